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
// Two-phase use (the plan is kept for its validation; the workspace is 0 bytes):
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
  std::size_t workspace_bytes = 0;  // what the caller must provide (0: radix select needs none)
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

}  // namespace detail

// Validates and records the counts of a segmented top-k (phase one; no device call). Counts are
// taken as int64 and must fit int32: a larger count is a kvsift::error, never a truncated one.
// (A template so that its instantiation list matches segmented_topk's.)
template <Element Score = float>
[[nodiscard]] segmented_topk_plan make_segmented_topk_plan(std::int64_t num_items64,
                                                           std::int64_t num_segments64,
                                                           std::int64_t num_kept64) {
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
  return p;
}

// Workspace a segmented top-k of these counts needs (phase one, shorthand).
template <Element Score = float>
[[nodiscard]] std::size_t segmented_topk_workspace_bytes(std::int64_t num_items,
                                                                std::int64_t num_segments,
                                                                std::int64_t num_kept) {
  return make_segmented_topk_plan<Score>(num_items, num_segments, num_kept).workspace_bytes;
}

// Segmented top-k (phase two). Enqueues one kernel on policy.stream; no allocation, no host
// sync (CUDA-graph safe).
//   scores       [plan.num_items] device, float (or half/bfloat16, compared as float); segment s is [offsets[s], offsets[s+1])
//   offsets      [plan.num_segments + 1] device CSR offsets, offsets[0] == 0
//   out_offsets  [plan.num_segments + 1] device CSR offsets of the result; segment s keeps
//                k_s = out_offsets[s+1] - out_offsets[s] <= its length (else -1 entries)
//   out_indices  [plan.num_kept] device; indices local to their segment, ascending
//   workspace    >= plan.workspace_bytes (0) bytes; any pointer
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
  (void)workspace;
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
