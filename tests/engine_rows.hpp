// SPDX-License-Identifier: Apache-2.0
#pragma once

// The pool rows an engine's kernel reads for entry s of each index format (store/flashinfer.hpp,
// store/engine_tables.hpp), as the format tests check them: attention over these rows must equal
// attention over the plan. Shared by tests/test_engine_tables.cpp and
// tests/thrust/test_paged_store.cpp.

#include <kvsift/store/engine_tables.hpp>
#include <kvsift/store/flashinfer.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsift_test {

// FlashInfer's CSR: every row of each listed block, the last one's last_page_len rows.
inline std::vector<std::int64_t> rows_of(const kvsift::flashinfer_table& t, int s) {
  std::vector<std::int64_t> rows;
  for (int i = t.indptr[s]; i < t.indptr[s + 1]; ++i) {
    const int n = i + 1 == t.indptr[s + 1] ? t.last_page_len[static_cast<std::size_t>(s)] : t.page_size;
    for (int o = 0; o < n; ++o) rows.push_back(static_cast<std::int64_t>(t.indices[i]) * t.page_size + o);
  }
  return rows;
}

// A block-table kernel: blocks 0 .. ceil(seq_len / bs) - 1 of its row (a padded list also ends
// at its first -1).
inline std::vector<std::int64_t> rows_of(const kvsift::block_table& b, int s, bool stop_at_minus_one) {
  std::vector<std::int64_t> rows;
  const int n = b.seq_lens[static_cast<std::size_t>(s)];
  for (int i = 0; i * b.block_size < n; ++i) {
    const std::int32_t block = b.row(s)[i];
    if (stop_at_minus_one && block == -1) break;
    for (int o = 0; o < b.block_size && i * b.block_size + o < n; ++o) {
      rows.push_back(static_cast<std::int64_t>(block) * b.block_size + o);
    }
  }
  return rows;
}

// A masked kernel: the rows below n_kv_max whose mask is 0.
inline std::vector<std::int64_t> rows_of(const kvsift::kv_mask& m, int s) {
  std::vector<std::int64_t> rows;
  for (std::int64_t r = 0; r < m.n_kv_max; ++r) {
    if (m.mask[static_cast<std::size_t>(s * m.n_kv + r)] == 0.0f) rows.push_back(r);
  }
  return rows;
}

}  // namespace kvsift_test
