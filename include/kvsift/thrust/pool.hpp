// SPDX-License-Identifier: Apache-2.0
#pragma once

// The two tiers of store::tiered with Thrust: a device tier (each head-sequence's working set,
// its rows sorted by original position) and a host pool (every token of every head-sequence,
// write-through). Mirrors store::tiered's append / install / promote and
// detail::pending_recalls' working set (method/schedule/two_tier.hpp), the pieces the two-tier
// schedules (deferred_recall: SyncKV, HeteroCache; speculative: FreeKV) run on the device:
//   tier_append             append one row per segment at the end of its working set
//                                                                  one thread per (segment, c)
//   working_set_positions   a target's new working set: its new prefill part followed by its
//                           resident positions >= boundary (the decode tokens)
//                                                                  one thread per output entry
//   tier_install            set the working set of target segments to exactly the given
//                           positions: a resident row keeps its bytes (copied from the tier), a
//                           missing one is copied from the host pool (the recall). Out of place
//                           through workspace (a packed staging of the new rows), then scattered
//                           into the tier, so rows never race.     one thread per (row, c)
//
// Layout. The tier is a strided [num_segments, capacity, d] array of keys and one of values plus
// [num_segments, capacity] positions; its lengths are CSR offsets (offsets[s + 1] - offsets[s]
// = resident rows of s), which the host owns (every count is a shape: the host knows how many
// rows each working set holds) and uploads. Seen as segmented_rows (strided, segment_stride =
// capacity * d, positions = the tier's) it is what thrust::attention_over reads.
// The pool is any segmented_rows with positions (ascending): host memory the policy can reach
// (under CUDA pinned, mapped host memory; under the CPP/OMP systems plain host memory). A recall
// reads only the rows the tier misses. Positions of a target must each be resident or in the
// pool (not checked on the device: the schedules only name pool positions).
//
// thrust::tiered_store (tiered_store.hpp) is the store built from these pieces the other way the
// design asks for: its tier keeps physical slots unordered and the plan sorted, so an install
// writes only the arriving rows and moves no resident one (it reuses tier_rows and find_sorted).

#include <kvsift/thrust/common.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvsift::thrust {

// The device tier: strided rows of every segment, `capacity` slots each.
template <class T>
struct tier_rows {
  T* keys = nullptr;                  // [num_segments, capacity, dim]
  T* values = nullptr;                // [num_segments, capacity, dim]
  std::int32_t* positions = nullptr;  // [num_segments, capacity] ascending within a segment
  int num_segments = 0;
  int capacity = 0;
  int dim = 0;

  // The tier as attention / scorers read it, with lengths from `offsets` (CSR, device).
  [[nodiscard]] segmented_rows<T> key_rows(const std::int32_t* offsets) const {
    return {keys, offsets, positions, static_cast<std::int64_t>(capacity) * dim, num_segments, dim};
  }
  [[nodiscard]] segmented_rows<T> value_rows(const std::int32_t* offsets) const {
    return {values, offsets, positions, static_cast<std::int64_t>(capacity) * dim, num_segments, dim};
  }
  void validate(std::string_view where) const {
    require(num_segments >= 0, where, "tier.num_segments", num_segments, ">= 0");
    require(capacity > 0, where, "tier.capacity", capacity, "> 0");
    require(dim > 0, where, "tier.dim", dim, "> 0");
    require(num_segments == 0 || (keys != nullptr && values != nullptr && positions != nullptr),
            where, "tier", "null", "[num_segments, capacity, dim] rows and their positions");
  }
};

namespace detail {

// Index of `pos` among the first n entries of an ascending array (stride 1), or -1.
KVSIFT_HOST_DEVICE inline int find_sorted(const std::int32_t* a, int n, std::int32_t pos) {
  const int lo = count_below(a, n, pos);
  return lo < n && a[lo] == pos ? lo : -1;
}

// Index of `pos` in segment s of a segmented_rows (positions ascending), or -1.
template <class T>
KVSIFT_HOST_DEVICE inline int find_row(const segmented_rows<T>& rows, int s, std::int32_t pos) {
  int lo = 0;
  int hi = rows.length(s);
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (rows.position(s, mid) < pos) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < rows.length(s) && rows.position(s, lo) == pos ? lo : -1;
}

template <class T>
struct tier_append_fn {
  tier_rows<T> tier;
  const std::int32_t* offsets;        // lengths before the append
  const T* keys;                      // [S, d]
  const T* values;                    // [S, d]
  const std::int32_t* new_positions;  // [S]
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = static_cast<int>(e / tier.dim);
    const int c = static_cast<int>(e % tier.dim);
    const std::int64_t slot = static_cast<std::int64_t>(s) * tier.capacity + (offsets[s + 1] - offsets[s]);
    tier.keys[slot * tier.dim + c] = keys[e];
    tier.values[slot * tier.dim + c] = values[e];
    if (c == 0) {
      tier.positions[slot] = new_positions[s];
    }
  }
};

