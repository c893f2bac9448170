// SPDX-License-Identifier: Apache-2.0
#pragma once

// The one-tier methods' kinds (SPEC.md §5), one handler body per kind, templated on a backend B
// that says where the method runs:
//
//   method.snapkv.prefill  method.pyramidkv.prefill  method.h2o.prefill
//   method.streaming_llm.prefill  method.quest.select (its gqa "max" form)
//   method.streaming_llm.decode  method.h2o.decode  method.quest.decode
//   method.lagkv.prefill  method.lagkv.decode  method.dynamickv.prefill
//
// Each body builds the library's named composition (method/baselines.hpp, lagkv.hpp,
// dynamickv.hpp) as kvsift::<name><B::store, B::exec> behind the erased lifecycle
// any_kv_method<float> (method/erased.hpp), drives it as an engine would (prefill chunks, then
// decode / attend / after_attention per step) and reads every output through that interface:
// the working set (length, position of a head-sequence's slots), the plan decode() returns,
// attend()'s output, stats(). Two outputs are the method's own state, read through the
// wrapper's get() (not in any_kv_method): LagKV's `base` (lagkv_base) and DynamicKV's budgeter
// (scores, past budgets, history).
//
// Backends:
//   host_backend        (here)  erased_method<M> over a store::dense<float> it owns, exec::host:
//                               registered for the CPU backend (kinds_baselines.cpp,
//                               kinds_lagkv.cpp, kinds_dynamickv.cpp)
//   device_backend<E>   (thrust/device_backend.hpp)  device::staged_method<M> over a
//                               thrust::dense_store<float, E>, E = exec::sim_cpp / sim_omp (the
//                               runner's Thrust system): registered for `--backend thrust`
//                               (thrust/kinds_thrust_methods.cpp, thrust/kinds_thrust.cpp)
// A backend has `store`, `exec`, `wrapper<M>` (an any_kv_method<float> with get() -> M&),
// `tiered_method<Recipe>` (a two-tier method over the backend's two-tier store: the kinds of
// two_tier_kinds.hpp), make<M>(name, shape, requests, capacity, params) ->
// std::unique_ptr<wrapper<M>>, M over either store, and make_paged<M>(name, shape, requests,
// capacity, page_size, params) for a two-tier method that recalls whole pages (FreeKV).
//
// method.quest.select's gqa "per_query_head" form scores and selects pages per query head, an
// option of the components that no composition runs: the caller passes that part in (the CPU's
// components on the host, the Thrust components on the device).

#include "runner.hpp"

#include <kvsift/core/error.hpp>
#include <kvsift/method/baselines.hpp>
#include <kvsift/method/dynamickv.hpp>
#include <kvsift/method/erased.hpp>
#include <kvsift/method/lagkv.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/tiered.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvsift::conformance::method_kinds {

// The CPU backend: the method over a store::dense<float> on exec::host, behind erased_method.
struct host_backend {
  using store = kvsift::store::dense<float>;
  using exec = kvsift::exec::host;
  template <class M>
  using wrapper = kvsift::erased_method<M>;
  template <class M>
  static std::unique_ptr<wrapper<M>> make(std::string name, const kvsift::model_shape& shape,
                                          int requests, int capacity, typename M::params p) {
    return std::make_unique<wrapper<M>>(
        std::move(name), std::make_unique<typename M::store_type>(shape, requests, capacity),
        std::move(p));
  }
  // A two-tier method whose host pool recalls whole pages of `page_size` tokens (FreeKV).
  template <class M>
  static std::unique_ptr<wrapper<M>> make_paged(std::string name, const kvsift::model_shape& shape,
                                                int requests, int capacity, int page_size,
                                                typename M::params p) {
    return std::make_unique<wrapper<M>>(
        std::move(name),
        std::make_unique<typename M::store_type>(shape, requests, capacity, page_size),
        std::move(p));
  }
  // A two-tier method (two_tier_kinds.hpp): a store::tiered<float> of `capacity` tokens.
  template <class Recipe>
  using tiered_method = kvsift::method<kvsift::store::tiered<float>, Recipe>;
};

