// Throughput of the widening instructions on this core: 8 independent chains of each, relative
// to vpermd (one uop on port 5 on Intel cores: one per cycle).
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#define T512 __attribute__((target("avx512f,avx512bw,avx512vbmi")))
template <int K> T512 __attribute__((noinline)) __m512i chains(long n, __m512i idx) {
  __m512i x[8]; for (int i = 0; i < 8; ++i) x[i] = _mm512_set1_epi32(i + 1);
  const __m512i y = _mm512_set1_epi32(7);
  for (long r = 0; r < n; ++r) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      if constexpr (K == 0) x[i] = _mm512_permutexvar_epi32(idx, x[i]);                        // vpermd
      if constexpr (K == 1) x[i] = _mm512_maskz_permutex2var_epi16(0xAAAAAAAAu, x[i], idx, y);   // vpermt2w (library)
      if constexpr (K == 2) x[i] = _mm512_permutexvar_epi16(idx, x[i]);                        // vpermw
      if constexpr (K == 3) x[i] = _mm512_permutex2var_epi32(x[i], idx, y);                    // vpermt2d
      if constexpr (K == 4) x[i] = _mm512_shuffle_epi8(x[i], idx);                             // vpshufb
      if constexpr (K == 5) x[i] = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(x[i]));         // vpmovzxwd
      if constexpr (K == 6) x[i] = _mm512_maskz_permutex2var_epi8(0xCCCCCCCCCCCCCCCCull, x[i], idx, y);  // vpermt2b
      if constexpr (K == 7) x[i] = _mm512_maskz_permutexvar_epi8(0xCCCCCCCCCCCCCCCCull, idx, x[i]);      // vpermb
      asm volatile("" : "+v"(x[i]));
    }
  }
  __m512i s = x[0]; for (int i = 1; i < 8; ++i) s = _mm512_xor_si512(s, x[i]); return s;
}
template <int K> T512 double rate(long n) {
  const __m512i idx = _mm512_set1_epi32(0x00010000);
  auto t0 = std::chrono::steady_clock::now();
  volatile __m512i s = chains<K>(n, idx); (void)s;
  return n * 8.0 / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
}
int main() {
  const char* names[] = {"vpermd", "vpermt2w (maskz)", "vpermw", "vpermt2d", "vpshufb", "vpmovzxwd", "vpermt2b (maskz)", "vpermb (maskz)"};
  for (int rep = 0; rep < 3; ++rep) {
    double r[8] = {rate<0>(1 << 26), rate<1>(1 << 26), rate<2>(1 << 26), rate<3>(1 << 26), rate<4>(1 << 26), rate<5>(1 << 26), rate<6>(1 << 26), rate<7>(1 << 26)};
    for (int k = 0; k < 8; ++k) printf("%-18s %.2f G/s  (%.2f of vpermd)\n", names[k], r[k], r[k] / r[0]);
    puts("");
  }
}
