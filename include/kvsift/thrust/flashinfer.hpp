// SPDX-License-Identifier: Apache-2.0
#pragma once

// The FlashInfer export of a device-resident plan with Thrust: the same arrays as the host
// reference kvsift/store/flashinfer.hpp (read its header for the two forms and the batch
// entries), built on the device from a device CSR plan (thrust/plan.hpp) and a device copy of
// the entries' page lists (`head_pages`, from kvsift::page_lists(store, layer, requests) of a
// store::paged, or thrust::page_lists of a thrust::paged_store, gathered on the device).
//   flashinfer_tokens  page_size 1: indices[e] = pages[s][r / ps] * ps + r % ps, r the slot's
//                      row (head_pages.rows, or the slot itself when rows are in slot order)
//   flashinfer_pages   page_size ps: indices[e] = pages[s][page]; last_page_len from the
//                      entry's length when its last kept page is its last page
// One thread per kept index (a gather through the page lists, s found by binary search of the
// plan's offsets) and one per entry (last_page_len); indptr is the plan's offsets, copied.
// No workspace, no allocation, outputs in caller memory: capturable in a CUDA graph with
// check = false.
//
// check (default true): before anything is written, one pass over the plan's offsets, one over
// the page lists' offsets (head_pages.indptr), one over the page lists and one over the kept
// indices find the first offender (a reduction, so the
// call synchronises with the device); kvsift::error then names it as the host reference would
// (argument, value, expectation) and the outputs are untouched. Pass false on a hot path whose
// plans come from the library's own selectors. Host-side arguments are always checked.

#include <kvsift/core/segments.hpp>
#include <kvsift/store/flashinfer.hpp>
#include <kvsift/thrust/common.hpp>
#include <kvsift/thrust/paged_store.hpp>
#include <kvsift/thrust/plan.hpp>

