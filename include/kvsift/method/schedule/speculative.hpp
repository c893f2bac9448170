// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::speculative — two tiers (store::tiered + its transfer_type): select one token ahead,
// recall in the background, correct the heads whose query moved (FreeKV; METHODS.md "FreeKV",
// SPEC method.freekv.decode). Parts: a page scorer and selector over the candidate domain
// domain::pool_pages (every host-pool page, one token ahead) and the data trigger
// trigger::query_cosine. Per sparse layer:
//
//   prefill   appends the prompt to both tiers; at the last chunk, when the prompt is over the
//             budget, the working set is cut to step 1's layout: sink, window and, when the
//             chunk carries queries, the candidates the prompt's last query selects (without
//             queries: sink and window only).
//   decode    appends k_t, v_t. Step 1 selects with q_1. From step 2, per KV head: if the
//             trigger asks for a correction the head selects with q_t and recalls the missing
//             pages now (a stall); otherwise it takes the selection made after step t-1 and
//             installs its background recall (detail::pending_recalls: the decision is used only
//             once its install succeeded; a failed recall sends every head to the synchronous
//             path). The working set becomes exactly the selected pages' tokens; the plan reads
//             all of it.
//   after     selects with q_t on step t+1's layout and submits the recall of its missing pages.
// Layers [0, dense_layers) keep everything resident and read every page.

#include <kvsift/concepts.hpp>
#include <kvsift/domain/pool_pages.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/recipe.hpp>
#include <kvsift/method/schedule/two_tier.hpp>
#include <kvsift/score/context.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift {

struct schedule::speculative {
  static constexpr int tiers = 2;
  template <class Store, class Recipe>
  class state;
};

template <class Store, class Recipe>
class schedule::speculative::state {
  static_assert(requires(typename Recipe::trigger& t, const float* q) {
                  { t.observe(std::int64_t{0}, q, 1, 1).correct } -> std::convertible_to<bool>;
                  t.forget(std::int64_t{0});
                },
                "kvsift::schedule::speculative: its trigger decides per KV head from the step's "
                "query: compose it with a data trigger that has observe(key, q, group, d) and "
                "forget(key) (trigger::query_cosine)");
  using T = typename Store::element_type;
  using xfer_type = typename Store::transfer_type;  // the store's Transfer slot
  using pages_t = std::vector<std::vector<std::int32_t>>;  // [kv_heads] ascending pages
  struct decision {
    int tokens = 0;  // the layout the selection was made for
    pages_t pages;
  };

 public:
  template <class R>
  static constexpr capabilities caps{
      .changes_physical_length = true,   // the working set holds the selected pages only
      .safe_with_shared_prefix = false,  // demotes and recalls rows of each head-sequence
      .needs_queries = true,             // decode needs q_t; prefill needs none
      .cuda_graph_safe = false,
      .speculative_decoding = false,
  };
  static constexpr bool after_attention_reads_queries = true;

  template <class M>
  explicit state(const M& m)
      : xfer_(std::make_unique<xfer_type>()),
        pending_(static_cast<std::size_t>(m.store().requests()) * m.store().shape().layers,
                 static_cast<std::size_t>(m.store().requests()) * m.store().shape().sequences_per_request(),
                 detail::far_policy_of(m.parameters())),
        steps_(pending_.keys(), 0) {
    const int p = page_size(m);
    require(m.store().page_size() == p, Recipe::name, "page_size", p,
            "the store's page size (" + std::to_string(m.store().page_size()) +
                "): FreeKV recalls whole host pages");
  }
  state(state&&) noexcept = default;

  [[nodiscard]] xfer_type& transfer() { return *xfer_; }
  [[nodiscard]] int steps(std::size_t slot) const { return steps_[slot]; }
  // Per segment of the last plan: 1 when that KV head was corrected (selected with q_t from step
  // 2 on), 0 otherwise (step 1, speculative reuse, dense layers).
  [[nodiscard]] const std::vector<std::uint8_t>& corrections() const { return corrected_; }
  [[nodiscard]] std::int64_t corrections_made() const { return corrections_made_; }

  template <class M>
  void check_chunk(const M& m, std::string_view where, int layer, const prefill_chunk<T>& c,
                   prefill_totals& tot) const {
    const auto& st = m.store();
    const auto k = m.slot(c.request, layer);
    require(c.queries.tokens <= c.keys.tokens, where, "queries.tokens", c.queries.tokens,
            "<= keys.tokens (the chunk's newest queries)");
    require(!(pending_.has(k) && pending_.rows(k) > 0), where, "request", c.request,
            "a request not decoding (reset it first)");
    const int left = st.host_capacity() - st.host_length(c.request, layer) - tot.added[c.request];
    require(c.keys.tokens <= left, where, "keys.tokens", c.keys.tokens,
            "<= the room left in the host pool (" + std::to_string(left) + " tokens)");
  }
  template <class M>
  void check_prefill(const M&, std::string_view, int, std::span<const prefill_chunk<T>>,
                     const prefill_totals&) const {}

