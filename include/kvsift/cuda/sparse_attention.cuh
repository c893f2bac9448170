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
// On request (`lse`, float [num_requests][num_q_heads] device, null = not written) each query
// head's log-sum-exp of its scaled logits over the set (-inf for an empty set): `out` is then a
// partial attention that attention::merge_partials combines with another over disjoint rows.
// Element types float, half, bfloat16; head_dim 64 or 128 (template-specialised).
//
// Kernel shape (split-KV, as flash-decoding): a block serves a tile of up to 4 query heads that
// share one KV head, so each K/V row is read from memory once for the whole tile, over one chunk
// of the segment's set; a segment's set is cut into `num_splits` chunks (a plan, below) so that a
// small batch still fills the GPU. Inside a block every 16-byte load is one lane's share of a
// row: a row of d channels takes d * sizeof(T) / 16 lanes, so a warp reads 1-4 rows at a time.
// Each iteration a lane-group issues the loads of its next 4 rows (K and V words) into
// registers, then computes: all dot products from the K words, then the V words; at 128
// registers a thread, 4 blocks fit on an SM. (A cp.async ring in shared memory, which keeps the
// next iteration's rows in flight during the compute, is kept as a variant the GPU benchmark
// compares: attention_pipeline. On an H200, 2026-11-27, a 3-stage ring was 5-10% faster in one
// run and 1% slower in another; the register pipeline is the one the GPU tests run.) Each lane-group keeps its
// own running max, sum and accumulator; the block merges them through shared memory. With more
// than one split, each chunk writes its partial result to the caller's workspace and a second
// kernel merges them, or (plan.merge_in_kernel) the last chunk of each head tile to finish does,
// counting arrivals in the workspace.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cuda/detail.cuh>
#include <kvsift/cuda/error.cuh>
#include <kvsift/cuda/kv_view.cuh>
#include <kvsift/cuda/memory.cuh>
#include <kvsift/cuda/policy.cuh>

#include <algorithm>
#include <cuda_fp16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvsift::cuda {

// POD description of one sparse decode-attention launch.
struct sparse_attention_shape {
  std::int32_t num_requests = 0;
  std::int32_t num_q_heads = 0;   // a multiple of the view's num_kv_heads
  float scale = 0.0f;             // softmax scale; 0 means 1 / sqrt(head_dim)
};

// POD plan of a split launch: how each segment's set is cut, and the workspace that holds the
// chunks' partial results. It depends only on host-known counts (the batch, the heads and an
// upper bound on any segment's set size), so one plan serves every step of the same
// capacities (CUDA-graph friendly). A segment larger than `max_entries` is still read whole:
// its last chunk takes the rest (slower, never wrong).
struct sparse_attention_plan {
  std::int32_t num_requests = 0;
  std::int32_t num_q_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t num_splits = 1;   // chunks per segment (grid.y)
  std::int32_t chunk = 0;        // set entries (tokens or pages) per chunk
  // true: the last chunk of a head tile to finish merges the tile's chunks (no merge kernel);
  // its arrival counters live in the workspace, which must then be zeroed once before first use
  // (prepare_sparse_attention_workspace). Off by default: on an H200 (2026-11-27) it was slower
  // at batch 1 (one block merges its tile's many chunks) and no faster at batch 64
  bool merge_in_kernel = false;
  std::size_t workspace_bytes = 0;  // 0 when num_splits == 1
};

namespace detail {

inline constexpr int attention_threads = 128;

// Query heads a block serves: the largest of 4, 2, 1 dividing the GQA group. (A tile of 8 would
// need 229 registers a thread; a group of 8 runs as two tiles of 4, each reading the KV head's
// rows: L2 may serve the second read, which was not measured.)
constexpr int attention_head_tile(std::int32_t group) {
  return group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
}

template <class T, int D>
struct attention_tile {
  static constexpr int vec = 16 / static_cast<int>(sizeof(T));  // channels per 16-byte load
  static constexpr int lanes = D / vec;                         // lanes reading one row
  static constexpr int groups = attention_threads / lanes;      // lane-groups in a block
  static_assert(lanes >= 4 && lanes <= 32 && 32 % lanes == 0);
};

// Token of set entry-position u of segment s, or -1 when it is absent or outside [0, n). For a
// token set u is the entry; for a page set u runs over the entries' pages token by token. Indices
// live in device memory, where the host cannot check them without a copy: a token outside the
// request's KV is never read (skipped, as if absent from the set).
KVSIFT_DEVICE inline std::int32_t token_at(const token_set& set, std::int32_t base,
                                           std::int32_t u, std::int32_t n) {
  const std::int32_t t = set.indices[base + u];
  return t >= 0 && t < n ? t : -1;
}
KVSIFT_DEVICE inline std::int32_t token_at(const page_set& set, std::int32_t base,
                                           std::int32_t u, std::int32_t n) {
  const std::int32_t page = set.indices[base + u / set.page_size];
  const std::int64_t t = std::int64_t{page} * set.page_size + u % set.page_size;
  return page >= 0 && t < n ? static_cast<std::int32_t>(t) : -1;
}
KVSIFT_DEVICE inline std::int32_t entry_tokens(const token_set&) { return 1; }
KVSIFT_DEVICE inline std::int32_t entry_tokens(const page_set& set) { return set.page_size; }

// Element i of a 16-byte word of T, as float (half through the hardware conversion: exact).
template <class T>
KVSIFT_DEVICE inline float element_of(const uint4& raw, int i) {
  const T e = reinterpret_cast<const T*>(&raw)[i];
  if constexpr (std::is_same_v<T, half>) {
    return __half2float(__ushort_as_half(e.bits));
  } else {
    return to_float(e);
  }
}

// Sum over the `Lanes` lanes of one lane-group (an aligned run of Lanes lanes of the warp).
// Every lane of the group ends with the same bits (the butterfly adds the same pairs).
template <int Lanes>
KVSIFT_DEVICE inline float group_sum(float x) {
#pragma unroll
  for (int o = Lanes / 2; o > 0; o >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, o);
  }
  return x;
}

