// SPDX-License-Identifier: Apache-2.0
#pragma once

// kvsift::method — the one shell every named method is: a store, a recipe of parts and an
// execution policy.
//
//   method<Store, Recipe, Exec = exec::host>
//
// The shell is written once. It owns what every method shares: validation of every call at the
// API boundary (nothing changes when a call throws), the binding of attend()/after_attention()
// to the last decode(), the query history, reset and stats. The recipe's Schedule owns the
// lifecycle points (method/schedule/: evict, sparse_read, deferred_recall, speculative) and
// the state they keep; the lifecycle every engine integration follows (DESIGN §3):
//
//   1. prefill(layer, chunks)      per layer and per prompt chunk; the chunk marked `last` ends
//                                  the prompt (the schedule's round runs then).
//   2. decode(layer, tokens)       = run_decode(plan_decode(layer, tokens)): plan_decode
//                                  validates the step on the host (shapes, counts, room; nothing
//                                  changes), run_decode touches the store (installs what was
//                                  recalled, appends each request's token) and returns the
//                                  step's attention plan: per KV head, the resident slots and
//                                  their original positions, the new token included.
//   3. the engine attends over the plan (its kernel, or attend()).
//   4. after_attention(layer, tokens)  the step's decisions (an eviction, an anticipation, a
//                                  speculative selection); effects show from the next step.
//   5. stats()                     resident bytes, bytes transferred, refreshes, stalls.
//
// Engine rules kept here (DESIGN §7): original positions travel with every plan; no scorer
// needs attention probabilities from the engine (attention-based scorers recompute them from
// the queries handed to prefill/decode); ragged batches and chunked prefill are the normal case.

#include <kvsift/attention/far_tier.hpp>
#include <kvsift/attention/reference.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/exec.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/query_history.hpp>
#include <kvsift/method/recipe.hpp>
#include <kvsift/method/schedule/evict.hpp>
#include <kvsift/method/schedule/sparse_read.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvsift {

namespace detail {
// The plan a schedule's state fills: attention_plan (host memory), or the state's own plan type
// (a device schedule's plan lives in the exec's memory: thrust::device_plan).
template <class State>
struct plan_type_of {
  using type = attention_plan;
};
template <class State>
  requires requires { typename State::plan_type; }
struct plan_type_of<State> {
  using type = typename State::plan_type;
};
}  // namespace detail

template <class Store_, class Recipe_, Exec Exec_ = exec::host>
  requires KvStore<Store_> || DeviceStore<Store_>
class method : public detail::interface_of<Recipe_, method<Store_, Recipe_, Exec_>>::type {
  using schedule_tag = typename Recipe_::schedule;
  using state_type = typename schedule_tag::template state<Store_, Recipe_>;
  friend state_type;

  static_assert(std::is_same_v<typename Exec_::memory_space, typename Store_::memory_space> ||
                    (Exec_::host_visible && HostAccessible<typename Store_::memory_space>),
                "kvsift::method: the Store's memory must be the Exec's (exec::host runs over "
                "host-accessible stores)");
  static_assert(Exec_::host_visible || requires { typename state_type::plan_type; },
                "kvsift::method on a device exec: this schedule has no device state for this "
                "store (device/evict.hpp and device/sparse_read.hpp give schedule::evict and "
                "schedule::sparse_read their device halves over a thrust::dense_store or "
                "thrust::paged_store; "
                "device/deferred_recall.hpp and device/speculative.hpp run SyncKV's and "
                "HeteroCache's schedule::deferred_recall and FreeKV's schedule::speculative over "
                "a thrust::tiered_store)");
  static_assert(schedule_tag::tiers == 1 || TieredStore<Store_> || DeviceTieredStore<Store_>,
                "kvsift::method: a two-tier schedule (deferred_recall, speculative) needs a "
                "two-tier store (store::tiered, or thrust::tiered_store on a device exec)");

 public:
  using recipe = Recipe_;
  using exec_type = Exec_;
  using store_type = Store_;
  using element_type = typename Store_::element_type;
  // Where the arrays handed to prefill() and decode() live: host memory on exec::host, the
  // exec's memory on a device exec (exec::sim, cuda).
  using view_space =
      std::conditional_t<Exec_::host_visible, host_space, typename Exec_::memory_space>;
  using chunk_type = prefill_chunk<element_type, view_space>;
  using plan_type = typename detail::plan_type_of<state_type>::type;
  using scorer = typename Recipe_::scorer;
  using selector = typename Recipe_::selector;
  using budgeter = typename Recipe_::budgeter;
  using trigger = typename Recipe_::trigger;
  using schedule = schedule_tag;
  using params = typename Recipe_::params;
  using parts_type = typename Recipe_::parts;
  using granularity = typename scorer::granularity;
  static constexpr bool page_level_selection = std::is_same_v<granularity, page_level>;
  static constexpr capabilities caps = state_type::template caps<Recipe_>;

