// The key pass alone on one core: avx512::logits_block (bf16 channel pairs) against
// avx512::amx_logits (the amx path's tile products) over n rows of one head (argv: n, repetitions)
// and a plain read of the same rows; prints ns per row and the largest difference of the logits.
// Build from the repository root:
// g++ -std=gnu++20 -O3 -DNDEBUG -fopenmp -march=native -Iinclude kpass.cpp
#include <kvsift/kvsift.hpp>
#include <chrono>
#include <cstdio>
#include <random>
using namespace kvsift; using namespace kvsift::cpu::detail;
int main(int argc, char** argv) {
  const int d = 128, G = 4; const size_t n = argc > 1 ? atol(argv[1]) : 2048; const int reps = argc > 2 ? atoi(argv[2]) : 200;
  kvsift::kv_vector<bfloat16> K(n * d); std::mt19937 g(1); std::normal_distribution<float> nd;
  for (auto& x : K) x = bfloat16(nd(g));
  std::vector<float> q(G * d), qp(G * d); for (auto& x : q) x = nd(g) * 0.1f;
  avx512::to_paired_order(q.data(), qp.data(), G, d);
  std::vector<const bfloat16*> rows(n); for (size_t j = 0; j < n; ++j) rows[j] = K.data() + j * d;
  const bfloat16* const* kr = rows.data();
  auto key = [kr](size_t j) { return kr[j]; };
  std::vector<float> l1(G * n), l2(G * n);
  std::vector<std::uint16_t> qt((d / 32) * 512); avx512::amx_query_tiles(q.data(), G, d, qt.data());
  (void)kvsift::cpu::amx_ready();
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) avx512::logits_block<4, bfloat16, true>(qp.data(), d, n, n, key, 0.088f, l1.data(), n);
    auto t1 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) avx512::amx_logits<4>(qt.data(), d, n, n, key, 0.088f, l2.data(), n);
    auto t2 = std::chrono::steady_clock::now();
    double a = std::chrono::duration<double>(t1 - t0).count() / reps / n * 1e9, b = std::chrono::duration<double>(t2 - t1).count() / reps / n * 1e9;
    auto t3 = std::chrono::steady_clock::now();
    __m512i acc = _mm512_setzero_si512();
    for (int r = 0; r < reps; ++r) { const __m512i* p = (const __m512i*)K.data(); for (size_t i = 0; i < n * d / 32; i += 4) acc = _mm512_add_epi32(_mm512_add_epi32(acc, _mm512_add_epi32(_mm512_loadu_si512(p+i), _mm512_loadu_si512(p+i+1))), _mm512_add_epi32(_mm512_loadu_si512(p+i+2), _mm512_loadu_si512(p+i+3))); }
    auto t4 = std::chrono::steady_clock::now();
    double c = std::chrono::duration<double>(t4 - t3).count() / reps / n * 1e9; if (_mm512_reduce_add_epi32(acc) == 12345) printf("x");
    printf("plain %.1f GB/s  ", 256 / c);
    double err = 0; for (size_t i = 0; i < l1.size(); ++i) err = std::max(err, (double)std::abs(l1[i] - l2[i]));
    printf("n=%zu avx512 %.2f ns/row (%.1f GB/s)  amx %.2f ns/row (%.1f GB/s)  maxdiff %.2e\n", n, a, 256 / a, b, 256 / b, err);
  }
}
