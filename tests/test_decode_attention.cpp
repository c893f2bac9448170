// SPDX-License-Identifier: Apache-2.0
// Decode attention of one GQA group (cpu/decode_attention.hpp): the portable path and the AVX2 and
// AVX-512 paths (where this CPU has them) against a double-precision reference, and against each
// other; attend_plan over a store gives the same output on every path. Shapes cover the kernels'
// blocking: G from 1 to 12 (chunks of 8 or 4 heads, tiles of 1-4 heads), head_dim multiples of
// 16, of 8 only (AVX-512 falls to AVX2) and of neither (portable fallback), row counts around
// the lane and prefetch boundaries and across the AVX2 path's 2048-row chunks.

#include <kvsift/attention/reference.hpp>
#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/store/dense.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

namespace {

using kvsift::bfloat16;
using kvsift::half;
namespace cpu = kvsift::cpu;

using pin = cpu::scoped_simd;

template <class T>
struct group_case {
  int G, d;
  std::size_t m;
  std::vector<float> q;
  std::vector<T> k, v;
  std::vector<std::size_t> order;  // row j reads stored row order[j]: scattered rows

  group_case(int G_, int d_, std::size_t m_, unsigned seed) : G(G_), d(d_), m(m_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    q.resize(static_cast<std::size_t>(G) * d);
    for (float& x : q) x = nd(rng);
    const std::size_t rows = m + 7;
    k.resize(rows * d);
    v.resize(rows * d);
    for (auto& x : k) x = kvsift::from_float<T>(2.0f * nd(rng));  // peaked softmax too
    for (auto& x : v) x = kvsift::from_float<T>(nd(rng));
    order.resize(m);
    // m distinct rows of the m + 7 stored, in ascending order with gaps (a kept set)
    for (std::size_t j = 0; j < m; ++j) order[j] = j + (j * 7) / (m + 1);
  }

  std::vector<float> run() const {
    std::vector<float> out(static_cast<std::size_t>(G) * d, -1.0f), logits;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    cpu::attend_group<T>(
        q.data(), G, d, m, [&](std::size_t j) { return k.data() + order[j] * d; },
        [&](std::size_t j) { return v.data() + order[j] * d; }, out.data(), scale, logits);
    return out;
  }

