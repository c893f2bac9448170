// SPDX-License-Identifier: Apache-2.0
#pragma once

// The dot products of a GQA group's query heads with one key row, each equal bit for bit to
// kvsift::dot (core/dot.hpp), the key row read once for the whole group. Scores that feed a
// selection (H2O's running attention) need these exact bits; decode attention (cpu/
// decode_attention.hpp) does not, and uses FMA.
//
// On a CPU with AVX2 the products run 8 lanes wide: lane l of an 8-wide accumulator sums the
// channels c = l (mod 8) by a multiply and an add, as dot's acc[l] does, then the lanes combine in
// combine8's pairs and the tail follows, in dot's order. The AVX2 functions are compiled without
// FMA (target "avx2,f16c"), so no multiply and add are fused into one rounding. With AVX-512 a
// 16-lane register holds two key rows' 8 lanes side by side (group_dots_rows), so one multiply
// and one add serve two rows; the products and sums are the embedded-rounding forms (builtins a
// compiler never contracts into an FMA), and each half reduces in combine8's order.

#include <kvsift/core/dot.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/cpu/decode_attention.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace kvsift::cpu {

namespace detail {

#if KVSIFT_HAVE_X86_SIMD_PATH
namespace exact {

template <Element T>
KVSIFT_TARGET_AVX2_NOFMA void group_dots(const float* q, int G, const T* k, int d, float* out) {
  const int body = d / 8 * 8;
  for (int g0 = 0; g0 < G; g0 += 4) {
    const int gc = std::min(4, G - g0);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int c = 0; c < body; c += 8) {
      const __m256 kv = avx2::load8(k + c);
      for (int g = 0; g < gc; ++g) {
        const __m256 qv = _mm256_loadu_ps(q + static_cast<std::size_t>(g0 + g) * d + c);
        acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(qv, kv));
      }
    }
    for (int g = 0; g < gc; ++g) {
      const float* qg = q + static_cast<std::size_t>(g0 + g) * d;
      // (a0 + a4, a1 + a5, a2 + a6, a3 + a7), then ((b0 + b1) + (b2 + b3)): combine8
      const __m128 b = _mm_add_ps(_mm256_castps256_ps128(acc[g]), _mm256_extractf128_ps(acc[g], 1));
      __m128 h = _mm_hadd_ps(b, b);
      h = _mm_hadd_ps(h, h);
      float tail = 0.0f;
      for (int c = body; c < d; ++c) tail += mul_rn(qg[c], to_float(k[c]));
      out[g0 + g] = _mm_cvtss_f32(h) + tail;
    }
  }
}

}  // namespace exact

namespace exact512 {

constexpr int kRN = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr __mmask16 kAll = 0xFFFF;

// Lanes 0-7: a[0, 8) as floats, lanes 8-15: b[0, 8) (bf16 exactly as the high half of each
// lane, f16 exactly).
//
// bf16 takes one instruction for the pair: a zero-masked two-source word permute (vpermt2w,
// AVX-512BW) puts a's and b's words in the odd words (the high halves) of lanes 0-7 and 8-15 and
// zeroes the even ones, where an insert, a widening and a shift took three. On a 2-core Zen 5 VM,
// one GQA group (4 heads, head_dim 128, 256 rows in L1/L2): 2.15-2.24 -> 1.76-1.92 us; on Ice
// Lake the same speed (docs/cpu-runs/2026-12-02c/results.txt, item 5; ../2026-12-02b).
template <Element T>
KVSIFT_TARGET_AVX512 inline __m512 load8x2(const T* a, const T* b) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(a))),
                                               _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    // odd word 2i + 1 of the result: word i of a (i < 8), word i - 8 of b (index 32 + i - 8)
    const __m512i from = _mm512_setr_epi32(0 << 16, 1 << 16, 2 << 16, 3 << 16, 4 << 16, 5 << 16,
                                           6 << 16, 7 << 16, 32 << 16, 33 << 16, 34 << 16, 35 << 16,
                                           36 << 16, 37 << 16, 38 << 16, 39 << 16);
    const __m512i x = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
    const __m512i y = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    return _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi16(0xAAAAAAAAu, x, from, y));
  } else {
    const __m256i h = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
    return _mm512_cvtph_ps(h);
  }
}

// Each 8-lane half of x reduced in combine8's order: ((a0 + a4) + (a1 + a5)) + ((a2 + a6) +
// (a3 + a7)); the sums are in lanes 0 and 8.
KVSIFT_TARGET_AVX512 inline __m512 combine8x2(__m512 x) {
  const __m512 b = _mm512_maskz_add_round_ps(kAll, x, _mm512_maskz_shuffle_f32x4(kAll, x, x, 0xB1), kRN);
  const __m512 c = _mm512_maskz_add_round_ps(kAll, b, _mm512_maskz_permute_ps(kAll, b, 0xB1), kRN);
  return _mm512_maskz_add_round_ps(kAll, c, _mm512_maskz_permute_ps(kAll, c, 0x4E), kRN);
}

