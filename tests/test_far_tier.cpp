// SPDX-License-Identifier: Apache-2.0
// The far tier attended where it lives (attention/far_tier.hpp): over a store::tiered with rows
// demoted to the host pool, the partial attention over the resident slots and the one over the
// host pool's rows a step needs, merged, equal the recall path's attention: the same rows recalled
// by transfer::async, installed, and attended in the working set (within 2e-5 relative); no row
// moves for the merged path. Bad positions and slots are refused with the argument named.

#include <kvsift/attention/far_tier.hpp>
#include <kvsift/transfer/async.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {
constexpr kvsift::model_shape kShape{.layers = 2, .q_heads = 8, .kv_heads = 2, .head_dim = 32};
}

TEMPLATE_TEST_CASE("far tier: host rows attended on the host and merged equal the recall path",
                   "[attention][far_tier][tiered]", float, kvsift::bfloat16) {
  using T = TestType;
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  CAPTURE(seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n = 60 + static_cast<int>(seed) * 7;
  kvsift::store::tiered<T> st(kShape, 1, 128, 8);
  const int layer = 1;
  std::vector<T> k(static_cast<std::size_t>(n) * kShape.kv_heads * kShape.head_dim), v(k.size());
  for (auto& x : k) x = kvsift::from_float<T>(nd(rng));
  for (auto& x : v) x = kvsift::from_float<T>(nd(rng));
  using view = kvsift::kv_view<const T, kvsift::nhd>;
  st.append(0, layer, view::contiguous(k.data(), n, kShape.kv_heads, kShape.head_dim),
            view::contiguous(v.data(), n, kShape.kv_heads, kShape.head_dim), 0);
  // keep a quarter resident (the sinks and a random rest), the others live in the host pool only
  kvsift::index_sets kept;
  std::bernoulli_distribution keep(0.25);
  for (int h = 0; h < kShape.kv_heads; ++h) {
    std::vector<std::int32_t> s{0, 1, 2, 3};
    for (int i = 4; i < n; ++i) {
      if (keep(rng)) s.push_back(i);
    }
    kept.push_back(s);
  }
  st.retain(0, layer, kept);
  const int G = kShape.group_size();
  const int d = kShape.head_dim;
  std::vector<float> q(static_cast<std::size_t>(G) * d);
  for (auto& x : q) x = nd(rng);
  for (int h = 0; h < kShape.kv_heads; ++h) {
    CAPTURE(h);
    const auto seq = kShape.sequence(0, layer, h);
    // the step needs every resident slot and some of the host tier's rows
    std::vector<std::int32_t> slots(static_cast<std::size_t>(st.length(seq)));
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int32_t>(i);
    std::vector<std::int32_t> far;
    std::bernoulli_distribution need(0.5);
    for (int p = 0; p < n; ++p) {
      if (!st.resident(seq, p) && need(rng)) far.push_back(p);
    }
    REQUIRE_FALSE(far.empty());
    std::vector<float> near_out(G * d), far_out(G * d), merged(G * d), near_lse(G), far_lse(G);
    const auto host_bytes = st.host_bytes();
    kvsift::attention::attend_slots(st, seq, slots, q.data(), G, near_out.data(), near_lse.data());
    kvsift::attention::attend_host_rows(st, seq, far, q.data(), G, far_out.data(), far_lse.data());
    kvsift::attention::merge_partials(G, d, near_out.data(), near_lse.data(), far_out.data(),
                                      far_lse.data(), merged.data());
    REQUIRE(st.length(seq) == static_cast<int>(slots.size()));  // nothing moved
    REQUIRE(st.host_bytes() == host_bytes);

    // the recall path: recall the same rows, install them beside the resident ones, attend all
    kvsift::transfer::async<T> xfer;
    std::vector<std::int32_t> want_resident;
    for (int i = 0; i < st.length(seq); ++i) want_resident.push_back(st.position(seq, i));
    const auto ticket = xfer.submit(st, {{seq, far}});
    std::vector<std::int32_t> all = want_resident;
    all.insert(all.end(), far.begin(), far.end());
    std::sort(all.begin(), all.end());
    st.install(seq, all, xfer.wait(ticket));
    xfer.release(ticket);
    REQUIRE(st.length(seq) == static_cast<int>(all.size()));
    std::vector<std::int32_t> every(all.size());
    for (std::size_t i = 0; i < every.size(); ++i) every[i] = static_cast<std::int32_t>(i);
    std::vector<float> recalled(G * d), lse(G);
    kvsift::attention::attend_slots(st, seq, every, q.data(), G, recalled.data(), lse.data());
    for (int c = 0; c < G * d; ++c) {
      CAPTURE(c);
      REQUIRE(std::abs(merged[c] - recalled[c]) <= 2e-5f * std::max(1.0f, std::abs(recalled[c])));
    }
  }
}

TEST_CASE("far tier: positions not in the host pool and slots not resident are refused",
          "[attention][far_tier][bad_input]") {
  using Catch::Matchers::ContainsSubstring;
  kvsift::store::tiered<float> st(kShape, 1, 32, 8);
  std::vector<float> k(static_cast<std::size_t>(10) * kShape.kv_heads * kShape.head_dim, 0.5f);
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  st.append(0, 0, view::contiguous(k.data(), 10, kShape.kv_heads, kShape.head_dim),
            view::contiguous(k.data(), 10, kShape.kv_heads, kShape.head_dim), 0);
  const int G = kShape.group_size();
  std::vector<float> q(G * kShape.head_dim, 0.1f), out(q.size()), lse(G);
  const std::vector<std::int32_t> absent{2, 12}, unsorted{5, 3}, bad_slot{0, 10};
  REQUIRE_THROWS_WITH(kvsift::attention::attend_host_rows(st, 0, absent, q.data(), G, out.data(), lse.data()),
                      ContainsSubstring("'positions[1]' = 12"));
  REQUIRE_THROWS_WITH(kvsift::attention::attend_host_rows(st, 0, unsorted, q.data(), G, out.data(), lse.data()),
                      ContainsSubstring("'positions[1]' = 3"));
  REQUIRE_THROWS_WITH(kvsift::attention::attend_slots(st, 0, bad_slot, q.data(), G, out.data(), lse.data()),
                      ContainsSubstring("'slots[1]' = 10"));
  REQUIRE_THROWS_WITH(kvsift::attention::attend_slots(st, 99, bad_slot, q.data(), G, out.data(), lse.data()),
                      ContainsSubstring("'seq' = 99"));
}
