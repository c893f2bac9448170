// SPDX-License-Identifier: Apache-2.0
#pragma once

// Every schedule state over device memory (CCCL only): include this, then compose a method over a
// thrust::dense_store on a device exec, e.g. kvsift::h2o<kvsift::thrust::dense_store<T, E>, E>,
// or SyncKV or HeteroCache over a thrust::tiered_store: kvsift::synckv<T, E>,
// kvsift::heterocache<T, E>.

#include <kvsift/device/evict.hpp>        // full KV, StreamingLLM, H2O, SnapKV, PyramidKV, DynamicKV, LagKV
#include <kvsift/device/sparse_read.hpp>  // Quest
#include <kvsift/device/deferred_recall.hpp>  // SyncKV, HeteroCache (over a thrust::tiered_store)
#include <kvsift/device/speculative.hpp>      // FreeKV (over a thrust::tiered_store)
