// SPDX-License-Identifier: Apache-2.0
#pragma once

// synckv — SyncKV (Zhou et al., 2025, "SyncKV: Synchronized KV cache compression with
// representative heads and periodic anticipation"; METHODS.md "SyncKV", SPEC
// method.synckv.decode). A dynamic method over store::tiered (device working set + host pool)
// and transfer::async (recalls on a worker thread).
//
// Head roles come from calibration (the head-roles file): per layer, KV heads are clustered and
// each cluster has one representative (R-head); the other members are followers.
//
//   prefill   every token goes to the host pool (write-through) and the working set. At the end of
//             the prompt (n tokens) each R-head's last-query attention (softmax, GQA max, no
//             pooling) picks the follower budget k (budget::synckv, N = layers x kv_heads,
//             N_R = all representatives): static = its top floor(rho k), dynamic = ranks
//             floor(rho k) .. k-1 (select::static_dynamic), shared by the cluster's followers
//             (select::shared_by_cluster). Followers keep static ∪ dynamic resident; the rest of
//             their prompt is demoted (it stays in the host pool). R-heads keep everything.
//   decode t  the token is appended to every head; the plan is every resident token: R-heads read
//             [0, n+t), followers static ∪ dynamic ∪ [n, n+t).
//   after t   when t % m == 0 (trigger::stride) each R-head with followers anticipates: its step-t
//             attention (softmax over its n+t tokens, GQA max) ranks the PREFILL tokens outside
//             the static set; the top k_dyn become the cluster's dynamic set. The followers'
//             missing rows are recalled asynchronously (one transfer::async recall per request
//             and layer, submitted here) and installed at the start of step t+1's decode(): if
//             the copy is not done, that decode waits (a stall, counted in stats()) — it never
//             reads stale or partial rows.
//
// Parameters (paper defaults): clusters N_r = 2, stride m = 5, rho = 0.5, memory_fraction M = 0.3
// (device-resident share of the prefill KV), roles (required: one cluster_roles per layer, each
// with N_r clusters). Resident KV after prefill: N_R n + (N - N_R) k <= M N n tokens.
// Cost per step: the attention over the plan; at an anticipation O((n + t) d G) per R-head with
// followers plus one recall of at most k_dyn rows per follower.
// Composition: score::last_query_attention{kernel 1, GQA max} -> budget::synckv ->
// select::static_dynamic shared by select::shared_by_cluster -> store::tiered retain / install,
// refreshed by trigger::stride through transfer::async (method/detail/tiered_lifecycle.hpp).

#include <kvsift/attention/reference.hpp>
#include <kvsift/budget/synckv.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/method/detail/tiered_lifecycle.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/score/context.hpp>
#include <kvsift/score/last_query_attention.hpp>
#include <kvsift/select/shared_by_cluster.hpp>
#include <kvsift/select/static_dynamic.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>
#include <kvsift/trigger/basic.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvsift {

template <Element T>
class synckv {
 public:
  using store_type = store::tiered<T>;
  using transfer_type = transfer::async<T>;
  using scorer = score::last_query_attention;
  using selector = select::static_dynamic;
  using sharing = select::shared_by_cluster<select::static_dynamic>;
  using budgeter = budget::synckv;
  using trigger = trigger::stride;
  using element_type = T;
  using roles_type = select::cluster_roles;

  struct params {
    int clusters = 2;               // N_r: clusters (and representatives) per layer
    int stride = 5;                 // m: anticipation at steps m, 2m, ...
    double rho = 0.5;               // static share of a follower's budget
    double memory_fraction = 0.3;   // M: device-resident share of the prefill KV
    std::vector<roles_type> roles;  // [layers] head roles (calibration); N_r clusters each
  };

  static constexpr capabilities caps{
      .changes_physical_length = true,   // followers' demoted rows leave the working set
      .safe_with_shared_prefix = false,  // retain/install rewrite a request's working set
      .needs_queries = true,             // the last prefill query and every decode query
      .cuda_graph_safe = false,
      .speculative_decoding = false,
  };

