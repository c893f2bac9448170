// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reference attention with Thrust: softmax(q . k / sqrt(d)) applied to the values, causal by
// original position, over every resident slot or over a plan (one ascending slot set per
// segment, e.g. a decode plan or a method's kept sets), GQA (query head h * G + g reads KV head
// h). Mirrors attention::attend_row / attention::causal: logits in core/dot.hpp's order, the
// softmax of thrust/math.hpp (= cpu::softmax), then out[c] = sum over the seen keys, in slot
// order, of w * v[c] from 0.0f; so under g++ the probabilities and outputs are the CPU's bits.
//
// A query at position p sees the candidates (the plan's slots, or every slot) whose position is
// <= p; candidates and positions ascend, so that is a prefix of the candidates.
//
// Stages (each a Thrust for_each over a counting iterator, policy passed in):
//   1. logits     q . k / sqrt(d) of every (s, g, i, candidate t)        one thread per logit
//   2. softmax    over the visible prefix of every row (s, g, i)         one thread per row
//   3. out        sum_t w[t] * v[t][c] of every (s, g, i, c)             one thread per channel
//   4. weights    (optional) probabilities scattered to dense rows        one thread per logit
// Workspace: G * nq * M floats (M = candidates in all), from attention_workspace_bytes.
// Cost O(G * nq * M * d).

#include <kvsift/core/dot.hpp>
#include <kvsift/thrust/math.hpp>
#include <kvsift/thrust/window_attention.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvsift::thrust {

// The candidates of each segment: plan[plan_offsets[s] .. plan_offsets[s + 1]) (ascending slots),
// or, with plan_offsets null, every slot of the segment.
struct attention_plan {
  const std::int32_t* plan_offsets = nullptr;  // [num_segments + 1] CSR; null = every slot
  const std::int32_t* plan = nullptr;          // [plan_offsets[S]] slots, ascending per segment
};

namespace detail {

template <class T>
struct attention_geometry {
  segmented_rows<T> keys;
  segmented_rows<T> values;  // same offsets / addressing as keys
  window_queries q;          // window = nq queries per request
  attention_plan plan;