// The sums of 16 accumulators a[g * 4 + p] (head g < 4, row pair p < 4; lanes 0-7 row 2p, 8-15
// row 2p + 1), each 8-lane half reduced in combine8's order, ((a0 + a4) + (a1 + a5)) + ((a2 + a6) +
// (a3 + a7)), as combine8x2 does for one register: the same adds, four to sixteen groups per
// instruction (adds of two accumulators' halves side by side, then of two such registers' pairs,
// then of their pairs). Returns two registers, heads 2i and 2i + 1: lanes 0-7 head 2i's rows 0-7,
// lanes 8-15 head 2i + 1's.
KVSIFT_TARGET_AVX512 inline void combine8x16(const __m512 (&a)[16], __m512 (&heads)[2]) {
  // level 1: 128-bit lanes [X rowA, X rowB, Y rowA, Y rowB] of a_i + a_{i+4}: each lane one
  // (head, row); b[i] = head i / 2, rows 4 (i % 2) .. + 3
  __m512 b[8];
  KVSIFT_UNROLL
  for (int i = 0; i < 8; ++i) {
    const __m512 x = a[2 * i], y = a[2 * i + 1];
    b[i] = _mm512_maskz_add_round_ps(kAll, _mm512_shuffle_f32x4(x, y, 0x88),
                                     _mm512_shuffle_f32x4(x, y, 0xDD), kRN);
  }
  // level 2: lane j of c[i] = (b0 + b1, b2 + b3) of head i's rows j and 4 + j
  __m512 c[4];
  KVSIFT_UNROLL
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm512_maskz_add_round_ps(kAll, _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x88),
                                     _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xDD), kRN);
  }
  // level 3: lane j of e = head 2i's rows j, 4 + j, head 2i + 1's rows j, 4 + j; then rows in order
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  KVSIFT_UNROLL
  for (int i = 0; i < 2; ++i) {
    const __m512 e = _mm512_maskz_add_round_ps(kAll, _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x88),
                                               _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xDD), kRN);
    heads[i] = _mm512_permutexvar_ps(order, e);
  }
}

// out[g * ld + r] += dot's tail (channels [d / 8 * 8, d), in dot's order) for GC heads and the
// rows k[0 .. R), by rounding intrinsics too: this function may use FMA, and a plain
// `tail += q * k` would be contracted into one.
template <int GC, int R, Element T>
KVSIFT_TARGET_AVX512 inline void add_tails(const float* q, int d, const T* const* k, float* out,
                                           std::size_t ld) {
  for (int g = 0; g < GC; ++g) {
    const float* qg = q + static_cast<std::size_t>(g) * d;
    for (int r = 0; r < R; ++r) {
      __m128 tail = _mm_setzero_ps();
      for (int c = d / 8 * 8; c < d; ++c) {
        const __m128 prod = _mm_mul_round_ss(_mm_set_ss(qg[c]), _mm_set_ss(to_float(k[r][c])), kRN);
        tail = _mm_add_round_ss(tail, prod, kRN);
      }
      float& o = out[static_cast<std::size_t>(g) * ld + r];
      o = _mm_cvtss_f32(_mm_add_round_ss(_mm_set_ss(o), tail, kRN));
    }
  }
}

// out[g * ld + r] = dot(q + g * d, k[r], d) for GC <= 4 heads and 2P rows k[0 .. 2P): rows in
// pairs, a pair's 8-lane blocks in one register; q2 holds each head's channels twice per block of
// 8 ([GC, d / 8, 16]). P pairs x GC heads independent chains. Eight rows (P = 4) reduce together
// (combine8x16) into one 8-float store per head; fewer, one register at a time (combine8x2).
template <int GC, int P, Element T>
KVSIFT_TARGET_AVX512 void dots_block(const float* q, const float* q2, int d, const T* const* k,
                                     float* out, std::size_t ld) {
  const int blocks = d / 8;
  __m512 acc[P][GC];
  KVSIFT_UNROLL
  for (int p = 0; p < P; ++p) {
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) acc[p][g] = _mm512_setzero_ps();
  }
  for (int b = 0; b < blocks; ++b) {
    __m512 kv[P];
    KVSIFT_UNROLL
    for (int p = 0; p < P; ++p) kv[p] = load8x2(k[2 * p] + 8 * b, k[2 * p + 1] + 8 * b);
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) {
      const __m512 qv = _mm512_loadu_ps(q2 + (static_cast<std::size_t>(g) * blocks + b) * 16);
      KVSIFT_UNROLL
      for (int p = 0; p < P; ++p) {
        acc[p][g] = _mm512_maskz_add_round_ps(
            kAll, acc[p][g], _mm512_maskz_mul_round_ps(kAll, qv, kv[p], kRN), kRN);
      }
    }
  }
  if constexpr (P == 4) {
    __m512 a[16];
    KVSIFT_UNROLL
    for (int g = 0; g < 4; ++g) {
      KVSIFT_UNROLL
      for (int p = 0; p < 4; ++p) a[g * 4 + p] = g < GC ? acc[p][g] : _mm512_setzero_ps();
    }
    __m512 heads[2];
    combine8x16(a, heads);
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) {
      const __m512 h = heads[g / 2];
      _mm256_storeu_ps(out + static_cast<std::size_t>(g) * ld,
                       g % 2 == 0 ? _mm512_castps512_ps256(h)
                                  : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(h), 1)));
    }
  } else {
    KVSIFT_UNROLL
    for (int p = 0; p < P; ++p) {
      KVSIFT_UNROLL
      for (int g = 0; g < GC; ++g) {
        alignas(64) float s[16];
        _mm512_store_ps(s, combine8x2(acc[p][g]));
        out[static_cast<std::size_t>(g) * ld + 2 * p] = s[0];
        out[static_cast<std::size_t>(g) * ld + 2 * p + 1] = s[8];
      }
    }
  }
  if (blocks * 8 < d) add_tails<GC, 2 * P, T>(q, d, k, out, ld);
}

}  // namespace exact512
#endif

}  // namespace detail

