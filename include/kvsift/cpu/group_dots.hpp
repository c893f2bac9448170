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
// FMA (target "avx2,f16c"), so no multiply and add are fused into one rounding.

#include <kvsift/core/dot.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/cpu/decode_attention.hpp>

#include <algorithm>
#include <type_traits>

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

}  // namespace kvsift::cpu
