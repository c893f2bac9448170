// read rate of several 256 MB huge-page-advised arrays, allocated one after another, read in turns
#include <kvsift/core/kv_memory.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
#include <omp.h>
static double pass(const float* a, std::size_t n, double* sink, int nt) {
  auto t0 = std::chrono::steady_clock::now();
  const long blocks = n / 64; double total = 0;
#pragma omp parallel num_threads(nt) reduction(+:total)
  { float acc[64] = {};
#pragma omp for schedule(static)
    for (long b = 0; b < blocks; ++b) { const float* p = a + b * 64; for (int k = 0; k < 64; ++k) acc[k] += p[k]; }
    for (int k = 0; k < 64; ++k) total += acc[k]; }
  *sink += total;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
int main(int argc, char** argv) {
  const int arrays = argc > 1 ? atoi(argv[1]) : 6, rounds = argc > 2 ? atoi(argv[2]) : 10;
  const std::size_t n = std::size_t{256} << 20 >> 2;
  std::vector<kvsift::kv_vector<float>> v;
  for (int i = 0; i < arrays; ++i) { v.emplace_back(n);
    float* p = v.back().data();
#pragma omp parallel for schedule(static)
    for (long j = 0; j < (long)n; ++j) p[j] = (j & 1023) * 0.001f; }
  double sink = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < arrays; ++i) { double best = 1e9; for (int k = 0; k < 3; ++k) best = std::min(best, pass(v[i].data(), n, &sink, 2));
      std::printf("%5.1f ", n * 4 / best / 1e9); }
    std::printf("\n"); std::fflush(stdout);
  }
  return sink == 1.2345;
}
