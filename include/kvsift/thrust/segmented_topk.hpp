// SPDX-License-Identifier: Apache-2.0
#pragma once

// Deterministic segmented top-k with Thrust. Mirrors cpu/segmented_topk.hpp and
// cuda/segmented_topk.cuh.
//
// Semantics (METHODS.md, general conventions): in segment s keep k_s = kept_offsets[s + 1] -
// kept_offsets[s] tokens: the protected ones (the first `sink` and the last window[s], see
// topk_protection) and then the highest scores; ties go to the lower index; the kept indices
// are written ascending. NaN ranks below every number; -0.0 == +0.0.
//
// Algorithm: one 64-bit key per score, (segment << 33) | (unprotected << 32) | descending score
// bits, so the key order is (segment, protected first, -score); a stable sort by key of the flat
// indices (stable: equal keys keep index order, i.e. ties to the lower index); the first k_s of
// each segment's range are copied out; one plain sort of those flat indices orders them within
// their segment (flat indices of segment s lie in [offsets[s], offsets[s + 1])), and subtracting
// offsets[s] makes them local. Cost: a sort of n and of sum(k) keys; workspace 12 bytes per score.
//
// Two-phase use:
//   std::size_t bytes = kvsift::thrust::segmented_topk_workspace_bytes(num_items);
//   ... allocate `bytes` where the policy's system can reach ...
//   kvsift::thrust::kept_offsets(exec, offsets, budgets, num_segments, kept_offsets);
//   kvsift::thrust::segmented_topk(exec, scores, offsets, num_segments, num_items,
//                                  kept_offsets, num_kept, out, ws, bytes);
//
// segmented_evict_one: the decode-step special case (StreamingLLM's rolling window, H2O's
// eviction: a head-sequence one token over its budget drops one): per segment one scan for the
// worst unprotected token, no sort, no workspace. It keeps exactly what segmented_topk keeps for
// the same counts and protection.

#include <kvsift/thrust/common.hpp>

#include <thrust/transform_reduce.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvsift::thrust {

// Tokens kept regardless of their score. They count towards k_s.
struct topk_protection {
  int sink = 0;                          // the first `sink` tokens of every segment
  const std::int32_t* window = nullptr;  // [num_segments] the last window[s] tokens; null = none
};

namespace detail {

struct topk_key_fn {
  const float* scores;
  const std::int32_t* offsets;
  int num_segments;
  topk_protection protect;
  std::uint64_t* keys;
  std::int32_t* items;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(offsets, num_segments, e);
    const int j = static_cast<int>(e - offsets[s]);
    const int n = offsets[s + 1] - offsets[s];
    const int w = protect.window == nullptr ? 0 : protect.window[s];
    const bool kept_anyway = j < protect.sink || j >= n - w;
    keys[e] = (static_cast<std::uint64_t>(s) << 33) |
              (static_cast<std::uint64_t>(kept_anyway ? 0u : 1u) << 32) |
              static_cast<std::uint64_t>(descending_key(scores[e]));
    items[e] = static_cast<std::int32_t>(e);
  }
};

struct take_first_fn {
  const std::int32_t* sorted_items;
  const std::int32_t* offsets;
  const std::int32_t* kept_offsets;
  int num_segments;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(kept_offsets, num_segments, t);
    out[t] = sorted_items[offsets[s] + (t - kept_offsets[s])];
  }
};

struct localize_fn {
  const std::int32_t* offsets;
  const std::int32_t* kept_offsets;
  int num_segments;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(kept_offsets, num_segments, t);
    out[t] -= offsets[s];
  }
};

struct kept_count_fn {
  const std::int32_t* offsets;
  const std::int32_t* budgets;
  KVSIFT_HOST_DEVICE std::int32_t operator()(int s) const {
    const std::int32_t n = offsets[s + 1] - offsets[s];
    return budgets[s] < n ? budgets[s] : n;
  }
};

inline detail::carver topk_layout(std::byte* ws, std::int64_t num_items, std::uint64_t** keys,
                                  std::int32_t** items) {
  detail::carver c{ws};
  *keys = c.take<std::uint64_t>(static_cast<std::size_t>(num_items));
  *items = c.take<std::int32_t>(static_cast<std::size_t>(num_items));
  return c;
}

