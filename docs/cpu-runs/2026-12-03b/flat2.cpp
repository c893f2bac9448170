// A flat sum over SIZE MB, 8 ymm accumulators, one thread (AVX2); PF > 0 prefetches (T0) PF bytes
// ahead; HP = 0 skips the huge-page advice.  g++ -O3 -mavx2 -mfma flat2.cpp; ./flat2 SIZE PF [HP]
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
int main(int argc, char** argv) {
  const size_t bytes = strtoul(argv[1], 0, 10) << 20; const int pf = atoi(argv[2]); const int hp = argc > 3 ? atoi(argv[3]) : 1;
  char* buf = (char*)aligned_alloc(2u << 20, bytes); if (hp) madvise(buf, bytes, MADV_HUGEPAGE); memset(buf, 1, bytes);
  double best = 1e9; float sink = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    __m256 acc[8]; for (auto& a : acc) a = _mm256_setzero_ps();
    for (size_t o = 0; o < bytes; o += 256) {
      if (pf) for (int k = 0; k < 4; ++k) _mm_prefetch(buf + o + pf + 64 * k, _MM_HINT_T0);
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_add_ps(acc[k], _mm256_load_ps((const float*)(buf + o + 32 * k)));
    }
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (t < best) best = t;
    for (auto& a : acc) { float f[8]; _mm256_storeu_ps(f, a); sink += f[0]; }
  }
  printf("%zu MB pf %d hp %d: %.2f GB/s (%g)\n", bytes >> 20, pf, hp, bytes / best * 1e-9, sink);
}
