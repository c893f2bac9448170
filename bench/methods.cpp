// SPDX-License-Identifier: Apache-2.0
// Per named method: prefill compression of one layer, and one decode step (decode + attend +
// after_attention) of one layer, on a paged store (page 16) holding a full model's shape (so
// per-layer budgets such as PyramidKV's and Quest's dense layers behave as in a real model), of
// which the benchmarked layer (layers / 2) is the only one filled.
//
//   prefill  bytes = the layer's prompt KV (keys and values, n tokens) read once
//   decode   bytes = the KV resident in the layer after the step's append, read once: the goal
//            is a step within 1.5x of that read at the reference bandwidth (bw_fraction >= 0.67)

#include "common.hpp"
#include "method_specs.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

namespace kvbench {
namespace {

using kvsift::kv_view;
using kvsift::nhd;

constexpr int page = 16;
constexpr int prefill_chunk_tokens = 4096;
// Decode steps before the fixture is rebuilt (untimed): a method that keeps every new token grows
// by at most this much over its prefilled state, so a row measures the state it is named after
// (a 0.5 s run of SnapKV at B=1024 with 2048 steps of room averaged ~2.5K resident tokens).
constexpr int headroom = 256;

template <class Spec, class T>
struct method_fixture {
  using store_t = kvsift::store::paged<T>;
  using method_t = typename Spec::template type<store_t>;
  const model& m;
  int n, budget, r, layer;
  store_t store;
  std::optional<method_t> meth;
  // one prefill chunk of random KV and queries, reused for every chunk of the prompt
  std::vector<T> ck, cv;
  std::vector<float> cq;
  // the decode tokens of a step
  std::vector<T> dk, dv;
  std::vector<float> dq, out;
  std::vector<kvsift::decode_token<T>> tokens;

  method_fixture(const model& mm, int nn, int b, int rr, int extra)
      : m(mm), n(nn), budget(b), r(rr), layer(mm.layers / 2),
        store(mm.shape(), rr, page, rr * mm.kv_heads * ((nn + extra + page - 1) / page + 1)) {
    const int c = std::min(n, prefill_chunk_tokens);
    ck = random_vector<T>(static_cast<std::size_t>(c) * m.kv_heads * m.head_dim, 21);
    cv = random_vector<T>(ck.size(), 22);
    if (method_t::caps.needs_queries) cq = random_vector<float>(static_cast<std::size_t>(c) * m.q_heads * m.head_dim, 23);
    dk = random_vector<T>(static_cast<std::size_t>(r) * m.kv_heads * m.head_dim, 24);
    dv = random_vector<T>(dk.size(), 25);
    dq = random_vector<float>(static_cast<std::size_t>(r) * m.q_heads * m.head_dim, 26);
    out.resize(dq.size());
    for (int q = 0; q < r; ++q) {
      tokens.push_back({q, dq.data() + static_cast<std::size_t>(q) * m.q_heads * m.head_dim,
                        dk.data() + static_cast<std::size_t>(q) * m.kv_heads * m.head_dim,
                        dv.data() + static_cast<std::size_t>(q) * m.kv_heads * m.head_dim});
    }
  }

  // Empties the store and builds a fresh method (not timed).
  void reset() {
    meth.reset();
    for (int q = 0; q < r; ++q) store.reset(q);
    meth.emplace(store, Spec::template params<store_t>(budget));
  }

  // The layer's prompt, in chunks of up to 4096 tokens, every request of the batch per call.
  // Queries as an engine keeps them: every prompt query when the scorer reads them all (H2O),
  // else only the newest query_window() on the last chunk (none when the scorer needs none).
  void prefill() {
    const int c = std::min(n, prefill_chunk_tokens);
    const int qw = method_t::caps.needs_queries ? meth->scorer_state().query_window() : 0;
    std::vector<kvsift::prefill_chunk<T>> chunks(static_cast<std::size_t>(r));
    for (int t = 0; t < n; t += c) {
      const int len = std::min(c, n - t);
      const bool last = t + len >= n;
      const int nq = qw < 0 ? len : last ? std::min(len, qw) : 0;
      for (int q = 0; q < r; ++q) {
        chunks[q] = {q, kv_view<const T, nhd>::contiguous(ck.data(), len, m.kv_heads, m.head_dim),
                     kv_view<const T, nhd>::contiguous(cv.data(), len, m.kv_heads, m.head_dim),
                     kv_view<const float, nhd>::contiguous(cq.empty() ? nullptr : cq.data(), nq,
                                                           m.q_heads, m.head_dim),
                     t, last};
      }
      meth->prefill(layer, chunks);
    }
  }

