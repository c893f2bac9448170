// SPDX-License-Identifier: Apache-2.0
#pragma once

// Cumulative attention scores of a prompt (H2O's prefill) with Thrust. Mirrors the prefill of
// score::cumulative_attention exactly: the score of token j of a KV head is the sum, over every
// given query i whose causal softmax sees j, of its attention a[i][j], per query head of the
// group, then reduced over the group (`gqa`, default mean). Tokens no query sees score 0.
//
// The probabilities are never stored: a row's softmax needs only its max and the float scale
// 1 / sum, so the logits are computed twice (once for the row statistics, once in the column
// sums) and the workspace stays O(rows + G * N) instead of the O(G * nq * N) of a stored matrix.
// The arithmetic is cpu::softmax's (float logits q . k / sqrt(d) in core/dot.hpp's order, the row
// max subtracted, exp in float, the sum in double, probabilities exp * float(1 / sum)) and the
// column sums add the queries in ascending order from 0.0f as score::cumulative_attention does,
// so under g++ the scores are bit-for-bit the CPU backend's and a top-k picks the same tokens.
//
// Stages (each a Thrust for_each over a counting iterator, policy passed in):
//   1. row stats   visible keys, max logit, float(1 / sum exp) of every (s, g, i)   per row
//   2. columns     sum over i of a[i][j] for every (s, g, j)                          per column
//   3. scores      GQA reduction over g (thrust::gqa_reduce_rows)                     per token
// Workspace: 3 * S * G * nq values (rows) + G * N floats (columns), from
// cumulative_attention_workspace_bytes. Cost O(G * nq * N * d), twice the dot products of a
// single pass; one thread per column loops over the nq queries.
//
// Decode (cumulative_attention_observe): H2O's running scores follow the decode steps as
// score::cumulative_attention::observe does: a step's attention probabilities over the slots it
// read (thrust::attention_over's weights, one query per request) are reduced over the GQA group
// (cpu::reduce_group's order) and added to the running score of each slot; a slot appended since
// the previous observe starts from 0. One thread per slot; no workspace. Cost O(G * N).

#include <kvsift/core/dot.hpp>
#include <kvsift/score/cumulative_attention.hpp>
#include <kvsift/thrust/math.hpp>
#include <kvsift/thrust/window_attention.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvsift::thrust {

// The queries are described by window_queries (window_attention.hpp) with `window` = the number
// of queries per request: [requests, nq, kv_heads * group, d], query i of request r at original
// position first_position[r] + i. For H2O's prefill nq is the whole prompt.

namespace detail {

struct cumulative_layout {
  float* row_max = nullptr;           // [S * G * nq] max logit over the visible keys
  float* row_inv = nullptr;           // [S * G * nq] float(1 / sum exp(logit - max))
  std::int32_t* row_visible = nullptr;  // [S * G * nq] keys the query sees (a prefix)
  float* columns = nullptr;           // [G * N]: row (s, g) at offsets[s] * G + g * n_s
  std::size_t bytes = 0;
};

inline cumulative_layout make_cumulative_layout(std::byte* ws, std::int64_t num_items,
                                                int num_segments, int group, int queries) {
  carver c{ws};
  const auto rows = static_cast<std::size_t>(num_segments) * group * queries;
  cumulative_layout l;
  l.row_max = c.take<float>(rows);
  l.row_inv = c.take<float>(rows);
  l.row_visible = c.take<std::int32_t>(rows);
  l.columns = c.take<float>(static_cast<std::size_t>(num_items) * group);
  l.bytes = c.bytes;
  return l;
}

// Row (s, g, i) = ((s * G) + g) * nq + i: the softmax statistics of query i of query head
// h * G + g over the keys of segment s it sees.
template <class T>
struct cumulative_row_fn {
  segmented_rows<T> keys;
  window_queries q;
  float scale;
  cumulative_layout l;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t row) const {
    const int nq = q.window;
    const int s = static_cast<int>(row / (static_cast<std::int64_t>(q.group) * nq));
    const int gi = static_cast<int>(row % (static_cast<std::int64_t>(q.group) * nq));
    const int g = gi / nq;
    const int i = gi % nq;
    const int r = s / q.kv_heads;
    const int h = s % q.kv_heads;
    const int v = keys.visible(s, q.first_position[r] + i);
    l.row_visible[row] = v;
    if (v == 0) {  // cpu::softmax leaves an empty row alone: nothing to add
      l.row_max[row] = 0.0f;
      l.row_inv[row] = 0.0f;
      return;
    }
    const float* qv = q.row(r, i, h * q.group + g, keys.dim);
    float mx = kvsift::dot(qv, keys.row(s, 0), keys.dim) * scale;
    for (int j = 1; j < v; ++j) {
      const float x = kvsift::dot(qv, keys.row(s, j), keys.dim) * scale;
      mx = x > mx ? x : mx;
    }
    double sum = 0.0;
    for (int j = 0; j < v; ++j) {
      const float x = kvsift::dot(qv, keys.row(s, j), keys.dim) * scale;
      sum += static_cast<float>(exact_expf(x - mx));
    }
    l.row_max[row] = mx;
    l.row_inv[row] = static_cast<float>(1.0 / sum);
  }
};

