// SPDX-License-Identifier: Apache-2.0
// Parity of the Thrust backend with the CPU reference, under the device system this binary is
// compiled for (THRUST_DEVICE_SYSTEM = CPP or OMP: `thrust::device`) and under explicit
// `thrust::cpp::par`. Laws: same kept indices as the CPU selectors, scores within 1e-5 relative.

#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/segmented_topk.hpp>
#include <kvsift/score/lag.hpp>
#include <kvsift/score/page_minmax.hpp>
#include <kvsift/score/window_attention.hpp>
#include <kvsift/select/page_topk.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/thrust/all.hpp>

#include <thrust/execution_policy.h>
#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using kvsift::bfloat16;
using kvsift::half;

// Runs f(policy, name) under the compiled device system and under thrust::cpp::par.
template <class F>
void for_each_policy(F&& f) {
  f(::thrust::device, std::string("device(" KVSIFT_THRUST_SYSTEM_NAME ")"));
  f(::thrust::cpp::par, std::string("cpp::par"));
}

bool close(float a, float b, float rel = 1e-5f) {
  if (a == b) return true;  // also equal infinities
  return std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b));
}

void require_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i, got[i], want[i]);
    REQUIRE(close(got[i], want[i]));
  }
}

std::vector<std::int32_t> csr(const std::vector<int>& sizes) {
  std::vector<std::int32_t> o(sizes.size() + 1, 0);
  for (std::size_t s = 0; s < sizes.size(); ++s) o[s + 1] = o[s] + sizes[s];
  return o;
}

// A dense store over caller memory plus the same memory described for the Thrust backend.
template <class T>
struct fixture {
  kvsift::model_shape shape;
  int requests = 0;
  int capacity = 0;
  std::vector<int> lengths;  // [requests]
  std::vector<T> keys, values;
  kvsift::store::dense<T> store;
  std::vector<std::int32_t> offsets;  // [requests * kv_heads + 1]

  fixture(kvsift::model_shape sh, std::vector<int> lens, std::uint32_t seed, bool quantise = false,
          int constant_channels = 0)
      : shape(sh),
        requests(static_cast<int>(lens.size())),
        capacity(std::max(1, *std::max_element(lens.begin(), lens.end()))),
        lengths(lens),
        keys(static_cast<std::size_t>(requests) * sh.kv_heads * capacity * sh.head_dim),
        values(keys.size()),
        store(sh, requests, capacity, keys.data(), values.data()) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int H = sh.kv_heads;
    const int d = sh.head_dim;
    std::vector<int> sizes;
    for (int r = 0; r < requests; ++r) {
      const int n = lengths[r];
      std::vector<T> k(static_cast<std::size_t>(n) * H * d), v(k.size());
      for (int t = 0; t < n; ++t) {
        for (int h = 0; h < H; ++h) {
          for (int c = 0; c < d; ++c) {
            float a = nd(rng);
            float b = nd(rng);
            if (quantise) {
              a = std::round(a * 2.0f) / 2.0f;
              b = std::round(b * 2.0f) / 2.0f;
            }
            if (c < constant_channels) {
              a = 0.25f * static_cast<float>(c + 1);
              b = -0.5f;
            }
            const std::size_t i = (static_cast<std::size_t>(t) * H + h) * d + c;
            k[i] = kvsift::from_float<T>(a);
            v[i] = kvsift::from_float<T>(b);
          }
        }
      }
      if (n > 0) {
        using view = kvsift::kv_view<const T, kvsift::nhd>;
        store.append(r, 0, view::contiguous(k.data(), n, H, d), view::contiguous(v.data(), n, H, d),
                     0);
      }
      for (int h = 0; h < H; ++h) sizes.push_back(n);
    }
    offsets = csr(sizes);
  }

  [[nodiscard]] int segments() const { return requests * shape.kv_heads; }
  [[nodiscard]] std::int64_t items() const { return offsets.back(); }
  [[nodiscard]] kvsift::thrust::segmented_rows<T> rows(const std::vector<T>& data) const {
    return {data.data(), offsets.data(), nullptr,
            static_cast<std::int64_t>(capacity) * shape.head_dim, segments(), shape.head_dim};
  }
  [[nodiscard]] std::vector<int> request_ids() const {
    std::vector<int> ids(static_cast<std::size_t>(requests));
    std::iota(ids.begin(), ids.end(), 0);
    return ids;
  }
};