namespace detail {

using kvsift::kv_view;
using kvsift::nhd;
using token = kvsift::decode_token<float>;
using method_ref = kvsift::any_kv_method<float>;

// Query h of a [Hq, nq, d] tensor, or of layer l of a [L, Hq, nq, d] one (and the same for
// keys / values): the token-major view the library takes.
inline kv_view<const float, nhd> layer_view(const tensor& t, int layer = 0) {
  const bool layered = t.rank() == 4;
  const int h = dim(t, layered ? 1 : 0), n = dim(t, layered ? 2 : 1), d = dim(t, layered ? 3 : 2);
  return head_major(t.f32.data() + static_cast<std::size_t>(layer) * h * n * d, h, n, d);
}

// [H, n, d] -> [n, H, d], the layout prefill chunks arrive in.
inline std::vector<float> to_nhd(const tensor& t) {
  const auto H = t.dim(0), n = t.dim(1), d = t.dim(2);
  std::vector<float> out(t.f32.size());
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t j = 0; j < n; ++j) {
      std::copy_n(t.f32.data() + (h * n + j) * d, d, out.data() + (j * H + h) * d);
    }
  }
  return out;
}

// The original positions of head-sequence (request 0, layer, h) of the working set.
inline std::vector<std::int32_t> positions(const method_ref& m, int layer, int h) {
  const auto seq = m.shape().sequence(0, layer, h);
  std::vector<std::int32_t> out;
  for (int i = 0; i < m.length(seq); ++i) out.push_back(m.position(seq, i));
  return out;
}

// Kept original positions of every KV head of `layer` (every head must keep the same count),
// heads one after the other; per_head: the count.
inline std::vector<std::int32_t> kept_positions(const method_ref& m, int layer,
                                                std::int64_t& per_head) {
  const int H = m.shape().kv_heads;
  std::vector<std::int32_t> out;
  per_head = m.length(m.shape().sequence(0, layer, 0));
  for (int h = 0; h < H; ++h) {
    const auto pos = positions(m, layer, h);
    if (static_cast<std::int64_t>(pos.size()) != per_head) {
      throw runner_error("KV heads keep different counts: " + std::to_string(per_head) + " vs " +
                         std::to_string(pos.size()));
    }
    out.insert(out.end(), pos.begin(), pos.end());
  }
  return out;
}

inline void put_kept(const method_ref& m, int layer, outputs& out) {
  std::int64_t k = 0;
  auto kept = kept_positions(m, layer, k);
  out.put_i32("kept", {m.shape().kv_heads, k}, std::move(kept));
}

inline void put_csr(outputs& out, const std::string& name, const kvsift::index_sets& sets) {
  out.put_i32(name, {static_cast<std::int64_t>(sets.values.size())}, sets.values);
  out.put_i32(name + "_offsets", {static_cast<std::int64_t>(sets.offsets.size())}, sets.offsets);
}

// Prefills layer 0 of request 0 with the case's keys and prefill queries in one last chunk.
// Prefill kinds check kept sets only, so the values are zeros.
inline void prefill_keys(method_ref& m, const tensor& k, const tensor& q) {
  const int n = dim(k, 1);
  const std::vector<float> zeros(k.f32.size(), 0.0f);
  const kvsift::prefill_chunk<float> ch{.request = 0,
                                        .keys = layer_view(k),
                                        .values = head_major(zeros.data(), dim(k, 0), n, dim(k, 2)),
                                        .queries = layer_view(q),
                                        .first_position = 0,
                                        .last = true};
  m.prefill(0, std::span<const kvsift::prefill_chunk<float>>(&ch, 1));
}

