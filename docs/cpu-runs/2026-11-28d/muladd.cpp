// One core's rate of 16-lane f32 multiply-adds in registers, three ways: FMA (what
// BM_arithmetic_reference measures), a multiply then an add by the embedded-rounding forms
// (what group_dots' exact kernels issue, no contraction), and the same with the multiply's
// operands independent per chain. 12 chains, 2^24 rounds, three times.
//   g++ -O3 muladd.cpp -o muladd && ./muladd
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

constexpr int K = 12;
constexpr std::int64_t R = std::int64_t{1} << 24;
constexpr int kRN = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

__attribute__((target("avx512f"))) float checksum(const __m512* a) {
  alignas(64) float lanes[16];
  float t = 0.0f;
  for (int k = 0; k < K; ++k) {
    _mm512_store_ps(lanes, a[k]);
    for (const float v : lanes) t += v;
  }
  return t;
}

__attribute__((target("avx512f"))) float fma_chains(std::int64_t r) {
  __m512 a[K];
  for (int k = 0; k < K; ++k) a[k] = _mm512_set1_ps(0.001f * k);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
  for (std::int64_t i = 0; i < r; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < K; ++k) a[k] = _mm512_fmadd_ps(a[k], x, y);
  }
  return checksum(a);
}

__attribute__((target("avx512f"))) float mul_add_chains(std::int64_t r) {
  __m512 a[K], q[K];
  for (int k = 0; k < K; ++k) {
    a[k] = _mm512_set1_ps(0.001f * k);
    q[k] = _mm512_set1_ps(1.0f + k);
  }
  __m512 x = _mm512_set1_ps(0.999f);
  for (std::int64_t i = 0; i < r; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < K; ++k) {
      a[k] = _mm512_maskz_add_round_ps(0xFFFF, a[k], _mm512_maskz_mul_round_ps(0xFFFF, q[k], x, kRN), kRN);
    }
    __asm__ volatile("" : "+v"(x));  // the products are recomputed every round
  }
  return checksum(a);
}

template <class F>
void time(const char* name, F f) {
  f(1 << 20);
  const auto t0 = std::chrono::steady_clock::now();
  const float s = f(R);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%-22s %.1f G multiply-adds/s (checksum %g)\n", name, R * K * 16.0 / sec * 1e-9, s);
}

int main() {
  for (int i = 0; i < 3; ++i) {
    time("fma", fma_chains);
    time("multiply then add", mul_add_chains);
  }
}
