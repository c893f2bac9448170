// SPDX-License-Identifier: Apache-2.0
#pragma once

// Quest page digests and page scores with Thrust. Mirrors score::page_minmax (cpu::page_digest,
// cpu::page_bound, cpu::reduce_group) operation for operation.
//   page_offsets   CSR of pages per segment: ceil(n_s / page_size)        scan
//   page_digest    kmin/kmax [pages, d] per page and channel               one thread per (page, c)
//   page_scores    sum_c max(q_c kmax_c, q_c kmin_c), GQA-reduced          one thread per page
//
// Decode (Quest's sparse read, schedule::sparse_read): the digests live in a strided layout
// [S, digest_stride, d] (page pg of segment s at s * digest_stride + pg) so that a step updates
// only the page its token lands in, as score::page_minmax refreshes its cache from the last
// cached page on; page_scores reads that layout with digest_stride > 0.
//   page_digest_tail   recompute the last `tail` pages of every segment   one thread per (page, c)
//   expand_page_slots  the slots of the selected pages (select::expand_pages)  one thread per slot
// No workspace.

#include <kvsift/core/dot.hpp>
#include <kvsift/thrust/math.hpp>

#include <cstdint>

namespace kvsift::thrust {

namespace detail {

struct page_count_fn {
  const std::int32_t* offsets;
  int page_size;
  KVSIFT_HOST_DEVICE std::int32_t operator()(int s) const {
    return (offsets[s + 1] - offsets[s] + page_size - 1) / page_size;
  }
};

template <class T>
struct digest_fn {
  segmented_rows<T> keys;
  const std::int32_t* page_offsets;
  int page_size;
  float* kmin;
  float* kmax;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t pg = e / keys.dim;
    const int c = static_cast<int>(e % keys.dim);
    const int s = segment_of(page_offsets, keys.num_segments, pg);
    const int local = static_cast<int>(pg - page_offsets[s]);
    const int n = keys.length(s);
    const int first = local * page_size;
    const int last = first + page_size < n ? first + page_size : n;
    float mn = -neg_inf();
    float mx = neg_inf();
    for (int j = first; j < last; ++j) {
      const float x = to_float(keys.row(s, j)[c]);
      mn = x < mn ? x : mn;
      mx = mx < x ? x : mx;
    }
    kmin[e] = mn;
    kmax[e] = mx;
  }
};

struct page_score_fn {
  const float* queries;  // [requests, kv_heads * group, dim]
  const float* kmin;
  const float* kmax;
  const std::int32_t* page_offsets;
  int num_segments;
  int kv_heads;
  int group;
  int dim;
  gqa_reduce mode;
  float* out;
  std::int64_t digest_stride;  // 0: digests packed by page_offsets; else [S, stride, d]
  KVSIFT_HOST_DEVICE float bound(const float* q, std::int64_t at) const {
    const float* lo = kmin + at * dim;
    const float* hi = kmax + at * dim;
    return kvsift::page_bound(q, lo, hi, dim);
  }
  KVSIFT_HOST_DEVICE void operator()(std::int64_t pg) const {
    const int s = segment_of(page_offsets, num_segments, pg);
    const int r = s / kv_heads;
    const int h = s % kv_heads;
    const std::int64_t at = digest_stride == 0 ? pg : s * digest_stride + (pg - page_offsets[s]);
    const std::int64_t q_heads = static_cast<std::int64_t>(kv_heads) * group;
    const float* q0 = queries + (r * q_heads + static_cast<std::int64_t>(h) * group) * dim;
    float acc = bound(q0, at);
    for (int g = 1; g < group; ++g) {
      const float v = bound(q0 + static_cast<std::int64_t>(g) * dim, at);
      acc = mode == gqa_reduce::max ? (acc < v ? v : acc) : acc + v;
    }
    out[pg] = mode == gqa_reduce::mean ? acc / static_cast<float>(group) : acc;
  }
};

// The last `tail` pages of every segment, strided: thread (s, k, c) recomputes local page
// P_s - tail + k (skipped when negative), as cpu::page_digest does from its first_page on.
template <class T>
struct digest_tail_fn {
  segmented_rows<T> keys;
  int page_size;
  int tail;
  std::int64_t digest_stride;
  float* kmin;
  float* kmax;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int d = keys.dim;
    const int c = static_cast<int>(e % d);
    const std::int64_t sk = e / d;
    const int s = static_cast<int>(sk / tail);
    const int k = static_cast<int>(sk % tail);
    const int n = keys.length(s);
    const int pages = (n + page_size - 1) / page_size;
    const int local = pages - tail + k;
    if (local < 0) {
      return;
    }
    const int first = local * page_size;
    const int last = first + page_size < n ? first + page_size : n;
    float mn = -neg_inf();
    float mx = neg_inf();
    for (int j = first; j < last; ++j) {
      const float x = to_float(keys.row(s, j)[c]);
      mn = x < mn ? x : mn;
      mx = mx < x ? x : mx;
    }
    const std::int64_t at = (static_cast<std::int64_t>(s) * digest_stride + local) * d + c;
    kmin[at] = mn;
    kmax[at] = mx;
  }
};