  // Validates params against a model shape without touching any store; throws kvsift::error.
  static void can_implement(const model_shape& shape, const params& p) {
    Recipe_::can_implement(shape, p);
  }

  explicit method(Store_& store, params p = {})
      : store_(&store), p_(checked(store, std::move(p))), parts_(Recipe_::make_parts(p_)),
        history_(static_cast<std::size_t>(store.requests()) * store.shape().layers, store.shape()),
        in_batch_(static_cast<std::size_t>(store.requests()), 0), sched_(*this) {}
  method(method&&) noexcept = default;
  method& operator=(method&&) = delete;
  method(const method&) = delete;
  ~method() { sched_.release(*this); }

  [[nodiscard]] const params& parameters() const { return p_; }
  [[nodiscard]] Store_& store() { return *store_; }
  [[nodiscard]] const Store_& store() const { return *store_; }
  [[nodiscard]] parts_type& parts() { return parts_; }
  [[nodiscard]] const parts_type& parts() const { return parts_; }
  [[nodiscard]] auto& scorer_state() { return parts_.scorer; }
  [[nodiscard]] auto& budgeter_state() { return parts_.budgeter; }
  // What the schedule keeps (its counters, pending recalls, per-request state).
  [[nodiscard]] state_type& schedule_state() { return sched_; }
  [[nodiscard]] const state_type& schedule_state() const { return sched_; }
  // For the schedule and the parts: the (request, layer) index of per-request state, and the
  // query history.
  [[nodiscard]] std::size_t slot(int request, int layer) const {
    return static_cast<std::size_t>(request) * store_->shape().layers + layer;
  }
  [[nodiscard]] detail::query_history& history() { return history_; }
  [[nodiscard]] const detail::query_history& history() const { return history_; }
  // The two-tier schedules' transfer (the recalls' worker).
  [[nodiscard]] decltype(auto) transfer_state()
    requires requires(state_type& s) { s.transfer(); }
  {
    return sched_.transfer();
  }
  [[nodiscard]] const plan_type& plan() const { return plan_; }
  // Decode steps of (request, layer) since its prompt ended.
  [[nodiscard]] int step(int request, int layer) const {
    return sched_.steps(checked_slot(std::string(Recipe_::name) + ".step", request, layer));
  }

  // 1. Appends each request's chunk, then runs the schedule's round for the requests whose
  // chunk is `last` (and between chunks when the trigger says so). Every chunk is validated
  // before anything is appended.
  void prefill(int layer, std::span<const chunk_type> chunks) {
    static const std::string where = std::string(Recipe_::name) + ".prefill";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    auto& tot = totals_;
    tot.added.assign(static_cast<std::size_t>(store_->requests()), 0);
    tot.next.assign(static_cast<std::size_t>(store_->requests()), -1);
    tot.ended.assign(static_cast<std::size_t>(store_->requests()), 0);
    tot.query_rows.assign(static_cast<std::size_t>(store_->requests()), -1);
    tot.query_end.assign(static_cast<std::size_t>(store_->requests()), 0);
    tot.pool_pages = 0;
    for (const auto& c : chunks) {
      check_request(where, c.request);
      require(!tot.ended[c.request], where, "request", c.request,
              "no chunk after the request's `last` chunk in the same call (its prompt ends there)");
      c.keys.validate(where, "keys", sh.kv_heads, sh.head_dim);
      c.values.validate(where, "values", sh.kv_heads, sh.head_dim);
      require(c.values.tokens == c.keys.tokens, where, "values.tokens", c.values.tokens,
              "keys.tokens (" + std::to_string(c.keys.tokens) + ")");
      require(c.keys.tokens > 0, where, "keys.tokens", c.keys.tokens, "> 0 (a non-empty chunk)");
      require_positions_fit(where, "first_position", c.first_position, c.keys.tokens);
      if constexpr (caps.needs_queries) {
        if (c.queries.tokens > 0) c.queries.validate(where, "queries", sh.q_heads, sh.head_dim);
      }
      sched_.check_chunk(*this, where, layer, c, tot);  // query counts, prompt state, room
      // after every view and count: it reads them. A device exec's chunk is not host memory:
      // its store checks the values on the device (thrust::dense_store::check()).
      if constexpr (Exec_::host_visible) require_finite(where, c, caps.needs_queries);
      const auto next = tot.next[c.request] >= 0 ? tot.next[c.request]
                                                 : store_->next_position(c.request, layer);
      require(c.first_position >= next, where, "first_position", c.first_position,
              ">= " + std::to_string(next));
      tot.added[c.request] += c.keys.tokens;
      tot.next[c.request] = c.first_position + c.keys.tokens;
      tot.ended[c.request] = c.last ? 1 : 0;
    }
    sched_.check_prefill(*this, where, layer, chunks, tot);  // budgets of the prompts that end
    // Checked: from here the store changes. A pending step of a request this call extends ends
    // (its plan names slots a round may move), and every planned decode_step is stale.
    if (binding_.bound()) {
      for (const auto& c : chunks) {
        if (std::find(plan_.requests.begin(), plan_.requests.end(), c.request) != plan_.requests.end()) {
          binding_.unbind();
          break;
        }
      }
    }
    ++generation_;
    sched_.prefill(*this, layer, chunks);
  }
  void prefill(int layer, const chunk_type& chunk) {
    prefill(layer, std::span<const chunk_type>(&chunk, 1));
  }

