// SPDX-License-Identifier: Apache-2.0
#pragma once

// Every algorithm of the Thrust backend. Compiles with g++ (define THRUST_DEVICE_SYSTEM to
// THRUST_DEVICE_SYSTEM_CPP or _OMP) and with nvcc; never pulled in by kvsift.hpp.

#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/common.hpp>
#include <kvsift/thrust/cumulative_attention.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/drift_median.hpp>
#include <kvsift/thrust/engine_tables.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/flashinfer.hpp>
#include <kvsift/thrust/freekv_pages.hpp>
#include <kvsift/thrust/gather.hpp>
#include <kvsift/thrust/lag.hpp>
#include <kvsift/thrust/last_query_attention.hpp>
#include <kvsift/thrust/math.hpp>
#include <kvsift/thrust/page_minmax.hpp>
#include <kvsift/thrust/paged_store.hpp>
#include <kvsift/thrust/plan.hpp>
#include <kvsift/thrust/query_cosine.hpp>
#include <kvsift/thrust/recency.hpp>
#include <kvsift/thrust/roles.hpp>
#include <kvsift/thrust/segmented_topk.hpp>
#include <kvsift/thrust/static_dynamic.hpp>
#include <kvsift/thrust/tiered_store.hpp>
#include <kvsift/thrust/window_attention.hpp>
