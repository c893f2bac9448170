// SPDX-License-Identifier: Apache-2.0
#pragma once

// The kinds that are host arithmetic on every backend: the budgeters' formulas (budget.fraction,
// budget.pyramidkv, budget.synckv, budget.heterocache). In the device design budgets are shapes,
// computed on the host whatever runs the scorers and selectors, so each of these kinds has one
// handler body, defined beside its family's CPU kinds (kinds_budget_fraction.cpp,
// kinds_baselines.cpp, kinds_synckv.cpp, kinds_heterocache.cpp) and registered for the CPU
// backend there and for the Thrust backend in thrust/kinds_thrust_host.cpp.

#include "runner.hpp"

namespace kvsift::conformance {

void budget_fraction_kind(const case_data& c, outputs& out);
void budget_pyramidkv_kind(const case_data& c, outputs& out);
void budget_synckv_kind(const case_data& c, outputs& out);
void budget_heterocache_kind(const case_data& c, outputs& out);

}  // namespace kvsift::conformance
