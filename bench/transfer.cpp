// SPDX-License-Identifier: Apache-2.0
// Recall benchmarks: transfer::async bringing tokens back from store::tiered's host pool into the
// working set, beside a plain memcpy of the same bytes in the same run.
//
//   BM_transfer/memcpy_reference/<model>/<dtype>/n<rows>        one memcpy of rows*2*d elements
//   BM_transfer/recall_pages/<model>/<dtype>/n<rows>            whole pages (one block copy each)
//   BM_transfer/recall_pages_staged/...                         the same through the two staging buffers
//   BM_transfer/recall_tokens/<model>/<dtype>/n<rows>           scattered single tokens
//   BM_transfer/recall_install_pages/...                        recall + install into a working set
//                                                               holding a 128-token window
// Counters: bytes_per_second (K+V bytes recalled), tokens_per_second, memcpy_fraction =
// bytes_per_second / the memcpy reference of the same size measured in this run. Goal
// (issue "Method lifecycle for dynamic methods"): recall_pages >= 50% of memcpy on the CPU.

#include "common.hpp"

#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <numeric>
#include <stdexcept>

namespace kvbench {
namespace {

std::map<std::string, double>& memcpy_rate() {  // "<dtype>/n<rows>" -> bytes/s
  static std::map<std::string, double> m;
  return m;
}

template <class T>
void bm_memcpy(benchmark::State& st, const model& m, int rows) {
  const std::size_t n = static_cast<std::size_t>(rows) * 2 * m.head_dim;
  const auto src = random_vector<T>(n, 1);
  std::vector<T> dst(n);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : st) {
    std::memcpy(dst.data(), src.data(), n * sizeof(T));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double bytes = static_cast<double>(n * sizeof(T));
  report(st, bytes, rows);
  auto& best = memcpy_rate()[std::string(kvsift::element_name<T>) + "/" + std::to_string(rows)];
  best = std::max(best, bytes * static_cast<double>(st.iterations()) / std::max(secs, 1e-12));
}

// rows recalled for one head-sequence of a prompt of `context` tokens; pages or scattered tokens.
template <class T>
void bm_recall(benchmark::State& st, const model& m, int rows, bool pages, bool install,
               bool staged = false) {
  const int page = 32;
  const int context = std::max(4 * rows, 4096) + 128;  // + the window below
  const kvsift::model_shape shape{1, m.q_heads / m.kv_heads, 1, m.head_dim};
  kvsift::store::tiered<T> store(shape, 1, context, page);
  {
    auto k = random_vector<T>(static_cast<std::size_t>(context) * m.head_dim, 2);
    auto v = random_vector<T>(static_cast<std::size_t>(context) * m.head_dim, 3);
    store.append(0, 0, kvsift::kv_view<const T, kvsift::nhd>::contiguous(k.data(), context, 1, m.head_dim),
                 kvsift::kv_view<const T, kvsift::nhd>::contiguous(v.data(), context, 1, m.head_dim), 0);
  }
  std::vector<std::int32_t> positions;
  if (pages) {  // every other page: rows / page whole pages
    for (int g = 0; static_cast<int>(positions.size()) < rows; g += 2)
      for (int i = 0; i < page; ++i) positions.push_back(g * page + i);
  } else {  // every 4th token
    for (int i = 0; i < rows; ++i) positions.push_back(4 * i);
  }
  // the working set between recalls: the newest 128 tokens (a decode window; the recalled
  // pages are older, so an install merges them in before it)
  kvsift::index_sets window;
  {
    std::vector<std::int32_t> slots(128);
    std::iota(slots.begin(), slots.end(), context - 128);
    window.push_back(slots);
  }
  std::vector<std::int32_t> target = positions;
  for (int p = context - 128; p < context; ++p) target.push_back(p);
  store.retain(0, 0, window);
  {
    std::vector<std::int32_t> slots(128);  // after an install, the window follows the recalled rows
    std::iota(slots.begin(), slots.end(), static_cast<std::int32_t>(positions.size()));
    window = {};
    window.push_back(slots);
  }
  if (positions.back() >= context - 128) throw std::logic_error("bench: recalled rows overlap the window");
  kvsift::transfer::async<T> xfer({.staged = staged});
  for (auto _ : st) {
    const auto t = xfer.submit(store, {{0, positions}});
    const auto& landed = xfer.wait(t);
    if (install) store.install(0, target, landed);
    xfer.release(t);
    if (install) {
      st.PauseTiming();
      store.retain(0, 0, window);  // back to the window (slots after the recalled rows)
      st.ResumeTiming();
    }
  }
  const double bytes = static_cast<double>(positions.size()) * 2 * m.head_dim * sizeof(T);
  report(st, bytes, static_cast<double>(positions.size()));
  const auto it = memcpy_rate().find(std::string(kvsift::element_name<T>) + "/" + std::to_string(rows));
  if (it != memcpy_rate().end() && it->second > 0) {
    st.counters["memcpy_fraction"] = benchmark::Counter(
        bytes * static_cast<double>(st.iterations()) / it->second, benchmark::Counter::kIsRate);
  }
}

template <class T>
void register_for(const model& m, int rows) {
  const std::string dt(kvsift::element_name<T>);
  const auto* mp = &m;
  add(name_of("transfer", "memcpy_reference", m, dt, rows, 0, 1),
      [=](benchmark::State& st) { bm_memcpy<T>(st, *mp, rows); });
  add(name_of("transfer", "recall_pages", m, dt, rows, 0, 1),
      [=](benchmark::State& st) { bm_recall<T>(st, *mp, rows, true, false); });
  add(name_of("transfer", "recall_pages_staged", m, dt, rows, 0, 1),
      [=](benchmark::State& st) { bm_recall<T>(st, *mp, rows, true, false, true); });
  add(name_of("transfer", "recall_tokens", m, dt, rows, 0, 1),
      [=](benchmark::State& st) { bm_recall<T>(st, *mp, rows, false, false); });
  add(name_of("transfer", "recall_install_pages", m, dt, rows, 0, 1),
      [=](benchmark::State& st) { bm_recall<T>(st, *mp, rows, true, true); });
}

}  // namespace

void register_transfer() {
  for (const int rows : {1024, 8192}) {
    register_for<float>(llama31_8b, rows);
    register_for<kvsift::bfloat16>(llama31_8b, rows);
  }
}

}  // namespace kvbench
