// SPDX-License-Identifier: Apache-2.0
#pragma once

// FreeKV's group-consistent page scores with Thrust. Mirrors score::freekv_pages
// (cpu::page_bound, cpu::freekv_group_scores) operation for operation, over the digests of
// thrust::page_digest (thrust/page_minmax.hpp):
//   freekv_softmax_stats  per (segment, query head): max and float(1 / sum exp) of the bounds
//                         over the candidate pages                   one thread per (s, g)
//   freekv_group_scores   per page: candidates merged over the group (softmax_mean, mean, max),
//                         sink and window pages 0                    one thread per page
// Workspace: 2 * num_segments * group floats (freekv_workspace_bytes), no allocation.

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

  KVSIFT_HOST_DEVICE const float* query(int s, int g) const {
    const int r = s / kv_heads;
    const int h = s % kv_heads;
    const std::int64_t q_heads = static_cast<std::int64_t>(kv_heads) * group;
    return queries + (r * q_heads + static_cast<std::int64_t>(h) * group + g) * dim;
  }
  KVSIFT_HOST_DEVICE float bound(const float* q, std::int64_t pg) const {
    return kvsift::page_bound(q, kmin + pg * dim, kmax + pg * dim, dim);
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
    float mx = f.bound(q, first);
    for (std::int64_t pg = first + 1; pg < last; ++pg) {
      const float b = f.bound(q, pg);
      mx = b > mx ? b : mx;
    }
    double sum = 0.0;
    for (std::int64_t pg = first; pg < last; ++pg) sum += std::exp(f.bound(q, pg) - mx);
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
        const float p = std::exp(f.bound(f.query(s, g), pg) - row_max[e]);
        acc += p * row_inv[e];
      }
      out[pg] = acc / static_cast<float>(f.group);
      return;
    }
    acc = f.bound(f.query(s, 0), pg);
    for (int g = 1; g < f.group; ++g) {
      const float v = f.bound(f.query(s, g), pg);
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
  constexpr std::string_view where = "thrust::freekv_group_scores";
  require(kv_heads > 0 && num_segments % kv_heads == 0, where, "kv_heads", kv_heads,
          "a positive divisor of num_segments (" + std::to_string(num_segments) + ")");
  require(group > 0, where, "group", group, "> 0");
  require(dim > 0, where, "dim", dim, "> 0");
  require(num_pages >= 0, where, "num_pages", num_pages, ">= 0");
  score::freekv_pages{{.page_size = page_size, .sink = sink, .window = window, .merge = merge}}
      .validate(where);
  require(workspace_bytes >= freekv_workspace_bytes(num_segments, group), where, "workspace_bytes",
          workspace_bytes, ">= freekv_workspace_bytes(num_segments, group)");
  float* row_max = static_cast<float*>(workspace);
  float* row_inv = row_max + static_cast<std::size_t>(num_segments) * group;
  const detail::freekv_pages_fn f{queries,      kmin,  kmax, page_offsets, num_segments,
                                  kv_heads,     group, dim,  sink / page_size,
                                  window / page_size};
  if (merge == score::freekv_merge::softmax_mean) {
    ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0),
                         static_cast<std::int64_t>(num_segments) * group,
                         detail::freekv_stats_fn{f, row_max, row_inv});
  }
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_pages,
                       detail::freekv_merge_fn{f, merge, row_max, row_inv, out});
}

}  // namespace kvsift::thrust