std::vector<float> random_queries(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(count);
  for (float& x : q) x = nd(rng);
  return q;
}

// Thrust top-k of flat CSR scores with protection; returns the kept CSR.
template <class Policy>
kvsift::index_sets thrust_topk(const Policy& exec, const std::vector<float>& scores,
                               const std::vector<std::int32_t>& offsets,
                               const std::vector<std::int32_t>& budgets,
                               kvsift::thrust::topk_protection protect = {}) {
  const int S = static_cast<int>(offsets.size()) - 1;
  kvsift::index_sets kept;
  kept.offsets.assign(static_cast<std::size_t>(S) + 1, 0);
  kvsift::thrust::kept_offsets(exec, offsets.data(), budgets.data(), S, kept.offsets.data());
  kept.values.assign(static_cast<std::size_t>(kept.offsets.back()), -1);
  std::vector<std::byte> ws(kvsift::thrust::segmented_topk_workspace_bytes(offsets.back()));
  kvsift::thrust::segmented_topk(exec, scores.data(), offsets.data(), S, offsets.back(),
                                 kept.offsets.data(), kept.offsets.back(), kept.values.data(),
                                 ws.data(), ws.size(), protect);
  return kept;
}

void require_same_sets(const kvsift::index_sets& got, const kvsift::index_sets& want) {
  REQUIRE(got.offsets == want.offsets);
  for (int s = 0; s < want.segments(); ++s) {
    CAPTURE(s);
    const auto a = got[s];
    const auto b = want[s];
    REQUIRE(std::vector<std::int32_t>(a.begin(), a.end()) ==
            std::vector<std::int32_t>(b.begin(), b.end()));
  }
}

}  // namespace

// ---- segmented top-k ----------------------------------------------------------------------------

TEST_CASE("thrust::segmented_topk rejects kept counts the protected tokens do not fit, writing nothing",
          "[thrust][topk][bad_input]") {
  // segment 1 (n = 10) keeps 5 < sink 2 + window 4 = 6; segment 0 and 2 fit
  const std::vector<std::int32_t> offsets{0, 8, 18, 30};
  const std::vector<std::int32_t> window{2, 4, 0};
  std::vector<float> scores(30);
  for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = static_cast<float>((i * 7) % 11);
  const std::vector<std::int32_t> kept_offsets{0, 4, 9, 12};
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::vector<std::int32_t> out(12, -7);
    std::vector<std::byte> ws(kvsift::thrust::segmented_topk_workspace_bytes(30));
    const kvsift::thrust::topk_protection protect{2, window.data()};
    try {
      kvsift::thrust::segmented_topk(exec, scores.data(), offsets.data(), 3, 30,
                                     kept_offsets.data(), 12, out.data(), ws.data(), ws.size(),
                                     protect);
      FAIL("no kvsift::error");
    } catch (const kvsift::error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      REQUIRE(what.find("thrust::segmented_topk") != std::string::npos);
      REQUIRE(what.find("kept_offsets[2] - kept_offsets[1]") != std::string::npos);
      REQUIRE(what.find("= 5") != std::string::npos);
      REQUIRE(what.find("sink 2 + window 4") != std::string::npos);
    }
    REQUIRE(std::all_of(out.begin(), out.end(), [](std::int32_t x) { return x == -7; }));
    // the same call with counts that fit (5 -> 6) goes through; a segment kept whole needs no room
    const std::vector<std::int32_t> fits{0, 4, 10, 12};
    std::vector<std::int32_t> ok(12, -7);
    kvsift::thrust::segmented_topk(exec, scores.data(), offsets.data(), 3, 30, fits.data(), 12,
                                   ok.data(), ws.data(), ws.size(), protect);
    REQUIRE(std::none_of(ok.begin(), ok.end(), [](std::int32_t x) { return x == -7; }));
    const std::vector<std::int32_t> whole{0, 8, 18, 30};
    std::vector<std::int32_t> all(30, -7);
    kvsift::thrust::segmented_topk(exec, scores.data(), offsets.data(), 3, 30, whole.data(), 30,
                                   all.data(), ws.data(), ws.size(),
                                   kvsift::thrust::topk_protection{20, window.data()});
    REQUIRE(all[0] == 0);
  });
}