// Column (s, g, j): sum over the queries i that see token j of a[i][j], i ascending from 0.0f.
template <class T>
struct cumulative_column_fn {
  segmented_rows<T> keys;
  window_queries q;
  float scale;
  cumulative_layout l;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int G = q.group;
    const int nq = q.window;
    const int s = segment_of(scaled_offsets{keys.offsets, G}, keys.num_segments, e);
    const int n = keys.length(s);
    const std::int64_t local = e - static_cast<std::int64_t>(keys.offsets[s]) * G;
    const int g = static_cast<int>(local / n);
    const int j = static_cast<int>(local % n);
    const int r = s / q.kv_heads;
    const int h = s % q.kv_heads;
    const T* k = keys.row(s, j);
    const std::int64_t row0 = (static_cast<std::int64_t>(s) * G + g) * nq;
    float acc = 0.0f;
    for (int i = 0; i < nq; ++i) {
      const std::int64_t row = row0 + i;
      if (j >= l.row_visible[row]) {
        continue;
      }
      const float* qv = q.row(r, i, h * G + g, keys.dim);
      const float x = kvsift::dot(qv, k, keys.dim) * scale;
      const float p = static_cast<float>(exact_expf(x - l.row_max[row])) * l.row_inv[row];
      acc += p;
    }
    l.columns[e] = acc;
  }
};

// Slot e of the weights' CSR: running[s * stride + j] = (j < seen[s] ? running : 0) + reduced.
struct cumulative_observe_fn {
  const float* weights;         // [G * N]: row (s, g) at offsets[s] * G + g * n_s
  const std::int32_t* offsets;  // [S + 1]
  int num_segments;
  int group;
  gqa_reduce mode;
  const std::int32_t* seen;     // [S] slots scored before this step, or null (all)
  float* running;
  std::int64_t running_stride;  // 0: packed like the weights' tokens
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(offsets, num_segments, e);
    const int b = offsets[s];
    const int n = offsets[s + 1] - b;
    const int j = static_cast<int>(e - b);
    const float add = reduce_at(weights + static_cast<std::int64_t>(b) * group, n, group, j, mode);
    float* run = running + (running_stride == 0 ? e : s * running_stride + j);
    const float old = seen != nullptr && j >= seen[s] ? 0.0f : *run;
    *run = old + add;
  }
};

}  // namespace detail

