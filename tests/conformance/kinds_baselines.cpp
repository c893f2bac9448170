// SPDX-License-Identifier: Apache-2.0
// The foundation kinds (SPEC.md §5): reference attention, the top-k selector, and the baselines
// StreamingLLM, H2O, SnapKV, PyramidKV and Quest, each through the library's public API the way
// an engine would use it: a store::dense<float> of the case's shape, the named method from
// method/baselines.hpp, prefill(layer, chunk), then decode / attend / after_attention per step.
// Component kinds (score.*, select.topk, budget.pyramidkv) call the component directly.

#include "kinds_host.hpp"
#include "runner.hpp"

#include <kvsift/attention/reference.hpp>
#include <kvsift/budget/pyramid.hpp>
#include <kvsift/method/baselines.hpp>
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

// Kept original positions of every KV head of `layer`, as a dense [H, k] tensor (every head must
// keep the same count) or appended to a CSR family.
std::vector<std::int32_t> kept_positions(const store_t& st, int layer, std::int64_t& per_head) {
  const auto& sh = st.shape();
  std::vector<std::int32_t> out;
  per_head = st.length(sh.sequence(0, layer, 0));
  for (int h = 0; h < sh.kv_heads; ++h) {
    const auto seq = sh.sequence(0, layer, h);
    if (st.length(seq) != per_head) {
      throw kc::runner_error("KV heads keep different counts: " + std::to_string(per_head) +
                             " vs " + std::to_string(st.length(seq)));
    }
    for (int i = 0; i < st.length(seq); ++i) out.push_back(st.position(seq, i));
  }
  return out;
}

// Prefills layer 0 of request 0 with the case's keys and prefill queries in one last chunk.
// Prefill kinds check kept sets only, so the values are zeros.
template <class Method>
void prefill_keys(Method& m, const kc::tensor& k, const kc::tensor& q) {
  const int n = dim(k, 1);
  const std::vector<float> zeros(k.f32.size(), 0.0f);
  m.prefill(0, kvsift::prefill_chunk<float>{.request = 0,
                                            .keys = kv_of(k),
                                            .values = head_major(zeros.data(), dim(k, 0), n,
                                                                 dim(k, 2)),
                                            .queries = queries_of(q),
                                            .first_position = 0,
                                            .last = true});
}

void put_kept(const store_t& st, int layer, kc::outputs& out) {
  std::int64_t k = 0;
  auto kept = kept_positions(st, layer, k);
  out.put_i32("kept", {st.shape().kv_heads, k}, std::move(kept));
}

void put_csr(kc::outputs& out, const std::string& name, const kvsift::index_sets& sets) {
  out.put_i32(name, {static_cast<std::int64_t>(sets.values.size())}, sets.values);
  out.put_i32(name + "_offsets", {static_cast<std::int64_t>(sets.offsets.size())}, sets.offsets);
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

const kc::registrar method_snapkv_prefill{
    "method.snapkv.prefill", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("queries");
      const auto& k = c.in("keys");
      const int n = dim(k, 1);
      store_t st(model_shape{1, dim(q, 0), dim(k, 0), dim(k, 2)}, 1, n);
      auto p = kvsift::snapkv_params<store_t>(
          param(c, "budget"), param(c, "window"), param(c, "kernel"),
          kvsift::parse_pooling(c.param_s("pooling")), kvsift::parse_gqa_reduce(c.param_s("gqa")));
      kvsift::snapkv<store_t> m(st, p);
      prefill_keys(m, k, q);  // only the window's queries: the chunk's newest ones
      put_kept(st, 0, out);
    }};

const kc::registrar budget_pyramidkv{"budget.pyramidkv", kc::budget_pyramidkv_kind};

