// One GQA group (4 query heads, head_dim 128) through the public attend_group_at and weighted_values_at
// (KVSIFT_SIMD=avx2|avx512 picks the path), one thread, rows contiguous in huge-page-advised memory;
// best of REPS. ./group ROWS REPS. Built: g++ -std=gnu++20 -O3 -DNDEBUG -Iinclude group.cpp
#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/core/kv_memory.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
using namespace kvsift;
template <class F> double best_of(int reps, F&& f) {
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now(); f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
template <class T> void run(std::size_t m, int reps) {
  const int G = 4, d = 128;
  kv_vector<T> K(m * d), V(m * d);
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  for (auto& x : K) x = T(nd(rng)); for (auto& x : V) x = T(nd(rng));
  std::vector<const T*> kr(m), vr(m);
  for (std::size_t j = 0; j < m; ++j) { kr[j] = K.data() + j * d; vr[j] = V.data() + j * d; }
  std::vector<float> q(G * d), out(G * d), logits, w(G * m, 1e-4f);
  for (auto& x : q) x = nd(rng) * 0.1f;
  const double all = best_of(reps, [&] { cpu::attend_group_at<T>(q.data(), G, d, m, kr.data(), vr.data(), out.data(), 0.088f, logits); });
  const double wv = best_of(reps, [&] { cpu::weighted_values_at<T>(w.data(), G, d, m, vr.data(), out.data()); });
  const double half = m * d * sizeof(T) * 1e-9;
  std::printf("%s m=%zu attend %.1f us (%.1f GB/s) weighted_values %.1f us (%.1f GB/s) out0 %g\n", sizeof(T) == 2 ? "bf16" : "f32 ", m,
              all * 1e6, 2 * half / all, wv * 1e6, half / wv, out[0]);
}
int main(int argc, char** argv) {
  const std::size_t m = std::strtoul(argv[1], nullptr, 10); const int reps = std::atoi(argv[2]);
  run<bfloat16>(m, reps); run<float>(m, reps);
}
