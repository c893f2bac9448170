// SPDX-License-Identifier: Apache-2.0
#pragma once

// One plan's page table (store/flashinfer.hpp's flashinfer_table, tokens or pages form) in the
// index formats of the other engines' decode kernels, one row per entry (request, KV head):
//
//   block_tables(t)   TensorRT-LLM's (and FlashInfer's trtllm decode) block tables: a padded
//                     [entries, max_blocks] array of pool blocks with a sequence length per entry;
//                     a kernel reads blocks 0 .. ceil(seq_len / block_size) - 1 of its row.
//   padded_pages(t)   SGLang's page lists: the same array padded with -1 (a row ends at its first -1).
//   kv_mask(t)        ggml's flash attention: an additive mask over the pool's rows [0, n_kv)
//                     (0 where an entry reads the row, -inf elsewhere) and n_kv_max, one past the
//                     highest live row of the batch, the bound a kernel may stop at.
//
// Rows and blocks are the pool's: in the tokens form a block is one row (block_size 1), in the
// pages form it is the store's page; every format names exactly the rows the table names, so an
// engine's attention over any of them equals the library's over the plan. The input is checked
// (CSR offsets, sizes, last-page lengths); kvsift::error names the argument, value and expectation.

#include <kvsift/core/error.hpp>
#include <kvsift/store/flashinfer.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kvsift {

// [entries, max_blocks] blocks of the pool per entry, row-major, padded with `pad` past each
// entry's blocks; seq_lens[s] tokens of entry s (its last block holds the remainder).
struct block_table {
  int entries = 0;
  int max_blocks = 0;  // the longest entry's block count
  int block_size = 0;  // rows per block: 1 (tokens form) or the store's page size
  std::vector<std::int32_t> blocks;    // [entries * max_blocks]
  std::vector<std::int32_t> seq_lens;  // [entries]
  [[nodiscard]] const std::int32_t* row(int s) const {
    return blocks.data() + static_cast<std::size_t>(s) * max_blocks;
  }
};

// An additive mask over the pool's rows for each entry: mask[s * n_kv + r] is 0 when entry s
// reads pool row r, -inf otherwise; rows at or past n_kv_max are -inf for every entry.
struct kv_mask {
  int entries = 0;
  std::int64_t n_kv = 0;      // rows the mask covers (the pool's rows, or fewer: see kv_mask())
  std::int64_t n_kv_max = 0;  // one past the highest row any entry reads (0 when none does)
  std::vector<float> mask;    // [entries * n_kv]
};

namespace detail {

inline void check_table(const flashinfer_table& t, std::string_view where) {
  require(t.page_size > 0, where, "table.page_size", t.page_size, "> 0");
  require(!t.indptr.empty() && t.indptr[0] == 0, where, "table.indptr[0]",
          t.indptr.empty() ? -1 : t.indptr[0], "0 (CSR offsets, entries + 1 of them)");
  for (std::size_t s = 1; s < t.indptr.size(); ++s) {
    require(t.indptr[s] >= t.indptr[s - 1], where,
            [s] { return "table.indptr[" + std::to_string(s) + "]"; }, t.indptr[s],
            [&] { return ">= table.indptr[" + std::to_string(s - 1) + "]: non-decreasing offsets"; });
  }
  require(static_cast<std::size_t>(t.indptr.back()) == t.indices.size(), where, "table.indices.size",
          t.indices.size(), [&] { return "table.indptr.back() (" + std::to_string(t.indptr.back()) + ")"; });
  require(static_cast<int>(t.last_page_len.size()) == t.entries(), where, "table.last_page_len.size",
          t.last_page_len.size(), [&] { return "one per entry (" + std::to_string(t.entries()) + ")"; });
  for (int s = 0; s < t.entries(); ++s) {
    const bool empty = t.indptr[s + 1] == t.indptr[s];
    const int last = t.last_page_len[static_cast<std::size_t>(s)];
    require(empty ? last == 0 : last >= 1 && last <= t.page_size, where,
            [s] { return "table.last_page_len[" + std::to_string(s) + "]"; }, last, [&] {
              return empty ? std::string("0 (the entry reads nothing)")
                           : "in [1, " + std::to_string(t.page_size) + "] (rows of the last page)";
            });
  }
  for (std::size_t i = 0; i < t.indices.size(); ++i) {
    require(t.indices[i] >= 0, where, [i] { return "table.indices[" + std::to_string(i) + "]"; },
            t.indices[i], [] { return std::string(">= 0 (a row or page of the pool)"); });
  }
}

}  // namespace detail

