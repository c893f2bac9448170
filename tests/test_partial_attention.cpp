// SPDX-License-Identifier: Apache-2.0
// Partial attention with its log-sum-exp (cpu::attend_group_at's `lse`) and the merge of two
// partials (attention/merge.hpp), alone: on every CPU path (portable, AVX2, AVX-512, amx where the
// CPU has them), a head's rows split into two disjoint subsets, each attended alone and merged,
// equal the attention over all of them within 2e-5 relative; the lse equals a float64
// log-sum-exp; an empty subset contributes nothing.

#include <kvsift/attention/merge.hpp>
#include <kvsift/cpu/decode_attention.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

std::vector<kvsift::cpu::simd> paths() {
  std::vector<kvsift::cpu::simd> out{kvsift::cpu::simd::portable};
  for (const auto s : {kvsift::cpu::simd::avx2, kvsift::cpu::simd::avx512, kvsift::cpu::simd::amx}) {
    if (kvsift::cpu::detected_simd() >= s) out.push_back(s);
  }
  return out;
}

// The path forced for a scope.
struct forced_simd {
  explicit forced_simd(kvsift::cpu::simd s) { kvsift::cpu::force_simd(s); }
  ~forced_simd() { kvsift::cpu::unforce_simd(); }
  forced_simd(const forced_simd&) = delete;
  forced_simd& operator=(const forced_simd&) = delete;
};

}  // namespace

