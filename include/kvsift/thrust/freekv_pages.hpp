// SPDX-License-Identifier: Apache-2.0
#pragma once

// FreeKV's group-consistent page scores with Thrust. Mirrors score::freekv_pages
// (cpu::page_bound, cpu::freekv_group_scores) operation for operation, over the digests of
// thrust::page_digest (thrust/page_minmax.hpp):
//   freekv_softmax_stats  per (segment, query head): max and float(1 / sum exp) of the bounds
//                         over the candidate pages                   one thread per (s, g)
//   freekv_group_scores   per page: candidates merged over the group (softmax_mean, mean, max),
//                         sink and window pages 0                    one thread per page
//   freekv_group_scores_strided  the same over digests kept at a fixed stride per segment
// Workspace: 2 * num_segments * group floats (freekv_workspace_bytes), no allocation.
// FreeKV's decode on the device (schedule::speculative) adds:
//   page_digest_append    the new token folded into its page's digest   one thread per (s, c)
//   pages_to_positions    the positions of selected pages (pool_pages::page_positions)
//   choose_sets           per segment one of two same-shaped sets (corrected heads: q_t's
//                         selection, the others the speculative one)   one thread per entry

#include <kvsift/core/dot.hpp>
#include <kvsift/score/freekv_pages.hpp>
#include <kvsift/thrust/math.hpp>
#include <kvsift/thrust/page_minmax.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace kvsift::thrust {

namespace detail {

struct freekv_pages_fn {
  const float* queries;  // [requests, kv_heads * group, dim]
  const float* kmin;
  const float* kmax;
  const std::int32_t* page_offsets;
  int num_segments;
  int kv_heads;
  int group;
  int dim;
  int sink_pages;
  int window_pages;
  std::int64_t digest_pages = 0;  // 0: digests at page_offsets; > 0: segment s's at s * digest_pages

  KVSIFT_HOST_DEVICE const float* query(int s, int g) const {
    const int r = s / kv_heads;
    const int h = s % kv_heads;
    const std::int64_t q_heads = static_cast<std::int64_t>(kv_heads) * group;
    return queries + (r * q_heads + static_cast<std::int64_t>(h) * group + g) * dim;
  }
  // Bound of global page pg (of segment s) under query q.
  KVSIFT_HOST_DEVICE float bound(const float* q, int s, std::int64_t pg) const {
    const std::int64_t at = digest_pages == 0 ? pg : s * digest_pages + (pg - page_offsets[s]);
    return kvsift::page_bound(q, kmin + at * dim, kmax + at * dim, dim);
  }
  // Candidate pages of segment s, as global page indices [first, last).
  KVSIFT_HOST_DEVICE void candidates(int s, std::int64_t& first, std::int64_t& last) const {
    const int pages = page_offsets[s + 1] - page_offsets[s];
    const int c0 = sink_pages;
    const int c1 = pages - window_pages > c0 ? pages - window_pages : c0;
    first = page_offsets[s] + c0;
    last = page_offsets[s] + c1;
  }
};

struct freekv_stats_fn {
  freekv_pages_fn f;
  float* row_max;  // [num_segments * group]
  float* row_inv;  // [num_segments * group]
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = static_cast<int>(e / f.group);
    const int g = static_cast<int>(e % f.group);
    std::int64_t first = 0, last = 0;
    f.candidates(s, first, last);
    if (last <= first) {
      row_max[e] = 0.0f;
      row_inv[e] = 0.0f;
      return;
    }
    const float* q = f.query(s, g);
    float mx = f.bound(q, s, first);
    for (std::int64_t pg = first + 1; pg < last; ++pg) {
      const float b = f.bound(q, s, pg);
      mx = b > mx ? b : mx;
    }
    double sum = 0.0;
    for (std::int64_t pg = first; pg < last; ++pg) sum += exact_expf(f.bound(q, s, pg) - mx);
    row_max[e] = mx;
    row_inv[e] = static_cast<float>(1.0 / sum);
  }
};