const kc::registrar method_pyramidkv_prefill{
    "method.pyramidkv.prefill", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("queries");
      const auto& k = c.in("keys");
      const int L = dim(k, 0), h = dim(k, 1), n = dim(k, 2), d = dim(k, 3);
      const int w = param(c, "window");
      store_t st(model_shape{L, dim(q, 1), h, d}, 1, n);
      auto p = kvsift::pyramidkv_params<store_t>(param(c, "budget"), w, param(c, "kernel"),
                                                 param(c, "beta"));
      p.scorer.pool = kvsift::parse_pooling(c.param_s("pooling"));
      p.scorer.gqa = kvsift::parse_gqa_reduce(c.param_s("gqa"));
      kvsift::pyramidkv<store_t> m(st, p);
      const std::vector<float> zeros(static_cast<std::size_t>(h) * n * d, 0.0f);
      kvsift::index_sets kept;
      std::vector<std::int32_t> past;
      for (int l = 0; l < L; ++l) {
        m.prefill(l, kvsift::prefill_chunk<float>{.request = 0,
                                                  .keys = kv_of(k, l),
                                                  .values = head_major(zeros.data(), h, n, d),
                                                  .queries = queries_of(q, l),
                                                  .first_position = 0,
                                                  .last = true});
        std::int64_t per_head = 0;
        const auto pos = kept_positions(st, l, per_head);
        for (int hh = 0; hh < h; ++hh) {
          kept.push_back(std::span<const std::int32_t>(pos.data() + hh * per_head,
                                                       static_cast<std::size_t>(per_head)));
        }
        past.push_back(static_cast<std::int32_t>(per_head) - std::min(w, n));
      }
      out.put_i32("past_budget", {L}, std::move(past));
      put_csr(out, "kept", kept);
    }};

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

const kc::registrar method_h2o_prefill{
    "method.h2o.prefill", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("queries");
      const auto& k = c.in("keys");
      const int n = dim(k, 1);
      store_t st(model_shape{1, dim(q, 0), dim(k, 0), dim(k, 2)}, 1, n);
      kvsift::h2o<store_t> m(st, kvsift::h2o_params<store_t>(
                                     param(c, "budget"), kvsift::parse_gqa_reduce(c.param_s("gqa"))));
      prefill_keys(m, k, q);
      put_kept(st, 0, out);
    }};

// ---- StreamingLLM -------------------------------------------------------------------------------

const kc::registrar method_streaming_llm_prefill{
    "method.streaming_llm.prefill", [](const kc::case_data& c, kc::outputs& out) {
      const int n = param(c, "n");
      store_t st(model_shape{1, 1, 1, 1}, 1, n);  // the kept set does not depend on KV
      kvsift::streaming_llm<store_t> m(
          st, kvsift::streaming_llm_params<store_t>(param(c, "budget"), param(c, "sink")));
      const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
      const auto kv = kv_view<const float, nhd>::contiguous(zeros.data(), n, 1, 1);
      m.prefill(0, kvsift::prefill_chunk<float>{.request = 0, .keys = kv, .values = kv,
                                                .queries = {}, .first_position = 0, .last = true});
      std::int64_t k = 0;
      auto kept = kept_positions(st, 0, k);
      out.put_i32("kept", {k}, std::move(kept));
    }};

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