// Weight of a partial result with running max m under the merged max `big` (0 for no token).
KVSIFT_DEVICE inline float merge_weight(float m, float big) {
  return m == -INFINITY ? 0.0f : __expf(m - big);
}

// cp.async (sm_80 and later): a 16-byte copy from global to shared memory that passes neither
// L1 nor the registers. Only the thread that issued a copy reads its slot, after wait_group, so
// the ring below needs no barrier.
KVSIFT_DEVICE inline void cp_async16(void* smem, const void* gmem) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}
KVSIFT_DEVICE inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
KVSIFT_DEVICE inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared memory of one attention block: the cp.async ring while the rows stream (Stages slots
// of Unroll rows' K and V words and tokens per thread), then, reusing it, the lane-groups'
// partial results for the block's merge.
template <int D, int G, int Stages, int Unroll, class T>
struct attention_smem {
  static constexpr int groups = attention_tile<T, D>::groups;
  static constexpr std::size_t ring_words = std::size_t{Stages} * Unroll * attention_threads;
  static constexpr std::size_t ring_bytes = ring_words * (2 * sizeof(uint4) + sizeof(int));
  static constexpr std::size_t merge_bytes = sizeof(float) * (std::size_t{groups} * G * (D + 3) + 2 * G);
  static constexpr std::size_t bytes = ring_bytes > merge_bytes ? ring_bytes : merge_bytes;
  static_assert(bytes <= 48 * 1024, "static shared memory is limited to 48 KiB");
};

// Output channel c of row `row` from the chunks' partial results (max, sum, unnormalised o).
// Reads through L2 (__ldcg): in the in-kernel merge the partials were written by other blocks.
template <int D>
KVSIFT_DEVICE inline float merge_chunks(const float* part_o, const float* part_ml,
                                        std::int32_t splits, std::int64_t rows, std::int64_t row,
                                        int c) {
  float big = -INFINITY;
  for (std::int32_t x = 0; x < splits; ++x) {
    big = fmaxf(big, __ldcg(part_ml + 2 * (x * rows + row)));
  }
  float o = 0.0f;
  float total = 0.0f;
  for (std::int32_t x = 0; x < splits; ++x) {
    const std::int64_t at = x * rows + row;
    const float w = merge_weight(__ldcg(part_ml + 2 * at), big);
    total += __ldcg(part_ml + 2 * at + 1) * w;
    o += __ldcg(part_o + at * D + c) * w;
  }
  return total > 0.0f ? o / total : 0.0f;
}
// The log-sum-exp of row `row` from the chunks' (max, sum) pairs: -inf when no chunk saw a token.
KVSIFT_DEVICE inline float merged_lse(const float* part_ml, std::int32_t splits, std::int64_t rows,
                                      std::int64_t row) {
  float big = -INFINITY;
  for (std::int32_t x = 0; x < splits; ++x) {
    big = fmaxf(big, __ldcg(part_ml + 2 * (x * rows + row)));
  }
  float total = 0.0f;
  for (std::int32_t x = 0; x < splits; ++x) {
    const std::int64_t at = x * rows + row;
    total += __ldcg(part_ml + 2 * at + 1) * merge_weight(__ldcg(part_ml + 2 * at), big);
  }
  return total > 0.0f ? big + logf(total) : -INFINITY;
}

// Stages == 0: each iteration loads its Unroll rows per lane-group into registers, then
// computes. Stages >= 2: the rows stream through a Stages-deep cp.async ring, so Stages - 1
// iterations' rows are in flight while one is computed (and no register holds a row in flight).
// With `arrivals` (split launches only), the last chunk of a head tile to finish merges the
// tile's chunks itself and resets its counter, in place of the merge kernel.
template <int D, int G, int Stages, int Unroll, KvView Kv, class Set>
__global__ void __launch_bounds__(attention_threads)
    sparse_decode_attention_kernel(const typename Kv::element_type* __restrict__ q, Kv kv,
                                   Set set, std::int32_t num_q_heads, float scale,
                                   std::int32_t chunk, typename Kv::element_type* __restrict__ out,
                                   float* __restrict__ part_o, float* __restrict__ part_ml,
                                   unsigned* __restrict__ arrivals, float* __restrict__ lse) {
  using T = typename Kv::element_type;
  using tile = attention_tile<T, D>;
  using smem_t = attention_smem<D, G, Stages, Unroll, T>;
  constexpr int vec = tile::vec;
  constexpr int lanes = tile::lanes;
  constexpr int groups = tile::groups;
  constexpr int step = groups * Unroll;  // entry-positions per iteration
  static_assert(Stages == 0 || Stages >= 2);
  __shared__ __align__(16) unsigned char smem[smem_t::bytes];

  const std::int32_t tiles_per_request = num_q_heads / G;
  const std::int32_t r = blockIdx.x / tiles_per_request;
  const std::int32_t hq0 = (blockIdx.x % tiles_per_request) * G;
  const std::int32_t h = hq0 / (num_q_heads / kv.num_kv_heads);
  const std::int32_t s = r * kv.num_kv_heads + h;
  const int lg = threadIdx.x / lanes;            // lane-group
  const int c0 = (threadIdx.x % lanes) * vec;    // first channel of this lane

  // this block's range of entry-positions: chunk blockIdx.y; the last chunk takes the rest
  const std::int32_t base = set.offsets[s];
  const std::int32_t entries = set.offsets[s + 1] - base;
  const std::int32_t e0 = min(entries, static_cast<std::int32_t>(blockIdx.y) * chunk);
  const std::int32_t e1 = blockIdx.y + 1 == gridDim.y ? entries : min(entries, e0 + chunk);
  const std::int32_t per_entry = entry_tokens(set);
  const std::int32_t u0 = e0 * per_entry;
  const std::int32_t u1 = e1 * per_entry;
  const std::int32_t n = kv.seq_len(r);

  float qr[G][vec];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const uint4 raw = *reinterpret_cast<const uint4*>(
        q + (std::int64_t{r} * num_q_heads + hq0 + g) * D + c0);
#pragma unroll
    for (int i = 0; i < vec; ++i) {
      qr[g][i] = element_of<T>(raw, i) * scale;  // fold the scale into q once
    }
  }
  float m[G], l[G], acc[G][vec];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < vec; ++i) {
      acc[g][i] = 0.0f;
    }
  }

  // The online softmax over one iteration's rows: t[j] < 0 is no row, whose words krow(j) and
  // vrow(j) give as zeros. K words first (all dot products), then V words, so one row's word is
  // live at a time when they come from the ring.
  const auto consume = [&](const std::int32_t (&t)[Unroll], auto&& krow, auto&& vrow) {
    float p[G][Unroll];
#pragma unroll
    for (int j = 0; j < Unroll; ++j) {
      const uint4 kw = krow(j);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float x = 0.0f;
#pragma unroll
        for (int i = 0; i < vec; ++i) {
          x += qr[g][i] * element_of<T>(kw, i);
        }
        p[g][j] = x;
      }
    }
    float corr[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float big = m[g];
#pragma unroll
      for (int j = 0; j < Unroll; ++j) {
        // every lane shuffles: the warp's two lane-groups may differ in t[j]
        const float x = group_sum<lanes>(p[g][j]);
        p[g][j] = t[j] >= 0 ? x : -INFINITY;
        big = fmaxf(big, p[g][j]);
      }
      if (big == -INFINITY) {  // nothing seen yet by this lane-group (uniform within it)
        corr[g] = 1.0f;
#pragma unroll
        for (int j = 0; j < Unroll; ++j) {
          p[g][j] = 0.0f;
        }
        continue;
      }
      // rescale what was accumulated under the old max (exp(-inf) = 0 on the first token)
      corr[g] = __expf(m[g] - big);
      float psum = 0.0f;
#pragma unroll
      for (int j = 0; j < Unroll; ++j) {
        p[g][j] = __expf(p[g][j] - big);
        psum += p[g][j];
      }
      l[g] = l[g] * corr[g] + psum;
      m[g] = big;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int i = 0; i < vec; ++i) {
        acc[g][i] *= corr[g];
      }
    }
