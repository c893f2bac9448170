// SPDX-License-Identifier: Apache-2.0
#pragma once

// Shared pieces of the Thrust backend: the description of segmented KV rows in caller memory,
// the mapping from a flat element to its segment, workspace carving, and the score key whose
// unsigned order is "higher score first". Every algorithm under kvsift/thrust/ takes an explicit
// Thrust execution policy (`thrust::cpp::par`, `thrust::omp::par`, `thrust::cuda::par.on(s)`,
// or `thrust::device`) and raw pointers; none allocates its own arrays: intermediate arrays live
// in caller-provided workspace sized by the matching `*_workspace_bytes(...)`. (Thrust's own
// sort scratch comes from the policy; attach an allocator, `par(alloc)`, to pool it.)
//
// The same headers compile with g++ (THRUST_DEVICE_SYSTEM = CPP or OMP) and with nvcc (CUDA);
// functors are KVSIFT_HOST_DEVICE. Pointers must be accessible from the policy's system.

#include <kvsift/core/config.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>

#if !KVSIFT_CUDA_COMPILATION() && !defined(THRUST_DEVICE_SYSTEM)
#error "kvsift/thrust: define THRUST_DEVICE_SYSTEM (e.g. THRUST_DEVICE_SYSTEM_CPP or _OMP) when compiling without nvcc"
#endif

#include <thrust/binary_search.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/scan.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

namespace kvsift::thrust {

// Rows of `dim` channels of a ragged batch of head-sequences. Segment s has
// offsets[s + 1] - offsets[s] tokens. Two addressings:
//   packed  (segment_stride == 0): token j of segment s is row offsets[s] + j of data;
//   strided (segment_stride  > 0): it is at data + s * segment_stride + j * dim, e.g. a
//           store::dense [sequences, capacity, d] array with segment_stride = capacity * d.
// `positions` (same addressing, one int32 per row; may be null = position j) gives the original
// positions, used for causal visibility.
// Paged rows (thrust::paged_store): with a `page_table`, token j of segment s is in the
// segment's row r = row_map[s * row_map_stride + j] (r = j without a row map), which is row
// page_table[s * table_stride + r / page_size] * page_size + r % page_size of `data` (a pool of
// pages of page_size rows), while `positions` keeps the strided addressing above.
template <class T>
struct segmented_rows {
  const T* data = nullptr;                   // rows of dim channels (see addressing above)
  const std::int32_t* offsets = nullptr;     // [num_segments + 1] CSR token offsets
  const std::int32_t* positions = nullptr;   // original positions, same addressing; null = slot
  std::int64_t segment_stride = 0;           // elements between segment starts; 0 = packed
  int num_segments = 0;
  int dim = 0;
  const std::int32_t* page_table = nullptr;  // paged rows: [num_segments, table_stride] pages
  std::int64_t table_stride = 0;             // page-table entries per segment
  int page_size = 0;                         // rows per page
  const std::int32_t* row_map = nullptr;     // paged rows: each token's row in its pages; null = j
  std::int64_t row_map_stride = 0;           // entries of row_map between segment starts