TEST_CASE("thrust::segmented_topk keeps what cpu::topk_of keeps", "[thrust][topk]") {
  const int segments = GENERATE(1, 3, 17);
  const int max_len = GENERATE(1, 9, 200);
  const int levels = GENERATE(0, 3);  // 0: continuous scores; else quantised (many exact ties)
  const std::uint32_t seed = GENERATE(1u, 2u);
  CAPTURE(segments, max_len, levels, seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> len(0, max_len);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int> sizes(static_cast<std::size_t>(segments));
  for (int& n : sizes) n = len(rng);
  const auto offsets = csr(sizes);
  std::vector<float> scores(static_cast<std::size_t>(offsets.back()));
  for (float& x : scores) x = levels == 0 ? nd(rng) : static_cast<float>(static_cast<int>(rng() % levels));
  if (!scores.empty()) scores[0] = -0.0f;  // -0 == +0
  std::vector<std::int32_t> budgets(static_cast<std::size_t>(segments));
  for (int s = 0; s < segments; ++s) {
    budgets[s] = std::uniform_int_distribution<int>(0, sizes[s] + 2)(rng);
  }

  kvsift::index_sets want;
  for (int s = 0; s < segments; ++s) {
    std::vector<std::int32_t> cand(static_cast<std::size_t>(sizes[s]));
    std::iota(cand.begin(), cand.end(), 0);
    std::vector<std::int32_t> picked;
    kvsift::cpu::topk_of(std::span<const float>(scores.data() + offsets[s], sizes[s]), cand,
                         budgets[s], picked);
    want.push_back(picked);
  }
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    require_same_sets(thrust_topk(exec, scores, offsets, budgets), want);
  });
}

TEST_CASE("thrust::segmented_topk with protected sink and window matches select::topk",
          "[thrust][topk]") {
  const int sink = GENERATE(0, 4);
  const int window = GENERATE(0, 8);
  const int levels = GENERATE(0, 2);
  CAPTURE(sink, window, levels);
  std::mt19937 rng(7);
  const std::vector<int> sizes{40, 12, 0, 97, 13};
  kvsift::score_sets scores;
  for (int n : sizes) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = levels == 0 ? std::normal_distribution<float>()(rng)
                                       : static_cast<float>(rng() % levels);
    scores.push_back(v);
  }
  const std::vector<int> budgets{20, 12, 5, 30, 12};
  kvsift::select::topk sel;
  sel.p.sink = sink;
  sel.p.window = window;
  kvsift::index_sets want;
  sel.select(scores, budgets, want);

  std::vector<std::int32_t> windows;
  for (int b : budgets) windows.push_back(sel.window_for(b));
  const std::vector<std::int32_t> b32(budgets.begin(), budgets.end());
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    require_same_sets(
        thrust_topk(exec, scores.values, scores.offsets, b32, {sink, windows.data()}), want);
  });
}

// ---- softmax, pooling, GQA reduction -------------------------------------------------------------

