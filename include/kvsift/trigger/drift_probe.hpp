// SPDX-License-Identifier: Apache-2.0
#pragma once

// trigger::drift_probe — HeteroCache's data trigger (METHODS.md "HeteroCache" / Decode): the
// W-window median overlap. trigger::drift_median says WHEN a check runs (after steps W, 2W, ...)
// and what a median means; the probe runs one check of one monitored set (a pivot's reference):
// the overlap of each window query's top set with the reference (calibrate::overlap), then their
// median against tau_drift. Cost: O(W (|set| + |reference|)) per check.

#include <kvsift/calibrate/overlap.hpp>
#include <kvsift/trigger/drift_median.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace kvsift::trigger {

struct drift_probe {
  drift_median window;  // W and tau_drift
  explicit drift_probe(drift_median w) : window(w) {}
  // sets: the window queries' top sets (W of them, oldest first); reference: the monitored set.
  [[nodiscard]] drift_median::decision check(std::span<const std::vector<std::int32_t>> sets,
                                             std::span<const std::int32_t> reference) const {
    overlaps_.clear();
    for (const auto& s : sets) overlaps_.push_back(calibrate::overlap(s, reference));
    return window.decide(overlaps_);
  }

 private:
  mutable std::vector<double> overlaps_;
};

}  // namespace kvsift::trigger