#include <thrust/copy.h>
#include <thrust/memory.h>
#include <thrust/transform.h>
#include <thrust/transform_reduce.h>

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::thrust {

// head_pages (store/flashinfer.hpp) in device memory, as the kernels read it.
struct head_pages_view {
  const std::int32_t* indptr = nullptr;   // [entries + 1] CSR offsets into pages
  const std::int32_t* pages = nullptr;    // [indptr[entries]] physical page ids, in row order
  const std::int32_t* lengths = nullptr;  // [entries] tokens of each entry's head-sequence
  int entries = 0;
  int page_size = 0;                      // rows per page of the store
  // The row of each slot (head_pages.rows; CSR over lengths), or null when slot i is row i. Built
  // by kvsift::page_lists from the store (not re-checked on the device).
  const std::int32_t* row_indptr = nullptr;  // [entries + 1]
  const std::int32_t* rows = nullptr;        // [row_indptr[entries]]
  // [entries] rows each entry's pages hold (head_pages.extents: its tokens, and a released row
  // the next append fills), or null when they hold exactly its tokens.
  const std::int32_t* extents = nullptr;
};

// The output arrays, in caller memory on the device.
struct flashinfer_view {
  std::int32_t* indptr = nullptr;         // [entries + 1]
  std::int32_t* indices = nullptr;        // [kept] physical rows (tokens) or pages (pages)
  std::int32_t* last_page_len = nullptr;  // [entries]
};

template <class Vector>
struct device_head_pages {
  Vector indptr, pages, lengths;  // as head_pages_view
  int page_size = 0;
  Vector row_indptr, rows;        // empty when slots are rows
  Vector extents;                 // empty when pages hold exactly the tokens
  [[nodiscard]] int entries() const { return static_cast<int>(indptr.size()) - 1; }
  [[nodiscard]] head_pages_view view() const {
    const bool mapped = !row_indptr.empty();
    return {::thrust::raw_pointer_cast(indptr.data()), ::thrust::raw_pointer_cast(pages.data()),
            ::thrust::raw_pointer_cast(lengths.data()), entries(), page_size,
            mapped ? ::thrust::raw_pointer_cast(row_indptr.data()) : nullptr,
            mapped ? ::thrust::raw_pointer_cast(rows.data()) : nullptr,
            extents.empty() ? nullptr : ::thrust::raw_pointer_cast(extents.data())};
  }
};

template <class Vector>
[[nodiscard]] device_head_pages<Vector> to_device(const head_pages& hp) {
  const bool mapped = hp.rows.segments() > 0;
  return {Vector(hp.pages.offsets.begin(), hp.pages.offsets.end()),
          Vector(hp.pages.values.begin(), hp.pages.values.end()),
          Vector(hp.lengths.begin(), hp.lengths.end()), hp.page_size,
          mapped ? Vector(hp.rows.offsets.begin(), hp.rows.offsets.end()) : Vector(),
          mapped ? Vector(hp.rows.values.begin(), hp.rows.values.end()) : Vector(),
          Vector(hp.extents.begin(), hp.extents.end())};
}

namespace detail {

// Entry i of the batch's lists, gathered from a per-head-sequence table ([sequences, stride]):
// list s = segment_of(indptr, i) takes the (i - indptr[s])-th entry of its head-sequence's row
// table_row[s]. The page ids come from the page table, each slot's row from the row map.
struct pl_gather_fn {
  const std::int32_t* indptr;
  const std::int32_t* table_row;
  const std::int32_t* table;
  std::int64_t stride;
  int entries;
  KVSIFT_HOST_DEVICE std::int32_t operator()(std::int64_t i) const {
    const int s = segment_of(indptr, entries, i);
    return table[table_row[s] * stride + (i - indptr[s])];
  }
};

}  // namespace detail

// The page lists of (requests[i], layer, h) for every i and KV head h, in that order, from a
// thrust::paged_store, as kvsift::page_lists gives them from a store::paged: the input of
// flashinfer_tokens / flashinfer_pages, and through them of the other engines' formats
// (thrust/engine_tables.hpp). The offsets, lengths and extents are host arithmetic on the store's
// shadows (ceil(row_extent / P) pages per entry), copied up; the page ids, and the row of each
// slot where a round left rows out of slot order (the store's shadow says where), are gathered on
// the device from its page table and row map, one thread each, nothing read back. The pages form
// needs rows in slot order, as the host's does. Allocates the lists (Vector, e.g. a
// thrust::device_vector<std::int32_t>): build them once per layer's batch, not per kernel call.
template <class Vector, Element T, DeviceExec E>
[[nodiscard]] device_head_pages<Vector> page_lists(const paged_store<T, E>& store, int layer,
                                                   std::span<const int> requests) {
  constexpr std::string_view where = "thrust::page_lists";
  const auto& sh = store.shape();
  kvsift::detail::check_batch_layer(where, requests, store.requests(), layer, sh.layers);
  require(store.sequences() <= std::numeric_limits<std::int32_t>::max(), where, "store.sequences()",
          store.sequences(), "<= 2^31 - 1 (page-table rows are int32 here)");
  const int P = store.page_size();
  std::vector<std::int32_t> indptr{0}, row_indptr{0}, lengths, extents, seqs;
  bool in_order = true, holes = false;
  for (const int r : requests) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto seq = sh.sequence(r, layer, h);
      const int n = store.length(seq), extent = store.row_extent(seq);
      indptr.push_back(indptr.back() + (extent + P - 1) / P);
      row_indptr.push_back(row_indptr.back() + n);
      lengths.push_back(n);
      extents.push_back(extent);
      seqs.push_back(static_cast<std::int32_t>(seq));
      in_order = in_order && store.rows_in_slot_order(seq);
      holes = holes || extent != n;
    }
  }
  if (!holes) extents.clear();
  device_head_pages<Vector> hp{Vector(indptr.begin(), indptr.end()), Vector(indptr.back()),
                               Vector(lengths.begin(), lengths.end()), P, Vector(), Vector(),
                               Vector(extents.begin(), extents.end())};
  const Vector table_row(seqs.begin(), seqs.end());
  const int entries = static_cast<int>(seqs.size());
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  const auto policy = store.exec().policy();
  ::thrust::transform(policy, zero, zero + indptr.back(), ::thrust::raw_pointer_cast(hp.pages.data()),
                      detail::pl_gather_fn{::thrust::raw_pointer_cast(hp.indptr.data()),
                                           ::thrust::raw_pointer_cast(table_row.data()),
                                           store.page_table(), store.table_stride(), entries});
  if (!in_order) {
    hp.row_indptr = Vector(row_indptr.begin(), row_indptr.end());
    hp.rows = Vector(row_indptr.back());
    ::thrust::transform(policy, zero, zero + row_indptr.back(), ::thrust::raw_pointer_cast(hp.rows.data()),
                        detail::pl_gather_fn{::thrust::raw_pointer_cast(hp.row_indptr.data()),
                                           ::thrust::raw_pointer_cast(table_row.data()),
                                           store.row_map(), store.capacity(), entries});
  }
  return hp;
}

