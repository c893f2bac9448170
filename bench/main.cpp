// SPDX-License-Identifier: Apache-2.0
// kvsift_bench: the streaming-read bandwidth reference (registered first, statically) and main(),
// which registers the component and method families after it, so the reference runs first.

#include "common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string_view>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace kvbench {

namespace {
int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}
double g_bandwidth = 0.0;  // bytes/s; 0 until measured
bool g_reference_beside = true;  // --kvsift_reference=beside (default) | run
constexpr std::size_t bandwidth_floats = std::size_t{256} << 20 >> 2;  // 256 MB of float
}  // namespace

void set_bandwidth_reference(double bytes_per_second) { g_bandwidth = bytes_per_second; }
bool reference_beside() { return g_reference_beside; }
void set_reference_beside(bool on) { g_reference_beside = on; }

kvsift::kv_vector<float> make_bandwidth_array() {
  kvsift::kv_vector<float> a(bandwidth_floats);
  float* p = a.data();
  const auto n = static_cast<std::int64_t>(a.size());
  // first touch by the threads that later read it
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i & 1023) * 0.001f;
  return a;
}

namespace {
// The array the lazy reference and the passes beside decode rows read: made once, kept for the run.
const kvsift::kv_vector<float>& kept_bandwidth_array() {
  static const auto a = make_bandwidth_array();
  return a;
}
}  // namespace

// Many independent accumulators (64 float lanes = 16 SSE registers): a single vector accumulator
// would make the sum latency-bound (one add per 4 cycles), measuring the adder, not the memory.
constexpr std::int64_t lanes = 64;
double streaming_read_pass(const float* a, std::size_t n, double* sink, int threads) {
  const int nt = threads > 0 ? threads : max_threads();
  const auto t0 = std::chrono::steady_clock::now();
  const auto blocks = static_cast<std::int64_t>(n) / lanes;
  double total = 0.0;
#pragma omp parallel num_threads(nt) reduction(+ : total)
  {
    float acc[lanes] = {};
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const float* p = a + b * lanes;
      for (int k = 0; k < lanes; ++k) acc[k] += p[k];
    }
    for (int k = 0; k < lanes; ++k) total += acc[k];
  }
  for (std::size_t i = static_cast<std::size_t>(blocks * lanes); i < n; ++i) total += a[i];
  const auto t1 = std::chrono::steady_clock::now();
  *sink += total;
  return std::chrono::duration<double>(t1 - t0).count();
}

double bandwidth_reference() {
  if (g_bandwidth <= 0.0) {  // BM_bandwidth_reference was filtered out: measure once, lazily
    const auto& a = kept_bandwidth_array();
    double sink = 0.0, best = 1e30;
    for (int i = 0; i < 8; ++i) best = std::min(best, streaming_read_pass(a.data(), a.size(), &sink, i % 2));
    benchmark::DoNotOptimize(sink);
    g_bandwidth = static_cast<double>(a.size() * sizeof(float)) / best;
    std::fprintf(stderr, "kvsift_bench: bandwidth reference measured lazily: %.2f GB/s\n",
                 g_bandwidth * 1e-9);
  }
  return g_bandwidth;
}

double bandwidth_now() {
  const auto& a = kept_bandwidth_array();
  double sink = 0.0;
  const double seconds = streaming_read_pass(a.data(), a.size(), &sink, 0);
  benchmark::DoNotOptimize(sink);
  return static_cast<double>(a.size() * sizeof(float)) / seconds;
}

