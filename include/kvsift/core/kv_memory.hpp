// SPDX-License-Identifier: Apache-2.0
#pragma once

// The allocator of the KV arrays a store owns: store::dense's and store::paged's keys and values,
// store::tiered's host pool.
//
// A decode step streams a head-sequence's whole resident KV. With 4 KiB pages every page of it
// is a TLB miss and a boundary where the hardware prefetcher stops; so an allocation of at least
// `huge_page_bytes` is aligned to 2 MiB and, on Linux, advised as transparent huge pages
// (madvise(MADV_HUGEPAGE), before the vector's first touch of it): Linux's default THP mode,
// `madvise`, backs only advised memory with huge pages (memory the C library reuses may already be
// backed by small pages). Measured on a 2-core AMD EPYC VM (docs/performance.md, "Latest tables
// (2026-11-27 evening)"): a bf16 full-KV decode step at 32K tokens 5.8 -> 5.0-5.3 ms in
// interleaved runs. The advice is only advice: where the kernel refuses it, or THP is `never`, the
// memory is ordinary pages and nothing else changes. Smaller allocations are `std::allocator`'s.
//
// Under AddressSanitizer every allocation is std::allocator's: a huge allocation is rounded up to
// 2 MiB, and ASan would not see an overrun into the rounding.
//
// Memory an engine hands a store (the wrapping constructors) is the engine's: it decides its
// pages (e.g. the same madvise on its KV pool).

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KVSIFT_KV_MEMORY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSIFT_KV_MEMORY_ASAN 1
#endif
#endif
#ifndef KVSIFT_KV_MEMORY_ASAN
#define KVSIFT_KV_MEMORY_ASAN 0
#endif

namespace kvsift {

template <class T>
struct kv_allocator {
  using value_type = T;
  static constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;
  // Whether allocations of huge_page_bytes or more take the aligned, advised path (not under ASan).
  static constexpr bool advises_huge_pages = !KVSIFT_KV_MEMORY_ASAN;

  kv_allocator() noexcept = default;
  template <class U>
  kv_allocator(const kv_allocator<U>&) noexcept {}  // NOLINT: rebinding is implicit by design

  [[nodiscard]] T* allocate(std::size_t n) {
    if (!huge(n)) return std::allocator<T>{}.allocate(n);
    if (n > static_cast<std::size_t>(-1) / sizeof(T) - huge_page_bytes) throw std::bad_array_new_length();
    void* p = std::aligned_alloc(huge_page_bytes, rounded(n));
    if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)::madvise(p, rounded(n), MADV_HUGEPAGE);  // advice: a refusal changes nothing
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (!huge(n)) {
      std::allocator<T>{}.deallocate(p, n);
    } else {
      std::free(p);
    }
  }

  friend bool operator==(const kv_allocator&, const kv_allocator&) noexcept { return true; }

 private:
  static constexpr bool huge(std::size_t n) noexcept {
    return advises_huge_pages && n >= huge_page_bytes / sizeof(T);
  }
  static constexpr std::size_t rounded(std::size_t n) noexcept {  // aligned_alloc: a multiple
    return (n * sizeof(T) + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
  }
};

// A vector of KV elements in that memory.
template <class T>
using kv_vector = std::vector<T, kv_allocator<T>>;

}  // namespace kvsift
