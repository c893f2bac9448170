// SPDX-License-Identifier: Apache-2.0
#pragma once

// Segmented top-k on the GPU by radix select, one block per segment. Mirrors
// cpu/segmented_topk.hpp and thrust/segmented_topk.hpp.
//
// Semantics (METHODS.md, general conventions): in each segment keep the k_s highest scores;
// ties go to the lower index; the kept indices are returned ascending. NaN ranks below every
// number (also below -inf); -0.0 and +0.0 are equal. Protected tokens (sinks, windows) are
// expressed by the caller as +inf scores; among equal +inf the lower index wins as usual.
//
// Algorithm: each score maps to a 32-bit key whose ascending order is the required order
// (descending score, NaN last, -0 == +0). Four 8-bit histogram passes over the segment find the
// k_s-th smallest key T exactly (radix select, as torch.topk does); a last pass in index order
// keeps every key < T and the first k_s - #(key < T) keys equal to T, writing each kept index at
// its rank among the kept (a block scan), so the output is ascending without a sort. Five reads
// of the segment (from L2 when it fits), nothing written but the result, no scratch memory.
//
// A few long segments (fewer than detail::topk_split_max_segments, averaging at least
// detail::topk_long_segment scores) would leave most SMs idle with one block per segment: the
// plan then splits each segment into `chunks` slices of about detail::topk_split_chunk scores,
// one block each. The four histogram passes add each slice's histogram into the segment's in
// the workspace (global atomics) and a one-warp kernel per segment finds the digit; a count
// pass records each slice's #less and #equal, and the write pass starts each slice at the sum
// of the slices before it, so the output is the same ascending set. 11 launches, six reads of
// the scores (from L2 when they fit), a workspace of a few KiB per segment.
//
// Two-phase use (the workspace is 0 bytes unless the plan splits segments):
//   auto plan = kvsift::cuda::make_segmented_topk_plan(n, segments, kept);  // host, once
//   device_buffer<std::byte> ws(plan.workspace_bytes);                      // once
//   kvsift::cuda::segmented_topk(kvsift::cuda::par{stream}, plan, ws.data(), ws.size(),
//                                scores, offsets, out_offsets, out_indices); // every step

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/memory.cuh>
#include <kvsift/cuda/policy.cuh>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace kvsift::cuda {

// POD plan of a segmented top-k: the validated counts. Depends only on the three counts, so
// one plan serves every step with the same capacities (CUDA-graph friendly).
struct segmented_topk_plan {
  std::int32_t num_items = 0;     // total scores over all segments (offsets[num_segments])
  std::int32_t num_segments = 0;  // number of segments
  std::int32_t num_kept = 0;      // total kept indices (out_offsets[num_segments])
  std::int32_t chunks = 1;        // blocks per segment: 1, or the split of a few long segments
  std::size_t workspace_bytes = 0;  // what the caller must provide (0 unless chunks > 1)
};

namespace detail {

// Maps a score to 32 bits whose ascending order is descending score; NaN last, -0 == +0.
KVSIFT_DEVICE inline std::uint32_t descending_key(float s) {
  std::uint32_t u = __float_as_uint(s);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return 0xffffffffu;  // NaN ranks last
  }
  if (u == 0x80000000u) {
    u = 0;  // -0.0 equals +0.0
  }
  const std::uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ordered;
}

// Threads per block: 256, or 1024 when the segments average at least topk_long_segment scores
// (a few long segments: one block per segment is then all the parallelism there is).
inline constexpr int topk_block = 256;
inline constexpr int topk_long_block = 1024;
inline constexpr std::int64_t topk_long_segment = 16384;
// The split path: fewer segments than this, averaging at least topk_long_segment scores, are
// cut into slices of about topk_split_chunk scores (at most topk_split_max_chunks a segment).
inline constexpr std::int64_t topk_split_max_segments = 128;
inline constexpr std::int64_t topk_split_chunk = 8192;
inline constexpr std::int64_t topk_split_max_chunks = 64;
inline constexpr int topk_split_block = 256;

