// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>

#include <limits>
#include <vector>

namespace kvsift::budget {

// Uniform: every head-sequence of every layer keeps `tokens` (all of them when it has fewer).
// The default keeps everything (full KV). Cost: O(segments).
struct uniform {
  using kvsift_role = budgeter_tag;
  struct params {
    int tokens = std::numeric_limits<int>::max();
  };
  params p{};
  void validate(std::string_view where) const {
    require(p.tokens >= 0, where, "budget", p.tokens, ">= 0");
  }
  void budgets(const budget_context& ctx, std::vector<int>& out) const {
    out.assign(ctx.lengths.size(), p.tokens);
  }
};
static_assert(Budgeter<uniform>);

}  // namespace kvsift::budget
