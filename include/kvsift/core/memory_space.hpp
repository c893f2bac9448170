// SPDX-License-Identifier: Apache-2.0
#pragma once

// Memory-space tags. Every view and store is tagged with the space its memory lives in; an
// operation that mixes spaces does not compile (the tags are distinct types, never converted).
//
// A type S is a MemorySpace when it opts in with `using kvsift_role = kvsift::memory_space_tag;`
// and states its `name` and whether host code may dereference it (`host_accessible`). The set
// is open: an exec may bring its own space (exec::sim's sim_space<System>, in thrust/exec.hpp).

#include <concepts>
#include <string_view>
#include <type_traits>

namespace kvsift {

struct memory_space_tag {};

struct host_space {  // pageable host memory
  using kvsift_role = memory_space_tag;
  static constexpr std::string_view name = "host";
  static constexpr bool host_accessible = true;
};
struct pinned_host_space {  // page-locked host memory: the source/target of async copies
  using kvsift_role = memory_space_tag;
  static constexpr std::string_view name = "pinned_host";
  static constexpr bool host_accessible = true;
};
struct device_space {  // GPU memory
  using kvsift_role = memory_space_tag;
  static constexpr std::string_view name = "device";
  static constexpr bool host_accessible = false;
};

// The memory of a simulated device (exec::sim, thrust/exec.hpp): physically host memory, which
// Thrust's CPP/OMP systems run over, but NOT host-accessible, so lifecycle code that
// dereferences it does not compile (HostAccessible is false) and host code reads it only
// through counted explicit copies. `System` is an opaque tag naming the simulating system
// (Thrust's cpp or omp tag); core never looks inside it, so it stays free of CCCL.
template <class System>
struct sim_space {
  using kvsift_role = memory_space_tag;
  using system = System;
  static constexpr std::string_view name = "sim";
  static constexpr bool host_accessible = false;
};

template <class S>
concept MemorySpace = requires {
  typename S::kvsift_role;
  { S::name } -> std::convertible_to<std::string_view>;
  { S::host_accessible } -> std::convertible_to<bool>;
} && std::same_as<typename S::kvsift_role, memory_space_tag>;

template <class S>
concept HostAccessible = MemorySpace<S> && S::host_accessible;

}  // namespace kvsift