struct working_set_fn {
  const std::int32_t* part_offsets;  // [R + 1]
  const std::int32_t* part;
  const std::int32_t* targets;       // [R] segment of each target
  const std::int32_t* tier_positions;
  const std::int32_t* tier_offsets;  // lengths of the tier
  int capacity;
  const std::int32_t* boundary;      // [R]
  const std::int32_t* out_offsets;   // [R + 1]
  int num_targets;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int r = segment_of(out_offsets, num_targets, t);
    const int i = static_cast<int>(t - out_offsets[r]);
    const int m = part_offsets[r + 1] - part_offsets[r];
    if (i < m) {
      out[t] = part[part_offsets[r] + i];
      return;
    }
    const int s = targets[r];
    const std::int32_t* pos = tier_positions + static_cast<std::int64_t>(s) * capacity;
    const int n = tier_offsets[s + 1] - tier_offsets[s];
    int lo = 0;  // first resident position >= boundary
    int hi = n;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (pos[mid] < boundary[r]) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    out[t] = pos[lo + (i - m)];
  }
};

template <class T>
struct install_stage_fn {
  segmented_rows<T> tier_k, tier_v;  // current tier (strided)
  segmented_rows<T> pool_k, pool_v;  // host pool
  const std::int32_t* targets;
  const std::int32_t* target_offsets;
  const std::int32_t* target_positions;
  int num_targets;
  T* staged_k;  // [num_rows, d]
  T* staged_v;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int d = tier_k.dim;
    const std::int64_t t = e / d;
    const int c = static_cast<int>(e % d);
    const int r = segment_of(target_offsets, num_targets, t);
    const int s = targets[r];
    const std::int32_t pos = target_positions[t];
    const int j = find_row(tier_k, s, pos);
    if (j >= 0) {
      staged_k[e] = tier_k.row(s, j)[c];
      staged_v[e] = tier_v.row(s, j)[c];
      return;
    }
    const int i = find_row(pool_k, s, pos);  // the recall: a row the tier misses
    staged_k[e] = pool_k.row(s, i)[c];
    staged_v[e] = pool_v.row(s, i)[c];
  }
};

template <class T>
struct install_scatter_fn {
  tier_rows<T> tier;
  const std::int32_t* targets;
  const std::int32_t* target_offsets;
  const std::int32_t* target_positions;
  int num_targets;
  const T* staged_k;
  const T* staged_v;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int d = tier.dim;
    const std::int64_t t = e / d;
    const int c = static_cast<int>(e % d);
    const int r = segment_of(target_offsets, num_targets, t);
    const std::int64_t slot =
        static_cast<std::int64_t>(targets[r]) * tier.capacity + (t - target_offsets[r]);
    tier.keys[slot * d + c] = staged_k[e];
    tier.values[slot * d + c] = staged_v[e];
    if (c == 0) {
      tier.positions[slot] = target_positions[t];
    }
  }
};

}  // namespace detail

// Appends row s of keys / values ([num_segments, d] each) at slot offsets[s + 1] - offsets[s] of
// segment s with position new_positions[s]. The caller's lengths grow by one (host: the append
// is a shape). The host pool's write-through copy is the caller's (a host copy).
template <class Policy, Element T>
void tier_append(const Policy& exec, const tier_rows<T>& tier, const std::int32_t* offsets,
                 const T* keys, const T* values, const std::int32_t* new_positions) {
  constexpr std::string_view where = "thrust::tier_append";
  tier.validate(where);
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0),
                       static_cast<std::int64_t>(tier.num_segments) * tier.dim,
                       detail::tier_append_fn<T>{tier, offsets, keys, values, new_positions});
}

