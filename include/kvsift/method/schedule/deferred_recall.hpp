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
//
// One body for every memory: schedule::deferred_recall::state (the control flow above) calls its
// content, detail::deferred_recall_content<Store, Recipe>: over host memory the roles part, the
// recall queue and the transfer (below); over a thrust::tiered_store on a device exec the roles'
// device halves (device/deferred_recall.hpp), which record each recall in device memory and
// install it at the request's next decode.

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

namespace detail {

// schedule::deferred_recall's content over host memory (store::tiered): the roles part
// (roles/), the recalls (detail::pending_recalls through the store's transfer) and the host
// two-tier hooks. The one body (schedule::deferred_recall::state, below) calls
//   check_chunk / check_decode   the shell's checks of a chunk and of a step
//   begin(m, layer, chunks)      the prompts that end: the scorer scores their last query, the
//                                roles place each head, the store retains the result
//   complete(m, layer, token)    the pending recall completes (its decision committed after
//                                the install), every token's before anything else of the step
//   begin_step(m, layer, token)  before the token is appended: the query window
//   append_and_plan              the tokens appended, the plan of every resident token
//   refreshing / end_round       whether a head of the layer can refresh; a step's round ends
//   fire(m, layer, firing)       the requests whose trigger fired: scored together, refreshed
//                                by the roles, ONE recall submitted per request and layer
//   drop(m, request)             a reset's recalls cancelled and far rows forgotten
// Over a thrust::tiered_store the same calls reach the roles' device halves
// (device/deferred_recall.hpp).
template <class Store, class Recipe>
class deferred_recall_content {
  using T = typename Store::element_type;
  using xfer_type = typename Store::transfer_type;  // the store's Transfer slot
  using roles_type = typename Recipe::roles;
  using role_state = typename roles_type::slot_state;
  using decision = typename roles_type::decision;
  using pending_type = pending_recalls<Store, decision>;
  using hooks = two_tier<Store>;

 public:
  struct slot_state {
    std::int32_t prompt_end = -1;  // positions below it are the prompt; -1 before its end
    int steps = 0;                 // decode steps since the prompt ended
    role_state roles{};
  };

  [[nodiscard]] xfer_type& transfer() { return *xfer_; }
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
  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    hooks::check_step(m, where, layer, tokens,
                      [&](int r) { return slots_[m.slot(r, layer)].prompt_end >= 0; });
  }
  // Bytes recalled (the rows that installs copied into the working set: the store's
  // bytes_to_device, as on every exec; a recall still pending or cancelled is not counted),
  // refreshes, stalls (decode steps that waited for a recall), per-layer budgets (-1 before any
  // prefill).
  template <class M>
  void stats(const M& m, method_stats& s) const {
    s.bytes_transferred = m.store().stats().bytes_to_device;
    s.refreshes = refreshes_;
    s.stalls = xfer_->stats().stalls;
    s.far_rows = far_rows_;
    s.layer_budgets = layer_budgets_;
  }
  template <class M>
  void release(M&) {
    if (!xfer_) return;  // moved from
    for (std::size_t i = 0; i < slots_.size(); ++i) pending_.cancel(*xfer_, i);
  }

 protected:
  // Roles that score q_t read it in after_attention; the others read their query window.
  static constexpr bool reads_step_query = roles_type::scores_step;

  template <class M>
  explicit deferred_recall_content(const M& m)
      : slots_(static_cast<std::size_t>(m.store().requests()) * m.store().shape().layers),
        xfer_(std::make_unique<xfer_type>()),
        pending_(slots_.size(),
                 static_cast<std::size_t>(m.store().requests()) * m.store().shape().sequences_per_request(),
                 far_policy_of(m.parameters())),
        layer_budgets_(static_cast<std::size_t>(m.store().shape().layers), -1) {}
  deferred_recall_content(deferred_recall_content&&) noexcept = default;

