// SPDX-License-Identifier: Apache-2.0
#pragma once

// heterocache — HeteroCache (head roles, inverse-stability budgets, drift-triggered retrieval;
// METHODS.md "HeteroCache", SPEC method.heterocache.prefill / method.heterocache.decode). A
// dynamic method over store::tiered (device working set + host pool) and transfer::async
// (recalls on a worker thread).
//
// Head roles come from calibration (the head-roles file, `kvsift calibrate`): per layer every KV
// head is an anchor (stable), volatile (unstable, no similar head), pivot (the centre of a star
// of similar heads) or satellite (a member of a pivot's star), with its stability s_h.
//
//   prefill   every token goes to the host pool (write-through) and the working set. At the end of
//             the prompt (n tokens) budget::inverse_stability gives base and cap_h (N = every KV
//             head of the model); the last query's attention over [0, n) (softmax, avg-pool 5 per
//             query head, GQA max: score::last_query_attention) ranks the prompt per head.
//             Volatile and pivot heads keep everything resident; anchors and satellites keep
//             their top cap_h and demote the rest (it stays in the host pool). A pivot with
//             satellites starts its reference set as its top `base`.
//   decode t  the token is appended to every head; the plan is every resident token: volatile
//             and pivot heads read [0, n+t), anchors and satellites their prefill part ∪ [n, n+t).
//   after t   at t = W, 2W, ... (trigger::drift_median) each pivot with satellites scores each of
//             the last W queries over the PREFILL keys only (softmax over those n, avg-pool, GQA
//             max over the pivot's group), takes each one's top-base set and its overlap with the
//             reference; median < tau_drift (strict) is a drift: the reference becomes q_t's set
//             and each satellite's prefill part becomes the pivot's top min(n, cap_s) by q_t's
//             scores. The satellites' missing rows are recalled asynchronously (one
//             transfer::async recall per request and layer, submitted here) and installed at the
//             start of step t+1's decode(): if the copy is not done, that decode waits (a stall,
//             counted in stats()); it never reads stale or partial rows. Decode tokens are never
//             candidates (they stay resident in every head).
//
// Parameters (METHODS.md defaults): tau_stable 0.5 and tau_sim 0.5 (calibration's thresholds,
// recorded here; the roles already carry them), tau_drift = tau_stable = 0.5, drift_window W = 5,
// rho 0.5 (resident share of the prefill KV over the whole model), kernel 5 (avg pooling),
// roles (required: one layer_roles per layer). fixed_budget replaces the inverse-stability
// budget by given caps (a replay of SPEC method.heterocache.decode, whose cases give cap and base).
// Resident KV after prefill: F n + sum(cap) <= rho N n tokens (F volatile + pivot heads).
// Cost per step: the attention over the plan; at a drift check O(W n d G) per pivot with
// satellites; at a drift one recall of at most cap_s rows per satellite.
// Composition: score::last_query_attention{kernel 5, avg, GQA max} -> budget::inverse_stability
// -> top cap_h (cpu::topk_of) -> store::tiered retain / install, refreshed by
// trigger::drift_median through transfer::async (method/detail/tiered_lifecycle.hpp).
// Difference from the public code: a satellite's new prefill part is the pivot's top cap_s by
// score (the paper); the public code takes the earliest cap_s by position (METHODS.md).

#include <kvsift/attention/reference.hpp>
#include <kvsift/budget/inverse_stability.hpp>
#include <kvsift/calibrate/overlap.hpp>
#include <kvsift/calibrate/star_cluster.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/segmented_topk.hpp>
#include <kvsift/method/detail/tiered_lifecycle.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/score/context.hpp>
#include <kvsift/score/last_query_attention.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>
#include <kvsift/trigger/drift_median.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvsift {

// HeteroCache's own counters (method_stats has the transfer's bytes and stalls).
struct heterocache_stats {
  std::int64_t drift_checks = 0;  // pivot windows examined (one per pivot with satellites per check)
  std::int64_t drift_events = 0;  // of those, the ones that drifted (a retrieval was decided)
  std::int64_t rows_recalled = 0; // satellite rows the retrievals asked the host pool for
};

