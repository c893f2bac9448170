// SPDX-License-Identifier: Apache-2.0
#pragma once

// RAII owners of CUDA resources: device buffers, pinned host buffers, streams and events, and
// the workspace carver that splits one caller-provided scratch allocation into aligned parts.
// Owners are move-only; constructing them allocates (never call that inside a decode step:
// allocate once, then hand raw pointers/workspace to the algorithms).

#include <kvsift/cuda/error.cuh>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace kvsift::cuda {

// Owns `size()` elements of T in device memory (cudaMalloc; not initialised).
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : size_(n) {
    if (n > 0) {
      check(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)), "device_buffer(n)");
    }
  }
  device_buffer(device_buffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  [[nodiscard]] T* data() const noexcept { return ptr_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }

  // Frees the memory (errors at free are ignored: a destructor must not throw).
  void reset() noexcept {
    if (ptr_ != nullptr) {
      (void)cudaFree(ptr_);
      ptr_ = nullptr;
    }
    size_ = 0;
  }

 private:
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

// Owns `size()` elements of T in page-locked host memory (cudaMallocHost), so asynchronous
// copies to and from it really overlap with kernels.
template <class T>
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t n) : size_(n) {
    if (n > 0) {
      check(cudaMallocHost(reinterpret_cast<void**>(&ptr_), n * sizeof(T)), "pinned_buffer(n)");
    }
  }
  pinned_buffer(pinned_buffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { reset(); }

  [[nodiscard]] T* data() const noexcept { return ptr_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] std::span<T> span() const noexcept { return {ptr_, size_}; }
  T& operator[](std::size_t i) const noexcept { return ptr_[i]; }

  void reset() noexcept {
    if (ptr_ != nullptr) {
      (void)cudaFreeHost(ptr_);
      ptr_ = nullptr;
    }
    size_ = 0;
  }

 private:
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

// Owns a non-blocking CUDA stream.
class stream {
 public:
  stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream()"); }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { reset(); }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  void synchronize() const { check(cudaStreamSynchronize(s_), "stream::synchronize"); }

 private:
  void reset() noexcept {
    if (s_ != nullptr) {
      (void)cudaStreamDestroy(s_);
      s_ = nullptr;
    }
  }
  cudaStream_t s_ = nullptr;
};

// Owns a CUDA event. `timing = false` gives the cheap kind used for stream ordering only.
class event {
 public:
  explicit event(bool timing = false) {
    check(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming),
          "event()");
  }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { reset(); }

  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  // Marks the point the stream has reached so far.
  void record(cudaStream_t s) const { check(cudaEventRecord(e_, s), "event::record"); }
  // Makes `s` wait (on the device, not the host) until the recorded point completes.
  void wait_on(cudaStream_t s) const {
    check(cudaStreamWaitEvent(s, e_, 0), "event::wait_on");
  }
  // True when the recorded work completed; never blocks.
  [[nodiscard]] bool ready() const {
    const cudaError_t r = cudaEventQuery(e_);
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    check(r, "event::ready");
    return true;
  }
  void synchronize() const { check(cudaEventSynchronize(e_), "event::synchronize"); }
  // Milliseconds between `start` and this event (both recorded with timing = true).
  [[nodiscard]] float elapsed_ms_since(const event& start) const {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start.e_, e_), "event::elapsed_ms_since");
    return ms;
  }

 private:
  void reset() noexcept {
    if (e_ != nullptr) {
      (void)cudaEventDestroy(e_);
      e_ = nullptr;
    }
  }
  cudaEvent_t e_ = nullptr;
};

// Alignment of every part carved from a workspace (CUB's own requirement is 256 bytes).
inline constexpr std::size_t workspace_alignment = 256;

[[nodiscard]] constexpr std::size_t align_up(std::size_t n,
                                             std::size_t a = workspace_alignment) noexcept {
  return (n + a - 1) / a * a;
}

// Splits one scratch allocation into aligned parts in a fixed order. The same sequence of
// take() calls on a null base computes the total size (phase one of a two-phase call), and on
// the caller's workspace yields the pointers (phase two).
class workspace_carver {
 public:
  explicit workspace_carver(void* base = nullptr) noexcept
      : base_(static_cast<std::byte*>(base)) {}
  // Reserves `count` objects of T; returns their address (null when sizing).
  template <class T>
  T* take(std::size_t count) noexcept {
    const std::size_t at = used_;
    used_ += align_up(count * sizeof(T));
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + at);
  }
  // Reserves raw bytes (for CUB temporary storage).
  void* take_bytes(std::size_t bytes) noexcept { return take<std::byte>(bytes); }
  [[nodiscard]] std::size_t used() const noexcept { return used_; }

 private:
  std::byte* base_;
  std::size_t used_ = 0;
};

}  // namespace kvsift::cuda