#pragma unroll
    for (int j = 0; j < Unroll; ++j) {
      const uint4 vw = vrow(j);
#pragma unroll
      for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int i = 0; i < vec; ++i) {
          acc[g][i] += p[g][j] * element_of<T>(vw, i);
        }
      }
    }
  };
  const auto token = [&](std::int32_t u) { return u < u1 ? token_at(set, base, u, n) : -1; };

  // The trip count is the block's, so every lane reaches the shuffles in consume.
  if constexpr (Stages == 0) {
    for (std::int32_t u = u0; u < u1; u += step) {
      std::int32_t t[Unroll];
      uint4 kr[Unroll], vr[Unroll];  // every load of the iteration in flight before any use
#pragma unroll
      for (int j = 0; j < Unroll; ++j) {
        t[j] = token(u + j * groups + lg);
        kr[j] = vr[j] = make_uint4(0, 0, 0, 0);
        if (t[j] >= 0) {
          kr[j] = __ldg(reinterpret_cast<const uint4*>(kv.row(0, r, h, t[j]) + c0));
          vr[j] = __ldg(reinterpret_cast<const uint4*>(kv.row(1, r, h, t[j]) + c0));
        }
      }
      consume(t, [&](int j) { return kr[j]; }, [&](int j) { return vr[j]; });
    }
  } else {
    // ring slot (stage, j) of this thread: [stage][j][thread]
    uint4* ring_k = reinterpret_cast<uint4*>(smem);
    uint4* ring_v = ring_k + smem_t::ring_words;
    std::int32_t* ring_t = reinterpret_cast<std::int32_t*>(ring_v + smem_t::ring_words);
    const auto slot = [&](int stage, int j) {
      return (stage * Unroll + j) * attention_threads + static_cast<int>(threadIdx.x);
    };
    const std::int32_t iters = u1 > u0 ? (u1 - u0 + step - 1) / step : 0;
    const auto issue = [&](std::int32_t it) {
      const int stage = it % Stages;
#pragma unroll
      for (int j = 0; j < Unroll; ++j) {
        const std::int32_t t = token(u0 + it * step + j * groups + lg);
        ring_t[slot(stage, j)] = t;
        if (t >= 0) {
          cp_async16(ring_k + slot(stage, j), kv.row(0, r, h, t) + c0);
          cp_async16(ring_v + slot(stage, j), kv.row(1, r, h, t) + c0);
        }
      }
    };
#pragma unroll
    for (int it = 0; it < Stages - 1; ++it) {
      if (it < iters) {
        issue(it);
      }
      cp_async_commit();  // one group per iteration, empty past the end
    }
    for (std::int32_t it = 0; it < iters; ++it) {
      if (it + Stages - 1 < iters) {
        issue(it + Stages - 1);  // into the slot read (and consumed) by iteration it - 1
      }
      cp_async_commit();
      cp_async_wait<Stages - 1>();  // iteration it's group has landed
      const int stage = it % Stages;
      std::int32_t t[Unroll];
#pragma unroll
      for (int j = 0; j < Unroll; ++j) {
        t[j] = ring_t[slot(stage, j)];
      }
      // an absent row's slot holds stale words: zeros instead
      const auto word = [&](const uint4* ring, int j) {
        return t[j] >= 0 ? ring[slot(stage, j)] : make_uint4(0, 0, 0, 0);
      };
      consume(t, [&](int j) { return word(ring_k, j); }, [&](int j) { return word(ring_v, j); });
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring's memory is the merge's below
  }

  // merge the lane-groups
  float* const sm_acc = reinterpret_cast<float*>(smem);        // [groups][G][D]
  float* const sm_m = sm_acc + groups * G * D;                 // [groups][G]
  float* const sm_l = sm_m + groups * G;
  float* const sm_w = sm_l + groups * G;
  float* const sm_big = sm_w + groups * G;                     // [G]
  float* const sm_total = sm_big + G;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (c0 == 0) {
      sm_m[lg * G + g] = m[g];
      sm_l[lg * G + g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < vec; ++i) {
      sm_acc[(lg * G + g) * D + c0 + i] = acc[g][i];
    }
  }
  __syncthreads();
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float big = -INFINITY;
    for (int x = 0; x < groups; ++x) {
      big = fmaxf(big, sm_m[x * G + g]);
    }
    float total = 0.0f;
    for (int x = 0; x < groups; ++x) {
      sm_w[x * G + g] = merge_weight(sm_m[x * G + g], big);
      total += sm_l[x * G + g] * sm_w[x * G + g];
    }
    sm_big[g] = big;
    sm_total[g] = total;
  }
  __syncthreads();
  const std::int64_t row0 = std::int64_t{r} * num_q_heads + hq0;  // output row of head hq0
  const std::int64_t rows = std::int64_t{gridDim.x} * G;          // num_requests * num_q_heads
  for (int e = threadIdx.x; e < G * D; e += attention_threads) {
    const int g = e / D;
    const int c = e % D;
    float o = 0.0f;
#pragma unroll
    for (int x = 0; x < groups; ++x) {
      o += sm_acc[(x * G + g) * D + c] * sm_w[x * G + g];
    }
    if (part_o == nullptr) {
      const float total = sm_total[g];
      out[(row0 + g) * D + c] = from_float<T>(total > 0.0f ? o / total : 0.0f);
      if (lse != nullptr && c == 0) {
        lse[row0 + g] = total > 0.0f ? sm_big[g] + logf(total) : -INFINITY;
      }
    } else {
      const std::int64_t at = blockIdx.y * rows + row0 + g;
      part_o[at * D + c] = o;
      if (c == 0) {
        part_ml[2 * at] = sm_big[g];
        part_ml[2 * at + 1] = sm_total[g];
      }
    }
  }
  if (part_o == nullptr || arrivals == nullptr) {
    return;
  }
  // The in-kernel merge: the tile's last chunk to arrive reads every chunk's partials.
  __shared__ bool last;
  __threadfence();  // this block's partials are visible device-wide before its arrival
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(arrivals + blockIdx.x, 1u) == gridDim.y - 1;
  }
  __syncthreads();
  if (!last) {
    return;
  }
  __threadfence();
  for (int e = threadIdx.x; e < G * D; e += attention_threads) {
    const int g = e / D;
    const int c = e % D;
    out[(row0 + g) * D + c] =
        from_float<T>(merge_chunks<D>(part_o, part_ml, gridDim.y, rows, row0 + g, c));
    if (lse != nullptr && c == 0) {
      lse[row0 + g] = merged_lse(part_ml, gridDim.y, rows, row0 + g);
    }
  }
  if (threadIdx.x == 0) {
    arrivals[blockIdx.x] = 0;  // every chunk of this launch has arrived: ready for the next
  }
}

