// SPDX-License-Identifier: Apache-2.0
#pragma once

// Observation-window attention scores (SnapKV, PyramidKV, DynamicKV) with Thrust. Mirrors
// score::window_attention exactly: for each KV head and each of the `window` newest queries of
// its group's query heads, the causal softmax over every key the query sees (window keys
// included); for the past tokens (positions before the first window query) the mean over the
// window queries, pooling along tokens, and the GQA reduction. Window tokens score 0.
//
// Stages (each a Thrust for_each over a counting iterator, policy passed in):
//   1. past[s]     = tokens of s before the first window query        one thread per segment
//   2. logits      q . k / sqrt(d) for every (s, g, i, j)              one thread per logit
//   3. softmax     over the visible prefix of every row (s, g, i)      one thread per row
//   4. means       over i of the past columns of (s, g)                one thread per column
//   5. pooled      along tokens of every (s, g)                        one thread per token
//   6. scores      GQA reduction over g                                one thread per token
// Workspace: G * window * N + 2 * G * N floats + S ints (N = total tokens), from
// window_attention_workspace_bytes. Cost O(G * window * N * d).

#include <kvsift/core/dot.hpp>
#include <kvsift/thrust/math.hpp>

#include <kvsift/score/window_attention.hpp>
#include <kvsift/thrust/round.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace kvsift::thrust {

// Geometry of the queries of a ragged batch: segment s is KV head s % kv_heads of request
// s / kv_heads, which serves query heads h * group .. h * group + group - 1.
struct window_queries {
  const float* data = nullptr;                 // [requests, window, kv_heads * group, dim]
  const std::int32_t* first_position = nullptr;  // [requests] original position of query 0
  int window = 0;                              // queries per request (the newest ones)
  int kv_heads = 1;
  int group = 1;

  [[nodiscard]] KVSIFT_HOST_DEVICE const float* row(int request, int i, int q_head, int dim) const {
    const int q_heads = kv_heads * group;
    return data + ((static_cast<std::int64_t>(request) * window + i) * q_heads + q_head) * dim;
  }
};

struct window_score_params {
  int kernel = 7;
  pooling pool = pooling::avg;
  gqa_reduce gqa = gqa_reduce::mean;
};

namespace detail {

// Offsets scaled by a constant: the CSR of `m` consecutive rows per token.
struct scaled_offsets {
  const std::int32_t* offsets;
  std::int64_t m;
  KVSIFT_HOST_DEVICE std::int64_t operator[](int s) const { return offsets[s] * m; }
};

struct window_layout {
  float* probs = nullptr;      // [G * w * N]: row (s, g, i) at offsets[s] * G * w + (g * w + i) * n_s
  float* means = nullptr;      // [G * N]:     row (s, g) at offsets[s] * G + g * n_s
  float* pooled = nullptr;     // [G * N]:     same layout
  std::int32_t* past = nullptr;  // [S]
  std::size_t bytes = 0;
};

inline window_layout make_window_layout(std::byte* ws, std::int64_t num_items, int num_segments,
                                        int group, int window) {
  carver c{ws};
  window_layout l;
  l.probs = c.take<float>(static_cast<std::size_t>(num_items) * group * window);
  l.means = c.take<float>(static_cast<std::size_t>(num_items) * group);
  l.pooled = c.take<float>(static_cast<std::size_t>(num_items) * group);
  l.past = c.take<std::int32_t>(static_cast<std::size_t>(num_segments));
  l.bytes = c.bytes;
  return l;
}

template <class T>
struct past_fn {
  segmented_rows<T> keys;
  window_queries q;
  std::int32_t* past;
  KVSIFT_HOST_DEVICE void operator()(int s) const {
    past[s] = keys.visible(s, q.first_position[s / q.kv_heads] - 1);
  }
};

template <class T>
struct logits_fn {
  segmented_rows<T> keys;
  window_queries q;
  float* probs;
  float scale;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t rows = static_cast<std::int64_t>(q.group) * q.window;
    const int s = segment_of(scaled_offsets{keys.offsets, rows}, keys.num_segments, e);
    const int n = keys.length(s);
    const std::int64_t local = e - keys.offsets[s] * rows;
    const int row = static_cast<int>(local / n);
    const int j = static_cast<int>(local % n);
    const int g = row / q.window;
    const int i = row % q.window;
    const int r = s / q.kv_heads;
    const int h = s % q.kv_heads;
    if (j >= keys.visible(s, q.first_position[r] + i)) {
      probs[e] = 0.0f;
      return;
    }
    const float* qv = q.row(r, i, h * q.group + g, keys.dim);
    const T* k = keys.row(s, j);
    probs[e] = kvsift::dot(qv, k, keys.dim) * scale;  // cpu::dot's order
  }
};

template <class T>
struct row_softmax_fn {
  segmented_rows<T> keys;
  window_queries q;
  float* probs;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t row) const {
    const std::int64_t rows = static_cast<std::int64_t>(q.group) * q.window;
    const int s = static_cast<int>(row / rows);
    const int gi = static_cast<int>(row % rows);
    const int i = gi % q.window;
    const int n = keys.length(s);
    const int v = keys.visible(s, q.first_position[s / q.kv_heads] + i);
    softmax_row(probs + keys.offsets[s] * rows + static_cast<std::int64_t>(gi) * n, v);
  }
};

