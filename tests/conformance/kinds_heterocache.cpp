// SPDX-License-Identifier: Apache-2.0
// HeteroCache kinds (SPEC.md budget.heterocache, method.heterocache.prefill,
// method.heterocache.decode): the inverse-stability budgets from budget/inverse_stability.hpp,
// the prefill scores of score::last_query_attention, and the placement and decode lifecycle
// through method/heterocache.hpp over a store::tiered<float> and transfer::async<float> —
// prefill(layer, chunk) with the last prefill query, then decode / attend / after_attention per
// step, as an engine would call them.

#include "kinds_host.hpp"
#include "runner.hpp"

#include <kvsift/budget/inverse_stability.hpp>
#include <kvsift/method/heterocache.hpp>
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
using role = kvsift::calibrate::head_role;
using method = kvsift::heterocache<float>;

void check_scoring(const kc::case_data& c, std::string_view where) {
  kvsift::require(c.param_s("pooling") == "avg", where, "pooling", c.param_s("pooling"),
                  "\"avg\" (HeteroCache pools its last-query attention with avg)");
  kvsift::require(c.param_s("gqa") == "max", where, "gqa", c.param_s("gqa"),
                  "\"max\" (HeteroCache's runtime scores)");
}

// One layer's roles from role codes and leaders (stability unused: the caps are given).
method::layer_roles layer_of(const std::vector<std::int32_t>& codes,
                             const std::vector<std::int32_t>& leader) {
  method::layer_roles x;
  for (const auto v : codes) x.roles.push_back(static_cast<role>(v));
  x.leader = leader;
  x.stability.assign(codes.size(), 1.0f);
  return x;
}

const kc::registrar budget_heterocache{"budget.heterocache", kc::budget_heterocache_kind};

const kc::registrar method_heterocache_prefill{
    "method.heterocache.prefill", [](const kc::case_data& c, kc::outputs& out) {
      check_scoring(c, "method.heterocache.prefill");
      const auto& k = c.in("keys");
      const auto& q = c.in("query");
      const auto& cap = c.in("cap");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
      // scores: the prefill scorer on its own
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
      // kept: the method's placement, every head an anchor with the given cap
      kvsift::store::tiered<float> st(kvsift::model_shape{1, hq, h, d}, 1, n);
      method::params p;
      p.kernel = param(c, "kernel");
      p.roles.push_back(layer_of(std::vector<std::int32_t>(static_cast<std::size_t>(h), 0),
                                 std::vector<std::int32_t>(static_cast<std::size_t>(h), -1)));
      p.fixed = method::fixed_budget{0, cap.i32};
      method m(st, p);
      m.prefill(0, kvsift::prefill_chunk<float>{.request = 0,
                                                .keys = head_major(k.f32.data(), h, n, d),
                                                .values = head_major(k.f32.data(), h, n, d),
                                                .queries = qv,
                                                .first_position = 0,
                                                .last = true});
      kvsift::index_sets kept;
      for (int hh = 0; hh < h; ++hh) {
        std::vector<std::int32_t> pos;
        const auto seq = st.shape().sequence(0, 0, hh);
        for (int i = 0; i < st.length(seq); ++i) pos.push_back(st.position(seq, i));
        kept.push_back(pos);
      }
      out.put_i32("kept", {static_cast<std::int64_t>(kept.values.size())}, kept.values);
      out.put_i32("kept_offsets", {static_cast<std::int64_t>(kept.offsets.size())}, kept.offsets);
    }};

const kc::registrar method_heterocache_decode{
    "method.heterocache.decode", [](const kc::case_data& c, kc::outputs& out) {
      check_scoring(c, "method.heterocache.decode");
      const auto& k = c.in("keys");
      const auto& v = c.in("values");
      const auto& q = c.in("query");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
      const int T = dim(sq, 0);
      kvsift::store::tiered<float> st(kvsift::model_shape{1, hq, h, d}, 1, n + T);
      method::params p;
      p.tau_drift = c.param_d("tau_drift");
      p.drift_window = param(c, "drift_window");
      p.kernel = param(c, "kernel");
      p.roles.push_back(layer_of(c.in("roles").i32, c.in("leader").i32));
      p.fixed = method::fixed_budget{c.in("base").i32.at(0), c.in("cap").i32};
      method m(st, p);
      m.prefill(0, kvsift::prefill_chunk<float>{.request = 0,
                                                .keys = head_major(k.f32.data(), h, n, d),
                                                .values = head_major(v.f32.data(), h, n, d),
                                                .queries = head_major(q.f32.data(), hq, 1, d),
                                                .first_position = 0,
                                                .last = true});
      kvsift::index_sets plan;
      std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
      std::vector<std::int32_t> drift;
      std::vector<float> median;
      for (int t = 0; t < T; ++t) {
        const kvsift::decode_token<float> tok{0, sq.f32.data() + static_cast<std::size_t>(t) * hq * d,
                                              sk.f32.data() + static_cast<std::size_t>(t) * h * d,
                                              sv.f32.data() + static_cast<std::size_t>(t) * h * d};
        const auto& pl = m.decode(0, tok);
        for (int hh = 0; hh < h; ++hh) plan.push_back(pl.positions[hh]);
        m.attend(0, std::span<const kvsift::decode_token<float>>(&tok, 1),
                 o.data() + static_cast<std::size_t>(t) * hq * d);
        m.after_attention(0, tok);
        for (int hh = 0; hh < h; ++hh) {
          drift.push_back(m.drifted(0, 0, hh) ? 1 : 0);
          median.push_back(static_cast<float>(m.drift_median(0, 0, hh)));
        }
      }
      out.put_i32("plan", {static_cast<std::int64_t>(plan.values.size())}, plan.values);
      out.put_i32("plan_offsets", {static_cast<std::int64_t>(plan.offsets.size())}, plan.offsets);
      out.put_f32("out", {T, hq, d}, std::move(o));
      out.put_i32("drift", {T, h}, std::move(drift));
      out.put_f32("drift_median", {T, h}, std::move(median));
    }};

}  // namespace
