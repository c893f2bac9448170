// SPDX-License-Identifier: Apache-2.0
#pragma once

// kvsift umbrella header: the CPU side of the library. Never pulls CUDA headers; the CUDA
// backend lives in <kvsift/cuda/...> and the Thrust algorithms in <kvsift/thrust/...>.

#include <kvsift/attention/reference.hpp>
#include <kvsift/budget/memory_fraction.hpp>
#include <kvsift/budget/per_layer.hpp>
#include <kvsift/budget/pyramid.hpp>
#include <kvsift/budget/uniform.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/memory_space.hpp>
#include <kvsift/core/rope.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/method/any_method.hpp>
#include <kvsift/method/baselines.hpp>
#include <kvsift/method/dynamickv.hpp>
#include <kvsift/method/lagkv.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/score/cumulative_attention.hpp>
#include <kvsift/score/last_query_attention.hpp>
#include <kvsift/score/page_minmax.hpp>
#include <kvsift/score/simple.hpp>
#include <kvsift/score/window_attention.hpp>
#include <kvsift/select/keep_all.hpp>
#include <kvsift/select/page_topk.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/paged.hpp>
#include <kvsift/transfer/basic.hpp>
#include <kvsift/trigger/basic.hpp>
