// SPDX-License-Identifier: Apache-2.0
// SyncKV kinds (SPEC.md budget.synckv, method.synckv.decode): the follower budget from
// budget/synckv.hpp, and one layer's decode lifecycle through SyncKV's recipe over a
// store::tiered<float>: the handler body of two_tier_kinds.hpp on the host backend.

#include "kinds_host.hpp"
#include "runner.hpp"
#include "two_tier_kinds.hpp"

#include <kvsift/budget/synckv.hpp>

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

const kc::registrar budget_synckv{"budget.synckv", kc::budget_synckv_kind};

const kc::registrar method_synckv_decode{
    "method.synckv.decode",
    kc::two_tier_kinds::synckv_decode<kc::method_kinds::host_backend>};

}  // namespace