// Adds 1 to hist[bin] for every lane of the warp whose `counts` is set. WarpAggregated: one
// shared atomic per distinct bin in the warp (__match_any_sync), for scores that cluster in a
// few bins; else one atomic per lane. Every lane of the warp must call it.
template <bool WarpAggregated>
KVSIFT_DEVICE inline void warp_histogram_add(unsigned* hist, unsigned bin, bool counts) {
  if constexpr (!WarpAggregated) {
    if (counts) {
      atomicAdd(hist + bin, 1u);
    }
    return;
  }
  const unsigned key = counts ? bin : 0xffffffffu;
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (counts && lane == __ffs(peers) - 1) {
    atomicAdd(hist + bin, static_cast<unsigned>(__popc(peers)));
  }
}

// One block per segment (grid-stride over segments). Kernels are templates so that a
// header-only library never defines a kernel twice. The library runs WarpAggregated = false: on
// an H200 (2026-11-27) the aggregated histogram was 1.17-1.25x slower on the benchmark's scores.
template <Element Score, int Block, bool WarpAggregated = false>
KVSIFT_KERNEL void __launch_bounds__(Block)
    radix_topk_kernel(const Score* __restrict__ scores, const std::int32_t* __restrict__ offsets,
                      const std::int32_t* __restrict__ out_offsets, std::int32_t num_segments,
                      std::int32_t* __restrict__ out) {
  using scan_t = ::cub::BlockScan<unsigned long long, Block>;
  __shared__ typename scan_t::TempStorage scan_storage;
  __shared__ unsigned hist[256];
  __shared__ std::uint32_t found_prefix;
  __shared__ std::uint32_t found_rank;
  for (std::int32_t s = blockIdx.x; s < num_segments; s += gridDim.x) {
    const std::int32_t first = offsets[s];
    const std::int32_t n = offsets[s + 1] - first;
    const std::int32_t o = out_offsets[s];
    const std::int32_t k = out_offsets[s + 1] - o;
    const std::int32_t kk = min(k, n);
    for (std::int32_t j = max(kk, 0) + threadIdx.x; j < k; j += Block) {
      out[o + j] = -1;  // a contract violation (k_s > n_s) yields -1, never another segment
    }
    if (kk <= 0) {
      continue;  // uniform across the block
    }
    const Score* seg = scores + first;
    // radix select of the kk-th smallest key: `prefix` holds the digits found so far, `rank`
    // the threshold's 1-based rank among the keys that share them
    std::uint32_t prefix = 0, mask = 0, rank = static_cast<std::uint32_t>(kk);
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += Block) {
        hist[i] = 0;
      }
      __syncthreads();
      // the trip count is the block's: every lane of a warp reaches the warp's match
      for (std::int32_t i0 = 0; i0 < n; i0 += Block) {
        const std::int32_t i = i0 + static_cast<std::int32_t>(threadIdx.x);
        const std::uint32_t key = i < n ? descending_key(to_float(seg[i])) : 0u;
        warp_histogram_add<WarpAggregated>(hist, (key >> shift) & 0xffu, i < n && (key & mask) == prefix);
      }
      __syncthreads();
      if (threadIdx.x < 32) {  // one warp finds the digit holding the rank
        const int lane = static_cast<int>(threadIdx.x);
        unsigned bins[8];
        unsigned sum = 0;
#pragma unroll
        for (int b = 0; b < 8; ++b) {
          bins[b] = hist[lane * 8 + b];
          sum += bins[b];
        }
        unsigned inclusive = sum;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
          const unsigned up = __shfl_up_sync(0xffffffffu, inclusive, d);
          if (lane >= d) {
            inclusive += up;
          }
        }
        unsigned before = inclusive - sum;
        if (before < rank && rank <= inclusive) {
#pragma unroll
          for (int b = 0; b < 8; ++b) {
            if (before + bins[b] >= rank) {
              found_prefix = prefix | (static_cast<std::uint32_t>(lane * 8 + b) << shift);
              found_rank = rank - before;
              break;
            }
            before += bins[b];
          }
        }
      }
      __syncthreads();
      prefix = found_prefix;
      rank = found_rank;
      mask |= 0xffu << shift;
    }
    // keep every key < prefix and the first `rank` keys == prefix, in index order
    unsigned long long seen = 0;  // (#less << 32) | #equal in the tiles before this one
    for (std::int32_t base = 0; base < n; base += Block) {
      const std::int32_t i = base + static_cast<std::int32_t>(threadIdx.x);
      const std::uint32_t key = i < n ? descending_key(to_float(seg[i])) : 0xffffffffu;
      const bool less = i < n && key < prefix;
      const bool equal = i < n && key == prefix;
      const unsigned long long mine =
          (static_cast<unsigned long long>(less) << 32) | static_cast<unsigned long long>(equal);
      unsigned long long prior = 0, tile = 0;
      scan_t(scan_storage).ExclusiveSum(mine, prior, tile);
      prior += seen;
      const auto less_before = static_cast<std::uint32_t>(prior >> 32);
      const auto equal_before = static_cast<std::uint32_t>(prior & 0xffffffffu);
      if (less || (equal && equal_before < rank)) {
        out[o + less_before + min(equal_before, rank)] = i;
      }
      seen += tile;
      __syncthreads();  // scan_storage is reused by the next tile
    }
  }
}

