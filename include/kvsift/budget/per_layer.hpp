// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>

#include <string>
#include <vector>

namespace kvsift::budget {

// Per-layer budgets given by the user: every head-sequence of layer l keeps `tokens[l]` tokens
// (every kept token counts, the selector's protected ones included; all of them when it has
// fewer). The "per-layer budgets" users ask kvpress for, and the way to replay a layer-adaptive
// method's budgets in any other composition — e.g. DynamicKV's stats().layer_budgets with
// SnapKV scoring. No paper; parameters: tokens (empty: must be given, one entry per layer).
// `tokens.size()` must equal the model's layers (checked when budgets are asked, before any store
// is touched). Cost: O(segments).
struct per_layer {
  using kvsift_role = budgeter_tag;
  struct params {
    std::vector<int> tokens;  // [layers] budget of each layer in tokens per head-sequence
  };
  params p{};

  void validate(std::string_view where) const {
    require(!p.tokens.empty(), where, "tokens.size", 0, "one budget per layer (> 0 entries)");
    for (std::size_t l = 0; l < p.tokens.size(); ++l) {
      require(p.tokens[l] >= 0, where, "tokens[" + std::to_string(l) + "]", p.tokens[l], ">= 0");
    }
  }
  void budgets(const budget_context& ctx, std::vector<int>& out) const {
    constexpr std::string_view where = "budget::per_layer";
    require(static_cast<int>(p.tokens.size()) == ctx.layers, where, "tokens.size",
            p.tokens.size(), "the model's layers (" + std::to_string(ctx.layers) + ")");
    require(ctx.layer >= 0 && ctx.layer < ctx.layers, where, "layer", ctx.layer,
            "in [0, " + std::to_string(ctx.layers) + ")");
    out.assign(ctx.lengths.size(), p.tokens[static_cast<std::size_t>(ctx.layer)]);
  }
};
static_assert(Budgeter<per_layer>);

}  // namespace kvsift::budget
