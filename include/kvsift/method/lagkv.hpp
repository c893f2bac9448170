// SPDX-License-Identifier: Apache-2.0
#pragma once

// lagkv — LagKV (Liang et al., 2025, "LagKV: Lag-Relative Information of the KV Cache Tells
// Which Tokens Are Important"): attention-free, recursive compression.
//
// Each head-sequence keeps a frozen prefix `base` (starting at the sink S). Whenever its
// uncompressed tail reaches two partitions (n - base >= 2L), [base, n) is cut into partitions of
// L tokens; every partition but the last full one is scored against the per-channel min/max of
// the partition that follows it (lag-relative std of K plus value_weight times that of V,
// softmaxed over the partition), keeps its top floor(r L) tokens, and those are frozen. The last
// full partition and the remainder stay raw until the next round.
//
//   prefill  the rounds run as if the prompt arrived in chunks of L after its first S + 2L tokens,
//            whatever the engine's chunking: a call that finds P > 2 partitions runs the P - 1
//            rounds of that recursion at once (partition p is scored against raw partition p + 1
//            in both cases, so the kept sets are the same, and stats().refreshes counts P - 1).
//   decode   after each step's attention (the triggering step reads the uncompressed cache;
//            the round shows from the next step); during decode a round always finds n - base = 2L.
//
// Resident tokens after a prefill of n tokens (docs/methods/lagkv.md, tests/test_lagkv.cpp):
//   n                                        if n < S + 2L
//   n - (floor((n - S) / L) - 1) (L - floor(r L))   otherwise.
//
// Composition: score::lag_relative -> budget::uniform (unused: LagKV has no token budget) ->
// select::partition_topk (per-partition top-k, advances the frozen prefix) -> store.retain, when
// trigger::length fires. Needs no queries; selection per KV head (GQA-safe); any element type and
// store (dense, paged). Defaults: sink 16, lag 128, keep_fraction 0.5, value_weight 1, variant lag.
// Cost per round: O((n - base) d) per head-sequence, memory bound; no attention, no queries.

#include <kvsift/budget/uniform.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/score/lag.hpp>
#include <kvsift/select/partition_topk.hpp>
#include <kvsift/trigger/length.hpp>

#include <algorithm>

namespace kvsift {

template <class Store, Exec E = exec::host>
using lagkv =
    method<Store, recipe<score::lag_relative, select::partition_topk, budget::uniform, trigger::length>, E>;

// The composition's params with the same sink and lag in every part. Validation (at
// construction, through can_implement): sink > 0, lag > 0, keep_fraction in (0, 1] with
// floor(keep_fraction * lag) >= 1; otherwise kvsift::error.
template <class Store, Exec E = exec::host>
typename lagkv<Store, E>::params lagkv_params(int sink = 16, int lag = 128, double keep_fraction = 0.5,
                                           double value_weight = 1.0,
                                           score::lag_variant variant = score::lag_variant::lag) {
  return {.scorer = {.sink = sink, .lag = lag, .value_weight = value_weight, .variant = variant},
          .selector = {.sink = sink, .lag = lag, .keep_fraction = keep_fraction},
          .budgeter = {},
          .trigger = {.sink = sink, .lag = lag}};
}

// LagKV's `base` of a head-sequence: slots before it are final (the sink until the first round).
template <class Store, Exec E>
int lagkv_base(const lagkv<Store, E>& m, int request, int layer, int head) {
  const auto seq = m.store().shape().sequence(request, layer, head);
  return std::max(m.schedule_state().frozen(seq), m.parameters().selector.sink);
}

}  // namespace kvsift
