// SPDX-License-Identifier: Apache-2.0
#pragma once

// The exact softmax every selection's scores go through, one row (cpu::softmax, cpu/math.hpp) or
// many (H2O's weights and every exact attention row of a GQA group): for each row its maximum,
// exact_expf (core/exp.hpp) of every element minus it, a sequential double sum in column order,
// each element times the float reciprocal of the sum. The result is fixed by those steps; the
// schedule is not:
// - exact_expf runs 16 lanes at a time on AVX-512 (two halves of 8 doubles) and 4 on AVX2: the
//   same double operations in the same order, products rounded on their own (embedded-rounding
//   multiplies on AVX-512, which no compiler fuses into an FMA; a function compiled without FMA
//   on AVX2), the table read by permutes (AVX-512) or a gather (AVX2); so each lane equals
//   exact_expf bit for bit;
// - each row's maximum comes from eight running maxima (the same value: a maximum does not depend
//   on the order it is taken in, and softmax's NaN-first and signed-zero cases give the same
//   exponentials);
// - up to eight rows' double sums are in flight together (as many as the call has), each still in
//   column order, where one row's chain of dependent adds would stall on each add; on AVX-512 a
//   block of 16 columns is added while the next block's exponentials are computed
//   (exp_sums_avx512), so the chains overlap that arithmetic instead of following the whole
//   row's (4 rows of 257: 1.7-1.8 -> 1.0-1.2 us on an Intel Xeon, docs/performance.md).

#include <kvsift/core/exp.hpp>
#include <kvsift/cpu/simd.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace kvsift::cpu {

namespace detail {

// x[j] = exact_expf(x[j] - top), j in [0, m), one lane at a time.
inline void exp_sub_row_portable(float* x, std::size_t m, float top) {
  for (std::size_t j = 0; j < m; ++j) x[j] = exact_expf(x[j] - top);
}

#if KVSIFT_HAVE_X86_SIMD_PATH
// The lanes exact_expf sends to its special cases are fixed after the core: NaN to x + x, above
// kOverflow to +inf, below kUnderflow (-inf included) to 0.
KVSIFT_TARGET_AVX512 inline __m512d exp_core8(__m512d xd) {
  namespace e = kvsift::detail::exp;
  constexpr int rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512d shift = _mm512_set1_pd(e::kShift);
  const __m512d z = _mm512_mul_round_pd(xd, _mm512_set1_pd(e::kInvLn2N), rn);
  const __m512d shifted = _mm512_add_round_pd(z, shift, rn);
  const __m512i ki = _mm512_castpd_si512(shifted);
  const __m512d r = _mm512_sub_round_pd(z, _mm512_sub_round_pd(shifted, shift, rn), rn);
  const __m512i idx = _mm512_and_si512(ki, _mm512_set1_epi64(e::kN - 1));
  // the 32-entry table from four registers (two two-source permutes and a blend on index bit 4),
  // where a gather would issue eight loads
  static_assert(e::kN == 32);
  const __m512i lo = _mm512_permutex2var_epi64(_mm512_loadu_si512(e::kTable), idx,
                                               _mm512_loadu_si512(e::kTable + 8));
  const __m512i hi = _mm512_permutex2var_epi64(_mm512_loadu_si512(e::kTable + 16), idx,
                                               _mm512_loadu_si512(e::kTable + 24));
  const __m512i entry =
      _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), lo, hi);
  const __m512i t = _mm512_add_epi64(entry, _mm512_slli_epi64(ki, 52 - e::kTableBits));
  const __m512d p = _mm512_add_round_pd(_mm512_mul_round_pd(_mm512_set1_pd(e::kC0), r, rn),
                                        _mm512_set1_pd(e::kC1), rn);
  const __m512d r2 = _mm512_mul_round_pd(r, r, rn);
  __m512d y = _mm512_add_round_pd(_mm512_mul_round_pd(_mm512_set1_pd(e::kC2), r, rn),
                                  _mm512_set1_pd(1.0), rn);
  y = _mm512_add_round_pd(_mm512_mul_round_pd(p, r2, rn), y, rn);
  return _mm512_mul_round_pd(y, _mm512_castsi512_pd(t), rn);
}

