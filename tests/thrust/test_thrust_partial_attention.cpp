// SPDX-License-Identifier: Apache-2.0
// thrust::attention_over's log-sum-exp output (a partial attention, attention/merge.hpp), alone,
// under the device system this binary is compiled for (CPP or OMP): each segment's candidates
// split into two disjoint plans, attended alone and merged by attention::merge_partials, equal
// the attention over the whole plan within 2e-5 relative; the lse equals a float64 log-sum-exp of
// the logits a query sees (causal: -inf where it sees none).

#include <kvsift/attention/merge.hpp>
#include <kvsift/thrust/attention.hpp>

#include <thrust/execution_policy.h>
#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

TEST_CASE("thrust attention: partial attentions over disjoint plans merge into the whole",
          "[thrust][attention][partial]") {
  using i32 = std::int32_t;
  const int H = 2, G = GENERATE(1, 3), d = 8, requests = 2;
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  CAPTURE(G, seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int S = requests * H;
  // segment s holds n_s rows at positions 0 .. n_s - 1
  std::vector<i32> offsets{0}, positions;
  for (int s = 0; s < S; ++s) {
    const int n = 3 + static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) positions.push_back(i);
    offsets.push_back(static_cast<i32>(positions.size()));
  }
  const std::int64_t N = positions.size();
  std::vector<float> keys(static_cast<std::size_t>(N) * d), values(keys.size());
  for (auto& x : keys) x = 2.0f * nd(rng);
  for (auto& x : values) x = nd(rng);
  // one query per request at a position that hides some heads' newest rows (none for request 1
  // when it sits before every row: position -1)
  std::vector<float> q(static_cast<std::size_t>(requests) * H * G * d);
  for (auto& x : q) x = nd(rng);
  const std::vector<i32> qpos{8, static_cast<i32>(seed == 3u ? -1 : 30)};
  // the whole plan (every slot) and its split into A and B
  std::vector<i32> all_off{0}, all, a_off{0}, a, b_off{0}, b;
  std::bernoulli_distribution in_a(0.4);
  for (int s = 0; s < S; ++s) {
    for (i32 j = 0; j < offsets[s + 1] - offsets[s]; ++j) {
      all.push_back(j);
      (in_a(rng) ? a : b).push_back(j);
    }
    all_off.push_back(static_cast<i32>(all.size()));
    a_off.push_back(static_cast<i32>(a.size()));
    b_off.push_back(static_cast<i32>(b.size()));
  }
  const auto rows = [&](const std::vector<float>& x) {
    return kvsift::thrust::segmented_rows<float>{x.data(), offsets.data(), positions.data(), 0, S, d};
  };
  const kvsift::thrust::window_queries wq{q.data(), qpos.data(), 1, H, G};
  const std::size_t out_size = q.size();
  const std::size_t heads = static_cast<std::size_t>(requests) * H * G;
  const auto attend = [&](const std::vector<i32>& off, const std::vector<i32>& plan,
                          std::vector<float>& out, std::vector<float>& lse) {
    out.assign(out_size, 0.0f);
    lse.assign(heads, 0.0f);
    const std::int64_t M = plan.size();
    std::vector<std::byte> ws(kvsift::thrust::attention_workspace_bytes(M, G, 1));
    kvsift::thrust::attention_over(::thrust::device, rows(keys), rows(values), wq,
                                   kvsift::thrust::attention_plan{off.data(), plan.data()}, N, M,
                                   out.data(), nullptr, ws.data(), ws.size(), lse.data());
  };
  std::vector<float> ow, lw, oa, la, ob, lb;
  attend(all_off, all, ow, lw);
  attend(a_off, a, oa, la);
  attend(b_off, b, ob, lb);
  // without lse the same output (the trailing argument is optional)
  {
    std::vector<float> plain(out_size);
    std::vector<std::byte> ws(kvsift::thrust::attention_workspace_bytes(N, G, 1));
    kvsift::thrust::attention_over(::thrust::cpp::par, rows(keys), rows(values), wq,
                                   kvsift::thrust::attention_plan{all_off.data(), all.data()}, N, N,
                                   plain.data(), nullptr, ws.data(), ws.size());
    REQUIRE(plain == ow);
  }
  std::vector<float> merged(out_size), lm(heads);
  kvsift::attention::merge_partials(static_cast<int>(heads), d, oa.data(), la.data(), ob.data(),
                                    lb.data(), merged.data(), lm.data());
  for (int r = 0; r < requests; ++r) {
    for (int h = 0; h < H; ++h) {
      const int s = r * H + h;
      for (int g = 0; g < G; ++g) {
        const std::size_t k = (static_cast<std::size_t>(r) * H + h) * G + g;
        CAPTURE(r, h, g);
        // float64 lse over the rows the query sees
        std::vector<double> x;
        for (i32 j = 0; j < offsets[s + 1] - offsets[s]; ++j) {
          if (positions[offsets[s] + j] > qpos[r]) continue;
          double dot = 0;
          for (int c = 0; c < d; ++c) {
            dot += static_cast<double>(q[k * d + c]) * keys[(offsets[s] + j) * static_cast<std::size_t>(d) + c];
          }
          x.push_back(dot / std::sqrt(static_cast<double>(d)));
        }
        if (x.empty()) {
          REQUIRE(lw[k] == -std::numeric_limits<float>::infinity());
          REQUIRE(lm[k] == -std::numeric_limits<float>::infinity());
        } else {
          const double top = *std::max_element(x.begin(), x.end());
          double sum = 0;
          for (const double v : x) sum += std::exp(v - top);
          const double want = top + std::log(sum);
          REQUIRE(std::abs(lw[k] - want) <= 1e-5 * std::max(1.0, std::abs(want)));
          REQUIRE(std::abs(lm[k] - lw[k]) <= 1e-5f * std::max(1.0f, std::abs(lw[k])));
        }
        for (int c = 0; c < d; ++c) {
          const float w = ow[k * d + c];
          REQUIRE(std::abs(merged[k * d + c] - w) <= 2e-5f * std::max(1.0f, std::abs(w)));
        }
      }
    }
  }
}