  [[nodiscard]] bool room_for_step() const {
    for (int q = 0; q < r; ++q) {
      const auto seq = store.shape().sequence(q, layer, 0);
      if (store.length(seq) + 1 > store.capacity(seq) - page) return false;
    }
    return true;
  }
  [[nodiscard]] double resident_kv_bytes() const {
    return static_cast<double>(store.resident_tokens()) * 2.0 * m.head_dim * sizeof(T);
  }
};

// Prefill and decode of one configuration share a fixture: the prefill benchmark leaves a freshly
// prefilled method behind, which the decode benchmark (registered right after it) steps on.
template <class Spec, class T>
std::string fixture_key(const model& m, int n, int b, int r) {
  return std::string("method/") + Spec::name + "/" + m.name + "/" + std::string(kvsift::element_name<T>) +
         "/" + std::to_string(n) + "/" + std::to_string(b) + "/" + std::to_string(r);
}

template <class Spec, class T>
void bm_prefill(benchmark::State& st, const model& m, int n, int b, int r) {
  using F = method_fixture<Spec, T>;
  auto& fx = cached<F>(fixture_key<Spec, T>(m, n, b, r),
                       [&] { return std::make_shared<F>(m, n, b, r, headroom); });
  for (auto _ : st) {
    st.PauseTiming();
    fx.reset();
    st.ResumeTiming();
    fx.prefill();
  }
  st.counters["resident_after"] = fx.resident_kv_bytes();
  report(st, static_cast<double>(n) * r * m.kv_heads * 2.0 * m.head_dim * sizeof(T),
         static_cast<double>(n) * r);
}

template <class Spec, class T>
void bm_decode(benchmark::State& st, const model& m, int n, int b, int r) {
  using F = method_fixture<Spec, T>;
  auto& fx = cached<F>(fixture_key<Spec, T>(m, n, b, r),
                       [&] { return std::make_shared<F>(m, n, b, r, headroom); });
  if (!fx.meth) {
    fx.reset();
    fx.prefill();
  }
  const std::span<const kvsift::decode_token<T>> tokens(fx.tokens);
  const auto step = [&] {
    const auto& plan = fx.meth->decode(fx.layer, tokens);
    benchmark::DoNotOptimize(plan.slots.values.data());
    fx.meth->attend(fx.layer, tokens, fx.out.data());
    benchmark::DoNotOptimize(fx.out.data());
    fx.meth->after_attention(fx.layer, tokens);
    return plan.slots.values.size();
  };
  const auto refill_if_full = [&] {
    if (fx.room_for_step()) return;
    fx.reset();
    fx.prefill();
  };
  const auto untimed_step = [&] {  // and room for the next one
    refill_if_full();
    step();
    refill_if_full();
  };
  // The streaming-read reference beside this row: one pass every ~20 ms of steps, each stretch of
  // steps compared with the better of the passes either side of it. A pass leaves the caches
  // cold, so one untimed step follows each (the first also does per-prompt one-off work, e.g.
  // Quest's digest cache). Without it (--kvsift_reference=run) the run's reference is the row's.
  const bool beside = reference_beside();
  constexpr double round_seconds = 0.02;
  double reference_before = beside ? bandwidth_now() : 0.0, in_round = 0.0, weighted = 0.0, timed = 0.0;
  const auto close_round = [&] {
    if (!beside) return;
    const double reference_after = bandwidth_now();
    weighted += in_round * std::max(reference_before, reference_after);
    timed += in_round;
    in_round = 0.0;
    reference_before = reference_after;
  };
  untimed_step();
  double bytes = 0.0, fmas = 0.0;
  const auto& sh = fx.store.shape();
  const double fmas_per_row = 2.0 * sh.group_size() * sh.head_dim;  // q.k and p.v, G query heads
  // each step's wall time (decode + attend + after_attention), for its median and p99: a busy
  // host shows in the tail first (scripts/bench.sh --loaded)
  std::vector<double> step_seconds;
  step_seconds.reserve(4096);
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto attended = step();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step_seconds.push_back(seconds);
    bytes += fx.resident_kv_bytes();  // read after the step: the kept set plus the new token
    fmas += fmas_per_row * static_cast<double>(attended);  // the rows it attends
    in_round += seconds;
    if ((beside && in_round >= round_seconds) || !fx.room_for_step()) {
      st.PauseTiming();
      close_round();
      untimed_step();
      st.ResumeTiming();
    }
  }
  close_round();
  const double reference = timed > 0.0 ? weighted / timed : bandwidth_reference();
  const double iters = std::max<double>(1.0, static_cast<double>(st.iterations()));
  st.counters["resident_bytes"] = bytes / iters;
  st.counters["step_p50_ms"] = 1e3 * quantile(step_seconds, 0.50);
  st.counters["step_p99_ms"] = 1e3 * quantile(step_seconds, 0.99);
  st.counters["steps"] = static_cast<double>(step_seconds.size());
  // the step's attention arithmetic against the machine's multiply-add rate (bench/common.hpp)
  st.counters["fma_fraction"] = benchmark::Counter(fmas / arithmetic_reference(), benchmark::Counter::kIsRate);
  st.counters["exact_fraction"] =
      benchmark::Counter(fmas / exact_arithmetic_reference(), benchmark::Counter::kIsRate);
  if (beside) st.counters["bw_reference_beside"] = reference;
  // bw_fraction against the reference beside the row; bw_fraction_run against the run's best
  st.counters["bw_fraction_run"] =
      benchmark::Counter(bytes / bandwidth_reference(), benchmark::Counter::kIsRate);
  report(st, bytes / iters, static_cast<double>(r), reference);
}

template <class Spec>
void register_method(const model& m, int n, int b, int r) {
  using kvsift::bfloat16;
  const auto* mp = &m;
  const int bb = Spec::budgeted ? b : 0;
  const auto both = [&]<class T>(const char* dt) {
    if (n <= Spec::max_prefill_n) {
      add(name_of("prefill", Spec::name, m, dt, n, bb, r),
          [=](benchmark::State& st) { bm_prefill<Spec, T>(st, *mp, n, b, r); });
    }
    if (n <= Spec::max_decode_n) {
      add(name_of("decode", Spec::name, m, dt, n, bb, r),
          [=](benchmark::State& st) { bm_decode<Spec, T>(st, *mp, n, b, r); });
    }
  };
  both.template operator()<float>("f32");
  both.template operator()<bfloat16>("bf16");
}

template <class... Specs>
void register_all(const model& m, int n, int b, int r) {
  (register_method<Specs>(m, n, b, r), ...);
}

}  // namespace

void register_methods() {
  const std::vector<int> budgets{1024, 4096};
  for (const model* m : models()) {
    for (const int r : {1, 4}) {
      for (const int n : contexts()) {
        if (r > 1 && n > 32768) continue;
        for (const int b : budgets) {
          if (b >= n) continue;
          if (b == budgets.front()) {
            register_all<KVBENCH_BUDGET_FREE_SPECS>(*m, n, b, r);  // once per context
          }
          register_all<KVBENCH_BUDGETED_SPECS>(*m, n, b, r);
        }
      }
      // H2O's prefill is O(n^2 d): its own, shorter contexts
      for (const int n : {1024, 2048}) {
        register_method<spec_h2o>(*m, n, 256, r);
      }
    }
  }
}

}  // namespace kvbench