inline void prefill_one(method_ref& m, int layer, const kvsift::prefill_chunk<float>& ch) {
  m.prefill(layer, std::span<const kvsift::prefill_chunk<float>>(&ch, 1));
}

// The prompt of a decode kind: the case's keys and values (and `queries`) in one last chunk.
inline kvsift::prefill_chunk<float> prompt(const case_data& c, kv_view<const float, nhd> queries) {
  return {.request = 0, .keys = layer_view(c.in("keys")), .values = layer_view(c.in("values")),
          .queries = queries, .first_position = 0, .last = true};
}

// T decode steps on `layer`, collecting plan, out (and pages, evicted).
inline void run_decode(const case_data& c, method_ref& m, int layer, outputs& out, bool pages,
                       bool evicted) {
  const auto& sq = c.in("step_queries");
  const auto& sk = c.in("step_keys");
  const auto& sv = c.in("step_values");
  const int T = dim(sq, 0), hq = dim(sq, 1), d = dim(sq, 2), h = dim(sk, 1);
  kvsift::index_sets plan_sets, page_sets;
  std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
  std::vector<std::int32_t> ev;
  for (int t = 0; t < T; ++t) {
    const token tok{0, sq.f32.data() + static_cast<std::size_t>(t) * hq * d,
                    sk.f32.data() + static_cast<std::size_t>(t) * h * d,
                    sv.f32.data() + static_cast<std::size_t>(t) * h * d};
    const std::span<const token> toks(&tok, 1);
    const auto& plan = m.decode(layer, toks);
    for (int hh = 0; hh < h; ++hh) {
      plan_sets.push_back(plan.positions[hh]);
      if (pages) page_sets.push_back(plan.pages[hh]);
    }
    m.attend(layer, toks, o.data() + static_cast<std::size_t>(t) * hq * d);
    std::vector<std::vector<std::int32_t>> before;
    for (int hh = 0; hh < h; ++hh) before.push_back(positions(m, layer, hh));
    m.after_attention(layer, toks);
    for (int hh = 0; hh < h; ++hh) {  // the position that disappeared, if any
      const auto after = positions(m, layer, hh);
      std::vector<std::int32_t> gone;
      std::set_difference(before[hh].begin(), before[hh].end(), after.begin(), after.end(),
                          std::back_inserter(gone));
      if (gone.size() > 1) {
        throw runner_error("step " + std::to_string(t + 1) + " evicted " +
                           std::to_string(gone.size()) + " tokens of head " + std::to_string(hh));
      }
      ev.push_back(gone.empty() ? -1 : gone[0]);
    }
  }
  put_csr(out, "plan", plan_sets);
  out.put_f32("out", {T, hq, d}, std::move(o));
  if (pages) put_csr(out, "pages", page_sets);
  if (evicted) out.put_i32("evicted", {T, h}, std::move(ev));
}

// The shape of a decode kind: the prefill keys plus T decode steps, on `layer` of `layer + 1`.
inline kvsift::model_shape decode_shape(const case_data& c, int layer) {
  const auto& k = c.in("keys");
  return {layer + 1, dim(c.in("step_queries"), 1), dim(k, 0), dim(k, 2)};
}
inline int decode_capacity(const case_data& c) {
  return dim(c.in("keys"), 1) + dim(c.in("step_queries"), 0);
}

// LagKV: the case's params, and the prompt fed as SPEC's method.lagkv.prefill says (the first
// min(n, S + 2L) tokens, then chunks of L); the method runs a round after each arrival when its
// trigger fires.
template <class B>
using lagkv_t = kvsift::lagkv<typename B::store, typename B::exec>;

template <class B>
typename lagkv_t<B>::params lagkv_params_of(const case_data& c) {
  return kvsift::lagkv_params<typename B::store, typename B::exec>(
      param(c, "sink"), param(c, "lag"), c.param_d("keep_fraction"), c.param_d("value_weight"),
      kvsift::score::parse_lag_variant(c.param_s("variant")));
}

