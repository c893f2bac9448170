// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::evict over a device store: the content half (detail::evict_content) that the one
// evict body (schedule::evict::state, method/schedule/evict.hpp) calls when method<Store, Recipe,
// E> runs over a thrust::dense_store<T, E> or a thrust::paged_store<T, E>
// (thrust::DeviceOneTierStore). The body's checks, order and trigger are the host's own.
//
//   kvsift::thrust::sim_arena arena;
//   kvsift::exec::sim_cpp e{arena};
//   kvsift::thrust::dense_store<float, kvsift::exec::sim_cpp> st(e, shape, requests, capacity, 1);
//   kvsift::h2o<decltype(st), kvsift::exec::sim_cpp> m(st, kvsift::h2o_params<...>(budget));
//   m.prefill(layer, chunk);              // chunk views in E's memory (method::chunk_type)
//   const auto& plan = m.decode(layer, tokens);   // thrust::device_plan: E memory
//   m.attend(layer, tokens, out);         // queries and out in E's memory
//   m.after_attention(layer, tokens);
//   st.check();                           // what the device found (NaN/Inf), outside a step
//
// Shapes on the host, contents on the device. Every count a step needs (lengths, budgets, whether
// a round runs, how many slots a head keeps, the plan's offsets) is host arithmetic on the
// store's host shadow, the budgeter and the trigger, in the body every exec shares; the data
// decides only which slots. A step
// uploads its descriptors (the plan's CSR, the batch, each request's local CSR and query
// position: counted host-to-device writes) and reads nothing back; every buffer it uses is
// allocated once, at construction, sized by the store's capacity and requests, so after warm-up
// a decode step allocates nothing (Thrust's own sort scratch comes from the exec's arena cache).
// tests/thrust/test_device_methods.cpp checks both with exec::sim's counters, and that every
// plan and attention output equals the host method's.
//
// Parts: select::topk or select::partition_topk on thrust::segmented_topk; a scorer with a
// Thrust round (thrust::ThrustScorer); budgeters and triggers are host arithmetic. A NaN query
// is not rejected on the device (it scores NaN, ranked below every number). How H2O, LagKV and
// DynamicKV map onto the device: docs/architecture.md, "Design notes from the headers".

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/schedule/evict.hpp>
#include <kvsift/device/one_tier.hpp>
#include <kvsift/method/schedule/one_tier.hpp>
#include <kvsift/select/partition_topk.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/cumulative_attention.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/lag.hpp>
#include <kvsift/thrust/recency.hpp>
#include <kvsift/thrust/round.hpp>
#include <kvsift/thrust/segmented_topk.hpp>
#include <kvsift/thrust/window_attention.hpp>

#include <thrust/copy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvsift::thrust {

namespace detail {

// Rows [skip, skip + n) of a [tokens, heads, d] view into contiguous [n, heads, d] floats.
template <class Space>
struct copy_query_rows_fn {
  kv_view<const float, nhd, Space> q;
  int skip;
  float* dst;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int c = static_cast<int>(e % q.dim);
    const std::int64_t th = e / q.dim;
    dst[e] = q.row(skip + static_cast<int>(th / q.heads), static_cast<int>(th % q.heads))[c];
  }
};

// LagKV's scored partitions back to back: dst[g * lag + j] = scores[src[g] + j].
struct pack_partitions_fn {
  const float* scores;
  const std::int32_t* src;  // [partitions] start of each in the packed scores
  int lag;
  float* dst;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    dst[e] = scores[src[e / lag] + e % lag];
  }
};

// offsets[g] = g * n, kept[g] = g * k: uniform CSRs of the partitions and their picks.
struct uniform_offsets_fn {
  int n, k;
  std::int32_t* offsets;
  std::int32_t* kept;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t g) const {
    offsets[g] = static_cast<std::int32_t>(g * n);
    kept[g] = static_cast<std::int32_t>(g * k);
  }
};