template <Element T>
class heterocache {
 public:
  using store_type = store::tiered<T>;
  using transfer_type = transfer::async<T>;
  using scorer = score::last_query_attention;
  using budgeter = budget::inverse_stability;
  using trigger = trigger::drift_median;
  using element_type = T;
  using role = calibrate::head_role;

  // One layer's roles, as calibration writes them (calibrate::heterocache_layer_roles has the
  // same fields; roles_from() adapts a whole roles file).
  struct layer_roles {
    std::vector<role> roles;           // [H]
    std::vector<std::int32_t> leader;  // [H] a satellite's pivot; a pivot itself; else -1 (or itself)
    std::vector<float> stability;      // [H] s_h
  };
  // Given budgets instead of inverse_stability's: base and cap [layers * kv_heads] (clamped to n).
  struct fixed_budget {
    int base = 0;
    std::vector<int> cap;
  };

  struct params {
    double tau_stable = 0.5;  // calibration's anchor threshold (recorded)
    double tau_sim = 0.5;     // calibration's similarity threshold (recorded)
    double tau_drift = 0.5;   // drift when the median overlap < tau_drift (METHODS.md: tau_stable)
    int drift_window = 5;     // W: drift checks after steps W, 2W, ...
    double rho = 0.5;         // resident share of the prefill KV (whole model)
    int kernel = 5;           // avg pooling of the last-query attention
    std::vector<layer_roles> roles;           // [layers] (calibration)
    std::optional<fixed_budget> fixed;        // replaces budget::inverse_stability when set
  };

  // Any roles file with `.layers[l].roles / .leader / .stability` (calibrate::heterocache_roles).
  template <class Roles>
  [[nodiscard]] static std::vector<layer_roles> roles_from(const Roles& file) {
    std::vector<layer_roles> out;
    for (const auto& l : file.layers) {
      layer_roles x;
      x.roles.assign(l.roles.begin(), l.roles.end());
      x.leader.assign(l.leader.begin(), l.leader.end());
      x.stability.assign(l.stability.begin(), l.stability.end());
      out.push_back(std::move(x));
    }
    return out;
  }

  static constexpr capabilities caps{
      .changes_physical_length = true,   // compressed heads' demoted rows leave the working set
      .safe_with_shared_prefix = false,  // retain/install rewrite a request's working set
      .needs_queries = true,             // the last prefill query and every decode query
      .cuda_graph_safe = false,
      .speculative_decoding = false,
  };

