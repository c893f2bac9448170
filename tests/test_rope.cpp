// SPDX-License-Identifier: Apache-2.0
// RoPE re-rotation: a key rotated for position p, re-rotated to p', equals the key rotated for p'.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace {

// Reference RoPE of a raw vector at position pos (HF rotate_half or interleaved pairs).
std::vector<float> rope(const std::vector<float>& x, int pos, const kvsift::rope_params& p) {
  const int d = static_cast<int>(x.size());
  const int half = d / 2;
  std::vector<float> out = x;
  for (int i = 0; i < half; ++i) {
    const double angle = pos * std::pow(p.theta, -2.0 * i / d);
    const int a = p.layout == kvsift::rope_layout::rotate_half ? i : 2 * i;
    const int b = p.layout == kvsift::rope_layout::rotate_half ? i + half : 2 * i + 1;
    out[a] = static_cast<float>(x[a] * std::cos(angle) - x[b] * std::sin(angle));
    out[b] = static_cast<float>(x[a] * std::sin(angle) + x[b] * std::cos(angle));
  }
  return out;
}

}  // namespace

TEST_CASE("rerotate_key moves a rotated key to another position", "[rope]") {
  const auto layout = GENERATE(kvsift::rope_layout::rotate_half, kvsift::rope_layout::interleaved);
  const int from = GENERATE(0, 17, 1000);
  const int to = GENERATE(0, 5, 999);
  CAPTURE(static_cast<int>(layout), from, to);
  const kvsift::rope_params p{.theta = 10000.0, .rotary_dim = 0, .layout = layout};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> raw(64);
  for (auto& v : raw) v = nd(rng);
  auto key = rope(raw, from, p);
  kvsift::rerotate_key(key.data(), 64, from, to, p);
  const auto expect = rope(raw, to, p);
  for (int c = 0; c < 64; ++c) {
    CAPTURE(c);
    REQUIRE(key[c] == Catch::Approx(expect[c]).margin(1e-4));
  }
}

TEST_CASE("rerotate_contiguous makes a compacted store read as contiguous positions", "[rope]") {
  const kvsift::model_shape shape{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 8};
  kvsift::store::dense<float> store(shape, 1, 64);
  const kvsift::rope_params p{};
  std::vector<std::vector<float>> raw(40, std::vector<float>(8));
  std::vector<float> keys;
  for (int t = 0; t < 40; ++t) {
    for (int c = 0; c < 8; ++c) raw[t][c] = std::sin(0.3f * static_cast<float>(t * 8 + c));
    const auto k = rope(raw[t], t, p);
    keys.insert(keys.end(), k.begin(), k.end());
  }
  using view = kvsift::kv_view<const float>;
  store.append(0, 0, view::contiguous(keys.data(), 40, 1, 8), view::contiguous(keys.data(), 40, 1, 8), 0);
  kvsift::index_sets kept;
  const std::vector<std::int32_t> slots{0, 1, 7, 20, 39};
  kept.push_back(slots);
  store.retain(0, 0, kept);
  REQUIRE(kvsift::rerotate_contiguous(store, 0, 0, p) == 5);
  for (int j = 0; j < 5; ++j) {
    CAPTURE(j);
    REQUIRE(store.position(0, j) == slots[j]);  // identities unchanged
    const auto expect = rope(raw[slots[j]], j, p);
    for (int c = 0; c < 8; ++c) REQUIRE(store.key(0, j)[c] == Catch::Approx(expect[c]).margin(1e-5));
  }
  REQUIRE_THROWS_AS(kvsift::rerotate_key(keys.data(), 8, 0, 1, {.rotary_dim = 3}), kvsift::error);
}
