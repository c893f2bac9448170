// SPDX-License-Identifier: Apache-2.0
#pragma once

// store/engine_tables.hpp's index formats built on the device from a device FlashInfer table
// (thrust/flashinfer.hpp's flashinfer_tokens / flashinfer_pages output), with Thrust, equal to
// the host reference's arrays:
//
//   block_tables(exec, t, max_blocks, pad, blocks, seq_lens)   TensorRT-LLM's block tables
//       [entries, max_blocks] with a sequence length per entry; max_blocks is the caller's fixed
//       width (an engine's block-table width, so a step's shapes never change), at least the
//       longest entry's block count. padded_pages(...): the same padded with -1 (SGLang).
//   kv_mask(exec, t, n_kv, mask) -> n_kv_max   ggml's additive mask over pool rows [0, n_kv)
//       (0 where an entry reads the row, -inf elsewhere) and the n_kv_max hint, one past the
//       highest live row.
//
// One thread per output element (block tables) or per kept block (mask); no workspace, outputs in
// caller memory. check (default true): before anything is written, one reduction finds the first
// offending entry or block (the call then synchronises with the device) and kvsift::error names
// it as the host reference does; the outputs are untouched. kv_mask always reduces for n_kv_max
// (a read back: not for a captured graph; block_tables with check = false is capturable).

#include <kvsift/core/error.hpp>
#include <kvsift/store/engine_tables.hpp>
#include <kvsift/thrust/common.hpp>
#include <kvsift/thrust/flashinfer.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/transform_reduce.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace kvsift::thrust {

// A device FlashInfer table as the formats read it (device_flashinfer_table::table_view()).
struct fi_table_view {
  const std::int32_t* indptr = nullptr;         // [entries + 1]
  const std::int32_t* indices = nullptr;        // [indptr[entries]] rows (page_size 1) or pages
  const std::int32_t* last_page_len = nullptr;  // [entries]
  int entries = 0;
  int page_size = 0;
};

template <class Vector>
[[nodiscard]] fi_table_view table_view(const device_flashinfer_table<Vector>& t) {
  return {::thrust::raw_pointer_cast(t.indptr.data()), ::thrust::raw_pointer_cast(t.indices.data()),
          ::thrust::raw_pointer_cast(t.last_page_len.data()),
          t.indptr.empty() ? 0 : static_cast<int>(t.indptr.size()) - 1, t.page_size};
}

namespace detail {

// Entry s's blocks and tokens.
KVSIFT_HOST_DEVICE inline int et_blocks(const fi_table_view& t, int s) {
  return t.indptr[s + 1] - t.indptr[s];
}
KVSIFT_HOST_DEVICE inline std::int32_t et_seq_len(const fi_table_view& t, int s) {
  const int n = et_blocks(t, s);
  return n == 0 ? 0 : (n - 1) * t.page_size + t.last_page_len[s];
}

// The first entry s in [0, entries] breaking the table (as store/engine_tables.hpp's
// check_table): indptr[0] = 0, non-decreasing offsets, last_page_len in [1, page_size] (0 for an
// entry with no blocks), and at most max_blocks blocks (max_blocks < 0: no limit).
struct et_bad_entry_fn {
  fi_table_view t;
  int max_blocks;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t s64) const {
    const int s = static_cast<int>(s64);
    if (s == 0 && t.indptr[0] != 0) return s;
    if (s == t.entries) return fi_none;
    const int n = et_blocks(t, s);
    const int last = t.last_page_len[s];
    const bool bad = n < 0 || (n == 0 ? last != 0 : last < 1 || last > t.page_size) ||
                     (max_blocks >= 0 && n > max_blocks);
    return bad ? s : fi_none;
  }
};

// The first kept block i that is negative or (n_kv >= 0) reaches past pool row n_kv.
struct et_bad_index_fn {
  fi_table_view t;
  std::int64_t n_kv;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t i) const {
    const int s = segment_of(t.indptr, t.entries, i);
    const std::int64_t first = static_cast<std::int64_t>(t.indices[i]) * t.page_size;
    const int rows = i + 1 == t.indptr[s + 1] ? t.last_page_len[s] : t.page_size;
    return t.indices[i] < 0 || (n_kv >= 0 && first + rows > n_kv) ? i : fi_none;
  }
};

