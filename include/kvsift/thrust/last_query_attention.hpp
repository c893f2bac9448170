// SPDX-License-Identifier: Apache-2.0
#pragma once

// Attention scores of single queries with Thrust: score::last_query_attention (SyncKV's and
// HeteroCache's runtime scores) and HeteroCache's drift probe scores (roles::stars::
// prefill_scores), one score row per query. Mirrors them operation for operation: for each KV
// head s and each of the nq queries i of its request, per query head g of the group, the causal
// softmax over the keys the query sees (position <= first_position[r] + i; logits in
// core/dot.hpp's order, thrust/math.hpp's softmax = cpu::softmax), the row of all n_s tokens (0
// past the visible ones) pooled along tokens exactly as cpu::pool1d (avg: the sliding window sum
// in double, adds then drops, divided by K; max: ignores padding; kernel 1 copies), then the GQA
// reduction over g in group order (cpu::reduce_group). So the scores are the CPU's bits under
// g++.
//   nq = 1, the query at its own position: score::last_query_attention (kernel 1 for SyncKV,
//           5 avg / GQA max for HeteroCache's prefill)
//   segments cut to the prompt's n rows, nq = W: the drift probe (every query sees the n
//           prefill keys: pass first_position >= n - 1)
//
// Stages (each a Thrust for_each, policy passed in):
//   1. logits     q . k / sqrt(d) of every (s, g, i, j)          one thread per logit
//   2. softmax    over the visible prefix of every row (s, g, i)  one thread per row
//   3. pooled     the row pooled along its n_s tokens             one thread per row (sliding)
//   4. scores     GQA reduction over g                            one thread per (s, i, j)
// Output: out[offsets[s] * nq + i * n_s + j]. Workspace 2 * G * nq * N floats (N = rows).
// Cost O(G * nq * N * d).

#include <kvsift/core/dot.hpp>
#include <kvsift/thrust/math.hpp>
#include <kvsift/thrust/window_attention.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvsift::thrust {

namespace detail {

// cpu::pool1d of a row of n values into out (in != out).
KVSIFT_HOST_DEVICE inline void pool_row_sliding(const float* in, float* out, int n, int kernel,
                                                pooling mode) {
  const int half = kernel / 2;
  if (kernel <= 1) {
    for (int j = 0; j < n; ++j) {
      out[j] = in[j];
    }
    return;
  }
  if (mode == pooling::avg) {
    double sum = 0.0;
    for (int j = 0; j < (half < n ? half : n); ++j) {
      sum += in[j];
    }
    for (int j = 0; j < n; ++j) {
      const int add = j + half;
      const int drop = j - half - 1;
      if (add < n) sum += in[add];
      if (drop >= 0) sum -= in[drop];
      out[j] = static_cast<float>(sum / kernel);
    }
    return;
  }
  for (int j = 0; j < n; ++j) {
    out[j] = pool_at(in, n, j, kernel, mode);
  }
}

struct query_pool_fn {
  const std::int32_t* offsets;
  std::int64_t rows;  // G * nq rows per token
  const float* probs;
  float* pooled;
  int kernel;
  pooling mode;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t row) const {
    const int s = static_cast<int>(row / rows);
    const std::int64_t gi = row % rows;
    const int n = offsets[s + 1] - offsets[s];
    const std::int64_t at = static_cast<std::int64_t>(offsets[s]) * rows + gi * n;
    pool_row_sliding(probs + at, pooled + at, n, kernel, mode);
  }
};

struct query_gqa_fn {
  const std::int32_t* offsets;
  int num_segments;
  int group;
  int nq;
  const float* pooled;  // row (s, g, i) at offsets[s] * G * nq + (g * nq + i) * n_s
  gqa_reduce mode;
  float* out;           // row (s, i) at offsets[s] * nq + i * n_s
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(scaled_offsets{offsets, nq}, num_segments, e);
    const int n = offsets[s + 1] - offsets[s];
    const std::int64_t local = e - static_cast<std::int64_t>(offsets[s]) * nq;
    const int i = static_cast<int>(local / n);
    const int j = static_cast<int>(local % n);
    const float* base = pooled + static_cast<std::int64_t>(offsets[s]) * group * nq +
                        static_cast<std::int64_t>(i) * n;
    out[e] = reduce_at(base, static_cast<std::int64_t>(nq) * n, group, j, mode);
  }
};

}  // namespace detail

// Bytes of workspace query_attention_scores needs.
inline std::size_t query_attention_workspace_bytes(std::int64_t num_items, int group, int queries) {
  detail::carver c{nullptr};
  c.take<float>(static_cast<std::size_t>(num_items) * group * queries);
  c.take<float>(static_cast<std::size_t>(num_items) * group * queries);
  return c.bytes;
}

// out[keys.offsets[s] * nq + i * n_s + j] = the pooled, GQA-reduced attention probability of
// token j of segment s under query i of its request (see the file comment).
//   keys       [N = keys.offsets[S]] rows, any segmented_rows addressing, positions ascending
//   queries    nq = queries.window queries per request at first_position[r] + i;
//              segments = requests * kv_heads
//   num_items  N (host copy of keys.offsets[S])
//   kernel     positive, odd; pool avg or max; gqa mean, max or sum
//   workspace  >= query_attention_workspace_bytes(N, group, nq)
template <class Policy, Element T>
void query_attention_scores(const Policy& exec, const segmented_rows<T>& keys,
                            const window_queries& queries, std::int64_t num_items, int kernel,
                            pooling pool, gqa_reduce gqa, float* out, void* workspace,
                            std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::query_attention_scores";
  keys.validate(where, "keys");
  require(queries.window > 0, where, "queries.window", queries.window, "> 0");
  require(queries.kv_heads > 0 && keys.num_segments % queries.kv_heads == 0, where,
          "queries.kv_heads", queries.kv_heads, "a positive divisor of keys.num_segments");
  require(queries.group > 0, where, "queries.group", queries.group, "> 0");
  require(queries.data != nullptr && queries.first_position != nullptr, where, "queries.data",
          "null", "[requests, nq, q_heads, d] queries and their positions");
  require(kernel > 0 && kernel % 2 == 1, where, "kernel", kernel, "a positive odd number");
  require(num_items >= 0, where, "num_items", num_items, ">= 0");
  const int S = keys.num_segments;
  const int G = queries.group;
  const int nq = queries.window;
  detail::carver c{static_cast<std::byte*>(workspace)};
  float* probs = c.take<float>(static_cast<std::size_t>(num_items) * G * nq);
  float* pooled = c.take<float>(static_cast<std::size_t>(num_items) * G * nq);
  detail::check_workspace(where, workspace, workspace_bytes, c.bytes);
  if (num_items == 0 || S == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(keys.dim));
  const std::int64_t rows = static_cast<std::int64_t>(G) * nq;
  ::thrust::for_each_n(exec, zero, num_items * rows,
                       detail::logits_fn<T>{keys, queries, probs, scale});
  ::thrust::for_each_n(exec, zero, static_cast<std::int64_t>(S) * rows,
                       detail::row_softmax_fn<T>{keys, queries, probs});
  ::thrust::for_each_n(exec, zero, static_cast<std::int64_t>(S) * rows,
                       detail::query_pool_fn{keys.offsets, rows, probs, pooled, kernel, pool});
  ::thrust::for_each_n(exec, zero, num_items * nq,
                       detail::query_gqa_fn{keys.offsets, S, G, nq, pooled, gqa, out});
}

}  // namespace kvsift::thrust