struct window_mean_fn {
  const std::int32_t* offsets;
  int num_segments;
  int group;
  int window;
  const std::int32_t* past;
  const float* probs;
  float* means;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(scaled_offsets{offsets, group}, num_segments, e);
    const int n = offsets[s + 1] - offsets[s];
    const std::int64_t local = e - static_cast<std::int64_t>(offsets[s]) * group;
    const int g = static_cast<int>(local / n);
    const int j = static_cast<int>(local % n);
    if (j >= past[s]) {
      means[e] = 0.0f;
      return;
    }
    const float* p = probs + static_cast<std::int64_t>(offsets[s]) * group * window +
                     static_cast<std::int64_t>(g) * window * n;
    float acc = 0.0f;  // score::window_attention order: row[j] += probs[j] per query, then / nq
    for (int i = 0; i < window; ++i) {
      acc += p[static_cast<std::int64_t>(i) * n + j];
    }
    means[e] = acc / static_cast<float>(window);
  }
};

struct window_pool_fn {
  const std::int32_t* offsets;
  int num_segments;
  int group;
  const std::int32_t* past;
  const float* means;
  float* pooled;
  int kernel;
  pooling mode;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(scaled_offsets{offsets, group}, num_segments, e);
    const int n = offsets[s + 1] - offsets[s];
    const std::int64_t local = e - static_cast<std::int64_t>(offsets[s]) * group;
    const int j = static_cast<int>(local % n);
    const std::int64_t row_start = e - j;
    pooled[e] = j < past[s] ? pool_at(means + row_start, past[s], j, kernel, mode) : 0.0f;
  }
};

struct window_gqa_fn {
  const std::int32_t* offsets;
  int num_segments;
  int group;
  const std::int32_t* past;
  const float* pooled;
  float* out;
  gqa_reduce mode;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(offsets, num_segments, e);
    const int n = offsets[s + 1] - offsets[s];
    const int j = static_cast<int>(e - offsets[s]);
    out[e] = j < past[s] ? reduce_at(pooled + static_cast<std::int64_t>(offsets[s]) * group, n,
                                     group, j, mode)
                         : 0.0f;
  }
};

}  // namespace detail

// Bytes of workspace window_attention_scores needs.
inline std::size_t window_attention_workspace_bytes(std::int64_t num_items, int num_segments,
                                                    int group, int window) {
  return detail::make_window_layout(nullptr, num_items, num_segments, group, window).bytes;
}

// out[keys.offsets[s] + j] = SnapKV score of token j of segment s (0 for window tokens).
//   keys       [N = keys.offsets[S]] rows, any segmented_rows addressing, positions ascending
//   queries    the `window` newest queries of each request; segments = requests * kv_heads
//   num_items  N (host copy of keys.offsets[S])
//   workspace  >= window_attention_workspace_bytes(N, S, group, window)
template <class Policy, Element T>
void window_attention_scores(const Policy& exec, const segmented_rows<T>& keys,
                             const window_queries& queries, std::int64_t num_items,
                             window_score_params params, float* out, void* workspace,
                             std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::window_attention_scores";
  keys.validate(where, "keys");
  require(queries.window > 0, where, "queries.window", queries.window, "> 0");
  require(queries.kv_heads > 0 && keys.num_segments % queries.kv_heads == 0, where,
          "queries.kv_heads", queries.kv_heads,
          "a positive divisor of keys.num_segments (" + std::to_string(keys.num_segments) + ")");
  require(queries.group > 0, where, "queries.group", queries.group, "> 0");
  require(queries.data != nullptr && queries.first_position != nullptr, where, "queries.data",
          "null", "[requests, window, q_heads, d] queries and their positions");
  require(params.kernel > 0 && params.kernel % 2 == 1, where, "params.kernel", params.kernel,
          "a positive odd number");
  const int S = keys.num_segments;
  const int G = queries.group;
  const int w = queries.window;
  const auto l =
      detail::make_window_layout(static_cast<std::byte*>(workspace), num_items, S, G, w);
  detail::check_workspace(where, workspace, workspace_bytes, l.bytes);
  if (num_items == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(keys.dim));
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<int>(0), S,
                       detail::past_fn<T>{keys, queries, l.past});
  ::thrust::for_each_n(exec, zero, num_items * G * w,
                       detail::logits_fn<T>{keys, queries, l.probs, scale});
  ::thrust::for_each_n(exec, zero, static_cast<std::int64_t>(S) * G * w,
                       detail::row_softmax_fn<T>{keys, queries, l.probs});
  ::thrust::for_each_n(exec, zero, num_items * G,
                       detail::window_mean_fn{keys.offsets, S, G, w, l.past, l.probs, l.means});
  ::thrust::for_each_n(exec, zero, num_items * G,
                       detail::window_pool_fn{keys.offsets, S, G, l.past, l.means, l.pooled,
                                              params.kernel, params.pool});
  ::thrust::for_each_n(exec, zero, num_items,
                       detail::window_gqa_fn{keys.offsets, S, G, l.past, l.pooled, out,
                                             params.gqa});
}

// score::window_attention's round over one (request, layer) of a device store
// (device/evict.hpp): the newest min(window, buffered) queries vote.
inline std::size_t score_round_workspace_bytes(const score::window_attention& sc,
                                               const round_shape& r) {
  return window_attention_workspace_bytes(r.num_items, r.segments, r.group,
                                          std::min(sc.p.window, r.queries));
}
template <class Policy, Element T>
void score_round(const Policy& exec, const score::window_attention& sc, const round_input<T>& in,
                 float* out, void* workspace, std::size_t workspace_bytes) {
  window_attention_scores(exec, in.keys, window_queries{in.queries, in.query_first, in.num_queries, in.kv_heads, in.group}, in.num_items,
                          window_score_params{sc.p.kernel, sc.p.pool, sc.p.gqa}, out, workspace,
                          workspace_bytes);
}

}  // namespace kvsift::thrust