// An owning device table; to_host() gives the host reference's type.
template <class Vector>
struct device_flashinfer_table {
  Vector indptr, indices, last_page_len;  // as flashinfer_table
  int page_size = 0;
  [[nodiscard]] flashinfer_view view() {
    return {::thrust::raw_pointer_cast(indptr.data()), ::thrust::raw_pointer_cast(indices.data()),
            ::thrust::raw_pointer_cast(last_page_len.data())};
  }
};

template <class Vector>
[[nodiscard]] flashinfer_table to_host(const device_flashinfer_table<Vector>& d) {
  flashinfer_table t;
  t.page_size = d.page_size;
  t.indptr.resize(d.indptr.size());
  t.indices.resize(d.indices.size());
  t.last_page_len.resize(d.last_page_len.size());
  ::thrust::copy(d.indptr.begin(), d.indptr.end(), t.indptr.begin());
  ::thrust::copy(d.indices.begin(), d.indices.end(), t.indices.begin());
  ::thrust::copy(d.last_page_len.begin(), d.last_page_len.end(), t.last_page_len.begin());
  return t;
}

namespace detail {

constexpr std::int64_t fi_none = 0x7fffffffffffffff;  // INT64_MAX: "no offender"

// Plan offsets: the first s in [0, S] breaking offsets[0] = 0, non-decreasing, offsets[S] = n.
struct fi_bad_offset_fn {
  const std::int32_t* offsets;
  int num_segments;
  std::int64_t num;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t s) const {
    const std::int64_t o = offsets[s];
    const bool bad = (s == 0 && o != 0) || (s > 0 && o < offsets[s - 1]) ||
                     (s == num_segments && o != num);
    return bad ? s : fi_none;
  }
};

// Page lists' CSR offsets: the first s in [0, entries] breaking indptr[0] = 0, non-decreasing
// (indptr[entries] is the page ids' count, which the view does not carry).
struct fi_bad_indptr_fn {
  const std::int32_t* indptr;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t s) const {
    const bool bad = s == 0 ? indptr[0] != 0 : indptr[s] < indptr[s - 1];
    return bad ? s : fi_none;
  }
};

// Page lists: the first entry whose length is negative, whose extent is not its length or one
// more (a waiting hole), or whose rows in use do not fill its pages (as check_head_pages).
struct fi_bad_entry_fn {
  head_pages_view hp;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t s) const {
    const std::int64_t n = hp.lengths[s];
    const std::int64_t extent = hp.extents == nullptr ? n : hp.extents[s];
    const std::int64_t pages = hp.indptr[s + 1] - hp.indptr[s];
    const bool bad = n < 0 || extent < n || extent > n + 1 ||
                     pages != (extent + hp.page_size - 1) / hp.page_size;
    return bad ? s : fi_none;
  }
};