// out[g] = kvsift::dot(q + g * d, k, d) for g < G, bit for bit, on the path `level` allows
// (AVX2 when the CPU has it and the level is at least avx2; else dot itself).
template <Element T>
void group_dots(const float* q, int G, const T* k, int d, float* out,
                simd level = active_simd()) {
#if KVSIFT_HAVE_X86_SIMD_PATH
  if (level >= simd::avx2) {
    detail::exact::group_dots(q, G, k, d, out);
    return;
  }
#endif
  (void)level;
  for (int g = 0; g < G; ++g) out[g] = dot(q + static_cast<std::size_t>(g) * d, k, d);
}

// out[g * ld + j] = kvsift::dot(q + g * d, key(j), d) for g < G and j < m, bit for bit, each key
// row read once per group of up to four heads; key(j) is a pointer to row j's d elements. With
// AVX-512, rows go two to a register (eight at a time); otherwise group_dots per row.
template <Element T, class KeyAt>
void group_dots_rows(const float* q, int G, int d, std::size_t m, KeyAt&& key, float* out,
                     std::size_t ld, simd level = active_simd()) {
#if KVSIFT_HAVE_X86_SIMD_PATH
  if (level >= simd::avx512 && d >= 8) {
    const int blocks = d / 8;
    thread_local std::vector<float> q2;  // each head's 8-channel blocks twice: [G, d / 8, 16]
    q2.resize(static_cast<std::size_t>(G) * blocks * 16);
    for (int g = 0; g < G; ++g) {
      for (int b = 0; b < blocks; ++b) {
        const float* src = q + static_cast<std::size_t>(g) * d + 8 * b;
        float* dst = q2.data() + (static_cast<std::size_t>(g) * blocks + b) * 16;
        KVSIFT_UNROLL
        for (int i = 0; i < 8; ++i) dst[i] = dst[i + 8] = src[i];  // inline: no call per block
      }
    }
    for (int g0 = 0; g0 < G; g0 += 4) {
      const float* qg = q + static_cast<std::size_t>(g0) * d;
      const float* q2g = q2.data() + static_cast<std::size_t>(g0) * blocks * 16;
      float* og = out + static_cast<std::size_t>(g0) * ld;
      detail::with_heads<4>(std::min(4, G - g0), [&]<int GC>() {
        std::size_t j = 0;
        for (; j + 8 <= m; j += 8) {  // 16 chains: a query block loaded once per 8 rows
          const T* k[8];
          KVSIFT_UNROLL
          for (int r = 0; r < 8; ++r) k[r] = static_cast<const T*>(key(j + r));
          detail::exact512::dots_block<GC, 4, T>(qg, q2g, d, k, og + j, ld);
        }
        for (; j + 4 <= m; j += 4) {
          const T* k[4] = {static_cast<const T*>(key(j)), static_cast<const T*>(key(j + 1)),
                           static_cast<const T*>(key(j + 2)), static_cast<const T*>(key(j + 3))};
          detail::exact512::dots_block<GC, 2, T>(qg, q2g, d, k, og + j, ld);
        }
        for (; j < m; j += 2) {  // the last one or two rows (a lone row is paired with itself)
          const T* k[2] = {static_cast<const T*>(key(j)),
                           static_cast<const T*>(key(j + 1 < m ? j + 1 : j))};
          float pair[GC * 2];
          detail::exact512::dots_block<GC, 1, T>(qg, q2g, d, k, pair, 2);
          KVSIFT_UNROLL
          for (int g = 0; g < GC; ++g) {
            og[static_cast<std::size_t>(g) * ld + j] = pair[2 * g];
            if (j + 1 < m) og[static_cast<std::size_t>(g) * ld + j + 1] = pair[2 * g + 1];
          }
        }
      });
    }
    return;
  }
#endif
  float dots[64];
  for (int g0 = 0; g0 < G; g0 += 64) {  // a group of at most 64 heads at a time
    const int gc = std::min(64, G - g0);
    for (std::size_t j = 0; j < m; ++j) {
      group_dots(q + static_cast<std::size_t>(g0) * d, gc, static_cast<const T*>(key(j)), d, dots,
                 level);
      for (int g = 0; g < gc; ++g) out[static_cast<std::size_t>(g0 + g) * ld + j] = dots[g];
    }
  }
}

}  // namespace kvsift::cpu
