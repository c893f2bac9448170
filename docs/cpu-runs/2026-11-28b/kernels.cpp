#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/decode_attention.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include <algorithm>
using namespace kvsift;
template <class T> void run(const char* name) {
  const int H = 8, G = 4, d = 128; const std::size_t m = 257;
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  std::vector<T> K(H * m * d), V(H * m * d);
  for (auto& x : K) x = T(nd(rng)); for (auto& x : V) x = T(nd(rng));
  std::vector<float> q(H * G * d); for (auto& x : q) x = nd(rng);
  std::vector<const T*> kr(H * m), vr(H * m);
  // scatter rows a bit like pages
  for (int h = 0; h < H; ++h) for (std::size_t j = 0; j < m; ++j) { kr[h*m+j] = &K[(h*m+j)*d]; vr[h*m+j] = &V[(h*m+j)*d]; }
  std::vector<float> probs(H * G * m), out(H * G * d);
  double best[3] = {1e9, 1e9, 1e9};
  for (int rep = 0; rep < 2000; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int h = 0; h < H; ++h) {
      const T* const* krh = kr.data() + h * m;
      cpu::group_dots_rows<T>(q.data() + h * G * d, G, d, m, [krh](std::size_t j) { return krh[j]; }, probs.data() + h * G * m, m);
    }
    auto t1 = std::chrono::steady_clock::now();
    for (int h = 0; h < H; ++h) cpu::softmax_rows(probs.data() + h * G * m, G, m, m);
    auto t2 = std::chrono::steady_clock::now();
    for (int h = 0; h < H; ++h) cpu::weighted_values_at<T>(probs.data() + h * G * m, G, d, m, vr.data() + h * m, out.data() + h * G * d);
    auto t3 = std::chrono::steady_clock::now();
    best[0] = std::min(best[0], std::chrono::duration<double>(t1 - t0).count());
    best[1] = std::min(best[1], std::chrono::duration<double>(t2 - t1).count());
    best[2] = std::min(best[2], std::chrono::duration<double>(t3 - t2).count());
  }
  std::printf("%s dots %.2f us softmax %.2f us wv %.2f us  (out %g)\n", name, best[0] * 1e6, best[1] * 1e6, best[2] * 1e6, out[5]);
}
int main() { run<float>("f32"); run<bfloat16>("bf16"); }
