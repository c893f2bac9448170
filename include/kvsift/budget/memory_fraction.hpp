// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>
#include <kvsift/cpu/math.hpp>

#include <string>
#include <vector>

namespace kvsift::budget {

// Tokens kept when a fraction f of n is kept: floor(f * n) (METHODS.md real-to-integer rule).
inline int tokens_from_keep_fraction(int n, double keep_fraction) {
  require(n >= 0, "budget::tokens_from_keep_fraction", "n", n, ">= 0");
  require(keep_fraction >= 0.0 && keep_fraction <= 1.0, "budget::tokens_from_keep_fraction",
          "keep_fraction", keep_fraction, "in [0, 1]");
  return static_cast<int>(count_floor(keep_fraction * n));
}

// Tokens kept when a fraction c of n is evicted: floor((1 - c) * n).
inline int tokens_from_evict_fraction(int n, double evict_fraction) {
  require(n >= 0, "budget::tokens_from_evict_fraction", "n", n, ">= 0");
  require(evict_fraction >= 0.0 && evict_fraction <= 1.0, "budget::tokens_from_evict_fraction",
          "evict_fraction", evict_fraction, "in [0, 1]");
  return static_cast<int>(count_floor((1.0 - evict_fraction) * n));
}

// Memory fraction (Mem%): every head-sequence keeps floor(keep_fraction * n) of its n resident
// tokens, at least `min_tokens` (e.g. a method's protected tokens). Cost: O(segments).
struct memory_fraction {
  using kvsift_role = budgeter_tag;
  struct params {
    double keep_fraction = 0.25;
    int min_tokens = 0;
  };
  params p{};
  void validate(std::string_view where) const {
    require(p.keep_fraction >= 0.0 && p.keep_fraction <= 1.0, where, "keep_fraction",
            p.keep_fraction, "in [0, 1]");
    require(p.min_tokens >= 0, where, "min_tokens", p.min_tokens, ">= 0");
  }
  void budgets(const budget_context& ctx, std::vector<int>& out) const {
    out.resize(ctx.lengths.size());
    for (std::size_t s = 0; s < ctx.lengths.size(); ++s) {
      out[s] = std::max(p.min_tokens, tokens_from_keep_fraction(ctx.lengths[s], p.keep_fraction));
    }
  }
};
static_assert(Budgeter<memory_fraction>);

}  // namespace kvsift::budget