// ---- the split path (few long segments): one block per (slice, segment) ---------------------
// Per segment in the workspace: the key prefix found so far and the threshold's rank among the
// keys sharing it, a 256-bin histogram, and each slice's (#less << 32 | #equal).
struct split_topk_workspace {
  std::uint32_t* prefix;       // [segments]
  std::uint32_t* rank;         // [segments]; 0: the segment keeps nothing
  unsigned* hist;              // [segments][256], zero between passes
  unsigned long long* counts;  // [segments][chunks]
};

// Slice c of C of a segment of n scores: [begin, end), possibly empty.
KVSIFT_DEVICE inline void split_slice(std::int32_t n, std::int32_t c, std::int32_t C,
                                      std::int32_t& begin, std::int32_t& end) {
  const std::int32_t len = (n + C - 1) / C;
  begin = min(n, c * len);
  end = min(n, begin + len);
}

// One block per segment: -1 past a violated k_s <= n_s, the histogram zeroed, prefix 0, rank k.
template <int Block>
KVSIFT_KERNEL void __launch_bounds__(Block)
    split_topk_init(const std::int32_t* __restrict__ offsets,
                    const std::int32_t* __restrict__ out_offsets, split_topk_workspace ws,
                    std::int32_t* __restrict__ out) {
  const std::int32_t s = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t n = offsets[s + 1] - offsets[s];
  const std::int32_t o = out_offsets[s];
  const std::int32_t k = out_offsets[s + 1] - o;
  const std::int32_t kk = max(min(k, n), 0);
  for (std::int32_t j = kk + static_cast<std::int32_t>(threadIdx.x); j < k; j += Block) {
    out[o + j] = -1;
  }
  for (int i = threadIdx.x; i < 256; i += Block) {
    ws.hist[s * 256 + i] = 0;
  }
  if (threadIdx.x == 0) {
    ws.prefix[s] = 0;
    ws.rank[s] = static_cast<std::uint32_t>(kk);
  }
}

// Histogram of digit `shift` over the slice's keys that share the prefix found so far, added
// into the segment's histogram.
template <Element Score, int Block>
KVSIFT_KERNEL void __launch_bounds__(Block)
    split_topk_histogram(const Score* __restrict__ scores, const std::int32_t* __restrict__ offsets,
                         split_topk_workspace ws, int shift) {
  __shared__ unsigned hist[256];
  const std::int32_t s = static_cast<std::int32_t>(blockIdx.y);
  if (ws.rank[s] == 0) {
    return;  // uniform across the block
  }
  const std::int32_t first = offsets[s];
  std::int32_t begin = 0, end = 0;
  split_slice(offsets[s + 1] - first, static_cast<std::int32_t>(blockIdx.x),
              static_cast<std::int32_t>(gridDim.x), begin, end);
  if (begin >= end) {
    return;
  }
  for (int i = threadIdx.x; i < 256; i += Block) {
    hist[i] = 0;
  }
  __syncthreads();
  const std::uint32_t prefix = ws.prefix[s];
  const std::uint32_t mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
  for (std::int32_t i = begin + static_cast<std::int32_t>(threadIdx.x); i < end; i += Block) {
    const std::uint32_t key = descending_key(to_float(scores[first + i]));
    if ((key & mask) == prefix) {
      atomicAdd(hist + ((key >> shift) & 0xffu), 1u);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += Block) {
    if (hist[i] != 0) {
      atomicAdd(ws.hist + s * 256 + i, hist[i]);
    }
  }
}

// One warp per segment: the digit holding the rank (as radix_topk_kernel's warp finds it); the
// histogram is left zero for the next pass. (A template, as every kernel here: a header-only
// library must not define a kernel in every translation unit that includes it.)
template <int Lanes = 32>
KVSIFT_KERNEL void __launch_bounds__(Lanes) split_topk_digit(split_topk_workspace ws, int shift) {
  static_assert(Lanes == 32, "one warp per segment");
  const std::int32_t s = static_cast<std::int32_t>(blockIdx.x);
  const std::uint32_t rank = ws.rank[s];
  if (rank == 0) {
    return;
  }
  const std::uint32_t prefix = ws.prefix[s];
  const int lane = static_cast<int>(threadIdx.x);
  unsigned* hist = ws.hist + s * 256;
  unsigned bins[8];
  unsigned sum = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    bins[b] = hist[lane * 8 + b];
    hist[lane * 8 + b] = 0;
    sum += bins[b];
  }
  unsigned inclusive = sum;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) {
      inclusive += up;
    }
  }
  unsigned before = inclusive - sum;
  if (before < rank && rank <= inclusive) {
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      if (before + bins[b] >= rank) {
        ws.prefix[s] = prefix | (static_cast<std::uint32_t>(lane * 8 + b) << shift);
        ws.rank[s] = rank - before;
        break;
      }
      before += bins[b];
    }
  }
}

