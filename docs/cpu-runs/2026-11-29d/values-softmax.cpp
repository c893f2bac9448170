#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/cpu/exact_softmax.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
template <class F> double med(F&& f, int reps = 41) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) { auto t0 = std::chrono::steady_clock::now(); for (int i = 0; i < 100; ++i) f(); t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 100); }
  std::sort(t.begin(), t.end()); return t[reps / 2] * 1e6;
}
int main() {
  using T = kvsift::bfloat16; const int G = 4, d = 128;
  for (int m : {257, 1024}) {
    std::vector<T> v(size_t(m) * d); for (size_t i = 0; i < v.size(); ++i) v[i] = T(float(i % 97) * 0.01f);
    std::vector<const T*> rows(m); for (int j = 0; j < m; ++j) rows[j] = v.data() + size_t(j) * d;
    std::vector<float> w(size_t(G) * m, 1.0f / m), out(G * d), x(size_t(G) * m);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 31) * 0.1f;
    double tv = med([&] { kvsift::cpu::weighted_values_at<T>(w.data(), G, d, m, rows.data(), out.data()); });
    double ts = med([&] { std::vector<float> y = x; kvsift::cpu::softmax_rows(y.data(), G, m, m); });
    double tc = med([&] { std::vector<float> y = x; (void)y; });
    printf("m=%d: weighted_values_at %.2f us (%.1f G FMA/s), softmax_rows %.2f us (copy %.2f)\n", m, tv, double(G) * d * m / tv * 1e-3, ts - tc, tc);
  }
}
