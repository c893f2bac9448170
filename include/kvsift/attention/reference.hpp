// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reference attention on the CPU: softmax(q . k / sqrt(d)) applied to values, over a dense
// causal range or over a kept index set, GQA (query head h reads KV head h / G), any element
// type. The exact reference the sparse CUDA kernel and the conformance vectors compare with.

#include <kvsift/core/segments.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/parallel.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <span>
#include <type_traits>
#include <vector>

namespace kvsift::attention {

// One query over `count` keys/values given by row accessors key(i), value(i) (pointers to d
// elements). Writes out[d]; if `weights` is given, the probabilities [count].
template <class KeyAt, class ValueAt>
void attend_row(const float* q, int d, int count, KeyAt&& key, ValueAt&& value, float* out,
                float* weights = nullptr) {
  std::vector<float> local;
  float* w = weights;
  if (w == nullptr) {
    local.resize(static_cast<std::size_t>(count));
    w = local.data();
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int i = 0; i < count; ++i) w[i] = cpu::dot(q, key(i), d) * scale;
  cpu::softmax(std::span<float>(w, static_cast<std::size_t>(count)));
  for (int c = 0; c < d; ++c) out[c] = 0.0f;
  for (int i = 0; i < count; ++i) {
    const auto* v = value(i);
    const float wi = w[i];
    for (int c = 0; c < d; ++c) out[c] += wi * to_float(v[c]);
  }
}

// A plan attention's probabilities, per plan segment s (one KV head of one token): segment(s) is
// [G, plan.size(s)] floats, query head g's softmax over the segment's slots in plan order, in
// cpu::attention_rows_over's exact arithmetic (kvsift::dot's bits, exact_expf, a double sum) —
// bit for bit what a second pass over the keys would derive, so a scorer that adds them (H2O's
// cumulative_attention::observe_weights) needs no such pass. Filled by attend_plan_batch.
//
// With `reduction` set before the attention, each segment's G rows are also reduced over the GQA
// group (cpu::reduce_group: one float per slot) into `reduced`, by the thread that computed them,
// inside the attention's parallel loop: a scorer that adds reduced probabilities (H2O's running
// scores) then reads one float per slot, written by another core, instead of G, and reduces none.
struct plan_weights {
  std::vector<float> values;
  std::vector<std::size_t> offsets;  // [segments + 1] start of each segment in values
  std::optional<gqa_reduce> reduction;        // set by the reader: reduce in the attention too
  std::vector<float> reduced;  // with reduction: segment s at offsets[s] / G, [plan.size(s)]
  int group = 1;               // G (set by attend_plan_batch)
  [[nodiscard]] std::span<const float> segment(int s) const {
    return {values.data() + offsets[s], offsets[s + 1] - offsets[s]};
  }
  [[nodiscard]] std::span<float> segment(int s) {
    return {values.data() + offsets[s], offsets[s + 1] - offsets[s]};
  }
  // Segment s reduced over its group (`reduction`), when the attention kept it.
  [[nodiscard]] std::span<const float> reduced_segment(int s) const {
    const auto G = static_cast<std::size_t>(group);
    return {reduced.data() + offsets[s] / G, (offsets[s + 1] - offsets[s]) / G};
  }
  [[nodiscard]] std::span<float> reduced_segment(int s) {
    const auto G = static_cast<std::size_t>(group);
    return {reduced.data() + offsets[s] / G, (offsets[s + 1] - offsets[s]) / G};
  }
};

namespace detail {

// The boundary of a plan attention: (request, layer) exist, q and out are arrays, and the plan's
// segments first_segment .. + kv_heads - 1 name resident slots of that request. O(slots).
template <class Store>
void check_plan_rows(const Store& store, int request, int layer, const float* q,
                     const index_sets& plan, const float* out, int first_segment) {
  const model_shape& sh = store.shape();
  constexpr std::string_view where = "attention::attend_plan";
  require(request >= 0 && request < store.requests(), where, "request", request,
          [&] { return "in [0, " + std::to_string(store.requests()) + ")"; });
  require(layer >= 0 && layer < sh.layers, where, "layer", layer,
          [&] { return "in [0, " + std::to_string(sh.layers) + ")"; });
  require(q != nullptr && out != nullptr, where, q == nullptr ? "q" : "out", "null",
          "a [q_heads, d] array");
  require(first_segment >= 0 && first_segment + sh.kv_heads <= plan.segments(), where,
          "first_segment", first_segment, [&] {
            return "a run of kv_heads = " + std::to_string(sh.kv_heads) +
                   " segments within the plan's " + std::to_string(plan.segments());
          });
  for (int h = 0; h < sh.kv_heads; ++h) {  // this request's segments only
    const int n = store.length(sh.sequence(request, layer, h));
    const auto seg = plan[first_segment + h];
    if (kvsift::detail::indices_within(seg, n, false)) [[likely]] continue;
    for (std::size_t i = 0; i < seg.size(); ++i) {  // name the first offender
      require(seg[i] >= 0 && seg[i] < n, where,
              [&] {
                return "plan[" + std::to_string(first_segment + h) + "][" + std::to_string(i) + "]";
              },
              seg[i], [&] { return "a resident slot in [0, " + std::to_string(n) + ")"; });
    }
  }
}

// KV head h of one request's plan attention (its GQA group of query heads). With `weights`, the
// group's probabilities go to weights->segment(first_segment + h) (exact, see plan_weights) and
// the output is their weighted values; otherwise cpu::attend_group's fused kernels.
template <class Store>
void attend_plan_head(const Store& store, int request, int layer, const float* q,
                      const index_sets& plan, float* out, int first_segment, int h,
                      plan_weights* weights = nullptr) {
  const model_shape& sh = store.shape();
  const int G = sh.group_size();
  const int d = sh.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto seq = sh.sequence(request, layer, h);
  const auto slots = plan[first_segment + h];
  const float* qg = q + static_cast<std::size_t>(h) * G * d;
  float* og = out + static_cast<std::size_t>(h) * G * d;
  // the plan's row addresses, looked up in one pass (a store's row_addresses: inline, where key()
  // and value() would each repeat the row map and page lookups); the kernels index this table
  using T = typename Store::element_type;
  const std::size_t m = slots.size();
  thread_local std::vector<const T*> rows;
  rows.resize(2 * m);
  const T** krow = rows.data();
  const T** vrow = rows.data() + m;
  if constexpr (requires { store.row_addresses(seq, slots, krow, vrow); }) {
    store.row_addresses(seq, slots, krow, vrow);
  } else {
    for (std::size_t j = 0; j < m; ++j) {
      krow[j] = store.key(seq, slots[j]);
      vrow[j] = store.value(seq, slots[j]);
    }
  }
  if (weights != nullptr) {
    const auto probs = weights->segment(first_segment + h);
    cpu::attention_rows_at<T>([krow](std::size_t j) { return krow[j]; }, m, d, qg, G, probs);
    cpu::weighted_values_at<T>(probs.data(), G, d, m, vrow, og);
    if (weights->reduction) {
      cpu::reduce_group(probs, G, weights->reduced_segment(first_segment + h),
                        *weights->reduction);
    }
    return;
  }
  thread_local std::vector<float> logits;
  cpu::attend_group_at<T>(qg, G, d, m, krow, vrow, og, scale, logits);
}

}  // namespace detail

// Decode attention of one request's step over a plan: q [q_heads, d]; the plan holds one
// ascending slot set per KV head, segments first_segment .. first_segment + kv_heads - 1 (a
// batch's plan holds every request's heads in turn); out [q_heads, d]. Each KV row is read once
// for the whole GQA group; KV heads run in parallel when the plan is large.
template <class Store>
void attend_plan(const Store& store, int request, int layer, const float* q,
                 const index_sets& plan, float* out, int first_segment = 0) {
  detail::check_plan_rows(store, request, layer, q, plan, out, first_segment);
  const model_shape& sh = store.shape();
  const std::int64_t work =
      static_cast<std::int64_t>(plan.size(first_segment)) * sh.head_dim * (sh.group_size() + 1);
  cpu::parallel_for(sh.kv_heads, [&](std::int64_t h) {
    detail::attend_plan_head(store, request, layer, q, plan, out, first_segment,
                             static_cast<int>(h));
  }, cpu::par, work);
}

// A batch's decode attention in one parallel loop over every (token, KV head): token i is
// request request_of(i) with query query_of(i) [q_heads, d] over plan segments i * kv_heads ..
// (i + 1) * kv_heads - 1, writing out + i * q_heads * d. The same output as attend_plan per
// token, without a parallel region per request: a batch of short plans fills the threads once.
// Every token's rows are checked before any is computed. With `weights`, the step's probabilities
// are kept too (plan_weights: laid out here, one segment per (token, KV head)), computed in the
// scorers' exact arithmetic instead of the fused kernels' (outputs within the same bound of a
// float64 reference; the keys are still read once).
template <class Store, class RequestOf, class QueryOf>
void attend_plan_batch(const Store& store, int layer, std::size_t tokens, RequestOf&& request_of,
                       QueryOf&& query_of, const index_sets& plan, float* out,
                       plan_weights* weights = nullptr) {
  const model_shape& sh = store.shape();
  const std::size_t out_stride = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
  for (std::size_t i = 0; i < tokens; ++i) {
    detail::check_plan_rows(store, request_of(i), layer, query_of(i), plan, out + i * out_stride,
                            static_cast<int>(i) * sh.kv_heads);
  }
  const std::int64_t jobs = static_cast<std::int64_t>(tokens) * sh.kv_heads;
  if (weights != nullptr) {
    weights->offsets.assign(static_cast<std::size_t>(jobs) + 1, 0);
    const auto G = static_cast<std::size_t>(sh.group_size());
    for (std::int64_t s = 0; s < jobs; ++s) {
      weights->offsets[s + 1] = weights->offsets[s] + G * plan.size(static_cast<int>(s));
    }
    weights->values.resize(weights->offsets.back());
    weights->group = static_cast<int>(G);
    if (weights->reduction) weights->reduced.resize(weights->offsets.back() / G);
  }
  if (jobs == 0) {
    return;
  }
  // elements touched per (token, KV head), on average: a batch of short plans still runs in
  // parallel once their sum is worth a region
  const std::int64_t work = static_cast<std::int64_t>(plan.values.size()) * sh.head_dim *
                            (sh.group_size() + 1) / jobs;
  cpu::parallel_for(jobs, [&](std::int64_t job) {
    const auto i = static_cast<std::size_t>(job / sh.kv_heads);
    detail::attend_plan_head(store, request_of(i), layer, query_of(i), plan,
                             out + i * out_stride, static_cast<int>(i) * sh.kv_heads,
                             static_cast<int>(job % sh.kv_heads), weights);
  }, cpu::par, work);
}

// Causal attention over dense views: queries [nq, q_heads, d] at positions
// first_query_position + i, keys/values [n, kv_heads, d] at positions 0..n-1. If `kept` is given
// (one ascending set per KV head), a query sees only kept keys at positions <= its own.
// out: [nq, q_heads, d] (nhd). weights (optional): [q_heads, nq, n], 0 for keys not seen.
template <class T, class L>
void causal(kv_view<const float, nhd> queries, int first_query_position, kv_view<const T, L> keys,
            kv_view<const T, L> values, float* out, float* weights = nullptr,
            const index_sets* kept = nullptr) {
  {
    constexpr std::string_view where = "attention::causal";
    require(keys.heads > 0 && queries.heads % keys.heads == 0, where, "queries.heads",
            queries.heads, [&] {
              return "a multiple of keys.heads = " + std::to_string(keys.heads) + " (GQA groups)";
            });
    queries.validate(where, "queries", queries.heads, keys.dim);
    values.validate(where, "values", keys.heads, keys.dim);
    require(values.tokens == keys.tokens, where, "values.tokens", values.tokens,
            [&] { return "keys.tokens (" + std::to_string(keys.tokens) + ")"; });
    require(out != nullptr, where, "out", "null", "a [nq, q_heads, d] array");
    if (kept != nullptr) {
      require(kept->segments() == keys.heads, where, "kept.segments", kept->segments(),
              [&] { return "one set per KV head (" + std::to_string(keys.heads) + ")"; });
      validate_index_sets(*kept, [&](int) { return keys.tokens; }, where, "kept");
    }
  }
  const int d = queries.dim;
  const int n = keys.tokens;
  const int nq = queries.tokens;
  const int G = queries.heads / keys.heads;
  cpu::parallel_for(static_cast<std::int64_t>(queries.heads) * nq, [&](std::int64_t job) {
    const int hq = static_cast<int>(job / nq);
    const int i = static_cast<int>(job % nq);
    const int h = hq / G;
    const int pos = first_query_position + i;
    std::vector<std::int32_t> idx;
    if (kept != nullptr) {
      for (const auto j : (*kept)[h]) {
        if (j <= pos) idx.push_back(j);
      }
    } else {
      for (int j = 0; j <= std::min(pos, n - 1); ++j) idx.push_back(j);
    }
    std::vector<float> w(idx.size());
    attend_row(
        queries.row(i, hq), d, static_cast<int>(idx.size()),
        [&](int t) { return keys.row(idx[t], h); }, [&](int t) { return values.row(idx[t], h); },
        out + (static_cast<std::size_t>(i) * queries.heads + hq) * d, w.data());
    if (weights != nullptr) {
      float* row = weights + (static_cast<std::size_t>(hq) * nq + i) * n;
      std::fill(row, row + n, 0.0f);
      for (std::size_t t = 0; t < idx.size(); ++t) row[idx[t]] = w[t];
    }
  });
}

}  // namespace kvsift::attention
