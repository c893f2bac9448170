// SPDX-License-Identifier: Apache-2.0
#pragma once

// Gather and compaction of kept KV rows with Thrust: the step that makes a kept set physically
// smaller (DESIGN §7.1). Mirrors store::basic_store::retain / gather and cuda/gather.cuh.
//   gather_rows   src rows (any segmented_rows addressing) -> dense [segments, capacity, d]
//   compact_rows  in place on a dense [segments, capacity, d] array (+ positions): kept row i of
//                 segment s moves to slot i. Out of place through caller workspace, because
//                 parallel in-place moves would race (slot i may still be read as kept[i'] = i).
// One thread per (kept row, channel). Kept sets are CSR (`kept_offsets`, local indices).
//
// A decode step's device store (a dense [segments, capacity, d] array plus [segments, capacity]
// positions, lengths in a CSR that the host keeps, since lengths are shapes) also needs:
//   append_rows       one row per segment written at its slot n_s (a decode token's K or V),
//                     one thread per (segment, channel)       mirrors store::basic_store::append
//   pack_rows         every resident row (and / or its position) to a packed CSR array, e.g. a
//                     per-slot side column (H2O's running scores) packed for a top-k, or the
//                     positions of a plan that reads every slot; one thread per (row, channel)
//   gather_positions  the original positions of a plan's slots (what attention_plan::positions
//                     holds); one thread per slot
// A per-slot side column (running scores) follows a compaction through compact_rows with
// dim = 1 and the same kept sets.

#include <kvsift/thrust/common.hpp>

#include <cstddef>
#include <cstdint>

namespace kvsift::thrust {

namespace detail {

template <class T>
struct gather_fn {
  segmented_rows<T> src;
  const std::int32_t* kept_offsets;
  const std::int32_t* kept;
  T* dst;                       // [segments, capacity, d]
  std::int32_t* dst_positions;  // [segments, capacity] or null
  std::int64_t capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t t = e / src.dim;
    const int c = static_cast<int>(e % src.dim);
    const int s = segment_of(kept_offsets, src.num_segments, t);
    const std::int64_t i = t - kept_offsets[s];
    const int j = kept[t];
    dst[(s * capacity + i) * src.dim + c] = src.row(s, j)[c];
    if (c == 0 && dst_positions != nullptr) {
      dst_positions[s * capacity + i] = src.position(s, j);
    }
  }
};

template <class T>
struct gather_packed_fn {
  const T* data;                   // [segments, capacity, d]
  const std::int32_t* positions;   // [segments, capacity] or null
  const std::int32_t* kept_offsets;
  const std::int32_t* kept;
  int num_segments;
  int dim;
  std::int64_t capacity;
  T* packed;                       // [num_kept, d]
  std::int32_t* packed_pos;        // [num_kept] or null
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t t = e / dim;
    const int c = static_cast<int>(e % dim);
    const int s = segment_of(kept_offsets, num_segments, t);
    const std::int64_t from = s * capacity + kept[t];
    packed[e] = data[from * dim + c];
    if (c == 0 && packed_pos != nullptr) {
      packed_pos[t] = positions[from];
    }
  }
};

template <class T>
struct scatter_packed_fn {
  const T* packed;                   // [num_kept, d]
  const std::int32_t* packed_pos;    // [num_kept] or null
  const std::int32_t* kept_offsets;
  int num_segments;
  int dim;
  T* dst;
  std::int32_t* dst_positions;
  std::int64_t capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t t = e / dim;
    const int c = static_cast<int>(e % dim);
    const int s = segment_of(kept_offsets, num_segments, t);
    const std::int64_t i = t - kept_offsets[s];
    dst[(s * capacity + i) * dim + c] = packed[e];
    if (c == 0 && dst_positions != nullptr) {
      dst_positions[s * capacity + i] = packed_pos[t];
    }
  }
};