TEMPLATE_TEST_CASE("partial attention: two disjoint parts merged equal the whole",
                   "[attention][partial]", float, kvsift::bfloat16) {
  using T = TestType;
  const int d = GENERATE(16, 64, 128);
  const int G = GENERATE(1, 4);
  const std::size_t m = GENERATE(std::size_t{1}, std::size_t{37}, std::size_t{300});
  const double split = GENERATE(0.0, 0.3, 1.0);  // share of rows in part A
  CAPTURE(d, G, m, split);
  std::mt19937 rng(static_cast<unsigned>(d * 1000 + G * 100 + m));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<T> keys(m * d), values(m * d);
  for (auto& x : keys) x = kvsift::from_float<T>(2.0f * nd(rng));
  for (auto& x : values) x = kvsift::from_float<T>(nd(rng));
  std::vector<float> q(static_cast<std::size_t>(G) * d);
  for (auto& x : q) x = nd(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<const T*> kall, vall, ka, va, kb, vb;
  std::bernoulli_distribution in_a(split);
  for (std::size_t j = 0; j < m; ++j) {
    kall.push_back(keys.data() + j * d);
    vall.push_back(values.data() + j * d);
    auto& k = in_a(rng) ? ka : kb;
    auto& v = &k == &ka ? va : vb;
    k.push_back(keys.data() + j * d);
    v.push_back(values.data() + j * d);
  }
  // float64 log-sum-exp of each head's scaled logits over a subset
  const auto lse64 = [&](const std::vector<const T*>& rows, int g) {
    if (rows.empty()) return -std::numeric_limits<double>::infinity();
    std::vector<double> x;
    for (const T* k : rows) {
      double s = 0;
      for (int c = 0; c < d; ++c) s += static_cast<double>(q[g * d + c]) * kvsift::to_float(k[c]);
      x.push_back(s * scale);
    }
    const double top = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (const double v : x) sum += std::exp(v - top);
    return top + std::log(sum);
  };
  for (const auto path : paths()) {
    CAPTURE(static_cast<int>(path));
    const forced_simd forced(path);
    std::vector<float> logits, whole(G * d), oa(G * d), ob(G * d), merged(G * d);
    std::vector<float> lw(G), la(G), lb(G), lm(G);
    kvsift::cpu::attend_group_at<T>(q.data(), G, d, m, kall.data(), vall.data(), whole.data(), scale,
                                    logits, lw.data());
    kvsift::cpu::attend_group_at<T>(q.data(), G, d, ka.size(), ka.data(), va.data(), oa.data(), scale,
                                    logits, la.data());
    kvsift::cpu::attend_group_at<T>(q.data(), G, d, kb.size(), kb.data(), vb.data(), ob.data(), scale,
                                    logits, lb.data());
    kvsift::attention::merge_partials(G, d, oa.data(), la.data(), ob.data(), lb.data(), merged.data(),
                                      lm.data());
    for (int g = 0; g < G; ++g) {
      CAPTURE(g);
      REQUIRE(std::abs(lw[g] - lse64(kall, g)) <= 1e-5 * std::max(1.0, std::abs(lse64(kall, g))));
      if (ka.empty()) {
        REQUIRE(la[g] == -std::numeric_limits<float>::infinity());
      } else {
        REQUIRE(std::abs(la[g] - lse64(ka, g)) <= 1e-5 * std::max(1.0, std::abs(lse64(ka, g))));
      }
      REQUIRE(std::abs(lm[g] - lw[g]) <= 1e-5f * std::max(1.0f, std::abs(lw[g])));
      for (int c = 0; c < d; ++c) {
        const float w = whole[g * d + c];
        REQUIRE(std::abs(merged[g * d + c] - w) <= 2e-5f * std::max(1.0f, std::abs(w)));
      }
    }
    // in place, with the other side empty: the partial itself
    std::vector<float> empty_lse(G, -std::numeric_limits<float>::infinity());
    std::vector<float> garbage(G * d, std::numeric_limits<float>::quiet_NaN());
    std::vector<float> same = whole;
    kvsift::attention::merge_partials(G, d, same.data(), lw.data(), garbage.data(), empty_lse.data(),
                                      same.data());
    REQUIRE(same == whole);
  }
}

// A partial that finite inputs cannot give (NaN or +inf lse, a non-finite output of a non-empty
// part) is an error naming the side, head and value, raised before anything is written.
TEST_CASE("partial attention: a poisoned partial is refused before the merge writes", "[attention][partial][bad_input]") {
  const int G = 2, d = 4;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> good_out(G * d, 0.5f), good_lse{1.0f, 2.0f};
  struct bad_case {
    const char* arg;
    std::vector<float> out_a, lse_a, out_b, lse_b;
  };
  std::vector<bad_case> cases;
  cases.push_back({"lse_a[1]", good_out, {1.0f, nan}, good_out, good_lse});
  cases.push_back({"lse_b[0]", good_out, good_lse, good_out, {inf, 2.0f}});
  auto poisoned = good_out;
  poisoned[1 * d + 3] = nan;
  cases.push_back({"out_a[1 * d + 3]", poisoned, good_lse, good_out, good_lse});
  poisoned = good_out;
  poisoned[2] = -inf;
  cases.push_back({"out_b[0 * d + 2]", good_out, good_lse, poisoned, good_lse});
  for (const auto& c : cases) {
    CAPTURE(c.arg);
    std::vector<float> out(G * d, 7.0f), lse(G, 7.0f);
    try {
      kvsift::attention::merge_partials(G, d, c.out_a.data(), c.lse_a.data(), c.out_b.data(),
                                        c.lse_b.data(), out.data(), lse.data());
      FAIL("no error");
    } catch (const kvsift::error& e) {
      CHECK(std::string(e.what()).find(std::string("'") + c.arg + "'") != std::string::npos);
    }
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
    CHECK(std::all_of(lse.begin(), lse.end(), [](float x) { return x == 7.0f; }));
  }
  // -inf in one part's lse is an empty part, whatever its output holds
  const std::vector<float> empty_lse{-inf, -inf}, garbage(G * d, nan);
  std::vector<float> out(G * d), lse(G);
  kvsift::attention::merge_partials(G, d, good_out.data(), good_lse.data(), garbage.data(),
                                    empty_lse.data(), out.data(), lse.data());
  CHECK(out == good_out);
  CHECK(lse == good_lse);
}