const kc::registrar method_quest_select{
    "method.quest.select", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("query");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int B = param(c, "budget"), ps = param(c, "page_size");
      const int layer = param(c, "layer"), dense = param(c, "dense_layers");
      const std::string gqa = c.param_s("gqa");
      if (gqa == "per_query_head") {
        // Quest's per-query-head option: one page set per query head, scored without reduction.
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
        return;
      }
      kvsift::require(gqa == "max", "method.quest.select", "gqa", gqa, "\"max\" or \"per_query_head\"");
      // The selection of a decode step whose token is the case's last key: the method prefills
      // the first n - 1 tokens (no queries: Quest scores nothing at prefill), then decodes.
      store_t st(model_shape{layer + 1, hq, h, d}, 1, n);
      kvsift::quest<store_t> m(st, kvsift::quest_params<store_t>(B, ps, dense));
      const std::vector<float> zeros(static_cast<std::size_t>(h) * n * d, 0.0f);
      if (n > 1) {
        const auto head = kv_of(k).slice(0, n - 1);
        m.prefill(layer, kvsift::prefill_chunk<float>{
                             .request = 0,
                             .keys = head,
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
      const auto& plan = m.decode(layer, kvsift::decode_token<float>{0, q.f32.data(),
                                                                     last_key.data(), zeros.data()});
      out.put_i32("pages", {h, plan.pages.size(0)}, plan.pages.values);
    }};

// ---- decode lifecycles ---------------------------------------------------------------------------

// Runs T decode steps of a method on `layer`, collecting plan, out (and pages, evicted).
template <class Method>
void run_decode(const kc::case_data& c, Method& m, store_t& st, int layer, kc::outputs& out,
                bool pages, bool evicted) {
  const auto& sq = c.in("step_queries");
  const auto& sk = c.in("step_keys");
  const auto& sv = c.in("step_values");
  const int T = dim(sq, 0), hq = dim(sq, 1), d = dim(sq, 2), h = dim(sk, 1);
  const auto& sh = st.shape();
  kvsift::index_sets plan_sets, page_sets;
  std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
  std::vector<std::int32_t> ev;
  for (int t = 0; t < T; ++t) {
    const kvsift::decode_token<float> tok{
        0, sq.f32.data() + static_cast<std::size_t>(t) * hq * d,
        sk.f32.data() + static_cast<std::size_t>(t) * h * d,
        sv.f32.data() + static_cast<std::size_t>(t) * h * d};
    const auto& plan = m.decode(layer, tok);
    for (int hh = 0; hh < h; ++hh) {
      plan_sets.push_back(plan.positions[hh]);
      if (pages) page_sets.push_back(plan.pages[hh]);
    }
    m.attend(layer, std::span<const kvsift::decode_token<float>>(&tok, 1),
             o.data() + static_cast<std::size_t>(t) * hq * d);
    std::vector<std::vector<std::int32_t>> before(static_cast<std::size_t>(h));
    for (int hh = 0; hh < h; ++hh) {
      const auto seq = sh.sequence(0, layer, hh);
      for (int i = 0; i < st.length(seq); ++i) before[hh].push_back(st.position(seq, i));
    }
    m.after_attention(layer, tok);
    for (int hh = 0; hh < h; ++hh) {  // the position that disappeared, if any
      const auto seq = sh.sequence(0, layer, hh);
      std::vector<std::int32_t> after;
      for (int i = 0; i < st.length(seq); ++i) after.push_back(st.position(seq, i));
      std::vector<std::int32_t> gone;
      std::set_difference(before[hh].begin(), before[hh].end(), after.begin(), after.end(),
                          std::back_inserter(gone));
      if (gone.size() > 1) {
        throw kc::runner_error("step " + std::to_string(t + 1) + " evicted " +
                               std::to_string(gone.size()) + " tokens of head " +
                               std::to_string(hh));
      }
      ev.push_back(gone.empty() ? -1 : gone[0]);
    }
  }
  put_csr(out, "plan", plan_sets);
  out.put_f32("out", {T, hq, d}, std::move(o));
  if (pages) put_csr(out, "pages", page_sets);
  if (evicted) out.put_i32("evicted", {T, h}, std::move(ev));
}

// A store for the prefill keys/values plus T decode steps, on `layer` of `layer + 1` layers.
store_t decode_store(const kc::case_data& c, int layer) {
  const auto& k = c.in("keys");
  const auto& sq = c.in("step_queries");
  return store_t(model_shape{layer + 1, dim(sq, 1), dim(k, 0), dim(k, 2)}, 1,
                 dim(k, 1) + dim(sq, 0));
}

kvsift::prefill_chunk<float> prompt(const kc::case_data& c, kv_view<const float, nhd> queries) {
  return {.request = 0, .keys = kv_of(c.in("keys")), .values = kv_of(c.in("values")),
          .queries = queries, .first_position = 0, .last = true};
}

const kc::registrar method_streaming_llm_decode{
    "method.streaming_llm.decode", [](const kc::case_data& c, kc::outputs& out) {
      store_t st = decode_store(c, 0);
      kvsift::streaming_llm<store_t> m(
          st, kvsift::streaming_llm_params<store_t>(param(c, "budget"), param(c, "sink")));
      m.prefill(0, prompt(c, {}));
      run_decode(c, m, st, 0, out, false, false);
    }};

const kc::registrar method_h2o_decode{
    "method.h2o.decode", [](const kc::case_data& c, kc::outputs& out) {
      store_t st = decode_store(c, 0);
      kvsift::h2o<store_t> m(st, kvsift::h2o_params<store_t>(
                                     param(c, "budget"), kvsift::parse_gqa_reduce(c.param_s("gqa"))));
      m.prefill(0, prompt(c, queries_of(c.in("queries"))));
      run_decode(c, m, st, 0, out, false, true);
    }};

const kc::registrar method_quest_decode{
    "method.quest.decode", [](const kc::case_data& c, kc::outputs& out) {
      kvsift::require(c.param_s("gqa") == "max", "method.quest.decode", "gqa", c.param_s("gqa"),
                      "\"max\"");
      const int layer = param(c, "layer");
      store_t st = decode_store(c, layer);
      kvsift::quest<store_t> m(st, kvsift::quest_params<store_t>(
                                       param(c, "budget"), param(c, "page_size"),
                                       param(c, "dense_layers")));
      m.prefill(layer, prompt(c, {}));  // Quest needs no prefill queries
      run_decode(c, m, st, layer, out, true, false);
    }};

}  // namespace
