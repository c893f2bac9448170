// SPDX-License-Identifier: Apache-2.0
// The kinds that are host arithmetic on every backend, registered for `--backend thrust`:
// budget.fraction, budget.pyramidkv, budget.synckv, budget.heterocache. Budgeters are host-only
// by design (budgets are shapes, computed on the host; contents live on the device), so the
// Thrust backend runs the very handler bodies the CPU backend runs (kinds_host.hpp), not copies.
// budget.dynamickv is not among them: its kept sets are selections, made on the device in
// kinds_thrust_dynamickv.cpp.

#include "../kinds_host.hpp"
#include "../runner.hpp"
#include "helpers.hpp"

namespace {
namespace kc = kvsift::conformance;
using kvsift::conformance::thrust_kinds::handlers_backend;

const kc::registrar budget_fraction{handlers_backend, "budget.fraction",
                                    kc::budget_fraction_kind};
const kc::registrar budget_pyramidkv{handlers_backend, "budget.pyramidkv",
                                     kc::budget_pyramidkv_kind};
const kc::registrar budget_synckv{handlers_backend, "budget.synckv", kc::budget_synckv_kind};
const kc::registrar budget_heterocache{handlers_backend, "budget.heterocache",
                                       kc::budget_heterocache_kind};

}  // namespace
