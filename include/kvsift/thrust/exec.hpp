// SPDX-License-Identifier: Apache-2.0
#pragma once

// exec::sim — a simulated device on a CPU-only machine (REDESIGN §3.2, §3.5).
//
//   kvsift::thrust::sim_arena arena;            // the device's memory, with counters
//   kvsift::exec::sim_cpp e{arena};             // or exec::sim_omp (OpenMP builds)
//   kvsift::thrust::buffer<float, kvsift::exec::sim_cpp> scores(e, n);   // allocated once
//   kvsift::thrust::copy_to_device(e, host_scores, scores);              // counted H2D write
//   kvsift::thrust::segmented_topk(e.policy(), scores.data(), ...);      // runs on the "device"
//   kvsift::thrust::copy_to_host(e, kept, host_kept);                    // counted D2H read
//
// The memory is host memory, so Thrust's CPP and OMP systems run over it, but it is tagged
// sim_space<System> (core/memory_space.hpp), which is not HostAccessible: a store or view in it
// cannot be handed to lifecycle code that dereferences memory (kvsift::method refuses it at
// compile time), and the only ways host code reads or writes it are copy_to_host and
// copy_to_device, which the arena counts. Every allocation goes through the arena too: the
// buffers', and Thrust's own temporary storage, because exec.policy() is Thrust's `par` with
// the arena's allocator attached (`par(alloc)`). So the CUDA-graph capture laws become counter
// checks on a CPU: after warm-up a step allocates 0 bytes (R1) and reads 0 bytes back (R2).
//
// What it cannot see: a Thrust algorithm that returns a value to the host (reduce,
// transform_reduce, count, ...) reads the memory directly on CPP/OMP, with no copy to count;
// keeping those off a captured path (`check = false`) is a review rule, not a counter. Nor does
// it see a plain ::thrust::copy into a host container, or a raw dereference of .data(): .data()
// is a raw pointer because the Thrust components take raw pointers.
//
// The arena's cache (see sim_arena) keeps freed blocks by their exact (256-rounded) size, so a
// step that repeats the same requests is served entirely from it after its first run.

#include <kvsift/core/error.hpp>
#include <kvsift/core/exec.hpp>
#include <kvsift/core/memory_space.hpp>
#include <kvsift/thrust/common.hpp>

#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/omp/execution_policy.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace kvsift::thrust {

// What a sim_arena counted since construction or the last reset_counters().
struct sim_counters {
  std::int64_t allocations = 0;      // blocks taken from the system: requests the cache missed
  std::int64_t allocated_bytes = 0;  // their bytes (each request rounded up to 256)
  std::int64_t cache_hits = 0;       // requests served from the cache (not allocations)
  std::int64_t d2h_reads = 0;        // copy_to_host calls
  std::int64_t d2h_bytes = 0;
  std::int64_t h2d_writes = 0;       // copy_to_device calls
  std::int64_t h2d_bytes = 0;
  friend bool operator==(const sim_counters&, const sim_counters&) = default;
};

class device_arena;

// The allocator a device exec attaches to Thrust's policy (`par(alloc)`): Thrust's temporary
// storage (sort scratch, scan partials) comes from the arena and goes back to its cache.
struct arena_allocator {
  using value_type = char;
  device_arena* arena = nullptr;
  char* allocate(std::size_t n);
  void deallocate(char* p, std::size_t n) noexcept;
  friend bool operator==(const arena_allocator&, const arena_allocator&) = default;
};
using sim_allocator = arena_allocator;

// Where an arena's blocks come from: the system's allocate / release of `alignment`-aligned
// blocks. host_backing() (aligned operator new) is exec::sim's; exec::cuda's is cudaMalloc /
// cudaFree (cuda/exec.cuh).
struct memory_backing {
  void* (*allocate)(std::size_t bytes);  // throws on failure
  void (*release)(void* p) noexcept;
};
inline constexpr std::size_t arena_alignment = 256;  // CUDA's allocation alignment
namespace detail {
inline void* host_allocate(std::size_t bytes) {
  return ::operator new(bytes, std::align_val_t{arena_alignment});
}
inline void host_release(void* p) noexcept { ::operator delete(p, std::align_val_t{arena_alignment}); }
}  // namespace detail
inline memory_backing host_backing() { return {&detail::host_allocate, &detail::host_release}; }

