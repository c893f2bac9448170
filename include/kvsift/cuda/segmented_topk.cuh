// SPDX-License-Identifier: Apache-2.0
#pragma once

// Segmented top-k on the GPU, built from CUB's DeviceSegmentedSort (CCCL 3.0.1 has no
// cub::DeviceTopK). Mirrors cpu/segmented_topk.hpp and thrust/segmented_topk.hpp.
//
// Semantics (METHODS.md, general conventions): in each segment keep the k_s highest scores;
// ties go to the lower index; the kept indices are returned ascending. NaN ranks below every
// number (also below -inf); -0.0 and +0.0 are equal. Protected tokens (sinks, windows) are
// expressed by the caller as +inf scores; among equal +inf the lower index wins as usual.
//
// Algorithm: one 64-bit key per score, (descending-order score bits << 32) | local index, so the
// key order IS the required order and no sort stability is needed; a segmented sort of those
// keys; the first k_s of each segment are copied out; a second segmented sort orders them by
// index. Cost: two segmented sorts, of n and of sum(k) keys; nothing is allocated.
//
// Two-phase use:
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

#include <cub/device/device_segmented_sort.cuh>

#include <cstddef>
#include <cstdint>
#include <limits>

namespace kvsift::cuda {

// POD plan of a segmented top-k: sizes and the workspace layout. Depends only on the three
// counts, so one plan serves every step with the same capacities (CUDA-graph friendly).
struct segmented_topk_plan {
  std::int32_t num_items = 0;     // total scores over all segments (offsets[num_segments])
  std::int32_t num_segments = 0;  // number of segments
  std::int32_t num_kept = 0;      // total kept indices (out_offsets[num_segments])
  std::size_t sort_bytes = 0;     // CUB scratch of the score sort
  std::size_t order_bytes = 0;    // CUB scratch of the index sort
  std::size_t workspace_bytes = 0;  // what the caller must provide
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

// Kernels are templates so that a header-only library never defines a kernel twice.
template <Element Score>
KVSIFT_KERNEL void topk_make_keys(const Score* __restrict__ scores,
                                  const std::int32_t* __restrict__ offsets,
                                  std::int32_t num_segments, std::int32_t num_items,
                                  std::uint64_t* __restrict__ keys) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < num_items;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int32_t s = segment_of(offsets, num_segments, i);
    const auto local = static_cast<std::uint32_t>(i - offsets[s]);
    // index in the low bits: equal scores order by index without a stable sort
    keys[i] = (std::uint64_t{descending_key(to_float(scores[i]))} << 32) | local;
  }
}

template <class Key>
KVSIFT_KERNEL void topk_take_first(const Key* __restrict__ sorted,
                                   const std::int32_t* __restrict__ offsets,
                                   const std::int32_t* __restrict__ out_offsets,
                                   std::int32_t num_segments, std::int32_t num_kept,
                                   std::int32_t* __restrict__ kept) {
  for (std::int64_t j = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; j < num_kept;
       j += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int32_t s = segment_of(out_offsets, num_segments, j);
    const std::int64_t r = j - out_offsets[s];
    const std::int64_t n = offsets[s + 1] - offsets[s];
    // a contract violation (k_s > n_s) yields -1 instead of reading another segment
    kept[j] = r < n ? static_cast<std::int32_t>(sorted[offsets[s] + r] & 0xffffffffu) : -1;
  }
}

}  // namespace detail

// Sizes a segmented top-k (phase one). Calls CUB's size queries, which read the current
// device's properties: throws cuda_error without a usable device, kvsift::error on negative
// counts. (A template only so that CUB's kernels are compiled in the TUs that use it; the plan
// does not depend on Score.)
// Counts are taken as int64 and must fit CUB's int32 item counts: a larger count is a
// kvsift::error, never a truncated one.
template <Element Score = float>
[[nodiscard]] segmented_topk_plan make_segmented_topk_plan(std::int64_t num_items64,
                                                                  std::int64_t num_segments64,
                                                                  std::int64_t num_kept64) {
  constexpr const char* where = "cuda::make_segmented_topk_plan";
  constexpr std::int64_t max32 = std::numeric_limits<std::int32_t>::max();
  require(num_items64 >= 0 && num_items64 <= max32, where, "num_items", num_items64,
          "in [0, 2^31 - 1] (CUB's int32 item counts)");
  require(num_segments64 >= 0 && num_segments64 <= max32, where, "num_segments",
          num_segments64, "in [0, 2^31 - 1]");
  require(num_kept64 >= 0 && num_kept64 <= num_items64, where, "num_kept", num_kept64,
          "in [0, num_items]");
  const auto num_items = static_cast<std::int32_t>(num_items64);
  const auto num_segments = static_cast<std::int32_t>(num_segments64);
  const auto num_kept = static_cast<std::int32_t>(num_kept64);
  segmented_topk_plan p;
  p.num_items = num_items;
  p.num_segments = num_segments;
  p.num_kept = num_kept;
  const std::int32_t* no_offsets = nullptr;
  if (num_items > 0 && num_segments > 0) {
    check(::cub::DeviceSegmentedSort::SortKeys(
              nullptr, p.sort_bytes, static_cast<const std::uint64_t*>(nullptr),
              static_cast<std::uint64_t*>(nullptr), num_items, num_segments, no_offsets,
              no_offsets, cudaStream_t{}),
          where);
  }
  if (num_kept > 0 && num_segments > 0) {
    check(::cub::DeviceSegmentedSort::SortKeys(
              nullptr, p.order_bytes, static_cast<const std::int32_t*>(nullptr),
              static_cast<std::int32_t*>(nullptr), num_kept, num_segments, no_offsets,
              no_offsets, cudaStream_t{}),
          where);
  }
  workspace_carver c;
  (void)c.take<std::uint64_t>(num_items);  // keys
  (void)c.take<std::uint64_t>(num_items);  // sorted keys
  (void)c.take<std::int32_t>(num_kept);    // kept, unordered
  (void)c.take_bytes(p.sort_bytes);
  (void)c.take_bytes(p.order_bytes);
  p.workspace_bytes = c.used();
  return p;
}