struct freekv_merge_fn {
  freekv_pages_fn f;
  score::freekv_merge merge;
  const float* row_max;
  const float* row_inv;
  float* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t pg) const {
    const int s = segment_of(f.page_offsets, f.num_segments, pg);
    std::int64_t first = 0, last = 0;
    f.candidates(s, first, last);
    if (pg < first || pg >= last) {
      out[pg] = 0.0f;
      return;
    }
    float acc = 0.0f;
    if (merge == score::freekv_merge::softmax_mean) {
      for (int g = 0; g < f.group; ++g) {
        const std::int64_t e = static_cast<std::int64_t>(s) * f.group + g;
        const float p = exact_expf(f.bound(f.query(s, g), s, pg) - row_max[e]);
        acc += mul_rn(p, row_inv[e]);
      }
      out[pg] = acc / static_cast<float>(f.group);
      return;
    }
    acc = f.bound(f.query(s, 0), s, pg);
    for (int g = 1; g < f.group; ++g) {
      const float v = f.bound(f.query(s, g), s, pg);
      acc = merge == score::freekv_merge::max ? (acc < v ? v : acc) : acc + v;
    }
    out[pg] = merge == score::freekv_merge::mean ? acc / static_cast<float>(f.group) : acc;
  }
};

}  // namespace detail

// Workspace of freekv_group_scores: 2 * num_segments * group floats.
inline std::size_t freekv_workspace_bytes(int num_segments, int group) {
  return 2 * static_cast<std::size_t>(num_segments) * static_cast<std::size_t>(group) * sizeof(float);
}

// freekv_group_scores over digests kept per segment at a fixed stride: segment s's page j at
// kmin/kmax + (s * digest_pages + j) * d (digest_pages = 0: at page_offsets[s] + j, as
// freekv_group_scores). The scored layout (page_offsets, the output's CSR) may be shorter than
// the digests (FreeKV decode: digests of the whole host pool kept on the device, grown by
// page_digest_append, scored on a step's layout one token ahead).
template <class Policy>
void freekv_group_scores_strided(const Policy& exec, const float* queries, int kv_heads, int group,
                         int dim, const float* kmin, const float* kmax, std::int64_t digest_pages,
                         const std::int32_t* page_offsets,
                         int num_segments, std::int64_t num_pages, int page_size, int sink,
                         int window, score::freekv_merge merge, float* out, void* workspace,
                         std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::freekv_group_scores";
  require(kv_heads > 0 && num_segments % kv_heads == 0, where, "kv_heads", kv_heads,
          "a positive divisor of num_segments (" + std::to_string(num_segments) + ")");
  require(group > 0, where, "group", group, "> 0");
  require(dim > 0, where, "dim", dim, "> 0");
  require(num_pages >= 0, where, "num_pages", num_pages, ">= 0");
  require(digest_pages >= 0, where, "digest_pages", digest_pages, ">= 0");
  score::freekv_pages{{.page_size = page_size, .sink = sink, .window = window, .merge = merge}}
      .validate(where);
  require(workspace_bytes >= freekv_workspace_bytes(num_segments, group), where, "workspace_bytes",
          workspace_bytes, ">= freekv_workspace_bytes(num_segments, group)");
  float* row_max = static_cast<float*>(workspace);
  float* row_inv = row_max + static_cast<std::size_t>(num_segments) * group;
  const detail::freekv_pages_fn f{queries,      kmin,  kmax, page_offsets, num_segments,
                                  kv_heads,     group, dim,  sink / page_size,
                                  window / page_size, digest_pages};
  if (merge == score::freekv_merge::softmax_mean) {
    ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0),
                         static_cast<std::int64_t>(num_segments) * group,
                         detail::freekv_stats_fn{f, row_max, row_inv});
  }
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_pages,
                       detail::freekv_merge_fn{f, merge, row_max, row_inv, out});
}


// out[p] = FreeKV's group score of page p (score::freekv_pages::score with the layout of each
// segment's length): candidate pages [S/p, P - W/p) of each segment merged over the G query heads
// of its KV head with `merge`; sink and window pages 0.
//   queries       [requests, kv_heads * group, d]: one query per request (the newest)
//   kmin, kmax    thrust::page_digest's digests; page_offsets from thrust::page_offsets
//   sink, window  tokens, whole pages of page_size
template <class Policy>
void freekv_group_scores(const Policy& exec, const float* queries, int kv_heads, int group, int dim,
                         const float* kmin, const float* kmax, const std::int32_t* page_offsets,
                         int num_segments, std::int64_t num_pages, int page_size, int sink,
                         int window, score::freekv_merge merge, float* out, void* workspace,
                         std::size_t workspace_bytes) {
  freekv_group_scores_strided(exec, queries, kv_heads, group, dim, kmin, kmax, 0, page_offsets,
                              num_segments, num_pages, page_size, sink, window, merge, out,
                              workspace, workspace_bytes);
}


