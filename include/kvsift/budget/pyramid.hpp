// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace kvsift::budget {

// PyramidKV's past-token budget of layer `layer` of `layers` for n tokens, average budget C and
// window w (window excluded). METHODS.md: min = (C - w) / beta, max = 2(C - w) - min; if
// max >= n - w then max = n - w, min = 2(C - w) - max; step = (max - min) / (L - 1); the layer
// keeps max - l * step. L = 1 keeps C - w; n < C keeps everything (max(n - w, 0) past);
// n < 2(C - w) keeps C - w. C <= w is an error. Integer arithmetic throughout.
inline int pyramid_past_budget(int n, int C, int w, int layer, int layers, int beta) {
  constexpr std::string_view where = "budget::pyramid";
  require(C > w, where, "budget", C, "> window (" + std::to_string(w) + ")");
  require(beta > 0, where, "beta", beta, "> 0");
  require(layers >= 1, where, "layers", layers, ">= 1");
  require(layer >= 0 && layer < layers, where, "layer", layer,
          "in [0, " + std::to_string(layers) + ")");
  if (n < C) return std::max(n - w, 0);
  const int cw = C - w;
  if (layers == 1 || n < 2 * cw) return cw;
  int mn = cw / beta;
  int mx = 2 * cw - mn;
  if (mx >= n - w) {
    mx = n - w;
    mn = 2 * cw - mx;
  }
  const int step = (mx - mn) / (layers - 1);
  return mx - layer * step;
}

// Pyramid — PyramidKV (Cai et al., 2024): lower layers keep more, upper layers fewer, the mean
// staying near C. Each head-sequence's budget is its layer's past budget plus the window.
// Parameters: budget C (tokens per head-sequence on average), window 32 (SnapKV's), beta 20.
struct pyramid {
  using kvsift_role = budgeter_tag;
  struct params {
    int tokens = 2048;
    int window = 32;
    int beta = 20;
  };
  params p{};
  void validate(std::string_view where) const {
    require(p.tokens > p.window, where, "budget", p.tokens,
            "> window (" + std::to_string(p.window) + ")");
    require(p.beta > 0, where, "beta", p.beta, "> 0");
  }
  void budgets(const budget_context& ctx, std::vector<int>& out) const {
    out.resize(ctx.lengths.size());
    for (std::size_t s = 0; s < ctx.lengths.size(); ++s) {
      const int n = ctx.lengths[s];
      out[s] = n < p.tokens ? n
                            : pyramid_past_budget(n, p.tokens, p.window, ctx.layer, ctx.layers,
                                                  p.beta) +
                                  p.window;
    }
  }
};
static_assert(Budgeter<pyramid>);

}  // namespace kvsift::budget