struct et_block_fn {
  fi_table_view t;
  int max_blocks;
  std::int32_t pad;
  std::int32_t* blocks;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = static_cast<int>(e / max_blocks), c = static_cast<int>(e % max_blocks);
    blocks[e] = c < et_blocks(t, s) ? t.indices[t.indptr[s] + c] : pad;
  }
};

struct et_seq_len_fn {
  fi_table_view t;
  std::int32_t* seq_lens;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t s) const {
    seq_lens[s] = et_seq_len(t, static_cast<int>(s));
  }
};

// Kept block i's rows set to 0 in its entry's mask row; returns one past its last row.
struct et_mask_fn {
  fi_table_view t;
  std::int64_t n_kv;
  float* mask;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t i) const {
    const int s = segment_of(t.indptr, t.entries, i);
    const std::int64_t first = static_cast<std::int64_t>(t.indices[i]) * t.page_size;
    const int rows = i + 1 == t.indptr[s + 1] ? t.last_page_len[s] : t.page_size;
    float* row = mask + static_cast<std::int64_t>(s) * n_kv;
    for (int r = 0; r < rows; ++r) row[first + r] = 0.0f;
    return first + rows;
  }
};
struct et_max_fn {
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t a, std::int64_t b) const {
    return a < b ? b : a;
  }
};

// Host-side arguments, then (check) the table on the device: kvsift::error naming the first
// offender, before anything is written.
template <class Policy>
void et_check(const Policy& exec, std::string_view where, const fi_table_view& t, int max_blocks,
              std::int64_t n_kv, bool check) {
  require(t.entries >= 0, where, "table.entries", t.entries, ">= 0");
  require(t.page_size > 0, where, "table.page_size", t.page_size, "> 0");
  require(t.indptr != nullptr, where, "table.indptr", "null", "entries + 1 CSR offsets");
  if (!check) return;
  const std::int64_t s = fi_first(exec, et_bad_entry_fn{t, max_blocks}, t.entries + 1);
  if (s != fi_none) {
    const int e = static_cast<int>(s);
    const std::int64_t off = fi_read(exec, fi_load_fn{t.indptr}, e);
    if (e == 0 && off != 0) {
      throw make_error(where, "table.indptr[0]", off, "0 (CSR offsets, entries + 1 of them)");
    }
    const std::int64_t next = fi_read(exec, fi_load_fn{t.indptr}, e + 1);
    const std::int64_t last = fi_read(exec, fi_load_fn{t.last_page_len}, e);
    const auto at = [e](const char* a) { return std::string(a) + "[" + std::to_string(e) + "]"; };
    if (next < off) {
      throw make_error(where, "table.indptr[" + std::to_string(e + 1) + "]", next,
                       ">= table.indptr[" + std::to_string(e) + "]: non-decreasing offsets");
    }
    if (max_blocks >= 0 && next - off > max_blocks) {
      throw make_error(where, "max_blocks", max_blocks,
                       "at least entry " + std::to_string(e) + "'s " + std::to_string(next - off) +
                           " blocks (the longest entry's count)");
    }
    throw make_error(where, at("table.last_page_len"), last,
                     next == off ? std::string("0 (the entry reads nothing)")
                                 : "in [1, " + std::to_string(t.page_size) + "] (rows of the last page)");
  }
  const std::int64_t kept = fi_read(exec, fi_load_fn{t.indptr}, t.entries);
  const std::int64_t i = fi_first(exec, et_bad_index_fn{t, n_kv}, kept);
  if (i != fi_none) {
    const std::int64_t v = fi_read(exec, fi_load_fn{t.indices}, i);
    throw make_error(where, "table.indices[" + std::to_string(i) + "]", v,
                     n_kv < 0 || v < 0 ? std::string(">= 0 (a row or page of the pool)")
                                       : "a block inside the pool's " + std::to_string(n_kv) + " rows");
  }
}

}  // namespace detail