// Each slice's #less and #equal against the threshold key (every slice writes, empty or not).
template <Element Score, int Block>
KVSIFT_KERNEL void __launch_bounds__(Block)
    split_topk_count(const Score* __restrict__ scores, const std::int32_t* __restrict__ offsets,
                     split_topk_workspace ws) {
  using reduce_t = ::cub::BlockReduce<unsigned long long, Block>;
  __shared__ typename reduce_t::TempStorage storage;
  const std::int32_t s = static_cast<std::int32_t>(blockIdx.y);
  if (ws.rank[s] == 0) {
    return;  // the write pass skips the segment too
  }
  const std::int32_t first = offsets[s];
  std::int32_t begin = 0, end = 0;
  split_slice(offsets[s + 1] - first, static_cast<std::int32_t>(blockIdx.x),
              static_cast<std::int32_t>(gridDim.x), begin, end);
  const std::uint32_t threshold = ws.prefix[s];
  unsigned long long mine = 0;
  for (std::int32_t i = begin + static_cast<std::int32_t>(threadIdx.x); i < end; i += Block) {
    const std::uint32_t key = descending_key(to_float(scores[first + i]));
    mine += key < threshold ? (1ull << 32) : (key == threshold ? 1ull : 0ull);
  }
  const unsigned long long total = reduce_t(storage).Sum(mine);
  if (threadIdx.x == 0) {
    ws.counts[static_cast<std::int64_t>(s) * gridDim.x + blockIdx.x] = total;
  }
}

// The slice's kept indices at their ranks: the slices before it give the start, then the same
// tiled block scan as radix_topk_kernel's last pass.
template <Element Score, int Block>
KVSIFT_KERNEL void __launch_bounds__(Block)
    split_topk_write(const Score* __restrict__ scores, const std::int32_t* __restrict__ offsets,
                     const std::int32_t* __restrict__ out_offsets, split_topk_workspace ws,
                     std::int32_t* __restrict__ out) {
  using scan_t = ::cub::BlockScan<unsigned long long, Block>;
  __shared__ typename scan_t::TempStorage scan_storage;
  __shared__ unsigned long long start;
  const std::int32_t s = static_cast<std::int32_t>(blockIdx.y);
  const std::uint32_t rank = ws.rank[s];
  if (rank == 0) {
    return;
  }
  const std::int32_t first = offsets[s];
  std::int32_t begin = 0, end = 0;
  split_slice(offsets[s + 1] - first, static_cast<std::int32_t>(blockIdx.x),
              static_cast<std::int32_t>(gridDim.x), begin, end);
  if (begin >= end) {
    return;
  }
  if (threadIdx.x == 0) {
    unsigned long long sum = 0;
    const unsigned long long* c = ws.counts + static_cast<std::int64_t>(s) * gridDim.x;
    for (unsigned j = 0; j < blockIdx.x; ++j) {
      sum += c[j];
    }
    start = sum;
  }
  __syncthreads();
  const std::uint32_t threshold = ws.prefix[s];
  const std::int32_t o = out_offsets[s];
  unsigned long long seen = start;
  for (std::int32_t base = begin; base < end; base += Block) {
    const std::int32_t i = base + static_cast<std::int32_t>(threadIdx.x);
    const std::uint32_t key = i < end ? descending_key(to_float(scores[first + i])) : 0xffffffffu;
    const bool less = i < end && key < threshold;
    const bool equal = i < end && key == threshold;
    const unsigned long long mine =
        (static_cast<unsigned long long>(less) << 32) | static_cast<unsigned long long>(equal);
    unsigned long long prior = 0, tile = 0;
    scan_t(scan_storage).ExclusiveSum(mine, prior, tile);
    prior += seen;
    const auto less_before = static_cast<std::uint32_t>(prior >> 32);
    const auto equal_before = static_cast<std::uint32_t>(prior & 0xffffffffu);
    if (less || (equal && equal_before < rank)) {
      out[o + less_before + min(equal_before, rank)] = i;
    }
    seen += tile;
    __syncthreads();  // scan_storage is reused by the next tile
  }
}

