// SPDX-License-Identifier: Apache-2.0
// Capacity: how many requests one page pool admits per method, at a budget of a quarter of the
// prompt, against full KV; and the fragmentation of what they hold.
//
// A one-layer model of Llama-3.1-8B's layer shape (32 query heads, 8 KV heads, d 128, bf16; one
// layer, so that DynamicKV's progressive update and PyramidKV's pyramid act on it as on a last
// layer) in a store::paged with pages of 16 tokens, scaled to this machine: prompts of n = 1024 tokens, each followed by 64
// decode steps, and a pool of the pages 16 full requests need (16 x 8 x ceil(1088 / 16) pages,
// 71 MB), so full KV admits 16. Requests arrive one after another: each is prefilled (one chunk)
// and then decodes its 64 tokens while the earlier ones stay resident. The first request whose
// prefill or decode the pool cannot serve is refused by the store's room check (kvsift::error,
// nothing changed), reset, and ends the count.
//
//   admitted        requests resident at the end
//   x_full          admitted / full KV's 16
//   fragmentation   pages held / the pages the kept tokens need (sum over head-sequences of
//                   ceil(kept / 16)): 1.0 when every page is full but each sequence's last
//   kept_tokens     tokens a request keeps per KV head at the end (mean)
//   bytes_per_second / tokens_per_second   the admissions' prompt KV and tokens (prefill and
//                   decode) per second of the whole run, bw_fraction against the run's
//                   bandwidth reference (BM_bandwidth_reference)
//
// BM_capacity_device/<method>/...: the same run over device memory, where the build has CCCL
// (KVBENCH_HAS_THRUST): the one-tier compositions over a thrust::paged_store on the simulated
// device exec (exec::sim_omp, or sim_cpp without OpenMP). It leaves a decode step's released row
// as a hole the next append fills and compacts larger rounds, as the host store::paged does, so
// its counters equal the host rows'. Its times are the simulation's, not a device's.

#include "common.hpp"
#include "method_specs.hpp"

#if KVBENCH_HAS_THRUST
#include <kvsift/device/all.hpp>
#include <kvsift/method/any_method.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/paged_store.hpp>
#endif

#include <memory>
#include <span>

