// A flat sum over SIZE MB (2 MiB-aligned, advised as huge pages), 8 zmm accumulators, one thread,
// optionally prefetching PF bytes ahead (T0). g++ -O3 -mavx512f flat-read.cpp; ./flat-read SIZE PF
// (results.txt section 4 was a -O2 build, whose accumulators GCC 12 kept in a stack array.)
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
int main(int argc, char** argv) {
  const size_t bytes = strtoul(argv[1], 0, 10) << 20; const int pf = atoi(argv[2]);
  char* buf = (char*)aligned_alloc(2u << 20, bytes); madvise(buf, bytes, MADV_HUGEPAGE); memset(buf, 1, bytes);
  double best = 1e9; float sink = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    __m512 acc[8]; for (auto& a : acc) a = _mm512_setzero_ps();
    for (size_t o = 0; o < bytes; o += 512) {
      if (pf) _mm_prefetch(buf + o + pf, _MM_HINT_T0), _mm_prefetch(buf + o + pf + 64, _MM_HINT_T0), _mm_prefetch(buf + o + pf + 128, _MM_HINT_T0), _mm_prefetch(buf + o + pf + 192, _MM_HINT_T0),
      _mm_prefetch(buf + o + pf + 256, _MM_HINT_T0), _mm_prefetch(buf + o + pf + 320, _MM_HINT_T0), _mm_prefetch(buf + o + pf + 384, _MM_HINT_T0), _mm_prefetch(buf + o + pf + 448, _MM_HINT_T0);
      for (int k = 0; k < 8; ++k) acc[k] = _mm512_add_ps(acc[k], _mm512_load_ps((const float*)(buf + o + 64 * k)));
    }
    __m512 s = acc[0]; for (int i = 1; i < 8; ++i) s = _mm512_add_ps(s, acc[i]); sink += _mm512_reduce_add_ps(s);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); if (t < best) best = t;
  }
  printf("%zu MB pf=%d: %.2f GB/s (%g)\n", bytes >> 20, pf, bytes / best * 1e-9, sink);
}
