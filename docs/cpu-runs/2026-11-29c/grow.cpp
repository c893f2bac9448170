// Grow a simple loop into the logits kernel (cpu/decode_attention.hpp, logits_block) one step at a
// time, from DRAM: bf16 rows, d = 128, 4 query heads, rows contiguous, huge-page advised; one thread.
// Build and run (from the repository root): g++ -std=gnu++20 -O3 -march=native -Iinclude
//   docs/cpu-runs/2026-11-29c/grow.cpp -o grow && ./grow ROWS REPS
// STAGE (template argument):
//  0  one load per 64-byte line, 1 FMA with a register operand per line, the kernel's line order
//  1  + the paired bf16 slots (shift, AND), 4 heads each, q in 8 registers: 8 FMAs per line
//  2  + the second slot's load again from L1 and q from L1 per (slot, head), as the kernel does
//  3  + the per-quad reduction (hsum4) and the logits store into [4, m]
//  4  the reduction into a register sum, no store
//  5  the store into a 1 KiB buffer (L1)
//  7  the store once per 16 rows (the quads' sums blended into one 64-byte vector per head)
// PF: 0 no software prefetch, 1 the kernel's (rows +16 into L1, rows +64 into L2). main() runs
// stages 2, 3, 4, 5, 7 with PF = 1 (edit it for the others). Check the binary (objdump): GCC's
// choices differ between stages; see results.txt.
#include <kvsift/cpu/decode_attention.hpp>
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <sys/mman.h>
using kvsift::cpu::detail::avx512::hsum4;  // the kernel's own per-quad reduction
constexpr int d = 128, RB = d * 2;  // row bytes
template <int STAGE, int PF>
__attribute__((noinline)) float pass(const char* K, size_t m, const float* q, float* logits) {
  __m512 acc[4][4];
  for (auto& a : acc) for (auto& x : a) x = _mm512_setzero_ps();
  __m512 qr[8];
  for (int i = 0; i < 8; ++i) qr[i] = _mm512_loadu_ps(q + 16 * i);
  const __m512i hi = _mm512_set1_epi32(int(0xffff0000u));
  __m128 tot = _mm_setzero_ps();
  __m512 hold[4] = {};
  for (size_t j = 0; j + 4 <= m; j += 4) {
    const char* base = K + j * RB;
    if constexpr (PF) {
      for (size_t p = j + 16; p < j + 20 && p < m; ++p)
        for (int o = 0; o < RB; o += 64) _mm_prefetch(K + p * RB + o, _MM_HINT_T0);
      if (j + 64 + 4 <= m) {
        const char* b = K + (j + 64) * RB;
        for (int o = 0; o < 4 * RB; o += 256) { _mm_prefetch(b + o, _MM_HINT_T2); _mm_prefetch(b + o + 64, _MM_HINT_T2); _mm_prefetch(b + o + 128, _MM_HINT_T2); _mm_prefetch(b + o + 192, _MM_HINT_T2); }
      }
    }
    if constexpr (STAGE >= 3) for (auto& a : acc) for (auto& x : a) x = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int L = 0; L < 4; ++L) {
      if constexpr (STAGE == 0) {
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) acc[0][r] = _mm512_fmadd_ps(qr[L], _mm512_load_ps((const float*)(base + r * RB + 64 * L)), acc[0][r]);
      } else if constexpr (STAGE == 1) {
        __m512 kv[4][2];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          const __m512i x = _mm512_load_si512(base + r * RB + 64 * L);
          kv[r][0] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); kv[r][1] = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
        }
#pragma GCC unroll 2
        for (int s = 0; s < 2; ++s)
#pragma GCC unroll 4
          for (int g = 0; g < 4; ++g)
#pragma GCC unroll 4
            for (int r = 0; r < 4; ++r) acc[g][r] = _mm512_fmadd_ps(qr[g * 2 + s], kv[r][s], acc[g][r]);
      } else {
#pragma GCC unroll 2
        for (int s = 0; s < 2; ++s) {
          __m512 kv[4];
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            const __m512i x = _mm512_loadu_si512(base + r * RB + 64 * L);
            kv[r] = _mm512_castsi512_ps(s == 0 ? _mm512_slli_epi32(x, 16) : _mm512_and_si512(x, hi));
          }
#pragma GCC unroll 4
          for (int g = 0; g < 4; ++g) {
            const __m512 qv = _mm512_loadu_ps(q + g * d + 16 * (2 * L + s));
#pragma GCC unroll 4
            for (int r = 0; r < 4; ++r) acc[g][r] = _mm512_fmadd_ps(qv, kv[r], acc[g][r]);
          }
        }
      }
    }
    if constexpr (STAGE == 4) {
      const __m128 sc = _mm_set1_ps(0.088f);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) tot = _mm_add_ps(tot, _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sc));
    }
    if constexpr (STAGE == 5) {
      const __m128 sc = _mm_set1_ps(0.088f);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) _mm_storeu_ps(logits + g * 64 + (j & 63), _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sc));
    }
    if constexpr (STAGE == 7) {
      const __m128 sc = _mm_set1_ps(0.088f);
      __m128 h[4];
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) h[g] = _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sc);
      const int slot = (j >> 2) & 3;
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) hold[g] = _mm512_mask_broadcast_f32x4(hold[g], __mmask16(0xf << (4 * slot)), h[g]);
      if (slot == 3) {
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) _mm512_storeu_ps(logits + g * m + j - 12, hold[g]);
      }
    }
    if constexpr (STAGE == 6) {
      const __m128 sc = _mm_set1_ps(0.088f);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) _mm_stream_ps(logits + g * m + j, _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sc));
    }
    if constexpr (STAGE == 3) {
      const __m128 sc = _mm_set1_ps(0.088f);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) _mm_storeu_ps(logits + g * m + j, _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sc));
    }
  }
  __m512 s = _mm512_setzero_ps();
  for (auto& a : acc) for (auto& x : a) s = _mm512_add_ps(s, x);
  return _mm512_reduce_add_ps(s) + _mm_cvtss_f32(tot) + (STAGE == 3 || STAGE == 5 || STAGE == 7 ? logits[m - 1] : 0.0f);
}
template <int ST, int PF> double run(const char* K, size_t m, const float* q, float* lg, int reps) {
  double best = 1e9; float sink = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now(); sink += pass<ST, PF>(K, m, q, lg);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (sink == 12345.f) puts("");
  return m * double(RB) / best * 1e-9;
}
int main(int argc, char** argv) {
  const size_t m = strtoul(argv[1], 0, 10); const int reps = atoi(argv[2]);
  const size_t bytes = m * RB;
  char* K = (char*)aligned_alloc(2u << 20, (bytes + (2u << 20)) & ~size_t((2u << 20) - 1)); madvise(K, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < bytes / 2; ++i) ((uint16_t*)K)[i] = uint16_t(0x3f80 + (i * 2654435761u >> 25));
  static float q[4 * d]; for (int i = 0; i < 4 * d; ++i) q[i] = 0.01f * (i % 7);
  float* lg = (float*)aligned_alloc(64, 4 * m * 4);
  printf("m=%zu (%.0f MB) GB/s, PF: s2 %.1f s3 store %.1f s4 reduce-only %.1f s5 store-L1 %.1f s7 store-every-16-rows %.1f\n", m, bytes * 1e-6,
         run<2,1>(K,m,q,lg,reps), run<3,1>(K,m,q,lg,reps), run<4,1>(K,m,q,lg,reps), run<5,1>(K,m,q,lg,reps), run<7,1>(K,m,q,lg,reps));
}
