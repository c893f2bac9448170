// SPDX-License-Identifier: Apache-2.0
#pragma once

// roles::clusters — SyncKV's head roles (METHODS.md "SyncKV"): per layer the KV heads form
// clusters, each with one representative (R-head) that keeps its whole KV; the other members
// (followers) hold their representative's static ∪ dynamic sets.
//
//   place     the R-heads' last-query scores under the follower budget k (budget::synckv over the
//             whole model): static = top floor(rho k), dynamic = ranks floor(rho k) .. k-1
//             (select::static_dynamic), shared by the cluster (select::shared_by_cluster).
//   refresh   (an anticipation, when trigger::stride fires) each R-head with followers ranks the
//             PREFILL tokens outside its static set by this step's scores; the top k_dyn become
//             the cluster's dynamic set (the decision); its followers' new prefill part is
//             static ∪ dynamic.
// Parameters: the roles (one cluster_roles per layer), rho, memory_fraction M.

#include <kvsift/budget/synckv.hpp>
#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/roles/context.hpp>
#include <kvsift/select/shared_by_cluster.hpp>
#include <kvsift/select/static_dynamic.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsift::roles {

struct clusters {
  struct params {
    std::vector<select::cluster_roles> layers;  // [layers]
    double rho = 0.5;
    double memory_fraction = 0.3;
  };
  struct slot_state {  // per (request, layer)
    budget::synckv_split split{};
    bool anticipated = false;  // the last after_attention anticipated
    std::vector<std::vector<std::int32_t>> static_pos, dynamic_pos;  // [clusters] positions
  };
  // An anticipation's outcome, per cluster with followers: (cluster, new dynamic set).
  using decision = std::vector<std::pair<int, std::vector<std::int32_t>>>;
  static constexpr bool scores_step = true;  // refresh reads the scorer's scores of q_t

  params p;

  // Per-layer cluster roles from a roles file (any type whose `layers[l]` has `assign` and
  // `representatives`: calibrate::synckv_roles).
  template <class Roles>
  [[nodiscard]] static std::vector<select::cluster_roles> from_file(const Roles& file) {
    std::vector<select::cluster_roles> out;
    for (const auto& l : file.layers) {
      out.push_back({std::vector<int>(l.assign.begin(), l.assign.end()),
                     std::vector<int>(l.representatives.begin(), l.representatives.end())});
    }
    return out;
  }
  // N = every KV head of the model, N_R = every representative.
  [[nodiscard]] budget::synckv budgeter() const {
    int heads = 0, reps = 0;
    for (const auto& r : p.layers) {
      heads += r.kv_heads();
      reps += r.clusters();
    }
    return budget::synckv{{.heads = heads, .representatives = reps,
                           .memory_fraction = p.memory_fraction, .rho = p.rho}};
  }
  [[nodiscard]] int followers() const {
    int f = 0;
    for (const auto& r : p.layers) {
      for (int h = 0; h < r.kv_heads(); ++h) f += r.is_representative(h) ? 0 : 1;
    }
    return f;
  }
  template <class Trigger>
  [[nodiscard]] int query_window(const Trigger&) const { return 0; }  // no past queries
  [[nodiscard]] bool places() const { return followers() > 0; }  // all R-heads: nothing to place
  void check_prompt(std::string_view, int, const budget::synckv&) const {}
  void start(slot_state& s, int layer) const {
    s.anticipated = false;
    s.static_pos.assign(static_cast<std::size_t>(p.layers[layer].clusters()), {});
    s.dynamic_pos.assign(static_cast<std::size_t>(p.layers[layer].clusters()), {});
  }

  // Every head holds the whole prompt, so a slot means the same token in every head. R-heads
  // split their own scores under k (followers score nothing: 0), every follower takes its
  // representative's sets. kept[i]: the working set of ended[i]'s heads.
  template <class Store>
  void place(const Store& st, const select::static_dynamic& sel, const budget::synckv& b, int layer,
             std::span<const int> ended, const score_sets& scores,
             std::span<slot_state* const> states, std::vector<int>& layer_budgets,
             std::vector<index_sets>& kept) const {
    const auto& sh = st.shape();
    const auto& roles = p.layers[layer];
    std::vector<int> budgets;
    for (std::size_t i = 0; i < ended.size(); ++i) {
      states[i]->split = b.split(st.host_length(ended[i], layer));
      layer_budgets[layer] = states[i]->split.k;
      for (int h = 0; h < sh.kv_heads; ++h) {
        budgets.push_back(roles.is_representative(h) ? states[i]->split.k : 0);
      }
    }
    index_sets own_static, own_dynamic, st_sets, dyn_sets;
    sel.split(scores, budgets, own_static, own_dynamic);
    select::shared_by_cluster<>::share(roles, own_static, st_sets);
    select::shared_by_cluster<>::share(roles, own_dynamic, dyn_sets);
    kept.assign(ended.size(), {});
    std::vector<std::int32_t> all, both;
    for (std::size_t i = 0; i < ended.size(); ++i) {
      auto& s = *states[i];
      for (int h = 0; h < sh.kv_heads; ++h) {
        const int seg = static_cast<int>(i) * sh.kv_heads + h;
        const auto seq = sh.sequence(ended[i], layer, h);
        if (roles.is_representative(h)) {
          all.resize(static_cast<std::size_t>(st.length(seq)));
          std::iota(all.begin(), all.end(), 0);
          kept[i].push_back(all);
          const int c = roles.assign[h];
          for (const auto slot : st_sets[seg]) s.static_pos[c].push_back(st.position(seq, slot));
          for (const auto slot : dyn_sets[seg]) s.dynamic_pos[c].push_back(st.position(seq, slot));
        } else {
          both.clear();
          std::merge(st_sets[seg].begin(), st_sets[seg].end(), dyn_sets[seg].begin(),
                     dyn_sets[seg].end(), std::back_inserter(both));
          kept[i].push_back(both);
        }
      }
    }
  }