// Sum over a 256 MB float array with all cores (and, as a floor, one). Its best pass becomes the reference every other
// benchmark's bw_fraction divides by.
void BM_bandwidth_reference(benchmark::State& st) {
  drop_cached();
  const auto a = make_bandwidth_array();
  double sink = 0.0, best = 1e30;
  for (auto _ : st) best = std::min(best, streaming_read_pass(a.data(), a.size(), &sink, 0));
  // On a shared machine the all-threads pass can lose to one thread (a thread waits for a core):
  // the reference is the best the machine delivered in this run, all threads or one.
  double best1 = 1e30;
  for (int i = 0; i < 4; ++i) best1 = std::min(best1, streaming_read_pass(a.data(), a.size(), &sink, 1));
  benchmark::DoNotOptimize(sink);
  const double bytes = static_cast<double>(a.size() * sizeof(float));
  st.counters["all_threads_bytes_per_second"] = bytes / best;
  st.counters["one_thread_bytes_per_second"] = bytes / best1;
  best = std::min(best, best1);
  // keep the best pass seen in this run (several calls happen while sizing iterations)
  g_bandwidth = std::max(g_bandwidth, bytes / best);
  st.counters["bytes_per_second"] =
      benchmark::Counter(bytes * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["best_bytes_per_second"] = g_bandwidth;
  st.counters["bw_fraction"] = benchmark::Counter(
      bytes * static_cast<double>(st.iterations()) / g_bandwidth, benchmark::Counter::kIsRate);
  st.counters["threads"] = max_threads();
}
BENCHMARK(BM_bandwidth_reference)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace kvbench

namespace kvbench {
namespace {
double g_arithmetic = 0.0;  // multiply-adds per second; 0 until measured
double g_exact = 0.0;       // the exact kernels' multiply-then-add pairs per second; 0 until measured
constexpr int kChains = 12;  // > FMA latency x issue rate: the loop is throughput-bound
constexpr std::int64_t kFmaRounds = std::int64_t{1} << 22;

#if KVSIFT_HAVE_X86_SIMD_PATH
// Exact: the exact kernels' arithmetic (cpu/group_dots.hpp, cpu/decode_attention.hpp), a multiply
// and then an add, each rounded on its own (the embedded-rounding forms, which no compiler fuses).
// Where the multiplies and the adds share the FMA ports (measured on Sapphire Rapids) that runs at
// half the FMA rate; where the adds have pipes of their own (Zen 5) at about it (docs/performance.md).
template <bool Exact>
KVSIFT_TARGET_AVX512 float madd_rounds_avx512(std::int64_t rounds) {
  constexpr int rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m512 a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = _mm512_set1_ps(0.001f * static_cast<float>(k));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
  for (std::int64_t i = 0; i < rounds; ++i) {
    for (int k = 0; k < kChains; ++k) {
      a[k] = Exact ? _mm512_add_round_ps(_mm512_mul_round_ps(a[k], x, rn), y, rn)
                   : _mm512_fmadd_ps(a[k], x, y);
    }
  }
  __m512 s = a[0];
  for (int k = 1; k < kChains; ++k) s = _mm512_add_ps(s, a[k]);
  return _mm512_reduce_add_ps(s);
}
KVSIFT_TARGET_AVX2_NOFMA inline float sum_chains_avx2(const __m256 (&a)[kChains]) {
  alignas(32) float lanes8[8];
  __m256 s = a[0];
  for (int k = 1; k < kChains; ++k) s = _mm256_add_ps(s, a[k]);
  _mm256_store_ps(lanes8, s);
  float t = 0.0f;
  for (const float v : lanes8) t += v;
  return t;
}
// The AVX2 exact kernels' multiply and add, compiled without FMA so that none is fused.
KVSIFT_TARGET_AVX2_NOFMA float exact_rounds_avx2(std::int64_t rounds) {
  __m256 a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = _mm256_set1_ps(0.001f * static_cast<float>(k));
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
  for (std::int64_t i = 0; i < rounds; ++i) {
    for (int k = 0; k < kChains; ++k) a[k] = _mm256_add_ps(_mm256_mul_ps(a[k], x), y);
  }
  return sum_chains_avx2(a);
}
KVSIFT_TARGET_AVX2 float fma_rounds_avx2(std::int64_t rounds) {
  __m256 a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = _mm256_set1_ps(0.001f * static_cast<float>(k));
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
  for (std::int64_t i = 0; i < rounds; ++i) {
    for (int k = 0; k < kChains; ++k) a[k] = _mm256_fmadd_ps(a[k], x, y);
  }
  return sum_chains_avx2(a);
}
#endif
// The portable path's arithmetic: a multiply and an add per lane, 4 lanes (SSE2).
float fma_rounds_portable(std::int64_t rounds) {
  float a[kChains][4];
  for (int k = 0; k < kChains; ++k) {
    for (int l = 0; l < 4; ++l) a[k][l] = 0.001f * static_cast<float>(k + l);
  }
  for (std::int64_t i = 0; i < rounds; ++i) {
    for (int k = 0; k < kChains; ++k) {
      for (int l = 0; l < 4; ++l) a[k][l] = a[k][l] * 0.999f + 0.001f;
    }
  }
  float t = 0.0f;
  for (int k = 0; k < kChains; ++k) {
    for (int l = 0; l < 4; ++l) t += a[k][l];
  }
  return t;
}

// lanes per multiply-add on the active path, and one thread's rounds: FMAs, or (exact) a multiply
// and then an add (the portable path's arithmetic either way). The amx path runs its float
// arithmetic on AVX-512 (its tile unit takes only the bf16 key pass, whose products are not
// counted apart), so it has the avx512 path's reference.
int path_lanes() {
#if KVSIFT_HAVE_X86_SIMD_PATH
  const auto level = kvsift::cpu::active_simd();
  if (level >= kvsift::cpu::simd::avx512) return 16;
  if (level == kvsift::cpu::simd::avx2) return 8;
#endif
  return 4;
}
float madd_rounds(std::int64_t rounds, bool exact) {
#if KVSIFT_HAVE_X86_SIMD_PATH
  const auto level = kvsift::cpu::active_simd();
  if (level >= kvsift::cpu::simd::avx512) {
    return exact ? madd_rounds_avx512<true>(rounds) : madd_rounds_avx512<false>(rounds);
  }
  if (level == kvsift::cpu::simd::avx2) return exact ? exact_rounds_avx2(rounds) : fma_rounds_avx2(rounds);
#endif
  return fma_rounds_portable(rounds);
}
}  // namespace

double fma_pass(int threads, bool exact) {
  const int nt = threads > 0 ? threads : max_threads();
  float sink = 0.0f;
  int team = 0;  // the threads that ran (OpenMP may start fewer than asked)
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nt) reduction(+ : sink, team)
  {
    sink += madd_rounds(kFmaRounds, exact);
    team += 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(sink);
  return static_cast<double>(team) * kFmaRounds * kChains * path_lanes() / seconds;
}

namespace {
// The best of `passes` passes, all threads and one in turn.
double best_pass(int passes, bool exact) {
  double best = 0.0;
  for (int i = 0; i < passes; ++i) best = std::max(best, fma_pass(i % 2, exact));
  return best;
}
// `g` measured once, lazily, where BM_arithmetic_reference was filtered out.
double measured_lazily(double& g, bool exact, const char* what) {
  if (g <= 0.0) {
    g = best_pass(6, exact);
    std::fprintf(stderr, "kvsift_bench: %s measured lazily: %.1f G multiply-adds/s\n", what, g * 1e-9);
  }
  return g;
}
}  // namespace

double arithmetic_reference() { return measured_lazily(g_arithmetic, false, "arithmetic reference"); }
double exact_arithmetic_reference() {
  return measured_lazily(g_exact, true, "exact arithmetic reference");
}

// Multiply-adds per second on the kernels' path, all threads (and one, as a floor on a shared
// machine); the best pass is the decode rows' arithmetic reference (fma_fraction). Then the exact
// kernels' multiply-then-add pairs, best of all threads and one: exact_fraction's reference.
void BM_arithmetic_reference(benchmark::State& st) {
  double best = 0.0;
  for (auto _ : st) best = std::max(best, fma_pass(0));
  double best1 = 0.0;
  for (int i = 0; i < 3; ++i) best1 = std::max(best1, fma_pass(1));
  st.counters["all_threads_fma_per_second"] = best;
  st.counters["one_thread_fma_per_second"] = best1;
  g_arithmetic = std::max({g_arithmetic, best, best1});
  st.counters["best_fma_per_second"] = g_arithmetic;
  g_exact = std::max(g_exact, best_pass(4, /*exact=*/true));
  st.counters["best_exact_madd_per_second"] = g_exact;
  st.counters["lanes"] = path_lanes();
  st.counters["threads"] = max_threads();
}
BENCHMARK(BM_arithmetic_reference)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- the host's own tail (scripts/bench.sh --loaded) --------------------------------------------
// A step of fixed work on the calling thread, in registers, touching no memory: what a busy host's
// scheduler alone does to a step of a given length, timed step by step as the decode rows are.
// Its p99 against its quiet p50 is the loaded goal's reference: where the busy processes run at
// the engine's own priority, a step that a scheduler slice interrupts waits out the slice, and no
// library can keep that step's p99 within 3x of its median.
namespace {
// `units` dependent multiply-adds (one chain: the latency of each, not the machine's width).
float spin(std::int64_t units, float x) {
  for (std::int64_t i = 0; i < units; ++i) {
    x = x * 0.9999999f + 1e-7f;
    benchmark::DoNotOptimize(x);
  }
  return x;
}
// Each row's work is fixed, the same in the quiet and the loaded process (a rate calibrated in each
// would differ with the host's moment): 600 units per nominal microsecond, the row's label; a unit
// (a multiply, an add and DoNotOptimize's trip through memory) takes longer than that, ~1.65x on
// the Emerald Rapids kind, so the tables show each row's measured quiet median beside it.
constexpr double kUnitsPerMicrosecond = 600.0;
}  // namespace

void BM_scheduler_reference(benchmark::State& st) {
  const auto units = static_cast<std::int64_t>(kUnitsPerMicrosecond * static_cast<double>(st.range(0)));
  std::vector<double> step_seconds;
  step_seconds.reserve(1 << 16);
  float x = 1.0f;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    x = spin(units, x);
    step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  benchmark::DoNotOptimize(x);
  st.counters["step_nominal_ms"] = 1e-3 * static_cast<double>(st.range(0));
  st.counters["step_min_ms"] = 1e3 * *std::min_element(step_seconds.begin(), step_seconds.end());
  st.counters["step_p50_ms"] = 1e3 * quantile(step_seconds, 0.50);
  st.counters["step_p99_ms"] = 1e3 * quantile(step_seconds, 0.99);
  st.counters["steps"] = static_cast<double>(step_seconds.size());
}
// nominally 25 us to 25.6 ms: the decode rows' quiet steps lie between
BENCHMARK(BM_scheduler_reference)
    ->ArgName("us")
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int us = 25; us <= 25600; us *= 2) b->Arg(us);
    })
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace kvbench