  [[nodiscard]] KVSIFT_HOST_DEVICE int length(int s) const { return offsets[s + 1] - offsets[s]; }
  // Index of token j of segment s in `positions` (and in `data` unless paged).
  [[nodiscard]] KVSIFT_HOST_DEVICE std::int64_t slot_index(int s, int j) const {
    return segment_stride == 0 ? static_cast<std::int64_t>(offsets[s]) + j
                               : static_cast<std::int64_t>(s) * (segment_stride / dim) + j;
  }
  // Row of `data` holding token j of segment s.
  [[nodiscard]] KVSIFT_HOST_DEVICE std::int64_t row_index(int s, int j) const {
    if (page_table != nullptr) {
      const std::int32_t r = row_map == nullptr ? j : row_map[s * row_map_stride + j];
      return static_cast<std::int64_t>(page_table[s * table_stride + r / page_size]) * page_size +
             r % page_size;
    }
    return slot_index(s, j);
  }
  [[nodiscard]] KVSIFT_HOST_DEVICE const T* row(int s, int j) const {
    return data + row_index(s, j) * dim;
  }
  [[nodiscard]] KVSIFT_HOST_DEVICE std::int32_t position(int s, int j) const {
    return positions == nullptr ? j : positions[slot_index(s, j)];
  }
  // Number of leading tokens of s whose position is <= pos (positions ascend).
  [[nodiscard]] KVSIFT_HOST_DEVICE int visible(int s, std::int32_t pos) const {
    int lo = 0;
    int hi = length(s);
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (position(s, mid) <= pos) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  // Host-side checks of what can be checked without touching the data.
  void validate(std::string_view where, std::string_view arg) const {
    const std::string a(arg);
    require(num_segments >= 0, where, a + ".num_segments", num_segments, ">= 0");
    require(dim > 0, where, a + ".dim", dim, "> 0");
    require(offsets != nullptr, where, a + ".offsets", "null", "[num_segments + 1] CSR offsets");
    require(segment_stride >= 0 && segment_stride % dim == 0, where, a + ".segment_stride",
            segment_stride, "0 (packed) or a positive multiple of dim");
    require(page_table == nullptr || (page_size > 0 && table_stride > 0), where, a + ".page_size",
            page_size, "> 0 with a page table (and table_stride > 0)");
  }
};

namespace detail {

// Segment of flat element e under CSR offsets (largest s with offsets[s] <= e).
template <class OffsetIt>
KVSIFT_HOST_DEVICE inline int segment_of(OffsetIt offsets, int num_segments, std::int64_t e) {
  int lo = 0;
  int hi = num_segments;  // invariant: offsets[lo] <= e < offsets[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (static_cast<std::int64_t>(offsets[mid]) <= e) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// 32 bits whose ascending unsigned order is descending score; NaN last; -0 == +0.
KVSIFT_HOST_DEVICE inline std::uint32_t descending_key(float x) {
  std::uint32_t u = kvsift::detail::float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return 0xffffffffu;
  }
  if (u == 0x80000000u) {
    u = 0;
  }
  const std::uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ordered;
}

// -inf from its bits: numeric_limits is host-only constexpr under nvcc without relaxed constexpr.
KVSIFT_HOST_DEVICE inline float neg_inf() { return kvsift::detail::bits_float(0xff800000u); }

// Carves typed arrays out of one caller buffer, each aligned to 256 bytes (CUDA's allocation
// alignment), so `bytes` computed by a dry run equals what a real run consumes.
struct carver {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  template <class U>
  U* take(std::size_t count) {
    bytes = (bytes + 255) / 256 * 256;
    U* p = base == nullptr ? nullptr : reinterpret_cast<U*>(base + bytes);
    bytes += count * sizeof(U);
    return p;
  }
};

inline void check_workspace(std::string_view where, const void* ws, std::size_t have,
                            std::size_t need) {
  require(need == 0 || ws != nullptr, where, "workspace", "null",
          "a buffer of " + std::to_string(need) + " bytes");
  require(have >= need, where, "workspace_bytes", have, ">= " + std::to_string(need));
}

// lengths[seq0 + h] += tokens, for h < heads (one thread per head): a store's append.
struct grow_lengths_fn {
  std::int32_t* lengths;
  std::int64_t seq0;
  int tokens;
  KVSIFT_HOST_DEVICE void operator()(int h) const { lengths[seq0 + h] += tokens; }
};

// A retain's host check (the stores' retain): one kept count per KV head of (request, layer),
// each in [0, that head's length] (`lengths` from the head-sequence seq0 on); writes their CSR
// offsets into offsets[0, H] and returns the total.
inline std::int64_t retain_offsets(std::string_view where, std::span<const int> kept_counts,
                                   const int* lengths, int H, std::int32_t* offsets) {
  require(static_cast<int>(kept_counts.size()) == H, where, "kept_counts.size()",
          kept_counts.size(), [&] { return "one count per KV head (" + std::to_string(H) + ")"; });
  offsets[0] = 0;
  for (int h = 0; h < H; ++h) {
    require(kept_counts[h] >= 0 && kept_counts[h] <= lengths[h], where,
            [&] { return "kept_counts[" + std::to_string(h) + "]"; }, kept_counts[h],
            [&] { return "in [0, " + std::to_string(lengths[h]) + "] (the head's length)"; });
    offsets[h + 1] = offsets[h] + kept_counts[h];
  }
  return offsets[H];
}

// Rank of v among the ascending a[0, n): how many entries are < v.
KVSIFT_HOST_DEVICE inline int count_below(const std::int32_t* a, int n, std::int32_t v) {
  int lo = 0;
  int hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (a[mid] < v) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Index of `pos` among the first n entries of an ascending array (stride 1), or -1.
KVSIFT_HOST_DEVICE inline int find_sorted(const std::int32_t* a, int n, std::int32_t pos) {
  const int lo = count_below(a, n, pos);
  return lo < n && a[lo] == pos ? lo : -1;
}

}  // namespace detail
}  // namespace kvsift::thrust