  template <class M>
  void begin(M& m, int layer, std::span<const prefill_chunk<T>> chunks) {
    auto& st = m.store();
    auto& rp = m.parts().roles;
    ended_.clear();
    queries_.clear();
    qpos_.clear();
    states_.clear();
    for (const auto& c : chunks) {
      if (!c.last) continue;
      ended_.push_back(c.request);
      queries_.push_back(c.queries.slice(c.queries.tokens - 1, 1));
      qpos_.push_back(c.first_position + c.keys.tokens - 1);
      auto& s = slots_[m.slot(c.request, layer)];
      rp.start(s.roles, layer);
      states_.push_back(&s.roles);
    }
    if (ended_.empty() || !rp.places()) return;
    score_input<Store> in{&st, layer, lifecycle_event::prefill_end, ended_, queries_, qpos_, {}};
    m.parts().scorer.score(in, scores_);
    rp.place(std::as_const(st), m.parts().selector, m.parts().budgeter, layer, ended_, scores_,
             states_, layer_budgets_, kept_);
    for (std::size_t i = 0; i < ended_.size(); ++i) st.retain(ended_[i], layer, kept_[i]);
  }
  template <class M>
  void complete(M& m, int layer, const decode_token<T>& t) {
    const auto k = m.slot(t.request, layer);
    auto& s = slots_[k];
    pending_.complete(*xfer_, m.store(), k,
                      [&](decision d) { roles_type::commit(s.roles, std::move(d)); });
  }
  template <class M>
  void begin_step(M& m, int layer, const decode_token<T>& t) {
    m.history().remember_row(m.slot(t.request, layer),
                             m.parts().roles.query_window(m.parts().trigger), t.query,
                             m.store().next_position(t.request, layer));
  }
  template <class M>
  void append_and_plan(M& m, int layer, std::span<const decode_token<T>> tokens,
                       attention_plan& plan) {
    hooks::append_tokens(m, layer, tokens);
    plan_whole_working_set(m.store(), layer, plan);
    pending_.fill_far(m.store(), layer, plan, far_rows_);
    m.store().debug_verify();
  }
  template <class M>
  [[nodiscard]] bool refreshing(const M& m, int layer) const {
    return m.parts().roles.refreshes(layer);
  }
  template <class M>
  static void end_round(const M& m, slot_state& s) {
    m.parts().roles.begin_step(s.roles);
  }
  template <class M>
  void fire(M& m, int layer, std::span<const decode_token<T>> firing) {
    auto& st = m.store();
    const auto& sh = st.shape();
    requests_.clear();
    queries_.clear();
    qpos_.clear();
    prompt_end_.clear();
    windows_.clear();
    states_.clear();
    for (const auto& t : firing) {
      const auto k = m.slot(t.request, layer);
      requests_.push_back(t.request);
      if constexpr (roles_type::scores_step) {
        queries_.push_back(kv_view<const float, nhd>::contiguous(t.query, 1, sh.q_heads, sh.head_dim));
      }
      qpos_.push_back(st.next_position(t.request, layer) - 1);
      prompt_end_.push_back(slots_[k].prompt_end);
      windows_.push_back(m.history().view(k));
      states_.push_back(&slots_[k].roles);
    }
    const score_sets* scores = nullptr;
    if constexpr (roles_type::scores_step) {
      score_input<Store> in{&st, layer, lifecycle_event::decode_step, requests_, queries_, qpos_,
                            {}};
      m.parts().scorer.score(in, scores_);
      scores = &scores_;
    }
    const roles::refresh_input in{layer, requests_, prompt_end_, windows_, scores};
    m.parts().roles.refresh(std::as_const(st), m.parts().trigger, in,
                            std::span<role_state* const>(states_),
                            [&](std::size_t i, roles::proposal<decision>&& p) {
      refreshes_ += p.refreshes;
      checks_ += p.checks;
      if (p.parts.empty()) return;
      const auto k = m.slot(requests_[i], layer);
      std::vector<typename pending_type::target> targets;
      for (auto& [seq, part] : p.parts) targets.push_back({seq, std::move(part), prompt_end_[i]});
      auto& s = slots_[k];
      pending_.submit(*xfer_, st, k, std::move(targets), std::move(p.decision),
                      [&](decision d) { roles_type::commit(s.roles, std::move(d)); });
      rows_recalled_ += pending_.rows(k);
      refreshes_ += roles_type::submitted(s.roles);
    });
  }
  template <class M>
  void drop(M& m, int request) {
    const auto& sh = m.store().shape();
    for (int l = 0; l < sh.layers; ++l) {
      pending_.cancel(*xfer_, m.slot(request, l));
      for (int h = 0; h < sh.kv_heads; ++h) pending_.clear_far(sh.sequence(request, l, h));
    }
  }

  std::vector<slot_state> slots_;  // [requests * layers]