namespace detail {

// Folds the new token's key into the digest of its page (a new page starts from +inf / -inf):
// the same comparisons, in token order, as cpu::page_digest / thrust::page_digest recomputing
// the page, so the same bits.
template <class T>
struct digest_append_fn {
  const T* keys;  // [S, d] the new token of each segment
  int dim;
  int index;      // the token's index in every segment's pool
  int page_size;
  std::int64_t digest_pages;
  float* kmin;
  float* kmax;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = static_cast<int>(e / dim);
    const int c = static_cast<int>(e % dim);
    const std::int64_t at = (s * digest_pages + index / page_size) * dim + c;
    const float x = to_float(keys[e]);
    float mn = index % page_size == 0 ? -neg_inf() : kmin[at];
    float mx = index % page_size == 0 ? neg_inf() : kmax[at];
    mn = x < mn ? x : mn;
    mx = mx < x ? x : mx;
    kmin[at] = mn;
    kmax[at] = mx;
  }
};

struct pages_to_positions_fn {
  const std::int32_t* page_offsets;  // [S + 1] selected pages per segment
  const std::int32_t* pages;         // ascending, all full but the segment's last
  const std::int32_t* out_offsets;   // [S + 1]
  int num_segments;
  int page_size;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(out_offsets, num_segments, t);
    const int i = static_cast<int>(t - out_offsets[s]);
    out[t] = pages[page_offsets[s] + i / page_size] * page_size + i % page_size;
  }
};

struct choose_sets_fn {
  const std::int32_t* offsets;
  int num_segments;
  const std::int32_t* flags;  // [S]
  const std::int32_t* if_set;
  const std::int32_t* if_clear;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(offsets, num_segments, t);
    out[t] = flags[s] != 0 ? if_set[t] : if_clear[t];
  }
};

}  // namespace detail

// Appends one token to the page digests of every segment: its key (row s of keys, [S, d]) is
// token `index` of each segment's pool (the same index in all: one request's head-sequences);
// digests [S, digest_pages, d] (kmin, kmax). Page index / page_size must be < digest_pages.
// The digest of the whole pool, kept on the device while the pool only appends (FreeKV's
// "digests kept incrementally").
template <class Policy, Element T>
void page_digest_append(const Policy& exec, const T* keys, int num_segments, int dim, int index,
                        int page_size, std::int64_t digest_pages, float* kmin, float* kmax) {
  constexpr std::string_view where = "thrust::page_digest_append";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(dim > 0, where, "dim", dim, "> 0");
  require(page_size > 0, where, "page_size", page_size, "> 0");
  require(index >= 0 && index / page_size < digest_pages, where, "index", index,
          "a token whose page is below digest_pages (" + std::to_string(digest_pages) + ")");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0),
                       static_cast<std::int64_t>(num_segments) * dim,
                       detail::digest_append_fn<T>{keys, dim, index, page_size, digest_pages, kmin,
                                                   kmax});
}

// The pool positions of selected pages (domain::pool_pages::page_positions for a pool whose
// token i has position i): out segment s = the tokens of pages[page_offsets[s] ..) in order.
// Every selected page but a segment's last is full (FreeKV: the last is the current page, in
// the window), so out_offsets[s + 1] - out_offsets[s] = (pages_s - 1) * page_size + the last
// page's tokens: a shape the host computes. No workspace.
template <class Policy>
void pages_to_positions(const Policy& exec, const std::int32_t* page_offsets,
                        const std::int32_t* pages, int num_segments, int page_size,
                        const std::int32_t* out_offsets, std::int64_t num_out, std::int32_t* out) {
  constexpr std::string_view where = "thrust::pages_to_positions";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(page_size > 0, where, "page_size", page_size, "> 0");
  require(num_out >= 0, where, "num_out", num_out, ">= 0");
  if (num_segments == 0 || num_out == 0) {
    return;
  }
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_out,
                       detail::pages_to_positions_fn{page_offsets, pages, out_offsets,
                                                     num_segments, page_size, out});
}

// Per segment, one of two index sets of the same shape: out segment s = if_set's when flags[s]
// != 0, else if_clear's (FreeKV: the corrected heads take the selection with q_t, the others the
// speculative one made after the previous step). offsets [S + 1] shared by all three; num =
// offsets[S] (host).
template <class Policy>
void choose_sets(const Policy& exec, const std::int32_t* offsets, int num_segments,
                 std::int64_t num, const std::int32_t* flags, const std::int32_t* if_set,
                 const std::int32_t* if_clear, std::int32_t* out) {
  require(num_segments >= 0, "thrust::choose_sets", "num_segments", num_segments, ">= 0");
  if (num_segments == 0 || num == 0) {
    return;
  }
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num,
                       detail::choose_sets_fn{offsets, num_segments, flags, if_set, if_clear, out});
}

}  // namespace kvsift::thrust
