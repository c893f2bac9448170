// SPDX-License-Identifier: Apache-2.0
#pragma once

// The two-tier methods' kinds (SPEC.md §5), one handler body per kind templated on a backend B
// (method_kinds.hpp: host_backend; thrust/device_backend.hpp: device_backend<E>):
//
//   method.synckv.decode
//
// Each body builds the library's recipe over the backend's two-tier store,
// B::tiered_method<Recipe> (kvsift::method<store::tiered<float>, Recipe> on the host,
// method<thrust::tiered_store<float, E>, Recipe, E> on a simulated device), behind the erased
// lifecycle, drives one layer as an engine would (the prompt in one last chunk with its last
// query, then decode / attend / after_attention per step) and reads the plan and attention
// output through that interface; the method's own flags (SyncKV's anticipated()) through the
// wrapper's get(), the same accessor on both.

#include "method_kinds.hpp"

#include <kvsift/core/error.hpp>
#include <kvsift/method/synckv.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvsift::conformance::two_tier_kinds {

template <class B>
void synckv_decode(const case_data& c, outputs& out) {
  namespace mk = method_kinds::detail;
  kvsift::require(c.param_s("gqa") == "max", "method.synckv.decode", "gqa", c.param_s("gqa"),
                  "\"max\" (SyncKV's runtime scores)");
  using M = typename B::template tiered_method<kvsift::synckv_recipe>;
  typename M::params p{.clusters = param(c, "clusters"),
                       .stride = param(c, "stride"),
                       .rho = c.param_d("rho"),
                       .memory_fraction = c.param_d("memory_fraction"),
                       .roles = std::vector<kvsift::select::cluster_roles>(1)};
  p.roles[0].assign.assign(c.in("assign").i32.begin(), c.in("assign").i32.end());
  p.roles[0].representatives.assign(c.in("representative").i32.begin(),
                                    c.in("representative").i32.end());
  auto m = B::template make<M>("synckv", mk::decode_shape(c, 0), 1, mk::decode_capacity(c),
                               std::move(p));
  mk::prefill_one(*m, 0, mk::prompt(c, mk::layer_view(c.in("query"))));

  const auto& sq = c.in("step_queries");
  const auto& sk = c.in("step_keys");
  const auto& sv = c.in("step_values");
  const int T = dim(sq, 0), hq = dim(sq, 1), d = dim(sq, 2), h = dim(sk, 1);
  kvsift::index_sets plan;
  std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
  std::vector<std::int32_t> anticipation;
  for (int t = 0; t < T; ++t) {
    const mk::token tok{0, sq.f32.data() + static_cast<std::size_t>(t) * hq * d,
                        sk.f32.data() + static_cast<std::size_t>(t) * h * d,
                        sv.f32.data() + static_cast<std::size_t>(t) * h * d};
    const std::span<const mk::token> toks(&tok, 1);
    const auto& pl = m->decode(0, toks);
    for (int hh = 0; hh < h; ++hh) plan.push_back(pl.positions[hh]);
    m->attend(0, toks, o.data() + static_cast<std::size_t>(t) * hq * d);
    m->after_attention(0, toks);
    anticipation.push_back(m->get().anticipated(0, 0) ? 1 : 0);
  }
  mk::put_csr(out, "plan", plan);
  out.put_f32("out", {T, hq, d}, std::move(o));
  out.put_i32("anticipation", {T}, std::move(anticipation));
}

}  // namespace kvsift::conformance::two_tier_kinds