  // Validates params against a model shape without touching any store; throws kvsift::error
  // (k < 0 names the smallest memory fraction that works).
  static void can_implement(const model_shape& shape, const params& p) {
    constexpr std::string_view where = "synckv";
    shape.validate(where);
    require(p.clusters > 0 && p.clusters <= shape.kv_heads, where, "clusters", p.clusters,
            "in [1, kv_heads = " + std::to_string(shape.kv_heads) + "]");
    trigger{{.m = p.stride}}.validate(where);
    selector{{.rho = p.rho}}.validate(where);
    require(static_cast<int>(p.roles.size()) == shape.layers, where, "roles.size", p.roles.size(),
            "one cluster_roles per layer (" + std::to_string(shape.layers) + ")");
    for (int l = 0; l < shape.layers; ++l) {
      p.roles[l].validate("synckv: roles[" + std::to_string(l) + "]", shape.kv_heads);
      require(p.roles[l].clusters() == p.clusters, where,
              "roles[" + std::to_string(l) + "].representatives.size", p.roles[l].clusters(),
              "clusters = " + std::to_string(p.clusters) + " (a roles file for this N_r)");
    }
    if (followers_in(p) > 0) (void)budget_of(shape, p).split(1);  // k < 0 is an error now
  }

  // The transfer is owned by the method (a worker thread); transfer_state() reaches it.
  explicit synckv(store_type& store, params p = {})
      : store_(&store), p_(std::move(p)), xfer_(std::make_unique<transfer_type>()) {
    can_implement(store.shape(), p_);
    const auto& sh = store.shape();
    const std::size_t rl = static_cast<std::size_t>(store.requests()) * sh.layers;
    state_.assign(rl, {});
    pending_ = pending_type(rl);
    layer_budgets_.assign(static_cast<std::size_t>(sh.layers), -1);
  }
  synckv(synckv&&) noexcept = default;
  ~synckv() {
    if (xfer_) {
      for (std::size_t i = 0; i < state_.size(); ++i) pending_.cancel(*xfer_, i);
    }
  }

  [[nodiscard]] const params& parameters() const { return p_; }
  [[nodiscard]] store_type& store() { return *store_; }
  [[nodiscard]] const store_type& store() const { return *store_; }
  [[nodiscard]] transfer_type& transfer_state() { return *xfer_; }
  [[nodiscard]] const attention_plan& plan() const { return plan_; }

  // The follower budget of the whole model for a prompt of n tokens.
  [[nodiscard]] budget::synckv_split split(int n) const {
    return budget_of(store_->shape(), p_).split(n);
  }
  // Decode steps of (request, layer) since its prompt ended (0 before).
  [[nodiscard]] int step(int request, int layer) const {
    return state_[checked_rl("synckv.step", request, layer)].steps;
  }
  // Prompt length of (request, layer): positions below it are prefill tokens (-1 before its end).
  [[nodiscard]] std::int32_t prompt_end(int request, int layer) const {
    return state_[checked_rl("synckv.prompt_end", request, layer)].prompt_end;
  }
  // Whether the last after_attention of (request, layer) anticipated (t % m == 0, some R-head
  // with followers).
  [[nodiscard]] bool anticipated(int request, int layer) const {
    return state_[checked_rl("synckv.anticipated", request, layer)].anticipated;
  }
  // Whether an anticipation's recall is decided and not yet installed / not yet copied.
  [[nodiscard]] bool recall_pending(int request, int layer) const {
    return pending_.has(checked_rl("synckv.recall_pending", request, layer));
  }
  [[nodiscard]] bool recall_in_flight(int request, int layer) const {
    return pending_.in_flight(*xfer_, checked_rl("synckv.recall_in_flight", request, layer));
  }
  // Cluster c's static / dynamic set (original positions, ascending) of (request, layer), as its
  // followers hold them: an anticipation's dynamic set becomes this one when the next decode()
  // installed its recall (a recall that fails leaves the previous set). Only after the prompt
  // ended (kvsift::error before, and after reset()).
  [[nodiscard]] std::span<const std::int32_t> static_set(int request, int layer, int c) const {
    return placed_state("synckv.static_set", request, layer, c).static_pos[c];
  }
  [[nodiscard]] std::span<const std::int32_t> dynamic_set(int request, int layer, int c) const {
    return placed_state("synckv.dynamic_set", request, layer, c).dynamic_pos[c];
  }