 private:
  std::unique_ptr<xfer_type> xfer_;  // owned: the method stays movable
  pending_type pending_;
  std::vector<int> layer_budgets_;
  std::int64_t refreshes_ = 0, checks_ = 0, rows_recalled_ = 0, far_rows_ = 0;
  // scratch
  std::vector<int> ended_, requests_;
  std::vector<kv_view<const float, nhd>> queries_, windows_;
  std::vector<std::int32_t> qpos_, prompt_end_;
  std::vector<role_state*> states_;
  std::vector<index_sets> kept_;
  score_sets scores_;
};

}  // namespace detail

// The one body of the schedule, for every memory: the control flow below calls its content
// (detail::deferred_recall_content: host memory above, a thrust::tiered_store in
// device/deferred_recall.hpp).
template <class Store, class Recipe>
class schedule::deferred_recall::state : public detail::deferred_recall_content<Store, Recipe> {
  static_assert(Recipe::scorer::needs_queries,
                "kvsift::schedule::deferred_recall: head roles place and follow a leader's scores "
                "of the prompt's last query and of decode queries: compose it with a scorer that "
                "reads queries");
  using T = typename Store::element_type;
  using content = detail::deferred_recall_content<Store, Recipe>;
  using content::slots_;

 public:
  using typename content::slot_state;

  template <class R>
  static constexpr capabilities caps{
      .changes_physical_length = true,   // compressed heads' demoted rows leave the working set
      .safe_with_shared_prefix = false,  // retain/install rewrite a request's working set
      .needs_queries = true,             // the last prefill query and every decode query
      .cuda_graph_safe = false,  // device: laws hold on exec::sim; exec::cuda captures no step
      .speculative_decoding = false,
  };
  static constexpr bool after_attention_reads_queries = content::reads_step_query;

  template <class M>
  explicit state(const M& m) : content(m) {}
  state(state&&) noexcept = default;

  [[nodiscard]] int steps(std::size_t slot) const { return slots_[slot].steps; }
  [[nodiscard]] const slot_state& at(std::size_t slot) const { return slots_[slot]; }

  // The roles' budgets of the prompts that end (before anything is appended).
  template <class M>
  void check_prefill(const M& m, std::string_view where, int layer,
                     std::span<const typename M::chunk_type> chunks,
                     const prefill_totals& tot) const {
    for (const auto& c : chunks) {
      const int n = m.store().host_length(c.request, layer) + tot.added[c.request];
      if (c.last) m.parts().roles.check_prompt(where, n, m.parts().budgeter);
    }
  }
  template <class M>
  void prefill(M& m, int layer, std::span<const typename M::chunk_type> chunks) {
    auto& st = m.store();
    for (const auto& c : chunks) st.append(c.request, layer, c.keys, c.values, c.first_position);
    for (const auto& c : chunks) {
      if (!c.last) continue;
      const auto k = m.slot(c.request, layer);
      slots_[k] = {};
      slots_[k].prompt_end = st.next_position(c.request, layer);
      m.history().clear(k);
    }
    this->begin(m, layer, chunks);
  }

  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens,
              typename M::plan_type& plan) {
    // every pending recall first: one that fails (a copy fault) throws before any request's
    // step is counted or its query kept, so the same decode can be retried
    for (const auto& t : tokens) this->complete(m, layer, t);
    for (const auto& t : tokens) {
      this->begin_step(m, layer, t);
      ++slots_[m.slot(t.request, layer)].steps;
    }
    this->append_and_plan(m, layer, tokens, plan);
  }

  template <class M>
  void after_attention(M& m, int layer, std::span<const decode_token<T>> tokens) {
    const bool any = this->refreshing(m, layer);
    firing_.clear();
    for (const auto& t : tokens) {
      auto& s = slots_[m.slot(t.request, layer)];
      this->end_round(m, s);
      const trigger_context ctx{lifecycle_event::decode_step, s.steps, 0, 0, 0};
      if (any && m.parts().trigger.fires(ctx)) firing_.push_back(t);
    }
    if (!firing_.empty()) this->fire(m, layer, std::span<const decode_token<T>>(firing_));
  }

  // Cancels the request's recalls, drops its state and its tokens from both tiers.
  template <class M>
  void reset(M& m, int request) {
    this->drop(m, request);
    for (int l = 0; l < m.store().shape().layers; ++l) slots_[m.slot(request, l)] = {};
    m.store().reset(request);
  }

 private:
  std::vector<decode_token<T>> firing_;  // scratch: the tokens whose trigger fired
};

}  // namespace kvsift