// Entry t of head h's kept slots (ascending): the prefix [0, base), then the k picks of each
// scored partition q (local to it: base + q * lag + pick), then the tail [tail, n).
// desc: [heads + 1] kept CSR, then base, tail, scored partitions, first partition per head.
struct partition_kept_fn {
  const std::int32_t* desc;
  int heads, lag, k;
  const std::int32_t* picked;  // [partitions * k] ascending per partition
  std::int32_t* kept;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int h = segment_of(desc, heads, t);
    const int i = static_cast<int>(t - desc[h]);
    const int base = desc[heads + 1 + h], tail = desc[2 * heads + 1 + h];
    const int scored = desc[3 * heads + 1 + h], first = desc[4 * heads + 1 + h];
    if (i < base) {
      kept[t] = i;
    } else if (i < base + scored * k) {
      const int q = (i - base) / k;
      kept[t] = base + q * lag + picked[static_cast<std::int64_t>(first + q) * k + (i - base) % k];
    } else {
      kept[t] = tail + (i - base - scored * k);
    }
  }
};

// Packed scores [offsets[h] + j] into a store's side column [h * capacity + j].
struct scatter_column_fn {
  const float* scores;
  const std::int32_t* offsets;
  int segments;
  std::int64_t capacity;
  float* column;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int h = segment_of(offsets, segments, e);
    column[h * capacity + (e - offsets[h])] = scores[e];
  }
};

}  // namespace detail

// The newest queries of each (request, layer) in E memory, for a scorer that reads past queries
// (method::query_history's device twin, with its rules: keep > 0 the newest `keep`, -1 every
// row; rows continue the buffered ones or the buffer restarts). A slot holds up to 2 * keep rows
// (every prompt row for keep = -1) and slides when full, so an append moves at most `keep` rows.
template <DeviceExec E>
class device_query_history {
 public:
  device_query_history(const E& e, std::size_t slots, int keep, int capacity, int q_heads, int dim)
      : exec_(e), keep_(keep), per_slot_(keep > 0 ? 2 * keep : keep < 0 ? capacity : 0),
        row_(static_cast<std::int64_t>(q_heads) * dim),
        rows_data_(e, static_cast<std::size_t>(per_slot_) * row_ * slots),
        scratch_(e, keep > 0 ? static_cast<std::size_t>(keep) * row_ : 0),
        count_(slots, 0), first_(slots, 0) {}

  [[nodiscard]] int rows(std::size_t slot) const { return count_[slot]; }
  [[nodiscard]] std::int32_t first(std::size_t slot) const { return first_[slot]; }
  // The newest n <= rows(slot) rows, [n, q_heads, d] contiguous in E memory.
  [[nodiscard]] const float* newest(std::size_t slot, int n) const {
    return rows_data_.data() + (static_cast<std::int64_t>(slot) * per_slot_ + count_[slot] - n) * row_;
  }
  // Rows a slot can hold (every prompt query of a request for keep = -1; 2 * keep otherwise).
  [[nodiscard]] int capacity() const { return per_slot_; }
  void clear(std::size_t slot) { count_[slot] = 0; }

  template <class Space>
  void remember(std::size_t slot, kv_view<const float, nhd, Space> q, std::int32_t first) {
    if (keep_ == 0) return;
    int& count = count_[slot];
    if (count > 0 && first_[slot] + count != first) count = 0;
    int skip = 0;
    int n = q.tokens;
    if (n == 0) return;
    if (keep_ > 0 && n > keep_) {
      skip = n - keep_;
      n = keep_;
      count = 0;
    }
    if (count == 0) first_[slot] = first + skip;
    require(count + n <= per_slot_ || keep_ > 0, "method.prefill", "queries.tokens", q.tokens,
            "room in the device query history (every prompt query of a request, at most the "
            "store's capacity)");
    const auto policy = exec_.policy();
    if (count + n > per_slot_) {  // slide: keep the newest keep - n rows, at the front
      const int kept = std::min(count, keep_ - n);
      const std::int64_t len = static_cast<std::int64_t>(kept) * row_;
      float* b = base(slot);
      ::thrust::copy_n(policy, b + (count - kept) * row_, len, scratch_.data());
      ::thrust::copy_n(policy, scratch_.data(), len, b);
      first_[slot] += count - kept;
      count = kept;
    }
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), n * row_,
                         detail::copy_query_rows_fn<Space>{q, skip, base(slot) + count * row_});
    count += n;
  }

 private:
  [[nodiscard]] float* base(std::size_t slot) {
    return rows_data_.data() + static_cast<std::int64_t>(slot) * per_slot_ * row_;
  }

  E exec_;
  int keep_;
  int per_slot_;
  std::int64_t row_;
  buffer<float, E> rows_data_;  // [slots, per_slot, q_heads, d]
  buffer<float, E> scratch_;    // [keep, q_heads, d] a slide's staging
  std::vector<int> count_;      // host shadow: rows buffered per slot
  std::vector<std::int32_t> first_;  // host shadow: position of the first
};

}  // namespace kvsift::thrust

