// SPDX-License-Identifier: Apache-2.0
// Decode attention of one GQA group (cpu/decode_attention.hpp): the portable path and the AVX2,
// AVX-512 and AMX paths (where this CPU has them) against a double-precision reference, and against each
// other; attend_plan over a store gives the same output on every path. Shapes cover the kernels'
// blocking: G from 1 to 12 (chunks of 8 or 4 heads, tiles of 1-4 heads), head_dim multiples of
// 16, of 8 only (AVX-512 falls to AVX2) and of neither (portable fallback), row counts around
// the lane and prefetch boundaries and across the vector paths' 2048-row chunks.

#include <kvsift/attention/reference.hpp>
#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/cpu/exact_softmax.hpp>
#include <kvsift/cpu/group_dots.hpp>
#include <kvsift/store/dense.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
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

// One shape on a vector path against the double reference and the portable path.
template <class T>
void check_shape(cpu::simd level, int G, int d, std::size_t m) {
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

// A vector path against the double reference and the portable path, over the kernels' blocking.
// Reported as skipped (not passed) on a CPU without that path.
template <class T>
void check_vector_path(cpu::simd level) {
  if (cpu::detected_simd() < level) {
    SKIP("this CPU has no " << cpu::simd_name(level) << " (that path cannot run here)");
  }
  const int G = GENERATE(1, 2, 3, 4, 5, 8, 12);
  const int d = GENERATE(8, 12, 16, 20, 40, 64, 80, 128, 256);  // 12, 20: not multiples of 8
  // 2049, 4099, 4500: several chunks of the vector paths' online softmax (a last chunk of one
  // row, of three, of 404)
  const std::size_t m = GENERATE(std::size_t{1}, std::size_t{5}, std::size_t{16}, std::size_t{17},
                                 std::size_t{100}, std::size_t{1000}, std::size_t{2049},
                                 std::size_t{4099}, std::size_t{4500});
  check_shape<T>(level, G, d, m);
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

// The amx path: bf16 keys on the tile unit (the other types run the avx512 kernels there).
TEMPLATE_TEST_CASE("decode attention of a GQA group: the amx path matches a double reference "
                   "and the portable path",
                   "[decode_attention][amx]", float, half, bfloat16) {
  check_vector_path<TestType>(cpu::simd::amx);
}

// The AVX-512 path reads bf16 rows with head_dim % 32 == 0 as even/odd channel pairs (the query
// and the output in slot order): every head count of a chunk (GC 1-8), head_dims whose channel
// tiles end in a tail of one pair (32, 96: a tile of 64 then 32; 160: 128 then 32), and every row
// count mod 4 (the logits' quads and their tail). f32 and f16 run the same shapes unpaired.
// On the amx path the same shapes cover its B tiles of 1-4 heads (G 5-8: a tile of four and one
// of the rest), one to five 32-channel chunks, and the rows past the last block of 16 (2, 3, 4,
// 18, 1001, 1002 rows: the AVX-512 logits take them).
TEMPLATE_TEST_CASE("decode attention of a GQA group: the avx512 path's tiles and tails, bf16 "
                   "channel pairs among them",
                   "[decode_attention][avx512]", float, half, bfloat16) {
  const cpu::simd level = GENERATE(cpu::simd::avx512, cpu::simd::amx);
  if (cpu::detected_simd() < level) SKIP("this CPU has no " << cpu::simd_name(level));
  const int G = GENERATE(1, 2, 3, 4, 5, 6, 7, 8);
  const int d = GENERATE(32, 96, 160);
  const std::size_t m = GENERATE(std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{18},
                                 std::size_t{1001}, std::size_t{1002});
  check_shape<TestType>(level, G, d, m);
}

#if KVSIFT_HAVE_X86_SIMD_PATH
// The amx key pass itself (amx_logits) against a double dot product: 1-4 heads, one to eight
// 32-channel chunks, rows the row stride apart and rows that are not (a block copied together
// first), the rows past the last block of 16 left to the caller. The three bf16 parts of the query
// carry a float's 24 bits: each logit within 1e-6 of sum |q_c k_c| x scale of the exact one.
TEST_CASE("amx key pass: 16 rows a tile product, each logit as close as a float sum",
          "[decode_attention][amx]") {
  if (cpu::detected_simd() < cpu::simd::amx) SKIP("this CPU has no amx");
  if (!cpu::amx_ready()) SKIP("the OS did not grant this process the AMX tile state");
  std::mt19937 rng(53);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const int d : {32, 64, 128, 256}) {
    for (const std::size_t n : {std::size_t{15}, std::size_t{16}, std::size_t{37}, std::size_t{300}}) {
      for (const bool strided : {true, false}) {
        std::vector<bfloat16> k((2 * n + 1) * static_cast<std::size_t>(d));
        for (auto& x : k) x = bfloat16(nd(rng));
        std::vector<const bfloat16*> rows(n);  // strided: row j at j; else every other row
        for (std::size_t j = 0; j < n; ++j) rows[j] = k.data() + (strided ? j : 2 * j + j % 3 / 2) * d;
        for (int G = 1; G <= 4; ++G) {
          std::vector<float> q(static_cast<std::size_t>(G) * d);
          for (float& x : q) x = nd(rng) * 0.3f;
          std::vector<std::uint16_t> tiles(static_cast<std::size_t>(d / 32) * 512);
          cpu::detail::avx512::amx_query_tiles(q.data(), G, d, tiles.data());
          const std::size_t ld = n + 5;
          std::vector<float> got(static_cast<std::size_t>(G) * ld, -7.0f);
          const float scale = 0.125f;
          auto key = [&](std::size_t j) { return rows[j]; };
          std::size_t done = 0;
          cpu::detail::with_heads<4>(G, [&]<int GC>() {
            done = cpu::detail::avx512::amx_logits<GC>(tiles.data(), d, n, n, key, scale, got.data(), ld);
          });
          REQUIRE(done == n / 16 * 16);
          for (int g = 0; g < G; ++g) {
            for (std::size_t j = 0; j < ld; ++j) {
              CAPTURE(d, n, strided, G, g, j);
              if (j >= done) {  // rows past the last block, and the columns beyond, untouched
                REQUIRE(got[g * ld + j] == -7.0f);
                continue;
              }
              double exact = 0.0, size = 0.0;
              for (int c = 0; c < d; ++c) {
                const double p = static_cast<double>(q[g * d + c]) * kvsift::to_float(rows[j][c]);
                exact += p;
                size += std::fabs(p);
              }
              REQUIRE(std::fabs(got[g * ld + j] - exact * scale) <= 1e-6 * size * scale + 1e-30);
            }
          }
        }
      }
    }
  }
}
#endif

// The vector paths' online softmax over 2048-row chunks: the group's largest logit planted in the
// first chunk (every later chunk keeps the running maximum: no rescale), in a middle one (one
// rescale, then none) or in the last (a rescale at the end), for every head (a key along the sum
// of the queries) or for one head only (head 0's key along its query: the heads' maxima move in
// different chunks). A rescale skipped or applied twice moves the output far outside 2e-5.
TEMPLATE_TEST_CASE("decode attention: the chunked softmax's running maximum wherever it peaks",
                   "[decode_attention]", float, bfloat16) {
  const std::size_t m = 5000;  // chunks of 2048, 2048, 904
  const std::size_t at = GENERATE(std::size_t{3}, std::size_t{2047}, std::size_t{2048},
                                  std::size_t{3000}, std::size_t{4999});
  const bool one_head = GENERATE(false, true);
  const int G = 4, d = 128;
  group_case<TestType> c(G, d, m, static_cast<unsigned>(at + one_head));
  std::vector<float> dir(d, 0.0f);
  for (int g = 0; g < (one_head ? 1 : G); ++g) {
    for (int i = 0; i < d; ++i) dir[i] += c.q[g * d + i];
  }
  float norm = 0.0f;
  for (const float x : dir) norm += x * x;
  for (int i = 0; i < d; ++i) {  // a logit ~4 x |q| above the rest: a peaked but finite softmax
    c.k[c.order[at] * d + i] = kvsift::from_float<TestType>(4.0f * dir[i] / std::sqrt(norm) * 6.0f);
  }
  const auto ref = c.reference();
  for (const cpu::simd s : {cpu::simd::avx2, cpu::simd::avx512, cpu::simd::amx}) {
    if (cpu::detected_simd() < s) continue;
    const pin p(s);
    require_close(c.run(), ref, 2e-5,
                  std::string(cpu::simd_name(s)) + " peak at row " + std::to_string(at) +
                      (one_head ? " (head 0)" : " (every head)"));
  }
}

// weighted_values_at (the values half alone, for weights computed elsewhere) against a double
// sum over the rows, on every path the CPU has: bf16 paired (d % 32 == 0) and not (d = 16, 80).
TEMPLATE_TEST_CASE("weighted_values_at matches a double weighted sum on every path",
                   "[decode_attention]", float, bfloat16) {
  const int G = GENERATE(1, 3, 4, 6, 7, 8, 12);
  const int d = GENERATE(16, 32, 80, 96, 128);
  const std::size_t m = GENERATE(std::size_t{1}, std::size_t{6}, std::size_t{37}, std::size_t{530});
  const group_case<TestType> c(G, d, m, static_cast<unsigned>(G * 977 + d * 13 + m));
  std::mt19937 rng(static_cast<unsigned>(G + d + m));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> w(static_cast<std::size_t>(G) * m);
  for (int g = 0; g < G; ++g) {  // a distribution per head, as the probabilities are
    float sum = 0.0f;
    for (std::size_t j = 0; j < m; ++j) sum += (w[g * m + j] = u(rng));
    for (std::size_t j = 0; j < m; ++j) w[g * m + j] /= sum;
  }
  std::vector<const TestType*> rows(m);
  for (std::size_t j = 0; j < m; ++j) rows[j] = c.v.data() + c.order[j] * d;
  std::vector<double> ref(static_cast<std::size_t>(G) * d, 0.0);
  for (int g = 0; g < G; ++g) {
    for (std::size_t j = 0; j < m; ++j) {
      for (int cc = 0; cc < d; ++cc) {
        ref[g * d + cc] += static_cast<double>(w[g * m + j]) * kvsift::to_float(rows[j][cc]);
      }
    }
  }
  for (const cpu::simd s : {cpu::simd::portable, cpu::simd::avx2, cpu::simd::avx512}) {
    if (cpu::detected_simd() < s) continue;
    const pin p(s);
    std::vector<float> out(static_cast<std::size_t>(G) * d, -1.0f);
    cpu::weighted_values_at<TestType>(w.data(), G, d, m, rows.data(), out.data());
    require_close(out, ref, 2e-5,
                  std::string(cpu::simd_name(s)) + " G=" + std::to_string(G) + " d=" +
                      std::to_string(d) + " m=" + std::to_string(m));
  }
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
      const pin inner(cpu::simd::amx);  // a level the CPU may lack: never more than detected
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
  for (const cpu::simd level : {cpu::simd::avx2, cpu::simd::avx512, cpu::simd::amx}) {  // each vector path here
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

TEMPLATE_TEST_CASE("attend_plan_batch equals attend_plan per token; a bad token rejects the batch",
                   "[decode_attention]", float, bfloat16) {
  // three requests of different lengths; the batch lists them out of order and one twice
  const kvsift::model_shape shape{.layers = 2, .q_heads = 6, .kv_heads = 3, .head_dim = 32};
  kvsift::store::dense<TestType> store(shape, 3, 400);
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int lens[3] = {300, 7, 129};
  for (int r = 0; r < 3; ++r) {
    for (int layer = 0; layer < 2; ++layer) {
      std::vector<TestType> k(static_cast<std::size_t>(lens[r]) * 3 * 32), v(k.size());
      for (auto& x : k) x = kvsift::from_float<TestType>(nd(rng));
      for (auto& x : v) x = kvsift::from_float<TestType>(nd(rng));
      using view = kvsift::kv_view<const TestType, kvsift::nhd>;
      store.append(r, layer, view::contiguous(k.data(), lens[r], 3, 32),
                   view::contiguous(v.data(), lens[r], 3, 32), 0);
    }
  }
  const std::vector<int> requests{2, 0, 1, 0};
  kvsift::index_sets plan;
  for (const int r : requests) {
    for (int h = 0; h < 3; ++h) {  // ragged: every (h + 1)-th row, an empty set for h = 2 of r 1
      std::vector<std::int32_t> set;
      for (int i = h; i < lens[r] && !(r == 1 && h == 2); i += h + 1) set.push_back(i);
      plan.push_back(set);
    }
  }
  const std::size_t per = 6 * 32;
  std::vector<float> q(requests.size() * per);
  for (float& x : q) x = nd(rng);
  const auto request_of = [&](std::size_t i) { return requests[i]; };
  const auto query_of = [&](std::size_t i) { return q.data() + i * per; };
  std::vector<float> batch(q.size(), -7.0f), single(q.size(), -7.0f);
  kvsift::attention::attend_plan_batch(store, 1, requests.size(), request_of, query_of, plan,
                                       batch.data());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    kvsift::attention::attend_plan(store, requests[i], 1, q.data() + i * per, plan,
                                   single.data() + i * per, static_cast<int>(i) * 3);
  }
  REQUIRE(batch == single);  // the same kernel per (token, head): identical bits
  REQUIRE(std::none_of(batch.begin(), batch.end(), [](float x) { return x == -7.0f; }));
  // token 2 (request 1, 7 rows) given a slot past its length: nothing is written
  auto bad = plan;
  bad.values[static_cast<std::size_t>(bad.offsets[2 * 3])] = 7;
  std::vector<float> untouched(q.size(), -7.0f);
  REQUIRE_THROWS_AS(kvsift::attention::attend_plan_batch(store, 1, requests.size(), request_of,
                                                         query_of, bad, untouched.data()),
                    kvsift::error);
  REQUIRE(std::all_of(untouched.begin(), untouched.end(), [](float x) { return x == -7.0f; }));
}

TEMPLATE_TEST_CASE("group_dots_rows equals dot on every row and head, bit for bit", "[decode_attention]",
                   float, bfloat16, half) {
  using T = TestType;
  std::mt19937 rng(37);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (const int d : {4, 8, 12, 20, 64, 128}) {
    for (const int G : {1, 2, 3, 4, 5, 6, 9}) {
      for (const std::size_t m : {1u, 2u, 3u, 5u, 8u, 13u}) {
        std::vector<float> q(static_cast<std::size_t>(G) * d);
        std::vector<T> k(m * static_cast<std::size_t>(d));
        for (float& x : q) x = nd(rng);
        for (auto& x : k) x = kvsift::from_float<T>(nd(rng));
        // rows out of order in memory, as a plan's slots are
        std::vector<const T*> rows(m);
        for (std::size_t j = 0; j < m; ++j) rows[j] = k.data() + (m - 1 - j) * d;
        const std::size_t ld = m + 3;  // a leading dimension wider than m: columns beyond stay
        for (const cpu::simd level : {cpu::simd::portable, cpu::simd::avx2, cpu::simd::avx512}) {
          if (level > cpu::detected_simd()) continue;
          std::vector<float> got(static_cast<std::size_t>(G) * ld, -5.0f);
          cpu::group_dots_rows<T>(q.data(), G, d, m, [&](std::size_t j) { return rows[j]; },
                                  got.data(), ld, level);
          for (int g = 0; g < G; ++g) {
            for (std::size_t j = 0; j < ld; ++j) {
              CAPTURE(d, G, m, g, j, cpu::simd_name(level));
              const float w = j < m ? kvsift::dot(q.data() + static_cast<std::size_t>(g) * d,
                                                  rows[j], d)
                                    : -5.0f;
              REQUIRE(std::bit_cast<std::uint32_t>(got[g * ld + j]) ==
                      std::bit_cast<std::uint32_t>(w));
            }
          }
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("group_dots and attention_rows_over equal dot and attention_row_over bit for bit",
                   "[decode_attention]", float, bfloat16, half) {
  using T = TestType;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (const int d : {8, 12, 20, 64, 128}) {
    for (const int G : {1, 3, 4, 6, 9}) {
      std::vector<float> q(static_cast<std::size_t>(G) * d);
      std::vector<T> k(static_cast<std::size_t>(d));
      for (int rep = 0; rep < 20; ++rep) {
        for (float& x : q) x = nd(rng);
        for (auto& x : k) x = kvsift::from_float<T>(nd(rng));
        for (const cpu::simd level : {cpu::simd::portable, cpu::simd::avx2, cpu::simd::avx512}) {
          if (level > cpu::detected_simd()) continue;
          std::vector<float> got(static_cast<std::size_t>(G));
          cpu::group_dots(q.data(), G, k.data(), d, got.data(), level);
          for (int g = 0; g < G; ++g) {
            const float want = kvsift::dot(q.data() + static_cast<std::size_t>(g) * d, k.data(), d);
            CAPTURE(d, G, g, rep, cpu::simd_name(level));
            REQUIRE(std::bit_cast<std::uint32_t>(got[g]) == std::bit_cast<std::uint32_t>(want));
          }
        }
      }
    }
  }
  // the rows of a group over a store's slots, against one head at a time
  const kvsift::model_shape shape{.layers = 1, .q_heads = 12, .kv_heads = 2, .head_dim = 20};
  kvsift::store::dense<T> store(shape, 1, 300);
  const int n = 257;
  std::vector<T> kk(static_cast<std::size_t>(n) * 2 * 20), vv(kk.size());
  for (auto& x : kk) x = kvsift::from_float<T>(nd(rng));
  for (auto& x : vv) x = kvsift::from_float<T>(nd(rng));
  using view = kvsift::kv_view<const T, kvsift::nhd>;
  store.append(0, 0, view::contiguous(kk.data(), n, 2, 20), view::contiguous(vv.data(), n, 2, 20), 0);
  std::vector<std::int32_t> slots;
  for (int i = 0; i < n; i += 2) slots.push_back(i);
  std::vector<float> q(6 * 20);
  for (float& x : q) x = nd(rng);
  const auto seq = shape.sequence(0, 0, 1);
  std::vector<float> rows(6 * slots.size()), one(slots.size());
  for (const cpu::simd level : {cpu::simd::portable, cpu::simd::avx2, cpu::simd::avx512}) {
    if (level > cpu::detected_simd()) continue;
    const pin p(level);
    cpu::attention_rows_over(store, seq, q.data(), 6, slots, rows);
    for (int g = 0; g < 6; ++g) {
      cpu::attention_row_over(store, seq, q.data() + g * 20, slots, one);
      for (std::size_t i = 0; i < slots.size(); ++i) {
        REQUIRE(std::bit_cast<std::uint32_t>(rows[g * slots.size() + i]) ==
                std::bit_cast<std::uint32_t>(one[i]));
      }
    }
  }
}

namespace {
// The exact softmax as its steps define it, one element at a time: std::max_element's maximum,
// exact_expf of each element minus it, a sequential double sum, the float reciprocal.
void softmax_steps(float* x, std::size_t m) {
  if (m == 0) return;
  const float mx = *std::max_element(x, x + m);
  double sum = 0.0;
  for (std::size_t j = 0; j < m; ++j) {
    x[j] = kvsift::exact_expf(x[j] - mx);
    sum += x[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (std::size_t j = 0; j < m; ++j) x[j] *= inv;
}
}  // namespace

TEST_CASE("softmax_rows and softmax follow the exact softmax's steps bit for bit", "[decode_attention]") {
  const cpu::simd level = GENERATE(cpu::simd::portable, cpu::simd::avx2, cpu::simd::avx512);
  if (level > cpu::detected_simd()) SKIP("this CPU has no " << cpu::simd_name(level) << " path");
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 17}) {
    for (const std::size_t m :
         {0u, 1u, 2u, 3u, 4u, 5u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 32u, 33u, 40u, 257u}) {
      for (int rep = 0; rep < 7; ++rep) {
        const std::size_t ld = m + 2;  // columns past m stay as they are
        std::vector<float> x(static_cast<std::size_t>(rows) * ld);
        for (float& v : x) v = nd(rng);
        for (int r = 0; r < rows && m > 0; ++r) {
          float* row = x.data() + r * ld;
          switch ((rep + r) % 7) {
            case 1: row[m - 1] = row[0] = 30.0f; break;   // a tied maximum, first and last
            case 2: row[0] = -0.0f; for (std::size_t j = 1; j < m; ++j) row[j] = j % 2 ? 0.0f : -0.0f; break;
            case 3: row[m / 2] = -inf; break;             // a masked-out key
            case 4: row[m - 1] = nan; break;              // a NaN after the first element
            case 5: row[0] = nan; break;                  // a NaN first: std::max_element keeps it
            default: break;
          }
        }
        std::vector<float> got = x, want = x;
        std::vector<float> one = x;  // softmax() a row at a time
        cpu::softmax_rows(got.data(), rows, m, ld, level);
        for (int r = 0; r < rows; ++r) {
          softmax_steps(want.data() + r * ld, m);
          cpu::scoped_simd pin(level);
          cpu::softmax(std::span<float>(one.data() + r * ld, m));
        }
        for (std::size_t i = 0; i < x.size(); ++i) {
          CAPTURE(rows, m, rep, i);
          REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i]));
          REQUIRE(std::bit_cast<std::uint32_t>(one[i]) == std::bit_cast<std::uint32_t>(want[i]));
        }
      }
    }
  }
}

#if KVSIFT_HAVE_X86_SIMD_PATH
// The AVX-512 softmax adds a block of 16 columns while the next block's exps run; each row's
// double sum must still be column_sums' (column order), bit for bit: a sum taken in another order
// differs in its last bits for most rows of widely spread exponentials, which the float
// reciprocal then mostly hides (hence this test of the doubles themselves), for every NR.
TEST_CASE("exp_sums_avx512: the exps and each row's double sum in column order", "[decode_attention]") {
  if (cpu::detected_simd() < cpu::simd::avx512) SKIP("this CPU has no avx512 path");
  std::mt19937 rng(43);
  std::normal_distribution<float> nd(0.0f, 6.0f);
  for (const std::size_t m : {1u, 15u, 16u, 17u, 33u, 48u, 257u, 1000u}) {
    for (int nr = 1; nr <= 8; ++nr) {
      cpu::detail::with_heads<8>(nr, [&]<int NR>() {
        std::vector<float> x(NR * m);
        for (float& v : x) v = nd(rng);
        std::vector<float> got = x, want = x;
        float* grow[NR];
        float* wrow[NR];
        float top[NR];
        for (int r = 0; r < NR; ++r) {
          grow[r] = got.data() + r * m;
          wrow[r] = want.data() + r * m;
          top[r] = *std::max_element(wrow[r], wrow[r] + m);
          cpu::exp_sub_row(wrow[r], m, top[r], cpu::simd::portable);
        }
        double gsum[NR], wsum[NR];
        cpu::detail::exp_sums_avx512<NR>(grow, top, m, gsum);
        cpu::detail::column_sums<NR>(wrow, m, wsum);
        for (int r = 0; r < NR; ++r) {
          CAPTURE(m, NR, r);
          REQUIRE(std::bit_cast<std::uint64_t>(gsum[r]) == std::bit_cast<std::uint64_t>(wsum[r]));
        }
        for (std::size_t i = 0; i < x.size(); ++i) {
          REQUIRE(std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i]));
        }
      });
    }
  }
}
#endif
