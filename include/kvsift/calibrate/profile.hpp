// SPDX-License-Identifier: Apache-2.0
#pragma once

// Offline head profiling of one layer for SyncKV and HeteroCache (METHODS.md "SyncKV" /
// Calibration and "HeteroCache" / Profiling). The inputs are the query of a profiled step and
// the keys it sees; the outputs are the matrices the role assignment (kmeans.hpp,
// star_cluster.hpp) consumes.
//
//   last_query_attention   softmax(q . k / sqrt(d)) of one query per query head over n keys
//                          (query head h reads KV head h / G), as score::last_query_attention;
//   synckv_similarity      S_ij = mean over profiled steps of overlap(set_i, set_j);
//   heterocache_profile    similarity = overlap matrix of the prefill sets, stability = median
//                          over decode steps of overlap(prefill set, step set).
//
// Default top-k sizes: SyncKV floor(n / 5) (a parameter), HeteroCache min(1024, floor(n / 5)),
// n the prompt length. Several prompts are combined by the caller (the kvsift CLI averages the
// per-prompt matrices, docs/calibration.md).

#include <kvsift/calibrate/overlap.hpp>
#include <kvsift/calibrate/topk_sets.hpp>
#include <kvsift/core/dot.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/math.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace kvsift::calibrate {

// Parameters of the two profiles (METHODS.md defaults).
struct synckv_profile_params {
  int clusters = 2;              // N_r
  int topk = 0;                  // k per set; 0 = floor(n / 5)
};
struct heterocache_profile_params {
  int kernel = 5;                // avg pooling
  int topk_cap = 1024;           // k = min(topk_cap, floor(n / 5))
  double tau_sim = 0.5;
  double tau_stable = 0.5;
};

[[nodiscard]] inline int synckv_topk(int n, const synckv_profile_params& p) {
  return p.topk > 0 ? p.topk : n / 5;
}
[[nodiscard]] inline int heterocache_topk(int n, const heterocache_profile_params& p) {
  return std::min(p.topk_cap, n / 5);
}

// out [q_heads, n] = per query head the softmax of q[h] . keys[t, h / G] / sqrt(d), t < n.
// q [q_heads, d]; keys token-major [n, kv_heads, d] (row t, head g at (t * kv_heads + g) * d).
inline void last_query_attention(std::span<const float> q, std::span<const float> keys, int n,
                                 int q_heads, int kv_heads, int d, std::vector<float>& out) {
  constexpr std::string_view where = "calibrate::last_query_attention";
  require(kv_heads > 0 && q_heads > 0 && q_heads % kv_heads == 0, where, "q_heads", q_heads,
          "a positive multiple of kv_heads (" + std::to_string(kv_heads) + ")");
  require(d > 0, where, "d", d, "> 0");
  require(n > 0, where, "n", n, "> 0");
  require(q.size() == static_cast<std::size_t>(q_heads) * d, where, "q.size()", q.size(),
          "q_heads * d");
  require(keys.size() >= static_cast<std::size_t>(n) * kv_heads * d, where, "keys.size()",
          keys.size(), "at least n * kv_heads * d = " + std::to_string(n * kv_heads * d));
  const int G = q_heads / kv_heads;
  const auto N = static_cast<std::size_t>(n);
  out.resize(static_cast<std::size_t>(q_heads) * N);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int h = 0; h < q_heads; ++h) {
    const float* qh = q.data() + static_cast<std::size_t>(h) * d;
    const int g = h / G;
    std::span<float> row(out.data() + static_cast<std::size_t>(h) * N, N);
    for (std::size_t t = 0; t < N; ++t) {
      row[t] = kvsift::dot(qh, keys.data() + (t * kv_heads + g) * d, d) * scale;
    }
    cpu::softmax(row);
  }
}

// SyncKV: S [H, H] = mean over the profiled steps of overlap_matrix(steps[t]).
[[nodiscard]] inline std::vector<float> synckv_similarity(const std::vector<head_sets>& steps) {
  require(!steps.empty(), "calibrate::synckv_similarity", "steps.size()", 0,
          "at least 1 profiled step");
  const std::size_t H = steps[0].size();
  std::vector<double> acc(H * H, 0.0);
  for (std::size_t t = 0; t < steps.size(); ++t) {
    require(steps[t].size() == H, "calibrate::synckv_similarity",
            "steps[" + std::to_string(t) + "].size()", steps[t].size(),
            "one set per head (" + std::to_string(H) + ")");
    const auto m = overlap_matrix(steps[t]);
    for (std::size_t i = 0; i < H * H; ++i) {
      acc[i] += m[i];
    }
  }
  std::vector<float> s(H * H);
  for (std::size_t i = 0; i < H * H; ++i) {
    s[i] = static_cast<float>(acc[i] / static_cast<double>(steps.size()));
  }
  return s;
}

// HeteroCache: the similarity [H, H] of the prefill sets and the stability [H] of each head.
struct heterocache_layer_profile {
  std::vector<float> similarity;
  std::vector<float> stability;
};

[[nodiscard]] inline heterocache_layer_profile heterocache_profile(
    const head_sets& prefill, const std::vector<head_sets>& steps) {
  return {overlap_matrix(prefill), stability(prefill, steps)};
}

}  // namespace kvsift::calibrate
