// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/attention/reference.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/score/context.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace kvsift::score {

// Cumulative attention — H2O (Zhang et al., 2023). Prefill: the score of token j is the sum over
// every prompt query i >= j of its causal attention a[i][j], reduced over the GQA group (`gqa`,
// default mean). Decode: the scorer keeps a running score per resident
// slot; `observe` adds a step's attention over the slots it read (the new token starts with its
// own), and `compact` follows the store's compaction. Stateful: one instance per method.
// Cost: prefill O(n^2 d) per query head (every prompt query); decode O(|plan| d) with `observe`
// (a second pass over the keys), O(|plan| G) with `observe_weights` (the probabilities the step's
// attention kept: method::attend's, schedule::evict).
struct cumulative_attention {
  using kvsift_role = scorer_tag;
  static constexpr hooks kvsift_hooks{.observe = true, .compact = true, .reset = true};
  using granularity = token_level;
  static constexpr bool needs_queries = true;
  struct params {
    gqa_reduce gqa = gqa_reduce::mean;
  };
  params p{};

  cumulative_attention() = default;
  explicit cumulative_attention(params prm) : p(prm) {}

  // Every prompt query is needed.
  [[nodiscard]] int query_window() const { return -1; }
  void validate(std::string_view) const {}

  // Prefill: cumulative attention of the given queries; initialises the running scores.
  // Decode: returns the running scores.
  template <class Store>
  void score(const score_input<Store>& in, score_sets& out) {
    const model_shape& sh = in.store->shape();
    layout_scores(in, out, [&](int s) { return in.store->length(in.sequence(s)); });
    if (in.event == lifecycle_event::decode_step) {
      for (int s = 0; s < in.segments(); ++s) {
        const auto& run = running_of(in.sequence(s));
        std::copy(run.begin(), run.end(), out[s].begin());
      }
      return;
    }
    const int G = sh.group_size();
    cpu::parallel_for(in.segments(), [&](std::int64_t s) {
      const int r = static_cast<int>(s) / sh.kv_heads;
      const int h = static_cast<int>(s) % sh.kv_heads;
      const auto seq = in.sequence(static_cast<int>(s));
      const auto& q = in.queries[r];
      const int n = in.store->length(seq);
      const int d = sh.head_dim;
      using T = typename Store::element_type;
      std::vector<const T*> keys(static_cast<std::size_t>(n));  // row addresses, looked up once
      for (int j = 0; j < n; ++j) keys[j] = in.store->key(seq, j);
      std::vector<float> rows(static_cast<std::size_t>(G) * n, 0.0f);
      std::vector<float> probs(static_cast<std::size_t>(G) * n);
      std::vector<float> qg(static_cast<std::size_t>(G) * d);
      // query i's G heads over the keys it sees (each key row read once for the group), added in
      // query order: per (head, slot) the same sums as one head at a time (attention_row's bits)
      for (int i = 0; i < q.tokens; ++i) {
        for (int g = 0; g < G; ++g) {
          const float* src = q.row(i, h * G + g);
          std::copy(src, src + d, qg.begin() + static_cast<std::ptrdiff_t>(g) * d);
        }
        const int v = cpu::visible_slots(*in.store, seq, in.query_position[r] + i);
        const auto sv = static_cast<std::size_t>(v);
        cpu::attention_rows_at<T>([&](std::size_t j) { return keys[j]; }, sv, d, qg.data(), G,
                                  std::span<float>(probs).first(G * sv));
        for (int g = 0; g < G; ++g) {
          float* row = rows.data() + static_cast<std::size_t>(g) * n;
          const float* pg = probs.data() + static_cast<std::size_t>(g) * sv;
          for (std::size_t j = 0; j < sv; ++j) row[j] += pg[j];
        }
      }
      cpu::reduce_group(rows, G, out[static_cast<int>(s)], p.gqa);
    });
    for (int s = 0; s < in.segments(); ++s) {
      auto seg = out[s];
      running_of(in.sequence(s)).assign(seg.begin(), seg.end());
    }
  }

  // Adds the attention of one decode query ([q_heads, d]) over the slots it read to their running
  // scores; slots the scorer has not seen yet (the new token) start at 0 before the addition.
  // The request's KV heads are segments first_segment .. first_segment + kv_heads - 1 of `plan`
  // (a batch's plan holds every request's heads in turn). A second pass over the plan's keys: an
  // engine that attended with its own kernel has no probabilities to hand over.
  template <class Store>
  void observe(const Store& store, int request, int layer, const float* q,
               const index_sets& plan, int first_segment = 0) {
    const model_shape& sh = store.shape();
    const int G = sh.group_size();
    const int d = sh.head_dim;
    add_step(store, request, layer, plan, first_segment, d,
             [&](int h, std::span<float> rows, std::span<float> reduced) {
      const auto seq = sh.sequence(request, layer, h);
      // every query head of the group in one pass over the keys, in dot's exact bits
      cpu::attention_rows_over(store, seq, q + static_cast<std::size_t>(h) * G * d, G,
                               plan[first_segment + h], rows);
      cpu::reduce_group(rows, G, reduced, p.gqa);
      return std::span<const float>(reduced);
    });
  }