// The split path's workspace, carved from `base` (sizing when null).
inline split_topk_workspace carve_split_topk(workspace_carver& w, std::int32_t segments,
                                             std::int32_t chunks) {
  split_topk_workspace ws{};
  ws.counts = w.take<unsigned long long>(static_cast<std::size_t>(segments) *
                                         static_cast<std::size_t>(chunks));
  ws.hist = w.take<unsigned>(static_cast<std::size_t>(segments) * 256);
  ws.prefix = w.take<std::uint32_t>(static_cast<std::size_t>(segments));
  ws.rank = w.take<std::uint32_t>(static_cast<std::size_t>(segments));
  return ws;
}

}  // namespace detail

// Validates and records the counts of a segmented top-k (phase one; no device call). Counts are
// taken as int64 and must fit int32: a larger count is a kvsift::error, never a truncated one.
// (A template so that its instantiation list matches segmented_topk's.)
// `chunks` 0 lets the plan choose (the split path for a few long segments, above); 1 forces one
// block per segment; 2..64 force that many slices (fewer than 128 segments only).
template <Element Score = float>
[[nodiscard]] segmented_topk_plan make_segmented_topk_plan(std::int64_t num_items64,
                                                           std::int64_t num_segments64,
                                                           std::int64_t num_kept64,
                                                           std::int64_t chunks = 0) {
  constexpr const char* where = "cuda::make_segmented_topk_plan";
  constexpr std::int64_t max32 = std::numeric_limits<std::int32_t>::max();
  require(num_items64 >= 0 && num_items64 <= max32, where, "num_items", num_items64,
          "in [0, 2^31 - 1]");
  require(num_segments64 >= 0 && num_segments64 <= max32, where, "num_segments",
          num_segments64, "in [0, 2^31 - 1]");
  require(num_kept64 >= 0 && num_kept64 <= num_items64, where, "num_kept", num_kept64,
          "in [0, num_items]");
  segmented_topk_plan p;
  p.num_items = static_cast<std::int32_t>(num_items64);
  p.num_segments = static_cast<std::int32_t>(num_segments64);
  p.num_kept = static_cast<std::int32_t>(num_kept64);
  require(chunks >= 0 && chunks <= detail::topk_split_max_chunks &&
              (chunks <= 1 || num_segments64 < detail::topk_split_max_segments),
          where, "chunks", chunks, "0 (choose), 1, or 2..64 with fewer than 128 segments");
  if (chunks == 0 && num_segments64 > 0 && num_segments64 < detail::topk_split_max_segments &&
      num_items64 / num_segments64 >= detail::topk_long_segment) {
    const std::int64_t average = num_items64 / num_segments64;
    chunks = std::min(detail::topk_split_max_chunks,
                      (average + detail::topk_split_chunk - 1) / detail::topk_split_chunk);
  }
  p.chunks = static_cast<std::int32_t>(std::max<std::int64_t>(chunks, 1));
  if (p.chunks > 1) {
    workspace_carver sizing;
    (void)detail::carve_split_topk(sizing, p.num_segments, p.chunks);
    p.workspace_bytes = sizing.used();
  }
  return p;
}

// Workspace a segmented top-k of these counts needs (phase one, shorthand).
template <Element Score = float>
[[nodiscard]] std::size_t segmented_topk_workspace_bytes(std::int64_t num_items,
                                                         std::int64_t num_segments,
                                                         std::int64_t num_kept,
                                                         std::int64_t chunks = 0) {
  return make_segmented_topk_plan<Score>(num_items, num_segments, num_kept, chunks).workspace_bytes;
}

