// SPDX-License-Identifier: Apache-2.0
// kvsift_bench: the streaming-read bandwidth reference (registered first, statically) and main(),
// which registers the component and method families after it, so the reference runs first.

#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kvbench {

namespace {
double g_bandwidth = 0.0;  // bytes/s; 0 until measured
constexpr std::size_t bandwidth_floats = std::size_t{256} << 20 >> 2;  // 256 MB of float
}  // namespace

void set_bandwidth_reference(double bytes_per_second) { g_bandwidth = bytes_per_second; }

std::vector<float> make_bandwidth_array() {
  std::vector<float> a(bandwidth_floats);
  float* p = a.data();
  const auto n = static_cast<std::int64_t>(a.size());
  // first touch by the threads that later read it
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i & 1023) * 0.001f;
  return a;
}

double streaming_read_pass(const float* a, std::size_t n, double* sink) {
  const auto t0 = std::chrono::steady_clock::now();
  float s = 0.0f;
  const auto nn = static_cast<std::int64_t>(n);
#pragma omp parallel for simd schedule(static) reduction(+ : s)
  for (std::int64_t i = 0; i < nn; ++i) s += a[i];
  const auto t1 = std::chrono::steady_clock::now();
  *sink += s;
  return std::chrono::duration<double>(t1 - t0).count();
}

double bandwidth_reference() {
  if (g_bandwidth <= 0.0) {  // BM_bandwidth_reference was filtered out: measure once, lazily
    const auto a = make_bandwidth_array();
    double sink = 0.0, best = 1e30;
    for (int i = 0; i < 8; ++i) best = std::min(best, streaming_read_pass(a.data(), a.size(), &sink));
    benchmark::DoNotOptimize(sink);
    g_bandwidth = static_cast<double>(a.size() * sizeof(float)) / best;
    std::fprintf(stderr, "kvsift_bench: bandwidth reference measured lazily: %.2f GB/s\n",
                 g_bandwidth * 1e-9);
  }
  return g_bandwidth;
}

// Sum over a 256 MB float array with all cores. Its best pass becomes the reference every other
// benchmark's bw_fraction divides by.
void BM_bandwidth_reference(benchmark::State& st) {
  drop_cached();
  const auto a = make_bandwidth_array();
  double sink = 0.0, best = 1e30;
  for (auto _ : st) best = std::min(best, streaming_read_pass(a.data(), a.size(), &sink));
  benchmark::DoNotOptimize(sink);
  const double bytes = static_cast<double>(a.size() * sizeof(float));
  // keep the best pass seen in this run (several calls happen while sizing iterations)
  g_bandwidth = std::max(g_bandwidth, bytes / best);
  st.counters["bytes_per_second"] =
      benchmark::Counter(bytes * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["best_bytes_per_second"] = g_bandwidth;
  st.counters["bw_fraction"] = benchmark::Counter(
      bytes * static_cast<double>(st.iterations()) / g_bandwidth, benchmark::Counter::kIsRate);
#if defined(_OPENMP)
  st.counters["threads"] = omp_get_max_threads();
#else
  st.counters["threads"] = 1;
#endif
}
BENCHMARK(BM_bandwidth_reference)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace kvbench

int main(int argc, char** argv) {
  kvbench::register_components();
  kvbench::register_methods();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