// Kept indices: the first e out of [0, limit(s)) or not above its predecessor in the segment.
struct fi_bad_index_fn {
  segmented_view<const std::int32_t> plan;
  head_pages_view hp;
  bool pages;  // limit = the entry's page count (pages form) or length (tokens form)
  KVSIFT_HOST_DEVICE std::int64_t limit(int s) const {
    return pages ? hp.indptr[s + 1] - hp.indptr[s] : hp.lengths[s];
  }
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t e) const {
    const int s = segment_of(plan.offsets, plan.num_segments, e);
    const std::int32_t v = plan.values[e];
    const bool bad = v < 0 || v >= limit(s) || (e > plan.offsets[s] && v <= plan.values[e - 1]);
    return bad ? e : fi_none;
  }
};

struct fi_min_fn {
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t a, std::int64_t b) const {
    return a < b ? a : b;
  }
};

// Reads f(i) back to the host (a one-element reduction: works for every system).
template <class Policy, class F>
std::int64_t fi_read(const Policy& exec, F f, std::int64_t i) {
  return ::thrust::transform_reduce(exec, ::thrust::counting_iterator<std::int64_t>(i),
                                    ::thrust::counting_iterator<std::int64_t>(i + 1), f,
                                    fi_none, fi_min_fn{});
}
template <class Policy, class F>
std::int64_t fi_first(const Policy& exec, F f, std::int64_t n) {
  return ::thrust::transform_reduce(exec, ::thrust::counting_iterator<std::int64_t>(0),
                                    ::thrust::counting_iterator<std::int64_t>(n), f, fi_none,
                                    fi_min_fn{});
}

struct fi_load_fn {
  const std::int32_t* a;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t i) const { return a[i]; }
};
struct fi_segment_fn {
  segmented_view<const std::int32_t> plan;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t e) const {
    return segment_of(plan.offsets, plan.num_segments, e);
  }
};
struct fi_limit_fn {
  fi_bad_index_fn f;
  KVSIFT_HOST_DEVICE std::int64_t operator()(std::int64_t s) const {
    return f.limit(static_cast<int>(s));
  }
};

template <class Policy>
void fi_check(const Policy& exec, std::string_view where, std::string_view arg,
              const head_pages_view& hp, segmented_view<const std::int32_t> plan, std::int64_t num,
              bool pages) {
  const int S = plan.num_segments;
  const std::int64_t bad_off = fi_first(exec, fi_bad_offset_fn{plan.offsets, S, num}, S + 1);
  if (bad_off != fi_none) {
    const std::int64_t v = fi_read(exec, fi_load_fn{plan.offsets}, bad_off);
    throw make_error(where, std::string(arg) + ".offsets[" + std::to_string(bad_off) + "]", v,
                     "CSR offsets: offsets[0] = 0, non-decreasing, offsets[" + std::to_string(S) +
                         "] = num (" + std::to_string(num) + ")");
  }
  const std::int64_t bad_ptr = fi_first(exec, fi_bad_indptr_fn{hp.indptr}, S + 1);
  if (bad_ptr != fi_none) {
    const std::int64_t v = fi_read(exec, fi_load_fn{hp.indptr}, bad_ptr);
    if (bad_ptr == 0) {
      throw make_error(where, "head_pages.indptr[0]", v, "0 (CSR offsets)");
    }
    const std::int64_t prev = fi_read(exec, fi_load_fn{hp.indptr}, bad_ptr - 1);
    throw make_error(where, "head_pages.indptr[" + std::to_string(bad_ptr) + "]", v,
                     ">= head_pages.indptr[" + std::to_string(bad_ptr - 1) + "] (" +
                         std::to_string(prev) + "): non-decreasing CSR offsets");
  }
  const std::int64_t bad_entry = fi_first(exec, fi_bad_entry_fn{hp}, S);
  if (bad_entry != fi_none) {
    const std::int64_t v = fi_read(exec, fi_load_fn{hp.lengths}, bad_entry);
    throw make_error(where, "head_pages.lengths[" + std::to_string(bad_entry) + "]", v,
                     ">= 0 and, with a released row the next append fills (head_pages.extents), "
                     "filling the entry's pages (of " + std::to_string(hp.page_size) +
                         ", the last one partly)");
  }
  const fi_bad_index_fn bad{plan, hp, pages};
  const std::int64_t e = fi_first(exec, bad, num);
  if (e == fi_none) {
    return;
  }
  const std::int64_t s = fi_read(exec, fi_segment_fn{plan}, e);
  const std::int64_t first = fi_read(exec, fi_load_fn{plan.offsets}, s);
  const std::int64_t v = fi_read(exec, fi_load_fn{plan.values}, e);
  const std::int64_t n = fi_read(exec, fi_limit_fn{bad}, s);
  const std::string name =
      std::string(arg) + "[" + std::to_string(s) + "][" + std::to_string(e - first) + "]";
  if (v < 0 || v >= n) {
    throw make_error(where, name, v, "an index in [0, " + std::to_string(n) + ")");
  }
  const std::int64_t prev = fi_read(exec, fi_load_fn{plan.values}, e - 1);
  throw make_error(where, name, v,
                   "strictly ascending indices (previous " + std::to_string(prev) + ")");
}

