// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/cpu/segmented_topk.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace kvsift::select {

// Page top-k — Quest (Tang et al., 2024). Budgets are in tokens; a segment of P page scores keeps
// max(min_pages, floor(B / page_size)) pages: the last (current, possibly partial) page always,
// and the top-scored of the complete pages [0, P - 1) for the rest (ties to the lower page).
// Every page is kept when they all fit. Output: ascending page indices.
// Parameters: page_size 16, min_pages 3, check_finite false. Cost: O(P) per segment.
struct page_topk {
  using kvsift_role = selector_tag;
  using granularity = page_level;
  struct params {
    int page_size = 16;
    int min_pages = 3;
    bool check_finite = false;  // reject inf too among the complete pages' scores (NaN always is)
  };
  params p{};

  [[nodiscard]] int pages_for(int budget) const {
    return std::max(p.min_pages, budget / p.page_size);
  }
  void validate(std::string_view where) const {
    require(p.page_size > 0, where, "page_size", p.page_size, "> 0");
    require(p.min_pages >= 1, where, "min_pages", p.min_pages, ">= 1 (the current page)");
  }

  void select(const score_sets& scores, std::span<const int> budgets, index_sets& kept) const {
    require(static_cast<int>(budgets.size()) == scores.segments(), "select::page_topk",
            "budgets.size", budgets.size(),
            [&] { return "one budget per segment (" + std::to_string(scores.segments()) + ")"; });
    for (int s = 0; s < scores.segments(); ++s) {
      require(budgets[s] >= 0, "select::page_topk", [s] { return "budgets[" + std::to_string(s) + "]"; },
              budgets[s], [] { return std::string(">= 0"); });
    }
    const auto first = [](int) { return 0; };
    const auto last = [&](int s) { return std::max(0, scores.size(s) - 1); };
    if (p.check_finite) {
      validate_finite(scores, first, last, "select::page_topk", "scores");
    } else {  // NaN is never a score: a top-k over it picks an unspecified set
      validate_not_nan(scores, first, last, "select::page_topk", "scores");
    }
    std::vector<int> sizes(static_cast<std::size_t>(scores.segments()));
    for (int s = 0; s < scores.segments(); ++s) {
      sizes[s] = std::min(pages_for(budgets[s]), scores.size(s));
    }
    kept.resize(sizes);
    cpu::parallel_for(scores.segments(), [&](std::int64_t s64) {
      const int s = static_cast<int>(s64);
      const int P = scores.size(s);
      auto out = kept[s];
      if (static_cast<int>(out.size()) >= P) {
        std::iota(out.begin(), out.end(), 0);
        return;
      }
      std::vector<std::int32_t> picked;
      cpu::topk_range(scores[s], 0, P - 1, static_cast<int>(out.size()) - 1, picked);
      picked.push_back(P - 1);
      std::copy(picked.begin(), picked.end(), out.begin());
    }, cpu::par, static_cast<std::int64_t>(scores.values.size()) / std::max(1, scores.segments()));
  }
};
static_assert(Selector<page_topk>);

// The slots a page selection reads: per segment s, every slot of each page of pages[s], in
// page order, the last page cut at lengths[s] (pages ascend, so slots ascend). `sizes` is
// scratch, reused across calls. Cost: O(selected slots).
inline void expand_pages(const index_sets& pages, std::span<const int> lengths, int page_size,
                         index_sets& slots, std::vector<int>& sizes) {
  require(static_cast<int>(lengths.size()) == pages.segments(), "select::expand_pages",
          "lengths.size", lengths.size(),
          [&] { return "one length per segment (" + std::to_string(pages.segments()) + ")"; });
  require(page_size > 0, "select::expand_pages", "page_size", page_size, "> 0");
  sizes.resize(static_cast<std::size_t>(pages.segments()));
  for (int s = 0; s < pages.segments(); ++s) {
    int n = 0;
    for (const auto pg : pages[s]) {
      const bool in_range = pg >= 0 && static_cast<std::int64_t>(pg) * page_size < lengths[s];
      require(in_range, "select::expand_pages", [&] { return "pages[" + std::to_string(s) + "]"; },
              pg, [&] {
                return "a page of the segment's " + std::to_string(lengths[s]) + " tokens";
              });
      n += std::min(page_size, lengths[s] - pg * page_size);
    }
    sizes[s] = n;
  }
  slots.resize(sizes);
  for (int s = 0; s < pages.segments(); ++s) {
    auto out = slots[s];
    std::size_t i = 0;
    for (const auto pg : pages[s]) {
      for (int j = pg * page_size; j < std::min(lengths[s], (pg + 1) * page_size); ++j) out[i++] = j;
    }
  }
}

}  // namespace kvsift::select
