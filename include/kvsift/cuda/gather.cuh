// SPDX-License-Identifier: Apache-2.0
#pragma once

// Gather of selected KV rows into compact per-head-sequence storage: the step that makes a kept
// set physically smaller (DESIGN §7.1). Works on dense (NHD/HND) and paged (NHD/HND) sources.
// Mirrors store/basic.hpp (basic_store::gather) and thrust/gather.hpp.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/kv_view.cuh>
#include <kvsift/cuda/policy.cuh>

#include <cstddef>
#include <cstdint>

namespace kvsift::cuda {

namespace detail {

template <KvView Kv>
KVSIFT_KERNEL void gather_rows_kernel(Kv src, token_set sel, std::int32_t num_segments,
                                      std::int32_t num_rows,
                                      typename Kv::element_type* __restrict__ dst_k,
                                      typename Kv::element_type* __restrict__ dst_v) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t{gridDim.x} * (blockDim.x / 32);
  // one warp per output row: lanes copy consecutive channels (coalesced on both sides)
  for (std::int64_t j = blockIdx.x * std::int64_t{blockDim.x / 32} + threadIdx.x / 32;
       j < num_rows; j += warps) {
    const std::int32_t s = segment_of(sel.offsets, num_segments, j);
    const std::int32_t r = s / src.num_kv_heads;
    const std::int32_t h = s % src.num_kv_heads;
    const std::int32_t t = sel.indices[j];
    const auto* ks = src.row(0, r, h, t);
    const auto* vs = src.row(1, r, h, t);
    const std::int64_t o = j * src.head_dim;
    for (int c = lane; c < src.head_dim; c += 32) {
      dst_k[o + c] = ks[c];
      dst_v[o + c] = vs[c];
    }
  }
}

}  // namespace detail

// Copies the selected rows of every segment into dst, compactly and in selection order.
//   src           dense_kv<T> or paged_kv<T> (device memory)
//   sel           token_set over num_segments = requests * src.num_kv_heads segments
//   num_rows      sel.offsets[num_segments] (host copy of the total)
//   dst_k, dst_v  [num_rows][head_dim] device; row sel.offsets[s] + j holds token
//                 sel.indices[sel.offsets[s] + j] of segment s
// No workspace. Throws kvsift::error on bad arguments, cuda_error on a launch error.
template <KvView Kv>
void gather(par policy, const Kv& src, token_set sel, std::int32_t num_segments,
            std::int32_t num_rows, typename Kv::element_type* dst_k,
            typename Kv::element_type* dst_v) {
  constexpr const char* where = "cuda::gather";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(num_rows >= 0, where, "num_rows", num_rows, ">= 0");
  require(src.num_kv_heads > 0, where, "src.num_kv_heads", src.num_kv_heads, "> 0");
  require(src.head_dim > 0, where, "src.head_dim", src.head_dim, "> 0");
  require(num_segments % src.num_kv_heads == 0, where, "num_segments", num_segments,
          "a multiple of src.num_kv_heads");
  if (num_rows == 0) {
    return;
  }
  require(sel.offsets != nullptr && sel.indices != nullptr, where, "sel", "null",
          "device CSR arrays");
  require(dst_k != nullptr && dst_v != nullptr, where, "dst_k/dst_v", "null", "device memory");
  constexpr int block = 256;
  detail::gather_rows_kernel<<<detail::grid_for(std::int64_t{num_rows} * 32, block), block, 0,
                               policy.stream>>>(src, sel, num_segments, num_rows, dst_k, dst_v);
  check_launch(where);
}

// Expands a page set into the token set it covers (for gather or token-level kernels).
// out_offsets must hold the token CSR of the expansion (computed by the caller's plan);
// this kernel writes out_indices[out_offsets[s] ..] = the tokens of each listed page.
namespace detail {

template <KvView Kv>
KVSIFT_KERNEL void expand_pages_kernel(Kv src, page_set pages, std::int32_t num_segments,
                                       const std::int32_t* __restrict__ out_offsets,
                                       std::int32_t* __restrict__ out_indices) {
  // one block per segment: pages are walked in order, threads fill each page's tokens
  for (std::int32_t s = blockIdx.x; s < num_segments; s += gridDim.x) {
    const std::int32_t r = s / src.num_kv_heads;
    const std::int32_t n = src.seq_len(r);
    std::int32_t at = out_offsets[s];
    for (std::int32_t i = pages.offsets[s]; i < pages.offsets[s + 1]; ++i) {
      const std::int32_t first = pages.indices[i] * pages.page_size;
      const std::int32_t last = min(first + pages.page_size, n);
      for (std::int32_t t = first + static_cast<std::int32_t>(threadIdx.x); t < last;
           t += blockDim.x) {
        out_indices[at + (t - first)] = t;
      }
      at += last > first ? last - first : 0;
    }
  }
}

}  // namespace detail

// Writes the tokens of every listed page (see page_set) as a token_set with the given CSR
// out_offsets ([num_segments + 1] device; segment s must have room for its pages' tokens).
template <KvView Kv>
void expand_pages(par policy, const Kv& src, page_set pages, std::int32_t num_segments,
                  const std::int32_t* out_offsets, std::int32_t* out_indices) {
  constexpr const char* where = "cuda::expand_pages";
  require(pages.page_size > 0, where, "pages.page_size", pages.page_size, "> 0");
  require(src.num_kv_heads > 0, where, "src.num_kv_heads", src.num_kv_heads, "> 0");
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  if (num_segments == 0) {
    return;
  }
  require(pages.offsets != nullptr && pages.indices != nullptr, where, "pages", "null",
          "device offsets and indices arrays");
  require(out_offsets != nullptr && out_indices != nullptr, where, "out_offsets/out_indices",
          "null", "device arrays ([num_segments + 1] and the expansion's tokens)");
  const unsigned grid = num_segments < 65535 ? static_cast<unsigned>(num_segments) : 65535u;
  detail::expand_pages_kernel<<<grid, 128, 0, policy.stream>>>(src, pages, num_segments,
                                                               out_offsets, out_indices);
  check_launch(where);
}

}  // namespace kvsift::cuda
