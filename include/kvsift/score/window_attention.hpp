// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/group_dots.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/score/context.hpp>

#include <algorithm>
#include <cmath>
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
      const int nq = std::min(q.tokens, p.window);
      const std::int32_t first_q = in.query_position[r] + (q.tokens - nq);
      const int past = cpu::visible_slots(*in.store, seq, first_q - 1);
      // Logits of every window query of the group (row g * nq + i: query head h * G + g, window
      // query i) against every key it may see, kvsift::dot's bits (cpu::group_dots_rows: four
      // rows per pass over a key, on the CPU's vector path), key block by key block so each key
      // row is read from memory once, not once per query.
      using T = typename Store::element_type;
      const int d = sh.head_dim;
      const int nrows = G * nq;
      const int last_visible = cpu::visible_slots(*in.store, seq, in.query_position[r] + q.tokens - 1);
      std::vector<float> logits(static_cast<std::size_t>(nrows) * last_visible);
      std::vector<float> qrows(static_cast<std::size_t>(nrows) * d);
      for (int row = 0; row < nrows; ++row) {
        const float* qv = q.row(q.tokens - nq + row % nq, h * G + row / nq);
        std::copy(qv, qv + d, qrows.data() + static_cast<std::size_t>(row) * d);
      }
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      constexpr int block = 128;
      const T* keys[block];
      for (int j0 = 0; j0 < last_visible; j0 += block) {
        const int m = std::min(last_visible - j0, block);
        for (int j = 0; j < m; ++j) keys[j] = in.store->key(seq, j0 + j);
        cpu::group_dots_rows<T>(qrows.data(), nrows, d, static_cast<std::size_t>(m),
                                [&](std::size_t j) { return keys[j]; }, logits.data() + j0,
                                static_cast<std::size_t>(last_visible));
      }
      for (float& x : logits) x *= scale;
      std::vector<float> rows(static_cast<std::size_t>(G) * past, 0.0f);
      std::vector<float> pooled(static_cast<std::size_t>(past));
      for (int g = 0; g < G; ++g) {
        std::span<float> acc(rows.data() + static_cast<std::size_t>(g) * past, past);
        for (int i = 0; i < nq; ++i) {
          const std::int32_t pos = in.query_position[r] + (q.tokens - nq) + i;
          const int visible = cpu::visible_slots(*in.store, seq, pos);
          std::span<float> probs(logits.data() + static_cast<std::size_t>(g * nq + i) * last_visible,
                                 static_cast<std::size_t>(visible));
          cpu::softmax(probs);
          for (int j = 0; j < past; ++j) acc[j] += probs[j];
        }
        for (float& x : acc) x /= static_cast<float>(nq);
        cpu::pool1d(acc, pooled, p.kernel, p.pool);
        std::copy(pooled.begin(), pooled.end(), acc.begin());
      }
      auto seg = out[static_cast<int>(s)];
      cpu::reduce_group(rows, G, seg.first(static_cast<std::size_t>(past)), p.gqa);
    });
  }
};
static_assert(Scorer<window_attention>);

}  // namespace kvsift::score
