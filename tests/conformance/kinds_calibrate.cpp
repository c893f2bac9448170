// SPDX-License-Identifier: Apache-2.0
// Calibration kinds (SPEC.md §5): calibrate.topk_sets, calibrate.overlap, calibrate.stability,
// calibrate.kmeans and calibrate.star_cluster, each one call of include/kvsift/calibrate/.

#include "runner.hpp"

#include <kvsift/calibrate/all.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace {
namespace kc = kvsift::conformance;
namespace cal = kvsift::calibrate;

using kc::dim;
using kc::param;

// Rows of a dense i32 [rows, k] tensor (starting at row `first`) as index sets.
cal::head_sets dense_sets(const kc::tensor& t, int first, int rows) {
  const int k = dim(t, t.rank() - 1);
  cal::head_sets out;
  for (int r = 0; r < rows; ++r) {
    const auto* p = t.i32.data() + static_cast<std::size_t>(first + r) * k;
    out.emplace_back(p, p + k);
  }
  return out;
}

const kc::registrar topk_sets{
    "calibrate.topk_sets", [](const kc::case_data& c, kc::outputs& out) {
      const auto& a = c.in("attention");
      const int T = dim(a, 0), hq = dim(a, 1), n = dim(a, 2);
      cal::topk_params p{.k = param(c, "k"), .group = param(c, "G"),
                         .kernel = param(c, "kernel")};
      if (p.kernel > 1) p.pool = kvsift::parse_pooling(c.param_s("pooling"));
      p.gqa = kvsift::parse_gqa_reduce(c.param_s("gqa"));
      std::vector<std::int32_t> values;
      cal::head_sets sets;
      for (int t = 0; t < T; ++t) {
        const std::span<const float> rows(a.f32.data() + static_cast<std::size_t>(t) * hq * n,
                                          static_cast<std::size_t>(hq) * n);
        cal::topk_sets(rows, hq, n, p, sets);
        for (const auto& s : sets) values.insert(values.end(), s.begin(), s.end());
      }
      const int H = hq / p.group;
      const int k = H > 0 && T > 0 ? static_cast<int>(values.size()) / (T * H) : 0;
      out.put_i32("sets", {T, H, k}, std::move(values));
    }};

const kc::registrar overlap{
    "calibrate.overlap", [](const kc::case_data& c, kc::outputs& out) {
      const auto& v = c.in("sets");
      const auto& off = c.in("sets_offsets");
      const int R = static_cast<int>(off.numel()) - 1;
      cal::head_sets sets;
      for (int r = 0; r < R; ++r) {
        sets.emplace_back(v.i32.begin() + off.i32[static_cast<std::size_t>(r)],
                          v.i32.begin() + off.i32[static_cast<std::size_t>(r) + 1]);
      }
      out.put_f32("overlap", {R, R}, cal::overlap_matrix(sets));
    }};

const kc::registrar stability{
    "calibrate.stability", [](const kc::case_data& c, kc::outputs& out) {
      const auto& pre = c.in("prefill_sets");
      const auto& st = c.in("step_sets");
      const int H = dim(pre, 0), T = dim(st, 0);
      if (T != param(c, "T")) throw kc::runner_error("step_sets: first dim != T");
      std::vector<cal::head_sets> steps;
      for (int t = 0; t < T; ++t) steps.push_back(dense_sets(st, t * H, H));
      out.put_f32("stability", {H}, cal::stability(dense_sets(pre, 0, H), steps));
    }};

const kc::registrar kmeans{
    "calibrate.kmeans", [](const kc::case_data& c, kc::outputs& out) {
      const auto& s = c.in("similarity");
      const int H = dim(s, 0);
      const auto r = cal::kmeans_roles(
          s.f32, H, {.clusters = param(c, "clusters"), .max_iter = param(c, "max_iter")});
      out.put_i32("assign", {H}, r.assign);
      out.put_i32("representative", {static_cast<std::int64_t>(r.representative.size())},
                  r.representative);
    }};

const kc::registrar star_cluster{
    "calibrate.star_cluster", [](const kc::case_data& c, kc::outputs& out) {
      const auto& s = c.in("similarity");
      const auto& st = c.in("stability");
      const int H = dim(st, 0);
      const auto r = cal::star_cluster(
          s.f32, st.f32, {.tau_sim = c.param_d("tau_sim"), .tau_stable = c.param_d("tau_stable")});
      std::vector<std::int32_t> roles;
      for (const auto role : r.roles) roles.push_back(static_cast<std::int32_t>(role));
      out.put_i32("roles", {H}, std::move(roles));
      out.put_i32("leader", {H}, r.leader);
    }};

}  // namespace
