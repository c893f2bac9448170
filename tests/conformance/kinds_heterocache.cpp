// SPDX-License-Identifier: Apache-2.0
// HeteroCache kinds (SPEC.md budget.heterocache, method.heterocache.prefill,
// method.heterocache.decode): the inverse-stability budgets from budget/inverse_stability.hpp,
// the prefill scores of score::last_query_attention, and the placement and decode lifecycle of
// HeteroCache's recipe over a store::tiered<float>: the handler bodies of two_tier_kinds.hpp on
// the host backend.

#include "kinds_host.hpp"
#include "runner.hpp"
#include "two_tier_kinds.hpp"

#include <kvsift/budget/inverse_stability.hpp>
#include <kvsift/score/last_query_attention.hpp>
#include <kvsift/store/tiered.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvsift::conformance {

// Host arithmetic on every backend (kinds_host.hpp).
void budget_heterocache_kind(const case_data& c, outputs& out) {
  using role = kvsift::calibrate::head_role;
  const auto& roles = c.in("roles");
  const auto& stab = c.in("stability");
  const int L = dim(roles, 0), H = dim(roles, 1);
  std::vector<role> r;
  for (const auto v : roles.i32) r.push_back(static_cast<role>(v));
  const auto caps =
      kvsift::budget::inverse_stability_caps(r, stab.f32, H, param(c, "n"), c.param_d("rho"));
  out.put_i32("base", {1}, {caps.base});
  out.put_i32("cap", {L, H}, {caps.cap.begin(), caps.cap.end()});
}

}  // namespace kvsift::conformance

namespace {
namespace kc = kvsift::conformance;
using kc::dim;
using kc::head_major;
using kc::param;

// The prefill scorer on its own (score::last_query_attention over a store::tiered).
void host_scores(const kc::case_data& c, kc::outputs& out) {
  const auto& k = c.in("keys");
  const auto& q = c.in("query");
  const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
  kvsift::store::tiered<float> st0(kvsift::model_shape{1, hq, h, d}, 1, n);
  st0.append(0, 0, head_major(k.f32.data(), h, n, d), head_major(k.f32.data(), h, n, d), 0);
  const kvsift::score::last_query_attention sc{
      {.kernel = param(c, "kernel"), .pool = kvsift::pooling::avg, .gqa = kvsift::gqa_reduce::max}};
  const int req = 0;
  const auto qv = head_major(q.f32.data(), hq, 1, d);
  const std::int32_t qpos = n - 1;
  kvsift::score_sets scores;
  sc.score(kvsift::score_input<kvsift::store::tiered<float>>{&st0, 0,
                                                             kvsift::lifecycle_event::prefill_end,
                                                             {&req, 1}, {&qv, 1}, {&qpos, 1}, {}},
           scores);
  out.put_f32("scores", {h, n}, scores.values);
}

const kc::registrar budget_heterocache{"budget.heterocache", kc::budget_heterocache_kind};

const kc::registrar method_heterocache_prefill{
    "method.heterocache.prefill", [](const kc::case_data& c, kc::outputs& out) {
      kc::two_tier_kinds::heterocache_prefill<kc::method_kinds::host_backend>(c, out, host_scores);
    }};

const kc::registrar method_heterocache_decode{
    "method.heterocache.decode",
    kc::two_tier_kinds::heterocache_decode<kc::method_kinds::host_backend>};

}  // namespace
