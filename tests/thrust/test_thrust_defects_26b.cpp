// SPDX-License-Identifier: Apache-2.0
// Regression tests for issue 26, item 11, under the device system this binary is compiled for
// (CPP or OMP) and under thrust::cpp::par: each failed before its fix.
//   thrust::segmented_topk(check = true) did not check that num_kept is kept_offsets[S] nor the
//   offset arrays (first 0, non-decreasing, offsets[S] = num_items): it read past its items and
//   wrote past `out`. The FlashInfer export's check never validated head_pages.indptr. Both now
//   throw kvsift::error naming the offending entry, with the outputs unwritten.

#include <kvsift/store/flashinfer.hpp>
#include <kvsift/thrust/all.hpp>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::ContainsSubstring;
using dvec = ::thrust::device_vector<std::int32_t>;

template <class F>
void for_each_policy(F&& f) {
  f(::thrust::device, std::string("device(" KVSIFT_THRUST_SYSTEM_NAME ")"));
  f(::thrust::cpp::par, std::string("cpp::par"));
}

bool untouched(const std::vector<std::int32_t>& v) {
  return std::all_of(v.begin(), v.end(), [](std::int32_t x) { return x == -7; });
}
bool untouched(const dvec& v) {
  return std::all_of(v.begin(), v.end(), [](std::int32_t x) { return x == -7; });
}

}  // namespace

TEST_CASE("thrust::segmented_topk checks num_kept and both offset arrays, writing nothing",
          "[thrust][topk][bad_input][defects]") {
  std::vector<float> scores(40);
  for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = static_cast<float>((i * 7) % 11);
  struct bad_case {
    std::string what;
    std::vector<std::int32_t> offsets, kept;
    std::int64_t num_items, num_kept;
    std::string message;
  };
  const std::vector<bad_case> cases{
      // kept_offsets[3] = 12 but 20 outputs asked for: the tail was gathered past segment 2
      {"num_kept", {0, 8, 18, 30}, {0, 4, 10, 12}, 30, 20,
       "argument 'num_kept' = 20, expected kept_offsets[3] (12)"},
      {"offsets[0]", {2, 8, 18, 30}, {0, 4, 10, 12}, 30, 12,
       "argument 'offsets[0]' = 2, expected 0"},
      {"offsets[S]", {0, 8, 18, 40}, {0, 4, 10, 12}, 30, 12,
       "argument 'offsets[3]' = 40, expected num_items (30)"},
      {"offsets decreasing", {0, 18, 8, 30}, {0, 4, 4, 12}, 30, 12,
       "argument 'offsets[2]' = 8, expected >= offsets[1] (18)"},
      {"kept_offsets[0]", {0, 8, 18, 30}, {1, 4, 10, 12}, 30, 12,
       "argument 'kept_offsets[0]' = 1, expected 0"},
  };
  for_each_policy([&](const auto& exec, const std::string& name) {
    for (const auto& c : cases) {
      CAPTURE(name, c.what);
      std::vector<std::int32_t> out(40, -7);  // room for any of them: nothing may be written
      std::vector<std::byte> ws(kvsift::thrust::segmented_topk_workspace_bytes(c.num_items));
      const auto run = [&] {
        kvsift::thrust::segmented_topk(exec, scores.data(), c.offsets.data(), 3, c.num_items,
                                       c.kept.data(), c.num_kept, out.data(), ws.data(),
                                       ws.size());
      };
      REQUIRE_THROWS_AS(run(), kvsift::error);
      REQUIRE_THROWS_WITH(run(), ContainsSubstring("thrust::segmented_topk") &&
                                     ContainsSubstring(c.message));
      REQUIRE(untouched(out));
    }
    // no segments: nothing to keep, no items
    std::vector<std::int32_t> out(4, -7);
    std::vector<std::byte> ws(kvsift::thrust::segmented_topk_workspace_bytes(4));
    const std::vector<std::int32_t> zero{0};
    REQUIRE_THROWS_WITH(kvsift::thrust::segmented_topk(exec, scores.data(), zero.data(), 0, 4,
                                                       zero.data(), 0, out.data(), ws.data(),
                                                       ws.size()),
                        ContainsSubstring("argument 'num_items' = 4, expected 0"));
    REQUIRE(untouched(out));
    // the well-formed call goes through (and check = false still skips the device pass)
    const std::vector<std::int32_t> offsets{0, 8, 18, 30}, kept{0, 4, 10, 12};
    std::vector<std::byte> ws30(kvsift::thrust::segmented_topk_workspace_bytes(30));
    for (const bool check : {true, false}) {
      std::vector<std::int32_t> ok(12, -7);
      kvsift::thrust::segmented_topk(exec, scores.data(), offsets.data(), 3, 30, kept.data(), 12,
                                     ok.data(), ws30.data(), ws30.size(), {}, check);
      REQUIRE(std::none_of(ok.begin(), ok.end(), [](std::int32_t x) { return x == -7; }));
    }
  });
}

