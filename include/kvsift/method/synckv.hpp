// SPDX-License-Identifier: Apache-2.0
#pragma once

// synckv — SyncKV (Zhou et al., 2025; METHODS.md "SyncKV", SPEC method.synckv.decode). A recipe
// over the shell (method/method.hpp), two tiers:
//   store::tiered<T>            host pool = every token; working set = R-heads' whole KV,
//                               followers' static ∪ dynamic ∪ decode tokens
//   score::last_query_attention kernel 1, GQA max: the prompt's last query; q_t when anticipating
//   roles::clusters             R-heads full; followers share their representative's sets
//                               (select::static_dynamic under budget::synckv, shared by
//                               select::shared_by_cluster); an anticipation re-ranks the prefill
//                               tokens outside the static set
//   trigger::stride             anticipation at steps m, 2m, ...
//   schedule::deferred_recall   decide after step t, recall through transfer::async, install at
//                               step t+1 (a stall when the copy is not done)
// Parameters (paper defaults): clusters N_r = 2, stride m = 5, rho = 0.5, memory_fraction M = 0.3
// (device-resident share of the prefill KV), roles (one cluster_roles per layer, N_r clusters
// each). Resident KV after prefill: N_R n + (N - N_R) k <= M N n tokens. Cost per step: the
// attention over the plan; at an anticipation O((n + t) d G) per R-head with followers plus one
// recall of at most k_dyn rows per follower.

#include <kvsift/budget/synckv.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/method/schedule/deferred_recall.hpp>
#include <kvsift/roles/clusters.hpp>
#include <kvsift/score/last_query_attention.hpp>
#include <kvsift/select/static_dynamic.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/trigger/basic.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvsift {

struct synckv_recipe {
  using scorer = kvsift::score::last_query_attention;
  using selector = kvsift::select::static_dynamic;
  using budgeter = kvsift::budget::synckv;
  using trigger = kvsift::trigger::stride;
  using roles = kvsift::roles::clusters;
  using schedule = kvsift::schedule::deferred_recall;
  using roles_type = select::cluster_roles;
  static constexpr std::string_view name = "synckv";
  static constexpr std::string_view paper = "SyncKV";

  struct params {
    int clusters = 2;               // N_r: clusters (and representatives) per layer
    int stride = 5;                 // m: anticipation at steps m, 2m, ...
    double rho = 0.5;               // static share of a follower's budget
    double memory_fraction = 0.3;   // M: device-resident share of the prefill KV
    std::vector<roles_type> roles;  // [layers] head roles (calibration); N_r clusters each
    far_tier far = far_tier::recall;  // host-pool rows a step needs: recalled, or attended there
  };
  struct parts {
    kvsift::score::last_query_attention scorer;
    kvsift::select::static_dynamic selector;
    kvsift::budget::synckv budgeter;
    kvsift::trigger::stride trigger;
    kvsift::roles::clusters roles;
  };
  static parts make_parts(const params& p) {
    roles r{{p.roles, p.rho, p.memory_fraction}};
    return {scorer{{.kernel = 1, .pool = pooling::avg, .gqa = gqa_reduce::max}},
            selector{{.rho = p.rho}}, r.budgeter(), trigger{{.m = p.stride}}, std::move(r)};
  }