template <class T>
struct append_fn {
  T* data;                         // [segments, capacity, d]
  std::int32_t* positions;         // [segments, capacity] or null
  const std::int32_t* offsets;     // [segments + 1] CSR of the lengths before the append
  const T* rows;                   // [segments, d]
  const std::int32_t* row_positions;  // [segments]
  int dim;
  std::int64_t capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t s = e / dim;
    const int c = static_cast<int>(e % dim);
    const std::int64_t at = s * capacity + (offsets[s + 1] - offsets[s]);
    data[at * dim + c] = rows[e];
    if (c == 0 && positions != nullptr) {
      positions[at] = row_positions[s];
    }
  }
};

template <class T>
struct pack_fn {
  segmented_rows<T> src;
  T* dst;                       // [num_items, d] or null
  std::int32_t* dst_positions;  // [num_items] or null
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t t = e / src.dim;
    const int c = static_cast<int>(e % src.dim);
    const int s = segment_of(src.offsets, src.num_segments, t);
    const int j = static_cast<int>(t - src.offsets[s]);
    if (dst != nullptr) {
      dst[e] = src.row(s, j)[c];
    }
    if (c == 0 && dst_positions != nullptr) {
      dst_positions[t] = src.position(s, j);
    }
  }
};

template <class T>
struct gather_positions_fn {
  segmented_rows<T> src;
  const std::int32_t* kept_offsets;
  const std::int32_t* kept;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(kept_offsets, src.num_segments, t);
    out[t] = src.position(s, kept[t]);
  }
};

}  // namespace detail

// Appends one row to every segment of a dense [num_segments, capacity, d] array: row s of `rows`
// ([num_segments, d], e.g. a decode token's keys of every KV head) goes to slot n_s = offsets[s +
// 1] - offsets[s] (the length before the append; the caller's lengths become n_s + 1), and its
// position row_positions[s] to positions[s * capacity + n_s] when positions is not null. Every
// n_s must be < capacity (the caller's room check, on host-side lengths). No workspace.
template <class Policy, Element T>
void append_rows(const Policy& exec, T* data, std::int32_t* positions, int num_segments,
                 int capacity, int dim, const std::int32_t* offsets, const T* rows,
                 const std::int32_t* row_positions) {
  constexpr std::string_view where = "thrust::append_rows";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(capacity > 0, where, "capacity", capacity, "> 0");
  require(dim > 0, where, "dim", dim, "> 0");
  require(num_segments == 0 || (data != nullptr && rows != nullptr && offsets != nullptr), where,
          "data / rows / offsets", "null", "the store's rows, [num_segments, d] rows, CSR offsets");
  require(positions == nullptr || row_positions != nullptr, where, "row_positions", "null",
          "[num_segments] positions (positions are written)");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0),
                       static_cast<std::int64_t>(num_segments) * dim,
                       detail::append_fn<T>{data, positions, offsets, rows, row_positions, dim,
                                            capacity});
}

// Packs every resident row of src (any addressing) into dst[(src.offsets[s] + j) * d + c] and its
// original position into dst_positions[src.offsets[s] + j]; either output may be null (then not
// written). num_items = src.offsets[S] (host copy). No workspace.
template <class Policy, Element T>
void pack_rows(const Policy& exec, const segmented_rows<T>& src, std::int64_t num_items, T* dst,
               std::int32_t* dst_positions) {
  constexpr std::string_view where = "thrust::pack_rows";
  src.validate(where, "src");
  require(num_items >= 0, where, "num_items", num_items, ">= 0");
  if (num_items == 0 || (dst == nullptr && dst_positions == nullptr)) {
    return;
  }
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_items * src.dim,
                       detail::pack_fn<T>{src, dst, dst_positions});
}

// out[t] = src.position(s, kept[t]) for every entry t of segment s of the CSR (kept_offsets,
// kept): the original positions of a plan's slots. num_kept = kept_offsets[S] (host copy).
template <class Policy, Element T>
void gather_positions(const Policy& exec, const segmented_rows<T>& src,
                      const std::int32_t* kept_offsets, const std::int32_t* kept,
                      std::int64_t num_kept, std::int32_t* out) {
  constexpr std::string_view where = "thrust::gather_positions";
  src.validate(where, "src");
  require(num_kept >= 0, where, "num_kept", num_kept, ">= 0");
  require(num_kept == 0 || (kept_offsets != nullptr && kept != nullptr && out != nullptr), where,
          "kept / out", "null", "the CSR of slots and [num_kept] positions");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_kept,
                       detail::gather_positions_fn<T>{src, kept_offsets, kept, out});
}