inline void lagkv_prefill(method_ref& m, const case_data& c, int sink, int lag) {
  const auto& keys = c.in("keys");
  const int H = dim(keys, 0), n = dim(keys, 1), d = dim(keys, 2);
  const auto k = to_nhd(keys), v = to_nhd(c.in("values"));
  int first = 0;
  int chunk = std::min(n, sink + 2 * lag);
  while (first < n) {
    kvsift::prefill_chunk<float> ch;
    ch.keys = kv_view<const float, nhd>::contiguous(k.data(), n, H, d).slice(first, chunk);
    ch.values = kv_view<const float, nhd>::contiguous(v.data(), n, H, d).slice(first, chunk);
    ch.first_position = first;
    ch.last = first + chunk == n;
    prefill_one(m, 0, ch);
    first += chunk;
    chunk = std::min(lag, n - first);
  }
}

}  // namespace detail

// ---- SnapKV / PyramidKV / H2O / StreamingLLM prefill ----------------------------------------------

template <class B>
void snapkv_prefill(const case_data& c, outputs& out) {
  using M = kvsift::snapkv<typename B::store, typename B::exec>;
  const auto& q = c.in("queries");
  const auto& k = c.in("keys");
  auto m = B::template make<M>(
      "snapkv", {1, dim(q, 0), dim(k, 0), dim(k, 2)}, 1, dim(k, 1),
      kvsift::snapkv_params<typename B::store, typename B::exec>(
          param(c, "budget"), param(c, "window"), param(c, "kernel"),
          kvsift::parse_pooling(c.param_s("pooling")), kvsift::parse_gqa_reduce(c.param_s("gqa"))));
  detail::prefill_keys(*m, k, q);  // only the window's queries: the chunk's newest ones
  detail::put_kept(*m, 0, out);
}

template <class B>
void pyramidkv_prefill(const case_data& c, outputs& out) {
  using M = kvsift::pyramidkv<typename B::store, typename B::exec>;
  const auto& q = c.in("queries");
  const auto& k = c.in("keys");
  const int L = dim(k, 0), h = dim(k, 1), n = dim(k, 2), d = dim(k, 3);
  const int w = param(c, "window");
  auto p = kvsift::pyramidkv_params<typename B::store, typename B::exec>(
      param(c, "budget"), w, param(c, "kernel"), param(c, "beta"));
  p.scorer.pool = kvsift::parse_pooling(c.param_s("pooling"));
  p.scorer.gqa = kvsift::parse_gqa_reduce(c.param_s("gqa"));
  auto m = B::template make<M>("pyramidkv", {L, dim(q, 1), h, d}, 1, n, std::move(p));
  const std::vector<float> zeros(static_cast<std::size_t>(h) * n * d, 0.0f);
  kvsift::index_sets kept;
  std::vector<std::int32_t> past;
  for (int l = 0; l < L; ++l) {
    detail::prefill_one(*m, l, {.request = 0,
                                .keys = detail::layer_view(k, l),
                                .values = head_major(zeros.data(), h, n, d),
                                .queries = detail::layer_view(q, l),
                                .first_position = 0,
                                .last = true});
    std::int64_t per_head = 0;
    const auto pos = detail::kept_positions(*m, l, per_head);
    for (int hh = 0; hh < h; ++hh) {
      kept.push_back(std::span<const std::int32_t>(pos.data() + hh * per_head,
                                                   static_cast<std::size_t>(per_head)));
    }
    past.push_back(static_cast<std::int32_t>(per_head) - std::min(w, n));
  }
  out.put_i32("past_budget", {L}, std::move(past));
  detail::put_csr(out, "kept", kept);
}