// Segmented top-k (phase two). Enqueues one kernel on policy.stream (11 when the plan splits
// segments); no allocation, no host sync (CUDA-graph safe).
//   scores       [plan.num_items] device, float (or half/bfloat16, compared as float); segment s is [offsets[s], offsets[s+1])
//   offsets      [plan.num_segments + 1] device CSR offsets, offsets[0] == 0
//   out_offsets  [plan.num_segments + 1] device CSR offsets of the result; segment s keeps
//                k_s = out_offsets[s+1] - out_offsets[s] <= its length (else -1 entries)
//   out_indices  [plan.num_kept] device; indices local to their segment, ascending
//   workspace    >= plan.workspace_bytes bytes of device memory (any pointer when 0); the
//                call initialises what it uses, so it needs no zeroing
// Throws kvsift::error on a too small workspace or null pointers; cuda_error on launch errors.
template <Element Score>
void segmented_topk(par policy, const segmented_topk_plan& plan, void* workspace,
                    std::size_t workspace_bytes, const Score* scores,
                           const std::int32_t* offsets, const std::int32_t* out_offsets,
                           std::int32_t* out_indices) {
  constexpr const char* where = "cuda::segmented_topk";
  require(plan.num_items >= 0 && plan.num_segments >= 0 && plan.num_kept >= 0 &&
              plan.num_kept <= plan.num_items,
          where, "plan", "negative or inconsistent counts", "a plan from make_segmented_topk_plan");
  require(workspace_bytes >= plan.workspace_bytes, where, "workspace_bytes", workspace_bytes,
          ">= plan.workspace_bytes");
  if (plan.num_kept == 0 || plan.num_segments == 0) {
    return;
  }
  require(scores != nullptr && offsets != nullptr && out_offsets != nullptr &&
              out_indices != nullptr,
          where, "scores/offsets/out_offsets/out_indices", "null", "device pointers");
  require(plan.chunks >= 1 && plan.chunks <= detail::topk_split_max_chunks &&
              (plan.chunks == 1 || plan.num_segments < detail::topk_split_max_segments),
          where, "plan.chunks", plan.chunks, "1, or at most 64 slices of fewer than 128 segments");
  if (plan.chunks > 1) {
    require(workspace != nullptr, where, "workspace", "null", "plan.workspace_bytes of device memory");
    workspace_carver carve(workspace);
    const detail::split_topk_workspace ws =
        detail::carve_split_topk(carve, plan.num_segments, plan.chunks);
    constexpr int block = detail::topk_split_block;
    const dim3 slices(static_cast<unsigned>(plan.chunks), static_cast<unsigned>(plan.num_segments));
    detail::split_topk_init<block><<<plan.num_segments, block, 0, policy.stream>>>(
        offsets, out_offsets, ws, out_indices);
    for (int shift = 24; shift >= 0; shift -= 8) {
      detail::split_topk_histogram<Score, block>
          <<<slices, block, 0, policy.stream>>>(scores, offsets, ws, shift);
      detail::split_topk_digit<32><<<plan.num_segments, 32, 0, policy.stream>>>(ws, shift);
    }
    detail::split_topk_count<Score, block><<<slices, block, 0, policy.stream>>>(scores, offsets, ws);
    detail::split_topk_write<Score, block>
        <<<slices, block, 0, policy.stream>>>(scores, offsets, out_offsets, ws, out_indices);
    check_launch(where);
    return;
  }
  const unsigned grid = static_cast<unsigned>(std::min(plan.num_segments, 65535 * 8));
  if (plan.num_items / plan.num_segments >= detail::topk_long_segment) {
    detail::radix_topk_kernel<Score, detail::topk_long_block>
        <<<grid, detail::topk_long_block, 0, policy.stream>>>(scores, offsets, out_offsets,
                                                              plan.num_segments, out_indices);
  } else {
    detail::radix_topk_kernel<Score, detail::topk_block>
        <<<grid, detail::topk_block, 0, policy.stream>>>(scores, offsets, out_offsets,
                                                         plan.num_segments, out_indices);
  }
  check_launch(where);
}

}  // namespace kvsift::cuda