namespace kvsift::detail {

// The content half of schedule::evict::state (method/schedule/evict.hpp, the one body) over a
// device store: queries in a device_query_history, the step's plan and attention in E memory, and
// each firing request's round on the thrust/ leaves.
template <class Store, class Recipe>
  requires thrust::DeviceOneTierStore<Store>
class evict_content<Store, Recipe> : public device_one_tier<Store> {
  using T = typename Store::element_type;
  using E = typename Store::exec_type;
  using base = device_one_tier<Store>;
  using Scorer = typename Recipe::scorer;
  using Selector = typename Recipe::selector;
  using Budgeter = typename Recipe::budgeter;
  using Policy = decltype(std::declval<const E&>().policy());
  using base::exec_;
  using base::H_;
  using base::G_;
  using base::cap_;
  using base::per_round;
  using base::rows_of;
  using base::local_offsets;
  using base::local_items;
  static constexpr bool observes = hooks_of<Scorer>.observe;
  static constexpr bool compresses = !requires { requires Selector::keeps_everything; };
  static constexpr bool partitions = std::is_same_v<Selector, select::partition_topk>;
  static_assert(!compresses || std::is_same_v<Selector, select::topk> || partitions,
                "kvsift::method on a device exec: the evict schedule selects with select::topk or "
                "select::partition_topk (thrust::segmented_topk); this selector has no Thrust path");
  static constexpr bool revises = hooks_of<Budgeter>.revise;
  static_assert(!compresses || thrust::ThrustScorer<Scorer, T, Policy>,
                "kvsift::method on a device exec: the Scorer needs a Thrust round "
                "(thrust::score_round: recency, window_attention, cumulative_attention and "
                "lag_relative have one)");
  static_assert(!observes || std::is_same_v<Scorer, score::cumulative_attention>,
                "kvsift::method on a device exec: the only observing scorer with a Thrust observe "
                "is cumulative_attention (H2O)");

 public:
  using chunk_type = prefill_chunk<T, typename E::memory_space>;

  template <class M>
  explicit evict_content(const M& m)
      : base(m),
        history_(exec_, static_cast<std::size_t>(m.store().requests()) * m.store().shape().layers,
                 Scorer::needs_queries ? m.parts().scorer.query_window() : 0, cap_,
                 m.store().shape().q_heads, m.store().shape().head_dim),
        scores_(exec_, per_round()),
        kept_(exec_, per_round()),
        kept_offsets_(exec_, static_cast<std::size_t>(H_) + 1),
        window_(exec_, static_cast<std::size_t>(H_)),
        victims_(exec_, static_cast<std::size_t>(H_)),
        round_offsets_(exec_, static_cast<std::size_t>(H_) + 1),
        query_first_(exec_, 1),
        topk_ws_(exec_, compresses ? thrust::segmented_topk_workspace_bytes(per_round()) : 0),
        score_ws_(exec_, score_workspace(m)),
        base_(exec_, static_cast<std::size_t>(H_)),
        part_src_(exec_, max_partitions(m)),
        part_offsets_(exec_, max_partitions(m) + 1),
        part_kept_offsets_(exec_, max_partitions(m) + 1),
        head_desc_d_(exec_, partitions ? static_cast<std::size_t>(5 * H_ + 1) : 0),
        part_scores_(exec_, partitions ? per_round() : 0),
        picked_(exec_, partitions ? per_round() : 0),
        weights_(exec_, observes ? per_round() * G_ : 0),
        observe_out_(exec_, observes ? static_cast<std::size_t>(m.store().shape().q_heads) *
                                           m.store().shape().head_dim
                                     : 0) {
    if constexpr (observes) {
      require(m.store().columns() >= 1, "method", "store.columns()", m.store().columns(),
              ">= 1: the observing scorer's running scores live in the store's side column 0 "
              "(thrust::dense_store(exec, shape, requests, capacity, /*columns=*/1))");
    }
    if constexpr (partitions) reserve_decode_round(m);
  }

