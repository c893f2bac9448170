// Prototype: a plan's positions through a row map and a page table (store/basic.hpp positions_range,
// unordered case), scalar as shipped vs AVX-512 gathers. 8 heads x 1025 slots, pages of 16.
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>
constexpr int kHeads = 8, kSlots = 1025, kPage = 16, kShift = 4;
struct Head { std::vector<int32_t> pages, rows; };
std::vector<int32_t> positions;  // the pool's [pages, 16] positions
__attribute__((noinline)) void scalar(const std::vector<Head>& hs, int32_t* out) {
  for (const auto& h : hs) {
    const int32_t* pl = h.pages.data();
    for (int j = 0; j < kSlots; ++j) {
      const int r = h.rows[j];
      const int64_t f = (int64_t(pl[r >> kShift]) << kShift) | (r & (kPage - 1));
      *out++ = positions[f];
    }
  }
}
__attribute__((noinline, target("avx512f"))) void gathered(const std::vector<Head>& hs, int32_t* out) {
  const __m512i mask = _mm512_set1_epi32(kPage - 1);
  for (const auto& h : hs) {
    const int32_t* pl = h.pages.data();
    const int32_t* rows = h.rows.data();
    int j = 0;
    for (; j + 16 <= kSlots; j += 16) {
      const __m512i r = _mm512_loadu_si512(rows + j);
      const __m512i pg = _mm512_i32gather_epi32(_mm512_srai_epi32(r, kShift), pl, 4);
      const __m512i f = _mm512_or_si512(_mm512_slli_epi32(pg, kShift), _mm512_and_si512(r, mask));
      _mm512_storeu_si512(out + j, _mm512_i32gather_epi32(f, positions.data(), 4));
    }
    for (; j < kSlots; ++j) {
      const int r = rows[j];
      out[j] = positions[(int64_t(pl[r >> kShift]) << kShift) | (r & (kPage - 1))];
    }
    out += kSlots;
  }
}
int main() {
  std::mt19937 rng(7);
  const int pool_pages = 4096;
  positions.resize(size_t(pool_pages) * kPage);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<int> free_pages(pool_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  std::vector<Head> hs(kHeads);
  int next = 0;
  for (auto& h : hs) {
    const int np = (kSlots + kPage) / kPage;
    for (int p = 0; p < np; ++p) h.pages.push_back(free_pages[next++]);
    h.rows.resize(kSlots);
    std::iota(h.rows.begin(), h.rows.end(), 0);
    for (int k = 0; k < 64; ++k) std::swap(h.rows[rng() % kSlots], h.rows[rng() % kSlots]);  // holes refilled
  }
  std::vector<int32_t> a(kHeads * kSlots), b(a.size());
  auto time = [&](auto f, std::vector<int32_t>& o) {
    double best = 1e9;
    for (int rep = 0; rep < 2000; ++rep) {
      auto t0 = std::chrono::steady_clock::now(); f(hs, o.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best * 1e6;
  };
  for (int k = 0; k < 3; ++k) {
    const double s = time(scalar, a), g = time(gathered, b);
    std::printf("8 x 1025 slots: scalar %.2f us, avx512 gathers %.2f us, equal %d\n", s, g, int(a == b));
  }
}