TEST_CASE("thrust segmented softmax, pool1d and GQA reduction match cpu/math.hpp",
          "[thrust][math]") {
  const int kernel = GENERATE(1, 3, 7);
  const auto mode = GENERATE(kvsift::pooling::avg, kvsift::pooling::max);
  const auto gqa = GENERATE(kvsift::gqa_reduce::mean, kvsift::gqa_reduce::max,
                            kvsift::gqa_reduce::sum);
  const int group = GENERATE(1, 4);
  CAPTURE(kernel, static_cast<int>(mode), static_cast<int>(gqa), group);
  std::mt19937 rng(11);
  const std::vector<int> sizes{5, 0, 1, 64, 2, 33};
  const auto offsets = csr(sizes);
  const int S = static_cast<int>(sizes.size());
  std::vector<float> x(static_cast<std::size_t>(offsets.back()));
  for (float& v : x) v = 3.0f * std::normal_distribution<float>()(rng);

  std::vector<float> soft_want = x;
  std::vector<float> pool_want(x.size());
  for (int s = 0; s < S; ++s) {
    kvsift::cpu::softmax(std::span<float>(soft_want.data() + offsets[s], sizes[s]));
    kvsift::cpu::pool1d(std::span<const float>(x.data() + offsets[s], sizes[s]),
                        std::span<float>(pool_want.data() + offsets[s], sizes[s]), kernel, mode);
  }
  // G rows per segment, [segments][G][n_s]
  std::vector<float> rows(x.size() * group);
  for (float& v : rows) v = std::normal_distribution<float>()(rng);
  std::vector<float> gqa_want(x.size());
  for (int s = 0; s < S; ++s) {
    kvsift::cpu::reduce_group(
        std::span<const float>(rows.data() + static_cast<std::size_t>(offsets[s]) * group,
                               static_cast<std::size_t>(sizes[s]) * group),
        group, std::span<float>(gqa_want.data() + offsets[s], sizes[s]), gqa);
  }
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::vector<float> soft = x;
    kvsift::thrust::segmented_softmax(exec, soft.data(), offsets.data(), S);
    require_close(soft, soft_want);
    std::vector<float> pooled(x.size(), -1.0f);
    kvsift::thrust::segmented_pool1d(exec, x.data(), pooled.data(), offsets.data(), S,
                                     offsets.back(), kernel, mode);
    require_close(pooled, pool_want);
    std::vector<float> red(x.size(), -1.0f);
    kvsift::thrust::gqa_reduce_rows(exec, rows.data(), red.data(), offsets.data(), S,
                                    offsets.back(), group, gqa);
    require_close(red, gqa_want);
  });
  REQUIRE_THROWS_AS(kvsift::thrust::segmented_pool1d(::thrust::cpp::par, x.data(), x.data(),
                                                     offsets.data(), S, offsets.back(), 4, mode),
                    kvsift::error);
}

// ---- gather / compaction ---------------------------------------------------------------------------

TEMPLATE_TEST_CASE("thrust compact_rows and gather_rows match store retain and gather",
                   "[thrust][gather]", float, half, bfloat16) {
  const int d = GENERATE(1, 8);
  const int kv_heads = GENERATE(1, 2);
  CAPTURE(d, kv_heads);
  const kvsift::model_shape sh{1, kv_heads, kv_heads, d};
  fixture<TestType> fx(sh, {23, 0, 7, 40}, 3);
  const int S = fx.segments();
  std::mt19937 rng(5);
  kvsift::index_sets kept;
  for (int s = 0; s < S; ++s) {
    std::vector<std::int32_t> k;
    for (int j = 0; j < fx.offsets[s + 1] - fx.offsets[s]; ++j) {
      if (rng() % 3 == 0) k.push_back(j);
    }
    kept.push_back(k);
  }
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    // gather into a fresh [S, capacity, d] array
    std::vector<TestType> dst(fx.keys.size());
    std::vector<std::int32_t> dst_pos(static_cast<std::size_t>(S) * fx.capacity, -1);
    kvsift::thrust::gather_rows(exec, fx.rows(fx.values), kept.offsets.data(),
                                kept.values.data(), kept.offsets.back(), dst.data(), fx.capacity,
                                dst_pos.data());
    for (int s = 0; s < S; ++s) {
      const auto k = kept[s];
      std::vector<TestType> ks(k.size() * d), vs(k.size() * d);
      std::vector<std::int32_t> ps(k.size());
      fx.store.gather(s, k, ks.data(), vs.data(), ps.data());
      for (std::size_t i = 0; i < k.size(); ++i) {
        REQUIRE(dst_pos[s * fx.capacity + i] == ps[i]);
        for (int c = 0; c < d; ++c) {
          REQUIRE(dst[(s * fx.capacity + i) * d + c] == vs[i * d + c]);
        }
      }
    }
  });
  // in-place compaction of a copy of the keys versus store.retain of the original
  std::vector<TestType> data = fx.keys;
  std::vector<std::int32_t> pos(static_cast<std::size_t>(S) * fx.capacity);
  for (int s = 0; s < S; ++s) {
    for (int j = 0; j < fx.capacity; ++j) pos[s * fx.capacity + j] = 1000 * s + j;
  }
  std::vector<std::byte> ws(
      kvsift::thrust::compact_workspace_bytes<TestType>(kept.offsets.back(), d, true));
  kvsift::thrust::compact_rows(::thrust::device, data.data(), pos.data(), S, fx.capacity, d,
                               kept.offsets.data(), kept.values.data(), kept.offsets.back(),
                               ws.data(), ws.size());
  REQUIRE_THROWS_AS(kvsift::thrust::compact_rows(::thrust::device, data.data(), pos.data(), S,
                                                 fx.capacity, d, kept.offsets.data(),
                                                 kept.values.data(), kept.offsets.back(),
                                                 ws.data(), ws.size() / 2),
                    kvsift::error);
  for (int r = 0; r < fx.requests; ++r) {
    kvsift::index_sets per_head;
    for (int h = 0; h < kv_heads; ++h) {
      const auto k = kept[r * kv_heads + h];
      per_head.push_back(std::vector<std::int32_t>(k.begin(), k.end()));
    }
    fx.store.retain(r, 0, per_head);
  }
  for (int s = 0; s < S; ++s) {
    const auto k = kept[s];
    REQUIRE(fx.store.length(s) == static_cast<int>(k.size()));
    for (std::size_t i = 0; i < k.size(); ++i) {
      REQUIRE(pos[s * fx.capacity + i] == 1000 * s + k[i]);
      for (int c = 0; c < d; ++c) {
        REQUIRE(data[(s * fx.capacity + i) * d + c] == fx.store.key(s, static_cast<int>(i))[c]);
      }
    }
  }
}

