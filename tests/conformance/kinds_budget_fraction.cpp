// SPDX-License-Identifier: Apache-2.0
// budget.fraction: a budget in tokens from a kept fraction (floor(f*n)) or an evicted
// fraction (floor((1-c)*n)), METHODS.md "Conventions".

#include "kinds_host.hpp"
#include "runner.hpp"

#include <kvsift/budget/memory_fraction.hpp>

#include <cstdint>

namespace kvsift::conformance {

// Host arithmetic on every backend (kinds_host.hpp).
void budget_fraction_kind(const case_data& c, outputs& out) {
  const int n = static_cast<int>(c.param_i("n"));
  const auto budget =
      c.has_param("keep_fraction")
          ? kvsift::budget::tokens_from_keep_fraction(n, c.param_d("keep_fraction"))
          : kvsift::budget::tokens_from_evict_fraction(n, c.param_d("evict_fraction"));
  out.put_i32("budget", {1}, {static_cast<std::int32_t>(budget)});
}

}  // namespace kvsift::conformance

namespace {
namespace kc = kvsift::conformance;

const kc::registrar budget_fraction{"budget.fraction", kc::budget_fraction_kind};

}  // namespace