// A device's memory: allocations, a cache of freed blocks, and counters (exec::sim's over host
// memory; exec::cuda's over cudaMalloc).
//
// Cache: a freed block is kept under its size (rounded up to 256 bytes) and handed out again
// only for a request of that same rounded size, so the same sequence of requests (a decode step
// of fixed shapes) is served from the cache after its first run, and a cache hit never hands a
// block bigger than asked. Growth is bounded: what the cache holds is at most, per distinct size,
// the most blocks of that size ever live at once, and never more than `max_cached_bytes` in all
// (a freed block that would pass it goes back to the system at once). trim() empties the cache.
// Not copyable or movable: policies and buffers point at it, and it must outlive them.
// Thread-safe (a mutex): OpenMP code may allocate from any thread.
class device_arena {
 public:
  static constexpr std::size_t alignment = arena_alignment;
  static constexpr std::size_t default_max_cached_bytes = std::size_t{1} << 30;

  explicit device_arena(std::size_t max_cached_bytes = default_max_cached_bytes,
                        memory_backing backing = host_backing())
      : max_cached_bytes_(max_cached_bytes), backing_(backing) {}
  device_arena(const device_arena&) = delete;
  device_arena& operator=(const device_arena&) = delete;
  ~device_arena() {
    trim();
    if (!live_.empty()) {  // a buffer or a Thrust temporary outlived its arena
      std::fputs("kvsift::thrust::device_arena: destroyed with blocks still live\n", stderr);
      std::terminate();
    }
  }

  // A block of at least `bytes` bytes, 256-aligned, from the cache when one of the same
  // rounded size is there (a cache hit), else from the system (counted as an allocation).
  [[nodiscard]] void* allocate(std::size_t bytes) {
    const std::size_t size = rounded(bytes);
    const std::lock_guard<std::mutex> lock(mutex_);
    void* p = nullptr;
    if (const auto it = cache_.find(size); it != cache_.end()) {
      p = it->second;
      cache_.erase(it);
      cached_bytes_ -= size;
      ++counters_.cache_hits;
    } else {
      p = backing_.allocate(size);
      ++counters_.allocations;
      counters_.allocated_bytes += static_cast<std::int64_t>(size);
    }
    live_.emplace(p, size);
    live_bytes_ += size;
    return p;
  }

  // Returns a block from allocate() to the cache (or to the system past max_cached_bytes).
  // `p` must be live in this arena (anything else is a bug: std::terminate).
  void deallocate(void* p) noexcept {
    if (p == nullptr) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = live_.find(p);
    if (it == live_.end()) {
      std::fputs("kvsift::thrust::device_arena: deallocate of a block it does not own\n", stderr);
      std::terminate();
    }
    const std::size_t size = it->second;
    live_.erase(it);
    live_bytes_ -= size;
    if (cached_bytes_ + size <= max_cached_bytes_) {
      cache_.emplace(size, p);
      cached_bytes_ += size;
    } else {
      backing_.release(p);
    }
  }

  // Releases every cached block to the system (live blocks are untouched).
  void trim() noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [size, p] : cache_) backing_.release(p);
    cache_.clear();
    cached_bytes_ = 0;
  }

  [[nodiscard]] sim_counters counters() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return counters_;
  }
  // Zeroes the counters (the cache and the live blocks stay): call it after a warm-up step.
  void reset_counters() {
    const std::lock_guard<std::mutex> lock(mutex_);
    counters_ = {};
  }
  [[nodiscard]] std::size_t cached_bytes() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return cached_bytes_;
  }
  [[nodiscard]] std::size_t live_bytes() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return live_bytes_;
  }
  [[nodiscard]] std::size_t max_cached_bytes() const { return max_cached_bytes_; }

  [[nodiscard]] arena_allocator allocator() { return arena_allocator{this}; }

  // For copy_to_host / copy_to_device, which perform the copies these count.
  void count_d2h(std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.d2h_reads;
    counters_.d2h_bytes += static_cast<std::int64_t>(bytes);
  }
  void count_h2d(std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.h2d_writes;
    counters_.h2d_bytes += static_cast<std::int64_t>(bytes);
  }

 private:
  static std::size_t rounded(std::size_t bytes) {
    return bytes == 0 ? alignment : (bytes + alignment - 1) / alignment * alignment;
  }

  mutable std::mutex mutex_;
  std::size_t max_cached_bytes_;
  memory_backing backing_;
  std::multimap<std::size_t, void*> cache_;    // rounded size -> free block
  std::unordered_map<void*, std::size_t> live_;  // block -> rounded size
  std::size_t cached_bytes_ = 0;
  std::size_t live_bytes_ = 0;
  sim_counters counters_{};
};