// ---- SnapKV window attention -------------------------------------------------------------------------

TEMPLATE_TEST_CASE("thrust window_attention_scores matches score::window_attention and select::topk",
                   "[thrust][window]", float, half, bfloat16) {
  const int kv_heads = GENERATE(1, 2);
  const int group = GENERATE(1, 3);
  const int window = GENERATE(1, 4);
  const int kernel = GENERATE(1, 5);
  const auto pool = GENERATE(kvsift::pooling::avg, kvsift::pooling::max);
  const auto gqa = GENERATE(kvsift::gqa_reduce::mean, kvsift::gqa_reduce::max);
  const bool quantise = GENERATE(false, true);
  CAPTURE(kvsift::element_name<TestType>, kv_heads, group, window, kernel, static_cast<int>(pool),
          static_cast<int>(gqa), quantise);
  const int d = 16;
  const kvsift::model_shape sh{1, kv_heads * group, kv_heads, d};
  const std::vector<int> lens{window + 30, window + 3, window + 57};
  fixture<TestType> fx(sh, lens, 17, quantise);
  const int R = fx.requests;
  const int S = fx.segments();
  const int q_heads = kv_heads * group;
  auto qdata = random_queries(static_cast<std::size_t>(R) * window * q_heads * d, 23);
  if (quantise) {
    for (float& x : qdata) x = std::round(x);
  }
  std::vector<kvsift::kv_view<const float, kvsift::nhd>> qviews;
  std::vector<std::int32_t> qpos;
  for (int r = 0; r < R; ++r) {
    qviews.push_back(kvsift::kv_view<const float, kvsift::nhd>::contiguous(
        qdata.data() + static_cast<std::size_t>(r) * window * q_heads * d, window, q_heads, d));
    qpos.push_back(lens[r] - window);
  }
  const auto ids = fx.request_ids();
  kvsift::score_input<kvsift::store::dense<TestType>> in;
  in.store = &fx.store;
  in.requests = ids;
  in.queries = qviews;
  in.query_position = qpos;
  kvsift::score::window_attention scorer;
  scorer.p = {window, kernel, pool, gqa};
  kvsift::score_sets want;
  scorer.score(in, want);

  // Budget: the window plus half of the past; select::topk protects the window.
  std::vector<int> budgets;
  for (int s = 0; s < S; ++s) budgets.push_back(window + (lens[s / kv_heads] - window) / 2);
  kvsift::select::topk sel;
  sel.p.window = window;
  kvsift::index_sets want_kept;
  sel.select(want, budgets, want_kept);

  const kvsift::thrust::window_queries q{qdata.data(), qpos.data(), window, kv_heads, group};
  std::vector<std::byte> ws(
      kvsift::thrust::window_attention_workspace_bytes(fx.items(), S, group, window));
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::vector<float> got(static_cast<std::size_t>(fx.items()), -1.0f);
    kvsift::thrust::window_attention_scores(exec, fx.rows(fx.keys), q, fx.items(),
                                            {kernel, pool, gqa}, got.data(), ws.data(),
                                            ws.size());
    REQUIRE(want.offsets == fx.offsets);
    require_close(got, want.values);
    const std::vector<std::int32_t> b32(budgets.begin(), budgets.end());
    const std::vector<std::int32_t> windows(static_cast<std::size_t>(S), window);
    require_same_sets(thrust_topk(exec, got, fx.offsets, b32, {0, windows.data()}), want_kept);
  });
  // Packed addressing of the same keys gives the same scores.
  std::vector<TestType> packed;
  for (int s = 0; s < S; ++s) {
    for (int j = 0; j < fx.store.length(s); ++j) {
      packed.insert(packed.end(), fx.store.key(s, j), fx.store.key(s, j) + d);
    }
  }
  kvsift::thrust::segmented_rows<TestType> prow{packed.data(), fx.offsets.data(), nullptr, 0, S, d};
  std::vector<float> got(static_cast<std::size_t>(fx.items()));
  kvsift::thrust::window_attention_scores(::thrust::device, prow, q, fx.items(),
                                          {kernel, pool, gqa}, got.data(), ws.data(), ws.size());
  require_close(got, want.values);
  REQUIRE_THROWS_AS(kvsift::thrust::window_attention_scores(::thrust::device, prow, q, fx.items(),
                                                            {kernel, pool, gqa}, got.data(),
                                                            ws.data(), ws.size() - 1),
                    kvsift::error);
}

