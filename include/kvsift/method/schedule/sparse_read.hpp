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
#include <vector>

namespace kvsift {

struct schedule::sparse_read {
  static constexpr int tiers = 1;
  template <class Store, class Recipe>
  class state;
};

template <class Store, class Recipe>
class schedule::sparse_read::state : public detail::one_tier<Store> {
  using base = detail::one_tier<Store>;
  using T = typename Store::element_type;
  static_assert(std::is_same_v<typename Recipe::scorer::granularity, page_level>,
                "kvsift::schedule::sparse_read: selects pages per step: compose it with a "
                "page-level scorer and selector (score::page_minmax, select::page_topk)");
  static_assert(ScorerFor<typename Recipe::scorer, Store>,
                "kvsift::method: the Scorer must provide score(const score_input<Store>&, "
                "score_sets&)");

 public:
  template <class R>
  static constexpr capabilities caps{
      .changes_physical_length = false,
      .safe_with_shared_prefix = true,
      .needs_queries = R::scorer::needs_queries,
      .cuda_graph_safe = false,
      .speculative_decoding = false,
  };
  static constexpr bool after_attention_reads_queries = false;

  template <class M>
  explicit state(const M& m) : base(m) {}

  template <class M>
  void check_chunk(const M& m, std::string_view where, int layer, const prefill_chunk<T>& c,
                   prefill_totals& tot) const {
    base::check_room(m, where, layer, c, tot.added[c.request], tot.pool_pages);
  }
  template <class M>
  void check_prefill(const M&, std::string_view, int, std::span<const prefill_chunk<T>>,
                     const prefill_totals&) const {}
  template <class M>
  void prefill(M& m, int layer, std::span<const prefill_chunk<T>> chunks) {
    for (const auto& c : chunks) m.store().append(c.request, layer, c.keys, c.values, c.first_position);
  }

  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    base::check_decode_room(m, where, layer, tokens);
  }
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
  template <class M>
  void after_attention(M&, int, std::span<const decode_token<T>>) {}

  template <class M>
  void reset(M& m, int request) {
    m.store().reset(request);
    this->reset_steps(m, request);
    if constexpr (hooks_of<typename Recipe::scorer>.reset) {
      m.parts().scorer.reset(std::as_const(m.store()), request);
    }
  }
  template <class M>
  void stats(const M&, method_stats& s) const { this->fill_stats(s); }

 private:
  score_sets scores_;
  std::vector<int> budgets_, lengths_;
  std::vector<kv_view<const float, nhd>> qs_;
  std::vector<std::int32_t> qpos_;
};

}  // namespace kvsift
