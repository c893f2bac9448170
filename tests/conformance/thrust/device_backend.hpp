// SPDX-License-Identifier: Apache-2.0
#pragma once

// The device backend of the methods' kinds (../method_kinds.hpp, ../two_tier_kinds.hpp): the
// method over a thrust::dense_store<float, E> (a thrust::tiered_store<float, E>: the two-tier
// methods) behind device::staged_method (host inputs staged into E memory, plans and attention
// outputs read back), E the device exec of the runner's Thrust system:
//
//   THRUST_DEVICE_SYSTEM CPP  ->  exec::sim_cpp   (kvsift-conformance-thrust-cpp)
//   THRUST_DEVICE_SYSTEM OMP  ->  exec::sim_omp   (kvsift-conformance-thrust-omp)
//   THRUST_DEVICE_SYSTEM CUDA ->  exec::cuda      (kvsift-conformance-cuda, nvcc; on a GPU)

#include <thrust/execution_policy.h>  // THRUST_DEVICE_SYSTEM's values

#include "../method_kinds.hpp"
#include "../two_tier_kinds.hpp"

#include <kvsift/device/erased.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <kvsift/cuda/exec.cuh>
#endif

#include <memory>
#include <string>
#include <utility>

namespace kvsift::conformance::method_kinds {

// The device backend on exec E: every method owns its arena (staged_method's).
template <kvsift::thrust::DeviceExec E>
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
  // thrust::tiered_store has no page size: the device state pages its tier by the params' own.
  template <class M>
  static std::unique_ptr<wrapper<M>> make_paged(std::string name, const kvsift::model_shape& shape,
                                                int requests, int capacity, int /*page_size*/,
                                                typename M::params p) {
    return make<M>(std::move(name), shape, requests, capacity, std::move(p));
  }
};

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP
using device = device_backend<kvsift::exec::sim_cpp>;
#elif THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_OMP
using device = device_backend<kvsift::exec::sim_omp>;
#else
using device = device_backend<kvsift::exec::cuda>;
#endif

}  // namespace kvsift::conformance::method_kinds