// exec::sim's arena: a device_arena over host memory (host_backing()).
using sim_arena = device_arena;

inline char* arena_allocator::allocate(std::size_t n) {
  return static_cast<char*>(arena->allocate(n));
}
inline void arena_allocator::deallocate(char* p, std::size_t) noexcept { arena->deallocate(p); }

namespace detail {

// The Thrust system behind a sim_space tag: its policy and exec::sim's name.
template <class System>
struct sim_system;  // undefined: exec::sim runs over Thrust's cpp or omp system

template <>
struct sim_system<::thrust::system::cpp::tag> {
  static constexpr std::string_view name = "sim-cpp";
  static auto par(const sim_allocator& a) { return ::thrust::cpp::par(a); }
};
template <>
struct sim_system<::thrust::system::omp::tag> {
  static constexpr std::string_view name = "sim-omp";
  static auto par(const sim_allocator& a) { return ::thrust::omp::par(a); }
};

}  // namespace detail

}  // namespace kvsift::thrust

namespace kvsift::exec {

// A device on the CPU: Thrust's CPP or OMP system over a sim_arena (see the file comment).
// Models kvsift::Exec; copyable (a pointer to the arena, which must outlive it).
template <class System>
struct sim {
  using memory_space = sim_space<System>;
  using system = System;
  static constexpr bool host_visible = false;
  static constexpr std::string_view name = kvsift::thrust::detail::sim_system<System>::name;

  explicit sim(kvsift::thrust::sim_arena& arena) : arena_(&arena) {}

  [[nodiscard]] kvsift::thrust::sim_arena& arena() const { return *arena_; }
  // Thrust's par of System with the arena's allocator: pass it to every kvsift::thrust
  // algorithm run on this exec, so Thrust's temporary storage is counted and cached.
  [[nodiscard]] auto policy() const {
    return kvsift::thrust::detail::sim_system<System>::par(arena_->allocator());
  }
  // Where a device_arena for this exec takes its blocks from (host memory).
  static kvsift::thrust::memory_backing backing() { return kvsift::thrust::host_backing(); }
  // The copies copy_to_device / copy_to_host perform (and count): plain host memory copies.
  void h2d(void* dst, const void* src, std::size_t bytes) const {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void d2h(void* dst, const void* src, std::size_t bytes) const {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }

 private:
  kvsift::thrust::sim_arena* arena_;
};

using sim_cpp = sim<::thrust::system::cpp::tag>;
using sim_omp = sim<::thrust::system::omp::tag>;  // run it only where OpenMP is enabled

}  // namespace kvsift::exec

namespace kvsift::thrust {

// A device exec: its memory is a device_arena's (not host-accessible; E::backing() says where an
// arena for it takes its blocks), Thrust runs on its policy(), and host code reaches its memory
// only through its h2d / d2h copies (which copy_to_device / copy_to_host count). exec::sim (here) and exec::cuda (cuda/exec.cuh). The
// device states (device/*.hpp), stores and buffers are written against this concept.
template <class E>
concept DeviceExec = Exec<E> && !E::host_visible &&
                     requires(const E& e, void* dst, const void* src, std::size_t n) {
                       { E::backing() } -> std::same_as<memory_backing>;
                       { e.arena() } -> std::same_as<device_arena&>;
                       e.policy();
                       e.h2d(dst, src, n);
                       e.d2h(dst, src, n);
                     };

// A simulated device exec (exec::sim): a DeviceExec whose memory is host memory tagged
// sim_space, so Thrust's CPP/OMP systems run over it on a CPU-only machine.
template <class E>
concept SimExec = DeviceExec<E> && requires { typename E::system; } &&
                  std::same_as<typename E::memory_space, sim_space<typename E::system>>;

// An owning array of `size` T in E's memory, allocated once through E's arena at construction
// (size fixed; contents uninitialised, as device memory is) and returned to the arena's cache
// when destroyed. data() is E's memory: pass it to Thrust algorithms run on E's policy; host
// code reads and writes it only through copy_to_host / copy_to_device. Move-only.
template <class T, DeviceExec E>
  requires std::is_trivially_copyable_v<T>
class buffer {
 public:
  using value_type = T;
  using exec_type = E;
  using memory_space = typename E::memory_space;