inline void fi_check_host(std::string_view where, const head_pages_view& hp,
                          segmented_view<const std::int32_t> plan, std::int64_t num,
                          const flashinfer_view& out, std::string_view arg) {
  require(hp.page_size > 0, where, "head_pages.page_size", hp.page_size, "> 0");
  require(hp.entries >= 0, where, "head_pages.entries", hp.entries, ">= 0");
  require(hp.indptr != nullptr && (hp.entries == 0 || hp.lengths != nullptr), where,
          "head_pages.indptr/lengths", "null", "[entries + 1] and [entries] device arrays");
  require(plan.num_segments == hp.entries, where, std::string(arg) + ".num_segments",
          plan.num_segments, [&] {
            return "one segment per (request, KV head) entry (" + std::to_string(hp.entries) + ")";
          });
  require(plan.offsets != nullptr && (num == 0 || plan.values != nullptr), where,
          std::string(arg) + ".offsets/values", "null", "device CSR arrays");
  require(num >= 0 && num <= segmented<std::int32_t>::max_offset, where, "num", num,
          "in [0, INT32_MAX] (int32 offsets)");
  require(out.indptr != nullptr && (num == 0 || out.indices != nullptr) &&
              (hp.entries == 0 || out.last_page_len != nullptr),
          where, "out", "null", "[entries + 1], [num] and [entries] device arrays");
}

struct fi_token_row_fn {
  segmented_view<const std::int32_t> plan;
  head_pages_view hp;
  KVSIFT_HOST_DEVICE std::int32_t operator()(std::int64_t e) const {
    const int s = segment_of(plan.offsets, plan.num_segments, e);
    const std::int32_t slot = plan.values[e];
    const std::int32_t r = hp.rows == nullptr ? slot : hp.rows[hp.row_indptr[s] + slot];
    return hp.pages[hp.indptr[s] + r / hp.page_size] * hp.page_size + r % hp.page_size;
  }
};
struct fi_token_last_fn {
  const std::int32_t* offsets;
  KVSIFT_HOST_DEVICE std::int32_t operator()(std::int64_t s) const {
    return offsets[s + 1] > offsets[s] ? 1 : 0;
  }
};
struct fi_page_id_fn {
  segmented_view<const std::int32_t> plan;
  head_pages_view hp;
  KVSIFT_HOST_DEVICE std::int32_t operator()(std::int64_t e) const {
    const int s = segment_of(plan.offsets, plan.num_segments, e);
    return hp.pages[hp.indptr[s] + plan.values[e]];
  }
};
struct fi_page_last_fn {
  segmented_view<const std::int32_t> plan;
  head_pages_view hp;
  KVSIFT_HOST_DEVICE std::int32_t operator()(std::int64_t s) const {
    const std::int32_t end = plan.offsets[s + 1];
    if (end == plan.offsets[s]) {
      return 0;
    }
    const std::int32_t last = plan.values[end - 1];
    const std::int32_t pages = hp.indptr[s + 1] - hp.indptr[s];
    return last == pages - 1 ? hp.lengths[s] - last * hp.page_size : hp.page_size;
  }
};

}  // namespace detail

