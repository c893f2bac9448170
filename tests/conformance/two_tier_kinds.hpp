// SPDX-License-Identifier: Apache-2.0
#pragma once

// The two-tier methods' kinds (SPEC.md §5), one handler body per kind templated on a backend B
// (method_kinds.hpp: host_backend; thrust/device_backend.hpp: device_backend<E>):
//
//   method.synckv.decode  method.heterocache.prefill  method.heterocache.decode
//   method.freekv.decode
//
// Each body builds the library's recipe over the backend's two-tier store,
// B::tiered_method<Recipe> (kvsift::method<store::tiered<float>, Recipe> on the host,
// method<thrust::tiered_store<float, E>, Recipe, E> on a simulated device), behind the erased
// lifecycle, drives one layer as an engine would (the prompt in one last chunk with its last
// query, then decode / attend / after_attention per step) and reads the plan and attention
// output through that interface; the method's own flags through the wrapper's get() (SyncKV's
// anticipated() and FreeKV's corrections(), the same accessors on both; HeteroCache's per-head
// drift, the interface's on the host and the device state's by slot, each one counted read, on a
// device).
//
// method.heterocache.prefill's `scores` output is the prefill scorer on its own (a component,
// not the method): the caller passes that part in (score::last_query_attention on the host, the
// Thrust scorer on the device), as method_kinds::quest_select's per-query-head form.

#include "method_kinds.hpp"

#include <kvsift/core/error.hpp>
#include <kvsift/calibrate/star_cluster.hpp>
#include <kvsift/method/freekv.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/synckv.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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

namespace detail {

inline void check_heterocache_scoring(const case_data& c, std::string_view where) {
  kvsift::require(c.param_s("pooling") == "avg", where, "pooling", c.param_s("pooling"),
                  "\"avg\" (HeteroCache pools its last-query attention with avg)");
  kvsift::require(c.param_s("gqa") == "max", where, "gqa", c.param_s("gqa"),
                  "\"max\" (HeteroCache's runtime scores)");
}

// One layer's roles from role codes and leaders (stability unused: the caps are given).
inline kvsift::heterocache_recipe::layer_roles layer_of(const std::vector<std::int32_t>& codes,
                                                        const std::vector<std::int32_t>& leader) {
  kvsift::heterocache_recipe::layer_roles x;
  for (const auto v : codes) x.roles.push_back(static_cast<kvsift::calibrate::head_role>(v));
  x.leader = leader;
  x.stability.assign(codes.size(), 1.0f);
  return x;
}

// The last check's median and drift flag of KV head h of (request 0, layer 0).
template <class M>
std::pair<double, bool> drift_of(const M& m, int h) {
  if constexpr (M::exec_type::host_visible) {
    return {m.drift_median(0, 0, h), m.drifted(0, 0, h)};
  } else {
    const auto slot = m.slot(0, 0);
    return {m.schedule_state().drift_median(slot, h), m.schedule_state().drifted(slot, h)};
  }
}

}  // namespace detail

// scores(c, out) puts the prefill scorer's `scores` on its own.
template <class B, class Scores>
void heterocache_prefill(const case_data& c, outputs& out, Scores&& scores) {
  namespace mk = method_kinds::detail;
  detail::check_heterocache_scoring(c, "method.heterocache.prefill");
  scores(c, out);
  // kept: the method's placement, every head an anchor with the given cap
  const auto& k = c.in("keys");
  const auto& q = c.in("query");
  const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
  using M = typename B::template tiered_method<kvsift::heterocache_recipe>;
  typename M::params p;
  p.kernel = param(c, "kernel");
  p.roles.push_back(detail::layer_of(std::vector<std::int32_t>(static_cast<std::size_t>(h), 0),
                                     std::vector<std::int32_t>(static_cast<std::size_t>(h), -1)));
  p.fixed = kvsift::heterocache_recipe::fixed_budget{0, c.in("cap").i32};
  auto m = B::template make<M>("heterocache", kvsift::model_shape{1, hq, h, d}, 1, n, std::move(p));
  // the prompt's values are the keys (prefill kinds check kept sets only)
  mk::prefill_one(*m, 0,
                  {.request = 0, .keys = mk::layer_view(k), .values = mk::layer_view(k),
                   .queries = mk::layer_view(q), .first_position = 0, .last = true});
  kvsift::index_sets kept;
  for (int hh = 0; hh < h; ++hh) kept.push_back(mk::positions(*m, 0, hh));
  mk::put_csr(out, "kept", kept);
}