// Merges the chunks' partial results of one output row per block (D threads, one channel each).
template <int D, Element T>
__global__ void __launch_bounds__(D)
    sparse_attention_merge_kernel(const float* __restrict__ part_o,
                                  const float* __restrict__ part_ml, std::int32_t splits,
                                  std::int64_t rows, T* __restrict__ out, float* __restrict__ lse) {
  out[blockIdx.x * std::int64_t{D} + threadIdx.x] = from_float<T>(
      merge_chunks<D>(part_o, part_ml, splits, rows, blockIdx.x, static_cast<int>(threadIdx.x)));
  if (lse != nullptr && threadIdx.x == 0) {
    lse[blockIdx.x] = merged_lse(part_ml, splits, rows, blockIdx.x);
  }
}

// The workspace of a split launch: partial outputs, (max, sum) pairs, and with the in-kernel
// merge one arrival counter per head tile (zero between launches); and the caller's optional
// log-sum-exp output (any launch).
struct attention_parts {
  float* o = nullptr;
  float* ml = nullptr;
  unsigned* arrivals = nullptr;
  float* lse = nullptr;
};
inline attention_parts carve_attention_parts(void* base, std::int64_t splits,
                                             std::int64_t rows, std::int32_t head_dim,
                                             std::int64_t tiles, std::size_t* used = nullptr) {
  workspace_carver carve(base);
  attention_parts p;
  p.o = carve.take<float>(static_cast<std::size_t>(splits * rows * head_dim));
  p.ml = carve.take<float>(static_cast<std::size_t>(2 * splits * rows));
  if (tiles > 0) {
    p.arrivals = carve.take<unsigned>(static_cast<std::size_t>(tiles));
  }
  if (used != nullptr) {
    *used = carve.used();
  }
  return p;
}

