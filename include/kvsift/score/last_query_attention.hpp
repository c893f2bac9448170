// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/score/context.hpp>

#include <vector>

namespace kvsift::score {

// Attention of the newest query — the runtime score of SyncKV and HeteroCache profiling.
// The softmax of the last query over every key it sees, pooled along tokens (`kernel`, 1 = no
// pooling) and reduced over the GQA group. Parameters: kernel 1, avg pooling, GQA mean.
// Cost: O(n d) per query head.
struct last_query_attention {
  using kvsift_role = scorer_tag;
  using granularity = token_level;
  static constexpr bool needs_queries = true;
  struct params {
    int kernel = 1;
    pooling pool = pooling::avg;
    gqa_reduce gqa = gqa_reduce::mean;
  };
  params p{};
  [[nodiscard]] int query_window() const { return 1; }
  void validate(std::string_view where) const {
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
      std::vector<float> rows(static_cast<std::size_t>(G) * n, 0.0f);
      std::vector<float> probs(static_cast<std::size_t>(n));
      for (int g = 0; g < G; ++g) {
        std::span<float> row(rows.data() + static_cast<std::size_t>(g) * n, n);
        const int last = q.tokens - 1;
        const int v = cpu::attention_row(*in.store, seq, q.row(last, h * G + g),
                                         in.query_position[r] + last, probs);
        std::copy(probs.begin(), probs.begin() + v, row.begin());
        cpu::pool1d(std::vector<float>(row.begin(), row.end()), row, p.kernel, p.pool);
      }
      cpu::reduce_group(rows, G, out[static_cast<int>(s)], p.gqa);
    });
  }
};
static_assert(Scorer<last_query_attention>);

}  // namespace kvsift::score
