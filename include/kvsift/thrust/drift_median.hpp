// SPDX-License-Identifier: Apache-2.0
#pragma once

// HeteroCache's drift probe with Thrust. Mirrors trigger::drift_probe (trigger::drift_median's
// decide over calibrate::overlap): for each monitored set p (a pivot's reference), the overlap of
// each of its W window sets with the reference, |A n B| / min(|A|, |B|) in double (0 when either
// is empty), then their median (sorted; an even W takes the mean of the two middle values), and
// the drift decision median < tau_drift (strict). Same arithmetic as the CPU, so the same bits.
//   1. overlaps   one thread per (p, w): a merge count of two ascending sets
//   2. medians    one thread per p: an insertion sort of its W overlaps (in workspace), the median
// The decision stays on the device (drift[p]): a schedule that acts on it without reading it
// back applies both outcomes' shapes (HeteroCache: a satellite's new part and its current one
// have the same size) and chooses per pivot on the device (thrust::choose_sets).
// Workspace: P * W doubles. Cost O(P W (|set| + |reference|) + P W^2).

#include <kvsift/thrust/common.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvsift::thrust {

namespace detail {

struct drift_overlap_fn {
  const std::int32_t* set_offsets;  // [P * W + 1]
  const std::int32_t* sets;
  const std::int32_t* ref_offsets;  // [P + 1]
  const std::int32_t* refs;
  int window;
  double* overlaps;  // [P * W]
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int p = static_cast<int>(e / window);
    const std::int32_t* a = sets + set_offsets[e];
    const int na = set_offsets[e + 1] - set_offsets[e];
    const std::int32_t* b = refs + ref_offsets[p];
    const int nb = ref_offsets[p + 1] - ref_offsets[p];
    if (na == 0 || nb == 0) {
      overlaps[e] = 0.0;
      return;
    }
    int i = 0;
    int j = 0;
    int common = 0;
    while (i < na && j < nb) {
      if (a[i] < b[j]) {
        ++i;
      } else if (b[j] < a[i]) {
        ++j;
      } else {
        ++common;
        ++i;
        ++j;
      }
    }
    overlaps[e] = static_cast<double>(common) / static_cast<double>(na < nb ? na : nb);
  }
};

struct drift_median_fn {
  double* overlaps;  // [P * W], sorted in place per p
  int window;
  double tau;
  double* median;       // [P] (may be null)
  std::int32_t* drift;  // [P]
  KVSIFT_HOST_DEVICE void operator()(int p) const {
    double* v = overlaps + static_cast<std::int64_t>(p) * window;
    for (int i = 1; i < window; ++i) {  // insertion sort: W is small
      const double x = v[i];
      int j = i - 1;
      while (j >= 0 && x < v[j]) {
        v[j + 1] = v[j];
        --j;
      }
      v[j + 1] = x;
    }
    const int m = window / 2;
    const double med = window % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
    if (median != nullptr) {
      median[p] = med;
    }
    drift[p] = med < tau ? 1 : 0;
  }
};

}  // namespace detail

// Bytes of workspace drift_medians needs for P monitored sets of W window sets each.
inline std::size_t drift_medians_workspace_bytes(int monitored, int window) {
  detail::carver c{nullptr};
  c.take<double>(static_cast<std::size_t>(monitored) * window);
  return c.bytes;
}

// For each monitored set p: median[p] = median over w of overlap(set p * W + w, reference p),
// drift[p] = median[p] < tau_drift.
//   set_offsets, sets   [P * W] ascending sets (CSR), the W window sets of p consecutive
//   ref_offsets, refs   [P] ascending references (CSR)
//   median              [P] doubles, may be null; drift [P]
//   workspace           >= drift_medians_workspace_bytes(P, W)
template <class Policy>
void drift_medians(const Policy& exec, const std::int32_t* set_offsets, const std::int32_t* sets,
                   const std::int32_t* ref_offsets, const std::int32_t* refs, int monitored,
                   int window, double tau_drift, double* median, std::int32_t* drift,
                   void* workspace, std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::drift_medians";
  require(monitored >= 0, where, "monitored", monitored, ">= 0");
  require(window > 0, where, "window", window, "> 0 (the drift window W)");
  const std::size_t need = drift_medians_workspace_bytes(monitored, window);
  detail::check_workspace(where, workspace, workspace_bytes, need);
  if (monitored == 0) {
    return;
  }
  require(drift != nullptr, where, "drift", "null", "[monitored] decisions");
  auto* overlaps = static_cast<double*>(workspace);
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0),
                       static_cast<std::int64_t>(monitored) * window,
                       detail::drift_overlap_fn{set_offsets, sets, ref_offsets, refs, window,
                                                overlaps});
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<int>(0), monitored,
                       detail::drift_median_fn{overlaps, window, tau_drift, median, drift});
}

}  // namespace kvsift::thrust