// H2O's decode observe: adds one step's GQA-reduced attention to the running scores.
//   weights         [G * N] probabilities of one query per request over every slot (0 for the
//                   slots the step did not read): thrust::attention_over's `weights` with nq = 1;
//                   row (s, g) of n_s slots at offsets[s] * G + g * n_s
//   offsets         [S + 1] CSR of the segments' current lengths; num_items N = offsets[S]
//   gqa             the reduction over the group (score::cumulative_attention's `gqa`)
//   seen            [S] slots that already had a running score (the length at the previous
//                   observe, or after the last compaction); slots j >= seen[s] start from 0,
//                   as the CPU scorer's running scores grow with zeros; null: every slot has one
//   running         the running score of slot j of segment s at running[s * running_stride + j]
//                   (a per-slot side column of a dense [S, capacity] store: stride capacity), or
//                   at running[offsets[s] + j] with running_stride = 0
// A slot the step did not read adds 0 (its weight), which leaves a running sum unchanged, as the
// CPU scorer adds only over the slots read.
template <class Policy>
void cumulative_attention_observe(const Policy& exec, const float* weights,
                                  const std::int32_t* offsets, int num_segments,
                                  std::int64_t num_items, int group, gqa_reduce gqa,
                                  const std::int32_t* seen, float* running,
                                  std::int64_t running_stride) {
  constexpr std::string_view where = "thrust::cumulative_attention_observe";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(num_items >= 0, where, "num_items", num_items, ">= 0");
  require(group > 0, where, "group", group, "> 0");
  require(running_stride >= 0, where, "running_stride", running_stride,
          ">= 0 (0 = packed by offsets)");
  if (num_items == 0) {
    return;
  }
  require(weights != nullptr && offsets != nullptr && running != nullptr, where,
          "weights / offsets / running", "null", "the step's weights, CSR offsets, running scores");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_items,
                       detail::cumulative_observe_fn{weights, offsets, num_segments, group, gqa,
                                                     seen, running, running_stride});
}

// Bytes of workspace cumulative_attention_scores needs (`queries` = nq per request).
inline std::size_t cumulative_attention_workspace_bytes(std::int64_t num_items, int num_segments,
                                                        int group, int queries) {
  return detail::make_cumulative_layout(nullptr, num_items, num_segments, group, queries).bytes;
}

// out[keys.offsets[s] + j] = H2O prefill score of token j of segment s.
//   keys       [N = keys.offsets[S]] rows, any segmented_rows addressing, positions ascending
//   queries    nq = queries.window queries per request; segments = requests * kv_heads
//   num_items  N (host copy of keys.offsets[S])
//   gqa        reduction over the group's query heads (mean / max / sum)
//   workspace  >= cumulative_attention_workspace_bytes(N, S, group, nq)
template <class Policy, Element T>
void cumulative_attention_scores(const Policy& exec, const segmented_rows<T>& keys,
                                 const window_queries& queries, std::int64_t num_items,
                                 gqa_reduce gqa, float* out, void* workspace,
                                 std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::cumulative_attention_scores";
  keys.validate(where, "keys");
  require(queries.window >= 0, where, "queries.window", queries.window, ">= 0");
  require(queries.kv_heads > 0 && keys.num_segments % queries.kv_heads == 0, where,
          "queries.kv_heads", queries.kv_heads,
          "a positive divisor of keys.num_segments (" + std::to_string(keys.num_segments) + ")");
  require(queries.group > 0, where, "queries.group", queries.group, "> 0");
  require(queries.window == 0 || (queries.data != nullptr && queries.first_position != nullptr),
          where, "queries.data", "null", "[requests, nq, q_heads, d] queries and their positions");
  const int S = keys.num_segments;
  const int G = queries.group;
  const auto l = detail::make_cumulative_layout(static_cast<std::byte*>(workspace), num_items, S,
                                                G, queries.window);
  detail::check_workspace(where, workspace, workspace_bytes, l.bytes);
  if (num_items == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(keys.dim));
  ::thrust::for_each_n(exec, zero, static_cast<std::int64_t>(S) * G * queries.window,
                       detail::cumulative_row_fn<T>{keys, queries, scale, l});
  ::thrust::for_each_n(exec, zero, num_items * G,
                       detail::cumulative_column_fn<T>{keys, queries, scale, l});
  gqa_reduce_rows(exec, l.columns, out, keys.offsets, S, num_items, G, gqa);
}

// score::cumulative_attention's round over one (request, layer) of a device store
// (device/evict.hpp): every buffered prompt query.
inline std::size_t score_round_workspace_bytes(const score::cumulative_attention&,
                                               const round_shape& r) {
  return cumulative_attention_workspace_bytes(r.num_items, r.segments, r.group, r.queries);
}
template <class Policy, Element T>
void score_round(const Policy& exec, const score::cumulative_attention& sc,
                 const round_input<T>& in, float* out, void* workspace,
                 std::size_t workspace_bytes) {
  cumulative_attention_scores(exec, in.keys, window_queries{in.queries, in.query_first, in.num_queries, in.kv_heads, in.group}, in.num_items, sc.p.gqa, out, workspace,
                              workspace_bytes);
}

}  // namespace kvsift::thrust