// Slot t of the expansion: entry i of segment s is slot pages[k] * page_size + i % page_size,
// k = i / page_size (every selected page but the segment's last page is full, so the selected
// pages' slots run in blocks of page_size).
struct expand_pages_fn {
  const std::int32_t* page_kept_offsets;
  const std::int32_t* pages;
  const std::int32_t* slot_offsets;
  int num_segments;
  int page_size;
  std::int32_t* slots;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(slot_offsets, num_segments, t);
    const int i = static_cast<int>(t - slot_offsets[s]);
    slots[t] = pages[page_kept_offsets[s] + i / page_size] * page_size + i % page_size;
  }
};

}  // namespace detail

// page_offsets[0] = 0, page_offsets[s + 1] = page_offsets[s] + ceil(n_s / page_size).
template <class Policy>
void page_offsets(const Policy& exec, const std::int32_t* offsets, int num_segments, int page_size,
                  std::int32_t* out_page_offsets) {
  constexpr std::string_view where = "thrust::page_offsets";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(page_size > 0, where, "page_size", page_size, "> 0");
  ::thrust::fill_n(exec, out_page_offsets, 1, 0);
  auto counts = ::thrust::make_transform_iterator(::thrust::counting_iterator<int>(0),
                                                  detail::page_count_fn{offsets, page_size});
  ::thrust::inclusive_scan(exec, counts, counts + num_segments, out_page_offsets + 1);
}

// Per page and channel min and max of the keys (pages of page_size tokens from token 0, the last
// one possibly partial). kmin, kmax: [num_pages, d], num_pages = page_offsets[S] (host copy).
template <class Policy, Element T>
void page_digest(const Policy& exec, const segmented_rows<T>& keys,
                 const std::int32_t* page_offsets, std::int64_t num_pages, int page_size,
                 float* kmin, float* kmax) {
  constexpr std::string_view where = "thrust::page_digest";
  keys.validate(where, "keys");
  require(page_size > 0, where, "page_size", page_size, "> 0");
  require(num_pages >= 0, where, "num_pages", num_pages, ">= 0");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_pages * keys.dim,
                       detail::digest_fn<T>{keys, page_offsets, page_size, kmin, kmax});
}

