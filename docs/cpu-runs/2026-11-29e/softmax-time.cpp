// One thread: softmax_rows over 4 rows of 257 (H2O's GQA group over its kept rows) on the
// CPU's best path; medians of 41 x 200 calls.
#include <kvsift/kvsift.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
int main() {
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (const std::size_t m : {257u, 1024u}) {
    std::vector<float> x(4 * m);
    for (float& v : x) v = nd(rng);
    std::vector<double> t;
    double check = 0;
    for (int k = 0; k < 41; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i) {
        auto y = x;
        kvsift::cpu::softmax_rows(y.data(), 4, m, m);
        check += y[i % y.size()];
      }
      t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200);
    }
    std::sort(t.begin(), t.end());
    printf("4 x %zu: %.3f us (min %.3f), checksum %.9g\n", m, t[20], t[0], check);
  }
}
