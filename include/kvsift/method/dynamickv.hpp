// SPDX-License-Identifier: Apache-2.0
#pragma once

// dynamickv — DynamicKV (Zhou et al., 2024, "DynamicKV: Task-Aware Adaptive KV Cache Compression
// for Long Context LLMs"): SnapKV window scoring per layer; as each layer finishes prefill it keeps
// up to r_max * base past tokens, and after every interval-th layer (and the last) the budgets of
// all layers seen so far are recounted from a global top-k over their pooled scores and shrunk in
// place (budgets only shrink), so the layers share base * L_total past tokens. Selection is per KV
// head with GQA mean (memory really shrinks), a deliberate deviation from the public code.
// See docs/methods/dynamickv.md and METHODS.md "DynamicKV".
//
// Defaults (the paper's): window 8, kernel 7, avg pooling, GQA mean, r_max 10, interval 4.
// stats().layer_budgets[l]: tokens kept per KV head of layer l, window included, after the last
// update (for the first request of the latest round; budgeter_state().past_budgets(request) has
// every request's past budgets). Cost per layer: SnapKV scoring O(w * n * d) per query head, plus
// an update O(l * H * (n - w)) every interval-th layer; O(L * H * (n - w)) floats of saved scores
// per request until its prefill ends.

#include <kvsift/budget/dynamic_layer.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/score/window_attention.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/trigger/basic.hpp>

namespace kvsift {

template <class Store, Exec E = exec::host>
using dynamickv =
    method<Store, recipe<score::window_attention, select::topk, budget::dynamic_layer, trigger::never>, E>;

// Params of dynamickv for an average budget of `budget` tokens per head-sequence (window
// included; budget <= window is an error).
template <class Store, Exec E = exec::host>
typename dynamickv<Store, E>::params dynamickv_params(int budget, int window = 8, int kernel = 7,
                                                   int r_max = 10, int interval = 4) {
  return {.scorer = {.window = window, .kernel = kernel, .pool = pooling::avg,
                     .gqa = gqa_reduce::mean},
          .selector = {.window = window},
          .budgeter = {.tokens = budget, .window = window, .r_max = r_max,
                       .interval = interval}};
}

}  // namespace kvsift
