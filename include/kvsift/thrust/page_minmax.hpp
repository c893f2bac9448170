// SPDX-License-Identifier: Apache-2.0
#pragma once

// Quest page digests and page scores with Thrust. Mirrors score::page_minmax (cpu::page_digest,
// cpu::page_bound, cpu::reduce_group) operation for operation.
//   page_offsets   CSR of pages per segment: ceil(n_s / page_size)        scan
//   page_digest    kmin/kmax [pages, d] per page and channel               one thread per (page, c)
//   page_scores    sum_c max(q_c kmax_c, q_c kmin_c), GQA-reduced          one thread per page
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
  KVSIFT_HOST_DEVICE float bound(const float* q, std::int64_t pg) const {
    const float* lo = kmin + pg * dim;
    const float* hi = kmax + pg * dim;
    return kvsift::page_bound(q, lo, hi, dim);
  }
  KVSIFT_HOST_DEVICE void operator()(std::int64_t pg) const {
    const int s = segment_of(page_offsets, num_segments, pg);
    const int r = s / kv_heads;
    const int h = s % kv_heads;
    const std::int64_t q_heads = static_cast<std::int64_t>(kv_heads) * group;
    const float* q0 = queries + (r * q_heads + static_cast<std::int64_t>(h) * group) * dim;
    float acc = bound(q0, pg);
    for (int g = 1; g < group; ++g) {
      const float v = bound(q0 + static_cast<std::int64_t>(g) * dim, pg);
      acc = mode == gqa_reduce::max ? (acc < v ? v : acc) : acc + v;
    }
    out[pg] = mode == gqa_reduce::mean ? acc / static_cast<float>(group) : acc;
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
//   queries  [requests, kv_heads * group, d]: one query per request (the newest)
template <class Policy>
void page_scores(const Policy& exec, const float* queries, int kv_heads, int group, int dim,
                 const float* kmin, const float* kmax, const std::int32_t* page_offsets,
                 int num_segments, std::int64_t num_pages, gqa_reduce gqa, float* out) {
  constexpr std::string_view where = "thrust::page_scores";
  require(kv_heads > 0 && num_segments % kv_heads == 0, where, "kv_heads", kv_heads,
          "a positive divisor of num_segments (" + std::to_string(num_segments) + ")");
  require(group > 0, where, "group", group, "> 0");
  require(dim > 0, where, "dim", dim, "> 0");
  require(num_pages >= 0, where, "num_pages", num_pages, ">= 0");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_pages,
                       detail::page_score_fn{queries, kmin, kmax, page_offsets, num_segments,
                                             kv_heads, group, dim, gqa, out});
}

}  // namespace kvsift::thrust
