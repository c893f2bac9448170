// SPDX-License-Identifier: Apache-2.0
#pragma once

// SyncKV's static / dynamic split with Thrust. Mirrors select::static_dynamic (split, refresh,
// and select's merge) in the deterministic order of every kvsift top-k: higher score first, ties
// to the lower index; NaN last; -0.0 == +0.0.
//   static_dynamic_split    per segment: static = ranks [0, k_static), dynamic = ranks
//                           [k_static, k_static + k_dynamic); both ascending
//   static_dynamic_refresh  per segment: the top k_dyn of the indices [0, limit) that are not in
//                           the segment's static set (the anticipation), ascending
//   merge_sets              per segment the union of two disjoint ascending sets, ascending
// Counts are shapes: the CSR offsets of every output come from the host (budget::synckv's split).
// Algorithm (split, refresh): one 64-bit key per score, (segment << 33) | (excluded << 32) |
// descending score bits, a stable sort of the flat indices by key (ties keep index order), the
// ranks taken per segment, one sort of the taken flat indices (ascending within each segment),
// minus offsets[s]. Workspace 12 bytes per score (+1 byte per score for refresh's exclusions).

#include <kvsift/thrust/common.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvsift::thrust {

namespace detail {

struct sd_key_fn {
  const float* scores;
  const std::int32_t* offsets;
  int num_segments;
  const std::int32_t* limits;     // [S] or null (no limit)
  const unsigned char* excluded;  // [N] or null
  std::uint64_t* keys;
  std::int32_t* items;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(offsets, num_segments, e);
    const int j = static_cast<int>(e - offsets[s]);
    const bool out = (limits != nullptr && j >= limits[s]) || (excluded != nullptr && excluded[e] != 0);
    keys[e] = (static_cast<std::uint64_t>(s) << 33) | (static_cast<std::uint64_t>(out ? 1u : 0u) << 32) |
              static_cast<std::uint64_t>(descending_key(scores[e]));
    items[e] = static_cast<std::int32_t>(e);
  }
};

// out[t] = the flat index of rank skip[s] + (t - out_offsets[s]) of segment s.
struct sd_take_fn {
  const std::int32_t* sorted_items;
  const std::int32_t* offsets;
  const std::int32_t* out_offsets;
  const std::int32_t* skip;  // [S] ranks skipped (null: 0)
  int num_segments;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(out_offsets, num_segments, t);
    const std::int64_t rank = (skip == nullptr ? 0 : skip[s]) + (t - out_offsets[s]);
    out[t] = sorted_items[offsets[s] + rank];
  }
};

// skip[s] = static count of s (its CSR).
struct sd_skip_fn {
  const std::int32_t* static_offsets;
  KVSIFT_HOST_DEVICE std::int32_t operator()(int s) const {
    return static_offsets[s + 1] - static_offsets[s];
  }
};

struct sd_localize_fn {
  const std::int32_t* offsets;
  const std::int32_t* out_offsets;
  int num_segments;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(out_offsets, num_segments, t);
    out[t] -= offsets[s];
  }
};

struct sd_exclude_fn {
  const std::int32_t* offsets;
  const std::int32_t* set_offsets;
  const std::int32_t* set;
  int num_segments;
  unsigned char* excluded;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(set_offsets, num_segments, t);
    const std::int32_t j = set[t];
    if (j >= 0 && j < offsets[s + 1] - offsets[s]) {
      excluded[offsets[s] + j] = 1;
    }
  }
};

// One thread per entry of a or b: its slot in the union is its own index plus the count of the
// other set's entries below it (the sets are disjoint).
struct merge_sets_fn {
  const std::int32_t* a_offsets;
  const std::int32_t* a;
  const std::int32_t* b_offsets;
  const std::int32_t* b;
  std::int64_t num_a;
  int num_segments;
  const std::int32_t* out_offsets;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const bool from_a = e < num_a;
    const std::int64_t t = from_a ? e : e - num_a;
    const std::int32_t* own_off = from_a ? a_offsets : b_offsets;
    const std::int32_t* own = from_a ? a : b;
    const std::int32_t* other_off = from_a ? b_offsets : a_offsets;
    const std::int32_t* other = from_a ? b : a;
    const int s = segment_of(own_off, num_segments, t);
    const int i = static_cast<int>(t - own_off[s]);
    const int below = count_below(other + other_off[s], other_off[s + 1] - other_off[s], own[t]);
    out[out_offsets[s] + i + below] = own[t];
  }
};

