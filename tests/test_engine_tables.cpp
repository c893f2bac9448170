// SPDX-License-Identifier: Apache-2.0
// The other engines' index formats of one plan (store/engine_tables.hpp): TensorRT-LLM's block
// tables, SGLang's -1-padded page lists and ggml's mask with its n_kv_max bound. Each is checked
// the way an engine would use it: attention computed by a kernel that reads only the format and
// the pool (written here, in double) equals the library's attention over the plan, on a ragged
// paged store whose rows a retain reordered, in the tokens form and the pages form.

#include <kvsift/attention/reference.hpp>
#include <kvsift/store/engine_tables.hpp>
#include <kvsift/store/flashinfer.hpp>
#include <kvsift/store/paged.hpp>

#include "engine_rows.hpp"

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

using kvsift::bfloat16;
constexpr kvsift::model_shape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
constexpr int kPage = 4;

// out [G, d] for query heads q [G, d] over the pool rows `rows` (softmax in double).
template <class T>
void attend_rows(const kvsift::store::paged<T>& st, const float* q, int G,
                 const std::vector<std::int64_t>& rows, float* out) {
  const int d = kShape.head_dim;
  for (int g = 0; g < G; ++g) {
    std::vector<double> logit(rows.size());
    double top = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const T* k = st.key_pool() + rows[i] * d;
      double s = 0;
      for (int c = 0; c < d; ++c) s += static_cast<double>(q[g * d + c]) * kvsift::to_float(k[c]);
      logit[i] = s / std::sqrt(static_cast<double>(d));
      top = std::max(top, logit[i]);
    }
    double sum = 0;
    for (double& x : logit) sum += (x = std::exp(x - top));
    for (int c = 0; c < d; ++c) {
      double o = 0;
      for (std::size_t i = 0; i < rows.size(); ++i) {
        o += logit[i] / sum * kvsift::to_float(st.value_pool()[rows[i] * d + c]);
      }
      out[g * d + c] = rows.empty() ? 0.0f : static_cast<float>(o);
    }
  }
}

using kvsift_test::rows_of;

