// SPDX-License-Identifier: Apache-2.0
#pragma once

// Random K, V and queries of one request for the two-tier method tests (test_synckv,
// test_heterocache, test_far_attend): every token of every layer, prompt and decode alike.

#include <cstddef>
#include <random>
#include <vector>

namespace kvsift_test {

// Every token of one request, [tokens, kv_heads, d] K and V, and [tokens, q_heads, d] queries.
struct tokens {
  int n = 0, T = 0, layers = 0, hkv = 0, hq = 0, d = 0;
  std::vector<float> k, v, q;  // [layers, n + T, heads, d]
  [[nodiscard]] std::size_t kv_at(int l, int t) const {
    return ((static_cast<std::size_t>(l) * (n + T) + t) * hkv) * d;
  }
  [[nodiscard]] std::size_t q_at(int l, int t) const {
    return ((static_cast<std::size_t>(l) * (n + T) + t) * hq) * d;
  }
};

// n prompt and T decode tokens per layer: keys N(0, 4), values N(0, 1), queries N(0, 4).
inline tokens make_tokens(int layers, int n, int T, int hkv, int hq, int d, unsigned seed) {
  tokens x{n, T, layers, hkv, hq, d, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  x.k.resize(static_cast<std::size_t>(layers) * (n + T) * hkv * d);
  x.v.resize(x.k.size());
  x.q.resize(static_cast<std::size_t>(layers) * (n + T) * hq * d);
  for (auto& e : x.k) e = 2.0f * nd(rng);
  for (auto& e : x.v) e = nd(rng);
  for (auto& e : x.q) e = 2.0f * nd(rng);
  return x;
}

}  // namespace kvsift_test