  // Validates params against a model shape without touching any store; throws kvsift::error
  // (infeasible roles name the layer, the count of full-KV heads and the rho that would work).
  static void can_implement(const model_shape& shape, const params& p) {
    constexpr std::string_view where = "heterocache";
    shape.validate(where);
    trigger{{.window = p.drift_window, .tau_drift = p.tau_drift}}.validate(where);
    scorer{{.kernel = p.kernel, .pool = pooling::avg, .gqa = gqa_reduce::max}}.validate(where);
    require(std::isfinite(p.rho) && p.rho >= 0.0 && p.rho <= 1.0, where, "rho", p.rho, "in [0, 1]");
    require(static_cast<int>(p.roles.size()) == shape.layers, where, "roles.size", p.roles.size(),
            "one layer_roles per layer (" + std::to_string(shape.layers) + ")");
    const auto H = static_cast<std::size_t>(shape.kv_heads);
    for (int l = 0; l < shape.layers; ++l) {
      const auto& x = p.roles[l];
      const std::string f = "roles[" + std::to_string(l) + "].";
      require(x.roles.size() == H, where, f + "roles.size", x.roles.size(),
              "kv_heads = " + std::to_string(H));
      require(x.leader.size() == H, where, f + "leader.size", x.leader.size(),
              "kv_heads = " + std::to_string(H));
      require(x.stability.size() == H, where, f + "stability.size", x.stability.size(),
              "kv_heads = " + std::to_string(H));
      for (int h = 0; h < shape.kv_heads; ++h) {
        const int code = static_cast<int>(x.roles[h]);
        require(code >= 0 && code <= 3, where, f + "roles[" + std::to_string(h) + "]", code,
                "0 anchor, 1 volatile, 2 pivot or 3 satellite");
        const int lead = x.leader[h];
        const std::string name = f + "leader[" + std::to_string(h) + "]";
        if (x.roles[h] == role::pivot) {
          require(lead == h, where, name, lead, "the pivot itself (" + std::to_string(h) + ")");
        } else if (x.roles[h] == role::satellite) {
          require(lead >= 0 && lead < shape.kv_heads && lead != h &&
                      x.roles[static_cast<std::size_t>(lead)] == role::pivot,
                  where, name, lead, "a pivot of the same layer");
        } else {
          require(lead == -1 || lead == h, where, name, lead, "-1 for an anchor or volatile head");
        }
      }
    }
    if (p.fixed) {
      const auto total = static_cast<std::size_t>(shape.layers) * H;
      require(p.fixed->cap.size() == total, where, "fixed.cap.size", p.fixed->cap.size(),
              "layers x kv_heads = " + std::to_string(total));
      require(p.fixed->base >= 0, where, "fixed.base", p.fixed->base, ">= 0");
      for (std::size_t i = 0; i < total; ++i) {
        require(p.fixed->cap[i] >= 0, where, "fixed.cap[" + std::to_string(i) + "]",
                p.fixed->cap[i], ">= 0");
      }
    } else {
      std::vector<role> r;
      std::vector<float> s;
      flatten(p, r, s);
      budget::check_inverse_stability(r, s, shape.kv_heads, p.rho, where);
    }
  }

  // The transfer is owned by the method (a worker thread); transfer_state() reaches it.
  explicit heterocache(store_type& store, params p = {})
      : store_(&store), p_(std::move(p)), xfer_(std::make_unique<transfer_type>()) {
    can_implement(store.shape(), p_);
    const auto& sh = store.shape();
    flatten(p_, roles_flat_, stability_flat_);
    const std::size_t rl = static_cast<std::size_t>(store.requests()) * sh.layers;
    state_.assign(rl, {});
    pending_ = pending_type(rl);
    layer_budgets_.assign(static_cast<std::size_t>(sh.layers), -1);
  }
  heterocache(heterocache&&) noexcept = default;
  ~heterocache() {
    if (xfer_) {
      for (std::size_t i = 0; i < state_.size(); ++i) pending_.cancel(*xfer_, i);
    }
  }

  [[nodiscard]] const params& parameters() const { return p_; }
  [[nodiscard]] store_type& store() { return *store_; }
  [[nodiscard]] const store_type& store() const { return *store_; }
  [[nodiscard]] transfer_type& transfer_state() { return *xfer_; }
  [[nodiscard]] const attention_plan& plan() const { return plan_; }

