// SPDX-License-Identifier: Apache-2.0
#pragma once

// Shared pieces of the kvsift CPU benchmarks: model shapes named after real models, random KV,
// the streaming-read bandwidth reference every benchmark is compared with, the counters, and a
// one-slot fixture cache (so Google Benchmark's repeated calls of one benchmark do not rebuild a
// 32K-token store each time).
//
// Naming scheme (shared with the CUDA benchmarks under cuda/, which use the same names and
// shapes):   BM_<family>/<component>/<model>/<dtype>/n<context>[/B<budget>]/r<requests>
//   family     score | select | budget | store | transfer | attention | prefill | decode |
//              capacity (no /r: requests admitted is its result)
//   model      llama31_8b (32 layers, 32 q heads, 8 KV heads, d 128) | llama32_1b (d 64)
//   dtype      f32 | bf16 (queries are always f32)
// Counters:  bytes_per_second, tokens_per_second (rates) and bw_fraction = bytes_per_second /
//   the bandwidth reference (a sum over a 256 MB float array with every core). "bytes" is the
//   minimal memory traffic of the operation: what it must read (and write) once.

#include <kvsift/kvsift.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvbench {

// One layer of a real model (the per-layer benchmarks use its one-layer shape).
struct model {
  const char* name;
  int layers;
  int q_heads;
  int kv_heads;
  int head_dim;
  [[nodiscard]] kvsift::model_shape shape(int layers_override = 0) const {
    return {layers_override > 0 ? layers_override : layers, q_heads, kv_heads, head_dim};
  }
};
inline constexpr model llama31_8b{"llama31_8b", 32, 32, 8, 128};  // Llama-3.1-8B
inline constexpr model llama32_1b{"llama32_1b", 16, 32, 8, 64};   // Llama-3.2-1B (d 64)

// ---- the bandwidth reference -----------------------------------------------------------------
// Bytes per second of a streaming read (sum of a 256 MB float array, every OpenMP thread), best
// pass. Set by BM_bandwidth_reference (registered first); measured lazily if it was filtered out.
double bandwidth_reference();
void set_bandwidth_reference(double bytes_per_second);
// One pass of the same streaming read now (a 256 MB array kept for the run, every thread), in
// bytes/s: a decode row interleaves these with its steps, its reference beside it. On a shared VM
// the read rate moves between regimes (52 <-> 80 GB/s, for bursts of 0.2 s to seconds, every
// array at once; docs/performance.md), so a row is compared with the rate the machine delivered
// while the row ran, not with the run's best pass.
double bandwidth_now();
// Whether decode rows measure that reference beside them (the default; --kvsift_reference=run:
// the run's reference, as the loaded pass does, whose busy host would only slow the passes).
bool reference_beside();
void set_reference_beside(bool on);
// One timed pass over `a` (seconds) with `threads` OpenMP threads (0: all).
double streaming_read_pass(const float* a, std::size_t n, double* sink, int threads);
kvsift::kv_vector<float> make_bandwidth_array();  // in the stores' memory (core/kv_memory.hpp)

// ---- the arithmetic reference -------------------------------------------------------------------
// Multiply-adds per second (f32 lanes) on the decode kernels' SIMD path (cpu::active_simd():
// AVX-512 or AVX2 FMAs, or the portable path's 4-lane multiply and add), every OpenMP thread,
// independent accumulators in registers, best pass. Set by BM_arithmetic_reference; measured
// lazily if it was filtered out. A decode step's attention needs 2 x G x d multiply-adds per
// (token, KV head) it reads (q.k for G query heads, then p.v), whatever the element type: G / 2
// multiply-adds per byte of bf16 KV, G / 4 of f32, so a row is arithmetic-bound where this rate
// is under that times the bandwidth reference (the decode table's second reference column,
// docs/performance.md). A run on the caller's thread (--kvsift_threading=caller) is still
// compared with the all-threads rate.
double arithmetic_reference();
// The same for the exact kernels' arithmetic, a multiply and then an add rounded on their own (no
// FMA: CPU and Thrust agree bit for bit): the limit of exact arithmetic, the decode rows'
// exact_fraction. Half the FMA rate where both share the FMA ports (measured on Sapphire Rapids),
// about equal where the adds have pipes of their own (Zen 5).
double exact_arithmetic_reference();
// one timed pass: multiply-adds per second with `threads` (0: all), FMAs or (exact) pairs
double fma_pass(int threads, bool exact = false);

// Sets bytes_per_second, tokens_per_second and bw_fraction from per-iteration amounts;
// bw_fraction divides by `reference` (bytes/s; 0: the run's bandwidth reference).
inline void report(benchmark::State& st, double bytes_per_iter, double tokens_per_iter,
                   double reference = 0.0) {
  const double it = static_cast<double>(st.iterations());
  if (reference <= 0.0) reference = bandwidth_reference();
  st.counters["bytes_per_second"] = benchmark::Counter(bytes_per_iter * it, benchmark::Counter::kIsRate);
  st.counters["tokens_per_second"] = benchmark::Counter(tokens_per_iter * it, benchmark::Counter::kIsRate);
  st.counters["bw_fraction"] = benchmark::Counter(bytes_per_iter * it / reference, benchmark::Counter::kIsRate);
}