std::vector<std::int32_t> subset(std::mt19937& rng, int n, double keep) {
  std::bernoulli_distribution take(keep);
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i) {
    if (take(rng)) out.push_back(i);
  }
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("engine tables: attention over each format equals the library's over the plan",
                   "[engine_tables][flashinfer]", float, bfloat16) {
  using T = TestType;
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  CAPTURE(seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int requests = 3;
  kvsift::store::paged<T> st(kShape, requests, kPage, 64);
  const int d = kShape.head_dim;
  const int layer = 1;
  // ragged prompts, then retains that free pages and reorder rows in some head-sequences
  for (int r = 0; r < requests; ++r) {
    const int n = 5 + 9 * r + static_cast<int>(seed);
    std::vector<T> k(static_cast<std::size_t>(n) * kShape.kv_heads * d), v(k.size());
    for (auto& x : k) x = kvsift::from_float<T>(nd(rng));
    for (auto& x : v) x = kvsift::from_float<T>(nd(rng));
    using view = kvsift::kv_view<const T, kvsift::nhd>;
    st.append(r, layer, view::contiguous(k.data(), n, kShape.kv_heads, d),
              view::contiguous(v.data(), n, kShape.kv_heads, d), 0);
    if (r > 0) {
      kvsift::index_sets kept;
      for (int h = 0; h < kShape.kv_heads; ++h) {
        auto s = subset(rng, n, 0.8);
        if (s.empty()) s.push_back(0);
        kept.push_back(s);
      }
      st.retain(r, layer, kept);
    }
  }
  const std::vector<int> batch{2, 0, 1};
  std::vector<float> q(batch.size() * kShape.q_heads * d);
  for (auto& x : q) x = nd(rng);
  const int G = kShape.group_size();
  const std::int64_t pool_rows = static_cast<std::int64_t>(64) * kPage;

  // the library's attention over a slot plan, and each format's over the same table
  const auto check = [&](const std::vector<int>& reqs, const kvsift::index_sets& slots,
                         const kvsift::flashinfer_table& t) {
    std::vector<float> want(q.size());
    kvsift::attention::attend_plan_batch(
        st, layer, reqs.size(), [&](std::size_t i) { return reqs[i]; },
        [&](std::size_t i) { return q.data() + i * kShape.q_heads * d; }, slots, want.data());
    const auto bt = kvsift::block_tables(t);
    const auto pp = kvsift::padded_pages(t);
    const auto mk = kvsift::kv_mask_of(t, pool_rows);
    const auto mk_trim = kvsift::kv_mask_of(t, pool_rows, true);
    REQUIRE(mk_trim.n_kv == mk.n_kv_max);
    for (int s = 0; s < t.entries(); ++s) {
      CAPTURE(s);
      REQUIRE(bt.seq_lens[static_cast<std::size_t>(s)] == slots.size(s));
      const int blocks = t.indptr[s + 1] - t.indptr[s];
      for (int i = blocks; i < pp.max_blocks; ++i) REQUIRE(pp.row(s)[i] == -1);
      for (int i = blocks; i < bt.max_blocks; ++i) REQUIRE(bt.row(s)[i] == 0);
      const std::size_t i = static_cast<std::size_t>(s / kShape.kv_heads);
      const int h = s % kShape.kv_heads;
      const float* qs = q.data() + i * kShape.q_heads * d + static_cast<std::size_t>(h) * G * d;
      const float* w = want.data() + i * kShape.q_heads * d + static_cast<std::size_t>(h) * G * d;
      for (const auto& rows : {rows_of(bt, s, false), rows_of(pp, s, true), rows_of(mk, s), rows_of(mk_trim, s)}) {
        REQUIRE(static_cast<int>(rows.size()) == slots.size(s));
        std::vector<float> got(static_cast<std::size_t>(G) * d);
        attend_rows(st, qs, G, rows, got.data());
        for (int c = 0; c < G * d; ++c) {
          CAPTURE(c);
          REQUIRE(std::abs(got[c] - w[c]) <= 2e-5f * std::max(1.0f, std::abs(w[c])));
        }
      }
    }
  };

  SECTION("tokens form: any slots") {
    kvsift::index_sets slots;
    for (const int r : batch) {
      for (int h = 0; h < kShape.kv_heads; ++h) slots.push_back(subset(rng, st.length(r, layer, h), 0.5));
    }
    check(batch, slots, kvsift::flashinfer_tokens(st, layer, batch, slots));
  }
  SECTION("pages form: whole pages of the head-sequences whose rows are in order") {
    std::vector<int> ordered;
    for (const int r : batch) {
      bool in_order = true;
      for (int h = 0; h < kShape.kv_heads; ++h) {
        in_order = in_order && st.rows_in_slot_order(kShape.sequence(r, layer, h));
      }
      if (in_order) ordered.push_back(r);
    }
    REQUIRE_FALSE(ordered.empty());  // request 0 is never retained
    kvsift::index_sets pages, slots;
    for (const int r : ordered) {
      for (int h = 0; h < kShape.kv_heads; ++h) {
        const int n = st.length(r, layer, h);
        auto p = subset(rng, (n + kPage - 1) / kPage, 0.6);
        std::vector<std::int32_t> s;
        for (const int page : p) {
          for (int o = 0; o < kPage && page * kPage + o < n; ++o) s.push_back(page * kPage + o);
        }
        pages.push_back(p);
        slots.push_back(s);
      }
    }
    check(ordered, slots, kvsift::flashinfer_pages(st, layer, ordered, pages, kPage));
  }
}

TEST_CASE("engine tables: bad tables and pools are refused with the argument named",
          "[engine_tables][bad_input]") {
  using Catch::Matchers::ContainsSubstring;
  kvsift::flashinfer_table t;
  t.page_size = 4;
  t.indptr = {0, 2, 3};
  t.indices = {5, 1, 7};
  t.last_page_len = {3, 4};
  const auto b = kvsift::block_tables(t);
  REQUIRE(b.max_blocks == 2);
  REQUIRE(b.seq_lens == std::vector<std::int32_t>{7, 4});
  REQUIRE(b.blocks == std::vector<std::int32_t>{5, 1, 7, 0});
  const auto m = kvsift::kv_mask_of(t, 32, true);
  REQUIRE(m.n_kv_max == 32);  // page 7's rows 28..31
  REQUIRE_THROWS_WITH(kvsift::kv_mask_of(t, 31),
                      ContainsSubstring("'table.indices[2]' = 7") && ContainsSubstring("inside the pool"));
  auto bad = t;
  bad.last_page_len[0] = 5;
  REQUIRE_THROWS_WITH(kvsift::block_tables(bad), ContainsSubstring("'table.last_page_len[0]' = 5"));
  bad = t;
  bad.indptr = {0, 3, 2};
  REQUIRE_THROWS_WITH(kvsift::padded_pages(bad), ContainsSubstring("'table.indptr[2]'"));
  bad = t;
  bad.indices[1] = -3;
  REQUIRE_THROWS_WITH(kvsift::kv_mask_of(bad, 64), ContainsSubstring("'table.indices[1]' = -3"));
}
