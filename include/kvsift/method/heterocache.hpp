// SPDX-License-Identifier: Apache-2.0
#pragma once

// heterocache — HeteroCache (METHODS.md "HeteroCache", SPEC method.heterocache.prefill /
// method.heterocache.decode). A recipe over the shell (method/method.hpp), two tiers:
//   store::tiered<T>            host pool = every token; working set = volatile and pivot heads'
//                               whole KV, anchors' and satellites' caps, decode tokens
//   score::last_query_attention kernel 5 (avg), GQA max: the prompt's last query
//   roles::stars                volatile / pivot heads full; anchors their own top cap_h,
//                               satellites their pivot's top cap_s (budget::inverse_stability or
//                               fixed caps; anchors through select::topk); pivots keep a
//                               reference set
//   trigger::drift_median       a check at steps W, 2W, ...; per pivot the data trigger
//                               trigger::drift_probe (median overlap < tau_drift)
//   schedule::deferred_recall   decide after step t, recall through transfer::async, install at
//                               step t+1 (a stall when the copy is not done)
// Parameters: see params (METHODS.md defaults). Resident KV after prefill: F n + sum(cap) <=
// rho N n (F volatile + pivot heads). Cost: at a drift check O(W n d G) per pivot with
// satellites; at a drift one recall of <= cap_s rows per satellite.

#include <kvsift/budget/inverse_stability.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/method/schedule/deferred_recall.hpp>
#include <kvsift/roles/stars.hpp>
#include <kvsift/score/last_query_attention.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/trigger/drift_median.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kvsift {

struct heterocache_stats {  // HeteroCache's own counters (method_stats: bytes, stalls)
  std::int64_t drift_checks = 0;   // pivot windows examined (per pivot with satellites, per check)
  std::int64_t drift_events = 0;   // of those, the ones that drifted (a retrieval was decided)
  std::int64_t rows_recalled = 0;  // satellite rows the retrievals asked the host pool for
};

