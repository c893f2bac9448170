// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>

#include <numeric>
#include <vector>

namespace kvsift::select {

// Keep everything — full KV's selector. Declares `keeps_everything`, so a method composed with it
// never runs a compression round, never changes physical length and is safe with shared prefix
// blocks. No parameters. Cost: none in a method; O(n) if called directly.
struct keep_all {
  using kvsift_role = selector_tag;
  using granularity = token_level;
  static constexpr bool keeps_everything = true;
  struct params {};
  params p{};

  void select(const score_sets& scores, std::span<const int>, index_sets& kept) const {
    std::vector<int> sizes(static_cast<std::size_t>(scores.segments()));
    for (int s = 0; s < scores.segments(); ++s) sizes[s] = scores.size(s);
    kept.resize(sizes);
    for (int s = 0; s < kept.segments(); ++s) {
      auto seg = kept[s];
      std::iota(seg.begin(), seg.end(), 0);
    }
  }
};
static_assert(Selector<keep_all>);

}  // namespace kvsift::select