template <class B>
void heterocache_decode(const case_data& c, outputs& out) {
  namespace mk = method_kinds::detail;
  detail::check_heterocache_scoring(c, "method.heterocache.decode");
  using M = typename B::template tiered_method<kvsift::heterocache_recipe>;
  typename M::params p;
  p.tau_drift = c.param_d("tau_drift");
  p.drift_window = param(c, "drift_window");
  p.kernel = param(c, "kernel");
  p.roles.push_back(detail::layer_of(c.in("roles").i32, c.in("leader").i32));
  p.fixed = kvsift::heterocache_recipe::fixed_budget{c.in("base").i32.at(0), c.in("cap").i32};
  auto m = B::template make<M>("heterocache", mk::decode_shape(c, 0), 1, mk::decode_capacity(c),
                               std::move(p));
  mk::prefill_one(*m, 0, mk::prompt(c, mk::layer_view(c.in("query"))));

  const auto& sq = c.in("step_queries");
  const auto& sk = c.in("step_keys");
  const auto& sv = c.in("step_values");
  const int T = dim(sq, 0), hq = dim(sq, 1), d = dim(sq, 2), h = dim(sk, 1);
  kvsift::index_sets plan;
  std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
  std::vector<std::int32_t> drift;
  std::vector<float> median;
  for (int t = 0; t < T; ++t) {
    const mk::token tok{0, sq.f32.data() + static_cast<std::size_t>(t) * hq * d,
                        sk.f32.data() + static_cast<std::size_t>(t) * h * d,
                        sv.f32.data() + static_cast<std::size_t>(t) * h * d};
    const std::span<const mk::token> toks(&tok, 1);
    const auto& pl = m->decode(0, toks);
    for (int hh = 0; hh < h; ++hh) plan.push_back(pl.positions[hh]);
    m->attend(0, toks, o.data() + static_cast<std::size_t>(t) * hq * d);
    m->after_attention(0, toks);
    for (int hh = 0; hh < h; ++hh) {
      const auto [med, drifted] = detail::drift_of(m->get(), hh);
      drift.push_back(drifted ? 1 : 0);
      median.push_back(static_cast<float>(med));
    }
  }
  mk::put_csr(out, "plan", plan);
  out.put_f32("out", {T, hq, d}, std::move(o));
  out.put_i32("drift", {T, h}, std::move(drift));
  out.put_f32("drift_median", {T, h}, std::move(median));
}

template <class B>
void freekv_decode(const case_data& c, outputs& out) {
  namespace mk = method_kinds::detail;
  using M = typename B::template tiered_method<kvsift::freekv_recipe>;
  const int layer = param(c, "layer"), ps = param(c, "page_size");
  auto m = B::template make_paged<M>(
      "freekv", mk::decode_shape(c, layer), 1, mk::decode_capacity(c), ps,
      typename M::params{.page_size = ps,
                         .budget = param(c, "budget"),
                         .sink = param(c, "sink"),
                         .window = param(c, "window"),
                         .tau = c.param_d("tau"),
                         .merge = kvsift::score::parse_freekv_merge(c.param_s("merge")),
                         .dense_layers = param(c, "dense_layers")});
  mk::prefill_one(*m, layer, mk::prompt(c, {}));  // the case's prompt has no queries

  const auto& sq = c.in("step_queries");
  const auto& sk = c.in("step_keys");
  const auto& sv = c.in("step_values");
  const int T = dim(sq, 0), hq = dim(sq, 1), d = dim(sq, 2), h = dim(sk, 1);
  kvsift::index_sets plan, pages;
  std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
  std::vector<std::int32_t> correct;
  for (int t = 0; t < T; ++t) {
    const mk::token tok{0, sq.f32.data() + static_cast<std::size_t>(t) * hq * d,
                        sk.f32.data() + static_cast<std::size_t>(t) * h * d,
                        sv.f32.data() + static_cast<std::size_t>(t) * h * d};
    const std::span<const mk::token> toks(&tok, 1);
    const auto& pl = m->decode(layer, toks);
    const auto& fixes = m->get().corrections();  // per KV head of this step's segment
    for (int hh = 0; hh < h; ++hh) {
      plan.push_back(pl.positions[hh]);
      pages.push_back(pl.pages[hh]);
      correct.push_back(fixes[static_cast<std::size_t>(hh)]);
    }
    m->attend(layer, toks, o.data() + static_cast<std::size_t>(t) * hq * d);
    m->after_attention(layer, toks);
  }
  mk::put_csr(out, "plan", plan);
  out.put_f32("out", {T, hq, d}, std::move(o));
  mk::put_csr(out, "pages", pages);
  out.put_i32("correct", {T, h}, std::move(correct));
}

}  // namespace kvsift::conformance::two_tier_kinds