  buffer(const E& e, std::size_t size) : arena_(&e.arena()), size_(size) {
    require(size <= max_allocation_bytes / sizeof(T), "thrust::buffer", "size", size,
            "<= max_allocation_bytes / sizeof(T)");
    if (size_ > 0) data_ = static_cast<T*>(arena_->allocate(size_ * sizeof(T)));
  }
  buffer(buffer&& o) noexcept
      : arena_(o.arena_),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      release();
      arena_ = o.arena_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() { release(); }

  // E's memory (null when empty): for Thrust calls on E's policy, never for host dereference.
  [[nodiscard]] T* data() { return data_; }
  [[nodiscard]] const T* data() const { return data_; }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::size_t bytes() const { return size_ * sizeof(T); }
  [[nodiscard]] device_arena& arena() const { return *arena_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) arena_->deallocate(data_);
    data_ = nullptr;
  }

  device_arena* arena_;
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Host-to-device: writes src into dst[0, src.size()) (src.size() <= dst.size()); one counted
// H2D write of src.size() * sizeof(T) bytes on exec's arena, which must be dst's.
template <class T, DeviceExec E>
void copy_to_device(const E& exec, std::type_identity_t<std::span<const T>> src,
                    buffer<T, E>& dst) {
  constexpr std::string_view where = "thrust::copy_to_device";
  require(&exec.arena() == &dst.arena(), where, "exec", "another arena", "dst's arena");
  require(src.size() <= dst.size(), where, "src.size()", src.size(),
          [&] { return "<= dst.size() = " + std::to_string(dst.size()); });
  exec.arena().count_h2d(src.size_bytes());
  exec.h2d(dst.data(), src.data(), src.size_bytes());
}

// Device-to-host: reads src[0, dst.size()) into dst (dst.size() <= src.size()); one counted
// D2H read of dst.size() * sizeof(T) bytes on exec's arena, which must be src's.
template <class T, DeviceExec E>
void copy_to_host(const E& exec, const buffer<T, E>& src, std::type_identity_t<std::span<T>> dst) {
  constexpr std::string_view where = "thrust::copy_to_host";
  require(&exec.arena() == &src.arena(), where, "exec", "another arena", "src's arena");
  require(dst.size() <= src.size(), where, "dst.size()", dst.size(),
          [&] { return "<= src.size() = " + std::to_string(src.size()); });
  exec.arena().count_d2h(dst.size_bytes());
  exec.d2h(dst.data(), src.data(), dst.size_bytes());
}

// Device-to-host from E memory a buffer does not own (a plan's slots, a store's positions):
// reads src[0, dst.size()) into dst; one counted D2H read on exec's arena. `src` must be E
// memory of that arena, dst.size() elements long at least (not checkable from a raw pointer).
template <class T, DeviceExec E>
void copy_to_host(const E& exec, const T* src, std::type_identity_t<std::span<T>> dst) {
  require(src != nullptr || dst.empty(), "thrust::copy_to_host", "src", "null",
          "E memory holding dst.size() elements");
  exec.arena().count_d2h(dst.size_bytes());
  exec.d2h(dst.data(), src, dst.size_bytes());
}

}  // namespace kvsift::thrust
