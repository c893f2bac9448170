// SPDX-License-Identifier: Apache-2.0
// The foundation kinds (SPEC.md §5) on the CPU backend: reference attention, the top-k selector,
// and the baselines StreamingLLM, H2O, SnapKV, PyramidKV and Quest.
//   method.*    the one handler body per kind of method_kinds.hpp, instantiated on host_backend
//               (the named method from method/baselines.hpp over a store::dense<float>, behind
//               erased_method); the Thrust runners register the same bodies on the device
//               (thrust/kinds_thrust_methods.cpp). method.quest.select's per_query_head form is
//               the components' (quest_per_query_head below).
//   components  score.*, select.topk, budget.pyramidkv, attention.decode call the component
//               directly (host code; their Thrust handlers are in thrust/).

#include "kinds_host.hpp"
#include "method_kinds.hpp"
#include "runner.hpp"

#include <kvsift/attention/reference.hpp>
#include <kvsift/budget/pyramid.hpp>
#include <kvsift/score/cumulative_attention.hpp>
#include <kvsift/score/page_minmax.hpp>
#include <kvsift/score/window_attention.hpp>
#include <kvsift/select/page_topk.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/store/dense.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kvsift::conformance {

// Host arithmetic on every backend (kinds_host.hpp).
void budget_pyramidkv_kind(const case_data& c, outputs& out) {
  const int n = param(c, "n"), C = param(c, "budget"), w = param(c, "window"),
            L = param(c, "layers"), beta = param(c, "beta");
  std::vector<std::int32_t> past, kept;
  for (int l = 0; l < L; ++l) {
    past.push_back(kvsift::budget::pyramid_past_budget(n, C, w, l, L, beta));
    kept.push_back(n < C ? n : past.back() + w);
  }
  out.put_i32("past_budget", {L}, std::move(past));
  out.put_i32("kept_count", {L}, std::move(kept));
}

}  // namespace kvsift::conformance

namespace {
namespace kc = kvsift::conformance;
using kvsift::kv_view;
using kvsift::model_shape;
using kvsift::nhd;
using store_t = kvsift::store::dense<float>;
using host = kc::method_kinds::host_backend;

using kc::dim;
using kc::head_major;
using kc::param;


// Query h of a [Hq, nq, d] tensor, or of layer l of a [L, Hq, nq, d] one.
kv_view<const float, nhd> queries_of(const kc::tensor& q, int layer = 0) {
  const bool layered = q.rank() == 4;
  const int hq = dim(q, layered ? 1 : 0), nq = dim(q, layered ? 2 : 1), d = dim(q, layered ? 3 : 2);
  return head_major(q.f32.data() + static_cast<std::size_t>(layer) * hq * nq * d, hq, nq, d);
}
kv_view<const float, nhd> kv_of(const kc::tensor& kv, int layer = 0) {
  const bool layered = kv.rank() == 4;
  const int h = dim(kv, layered ? 1 : 0), n = dim(kv, layered ? 2 : 1), d = dim(kv, layered ? 3 : 2);
  return head_major(kv.f32.data() + static_cast<std::size_t>(layer) * h * n * d, h, n, d);
}

kvsift::index_sets csr(const kc::tensor& values, const kc::tensor& offsets) {
  kvsift::index_sets s;
  s.values = values.i32;
  s.offsets = offsets.i32;
  return s;
}

// A store holding one layer's keys [H, n, d] (values zero: the kind reads only keys).
store_t make_store(const kc::tensor& keys, int q_heads, int capacity, int layers = 1,
                   int layer = 0) {
  const int h = dim(keys, 0), n = dim(keys, 1), d = dim(keys, 2);
  store_t st(model_shape{layers, q_heads, h, d}, 1, std::max(capacity, 1));
  if (n > 0) {
    const std::vector<float> zeros(keys.f32.size(), 0.0f);
    st.append(0, layer, head_major(keys.f32.data(), h, n, d), head_major(zeros.data(), h, n, d), 0);
  }
  return st;
}

// ---- attention -------------------------------------------------------------------------------

const kc::registrar attention_decode{
    "attention.decode", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("queries");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), nq = dim(q, 1), d = dim(q, 2), n = dim(k, 1);
      kvsift::require(hq == param(c, "G") * dim(k, 0), "attention.decode", "G", param(c, "G"),
                      "q_heads / kv_heads");
      kvsift::index_sets kept;
      const bool sparse = c.has_input("kept");
      if (sparse) kept = csr(c.in("kept"), c.in("kept_offsets"));
      std::vector<float> o(static_cast<std::size_t>(nq) * hq * d);
      std::vector<float> w(static_cast<std::size_t>(hq) * nq * n);
      kvsift::attention::causal(queries_of(q), n - nq, kv_of(k), kv_of(c.in("values")), o.data(),
                                w.data(), sparse ? &kept : nullptr);
      std::vector<float> o_hq(o.size());  // [nq, Hq, d] -> [Hq, nq, d]
      for (int h = 0; h < hq; ++h) {
        for (int i = 0; i < nq; ++i) {
          std::copy_n(o.data() + (static_cast<std::size_t>(i) * hq + h) * d, d,
                      o_hq.data() + (static_cast<std::size_t>(h) * nq + i) * d);
        }
      }
      out.put_f32("weights", {hq, nq, n}, std::move(w));
      out.put_f32("out", {hq, nq, d}, std::move(o_hq));
    }};

