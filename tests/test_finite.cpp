// SPDX-License-Identifier: Apache-2.0
// Non-finite scores, where checking is asked for: a kvsift::error naming the score, nothing
// written; without the check the selection stays deterministic.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

using Catch::Matchers::ContainsSubstring;

TEST_CASE("select::topk rejects NaN or infinite candidate scores when check_finite is on",
          "[select][bad_input]") {
  kvsift::score_sets scores;
  std::vector<float> row(20, 1.0f);
  const float bad = GENERATE(std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::infinity());
  row[9] = bad;
  scores.push_back(row);
  const std::vector<int> budgets{8};
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{42});
  const kvsift::select::topk checked{{.sink = 2, .window = 2, .check_finite = true}};
  REQUIRE_THROWS_WITH(checked.select(scores, budgets, kept), ContainsSubstring("scores[0][9]"));
  REQUIRE(kept.values == std::vector<std::int32_t>{42});  // output untouched

  // a non-finite score at a protected position is ignored (it is never compared)
  row[9] = 1.0f;
  row[0] = bad;
  row[19] = bad;
  kvsift::score_sets protected_only;
  protected_only.push_back(row);
  REQUIRE_NOTHROW(checked.select(protected_only, budgets, kept));
  REQUIRE(kept.size(0) == 8);

  // unchecked, an infinity is an ordinary score; NaN is rejected all the same (a top-k over NaN
  // picks an unspecified set)
  const kvsift::select::topk unchecked{{.sink = 2, .window = 2}};
  if (std::isnan(bad)) {
    REQUIRE_THROWS_WITH(unchecked.select(scores, budgets, kept), ContainsSubstring("scores[0][9]"));
  } else {
    REQUIRE_NOTHROW(unchecked.select(scores, budgets, kept));
  }
}

TEST_CASE("select::page_topk rejects non-finite page scores when check_finite is on",
          "[select][bad_input]") {
  kvsift::score_sets scores;
  std::vector<float> pages(10, 0.5f);
  pages[3] = std::numeric_limits<float>::quiet_NaN();
  scores.push_back(pages);
  const std::vector<int> budgets{64};
  kvsift::index_sets kept;
  const kvsift::select::page_topk checked{{.page_size = 16, .min_pages = 3, .check_finite = true}};
  REQUIRE_THROWS_WITH(checked.select(scores, budgets, kept), ContainsSubstring("scores[0][3]"));
}

// Floats of every exponent and sign, each with the mantissa edges 0, 1, the quiet bit and all
// ones: zeros, subnormals, normals, both infinities and the smallest and largest NaN payloads.
namespace {
std::vector<float> edge_floats() {
  std::vector<float> out;
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (std::uint32_t mantissa : {0u, 1u, 0x400000u, 0x7fffffu}) {
        const std::uint32_t bits = sign | (exponent << 23) | mantissa;
        float x;
        std::memcpy(&x, &bits, sizeof x);
        out.push_back(x);
      }
    }
  }
  return out;
}
}  // namespace

// The lifecycle's input check (detail::all_finite, a carry out of the exponent field) agrees with
// std::isfinite on every half and bfloat16 pattern and on floats of every exponent, sign and
// mantissa edge, alone and at any place of a row of finite values.
TEST_CASE("detail::all_finite agrees with std::isfinite bit pattern by bit pattern", "[bad_input][nonfinite]") {
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto b = kvsift::bfloat16::from_bits(static_cast<std::uint16_t>(u));
    const auto h = kvsift::half::from_bits(static_cast<std::uint16_t>(u));
    REQUIRE(kvsift::detail::all_finite(&b, 1) == std::isfinite(static_cast<float>(b)));
    REQUIRE(kvsift::detail::all_finite(&h, 1) == std::isfinite(static_cast<float>(h)));
  }
  std::vector<float> row(37, 1.0f);
  for (const float x : edge_floats()) {
    REQUIRE(kvsift::detail::all_finite(&x, 1) == std::isfinite(x));
    for (std::size_t at : {std::size_t{0}, std::size_t{17}, row.size() - 1}) {
      row[at] = x;
      REQUIRE(kvsift::detail::all_finite(row.data(), static_cast<int>(row.size())) == std::isfinite(x));
      row[at] = 1.0f;
    }
  }
}

// validate_not_nan (every top-k selector's check) rejects exactly the NaNs among the candidates
// [first, last) of each segment, naming the first one, and validate_finite (check_finite) exactly
// the NaNs and infinities: every exponent and sign with mantissa
// edges (the smallest and largest NaN payloads, both infinities), at either end of the range and
// just outside it.
TEST_CASE("validate_not_nan and validate_finite reject exactly the NaN / non-finite candidates, whatever their bits", "[bad_input][nonfinite]") {
  kvsift::score_sets scores;
  scores.push_back(std::vector<float>(5, 0.25f));
  scores.push_back(std::vector<float>(11, 0.5f));
  const auto first = [](int s) { return s == 0 ? 0 : 2; };
  const auto last = [](int s) { return s == 0 ? 5 : 9; };  // segment 1: [2, 9) of 11
  for (const float x : edge_floats()) {
    for (int at : {1, 2, 8, 9}) {
      scores.values[5 + at] = x;
      if (std::isnan(x) && at >= 2 && at < 9) {
        REQUIRE_THROWS_WITH(kvsift::validate_not_nan(scores, first, last, "where", "scores"),
                            ContainsSubstring("scores[1][" + std::to_string(at) + "]"));
      } else {
        REQUIRE_NOTHROW(kvsift::validate_not_nan(scores, first, last, "where", "scores"));
      }
      if (!std::isfinite(x) && at >= 2 && at < 9) {  // check_finite's validate_finite: NaN and +-inf
        REQUIRE_THROWS_WITH(kvsift::validate_finite(scores, first, last, "where", "scores"),
                            ContainsSubstring("scores[1][" + std::to_string(at) + "]"));
      } else {
        REQUIRE_NOTHROW(kvsift::validate_finite(scores, first, last, "where", "scores"));
      }
      scores.values[5 + at] = 0.5f;
    }
  }
}
