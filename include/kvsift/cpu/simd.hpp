// SPDX-License-Identifier: Apache-2.0
#pragma once

// The CPU's vector paths: which one this CPU and build can run (portable, AVX2, AVX-512, AVX-512
// with AMX tiles), a pin to a lower one for tests and side-by-side benchmarks (`scoped_simd`,
// `force_simd`, KVSIFT_SIMD=portable|avx2|avx512 in the environment, read once), and the target
// attributes the
// kernels compiled for each path carry (`__attribute__((target))`, so a binary built for generic
// x86-64 still runs them where the CPU has them). Used by the decode attention
// (cpu/decode_attention.hpp), the exact dot products (cpu/group_dots.hpp) and the exact softmax
// (cpu/exact_softmax.hpp).

#include <atomic>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(KVSIFT_PORTABLE_ONLY)
#define KVSIFT_HAVE_X86_SIMD_PATH 1
#include <cpuid.h>
// GCC 12's AVX-512 wrappers start from a self-initialised "undefined" vector, which
// -Wmaybe-uninitialized reports wherever they are inlined (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
// Unrolls the loops over a kernel's register arrays (heads, rows, channel blocks: constant trip
// counts) whatever the includer's -O level: without it GCC at -O2 (CMake's RelWithDebInfo) keeps
// the accumulators on the stack and the bf16 attention runs ~3.5x slower than at -O3.
#if defined(__clang__)
#define KVSIFT_UNROLL _Pragma("unroll")
#else
#define KVSIFT_UNROLL _Pragma("GCC unroll 16")
#endif
#define KVSIFT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define KVSIFT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
// AVX2 without FMA: code whose products must round on their own (cpu/group_dots.hpp), and the
// loads both kinds inline (a callee's target must be a subset of its caller's)
#define KVSIFT_TARGET_AVX2_NOFMA __attribute__((target("avx2,f16c")))
// The AVX-512 path's bf16 key pass on the AMX tile unit (cpu/decode_attention.hpp)
#define KVSIFT_TARGET_AMX \
  __attribute__((target("avx512f,avx512bw,avx2,fma,f16c,amx-tile,amx-bf16")))
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define KVSIFT_HAVE_X86_SIMD_PATH 0
#endif

namespace kvsift::cpu {

// The decode attention paths, in order: a CPU that runs one runs every one before it. `amx` is
// the AVX-512 path with the bf16 key pass on the AMX tile unit (AMX-TILE + AMX-BF16: Intel Xeon
// since Sapphire Rapids); every other kernel runs as on `avx512`.
enum class simd { portable, avx2, avx512, amx };

inline std::string_view simd_name(simd s) {
  switch (s) {
    case simd::amx: return "amx";
    case simd::avx512: return "avx512";
    case simd::avx2: return "avx2";
    default: return "portable";
  }
}

#if KVSIFT_HAVE_X86_SIMD_PATH
namespace detail {
// AMX-TILE and AMX-BF16 (CPUID leaf 7: EDX bits 24 and 22), with the tile state enabled by the
// OS (XCR0 bits 17 and 18, read where OSXSAVE says XGETBV may run).
inline bool amx_in_cpu_and_os() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  if ((d & (1u << 24)) == 0 || (d & (1u << 22)) == 0) return false;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 27)) == 0) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}
}  // namespace detail
#endif

// The best path this CPU and build can run.
inline simd detected_simd() {
#if KVSIFT_HAVE_X86_SIMD_PATH
  // The AVX-512 path needs F and BW (the exact dots widen bf16 by a word permute): every
  // AVX-512 CPU since Skylake-SP has both (only the Xeon Phi lacks BW and takes AVX2), and the
  // FMA, AVX2 and F16C the kernels use. F16C is read from CPUID (leaf 1, ECX bit 29): clang 14's
  // __builtin_cpu_supports does not know "f16c".
  static const simd best = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
      return detail::amx_in_cpu_and_os() ? simd::amx : simd::avx512;
    }
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c
               ? simd::avx2
               : simd::portable;
  }();
  return best;
#else
  return simd::portable;
#endif
}

namespace detail {
// -1: no override; otherwise the forced simd value.
inline std::atomic<int>& simd_override() {
  static std::atomic<int> v{[] {
    const char* env = std::getenv("KVSIFT_SIMD");
    const std::string_view pin = env != nullptr ? env : "";
    return pin == "portable" ? static_cast<int>(simd::portable)
           : pin == "avx2"   ? static_cast<int>(simd::avx2)
           : pin == "avx512" ? static_cast<int>(simd::avx512)
                             : -1;
  }()};
  return v;
}

// f.operator()<N>() for N = min(n, Max) (n >= 1): a kernel's tile of N query heads or rows, the
// count a compile-time constant so its accumulators stay in registers.
template <int Max, class F>
void with_heads(int n, F&& f) {
  if constexpr (Max > 1) {
    if (n < Max) {
      with_heads<Max - 1>(n, f);
      return;
    }
  }
  f.template operator()<Max>();
}
}  // namespace detail

// The path the vector kernels take: the detected one unless pinned lower. A pin above what the CPU
// has runs the detected path.
inline simd active_simd() {
  const int o = detail::simd_override().load(std::memory_order_relaxed);
  const simd best = detected_simd();
  return o >= 0 && o < static_cast<int>(best) ? static_cast<simd>(o) : best;
}
// Whether this process may run AMX tile instructions, asked of the OS once, the first time the
// amx path is about to run (never where it is pinned lower): Linux grants the tile data state
// per process on request (arch_prctl ARCH_REQ_XCOMP_PERM, 5.16 and later; it refuses while a
// thread has an alternate signal stack too small for that state, and afterwards such a stack
// cannot be installed). A refusal, or another OS, leaves the amx path running as avx512;
// KVSIFT_SIMD=avx512 keeps the request from being made.
inline bool amx_ready() {
#if KVSIFT_HAVE_X86_SIMD_PATH && defined(__linux__)
  static const bool granted = [] {
    constexpr long kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kXtiledata = 18;         // XFEATURE_XTILEDATA
    return detected_simd() == simd::amx && ::syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

// Pins the path (process-wide) / drops any pin, KVSIFT_SIMD's included.
inline void force_simd(simd s) { detail::simd_override().store(static_cast<int>(s)); }
inline void unforce_simd() { detail::simd_override().store(-1); }

// Pins the path for a scope and restores what was there before (a KVSIFT_SIMD pin included);
// for tests and side-by-side benchmarks.
class scoped_simd {
 public:
  explicit scoped_simd(simd s) : saved_(detail::simd_override().exchange(static_cast<int>(s))) {}
  ~scoped_simd() { detail::simd_override().store(saved_); }
  scoped_simd(const scoped_simd&) = delete;
  scoped_simd& operator=(const scoped_simd&) = delete;

 private:
  int saved_;
};

}  // namespace kvsift::cpu
