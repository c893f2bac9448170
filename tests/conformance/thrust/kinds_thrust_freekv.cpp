// SPDX-License-Identifier: Apache-2.0
// Thrust handler of trigger.query_cosine (FreeKV's correction trigger): thrust::
// query_cosine_decisions over the step's query and the previous one, both on the device (the
// stateless device form of trigger::query_cosine's observe(prev) then observe(q)). The FreeKV
// scorer and selector kinds are in kinds_thrust.cpp; see there for the conventions.

#include "helpers.hpp"

#include <kvsift/thrust/query_cosine.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace {
using namespace kvsift::conformance::thrust_kinds;  // kc, kt, dvec, to_device, ...

const kc::registrar trigger_query_cosine{
    handlers_backend, "trigger.query_cosine", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("query");
      const auto& prev = c.in("prev_query");
      const int hq = dim(q, 0), d = dim(q, 2), G = param(c, "G");
      if (G <= 0 || hq % G != 0) {
        throw kc::runner_error("G " + std::to_string(G) + " does not divide the query heads " +
                               std::to_string(hq));
      }
      if (prev.shape != q.shape || dim(q, 1) != 1) {
        throw kc::runner_error("query / prev_query: one [Hq, 1, d] decode query each expected");
      }
      const int h = hq / G;
      // [Hq, 1, d] = [H, G, d]: KV head h's group is G consecutive query heads
      const dvec<float> qd = to_device(q.f32), pd = to_device(prev.f32);
      dvec<float> cos(static_cast<std::size_t>(h));
      dvec<i32> correct(static_cast<std::size_t>(h));
      kt::query_cosine_decisions(::thrust::device, raw(qd), raw(pd), h, G, d, c.param_d("tau"),
                                 raw(cos), raw(correct));
      out.put_f32("cos_mean", {h}, to_host(cos));
      out.put_i32("correct", {h}, to_host(correct));
    }};

}  // namespace