// out segment r = part segment r followed by the tier positions of segment targets[r] that are
// >= boundary[r] (ascending: a target's part lies below its boundary). out_offsets [R + 1] come
// from the host (|part_r| + the resident decode tokens of targets[r]). pending_recalls'
// working_set().
template <class Policy>
void working_set_positions(const Policy& exec, const std::int32_t* part_offsets,
                           const std::int32_t* part, const std::int32_t* targets, int num_targets,
                           const std::int32_t* tier_positions, const std::int32_t* tier_offsets,
                           int capacity, const std::int32_t* boundary,
                           const std::int32_t* out_offsets, std::int64_t num_out,
                           std::int32_t* out) {
  constexpr std::string_view where = "thrust::working_set_positions";
  require(num_targets >= 0, where, "num_targets", num_targets, ">= 0");
  require(capacity > 0, where, "capacity", capacity, "> 0");
  require(num_out >= 0, where, "num_out", num_out, ">= 0");
  if (num_targets == 0) {
    return;
  }
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_out,
                       detail::working_set_fn{part_offsets, part, targets, tier_positions,
                                              tier_offsets, capacity, boundary, out_offsets,
                                              num_targets, out});
}

// Bytes of workspace tier_install needs for `num_rows` rows of `dim` channels.
template <Element T>
std::size_t tier_install_workspace_bytes(std::int64_t num_rows, int dim) {
  detail::carver c{};
  (void)c.take<T>(static_cast<std::size_t>(num_rows) * dim);
  (void)c.take<T>(static_cast<std::size_t>(num_rows) * dim);
  return c.bytes;
}

// Sets the working set of each target segment targets[r] to exactly target_positions[
// target_offsets[r] .. target_offsets[r + 1]) (ascending, each resident or in the pool): a
// resident row is kept (its bytes from the tier), a missing one recalled from the pool. Segments
// not named keep their rows. The caller's lengths of the targets become the target counts.
//   tier_offsets    CSR lengths of the tier before the install
//   pool_k, pool_v  the host pool as segmented_rows (same segments as the tier, positions set)
//   num_rows        target_offsets[R] (host copy); a target's count must fit the capacity
//   workspace       >= tier_install_workspace_bytes<T>(num_rows, dim)
// Store::tiered's install (after a recall) and promote (a synchronous recall) both end here.
template <class Policy, Element T>
void tier_install(const Policy& exec, const tier_rows<T>& tier, const std::int32_t* tier_offsets,
                  const segmented_rows<T>& pool_k, const segmented_rows<T>& pool_v,
                  const std::int32_t* targets, int num_targets, const std::int32_t* target_offsets,
                  const std::int32_t* target_positions, std::int64_t num_rows, void* workspace,
                  std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::tier_install";
  tier.validate(where);
  pool_k.validate(where, "pool_k");
  pool_v.validate(where, "pool_v");
  require(pool_k.dim == tier.dim && pool_v.dim == tier.dim && pool_k.num_segments == tier.num_segments &&
              pool_v.num_segments == tier.num_segments,
          where, "pool", "a different shape", "the tier's segments and dim");
  require(num_targets >= 0 && num_targets <= tier.num_segments, where, "num_targets", num_targets,
          "in [0, tier.num_segments]");
  require(num_rows >= 0, where, "num_rows", num_rows, ">= 0");
  detail::carver c{static_cast<std::byte*>(workspace)};
  T* staged_k = c.take<T>(static_cast<std::size_t>(num_rows) * tier.dim);
  T* staged_v = c.take<T>(static_cast<std::size_t>(num_rows) * tier.dim);
  detail::check_workspace(where, workspace, workspace_bytes, c.bytes);
  if (num_targets == 0 || num_rows == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  const std::int64_t n = num_rows * tier.dim;
  ::thrust::for_each_n(exec, zero, n,
                       detail::install_stage_fn<T>{tier.key_rows(tier_offsets),
                                                   tier.value_rows(tier_offsets), pool_k, pool_v,
                                                   targets, target_offsets, target_positions,
                                                   num_targets, staged_k, staged_v});
  ::thrust::for_each_n(exec, zero, n,
                       detail::install_scatter_fn<T>{tier, targets, target_offsets,
                                                     target_positions, num_targets, staged_k,
                                                     staged_v});
}

}  // namespace kvsift::thrust
