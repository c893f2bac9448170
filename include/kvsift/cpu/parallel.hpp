// SPDX-License-Identifier: Apache-2.0
#pragma once

// CPU execution: the policy object and a parallel loop over segments (OpenMP when present).

#include <kvsift/core/config.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <type_traits>

#if KVSIFT_HAS_OPENMP()
#include <omp.h>
#endif

namespace kvsift::cpu {

// ---- who runs the library's parallel loops (the engine decides) ------------------------------
//
// An engine's host is never idle: a parallel region over a handful of items waits for its
// slowest thread, and a thread the OS descheduled for a time slice makes a 0.2 ms step an 8 ms
// one. So the engine chooses, per calling thread, how kvsift runs its loops:
//
//   threading::pool    the default: an OpenMP team when the loop is big enough to pay for it
//   threading::caller  every loop runs on the calling thread (no other thread is ever waited for)
//   an executor        the engine's own pool: kvsift hands it the loop and waits for it
//
//   kvsift::cpu::scoped_threading serial(kvsift::cpu::threading::caller);  // this thread, this scope
//   my_pool_executor pool;                      // derives from kvsift::cpu::executor
//   kvsift::cpu::scoped_threading on_pool(pool);
//
// The choice is thread-local and scoped (the previous one is restored at the end of the scope),
// so two engine threads can choose differently. Results never depend on it: every loop's
// iterations are independent and write disjoint outputs.

enum class threading {
  pool,    // OpenMP (when built with it) for loops above parallel_threshold
  caller,  // every loop on the calling thread
};

// An engine's thread pool. bulk() runs body(ctx, i) once for every i in [0, n), on any threads
// (the caller's included), and returns when all have returned. kvsift's bodies never throw: an
// exception is captured inside and rethrown on the calling thread after bulk() returns.
class executor {
 public:
  virtual ~executor() = default;
  virtual void bulk(std::int64_t n, void (*body)(void* ctx, std::int64_t i), void* ctx) = 0;
};

namespace detail {
struct threading_choice {
  threading mode = threading::pool;
  executor* exec = nullptr;  // set: loops go to it (mode is ignored)
};
inline threading_choice& current_threading() {
  thread_local threading_choice choice;
  return choice;
}
}  // namespace detail

// Sets how this thread runs kvsift's parallel loops until the end of the scope.
class scoped_threading {
 public:
  explicit scoped_threading(threading mode) : saved_(detail::current_threading()) {
    detail::current_threading() = {mode, nullptr};
  }
  explicit scoped_threading(executor& e) : saved_(detail::current_threading()) {
    detail::current_threading() = {threading::pool, &e};
  }
  scoped_threading(const scoped_threading&) = delete;
  scoped_threading& operator=(const scoped_threading&) = delete;
  ~scoped_threading() { detail::current_threading() = saved_; }

 private:
  detail::threading_choice saved_;
};

// Execution policy of the CPU backend. `threads = 0` lets OpenMP decide.
struct par_t {
  int threads = 0;
};
inline constexpr par_t par{};

// Below this much work (elements touched in all) a parallel region costs more than it saves,
// notably in decode steps, where waking threads every step would dominate.
inline constexpr std::int64_t parallel_threshold = std::int64_t{1} << 18;

#if KVSIFT_HAS_OPENMP()
namespace detail {
// Runs body(i) for i in [0, n) on an OpenMP team of up to `threads`. [0, n) is cut into one
// contiguous share per thread; each thread runs its own share first, then takes what is left of
// the others' (an atomic cursor per share, so every item runs once). While every thread runs,
// thread t gets the same items at every call: a decode step's KV heads are read by the core that
// read them the step before, out of its own cache, where `schedule(dynamic, 1)` hands them out in
// arrival order (H2O's bf16 step, its 1 MB in L2, attends ~10% faster this way, docs/performance.md).
// A descheduled thread's share is taken over by the others, as with a dynamic schedule, not
// waited for, as with a static one. More than kMaxShares threads: a dynamic schedule.
template <class Body>
void run_shares(std::int64_t n, int threads, Body& body) {
  constexpr int kMaxShares = 64;
  const int shares = static_cast<int>(std::min<std::int64_t>(n, std::max(threads, 1)));
  if (shares > kMaxShares) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (std::int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  struct alignas(64) share {  // one cache line each: the cursors are written by different cores
    std::atomic<std::int64_t> next;
    std::int64_t end;
  };
  share s[kMaxShares];
  for (int t = 0; t < shares; ++t) {
    s[t].next.store(n * t / shares, std::memory_order_relaxed);
    s[t].end = n * (t + 1) / shares;
  }
#pragma omp parallel num_threads(shares)
  {
    const int me = omp_get_thread_num();  // a smaller team (nested, limited) takes over the rest
    for (int k = 0; k < shares; ++k) {    // its own share, then the others' in turn
      share& sh = s[(me + k) % shares];
      for (;;) {
        const std::int64_t i = sh.next.fetch_add(1, std::memory_order_relaxed);
        if (i >= sh.end) break;
        body(i);
      }
    }
  }
}
}  // namespace detail
#endif

// Runs f(i) for i in [0, n), in parallel over OpenMP threads when available and worth it:
// `work_per_item` estimates the elements each iteration touches. Iterations must be
// independent (they are: one segment each). An exception thrown by an iteration (kvsift::error,
// std::bad_alloc, ...) cannot cross an OpenMP region: the first one is captured, the remaining
// iterations are skipped, and it is rethrown on the calling thread once the region has ended.
// The loop follows this thread's scoped_threading: on the calling thread, on the engine's
// executor (every loop of more than one item, whatever its size: the engine's pool decides), or
// on OpenMP.
template <class F>
void parallel_for(std::int64_t n, F&& f, par_t policy = par,
                  std::int64_t work_per_item = parallel_threshold) {
  const auto choice = detail::current_threading();
  if (choice.exec != nullptr && n > 1) {
    struct context {
      std::remove_reference_t<F>* f = nullptr;
      std::mutex mu;
      std::exception_ptr first_error;
      std::atomic<bool> failed{false};
    } ctx;
    ctx.f = &f;
    choice.exec->bulk(n, [](void* c, std::int64_t i) {
      auto& x = *static_cast<context*>(c);
      if (x.failed.load(std::memory_order_relaxed)) return;
      try {
        (*x.f)(i);
      } catch (...) {
        std::lock_guard lock(x.mu);
        if (!x.first_error) x.first_error = std::current_exception();
        x.failed.store(true, std::memory_order_relaxed);
      }
    }, &ctx);
    if (ctx.first_error) std::rethrow_exception(ctx.first_error);
    return;
  }
#if KVSIFT_HAS_OPENMP()
  if (choice.mode == threading::pool && n > 1 && n * work_per_item >= parallel_threshold) {
    const int threads = policy.threads > 0 ? policy.threads : omp_get_max_threads();
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
    detail::run_shares(n, threads, guarded);
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
