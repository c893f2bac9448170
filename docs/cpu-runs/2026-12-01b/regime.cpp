// alternates a 2-thread streaming read of 256 MB with a 2-thread register-FMA loop; prints both rates
#include <kvsift/core/kv_memory.hpp>
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <omp.h>
static double pass(const float* a, std::size_t n, double* sink) {
  auto t0 = std::chrono::steady_clock::now();
  const long blocks = n / 64; double total = 0;
#pragma omp parallel reduction(+:total)
  { float acc[64] = {};
#pragma omp for schedule(static)
    for (long b = 0; b < blocks; ++b) { const float* p = a + b * 64; for (int k = 0; k < 64; ++k) acc[k] += p[k]; }
    for (int k = 0; k < 64; ++k) total += acc[k]; }
  *sink += total;
  return n * 4.0 / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
__attribute__((target("avx512f"))) static double fma(double* sink) {
  const long rounds = 1 << 19;
  auto t0 = std::chrono::steady_clock::now();
  double tot = 0;
#pragma omp parallel reduction(+:tot)
  { __m512 a[12]; for (int k = 0; k < 12; ++k) a[k] = _mm512_set1_ps(0.001f * k);
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
    for (long i = 0; i < rounds; ++i) for (int k = 0; k < 12; ++k) a[k] = _mm512_fmadd_ps(a[k], x, y);
    __m512 s = a[0]; for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, a[k]); tot += _mm512_reduce_add_ps(s); }
  *sink += tot;
  return 2.0 * rounds * 12 * 16 / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 400;
  const std::size_t n = std::size_t{256} << 20 >> 2;
  kvsift::kv_vector<float> v(n);
  float* p = v.data();
#pragma omp parallel for schedule(static)
  for (long j = 0; j < (long)n; ++j) p[j] = (j & 1023) * 0.001f;
  double sink = 0;
  for (int r = 0; r < rounds; ++r) std::printf("%.1f %.1f\n", pass(p, n, &sink) / 1e9, fma(&sink) / 1e9);
  return sink == 1.2345;
}
