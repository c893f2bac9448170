// SPDX-License-Identifier: Apache-2.0
#pragma once

// The baselines users compare against, each a short composition with its paper's defaults.
// `*_params(budget)` returns the composition's params for a budget in tokens per head-sequence
// (every kept token counts, protected ones included).

#include <kvsift/budget/pyramid.hpp>
#include <kvsift/budget/uniform.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/score/cumulative_attention.hpp>
#include <kvsift/score/page_minmax.hpp>
#include <kvsift/score/simple.hpp>
#include <kvsift/score/window_attention.hpp>
#include <kvsift/select/keep_all.hpp>
#include <kvsift/select/page_topk.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/trigger/basic.hpp>

#include <limits>

namespace kvsift {

// full_kv — keeps everything: the reference every method is measured against.
template <class Store, Exec E = exec::host>
using full_kv =
    method<Store, recipe<score::recency, select::keep_all, budget::uniform, trigger::never>, E>;
template <class Store, Exec E = exec::host>
typename full_kv<Store, E>::params full_kv_params() {
  return {.budgeter = {.tokens = std::numeric_limits<int>::max()}};
}

// streaming_llm — StreamingLLM (Xiao et al., ICLR 2024): attention sinks [0, S) plus the newest
// B - S tokens; after every decode step the oldest non-sink token is dropped. Positions stay the
// original ones (no re-rotation). Defaults: sink 4.
template <class Store, Exec E = exec::host>
using streaming_llm =
    method<Store, recipe<score::recency, select::topk, budget::uniform, trigger::every_step>, E>;
template <class Store, Exec E = exec::host>
typename streaming_llm<Store, E>::params streaming_llm_params(int budget, int sink = 4) {
  return {.selector = {.sink = sink}, .budgeter = {.tokens = budget}};
}

// h2o — Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023): the recent half of the budget plus the
// heavy hitters by cumulative attention; during decode each step's attention adds to the running
// scores and the lowest-scored token older than the recent window is evicted. Defaults: recent
// window floor(B / 2), GQA mean.
template <class Store, Exec E = exec::host>
using h2o =
    method<Store, recipe<score::cumulative_attention, select::topk, budget::uniform, trigger::every_step>, E>;
template <class Store, Exec E = exec::host>
typename h2o<Store, E>::params h2o_params(int budget, gqa_reduce gqa = gqa_reduce::mean) {
  return {.scorer = {.gqa = gqa}, .selector = {.window_share = 0.5},
          .budgeter = {.tokens = budget}};
}

// snapkv — SnapKV (Li et al., NeurIPS 2024): the last w prompt queries vote, pooled; keep the top
// B - w past tokens plus the window, once at the end of prefill; decoding appends without
// evicting. Defaults: window 32, kernel 7, avg pooling, GQA mean.
template <class Store, Exec E = exec::host>
using snapkv =
    method<Store, recipe<score::window_attention, select::topk, budget::uniform, trigger::never>, E>;
template <class Store, Exec E = exec::host>
typename snapkv<Store, E>::params snapkv_params(int budget, int window = 32, int kernel = 7,
                                             pooling pool = pooling::avg,
                                             gqa_reduce gqa = gqa_reduce::mean) {
  return {.scorer = {.window = window, .kernel = kernel, .pool = pool, .gqa = gqa},
          .selector = {.window = window},
          .budgeter = {.tokens = budget}};
}

// pyramidkv — PyramidKV (Cai et al., 2024): SnapKV scoring with a pyramid of per-layer budgets
// (more below, fewer above). Defaults: window 32, kernel 7, avg pooling, GQA mean, beta 20.
template <class Store, Exec E = exec::host>
using pyramidkv =
    method<Store, recipe<score::window_attention, select::topk, budget::pyramid, trigger::never>, E>;
template <class Store, Exec E = exec::host>
typename pyramidkv<Store, E>::params pyramidkv_params(int budget, int window = 32, int kernel = 7,
                                                   int beta = 20) {
  return {.scorer = {.window = window, .kernel = kernel},
          .selector = {.window = window},
          .budgeter = {.tokens = budget, .window = window, .beta = beta}};
}

// quest — Quest (Tang et al., ICML 2024): query-aware page selection every decode step from
// per-page key min/max digests; full KV stays resident (Quest saves bandwidth, not memory).
// Defaults: pages of 16, max(3, floor(B / 16)) pages including the current one, GQA max,
// layers [0, 2) dense.
template <class Store, Exec E = exec::host>
using quest =
    method<Store, recipe<score::page_minmax, select::page_topk, budget::uniform, trigger::every_step,
                         schedule::sparse_read>,
           E>;
template <class Store, Exec E = exec::host>
typename quest<Store, E>::params quest_params(int budget, int page_size = 16, int dense_layers = 2) {
  return {.scorer = {.page_size = page_size, .gqa = gqa_reduce::max},
          .selector = {.page_size = page_size, .min_pages = 3},
          .budgeter = {.tokens = budget},
          .dense_layers = dense_layers};
}

}  // namespace kvsift