  // CSR offsets of the candidates.
  [[nodiscard]] KVSIFT_HOST_DEVICE const std::int32_t* cand_offsets() const {
    return plan.plan_offsets != nullptr ? plan.plan_offsets : keys.offsets;
  }
  [[nodiscard]] KVSIFT_HOST_DEVICE int candidates(int s) const {
    const std::int32_t* o = cand_offsets();
    return o[s + 1] - o[s];
  }
  [[nodiscard]] KVSIFT_HOST_DEVICE int slot(int s, int t) const {
    return plan.plan_offsets != nullptr ? plan.plan[plan.plan_offsets[s] + t] : t;
  }
  // Candidates of s whose position is <= pos (a prefix).
  [[nodiscard]] KVSIFT_HOST_DEVICE int visible(int s, std::int32_t pos) const {
    int lo = 0;
    int hi = candidates(s);
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (keys.position(s, slot(s, mid)) <= pos) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
  // Start of row (s, g, i) in the probability buffer: [M * G * nq], segment s's rows of
  // candidates(s) at cand_offsets[s] * G * nq.
  [[nodiscard]] KVSIFT_HOST_DEVICE std::int64_t row_start(int s, int g, int i) const {
    const int m = candidates(s);
    return static_cast<std::int64_t>(cand_offsets()[s]) * q.group * q.window +
           (static_cast<std::int64_t>(g) * q.window + i) * m;
  }
};

template <class T>
struct attention_logits_fn {
  attention_geometry<T> a;
  float scale;
  float* probs;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t rows = static_cast<std::int64_t>(a.q.group) * a.q.window;
    const int s = segment_of(scaled_offsets{a.cand_offsets(), rows}, a.keys.num_segments, e);
    const int m = a.candidates(s);
    const std::int64_t local = e - a.cand_offsets()[s] * rows;
    const int row = static_cast<int>(local / m);
    const int t = static_cast<int>(local % m);
    const int g = row / a.q.window;
    const int i = row % a.q.window;
    const int r = s / a.q.kv_heads;
    const int h = s % a.q.kv_heads;
    const int j = a.slot(s, t);
    if (a.keys.position(s, j) > a.q.first_position[r] + i) {
      probs[e] = 0.0f;
      return;
    }
    const float* qv = a.q.row(r, i, h * a.q.group + g, a.keys.dim);
    probs[e] = kvsift::dot(qv, a.keys.row(s, j), a.keys.dim) * scale;
  }
};

template <class T>
struct attention_softmax_fn {
  attention_geometry<T> a;
  float* probs;
  float* lse;  // null, or [requests, nq, q_heads] as `out` without its channels
  KVSIFT_HOST_DEVICE void operator()(std::int64_t row) const {
    const std::int64_t rows = static_cast<std::int64_t>(a.q.group) * a.q.window;
    const int s = static_cast<int>(row / rows);
    const int gi = static_cast<int>(row % rows);
    const int g = gi / a.q.window;
    const int i = gi % a.q.window;
    const int r = s / a.q.kv_heads;
    const int h = s % a.q.kv_heads;
    const int v = a.visible(s, a.q.first_position[r] + i);
    const int q_heads = a.q.kv_heads * a.q.group;
    float* l = lse == nullptr
                   ? nullptr
                   : lse + (static_cast<std::int64_t>(r) * a.q.window + i) * q_heads + h * a.q.group + g;
    softmax_row(probs + a.row_start(s, g, i), v, l);
  }
};

template <class T>
struct attention_out_fn {
  attention_geometry<T> a;
  const float* probs;
  float* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int d = a.keys.dim;
    const int c = static_cast<int>(e % d);
    const std::int64_t row = e / d;  // (s, g, i)
    const std::int64_t rows = static_cast<std::int64_t>(a.q.group) * a.q.window;
    const int s = static_cast<int>(row / rows);
    const int gi = static_cast<int>(row % rows);
    const int g = gi / a.q.window;
    const int i = gi % a.q.window;
    const int r = s / a.q.kv_heads;
    const int h = s % a.q.kv_heads;
    const int v = a.visible(s, a.q.first_position[r] + i);
    const float* w = probs + a.row_start(s, g, i);
    float acc = 0.0f;
    for (int t = 0; t < v; ++t) {
      acc += w[t] * to_float(a.values.row(s, a.slot(s, t))[c]);
    }
    const int q_heads = a.q.kv_heads * a.q.group;
    out[((static_cast<std::int64_t>(r) * a.q.window + i) * q_heads + h * a.q.group + g) * d + c] =
        acc;
  }
};

template <class T>
struct attention_weights_fn {
  attention_geometry<T> a;
  const float* probs;
  float* weights;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t rows = static_cast<std::int64_t>(a.q.group) * a.q.window;
    const int s = segment_of(scaled_offsets{a.cand_offsets(), rows}, a.keys.num_segments, e);
    const int m = a.candidates(s);
    const std::int64_t local = e - a.cand_offsets()[s] * rows;
    const int row = static_cast<int>(local / m);
    const int t = static_cast<int>(local % m);
    const int i = row % a.q.window;
    const int r = s / a.q.kv_heads;
    const int j = a.slot(s, t);
    const int n = a.keys.length(s);
    const bool seen = a.keys.position(s, j) <= a.q.first_position[r] + i;
    weights[static_cast<std::int64_t>(a.keys.offsets[s]) * rows +
            static_cast<std::int64_t>(row) * n + j] = seen ? probs[e] : 0.0f;
  }
};

}  // namespace detail

// Bytes of workspace attention_over needs: `candidates` = M (plan_offsets[S], or N without a
// plan), `queries` = nq per request.
inline std::size_t attention_workspace_bytes(std::int64_t candidates, int group, int queries) {
  detail::carver c{nullptr};
  c.take<float>(static_cast<std::size_t>(candidates) * group * queries);
  return c.bytes;
}