TEST_CASE("thrust FlashInfer export checks head_pages.indptr, writing nothing",
          "[thrust][flashinfer][bad_input][defects]") {
  // two entries of a store with pages of 4: entry 0 holds 5 tokens (2 pages), entry 1 3 (1 page)
  kvsift::head_pages good;
  good.page_size = 4;
  good.pages.push_back(std::vector<std::int32_t>{7, 1});
  good.pages.push_back(std::vector<std::int32_t>{4});
  good.lengths = {5, 3};
  kvsift::index_sets slots;
  slots.push_back(std::vector<std::int32_t>{0, 4});
  slots.push_back(std::vector<std::int32_t>{2});

  struct bad_case {
    std::string what;
    std::vector<std::int32_t> indptr, pages;
    std::string message;
  };
  const std::vector<bad_case> cases{
      // pages of entry 0 start at 1: entry 1 read past the page ids before
      {"indptr[0]", {1, 3, 4}, {0, 7, 1, 4}, "argument 'head_pages.indptr[0]' = 1, expected 0"},
      // decreasing: reported as a length mismatch before, now as the indptr entry it is
      {"decreasing", {0, 3, 2}, {7, 1, 4}, "argument 'head_pages.indptr[2]' = 2, expected >= "
                                           "head_pages.indptr[1] (3)"},
  };
  for_each_policy([&](const auto& exec, const std::string& name) {
    for (const auto& c : cases) {
      CAPTURE(name, c.what);
      kvsift::thrust::device_head_pages<dvec> dhp{dvec(c.indptr.begin(), c.indptr.end()),
                                                  dvec(c.pages.begin(), c.pages.end()),
                                                  dvec(good.lengths.begin(), good.lengths.end()),
                                                  good.page_size, dvec(), dvec(), dvec()};
      const auto plan = kvsift::thrust::to_device<dvec>(slots);
      dvec indptr(3, -7), indices(3, -7), last(2, -7);
      const kvsift::thrust::flashinfer_view out{::thrust::raw_pointer_cast(indptr.data()),
                                                ::thrust::raw_pointer_cast(indices.data()),
                                                ::thrust::raw_pointer_cast(last.data())};
      // tokens form
      const auto run = [&] {
        kvsift::thrust::flashinfer_tokens(exec, dhp.view(), plan.view(), plan.size(), out);
      };
      REQUIRE_THROWS_AS(run(), kvsift::error);
      REQUIRE_THROWS_WITH(run(), ContainsSubstring("thrust::flashinfer_tokens") &&
                                     ContainsSubstring(c.message));
      // pages form: entry 0 keeps its page 1, entry 1 its page 0
      kvsift::index_sets pg;
      pg.push_back(std::vector<std::int32_t>{1});
      pg.push_back(std::vector<std::int32_t>{0});
      const auto dpg = kvsift::thrust::to_device<dvec>(pg);
      REQUIRE_THROWS_WITH(
          kvsift::thrust::flashinfer_pages(exec, dhp.view(), dpg.view(), dpg.size(), 4, out),
          ContainsSubstring("thrust::flashinfer_pages") && ContainsSubstring(c.message));
      REQUIRE(untouched(indptr));
      REQUIRE(untouched(indices));
      REQUIRE(untouched(last));
    }
    // the well-formed table exports
    const auto dhp = kvsift::thrust::to_device<dvec>(good);
    const auto t = kvsift::thrust::to_host(
        kvsift::thrust::flashinfer_tokens(exec, dhp, kvsift::thrust::to_device<dvec>(slots)));
    REQUIRE(t.indices == std::vector<std::int32_t>{28, 4, 18});
  });
}
