#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <random>
constexpr int kRN = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#define T512 __attribute__((target("avx512f,avx512bw,avx512vbmi,avx2,fma")))
T512 inline __m512 load_old(const uint16_t* a, const uint16_t* b) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)a)),
                                            _mm_loadu_si128((const __m128i*)b), 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
T512 inline __m512 load_perm(const uint16_t* a, const uint16_t* b, __m512i idx) {
  __m512i A = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)a));
  __m512i B = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)b));
  return _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi16(0xAAAAAAAAu, A, idx, B));
}
T512 inline __m512 load_vpermw(const uint16_t* a, const uint16_t* b, __m512i idx) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)a)),
                                            _mm_loadu_si128((const __m128i*)b), 1);
  return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx, _mm512_castsi256_si512(h)));
}
template <int MODE>
T512 void block(const float* q2, int d, const uint16_t* const* k, float* out, __m512i idx, __m512i idx2) {
  const int blocks = d / 8;
  __m512 acc[4][4];
  _Pragma("GCC unroll 16") for (int p = 0; p < 4; ++p) for (int g = 0; g < 4; ++g) acc[p][g] = _mm512_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    __m512 kv[4];
    _Pragma("GCC unroll 16") for (int p = 0; p < 4; ++p) kv[p] = MODE == 0 ? load_old(k[2*p] + 8*b, k[2*p+1] + 8*b) : MODE == 1 ? load_perm(k[2*p] + 8*b, k[2*p+1] + 8*b, idx) : load_vpermw(k[2*p] + 8*b, k[2*p+1] + 8*b, idx2);
    _Pragma("GCC unroll 16") for (int g = 0; g < 4; ++g) {
      const __m512 qv = _mm512_loadu_ps(q2 + (g * blocks + b) * 16);
      _Pragma("GCC unroll 16") for (int p = 0; p < 4; ++p)
        acc[p][g] = _mm512_add_round_ps(acc[p][g], _mm512_mul_round_ps(qv, kv[p], kRN), kRN);
    }
  }
  _Pragma("GCC unroll 16") for (int p = 0; p < 4; ++p) for (int g = 0; g < 4; ++g) _mm512_storeu_ps(out + (p * 4 + g) * 16, acc[p][g]);
}
T512 int main() {
  const int d = 128, m = 256;
  std::vector<uint16_t> K(m * d); std::mt19937 rng(1);
  for (auto& x : K) x = 0x3f00 + (rng() & 0xff);
  std::vector<float> q2(4 * d * 2, 0.5f), out(256);
  alignas(64) uint16_t ix[32];
  for (int i = 0; i < 16; ++i) { ix[2*i] = 0; ix[2*i+1] = i < 8 ? i : 32 + (i - 8); }
  __m512i idx = _mm512_load_si512(ix);
  alignas(64) uint16_t ix2[32];
  for (int i = 0; i < 16; ++i) { ix2[2*i] = 0; ix2[2*i+1] = i; }
  __m512i idx2 = _mm512_load_si512(ix2);
  // verify equality
  const uint16_t* kk[8]; for (int r = 0; r < 8; ++r) kk[r] = K.data() + r * d;
  std::vector<float> o1(256), o2(256);
  block<0>(q2.data(), d, kk, o1.data(), idx, idx2); block<2>(q2.data(), d, kk, o2.data(), idx, idx2);
  int bad = 0; for (int i = 0; i < 256; ++i) bad += o1[i] != o2[i];
  printf("mismatch %d\n", bad);
  for (int rep = 0; rep < 4; ++rep) {
    for (int mode = 0; mode < 3; ++mode) {
      auto t0 = std::chrono::steady_clock::now();
      const int iters = 20000;
      for (int it = 0; it < iters; ++it) {
        for (int j = 0; j < m; j += 8) {
          for (int r = 0; r < 8; ++r) kk[r] = K.data() + (j + r) * d;
          if (mode == 0) block<0>(q2.data(), d, kk, out.data(), idx, idx2); else if (mode == 1) block<1>(q2.data(), d, kk, out.data(), idx, idx2); else block<2>(q2.data(), d, kk, out.data(), idx, idx2);
          asm volatile("" ::: "memory");
        }
      }
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      double madds = double(iters) * m * d * 4;
      printf("mode %d: %.2f us per 256 rows, %.1f G madd/s\n", mode, t / iters * 1e6, madds / t / 1e9);
    }
  }
}