  template <class M>
  void prefill(M& m, int layer, std::span<const prefill_chunk<T>> chunks) {
    auto& st = m.store();
    const auto& sh = st.shape();
    const int ps = page_size(m);
    for (const auto& c : chunks) {
      st.append(c.request, layer, c.keys, c.values, c.first_position);
      if (!c.last || layer < m.parameters().dense_layers) continue;
      const int n1 = st.host_length(c.request, layer) + 1;  // step 1's layout
      const auto lay = m.parts().scorer.layout(n1);
      const auto& budgets = layer_budgets(m, layer, n1);
      if (lay.pages <= *std::min_element(budgets.begin(), budgets.end()) / ps) continue;
      // With the prompt's last query, the budget's pages are placed as that query would select
      // them (step 1 still selects with q_1 and recalls what differs); without, sink + window.
      pages_t placed;
      if (c.queries.tokens > 0) {
        std::vector<float> q(static_cast<std::size_t>(sh.q_heads) * sh.head_dim);
        for (int hq = 0; hq < sh.q_heads; ++hq) {
          std::copy_n(c.queries.row(c.queries.tokens - 1, hq), sh.head_dim,
                      q.data() + static_cast<std::size_t>(hq) * sh.head_dim);
        }
        placed = select_pages(m, c.request, layer, q.data(), n1);
      }
      index_sets keep;
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(c.request, layer, h);
        std::vector<std::int32_t> slots;
        for (int s = 0; s < st.length(seq); ++s) {
          const int pg = st.host_index(c.request, layer, st.position(seq, s)) / ps;
          const bool kept = placed.empty()
                                ? pg < lay.candidates_first || pg >= lay.candidates_last
                                : std::binary_search(placed[h].begin(), placed[h].end(), pg);
          if (kept) slots.push_back(s);
        }
        keep.push_back(slots);
      }
      st.retain(c.request, layer, keep);
    }
  }

  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    const auto& st = m.store();
    for (const auto& t : tokens) {
      require(st.host_length(t.request, layer) < st.host_capacity(), where, "request", t.request,
              "a head-sequence with room for one more token in the host pool");
    }
  }
  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens, attention_plan& plan) {
    plan.slots.clear();
    plan.pages.clear();
    corrected_.clear();
    for (const auto& t : tokens) {
      detail::two_tier<Store>::append_tokens(m, layer, std::span<const decode_token<T>>(&t, 1));
      ++steps_[m.slot(t.request, layer)];
      if (layer < m.parameters().dense_layers) {
        dense_plan(m, t.request, layer, plan);
      } else {
        settle(m, t, layer, plan);
      }
    }
    fill_positions(m, layer, plan);
    pending_.fill_far(m.store(), layer, plan, far_rows_);
    m.store().debug_verify();
  }

  template <class M>
  void after_attention(M& m, int layer, std::span<const decode_token<T>> tokens) {
    if (layer < m.parameters().dense_layers) return;
    auto& st = m.store();
    const auto& sh = st.shape();
    const domain::pool_pages<T> pool{&st};
    pending_.sweep(*xfer_);
    for (const auto& t : tokens) {
      const auto k = m.slot(t.request, layer);
      pending_.discard(*xfer_, k);
      const int next = pool.tokens_ahead(t.request, layer);
      decision d{next, select_pages(m, t.request, layer, t.query, next)};
      std::vector<typename detail::pending_recalls<Store, decision>::target> targets;
      const auto boundary = st.next_position(t.request, layer);  // step t+1's token, resident
      for (int h = 0; h < sh.kv_heads; ++h) {
        targets.push_back({sh.sequence(t.request, layer, h),
                           pool.page_positions(t.request, layer, page_size(m), d.pages[h]), boundary});
      }
      pending_.submit(*xfer_, st, k, std::move(targets), std::move(d), [](decision&&) {});
    }
  }

  template <class M>
  void reset(M& m, int request) {
    const auto& sh = m.store().shape();
    for (int l = 0; l < sh.layers; ++l) {
      pending_.cancel(*xfer_, m.slot(request, l));
      steps_[m.slot(request, l)] = 0;
      for (int h = 0; h < sh.kv_heads; ++h) {
        m.parts().trigger.forget(sh.sequence(request, l, h));
        m.parts().scorer.forget(sh.sequence(request, l, h));
        pending_.clear_far(sh.sequence(request, l, h));
      }
    }
    pending_.cancel_discarded(*xfer_);  // recalls of any request: none may read a pool being reset
    m.store().reset(request);
  }

  // Bytes recalled (the rows that installs of background recalls and the synchronous recalls of
  // step 1 and corrections copied into the working set: the store's bytes_to_device, as on every
  // exec; a discarded speculation or one still pending is not counted), selections made, stalls
  // (a synchronous recall that moved bytes, or a wait for a background recall not done in time).
  template <class M>
  void stats(const M& m, method_stats& s) const {
    const auto ts = xfer_->stats();
    s.bytes_transferred = m.store().stats().bytes_to_device;
    s.refreshes = refreshes_;
    s.stalls = ts.stalls + sync_stalls_;
    s.far_rows = far_rows_;
    for (int l = 0; l < m.store().shape().layers; ++l) {
      // the recipe's budget of layer l's head 0 at a full pool (budget::uniform: B at any length)
      std::vector<int> lengths, budgets;
      const bool dense = l < m.parameters().dense_layers;
      if (!dense) budgets_of(m, l, m.store().host_capacity(), lengths, budgets);
      s.layer_budgets.push_back(dense ? -1 : budgets.front());
    }
  }
  template <class M>
  void release(M&) {
    if (!xfer_) return;  // moved from
    for (std::size_t k = 0; k < pending_.keys(); ++k) pending_.cancel(*xfer_, k);
    pending_.cancel_discarded(*xfer_);
  }

 private:
  template <class M>
  static int page_size(const M& m) { return m.parameters().page_size; }

  // The recipe's Budgeter: the token budget of each KV head of `layer` when each holds `tokens`
  // (FreeKV: budget::uniform, B for every head), into `out` (`lengths`: its context).
  template <class M>
  static const std::vector<int>& budgets_of(const M& m, int layer, int tokens,
                                            std::vector<int>& lengths, std::vector<int>& out) {
    const auto& sh = m.store().shape();
    lengths.assign(static_cast<std::size_t>(sh.kv_heads), tokens);
    m.parts().budgeter.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths}, out);
    return out;
  }
  template <class M>
  const std::vector<int>& layer_budgets(const M& m, int layer, int tokens) {
    return budgets_of(m, layer, tokens, lengths_, budgets_);
  }

  // Page sets [kv_heads] of (request, layer) selected with query q ([q_heads, d]) over the host
  // pool's pages on the layout of `tokens` tokens (the pool's length, or one more).
  template <class M>
  pages_t select_pages(M& m, int request, int layer, const float* q, int tokens) {
    const auto& st = m.store();
    const auto& sh = st.shape();
    const domain::pool_pages<T> pool{&st};
    const auto qv = kv_view<const float, nhd>::contiguous(q, 1, sh.q_heads, sh.head_dim);
    const std::int32_t qpos = st.next_position(request, layer) - 1;
    const std::vector<int> layout(static_cast<std::size_t>(sh.kv_heads), tokens);
    score_input<domain::pool_pages<T>> in{&pool, layer, lifecycle_event::decode_step,
                                          {&request, 1}, {&qv, 1}, {&qpos, 1}, {}};
    m.parts().scorer.score(in, scores_, layout);
    m.parts().selector.select(scores_, layer_budgets(m, layer, tokens), kept_);
    pages_t out(static_cast<std::size_t>(sh.kv_heads));
    for (int h = 0; h < sh.kv_heads; ++h) out[h].assign(kept_[h].begin(), kept_[h].end());
    refreshes_ += sh.kv_heads;
    return out;
  }

  // A dense layer's plan segment: every resident token (everything), every page.
  template <class M>
  void dense_plan(const M& m, int request, int layer, attention_plan& plan) {
    const auto& sh = m.store().shape();
    const int ps = page_size(m);
    for (int h = 0; h < sh.kv_heads; ++h) {
      const int n = m.store().length(sh.sequence(request, layer, h));
      std::vector<std::int32_t> slots(static_cast<std::size_t>(n));
      std::iota(slots.begin(), slots.end(), 0);
      plan.slots.push_back(slots);
      std::vector<std::int32_t> pages(static_cast<std::size_t>((n + ps - 1) / ps));
      std::iota(pages.begin(), pages.end(), 0);
      plan.pages.push_back(pages);
      corrected_.push_back(0);
    }
  }

  // Settles step t's selection of every KV head of one request of a sparse layer and makes the
  // working set exactly the selected pages' tokens.
  template <class M>
  void settle(M& m, const decode_token<T>& t, int layer, attention_plan& plan) {
    auto& st = m.store();
    const auto& sh = st.shape();
    const int G = sh.group_size();
    const int d = sh.head_dim;
    const int n = st.host_length(t.request, layer);
    const auto k = m.slot(t.request, layer);
    const decision* spec = pending_.decision(k);
    const bool speculative_ready = spec != nullptr && spec->tokens == n;
    std::vector<char> now(static_cast<std::size_t>(sh.kv_heads), 0);
    std::vector<std::uint8_t> flag(static_cast<std::size_t>(sh.kv_heads), 0);
    bool any_now = false, any_spec = false;
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto dec = m.parts().trigger.observe(sh.sequence(t.request, layer, h),
                                                 t.query + static_cast<std::size_t>(h) * G * d, G, d);
      now[h] = !speculative_ready || dec.first || dec.correct;
      flag[h] = speculative_ready && !dec.first && dec.correct;
      corrections_made_ += flag[h];
      any_now = any_now || now[h];
      any_spec = any_spec || !now[h];
    }
    pages_t pages(static_cast<std::size_t>(sh.kv_heads));
    // speculative heads: the selection made after step t-1, its background recall installed. A
    // recall that failed (transfer::fault, an allocation failure) is not installed: every head
    // falls back to the synchronous path below, so the step never throws after its token was
    // appended and never reads a partial row (tests/test_transfer_faults.cpp).
    if (any_spec) {
      try {
        pending_.complete_part(*xfer_, st, k, [&](std::size_t h) { return !now[h]; },
                               [&](decision&& dc) {
                                 for (int h = 0; h < sh.kv_heads; ++h) {
                                   if (!now[h]) pages[h] = std::move(dc.pages[h]);
                                 }
                               });
      } catch (const error&) {
        std::fill(now.begin(), now.end(), 1);
        any_now = true;
      }
    }
    pending_.discard(*xfer_, k);  // a selection no head takes: its recall is not waited for
    // step 1 and corrected heads: select with q_t, recall what is missing and wait for it
    if (any_now) {
      const domain::pool_pages<T> pool{&st};
      auto fresh = select_pages(m, t.request, layer, t.query, n);
      for (int h = 0; h < sh.kv_heads; ++h) {
        if (!now[h]) continue;
        pages[h] = std::move(fresh[h]);
        // a synchronous recall on this thread (no hand-off to the worker): the step waits for it
        // (under far_tier::attend the missing rows stay where they are: nothing to wait for)
        const auto before = st.stats().bytes_to_device;
        pending_.place(st, sh.sequence(t.request, layer, h),
                       pool.page_positions(t.request, layer, page_size(m), pages[h]));
        sync_stalls_ += st.stats().bytes_to_device > before ? 1 : 0;
      }
    }
    for (int h = 0; h < sh.kv_heads; ++h) {
      const int len = st.length(sh.sequence(t.request, layer, h));
      std::vector<std::int32_t> slots(static_cast<std::size_t>(len));
      std::iota(slots.begin(), slots.end(), 0);
      plan.slots.push_back(slots);
      plan.pages.push_back(pages[h]);
      corrected_.push_back(flag[h]);
    }
  }

  template <class M>
  static void fill_positions(const M& m, int layer, attention_plan& plan) {
    const auto& sh = m.store().shape();
    plan.positions.offsets = plan.slots.offsets;
    plan.positions.values.resize(plan.slots.values.size());
    for (int s = 0; s < plan.slots.segments(); ++s) {
      const auto seq = sh.sequence(plan.requests[s / sh.kv_heads], layer, s % sh.kv_heads);
      const auto in = plan.slots[s];
      auto out = plan.positions[s];
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = m.store().position(seq, in[i]);
    }
  }

  std::unique_ptr<xfer_type> xfer_;  // a worker thread: held by pointer (the method moves)
  detail::pending_recalls<Store, decision> pending_;  // per (request, layer): the selection for t+1
  std::vector<int> steps_;                        // [requests * layers]
  std::int64_t refreshes_ = 0;
  std::int64_t corrections_made_ = 0;
  std::int64_t sync_stalls_ = 0;  // synchronous recalls that moved bytes
  std::int64_t far_rows_ = 0;     // host-pool rows the plans attended where they lie (attend)
  score_sets scores_;
  index_sets kept_;
  std::vector<int> lengths_, budgets_;  // the budgeter's context and answer (scratch)
  std::vector<std::uint8_t> corrected_;  // [plan segments]
};

}  // namespace kvsift
