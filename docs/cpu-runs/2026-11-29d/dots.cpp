// group_dots_rows (H2O's exact q.k) on one GQA group: G = 4, d = 128, m rows (L1/L2 resident), one thread.
#include <kvsift/cpu/group_dots.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
template <class T> double run(int m, int reps, float* sink) {
  const int G = 4, d = 128;
  std::vector<T> k(size_t(m) * d);
  for (size_t i = 0; i < k.size(); ++i) k[i] = T(float((i * 2654435761u >> 20) % 1000) * 0.001f - 0.5f);
  std::vector<const T*> rows(m);
  for (int j = 0; j < m; ++j) rows[j] = k.data() + size_t(j) * d;
  std::vector<float> q(G * d), out(size_t(G) * m);
  for (int i = 0; i < G * d; ++i) q[i] = 0.01f * (i % 13) - 0.05f;
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < 100; ++it) kvsift::cpu::group_dots_rows<T>(q.data(), G, d, m, [&](size_t j) { return rows[j]; }, out.data(), m);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 100);
    *sink += out[m - 1];
  }
  std::sort(t.begin(), t.end());
  double h = 0; for (float x : out) h = h * 1.0000001 + x;  // a checksum: old and new must agree
  printf("  %s m=%d: median %.2f us, best %.2f us, %.1f G mul-adds/s (checksum %.9g)\n", sizeof(T) == 2 ? "bf16" : "f32 ", m, t[reps / 2] * 1e6, t[0] * 1e6, double(G) * d * m / t[reps / 2] * 1e-9, h);
  return t[reps / 2];
}
int main() {
  float s = 0;
  for (int k = 0; k < 2; ++k) { run<kvsift::bfloat16>(257, 41, &s); run<float>(257, 41, &s); run<kvsift::bfloat16>(1024, 21, &s); }
  if (s == 1234.5f) puts("");
}
