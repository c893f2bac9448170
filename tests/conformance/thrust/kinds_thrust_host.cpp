// SPDX-License-Identifier: Apache-2.0
// The kinds that are host arithmetic on every backend, registered for `--backend thrust`:
// budget.fraction, budget.pyramidkv, budget.synckv, budget.heterocache. Budgeters are host-only
// by design (budgets are shapes, computed on the host; contents live on the device), so the
// Thrust backend runs the very handler bodies the CPU backend runs (kinds_host.hpp), not copies.
// budget.dynamickv is not among them: its kept sets are selections, made on the device in
// kinds_thrust_dynamickv.cpp.

#include "../kinds_host.hpp"
#include "../runner.hpp"

namespace {
namespace kc = kvsift::conformance;

const kc::registrar budget_fraction{kc::backend::thrust, "budget.fraction",
                                    kc::budget_fraction_kind};
const kc::registrar budget_pyramidkv{kc::backend::thrust, "budget.pyramidkv",
                                     kc::budget_pyramidkv_kind};
const kc::registrar budget_synckv{kc::backend::thrust, "budget.synckv", kc::budget_synckv_kind};
const kc::registrar budget_heterocache{kc::backend::thrust, "budget.heterocache",
                                       kc::budget_heterocache_kind};

}  // namespace