  // Appends each request's token, then the plan of every resident slot (E memory).
  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens, thrust::device_plan& plan) {
    this->append_step(m, layer, tokens, plan.requests);
    this->plan_every_slot(m, layer, plan);
  }

 protected:
  // The scorer's queries: a device_query_history in E memory.
  template <class M>
  const thrust::device_query_history<E>& history(const M&) const { return history_; }
  // Every prompt query (window -1) must fit the history's buffer of capacity rows.
  template <class M>
  void check_history(const M& m, std::string_view where, const chunk_type& c, int rows) const {
    if (m.parts().scorer.query_window() < 0) {
      require(rows <= history_.capacity(), where, "queries.tokens", c.queries.tokens,
              "room in the device query history: " + std::to_string(rows) +
                  " prompt queries buffered, at most the store's capacity (" +
                  std::to_string(history_.capacity()) + ")");
    }
  }
  template <class M>
  void remember(M& m, int layer, const chunk_type& c) {
    history_.remember(m.slot(c.request, layer), c.queries,
                      c.first_position + c.keys.tokens - c.queries.tokens);
  }
  template <class M>
  void remember_step(M& m, int layer, const decode_token<T>& t) {
    const auto& sh = m.store().shape();
    history_.remember(m.slot(t.request, layer),
                      kv_view<const float, nhd, typename E::memory_space>::contiguous(
                          t.query, 1, sh.q_heads, sh.head_dim),
                      m.store().next_position(t.request, layer) - 1);
  }
  template <class M>
  void forget(M& m, int layer, int request) { history_.clear(m.slot(request, layer)); }
  // The running scores (H2O) live in the store's side column, which the store's reset clears.
  template <class M>
  void forget_request(M& m, int request) {
    for (int l = 0; l < m.store().shape().layers; ++l) history_.clear(m.slot(request, l));
  }

