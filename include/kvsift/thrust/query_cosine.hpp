// SPDX-License-Identifier: Apache-2.0
#pragma once

// FreeKV's query-similarity correction trigger with Thrust. Mirrors trigger::query_cosine's
// decision (cos_mean, then `corrects`): for each group of `group` query heads (one KV head), the
// mean over the group of cos(q_t, q_{t-1}), each cosine in double (dot and both squared norms
// accumulated in double over the channels in order, 0 when either norm is 0), the mean taken in
// double and stored as float; the group asks for a correction when that float is below tau
// (strict, compared in double). Same operation order as the CPU, so the same bits under g++.
//
// Stateless: the caller keeps the previous step's queries on the device (trigger::query_cosine
// keeps them per KV head on the host) and passes both. One thread per group; no workspace.
// Cost O(groups * group * d).

#include <kvsift/trigger/query_cosine.hpp>
#include <kvsift/thrust/common.hpp>

#include <cmath>
#include <cstdint>
#include <string_view>

namespace kvsift::thrust {

namespace detail {

struct query_cosine_fn {
  const float* q;
  const float* prev;
  int group;
  int d;
  double tau;
  float* cos_mean;
  std::int32_t* correct;
  KVSIFT_HOST_DEVICE void operator()(int k) const {
    const std::int64_t at = static_cast<std::int64_t>(k) * group * d;
    const float c = kvsift::trigger::group_cos_mean(q + at, prev + at, group, d);
    if (cos_mean != nullptr) {
      cos_mean[k] = c;
    }
    correct[k] = c < tau ? 1 : 0;
  }
};

}  // namespace detail

// For each of `groups` groups (request r's KV head h is group r * kv_heads + h):
//   cos_mean[k] = mean over g of cos(q[k, g], prev[k, g])   (may be null)
//   correct[k]  = 1 if cos_mean[k] < tau else 0
// q, prev: [groups, group, d] (a decode step's [q_heads, d] per request, requests in turn).
// tau must be a cosine threshold in [-1, 1] (trigger::query_cosine::validate).
template <class Policy>
void query_cosine_decisions(const Policy& exec, const float* q, const float* prev, int groups,
                            int group, int d, double tau, float* cos_mean, std::int32_t* correct) {
  constexpr std::string_view where = "thrust::query_cosine_decisions";
  require(std::isfinite(tau) && tau >= -1.0 && tau <= 1.0, where, "tau", tau,
          "a cosine threshold in [-1, 1]");
  require(groups >= 0, where, "groups", groups, ">= 0");
  require(group > 0, where, "group", group, "> 0");
  require(d > 0, where, "d", d, "> 0");
  require(groups == 0 || (q != nullptr && prev != nullptr && correct != nullptr), where,
          "q / prev / correct", "null", "[groups, group, d] queries and [groups] decisions");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<int>(0), groups,
                       detail::query_cosine_fn{q, prev, group, d, tau, cos_mean, correct});
}

}  // namespace kvsift::thrust
