// SPDX-License-Identifier: Apache-2.0
#pragma once

// One task at a time on a worker thread of the library's own, beside the calling thread: the host
// part of a step that the device part overlaps (device/two_tier.hpp, far_tier::attend).
//
//   cpu::host_task task;
//   auto running = task.start([&] { host_part(); });  // returns once the task has begun
//   device_part();                                    // overlaps host_part()
//   const auto end = task.now();                      // a tick of the task's clock
//   running.finish();                                 // waits for host_part(), rethrows its error
//   task.started_at() < end                           // the ordering: host part began first
//
// start() returns a guard: if it is destroyed unfinished (an exception left the caller's scope),
// it waits for the task and drops the task's error, so a task never outlives what it captured.
// The worker starts with the first task and is joined with the object. It runs the task under the
// caller's scoped_threading (cpu/parallel.hpp), so the engine's choice of threads holds there too.

#include <kvsift/cpu/parallel.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

namespace kvsift::cpu {

class host_task {
 public:
  // The task start() handed over, held here while it runs: finish() waits for it; the destructor
  // too, if finish() did not. Built in place (start() returns it as a prvalue), never moved, so
  // the worker's pointer to the task stays good and nothing is allocated per task.
  template <class Fn>
  class running {
   public:
    template <class F>
    running(host_task& t, F&& task) : task_(&t), fn_(std::forward<F>(task)) {
      t.hand(+[](void* fn) { (*static_cast<Fn*>(fn))(); }, std::addressof(fn_));
    }
    running(const running&) = delete;
    running& operator=(const running&) = delete;
    ~running() {
      if (task_ == nullptr) return;
      try {
        task_->wait();
      } catch (...) {  // unwinding already: the task's error is dropped
      }
    }
    // Waits for the task; rethrows on this thread what it threw.
    void finish() { std::exchange(task_, nullptr)->wait(); }

   private:
    host_task* task_;
    Fn fn_;
  };

  host_task() = default;
  host_task(const host_task&) = delete;
  host_task& operator=(const host_task&) = delete;
  ~host_task() {
    if (!worker_.joinable()) return;
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  // Hands `task` to the worker and returns once it has begun there (started_at() is its tick).
  template <class F>
  [[nodiscard]] running<std::decay_t<F>> start(F&& task) {
    return running<std::decay_t<F>>(*this, std::forward<F>(task));
  }

  // A tick of the task's clock (every call a later one); started_at() is the last task's.
  [[nodiscard]] std::uint64_t now() { return clock_.fetch_add(1) + 1; }
  [[nodiscard]] std::uint64_t started_at() const { return started_at_; }
  [[nodiscard]] std::thread::id worker() const { return worker_.get_id(); }

 private:
  enum class state { idle, handed, running };

  void hand(void (*run)(void*), void* fn) {
    if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
    std::unique_lock lock(mu_);
    run_ = run;
    fn_ = fn;
    threading_ = detail::current_threading();
    state_ = state::handed;
    cv_.notify_all();
    cv_.wait(lock, [this] { return state_ != state::handed; });
  }

  void wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return state_ == state::idle; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || state_ == state::handed; });
      if (stop_) return;
      detail::current_threading() = threading_;
      started_at_ = now();
      state_ = state::running;
      cv_.notify_all();
      lock.unlock();
      std::exception_ptr error;
      try {
        run_(fn_);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      state_ = state::idle;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::thread worker_;
  void (*run_)(void*) = nullptr;  // the running guard's task: run_(fn_)
  void* fn_ = nullptr;
  detail::threading_choice threading_;
  std::exception_ptr error_;
  std::atomic<std::uint64_t> clock_{0};
  std::uint64_t started_at_ = 0;  // written under mu_ before start() returns
  state state_ = state::idle;     // a start() always finds it idle: its guard waited
  bool stop_ = false;
};

}  // namespace kvsift::cpu