struct sd_layout {
  std::uint64_t* keys = nullptr;
  std::int32_t* items = nullptr;
  std::int32_t* skip = nullptr;
  unsigned char* excluded = nullptr;
  std::size_t bytes = 0;
};

inline sd_layout make_sd_layout(std::byte* ws, std::int64_t num_items, int num_segments,
                                bool with_exclusions) {
  carver c{ws};
  sd_layout l;
  l.keys = c.take<std::uint64_t>(static_cast<std::size_t>(num_items));
  l.items = c.take<std::int32_t>(static_cast<std::size_t>(num_items));
  l.skip = c.take<std::int32_t>(static_cast<std::size_t>(num_segments));
  if (with_exclusions) l.excluded = c.take<unsigned char>(static_cast<std::size_t>(num_items));
  l.bytes = c.bytes;
  return l;
}

template <class Policy>
void sd_take_sorted(const Policy& exec, const std::int32_t* items, const std::int32_t* offsets,
                    int num_segments, const std::int32_t* out_offsets, std::int64_t num_out,
                    const std::int32_t* skip, std::int32_t* out) {
  if (num_out == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  ::thrust::for_each_n(exec, zero, num_out,
                       sd_take_fn{items, offsets, out_offsets, skip, num_segments, out});
  ::thrust::sort(exec, out, out + num_out);  // flat indices: ascending within each segment
  ::thrust::for_each_n(exec, zero, num_out, sd_localize_fn{offsets, out_offsets, num_segments, out});
}

}  // namespace detail

// Bytes of workspace static_dynamic_split needs for num_items scores in num_segments segments.
inline std::size_t static_dynamic_split_workspace_bytes(std::int64_t num_items, int num_segments) {
  return detail::make_sd_layout(nullptr, num_items, num_segments, false).bytes;
}
// Bytes of workspace static_dynamic_refresh needs.
inline std::size_t static_dynamic_refresh_workspace_bytes(std::int64_t num_items, int num_segments) {
  return detail::make_sd_layout(nullptr, num_items, num_segments, true).bytes;
}

// select::static_dynamic::split on the device.
//   scores          [num_items] CSR by offsets ([S + 1])
//   static_offsets  [S + 1] CSR of the static sets: k_static(s) = floor(rho * min(budget, n_s))
//   dynamic_offsets [S + 1] CSR of the dynamic sets: min(budget, n_s) - k_static(s)
//   num_static, num_dynamic  host copies of the last offsets
//   static_out, dynamic_out  local indices, ascending per segment
// k_static(s) + k_dynamic(s) <= n_s (not checked on the device).
template <class Policy>
void static_dynamic_split(const Policy& exec, const float* scores, const std::int32_t* offsets,
                          int num_segments, std::int64_t num_items,
                          const std::int32_t* static_offsets, std::int64_t num_static,
                          std::int32_t* static_out, const std::int32_t* dynamic_offsets,
                          std::int64_t num_dynamic, std::int32_t* dynamic_out, void* workspace,
                          std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::static_dynamic_split";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(num_items >= 0 && num_items <= 0x7fffffff, where, "num_items", num_items,
          "in [0, 2^31) (int32 token indices)");
  require(num_static >= 0 && num_dynamic >= 0 && num_static + num_dynamic <= num_items, where,
          "num_static + num_dynamic", num_static + num_dynamic, "in [0, num_items]");
  const auto l = detail::make_sd_layout(static_cast<std::byte*>(workspace), num_items,
                                        num_segments, false);
  detail::check_workspace(where, workspace, workspace_bytes, l.bytes);
  if (num_segments == 0 || num_items == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  ::thrust::for_each_n(exec, zero, num_items,
                       detail::sd_key_fn{scores, offsets, num_segments, nullptr, nullptr, l.keys,
                                         l.items});
  ::thrust::stable_sort_by_key(exec, l.keys, l.keys + num_items, l.items);
  ::thrust::transform(exec, ::thrust::counting_iterator<int>(0),
                      ::thrust::counting_iterator<int>(num_segments), l.skip,
                      detail::sd_skip_fn{static_offsets});
  detail::sd_take_sorted(exec, l.items, offsets, num_segments, static_offsets, num_static, nullptr,
                         static_out);
  detail::sd_take_sorted(exec, l.items, offsets, num_segments, dynamic_offsets, num_dynamic, l.skip,
                         dynamic_out);
}