// TensorRT-LLM-style block tables of the table's entries, padded with `pad` (0: an index every
// kernel may touch without faulting; a kernel reads only blocks within seq_lens).
[[nodiscard]] inline block_table block_tables(const flashinfer_table& t, std::int32_t pad = 0) {
  detail::check_table(t, "kvsift::block_tables");
  block_table b;
  b.entries = t.entries();
  b.block_size = t.page_size;
  for (int s = 0; s < b.entries; ++s) b.max_blocks = std::max(b.max_blocks, t.indptr[s + 1] - t.indptr[s]);
  b.blocks.assign(static_cast<std::size_t>(b.entries) * b.max_blocks, pad);
  b.seq_lens.resize(static_cast<std::size_t>(b.entries));
  for (int s = 0; s < b.entries; ++s) {
    std::copy(t.indices.begin() + t.indptr[s], t.indices.begin() + t.indptr[s + 1],
              b.blocks.begin() + static_cast<std::ptrdiff_t>(s) * b.max_blocks);
    b.seq_lens[static_cast<std::size_t>(s)] = t.seq_len(s);
  }
  return b;
}

// SGLang-style page lists: block tables padded with -1, an entry's list ending at its first -1.
[[nodiscard]] inline block_table padded_pages(const flashinfer_table& t) { return block_tables(t, -1); }

// ggml-style mask over pool rows [0, n_kv) with the n_kv_max hint. `pool_rows` is the pool's row
// count (store.key_pool() rows: total_pages * page_size); the mask covers all of them, or only
// [0, n_kv_max) with `trim` (a kernel given n_kv_max never reads further).
[[nodiscard]] inline kv_mask kv_mask_of(const flashinfer_table& t, std::int64_t pool_rows, bool trim = false) {
  constexpr std::string_view where = "kvsift::kv_mask_of";
  detail::check_table(t, where);
  kv_mask m;
  m.entries = t.entries();
  // entry s's block i (index i of t.indices): its first pool row and how many rows it holds
  const auto first_row = [&](int i) {
    return static_cast<std::int64_t>(t.indices[static_cast<std::size_t>(i)]) * t.page_size;
  };
  const auto rows_of = [&](int s, int i) {
    return i + 1 == t.indptr[s + 1] ? t.last_page_len[static_cast<std::size_t>(s)] : t.page_size;
  };
  // the highest row any entry reads, each checked against the pool first
  for (int s = 0; s < m.entries; ++s) {
    for (int i = t.indptr[s]; i < t.indptr[s + 1]; ++i) {
      const std::int64_t end = first_row(i) + rows_of(s, i);
      require(end <= pool_rows, where, [i] { return "table.indices[" + std::to_string(i) + "]"; },
              t.indices[static_cast<std::size_t>(i)],
              [&] { return "a block inside the pool's " + std::to_string(pool_rows) + " rows"; });
      m.n_kv_max = std::max(m.n_kv_max, end);
    }
  }
  m.n_kv = trim ? m.n_kv_max : pool_rows;
  m.mask.assign(static_cast<std::size_t>(m.entries) * static_cast<std::size_t>(m.n_kv),
                -std::numeric_limits<float>::infinity());
  for (int s = 0; s < m.entries; ++s) {
    float* row = m.mask.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(m.n_kv);
    for (int i = t.indptr[s]; i < t.indptr[s + 1]; ++i) {
      std::fill(row + first_row(i), row + first_row(i) + rows_of(s, i), 0.0f);
    }
  }
  return m;
}

}  // namespace kvsift