// The first offender of segment_topk's preconditions, scanning the segments in order; in
// segment s, in this order: offsets[0] != 0 or kept_offsets[0] != 0 (s = 0), offsets[s + 1] <
// offsets[s], offsets[S] != num_items or kept_offsets[S] != num_kept (s = S - 1), and k_s that
// does not fit (outside [0, n_s], or k_s < n_s with fewer than sink + window[s] slots for the
// protected tokens). s = num_segments when all hold. Together they keep every read inside the
// items and every write inside out[0, num_kept).
enum class topk_fault : int {
  none, offsets_first, kept_first, offsets_order, offsets_last, kept_last, misfit
};
struct topk_misfit {
  int s;
  topk_fault fault;
  std::int64_t value;  // the offending entry (the count k_s for misfit)
  std::int64_t other;  // what it was compared with (offsets[s], n_s for misfit)
  int w;               // window[s] (misfit)
};
struct topk_misfit_fn {
  const std::int32_t* offsets;
  const std::int32_t* kept_offsets;
  int num_segments;
  std::int64_t num_items;
  std::int64_t num_kept;
  topk_protection protect;
  KVSIFT_HOST_DEVICE topk_misfit operator()(int s) const {
    const bool last = s + 1 == num_segments;
    if (s == 0 && offsets[0] != 0) return {s, topk_fault::offsets_first, offsets[0], 0, 0};
    if (s == 0 && kept_offsets[0] != 0) return {s, topk_fault::kept_first, kept_offsets[0], 0, 0};
    if (offsets[s + 1] < offsets[s]) {
      return {s, topk_fault::offsets_order, offsets[s + 1], offsets[s], 0};
    }
    if (last && offsets[s + 1] != num_items) {
      return {s, topk_fault::offsets_last, offsets[s + 1], num_items, 0};
    }
    if (last && kept_offsets[s + 1] != num_kept) {
      return {s, topk_fault::kept_last, kept_offsets[s + 1], num_kept, 0};
    }
    // 64-bit: another segment's offsets may be anything (the first offender is reported)
    const std::int64_t n = std::int64_t{offsets[s + 1]} - offsets[s];
    const std::int64_t k = std::int64_t{kept_offsets[s + 1]} - kept_offsets[s];
    const int w = protect.window == nullptr ? 0 : protect.window[s];
    const bool fits = k >= 0 && k <= n && (k == n || k >= std::int64_t{protect.sink} + w);
    return fits ? topk_misfit{num_segments, topk_fault::none, 0, 0, 0}
                : topk_misfit{s, topk_fault::misfit, k, n, w};
  }
};
struct first_misfit {
  KVSIFT_HOST_DEVICE topk_misfit operator()(const topk_misfit& a, const topk_misfit& b) const {
    return a.s <= b.s ? a : b;
  }
};

// The kvsift::error for an offender found by topk_misfit_fn.
[[noreturn]] inline void throw_topk_misfit(std::string_view where, const topk_misfit& bad,
                                           int num_segments, int sink) {
  const std::string S = std::to_string(num_segments);
  const std::string s1 = std::to_string(bad.s + 1);
  switch (bad.fault) {
    case topk_fault::offsets_first:
      throw make_error(where, "offsets[0]", bad.value, "0 (CSR offsets)");
    case topk_fault::kept_first:
      throw make_error(where, "kept_offsets[0]", bad.value, "0 (CSR offsets)");
    case topk_fault::offsets_order:
      throw make_error(where, "offsets[" + s1 + "]", bad.value,
                       ">= offsets[" + std::to_string(bad.s) + "] (" + std::to_string(bad.other) +
                           "): non-decreasing CSR offsets");
    case topk_fault::offsets_last:
      throw make_error(where, "offsets[" + S + "]", bad.value,
                       "num_items (" + std::to_string(bad.other) + ")");
    case topk_fault::kept_last:
      throw make_error(where, "num_kept", bad.other,
                       "kept_offsets[" + S + "] (" + std::to_string(bad.value) + ")");
    default:
      throw make_error(where, "kept_offsets[" + s1 + "] - kept_offsets[" + std::to_string(bad.s) +
                                  "]",
                       bad.value,
                       "in [0, n = " + std::to_string(bad.other) +
                           "], and when below n >= the protected tokens: sink " +
                           std::to_string(sink) + " + window " + std::to_string(bad.w));
  }
}