  // The reduction observe_weights adds: a plan_weights whose `reduction` is this has every
  // segment reduced by the attention's own threads (schedule::evict sets it).
  [[nodiscard]] gqa_reduce weights_reduction() const { return p.gqa; }

  // observe without the second pass: the probabilities the step's own attention kept
  // (attention::attend_plan_batch with weights over the same plan), equal bit for bit to what
  // observe derives, so the running scores are the same; already reduced over the group where
  // the attention did it (weights.reduction == weights_reduction(): the same reduce_group).
  template <class Store>
  void observe_weights(const Store& store, int request, int layer, const index_sets& plan,
                       const attention::plan_weights& weights, int first_segment = 0) {
    const int G = store.shape().group_size();
    const bool reduced_there = weights.reduction == p.gqa && weights.group == G &&
                               !weights.offsets.empty() &&
                               weights.reduced.size() == weights.offsets.back() / G;
    add_step(store, request, layer, plan, first_segment, reduced_there ? 0 : 1,
             [&](int h, std::span<float>, std::span<float> reduced) {
      if (reduced_there) return weights.reduced_segment(first_segment + h);
      cpu::reduce_group(weights.segment(first_segment + h), G, reduced, p.gqa);
      return std::span<const float>(reduced);
    });
  }
  // The store kept `kept[h]` of each head: keep the matching running scores.
  template <class Store>
  void compact(const Store& store, int request, int layer, const index_sets& kept) {
    for (int h = 0; h < store.shape().kv_heads; ++h) {
      auto& run = running_of(store.shape().sequence(request, layer, h));
      const auto slots = kept[h];
      for (std::size_t i = 0; i < slots.size(); ++i) run[i] = run[slots[i]];
      run.resize(slots.size());
    }
  }

  // A request ended (method::reset): drop its running scores.
  template <class Store>
  void reset(const Store& store, int request) {
    const model_shape& sh = store.shape();
    for (int l = 0; l < sh.layers; ++l) {
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = static_cast<std::size_t>(sh.sequence(request, l, h));
        if (seq < running_.size()) std::vector<float>().swap(running_[seq]);  // memory freed
      }
    }
  }

  // Running score of a head-sequence's slot (tests, diagnostics).
  [[nodiscard]] std::span<const float> running(std::int64_t seq) const {
    const auto i = static_cast<std::size_t>(seq);
    return i < running_.size() ? std::span<const float>(running_[i]) : std::span<const float>{};
  }

 private:
  // Adds a step's GQA-reduced probabilities to the running scores of the request's KV heads:
  // reduced(h, rows, out) returns head h's probabilities reduced over the group
  // [plan[first_segment + h].size()] (in `out`, or elsewhere; `rows` is [G, that] scratch),
  // reading `per_slot` elements per slot and query head (the parallel loop's work estimate).
  // The table's entries first (growing it moves them and is not thread-safe), then the KV heads
  // in parallel: each head adds to its own running scores only, in the same order as one thread
  // would.
  template <class Store, class Reduced>
  void add_step(const Store& store, int request, int layer, const index_sets& plan,
                int first_segment, int per_slot, Reduced&& reduced_of) {
    const model_shape& sh = store.shape();
    const int G = sh.group_size();
    observed_.resize(static_cast<std::size_t>(sh.kv_heads));
    running_of(sh.sequence(request, layer, sh.kv_heads - 1));  // the highest: no growth below
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto seq = sh.sequence(request, layer, h);
      auto& run = running_of(seq);
      run.resize(static_cast<std::size_t>(store.length(seq)), 0.0f);
      observed_[h] = &run;
    }
    // observe's second pass reads G * d per slot; adding kept probabilities touches G
    const std::int64_t work =
        static_cast<std::int64_t>(plan.size(first_segment)) * (G * per_slot + 1);
    cpu::parallel_for(sh.kv_heads, [&](std::int64_t h64) {
      const int h = static_cast<int>(h64);
      auto& run = *observed_[h];
      const auto slots = plan[first_segment + h];
      thread_local std::vector<float> rows, reduced;  // scratch: nothing allocated once warm
      rows.resize(static_cast<std::size_t>(G) * slots.size());
      reduced.resize(slots.size());
      const std::span<const float> add =
          reduced_of(h, std::span<float>(rows), std::span<float>(reduced));
      if (consecutive(slots)) {  // a whole-cache plan (H2O's): one contiguous add, vectorised
        float* to = run.data() + slots[0];
        for (std::size_t i = 0; i < slots.size(); ++i) to[i] += add[i];
        return;
      }
      for (std::size_t i = 0; i < slots.size(); ++i) run[slots[i]] += add[i];
    }, cpu::par, work);
  }

  // A head-sequence's running scores (the table grows to the highest sequence seen).
  std::vector<float>& running_of(std::int64_t seq) {
    const auto i = static_cast<std::size_t>(seq);
    if (i >= running_.size()) running_.resize(i + 1);
    return running_[i];
  }

  std::vector<std::vector<float>> running_;  // per head-sequence (its index), per slot
  std::vector<std::vector<float>*> observed_;  // scratch of observe: each KV head's running scores
};
static_assert(Scorer<cumulative_attention>);

}  // namespace kvsift::score