template <class B>
void h2o_prefill(const case_data& c, outputs& out) {
  using M = kvsift::h2o<typename B::store, typename B::exec>;
  const auto& q = c.in("queries");
  const auto& k = c.in("keys");
  auto m = B::template make<M>("h2o", {1, dim(q, 0), dim(k, 0), dim(k, 2)}, 1, dim(k, 1),
                               kvsift::h2o_params<typename B::store, typename B::exec>(
                                   param(c, "budget"), kvsift::parse_gqa_reduce(c.param_s("gqa"))));
  detail::prefill_keys(*m, k, q);
  detail::put_kept(*m, 0, out);
}

template <class B>
void streaming_llm_prefill(const case_data& c, outputs& out) {
  using M = kvsift::streaming_llm<typename B::store, typename B::exec>;
  const int n = param(c, "n");
  auto m = B::template make<M>(  // the kept set does not depend on KV
      "streaming_llm", {1, 1, 1, 1}, 1, n,
      kvsift::streaming_llm_params<typename B::store, typename B::exec>(param(c, "budget"),
                                                                        param(c, "sink")));
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  const auto kv = detail::kv_view<const float, detail::nhd>::contiguous(zeros.data(), n, 1, 1);
  detail::prefill_one(*m, 0, {.request = 0, .keys = kv, .values = kv, .queries = {},
                              .first_position = 0, .last = true});
  std::int64_t k = 0;
  auto kept = detail::kept_positions(*m, 0, k);
  out.put_i32("kept", {k}, std::move(kept));
}

// ---- Quest ------------------------------------------------------------------------------------

// gqa "max": the selection of a decode step whose token is the case's last key (the method
// prefills the first n - 1 tokens, no queries: Quest scores nothing at prefill, then decodes);
// gqa "per_query_head": per_query_head(c, out), the backend's components.
template <class B, class PerQueryHead>
void quest_select(const case_data& c, outputs& out, PerQueryHead&& per_query_head) {
  using M = kvsift::quest<typename B::store, typename B::exec>;
  const std::string gqa = c.param_s("gqa");
  if (gqa == "per_query_head") {
    per_query_head(c, out);
    return;
  }
  kvsift::require(gqa == "max", "method.quest.select", "gqa", gqa, "\"max\" or \"per_query_head\"");
  const auto& q = c.in("query");
  const auto& k = c.in("keys");
  const int hq = dim(q, 0), h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
  const int layer = param(c, "layer");
  auto m = B::template make<M>("quest", {layer + 1, hq, h, d}, 1, n,
                               kvsift::quest_params<typename B::store, typename B::exec>(
                                   param(c, "budget"), param(c, "page_size"),
                                   param(c, "dense_layers")));
  const std::vector<float> zeros(static_cast<std::size_t>(h) * n * d, 0.0f);
  if (n > 1) {
    detail::prefill_one(*m, layer, {.request = 0,
                                    .keys = detail::layer_view(k).slice(0, n - 1),
                                    .values = head_major(zeros.data(), h, n, d).slice(0, n - 1),
                                    .queries = {},
                                    .first_position = 0,
                                    .last = true});
  }
  std::vector<float> last_key(static_cast<std::size_t>(h) * d);
  for (int hh = 0; hh < h; ++hh) {
    std::copy_n(k.f32.data() + (static_cast<std::size_t>(hh) * n + n - 1) * d, d,
                last_key.data() + static_cast<std::size_t>(hh) * d);
  }
  const detail::token tok{0, q.f32.data(), last_key.data(), zeros.data()};
  const auto& plan = m->decode(layer, std::span<const detail::token>(&tok, 1));
  out.put_i32("pages", {h, plan.pages.size(0)}, plan.pages.values);
}

// ---- decode lifecycles ----------------------------------------------------------------------------

template <class B>
void streaming_llm_decode(const case_data& c, outputs& out) {
  using M = kvsift::streaming_llm<typename B::store, typename B::exec>;
  auto m = B::template make<M>(
      "streaming_llm", detail::decode_shape(c, 0), 1, detail::decode_capacity(c),
      kvsift::streaming_llm_params<typename B::store, typename B::exec>(param(c, "budget"),
                                                                        param(c, "sink")));
  detail::prefill_one(*m, 0, detail::prompt(c, {}));
  detail::run_decode(c, *m, 0, out, false, false);
}

