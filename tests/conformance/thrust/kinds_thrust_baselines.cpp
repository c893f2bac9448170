// SPDX-License-Identifier: Apache-2.0
// Thrust handlers of two baseline component kinds: attention.decode (thrust::attention_over) and
// score.h2o_prefill (thrust::cumulative_attention_scores). The baselines' method kinds run the
// library's methods on the device (kinds_thrust_methods.cpp). See kinds_thrust.cpp for the
// conventions.

#include "helpers.hpp"

#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/cumulative_attention.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace {
using namespace kvsift::conformance::thrust_kinds;  // kc, kt, dvec, device_topk, gather_kept, ...

// ---- attention.decode: attention_over -------------------------------------------------------

const kc::registrar attention_decode{
    handlers_backend, "attention.decode", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("queries");
      const auto& k = c.in("keys");
      const auto& v = c.in("values");
      const int hq = dim(q, 0), nq = dim(q, 1), d = dim(q, 2), h = dim(k, 0), n = dim(k, 1);
      kvsift::require(h > 0 && hq == param(c, "G") * h, "attention.decode", "G", param(c, "G"),
                      "q_heads / kv_heads");
      const int G = hq / h;
      const auto exec = ::thrust::device;
      const dvec<float> kd = to_device(k.f32), vd = to_device(v.f32);
      const dvec<float> qd = to_device(swap_outer(q.f32.data(), hq, nq, d));  // [nq, Hq, d]
      const dvec<i32> offsets = to_device(uniform_offsets(h, n));
      const dvec<i32> first = to_device(std::vector<i32>{n - nq});
      const kt::segmented_rows<float> keys{raw(kd), raw(offsets), nullptr, 0, h, d};
      const kt::segmented_rows<float> values{raw(vd), raw(offsets), nullptr, 0, h, d};
      const kt::window_queries wq{raw(qd), raw(first), nq, h, G};
      const std::int64_t N = static_cast<std::int64_t>(h) * n;
      dvec<i32> plan, plan_offsets;
      kt::attention_plan p{};
      std::int64_t M = N;
      if (c.has_input("kept")) {  // a query sees only its KV head's kept keys
        plan = to_device(c.in("kept").i32);
        plan_offsets = to_device(c.in("kept_offsets").i32);
        if (static_cast<int>(plan_offsets.size()) != h + 1) {
          throw kc::runner_error("kept_offsets: one set per KV head expected");
        }
        p = {raw(plan_offsets), raw(plan)};
        M = static_cast<std::int64_t>(plan.size());
      }
      dvec<float> o(static_cast<std::size_t>(nq) * hq * d);
      dvec<float> w(static_cast<std::size_t>(N) * G * nq);  // [H][G][nq][n] = [Hq, nq, n]
      dvec<unsigned char> ws(kt::attention_workspace_bytes(M, G, nq));
      kt::attention_over(exec, keys, values, wq, p, N, M, raw(o), raw(w), raw(ws), ws.size());
      out.put_f32("weights", {hq, nq, n}, to_host(w));
      const auto oh = to_host(o);  // [nq, Hq, d] -> [Hq, nq, d]
      out.put_f32("out", {hq, nq, d}, swap_outer(oh.data(), nq, hq, d));
    }};

// ---- H2O: cumulative_attention_scores ----------------------------------------------------------

// H2O prefill scores of the H KV heads of one request: queries [Hq, nq, d] at n - nq .. n - 1.
dvec<float> h2o_scores(const kc::case_data& c) {
  const auto& q = c.in("queries");
  const auto& k = c.in("keys");
  const int hq = dim(q, 0), nq = dim(q, 1), d = dim(q, 2), h = dim(k, 0), n = dim(k, 1);
  const auto exec = ::thrust::device;
  const dvec<float> kd = to_device(k.f32);
  const dvec<float> qd = to_device(swap_outer(q.f32.data(), hq, nq, d));  // [nq, Hq, d]
  const dvec<i32> offsets = to_device(uniform_offsets(h, n));
  const dvec<i32> first = to_device(std::vector<i32>{n - nq});
  const kt::segmented_rows<float> keys{raw(kd), raw(offsets), nullptr, 0, h, d};
  const kt::window_queries wq{raw(qd), raw(first), nq, h, hq / h};
  const std::int64_t N = static_cast<std::int64_t>(h) * n;
  dvec<float> scores(static_cast<std::size_t>(N));
  dvec<unsigned char> ws(kt::cumulative_attention_workspace_bytes(N, h, hq / h, nq));
  kt::cumulative_attention_scores(exec, keys, wq, N, kvsift::parse_gqa_reduce(c.param_s("gqa")),
                                  raw(scores), raw(ws), ws.size());
  return scores;
}

const kc::registrar score_h2o_prefill{
    handlers_backend, "score.h2o_prefill", [](const kc::case_data& c, kc::outputs& out) {
      const auto& k = c.in("keys");
      out.put_f32("scores", {dim(k, 0), dim(k, 1)}, to_host(h2o_scores(c)));
    }};

}  // namespace
