// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/score/context.hpp>

#include <algorithm>
#include <vector>

namespace kvsift::score {

// Observation-window attention with pooling — SnapKV (Li et al., 2024), also PyramidKV and
// DynamicKV. Each of the last `window` queries takes its causal softmax over every key it sees
// (window keys included); the columns of the past tokens (positions before the first window
// query) are averaged over the window queries, pooled along tokens (`kernel`, `pooling`) and
// reduced over the GQA group (`gqa`). Window tokens score 0: selectors protect them.
// Parameters (SnapKV defaults): window 32, kernel 7, avg pooling, GQA mean.
// Cost: O(window * n * d) per query head.
struct window_attention {
  using kvsift_role = scorer_tag;
  using granularity = token_level;
  static constexpr bool needs_queries = true;
  struct params {
    int window = 32;
    int kernel = 7;
    pooling pool = pooling::avg;
    gqa_reduce gqa = gqa_reduce::mean;
  };
  params p{};

  // Queries the method must hand over: the newest `window` of the prompt.
  [[nodiscard]] int query_window() const { return p.window; }

  void validate(std::string_view where) const {
    require(p.window > 0, where, "window", p.window, "> 0");
    require(p.kernel > 0 && p.kernel % 2 == 1, where, "kernel", p.kernel, "a positive odd number");
  }

  template <class Store>
  void score(const score_input<Store>& in, score_sets& out) const {
    const model_shape& sh = in.store->shape();
    layout_scores(in, out, [&](int s) { return in.store->length(in.sequence(s)); });
    const int G = sh.group_size();
    cpu::parallel_for(in.segments(), [&](std::int64_t s) {
      const int r = static_cast<int>(s) / sh.kv_heads;
      const int h = static_cast<int>(s) % sh.kv_heads;
      const auto seq = in.sequence(static_cast<int>(s));
      const auto& q = in.queries[r];
      const int n = in.store->length(seq);
      const int nq = std::min(q.tokens, p.window);
      const std::int32_t first_q = in.query_position[r] + (q.tokens - nq);
      const int past = cpu::visible_slots(*in.store, seq, first_q - 1);
      std::vector<float> rows(static_cast<std::size_t>(G) * past, 0.0f);
      std::vector<float> probs(static_cast<std::size_t>(n));
      std::vector<float> pooled(static_cast<std::size_t>(past));
      for (int g = 0; g < G; ++g) {
        std::span<float> row(rows.data() + static_cast<std::size_t>(g) * past, past);
        for (int i = q.tokens - nq; i < q.tokens; ++i) {
          cpu::attention_row(*in.store, seq, q.row(i, h * G + g), in.query_position[r] + i, probs);
          for (int j = 0; j < past; ++j) row[j] += probs[j];
        }
        for (float& x : row) x /= static_cast<float>(nq);
        cpu::pool1d(row, pooled, p.kernel, p.pool);
        std::copy(pooled.begin(), pooled.end(), row.begin());
      }
      auto seg = out[static_cast<int>(s)];
      cpu::reduce_group(rows, G, seg.first(static_cast<std::size_t>(past)), p.gqa);
    });
  }
};
static_assert(Scorer<window_attention>);

}  // namespace kvsift::score
