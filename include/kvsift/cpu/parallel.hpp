// SPDX-License-Identifier: Apache-2.0
#pragma once

// CPU execution: the policy object and a parallel loop over segments (OpenMP when present).

#include <kvsift/core/config.hpp>

#include <atomic>
#include <cstdint>
#include <exception>

namespace kvsift::cpu {

// Execution policy of the CPU backend. `threads = 0` lets OpenMP decide.
struct par_t {
  int threads = 0;
};
inline constexpr par_t par{};

// Below this much work (elements touched in all) a parallel region costs more than it saves,
// notably in decode steps, where waking threads every step would dominate.
inline constexpr std::int64_t parallel_threshold = std::int64_t{1} << 18;

// Runs f(i) for i in [0, n), in parallel over OpenMP threads when available and worth it:
// `work_per_item` estimates the elements each iteration touches. Iterations must be
// independent (they are: one segment each). An exception thrown by an iteration (kvsift::error,
// std::bad_alloc, ...) cannot cross an OpenMP region: the first one is captured, the remaining
// iterations are skipped, and it is rethrown on the calling thread once the region has ended.
template <class F>
void parallel_for(std::int64_t n, F&& f, par_t policy = par,
                  std::int64_t work_per_item = parallel_threshold) {
#if KVSIFT_HAS_OPENMP()
  if (n > 1 && n * work_per_item >= parallel_threshold) {
    const int threads = policy.threads > 0 ? policy.threads : 0;
    std::exception_ptr first_error;
    std::atomic<bool> failed{false};
    auto guarded = [&](std::int64_t i) {
      if (failed.load(std::memory_order_relaxed)) return;
      try {
        f(i);
      } catch (...) {
#pragma omp critical(kvsift_parallel_for_error)
        {
          if (!first_error) first_error = std::current_exception();
        }
        failed.store(true, std::memory_order_relaxed);
      }
    };
    if (threads > 0) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
      for (std::int64_t i = 0; i < n; ++i) {
        guarded(i);
      }
    } else {
#pragma omp parallel for schedule(dynamic, 1)
      for (std::int64_t i = 0; i < n; ++i) {
        guarded(i);
      }
    }
    if (first_error) std::rethrow_exception(first_error);
    return;
  }
#else
  (void)policy;
  (void)work_per_item;
#endif
  for (std::int64_t i = 0; i < n; ++i) {
    f(i);
  }
}

}  // namespace kvsift::cpu