// Workspace a segmented top-k of these counts needs (phase one, shorthand).
template <Element Score = float>
[[nodiscard]] std::size_t segmented_topk_workspace_bytes(std::int64_t num_items,
                                                                std::int64_t num_segments,
                                                                std::int64_t num_kept) {
  return make_segmented_topk_plan<Score>(num_items, num_segments, num_kept).workspace_bytes;
}

// Segmented top-k (phase two). Enqueues on policy.stream; no allocation, no host sync.
//   scores       [plan.num_items] device, float (or half/bfloat16, compared as float); segment s is [offsets[s], offsets[s+1])
//   offsets      [plan.num_segments + 1] device CSR offsets, offsets[0] == 0
//   out_offsets  [plan.num_segments + 1] device CSR offsets of the result; segment s keeps
//                k_s = out_offsets[s+1] - out_offsets[s] <= its length (else -1 entries)
//   out_indices  [plan.num_kept] device; indices local to their segment, ascending
//   workspace    >= plan.workspace_bytes bytes of device memory, 256-byte aligned
// Throws kvsift::error on a too small workspace or null pointers; cuda_error on launch errors.
template <Element Score>
void segmented_topk(par policy, const segmented_topk_plan& plan, void* workspace,
                    std::size_t workspace_bytes, const Score* scores,
                           const std::int32_t* offsets, const std::int32_t* out_offsets,
                           std::int32_t* out_indices) {
  constexpr const char* where = "cuda::segmented_topk";
  require(workspace_bytes >= plan.workspace_bytes, where, "workspace_bytes", workspace_bytes,
          ">= plan.workspace_bytes");
  if (plan.num_kept == 0 || plan.num_segments == 0) {
    return;
  }
  require(workspace != nullptr, where, "workspace", "null", "device memory");
  require(scores != nullptr && offsets != nullptr && out_offsets != nullptr &&
              out_indices != nullptr,
          where, "scores/offsets/out_offsets/out_indices", "null", "device pointers");
  workspace_carver c(workspace);
  auto* keys = c.take<std::uint64_t>(plan.num_items);
  auto* sorted = c.take<std::uint64_t>(plan.num_items);
  auto* kept = c.take<std::int32_t>(plan.num_kept);
  void* sort_tmp = c.take_bytes(plan.sort_bytes);
  void* order_tmp = c.take_bytes(plan.order_bytes);
  constexpr int block = 256;

  detail::topk_make_keys<Score><<<detail::grid_for(plan.num_items, block), block, 0, policy.stream>>>(
      scores, offsets, plan.num_segments, plan.num_items, keys);
  check_launch(where);
  std::size_t sort_bytes = plan.sort_bytes;
  check(::cub::DeviceSegmentedSort::SortKeys(sort_tmp, sort_bytes, keys, sorted, plan.num_items,
                                             plan.num_segments, offsets, offsets + 1,
                                             policy.stream),
        where);
  detail::topk_take_first<std::uint64_t><<<detail::grid_for(plan.num_kept, block), block, 0, policy.stream>>>(
      sorted, offsets, out_offsets, plan.num_segments, plan.num_kept, kept);
  check_launch(where);
  std::size_t order_bytes = plan.order_bytes;
  check(::cub::DeviceSegmentedSort::SortKeys(order_tmp, order_bytes, kept, out_indices,
                                             plan.num_kept, plan.num_segments, out_offsets,
                                             out_offsets + 1, policy.stream),
        where);
}

}  // namespace kvsift::cuda
