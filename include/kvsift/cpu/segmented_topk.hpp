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
// scores[c], ascending. `candidates` must be ascending. The order is strict and total (score,
// then index), so the kept set is exactly the complement of the |candidates| - k lowest: when
// fewer are dropped than kept (a sliding window's step drops one of a thousand) those are found
// instead and the kept ones written in candidate order, O(n) with no sort of the kept set; a
// single drop (H2O's step past its budget) is the worst candidate, one pass, no scratch copy.
inline void topk_of(std::span<const float> scores, std::span<const std::int32_t> candidates, int k,
                    std::vector<std::int32_t>& out) {
  const std::size_t n = candidates.size();
  const std::size_t keep = static_cast<std::size_t>(std::max(k, 0));
  const auto better = [&](std::int32_t a, std::int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  if (keep >= n) {
    out.assign(candidates.begin(), candidates.end());
    return;
  }
  const std::size_t drop = n - keep;
  if (drop == 1) {  // a decode step's eviction: the one worst candidate, found in one pass
    std::size_t worst = 0;
    for (std::size_t i = 1; i < n; ++i) {
      if (better(candidates[worst], candidates[i])) worst = i;
    }
    out.clear();
    out.insert(out.end(), candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(worst));
    out.insert(out.end(), candidates.begin() + static_cast<std::ptrdiff_t>(worst) + 1, candidates.end());
    return;
  }
  if (drop < keep) {
    thread_local std::vector<std::int32_t> dropped;  // scratch, reused across calls
    dropped.assign(candidates.begin(), candidates.end());
    std::nth_element(dropped.begin(), dropped.begin() + static_cast<std::ptrdiff_t>(drop),
                     dropped.end(), [&](std::int32_t a, std::int32_t b) { return better(b, a); });
    dropped.resize(drop);
    std::sort(dropped.begin(), dropped.end());
    out.clear();
    out.reserve(keep);
    std::size_t d = 0;
    for (const std::int32_t c : candidates) {
      if (d < drop && dropped[d] == c) {
        ++d;
      } else {
        out.push_back(c);
      }
    }
    return;
  }
  out.assign(candidates.begin(), candidates.end());
  std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(keep), out.end(), better);
  out.resize(keep);
  std::sort(out.begin(), out.end());
}

// Top k of the index range [first, last) of `scores`, ascending, appended to `out`.
inline void topk_range(std::span<const float> scores, int first, int last, int k,
                       std::vector<std::int32_t>& out) {
  thread_local std::vector<std::int32_t> cand, picked;  // scratch, reused across calls
  cand.resize(static_cast<std::size_t>(std::max(0, last - first)));
  std::iota(cand.begin(), cand.end(), first);
  topk_of(scores, cand, k, picked);
  out.insert(out.end(), picked.begin(), picked.end());
}

}  // namespace kvsift::cpu
