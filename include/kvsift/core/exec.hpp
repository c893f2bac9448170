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

// The two-tier store a method names by default in E's memory (`kvsift::synckv<T, E>`,
// `heterocache<T, E>`, `freekv<T, E>`): store::tiered<T> on exec::host (store/tiered.hpp),
// thrust::tiered_store<T, E> on a device exec (thrust/tiered_store.hpp). One spelling per method
// for every exec; the memory decides the store.
template <class T, class E>
struct default_tiered_store {
  static_assert(sizeof(E) == 0,
                "kvsift: no two-tier store in this exec's memory is declared; for a device exec "
                "include <kvsift/device/all.hpp> (thrust::tiered_store)");
};
template <class T, class E>
using default_tiered_store_t = typename default_tiered_store<T, E>::type;

}  // namespace kvsift