struct heterocache_recipe {
  using scorer = kvsift::score::last_query_attention;
  using selector = kvsift::select::topk;  // the capped heads' prefill selection (roles::stars)
  using budgeter = kvsift::budget::inverse_stability;
  using trigger = kvsift::trigger::drift_median;
  using roles = kvsift::roles::stars;
  using schedule = kvsift::schedule::deferred_recall;
  static constexpr std::string_view name = "heterocache";
  static constexpr std::string_view paper = "HeteroCache";
  using layer_roles = kvsift::roles::stars::layer_roles;
  using fixed_budget = kvsift::roles::stars::fixed_budget;
  struct params {
    double tau_stable = 0.5;  // calibration's anchor threshold (recorded)
    double tau_sim = 0.5;     // calibration's similarity threshold (recorded)
    double tau_drift = 0.5;   // drift when the median overlap < tau_drift (METHODS.md: tau_stable)
    int drift_window = 5;     // W: drift checks after steps W, 2W, ...
    double rho = 0.5;         // resident share of the prefill KV (whole model)
    int kernel = 5;           // avg pooling of the last-query attention
    std::vector<layer_roles> roles;     // [layers] (calibration)
    std::optional<fixed_budget> fixed;  // replaces budget::inverse_stability when set
    far_tier far = far_tier::recall;  // host-pool rows a step needs: recalled, or attended there
  };
  struct parts {
    kvsift::score::last_query_attention scorer;
    kvsift::select::topk selector;
    kvsift::budget::inverse_stability budgeter;
    kvsift::trigger::drift_median trigger;
    kvsift::roles::stars roles;
  };
  static parts make_parts(const params& p) {
    roles r{{p.roles, p.rho, p.kernel}};
    budgeter b = r.budgeter(p.fixed);
    return {scorer{{.kernel = p.kernel, .pool = pooling::avg, .gqa = gqa_reduce::max}},
            selector{}, std::move(b), trigger{{.window = p.drift_window, .tau_drift = p.tau_drift}},
            std::move(r)};
  }
  // Validates params against a model shape without touching any store; throws kvsift::error
  // (infeasible roles name the layer, the count of full-KV heads and the rho that would work).
  static void can_implement(const model_shape& shape, const params& p) {
    shape.validate(name);
    trigger{{.window = p.drift_window, .tau_drift = p.tau_drift}}.validate(name);
    scorer{{.kernel = p.kernel, .pool = pooling::avg, .gqa = gqa_reduce::max}}.validate(name);
    require(std::isfinite(p.rho) && p.rho >= 0.0 && p.rho <= 1.0, name, "rho", p.rho, "in [0, 1]");
    roles::check(shape, p.roles, p.fixed, p.rho, name);
  }
  // HeteroCache's own accessors on the method (per-head state: once the prompt of (request,
  // layer) ended, until reset(); kvsift::error before, after and for a head out of range).
  template <class M>
  struct interface {
    using role = calibrate::head_role;
    using layer_roles = heterocache_recipe::layer_roles;
    using fixed_budget = heterocache_recipe::fixed_budget;
    template <class Roles>  // a roles file (calibrate::heterocache_roles) -> params::roles
    [[nodiscard]] static auto roles_from(const Roles& file) { return roles::from_file(file); }
    [[nodiscard]] auto budget(int n) const {  // base, caps: the recipe's budgeter
      return self().parts().budgeter.caps(self().store().shape().kv_heads, n);
    }
    [[nodiscard]] std::int32_t prompt_end(int request, int layer) const {
      return at("heterocache.prompt_end", request, layer).prompt_end;
    }
    [[nodiscard]] int base(int r, int l) const { return placed("heterocache.base", r, l, 0).base; }
    [[nodiscard]] int cap(int r, int l, int h) const { return placed("heterocache.cap", r, l, h).cap[h]; }
    // A pivot's reference set (original positions, ascending; empty for other heads); a drift's
    // new reference shows once the next decode() installed the satellites' retrieval.
    [[nodiscard]] std::span<const std::int32_t> reference(int r, int l, int h) const {
      return placed("heterocache.reference", r, l, h).reference[h];
    }
    // The last after_attention's check per KV head: median overlap (-1 where none ran), drift.
    [[nodiscard]] double drift_median(int r, int l, int h) const {
      return placed("heterocache.drift_median", r, l, h).median[h];
    }
    [[nodiscard]] bool drifted(int r, int l, int h) const {
      return placed("heterocache.drifted", r, l, h).drift[h] != 0;
    }
    [[nodiscard]] bool recall_pending(int r, int l) const {
      return state().recall_pending(slot("heterocache.recall_pending", r, l));
    }
    [[nodiscard]] bool recall_in_flight(int r, int l) const {
      return state().recall_in_flight(slot("heterocache.recall_in_flight", r, l));
    }
    [[nodiscard]] heterocache_stats drift_stats() const {  // since construction
      return {state().checks(), state().refreshes(), state().rows_recalled()};
    }

   private:
    const M& self() const { return static_cast<const M&>(*this); }
    const auto& state() const { return self().schedule_state(); }
    std::size_t slot(std::string_view where, int r, int l) const {
      return self().checked_slot(where, r, l);
    }
    const auto& at(std::string_view where, int r, int l) const {
      return state().at(slot(where, r, l));
    }
    const auto& placed(std::string_view where, int request, int layer, int head) const {
      const auto& st = at(where, request, layer);
      const int H = self().store().shape().kv_heads;
      require(st.prompt_end >= 0, where, "request", request, "a request whose prompt ended on this "
              "layer (its per-head state exists from then until reset())");
      require(head >= 0 && head < H, where, "head", head,
              [&] { return "a KV head in [0, " + std::to_string(H) + ")"; });
      return st.roles;
    }
  };
};

// The method over the default two-tier store in E's memory (store::tiered<T> on exec::host,
// thrust::tiered_store<T, E> on a device exec with <kvsift/device/all.hpp>): one spelling for
// every exec.
template <Element T, Exec E = exec::host>
using heterocache = method<default_tiered_store_t<T, E>, heterocache_recipe, E>;

}  // namespace kvsift
