// SPDX-License-Identifier: Apache-2.0
#pragma once

// trigger::drift_median — HeteroCache's drift test (HeteroCache; METHODS.md "HeteroCache" /
// Decode, SPEC method.heterocache.decode).
//
// A periodic check over a window of W decode steps: it runs after the attention of steps
// W, 2W, ... (fires()), and for each monitored set (HeteroCache: each pivot with satellites) it is
// handed the W overlaps between the top sets of the window's queries and the reference set. The
// set has drifted when the MEDIAN of the W overlaps is strictly below tau_drift (an even W takes
// the mean of the two middle values; a median equal to tau_drift is no drift).
// Like trigger::query_cosine it decides from data the Trigger concept's context does not carry,
// so a method calls median() / drifted() itself; fires() is the Trigger model of the schedule.
// Parameters (METHODS.md): window W = 5, tau_drift = tau_stable = 0.5. Cost: O(W log W) per check.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::trigger {

struct drift_median {
  using kvsift_role = trigger_tag;
  struct params {
    int window = 5;          // W: a check after steps W, 2W, ... over the last W queries
    double tau_drift = 0.5;  // drift when median(overlaps) < tau_drift
  };
  params p{};

  void validate(std::string_view where) const {
    require(p.window > 0, where, "drift_window", p.window, "> 0");
    require(std::isfinite(p.tau_drift), where, "tau_drift", p.tau_drift, "a finite number");
  }

  // The schedule: decode steps W, 2W, ... (never during prefill).
  [[nodiscard]] bool fires(const trigger_context& ctx) const {
    return ctx.event == lifecycle_event::decode_step && ctx.step > 0 && ctx.step % p.window == 0;
  }

  // Median of the overlaps (even count: the mean of the two middle values). Throws kvsift::error
  // on an empty or non-finite input.
  [[nodiscard]] static double median(std::span<const double> overlaps) {
    constexpr std::string_view where = "trigger::drift_median";
    require(!overlaps.empty(), where, "overlaps.size", overlaps.size(), "> 0");
    for (std::size_t i = 0; i < overlaps.size(); ++i) {
      require(std::isfinite(overlaps[i]), where, "overlaps[" + std::to_string(i) + "]",
              overlaps[i], "a finite number");
    }
    std::vector<double> v(overlaps.begin(), overlaps.end());
    std::sort(v.begin(), v.end());
    const std::size_t m = v.size() / 2;
    return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
  }

  // Whether a median means drift: median < tau_drift (strict).
  [[nodiscard]] bool drifted(double median_value) const { return median_value < p.tau_drift; }

  // The window's decision: median, and whether it drifted. Needs exactly W overlaps.
  struct decision {
    double median = 0.0;
    bool drift = false;
  };
  [[nodiscard]] decision decide(std::span<const double> overlaps) const {
    require(static_cast<int>(overlaps.size()) == p.window, "trigger::drift_median", "overlaps.size",
            overlaps.size(), "the drift window W = " + std::to_string(p.window));
    const double m = median(overlaps);
    return {m, drifted(m)};
  }
};
static_assert(Trigger<drift_median>);

}  // namespace kvsift::trigger
