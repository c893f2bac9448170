// SPDX-License-Identifier: Apache-2.0
#pragma once

// Sparse decode attention: one query token per request attends over the index set (token_set)
// or page set (page_set) of its KV head, read in place from a dense or paged KV view. This is
// step 3 of the method lifecycle when the engine uses the library's kernel. Mirrors
// attention/reference.hpp (attend_row, attend_plan: the CPU reference).
//
//   out[r][hq] = sum_j softmax_j(scale * q[r][hq] . k[r][hq / G][t_j]) * v[r][hq / G][t_j]
//
// over the tokens t_j of segment s = r * kv_heads + hq / G, G = q_heads / kv_heads (GQA; MHA is
// G = 1). Arithmetic in float, row max subtracted (online softmax). An empty set gives zeros.
// Element types float, half, bfloat16; head_dim 64 or 128 (template-specialised).
//
// Kernel shape: one block per (request, query head); each warp walks a strided share of the
// set keeping its own running max, sum and accumulator; the warps merge through shared memory.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/kv_view.cuh>
#include <kvsift/cuda/policy.cuh>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace kvsift::cuda {

// POD description of one sparse decode-attention launch.
struct sparse_attention_shape {
  std::int32_t num_requests = 0;
  std::int32_t num_q_heads = 0;   // a multiple of the view's num_kv_heads
  float scale = 0.0f;             // softmax scale; 0 means 1 / sqrt(head_dim)
};

namespace detail {

inline constexpr int attention_warps = 4;

// Walks the tokens of segment s that warp `w` of `nw` owns, calling f(t) for each. Indices live
// in device memory, where the host cannot check them without a copy: a token outside
// [0, seq_len) of its request is never read (it is skipped, as if absent from the set), so a bad
// index cannot read past the request's KV.
template <class Kv, class F>
KVSIFT_DEVICE void for_each_token(const token_set& set, const Kv& kv, std::int32_t r,
                                  std::int32_t s, int w, int nw, F&& f) {
  const std::int32_t n = kv.seq_len(r);
  for (std::int32_t i = set.offsets[s] + w; i < set.offsets[s + 1]; i += nw) {
    const std::int32_t t = set.indices[i];
    if (t >= 0 && t < n) f(t);
  }
}

template <class Kv, class F>
KVSIFT_DEVICE void for_each_token(const page_set& set, const Kv& kv, std::int32_t r,
                                  std::int32_t s, int w, int nw, F&& f) {
  const std::int32_t n = kv.seq_len(r);
  // pages are dealt to warps round-robin; a warp walks its page's tokens in order
  for (std::int32_t i = set.offsets[s] + w; i < set.offsets[s + 1]; i += nw) {
    const std::int32_t page = set.indices[i];
    if (page < 0) continue;  // never read before the request's first page
    const std::int64_t first64 = static_cast<std::int64_t>(page) * set.page_size;
    const std::int32_t first = first64 < n ? static_cast<std::int32_t>(first64) : n;
    const std::int32_t last = min(first + set.page_size, n);
    for (std::int32_t t = first; t < last; ++t) {
      f(t);
    }
  }
}

template <int D, KvView Kv, class Set>
__global__ void __launch_bounds__(attention_warps * 32)
    sparse_decode_attention_kernel(const typename Kv::element_type* __restrict__ q, Kv kv,
                                   Set set, std::int32_t num_q_heads, float scale,
                                   typename Kv::element_type* __restrict__ out) {
  using T = typename Kv::element_type;
  constexpr int per_lane = D / 32;  // each lane owns per_lane consecutive channels
  const std::int32_t r = blockIdx.x / num_q_heads;
  const std::int32_t hq = blockIdx.x % num_q_heads;
  const std::int32_t group = num_q_heads / kv.num_kv_heads;
  const std::int32_t h = hq / group;
  const std::int32_t s = r * kv.num_kv_heads + h;
  const int lane = threadIdx.x % 32;
  const int w = threadIdx.x / 32;
  const int c0 = lane * per_lane;

  float qr[per_lane];
  const T* qrow = q + (std::int64_t{r} * num_q_heads + hq) * D;
#pragma unroll
  for (int i = 0; i < per_lane; ++i) {
    qr[i] = to_float(qrow[c0 + i]) * scale;  // fold the scale into q once
  }
  float m = -INFINITY;
  float l = 0.0f;
  float acc[per_lane];
#pragma unroll
  for (int i = 0; i < per_lane; ++i) {
    acc[i] = 0.0f;
  }

  for_each_token(set, kv, r, s, w, attention_warps, [&](std::int32_t t) {
    const T* kr = kv.row(0, r, h, t);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
      dot += qr[i] * to_float(kr[c0 + i]);
    }
    dot = warp_sum(dot);
    const float m_new = fmaxf(m, dot);
    // rescale what was accumulated under the old max (exp(-inf) = 0 on the first token)
    const float corr = __expf(m - m_new);
    const float p = __expf(dot - m_new);
    const T* vr = kv.row(1, r, h, t);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
      acc[i] = acc[i] * corr + p * to_float(vr[c0 + i]);
    }
    m = m_new;
  });

  __shared__ float sm_m[attention_warps];
  __shared__ float sm_l[attention_warps];
  __shared__ float sm_acc[attention_warps][D];
  if (lane == 0) {
    sm_m[w] = m;
    sm_l[w] = l;
  }