  // base and the caps of the whole model ([layers * kv_heads]) for a prompt of n tokens.
  [[nodiscard]] budget::heterocache_caps budget(int n) const {
    if (p_.fixed) {
      budget::heterocache_caps c;
      c.base = std::min(p_.fixed->base, n);
      for (const int x : p_.fixed->cap) c.cap.push_back(std::min(x, n));
      return c;
    }
    return budget::inverse_stability_caps(roles_flat_, stability_flat_, store_->shape().kv_heads, n,
                                          p_.rho);
  }
  // Decode steps of (request, layer) since its prompt ended (0 before).
  [[nodiscard]] int step(int request, int layer) const {
    return state_[checked_rl("heterocache.step", request, layer)].steps;
  }
  // Prompt end of (request, layer): positions below it are prefill tokens (-1 before its end).
  [[nodiscard]] std::int32_t prompt_end(int request, int layer) const {
    return state_[checked_rl("heterocache.prompt_end", request, layer)].prompt_end;
  }
  // The per-head state below exists once the prompt of (request, layer) ended, until reset():
  // before or after, and for a head out of range, they throw kvsift::error.
  // The base budget and head h's cap of (request, layer), for its prompt length.
  [[nodiscard]] int base(int request, int layer) const {
    return placed_state("heterocache.base", request, layer, 0).base;
  }
  [[nodiscard]] int cap(int request, int layer, int head) const {
    return placed_state("heterocache.cap", request, layer, head).cap[static_cast<std::size_t>(head)];
  }
  // A pivot's reference set (original positions, ascending; empty for other heads). A drift's new
  // reference becomes this one when the next decode() installed the satellites' retrieval (a
  // retrieval that fails leaves the previous reference, as the satellites keep their sets).
  [[nodiscard]] std::span<const std::int32_t> reference(int request, int layer, int head) const {
    return placed_state("heterocache.reference", request, layer, head).reference[static_cast<std::size_t>(head)];
  }
  // The last after_attention's drift check of (request, layer): per KV head (pivots with
  // satellites), the median overlap (-1 where no check ran) and whether it drifted.
  [[nodiscard]] double drift_median(int request, int layer, int head) const {
    return placed_state("heterocache.drift_median", request, layer, head).median[static_cast<std::size_t>(head)];
  }
  [[nodiscard]] bool drifted(int request, int layer, int head) const {
    return placed_state("heterocache.drifted", request, layer, head).drift[static_cast<std::size_t>(head)] != 0;
  }
  // Whether a retrieval is decided and not yet installed / not yet copied.
  [[nodiscard]] bool recall_pending(int request, int layer) const {
    return pending_.has(checked_rl("heterocache.recall_pending", request, layer));
  }
  [[nodiscard]] bool recall_in_flight(int request, int layer) const {
    return pending_.in_flight(*xfer_, checked_rl("heterocache.recall_in_flight", request, layer));
  }
  // Drift checks, drift events and recalled rows since construction.
  [[nodiscard]] const heterocache_stats& drift_stats() const { return hstats_; }

