// SPDX-License-Identifier: Apache-2.0
#pragma once

// The per-prompt profiling `kvsift calibrate` runs on each prompt trace (from the engine or a
// trace file): top-k sets of the last query's attention at every profiled step, and the
// per-layer sums of the SyncKV similarity or the HeteroCache similarity and stability.

#include "calibration_trace.hpp"

#include <kvsift/calibrate/all.hpp>

#include <string>
#include <vector>

namespace kvsift::cli {

namespace cal = kvsift::calibrate;

// Per-layer sums over prompts.
struct accumulator {
  int layers = 0, heads = 0, prompts = 0;
  std::vector<std::vector<double>> sim;   // [L][H * H]
  std::vector<std::vector<double>> stab;  // [L][H] (heterocache)

  void init(int L, int H) {
    layers = L;
    heads = H;
    sim.assign(static_cast<std::size_t>(L), std::vector<double>(static_cast<std::size_t>(H) * H));
    stab.assign(static_cast<std::size_t>(L), std::vector<double>(static_cast<std::size_t>(H)));
  }
  [[nodiscard]] std::vector<float> mean(const std::vector<double>& v) const {
    std::vector<float> m(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      m[i] = static_cast<float>(v[i] / static_cast<double>(prompts));
    }
    return m;
  }
};

// The top-k sets of every profiled step of one layer: [0] the prefill step, [t] decode step t.
inline std::vector<cal::head_sets> step_sets(const prompt_trace& tr, int l, const cal::topk_params& p) {
  const auto& s = tr.shape;
  std::vector<cal::head_sets> out;
  std::vector<float> att;
  for (int t = 0; t <= tr.steps; ++t) {
    const int seen = tr.n + t;  // prefill: n keys; decode step t: n + t keys
    cal::last_query_attention(tr.query(l, tr.window - 1 + t), tr.layer_keys(l), seen, s.q_heads,
                              s.kv_heads, s.head_dim, att);
    cal::head_sets sets;
    cal::topk_sets(att, s.q_heads, seen, p, sets);
    out.push_back(std::move(sets));
  }
  return out;
}

inline void profile_prompt(const std::string& method, const prompt_trace& tr, accumulator& acc,
                    const cal::synckv_profile_params& sp,
                    const cal::heterocache_profile_params& hp) {
  const int G = tr.shape.group_size();
  for (int l = 0; l < tr.shape.layers; ++l) {
    const auto L = static_cast<std::size_t>(l);
    if (method == "synckv") {
      const auto sets = step_sets(tr, l,
                                  {.k = cal::synckv_topk(tr.n, sp), .group = G, .kernel = 1,
                                   .gqa = gqa_reduce::max});
      const auto S = cal::synckv_similarity(sets);
      for (std::size_t i = 0; i < S.size(); ++i) acc.sim[L][i] += S[i];
    } else {
      auto sets = step_sets(tr, l,
                            {.k = cal::heterocache_topk(tr.n, hp), .group = G,
                             .kernel = hp.kernel, .pool = pooling::avg, .gqa = gqa_reduce::mean});
      const cal::head_sets prefill = std::move(sets.front());
      sets.erase(sets.begin());
      const auto prof = cal::heterocache_profile(prefill, sets);
      for (std::size_t i = 0; i < prof.similarity.size(); ++i) acc.sim[L][i] += prof.similarity[i];
      for (std::size_t i = 0; i < prof.stability.size(); ++i) acc.stab[L][i] += prof.stability[i];
    }
  }
  ++acc.prompts;
}

}  // namespace kvsift::cli