// blocks [entries * max_blocks] (row-major, padded with `pad`), seq_lens [entries].
template <class Policy>
void block_tables(const Policy& exec, const fi_table_view& t, int max_blocks, std::int32_t pad,
                  std::int32_t* blocks, std::int32_t* seq_lens, bool check = true) {
  constexpr std::string_view where = "thrust::block_tables";
  require(max_blocks >= 0, where, "max_blocks", max_blocks, ">= 0");
  detail::et_check(exec, where, t, max_blocks, -1, check);
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  ::thrust::for_each_n(exec, zero, static_cast<std::int64_t>(t.entries) * max_blocks,
                       detail::et_block_fn{t, max_blocks, pad, blocks});
  ::thrust::for_each_n(exec, zero, t.entries, detail::et_seq_len_fn{t, seq_lens});
}

// SGLang's page lists: block_tables padded with -1.
template <class Policy>
void padded_pages(const Policy& exec, const fi_table_view& t, int max_blocks,
                  std::int32_t* blocks, std::int32_t* seq_lens, bool check = true) {
  block_tables(exec, t, max_blocks, -1, blocks, seq_lens, check);
}

// mask [entries * n_kv] over pool rows [0, n_kv); returns n_kv_max (0 when no entry reads any).
template <class Policy>
std::int64_t kv_mask(const Policy& exec, const fi_table_view& t, std::int64_t n_kv, float* mask,
                     bool check = true) {
  constexpr std::string_view where = "thrust::kv_mask";
  require(n_kv >= 0, where, "n_kv", n_kv, ">= 0 (the pool's rows)");
  detail::et_check(exec, where, t, -1, n_kv, check);
  const std::int64_t kept = detail::fi_read(exec, detail::fi_load_fn{t.indptr}, t.entries);
  ::thrust::fill_n(exec, mask, static_cast<std::int64_t>(t.entries) * n_kv,
                   -std::numeric_limits<float>::infinity());
  return ::thrust::transform_reduce(exec, ::thrust::counting_iterator<std::int64_t>(0),
                                    ::thrust::counting_iterator<std::int64_t>(kept),
                                    detail::et_mask_fn{t, n_kv, mask}, std::int64_t{0},
                                    detail::et_max_fn{});
}

// Owning conveniences (Vector / FloatVector, e.g. thrust::device_vector), read back into the host
// reference's types: block_table (max_blocks: the longest entry's, found on the host) and kv_mask.
template <class Vector, class Policy>
[[nodiscard]] kvsift::block_table block_tables(const Policy& exec, const device_flashinfer_table<Vector>& d,
                                               std::int32_t pad = 0) {
  const auto host = to_host(d);  // max_blocks is a shape: read on the host
  kvsift::block_table b;
  b.entries = host.entries();
  b.block_size = host.page_size;
  for (int s = 0; s < b.entries; ++s) b.max_blocks = std::max(b.max_blocks, host.indptr[s + 1] - host.indptr[s]);
  Vector blocks(static_cast<std::size_t>(b.entries) * b.max_blocks), lens(static_cast<std::size_t>(b.entries));
  block_tables(exec, table_view(d), b.max_blocks, pad, ::thrust::raw_pointer_cast(blocks.data()),
               ::thrust::raw_pointer_cast(lens.data()));
  b.blocks.resize(blocks.size());
  b.seq_lens.resize(lens.size());
  ::thrust::copy(blocks.begin(), blocks.end(), b.blocks.begin());
  ::thrust::copy(lens.begin(), lens.end(), b.seq_lens.begin());
  return b;
}
template <class FloatVector, class Vector, class Policy>
[[nodiscard]] kvsift::kv_mask kv_mask(const Policy& exec, const device_flashinfer_table<Vector>& d,
                                      std::int64_t pool_rows) {
  const auto v = table_view(d);
  FloatVector mask(static_cast<std::size_t>(v.entries) * static_cast<std::size_t>(pool_rows));
  kvsift::kv_mask m;
  m.entries = v.entries;
  m.n_kv = pool_rows;
  m.n_kv_max = kv_mask(exec, v, pool_rows, ::thrust::raw_pointer_cast(mask.data()));
  m.mask.resize(mask.size());
  ::thrust::copy(mask.begin(), mask.end(), m.mask.begin());
  return m;
}

}  // namespace kvsift::thrust