  // 1. Appends each chunk (the chunk marked `last` must carry at least the prompt's last query),
  // then places the KV of the requests whose prompt ended. Validates everything first.
  void prefill(int layer, std::span<const prefill_chunk<T>> chunks) {
    constexpr std::string_view where = "heterocache.prefill";
    check_layer(where, layer);
    const auto added = detail::check_prefill_chunks(
        *store_, layer, chunks, where, "HeteroCache",
        [&](int r) { return state_[rl(r, layer)].prompt_end < 0; });
    for (const auto& c : chunks) {  // the budgets of the prompts that end (throws before appending)
      if (c.last) (void)budget(store_->host_length(c.request, layer) + added[c.request]);
    }
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

  // 2. Installs the retrievals decided at the previous step (waiting for them if needed: a
  // stall), appends each request's token, remembers its query for the drift window and returns
  // the plan: every resident token of every head.
  const attention_plan& decode(int layer, std::span<const decode_token<T>> tokens) {
    constexpr std::string_view where = "heterocache.decode";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    for (const auto& t : tokens) check_request(where, t.request);
    require_distinct_requests(where, tokens, store_->requests());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto& t = tokens[i];
      require(t.key != nullptr && t.value != nullptr, where, "key/value", "null",
              "[kv_heads, d] arrays");
      require(t.query != nullptr, where, "query", "null",
              "a [q_heads, d] array (HeteroCache's drift check scores it)");
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
      pending_.complete(*xfer_, *store_, rl(t.request, layer), [&](decision d) { commit(st, d); });
    }
    const std::size_t row = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
    for (const auto& t : tokens) {
      store_->append(t.request, layer,
                     kv_view<const T, nhd>::contiguous(t.key, 1, sh.kv_heads, sh.head_dim),
                     kv_view<const T, nhd>::contiguous(t.value, 1, sh.kv_heads, sh.head_dim),
                     store_->next_position(t.request, layer));
      auto& st = state_[rl(t.request, layer)];
      // the drift window: the newest W queries, oldest first
      if (st.window_rows == p_.drift_window) {
        st.window.erase(st.window.begin(), st.window.begin() + static_cast<std::ptrdiff_t>(row));
        --st.window_rows;
      }
      st.window.insert(st.window.end(), t.query, t.query + row);
      ++st.window_rows;
      ++st.steps;
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
    binding_.check("heterocache.attend", layer, tokens, plan_.requests, true);
    detail::attend_over_plan(*store_, layer, tokens, plan_, out);
  }

  // 4. At t = W, 2W, ...: the drift check of each pivot with satellites; a drift submits the
  // satellites' retrieval now, installed by the next decode().
  void after_attention(int layer, std::span<const decode_token<T>> tokens) {
    constexpr std::string_view where = "heterocache.after_attention";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    binding_.check(where, layer, tokens, plan_.requests, false);  // once per decode()
    binding_.unbind();
    const trigger trig{{.window = p_.drift_window, .tau_drift = p_.tau_drift}};
    const auto& roles = p_.roles[layer];
    std::vector<int> pivots;  // pivots with satellites
    for (int h = 0; h < sh.kv_heads; ++h) {
      if (roles.roles[h] != role::pivot) continue;
      for (int s = 0; s < sh.kv_heads; ++s) {
        if (roles.roles[s] == role::satellite && roles.leader[s] == h) {
          pivots.push_back(h);
          break;
        }
      }
    }
    for (const auto& t : tokens) {
      auto& st = state_[rl(t.request, layer)];
      std::fill(st.median.begin(), st.median.end(), -1.0);
      std::fill(st.drift.begin(), st.drift.end(), 0);
      const trigger_context ctx{lifecycle_event::decode_step, st.steps, 0, 0, 0};
      if (pivots.empty() || !trig.fires(ctx)) continue;
      check_window(t.request, layer);
    }
  }
  void after_attention(int layer, const decode_token<T>& token) {
    after_attention(layer, std::span<const decode_token<T>>(&token, 1));
  }

  // Ends a request: cancels its retrievals, drops its tokens from both tiers and its state.
  void reset(int request) {
    check_request("heterocache.reset", request);
    for (int l = 0; l < store_->shape().layers; ++l) {
      pending_.cancel(*xfer_, rl(request, l));
      state_[rl(request, l)] = {};
    }
    store_->reset(request);
    binding_.unbind();  // a pending step may have included the request
  }

  // 5. Working-set bytes and tokens, bytes the transfer recalled, drift events (refreshes), stalls
  // (decode steps that waited for a recall), per-layer base budget (-1 before any prefill).
  [[nodiscard]] method_stats stats() const {
    method_stats s;
    s.resident_bytes = store_->resident_bytes();
    s.resident_tokens = store_->resident_tokens();
    const auto xs = xfer_->stats();
    s.bytes_transferred = xs.bytes_moved;
    s.refreshes = hstats_.drift_events;
    s.stalls = xs.stalls;
    s.layer_budgets = layer_budgets_;
    return s;
  }

 private:
  struct request_state {
    std::int32_t prompt_end = -1;  // positions below it are the prompt; -1 before its end
    int prompt_first = 0;          // slot count of the prompt in a full head (= n)
    int steps = 0;
    int base = 0;
    std::vector<int> cap;                              // [H]
    std::vector<std::vector<std::int32_t>> reference;  // [H] pivots with satellites: positions
    std::vector<double> median;                        // [H] last check, -1 where none ran
    std::vector<int> drift;                            // [H] last check drifted
    std::vector<float> window;                         // [window_rows, q_heads, d] oldest first
    int window_rows = 0;
  };

  // A drift's outcome: (pivot, new reference set), committed once the retrieval is installed.
  using decision = std::vector<std::pair<int, std::vector<std::int32_t>>>;
  using pending_type = detail::pending_recalls<T, decision>;
  static void commit(request_state& st, decision& d) {
    for (auto& [h, ref] : d) st.reference[static_cast<std::size_t>(h)] = std::move(ref);
  }

  static void flatten(const params& p, std::vector<role>& r, std::vector<float>& s) {
    r.clear();
    s.clear();
    for (const auto& l : p.roles) {
      r.insert(r.end(), l.roles.begin(), l.roles.end());
      s.insert(s.end(), l.stability.begin(), l.stability.end());
    }
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
  // The state of (request, layer) once its prompt was placed, with `head` a KV head.
  [[nodiscard]] const request_state& placed_state(std::string_view where, int request, int layer, int head) const {
    const auto& st = state_[checked_rl(where, request, layer)];
    require(st.prompt_end >= 0, where, "request", request,
            "a request whose prompt ended on this layer (its per-head state exists from then until reset())");
    require(head >= 0 && head < store_->shape().kv_heads, where, "head", head,
            [&] { return "a KV head in [0, " + std::to_string(store_->shape().kv_heads) + ")"; });
    return st;
  }

  // Scores of one query of the pivot's group over the prefill keys of a full (pivot) head:
  // per query head the softmax over the n prompt tokens, avg-pooled, then the max over the group.
  void prefill_scores(std::int64_t seq, const float* q, std::int32_t last_prompt_position, int n,
                      std::vector<float>& out) const {
    const auto& sh = store_->shape();
    const int G = sh.group_size();
    const int h = static_cast<int>(seq % sh.kv_heads);
    std::vector<float> rows(static_cast<std::size_t>(G) * n, 0.0f);
    std::vector<float> probs(static_cast<std::size_t>(store_->length(seq)));
    for (int g = 0; g < G; ++g) {
      const int v = cpu::attention_row(*store_, seq, q + static_cast<std::size_t>(h * G + g) * sh.head_dim,
                                       last_prompt_position, probs);
      std::span<float> row(rows.data() + static_cast<std::size_t>(g) * n, static_cast<std::size_t>(n));
      cpu::pool1d(std::span<const float>(probs.data(), static_cast<std::size_t>(std::min(v, n))), row,
                  p_.kernel, pooling::avg);
    }
    out.assign(static_cast<std::size_t>(n), 0.0f);
    cpu::reduce_group(rows, G, out, gqa_reduce::max);
  }

  // Top k of a full head's first n slots, as original positions (ascending).
  std::vector<std::int32_t> top_positions(std::int64_t seq, std::span<const float> scores, int k) const {
    std::vector<std::int32_t> cand(scores.size()), picked;
    std::iota(cand.begin(), cand.end(), 0);
    cpu::topk_of(scores, cand, k, picked);
    for (auto& x : picked) x = store_->position(seq, x);
    return picked;
  }

  // The end of the prompt: budgets, last-query scores, per-head placement (retain), references.
  void place_prompt(int layer, const std::vector<int>& ended,
                    const std::vector<kv_view<const float, nhd>>& queries,
                    const std::vector<std::int32_t>& qpos) {
    const auto& sh = store_->shape();
    const auto& roles = p_.roles[layer];
    const auto H = static_cast<std::size_t>(sh.kv_heads);
    std::vector<budget::heterocache_caps> budgets;
    for (const int r : ended) budgets.push_back(budget(store_->host_length(r, layer)));  // may throw
    const scorer sc{{.kernel = p_.kernel, .pool = pooling::avg, .gqa = gqa_reduce::max}};
    score_input<store_type> in{store_, layer, lifecycle_event::prefill_end, ended, queries, qpos, {}};
    sc.score(in, scores_);
    for (std::size_t i = 0; i < ended.size(); ++i) {
      const int r = ended[i];
      const int n = store_->host_length(r, layer);
      auto& st = state_[rl(r, layer)];
      st = {};
      st.prompt_end = store_->next_position(r, layer);
      st.prompt_first = n;
      st.base = budgets[i].base;
      st.cap.assign(budgets[i].cap.begin() + static_cast<std::ptrdiff_t>(layer * H),
                    budgets[i].cap.begin() + static_cast<std::ptrdiff_t>((layer + 1) * H));
      st.reference.assign(H, {});
      st.median.assign(H, -1.0);
      st.drift.assign(H, 0);
      layer_budgets_[layer] = st.base;
      index_sets kept;
      std::vector<std::int32_t> picked, all(static_cast<std::size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      for (int h = 0; h < sh.kv_heads; ++h) {
        const int s = static_cast<int>(i) * sh.kv_heads + h;
        const auto seq = sh.sequence(r, layer, h);
        const auto sc_h = scores_[s];
        if (budget::full_kv(roles.roles[h])) {
          kept.push_back(all);
          if (roles.roles[h] == role::pivot) st.reference[h] = top_positions(seq, sc_h, st.base);
        } else {
          cpu::topk_of(sc_h, all, std::min(n, st.cap[h]), picked);
          kept.push_back(picked);
        }
      }
      store_->retain(r, layer, kept);
    }
  }

  // One request's drift check: every pivot with satellites, W queries, median, retrieval.
  void check_window(int r, int layer) {
    const auto& sh = store_->shape();
    const auto& roles = p_.roles[layer];
    auto& st = state_[rl(r, layer)];
    const trigger trig{{.window = p_.drift_window, .tau_drift = p_.tau_drift}};
    const std::size_t row = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
    const int n = st.prompt_first;
    std::vector<typename pending_type::target> targets;
    decision next;  // the new references, committed once the satellites' rows are installed
    std::vector<float> scores;
    std::vector<double> overlaps;
    for (int h = 0; h < sh.kv_heads; ++h) {
      if (roles.roles[h] != role::pivot) continue;
      std::vector<int> sats;
      for (int s = 0; s < sh.kv_heads; ++s) {
        if (roles.roles[s] == role::satellite && roles.leader[s] == h) sats.push_back(s);
      }
      if (sats.empty()) continue;
      const auto seq = sh.sequence(r, layer, h);
      overlaps.clear();
      std::vector<std::int32_t> newest;
      for (int w = 0; w < st.window_rows; ++w) {
        prefill_scores(seq, st.window.data() + w * row, st.prompt_end - 1, n, scores);
        auto set = top_positions(seq, scores, st.base);
        overlaps.push_back(calibrate::overlap(set, st.reference[h]));
        if (w + 1 == st.window_rows) newest = std::move(set);
      }
      const auto d = trig.decide(overlaps);
      ++hstats_.drift_checks;
      st.median[h] = d.median;
      if (!d.drift) continue;
      st.drift[h] = 1;
      ++hstats_.drift_events;
      next.emplace_back(h, std::move(newest));
      // `scores` holds q_t's (the newest query's) pivot scores
      for (const int s : sats) {
        auto part = top_positions(seq, scores, std::min(n, st.cap[s]));
        targets.push_back({sh.sequence(r, layer, s), std::move(part), st.prompt_end});
      }
    }
    if (targets.empty()) return;
    pending_.submit(*xfer_, *store_, rl(r, layer), std::move(targets), std::move(next),
                    [&](decision d) { commit(st, d); });
    hstats_.rows_recalled += pending_.rows(rl(r, layer));
  }

  store_type* store_;
  params p_;
  std::unique_ptr<transfer_type> xfer_;
  std::vector<role> roles_flat_;       // [layers * kv_heads]
  std::vector<float> stability_flat_;  // [layers * kv_heads]
  std::vector<request_state> state_;   // [requests * layers]
  pending_type pending_;
  step_binding binding_;  // attend / after_attention: the step of the last decode()
  std::vector<int> layer_budgets_;
  heterocache_stats hstats_;
  score_sets scores_;
  attention_plan plan_;
};

}  // namespace kvsift