  // The step's attention into the running scores (side column 0).
  template <class M>
  void observe(M& m, int layer, std::span<const decode_token<T>> tokens) {
    const auto& sh = m.store().shape();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      this->attend_one(m, layer, i, tokens[i], observe_out_.data(), weights_.data());
      const std::int64_t seq0 = sh.sequence(tokens[i].request, layer, 0);
      thrust::cumulative_attention_observe(exec_.policy(), weights_.data(), local_offsets(i), H_,
                                           local_items(i), G_, m.parts().scorer.p.gqa, nullptr,
                                           m.store().column(0) + seq0 * cap_, cap_);
    }
  }

  // A round of `firing` (their heads' budgets [firing * kv_heads]), request by request on the
  // device over its KV heads, its counts (and LagKV's partitions) host arithmetic; a freezing
  // selector advances `frozen_all`.
  template <class M>
  void round(M& m, int layer, lifecycle_event event, const std::vector<int>& firing,
             const std::vector<int>& firing_budgets, std::vector<int>& frozen_all) {
    auto& st = m.store();
    const auto& sh = st.shape();
    if constexpr (revises) {
      round_sizes_.clear();
      kept_sizes_.clear();
      round_scores_host_.clear();
      round_kept_host_.clear();
    }
    int rounds = 0;  // partition_topk: the rounds of LagKV's recursion the call amounts to
    for (std::size_t i = 0; i < firing.size(); ++i) {
      const int r = firing[i];
      const std::int64_t seq0 = sh.sequence(r, layer, 0);
      round_local_.assign(1, 0);
      for (int h = 0; h < H_; ++h) round_local_.push_back(round_local_.back() + st.length(seq0 + h));
      bool shrinks = false;
      if constexpr (partitions) {
        shrinks = plan_partitions(m, seq0, frozen_all, rounds);
      } else {
        shrinks = plan_topk(m, std::span<const int>(firing_budgets).subspan(i * H_, H_));
      }
      const bool from_prompt = event != lifecycle_event::decode_step;
      const bool scores_needed =
          partitions ? rounds_here_ : shrinks || revises || (observes && from_prompt);
      if (!scores_needed) continue;
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(round_local_), round_offsets_);
      round_scores(m, r, layer, from_prompt);
      if (shrinks) select(m);
      if constexpr (revises) keep_for_revision(shrinks);
      if (shrinks) st.retain(r, layer, counts_, kept_.data());
      if constexpr (partitions) {
        for (int h = 0; h < H_; ++h) frozen_all[seq0 + h] = part_shape_.frozen_after[h];
      }
    }
    this->refreshes_ += partitions ? rounds : 1;
    if constexpr (revises) revise(m, layer, event, firing);
  }

 private:
  template <class M>
  [[nodiscard]] std::size_t score_workspace(const M& m) const {
    if constexpr (compresses) {
      const int w = Scorer::needs_queries ? m.parts().scorer.query_window() : 0;
      return score_round_workspace_bytes(
          m.parts().scorer, thrust::round_shape{static_cast<std::int64_t>(per_round()), H_, G_,
                                                w < 0 ? cap_ : w, m.store().shape().head_dim});
    } else {
      return 0;
    }
  }
  // A LagKV decode round scores one partition per head: sort the same number of keys once now,
  // so the exec's arena holds that sort's scratch (Thrust's temporary storage, which the arena
  // caches by size) and no decode step allocates it (the capture law).
  template <class M>
  void reserve_decode_round(const M& m) {
    const auto& sel = m.parts().selector;
    const int L = sel.p.lag, k = sel.keep_per_partition();
    if (static_cast<std::size_t>(H_) * L > part_scores_.size()) return;  // no round can fire
    const auto policy = exec_.policy();
    ::thrust::fill_n(policy, part_scores_.data(), static_cast<std::int64_t>(H_) * L, 0.0f);
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), H_ + 1,
                         thrust::detail::uniform_offsets_fn{L, k, part_offsets_.data(),
                                                            part_kept_offsets_.data()});
    thrust::segmented_topk(policy, part_scores_.data(), part_offsets_.data(), H_,
                           static_cast<std::int64_t>(H_) * L, part_kept_offsets_.data(),
                           static_cast<std::int64_t>(H_) * k, picked_.data(), topk_ws_.data(),
                           topk_ws_.size(), {}, /*check=*/false);
  }

  // partition_topk's scored partitions per round, at most.
  template <class M>
  [[nodiscard]] std::size_t max_partitions(const M& m) const {
    if constexpr (partitions) {
      return static_cast<std::size_t>(H_) * (cap_ / m.parts().selector.p.lag + 1);
    } else {
      return 0;
    }
  }
  // A progressive budgeter (DynamicKV) sees the round's scores and kept sets on the host: they
  // are read back once per round (DynamicKV's trigger fires at the prompt's end only, so never in
  // a decode step; a revising budgeter under a trigger that fires at decode would read back in
  // that step), then its orders to shrink earlier layers are uploaded and retained, as the host
  // state applies them.
  void keep_for_revision(bool shrinks) {
    const std::int64_t N = round_local_.back();
    for (int h = 0; h < H_; ++h) {
      round_sizes_.push_back(round_local_[h + 1] - round_local_[h]);
      kept_sizes_.push_back(counts_[h]);
    }
    const std::size_t at = round_scores_host_.size();
    round_scores_host_.resize(at + static_cast<std::size_t>(N));
    thrust::copy_to_host(exec_, scores_, std::span<float>(round_scores_host_.data() + at, N));
    const std::size_t kat = round_kept_host_.size();
    if (shrinks) {
      round_kept_host_.resize(kat + static_cast<std::size_t>(kept_host_.back()));
      thrust::copy_to_host(exec_, kept_,
                           std::span<std::int32_t>(round_kept_host_.data() + kat, kept_host_.back()));
    } else {  // nothing evicted: every slot
      for (int h = 0; h < H_; ++h) {
        for (int j = 0; j < counts_[h]; ++j) round_kept_host_.push_back(j);
      }
    }
  }
  template <class M>
  void revise(M& m, int layer, lifecycle_event event, const std::vector<int>& firing) {
    const auto& sh = m.store().shape();
    if (round_sizes_.size() != firing.size() * H_) return;  // no request was scored
    score_sets scores;
    scores.resize(round_sizes_);
    std::copy(round_scores_host_.begin(), round_scores_host_.end(), scores.values.begin());
    index_sets kept;
    kept.resize(kept_sizes_);
    std::copy(round_kept_host_.begin(), round_kept_host_.end(), kept.values.begin());
    revisions_.clear();
    m.parts().budgeter.revise(
        budget_round{layer, sh.layers, sh.kv_heads, event, firing, &scores, &kept}, revisions_);
    for (const auto& rv : revisions_) {
      counts_.clear();
      for (int h = 0; h < H_; ++h) counts_.push_back(rv.kept.size(h));
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(rv.kept.values), kept_);
      m.store().retain(rv.request, rv.layer, counts_, kept_.data());
      if (rv.request == firing.front()) this->layer_budgets_[rv.layer] = rv.budget;
    }
  }

  // The round's head lengths (from round_local_).
  void head_lengths() {
    head_lengths_.clear();
    for (int h = 0; h < H_; ++h) head_lengths_.push_back(round_local_[h + 1] - round_local_[h]);
  }

  // select::topk's shape half (counts, protected windows) for request i's heads, and the kept
  // CSR the device selection writes into. Whether any head shrinks.
  template <class M>
  bool plan_topk(const M& m, std::span<const int> budgets) {
    head_lengths();
    m.parts().selector.shape_of(head_lengths_, budgets, topk_shape_);
    counts_ = topk_shape_.counts;
    kept_host_.assign(1, 0);
    for (const int c : counts_) kept_host_.push_back(kept_host_.back() + c);
    return topk_shape_.shrinks;
  }

  // select::partition_topk's shape half (bases, partitions, counts, frozen prefixes after), then
  // the device selection's descriptors from it: the scored partitions (where each starts in the
  // packed scores) and, per head, the kept CSR, base, tail, scored partitions and the first of
  // them. Whether any head shrinks.
  template <class M>
  bool plan_partitions(const M& m, std::int64_t seq0, const std::vector<int>& frozen_all,
                       int& rounds) {
    const auto& sel = m.parts().selector;
    const int L = sel.p.lag;
    head_lengths();
    frozen_in_.assign(frozen_all.begin() + seq0, frozen_all.begin() + seq0 + H_);
    sel.shape_of(head_lengths_, frozen_in_, part_shape_);
    const auto& sh = part_shape_;
    counts_ = sh.counts;
    part_src_host_.clear();
    head_desc_.assign(static_cast<std::size_t>(5 * H_ + 1), 0);  // kept CSR, base, tail, parts, first
    for (int h = 0; h < H_; ++h) {
      const int scored = sh.scored(h), base = sh.bases[h];
      head_desc_[h + 1] = head_desc_[h] + counts_[h];
      head_desc_[H_ + 1 + h] = scored > 0 ? base : head_lengths_[h];  // none scored: all "prefix"
      head_desc_[2 * H_ + 1 + h] = base + scored * L;
      head_desc_[3 * H_ + 1 + h] = scored;
      head_desc_[4 * H_ + 1 + h] = static_cast<int>(part_src_host_.size());
      for (int p = 0; p < scored; ++p) part_src_host_.push_back(round_local_[h] + base + p * L);
    }
    rounds = std::max(rounds, sh.rounds);
    rounds_here_ = sh.rounds > 0;
    return sh.shrinks;
  }

  // The round's scores into scores_ (packed by round_offsets_): H2O's running scores during
  // decode, else the scorer's Thrust round over the buffered queries (and, for H2O at the
  // prompt, the start of its running scores).
  template <class M>
  void round_scores(M& m, int r, int layer, bool from_prompt) {
    auto& st = m.store();
    const std::int64_t seq0 = st.shape().sequence(r, layer, 0);
    const std::int64_t N = round_local_.back();
    const auto policy = exec_.policy();
    if (observes && !from_prompt) {
      thrust::pack_rows(policy, thrust::segmented_rows<float>{st.column(0) + seq0 * cap_,
                                                              round_offsets_.data(), nullptr,
                                                              cap_, H_, 1},
                        N, scores_.data(), static_cast<std::int32_t*>(nullptr));
      return;
    }
    int nq = 0;
    const std::size_t slot = m.slot(r, layer);
    if constexpr (Scorer::needs_queries) {
      const int w = m.parts().scorer.query_window();
      nq = w < 0 ? history_.rows(slot) : std::min(w, history_.rows(slot));
      const std::int32_t first = history_.first(slot) + (history_.rows(slot) - nq);
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(&first, 1), query_first_);
    }
    if constexpr (partitions) {
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(part_shape_.bases), base_);
    }
    const auto [k, v] = rows_of(m, r, layer, round_offsets_.data());
    const thrust::round_input<T> in{k, v, N, nq > 0 ? history_.newest(slot, nq) : nullptr,
                                    query_first_.data(), nq, H_, G_,
                                    partitions ? base_.data() : nullptr};
    thrust::score_round(policy, m.parts().scorer, in, scores_.data(), score_ws_.data(),
                        score_ws_.size());
    if constexpr (observes) {  // the prompt's scores start the running scores
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), N,
                           thrust::detail::scatter_column_fn{scores_.data(), round_offsets_.data(),
                                                             H_, cap_, st.column(0) + seq0 * cap_});
    }
  }

  // The kept slots into kept_ (ascending per head, counts_ per head).
  template <class M>
  void select(const M& m) {
    const auto policy = exec_.policy();
    const std::int64_t N = round_local_.back();
    if constexpr (partitions) {
      // the scored partitions packed back to back (L each; at decode the same count every step,
      // so the sort's scratch is the same size), their top k, then each head's kept slots
      const auto& sel = m.parts().selector;
      const int L = sel.p.lag, k = sel.keep_per_partition();
      const auto parts = static_cast<std::int64_t>(part_src_host_.size());
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(part_src_host_), part_src_);
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(head_desc_), head_desc_d_);
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), parts * L,
                           thrust::detail::pack_partitions_fn{scores_.data(), part_src_.data(), L,
                                                              part_scores_.data()});
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), parts + 1,
                           thrust::detail::uniform_offsets_fn{L, k, part_offsets_.data(),
                                                              part_kept_offsets_.data()});
      thrust::segmented_topk(policy, part_scores_.data(), part_offsets_.data(),
                             static_cast<int>(parts), parts * L, part_kept_offsets_.data(),
                             parts * k, picked_.data(), topk_ws_.data(), topk_ws_.size(), {},
                             /*check=*/false);
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), head_desc_[H_],
                           thrust::detail::partition_kept_fn{head_desc_d_.data(), H_, L, k,
                                                             picked_.data(), kept_.data()});
    } else {
      const auto& sel = m.parts().selector;
      const std::int64_t total = kept_host_.back();
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(kept_host_), kept_offsets_);
      thrust::copy_to_device(exec_, std::span<const std::int32_t>(topk_shape_.windows), window_);
      const thrust::topk_protection protect{sel.p.sink, window_.data()};
      if (topk_shape_.one_over) {  // each head drops its worst unprotected slot: no sort
        thrust::segmented_evict_one(policy, scores_.data(), round_offsets_.data(), H_,
                                    kept_offsets_.data(), total, kept_.data(), victims_.data(),
                                    protect);
      } else {
        thrust::segmented_topk(policy, scores_.data(), round_offsets_.data(), H_, N,
                               kept_offsets_.data(), total, kept_.data(), topk_ws_.data(),
                               topk_ws_.size(), protect, /*check=*/false);
      }
    }
  }

  thrust::device_query_history<E> history_;
  // E memory, allocated once (the step's plan and descriptor are device_one_tier's): a round's
  // scores, kept slots, descriptors and scratch
  thrust::buffer<float, E> scores_;
  thrust::buffer<std::int32_t, E> kept_, kept_offsets_, window_, victims_, round_offsets_,
      query_first_;
  thrust::buffer<std::byte, E> topk_ws_, score_ws_;
  // LagKV's rounds: bases, the scored partitions, the per-head descriptor, the packed scores and
  // each partition's picks
  thrust::buffer<std::int32_t, E> base_, part_src_, part_offsets_, part_kept_offsets_, head_desc_d_;
  thrust::buffer<float, E> part_scores_;
  thrust::buffer<std::int32_t, E> picked_;
  thrust::buffer<float, E> weights_, observe_out_;  // H2O's observe: the step's attention
  // host scratch (shapes)
  std::vector<std::int32_t> round_local_, kept_host_;     // a round's
  std::vector<std::int32_t> part_src_host_, head_desc_;
  std::vector<int> head_lengths_, frozen_in_;  // a firing request's heads (lengths, final prefixes)
  select::topk::shape topk_shape_;            // the selector's shape half of the round
  select::partition_topk::shape part_shape_;
  // a progressive budgeter's view of a round, on the host, and its orders
  std::vector<int> round_sizes_, kept_sizes_;
  std::vector<float> round_scores_host_;
  std::vector<std::int32_t> round_kept_host_;
  std::vector<budget_revision> revisions_;
  bool rounds_here_ = false;
  std::vector<int> counts_;  // the kept slots per head of the request in hand
};

}  // namespace kvsift::detail
