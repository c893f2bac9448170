// attention::attend_plan alone (8 KV heads x 32K contiguous rows, G = 4, d = 128) from DRAM (a
// 256 MB read before each repetition), f32 and bf16, against the streaming read measured before
// and after; run with KVSIFT_SIMD=avx512 and without (the amx path) for results.txt item 3.
// Build from the repository root: g++ -std=gnu++20 -O3 -DNDEBUG -fopenmp -Iinclude a32.cpp
#include <kvsift/kvsift.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include <omp.h>
using namespace kvsift;
template <class T> double run(int n, int reps) {
  model_shape sh{1, 32, 8, 128};
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
  std::vector<float> q(32 * 128), out(32 * 128);
  for (auto& x : q) x = nd(g) * 0.1f;
  std::vector<double> ts;
  static kv_vector<float> junk(64 << 20);
  for (int r = 0; r < reps; ++r) {
    { float acc = 0;
#pragma omp parallel for reduction(+ : acc)
      for (size_t i = 0; i < junk.size(); i += 16) acc += junk[i];
      if (acc == 1.5f) printf("x"); }
    auto t0 = std::chrono::steady_clock::now();
    attention::attend_plan(st, 0, 0, q.data(), plan, out.data());
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  double bytes = 2.0 * n * 8 * 128 * sizeof(T);
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
  int n = argc > 1 ? atoi(argv[1]) : 32768;
  double r0 = ref();
  double f = run<float>(n, 30), b = run<bfloat16>(n, 30);
  double r1 = ref();
  printf("ref %.1f %.1f  f32 %.2f GB/s (%.3f)  bf16 %.2f GB/s (%.3f)\n", r0, r1, f, f / std::max(r0, r1), b, b / std::max(r0, r1));
}