  // Validates params against a model shape without touching any store; throws kvsift::error
  // (k < 0 names the smallest memory fraction that works).
  static void can_implement(const model_shape& shape, const params& p) {
    shape.validate(name);
    require(p.clusters > 0 && p.clusters <= shape.kv_heads, name, "clusters", p.clusters,
            "in [1, kv_heads = " + std::to_string(shape.kv_heads) + "]");
    trigger{{.m = p.stride}}.validate(name);
    selector{{.rho = p.rho}}.validate(name);
    require(static_cast<int>(p.roles.size()) == shape.layers, name, "roles.size", p.roles.size(),
            "one cluster_roles per layer (" + std::to_string(shape.layers) + ")");
    for (int l = 0; l < shape.layers; ++l) {
      p.roles[l].validate("synckv: roles[" + std::to_string(l) + "]", shape.kv_heads);
      require(p.roles[l].clusters() == p.clusters, name,
              "roles[" + std::to_string(l) + "].representatives.size", p.roles[l].clusters(),
              "clusters = " + std::to_string(p.clusters) + " (a roles file for this N_r)");
    }
    const roles r{{p.roles, p.rho, p.memory_fraction}};
    if (r.followers() > 0) (void)r.budgeter().split(1);  // k < 0 is an error now
  }

  // SyncKV's own accessors on the method.
  template <class M>
  struct interface {
    // The follower budget of the whole model for a prompt of n tokens.
    [[nodiscard]] budget::synckv_split split(int n) const {
      return self().parts().budgeter.split(n);
    }
    // Prompt length of (request, layer): positions below it are prefill tokens (-1 before).
    [[nodiscard]] std::int32_t prompt_end(int request, int layer) const {
      return at("synckv.prompt_end", request, layer).prompt_end;
    }
    // Whether the last after_attention of (request, layer) anticipated.
    [[nodiscard]] bool anticipated(int request, int layer) const {
      return at("synckv.anticipated", request, layer).roles.anticipated;
    }
    // Whether an anticipation's recall is decided and not yet installed / not yet copied.
    [[nodiscard]] bool recall_pending(int request, int layer) const {
      return self().schedule_state().recall_pending(slot("synckv.recall_pending", request, layer));
    }
    [[nodiscard]] bool recall_in_flight(int request, int layer) const {
      return self().schedule_state().recall_in_flight(slot("synckv.recall_in_flight", request, layer));
    }
    // Cluster c's static / dynamic set (original positions, ascending) as its followers hold
    // them: an anticipation's dynamic set shows once the next decode() installed its recall.
    // Only after the prompt ended (kvsift::error before, and after reset()).
    [[nodiscard]] std::span<const std::int32_t> static_set(int request, int layer, int c) const {
      return placed("synckv.static_set", request, layer, c).static_pos[c];
    }
    [[nodiscard]] std::span<const std::int32_t> dynamic_set(int request, int layer, int c) const {
      return placed("synckv.dynamic_set", request, layer, c).dynamic_pos[c];
    }

   private:
    const M& self() const { return static_cast<const M&>(*this); }
    std::size_t slot(std::string_view where, int r, int l) const {
      return self().checked_slot(where, r, l);
    }
    const auto& at(std::string_view where, int r, int l) const {
      return self().schedule_state().at(slot(where, r, l));
    }
    const auto& placed(std::string_view where, int request, int layer, int c) const {
      const auto& st = at(where, request, layer);
      require(st.prompt_end >= 0, where, "request", request,
              "a request whose prompt ended on this layer (its sets exist from then until reset())");
      require(c >= 0 && c < static_cast<int>(st.roles.static_pos.size()), where, "c", c,
              [&] { return "a cluster in [0, " + std::to_string(st.roles.static_pos.size()) + ")"; });
      return st.roles;
    }
  };
};

// The method over the default two-tier store in E's memory (store::tiered<T> on exec::host,
// thrust::tiered_store<T, E> on a device exec with <kvsift/device/all.hpp>): one spelling for
// every exec.
template <Element T, Exec E = exec::host>
using synckv = method<default_tiered_store_t<T, E>, synckv_recipe, E>;

// Per-layer cluster roles from a head-roles file (calibrate::synckv_roles, or any type whose
// `layers[l]` has `assign` and `representatives`), for synckv<T>::params::roles.
template <class Roles>
std::vector<select::cluster_roles> synckv_roles_of(const Roles& roles) {
  return kvsift::roles::clusters::from_file(roles);
}

}  // namespace kvsift