// Tokens form (page_size 1) of a device token plan: slots.values[slots.offsets[s] + i] is the
// i-th kept slot of entry s. out.indptr [entries + 1], out.indices [num], out.last_page_len
// [entries]; num = the plan's offsets[entries] (host copy).
template <class Policy>
void flashinfer_tokens(const Policy& exec, const head_pages_view& hp,
                       segmented_view<const std::int32_t> slots, std::int64_t num,
                       flashinfer_view out, bool check = true) {
  constexpr std::string_view where = "thrust::flashinfer_tokens";
  detail::fi_check_host(where, hp, slots, num, out, "slots");
  if (check) detail::fi_check(exec, where, "slots", hp, slots, num, false);
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  ::thrust::copy_n(exec, slots.offsets, slots.num_segments + 1, out.indptr);
  ::thrust::transform(exec, zero, zero + num, out.indices, detail::fi_token_row_fn{slots, hp});
  ::thrust::transform(exec, zero, zero + slots.num_segments, out.last_page_len,
                      detail::fi_token_last_fn{slots.offsets});
}

// Pages form of a device page plan over the store's pages (page_size must be hp.page_size):
// pages.values[pages.offsets[s] + i] is the i-th kept logical page of entry s.
template <class Policy>
void flashinfer_pages(const Policy& exec, const head_pages_view& hp,
                      segmented_view<const std::int32_t> pages, std::int64_t num, int page_size,
                      flashinfer_view out, bool check = true) {
  constexpr std::string_view where = "thrust::flashinfer_pages";
  require(page_size == hp.page_size, where, "page_size", page_size, [&] {
    return "the store's page size (" + std::to_string(hp.page_size) +
           "); export a plan of another page size in the tokens form, from its slots";
  });
  require(hp.rows == nullptr, where, "head_pages.rows", "a row map (a retain reordered rows)",
          "slots in row order: a logical page is a store page only until a retain reorders rows; "
          "export a plan over reordered rows in the tokens form");
  detail::fi_check_host(where, hp, pages, num, out, "pages");
  if (check) detail::fi_check(exec, where, "pages", hp, pages, num, true);
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  ::thrust::copy_n(exec, pages.offsets, pages.num_segments + 1, out.indptr);
  ::thrust::transform(exec, zero, zero + num, out.indices, detail::fi_page_id_fn{pages, hp});
  ::thrust::transform(exec, zero, zero + pages.num_segments, out.last_page_len,
                      detail::fi_page_last_fn{pages, hp});
}

// Owning conveniences: allocate the table (Vector, e.g. thrust::device_vector<std::int32_t>)
// and fill it.
template <class Vector, class Policy>
[[nodiscard]] device_flashinfer_table<Vector> flashinfer_tokens(
    const Policy& exec, const device_head_pages<Vector>& hp, const device_index_sets<Vector>& slots,
    bool check = true) {
  device_flashinfer_table<Vector> t;
  t.page_size = 1;
  t.indptr.resize(slots.offsets.size());
  t.indices.resize(slots.values.size());
  t.last_page_len.resize(slots.offsets.empty() ? 0 : slots.offsets.size() - 1);
  flashinfer_tokens(exec, hp.view(), slots.view(), slots.size(), t.view(), check);
  return t;
}
template <class Vector, class Policy>
[[nodiscard]] device_flashinfer_table<Vector> flashinfer_pages(
    const Policy& exec, const device_head_pages<Vector>& hp, const device_index_sets<Vector>& pages,
    int page_size, bool check = true) {
  device_flashinfer_table<Vector> t;
  t.page_size = page_size;
  t.indptr.resize(pages.offsets.size());
  t.indices.resize(pages.values.size());
  t.last_page_len.resize(pages.offsets.empty() ? 0 : pages.offsets.size() - 1);
  flashinfer_pages(exec, hp.view(), pages.view(), pages.size(), page_size, t.view(), check);
  return t;
}

}  // namespace kvsift::thrust