inline void check_attention_shape(const char* where, std::int32_t head_dim,
                                  std::int32_t num_kv_heads, sparse_attention_shape shape) {
  require(head_dim == 64 || head_dim == 128, where, "kv.head_dim", head_dim, "64 or 128");
  require(num_kv_heads > 0, where, "kv.num_kv_heads", num_kv_heads, "> 0");
  require(shape.num_q_heads > 0 && shape.num_q_heads % num_kv_heads == 0, where,
          "shape.num_q_heads", shape.num_q_heads, "a positive multiple of kv.num_kv_heads");
  require(shape.num_requests >= 0, where, "shape.num_requests", shape.num_requests, ">= 0");
  require(std::isfinite(shape.scale) && shape.scale >= 0.0f, where, "shape.scale", shape.scale,
          "finite and >= 0 (0 means 1/sqrt(head_dim))");
  const std::int64_t rows = std::int64_t{shape.num_requests} * shape.num_q_heads;
  require(rows <= 0x7fffffff, where, "num_requests * num_q_heads", rows, "< 2^31");
}

// 16-byte loads need 16-byte aligned rows: base pointers and every stride.
template <Element T>
bool rows_aligned(const dense_kv<T>& kv) {
  const auto ok = [](std::int64_t elems) { return elems * sizeof(T) % 16 == 0; };
  return reinterpret_cast<std::uintptr_t>(kv.k) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(kv.v) % 16 == 0 && ok(kv.request_stride) &&
         ok(kv.token_stride) && ok(kv.head_stride);
}
template <Element T>
bool rows_aligned(const paged_kv<T>& kv) {
  return reinterpret_cast<std::uintptr_t>(kv.k_pages) % 16 == 0 &&
         reinterpret_cast<std::uintptr_t>(kv.v_pages) % 16 == 0;
}

