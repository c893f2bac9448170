// SPDX-License-Identifier: Apache-2.0
#pragma once

// select::shared_by_cluster — indices chosen by a cluster's representative head, shared by its
// followers (SyncKV's R-heads, Zhou et al., 2025; HeteroCache's pivots and satellites).
//
// Head roles of one layer come from calibration (the head-roles file): `assign[h]` is KV head h's
// cluster, `representatives[c]` cluster c's representative (R-head), itself a member of c.
// Every other member of c is a follower. The selector runs an inner selector (default
// static_dynamic, i.e. SyncKV's top-k) on each representative's scores and gives the result to
// every follower of its cluster; a representative keeps everything (R-heads keep full KV).
// Indices are those of the representative's segment: the caller scores segments whose index i
// means the same token in every head of the layer (SyncKV: right after prefill, when every head
// holds the whole prompt). Parameters: roles (required), inner selector's params.
// Cost: the inner selector's, once per cluster; O(k) per follower to copy.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/select/static_dynamic.hpp>

#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace kvsift::select {

// One layer's clusters: assign[kv_heads], representatives[clusters].
struct cluster_roles {
  std::vector<int> assign;           // [kv_heads] cluster of each KV head
  std::vector<int> representatives;  // [clusters] R-head of each cluster (a member of it)

  // Throws kvsift::error unless there is one assignment per KV head, every cluster index is in
  // range and every representative is a distinct head assigned to its own cluster.
  void validate(std::string_view where, int kv_heads) const {
    require(static_cast<int>(assign.size()) == kv_heads, where, "assign.size", assign.size(),
            "one cluster per KV head (" + std::to_string(kv_heads) + ")");
    const int clusters = static_cast<int>(representatives.size());
    require(clusters > 0, where, "representatives.size", clusters, "> 0 (one per cluster)");
    for (int h = 0; h < kv_heads; ++h) {
      require(assign[h] >= 0 && assign[h] < clusters, where, "assign[" + std::to_string(h) + "]",
              assign[h], "a cluster in [0, " + std::to_string(clusters) + ")");
    }
    for (int c = 0; c < clusters; ++c) {
      const int r = representatives[c];
      require(r >= 0 && r < kv_heads, where, "representatives[" + std::to_string(c) + "]", r,
              "a KV head in [0, " + std::to_string(kv_heads) + ")");
      require(assign[r] == c, where, "representatives[" + std::to_string(c) + "]", r,
              "a head assigned to cluster " + std::to_string(c) + " (assign[" + std::to_string(r) +
                  "] = " + std::to_string(assign[r]) + ")");
    }
  }
  [[nodiscard]] int kv_heads() const { return static_cast<int>(assign.size()); }
  [[nodiscard]] int clusters() const { return static_cast<int>(representatives.size()); }
  // The representative of head h's cluster (h itself for a representative).
  [[nodiscard]] int leader(int h) const { return representatives[assign[h]]; }
  [[nodiscard]] bool is_representative(int h) const { return leader(h) == h; }
  [[nodiscard]] int followers(int c) const {
    int n = 0;
    for (int h = 0; h < kv_heads(); ++h) n += (assign[h] == c && representatives[c] != h) ? 1 : 0;
    return n;
  }
};

template <Selector Inner = static_dynamic>
struct shared_by_cluster {
  using kvsift_role = selector_tag;
  using granularity = typename Inner::granularity;
  struct params {
    cluster_roles roles;
    typename Inner::params inner{};
  };
  params p{};

  // out[s] = by_head[segment of the leader of s]: segments are requests x kv_heads (head-minor).
  static void share(const cluster_roles& roles, const index_sets& by_head, index_sets& out) {
    const int h = roles.kv_heads();
    require(h > 0 && by_head.segments() % h == 0, "select::shared_by_cluster", "by_head.segments",
            by_head.segments(), "a multiple of kv_heads (" + std::to_string(h) + ")");
    out.clear();
    for (int s = 0; s < by_head.segments(); ++s) {
      out.push_back(by_head[(s / h) * h + roles.leader(s % h)]);
    }
  }

  // Representatives keep every index; followers the inner selection of their representative's
  // scores under their own budget.
  void select(const score_sets& scores, std::span<const int> budgets, index_sets& kept) const {
    constexpr std::string_view where = "select::shared_by_cluster";
    const int h = p.roles.kv_heads();
    p.roles.validate(where, h);
    require(scores.segments() % h == 0, where, "scores.segments", scores.segments(),
            "a multiple of kv_heads (" + std::to_string(h) + ")");
    require(static_cast<int>(budgets.size()) == scores.segments(), where, "budgets.size",
            budgets.size(), "one budget per segment");
    score_sets led;  // segment s: the leader's scores under s's budget
    std::vector<int> led_budgets(budgets.begin(), budgets.end());
    for (int s = 0; s < scores.segments(); ++s) {
      led.push_back(scores[(s / h) * h + p.roles.leader(s % h)]);
    }
    index_sets picked;
    Inner{p.inner}.select(led, led_budgets, picked);
    kept.clear();
    std::vector<std::int32_t> all;
    for (int s = 0; s < scores.segments(); ++s) {
      if (p.roles.is_representative(s % h)) {
        all.resize(static_cast<std::size_t>(scores.size(s)));
        std::iota(all.begin(), all.end(), 0);
        kept.push_back(all);
      } else {
        kept.push_back(picked[s]);
      }
    }
  }
};
static_assert(Selector<shared_by_cluster<>>);

}  // namespace kvsift::select
