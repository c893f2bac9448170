// SPDX-License-Identifier: Apache-2.0
#pragma once

// exp of a float for every path a selection depends on (the exact softmax of H2O, SnapKV's
// window, LagKV, FreeKV's pages, calibration), the same bits on the CPU, under Thrust and on a
// GPU, on any C library.
//
// The algorithm is the one glibc (2.27 on) and ARM's optimized-routines use for expf, within
// 0.502 ULP: x / ln2 = k / 32 + r with |r| <= 1/64 in double, 2^(k/32) from a 32-entry table and
// the exponent's bits, 2^r by a cubic, the product rounded to float once. Its products go through
// mul_rn (core/dot.hpp), so no compiler merges them into an FMA, and so one input gives one
// result everywhere; std::exp's own result is not that: glibc picks an FMA build of the same code
// on CPUs that have FMA, the CUDA library another algorithm. Run over all 2^32 floats once
// (2026-11-28, glibc 2.36), it equalled glibc's build without FMA on every one, and glibc's FMA
// build on all but two; tests/test_exact_exp.cpp holds it within 0.502 ULP of e^x on a sweep and
// carries those two floats.
//
// exact_expf is the scalar; cpu/exact_softmax.hpp runs it 16 (AVX-512) or 4 (AVX2) lanes at a
// time with the same operations, bit for bit.

#include <kvsift/core/config.hpp>
#include <kvsift/core/dot.hpp>

#include <cstdint>
#include <cstring>

namespace kvsift {

namespace detail::exp {

inline constexpr int kTableBits = 5;
inline constexpr int kN = 1 << kTableBits;
// tab[i] = bits(2^(i/32)) - (i << 52) / 32: 2^(i/32) correctly rounded to double, its exponent
// field lowered so that adding k << 47 (k = 32 * e + i) gives 2^(e + i/32).
#define KVSIFT_EXP_TABLE                                                        \
  0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, \
      0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, \
      0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d, \
      0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585, \
      0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13, \
      0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, \
      0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, \
      0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540
inline constexpr std::uint64_t kTable[kN] = {KVSIFT_EXP_TABLE};
#if defined(__CUDACC__)
// The device's copy (a host constexpr array is not addressable from device code).
static __device__ const std::uint64_t kTableDevice[kN] = {KVSIFT_EXP_TABLE};
#endif
#undef KVSIFT_EXP_TABLE
KVSIFT_HOST_DEVICE inline std::uint64_t table(unsigned i) {
#if defined(__CUDA_ARCH__)
  return kTableDevice[i];
#else
  return kTable[i];
#endif
}
inline constexpr double kInvLn2N = 0x1.71547652b82fep+0 * kN;  // 32 / ln 2
inline constexpr double kShift = 0x1.8p+52;                      // rounds to an integer on add
inline constexpr double kC0 = 0x1.c6af84b912394p-5 / kN / kN / kN;
inline constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / kN / kN;
inline constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / kN;
// Beyond these, float's exp overflows / rounds to zero (glibc's bounds).
inline constexpr float kOverflow = 0x1.62e42ep6f;    // log(0x1p128) ~ 88.72
inline constexpr float kUnderflow = -0x1.9fe368p6f;  // log(0x1p-150) ~ -103.97

KVSIFT_HOST_DEVICE inline std::uint64_t bits(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
KVSIFT_HOST_DEVICE inline double from_bits(std::uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace detail::exp

// e^x rounded to float as glibc's expf computes it (see above); +-inf, NaN, overflow and
// underflow as IEEE expf gives them (inf, NaN, 0).
KVSIFT_HOST_DEVICE inline float exact_expf(float x) {
  namespace e = detail::exp;
  if (!(x <= e::kOverflow)) return x != x ? x + x : x * 0x1p127f * 0x1p127f;  // NaN, inf
  if (x < e::kUnderflow) return 0.0f;                                            // -inf included
  const double xd = x;
  const double z = mul_rn(e::kInvLn2N, xd);
  const double shifted = z + e::kShift;  // round z to an integer k, ties to even
  const std::uint64_t ki = e::bits(shifted);
  const double kd = shifted - e::kShift;
  const double r = z - kd;
  const std::uint64_t t =
      e::table(static_cast<unsigned>(ki % e::kN)) + (ki << (52 - e::kTableBits));
  const double s = e::from_bits(t);
  const double p = mul_rn(e::kC0, r) + e::kC1;
  const double r2 = mul_rn(r, r);
  double y = mul_rn(e::kC2, r) + 1.0;
  y = mul_rn(p, r2) + y;
  return static_cast<float>(mul_rn(y, s));
}

}  // namespace kvsift
