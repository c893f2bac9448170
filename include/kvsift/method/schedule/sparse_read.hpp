// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::sparse_read — one tier, nothing evicted: full KV stays resident (the method saves
// bandwidth, not memory) and each decode step selects what attention reads (Quest's pages).
//
//   prefill   appends every chunk
//   decode    appends each request's token; with this step's query the scorer scores the pages,
//             the budgeter and selector pick them, and the plan reads their tokens (dense layers
//             read every page)
//   after     nothing

#include <kvsift/concepts.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/recipe.hpp>
#include <kvsift/method/schedule/one_tier.hpp>
#include <kvsift/score/context.hpp>
#include <kvsift/select/page_topk.hpp>

#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvsift {

struct schedule::sparse_read {
  static constexpr int tiers = 1;
  template <class Store, class Recipe>
  class state;
};

// The content half of a sparse_read state: the step's plan (score the pages, budget, select,
// expand to slots). This one runs over host memory; device/sparse_read.hpp specialises it for a
// store in a device exec's memory. The control flow both share is schedule::sparse_read::state.
namespace detail {

template <class Store, class Recipe>
class sparse_read_content : public one_tier<Store> {
  using base = one_tier<Store>;
  using T = typename Store::element_type;
  static_assert(std::is_same_v<typename Recipe::scorer::granularity, page_level>,
                "kvsift::schedule::sparse_read: selects pages per step: compose it with a "
                "page-level scorer and selector (score::page_minmax, select::page_topk)");
  static_assert(ScorerFor<typename Recipe::scorer, Store>,
                "kvsift::method: the Scorer must provide score(const score_input<Store>&, "
                "score_sets&)");

 public:
  using chunk_type = prefill_chunk<T>;

  template <class M>
  explicit sparse_read_content(const M& m) : base(m) {}

  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens, attention_plan& plan) {
    this->append_tokens(m, layer, tokens);
    const int page_size = m.parts().selector.p.page_size;
    if (layer < m.parameters().dense_layers) {  // a dense layer reads every page
      this->plan_everything(m, layer, plan, page_size);
      return;
    }
    auto& parts = m.parts();
    const auto& sh = m.store().shape();
    qs_.clear();
    qpos_.clear();
    lengths_.clear();
    for (const auto& t : tokens) {
      qs_.push_back(kv_view<const float, nhd>::contiguous(t.query, 1, sh.q_heads, sh.head_dim));
      qpos_.push_back(m.store().next_position(t.request, layer) - 1);
      for (int h = 0; h < sh.kv_heads; ++h) {
        lengths_.push_back(m.store().length(sh.sequence(t.request, layer, h)));
      }
    }
    score_input<Store> in{&m.store(), layer, lifecycle_event::decode_step, plan.requests, qs_, qpos_, {}};
    parts.scorer.score(in, scores_);
    parts.budgeter.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths_}, budgets_);
    parts.selector.select(scores_, budgets_, plan.pages);
    select::expand_pages(plan.pages, lengths_, page_size, plan.slots, this->sizes_);
    ++this->refreshes_;
    base::fill_positions(m, layer, plan);
  }

 protected:
  // A chunk appended at `before`: the scorer reads the host store's keys when it scores.
  template <class M>
  void appended(M&, int, int, int) {}
  template <class M>
  void forget_request(M& m, int request) {
    if constexpr (hooks_of<typename Recipe::scorer>.reset) {
      m.parts().scorer.reset(std::as_const(m.store()), request);
    }
  }

 private:
  score_sets scores_;
  std::vector<int> budgets_, lengths_;
  std::vector<kv_view<const float, nhd>> qs_;
  std::vector<std::int32_t> qpos_;
};

}  // namespace detail

// The one body of the sparse_read schedule, for every exec.
template <class Store, class Recipe>
class schedule::sparse_read::state : public detail::sparse_read_content<Store, Recipe> {
  using content = detail::sparse_read_content<Store, Recipe>;
  using T = typename Store::element_type;
  using chunk = typename content::chunk_type;

 public:
  template <class R>
  static constexpr capabilities caps{
      .changes_physical_length = false,
      .safe_with_shared_prefix = true,
      .needs_queries = R::scorer::needs_queries,
      .cuda_graph_safe = false,  // the laws hold on exec::sim; exec::cuda captures no step yet
      .speculative_decoding = false,
  };
  static constexpr bool after_attention_reads_queries = false;

  template <class M>
  explicit state(const M& m) : content(m) {}

  template <class M>
  void check_chunk(const M& m, std::string_view where, int layer, const chunk& c,
                   prefill_totals& tot) const {
    this->check_room(m, where, layer, c, tot.added[c.request], tot.pool_pages);
  }
  template <class M>
  void check_prefill(const M&, std::string_view, int, std::span<const chunk>,
                     const prefill_totals&) const {}
  template <class M>
  void prefill(M& m, int layer, std::span<const chunk> chunks) {
    for (const auto& c : chunks) {
      const int before = m.store().length(m.store().shape().sequence(c.request, layer, 0));
      m.store().append(c.request, layer, c.keys, c.values, c.first_position);
      this->appended(m, c.request, layer, before);
    }
  }

  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    this->check_decode_room(m, where, layer, tokens);
  }
  template <class M>
  void after_attention(M&, int, std::span<const decode_token<T>>) {}

  template <class M>
  void reset(M& m, int request) {
    m.store().reset(request);
    this->reset_steps(m, request);
    this->forget_request(m, request);
  }
  template <class M>
  void stats(const M&, method_stats& s) const { this->fill_stats(s); }
};

}  // namespace kvsift
