// SPDX-License-Identifier: Apache-2.0
// Core data model: element conversions (round to nearest, ties to even), views, segments and the
// real-to-integer rule.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

using kvsift::bfloat16;
using kvsift::half;

namespace {

float f32(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t u32(float f) { return std::bit_cast<std::uint32_t>(f); }

// Independent reference for binary16: decode by arithmetic (no bit tricks).
double half_value(std::uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  if (e == 31) return m == 0 ? sign * std::numeric_limits<double>::infinity()
                             : std::numeric_limits<double>::quiet_NaN();
  return sign * std::ldexp(static_cast<double>(m + 1024), e - 25);
}

// Independent reference for float -> bfloat16: pick the nearer of the two neighbours, ties to the
// even one, in double arithmetic.
std::uint16_t bf16_reference(float x) {
  if (std::isnan(x)) return 0x7fc0;
  const std::uint32_t u = u32(x);
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);  // next magnitude, same sign
  if ((u & 0xffffu) == 0) return lo;
  const double a = std::fabs(static_cast<double>(f32(static_cast<std::uint32_t>(lo) << 16)));
  // the upper neighbour may be infinity: its "value" for rounding is 2^128
  const double b = (hi & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128)
                                           : std::fabs(static_cast<double>(
                                                 f32(static_cast<std::uint32_t>(hi) << 16)));
  const double v = std::fabs(static_cast<double>(x));
  if (v - a < b - v) return lo;
  if (v - a > b - v) return hi;
  return (lo & 1) ? hi : lo;
}

}  // namespace

TEST_CASE("half: every one of the 65536 bit patterns round-trips exactly", "[core][element]") {
  int nan_count = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = half::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    const double ref = half_value(static_cast<std::uint16_t>(b));
    CAPTURE(b);
    if (std::isnan(ref)) {
      ++nan_count;
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(static_cast<float>(half(f))));
      REQUIRE((half(f).bits & 0x7c00) == 0x7c00);
      REQUIRE((half(f).bits & 0x3ff) != 0);
      continue;
    }
    REQUIRE(static_cast<double>(f) == ref);
    REQUIRE(std::signbit(f) == ((b & 0x8000u) != 0));  // -0 stays -0
    REQUIRE(half(f).bits == b);
  }
  REQUIRE(nan_count == 2 * 1023);
}

TEST_CASE("half: float -> half rounds to nearest, ties to even, at every midpoint",
          "[core][element]") {
  // Between every pair of adjacent finite non-negative halves (a, a+1) the midpoint is exact in
  // float; it must go to the even one, and one float ulp either side to the nearer one.
  for (std::uint16_t a = 0; a < 0x7bff; ++a) {
    const std::uint16_t b = static_cast<std::uint16_t>(a + 1);
    const double mid = (half_value(a) + half_value(b)) / 2;
    const float m = static_cast<float>(mid);
    CAPTURE(a);
    REQUIRE(static_cast<double>(m) == mid);
    const std::uint16_t even = (a & 1) ? b : a;
    REQUIRE(half(m).bits == even);
    REQUIRE(half(-m).bits == (even | 0x8000));
    REQUIRE(half(std::nextafter(m, 0.0f)).bits == a);
    REQUIRE(half(std::nextafter(m, 1e9f)).bits == b);
  }
}