// ---- Quest -----------------------------------------------------------------------------------------------

TEMPLATE_TEST_CASE("thrust page_digest and page_scores match score::page_minmax and page_topk",
                   "[thrust][quest]", float, half, bfloat16) {
  const int page_size = GENERATE(1, 4, 16);
  const int group = GENERATE(1, 4);
  const auto gqa = GENERATE(kvsift::gqa_reduce::max, kvsift::gqa_reduce::mean);
  const bool quantise = GENERATE(false, true);
  CAPTURE(kvsift::element_name<TestType>, page_size, group, static_cast<int>(gqa), quantise);
  const int kv_heads = 2;
  const int d = 8;
  const kvsift::model_shape sh{1, kv_heads * group, kv_heads, d};
  const std::vector<int> lens{70, 5, 129};
  fixture<TestType> fx(sh, lens, 29, quantise);
  const int R = fx.requests;
  const int S = fx.segments();
  const int q_heads = kv_heads * group;
  auto qdata = random_queries(static_cast<std::size_t>(R) * q_heads * d, 31);
  if (quantise) {
    for (float& x : qdata) x = std::round(x);
  }
  std::vector<kvsift::kv_view<const float, kvsift::nhd>> qviews;
  std::vector<std::int32_t> qpos;
  for (int r = 0; r < R; ++r) {
    qviews.push_back(kvsift::kv_view<const float, kvsift::nhd>::contiguous(
        qdata.data() + static_cast<std::size_t>(r) * q_heads * d, 1, q_heads, d));
    qpos.push_back(lens[r] - 1);
  }
  const auto ids = fx.request_ids();
  kvsift::score_input<kvsift::store::dense<TestType>> in;
  in.store = &fx.store;
  in.requests = ids;
  in.queries = qviews;
  in.query_position = qpos;
  kvsift::score::page_minmax scorer;
  scorer.p = {page_size, gqa};
  kvsift::score_sets want;
  scorer.score(in, want);
  kvsift::select::page_topk sel;
  sel.p.page_size = page_size;
  const std::vector<int> budgets(static_cast<std::size_t>(S), 4 * page_size);
  kvsift::index_sets want_kept;
  sel.select(want, budgets, want_kept);

  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::vector<std::int32_t> poff(static_cast<std::size_t>(S) + 1);
    kvsift::thrust::page_offsets(exec, fx.offsets.data(), S, page_size, poff.data());
    REQUIRE(poff == want.offsets);
    const std::int64_t pages = poff.back();
    std::vector<float> kmin(static_cast<std::size_t>(pages) * d), kmax(kmin.size());
    kvsift::thrust::page_digest(exec, fx.rows(fx.keys), poff.data(), pages, page_size,
                                kmin.data(), kmax.data());
    // digest of every segment against cpu::page_digest
    for (int s = 0; s < S; ++s) {
      const int np = poff[s + 1] - poff[s];
      std::vector<float> mn(static_cast<std::size_t>(np) * d), mx(mn.size());
      kvsift::cpu::page_digest(fx.store, s, page_size, mn, mx);
      for (std::size_t i = 0; i < mn.size(); ++i) {
        REQUIRE(kmin[poff[s] * d + i] == mn[i]);
        REQUIRE(kmax[poff[s] * d + i] == mx[i]);
      }
    }
    std::vector<float> got(static_cast<std::size_t>(pages), -1.0f);
    kvsift::thrust::page_scores(exec, qdata.data(), kv_heads, group, d, kmin.data(), kmax.data(),
                                poff.data(), S, pages, gqa, got.data());
    require_close(got, want.values);
    // page_topk: the current (last) page always, then the top complete pages
    std::vector<std::int32_t> b32, last(static_cast<std::size_t>(S), 1);
    for (int s = 0; s < S; ++s) b32.push_back(sel.pages_for(budgets[s]));
    require_same_sets(thrust_topk(exec, got, poff, b32, {0, last.data()}), want_kept);
  });
}

