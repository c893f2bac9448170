// SPDX-License-Identifier: Apache-2.0
#pragma once

// Everything of the CUDA backend (nvcc only). The CPU umbrella kvsift/kvsift.hpp never includes
// this file.

#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/gather.cuh>
#include <kvsift/cuda/kv_view.cuh>
#include <kvsift/cuda/memory.cuh>
#include <kvsift/cuda/policy.cuh>
#include <kvsift/cuda/segmented_topk.cuh>
#include <kvsift/cuda/sparse_attention.cuh>
#include <kvsift/cuda/transfer.cuh>