TEST_CASE("half: subnormals, overflow to infinity, NaN and signed zero", "[core][element]") {
  REQUIRE(half(0.0f).bits == 0x0000);
  REQUIRE(half(-0.0f).bits == 0x8000);
  REQUIRE(half(std::ldexp(1.0f, -24)).bits == 0x0001);    // smallest subnormal
  REQUIRE(half(std::ldexp(1.0f, -25)).bits == 0x0000);    // tie between 0 and 2^-24: even (0)
  REQUIRE(half(std::ldexp(3.0f, -26)).bits == 0x0001);    // 0.75 * 2^-24: rounds up
  REQUIRE(half(std::ldexp(3.0f, -25)).bits == 0x0002);    // 1.5 * 2^-24: tie, even (2)
  REQUIRE(half(std::ldexp(5.0f, -25)).bits == 0x0002);    // 2.5 * 2^-24: tie, even (2)
  REQUIRE(half(std::ldexp(1023.0f, -24)).bits == 0x03ff); // largest subnormal
  REQUIRE(half(std::ldexp(1.0f, -14)).bits == 0x0400);    // smallest normal
  REQUIRE(half(std::ldexp(2047.0f, -25)).bits == 0x0400); // tie 1023.5 * 2^-24 -> 1024 (even)
  REQUIRE(half(std::ldexp(1.0f, -40)).bits == 0x0000);    // underflow to zero
  REQUIRE(half(-std::ldexp(1.0f, -40)).bits == 0x8000);
  REQUIRE(half(65504.0f).bits == 0x7bff);                 // max finite
  REQUIRE(half(65519.99f).bits == 0x7bff);
  REQUIRE(half(65520.0f).bits == 0x7c00);                 // tie with 65536: even -> inf
  REQUIRE(half(-65520.0f).bits == 0xfc00);
  REQUIRE(half(1e10f).bits == 0x7c00);
  REQUIRE(half(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  REQUIRE(half(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  const auto qn = half(std::numeric_limits<float>::quiet_NaN());
  REQUIRE((qn.bits & 0x7c00) == 0x7c00);
  REQUIRE((qn.bits & 0x03ff) != 0);
  const auto sn = half(f32(0x7f800001u));  // signalling NaN with payload only in low bits
  REQUIRE(std::isnan(static_cast<float>(sn)));
  REQUIRE(half(1.0f).bits == 0x3c00);
  REQUIRE(half(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // tie -> even 1.0
  REQUIRE(half(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);  // tie -> even
}

TEST_CASE("half: float -> half agrees with the compiler's _Float16 conversion",
          "[core][element]") {
#if defined(__FLT16_MAX__)
  std::mt19937 rng(1234);
  auto check = [](std::uint32_t u) {
    const float x = f32(u);
    const _Float16 ref = static_cast<_Float16>(x);
    const auto rb = std::bit_cast<std::uint16_t>(ref);
    const auto got = half(x).bits;
    if (std::isnan(x)) {
      return (got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0;
    }
    return got == rb;
  };
  // a stride through all 2^32 float patterns, plus random ones around the half range
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4093) {
    CAPTURE(u);
    REQUIRE(check(static_cast<std::uint32_t>(u)));
  }
  std::uniform_int_distribution<std::uint32_t> near(0x33000000u, 0x47800000u);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t u = near(rng) | (i % 2 ? 0x80000000u : 0u);
    CAPTURE(u);
    REQUIRE(check(u));
  }
#else
  SKIP("no _Float16 in this compiler");
#endif
}

TEST_CASE("bfloat16: exact conversions, ties to even, overflow and NaN", "[core][element]") {
  // every bfloat16 pattern round-trips (NaNs stay NaN)
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto x = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(x);
    CAPTURE(b);
    REQUIRE(u32(f) == (b << 16));
    if (std::isnan(f)) {
      REQUIRE(std::isnan(static_cast<float>(bfloat16(f))));
    } else {
      REQUIRE(bfloat16(f).bits == b);
    }
  }
  // midpoints between adjacent bfloat16 values go to the even one
  for (std::uint32_t a = 0; a < 0x7f7f; a += 3) {
    const float mid = f32((a << 16) | 0x8000u);
    const std::uint32_t even = (a & 1) ? a + 1 : a;
    CAPTURE(a);
    REQUIRE(bfloat16(mid).bits == even);
    REQUIRE(bfloat16(-mid).bits == (even | 0x8000u));
    REQUIRE(bfloat16(f32((a << 16) | 0x7fffu)).bits == a);
    REQUIRE(bfloat16(f32((a << 16) | 0x8001u)).bits == a + 1);
  }
  REQUIRE(bfloat16(1.0f).bits == 0x3f80);
  REQUIRE(bfloat16(f32(0x7f7fffffu)).bits == 0x7f80);  // FLT_MAX rounds to infinity
  REQUIRE(bfloat16(f32(0x7f7f7fffu)).bits == 0x7f7f);
  REQUIRE(bfloat16(f32(0x7f7f8000u)).bits == 0x7f80);  // tie at the top: even is infinity
  REQUIRE(bfloat16(f32(0xff7fffffu)).bits == 0xff80);
  REQUIRE(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  REQUIRE(bfloat16(f32(0x00008000u)).bits == 0x0000);  // subnormal tie to even (0)
  REQUIRE(bfloat16(f32(0x00018000u)).bits == 0x0002);  // subnormal tie to even (2)
  REQUIRE(bfloat16(-0.0f).bits == 0x8000);
  const auto sn = bfloat16(f32(0x7f800001u));  // payload only in the dropped half: still NaN
  REQUIRE(std::isnan(static_cast<float>(sn)));
  const auto nn = bfloat16(f32(0xffc00000u));
  REQUIRE(std::isnan(static_cast<float>(nn)));
  REQUIRE((nn.bits & 0x8000) != 0);

  std::mt19937 rng(77);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 300000; ++i) {
    const std::uint32_t u = any(rng);
    const float x = f32(u);
    CAPTURE(u);
    if (std::isnan(x)) {
      REQUIRE(std::isnan(static_cast<float>(bfloat16(x))));
    } else {
      REQUIRE(bfloat16(x).bits == bf16_reference(x));
    }
  }
}

TEST_CASE("to_float / from_float and element names", "[core][element]") {
  REQUIRE(kvsift::to_float(kvsift::from_float<half>(0.5f)) == 0.5f);
  REQUIRE(kvsift::to_float(kvsift::from_float<bfloat16>(-2.0f)) == -2.0f);
  REQUIRE(kvsift::from_float<float>(0.1f) == 0.1f);
  REQUIRE(kvsift::element_name<float> == "f32");
  REQUIRE(kvsift::element_name<half> == "f16");
  REQUIRE(kvsift::element_name<bfloat16> == "bf16");
}

TEST_CASE("kv_view: nhd and hnd address the same (token, head) row", "[core][view]") {
  const int T = 5, H = 3, D = 4;
  std::vector<float> nhd_buf(T * H * D), hnd_buf(T * H * D);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      for (int c = 0; c < D; ++c) {
        const float v = static_cast<float>(t * 100 + h * 10 + c);
        nhd_buf[(t * H + h) * D + c] = v;
        hnd_buf[(h * T + t) * D + c] = v;
      }
    }
  }
  const auto a = kvsift::kv_view<float, kvsift::nhd>::contiguous(nhd_buf.data(), T, H, D);
  const auto b = kvsift::kv_view<float, kvsift::hnd>::contiguous(hnd_buf.data(), T, H, D);
  REQUIRE(a.token_stride == H * D);
  REQUIRE(a.head_stride == D);
  REQUIRE(b.token_stride == D);
  REQUIRE(b.head_stride == T * D);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      CAPTURE(t, h);
      REQUIRE(a.row(t, h) == nhd_buf.data() + (t * H + h) * D);
      REQUIRE(b.row(t, h) == hnd_buf.data() + (h * T + t) * D);
      for (int c = 0; c < D; ++c) REQUIRE(a.row(t, h)[c] == b.row(t, h)[c]);
    }
  }
  const auto first = GENERATE(0, 1, 3);
  const auto count = GENERATE(0, 1, 2);
  CAPTURE(first, count);
  const auto sa = a.slice(first, count);
  const auto sb = b.slice(first, count);
  REQUIRE(sa.tokens == count);
  REQUIRE(sb.tokens == count);
  for (int t = 0; t < count; ++t) {
    for (int h = 0; h < H; ++h) {
      REQUIRE(sa.row(t, h) == a.row(first + t, h));
      REQUIRE(sb.row(t, h) == b.row(first + t, h));
    }
  }
  const kvsift::kv_view<const float, kvsift::hnd> cb = b;  // read-only view of the same memory
  REQUIRE(cb.row(2, 1) == b.row(2, 1));
  REQUIRE_NOTHROW(a.validate("test", "k", H, D));
  REQUIRE_NOTHROW(b.validate("test", "k", H, D));
  REQUIRE_THROWS_WITH(a.validate("test", "k", H + 1, D), Catch::Matchers::ContainsSubstring("k.heads"));
  REQUIRE_THROWS_WITH(a.validate("test", "k", H, D + 1), Catch::Matchers::ContainsSubstring("k.dim"));
  auto overlapping = a;
  overlapping.head_stride = 1;  // rows of 4 channels 1 apart overlap
  REQUIRE_THROWS_WITH(overlapping.validate("test", "k", H, D),
                      Catch::Matchers::ContainsSubstring("k.strides"));
  auto null = a;
  null.data = nullptr;
  REQUIRE_THROWS_WITH(null.validate("test", "k", H, D), Catch::Matchers::ContainsSubstring("k.data"));
}

TEST_CASE("paged_kv_view: paged_nhd and paged_hnd rows follow the CSR page table",
          "[core][view]") {
  const int P = 6, PS = 4, H = 2, D = 3;
  // request 0: pages {4, 1, 2}, 2 tokens in the last (10 tokens); request 1: {0} with 3 tokens;
  // request 2: no pages.
  const std::vector<std::int32_t> indptr{0, 3, 4, 4};
  const std::vector<std::int32_t> indices{4, 1, 2, 0};
  const std::vector<std::int32_t> last{2, 3, 1};
  std::vector<float> pn(P * PS * H * D), ph(P * PS * H * D);
  kvsift::paged_kv_view<float, kvsift::paged_nhd> vn{pn.data(), P, PS, H, D, 3,
                                                     indptr.data(), indices.data(), last.data()};
  kvsift::paged_kv_view<float, kvsift::paged_hnd> vh{ph.data(), P, PS, H, D, 3,
                                                     indptr.data(), indices.data(), last.data()};
  REQUIRE(vn.length(0) == 10);
  REQUIRE(vn.length(1) == 3);
  REQUIRE(vn.length(2) == 0);
  REQUIRE(vh.length(0) == 10);
  for (int t = 0; t < 10; ++t) {
    for (int h = 0; h < H; ++h) {
      CAPTURE(t, h);
      const int page = indices[t / PS];
      const int slot = t % PS;
      REQUIRE(vn.row(0, t, h) == pn.data() + ((page * PS + slot) * H + h) * D);
      REQUIRE(vh.row(0, t, h) == ph.data() + ((page * H + h) * PS + slot) * D);
    }
  }
  REQUIRE(vn.row(1, 2, 1) == pn.data() + ((0 * PS + 2) * H + 1) * D);
  // every (request, token, head) row is distinct memory
  std::vector<const float*> rows;
  for (int r = 0; r < 2; ++r) {
    for (int t = 0; t < vn.length(r); ++t) {
      for (int h = 0; h < H; ++h) rows.push_back(vh.row(r, t, h));
    }
  }
  std::sort(rows.begin(), rows.end());
  REQUIRE(std::adjacent_find(rows.begin(), rows.end()) == rows.end());
  REQUIRE_NOTHROW(vn.validate("test", "kv", H, D));
  auto bad = vn;
  const std::vector<std::int32_t> bad_indices{4, 1, 9, 0};
  bad.indices = bad_indices.data();
  REQUIRE_THROWS_WITH(bad.validate("test", "kv", H, D), Catch::Matchers::ContainsSubstring("kv.indices[2]"));
  const std::vector<std::int32_t> bad_last{5, 3, 1};
  bad = vn;
  bad.last_page_len = bad_last.data();
  REQUIRE_THROWS_WITH(bad.validate("test", "kv", H, D),
                      Catch::Matchers::ContainsSubstring("kv.last_page_len[0]"));
}

TEST_CASE("segmented: CSR layout, resize, push_back and index-set validation", "[core][segments]") {
  kvsift::index_sets s;
  REQUIRE(s.segments() == 0);
  const std::vector<int> sizes{3, 0, 2};
  s.resize(sizes);
  REQUIRE(s.segments() == 3);
  REQUIRE(s.offsets == std::vector<std::int32_t>{0, 3, 3, 5});
  REQUIRE(s.size(1) == 0);
  REQUIRE(s[2].size() == 2);
  std::iota(s[0].begin(), s[0].end(), 0);
  s[2][0] = 1;
  s[2][1] = 4;
  REQUIRE(s.values == std::vector<std::int32_t>{0, 1, 2, 1, 4});
  const std::vector<std::int32_t> extra{7, 8};
  s.push_back(extra);
  REQUIRE(s.segments() == 4);
  REQUIRE(s[3][1] == 8);
  REQUIRE_NOTHROW(kvsift::validate_index_sets(s, [](int) { return 9; }, "t", "kept"));
  REQUIRE_THROWS_WITH(kvsift::validate_index_sets(s, [](int) { return 8; }, "t", "kept"),
                      Catch::Matchers::ContainsSubstring("kept[3][1]"));
  s[0][2] = 1;  // 0, 1, 1: not strictly ascending
  REQUIRE_THROWS_WITH(kvsift::validate_index_sets(s, [](int) { return 9; }, "t", "kept"),
                      Catch::Matchers::ContainsSubstring("kept[0][2]") &&
                          Catch::Matchers::ContainsSubstring("ascending"));
  // reshape: the same layout without value-initialising what the array held (a tail it grows
  // is); resize zeroes everything; a bad size changes neither
  s.reshape(std::vector<int>{2, 4});
  REQUIRE(s.offsets == std::vector<std::int32_t>{0, 2, 6});
  REQUIRE(s.values == std::vector<std::int32_t>{0, 1, 1, 1, 4, 7});
  s.reshape(std::vector<int>{4, 4});
  REQUIRE(s.values == std::vector<std::int32_t>{0, 1, 1, 1, 4, 7, 0, 0});
  REQUIRE_THROWS_WITH(s.reshape(std::vector<int>{1, -1}), Catch::Matchers::ContainsSubstring("sizes[1]"));
  REQUIRE(s.offsets == std::vector<std::int32_t>{0, 4, 8});
  s.resize(std::vector<int>{3, 3});
  REQUIRE(s.values == std::vector<std::int32_t>(6, 0));
  s.clear();
  REQUIRE(s.segments() == 0);
  REQUIRE(s.values.empty());
}

TEST_CASE("count_floor: counts that are mathematically integers are not lost to rounding",
          "[core][budget]") {
  REQUIRE((1.0 - 0.9) * 10 < 1.0);  // the premise: plain floor would give 0
  REQUIRE(kvsift::count_floor((1.0 - 0.9) * 10) == 1);
  REQUIRE(kvsift::budget::tokens_from_evict_fraction(10, 0.9) == 1);
  REQUIRE(kvsift::budget::tokens_from_keep_fraction(100, 0.29) == 29);  // 28.999999999999996
  REQUIRE(kvsift::budget::tokens_from_keep_fraction(10, 0.25) == 2);    // real truncation stays
  REQUIRE(kvsift::budget::tokens_from_keep_fraction(7, 0.5) == 3);
  REQUIRE(kvsift::count_floor(2.9999) == 2);
  REQUIRE(kvsift::count_floor(0.0) == 0);
  REQUIRE(kvsift::count_floor(1e6 - 0.5) == 999999);  // tolerance is 1e-9 relative, not more
  REQUIRE(kvsift::budget::tokens_from_evict_fraction(0, 0.5) == 0);
  REQUIRE(kvsift::budget::tokens_from_evict_fraction(1000, 0.0) == 1000);
}

TEST_CASE("model_shape: sequence numbering and validation", "[core][shape]") {
  const kvsift::model_shape sh{.layers = 3, .q_heads = 8, .kv_heads = 2, .head_dim = 16};
  REQUIRE(sh.group_size() == 4);
  REQUIRE(sh.sequences_per_request() == 6);
  REQUIRE(sh.sequence(0, 0, 0) == 0);
  REQUIRE(sh.sequence(0, 0, 1) == 1);
  REQUIRE(sh.sequence(0, 1, 0) == 2);
  REQUIRE(sh.sequence(2, 1, 1) == 2 * 6 + 1 * 2 + 1);
  REQUIRE_NOTHROW(sh.validate("t"));
  auto bad = sh;
  bad.q_heads = 7;
  REQUIRE_THROWS_WITH(bad.validate("t"), Catch::Matchers::ContainsSubstring("shape.q_heads"));
}

// cpu::topk_of keeps the k best by (score descending, index ascending), ascending; it finds the
// dropped ones instead when fewer are dropped than kept, and a single dropped one in one pass.
// Every regime against a full sort, with many ties, over ascending candidate subsets, for every k
// from -1 to n + 1 (k = n - 1: the single drop).
TEST_CASE("cpu::topk_of equals a full sort in both regimes, ties to the lower index", "[core][topk]") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const int range = 1 + static_cast<int>(rng() % 200);
    std::vector<float> scores(static_cast<std::size_t>(range));
    for (float& x : scores) x = static_cast<float>(rng() % 7) - 3.0f;  // many ties
    std::vector<std::int32_t> cand;
    for (int i = 0; i < range; ++i) {
      if (trial % 2 == 0 || rng() % 3 != 0) cand.push_back(i);
    }
    const int n = static_cast<int>(cand.size());
    for (int k = -1; k <= n + 1; ++k) {
      auto expect = cand;
      std::stable_sort(expect.begin(), expect.end(), [&](std::int32_t a, std::int32_t b) {
        return scores[a] > scores[b];  // stable over ascending indices: ties to the lower index
      });
      expect.resize(static_cast<std::size_t>(std::clamp(k, 0, n)));
      std::sort(expect.begin(), expect.end());
      std::vector<std::int32_t> got{99};  // overwritten, not appended to
      kvsift::cpu::topk_of(scores, cand, k, got);
      REQUIRE(got == expect);
    }
  }
}