  std::vector<double> reference() const {
    std::vector<double> out(static_cast<std::size_t>(G) * d, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    for (int g = 0; g < G; ++g) {
      std::vector<double> w(m);
      double mx = -1e300;
      for (std::size_t j = 0; j < m; ++j) {
        double s = 0.0;
        for (int c = 0; c < d; ++c) {
          s += static_cast<double>(q[g * d + c]) * kvsift::to_float(k[order[j] * d + c]);
        }
        w[j] = s * scale;
        mx = std::max(mx, w[j]);
      }
      double sum = 0.0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (std::size_t j = 0; j < m; ++j) {
        for (int c = 0; c < d; ++c) {
          out[g * d + c] += w[j] / sum * kvsift::to_float(v[order[j] * d + c]);
        }
      }
    }
    return out;
  }
};

// |a - b| <= tol * (1 + |b|) for every element
template <class A, class B>
void require_close(const A& a, const B& b, double tol, const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (!(std::fabs(x - y) <= tol * (1.0 + std::fabs(y)))) {
      FAIL(what << ": element " << i << " = " << x << ", expected " << y);
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("decode attention of a GQA group: the portable path matches a double reference",
                   "[decode_attention]", float, half, bfloat16) {
  const int G = GENERATE(1, 2, 3, 4, 5, 8, 12);
  const int d = GENERATE(16, 40, 64, 80, 128, 256);
  const std::size_t m = GENERATE(std::size_t{1}, std::size_t{5}, std::size_t{16}, std::size_t{17},
                                 std::size_t{100}, std::size_t{1000});
  const group_case<TestType> c(G, d, m, static_cast<unsigned>(G * 1000 + d * 10 + m));
  const std::string where = "G=" + std::to_string(G) + " d=" + std::to_string(d) +
                            " m=" + std::to_string(m);
  const pin p(cpu::simd::portable);
  REQUIRE(cpu::active_simd() == cpu::simd::portable);
  require_close(c.run(), c.reference(), 2e-5, "portable " + where);
}

// A vector path against the double reference and the portable path, over the kernels' blocking.
// Reported as skipped (not passed) on a CPU without that path.
template <class T>
void check_vector_path(cpu::simd level) {
  if (cpu::detected_simd() < level) {
    SKIP("this CPU has no " << cpu::simd_name(level) << " (that path cannot run here)");
  }
  const int G = GENERATE(1, 2, 3, 4, 5, 8, 12);
  const int d = GENERATE(8, 12, 16, 20, 40, 64, 80, 128, 256);  // 12, 20: not multiples of 8
  // 2049, 4099, 4500: several chunks of the AVX2 path's online softmax (a last chunk of one row,
  // of three, of 404)
  const std::size_t m = GENERATE(std::size_t{1}, std::size_t{5}, std::size_t{16}, std::size_t{17},
                                 std::size_t{100}, std::size_t{1000}, std::size_t{2049},
                                 std::size_t{4099}, std::size_t{4500});
  const group_case<T> c(G, d, m, static_cast<unsigned>(G * 1000 + d * 10 + m));
  const std::string where = std::string(cpu::simd_name(level)) + " G=" + std::to_string(G) +
                            " d=" + std::to_string(d) + " m=" + std::to_string(m);
  const auto ref = c.reference();
  std::vector<float> portable;
  {
    const pin p(cpu::simd::portable);
    portable = c.run();
  }
  const pin p(level);
  REQUIRE(cpu::active_simd() == level);
  const auto fast = c.run();
  require_close(fast, ref, 2e-5, where);
  require_close(fast, portable, 2e-5, "vs portable " + where);
}

TEMPLATE_TEST_CASE("decode attention of a GQA group: the avx2 path matches a double reference "
                   "and the portable path",
                   "[decode_attention][avx2]", float, half, bfloat16) {
  check_vector_path<TestType>(cpu::simd::avx2);
}

TEMPLATE_TEST_CASE("decode attention of a GQA group: the avx512 path matches a double reference "
                   "and the portable path",
                   "[decode_attention][avx512]", float, half, bfloat16) {
  check_vector_path<TestType>(cpu::simd::avx512);
}

TEST_CASE("decode attention over no rows writes zeros", "[decode_attention]") {
  for (const cpu::simd s : {cpu::simd::portable, cpu::detected_simd()}) {
    const pin p(s);
    std::vector<float> q(4 * 64, 1.0f), out(4 * 64, 7.0f), logits;
    const float* none = nullptr;
    cpu::attend_group<float>(q.data(), 4, 64, 0, [&](std::size_t) { return none; },
                             [&](std::size_t) { return none; }, out.data(), 0.125f, logits);
    REQUIRE(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
  }
}

TEST_CASE("pinning the path: scoped pins nest and restore, force/unforce, never above detected",
          "[decode_attention]") {
  const cpu::simd before = cpu::active_simd();  // KVSIFT_SIMD=portable in the environment pins
  {
    const pin outer(cpu::simd::portable);
    REQUIRE(cpu::active_simd() == cpu::simd::portable);
    {
      const pin inner(cpu::simd::avx512);  // a level the CPU may lack: never more than detected
      REQUIRE(cpu::active_simd() == cpu::detected_simd());
      const pin middle(cpu::simd::avx2);
      REQUIRE(cpu::active_simd() == std::min(cpu::simd::avx2, cpu::detected_simd()));
    }
    REQUIRE(cpu::active_simd() == cpu::simd::portable);
  }
  REQUIRE(cpu::active_simd() == before);
  {
    const pin keep(before);  // restores the environment's pin after the force/unforce below
    cpu::force_simd(cpu::simd::portable);
    REQUIRE(cpu::active_simd() == cpu::simd::portable);
    cpu::unforce_simd();
    REQUIRE(cpu::active_simd() == cpu::detected_simd());
  }
  REQUIRE(cpu::active_simd() == before);
}

TEMPLATE_TEST_CASE("attend_plan gives the same output on both paths, ragged plan", "[decode_attention]",
                   float, bfloat16) {
  const kvsift::model_shape shape{.layers = 1, .q_heads = 8, .kv_heads = 2, .head_dim = 64};
  kvsift::store::dense<TestType> store(shape, 1, 600);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n = 500;
  std::vector<TestType> k(static_cast<std::size_t>(n) * 2 * 64), v(k.size());
  for (auto& x : k) x = kvsift::from_float<TestType>(nd(rng));
  for (auto& x : v) x = kvsift::from_float<TestType>(nd(rng));
  store.append(0, 0, kvsift::kv_view<const TestType, kvsift::nhd>::contiguous(k.data(), n, 2, 64),
               kvsift::kv_view<const TestType, kvsift::nhd>::contiguous(v.data(), n, 2, 64), 0);
  std::vector<std::vector<std::int32_t>> sets(2);
  for (int i = 0; i < n; i += 3) sets[0].push_back(i);  // head 0: every third row
  for (int i = 100; i < 117; ++i) sets[1].push_back(i);  // head 1: 17 rows
  kvsift::index_sets plan;
  for (const auto& set : sets) plan.push_back(set);
  std::vector<float> q(8 * 64);
  for (float& x : q) x = nd(rng);
  std::vector<float> a(q.size()), b(q.size());
  {
    const pin p(cpu::simd::portable);
    kvsift::attention::attend_plan(store, 0, 0, q.data(), plan, a.data());
  }
  for (const cpu::simd level : {cpu::simd::avx2, cpu::simd::avx512}) {  // each vector path here
    if (level > cpu::detected_simd()) continue;
    const pin p(level);
    std::vector<float> c(q.size());
    kvsift::attention::attend_plan(store, 0, 0, q.data(), plan, c.data());
    require_close(c, a, 2e-5, "attend_plan " + std::string(cpu::simd_name(level)));
  }
  {
    const pin p(cpu::detected_simd());
    kvsift::attention::attend_plan(store, 0, 0, q.data(), plan, b.data());
  }
  require_close(b, a, 2e-5, "attend_plan");
  // and each group against attend_row, the one-query reference
  for (int h = 0; h < 8; ++h) {
    const int kv = h / 4;
    const auto seq = shape.sequence(0, 0, kv);
    const auto slots = plan[kv];
    std::vector<float> row(64);
    kvsift::attention::attend_row(
        q.data() + h * 64, 64, static_cast<int>(slots.size()),
        [&](int i) { return store.key(seq, slots[i]); },
        [&](int i) { return store.value(seq, slots[i]); }, row.data());
    require_close(std::vector<float>(b.begin() + h * 64, b.begin() + (h + 1) * 64), row, 2e-5,
                  "head " + std::to_string(h));
  }
}