// The view's own arrays, each named when it is missing.
template <Element T>
void check_view(const char* where, const dense_kv<T>& kv) {
  require(kv.k != nullptr, where, "kv.k", "null", "a device array");
  require(kv.v != nullptr, where, "kv.v", "null", "a device array");
  require(kv.seq_lens != nullptr, where, "kv.seq_lens", "null", "a device array");
}
template <Element T>
void check_view(const char* where, const paged_kv<T>& kv) {
  require(kv.k_pages != nullptr, where, "kv.k_pages", "null", "a device array");
  require(kv.v_pages != nullptr, where, "kv.v_pages", "null", "a device array");
  require(kv.indptr != nullptr, where, "kv.indptr", "null", "a device array");
  require(kv.indices != nullptr, where, "kv.indices", "null", "a device array");
  require(kv.last_page_len != nullptr, where, "kv.last_page_len", "null", "a device array");
  require(kv.page_size > 0, where, "kv.page_size", kv.page_size, "> 0");
}

// How the attention kernel streams its rows (see the kernel): cp.async ring depth (0: through
// registers) and rows per lane-group and iteration. The library runs default_attention_pipeline;
// the GPU benchmark compares it with the others.
template <int Stages, int Unroll>
struct attention_pipeline {
  static constexpr int stages = Stages;
  static constexpr int unroll = Unroll;
};
using default_attention_pipeline = attention_pipeline<0, 4>;

// Head tiles of a launch (grid.x): num_requests * num_q_heads / tile.
inline std::int64_t attention_tiles(std::int32_t num_requests, std::int32_t num_q_heads,
                                    std::int32_t num_kv_heads) {
  return std::int64_t{num_requests} * num_q_heads /
         attention_head_tile(num_q_heads / num_kv_heads);
}

template <int D, class Pipe, KvView Kv, class Set>
void launch_attention(par policy, const typename Kv::element_type* q, const Kv& kv,
                      const Set& set, std::int32_t num_q_heads, std::int32_t num_requests,
                      float scale, std::int32_t splits, std::int32_t chunk,
                      typename Kv::element_type* out, attention_parts parts) {
  const int g = attention_head_tile(num_q_heads / kv.num_kv_heads);
  const dim3 grid(static_cast<unsigned>(attention_tiles(num_requests, num_q_heads,
                                                        kv.num_kv_heads)),
                  static_cast<unsigned>(splits));
  const auto run = [&](auto kernel) {
    kernel<<<grid, attention_threads, 0, policy.stream>>>(q, kv, set, num_q_heads, scale, chunk,
                                                          out, parts.o, parts.ml,
                                                          parts.arrivals, parts.lse);
  };
  constexpr int S = Pipe::stages;
  constexpr int U = Pipe::unroll;
  switch (g) {
    case 4: run(sparse_decode_attention_kernel<D, 4, S, U, Kv, Set>); break;
    case 2: run(sparse_decode_attention_kernel<D, 2, S, U, Kv, Set>); break;
    default: run(sparse_decode_attention_kernel<D, 1, S, U, Kv, Set>); break;
  }
  if (parts.o != nullptr && parts.arrivals == nullptr) {
    const std::int64_t rows = std::int64_t{num_requests} * num_q_heads;
    sparse_attention_merge_kernel<D, typename Kv::element_type>
        <<<static_cast<unsigned>(rows), D, 0, policy.stream>>>(parts.o, parts.ml, splits, rows,
                                                                out, parts.lse);
  }
}

template <class Pipe = default_attention_pipeline, KvView Kv, class Set>
void run_attention(const char* where, par policy, const typename Kv::element_type* q,
                   const Kv& kv, const Set& set, sparse_attention_shape shape,
                   std::int32_t splits, std::int32_t chunk, typename Kv::element_type* out,
                   attention_parts parts) {
  if constexpr (std::same_as<Set, page_set>) {
    require(set.page_size > 0, where, "set.page_size", set.page_size, "> 0");
  }
  if (shape.num_requests == 0) {
    return;
  }
  require(q != nullptr, where, "q", "null", "a device array");
  require(out != nullptr, where, "out", "null", "a device array");
  require(set.offsets != nullptr, where, "set.offsets", "null", "a device array");
  require(set.indices != nullptr, where, "set.indices", "null", "a device array");
  check_view(where, kv);
  require(rows_aligned(kv), where, "kv", "rows not 16-byte aligned",
          "K/V base pointers and strides that are multiples of 16 bytes");
  require(reinterpret_cast<std::uintptr_t>(q) % 16 == 0, where, "q", "not 16-byte aligned",
          "a 16-byte aligned array");
  const float scale =
      shape.scale > 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
  if (kv.head_dim == 64) {
    launch_attention<64, Pipe>(policy, q, kv, set, shape.num_q_heads, shape.num_requests, scale,
                               splits, chunk, out, parts);
  } else {
    launch_attention<128, Pipe>(policy, q, kv, set, shape.num_q_heads, shape.num_requests,
                                scale, splits, chunk, out, parts);
  }
  check_launch(where);
}