  // The shape of a layer's anticipation, derived here once for every exec: one segment per
  // cluster with followers (in cluster order: its cluster and representative), and the layer's
  // followers (ascending) with the segment of each one's cluster.
  struct layer_segments {
    std::vector<int> clusters, representatives;  // [segments]
    std::vector<int> followers, segment;         // [followers]
  };
  [[nodiscard]] layer_segments segments(int layer) const {
    const auto& r = p.layers[layer];
    layer_segments out;
    std::vector<int> seg_of(static_cast<std::size_t>(r.clusters()), -1);
    for (int c = 0; c < r.clusters(); ++c) {
      if (r.followers(c) == 0) continue;
      seg_of[c] = static_cast<int>(out.clusters.size());
      out.clusters.push_back(c);
      out.representatives.push_back(r.representatives[c]);
    }
    for (int h = 0; h < r.kv_heads(); ++h) {
      if (r.is_representative(h)) continue;
      out.followers.push_back(h);
      out.segment.push_back(seg_of[r.assign[h]]);
    }
    return out;
  }

  void begin_step(slot_state& s) const { s.anticipated = false; }
  // segments(layer) has a segment (checked every decode step: allocates nothing)
  [[nodiscard]] bool refreshes(int layer) const {
    const auto& r = p.layers[layer];
    for (int c = 0; c < r.clusters(); ++c) {
      if (r.followers(c) > 0) return true;
    }
    return false;
  }
  // An anticipation of every firing request: emit(i, proposal) per request, in order.
  template <class Store, class Trigger, class Emit>
  void refresh(const Store& st, const Trigger&, const refresh_input& in,
               std::span<slot_state* const> states, Emit&& emit) const {
    const auto& sh = st.shape();
    const auto lay = segments(in.layer);
    const auto S = lay.clusters.size();
    score_sets rep_scores;  // per firing request: one segment per cluster with followers
    index_sets rep_static;
    std::vector<int> limits, k_dyn;
    for (std::size_t i = 0; i < in.requests.size(); ++i) {
      const auto& s = *states[i];
      for (std::size_t g = 0; g < S; ++g) {
        const int c = lay.clusters[g];
        const int rep = lay.representatives[g];
        const auto seq = sh.sequence(in.requests[i], in.layer, rep);
        rep_scores.push_back((*in.scores)[static_cast<int>(i) * sh.kv_heads + rep]);
        std::vector<std::int32_t> slots;
        for (const auto pos : s.static_pos[c]) slots.push_back(st.slot_of(seq, pos));
        rep_static.push_back(slots);
        limits.push_back(cpu::visible_slots(st, seq, in.prompt_end[i] - 1));
        k_dyn.push_back(s.split.k_dynamic);
      }
    }
    index_sets rep_dynamic;
    select::static_dynamic{{.rho = p.rho}}.refresh(rep_scores, rep_static, limits, k_dyn, rep_dynamic);
    int seg = 0;
    for (std::size_t i = 0; i < in.requests.size(); ++i) {
      const int r = in.requests[i];
      const auto& s = *states[i];
      proposal<decision> out;
      for (std::size_t g = 0; g < S; ++g) {
        const int c = lay.clusters[g];
        const auto rep_seq = sh.sequence(r, in.layer, lay.representatives[g]);
        auto& dyn = out.decision.emplace_back(c, std::vector<std::int32_t>{}).second;
        for (const auto slot : rep_dynamic[seg]) dyn.push_back(st.position(rep_seq, slot));
        ++seg;
        std::vector<std::int32_t> part;
        std::set_union(s.static_pos[c].begin(), s.static_pos[c].end(), dyn.begin(), dyn.end(),
                       std::back_inserter(part));
        for (std::size_t f = 0; f < lay.followers.size(); ++f) {
          if (lay.segment[f] != static_cast<int>(g)) continue;
          out.parts.emplace_back(sh.sequence(r, in.layer, lay.followers[f]), part);
        }
      }
      emit(i, std::move(out));
    }
  }
  // After a refresh's recall was submitted: the anticipation counts.
  static int submitted(slot_state& s) {
    s.anticipated = true;
    return 1;
  }
  static void commit(slot_state& s, decision&& d) {
    for (auto& [c, dyn] : d) s.dynamic_pos[c] = std::move(dyn);
  }
};

}  // namespace kvsift::roles
