// SPDX-License-Identifier: Apache-2.0
#pragma once

// Ragged batches. A family of per-segment arrays is stored CSR-style: the segments'
// elements concatenated in `values` and `offsets[s] .. offsets[s + 1]` delimiting segment s.
// One segment is one head-sequence (request x layer x KV head) or, for page-level data, the
// pages of one head-sequence. This is exactly the input of CUB's segmented algorithms.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace kvsift {

template <class T>
struct segmented {
  std::vector<T> values;                // [offsets.back()] the segments, concatenated
  std::vector<std::int32_t> offsets{0};  // [segments() + 1] CSR offsets, offsets[0] = 0

  [[nodiscard]] int segments() const { return static_cast<int>(offsets.size()) - 1; }
  [[nodiscard]] int size(int s) const { return offsets[s + 1] - offsets[s]; }
  [[nodiscard]] std::span<T> operator[](int s) {
    return {values.data() + offsets[s], static_cast<std::size_t>(size(s))};
  }
  [[nodiscard]] std::span<const T> operator[](int s) const {
    return {values.data() + offsets[s], static_cast<std::size_t>(size(s))};
  }

  void clear() {
    values.clear();
    offsets.assign(1, 0);
  }
  // Lays out segments of the given sizes (values value-initialised) in one allocation. Offsets
  // are int32 (CUB's segment offsets): sizes that are negative or sum past INT32_MAX are a
  // kvsift::error, thrown before anything changes.
  void resize(std::span<const int> sizes) {
    reshape(sizes);
    std::fill(values.begin(), values.end(), T{});
  }
  // resize without the value-initialisation: the values are left as the old array held them (a
  // new tail value-initialised), for a caller that rewrites every segment next (a whole-cache
  // plan, one token longer each step: 1 MB of zeros a step at 32K x 8 heads, not written).
  void reshape(std::span<const int> sizes) {
    std::int64_t total = 0;
    for (std::size_t s = 0; s < sizes.size(); ++s) {
      total += sizes[s];
      if (sizes[s] < 0 || total > max_offset) [[unlikely]] {
        throw make_error("segmented.resize", "sizes[" + std::to_string(s) + "]", sizes[s],
                         ">= 0, with every size summed <= INT32_MAX (int32 offsets)");
      }
    }
    offsets.assign(sizes.size() + 1, 0);
    for (std::size_t s = 0; s < sizes.size(); ++s) {
      offsets[s + 1] = offsets[s] + sizes[s];
    }
    const auto n = static_cast<std::size_t>(offsets.back());
    if (n > values.capacity()) values.reserve(std::max(n, 2 * values.capacity()));  // amortised
    values.resize(n);
  }
  void push_back(std::span<const T> segment) {
    require(values.size() + segment.size() <= static_cast<std::size_t>(max_offset),
            "segmented.push_back", "segment.size", segment.size(),
            [&] { return "<= " + std::to_string(max_offset - static_cast<std::int64_t>(values.size())) +
                         " (int32 offsets)"; });
    values.insert(values.end(), segment.begin(), segment.end());
    offsets.push_back(static_cast<std::int32_t>(values.size()));
  }

  static constexpr std::int64_t max_offset = std::numeric_limits<std::int32_t>::max();
};

using index_sets = segmented<std::int32_t>;  // kept token (or page) indices, ascending per segment
using score_sets = segmented<float>;         // one score per token (or page) per segment

// Non-owning CSR view, trivially copyable so it can travel to a kernel.
template <class T>
struct segmented_view {
  T* values = nullptr;                      // [offsets[num_segments]]
  const std::int32_t* offsets = nullptr;    // [num_segments + 1]
  int num_segments = 0;
};

// slots[i] == slots[0] + i for every i (and at least one slot): a whole-cache plan's segment. One
// OR over every step's difference from +1, no branch per slot (the scan vectorises).
inline bool consecutive(std::span<const std::int32_t> slots) {
  if (slots.empty()) return false;
  const std::int32_t* s = slots.data();
  std::uint32_t off = 0;
  for (std::size_t i = 1; i < slots.size(); ++i) {
    off |= static_cast<std::uint32_t>(s[i]) - static_cast<std::uint32_t>(s[i - 1]) - 1u;
  }
  return off == 0;
}