// The q-quantile of `xs` (nearest rank; reorders xs), 0 when empty.
inline double quantile(std::vector<double>& xs, double q) {
  if (xs.empty()) return 0.0;
  const auto k = static_cast<std::size_t>(std::min<double>(static_cast<double>(xs.size()) - 1.0,
                                                           std::ceil(q * static_cast<double>(xs.size())) - 1.0));
  std::nth_element(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(k), xs.end());
  return xs[k];
}

// ---- random data -------------------------------------------------------------------------------
inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [-1, 1).
inline float uniform(std::uint64_t& s) {
  return static_cast<float>(static_cast<double>(splitmix(s) >> 11) * 0x1.0p-52 - 1.0);
}
template <class T>
void fill_random(std::vector<T>& v, std::uint64_t seed) {
  for (auto& x : v) x = kvsift::from_float<T>(uniform(seed));
}
template <class T>
std::vector<T> random_vector(std::size_t n, std::uint64_t seed) {
  std::vector<T> v(n);
  fill_random(v, seed);
  return v;
}

// Appends n random tokens to every KV head of (request, layer), in chunks of up to 4096.
template <class Store>
void fill_store(Store& s, int request, int layer, int n, std::uint64_t seed) {
  using T = typename Store::element_type;
  const auto& sh = s.shape();
  const int chunk = std::min(n, 4096);
  std::vector<T> k(static_cast<std::size_t>(chunk) * sh.kv_heads * sh.head_dim), v(k.size());
  const std::int32_t first = s.next_position(request, layer);
  for (int t = 0; t < n; t += chunk) {
    const int c = std::min(chunk, n - t);
    fill_random(k, seed++);
    fill_random(v, seed++);
    s.append(request, layer, kvsift::kv_view<const T, kvsift::nhd>::contiguous(k.data(), c, sh.kv_heads, sh.head_dim),
             kvsift::kv_view<const T, kvsift::nhd>::contiguous(v.data(), c, sh.kv_heads, sh.head_dim),
             first + t);
  }
}

// `count` ascending slots spread evenly over [0, n) (the last one included).
inline std::vector<std::int32_t> spread(int n, int count) {
  std::vector<std::int32_t> out;
  count = std::min(count, n);
  out.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    out.push_back(static_cast<std::int32_t>(static_cast<std::int64_t>(i) * n / count));
  }
  if (!out.empty()) out.back() = n - 1;
  return out;
}

// ---- a one-slot fixture cache ----------------------------------------------------------------
// Google Benchmark calls a benchmark function several times while it sizes the iteration count;
// the fixture of the most recent key is kept (only one, to bound memory on a shared machine).
struct fixture_slot {
  std::string key;
  std::shared_ptr<void> obj;
};
inline fixture_slot& fixture_cache() {
  static fixture_slot slot;
  return slot;
}
template <class F, class Make>
F& cached(const std::string& key, Make&& make) {
  auto& c = fixture_cache();
  if (c.key != key || !c.obj) {
    c.obj.reset();  // release the previous fixture before building the next
    c.key = key;
    c.obj = std::static_pointer_cast<void>(std::shared_ptr<F>(make()));
  }
  return *static_cast<F*>(c.obj.get());
}
inline void drop_cached() {
  fixture_cache().obj.reset();
  fixture_cache().key.clear();
}

// ---- registration ------------------------------------------------------------------------------
inline std::string dtype_name(bool bf16) { return bf16 ? "bf16" : "f32"; }
inline std::string name_of(const std::string& family, const std::string& component, const model& m,
                           const std::string& dtype, int n, int budget, int requests) {
  std::string s = "BM_" + family + "/" + component + "/" + m.name + "/" + dtype + "/n" + std::to_string(n);
  if (budget > 0) s += "/B" + std::to_string(budget);
  s += "/r" + std::to_string(requests);
  return s;
}
inline benchmark::internal::Benchmark* add(const std::string& name,
                                           std::function<void(benchmark::State&)> fn,
                                           benchmark::TimeUnit unit = benchmark::kMillisecond) {
  return benchmark::RegisterBenchmark(name.c_str(), [fn](benchmark::State& st) { fn(st); })
      ->UseRealTime()
      ->Unit(unit);
}

// Sweeps. The full suite; scripts/bench.sh --quick filters it.
inline const std::vector<int>& contexts() {
  static const std::vector<int> v{4096, 8192, 16384, 32768, 65536, 131072};
  return v;
}
inline const std::vector<const model*>& models() {
  static const std::vector<const model*> v{&llama31_8b, &llama32_1b};
  return v;
}

void register_components();
void register_methods();
void register_transfer();  // transfer.cpp: recall from store::tiered beside memcpy
void register_capacity();  // capacity.cpp: requests one page pool admits per method

}  // namespace kvbench