  // 1. Appends each chunk (the chunk marked `last` must carry at least the prompt's last query),
  // then places the KV of the requests whose prompt ended. Validates everything first.
  void prefill(int layer, std::span<const prefill_chunk<T>> chunks) {
    constexpr std::string_view where = "synckv.prefill";
    check_layer(where, layer);
    const auto added = detail::check_prefill_chunks(
        *store_, layer, chunks, where, "SyncKV",
        [&](int r) { return state_[rl(r, layer)].prompt_end < 0; });
    std::vector<int> ended;
    std::vector<kv_view<const float, nhd>> queries;
    std::vector<std::int32_t> qpos;
    for (const auto& c : chunks) {
      store_->append(c.request, layer, c.keys, c.values, c.first_position);
      if (c.last) {
        ended.push_back(c.request);
        queries.push_back(c.queries.slice(c.queries.tokens - 1, 1));
        qpos.push_back(c.first_position + c.keys.tokens - 1);
      }
    }
    if (!ended.empty()) place_prompt(layer, ended, queries, qpos);
  }
  void prefill(int layer, const prefill_chunk<T>& chunk) {
    prefill(layer, std::span<const prefill_chunk<T>>(&chunk, 1));
  }

  // 2. Installs the recalls decided at the previous step (waiting for them if needed: a stall),
  // appends each request's token and returns the plan: every resident token of every head.
  const attention_plan& decode(int layer, std::span<const decode_token<T>> tokens) {
    constexpr std::string_view where = "synckv.decode";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    for (const auto& t : tokens) check_request(where, t.request);
    require_distinct_requests(where, tokens, store_->requests());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto& t = tokens[i];
      require(t.key != nullptr && t.value != nullptr, where, "key/value", "null",
              "[kv_heads, d] arrays");
      require(t.query != nullptr, where, "query", "null", "a [q_heads, d] array (SyncKV scores it)");
      require_finite(where, i, t, sh, true);
      require(state_[rl(t.request, layer)].prompt_end >= 0, where, "request", t.request,
              "a request whose prompt ended on this layer (prefill with last = true first)");
      require(store_->host_length(t.request, layer) < store_->host_capacity(), where, "request",
              t.request, "a head-sequence with room for one more token in the host pool");
    }
    binding_.unbind();
    plan_.requests.clear();
    for (const auto& t : tokens) {
      auto& st = state_[rl(t.request, layer)];
      pending_.complete(*xfer_, *store_, rl(t.request, layer), [&](decision d) {
        for (auto& [c, dyn] : d) st.dynamic_pos[c] = std::move(dyn);
      });
    }
    for (const auto& t : tokens) {
      store_->append(t.request, layer,
                     kv_view<const T, nhd>::contiguous(t.key, 1, sh.kv_heads, sh.head_dim),
                     kv_view<const T, nhd>::contiguous(t.value, 1, sh.kv_heads, sh.head_dim),
                     store_->next_position(t.request, layer));
      ++state_[rl(t.request, layer)].steps;
      plan_.requests.push_back(t.request);
    }
    detail::plan_whole_working_set(*store_, layer, plan_);
    store_->debug_verify();
    binding_.bind(layer);
    return plan_;
  }
  const attention_plan& decode(int layer, const decode_token<T>& token) {
    return decode(layer, std::span<const decode_token<T>>(&token, 1));
  }

  // 3. The library's attention over the current plan: out [tokens.size(), q_heads, d]. The call
  // must be the step of the last decode(): same layer, same requests in the same order, a query
  // each (kvsift::error otherwise).
  void attend(int layer, std::span<const decode_token<T>> tokens, float* out) const {
    binding_.check("synckv.attend", layer, tokens, plan_.requests, true);
    detail::attend_over_plan(*store_, layer, tokens, plan_, out);
  }

  // 4. At t % m == 0: each R-head with followers anticipates from this step's query; the
  // followers' recall is submitted now and installed by the next decode().
  void after_attention(int layer, std::span<const decode_token<T>> tokens) {
    constexpr std::string_view where = "synckv.after_attention";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    binding_.check(where, layer, tokens, plan_.requests, true);  // once per decode()
    binding_.unbind();
    const trigger trig{{.m = p_.stride}};
    const auto& roles = p_.roles[layer];
    bool any_followers = false;
    for (int c = 0; c < roles.clusters(); ++c) any_followers = any_followers || roles.followers(c) > 0;
    std::vector<int> firing;
    std::vector<kv_view<const float, nhd>> queries;
    std::vector<std::int32_t> qpos;
    for (const auto& t : tokens) {
      auto& st = state_[rl(t.request, layer)];
      st.anticipated = false;
      const trigger_context ctx{lifecycle_event::decode_step, st.steps, 0, 0, 0};
      if (!any_followers || !trig.fires(ctx)) continue;
      firing.push_back(t.request);
      queries.push_back(kv_view<const float, nhd>::contiguous(t.query, 1, sh.q_heads, sh.head_dim));
      qpos.push_back(store_->next_position(t.request, layer) - 1);
    }
    if (firing.empty()) return;
    score_input<store_type> in{store_, layer, lifecycle_event::decode_step, firing, queries, qpos, {}};
    scorer_.score(in, scores_);
    // Per firing request: one segment per cluster with followers (its R-head's scores).
    score_sets rep_scores;
    index_sets rep_static;
    std::vector<int> limits, k_dyn;
    for (std::size_t i = 0; i < firing.size(); ++i) {
      const auto& st = state_[rl(firing[i], layer)];
      for (int c = 0; c < roles.clusters(); ++c) {
        if (roles.followers(c) == 0) continue;
        const int rep = roles.representatives[c];
        const auto seq = sh.sequence(firing[i], layer, rep);
        rep_scores.push_back(scores_[static_cast<int>(i) * sh.kv_heads + rep]);
        std::vector<std::int32_t> slots;
        for (const auto pos : st.static_pos[c]) slots.push_back(store_->slot_of(seq, pos));
        rep_static.push_back(slots);
        limits.push_back(cpu::visible_slots(*store_, seq, st.prompt_end - 1));
        k_dyn.push_back(st.split.k_dynamic);
      }
    }
    index_sets rep_dynamic;
    selector{{.rho = p_.rho}}.refresh(rep_scores, rep_static, limits, k_dyn, rep_dynamic);
    int seg = 0;
    for (const int r : firing) {
      auto& st = state_[rl(r, layer)];
      std::vector<typename pending_type::target> targets;
      decision next;  // the new dynamic sets: the followers' state once their recall is installed
      for (int c = 0; c < roles.clusters(); ++c) {
        if (roles.followers(c) == 0) continue;
        const auto rep_seq = sh.sequence(r, layer, roles.representatives[c]);
        auto& dyn = next.emplace_back(c, std::vector<std::int32_t>{}).second;
        for (const auto slot : rep_dynamic[seg]) dyn.push_back(store_->position(rep_seq, slot));
        ++seg;
        std::vector<std::int32_t> prefill_part;
        std::set_union(st.static_pos[c].begin(), st.static_pos[c].end(), dyn.begin(), dyn.end(),
                       std::back_inserter(prefill_part));
        for (int h = 0; h < sh.kv_heads; ++h) {
          if (roles.assign[h] != c || roles.is_representative(h)) continue;
          targets.push_back({sh.sequence(r, layer, h), prefill_part, st.prompt_end});
        }
      }
      pending_.submit(*xfer_, *store_, rl(r, layer), std::move(targets), std::move(next),
                      [&](decision d) { for (auto& [c, dyn] : d) st.dynamic_pos[c] = std::move(dyn); });
      st.anticipated = true;
      ++refreshes_;
    }
  }
  void after_attention(int layer, const decode_token<T>& token) {
    after_attention(layer, std::span<const decode_token<T>>(&token, 1));
  }

  // Ends a request: cancels its recalls, drops its tokens from both tiers and its state.
  void reset(int request) {
    check_request("synckv.reset", request);
    for (int l = 0; l < store_->shape().layers; ++l) {
      pending_.cancel(*xfer_, rl(request, l));
      state_[rl(request, l)] = {};
    }
    store_->reset(request);
    binding_.unbind();  // a pending step may have included the request
  }

  // 5. Working-set bytes and tokens, bytes the transfer recalled, anticipations, stalls (decode
  // steps that waited for a recall), per-layer follower budget k (-1 before any prefill).
  [[nodiscard]] method_stats stats() const {
    method_stats s;
    s.resident_bytes = store_->resident_bytes();
    s.resident_tokens = store_->resident_tokens();
    const auto xs = xfer_->stats();
    s.bytes_transferred = xs.bytes_moved;
    s.refreshes = refreshes_;
    s.stalls = xs.stalls;
    s.layer_budgets = layer_budgets_;
    return s;
  }

 private:
  // An anticipation's outcome, per cluster with followers: (cluster, new dynamic set).
  using decision = std::vector<std::pair<int, std::vector<std::int32_t>>>;
  using pending_type = detail::pending_recalls<T, decision>;

  struct request_state {
    std::int32_t prompt_end = -1;  // positions below it are the prompt; -1 before its end
    int steps = 0;
    bool anticipated = false;
    budget::synckv_split split{};
    std::vector<std::vector<std::int32_t>> static_pos, dynamic_pos;  // [clusters] positions
  };

  static int followers_in(const params& p) {
    int f = 0;
    for (const auto& r : p.roles) {
      for (int h = 0; h < r.kv_heads(); ++h) f += r.is_representative(h) ? 0 : 1;
    }
    return f;
  }
  // N = every KV head of the model, N_R = every representative.
  static budgeter budget_of(const model_shape& sh, const params& p) {
    int reps = 0;
    for (const auto& r : p.roles) reps += r.clusters();
    return budgeter{{.heads = sh.layers * sh.kv_heads, .representatives = reps,
                     .memory_fraction = p.memory_fraction, .rho = p.rho}};
  }

  [[nodiscard]] std::size_t rl(int request, int layer) const {
    return static_cast<std::size_t>(request) * store_->shape().layers + layer;
  }
  void check_layer(std::string_view where, int layer) const {
    require(layer >= 0 && layer < store_->shape().layers, where, "layer", layer,
            "in [0, " + std::to_string(store_->shape().layers) + ")");
  }
  void check_request(std::string_view where, int request) const {
    require(request >= 0 && request < store_->requests(), where, "request", request,
            "in [0, " + std::to_string(store_->requests()) + ")");
  }
  [[nodiscard]] std::size_t checked_rl(std::string_view where, int request, int layer) const {
    check_request(where, request);
    check_layer(where, layer);
    return rl(request, layer);
  }
  // The state of (request, layer) once its prompt was placed, with c a cluster of the layer.
  [[nodiscard]] const request_state& placed_state(std::string_view where, int request, int layer, int c) const {
    const auto& st = state_[checked_rl(where, request, layer)];
    require(st.prompt_end >= 0, where, "request", request,
            "a request whose prompt ended on this layer (its sets exist from then until reset())");
    require(c >= 0 && c < static_cast<int>(st.static_pos.size()), where, "c", c,
            [&] { return "a cluster in [0, " + std::to_string(st.static_pos.size()) + ")"; });
    return st;
  }

  // The end of the prompt: R-heads' last-query attention -> static / dynamic sets -> followers
  // keep them resident, the rest of their prompt is demoted to the host pool.
  void place_prompt(int layer, const std::vector<int>& ended,
                    const std::vector<kv_view<const float, nhd>>& queries,
                    const std::vector<std::int32_t>& qpos) {
    const auto& sh = store_->shape();
    const auto& roles = p_.roles[layer];
    for (const int r : ended) {
      auto& st = state_[rl(r, layer)];
      st.prompt_end = store_->next_position(r, layer);
      st.steps = 0;
      st.anticipated = false;
      st.static_pos.assign(static_cast<std::size_t>(roles.clusters()), {});
      st.dynamic_pos.assign(static_cast<std::size_t>(roles.clusters()), {});
    }
    if (followers_in(p_) == 0) return;  // every head is a representative: nothing to place
    score_input<store_type> in{store_, layer, lifecycle_event::prefill_end, ended, queries, qpos, {}};
    scorer_.score(in, scores_);
    // Every head holds the whole prompt now, so a slot means the same token in every head.
    // R-heads split their own scores under the follower budget k (followers score nothing: 0),
    // then every follower takes its representative's sets (select::shared_by_cluster).
    std::vector<int> budgets;
    for (std::size_t i = 0; i < ended.size(); ++i) {
      auto& st = state_[rl(ended[i], layer)];
      st.split = split(store_->host_length(ended[i], layer));
      layer_budgets_[layer] = st.split.k;
      for (int h = 0; h < sh.kv_heads; ++h) {
        budgets.push_back(roles.is_representative(h) ? st.split.k : 0);
      }
    }
    index_sets own_static, own_dynamic, st_sets, dyn_sets;
    selector{{.rho = p_.rho}}.split(scores_, budgets, own_static, own_dynamic);
    sharing::share(roles, own_static, st_sets);
    sharing::share(roles, own_dynamic, dyn_sets);
    for (std::size_t i = 0; i < ended.size(); ++i) {
      const int r = ended[i];
      auto& st = state_[rl(r, layer)];
      index_sets kept;
      std::vector<std::int32_t> all, both;
      for (int h = 0; h < sh.kv_heads; ++h) {
        const int s = static_cast<int>(i) * sh.kv_heads + h;
        const auto seq = sh.sequence(r, layer, h);
        if (roles.is_representative(h)) {
          all.resize(static_cast<std::size_t>(store_->length(seq)));
          std::iota(all.begin(), all.end(), 0);
          kept.push_back(all);
          const int c = roles.assign[h];
          for (const auto slot : st_sets[s]) st.static_pos[c].push_back(store_->position(seq, slot));
          for (const auto slot : dyn_sets[s]) st.dynamic_pos[c].push_back(store_->position(seq, slot));
        } else {
          both.clear();
          std::merge(st_sets[s].begin(), st_sets[s].end(), dyn_sets[s].begin(), dyn_sets[s].end(),
                     std::back_inserter(both));
          kept.push_back(both);
        }
      }
      store_->retain(r, layer, kept);
    }
  }

  store_type* store_;
  params p_;
  std::unique_ptr<transfer_type> xfer_;
  scorer scorer_{{.kernel = 1, .pool = pooling::avg, .gqa = gqa_reduce::max}};
  std::vector<request_state> state_;  // [requests * layers]
  pending_type pending_;
  step_binding binding_;  // attend / after_attention: the step of the last decode()
  std::vector<int> layer_budgets_;
  std::int64_t refreshes_ = 0;
  score_sets scores_;
  attention_plan plan_;
};

}  // namespace kvsift

namespace kvsift {

// Per-layer cluster roles from a head-roles file (calibrate::synckv_roles, or any type whose
// `layers[l]` has `assign` and `representatives`), for synckv<T>::params::roles. Kept generic so
// this header does not pull the JSON reader in.
template <class Roles>
std::vector<select::cluster_roles> synckv_roles_of(const Roles& roles) {
  std::vector<select::cluster_roles> out;
  for (const auto& l : roles.layers) {
    out.push_back({std::vector<int>(l.assign.begin(), l.assign.end()),
                   std::vector<int>(l.representatives.begin(), l.representatives.end())});
  }
  return out;
}

}  // namespace kvsift