// cpu::worst_of (the single drop of topk_of and topk_range): the minimum in lanes, then the last
// position holding it, equal to the one-pass chained scan it replaced on every length (below 16
// the chained scan itself), with -0 and +0 tied, infinities, and NaN (the chained scan's answer,
// whatever NaN makes of it).
TEST_CASE("cpu::worst_of equals the one-pass scan: ties, signed zeros, infinities, NaN",
          "[core][topk]") {
  const auto chained = [](const std::vector<float>& v) {
    std::size_t worst = 0;
    for (std::size_t i = 1; i < v.size(); ++i) {
      if (v[worst] >= v[i]) worst = i;
    }
    return worst;
  };
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> pool{-0.0f, 0.0f, 1.0f, -1.0f, 2.5f, inf, -inf};
  std::mt19937 rng(11);
  int nans = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t m = 1 + rng() % 300;
    std::vector<float> v(m);
    for (float& x : v) x = pool[rng() % pool.size()];
    if (trial % 5 == 0) {
      v[rng() % m] = nan;
      ++nans;
    }
    if (trial % 7 == 0) std::fill(v.begin(), v.end(), trial % 2 ? 0.0f : -0.0f);
    const auto got = kvsift::cpu::worst_of(m, [&](std::size_t i) { return v[i]; });
    CAPTURE(trial, m);
    REQUIRE(got == chained(v));
  }
  REQUIRE(nans > 0);
  // the lowest in the last lane of the last block, and in the tail past it
  std::vector<float> v(40, 3.0f);
  v[31] = -2.0f;
  REQUIRE(kvsift::cpu::worst_of(v.size(), [&](std::size_t i) { return v[i]; }) == 31);
  v[39] = -2.0f;
  REQUIRE(kvsift::cpu::worst_of(v.size(), [&](std::size_t i) { return v[i]; }) == 39);
}

