// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::query_history — the newest queries of each (request, layer), kept by the method shell
// for the parts that read past queries: a scorer's prompt window (SnapKV's last w, H2O's every
// prompt query), a data trigger's decode window (HeteroCache's last W). One buffer per (request,
// layer), rows [q_heads, d] oldest first, with the original position of the first one.
//
// `keep` is how many rows to keep: > 0 the newest `keep`, -1 every row, 0 none. Rows must
// continue the buffered ones (position first = the buffered first + rows); a gap (a chunk that
// carried only its newest queries) drops what was buffered.

#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsift::detail {

class query_history {
 public:
  query_history() = default;
  query_history(std::size_t slots, const model_shape& shape)
      : rows_(slots), first_(slots, 0),
        row_(static_cast<std::size_t>(shape.q_heads) * shape.head_dim), shape_(shape) {}

  // Rows buffered for `slot`.
  [[nodiscard]] int rows(std::size_t slot) const { return static_cast<int>(rows_[slot].size() / row_); }
  // Position of the first buffered row.
  [[nodiscard]] std::int32_t first(std::size_t slot) const { return first_[slot]; }
  // The buffered rows as a view [rows, q_heads, d].
  [[nodiscard]] kv_view<const float, nhd> view(std::size_t slot) const {
    return kv_view<const float, nhd>::contiguous(rows_[slot].data(), rows(slot), shape_.q_heads,
                                                 shape_.head_dim);
  }
  // Row i of the buffer (q_heads * d floats).
  [[nodiscard]] const float* row(std::size_t slot, int i) const {
    return rows_[slot].data() + static_cast<std::size_t>(i) * row_;
  }

  // Keeps the newest `keep` rows of the buffer followed by q (first row at position `first`).
  void remember(std::size_t slot, int keep, kv_view<const float, nhd> q, std::int32_t first) {
    if (keep == 0) return;
    auto& buf = rows_[slot];
    if (!buf.empty() && first_[slot] + rows(slot) != first) buf.clear();
    if (q.tokens == 0) return;
    if (keep > 0 && q.tokens > keep) {  // only the newest `keep` rows can matter: copy just those
      buf.clear();
      first += q.tokens - keep;
      q = q.slice(q.tokens - keep, keep);
    }
    const int have = rows(slot);
    if (have == 0) first_[slot] = first;
    for (int t = 0; t < q.tokens; ++t) {
      for (int h = 0; h < shape_.q_heads; ++h) {
        const float* src = q.row(t, h);
        buf.insert(buf.end(), src, src + shape_.head_dim);
      }
    }
    const int total = have + q.tokens;
    if (keep > 0 && total > keep) {
      buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>((total - keep) * row_));
      first_[slot] = first + q.tokens - keep;
    }
  }
  // One decode query (q_heads * d floats) at `position`.
  void remember_row(std::size_t slot, int keep, const float* q, std::int32_t position) {
    remember(slot, keep, kv_view<const float, nhd>::contiguous(q, 1, shape_.q_heads, shape_.head_dim),
             position);
  }

  // Drops the rows of `slot` and frees their memory.
  void clear(std::size_t slot) { std::vector<float>().swap(rows_[slot]); }

 private:
  std::vector<std::vector<float>> rows_;  // [slots] rows, [rows, q_heads, d] oldest first
  std::vector<std::int32_t> first_;       // [slots] position of the first buffered row
  std::size_t row_ = 0;                   // q_heads * d
  model_shape shape_{};
};

}  // namespace kvsift::detail