#pragma unroll
  for (int i = 0; i < per_lane; ++i) {
    sm_acc[w][c0 + i] = acc[i];
  }
  __syncthreads();
  float big = -INFINITY;
#pragma unroll
  for (int x = 0; x < attention_warps; ++x) {
    big = fmaxf(big, sm_m[x]);
  }
  float total = 0.0f;
  float wscale[attention_warps];
#pragma unroll
  for (int x = 0; x < attention_warps; ++x) {
    // warps that saw no token have m = -inf and weigh 0
    wscale[x] = sm_m[x] == -INFINITY ? 0.0f : __expf(sm_m[x] - big);
    total += sm_l[x] * wscale[x];
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  T* orow = out + (std::int64_t{r} * num_q_heads + hq) * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    float o = 0.0f;
#pragma unroll
    for (int x = 0; x < attention_warps; ++x) {
      o += sm_acc[x][c] * wscale[x];
    }
    orow[c] = from_float<T>(o * inv);
  }
}

}  // namespace detail

// Runs sparse decode attention (see the file comment). Enqueues on policy.stream; no workspace,
// no allocation, no host synchronisation (CUDA-graph safe).
//   q     [num_requests][num_q_heads][head_dim] device
//   kv    dense_kv<T> or paged_kv<T>
//   set   token_set or page_set over num_requests * kv.num_kv_heads segments
//   out   [num_requests][num_q_heads][head_dim] device
// Throws kvsift::error for head_dim not in {64, 128}, q heads not a multiple of KV heads, bad
// counts or null pointers; cuda_error on a launch error.
template <KvView Kv, class Set>
  requires std::same_as<Set, token_set> || std::same_as<Set, page_set>
void sparse_decode_attention(par policy, const typename Kv::element_type* q, const Kv& kv,
                             const Set& set, sparse_attention_shape shape,
                             typename Kv::element_type* out) {
  constexpr const char* where = "cuda::sparse_decode_attention";
  require(kv.head_dim == 64 || kv.head_dim == 128, where, "kv.head_dim", kv.head_dim,
          "64 or 128");
  require(kv.num_kv_heads > 0, where, "kv.num_kv_heads", kv.num_kv_heads, "> 0");
  require(shape.num_q_heads > 0 && shape.num_q_heads % kv.num_kv_heads == 0, where,
          "shape.num_q_heads", shape.num_q_heads, "a positive multiple of kv.num_kv_heads");
  require(shape.num_requests >= 0, where, "shape.num_requests", shape.num_requests, ">= 0");
  require(std::isfinite(shape.scale) && shape.scale >= 0.0f, where, "shape.scale", shape.scale,
          "finite and >= 0 (0 means 1/sqrt(head_dim))");
  if constexpr (std::same_as<Set, page_set>) {
    require(set.page_size > 0, where, "set.page_size", set.page_size, "> 0");
  }
  if (shape.num_requests == 0) {
    return;
  }
  require(q != nullptr && out != nullptr && set.offsets != nullptr && set.indices != nullptr,
          where, "q/out/set", "null", "device pointers");
  const std::int64_t blocks = std::int64_t{shape.num_requests} * shape.num_q_heads;
  require(blocks <= 0x7fffffff, where, "num_requests * num_q_heads", blocks, "< 2^31");
  const float scale =
      shape.scale > 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(detail::attention_warps * 32);
  if (kv.head_dim == 64) {
    detail::sparse_decode_attention_kernel<64, Kv, Set>
        <<<grid, block, 0, policy.stream>>>(q, kv, set, shape.num_q_heads, scale, out);
  } else {
    detail::sparse_decode_attention_kernel<128, Kv, Set>
        <<<grid, block, 0, policy.stream>>>(q, kv, set, shape.num_q_heads, scale, out);
  }
  check_launch(where);
}

}  // namespace kvsift::cuda
