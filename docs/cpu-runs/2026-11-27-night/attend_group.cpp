// SPDX-License-Identifier: Apache-2.0
// One KV head's fused decode attention (cpu::attend_group, bf16, G 4, d 128, m rows in
// cache), best of 5 timed loops: how the includer's -O level and compiler change the kernels.
// Build and run: see run_o2.sh beside this file.
#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/core/element.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
using namespace kvsift;
int main(int argc, char** argv) {
  const int G = 4, d = 128;
  const std::size_t m = argc > 1 ? std::atoi(argv[1]) : 1024;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 2000;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<bfloat16> k(m * d), v(m * d);
  for (auto& x : k) x = from_float<bfloat16>(nd(rng));
  for (auto& x : v) x = from_float<bfloat16>(nd(rng));
  std::vector<float> q(G * d), out(G * d);
  for (auto& x : q) x = nd(rng);
  std::vector<const bfloat16*> kr(m), vr(m);
  for (std::size_t j = 0; j < m; ++j) { kr[j] = k.data() + j * d; vr[j] = v.data() + j * d; }
  std::vector<float> logits;
  double best = 1e9;
  for (int t = 0; t < 5; ++t) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) cpu::attend_group<bfloat16>(q.data(), G, d, m, [&](std::size_t j) { return kr[j]; }, [&](std::size_t j) { return vr[j]; }, out.data(), 0.088f, logits);
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count() / reps);
  }
  std::printf("m=%zu best %.2f us/call  %.2f GB/s  out0=%g\n", m, best, 2.0 * m * d * 2 / best / 1e3, out[0]);
}