// select::static_dynamic::refresh on the device: dynamic segment s = the top k_dyn(s) of the
// indices [0, limits[s]) of segment s not in static set s.
//   limits          [S] device
//   static_offsets, static_sets  the static sets (local indices, CSR)
//   dynamic_offsets [S + 1] output CSR: k_dyn(s), at most the candidates (limit - static ones
//                   below it; SyncKV: k_dyn <= n - k_static always); num_dynamic its last entry
template <class Policy>
void static_dynamic_refresh(const Policy& exec, const float* scores, const std::int32_t* offsets,
                            int num_segments, std::int64_t num_items, const std::int32_t* limits,
                            const std::int32_t* static_offsets, const std::int32_t* static_sets,
                            std::int64_t num_static, const std::int32_t* dynamic_offsets,
                            std::int64_t num_dynamic, std::int32_t* dynamic_out, void* workspace,
                            std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::static_dynamic_refresh";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(num_items >= 0 && num_items <= 0x7fffffff, where, "num_items", num_items,
          "in [0, 2^31) (int32 token indices)");
  require(num_static >= 0, where, "num_static", num_static, ">= 0");
  require(num_dynamic >= 0 && num_dynamic <= num_items, where, "num_dynamic", num_dynamic,
          "in [0, num_items]");
  require(limits != nullptr || num_segments == 0, where, "limits", "null", "[num_segments] limits");
  const auto l = detail::make_sd_layout(static_cast<std::byte*>(workspace), num_items,
                                        num_segments, true);
  detail::check_workspace(where, workspace, workspace_bytes, l.bytes);
  if (num_segments == 0 || num_items == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  ::thrust::fill_n(exec, l.excluded, num_items, static_cast<unsigned char>(0));
  if (num_static > 0) {
    ::thrust::for_each_n(exec, zero, num_static,
                         detail::sd_exclude_fn{offsets, static_offsets, static_sets, num_segments,
                                               l.excluded});
  }
  ::thrust::for_each_n(exec, zero, num_items,
                       detail::sd_key_fn{scores, offsets, num_segments, limits, l.excluded, l.keys,
                                         l.items});
  ::thrust::stable_sort_by_key(exec, l.keys, l.keys + num_items, l.items);
  detail::sd_take_sorted(exec, l.items, offsets, num_segments, dynamic_offsets, num_dynamic,
                         nullptr, dynamic_out);
}

// out segment s = a segment s ∪ b segment s, ascending (select::static_dynamic::select's merge).
// a and b ascending and disjoint per segment; out_offsets[s] = a_offsets[s] + b_offsets[s]
// (host). num_a, num_b: host copies of the last offsets.
template <class Policy>
void merge_sets(const Policy& exec, const std::int32_t* a_offsets, const std::int32_t* a,
                std::int64_t num_a, const std::int32_t* b_offsets, const std::int32_t* b,
                std::int64_t num_b, int num_segments, const std::int32_t* out_offsets,
                std::int32_t* out) {
  constexpr std::string_view where = "thrust::merge_sets";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(num_a >= 0 && num_b >= 0, where, "num_a + num_b", num_a + num_b, ">= 0");
  if (num_segments == 0 || num_a + num_b == 0) {
    return;
  }
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_a + num_b,
                       detail::merge_sets_fn{a_offsets, a, b_offsets, b, num_a, num_segments,
                                             out_offsets, out});
}

}  // namespace kvsift::thrust
