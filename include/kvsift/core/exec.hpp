// SPDX-License-Identifier: Apache-2.0
#pragma once

// kvsift::exec — the execution backend of a composition, as a compile-time policy
// (method<Store, Recipe, Exec>; CCCL's system tags and CUTLASS's dispatch policies are the model).
//
//   exec::host   the CPU: the store's memory is host memory, the lifecycle reads it directly, and
//                every component runs its CPU algorithm (cpu/: AVX-512 attention, OpenMP loops
//                under cpu::scoped_threading).
//   exec::sim    a device on the CPU (thrust/exec.hpp, needs CCCL): Thrust's CPP/OMP systems
//                over sim_space memory, which the lifecycle may not dereference, with counters
//                of allocations and host<->device copies that check the graph-capture laws.
//
// An Exec names the memory space its stores, plans and scratch live in and whether the lifecycle
// may dereference that memory (`host_visible`). Device execs (Thrust's systems, CUDA) are the
// device-path work (docs/architecture.md, "The execution policy"); a composition names its exec
// so that adding one changes no recipe.

#include <kvsift/core/memory_space.hpp>

#include <concepts>
#include <string_view>

namespace kvsift {

template <class E>
concept Exec = requires {
  typename E::memory_space;
  { E::host_visible } -> std::convertible_to<bool>;
  { E::name } -> std::convertible_to<std::string_view>;
} && MemorySpace<typename E::memory_space>;

namespace exec {

struct host {
  using memory_space = host_space;
  static constexpr bool host_visible = true;
  static constexpr std::string_view name = "host";
};

}  // namespace exec

// Whether a store of memory space S can serve a composition running on E.
template <class E, class S>
inline constexpr bool runs_over = !E::host_visible || HostAccessible<S>;

}  // namespace kvsift