namespace detail {
// Whether every index is in [0, n) and, with `ascending`, each is above the one before: one pass
// of unsigned arithmetic, no branch per index (the scan vectorises), for the checks at the API
// boundary that run every step. A negative index is a large unsigned one; once every index is in
// range, the difference of two neighbours minus one wraps past 2^31 exactly when they descend
// or repeat.
inline bool indices_within(std::span<const std::int32_t> seg, int n, bool ascending) {
  const auto limit = static_cast<std::uint32_t>(std::max(n, 0));
  std::uint32_t outside = 0, descent = 0;
  for (std::size_t i = 0; i < seg.size(); ++i) outside |= static_cast<std::uint32_t>(seg[i]) >= limit;
  if (outside != 0 || !ascending) return outside == 0;
  for (std::size_t i = 1; i < seg.size(); ++i) {
    descent |= static_cast<std::uint32_t>(seg[i]) - static_cast<std::uint32_t>(seg[i - 1]) - 1u;
  }
  return (descent >> 31) == 0;
}
}  // namespace detail

// Checks that every segment of `sets` is strictly ascending and inside [0, limit(s)).
template <class Limit>
void validate_index_sets(const index_sets& sets, Limit&& limit, std::string_view where,
                         std::string_view arg) {
  for (int s = 0; s < sets.segments(); ++s) {
    const auto seg = sets[s];
    const int n = limit(s);
    if (detail::indices_within(seg, n, true)) [[likely]] continue;
    for (std::size_t i = 0; i < seg.size(); ++i) {  // name the first offender
      if (seg[i] < 0 || seg[i] >= n) {
        throw make_error(where, std::string(arg) + "[" + std::to_string(s) + "][" +
                                    std::to_string(i) + "]",
                         seg[i], "an index in [0, " + std::to_string(n) + ")");
      }
      if (i > 0 && seg[i] <= seg[i - 1]) {
        throw make_error(where, std::string(arg) + "[" + std::to_string(s) + "][" +
                                    std::to_string(i) + "]",
                         seg[i], "strictly ascending indices (previous " +
                                     std::to_string(seg[i - 1]) + ")");
      }
    }
  }
}

// Checks that scores[s][j] is finite for j in [first(s), last(s)) of every segment s: NaN or
// infinite scores would make a top-k meaningless (kvsift::error names the first offender).
template <class First, class Last>
void validate_finite(const score_sets& scores, First&& first, Last&& last, std::string_view where,
                     std::string_view arg) {
  for (int s = 0; s < scores.segments(); ++s) {
    const auto seg = scores[s];
    const int b = first(s), e = last(s);
    if (e <= b || detail::all_finite(seg.data() + b, e - b)) [[likely]] continue;
    for (int j = b; j < e; ++j) {  // name the first offender
      if (!std::isfinite(seg[j])) {
        throw make_error(where, std::string(arg) + "[" + std::to_string(s) + "][" +
                                    std::to_string(j) + "]",
                         seg[j], "a finite score (check_finite is on)");
      }
    }
  }
}

// Checks that no scores[s][j], j in [first(s), last(s)), is NaN. Every top-k selector runs it
// (check_finite or not): NaN compares neither above nor below anything, so a top-k over it is no
// ordering at all (std::nth_element's result is then unspecified: a wrong set, silently).
// Infinities order fine and stay allowed (score::lag marks unscored slots +inf). One pass over
// the candidates, before anything is written.
template <class First, class Last>
void validate_not_nan(const score_sets& scores, First&& first, Last&& last, std::string_view where,
                      std::string_view arg) {
  for (int s = 0; s < scores.segments(); ++s) {
    const auto seg = scores[s];
    const int b = std::max(first(s), 0);
    const int e = std::min(last(s), static_cast<int>(seg.size()));
    if (e <= b || !detail::any_nan(seg.data() + b, e - b)) [[likely]] continue;
    for (int j = b; j < e; ++j) {  // name the first NaN
      if (std::isnan(seg[j])) [[unlikely]] {
        throw make_error(where, std::string(arg) + "[" + std::to_string(s) + "][" +
                                    std::to_string(j) + "]",
                         seg[j], "a score that is not NaN (NaN keys or queries upstream?)");
      }
    }
  }
}

}  // namespace kvsift
