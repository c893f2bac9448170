// Read SIZE MB as 256-byte rows in fours with 8 FMAs per 64-byte line (register accumulators), in
// two line orders: sequential (row 0's 4 lines, then row 1's, ...) or the decode kernel's (line 0
// of rows 0-3, then line 1 of rows 0-3, ...), three rounds of both. One thread.
//   g++ -O3 -mavx512f -mfma line-order.cpp -o lo; ./lo SIZE_MB [PF_BYTES [0: T0 | 1: T2]]
// -DFILL=N adds N independent integer adds (asm, on four registers) after every line's load: does
// the instruction count per line limit the read rate from DRAM? (results.txt sections 10 and 12)
#ifndef FILL
#define FILL 0
#endif
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
static unsigned long g_fill;
template <bool Interleaved>
__attribute__((noinline)) __m512 pass(const char* buf, size_t bytes, long pf, int hint) {
  __m512 acc[16]; for (auto& a : acc) a = _mm512_setzero_ps(); unsigned long filler[4] = {0, 0, 0, 0};
  const __m512 q[4] = {_mm512_set1_ps(1.0001f), _mm512_set1_ps(0.9999f), _mm512_set1_ps(1.01f), _mm512_set1_ps(0.99f)};
  for (size_t o = 0; o < bytes; o += 1024) {
    if (pf) for (int l = 0; l < 16; ++l) { if (hint) _mm_prefetch(buf + o + pf + 64 * l, _MM_HINT_T2); else _mm_prefetch(buf + o + pf + 64 * l, _MM_HINT_T0); }
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      const int r = Interleaved ? i % 4 : i / 4, l = Interleaved ? i / 4 : i % 4;
      const __m512 v = _mm512_load_ps((const float*)(buf + o + 256 * r + 64 * l));
#pragma GCC unroll 16
      for (int f = 0; f < FILL; ++f) asm volatile("add $1, %0" : "+r"(filler[f % 4]));
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) { acc[4 * g + r] = _mm512_fmadd_ps(q[g], v, acc[4 * g + r]); acc[4 * g + r] = _mm512_fmadd_ps(q[3 - g], v, acc[4 * g + r]); }
    }
  }
  __m512 s = acc[0]; for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]); g_fill = filler[0] + filler[1] + filler[2] + filler[3]; return s;
}
int main(int argc, char** argv) {
  const size_t bytes = strtoul(argv[1], 0, 10) << 20; const long pf = argc > 2 ? atol(argv[2]) : 0; const int hint = argc > 3 ? atoi(argv[3]) : 0;
  char* buf = (char*)aligned_alloc(2u << 20, bytes); madvise(buf, bytes, MADV_HUGEPAGE); memset(buf, 0, bytes);
  for (int round = 0; round < 3; ++round) for (int mode = 0; mode < 2; ++mode) {
    double best = 1e9; float sink = 0;
    for (int r = 0; r < 3; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      __m512 s = mode ? pass<true>(buf, bytes, pf, hint) : pass<false>(buf, bytes, pf, hint);
      sink += _mm512_reduce_add_ps(s);
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); if (t < best) best = t;
    }
    printf("%s pf=%ld hint=%s: %.2f GB/s (%g)\n", mode ? "interleaved" : "sequential ", pf, hint ? "T2" : "T0", bytes / best * 1e-9, sink);
  }
}