// exact_expf on 16 lanes.
KVSIFT_TARGET_AVX512 inline __m512 exact_exp16(__m512 x) {
  const __m256 lo = _mm512_cvt_roundpd_ps(exp_core8(_mm512_cvtps_pd(_mm512_castps512_ps256(x))),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 hi = _mm512_cvt_roundpd_ps(
      exp_core8(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 y = _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kvsift::detail::exp::kUnderflow), _CMP_LT_OQ),
                           y, _mm512_setzero_ps());
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(kvsift::detail::exp::kOverflow), _CMP_GT_OQ),
                           y, _mm512_set1_ps(std::numeric_limits<float>::infinity()));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, _mm512_add_ps(x, x));
}

KVSIFT_TARGET_AVX512 inline void exp_sub_row_avx512(float* x, std::size_t m, float top) {
  const __m512 t = _mm512_set1_ps(top);
  std::size_t j = 0;
  for (; j + 16 <= m; j += 16) {
    _mm512_storeu_ps(x + j, exact_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), t)));
  }
  if (j < m) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (m - j)) - 1u);
    _mm512_mask_storeu_ps(x + j, tail,
                          exact_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + j), t)));
  }
}

// exact_expf on 4 lanes, compiled without FMA so the products round on their own.
KVSIFT_TARGET_AVX2_NOFMA inline __m128 exact_exp4(__m128 x) {
  namespace e = kvsift::detail::exp;
  const __m256d shift = _mm256_set1_pd(e::kShift);
  const __m256d z = _mm256_mul_pd(_mm256_cvtps_pd(x), _mm256_set1_pd(e::kInvLn2N));
  const __m256d shifted = _mm256_add_pd(z, shift);
  const __m256i ki = _mm256_castpd_si256(shifted);
  const __m256d r = _mm256_sub_pd(z, _mm256_sub_pd(shifted, shift));
  const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(e::kN - 1));
  const __m256i t =
      _mm256_add_epi64(_mm256_i64gather_epi64(reinterpret_cast<const long long*>(e::kTable), idx, 8),
                       _mm256_slli_epi64(ki, 52 - e::kTableBits));
  const __m256d p = _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(e::kC0), r), _mm256_set1_pd(e::kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(e::kC2), r), _mm256_set1_pd(1.0));
  y = _mm256_add_pd(_mm256_mul_pd(p, r2), y);
  __m128 out = _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
  out = _mm_blendv_ps(out, _mm_setzero_ps(),
                      _mm_cmp_ps(x, _mm_set1_ps(kvsift::detail::exp::kUnderflow), _CMP_LT_OQ));
  out = _mm_blendv_ps(out, _mm_set1_ps(std::numeric_limits<float>::infinity()),
                      _mm_cmp_ps(x, _mm_set1_ps(kvsift::detail::exp::kOverflow), _CMP_GT_OQ));
  return _mm_blendv_ps(out, _mm_add_ps(x, x), _mm_cmp_ps(x, x, _CMP_UNORD_Q));
}

KVSIFT_TARGET_AVX2_NOFMA inline void exp_sub_row_avx2(float* x, std::size_t m, float top) {
  const __m128 t = _mm_set1_ps(top);
  std::size_t j = 0;
  for (; j + 4 <= m; j += 4) _mm_storeu_ps(x + j, exact_exp4(_mm_sub_ps(_mm_loadu_ps(x + j), t)));
  for (; j < m; ++j) x[j] = exact_expf(x[j] - top);
}
#endif