namespace kvbench {
namespace {

using kvsift::kv_view;
using kvsift::nhd;

constexpr int cap_page = 16;
constexpr int cap_prompt = 1024;
constexpr int cap_steps = 64;
constexpr int cap_full_requests = 16;
constexpr int cap_slots = 128;  // request slots: more than any method admits here

// One request's inputs in the memory the method reads (host vectors, or E-memory buffers).
template <class T>
struct request_inputs {
  const T* keys;       // [n, kv_heads, d]
  const T* values;
  const float* queries;  // [n, q_heads, d]: the prompt's queries
  const T* dk;         // [kv_heads, d]: the decode token's
  const T* dv;
  const float* dq;     // [q_heads, d]
  float* out;          // [q_heads, d]
};

struct capacity_result {
  int admitted = 0;
  double fragmentation = 0.0;
  double kept = 0.0;
};

// Admits requests one after another into meth's store until the pool refuses one (reset, and the
// count ends); then measures what the admitted ones hold.
template <class M, class Store, class T>
capacity_result admit_all(M& meth, const Store& store, const model& m, const request_inputs<T>& in) {
  using chunk_t = typename M::chunk_type;
  using view = kvsift::kv_view<const T, nhd, typename M::view_space>;
  using qview = kvsift::kv_view<const float, nhd, typename M::view_space>;
  const int layer = 0, n = cap_prompt;
  const int qw = M::caps.needs_queries ? meth.scorer_state().query_window() : 0;
  const int nq = qw < 0 ? n : std::min(n, qw);
  capacity_result res;
  for (int r = 0; r < cap_slots; ++r) {
    const chunk_t chunk{r, view::contiguous(in.keys, n, m.kv_heads, m.head_dim),
                        view::contiguous(in.values, n, m.kv_heads, m.head_dim),
                        qview::contiguous(in.queries + static_cast<std::size_t>(n - nq) * m.q_heads * m.head_dim,
                                          nq, m.q_heads, m.head_dim),
                        0, true};
    try {
      meth.prefill(layer, std::span<const chunk_t>(&chunk, 1));
      const kvsift::decode_token<T> tok{r, in.dq, in.dk, in.dv};
      const std::span<const kvsift::decode_token<T>> toks(&tok, 1);
      for (int s = 0; s < cap_steps; ++s) {
        (void)meth.decode(layer, toks);
        meth.attend(layer, toks, in.out);
        meth.after_attention(layer, toks);
      }
    } catch (const kvsift::error&) {  // the pool is full: refused before anything changed
      meth.reset(r);
      break;
    }
    ++res.admitted;
  }
  const auto& shape = store.shape();
  std::int64_t need = 0, tokens = 0;
  for (int r = 0; r < res.admitted; ++r) {
    for (int h = 0; h < m.kv_heads; ++h) {
      const int len = store.length(shape.sequence(r, layer, h));
      need += (len + cap_page - 1) / cap_page;
      tokens += len;
    }
  }
  res.fragmentation = need > 0 ? static_cast<double>(store.used_pages()) / static_cast<double>(need) : 0.0;
  res.kept = res.admitted > 0
                 ? static_cast<double>(tokens) / (static_cast<double>(res.admitted) * m.kv_heads)
                 : 0.0;
  return res;
}

struct capacity_inputs {
  model m;
  int pool = 0;
  std::vector<kvsift::bfloat16> keys, values, dk, dv;
  std::vector<float> queries, dq;
  explicit capacity_inputs(const model& m_)
      : m(m_),
        pool(cap_full_requests * m_.kv_heads * ((cap_prompt + cap_steps + cap_page - 1) / cap_page)),
        keys(random_vector<kvsift::bfloat16>(static_cast<std::size_t>(cap_prompt) * m_.kv_heads * m_.head_dim, 31)),
        values(random_vector<kvsift::bfloat16>(keys.size(), 32)),
        dk(random_vector<kvsift::bfloat16>(static_cast<std::size_t>(m_.kv_heads) * m_.head_dim, 34)),
        dv(random_vector<kvsift::bfloat16>(dk.size(), 35)),
        queries(random_vector<float>(static_cast<std::size_t>(cap_prompt) * m_.q_heads * m_.head_dim, 33)),
        dq(random_vector<float>(static_cast<std::size_t>(m_.q_heads) * m_.head_dim, 36)) {}
};

void report_capacity(benchmark::State& st, const capacity_inputs& in, const capacity_result& res) {
  const model& m = in.m;
  st.counters["admitted"] = res.admitted;
  st.counters["x_full"] = static_cast<double>(res.admitted) / cap_full_requests;
  st.counters["fragmentation"] = res.fragmentation;
  st.counters["kept_tokens"] = res.kept;
  st.counters["pool_pages"] = in.pool;
  report(st, static_cast<double>(res.admitted) * cap_prompt * m.kv_heads * 2.0 * m.head_dim * sizeof(kvsift::bfloat16),
         static_cast<double>(res.admitted) * (cap_prompt + cap_steps));
}

// The host rows: store::paged on exec::host.
template <class Spec>
void bm_capacity(benchmark::State& st, const capacity_inputs& in) {
  using T = kvsift::bfloat16;
  using store_t = kvsift::store::paged<T>;
  using method_t = typename Spec::template type<store_t>;
  const model& m = in.m;
  const kvsift::model_shape shape{1, m.q_heads, m.kv_heads, m.head_dim};
  std::vector<float> out(in.dq.size());
  const request_inputs<T> ri{in.keys.data(), in.values.data(), in.queries.data(), in.dk.data(),
                             in.dv.data(), in.dq.data(), out.data()};
  capacity_result res;
  for (auto _ : st) {
    store_t store(shape, cap_slots, cap_page, in.pool);
    method_t meth(store, Spec::template params<store_t>(cap_prompt / 4));
    res = admit_all(meth, store, m, ri);
  }
  report_capacity(st, in, res);
}

#if KVBENCH_HAS_THRUST
// The simulated-device rows: the same compositions over a thrust::paged_store (the pool and page
// tables in the exec's memory, one side column for H2O's running scores) on a simulated device
// exec, built by name through the registry's map (detail::visit_one_tier), inputs staged once.
template <class Spec, class E>
void bm_capacity_device(benchmark::State& st, const capacity_inputs& in) {
  using T = kvsift::bfloat16;
  using store_t = kvsift::thrust::paged_store<T, E>;
  using kvsift::thrust::buffer;
  using kvsift::thrust::copy_to_device;
  const model& m = in.m;
  const kvsift::model_shape shape{1, m.q_heads, m.kv_heads, m.head_dim};
  kvsift::thrust::sim_arena arena;
  const E e{arena};
  const auto staged = [&]<class U>(const std::vector<U>& host) {
    buffer<U, E> b(e, host.size());
    copy_to_device(e, std::span<const U>(host), b);
    return b;
  };
  const auto keys = staged(in.keys), values = staged(in.values), dk = staged(in.dk), dv = staged(in.dv);
  const auto queries = staged(in.queries), dq = staged(in.dq);
  buffer<float, E> out(e, in.dq.size());
  const request_inputs<T> ri{keys.data(), values.data(), queries.data(), dk.data(), dv.data(), dq.data(),
                             out.data()};
  kvsift::method_config c;
  c.budget = cap_prompt / 4;
  capacity_result res;
  for (auto _ : st) {
    store_t store(e, shape, cap_slots, cap_prompt + cap_steps, cap_page, in.pool, /*columns=*/1);
    kvsift::detail::visit_one_tier<store_t, E>(Spec::name, c, [&]<class M>(typename M::params p) {
      M meth(store, std::move(p));
      res = admit_all(meth, store, m, ri);
    });
  }
  report_capacity(st, in, res);
}
#endif

template <class... Specs>
void register_capacity_all(const model& m) {
  const auto in = std::make_shared<const capacity_inputs>(m);
  const std::string shape = std::string("/") + m.name + "/bf16/n" + std::to_string(cap_prompt) + "/B" +
                            std::to_string(cap_prompt / 4);
  (add(std::string("BM_capacity/") + Specs::name + shape,
       [in](benchmark::State& st) { bm_capacity<Specs>(st, *in); })
       ->Iterations(1),
   ...);
#if KVBENCH_HAS_THRUST
#if defined(_OPENMP)
  using E = kvsift::exec::sim_omp;
#else
  using E = kvsift::exec::sim_cpp;
#endif
  (add(std::string("BM_capacity_device/") + Specs::name + shape,
       [in](benchmark::State& st) { bm_capacity_device<Specs, E>(st, *in); })
       ->Iterations(1),
   ...);
#endif
}

}  // namespace

void register_capacity() {
  register_capacity_all<KVBENCH_BUDGET_FREE_SPECS, KVBENCH_BUDGETED_SPECS>(llama31_8b);
}

}  // namespace kvbench
