// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a scorer is given: a store, one layer, a ragged batch of requests and, for attention-based
// scorers, the queries they recompute attention from (never probabilities from the engine).

#include <kvsift/concepts.hpp>
#include <kvsift/core/view.hpp>

#include <cstdint>
#include <span>

namespace kvsift {

template <class Store>
struct score_input {
  const Store* store = nullptr;
  int layer = 0;
  lifecycle_event event = lifecycle_event::prefill_end;
  std::span<const int> requests;                      // [R] the batch
  std::span<const kv_view<const float, nhd>> queries;  // [R] each [nq, q_heads, d]: the newest nq queries
  std::span<const std::int32_t> query_position;       // [R] original position of each request's first query
  std::span<const int> frozen;                        // [R * kv_heads] slots before it are final; empty = none

  [[nodiscard]] int segments() const {
    return static_cast<int>(requests.size()) * store->shape().kv_heads;
  }
  [[nodiscard]] std::int64_t sequence(int segment) const {
    const int h = store->shape().kv_heads;
    return store->shape().sequence(requests[segment / h], layer, segment % h);
  }
  [[nodiscard]] int frozen_of(int segment) const { return frozen.empty() ? 0 : frozen[segment]; }
};

// Lays out `out` with one segment per head-sequence of `in`, each of size(segment) entries.
template <class Store, class SizeOf>
void layout_scores(const score_input<Store>& in, score_sets& out, SizeOf&& size_of) {
  thread_local std::vector<int> sizes;  // scratch: nothing allocated once warm
  sizes.resize(static_cast<std::size_t>(in.segments()));
  for (int s = 0; s < in.segments(); ++s) sizes[s] = size_of(s);
  out.resize(sizes);
}

}  // namespace kvsift
