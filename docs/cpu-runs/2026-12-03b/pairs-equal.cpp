// The AVX2 logits of four heads (logits_block<4>: rows in pairs for 16-bit rows, fours for f32)
// against two logits_quad<2> per four rows, bit for bit, bf16, f16 and f32 (37 rows: the tail rows
// take the same loop in both).  g++ -std=c++20 -O3 -march=native -I../../../include pairs-equal.cpp
#include <kvsift/cpu/decode_attention.hpp>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
using namespace kvsift; using namespace kvsift::cpu::detail::avx2;
template <class T> int run() {
  const int G = 4, d = 128; const std::size_t m = 37;
  std::mt19937 rng(3); std::normal_distribution<float> nd;
  std::vector<T> K(m * d); for (auto& x : K) x = T(nd(rng));
  std::vector<float> q(G * d); for (auto& x : q) x = nd(rng);
  std::vector<const T*> kr(m); for (std::size_t j = 0; j < m; ++j) kr[j] = K.data() + j * d;
  auto key = [&](std::size_t j) { return kr[j]; };
  std::vector<float> a(G * m), b(G * m);
  logits_block<4, T>(q.data(), d, m, key, 0.088f, a.data(), m);
  std::size_t j = 0;
  for (; j + 4 <= m; j += 4) { const T* k[4] = {kr[j], kr[j+1], kr[j+2], kr[j+3]}; logits_quad<2, T>(q.data(), d, k, 0.088f, b.data(), m, j); logits_quad<2, T>(q.data() + 2 * d, d, k, 0.088f, b.data() + 2 * m, m, j); }
  for (; j < m; ++j) for (int g = 0; g < G; ++g) b[g * m + j] = a[g * m + j];  // tail rows: one loop in both
  int diff = 0; for (std::size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], 4) != 0;
  std::printf("%d of %zu differ\n", diff, a.size()); return diff;
}
int main() { return run<bfloat16>() + run<half>() + run<float>(); }
