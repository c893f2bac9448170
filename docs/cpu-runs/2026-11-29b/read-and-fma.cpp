// A flat read of SIZE_KB (2 MiB-aligned, advised as huge pages) with K FMAs per 16 floats read
// (K = 0: plain adds), into 4 to 16 accumulators, one thread: how one core's read rate from
// DRAM combines with arithmetic. Build and run:
//   g++ -O3 -mavx512f -mfma -DPFH=_MM_HINT_T0 read-and-fma.cpp -o rf     # PF > 0: prefetch PF bytes ahead
//   g++ -O3 -mavx512f -mfma -DPFH=_MM_HINT_T0 -DTOUCH read-and-fma.cpp -o rt  # PF > 0: a scalar load
//        PF bytes ahead instead (env PF2=N adds a T2 prefetch N bytes ahead)
//   ./rf SIZE_KB K PF          (env FILL=byte fills the array, NOHUGE=1 advises small pages)
// Build at -O3: at -O2 GCC 12 keeps the accumulators in a stack array (results.txt section 8b).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
static unsigned long g_touch; static size_t g_pf2 = getenv("PF2") ? atoi(getenv("PF2")) : 0;
template <int K>
__attribute__((noinline)) __m512 pass(const char* buf, size_t bytes, int pf) {
  __m512 acc[16]; for (auto& a : acc) a = _mm512_setzero_ps(); unsigned long touch = 0;
  const __m512 q0 = _mm512_set1_ps(1.0001f), q1 = _mm512_set1_ps(0.9999f), q2 = _mm512_set1_ps(1.01f), q3 = _mm512_set1_ps(0.99f);
  for (size_t o = 0; o < bytes; o += 256) {
#ifdef TOUCH
    if (pf) for (int l = 0; l < 4; ++l) touch += *(const volatile unsigned long*)(buf + o + pf + 64 * l);
    if (g_pf2) for (int l = 0; l < 4; ++l) _mm_prefetch(buf + o + g_pf2 + 64 * l, _MM_HINT_T2);
#else
    if (pf) for (int l = 0; l < 4; ++l) _mm_prefetch(buf + o + pf + 64 * l, PFH);
#endif
    for (int l = 0; l < 4; ++l) {
      const __m512 v = _mm512_load_ps((const float*)(buf + o + 64 * l));
      if constexpr (K == 0) acc[l] = _mm512_add_ps(acc[l], v);
      if constexpr (K >= 1) acc[4 * 0 + l] = _mm512_fmadd_ps(q0, v, acc[4 * 0 + l]);
      if constexpr (K >= 2) acc[4 * 1 + l] = _mm512_fmadd_ps(q1, v, acc[4 * 1 + l]);
      if constexpr (K >= 4) { acc[4 * 2 + l] = _mm512_fmadd_ps(q2, v, acc[4 * 2 + l]); acc[4 * 3 + l] = _mm512_fmadd_ps(q3, v, acc[4 * 3 + l]); }
      if constexpr (K >= 8) { acc[4 * 0 + l] = _mm512_fmadd_ps(q3, v, acc[4 * 0 + l]); acc[4 * 1 + l] = _mm512_fmadd_ps(q2, v, acc[4 * 1 + l]);
                              acc[4 * 2 + l] = _mm512_fmadd_ps(q1, v, acc[4 * 2 + l]); acc[4 * 3 + l] = _mm512_fmadd_ps(q0, v, acc[4 * 3 + l]); }
    }
  }
  __m512 s = acc[0]; for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]); g_touch = touch; return s;
}
int main(int argc, char** argv) {
  const size_t bytes = strtoul(argv[1], 0, 10) << 10; const int k = atoi(argv[2]), pf = atoi(argv[3]);
  char* buf = (char*)aligned_alloc(2u << 20, (bytes + (2u << 20)) & ~size_t((2u << 20) - 1)); madvise(buf, bytes, MADV_HUGEPAGE); memset(buf, getenv("FILL") ? atoi(getenv("FILL")) : 0, bytes); if (getenv("NOHUGE")) madvise(buf, bytes, MADV_NOHUGEPAGE);
  const int reps = bytes < (64u << 20) ? 2000 : 5;
  double best = 1e9; float sink = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    __m512 s = k == 0 ? pass<0>(buf, bytes, pf) : k == 1 ? pass<1>(buf, bytes, pf) : k == 2 ? pass<2>(buf, bytes, pf) : k == 4 ? pass<4>(buf, bytes, pf) : pass<8>(buf, bytes, pf);
    sink += _mm512_reduce_add_ps(s);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); if (t < best) best = t;
  }
  printf("%8zu KB K=%d pf=%5d: %6.2f GB/s  %6.1f G FMA/s (%g)\n", bytes >> 10, k, pf, bytes / best * 1e-9, bytes / 64.0 * k * 16 / best * 1e-9, sink);
}
