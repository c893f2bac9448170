// SPDX-License-Identifier: Apache-2.0
// exact_expf (core/exp.hpp): within 0.502 ULP of e^x, IEEE's special cases, and the vector paths
// of cpu/exact_softmax.hpp equal to it bit for bit.

#include <kvsift/core/exp.hpp>
#include <kvsift/cpu/exact_softmax.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace kvsift;

namespace {

// Every float whose bit pattern is a multiple of `stride`, plus the special values, the bounds of
// the special cases with their neighbours, and two inputs that tell a fused path apart.
std::vector<float> sweep(std::uint32_t stride) {
  std::vector<float> xs;
  for (std::uint64_t u = 0; u < (1ull << 32); u += stride) {
    xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (const float b : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                        detail::exp::kOverflow, detail::exp::kUnderflow, -87.0f, -88.0f, 88.0f,
                        -103.28f, 1e-30f, -1e-30f, std::numeric_limits<float>::denorm_min()}) {
    xs.push_back(b);
    xs.push_back(std::nextafter(b, inf));
    xs.push_back(std::nextafter(b, -inf));
  }
  // The two floats where glibc's FMA build of this algorithm rounds otherwise (0x1.04845ep+5,
  // -0x1.f8cbb2p+5): x / ln2 fused into the adds that round it and take the remainder changes
  // these. (Fusing any one of the cubic's multiply-adds changes no result for x in [-104, 0],
  // checked over every float there once.)
  xs.push_back(std::bit_cast<float>(0x4202422fu));
  xs.push_back(std::bit_cast<float>(0xc27c65d9u));
  return xs;
}

}  // namespace

TEST_CASE("exact_expf is within 0.502 ULP of e^x and keeps IEEE's special cases", "[exact_exp]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(exact_expf(0.0f) == 1.0f);
  CHECK(exact_expf(-0.0f) == 1.0f);
  CHECK(exact_expf(-inf) == 0.0f);
  CHECK(exact_expf(inf) == inf);
  CHECK(std::isnan(exact_expf(std::numeric_limits<float>::quiet_NaN())));
  CHECK(exact_expf(89.0f) == inf);
  CHECK(exact_expf(-104.0f) == 0.0f);
  CHECK(exact_expf(-100.0f) > 0.0f);  // a subnormal, not flushed
  CHECK(exact_expf(1.0f) == 2.71828182845904523536f);

  std::int64_t checked = 0;
  for (const float x : sweep(4099)) {
    if (std::isnan(x)) continue;
    const float got = exact_expf(x);
    const double want = std::exp(static_cast<double>(x));  // glibc's double exp: < 1 double ULP
    CAPTURE(x, got, want);
    if (want > std::numeric_limits<float>::max()) {
      REQUIRE(got == inf);
      continue;
    }
    // One float ULP where e^x lies: the step between the two floats around it.
    const float near = static_cast<float>(want);
    const float lo = near > want ? std::nextafter(near, 0.0f) : near;
    const float hi = near > want ? near : std::nextafter(near, inf);
    const double ulp = static_cast<double>(hi) - lo;
    if (!(std::fabs(static_cast<double>(got) - want) <= 0.502 * ulp)) {
      FAIL_CHECK("x " << x << ": " << got << ", e^x = " << want << ", ULP " << ulp);
      break;
    }
    ++checked;
  }
  CHECK(checked > 500000);
}

TEST_CASE("exact_expf on the vector paths equals the scalar bit for bit", "[exact_exp]") {
  const cpu::simd level = GENERATE(cpu::simd::portable, cpu::simd::avx2, cpu::simd::avx512);
  if (level > cpu::detected_simd()) SKIP("this CPU has no " << cpu::simd_name(level) << " path");
  const std::vector<float> xs = sweep(1031);
  SECTION("every float of the sweep, x - 0") {
    std::vector<float> got = xs;
    cpu::exp_sub_row(got.data(), got.size(), 0.0f, level);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(exact_expf(xs[i]))) {
        if (differ++ == 0) UNSCOPED_INFO("first: x " << xs[i] << " gives " << got[i]);
      }
    }
    CHECK(differ == 0);
  }
  SECTION("every tail length, a row maximum subtracted, the columns past the row untouched") {
    for (std::size_t m = 0; m <= 40; ++m) {
      std::vector<float> row(m + 3);
      for (std::size_t j = 0; j < row.size(); ++j) row[j] = xs[(j * 7919 + m * 104729) % xs.size()];
      std::vector<float> got = row;
      const float top = 3.5f;
      cpu::exp_sub_row(got.data(), m, top, level);
      for (std::size_t j = 0; j < row.size(); ++j) {
        CAPTURE(m, j, row[j]);
        const float want = j < m ? exact_expf(row[j] - top) : row[j];
        REQUIRE(std::bit_cast<std::uint32_t>(got[j]) == std::bit_cast<std::uint32_t>(want));
      }
    }
  }
}
