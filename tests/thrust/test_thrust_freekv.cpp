// SPDX-License-Identifier: Apache-2.0
// Thrust FreeKV page scores (thrust/freekv_pages.hpp) against score::freekv_pages and
// select::freekv_pages, under the compiled device system (CPP or OMP) and thrust::cpp::par.

#include <kvsift/score/freekv_pages.hpp>
#include <kvsift/select/freekv_pages.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/thrust/all.hpp>
#include <kvsift/thrust/freekv_pages.hpp>

#include <thrust/execution_policy.h>
#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

template <class F>
void for_each_policy(F&& f) {
  f(::thrust::device, std::string("device(" KVSIFT_THRUST_SYSTEM_NAME ")"));
  f(::thrust::cpp::par, std::string("cpp::par"));
}

}  // namespace

TEMPLATE_TEST_CASE("thrust freekv_group_scores matches score::freekv_pages and its selection",
                   "[thrust][freekv]", float, kvsift::half, kvsift::bfloat16) {
  const int page_size = GENERATE(4, 16);
  const int group = GENERATE(1, 4);
  const auto merge = GENERATE(kvsift::score::freekv_merge::softmax_mean,
                              kvsift::score::freekv_merge::mean, kvsift::score::freekv_merge::max);
  const bool quantise = GENERATE(false, true);
  CAPTURE(kvsift::element_name<TestType>, page_size, group, static_cast<int>(merge), quantise);
  const int kv_heads = 2;
  const int d = 8;
  const int sink = page_size;
  const int window = 2 * page_size;
  const kvsift::model_shape sh{1, kv_heads * group, kv_heads, d};
  // ragged: one request with no candidates, one with a partial last page, one long
  const std::vector<int> lens{2 * page_size + 1, 9 * page_size + 3, 20 * page_size};
  const int R = static_cast<int>(lens.size());
  const int S = R * kv_heads;
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto draw = [&] {
    const float x = nd(rng);
    return quantise ? std::round(x * 2.0f) / 2.0f : x;
  };
  kvsift::store::dense<TestType> store(sh, R, *std::max_element(lens.begin(), lens.end()));
  std::vector<TestType> packed;  // [tokens of every segment, d], segment-major
  std::vector<std::int32_t> offsets{0};
  for (int r = 0; r < R; ++r) {
    const int n = lens[r];
    std::vector<TestType> k(static_cast<std::size_t>(n) * kv_heads * d);
    for (auto& x : k) x = kvsift::from_float<TestType>(draw());
    using view = kvsift::kv_view<const TestType, kvsift::nhd>;
    store.append(r, 0, view::contiguous(k.data(), n, kv_heads, d), view::contiguous(k.data(), n, kv_heads, d), 0);
    for (int h = 0; h < kv_heads; ++h) {
      for (int t = 0; t < n; ++t) {
        const auto* row = k.data() + (static_cast<std::size_t>(t) * kv_heads + h) * d;
        packed.insert(packed.end(), row, row + d);
      }
      offsets.push_back(offsets.back() + n);
    }
  }
  std::vector<float> qdata(static_cast<std::size_t>(R) * sh.q_heads * d);
  for (auto& x : qdata) x = quantise ? std::round(nd(rng)) : nd(rng);
  std::vector<kvsift::kv_view<const float, kvsift::nhd>> qviews;
  std::vector<std::int32_t> qpos;
  std::vector<int> ids;
  for (int r = 0; r < R; ++r) {
    qviews.push_back(kvsift::kv_view<const float, kvsift::nhd>::contiguous(
        qdata.data() + static_cast<std::size_t>(r) * sh.q_heads * d, 1, sh.q_heads, d));
    qpos.push_back(lens[r] - 1);
    ids.push_back(r);
  }
  kvsift::score_input<kvsift::store::dense<TestType>> in;
  in.store = &store;
  in.requests = ids;
  in.queries = qviews;
  in.query_position = qpos;
  const kvsift::score::freekv_pages scorer{{.page_size = page_size, .sink = sink, .window = window, .merge = merge}};
  kvsift::score_sets want;
  scorer.score(in, want);
  const kvsift::select::freekv_pages sel{{.page_size = page_size, .sink = sink, .window = window}};
  const int budget = 5 * page_size;
  const std::vector<int> budgets(static_cast<std::size_t>(S), budget);
  kvsift::index_sets want_kept;
  sel.select(want, budgets, want_kept);

  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::vector<std::int32_t> poff(static_cast<std::size_t>(S) + 1);
    kvsift::thrust::page_offsets(exec, offsets.data(), S, page_size, poff.data());
    REQUIRE(poff == want.offsets);
    const std::int64_t pages = poff.back();
    std::vector<float> kmin(static_cast<std::size_t>(pages) * d), kmax(kmin.size());
    const kvsift::thrust::segmented_rows<TestType> rows{packed.data(), offsets.data(), nullptr, 0, S, d};
    kvsift::thrust::page_digest(exec, rows, poff.data(), pages, page_size, kmin.data(), kmax.data());
    std::vector<float> got(static_cast<std::size_t>(pages), -1.0f);
    std::vector<std::byte> ws(kvsift::thrust::freekv_workspace_bytes(S, group));
    kvsift::thrust::freekv_group_scores(exec, qdata.data(), kv_heads, group, d, kmin.data(),
                                        kmax.data(), poff.data(), S, pages, page_size, sink,
                                        window, merge, got.data(), ws.data(), ws.size());
    // the same operations in the same order: bit-equal scores
    REQUIRE(got == want.values);
    // the selection: sink and window protected, top B/p - S/p - W/p candidates (ties to the lower
    // page), every page when they fit
    std::vector<std::int32_t> b32(static_cast<std::size_t>(S), budget / page_size);
    std::vector<std::int32_t> win(static_cast<std::size_t>(S), window / page_size);
    kvsift::index_sets kept;
    kept.offsets.assign(static_cast<std::size_t>(S) + 1, 0);
    kvsift::thrust::kept_offsets(exec, poff.data(), b32.data(), S, kept.offsets.data());
    kept.values.assign(static_cast<std::size_t>(kept.offsets.back()), -1);
    std::vector<std::byte> tws(kvsift::thrust::segmented_topk_workspace_bytes(pages));
    kvsift::thrust::segmented_topk(exec, got.data(), poff.data(), S, pages, kept.offsets.data(),
                                   kept.offsets.back(), kept.values.data(), tws.data(), tws.size(),
                                   {sink / page_size, win.data()});
    REQUIRE(kept.offsets == want_kept.offsets);
    REQUIRE(kept.values == want_kept.values);
  });
}

TEST_CASE("thrust freekv_group_scores rejects a short workspace and non-page sink", "[thrust][freekv]") {
  std::vector<std::int32_t> poff{0, 4};
  std::vector<float> kmin(4 * 2, 0.0f), kmax(kmin), q(2, 1.0f), out(4);
  std::vector<std::byte> ws(kvsift::thrust::freekv_workspace_bytes(1, 1));
  REQUIRE_THROWS_AS(kvsift::thrust::freekv_group_scores(
                        ::thrust::cpp::par, q.data(), 1, 1, 2, kmin.data(), kmax.data(), poff.data(), 1,
                        4, 4, 4, 4, kvsift::score::freekv_merge::softmax_mean, out.data(), ws.data(), 0),
                    kvsift::error);
  REQUIRE_THROWS_AS(kvsift::thrust::freekv_group_scores(
                        ::thrust::cpp::par, q.data(), 1, 1, 2, kmin.data(), kmax.data(), poff.data(), 1,
                        4, 4, 3, 4, kvsift::score::freekv_merge::softmax_mean, out.data(), ws.data(),
                        ws.size()),
                    kvsift::error);
}
