// SPDX-License-Identifier: Apache-2.0
// Non-finite scores, where checking is asked for: a kvsift::error naming the score, nothing
// written; without the check the selection stays deterministic.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
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
