// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::deferred_recall — two tiers (store::tiered + its transfer_type): decide after step
// t's attention, recall in the background, install at step t+1 (SyncKV, HeteroCache; METHODS.md
// "SyncKV", "HeteroCache"). Besides the scorer and the trigger, the recipe names a roles part
// (roles/: clusters, stars) that says per KV head whether it keeps its whole KV, its own set, or
// follows a leader's.
//
//   prefill   appends every chunk to both tiers (write-through). At the prompt's end the scorer
//             scores its last query; the roles place each head and the store retains the
//             result (what leaves the working set stays in the host pool).
//   decode t  completes the pending recall of each request (waits for it when not copied yet: a
//             stall; its decision is committed only after the install succeeded), appends the
//             token (and keeps the roles' query window), and the plan reads every resident token.
//   after t   the trigger decides per request whether to refresh (trigger::stride every m steps;
//             trigger::drift_median every W steps, the drift probe then per head, from data);
//             the scorer scores q_t when the roles read its scores; the roles turn them into new
//             prefill parts for the follower heads and a decision, submitted as ONE recall per
//             request and layer (detail::pending_recalls). Decode tokens are never candidates.
// State: per (request, layer) the prompt end, the steps and the roles' state; the pending
// recalls; the transfer (owned: the method stays movable); refreshes, checks, recalled rows.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/recipe.hpp>
#include <kvsift/method/schedule/two_tier.hpp>
#include <kvsift/roles/context.hpp>
#include <kvsift/score/context.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsift {

struct schedule::deferred_recall {
  static constexpr int tiers = 2;
  template <class Store, class Recipe>
  class state;
};

template <class Store, class Recipe>
class schedule::deferred_recall::state {
  static_assert(Recipe::scorer::needs_queries,
                "kvsift::schedule::deferred_recall: head roles place and follow a leader's scores "
                "of the prompt's last query and of decode queries: compose it with a scorer that "
                "reads queries");
  using T = typename Store::element_type;
  using xfer_type = typename Store::transfer_type;  // the store's Transfer slot
  using roles_type = typename Recipe::roles;
  using role_state = typename roles_type::slot_state;
  using decision = typename roles_type::decision;
  using pending_type = detail::pending_recalls<Store, decision>;
  using hooks = detail::two_tier<Store>;

 public:
  struct slot_state {
    std::int32_t prompt_end = -1;  // positions below it are the prompt; -1 before its end
    int steps = 0;                 // decode steps since the prompt ended
    role_state roles{};
  };

  template <class R>
  static constexpr capabilities caps{
      .changes_physical_length = true,   // compressed heads' demoted rows leave the working set
      .safe_with_shared_prefix = false,  // retain/install rewrite a request's working set
      .needs_queries = true,             // the last prefill query and every decode query
      .cuda_graph_safe = false,
      .speculative_decoding = false,
  };
  // Roles that score q_t read it in after_attention; the others read their query window.
  static constexpr bool after_attention_reads_queries = roles_type::scores_step;

  template <class M>
  explicit state(const M& m)
      : xfer_(std::make_unique<xfer_type>()),
        slots_(static_cast<std::size_t>(m.store().requests()) * m.store().shape().layers),
        pending_(slots_.size(),
                 static_cast<std::size_t>(m.store().requests()) * m.store().shape().sequences_per_request(),
                 detail::far_policy_of(m.parameters())),
        layer_budgets_(static_cast<std::size_t>(m.store().shape().layers), -1) {}
  state(state&&) noexcept = default;

  [[nodiscard]] xfer_type& transfer() { return *xfer_; }
  [[nodiscard]] int steps(std::size_t slot) const { return slots_[slot].steps; }
  [[nodiscard]] const slot_state& at(std::size_t slot) const { return slots_[slot]; }
  [[nodiscard]] bool recall_pending(std::size_t slot) const { return pending_.has(slot); }
  [[nodiscard]] bool recall_in_flight(std::size_t slot) const { return pending_.in_flight(*xfer_, slot); }
  [[nodiscard]] std::int64_t refreshes() const { return refreshes_; }
  [[nodiscard]] std::int64_t checks() const { return checks_; }
  [[nodiscard]] std::int64_t rows_recalled() const { return rows_recalled_; }

