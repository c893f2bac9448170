// SPDX-License-Identifier: Apache-2.0
// One benchmark family per component model: scorers, selectors, budgeters, stores (dense and
// paged: append, retain, gather), transfers (none, sync_copy) and attention over a kept set.
// Shapes are one layer of a real model (common.hpp); the sweep covers context length, head_dim
// (through the model), element type, budget and batch of requests.

#include "common.hpp"

#if __has_include(<kvsift/score/lag.hpp>) && !defined(KVBENCH_NO_LAGKV)
#include <kvsift/score/lag.hpp>
#define KVBENCH_HAS_LAG 1
#else
#define KVBENCH_HAS_LAG 0
#endif

#include <kvsift/attention/far_tier.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

namespace kvbench {
namespace {

using kvsift::index_sets;
using kvsift::kv_view;
using kvsift::nhd;
using kvsift::score_sets;

// ---- a filled dense store of one layer, shared by the read-only families ----------------------
template <class T>
struct layer_fixture {
  kvsift::store::dense<T> store;
  std::vector<int> requests;
  layer_fixture(const model& m, int n, int r) : store(m.shape(1), r, n) {
    for (int q = 0; q < r; ++q) {
      fill_store(store, q, 0, n, 1000 + 77 * static_cast<std::uint64_t>(q));
      requests.push_back(q);
    }
  }
};
template <class T>
layer_fixture<T>& layer_of(const model& m, int n, int r) {
  const std::string key = std::string("layer/") + m.name + "/" + std::string(kvsift::element_name<T>) +
                          "/" + std::to_string(n) + "/" + std::to_string(r);
  return cached<layer_fixture<T>>(key, [&] { return std::make_shared<layer_fixture<T>>(m, n, r); });
}

// Queries [rows, q_heads, d] for each request, the newest `rows` of a prompt of n tokens.
struct query_set {
  std::vector<std::vector<float>> data;
  std::vector<kv_view<const float, nhd>> views;
  std::vector<std::int32_t> first_position;
  query_set(const model& m, int rows, int n, int r) {
    for (int q = 0; q < r; ++q) {
      data.push_back(random_vector<float>(static_cast<std::size_t>(std::max(rows, 1)) * m.q_heads * m.head_dim,
                                          5000 + static_cast<std::uint64_t>(q)));
    }
    for (int q = 0; q < r; ++q) {
      views.push_back(kv_view<const float, nhd>::contiguous(data[q].data(), rows, m.q_heads, m.head_dim));
      first_position.push_back(n - rows);
    }
  }
};

// ---- scorers ----------------------------------------------------------------------------------
// Bytes: the keys (kv: keys and values) read once plus the scores written (positions: positions
// read, scores written).
enum class reads { keys, kv, positions };
template <class Scorer, class T>
void bm_score(benchmark::State& st, const model& m, int n, int r, int query_rows,
              typename Scorer::params prm, reads what = reads::keys) {
  auto& fx = layer_of<T>(m, n, r);
  const query_set qs(m, query_rows, n, r);
  score_sets out;
  kvsift::score_input<kvsift::store::dense<T>> in{&fx.store, 0, kvsift::lifecycle_event::prefill_end,
                                                  fx.requests, qs.views, qs.first_position, {}};
  for (auto _ : st) {
    Scorer sc{prm};  // cold: a scorer that caches (Quest's digests) recomputes them every iteration
    sc.score(in, out);
    benchmark::DoNotOptimize(out.values.data());
  }
  const double rows = static_cast<double>(n) * r * m.kv_heads;
  const double row = what == reads::positions ? sizeof(std::int32_t)
                     : what == reads::kv      ? 2.0 * m.head_dim * sizeof(T)
                                              : 1.0 * m.head_dim * sizeof(T);
  const double bytes = rows * (row + sizeof(float));
  report(st, bytes, static_cast<double>(n) * r);
}


// ---- probe: what the memory-bound scorers could reach ---------------------------------------
// Not a library component: key_norm's loop with the channel sum reassociated (`omp simd`
// reduction, i.e. several accumulators), to show the headroom docs/performance.md talks about.
template <class T>
void bm_probe_key_norm_simd(benchmark::State& st, const model& m, int n, int r) {
  auto& fx = layer_of<T>(m, n, r);
  const int d = m.head_dim;
  std::vector<float> out(static_cast<std::size_t>(n) * r * m.kv_heads);
  for (auto _ : st) {
    kvsift::cpu::parallel_for(static_cast<std::int64_t>(r) * m.kv_heads, [&](std::int64_t s) {
      const auto seq = fx.store.shape().sequence(static_cast<int>(s) / m.kv_heads, 0,
                                                 static_cast<int>(s) % m.kv_heads);
      float* o = out.data() + s * n;
      for (int j = 0; j < n; ++j) {
        const T* k = fx.store.key(seq, j);
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int c = 0; c < d; ++c) {
          const float x = kvsift::to_float(k[c]);
          acc += x * x;
        }
        o[j] = -std::sqrt(acc);
      }
    });
    benchmark::DoNotOptimize(out.data());
  }
  const double rows = static_cast<double>(n) * r * m.kv_heads;
  report(st, rows * (m.head_dim * sizeof(T) + sizeof(float)), static_cast<double>(n) * r);
}

// ---- attention over a kept set ----------------------------------------------------------------
// Bytes: the kept keys and values read once.
// `portable` pins cpu/decode_attention.hpp's portable path (the AVX-512 path is the default where
// the CPU has it), so both are measured in the same run.
template <class T>
void bm_attend(benchmark::State& st, const model& m, int n, int budget, int r, bool portable = false) {
  std::optional<kvsift::cpu::scoped_simd> pin;
  if (portable) pin.emplace(kvsift::cpu::simd::portable);
  st.SetLabel(std::string(kvsift::cpu::simd_name(kvsift::cpu::active_simd())));
  auto& fx = layer_of<T>(m, n, r);
  index_sets plan;
  const auto kept = spread(n, budget);
  for (int h = 0; h < m.kv_heads; ++h) plan.push_back(kept);
  const auto q = random_vector<float>(static_cast<std::size_t>(m.q_heads) * m.head_dim, 42);
  std::vector<float> out(static_cast<std::size_t>(m.q_heads) * m.head_dim);
  for (auto _ : st) {
    for (int req = 0; req < r; ++req) kvsift::attention::attend_plan(fx.store, req, 0, q.data(), plan, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double rows = static_cast<double>(kept.size()) * r * m.kv_heads;
  report(st, rows * 2.0 * m.head_dim * sizeof(T), static_cast<double>(kept.size()) * r);
}

// ---- attention over the host tier where it lives (attention/far_tier.hpp) -------------------------
// A store::tiered of one layer whose prompt of n tokens keeps only the sinks and the newest 256
// resident; each step attends `budget` rows of every KV head's host pool, spread over the demoted
// ones, on the host: the far tier's half of an `attend` policy. Bytes: those keys and values read
// once (on the caller's thread, KV head after KV head).
template <class T>
struct far_fixture {
  kvsift::store::tiered<T> store;
  far_fixture(const model& m, int n) : store(m.shape(1), 1, n, 16) {
    fill_store(store, 0, 0, n, 9000);
    index_sets kept;
    std::vector<std::int32_t> window{0, 1, 2, 3};
    for (int i = std::max(4, n - 256); i < n; ++i) window.push_back(i);
    for (int h = 0; h < m.kv_heads; ++h) kept.push_back(window);
    store.retain(0, 0, kept);
  }
};
template <class T>
void bm_attend_far(benchmark::State& st, const model& m, int n, int budget) {
  const std::string key = std::string("far/") + m.name + "/" + std::string(kvsift::element_name<T>) +
                          "/" + std::to_string(n);
  auto& fx = cached<far_fixture<T>>(key, [&] { return std::make_shared<far_fixture<T>>(m, n); });
  const int demoted = std::max(1, n - 260);
  std::vector<std::int32_t> far;
  for (const int i : spread(demoted, std::min(budget, demoted))) far.push_back(4 + i);
  const int G = m.q_heads / m.kv_heads;
  const auto q = random_vector<float>(static_cast<std::size_t>(m.q_heads) * m.head_dim, 43);
  std::vector<float> out(q.size()), lse(static_cast<std::size_t>(m.q_heads));
  for (auto _ : st) {
    for (int h = 0; h < m.kv_heads; ++h) {
      kvsift::attention::attend_host_rows(fx.store, fx.store.shape().sequence(0, 0, h), far,
                                          q.data() + static_cast<std::size_t>(h) * G * m.head_dim, G,
                                          out.data() + static_cast<std::size_t>(h) * G * m.head_dim,
                                          lse.data() + h * G);
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double rows = static_cast<double>(far.size()) * m.kv_heads;
  report(st, rows * 2.0 * m.head_dim * sizeof(T), static_cast<double>(far.size()));
}

// ---- selectors ----------------------------------------------------------------------------------
// Bytes: the scores read once plus the kept indices written.
struct score_fixture {
  score_sets scores;
  std::vector<int> budgets;
  score_fixture(int segs, int per_seg, int budget) {
    std::vector<int> sizes(static_cast<std::size_t>(segs), per_seg);
    scores.resize(sizes);
    fill_random(scores.values, 99);
    budgets.assign(static_cast<std::size_t>(segs), budget);
  }
};
template <class Selector>
void bm_select(benchmark::State& st, const model& m, int n, int budget, int r, int per_seg,
               typename Selector::params prm) {
  const int segs = r * m.kv_heads;
  score_fixture fx(segs, per_seg, budget);
  Selector sel{prm};
  index_sets kept;
  for (auto _ : st) {
    sel.select(fx.scores, fx.budgets, kept);
    benchmark::DoNotOptimize(kept.values.data());
  }
  report(st, static_cast<double>(segs) * per_seg * 4.0 + static_cast<double>(kept.values.size()) * 4.0,
         static_cast<double>(n) * r);
}

// ---- budgeters ----------------------------------------------------------------------------------
template <class Budgeter>
void bm_budget(benchmark::State& st, const model& m, int n, int r, typename Budgeter::params prm) {
  const std::vector<int> lengths(static_cast<std::size_t>(r) * m.kv_heads, n);
  Budgeter b{prm};
  std::vector<int> out;
  const kvsift::budget_context ctx{m.layers / 2, m.layers, m.kv_heads, lengths};
  for (auto _ : st) {
    b.budgets(ctx, out);
    benchmark::DoNotOptimize(out.data());
  }
  report(st, static_cast<double>(lengths.size()) * 8.0, static_cast<double>(n) * r);
}

// ---- stores -------------------------------------------------------------------------------------
template <class Store>
std::shared_ptr<Store> make_store(const model& m, int n, int r) {
  if constexpr (requires(Store& s) { s.page_size(); }) {
    const int pages = r * m.kv_heads * ((n + 15) / 16 + 1);
    return std::make_shared<Store>(m.shape(1), r, 16, pages);
  } else {
    return std::make_shared<Store>(m.shape(1), r, n);
  }
}
template <class Store>
double row_bytes(const model& m) {
  return static_cast<double>(m.head_dim) * sizeof(typename Store::element_type);
}

// append: n tokens into an empty head-sequence, in 4096-token chunks. Bytes: read + write K and V.
template <class Store>
void bm_store_append(benchmark::State& st, const model& m, int n, int r) {
  using T = typename Store::element_type;
  auto s = make_store<Store>(m, n, r);
  const int chunk = std::min(n, 4096);
  const auto k = random_vector<T>(static_cast<std::size_t>(chunk) * m.kv_heads * m.head_dim, 1);
  const auto v = random_vector<T>(k.size(), 2);
  for (auto _ : st) {
    for (int q = 0; q < r; ++q) {
      s->reset(q);
      for (int t = 0; t < n; t += chunk) {
        const int c = std::min(chunk, n - t);
        s->append(q, 0, kv_view<const T, nhd>::contiguous(k.data(), c, m.kv_heads, m.head_dim),
                  kv_view<const T, nhd>::contiguous(v.data(), c, m.kv_heads, m.head_dim), t);
      }
    }
  }
  report(st, 2.0 * 2.0 * n * r * m.kv_heads * row_bytes<Store>(m), static_cast<double>(n) * r);
}

// retain_roll: StreamingLLM's per-step retain — drop the oldest non-sink token (sink 4) of n;
// one token is appended back outside the timing (into the released row, which waits for it).
// No row moves: every later slot's row number shifts by one (store/basic.hpp, "Slots and rows").
// Bytes: read + write of the n - 5 row numbers after the released slot.
template <class Store>
void bm_store_retain_roll(benchmark::State& st, const model& m, int n, int r) {
  using T = typename Store::element_type;
  auto s = make_store<Store>(m, n, r);
  for (int q = 0; q < r; ++q) fill_store(*s, q, 0, n, 7 + static_cast<std::uint64_t>(q));
  std::vector<std::int32_t> keep(static_cast<std::size_t>(n - 1));
  std::iota(keep.begin(), keep.begin() + 4, 0);
  std::iota(keep.begin() + 4, keep.end(), 5);
  index_sets kept;
  for (int h = 0; h < m.kv_heads; ++h) kept.push_back(keep);
  const auto one = random_vector<T>(static_cast<std::size_t>(m.kv_heads) * m.head_dim, 3);
  for (auto _ : st) {
    for (int q = 0; q < r; ++q) s->retain(q, 0, kept);
    st.PauseTiming();
    for (int q = 0; q < r; ++q) {
      s->append(q, 0, kv_view<const T, nhd>::contiguous(one.data(), 1, m.kv_heads, m.head_dim),
                kv_view<const T, nhd>::contiguous(one.data(), 1, m.kv_heads, m.head_dim),
                s->next_position(q, 0));
    }
    st.ResumeTiming();
  }
  report(st, 2.0 * (n - 5) * sizeof(std::int32_t) * r * m.kv_heads, static_cast<double>(n) * r);
}

// retain_compress: a prefill compression — keep `budget` spread slots of n (refilled outside the
// timing). Bytes: read + write of the kept K and V rows.
template <class Store>
void bm_store_retain_compress(benchmark::State& st, const model& m, int n, int budget, int r) {
  auto s = make_store<Store>(m, n, r);
  index_sets kept;
  const auto keep = spread(n, budget);
  for (int h = 0; h < m.kv_heads; ++h) kept.push_back(keep);
  std::uint64_t seed = 11;
  for (auto _ : st) {
    st.PauseTiming();
    for (int q = 0; q < r; ++q) {
      s->reset(q);
      fill_store(*s, q, 0, n, seed);
    }
    st.ResumeTiming();
    for (int q = 0; q < r; ++q) s->retain(q, 0, kept);
  }
  report(st, 2.0 * 2.0 * static_cast<double>(keep.size()) * r * m.kv_heads * row_bytes<Store>(m),
         static_cast<double>(n) * r);
}

// gather: `budget` spread slots of every KV head into contiguous arrays. Bytes: read + write.
template <class Store>
void bm_store_gather(benchmark::State& st, const model& m, int n, int budget, int r) {
  using T = typename Store::element_type;
  auto s = make_store<Store>(m, n, r);
  for (int q = 0; q < r; ++q) fill_store(*s, q, 0, n, 9 + static_cast<std::uint64_t>(q));
  const auto keep = spread(n, budget);
  std::vector<T> ko(keep.size() * m.head_dim), vo(ko.size());
  std::vector<std::int32_t> po(keep.size());
  for (auto _ : st) {
    for (int q = 0; q < r; ++q) {
      for (int h = 0; h < m.kv_heads; ++h) {
        s->gather(s->shape().sequence(q, 0, h), keep, ko.data(), vo.data(), po.data());
      }
    }
    benchmark::DoNotOptimize(ko.data());
  }
  report(st, 2.0 * 2.0 * static_cast<double>(keep.size()) * r * m.kv_heads * row_bytes<Store>(m),
         static_cast<double>(keep.size()) * r);
}

// ---- transfers ----------------------------------------------------------------------------------
// none: the cost of the no-op. sync_copy: one layer's KV (n tokens) host -> pinned host.
void bm_transfer_none(benchmark::State& st, int n) {
  kvsift::transfer::none t;
  for (auto _ : st) {
    t.wait();
    benchmark::DoNotOptimize(t.bytes_moved());
  }
  report(st, 0.0, n);
}
template <class T>
void bm_transfer_sync_copy(benchmark::State& st, const model& m, int n, int r) {
  const std::size_t bytes = static_cast<std::size_t>(n) * r * m.kv_heads * m.head_dim * 2 * sizeof(T);
  std::vector<unsigned char> from(bytes, 1), to(bytes, 0);
  kvsift::transfer::sync_copy t;
  for (auto _ : st) {
    t.copy<kvsift::pinned_host_space, kvsift::host_space>(to.data(), from.data(), bytes);
    t.wait();
    benchmark::DoNotOptimize(to.data());
  }
  report(st, 2.0 * static_cast<double>(bytes), static_cast<double>(n) * r);
}

// ---- registration -------------------------------------------------------------------------------
constexpr int window = 32;  // SnapKV's observation window
const std::vector<int> budgets{1024, 4096};
const std::vector<int> batches{1, 4};

template <class T>
void register_typed(const model& m, int n, int r) {
  const std::string dt(kvsift::element_name<T>);
  using namespace kvsift::score;
  const auto* mp = &m;
  add(name_of("score", "window_attention", m, dt, n, 0, r),
      [=](benchmark::State& st) { bm_score<window_attention, T>(st, *mp, n, r, window, {}); });
  add(name_of("score", "last_query_attention", m, dt, n, 0, r),
      [=](benchmark::State& st) { bm_score<last_query_attention, T>(st, *mp, n, r, 1, {}); });
  add(name_of("score", "key_norm", m, dt, n, 0, r),
      [=](benchmark::State& st) { bm_score<key_norm, T>(st, *mp, n, r, 0, {}); });
  add(name_of("score", "recency", m, dt, n, 0, r),
      [=](benchmark::State& st) { bm_score<recency, T>(st, *mp, n, r, 0, {}, reads::positions); });
  add(name_of("score", "page_minmax", m, dt, n, 0, r),
      [=](benchmark::State& st) { bm_score<page_minmax, T>(st, *mp, n, r, 1, {}); });
  add(name_of("probe", "key_norm_simd", m, dt, n, 0, r),
      [=](benchmark::State& st) { bm_probe_key_norm_simd<T>(st, *mp, n, r); });
#if KVBENCH_HAS_LAG
  add(name_of("score", "lag", m, dt, n, 0, r),
      [=](benchmark::State& st) { bm_score<lag_relative, T>(st, *mp, n, r, 0, {}, reads::kv); });
#endif
  for (const int b : budgets) {
    if (b >= n) continue;
    add(name_of("attention", "attend_plan", m, dt, n, b, r),
        [=](benchmark::State& st) { bm_attend<T>(st, *mp, n, b, r); });
  }
  add(name_of("attention", "attend_plan", m, dt, n, n, r),
      [=](benchmark::State& st) { bm_attend<T>(st, *mp, n, n, r); });
  for (const int b : budgets) {
    if (b >= n || r != 1) continue;
    add(name_of("attention", "far_host_rows", m, dt, n, b, r),
        [=](benchmark::State& st) { bm_attend_far<T>(st, *mp, n, b); });
  }
  if (kvsift::cpu::detected_simd() != kvsift::cpu::simd::portable) {
    add(name_of("attention", "attend_plan_portable", m, dt, n, n, r),
        [=](benchmark::State& st) { bm_attend<T>(st, *mp, n, n, r, true); });
  }
}

template <class T>
void register_stores(const model& m, int n, int r) {
  const std::string dt(kvsift::element_name<T>);
  const auto* mp = &m;
  using dense = kvsift::store::dense<T>;
  using paged = kvsift::store::paged<T>;
  const auto both = [&](const char* what, auto fn) {
    add(name_of("store", std::string("dense_") + what, m, dt, n, 0, r),
        [=](benchmark::State& st) { fn.template operator()<dense>(st, *mp, n, r); });
    add(name_of("store", std::string("paged_") + what, m, dt, n, 0, r),
        [=](benchmark::State& st) { fn.template operator()<paged>(st, *mp, n, r); });
  };
  both("append", []<class S>(benchmark::State& st, const model& mm, int nn, int rr) {
    bm_store_append<S>(st, mm, nn, rr);
  });
  both("retain_roll", []<class S>(benchmark::State& st, const model& mm, int nn, int rr) {
    bm_store_retain_roll<S>(st, mm, nn, rr);
  });
  for (const int b : budgets) {
    if (b >= n) continue;
    for (const bool is_paged : {false, true}) {
      const std::string pre = is_paged ? "paged_" : "dense_";
      add(name_of("store", pre + "retain_compress", m, dt, n, b, r), [=](benchmark::State& st) {
        if (is_paged) {
          bm_store_retain_compress<paged>(st, *mp, n, b, r);
        } else {
          bm_store_retain_compress<dense>(st, *mp, n, b, r);
        }
      })->Iterations(16);  // each iteration refills n tokens untimed: bound the wall time
      add(name_of("store", pre + "gather", m, dt, n, b, r), [=](benchmark::State& st) {
        if (is_paged) {
          bm_store_gather<paged>(st, *mp, n, b, r);
        } else {
          bm_store_gather<dense>(st, *mp, n, b, r);
        }
      });
    }
  }
  add(name_of("transfer", "sync_copy", m, dt, n, 0, r),
      [=](benchmark::State& st) { bm_transfer_sync_copy<T>(st, *mp, n, r); });
}

}  // namespace

void register_components() {
  using kvsift::bfloat16;
  for (const model* m : models()) {
    for (const int r : batches) {
      for (const int n : contexts()) {
        if (r > 1 && n > 32768) continue;  // bound memory: 4 x 128K f32 is 4 GB per layer
        register_typed<float>(*m, n, r);
        register_typed<bfloat16>(*m, n, r);
      }
      // H2O's prefill score is O(n^2 d): every prompt query against every key it sees.
      for (const int n : {1024, 2048, 4096, 8192}) {
        const auto* mp = m;
        for (const bool bf : {false, true}) {
          add(name_of("score", "cumulative_attention", *m, dtype_name(bf), n, 0, r),
              [=](benchmark::State& st) {
                if (bf) {
                  bm_score<kvsift::score::cumulative_attention, bfloat16>(st, *mp, n, r, n, {});
                } else {
                  bm_score<kvsift::score::cumulative_attention, float>(st, *mp, n, r, n, {});
                }
              });
        }
      }
      for (const int n : contexts()) {
        if (r > 1 && n > 32768) continue;
        register_stores<float>(*m, n, r);
        register_stores<bfloat16>(*m, n, r);
      }
      // scores and budgets are f32 / i32 whatever the KV element type
      for (const int n : contexts()) {
        const auto* mp = m;
        for (const int b : budgets) {
          if (b >= n) continue;
          add(name_of("select", "topk", *m, "f32", n, b, r), [=](benchmark::State& st) {
            bm_select<kvsift::select::topk>(st, *mp, n, b, r, n, {.sink = 4, .window = window});
          }, benchmark::kMicrosecond);
          add(name_of("select", "page_topk", *m, "f32", n, b, r), [=](benchmark::State& st) {
            bm_select<kvsift::select::page_topk>(st, *mp, n, b, r, (n + 15) / 16, {});
          }, benchmark::kMicrosecond);
          add(name_of("budget", "uniform", *m, "i32", n, b, r), [=](benchmark::State& st) {
            bm_budget<kvsift::budget::uniform>(st, *mp, n, r, {.tokens = b});
          }, benchmark::kNanosecond);
          add(name_of("budget", "pyramid", *m, "i32", n, b, r), [=](benchmark::State& st) {
            bm_budget<kvsift::budget::pyramid>(st, *mp, n, r, {.tokens = b});
          }, benchmark::kNanosecond);
          add(name_of("budget", "memory_fraction", *m, "i32", n, b, r), [=](benchmark::State& st) {
            bm_budget<kvsift::budget::memory_fraction>(
                st, *mp, n, r, {.keep_fraction = static_cast<double>(b) / n});
          }, benchmark::kNanosecond);
        }
        add(name_of("transfer", "none", *m, "f32", n, 0, r),
            [=](benchmark::State& st) { bm_transfer_none(st, n); }, benchmark::kNanosecond);
      }
    }
  }
}

}  // namespace kvbench