// out[p] = Quest score of page p for the query of its request: the G query heads of the KV head
// each score sum_c max(q_c kmax_c, q_c kmin_c) (no scale), reduced with `gqa` in group order.
//   queries        [requests, kv_heads * group, d]: one query per request (the newest)
//   digest_stride  0: kmin / kmax packed [num_pages, d] by page_offsets; > 0: strided [S,
//                  digest_stride, d] (page_digest_tail's layout), page pg of segment s at
//                  s * digest_stride + pg. out is packed by page_offsets either way.
template <class Policy>
void page_scores(const Policy& exec, const float* queries, int kv_heads, int group, int dim,
                 const float* kmin, const float* kmax, const std::int32_t* page_offsets,
                 int num_segments, std::int64_t num_pages, gqa_reduce gqa, float* out,
                 std::int64_t digest_stride = 0) {
  constexpr std::string_view where = "thrust::page_scores";
  require(kv_heads > 0 && num_segments % kv_heads == 0, where, "kv_heads", kv_heads,
          "a positive divisor of num_segments (" + std::to_string(num_segments) + ")");
  require(group > 0, where, "group", group, "> 0");
  require(dim > 0, where, "dim", dim, "> 0");
  require(num_pages >= 0, where, "num_pages", num_pages, ">= 0");
  require(digest_stride >= 0, where, "digest_stride", digest_stride, ">= 0 (0 = packed)");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_pages,
                       detail::page_score_fn{queries, kmin, kmax, page_offsets, num_segments,
                                             kv_heads, group, dim, gqa, out, digest_stride});
}

// Recomputes the digests of the last `tail` pages of every segment (fewer where a segment has
// fewer pages) into the strided layout kmin / kmax [S, digest_stride, d]; the other pages are
// left as they are. After a decode step's append (one token per segment) tail = 1 updates the
// page the token landed in, which is what score::page_minmax's incremental refresh recomputes;
// tail = digest_stride digests everything (a prompt's install). digest_stride must be >= every
// segment's page count ceil(n_s / page_size) (the caller's capacity in pages).
template <class Policy, Element T>
void page_digest_tail(const Policy& exec, const segmented_rows<T>& keys, int page_size, int tail,
                      float* kmin, float* kmax, std::int64_t digest_stride) {
  constexpr std::string_view where = "thrust::page_digest_tail";
  keys.validate(where, "keys");
  require(page_size > 0, where, "page_size", page_size, "> 0");
  require(tail >= 0, where, "tail", tail, ">= 0");
  require(digest_stride > 0, where, "digest_stride", digest_stride,
          "> 0: pages per segment in the strided digest layout");
  if (tail == 0 || keys.num_segments == 0) {
    return;
  }
  require(kmin != nullptr && kmax != nullptr, where, "kmin / kmax", "null",
          "[S, digest_stride, d] digests");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0),
                       static_cast<std::int64_t>(keys.num_segments) * tail * keys.dim,
                       detail::digest_tail_fn<T>{keys, page_size, tail, digest_stride, kmin,
                                                 kmax});
}

// The slots a page selection reads (select::expand_pages): per segment s, every slot of each
// selected page, in page order, the segment's last page cut at its length.
//   page_kept_offsets, pages  CSR of the selected pages (ascending local page indices), as
//                             segmented_topk writes them; every page but the segment's last
//                             one is full, so only a selected last page can be partial
//   slot_offsets              [S + 1] CSR of the slots: n_s - (P_s - k_s) * page_size for a
//                             selection of k_s of P_s pages that keeps the last page (Quest's
//                             select::page_topk always does), n_s when it keeps them all; host
//                             arithmetic on lengths and page counts (shapes)
//   num_slots                 slot_offsets[S] (host copy); slots: [num_slots], ascending
template <class Policy>
void expand_page_slots(const Policy& exec, const std::int32_t* page_kept_offsets,
                       const std::int32_t* pages, int num_segments, int page_size,
                       const std::int32_t* slot_offsets, std::int64_t num_slots,
                       std::int32_t* slots) {
  constexpr std::string_view where = "thrust::expand_page_slots";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(page_size > 0, where, "page_size", page_size, "> 0");
  require(num_slots >= 0, where, "num_slots", num_slots, ">= 0");
  if (num_slots == 0) {
    return;
  }
  require(page_kept_offsets != nullptr && pages != nullptr && slot_offsets != nullptr &&
              slots != nullptr,
          where, "pages / slots", "null", "the CSR of pages and of slots");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_slots,
                       detail::expand_pages_fn{page_kept_offsets, pages, slot_offsets,
                                               num_segments, page_size, slots});
}

}  // namespace kvsift::thrust