// Segment s: the worst unprotected token (largest descending_key, i.e. lowest score, NaN
// lowest; among equals the higher index, since the top-k keeps the lower) when k_s = n_s - 1;
// -1 when the segment keeps everything or has no unprotected token.
struct evict_victim_fn {
  const float* scores;
  const std::int32_t* offsets;
  const std::int32_t* kept_offsets;
  topk_protection protect;
  std::int32_t* victims;
  KVSIFT_HOST_DEVICE void operator()(int s) const {
    const int b = offsets[s];
    const int n = offsets[s + 1] - b;
    const int k = kept_offsets[s + 1] - kept_offsets[s];
    const int w = protect.window == nullptr ? 0 : protect.window[s];
    const int last = n - w;
    int victim = -1;
    if (k < n) {
      std::uint32_t worst = 0;
      for (int j = protect.sink; j < last; ++j) {
        const std::uint32_t key = descending_key(scores[b + j]);
        if (victim < 0 || key >= worst) {
          worst = key;
          victim = j;
        }
      }
    }
    victims[s] = victim;
  }
};

struct evict_write_fn {
  const std::int32_t* kept_offsets;
  const std::int32_t* victims;
  int num_segments;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(kept_offsets, num_segments, t);
    const int i = static_cast<int>(t - kept_offsets[s]);
    const int v = victims[s];
    out[t] = v < 0 || i < v ? i : i + 1;
  }
};

}  // namespace detail

// One-token eviction per segment (see the file comment).
//   scores        [num_items] CSR by `offsets` ([num_segments + 1])
//   kept_offsets  [num_segments + 1] output CSR; every k_s must be n_s (nothing leaves) or
//                 n_s - 1 with at least one unprotected token (n_s - 1 >= sink + window[s]):
//                 counts are host arithmetic (kept_offsets from thrust::kept_offsets, or the
//                 host's lengths and budgets); num_kept = kept_offsets[S]
//   out           [num_kept] kept local indices, ascending per segment: every slot but the victim
//   victims       [num_segments] the dropped local slot of each segment, or -1 (none)
// The kept sets equal segmented_topk's for the same counts and protection. No workspace, no
// host synchronisation. Cost O(n_s) per segment (one thread each) + O(num_kept).
template <class Policy>
void segmented_evict_one(const Policy& exec, const float* scores, const std::int32_t* offsets,
                         int num_segments, const std::int32_t* kept_offsets, std::int64_t num_kept,
                         std::int32_t* out, std::int32_t* victims, topk_protection protect = {}) {
  constexpr std::string_view where = "thrust::segmented_evict_one";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(num_kept >= 0, where, "num_kept", num_kept, ">= 0");
  require(protect.sink >= 0, where, "protect.sink", protect.sink, ">= 0");
  if (num_segments == 0) {
    return;
  }
  require(offsets != nullptr && kept_offsets != nullptr && victims != nullptr &&
              (num_kept == 0 || out != nullptr),
          where, "offsets / kept_offsets / out / victims", "null",
          "CSR offsets, the kept CSR and [num_segments] victims");
  const ::thrust::counting_iterator<int> zero(0);
  ::thrust::for_each_n(exec, zero, num_segments,
                       detail::evict_victim_fn{scores, offsets, kept_offsets, protect, victims});
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_kept,
                       detail::evict_write_fn{kept_offsets, victims, num_segments, out});
}

// Bytes of caller workspace segmented_topk needs for `num_items` scores in all.
inline std::size_t segmented_topk_workspace_bytes(std::int64_t num_items) {
  std::uint64_t* k = nullptr;
  std::int32_t* i = nullptr;
  return detail::topk_layout(nullptr, num_items, &k, &i).bytes;
}

