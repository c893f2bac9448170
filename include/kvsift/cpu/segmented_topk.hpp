// SPDX-License-Identifier: Apache-2.0
#pragma once

// Deterministic top-k on the CPU: higher score first, ties to the lower index, output ascending.
// Mirrors thrust/segmented_topk.hpp and cuda/segmented_topk.cuh.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace kvsift::cpu {

// The position of the worst of m scores at(0) .. at(m - 1) (m >= 1): the lowest, and among equal
// lowest the last (ties go to the lower index, so the higher one is worse). Two passes with no
// chain through memory: the minimum in 16 independent lanes (the minimum of a set is the same in
// any order; -0 and +0 compare equal, as everywhere here, and NaN is rejected by the selectors'
// checks), then the last position holding it. One pass with `if (at(worst) >= at(i)) worst = i`
// waits for each load on the previous compare (~8 cycles a score: 2.8 us of H2O's 8 x 256-slot
// step on a Sapphire Rapids VM).
template <class At>
std::size_t worst_of(std::size_t m, At&& at) {
  const auto chained = [&] {  // the one-pass form: short ranges, and the same answer with NaN
    std::size_t worst = 0;
    for (std::size_t i = 1; i < m; ++i) {
      if (at(worst) >= at(i)) worst = i;
    }
    return worst;
  };
  float lane[16];
  int nan[16];
  const std::size_t body = m / 16 * 16;
  if (body == 0) return chained();
  for (int l = 0; l < 16; ++l) {
    lane[l] = at(static_cast<std::size_t>(l));
    nan[l] = static_cast<int>(lane[l] != lane[l]);
  }
  for (std::size_t i = 16; i < body; i += 16) {
    for (int l = 0; l < 16; ++l) {
      const float v = at(i + static_cast<std::size_t>(l));
      lane[l] = v < lane[l] ? v : lane[l];
      nan[l] |= static_cast<int>(v != v);
    }
  }
  float low = lane[0];
  int any_nan = nan[0];
  for (int l = 1; l < 16; ++l) {
    low = lane[l] < low ? lane[l] : low;
    any_nan |= nan[l];
  }
  for (std::size_t i = body; i < m; ++i) {
    const float v = at(i);
    low = v < low ? v : low;
    any_nan |= static_cast<int>(v != v);
  }
  if (any_nan) return chained();  // NaN has no order: keep the one-pass form's answer
  std::size_t i = m - 1;
  while (!(at(i) == low)) --i;  // `low` is one of the scores: found before i passes 0
  return i;
}

// Writes into `out` (resized to min(k, |candidates|)) the candidates with the k highest
// scores[c], ascending. `candidates` must be ascending. The order is strict and total (score,
// then index), so the kept set is exactly the complement of the |candidates| - k lowest: when
// fewer are dropped than kept (a sliding window's step drops one of a thousand) those are found
// instead and the kept ones written in candidate order, O(n) with no sort of the kept set; a
// single drop (H2O's step past its budget) is the worst candidate (worst_of), no scratch copy.
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
  if (drop == 1) {  // a decode step's eviction: the one worst candidate, found by worst_of
    const std::size_t worst = worst_of(n, [&](std::size_t i) { return scores[candidates[i]]; });
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

// Top k of the index range [first, last) of `scores`, ascending, into out[0, min(k, last -
// first)) (out holds at least that many). Keeping all of them or all but one (H2O's step past its
// budget) takes no candidate list: the one dropped is the worst of the range, found by worst_of
// under topk_of's order (a later index loses a tie).
inline void topk_range(std::span<const float> scores, int first, int last, int k,
                       std::span<std::int32_t> out) {
  const int n = std::max(0, last - first);
  const int keep = std::clamp(k, 0, n);
  if (keep == n) {
    std::iota(out.begin(), out.begin() + n, first);
    return;
  }
  if (keep + 1 == n) {
    const auto at = [&](std::size_t i) { return scores[static_cast<std::size_t>(first) + i]; };
    const int worst = first + static_cast<int>(worst_of(static_cast<std::size_t>(n), at));
    std::iota(out.begin(), out.begin() + (worst - first), first);
    std::iota(out.begin() + (worst - first), out.begin() + keep, worst + 1);
    return;
  }
  thread_local std::vector<std::int32_t> cand, picked;  // scratch, reused across calls
  cand.resize(static_cast<std::size_t>(n));
  std::iota(cand.begin(), cand.end(), first);
  topk_of(scores, cand, k, picked);
  std::copy(picked.begin(), picked.end(), out.begin());
}

// Top k of the index range [first, last) of `scores`, ascending, appended to `out`.
inline void topk_range(std::span<const float> scores, int first, int last, int k,
                       std::vector<std::int32_t>& out) {
  const std::size_t at = out.size();
  out.resize(at + static_cast<std::size_t>(std::clamp(k, 0, std::max(0, last - first))));
  topk_range(scores, first, last, k, std::span<std::int32_t>(out).subspan(at));
}

}  // namespace kvsift::cpu
