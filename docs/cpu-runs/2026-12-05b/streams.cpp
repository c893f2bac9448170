// Streaming 16 MB "heads" of 512-byte rows (f32, d = 128) from DRAM on one core, in the access
// patterns of the logits pass, with and without its software prefetches (PF 1: the kernels' near
// T0 16 rows ahead + far T2 64 rows ahead; 2: one T2 line per 4 KB page 64 rows ahead; 3: near +
// that; 4: two lines per page). Build: g++ -std=gnu++20 -O2 streams.cpp (results.txt, item 4).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <sys/mman.h>
#include <utility>
#include <cstdint>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// rows of 512 B (f32 d=128). mode 0: row by row; 1: four rows interleaved by line; 2: 1 + rows via pointer table; 3: 2 + stores of 4 floats per 4 rows into 4 streams; PF: +far T2 prefetch 64 rows + near T0 16 rows
template <int mode, int PF>
__attribute__((target("avx512f"))) double pass(const float* a, size_t rows, const float* const* tab, float* lg) {
  double t0 = now(); __m512 s[4][4] = {};
  for (size_t j = 0; j + 4 <= rows; j += 4) {
    if (PF && j + 68 < rows) {
      if (PF == 1 || PF == 3) for (int r = 0; r < 4; ++r) { const char* p = (const char*)(a + (j + 16 + r) * 128); for (int l = 0; l < 8; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0); }
      const char* f = (const char*)(a + (j + 64) * 128);
      if (PF == 1) for (int l = 0; l < 32; ++l) _mm_prefetch(f + 64 * l, _MM_HINT_T2);
      if (PF == 2 || PF == 3) { if (((uintptr_t)f & 4095) < 2048) _mm_prefetch(f, _MM_HINT_T2); }
      if (PF == 4) { if (((uintptr_t)f & 4095) < 2048) { _mm_prefetch(f, _MM_HINT_T2); _mm_prefetch(f + 64, _MM_HINT_T2); } }
    }
    const float* k[4];
    for (int r = 0; r < 4; ++r) k[r] = mode >= 2 ? tab[j + r] : a + (j + r) * 128;
    if (mode == 0) {
      for (int r = 0; r < 4; ++r) for (int b = 0; b < 8; ++b) s[r][b & 3] = _mm512_add_ps(s[r][b & 3], _mm512_loadu_ps(k[r] + 16 * b));
    } else {
      for (int b = 0; b < 8; ++b) for (int r = 0; r < 4; ++r) s[r][b & 3] = _mm512_add_ps(s[r][b & 3], _mm512_loadu_ps(k[r] + 16 * b));
    }
    if (mode == 4) for (int g = 0; g < 4; ++g) _mm_storeu_ps(lg + g * 512 + (j & 511), _mm512_castps512_ps128(s[g][0]));
    if (mode == 3) for (int g = 0; g < 4; ++g) _mm_storeu_ps(lg + g * rows + j, _mm512_castps512_ps128(s[g][0]));
  }
  double t = now() - t0; __m512 z = _mm512_setzero_ps(); for (auto& x : s) for (auto& y : x) z = _mm512_add_ps(z, y);
  volatile float zz = _mm512_reduce_add_ps(z); (void)zz;
  return rows * 512.0 / t / 1e9;
}
int main() {
  size_t n = 64 << 20, rows = n / 128; float* a = (float*)aligned_alloc(2 << 20, n * 4); madvise(a, n * 4, MADV_HUGEPAGE);
  for (size_t i = 0; i < n; ++i) a[i] = 1;
  std::vector<const float*> tab(rows); for (size_t j = 0; j < rows; ++j) tab[j] = a + j * 128;
  // per "head": 32K rows (16 MB), as the kernel sees
  std::vector<float> lg(4 * 32768);
  double r[5][5] = {};
  auto go = [&](auto f) {  // every 32K-row "head" of the array in turn
    double bytes = 0, t = 0;
    for (size_t h = 0; h < rows; h += 32768) {
      const double bw = f(a + h * 128, tab.data() + h);
      t += 32768 * 512.0 / bw;
      bytes += 32768 * 512.0;
    }
    return bytes / t;
  };
  auto mode = [&]<int M, int... P>(std::integral_constant<int, M>, std::integer_sequence<int, P...>) {
    ((r[M][P] = std::max(r[M][P], go([&](const float* p, const float* const* tb) { return pass<M, P>(p, 32768, tb, lg.data()); }))), ...);
  };
  for (int rep = 0; rep < 3; ++rep) {
    mode(std::integral_constant<int, 0>{}, std::make_integer_sequence<int, 5>{});
    mode(std::integral_constant<int, 1>{}, std::make_integer_sequence<int, 5>{});
    mode(std::integral_constant<int, 2>{}, std::make_integer_sequence<int, 5>{});
    mode(std::integral_constant<int, 3>{}, std::make_integer_sequence<int, 5>{});
    mode(std::integral_constant<int, 4>{}, std::make_integer_sequence<int, 5>{});
  }
  const char* nm[5] = {"a row at a time", "four rows by line", "+ row table", "+ logits stores, 4 x m", "+ logits stores, ring"};
  for (int m = 0; m < 5; ++m) printf("%-24s none %.2f  near+far %.2f  far-page-only %.2f  near+far-page %.2f  far-page-2lines %.2f\n", nm[m], r[m][0], r[m][1], r[m][2], r[m][3], r[m][4]);
}
