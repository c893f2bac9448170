// What a loop's shape costs a plain read on one core (results.txt, item 2): 2 x 16 MB "K" and "V"
// regions of rows (argv: row bytes), each pass after a 512 MB read: one stream, the same rows
// with a run-time inner loop per row, and K/V alternating in chunks of 512-8192 rows.
// Build from the repository root: g++ -std=gnu++20 -O3 -march=native -Iinclude pat.cpp
#include <kvsift/kvsift.hpp>
#include <immintrin.h>
#include <chrono>
#include <cstdio>
using namespace kvsift;
static kv_vector<char> junk(512ull << 20);
void flush() { __m512i a = _mm512_setzero_si512(); for (size_t i = 0; i < junk.size(); i += 64) a = _mm512_or_si512(a, _mm512_loadu_si512(junk.data() + i)); if (_mm512_reduce_or_epi32(a) == 3) printf("x"); }
int main(int argc, char** argv) {
  const size_t R = 1 << 16; int rb = argc > 1 ? atoi(argv[1]) : 256;  // rows per region, row bytes
  kv_vector<char> K(R * rb), V(R * rb);
  for (size_t i = 0; i < K.size(); i += 64) { K[i] = 1; V[i] = 2; } for (size_t i = 0; i < junk.size(); i += 4096) junk[i] = 1;
  auto run = [&](const char* name, auto&& body) {
    double best = 0;
    for (int r = 0; r < 5; ++r) { flush(); auto t0 = std::chrono::steady_clock::now(); __m512i a = body(); double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); if (_mm512_reduce_or_epi32(a) == 3) printf("x"); best = std::max(best, 2.0 * R * rb / t / 1e9); }
    printf("%-40s %.2f GB/s\n", name, best);
  };
  run("stream K then V", [&] { __m512i a = _mm512_setzero_si512(); for (const char* b : {K.data(), V.data()}) for (size_t i = 0; i < R * rb; i += 64) a = _mm512_or_si512(a, _mm512_loadu_si512(b + i)); return a; });
  run("rows (runtime inner) K then V", [&] { __m512i a = _mm512_setzero_si512(); for (const char* b : {K.data(), V.data()}) for (size_t r = 0; r < R; ++r) for (int o = 0; o < rb; o += 64) a = _mm512_or_si512(a, _mm512_loadu_si512(b + r * rb + o)); return a; });
  for (size_t ch : {512ul, 2048ul, 8192ul}) {
    char nm[64]; snprintf(nm, 64, "stream, K/V alternating chunks of %zu rows", ch);
    run(nm, [&] { __m512i a = _mm512_setzero_si512(); for (size_t c = 0; c < R; c += ch) for (const char* b : {K.data(), V.data()}) for (size_t i = c * rb; i < (c + ch) * rb; i += 64) a = _mm512_or_si512(a, _mm512_loadu_si512(b + i)); return a; });
  }
}
