// SPDX-License-Identifier: Apache-2.0
#pragma once

// Set overlap, overlap matrices, medians and HeteroCache stability (METHODS.md "General
// conventions" and HeteroCache "Profiling"):
//   overlap(A, B)  = |A n B| / min(|A|, |B|), 0 when either set is empty; symmetric, in [0, 1];
//   median         of an even count is the mean of the two middle values;
//   stability s_h  = median over decode steps t of overlap(prefill set of h, step-t set of h).
// Sets are ascending, duplicate-free index lists (what topk_sets produces). Arithmetic in double,
// results stored as float. Cost: O(|A| + |B|) per overlap, O(R^2 k) for an R x R matrix.

#include <kvsift/calibrate/topk_sets.hpp>
#include <kvsift/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::calibrate {

namespace detail {

inline void require_ascending(std::span<const std::int32_t> s, std::string_view where,
                              std::string_view arg) {
  for (std::size_t i = 1; i < s.size(); ++i) {
    require(s[i - 1] < s[i], where, std::string(arg) + "[" + std::to_string(i) + "]", s[i],
            "strictly ascending indices (previous " + std::to_string(s[i - 1]) + ")");
  }
}

// |A n B| of two ascending sets (merge count).
inline std::size_t intersection_size(std::span<const std::int32_t> a,
                                     std::span<const std::int32_t> b) {
  std::size_t i = 0, j = 0, common = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++common;
      ++i;
      ++j;
    }
  }
  return common;
}

inline double overlap_unchecked(std::span<const std::int32_t> a, std::span<const std::int32_t> b) {
  if (a.empty() || b.empty()) {
    return 0.0;
  }
  return static_cast<double>(intersection_size(a, b)) /
         static_cast<double>(std::min(a.size(), b.size()));
}

}  // namespace detail

// |A n B| / min(|A|, |B|); 0 if either is empty. Throws kvsift::error unless both are strictly
// ascending.
[[nodiscard]] inline double overlap(std::span<const std::int32_t> a,
                                    std::span<const std::int32_t> b) {
  detail::require_ascending(a, "calibrate::overlap", "a");
  detail::require_ascending(b, "calibrate::overlap", "b");
  return detail::overlap_unchecked(a, b);
}

// The R x R matrix (row-major) of pairwise overlaps of `sets`, diagonal included (1 for a
// non-empty set, 0 for an empty one).
[[nodiscard]] inline std::vector<float> overlap_matrix(const head_sets& sets) {
  for (std::size_t r = 0; r < sets.size(); ++r) {
    detail::require_ascending(sets[r], "calibrate::overlap_matrix",
                              "sets[" + std::to_string(r) + "]");
  }
  const std::size_t R = sets.size();
  std::vector<float> m(R * R);
  for (std::size_t i = 0; i < R; ++i) {
    for (std::size_t j = i; j < R; ++j) {
      const auto v = static_cast<float>(detail::overlap_unchecked(sets[i], sets[j]));
      m[i * R + j] = v;
      m[j * R + i] = v;
    }
  }
  return m;
}

// Median of `values` (the mean of the two middle ones for an even count). Throws kvsift::error
// for an empty list.
[[nodiscard]] inline double median(std::vector<double> values) {
  require(!values.empty(), "calibrate::median", "values.size()", 0, "at least 1 value");
  std::sort(values.begin(), values.end());
  const std::size_t m = values.size() / 2;
  return values.size() % 2 == 1 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

// HeteroCache stability per KV head: s_h = median over t of overlap(prefill[h], steps[t][h]).
// `prefill` has one set per head, every steps[t] as many; at least one step.
[[nodiscard]] inline std::vector<float> stability(const head_sets& prefill,
                                                  const std::vector<head_sets>& steps) {
  constexpr std::string_view where = "calibrate::stability";
  require(!steps.empty(), where, "steps.size()", 0, "at least 1 decode step");
  const std::size_t H = prefill.size();
  for (std::size_t h = 0; h < H; ++h) {
    detail::require_ascending(prefill[h], where, "prefill[" + std::to_string(h) + "]");
  }
  for (std::size_t t = 0; t < steps.size(); ++t) {
    require(steps[t].size() == H, where, "steps[" + std::to_string(t) + "].size()",
            steps[t].size(), "one set per head (" + std::to_string(H) + ")");
    for (std::size_t h = 0; h < H; ++h) {
      detail::require_ascending(steps[t][h], where,
                                "steps[" + std::to_string(t) + "][" + std::to_string(h) + "]");
    }
  }
  std::vector<float> s(H);
  std::vector<double> o(steps.size());
  for (std::size_t h = 0; h < H; ++h) {
    for (std::size_t t = 0; t < steps.size(); ++t) {
      o[t] = detail::overlap_unchecked(prefill[h], steps[t][h]);
    }
    s[h] = static_cast<float>(median(o));
  }
  return s;
}

}  // namespace kvsift::calibrate