  // 2. The step's host part: validates the batch (each request at most once, its token's
  // arrays, room, the schedule's own preconditions) and names the step. Nothing changes. A step
  // is stamped with the method's generation, which every decode, prefill and reset advances:
  // run_decode() takes it once, and only while nothing else changed the method since.
  class decode_step {
   public:
    [[nodiscard]] int layer() const { return layer_; }
    [[nodiscard]] std::span<const decode_token<element_type>> tokens() const { return tokens_; }

   private:
    friend class method;
    decode_step(int layer, std::span<const decode_token<element_type>> t, std::uint64_t generation)
        : layer_(layer), tokens_(t), generation_(generation) {}
    int layer_;
    std::span<const decode_token<element_type>> tokens_;
    std::uint64_t generation_;
  };
  [[nodiscard]] decode_step plan_decode(int layer, std::span<const decode_token<element_type>> tokens) {
    static const std::string where = std::string(Recipe_::name) + ".decode";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    std::size_t i = 0;
    try {
      for (; i < tokens.size(); ++i) {
        const auto& t = tokens[i];
        check_request(where, t.request);
        require(in_batch_[t.request] == 0, where,
                [&] { return "tokens[" + std::to_string(i) + "].request"; }, t.request,
                [] { return std::string("a request at most once per batch (one token per request in a step)"); });
        in_batch_[t.request] = 1;
        require(t.key != nullptr && t.value != nullptr, where, "key/value", "null",
                "[kv_heads, d] arrays");
        require(!caps.needs_queries || t.query != nullptr, where, "query", "null",
                "a [q_heads, d] array (this method scores queries)");
        require_positions_fit(where, "next position", store_->next_position(t.request, layer), 1);
        if constexpr (Exec_::host_visible) require_finite(where, i, t, sh, caps.needs_queries);
      }
    } catch (...) {
      clear_batch(tokens, i);
      throw;
    }
    clear_batch(tokens, tokens.size());
    sched_.check_decode(*this, where, layer, tokens);  // room, prompt ended, budgets after the step
    return decode_step(layer, tokens, generation_);
  }
  // 2. The step's store part: installs what the schedule recalled, appends each request's token
  // and returns the step's plan.
  const plan_type& run_decode(const decode_step& step) {
    static const std::string where = std::string(Recipe_::name) + ".run_decode";
    require(step.generation_ == generation_, where, "step", "a stale decode_step", [] {
      return std::string("the step of the last plan_decode(), not yet run, with no decode, prefill "
                         "or reset since (plan again)");
    });
    ++generation_;
    binding_.unbind();
    plan_.requests.clear();
    for (const auto& t : step.tokens()) plan_.requests.push_back(t.request);
    sched_.decode(*this, step.layer(), step.tokens(), plan_);
    binding_.bind(step.layer());
    return plan_;
  }
  const plan_type& decode(int layer, std::span<const decode_token<element_type>> tokens) {
    return run_decode(plan_decode(layer, tokens));
  }
  const plan_type& decode(int layer, const decode_token<element_type>& token) {
    return decode(layer, std::span<const decode_token<element_type>>(&token, 1));
  }

  // 3. The library's attention over the current plan: out [tokens.size(), q_heads, d]. The call
  // must be the step of the last decode(): same layer, same requests in the same order, a query
  // each (kvsift::error otherwise).
  void attend(int layer, std::span<const decode_token<element_type>> tokens, float* out) const {
    static const std::string where = std::string(Recipe_::name) + ".attend";
    binding_.check(where, layer, tokens, plan_.requests, true);
    require(out != nullptr || tokens.empty(), where, "out", "null",
            "a [tokens, q_heads, d] output array");
    if constexpr (Exec_::host_visible && TieredStore<Store_>) {
      if (plan_.far.segments() > 0) {  // far_tier::attend: the host-pool part where it lies
        attention::attend_plan_far(*store_, layer, tokens.size(),
                                   [&](std::size_t i) { return tokens[i].query; }, plan_.slots,
                                   plan_.far, plan_.requests, out);
        return;
      }
    }
    if constexpr (Exec_::host_visible) {
      attention::attend_plan_batch(
          *store_, layer, tokens.size(), [&](std::size_t i) { return tokens[i].request; },
          [&](std::size_t i) { return tokens[i].query; }, plan_.slots, out, step_weights(layer));
    } else {
      sched_.attend(*this, layer, tokens, out);  // queries and out in the exec's memory
    }
  }
  void attend(int layer, const decode_token<element_type>& token, float* out) const {
    attend(layer, std::span<const decode_token<element_type>>(&token, 1), out);
  }

