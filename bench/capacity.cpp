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

#include "common.hpp"
#include "method_specs.hpp"

namespace kvbench {
namespace {

using kvsift::kv_view;
using kvsift::nhd;

constexpr int cap_page = 16;
constexpr int cap_prompt = 1024;
constexpr int cap_steps = 64;
constexpr int cap_full_requests = 16;
constexpr int cap_slots = 128;  // request slots: more than any method admits here

template <class Spec, class T>
void bm_capacity(benchmark::State& st, const model& m) {
  using store_t = kvsift::store::paged<T>;
  using method_t = typename Spec::template type<store_t>;
  const kvsift::model_shape shape{1, m.q_heads, m.kv_heads, m.head_dim};
  const int layer = 0, n = cap_prompt;
  const int budget = n / 4;
  const int pages_per_head = (n + cap_steps + cap_page - 1) / cap_page;
  const int pool = cap_full_requests * m.kv_heads * pages_per_head;
  const auto keys = random_vector<T>(static_cast<std::size_t>(n) * m.kv_heads * m.head_dim, 31);
  const auto values = random_vector<T>(keys.size(), 32);
  const auto queries = random_vector<float>(static_cast<std::size_t>(n) * m.q_heads * m.head_dim, 33);
  const auto dk = random_vector<T>(static_cast<std::size_t>(m.kv_heads) * m.head_dim, 34);
  const auto dv = random_vector<T>(dk.size(), 35);
  const auto dq = random_vector<float>(static_cast<std::size_t>(m.q_heads) * m.head_dim, 36);
  std::vector<float> out(dq.size());

  int admitted = 0;
  double fragmentation = 0.0, kept = 0.0;
  for (auto _ : st) {
    store_t store(shape, cap_slots, cap_page, pool);
    method_t meth(store, Spec::template params<store_t>(budget));
    const int qw = method_t::caps.needs_queries ? meth.scorer_state().query_window() : 0;
    const int nq = qw < 0 ? n : std::min(n, qw);
    admitted = 0;
    for (int r = 0; r < cap_slots; ++r) {
      const kvsift::prefill_chunk<T> chunk{
          r, kv_view<const T, nhd>::contiguous(keys.data(), n, m.kv_heads, m.head_dim),
          kv_view<const T, nhd>::contiguous(values.data(), n, m.kv_heads, m.head_dim),
          kv_view<const float, nhd>::contiguous(queries.data() + static_cast<std::size_t>(n - nq) *
                                                                     m.q_heads * m.head_dim,
                                                nq, m.q_heads, m.head_dim),
          0, true};
      try {
        meth.prefill(layer, std::span<const kvsift::prefill_chunk<T>>(&chunk, 1));
        const kvsift::decode_token<T> tok{r, dq.data(), dk.data(), dv.data()};
        const std::span<const kvsift::decode_token<T>> toks(&tok, 1);
        for (int s = 0; s < cap_steps; ++s) {
          (void)meth.decode(layer, toks);
          meth.attend(layer, toks, out.data());
          meth.after_attention(layer, toks);
        }
      } catch (const kvsift::error&) {  // the pool is full: refused before anything changed
        meth.reset(r);
        break;
      }
      ++admitted;
    }
    std::int64_t need = 0, tokens = 0;
    for (int r = 0; r < admitted; ++r) {
      for (int h = 0; h < m.kv_heads; ++h) {
        const int len = store.length(shape.sequence(r, layer, h));
        need += (len + cap_page - 1) / cap_page;
        tokens += len;
      }
    }
    fragmentation = need > 0 ? static_cast<double>(store.used_pages()) / static_cast<double>(need) : 0.0;
    kept = admitted > 0 ? static_cast<double>(tokens) / (static_cast<double>(admitted) * m.kv_heads) : 0.0;
  }
  st.counters["admitted"] = admitted;
  st.counters["x_full"] = static_cast<double>(admitted) / cap_full_requests;
  st.counters["fragmentation"] = fragmentation;
  st.counters["kept_tokens"] = kept;
  st.counters["pool_pages"] = pool;
  report(st, static_cast<double>(admitted) * n * m.kv_heads * 2.0 * m.head_dim * sizeof(T),
         static_cast<double>(admitted) * (n + cap_steps));
}

template <class... Specs>
void register_capacity_all(const model& m) {
  const auto* mp = &m;
  (add(std::string("BM_capacity/") + Specs::name + "/" + m.name + "/bf16/n" +
           std::to_string(cap_prompt) + "/B" + std::to_string(cap_prompt / 4),
       [=](benchmark::State& st) { bm_capacity<Specs, kvsift::bfloat16>(st, *mp); })
       ->Iterations(1),
   ...);
}

}  // namespace

void register_capacity() {
  register_capacity_all<KVBENCH_BUDGET_FREE_SPECS, KVBENCH_BUDGETED_SPECS>(llama31_8b);
}

}  // namespace kvbench
