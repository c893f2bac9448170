// SPDX-License-Identifier: Apache-2.0
#pragma once

// Device-resident plans: a CSR index set (core/segments.hpp's index_sets, one ascending set per
// segment) whose offsets and values live in vectors of the caller's choice, normally
// thrust::device_vector<std::int32_t> (named only by the caller, so this header stays free of
// it: STYLE 4). Algorithms take the non-owning segmented_view<const std::int32_t> of view().
//
//   auto plan = kvsift::thrust::to_device<thrust::device_vector<std::int32_t>>(host_sets);
//   algorithm(exec, plan.view(), plan.size(), ...);
//   kvsift::index_sets back = kvsift::thrust::to_host(plan);

#include <kvsift/core/segments.hpp>
#include <kvsift/thrust/common.hpp>

#include <thrust/copy.h>
#include <thrust/memory.h>

#include <cstdint>
#include <vector>

namespace kvsift::thrust {

// index_sets in device memory. Vector: a contiguous vector of std::int32_t with size(),
// begin()/end(), data() and construction from a host iterator range (thrust::device_vector,
// thrust::host_vector, std::vector under the CPP/OMP systems).
template <class Vector>
struct device_index_sets {
  Vector offsets;  // [segments() + 1] CSR offsets, offsets[0] = 0
  Vector values;   // [size()] the segments' indices, concatenated

  [[nodiscard]] int segments() const { return static_cast<int>(offsets.size()) - 1; }
  [[nodiscard]] std::int64_t size() const { return static_cast<std::int64_t>(values.size()); }
  [[nodiscard]] segmented_view<const std::int32_t> view() const {
    return {::thrust::raw_pointer_cast(values.data()), ::thrust::raw_pointer_cast(offsets.data()),
            segments()};
  }
};

// Copies a host plan to the device (one copy per array).
template <class Vector>
[[nodiscard]] device_index_sets<Vector> to_device(const index_sets& sets) {
  return {Vector(sets.offsets.begin(), sets.offsets.end()),
          Vector(sets.values.begin(), sets.values.end())};
}

// Copies a device plan back to the host.
template <class Vector>
[[nodiscard]] index_sets to_host(const device_index_sets<Vector>& sets) {
  index_sets h;
  h.offsets.resize(sets.offsets.size());
  h.values.resize(sets.values.size());
  ::thrust::copy(sets.offsets.begin(), sets.offsets.end(), h.offsets.begin());
  ::thrust::copy(sets.values.begin(), sets.values.end(), h.values.begin());
  return h;
}

}  // namespace kvsift::thrust
