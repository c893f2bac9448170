// softmax_rows on the AVX-512 path against the AVX2 path (the same exact steps), bit for bit, over
// rows 1-17, widths 1-1000, ties, -0, -inf, +inf and NaN; then a rough timing of both paths.
#include <kvsift/kvsift.hpp>
#include <random>
#include <bit>
#include <cstdio>
#include <chrono>
#include <algorithm>
using namespace kvsift;
int main() {
  std::mt19937 rng(41); std::normal_distribution<float> nd(0.0f, 4.0f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  long bad = 0, n = 0;
  for (int rows : {1,2,3,4,5,8,9,17}) for (std::size_t m : {1u,2u,3u,7u,8u,15u,16u,17u,31u,32u,33u,40u,257u,1000u}) for (int rep = 0; rep < 14; ++rep) {
    const std::size_t ld = m + 3; std::vector<float> x(rows * ld);
    for (float& v : x) v = nd(rng) * (rep > 7 ? 10.f : 1.f);
    for (int r = 0; r < rows; ++r) { float* row = x.data() + r * ld;
      switch ((rep + r) % 7) { case 1: row[m-1] = row[0] = 30.f; break; case 2: row[0] = -0.f; for (std::size_t j = 1; j < m; ++j) row[j] = j % 2 ? 0.f : -0.f; break;
        case 3: row[m/2] = -inf; break; case 4: row[m-1] = nan; break; case 5: row[0] = nan; break; case 6: row[m/3] = inf; break; default: break; } }
    auto a = x, b = x;
    cpu::softmax_rows(a.data(), rows, m, ld, cpu::simd::avx2);
    cpu::softmax_rows(b.data(), rows, m, ld, cpu::simd::avx512);
    for (std::size_t i = 0; i < x.size(); ++i) { ++n; if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) { if (bad < 5) printf("diff rows %d m %zu rep %d i %zu: %a vs %a\n", rows, m, rep, i, a[i], b[i]); ++bad; } }
  }
  printf("checked %ld, %ld differ\n", n, bad);
  // timing: 4 rows x 257
  std::vector<float> x(4 * 257); for (float& v : x) v = nd(rng);
  for (auto lv : {cpu::simd::avx2, cpu::simd::avx512}) {
    std::vector<double> t;
    for (int k = 0; k < 41; ++k) { auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i) { auto y = x; cpu::softmax_rows(y.data(), 4, 257, 257, lv); asm volatile("" :: "r"(y.data()) : "memory"); }
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200); }
    std::sort(t.begin(), t.end()); printf("%s: %.3f us per 4x257\n", lv == cpu::simd::avx2 ? "old(avx2)" : "avx512", t[20]);
  }
}