// --kvsift_threading=caller runs every loop of the library on the benchmark's thread (the
// engine's choice, cpu::scoped_threading); pool (the default) lets OpenMP take big loops.
// --kvsift_reference=run compares decode rows with the run's bandwidth reference instead of the
// passes each row interleaves with its steps (bench/common.hpp, bandwidth_now).
int main(int argc, char** argv) {
  auto threading = kvsift::cpu::threading::pool;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--kvsift_threading=caller") {
      threading = kvsift::cpu::threading::caller;
    } else if (a == "--kvsift_threading=pool") {
      threading = kvsift::cpu::threading::pool;
    } else if (a == "--kvsift_reference=beside" || a == "--kvsift_reference=run") {
      kvbench::set_reference_beside(a.ends_with("beside"));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  kvsift::cpu::scoped_threading chosen(threading);
  benchmark::AddCustomContext("kvsift_reference", kvbench::reference_beside() ? "beside" : "run");
  benchmark::AddCustomContext("kvsift_threading",
                              threading == kvsift::cpu::threading::caller ? "caller" : "pool");
  {  // the decode attention's path (KVSIFT_SIMD pins it lower); amx where the OS granted the tiles
    auto path = kvsift::cpu::active_simd();
    if (path == kvsift::cpu::simd::amx && !kvsift::cpu::amx_ready()) path = kvsift::cpu::simd::avx512;
    benchmark::AddCustomContext("kvsift_simd", std::string(kvsift::cpu::simd_name(path)));
  }
  kvbench::register_components();
  kvbench::register_methods();
  kvbench::register_transfer();
  kvbench::register_capacity();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
