// SPDX-License-Identifier: Apache-2.0
#pragma once

// The device backend of the methods' kinds (../method_kinds.hpp, ../two_tier_kinds.hpp): the
// method over a thrust::dense_store<float, E> (a thrust::tiered_store<float, E>: the two-tier
// methods) behind device::staged_method (host inputs staged into E memory,
// plans and attention outputs read back), E the simulated device of the runner's Thrust system:
//
//   THRUST_DEVICE_SYSTEM CPP  ->  exec::sim_cpp   (kvsift-conformance-thrust-cpp)
//   THRUST_DEVICE_SYSTEM OMP  ->  exec::sim_omp   (kvsift-conformance-thrust-omp)
//   THRUST_DEVICE_SYSTEM CUDA ->  none yet: the library's methods have no CUDA exec, so
//                                 kvsift-conformance-cuda does not register these kinds
//                                 (KVSIFT_CONFORMANCE_DEVICE_METHODS is 0; cuda/CMakeLists.txt
//                                 leaves KVSIFT_CONFORMANCE_METHOD_KINDS out of its list)

#include <thrust/execution_policy.h>  // THRUST_DEVICE_SYSTEM's values

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP || THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
#define KVSIFT_CONFORMANCE_DEVICE_METHODS 1
#else
#define KVSIFT_CONFORMANCE_DEVICE_METHODS 0
#endif

#if KVSIFT_CONFORMANCE_DEVICE_METHODS

#include "../method_kinds.hpp"
#include "../two_tier_kinds.hpp"

#include <kvsift/device/erased.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#include <memory>
#include <string>
#include <utility>

namespace kvsift::conformance::method_kinds {

// The device backend on exec E: every method owns its simulated device (staged_method's arena).
template <kvsift::thrust::SimExec E>
struct device_backend {
  using store = kvsift::thrust::dense_store<float, E>;
  using exec = E;
  template <class M>
  using wrapper = kvsift::device::staged_method<M>;
  template <class Recipe>
  using tiered_method = kvsift::method<kvsift::thrust::tiered_store<float, E>, Recipe, E>;
  template <class M>
  static std::unique_ptr<wrapper<M>> make(std::string name, const kvsift::model_shape& shape,
                                          int requests, int capacity, typename M::params p) {
    return std::make_unique<wrapper<M>>(std::move(name), shape, requests, capacity, std::move(p));
  }
};

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP
using device = device_backend<kvsift::exec::sim_cpp>;
#else
using device = device_backend<kvsift::exec::sim_omp>;
#endif

}  // namespace kvsift::conformance::method_kinds

#endif  // KVSIFT_CONFORMANCE_DEVICE_METHODS