  // 4. Applies this step's decisions; they show from the next step. The call must be the step
  // of the last decode() (same layer, same requests in the same order, queries where the
  // schedule reads them), once: the step's plan is spent afterwards.
  void after_attention(int layer, std::span<const decode_token<element_type>> tokens) {
    static const std::string where = std::string(Recipe_::name) + ".after_attention";
    check_layer(where, layer);
    binding_.check(where, layer, tokens, plan_.requests, state_type::after_attention_reads_queries);
    binding_.unbind();  // applied once; the next step starts with decode()
    sched_.after_attention(*this, layer, tokens);
  }
  void after_attention(int layer, const decode_token<element_type>& token) {
    after_attention(layer, std::span<const decode_token<element_type>>(&token, 1));
  }

  // Ends a request: cancels what the schedule has in flight for it, drops its tokens from the
  // store and its state from the method (steps, buffered queries, parts' per-request state), so
  // the slot can take a new prompt in a continuous batch.
  void reset(int request) {
    static const std::string where = std::string(Recipe_::name) + ".reset";
    check_request(where, request);
    sched_.reset(*this, request);
    for (int l = 0; l < store_->shape().layers; ++l) history_.clear(slot(request, l));
    binding_.unbind();  // a pending step may have included the request
    ++generation_;      // and a planned one
  }

  // 5. Resident bytes and tokens, bytes moved between tiers, refreshes, stalls, layer budgets.
  [[nodiscard]] method_stats stats() const {
    method_stats s;
    s.resident_bytes = store_->resident_bytes();
    s.resident_tokens = store_->resident_tokens();
    if constexpr (requires { store_->used_pages(); store_->page_size(); }) {
      s.pages = store_->used_pages();
      s.page_size = store_->page_size();
    }
    sched_.stats(*this, s);
    return s;
  }
  // The (request, layer) slot of the schedule's per-slot state, for an accessor named `where`
  // (kvsift::error naming the request or the layer out of range).
  [[nodiscard]] std::size_t checked_slot(std::string_view where, int request, int layer) const {
    check_request(where, request);
    check_layer(where, layer);
    return slot(request, layer);
  }

 private:
  static params checked(const Store_& store, params p) {
    can_implement(store.shape(), p);
    return p;
  }
  void check_layer(std::string_view where, int layer) const {
    require(layer >= 0 && layer < store_->shape().layers, where, "layer", layer,
            [&] { return "in [0, " + std::to_string(store_->shape().layers) + ")"; });
  }
  void check_request(std::string_view where, int request) const {
    require(request >= 0 && request < store_->requests(), where, "request", request,
            [&] { return "in [0, " + std::to_string(store_->requests()) + ")"; });
  }
  // Where attend() keeps the step's attention probabilities for the schedule, which reads them in
  // after_attention instead of a second pass over the keys (H2O's running scores,
  // schedule::evict::state::attention_weights), or null.
  [[nodiscard]] attention::plan_weights* step_weights(int layer) const {
    if constexpr (requires { sched_.attention_weights(*this, layer); }) {
      return sched_.attention_weights(*this, layer);
    } else {
      return nullptr;
    }
  }
  void clear_batch(std::span<const decode_token<element_type>> tokens, std::size_t upto) {
    for (std::size_t j = 0; j <= upto && j < tokens.size(); ++j) {
      if (tokens[j].request >= 0 && tokens[j].request < store_->requests()) in_batch_[tokens[j].request] = 0;
    }
  }

  Store_* store_;
  params p_;
  parts_type parts_;
  detail::query_history history_;  // newest queries per (request, layer), for the parts
  step_binding binding_;           // the pending step (decode() done, not yet applied)
  plan_type plan_;
  prefill_totals totals_;                // scratch of prefill()
  std::vector<unsigned char> in_batch_;  // [requests] scratch: requests seen in a decode batch
  std::uint64_t generation_ = 0;         // advanced by every decode, prefill and reset
  state_type sched_;                     // last: built from the members above
};

}  // namespace kvsift
