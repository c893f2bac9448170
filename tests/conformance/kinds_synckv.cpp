// SPDX-License-Identifier: Apache-2.0
// SyncKV kinds (SPEC.md budget.synckv, method.synckv.decode): the follower budget from
// budget/synckv.hpp, and one layer's decode lifecycle through method/synckv.hpp over a
// store::tiered<float> and transfer::async<float> — prefill(layer, chunk) with the last prefill
// query, then decode / attend / after_attention per step, as an engine would call them.

#include "kinds_host.hpp"
#include "runner.hpp"

#include <kvsift/budget/synckv.hpp>
#include <kvsift/method/synckv.hpp>
#include <kvsift/store/tiered.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kvsift::conformance {

// Host arithmetic on every backend (kinds_host.hpp).
void budget_synckv_kind(const case_data& c, outputs& out) {
  const auto s = kvsift::budget::synckv_budget(param(c, "heads"), param(c, "representatives"),
                                               param(c, "n"), c.param_d("memory_fraction"),
                                               c.param_d("rho"));
  out.put_i32("k", {1}, {s.k});
  out.put_i32("k_static", {1}, {s.k_static});
  out.put_i32("k_dynamic", {1}, {s.k_dynamic});
}

}  // namespace kvsift::conformance

namespace {
namespace kc = kvsift::conformance;
using kc::dim;
using kc::head_major;
using kc::param;

const kc::registrar budget_synckv{"budget.synckv", kc::budget_synckv_kind};

const kc::registrar method_synckv_decode{
    "method.synckv.decode", [](const kc::case_data& c, kc::outputs& out) {
      kvsift::require(c.param_s("gqa") == "max", "method.synckv.decode", "gqa", c.param_s("gqa"),
                      "\"max\" (SyncKV's runtime scores)");
      const auto& k = c.in("keys");
      const auto& v = c.in("values");
      const auto& q = c.in("query");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
      const int T = dim(sq, 0);
      kvsift::store::tiered<float> st(kvsift::model_shape{1, hq, h, d}, 1, n + T);
      kvsift::synckv<float>::params p{.clusters = param(c, "clusters"),
                                      .stride = param(c, "stride"),
                                      .rho = c.param_d("rho"),
                                      .memory_fraction = c.param_d("memory_fraction"),
                                      .roles = std::vector<kvsift::select::cluster_roles>(1)};
      p.roles[0].assign.assign(c.in("assign").i32.begin(), c.in("assign").i32.end());
      p.roles[0].representatives.assign(c.in("representative").i32.begin(),
                                        c.in("representative").i32.end());
      kvsift::synckv<float> m(st, p);
      m.prefill(0, kvsift::prefill_chunk<float>{.request = 0,
                                                .keys = head_major(k.f32.data(), h, n, d),
                                                .values = head_major(v.f32.data(), h, n, d),
                                                .queries = head_major(q.f32.data(), hq, 1, d),
                                                .first_position = 0,
                                                .last = true});
      kvsift::index_sets plan;
      std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
      std::vector<std::int32_t> anticipation;
      for (int t = 0; t < T; ++t) {
        const kvsift::decode_token<float> tok{0, sq.f32.data() + static_cast<std::size_t>(t) * hq * d,
                                              sk.f32.data() + static_cast<std::size_t>(t) * h * d,
                                              sv.f32.data() + static_cast<std::size_t>(t) * h * d};
        const auto& pl = m.decode(0, tok);
        for (int hh = 0; hh < h; ++hh) plan.push_back(pl.positions[hh]);
        m.attend(0, std::span<const kvsift::decode_token<float>>(&tok, 1),
                 o.data() + static_cast<std::size_t>(t) * hq * d);
        m.after_attention(0, tok);
        anticipation.push_back(m.anticipated(0, 0) ? 1 : 0);
      }
      out.put_i32("plan", {static_cast<std::int64_t>(plan.values.size())}, plan.values);
      out.put_i32("plan_offsets", {static_cast<std::int64_t>(plan.offsets.size())}, plan.offsets);
      out.put_f32("out", {T, hq, d}, std::move(o));
      out.put_i32("anticipation", {T}, std::move(anticipation));
    }};

}  // namespace
