// SPDX-License-Identifier: Apache-2.0
#pragma once

// select::static_dynamic — SyncKV's split of a follower budget into a static and a dynamic set
// (Zhou et al., 2025, "SyncKV"; METHODS.md "SyncKV").
//
// Per segment of n scores and budget k (tokens, clipped to n):
//   static  = the top floor(rho * k)                       kept for the whole decode
//   dynamic = the next k - floor(rho * k) (ranks k_static .. k-1)
// in the deterministic order of every kvsift top-k: higher score first, ties to the lower index.
// select() returns static ∪ dynamic (= the top k), ascending, so the type models Selector; split()
// returns the two sets; refresh() is the anticipation: the top k_dyn of the candidates [0, limit)
// that are not in the static set (SyncKV: prefill tokens only, decode tokens are always kept).
// Parameters: rho 0.5. Cost: O(n) per segment (nth_element), plus O(k log k) to sort.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/segmented_topk.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace kvsift::select {

struct static_dynamic {
  using kvsift_role = selector_tag;
  using granularity = token_level;
  struct params {
    double rho = 0.5;  // static share of the budget
  };
  params p{};

  void validate(std::string_view where) const {
    require(p.rho >= 0.0 && p.rho <= 1.0, where, "rho", p.rho, "in [0, 1]");
  }
  // floor(rho * k) (METHODS.md real-to-integer rule).
  [[nodiscard]] int static_count(int k) const { return static_cast<int>(count_floor(p.rho * k)); }

  void check(const score_sets& scores, std::span<const int> budgets) const {
    constexpr std::string_view where = "select::static_dynamic";
    validate(where);
    require(static_cast<int>(budgets.size()) == scores.segments(), where, "budgets.size",
            budgets.size(), "one budget per segment (" + std::to_string(scores.segments()) + ")");
    for (std::size_t s = 0; s < budgets.size(); ++s) {
      require(budgets[s] >= 0, where, "budgets[" + std::to_string(s) + "]", budgets[s], ">= 0");
    }
    validate_not_nan(scores, [](int) { return 0; }, [&](int s) { return scores.size(s); }, where,
                     "scores");
  }

  // kept[s] = static ∪ dynamic = the top min(budget, n), ascending.
  void select(const score_sets& scores, std::span<const int> budgets, index_sets& kept) const {
    index_sets st, dyn;
    split(scores, budgets, st, dyn);
    kept.clear();
    std::vector<std::int32_t> both;
    for (int s = 0; s < scores.segments(); ++s) {
      both.clear();
      std::merge(st[s].begin(), st[s].end(), dyn[s].begin(), dyn[s].end(), std::back_inserter(both));
      kept.push_back(both);
    }
  }

  // static_sets[s] = the top floor(rho * k) of segment s, dynamic_sets[s] = ranks
  // floor(rho * k) .. k-1, k = min(budgets[s], n); both ascending.
  void split(const score_sets& scores, std::span<const int> budgets, index_sets& static_sets,
             index_sets& dynamic_sets) const {
    check(scores, budgets);
    static_sets.clear();
    dynamic_sets.clear();
    std::vector<std::int32_t> all, top, first, rest;
    for (int s = 0; s < scores.segments(); ++s) {
      const auto sc = scores[s];
      const int n = static_cast<int>(sc.size());
      const int k = std::min(budgets[s], n);
      all.resize(static_cast<std::size_t>(n));
      std::iota(all.begin(), all.end(), 0);
      cpu::topk_of(sc, all, k, top);
      cpu::topk_of(sc, top, static_count(k), first);  // the top of the top k: ranks 0 .. k_static-1
      rest.clear();
      std::set_difference(top.begin(), top.end(), first.begin(), first.end(), std::back_inserter(rest));
      static_sets.push_back(first);
      dynamic_sets.push_back(rest);
    }
  }

  // The anticipation: dynamic_sets[s] = the top k_dyn[s] of the indices [0, limits[s]) of
  // segment s that are not in static_sets[s] (ascending; fewer when fewer candidates exist).
  void refresh(const score_sets& scores, const index_sets& static_sets, std::span<const int> limits,
               std::span<const int> k_dyn, index_sets& dynamic_sets) const {
    constexpr std::string_view where = "select::static_dynamic.refresh";
    require(static_sets.segments() == scores.segments(), where, "static_sets.segments",
            static_sets.segments(), std::to_string(scores.segments()));
    require(static_cast<int>(limits.size()) == scores.segments() &&
                static_cast<int>(k_dyn.size()) == scores.segments(),
            where, "limits.size", limits.size(), "one limit and one k_dyn per segment");
    for (int s = 0; s < scores.segments(); ++s) {
      require(limits[s] >= 0 && limits[s] <= scores.size(s), where,
              "limits[" + std::to_string(s) + "]", limits[s],
              "in [0, " + std::to_string(scores.size(s)) + "]");
      require(k_dyn[s] >= 0, where, "k_dyn[" + std::to_string(s) + "]", k_dyn[s], ">= 0");
    }
    validate_not_nan(scores, [](int) { return 0; }, [&](int s) { return limits[s]; }, where,
                     "scores");
    dynamic_sets.clear();
    std::vector<std::int32_t> cand, picked;
    for (int s = 0; s < scores.segments(); ++s) {
      const auto st = static_sets[s];
      cand.clear();
      auto it = st.begin();
      for (std::int32_t i = 0; i < limits[s]; ++i) {
        while (it != st.end() && *it < i) ++it;
        if (it == st.end() || *it != i) cand.push_back(i);
      }
      cpu::topk_of(scores[s], cand, k_dyn[s], picked);
      dynamic_sets.push_back(picked);
    }
  }
};
static_assert(Selector<static_dynamic>);

}  // namespace kvsift::select