// Copies kept row i of segment s (source token kept[kept_offsets[s] + i]) to
// dst + (s * dst_capacity + i) * d, and its original position to dst_positions[s * dst_capacity
// + i] when dst_positions is not null. dst must not overlap src. No workspace.
//   kept_offsets [src.num_segments + 1] CSR of `kept`; num_kept = kept_offsets[S] (host copy)
template <class Policy, Element T>
void gather_rows(const Policy& exec, const segmented_rows<T>& src,
                 const std::int32_t* kept_offsets, const std::int32_t* kept, std::int64_t num_kept,
                 T* dst, int dst_capacity, std::int32_t* dst_positions = nullptr) {
  constexpr std::string_view where = "thrust::gather_rows";
  src.validate(where, "src");
  require(num_kept >= 0, where, "num_kept", num_kept, ">= 0");
  require(dst_capacity >= 0, where, "dst_capacity", dst_capacity, ">= 0");
  require(num_kept == 0 || dst != nullptr, where, "dst", "null", "[segments, capacity, d] rows");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_kept * src.dim,
                       detail::gather_fn<T>{src, kept_offsets, kept, dst, dst_positions,
                                            dst_capacity});
}

// Bytes of workspace compact_rows needs for `num_kept` rows of `dim` channels of T.
template <Element T>
std::size_t compact_workspace_bytes(std::int64_t num_kept, int dim, bool with_positions = true) {
  detail::carver c{};
  (void)c.take<T>(static_cast<std::size_t>(num_kept) * dim);
  if (with_positions) (void)c.take<std::int32_t>(static_cast<std::size_t>(num_kept));
  return c.bytes;
}

// In-place compaction of a dense [num_segments, capacity, d] array: afterwards slot i of segment
// s holds what slot kept[kept_offsets[s] + i] held (positions too, when not null); the caller's
// lengths become kept_offsets[s + 1] - kept_offsets[s]. Slots past them are left as they were.
//   kept_offsets [num_segments + 1] CSR of `kept` (local slot indices, ascending per segment)
//   workspace    >= compact_workspace_bytes<T>(num_kept, d, positions != nullptr)
template <class Policy, Element T>
void compact_rows(const Policy& exec, T* data, std::int32_t* positions, int num_segments,
                  int capacity, int dim, const std::int32_t* kept_offsets, const std::int32_t* kept,
                  std::int64_t num_kept, void* workspace, std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::compact_rows";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(capacity > 0, where, "capacity", capacity, "> 0");
  require(dim > 0, where, "dim", dim, "> 0");
  require(num_kept >= 0 && num_kept <= static_cast<std::int64_t>(num_segments) * capacity, where,
          "num_kept", num_kept, "in [0, num_segments * capacity]");
  detail::carver c{static_cast<std::byte*>(workspace)};
  T* packed = c.take<T>(static_cast<std::size_t>(num_kept) * dim);
  std::int32_t* packed_pos =
      positions != nullptr ? c.take<std::int32_t>(static_cast<std::size_t>(num_kept)) : nullptr;
  detail::check_workspace(where, workspace, workspace_bytes, c.bytes);
  if (num_kept == 0) {
    return;
  }
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  ::thrust::for_each_n(exec, zero, num_kept * dim,
                       detail::gather_packed_fn<T>{data, positions, kept_offsets, kept,
                                                   num_segments, dim, capacity, packed,
                                                   packed_pos});
  ::thrust::for_each_n(exec, zero, num_kept * dim,
                       detail::scatter_packed_fn<T>{packed, packed_pos, kept_offsets, num_segments,
                                                    dim, data, positions, capacity});
}

}  // namespace kvsift::thrust
