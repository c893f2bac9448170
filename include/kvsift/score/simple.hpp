// SPDX-License-Identifier: Apache-2.0
#pragma once

// Scorers that need no queries: recency (StreamingLLM) and key norm.

#include <kvsift/core/dot.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/score/context.hpp>

#include <cmath>

namespace kvsift::score {

// Recency — StreamingLLM (Xiao et al., 2024): the score of a token is its original position, so
// a top-k keeps the newest tokens. No parameters. Cost: O(n).
struct recency {
  using kvsift_role = scorer_tag;
  using granularity = token_level;
  static constexpr bool needs_queries = false;
  struct params {};
  params p{};
  [[nodiscard]] int query_window() const { return 0; }
  void validate(std::string_view) const {}

  template <class Store>
  void score(const score_input<Store>& in, score_sets& out) const {
    layout_scores(in, out, [&](int s) { return in.store->length(in.sequence(s)); });
    for (int s = 0; s < in.segments(); ++s) {
      const auto seq = in.sequence(s);
      auto seg = out[s];
      if constexpr (requires { in.store->positions_prefix(seq, 0, seg.data()); }) {
        in.store->positions_prefix(seq, static_cast<int>(seg.size()), seg.data());  // one pass
      } else {
        for (std::size_t j = 0; j < seg.size(); ++j) {
          seg[j] = static_cast<float>(in.store->position(seq, static_cast<int>(j)));
        }
      }
    }
  }
};
static_assert(Scorer<recency>);

// Key norm (Devoto et al., 2024; LagKV's `knorm` variant): score = -||k||_2 over the raw key's
// channels, so low-norm keys, which attract attention, rank first. Cost: O(n d), memory bound.
struct key_norm {
  using kvsift_role = scorer_tag;
  using granularity = token_level;
  static constexpr bool needs_queries = false;
  struct params {};
  params p{};
  [[nodiscard]] int query_window() const { return 0; }
  void validate(std::string_view) const {}

  template <class Store>
  void score(const score_input<Store>& in, score_sets& out) const {
    layout_scores(in, out, [&](int s) { return in.store->length(in.sequence(s)); });
    const int d = in.store->shape().head_dim;
    cpu::parallel_for(in.segments(), [&](std::int64_t s) {
      const auto seq = in.sequence(static_cast<int>(s));
      auto seg = out[static_cast<int>(s)];
      for (std::size_t j = 0; j < seg.size(); ++j) {
        const auto* k = in.store->key(seq, static_cast<int>(j));
        seg[j] = -std::sqrt(squared_norm(k, d));
      }
    });
  }
};
static_assert(Scorer<key_norm>);

}  // namespace kvsift::score