// ---- select.topk -----------------------------------------------------------------------------

const kc::registrar select_topk{
    "select.topk", [](const kc::case_data& c, kc::outputs& out) {
      const auto& sc = c.in("scores");
      const int rows = dim(sc, 0), n = dim(sc, 1);
      kvsift::score_sets scores;
      for (int r = 0; r < rows; ++r) {
        scores.push_back(std::span<const float>(sc.f32.data() + static_cast<std::size_t>(r) * n,
                                                static_cast<std::size_t>(n)));
      }
      const kvsift::select::topk sel{{.sink = param(c, "sink"), .window = param(c, "window")}};
      const std::vector<int> budgets(static_cast<std::size_t>(rows), param(c, "budget"));
      kvsift::index_sets kept;
      sel.select(scores, budgets, kept);
      out.put_i32("kept", {rows, rows == 0 ? 0 : kept.size(0)}, kept.values);
    }};

// ---- SnapKV / PyramidKV ------------------------------------------------------------------------

kvsift::score::window_attention::params snap_scorer_params(const kc::case_data& c, int kernel) {
  return {.window = param(c, "window"),
          .kernel = kernel,
          .pool = kvsift::parse_pooling(c.param_s("pooling")),
          .gqa = kvsift::parse_gqa_reduce(c.param_s("gqa"))};
}

const kc::registrar score_snapkv{
    "score.snapkv", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("queries");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), w = dim(q, 1), d = dim(q, 2), h = dim(k, 0), n = dim(k, 1);
      const int G = hq / h;
      const int past = n - w;
      const auto qv = queries_of(q);
      const std::int32_t qpos = n - w;
      const int request = 0;
      // scores: the scorer as a method runs it.
      {
        store_t st = make_store(k, hq, n);
        kvsift::score_input<store_t> in{&st, 0, kvsift::lifecycle_event::prefill_end,
                                        {&request, 1}, {&qv, 1}, {&qpos, 1}, {}};
        kvsift::score::window_attention sc{snap_scorer_params(c, param(c, "kernel"))};
        kvsift::score_sets s;
        sc.score(in, s);
        std::vector<float> v;
        for (int hh = 0; hh < h; ++hh) v.insert(v.end(), s[hh].begin(), s[hh].begin() + past);
        out.put_f32("scores", {h, past}, std::move(v));
      }
      // window_mean: the same scorer, unpooled (kernel 1), per query head (MHA layout: query
      // head hq gets its own copy of KV head hq / G).
      {
        kc::tensor kq{"f32", {hq, n, d}, {}, {}};
        for (int x = 0; x < hq; ++x) {
          const float* src = k.f32.data() + static_cast<std::size_t>(x / G) * n * d;
          kq.f32.insert(kq.f32.end(), src, src + static_cast<std::size_t>(n) * d);
        }
        store_t st = make_store(kq, hq, n);
        kvsift::score_input<store_t> in{&st, 0, kvsift::lifecycle_event::prefill_end,
                                        {&request, 1}, {&qv, 1}, {&qpos, 1}, {}};
        kvsift::score::window_attention sc{snap_scorer_params(c, 1)};
        kvsift::score_sets s;
        sc.score(in, s);
        std::vector<float> v;
        for (int x = 0; x < hq; ++x) v.insert(v.end(), s[x].begin(), s[x].begin() + past);
        out.put_f32("window_mean", {hq, past}, std::move(v));
      }
    }};

const kc::registrar method_snapkv_prefill{"method.snapkv.prefill",
                                          kc::method_kinds::snapkv_prefill<host>};

const kc::registrar budget_pyramidkv{"budget.pyramidkv", kc::budget_pyramidkv_kind};

const kc::registrar method_pyramidkv_prefill{"method.pyramidkv.prefill",
                                             kc::method_kinds::pyramidkv_prefill<host>};

// ---- H2O ----------------------------------------------------------------------------------------