  template <class M>
  void check_chunk(const M& m, std::string_view where, int layer, const prefill_chunk<T>& c,
                   prefill_totals& tot) const {
    hooks::check_chunk(m, where, Recipe::paper, layer, c, tot,
                       slots_[m.slot(c.request, layer)].prompt_end < 0, true);
  }
  // The roles' budgets of the prompts that end (before anything is appended).
  template <class M>
  void check_prefill(const M& m, std::string_view where, int layer,
                     std::span<const prefill_chunk<T>> chunks, const prefill_totals& tot) const {
    for (const auto& c : chunks) {
      const int n = m.store().host_length(c.request, layer) + tot.added[c.request];
      if (c.last) m.parts().roles.check_prompt(where, n, m.parts().budgeter);
    }
  }
  template <class M>
  void prefill(M& m, int layer, std::span<const prefill_chunk<T>> chunks) {
    auto& st = m.store();
    ended_.clear();
    queries_.clear();
    qpos_.clear();
    for (const auto& c : chunks) {
      st.append(c.request, layer, c.keys, c.values, c.first_position);
      if (!c.last) continue;
      ended_.push_back(c.request);
      queries_.push_back(c.queries.slice(c.queries.tokens - 1, 1));
      qpos_.push_back(c.first_position + c.keys.tokens - 1);
    }
    if (ended_.empty()) return;
    auto& rp = m.parts().roles;
    states_.clear();
    for (const int r : ended_) {
      auto& s = slots_[m.slot(r, layer)];
      s = {};
      s.prompt_end = st.next_position(r, layer);
      rp.start(s.roles, layer);
      m.history().clear(m.slot(r, layer));
      states_.push_back(&s.roles);
    }
    if (!rp.places()) return;
    score_input<Store> in{&st, layer, lifecycle_event::prefill_end, ended_, queries_, qpos_, {}};
    m.parts().scorer.score(in, scores_);
    rp.place(std::as_const(st), m.parts().selector, m.parts().budgeter, layer, ended_, scores_,
             states_, layer_budgets_, kept_);
    for (std::size_t i = 0; i < ended_.size(); ++i) st.retain(ended_[i], layer, kept_[i]);
  }

  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    hooks::check_step(m, where, layer, tokens,
                      [&](int r) { return slots_[m.slot(r, layer)].prompt_end >= 0; });
  }
  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens, attention_plan& plan) {
    auto& st = m.store();
    for (const auto& t : tokens) {
      const auto k = m.slot(t.request, layer);
      auto& s = slots_[k];
      pending_.complete(*xfer_, st, k, [&](decision d) { roles_type::commit(s.roles, std::move(d)); });
    }
    const int window = m.parts().roles.query_window(m.parts().trigger);
    for (const auto& t : tokens) {
      const auto k = m.slot(t.request, layer);
      m.history().remember_row(k, window, t.query, st.next_position(t.request, layer));
      ++slots_[k].steps;
    }
    hooks::append_tokens(m, layer, tokens);
    detail::plan_whole_working_set(st, layer, plan);
    pending_.fill_far(st, layer, plan, far_rows_);
    st.debug_verify();
  }

  template <class M>
  void after_attention(M& m, int layer, std::span<const decode_token<T>> tokens) {
    auto& st = m.store();
    const auto& sh = st.shape();
    auto& rp = m.parts().roles;
    const auto& trig = m.parts().trigger;
    const bool any = rp.refreshes(layer);
    firing_.clear();
    queries_.clear();
    qpos_.clear();
    prompt_end_.clear();
    windows_.clear();
    states_.clear();
    for (const auto& t : tokens) {
      const auto k = m.slot(t.request, layer);
      auto& s = slots_[k];
      rp.begin_step(s.roles);
      const trigger_context ctx{lifecycle_event::decode_step, s.steps, 0, 0, 0};
      if (!any || !trig.fires(ctx)) continue;
      firing_.push_back(t.request);
      if constexpr (roles_type::scores_step) {
        queries_.push_back(kv_view<const float, nhd>::contiguous(t.query, 1, sh.q_heads, sh.head_dim));
      }
      qpos_.push_back(st.next_position(t.request, layer) - 1);
      prompt_end_.push_back(s.prompt_end);
      windows_.push_back(m.history().view(k));
      states_.push_back(&s.roles);
    }
    if (firing_.empty()) return;
    const score_sets* scores = nullptr;
    if constexpr (roles_type::scores_step) {
      score_input<Store> in{&st, layer, lifecycle_event::decode_step, firing_, queries_, qpos_, {}};
      m.parts().scorer.score(in, scores_);
      scores = &scores_;
    }
    const roles::refresh_input in{layer, firing_, prompt_end_, windows_, scores};
    rp.refresh(std::as_const(st), trig, in, std::span<role_state* const>(states_),
                  [&](std::size_t i, roles::proposal<decision>&& p) {
      refreshes_ += p.refreshes;
      checks_ += p.checks;
      if (p.parts.empty()) return;
      const auto k = m.slot(firing_[i], layer);
      std::vector<typename pending_type::target> targets;
      for (auto& [seq, part] : p.parts) targets.push_back({seq, std::move(part), prompt_end_[i]});
      auto& s = slots_[k];
      pending_.submit(*xfer_, st, k, std::move(targets), std::move(p.decision),
                      [&](decision d) { roles_type::commit(s.roles, std::move(d)); });
      rows_recalled_ += pending_.rows(k);
      refreshes_ += roles_type::submitted(s.roles);
    });
  }

  // Cancels the request's recalls, drops its state and its tokens from both tiers.
  template <class M>
  void reset(M& m, int request) {
    const auto& sh = m.store().shape();
    for (int l = 0; l < sh.layers; ++l) {
      pending_.cancel(*xfer_, m.slot(request, l));
      slots_[m.slot(request, l)] = {};
      for (int h = 0; h < sh.kv_heads; ++h) pending_.clear_far(sh.sequence(request, l, h));
    }
    m.store().reset(request);
  }
  // Bytes recalled (the rows that installs copied into the working set: the store's
  // bytes_to_device, as on every exec; a recall still pending or cancelled is not counted),
  // refreshes, stalls (decode steps that waited for a recall), per-layer budgets (-1 before any
  // prefill).
  template <class M>
  void stats(const M& m, method_stats& s) const {
    const auto xs = xfer_->stats();
    s.bytes_transferred = m.store().stats().bytes_to_device;
    s.refreshes = refreshes_;
    s.stalls = xs.stalls;
    s.far_rows = far_rows_;
    s.layer_budgets = layer_budgets_;
  }
  template <class M>
  void release(M&) {
    if (!xfer_) return;  // moved from
    for (std::size_t i = 0; i < slots_.size(); ++i) pending_.cancel(*xfer_, i);
  }

 private:
  std::unique_ptr<xfer_type> xfer_;
  std::vector<slot_state> slots_;  // [requests * layers]
  pending_type pending_;
  std::vector<int> layer_budgets_;
  std::int64_t refreshes_ = 0, checks_ = 0, rows_recalled_ = 0, far_rows_ = 0;
  // scratch
  std::vector<int> ended_, firing_;
  std::vector<kv_view<const float, nhd>> queries_, windows_;
  std::vector<std::int32_t> qpos_, prompt_end_;
  std::vector<role_state*> states_;
  std::vector<index_sets> kept_;
  score_sets scores_;
};

}  // namespace kvsift
