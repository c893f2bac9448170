// SPDX-License-Identifier: Apache-2.0
#pragma once

// Deterministic top-k on the CPU: higher score first, ties to the lower index, output ascending.
// Mirrors thrust/segmented_topk.hpp and cuda/segmented_topk.cuh.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace kvsift::cpu {

// Writes into `out` (resized to min(k, |candidates|)) the candidates with the k highest
// scores[c], ascending. `candidates` must be ascending; scratch is reused across calls.
inline void topk_of(std::span<const float> scores, std::span<const std::int32_t> candidates, int k,
                    std::vector<std::int32_t>& out) {
  out.assign(candidates.begin(), candidates.end());
  if (k < static_cast<int>(out.size())) {
    const auto better = [&](std::int32_t a, std::int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    };
    std::nth_element(out.begin(), out.begin() + std::max(k, 0), out.end(), better);
    out.resize(static_cast<std::size_t>(std::max(k, 0)));
  }
  std::sort(out.begin(), out.end());
}

// Top k of the index range [first, last) of `scores`, ascending, appended to `out`.
inline void topk_range(std::span<const float> scores, int first, int last, int k,
                       std::vector<std::int32_t>& out) {
  std::vector<std::int32_t> cand(static_cast<std::size_t>(std::max(0, last - first)));
  std::iota(cand.begin(), cand.end(), first);
  std::vector<std::int32_t> picked;
  topk_of(scores, cand, k, picked);
  out.insert(out.end(), picked.begin(), picked.end());
}

}  // namespace kvsift::cpu