// ---- LagKV -----------------------------------------------------------------------------------------------

namespace {

kvsift::score::lag_variant cpu_variant(kvsift::thrust::lag_variant v) {
  switch (v) {
    case kvsift::thrust::lag_variant::lag: return kvsift::score::lag_variant::lag;
    case kvsift::thrust::lag_variant::local: return kvsift::score::lag_variant::local;
    case kvsift::thrust::lag_variant::knorm: return kvsift::score::lag_variant::knorm;
  }
  return kvsift::score::lag_variant::lag;
}

}  // namespace

TEMPLATE_TEST_CASE("thrust lag_scores matches score::lag_relative and its per-partition top-k",
                   "[thrust][lag]", float, half, bfloat16) {
  const auto variant = GENERATE(kvsift::thrust::lag_variant::lag,
                                kvsift::thrust::lag_variant::local,
                                kvsift::thrust::lag_variant::knorm);
  const int lag = GENERATE(4, 16);
  const int constant = GENERATE(0, 3, 8);  // leading constant channels (8 = all: exact ties)
  const double value_weight = GENERATE(1.0, 0.5);
  CAPTURE(kvsift::element_name<TestType>, static_cast<int>(variant), lag, constant, value_weight);
  const int d = 8;
  const int kv_heads = 2;
  const int sink = 3;
  const kvsift::model_shape sh{1, kv_heads, kv_heads, d};
  const std::vector<int> lens{sink + 5 * lag + 2, sink + lag + 1, sink + 2 * lag, 2, sink + 3 * lag - 1};
  fixture<TestType> fx(sh, lens, 41, false, constant);
  const int S = fx.segments();
  std::vector<int> frozen(static_cast<std::size_t>(S), 0);
  frozen[0] = sink + lag;  // a previous round froze some tokens
  const auto ids = fx.request_ids();
  kvsift::score_input<kvsift::store::dense<TestType>> in;
  in.store = &fx.store;
  in.requests = ids;
  in.frozen = frozen;
  kvsift::score::lag_relative scorer;
  scorer.p.sink = sink;
  scorer.p.lag = lag;
  scorer.p.value_weight = value_weight;
  scorer.p.variant = cpu_variant(variant);
  kvsift::score_sets want;
  scorer.score(in, want);

  std::vector<std::int32_t> base(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) {
    base[s] = std::min(scorer.base_of(frozen[s]), fx.offsets[s + 1] - fx.offsets[s]);
  }
  // Per-partition kept sets: floor(r L) with r = 0.5 of each scored partition.
  const int keep = lag / 2;
  std::vector<std::int32_t> part_offsets{0}, part_budget;
  for (int s = 0; s < S; ++s) {
    const int n = fx.offsets[s + 1] - fx.offsets[s];
    const int P = scorer.partitions(n, base[s]);
    part_offsets.push_back(fx.offsets[s] + base[s]);  // the frozen prefix: nothing selected
    part_budget.push_back(0);
    for (int p = 0; p + 1 < P; ++p) {
      part_offsets.push_back(fx.offsets[s] + base[s] + (p + 1) * lag);
      part_budget.push_back(keep);
    }
    // the raw tail: nothing selected; the ranges cover the flat score array in order
    part_offsets.push_back(fx.offsets[s + 1]);
    part_budget.push_back(0);
  }
  kvsift::index_sets want_kept;
  {
    std::vector<std::int32_t> off{0};
    std::vector<std::int32_t> cand, picked;
    for (std::size_t k = 0; k + 1 < part_offsets.size(); ++k) {
      const int a = part_offsets[k];
      const int b = part_offsets[k + 1];
      cand.resize(static_cast<std::size_t>(b - a));
      std::iota(cand.begin(), cand.end(), 0);
      kvsift::cpu::topk_of(std::span<const float>(want.values.data() + a, b - a), cand,
                           part_budget[k], picked);
      want_kept.push_back(picked);
    }
  }

  std::vector<std::byte> ws(kvsift::thrust::lag_workspace_bytes(fx.items(), S, d, lag));
  kvsift::thrust::lag_params params;
  params.lag = lag;
  params.value_weight = value_weight;
  params.variant = variant;
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::vector<float> got(static_cast<std::size_t>(fx.items()), -1.0f);
    kvsift::thrust::lag_scores(exec, fx.rows(fx.keys), fx.rows(fx.values), base.data(),
                               fx.items(), params, got.data(), ws.data(), ws.size());
    require_close(got, want.values);
    // the partitions above: consecutive ranges, so partition-local top-k works on flat scores
    require_same_sets(thrust_topk(exec, got, part_offsets, part_budget), want_kept);
  });
}