template <class B>
void h2o_decode(const case_data& c, outputs& out) {
  using M = kvsift::h2o<typename B::store, typename B::exec>;
  auto m = B::template make<M>("h2o", detail::decode_shape(c, 0), 1, detail::decode_capacity(c),
                               kvsift::h2o_params<typename B::store, typename B::exec>(
                                   param(c, "budget"), kvsift::parse_gqa_reduce(c.param_s("gqa"))));
  detail::prefill_one(*m, 0, detail::prompt(c, detail::layer_view(c.in("queries"))));
  detail::run_decode(c, *m, 0, out, false, true);
}

template <class B>
void quest_decode(const case_data& c, outputs& out) {
  using M = kvsift::quest<typename B::store, typename B::exec>;
  kvsift::require(c.param_s("gqa") == "max", "method.quest.decode", "gqa", c.param_s("gqa"),
                  "\"max\"");
  const int layer = param(c, "layer");
  auto m = B::template make<M>("quest", detail::decode_shape(c, layer), 1,
                               detail::decode_capacity(c),
                               kvsift::quest_params<typename B::store, typename B::exec>(
                                   param(c, "budget"), param(c, "page_size"),
                                   param(c, "dense_layers")));
  detail::prefill_one(*m, layer, detail::prompt(c, {}));  // Quest needs no prefill queries
  detail::run_decode(c, *m, layer, out, true, false);
}

// ---- LagKV ----------------------------------------------------------------------------------------

template <class B>
void lagkv_prefill(const case_data& c, outputs& out) {
  using M = detail::lagkv_t<B>;
  const auto& keys = c.in("keys");
  const int H = dim(keys, 0), n = dim(keys, 1), d = dim(keys, 2);
  auto m = B::template make<M>("lagkv", {1, H, H, d}, 1, n, detail::lagkv_params_of<B>(c));
  detail::lagkv_prefill(*m, c, param(c, "sink"), param(c, "lag"));
  std::int64_t kept = 0;
  auto pos = detail::kept_positions(*m, 0, kept);
  out.put_i32("kept", {H, kept}, std::move(pos));
  out.put_i32("base", {1}, {kvsift::lagkv_base(m->get(), 0, 0, 0)});
  out.put_i32("rounds", {1}, {static_cast<std::int32_t>(m->stats().refreshes)});
}

template <class B>
void lagkv_decode(const case_data& c, outputs& out) {
  using M = detail::lagkv_t<B>;
  const auto& keys = c.in("keys");
  const auto& q = c.in("step_queries");
  const auto& sk = c.in("step_keys");
  const auto& sv = c.in("step_values");
  const int H = dim(keys, 0), n = dim(keys, 1), d = dim(keys, 2);
  const int T = dim(q, 0), Hq = dim(q, 1);
  auto m = B::template make<M>("lagkv", {1, Hq, H, d}, 1, n + T, detail::lagkv_params_of<B>(c));
  detail::lagkv_prefill(*m, c, param(c, "sink"), param(c, "lag"));
  std::vector<std::int32_t> plan, offsets{0}, compressed, base;
  std::vector<float> att(static_cast<std::size_t>(T) * Hq * d);
  for (int t = 0; t < T; ++t) {
    const detail::token tok{0, q.f32.data() + static_cast<std::size_t>(t) * Hq * d,
                            sk.f32.data() + static_cast<std::size_t>(t) * H * d,
                            sv.f32.data() + static_cast<std::size_t>(t) * H * d};
    const std::span<const detail::token> toks(&tok, 1);
    const auto& pl = m->decode(0, toks);
    for (int h = 0; h < H; ++h) {
      plan.insert(plan.end(), pl.positions[h].begin(), pl.positions[h].end());
      offsets.push_back(static_cast<std::int32_t>(plan.size()));
    }
    m->attend(0, toks, att.data() + static_cast<std::size_t>(t) * Hq * d);
    const auto before = m->stats().refreshes;
    m->after_attention(0, toks);
    compressed.push_back(m->stats().refreshes > before ? 1 : 0);
    base.push_back(kvsift::lagkv_base(m->get(), 0, 0, 0));
  }
  out.put_i32("plan", {static_cast<std::int64_t>(plan.size())}, plan);
  out.put_i32("plan_offsets", {static_cast<std::int64_t>(offsets.size())}, offsets);
  out.put_f32("out", {T, Hq, d}, std::move(att));
  out.put_i32("compressed", {T}, std::move(compressed));
  out.put_i32("base", {T}, std::move(base));
}

