// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/cpu/segmented_topk.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace kvsift::select {

// Page selection with sink and window — FreeKV (Liu et al., 2025). A segment of P page scores
// (score::freekv_pages: candidates [S/p, P - W/p) scored, sink and window entries ignored) with a
// budget of B tokens (whole pages) keeps, when P > B/p: the sink pages [0, S/p), the top
// B/p - S/p - W/p candidates (higher score first, ties to the lower page) and the window pages
// [P - W/p, P), the current partial page among them — exactly B/p pages. When P <= B/p every
// page is kept. B/p < S/p + W/p with P > B/p is a kvsift::error, as are a negative budget and
// one that is not whole pages. Output: ascending page indices.
// Parameters (paper defaults): page_size 32, sink 512, window 512. Cost: O(P) per segment.
struct freekv_pages {
  using kvsift_role = selector_tag;
  using granularity = page_level;
  struct params {
    int page_size = 32;
    int sink = 512;
    int window = 512;
  };
  params p{};

  void validate(std::string_view where) const {
    require(p.page_size > 0, where, "page_size", p.page_size, "> 0");
    require(p.sink >= 0 && p.sink % p.page_size == 0, where, "sink", p.sink,
            "whole pages (a multiple of page_size " + std::to_string(p.page_size) + ", >= 0)");
    require(p.window > 0 && p.window % p.page_size == 0, where, "window", p.window,
            "whole pages (a positive multiple of page_size " + std::to_string(p.page_size) + ")");
  }
  // Checks a budget in tokens: >= 0, whole pages.
  void validate_budget(std::string_view where, std::string_view arg, int budget) const {
    require(budget >= 0 && budget % p.page_size == 0, where, arg, budget,
            "whole pages (a multiple of page_size " + std::to_string(p.page_size) + ", >= 0)");
  }
  // Candidate pages selected for a budget of B tokens: B/p - S/p - W/p (may be negative).
  [[nodiscard]] int selectable(int budget) const {
    return budget / p.page_size - p.sink / p.page_size - p.window / p.page_size;
  }

  void select(const score_sets& scores, std::span<const int> budgets, index_sets& kept) const {
    constexpr std::string_view where = "select::freekv_pages";
    validate(where);
    require(static_cast<int>(budgets.size()) == scores.segments(), where, "budgets.size",
            budgets.size(), "one budget per segment (" + std::to_string(scores.segments()) + ")");
    std::vector<int> sizes(static_cast<std::size_t>(scores.segments()));
    for (int s = 0; s < scores.segments(); ++s) {
      const std::string arg = "budgets[" + std::to_string(s) + "]";
      validate_budget(where, arg, budgets[s]);
      const int P = scores.size(s);
      const int B = budgets[s] / p.page_size;
      if (P > B) {
        require(selectable(budgets[s]) >= 0, where, arg, budgets[s],
                ">= sink + window (" + std::to_string(p.sink + p.window) + " tokens)");
      }
      sizes[s] = std::min(P, B);
    }
    const int sink = p.sink / p.page_size;
    const int window = p.window / p.page_size;
    validate_not_nan(
        scores, [&](int) { return sink; },
        [&](int s) { return sizes[s] < scores.size(s) ? scores.size(s) - window : 0; }, where,
        "scores");
    kept.resize(sizes);
    cpu::parallel_for(scores.segments(), [&](std::int64_t s64) {
      const int s = static_cast<int>(s64);
      const int P = scores.size(s);
      auto out = kept[s];
      if (static_cast<int>(out.size()) >= P) {
        std::iota(out.begin(), out.end(), 0);
        return;
      }
      std::vector<std::int32_t> picked(static_cast<std::size_t>(sink));
      std::iota(picked.begin(), picked.end(), 0);
      cpu::topk_range(scores[s], sink, P - window, selectable(budgets[s]), picked);
      for (int pg = P - window; pg < P; ++pg) picked.push_back(pg);
      std::copy(picked.begin(), picked.end(), out.begin());
    });
  }
};
static_assert(Selector<freekv_pages>);

}  // namespace kvsift::select