// The plan form's checks and workspace, then run_attention (the public split form below; the
// GPU benchmark calls it with other pipelines).
inline std::size_t attention_workspace_bytes(const sparse_attention_plan& plan) {
  std::size_t need = 0;
  if (plan.num_splits > 1) {
    carve_attention_parts(nullptr, plan.num_splits,
                          std::int64_t{plan.num_requests} * plan.num_q_heads, plan.head_dim,
                          attention_tiles(plan.num_requests, plan.num_q_heads,
                                          plan.num_kv_heads),
                          &need);
  }
  return need;
}

template <class Pipe = default_attention_pipeline, KvView Kv, class Set>
void run_attention_plan(par policy, const sparse_attention_plan& plan, void* workspace,
                        std::size_t workspace_bytes, const typename Kv::element_type* q,
                        const Kv& kv, const Set& set, sparse_attention_shape shape,
                        typename Kv::element_type* out, float* lse = nullptr) {
  constexpr const char* where = "cuda::sparse_decode_attention";
  check_attention_shape(where, kv.head_dim, kv.num_kv_heads, shape);
  require(plan.num_requests == shape.num_requests && plan.num_q_heads == shape.num_q_heads &&
              plan.num_kv_heads == kv.num_kv_heads && plan.head_dim == kv.head_dim,
          where, "plan", "for another shape",
          "a plan made for this launch's requests, q heads, KV heads and head_dim");
  require(plan.num_splits >= 1 && plan.num_splits <= 65535 &&
              (plan.num_splits == 1 || plan.chunk > 0) &&
              std::int64_t{plan.chunk} * (plan.num_splits - 1) <= 0x7fffffff,
          where, "plan.num_splits", plan.num_splits,
          "in [1, 65535] with a positive chunk (from make_sparse_attention_plan)");
  // what the chunks' partials take, from the plan's shape (never from a field it could disagree
  // with)
  const std::size_t need = attention_workspace_bytes(plan);
  require(workspace_bytes >= need, where, "workspace_bytes", workspace_bytes,
          ">= the plan's workspace_bytes");
  require(need == 0 || (workspace != nullptr &&
                        reinterpret_cast<std::uintptr_t>(workspace) % workspace_alignment == 0),
          where, "workspace", workspace == nullptr ? "null" : "not 256-byte aligned",
          "a 256-byte aligned device array");
  attention_parts parts =
      plan.num_splits > 1
          ? carve_attention_parts(workspace, plan.num_splits,
                                  std::int64_t{shape.num_requests} * shape.num_q_heads,
                                  plan.head_dim,
                                  attention_tiles(shape.num_requests, shape.num_q_heads,
                                                  kv.num_kv_heads))
          : attention_parts{};
  if (!plan.merge_in_kernel) {
    parts.arrivals = nullptr;  // the merge kernel instead
  }
  parts.lse = lse;
  run_attention<Pipe>(where, policy, q, kv, set, shape, plan.num_splits, plan.chunk, out, parts);
}

}  // namespace detail

// Plans a split launch (host only, no device call). `max_entries` bounds any segment's set size
// in entries (tokens of a token_set, pages of a page_set of `page_size` tokens; 1 for tokens).
// The sets are cut into chunks of at least `min_chunk_tokens` tokens (one chunk when the bound is
// smaller) until the grid has about `target_blocks` blocks. The defaults (512 blocks: about one
// wave of 4 blocks on each of an H100's or H200's 132 SMs; chunks of at least 128 tokens) were
// the fastest of those measured at batch 1 on an H200 (2026-11-27: 36 us where 1024 blocks of
// 64-token chunks took 52 us at 10K kept; no slower at batch 64, which needs no split).
[[nodiscard]] inline sparse_attention_plan make_sparse_attention_plan(
    sparse_attention_shape shape, std::int32_t num_kv_heads, std::int32_t head_dim,
    std::int32_t max_entries, std::int32_t page_size = 1, std::int32_t target_blocks = 512,
    std::int32_t min_chunk_tokens = 128) {
  constexpr const char* where = "cuda::make_sparse_attention_plan";
  detail::check_attention_shape(where, head_dim, num_kv_heads, shape);
  require(max_entries >= 0, where, "max_entries", max_entries, ">= 0");
  require(page_size > 0, where, "page_size", page_size, "> 0");
  require(target_blocks > 0, where, "target_blocks", target_blocks, "> 0");
  require(min_chunk_tokens > 0, where, "min_chunk_tokens", min_chunk_tokens, "> 0");
  sparse_attention_plan p;
  p.num_requests = shape.num_requests;
  p.num_q_heads = shape.num_q_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = head_dim;
  const std::int64_t blocks = std::int64_t{shape.num_requests} * shape.num_q_heads /
                              detail::attention_head_tile(shape.num_q_heads / num_kv_heads);
  const std::int64_t min_chunk = std::max<std::int64_t>(1, min_chunk_tokens / page_size);
  const std::int64_t most = std::max<std::int64_t>(1, max_entries / min_chunk);  // chunks >= min
  const std::int64_t want = blocks == 0 ? 1 : (target_blocks + blocks - 1) / blocks;
  std::int64_t splits = std::clamp<std::int64_t>(want, 1, std::min<std::int64_t>(most, 65535));
  const std::int64_t chunk = (max_entries + splits - 1) / splits;
  splits = chunk == 0 ? 1 : (max_entries + chunk - 1) / chunk;  // no chunk starts past the end
  p.num_splits = static_cast<std::int32_t>(splits);
  p.chunk = static_cast<std::int32_t>(chunk);
  p.workspace_bytes = detail::attention_workspace_bytes(p);
  return p;
}