// sum[r] = row[r][0] + row[r][1] + ... in column order, in double, for NR rows side by side.
template <int NR>
inline void column_sums(float* const* row, std::size_t m, double* sum) {
  double s[NR] = {};
  for (std::size_t j = 0; j < m; ++j) {
    for (int r = 0; r < NR; ++r) s[r] += row[r][j];
  }
  for (int r = 0; r < NR; ++r) sum[r] = s[r];
}

#if KVSIFT_HAVE_X86_SIMD_PATH
// The row's maximum as softmax_rows takes it (m >= 1): lanes start at row[0] and keep the larger
// of themselves and each element (`lane < x ? x : lane`, a compare and a blend, so a NaN after
// the first element never enters and a NaN first stays), then the same over the 16 lanes.
KVSIFT_TARGET_AVX512 inline float row_max_avx512(const float* row, std::size_t m) {
  __m512 lanes = _mm512_set1_ps(row[0]);
  std::size_t j = 1;
  for (; j + 16 <= m; j += 16) {
    const __m512 x = _mm512_loadu_ps(row + j);
    lanes = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(lanes, x, _CMP_LT_OQ), lanes, x);
  }
  if (j < m) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (m - j)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(tail, row + j);
    lanes = _mm512_mask_blend_ps(_mm512_mask_cmp_ps_mask(tail, lanes, x, _CMP_LT_OQ), lanes, x);
  }
  alignas(64) float l[16];
  _mm512_store_ps(l, lanes);
  float top = l[0];
  for (int i = 1; i < 16; ++i) top = top < l[i] ? l[i] : top;
  return top;
}

// For NR rows side by side, 16 columns at a time: row[r][j] = exact_expf(row[r][j] - top[r]),
// and each row's double sum in column order (sum[r]). The sums are chains of dependent adds, so
// they are software-pipelined: a block's columns are added while the next block's exponentials
// are computed (a share of them after each row's), where adding them after all the row's
// exponentials would leave the chains' latency exposed.
template <int NR>
KVSIFT_TARGET_AVX512 void exp_sums_avx512(float* const* row, const float* top, std::size_t m,
                                          double* sum) {
  double s[NR] = {};
  __m512 t[NR];
  KVSIFT_UNROLL
  for (int r = 0; r < NR; ++r) t[r] = _mm512_set1_ps(top[r]);
  alignas(64) double wide[2][NR][16];  // a block's exponentials in double, this block's and the last
  const std::size_t blocks = m / 16;
  for (std::size_t b = 0; b < blocks; ++b) {
    double(&cur)[NR][16] = wide[b % 2];
    const double(&prev)[NR][16] = wide[(b + 1) % 2];
    KVSIFT_UNROLL
    for (int r = 0; r < NR; ++r) {
      float* x = row[r] + 16 * b;
      const __m512 e = exact_exp16(_mm512_sub_ps(_mm512_loadu_ps(x), t[r]));
      _mm512_storeu_ps(x, e);
      _mm512_store_pd(cur[r], _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
      _mm512_store_pd(cur[r] + 8, _mm512_cvtps_pd(_mm256_castpd_ps(
                                      _mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
      if (b > 0) {  // the last block's columns [16 r / NR, 16 (r + 1) / NR) into every row's sum
        for (int i = 16 * r / NR; i < 16 * (r + 1) / NR; ++i) {
          KVSIFT_UNROLL
          for (int q = 0; q < NR; ++q) s[q] += prev[q][i];
        }
      }
    }
  }
  if (blocks > 0) {
    const double(&last)[NR][16] = wide[(blocks - 1) % 2];
    for (int i = 0; i < 16; ++i) {
      KVSIFT_UNROLL
      for (int q = 0; q < NR; ++q) s[q] += last[q][i];
    }
  }
  std::size_t j = blocks * 16;
  if (j < m) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (m - j)) - 1u);
    KVSIFT_UNROLL
    for (int r = 0; r < NR; ++r) {
      _mm512_mask_storeu_ps(row[r] + j, tail, exact_exp16(_mm512_sub_ps(
                                                  _mm512_maskz_loadu_ps(tail, row[r] + j), t[r])));
    }
    for (; j < m; ++j) {
      KVSIFT_UNROLL
      for (int r = 0; r < NR; ++r) s[r] += row[r][j];
    }
  }
  for (int r = 0; r < NR; ++r) sum[r] = s[r];
}

// row[j] *= inv, j in [0, m).
KVSIFT_TARGET_AVX512 inline void scale_row_avx512(float* row, std::size_t m, float inv) {
  const __m512 s = _mm512_set1_ps(inv);
  std::size_t j = 0;
  for (; j + 16 <= m; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), s));
  if (j < m) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (m - j)) - 1u);
    _mm512_mask_storeu_ps(row + j, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, row + j), s));
  }
}
#endif

}  // namespace detail