const kc::registrar score_h2o_prefill{
    "score.h2o_prefill", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("queries");
      const auto& k = c.in("keys");
      const int h = dim(k, 0), n = dim(k, 1);
      store_t st = make_store(k, dim(q, 0), n);
      const auto qv = queries_of(q);
      const std::int32_t qpos = n - dim(q, 1);
      const int request = 0;
      kvsift::score_input<store_t> in{&st, 0, kvsift::lifecycle_event::prefill_end,
                                      {&request, 1}, {&qv, 1}, {&qpos, 1}, {}};
      kvsift::score::cumulative_attention sc{{.gqa = kvsift::parse_gqa_reduce(c.param_s("gqa"))}};
      kvsift::score_sets s;
      sc.score(in, s);
      out.put_f32("scores", {h, n}, s.values);
    }};

const kc::registrar method_h2o_prefill{"method.h2o.prefill", kc::method_kinds::h2o_prefill<host>};

// ---- StreamingLLM -------------------------------------------------------------------------------

const kc::registrar method_streaming_llm_prefill{"method.streaming_llm.prefill",
                                                 kc::method_kinds::streaming_llm_prefill<host>};

// ---- Quest ----------------------------------------------------------------------------------------

const kc::registrar score_quest_pages{
    "score.quest_pages", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("query");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int ps = param(c, "page_size");
      const int P = (n + ps - 1) / ps;
      store_t st = make_store(k, hq, n);
      std::vector<float> kmin(static_cast<std::size_t>(h) * P * d), kmax(kmin.size());
      for (int hh = 0; hh < h; ++hh) {
        const std::size_t at = static_cast<std::size_t>(hh) * P * d;
        kvsift::cpu::page_digest(st, st.shape().sequence(0, 0, hh), ps,
                                 std::span<float>(kmin).subspan(at, static_cast<std::size_t>(P) * d),
                                 std::span<float>(kmax).subspan(at, static_cast<std::size_t>(P) * d));
      }
      out.put_f32("page_min", {h, P, d}, std::move(kmin));
      out.put_f32("page_max", {h, P, d}, std::move(kmax));
      const auto qv = queries_of(q);
      const std::int32_t qpos = n - 1;
      const int request = 0;
      kvsift::score_input<store_t> in{&st, 0, kvsift::lifecycle_event::decode_step,
                                      {&request, 1}, {&qv, 1}, {&qpos, 1}, {}};
      kvsift::score::page_minmax sc{{.page_size = ps, .gqa = kvsift::gqa_reduce::max}};
      kvsift::score_sets per_q, per_kv;
      sc.score_per_query_head(in, per_q);
      sc.score(in, per_kv);
      out.put_f32("page_scores", {hq, P}, per_q.values);
      out.put_f32("page_scores_kv", {h, P}, per_kv.values);
    }};

// method.quest.select, gqa "per_query_head": Quest's per-query-head option, one page set per query
// head, scored without reduction (the components: no composition runs it).
void quest_per_query_head(const kc::case_data& c, kc::outputs& out) {
  const auto& q = c.in("query");
  const auto& k = c.in("keys");
  const int hq = dim(q, 0), n = dim(k, 1);
  const int B = param(c, "budget"), ps = param(c, "page_size");
  const int layer = param(c, "layer"), dense = param(c, "dense_layers");
  store_t st = make_store(k, hq, n, layer + 1, layer);
  const auto qv = queries_of(q);
  const std::int32_t qpos = n - 1;
  const int request = 0;
  kvsift::score_input<store_t> in{&st, layer, kvsift::lifecycle_event::decode_step,
                                  {&request, 1}, {&qv, 1}, {&qpos, 1}, {}};
  kvsift::score::page_minmax sc{{.page_size = ps, .gqa = kvsift::gqa_reduce::max}};
  kvsift::score_sets scores;
  sc.score_per_query_head(in, scores);
  const kvsift::select::page_topk sel{{.page_size = ps, .min_pages = 3}};
  const int budget = layer < dense ? std::numeric_limits<int>::max() : B;
  const std::vector<int> budgets(static_cast<std::size_t>(hq), budget);
  kvsift::index_sets pages;
  sel.select(scores, budgets, pages);
  out.put_i32("pages", {hq, pages.size(0)}, pages.values);
}

const kc::registrar method_quest_select{
    "method.quest.select", [](const kc::case_data& c, kc::outputs& out) {
      kc::method_kinds::quest_select<host>(c, out, quest_per_query_head);
    }};

// ---- decode lifecycles ---------------------------------------------------------------------------

const kc::registrar method_streaming_llm_decode{"method.streaming_llm.decode",
                                                kc::method_kinds::streaming_llm_decode<host>};
const kc::registrar method_h2o_decode{"method.h2o.decode", kc::method_kinds::h2o_decode<host>};
const kc::registrar method_quest_decode{"method.quest.decode", kc::method_kinds::quest_decode<host>};

}  // namespace