// Runs sparse decode attention (see the file comment) in one block per query-head tile and
// segment. Enqueues on policy.stream; no workspace, no allocation, no host synchronisation
// (CUDA-graph safe). Fills the GPU only with many segments; for a small batch use the plan form.
//   q     [num_requests][num_q_heads][head_dim] device
//   kv    dense_kv<T> or paged_kv<T>; rows 16-byte aligned (base pointers and strides)
//   set   token_set or page_set over num_requests * kv.num_kv_heads segments
//   out   [num_requests][num_q_heads][head_dim] device
//   lse   optional [num_requests][num_q_heads] float device: each head's log-sum-exp of its
//         scaled logits over the set (-inf: empty), for attention::merge_partials
// Throws kvsift::error for head_dim not in {64, 128}, q heads not a multiple of KV heads, bad
// counts, unaligned rows or null pointers; cuda_error on a launch error.
template <KvView Kv, class Set>
  requires std::same_as<Set, token_set> || std::same_as<Set, page_set>
void sparse_decode_attention(par policy, const typename Kv::element_type* q, const Kv& kv,
                             const Set& set, sparse_attention_shape shape,
                             typename Kv::element_type* out, float* lse = nullptr) {
  constexpr const char* where = "cuda::sparse_decode_attention";
  detail::check_attention_shape(where, kv.head_dim, kv.num_kv_heads, shape);
  detail::attention_parts parts;
  parts.lse = lse;
  detail::run_attention(where, policy, q, kv, set, shape, 1, 0, out, parts);
}

// Zeroes the arrival counters of a split launch's workspace on the stream, where the plan puts
// them (the size is the plan's shape's, never its workspace_bytes field): needed by
// plan.merge_in_kernel only, once after allocating the workspace and again after it served
// another plan. Every launch leaves the counters at zero, so a captured graph replays without it.
inline void prepare_sparse_attention_workspace(par policy, const sparse_attention_plan& plan,
                                               void* workspace) {
  constexpr const char* where = "cuda::prepare_sparse_attention_workspace";
  if (detail::attention_workspace_bytes(plan) == 0) {
    return;  // one split: no partials, no counters
  }
  require(workspace != nullptr &&
              reinterpret_cast<std::uintptr_t>(workspace) % workspace_alignment == 0,
          where, "workspace", workspace == nullptr ? "null" : "not 256-byte aligned",
          "a 256-byte aligned device array of the plan's workspace_bytes");
  const std::int64_t tiles =
      detail::attention_tiles(plan.num_requests, plan.num_q_heads, plan.num_kv_heads);
  const detail::attention_parts parts = detail::carve_attention_parts(
      workspace, plan.num_splits, std::int64_t{plan.num_requests} * plan.num_q_heads,
      plan.head_dim, tiles);
  check(cudaMemsetAsync(parts.arrivals, 0, static_cast<std::size_t>(tiles) * sizeof(unsigned),
                        policy.stream),
        where);
}

// The split form: `plan` from make_sparse_attention_plan with this launch's shape, head_dim and
// KV heads; `workspace` of at least plan.workspace_bytes (any pointer when that is 0), reused
// by every step of this plan. Two kernels (the chunks, then a merge kernel), or with
// plan.merge_in_kernel one (the last chunk of each head tile to finish merges it; the workspace
// must then have been through prepare_sparse_attention_workspace for this plan). No
// allocation or synchronisation either way.
template <KvView Kv, class Set>
  requires std::same_as<Set, token_set> || std::same_as<Set, page_set>
void sparse_decode_attention(par policy, const sparse_attention_plan& plan, void* workspace,
                             std::size_t workspace_bytes, const typename Kv::element_type* q,
                             const Kv& kv, const Set& set, sparse_attention_shape shape,
                             typename Kv::element_type* out, float* lse = nullptr) {
  detail::run_attention_plan(policy, plan, workspace, workspace_bytes, q, kv, set, shape, out,
                             lse);
}

}  // namespace kvsift::cuda
