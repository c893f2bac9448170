// H2O's decode step on Llama-3.1-8B's shape (bf16, paged store, page 16), budget 256, after a
// prefill of argv[1] tokens (default 2048): each phase's time per step (decode, attend,
// after_attention) over 8000 steps, the first 100 left out. CALLER=1 runs the library on the
// calling thread (cpu::threading::caller), else on the OpenMP pool. Build from the repository root:
// g++ -std=gnu++20 -O3 -DNDEBUG -fopenmp -Iinclude docs/cpu-runs/2026-12-05d/h2o-phases.cpp
#include <kvsift/kvsift.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
using namespace kvsift;
template <class T> std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<T> v(n);
  for (auto& x : v) x = T(d(g));
  return v;
}
int main(int argc, char** argv) {
  using T = bfloat16;
  using S = store::paged<T>;
  const int n = argc > 1 ? std::atoi(argv[1]) : 2048, L = 32, QH = 32, KH = 8, D = 128, page = 16;
  const model_shape sh{L, QH, KH, D};
  S st(sh, 1, page, KH * ((n + 256 + page - 1) / page + 1));
  h2o<S> m(st, h2o_params<S>(256));
  const int layer = L / 2, c = std::min(n, 4096);
  const auto ck = random_values<T>(static_cast<std::size_t>(c) * KH * D, 21), cv = random_values<T>(ck.size(), 22);
  const auto cq = random_values<float>(static_cast<std::size_t>(c) * QH * D, 23);
  const auto dk = random_values<T>(KH * D, 24), dv = random_values<T>(KH * D, 25);
  const auto dq = random_values<float>(QH * D, 26);
  std::vector<float> out(dq.size());
  for (int t = 0; t < n; t += c) {
    const int len = std::min(c, n - t);
    std::vector<prefill_chunk<T>> chunk{{0, kv_view<const T, nhd>::contiguous(ck.data(), len, KH, D),
                                         kv_view<const T, nhd>::contiguous(cv.data(), len, KH, D),
                                         kv_view<const float, nhd>::contiguous(cq.data(), len, QH, D), t,
                                         t + len >= n}};
    m.prefill(layer, chunk);
  }
  cpu::scoped_threading chosen(std::getenv("CALLER") ? cpu::threading::caller : cpu::threading::pool);
  const std::vector<decode_token<T>> tok{{0, dq.data(), dk.data(), dv.data()}};
  const std::span<const decode_token<T>> tokens(tok);
  std::vector<double> phase[4];
  for (auto& p : phase) p.reserve(8000);
  using clock = std::chrono::steady_clock;
  const auto us = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
  for (int i = 0; i < 8000; ++i) {
    const auto t0 = clock::now();
    m.decode(layer, tokens);
    const auto t1 = clock::now();
    m.attend(layer, tokens, out.data());
    const auto t2 = clock::now();
    m.after_attention(layer, tokens);
    const auto t3 = clock::now();
    if (i < 100) continue;
    phase[0].push_back(us(t0, t1));
    phase[1].push_back(us(t1, t2));
    phase[2].push_back(us(t2, t3));
    phase[3].push_back(us(t0, t3));
  }
  const char* names[4] = {"decode", "attend", "after", "total"};
  for (int k = 0; k < 4; ++k) {
    auto v = phase[k];
    double sum = 0;
    for (const double x : v) sum += x;
    std::sort(v.begin(), v.end());
    std::printf("%-7s mean %6.2f p50 %6.2f p90 %6.2f p99 %6.2f us\n", names[k], sum / v.size(), v[v.size() / 2],
                v[v.size() * 9 / 10], v[v.size() * 99 / 100]);
  }
}