TEST_CASE("thrust lag_scores on constant channels is an exact tie, ties to the lower index",
          "[thrust][lag]") {
  const int lag = 4;
  const int d = 4;
  const kvsift::model_shape sh{1, 1, 1, d};
  fixture<float> fx(sh, {1 + 3 * lag}, 3, false, d);  // every channel constant
  const std::vector<std::int32_t> base{1};
  std::vector<float> got(static_cast<std::size_t>(fx.items()));
  std::vector<std::byte> ws(kvsift::thrust::lag_workspace_bytes(fx.items(), 1, d, lag));
  kvsift::thrust::lag_params params;
  params.lag = lag;
  kvsift::thrust::lag_scores(::thrust::device, fx.rows(fx.keys), fx.rows(fx.values), base.data(),
                             fx.items(), params, got.data(), ws.data(), ws.size());
  // partitions 0 and 1 are scored: x' = 0 everywhere, std 0, softmax uniform, s_K + s_V = 2 / L
  for (int j = 1; j < 1 + 2 * lag; ++j) REQUIRE(got[j] == 2.0f * (1.0f / lag));
  REQUIRE(std::isinf(got[0]));
  for (int j = 1 + 2 * lag; j < 1 + 3 * lag; ++j) REQUIRE(std::isinf(got[j]));
  const std::vector<std::int32_t> budget{2};
  std::vector<float> part(got.begin() + 1, got.begin() + 1 + lag);
  const auto kept = thrust_topk(::thrust::device, part, {0, lag}, budget);
  REQUIRE(std::vector<std::int32_t>(kept.values.begin(), kept.values.end()) ==
          std::vector<std::int32_t>{0, 1});
}