// cpu::topk_range: the same order over an index range, appended to a vector or written into a
// span; keeping all or all but one (one pass, no candidate list) and the general case, every k
// from -1 to n + 1 over ranges that start inside the scores, with many ties.
TEST_CASE("cpu::topk_range equals a full sort, appended or into a span", "[core][topk]") {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 60; ++trial) {
    const int size = 1 + static_cast<int>(rng() % 120);
    std::vector<float> scores(static_cast<std::size_t>(size));
    for (float& x : scores) x = static_cast<float>(rng() % 5) - 2.0f;  // many ties
    const int first = static_cast<int>(rng() % static_cast<unsigned>(size));
    const int last = first + static_cast<int>(rng() % static_cast<unsigned>(size - first + 1));
    const int n = last - first;
    for (int k = -1; k <= n + 1; ++k) {
      std::vector<std::int32_t> expect(static_cast<std::size_t>(n));
      std::iota(expect.begin(), expect.end(), first);
      std::stable_sort(expect.begin(), expect.end(), [&](std::int32_t a, std::int32_t b) {
        return scores[a] > scores[b];
      });
      expect.resize(static_cast<std::size_t>(std::clamp(k, 0, n)));
      std::sort(expect.begin(), expect.end());
      std::vector<std::int32_t> appended{-5};  // kept, the top k after it
      kvsift::cpu::topk_range(scores, first, last, k, appended);
      REQUIRE(appended.front() == -5);
      REQUIRE(std::vector<std::int32_t>(appended.begin() + 1, appended.end()) == expect);
      std::vector<std::int32_t> span_out(expect.size() + 1, -9);  // one past: left alone
      kvsift::cpu::topk_range(scores, first, last, k, std::span<std::int32_t>(span_out));
      REQUIRE(std::vector<std::int32_t>(span_out.begin(), span_out.end() - 1) == expect);
      REQUIRE(span_out.back() == -9);
    }
  }
}