// ---- DynamicKV ------------------------------------------------------------------------------------

// Prefills layer by layer as an engine does; outputs the budgeter's past budgets and history,
// the kept sets (CSR, one set per (layer, head)) and, when expected, the saved scores.
template <class B>
void dynamickv_prefill(const case_data& c, outputs& out) {
  using M = kvsift::dynamickv<typename B::store, typename B::exec>;
  const auto& q = c.in("queries");
  const auto& k = c.in("keys");
  const int L = dim(k, 0), H = dim(k, 1), n = dim(k, 2), d = dim(k, 3);
  const int hq = dim(q, 1), nq = dim(q, 2), w = param(c, "window");
  auto p = kvsift::dynamickv_params<typename B::store, typename B::exec>(
      param(c, "budget"), w, param(c, "kernel"), param(c, "r_max"), param(c, "interval"));
  p.scorer.pool = kvsift::parse_pooling(c.param_s("pooling"));
  p.scorer.gqa = kvsift::parse_gqa_reduce(c.param_s("gqa"));
  auto m = B::template make<M>("dynamickv", {L, hq, H, d}, 1, n, std::move(p));
  auto& budgeter = m->get().budgeter_state();
  const std::vector<float> zeros(static_cast<std::size_t>(H) * n * d, 0.0f);
  // Queries [n, Hq, d] token-major: only the last nq (the window) are meaningful.
  std::vector<float> qs(static_cast<std::size_t>(n) * hq * d, 0.0f);
  std::vector<float> scores;
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < hq; ++h) {
      for (int i = 0; i < nq; ++i) {
        std::copy_n(q.f32.data() + ((static_cast<std::size_t>(l) * hq + h) * nq + i) * d, d,
                    qs.data() + (static_cast<std::size_t>(n - nq + i) * hq + h) * d);
      }
    }
    detail::prefill_one(*m, l, {.request = 0,
                                .keys = detail::layer_view(k, l),
                                .values = head_major(zeros.data(), H, n, d),
                                .queries = detail::kv_view<const float, detail::nhd>::contiguous(
                                    qs.data(), n, hq, d),
                                .first_position = 0,
                                .last = true});
    const auto s = budgeter.scores(0, l);
    scores.insert(scores.end(), s.begin(), s.end());
  }
  if (c.expected.count("scores") != 0) {
    out.put_f32("scores", {L, H, std::max(n - w, 0)}, std::move(scores));
  }
  const auto past = budgeter.past_budgets(0);
  out.put_i32("past_budget", {L}, std::vector<std::int32_t>(past.begin(), past.end()));
  std::vector<std::int32_t> hist;
  const auto history = budgeter.history(0);
  for (const auto& row : history) hist.insert(hist.end(), row.begin(), row.end());
  out.put_i32("history", {static_cast<std::int64_t>(history.size()), L}, std::move(hist));
  kvsift::index_sets kept;
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < H; ++h) kept.push_back(detail::positions(*m, l, h));
  }
  detail::put_csr(out, "kept", kept);
}

}  // namespace kvsift::conformance::method_kinds
