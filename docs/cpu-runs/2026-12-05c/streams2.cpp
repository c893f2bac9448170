// One core reading 256 MB as 1, 2, 4 or 8 interleaved streams (results.txt, item 2).
// Build from the repository root: g++ -std=gnu++20 -O3 -march=native -Iinclude streams2.cpp
#include <kvsift/kvsift.hpp>
#include <immintrin.h>
#include <chrono>
#include <cstdio>
using namespace kvsift;
int main() {
  const size_t bytes = 256ull << 20; kv_vector<char> a(bytes), junk(bytes);
  for (size_t i = 0; i < bytes; i += 64) { a[i] = 1; junk[i] = 1; }
  for (int rep = 0; rep < 3; ++rep)
  for (int S : {1, 2, 4, 8}) {
    volatile char sink = 0; for (size_t i = 0; i < bytes; i += 64) sink += junk[i];
    auto t0 = std::chrono::steady_clock::now();
    __m512i acc = _mm512_setzero_si512();
    const size_t per = bytes / S;
    for (size_t o = 0; o < per; o += 256)
      for (int s = 0; s < S; ++s) {
        const char* p = a.data() + s * per + o;
        acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_add_epi32(_mm512_loadu_si512(p), _mm512_loadu_si512(p + 64)), _mm512_add_epi32(_mm512_loadu_si512(p + 128), _mm512_loadu_si512(p + 192))));
      }
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (_mm512_reduce_add_epi32(acc) == 7) printf("x");
    printf("streams %d: %.1f GB/s\n", S, bytes / t / 1e9);
  }
}
