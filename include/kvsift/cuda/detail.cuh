// SPDX-License-Identifier: Apache-2.0
#pragma once

// Small device helpers shared by the kvsift::cuda kernels.

#include <kvsift/core/config.hpp>
#include <kvsift/cuda/error.cuh>

#include <cstdint>

namespace kvsift::cuda::detail {

// Index s of the CSR segment holding item i: offsets[s] <= i < offsets[s + 1].
// Empty segments are skipped because the search returns the last s with offsets[s] <= i.
KVSIFT_DEVICE inline std::int32_t segment_of(const std::int32_t* offsets,
                                             std::int32_t num_segments, std::int64_t i) {
  std::int32_t lo = 0;
  std::int32_t hi = num_segments;  // invariant: offsets[lo] <= i < offsets[hi]
  while (hi - lo > 1) {
    const std::int32_t mid = lo + (hi - lo) / 2;
    if (offsets[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Grid size for a grid-stride loop over n work items with `block` threads per block.
inline unsigned grid_for(std::int64_t n, int block, unsigned cap = 65535u * 8u) {
  const std::int64_t g = (n + block - 1) / block;
  return g < 1 ? 1u : (g > cap ? cap : static_cast<unsigned>(g));
}

KVSIFT_DEVICE inline float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, o);
  }
  return x;
}

}  // namespace kvsift::cuda::detail
