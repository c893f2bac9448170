// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/core/config.hpp>
#include <kvsift/core/dot.hpp>
#include <kvsift/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvsift::trigger {

// Mean over a GQA group of cos(a[g], b[g]); a and b are [group, d] row-major. Sums in double, in
// channel order; a zero vector's cosine counts as 0. The one definition both backends run
// (trigger::query_cosine here, thrust/query_cosine.hpp on the device).
KVSIFT_HOST_DEVICE inline float group_cos_mean(const float* a, const float* b, int group, int d) {
  double acc = 0.0;
  for (int g = 0; g < group; ++g) {
    const float* x = a + static_cast<std::int64_t>(g) * d;
    const float* y = b + static_cast<std::int64_t>(g) * d;
    double xy = 0.0, xx = 0.0, yy = 0.0;
    for (int c = 0; c < d; ++c) {
      const double xc = x[c], yc = y[c];
      xy += mul_rn(xc, yc);  // never fused on the device (core/dot.hpp)
      xx += mul_rn(xc, xc);
      yy += mul_rn(yc, yc);
    }
    acc += xx > 0.0 && yy > 0.0 ? xy / std::sqrt(xx * yy) : 0.0;
  }
  return static_cast<float>(acc / group);
}


// Query-similarity correction trigger — FreeKV (Liu et al., 2025, "FreeKV: Boosting KV Cache
// Retrieval for Efficient LLM Inference"). FreeKV reuses, at step t, the pages selected with
// q_{t-1} (speculative retrieval) unless the query moved: for each KV head, the mean over its G
// query heads of cos(q_t, q_{t-1}) below tau asks for a correction (select with q_t and recall
// before attention). The trigger keeps, per KV head (a key the caller chooses, the head-sequence
// id in schedule::speculative), the previous query of its group.
//
// Unlike the lifecycle triggers (trigger/basic.hpp) it decides from queries, so it is not a
// model of the Trigger concept (whose context carries no query): a method calls observe().
// A query of zero norm has cosine 0 with anything (never similar).
// Parameters (paper default): tau 0.8. Cost: O(G d) per KV head and step; state G d floats per
// KV head.
class query_cosine {
 public:
  struct params {
    double tau = 0.8;
  };

  query_cosine() = default;
  explicit query_cosine(params p) : p_(p) { validate("trigger::query_cosine"); }

  void validate(std::string_view where) const {
    require(std::isfinite(p_.tau) && p_.tau >= -1.0 && p_.tau <= 1.0, where, "tau", p_.tau,
            "a cosine threshold in [-1, 1]");
  }
  [[nodiscard]] const params& parameters() const { return p_; }

  // Mean over the group of cos(q[g], prev[g]); q and prev are [group, d] row-major.
  [[nodiscard]] static float cos_mean(const float* q, const float* prev, int group, int d) {
    return group_cos_mean(q, prev, group, d);
  }
  // Whether a cosine mean asks for a correction: cos_mean < tau (strict).
  [[nodiscard]] bool corrects(float cos_mean) const { return cos_mean < p_.tau; }

  struct decision {
    bool first = true;     // no previous query for this key (step 1): nothing to compare
    float cos_mean = 0.0f; // 0 when first
    bool correct = false;  // cos_mean < tau (false when first)
  };

  // Compares the group's query q ([group, d]) with the one observed last for `key`, remembers q
  // and returns the decision.
  decision observe(std::int64_t key, const float* q, int group, int d) {
    require(group > 0, "trigger::query_cosine.observe", "group", group, "> 0");
    require(d > 0, "trigger::query_cosine.observe", "d", d, "> 0");
    auto& prev = previous_[key];
    const std::size_t size = static_cast<std::size_t>(group) * d;
    decision out;
    if (prev.size() == size) {
      out.first = false;
      out.cos_mean = cos_mean(q, prev.data(), group, d);
      out.correct = corrects(out.cos_mean);
    }
    prev.assign(q, q + size);
    return out;
  }

  // Forgets the previous query of `key` (its request ended).
  void forget(std::int64_t key) { previous_.erase(key); }
  void clear() { previous_.clear(); }

 private:
  params p_{};
  std::unordered_map<std::int64_t, std::vector<float>> previous_;  // per KV head: [group, d]
};

}  // namespace kvsift::trigger