// kept_offsets[0] = 0, kept_offsets[s + 1] = kept_offsets[s] + min(budgets[s], n_s): the CSR
// offsets of a top-k output. budgets must be >= 0.
template <class Policy>
void kept_offsets(const Policy& exec, const std::int32_t* offsets, const std::int32_t* budgets,
                  int num_segments, std::int32_t* out_offsets) {
  require(num_segments >= 0, "thrust::kept_offsets", "num_segments", num_segments, ">= 0");
  ::thrust::fill_n(exec, out_offsets, 1, 0);
  auto counts = ::thrust::make_transform_iterator(::thrust::counting_iterator<int>(0),
                                                  detail::kept_count_fn{offsets, budgets});
  ::thrust::inclusive_scan(exec, counts, counts + num_segments, out_offsets + 1);
}

// Segmented top-k (see the file comment).
//   scores        [num_items] CSR by `offsets` ([num_segments + 1], offsets[S] = num_items)
//   kept_offsets  [num_segments + 1] output CSR; k_s = kept_offsets[s + 1] - kept_offsets[s] must
//                 be <= n_s and >= sink + window[s] when k_s < n_s; num_kept = kept_offsets[S]
//   out           [num_kept] kept local indices, ascending per segment
//   workspace     >= segmented_topk_workspace_bytes(num_items) bytes
//   check         verify the offsets, num_kept and the kept counts first (one reduction over
//                 the segments, which synchronises with the device; offsets[0] = 0, non-decreasing,
//                 offsets[S] = num_items, the same of kept_offsets with num_kept, and every k_s
//                 fitting; a kvsift::error naming the first offender throws before anything is
//                 written).
//                 false skips it: no host synchronisation, for a captured decode step.
template <class Policy>
void segmented_topk(const Policy& exec, const float* scores, const std::int32_t* offsets,
                    int num_segments, std::int64_t num_items, const std::int32_t* kept_offsets,
                    std::int64_t num_kept, std::int32_t* out, void* workspace,
                    std::size_t workspace_bytes, topk_protection protect = {}, bool check = true) {
  constexpr std::string_view where = "thrust::segmented_topk";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(num_items >= 0 && num_items <= 0x7fffffff, where, "num_items", num_items,
          "in [0, 2^31) (int32 token indices)");
  require(num_kept >= 0 && num_kept <= num_items, where, "num_kept", num_kept,
          "in [0, num_items = " + std::to_string(num_items) + "]");
  require(protect.sink >= 0, where, "protect.sink", protect.sink, ">= 0");
  std::uint64_t* keys = nullptr;
  std::int32_t* items = nullptr;
  const std::size_t need =
      detail::topk_layout(static_cast<std::byte*>(workspace), num_items, &keys, &items).bytes;
  detail::check_workspace(where, workspace, workspace_bytes, need);
  if (check) {
    // no segments: nothing to read and nothing to keep
    require(num_segments > 0 || num_items == 0, where, "num_items", num_items,
            "0 (no segments)");
    require(num_segments > 0 || num_kept == 0, where, "num_kept", num_kept, "0 (no segments)");
  }
  if (num_segments == 0) {
    return;
  }
  if (check) {
    const detail::topk_misfit none{num_segments, detail::topk_fault::none, 0, 0, 0};
    const detail::topk_misfit bad = ::thrust::transform_reduce(
        exec, ::thrust::counting_iterator<int>(0), ::thrust::counting_iterator<int>(num_segments),
        detail::topk_misfit_fn{offsets, kept_offsets, num_segments, num_items, num_kept, protect},
        none, detail::first_misfit{});
    if (bad.s != num_segments) [[unlikely]] {
      detail::throw_topk_misfit(where, bad, num_segments, protect.sink);
    }
  }
  if (num_items == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  ::thrust::for_each_n(exec, zero, num_items,
                       detail::topk_key_fn{scores, offsets, num_segments, protect, keys, items});
  ::thrust::stable_sort_by_key(exec, keys, keys + num_items, items);
  ::thrust::for_each_n(exec, zero, num_kept,
                       detail::take_first_fn{items, offsets, kept_offsets, num_segments, out});
  ::thrust::sort(exec, out, out + num_kept);
  ::thrust::for_each_n(exec, zero, num_kept,
                       detail::localize_fn{offsets, kept_offsets, num_segments, out});
}

}  // namespace kvsift::thrust