// x[j] = exact_expf(x[j] - top) for j in [0, m), on the best path the CPU has (`level`: for tests).
inline void exp_sub_row(float* x, std::size_t m, float top, simd level = active_simd()) {
#if KVSIFT_HAVE_X86_SIMD_PATH
  if (level >= simd::avx512) return detail::exp_sub_row_avx512(x, m, top);
  if (level >= simd::avx2) return detail::exp_sub_row_avx2(x, m, top);
#endif
  (void)level;
  detail::exp_sub_row_portable(x, m, top);
}

// softmax() on each of `rows` rows x[r * ld .. r * ld + m), bit for bit (see above).
inline void softmax_rows(float* x, int rows, std::size_t m, std::size_t ld,
                         simd level = active_simd()) {
  if (m == 0) return;
  constexpr int kRows = 8;
#if KVSIFT_HAVE_X86_SIMD_PATH
  if (level >= simd::avx512) {
    for (int r0 = 0; r0 < rows; r0 += kRows) {
      const int nr = std::min(kRows, rows - r0);
      float* row[kRows];
      float top[kRows];
      double sum[kRows];
      for (int r = 0; r < nr; ++r) {
        row[r] = x + static_cast<std::size_t>(r0 + r) * ld;
        top[r] = detail::row_max_avx512(row[r], m);
      }
      detail::with_heads<kRows>(nr, [&]<int NR>() { detail::exp_sums_avx512<NR>(row, top, m, sum); });
      for (int r = 0; r < nr; ++r) detail::scale_row_avx512(row[r], m, static_cast<float>(1.0 / sum[r]));
    }
    return;
  }
#endif
  for (int r = 0; r < rows; ++r) {
    float* row = x + static_cast<std::size_t>(r) * ld;
    float lanes[8];
    for (float& l : lanes) l = row[0];  // std::max_element keeps the first maximum
    std::size_t j = 1;
    for (; j + 8 <= m; j += 8) {
      for (int i = 0; i < 8; ++i) lanes[i] = lanes[i] < row[j + i] ? row[j + i] : lanes[i];
    }
    for (; j < m; ++j) lanes[0] = lanes[0] < row[j] ? row[j] : lanes[0];
    float top = lanes[0];
    for (int i = 1; i < 8; ++i) top = top < lanes[i] ? lanes[i] : top;
    exp_sub_row(row, m, top, level);
  }
  for (int r0 = 0; r0 < rows; r0 += kRows) {
    const int nr = std::min(kRows, rows - r0);
    float* row[kRows];
    double sum[kRows];
    for (int r = 0; r < nr; ++r) row[r] = x + static_cast<std::size_t>(r0 + r) * ld;
    // nr chains side by side for any nr (a GQA group of four heads is four rows)
    detail::with_heads<kRows>(nr, [&]<int NR>() { detail::column_sums<NR>(row, m, sum); });
    for (int r = 0; r < nr; ++r) {
      const float inv = static_cast<float>(1.0 / sum[r]);
      for (std::size_t j = 0; j < m; ++j) row[r][j] *= inv;
    }
  }
}

}  // namespace kvsift::cpu
