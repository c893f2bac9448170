// The decode attention of one layer (8 KV heads, G query heads each, d = 128) over 32K contiguous
// rows of a dense store from DRAM (a 256 MB read between repetitions), f32 and bf16, with the
// streaming read beside it and over the store's own keys. argv: G (default 4) and a mode:
// 0 attention::attend_plan; 1 the row addresses built per 2048-row chunk, attend_group_at per
// chunk; 2 the same with one table per head; 3 attend_group_at over tables built once, untimed.
// The KFREE=1..6 rows of results.txt ran modes 0 and 3 against a copy of
// cpu/decode_attention.hpp whose attend_group replaced a pass by plain loads of its rows (see
// results.txt, item 2). Build from the repository root:
// g++ -std=gnu++20 -O3 -DNDEBUG -fopenmp -Iinclude attend-modes.cpp
#include <kvsift/kvsift.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include <omp.h>
using namespace kvsift;
static int G = 4; static int mode = 0;
template <class T> double run(int n, int reps) {
  model_shape sh{1, 8 * G, 8, 128};
  store::dense<T> st(sh, 1, n);
  const int chunk = 4096;
  std::vector<T> k((size_t)chunk * 8 * 128), v(k.size());
  std::mt19937 g(1); std::normal_distribution<float> nd;
  for (auto& x : k) x = T(nd(g)); for (auto& x : v) x = T(nd(g));
  for (int t = 0; t < n; t += chunk)
    st.append(0, 0, kv_view<const T, nhd>::contiguous(k.data(), chunk, 8, 128),
              kv_view<const T, nhd>::contiguous(v.data(), chunk, 8, 128), t);
  index_sets plan;
  std::vector<std::int32_t> all(n); for (int i = 0; i < n; ++i) all[i] = i;
  for (int h = 0; h < 8; ++h) plan.push_back(all);
  std::vector<float> q(8 * G * 128), out(8 * G * 128);
  for (auto& x : q) x = nd(g) * 0.1f;
  std::vector<double> ts;
  static kv_vector<float> junk(64 << 20);
  for (int r = 0; r < reps; ++r) {
    { float acc = 0;
#pragma omp parallel for reduction(+ : acc)
      for (size_t i = 0; i < junk.size(); i += 16) acc += junk[i];
      if (acc == 1.5f) printf("x"); }
    auto t0 = std::chrono::steady_clock::now();
    if (mode == 0) attention::attend_plan(st, 0, 0, q.data(), plan, out.data());
    else if (mode == 3) {
      static std::vector<std::vector<const T*>> tabs;
      if (tabs.empty()) { tabs.resize(16); for (int h = 0; h < 8; ++h) { tabs[2*h].resize(n); tabs[2*h+1].resize(n); st.row_addresses(sh.sequence(0,0,h), std::span<const std::int32_t>(all), tabs[2*h].data(), tabs[2*h+1].data()); } }
      cpu::parallel_for(8, [&](std::int64_t h) { thread_local std::vector<float> lg;
        cpu::attend_group_at<T>(q.data() + h * G * 128, G, 128, n, tabs[2*h].data(), tabs[2*h+1].data(), out.data() + h * G * 128, 0.088f, lg); }, cpu::par, 1 << 30);
    }
    else {
      cpu::parallel_for(8, [&](std::int64_t h) {
        thread_local std::vector<const T*> kr(4096), vr(4096); thread_local std::vector<float> lg; thread_local std::vector<float> o(G * 128);
        const auto seq = sh.sequence(0, 0, (int)h);
        const std::size_t ch = mode == 1 ? 2048 : n;
        if (kr.size() < ch) { kr.resize(ch); vr.resize(ch); }
        for (std::size_t c0 = 0; c0 < (std::size_t)n; c0 += ch) {
          const std::size_t m = std::min(ch, (std::size_t)n - c0);
          st.row_addresses(seq, std::span<const std::int32_t>(all.data() + c0, m), kr.data(), vr.data());
          cpu::attend_group_at<T>(q.data() + h * G * 128, G, 128, m, kr.data(), vr.data(), o.data(), 0.088f, lg);
        }
        std::copy(o.begin(), o.end(), out.begin() + h * G * 128);
      }, cpu::par, 1 << 30);
    }
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  {
    const T* k0 = st.key(sh.sequence(0, 0, 0), 0); const T* k7 = st.key(sh.sequence(0, 0, 7), 0);
    const char* base = (const char*)k0; const size_t nbytes = (const char*)k7 - base + (size_t)n * 128 * sizeof(T);
    double best = 0;
    for (int r = 0; r < 5; ++r) {
      { float acc = 0;
#pragma omp parallel for reduction(+ : acc)
        for (size_t i = 0; i < junk.size(); i += 16) acc += junk[i];
        if (acc == 1.5f) printf("x"); }
      auto t0 = std::chrono::steady_clock::now(); double total = 0;
#pragma omp parallel reduction(+ : total)
      { float acc[16] = {}; const float* a = (const float*)base;
#pragma omp for schedule(static)
        for (size_t b = 0; b < nbytes / 64; ++b) for (int k = 0; k < 16; ++k) acc[k] += a[b * 16 + k];
        for (float x : acc) total += x; }
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (total == 0.5) printf("x");
      best = std::max(best, nbytes / t / 1e9);
    }
    fprintf(stderr, "[store-K stream %.2f GB/s over %.0f MB] ", best, nbytes / 1e6);
  }
  double bytes = 2.0 * n * 8 * 128 * sizeof(T);
  fprintf(stderr, "[best %.2f median %.2f] ", bytes / ts[0] / 1e9, bytes / ts[ts.size() / 2] / 1e9);
  return bytes / ts[ts.size() / 2] / 1e9;
}
// The bench's streaming read (bench/main.cpp): a 256 MB float array summed in 16-lane blocks by
// every OpenMP thread, best of five passes.
double ref() {
  const size_t n = 64 << 20;
  kv_vector<float> a(n);  // the stores' memory (core/kv_memory.hpp), first touched by its readers
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i & 1023) * 0.001f;
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    double total = 0;
#pragma omp parallel reduction(+ : total)
    {
      float acc[16] = {};
#pragma omp for schedule(static)
      for (size_t b = 0; b < n / 16; ++b)
        for (int k = 0; k < 16; ++k) acc[k] += a[b * 16 + k];
      for (float x : acc) total += x;
    }
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (total < 0) printf("x");
    best = std::max(best, n * 4.0 / t / 1e9);
  }
  return best;
}
int main(int argc, char** argv) {
  int n = 32768; G = argc > 1 ? atoi(argv[1]) : 4; mode = argc > 2 ? atoi(argv[2]) : 0;
  double r0 = ref();
  double f = run<float>(n, 30), b = run<bfloat16>(n, 30);
  double r1 = ref();
  printf("ref %.1f %.1f  f32 %.2f GB/s (%.3f)  bf16 %.2f GB/s (%.3f)\n", r0, r1, f, f / std::max(r0, r1), b, b / std::max(r0, r1));
}