// Causal attention of nq queries per request over each KV head's candidates.
//   keys, values  [N] rows each, the same CSR offsets and addressing, positions ascending
//   queries       [requests, nq, kv_heads * group, d] at first_position[r] + i (window = nq);
//                 segments = requests * kv_heads
//   plan          the candidates per segment (null offsets: every slot); slots must be resident
//   num_items     N: host copy of keys.offsets[S]
//   candidates    M: host copy of plan.plan_offsets[S], or N without a plan
//   out           [requests, nq, q_heads, d]
//   weights       optional (null = not written): [N * G * nq], row (s, g, i) of n_s slots at
//                 keys.offsets[s] * G * nq + (g * nq + i) * n_s; 0 for slots the query does not see
//   workspace     >= attention_workspace_bytes(M, group, nq)
//   lse           optional (null = not written): [requests, nq, q_heads], each query head's
//                 log-sum-exp of its scaled logits over the candidates it sees (-inf: none), so
//                 that `out` is a partial attention attention::merge_partials can combine with
//                 another over disjoint candidates
template <class Policy, Element T>
void attention_over(const Policy& exec, const segmented_rows<T>& keys,
                    const segmented_rows<T>& values, const window_queries& queries,
                    attention_plan plan, std::int64_t num_items, std::int64_t candidates,
                    float* out, float* weights,
                    void* workspace, std::size_t workspace_bytes, float* lse = nullptr) {
  constexpr std::string_view where = "thrust::attention_over";
  keys.validate(where, "keys");
  values.validate(where, "values");
  require(values.num_segments == keys.num_segments && values.dim == keys.dim &&
              values.offsets == keys.offsets,
          where, "values", "a different layout", "the keys' segments, offsets and dim");
  require(queries.window >= 0, where, "queries.window", queries.window, ">= 0");
  require(queries.kv_heads > 0 && keys.num_segments % queries.kv_heads == 0, where,
          "queries.kv_heads", queries.kv_heads,
          "a positive divisor of keys.num_segments (" + std::to_string(keys.num_segments) + ")");
  require(queries.group > 0, where, "queries.group", queries.group, "> 0");
  require(plan.plan_offsets == nullptr || plan.plan != nullptr || candidates == 0, where,
          "plan.plan", "null", "[plan_offsets[S]] slots");
  require(num_items >= 0, where, "num_items", num_items, ">= 0");
  require(candidates >= 0 && (plan.plan_offsets != nullptr || candidates == num_items), where,
          "candidates", candidates, "plan_offsets[S] (>= 0), or num_items without a plan");
  const int S = keys.num_segments;
  const int G = queries.group;
  const int nq = queries.window;
  const std::size_t need = attention_workspace_bytes(candidates, G, nq);
  detail::check_workspace(where, workspace, workspace_bytes, need);
  if (S == 0 || nq == 0) {
    return;
  }
  require(out != nullptr && queries.data != nullptr && queries.first_position != nullptr, where,
          "out / queries", "null", "[requests, nq, q_heads, d] arrays and query positions");
  auto* probs = static_cast<float*>(workspace);
  const detail::attention_geometry<T> a{keys, values, queries, plan};
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  const std::int64_t logits = candidates * G * nq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(keys.dim));
  ::thrust::for_each_n(exec, zero, logits, detail::attention_logits_fn<T>{a, scale, probs});
  ::thrust::for_each_n(exec, zero, static_cast<std::int64_t>(S) * G * nq,
                       detail::attention_softmax_fn<T>{a, probs, lse});
  ::thrust::for_each_n(exec, zero, static_cast<std::int64_t>(S) * G * nq * keys.dim,
                       detail::attention_out_fn<T>{a, probs, out});
  if (weights != nullptr) {
    ::thrust::fill_n(exec, weights, num_items * G * nq, 0.0f);
    ::thrust::for_each_n(exec, zero, logits, detail::attention_weights_fn<T>{a, probs, weights});
  }
}

}  // namespace kvsift::thrust
