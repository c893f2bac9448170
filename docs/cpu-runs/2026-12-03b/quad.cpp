// One thread reading SIZE MB (huge-page-advised) as rows of RB bytes, four rows at a time, with two
// FMAs per 32-byte load: MODE 0 reads a 32-byte block of each of the four rows in turn (the AVX2
// logits quad's order), 2 two rows at a time, 1 each row whole before the next; PF > 0 also
// prefetches (T0) the lines PF bytes ahead.  g++ -O3 -mavx2 -mfma quad.cpp; ./quad SIZE MODE RB PF
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
// rows of RB bytes, 4 rows at a time, 32-byte blocks interleaved across the 4 rows (MODE 0) or row by row (MODE 1)
int main(int argc, char** argv) {
  const size_t bytes = strtoul(argv[1], 0, 10) << 20; const int mode = atoi(argv[2]); const int rb = atoi(argv[3]); const int pf = atoi(argv[4]);
  char* buf = (char*)aligned_alloc(2u << 20, bytes); madvise(buf, bytes, MADV_HUGEPAGE); memset(buf, 1, bytes);
  double best = 1e9; float sink = 0;
  __m256 q = _mm256_set1_ps(1.0f);
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    __m256 acc[8]; for (auto& a : acc) a = _mm256_setzero_ps();
    for (size_t o = 0; o < bytes; o += 4 * rb) {
      if (pf) for (int k = 0; k < 4 * rb; k += 64) _mm_prefetch(buf + o + pf + k, _MM_HINT_T0);
      if (mode == 0) {
        for (int b = 0; b < rb; b += 32)
          for (int r = 0; r < 4; ++r) { __m256 v = _mm256_load_ps((const float*)(buf + o + r * rb + b)); acc[r] = _mm256_fmadd_ps(q, v, acc[r]); acc[4 + r] = _mm256_fmadd_ps(q, v, acc[4 + r]); }
      } else if (mode == 2) {
        for (int h = 0; h < 4; h += 2)
        for (int b = 0; b < rb; b += 32)
          for (int r = h; r < h + 2; ++r) { __m256 v = _mm256_load_ps((const float*)(buf + o + r * rb + b)); acc[r] = _mm256_fmadd_ps(q, v, acc[r]); acc[4 + r] = _mm256_fmadd_ps(q, v, acc[4 + r]); }
      } else {
        for (int r = 0; r < 4; ++r)
          for (int b = 0; b < rb; b += 64) { __m256 v = _mm256_load_ps((const float*)(buf + o + r * rb + b)); __m256 w = _mm256_load_ps((const float*)(buf + o + r * rb + b + 32)); acc[r] = _mm256_fmadd_ps(q, v, acc[r]); acc[4 + r] = _mm256_fmadd_ps(q, w, acc[4 + r]); }
      }
    }
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (t < best) best = t;
    for (auto& a : acc) { float f[8]; _mm256_storeu_ps(f, a); sink += f[0]; }
  }
  printf("mode %d rb %d pf %d: %.2f GB/s (%g)\n", mode, rb, pf, bytes / best * 1e-9, sink);
}
