// SPDX-License-Identifier: Apache-2.0
// FreeKV's kinds (SPEC.md §5): score.freekv_pages, method.freekv.select, trigger.query_cosine
// call the components (score::freekv_pages, select::freekv_pages, trigger::query_cosine) on a
// store::dense; method.freekv.decode runs kvsift::freekv over a store::tiered with an
// asynchronous transfer, the way an engine would.

#include "runner.hpp"

#include <kvsift/method/freekv.hpp>
#include <kvsift/score/freekv_pages.hpp>
#include <kvsift/select/freekv_pages.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/trigger/query_cosine.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {
namespace kc = kvsift::conformance;
using kvsift::kv_view;
using kvsift::model_shape;
using kvsift::nhd;
using store_t = kvsift::store::dense<float>;
using kc::dim;
using kc::head_major;
using kc::param;

// A store holding one layer's keys [H, n, d] (values zero: the kinds read only keys).
store_t key_store(const kc::tensor& keys, int q_heads) {
  const int h = dim(keys, 0), n = dim(keys, 1), d = dim(keys, 2);
  store_t st(model_shape{1, q_heads, h, d}, 1, std::max(n, 1));
  if (n > 0) {
    const std::vector<float> zeros(keys.f32.size(), 0.0f);
    st.append(0, 0, head_major(keys.f32.data(), h, n, d), head_major(zeros.data(), h, n, d), 0);
  }
  return st;
}

kvsift::score::freekv_pages scorer_of(const kc::case_data& c) {
  return kvsift::score::freekv_pages{{.page_size = param(c, "page_size"),
                                      .sink = param(c, "sink"),
                                      .window = param(c, "window"),
                                      .merge = kvsift::score::parse_freekv_merge(c.param_s("merge"))}};
}

// The scorer's group scores for the case's query (one query per query head) over the keys.
struct scored {
  store_t st;
  kvsift::score_sets group, bounds;
};

scored score_case(const kc::case_data& c) {
  const auto& q = c.in("query");
  const auto& k = c.in("keys");
  const int hq = dim(q, 0), d = dim(q, 2);
  scored r{key_store(k, hq), {}, {}};
  const auto qv = head_major(q.f32.data(), hq, dim(q, 1), d);
  const std::int32_t qpos = dim(k, 1) - 1;
  const int request = 0;
  kvsift::score_input<store_t> in{&r.st, 0, kvsift::lifecycle_event::decode_step,
                                  {&request, 1}, {&qv, 1}, {&qpos, 1}, {}};
  const auto sc = scorer_of(c);
  sc.score(in, r.group);
  sc.bounds(in, r.bounds);
  return r;
}

const kc::registrar score_freekv_pages{
    "score.freekv_pages", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("query");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), h = dim(k, 0), n = dim(k, 1);
      const auto sc = scorer_of(c);
      sc.validate("score.freekv_pages");
      const auto lay = sc.layout(n);
      const auto r = score_case(c);
      std::vector<std::int32_t> cand;
      for (int pg = lay.candidates_first; pg < lay.candidates_last; ++pg) cand.push_back(pg);
      out.put_i32("candidates", {lay.candidates()}, cand);
      out.put_f32("page_scores", {hq, lay.pages}, r.bounds.values);
      std::vector<float> group;
      for (int s = 0; s < h; ++s) {
        const auto seg = r.group[s];
        group.insert(group.end(), seg.begin() + lay.candidates_first,
                     seg.begin() + lay.candidates_last);
      }
      out.put_f32("group_scores", {h, lay.candidates()}, std::move(group));
    }};

const kc::registrar method_freekv_select{
    "method.freekv.select", [](const kc::case_data& c, kc::outputs& out) {
      const int h = dim(c.in("keys"), 0);
      const int layer = param(c, "layer"), dense = param(c, "dense_layers");
      const kvsift::select::freekv_pages sel{{.page_size = param(c, "page_size"),
                                              .sink = param(c, "sink"),
                                              .window = param(c, "window")}};
      const auto r = score_case(c);
      const int B = param(c, "budget");
      sel.validate_budget("method.freekv.select", "budget", B);
      // a dense layer keeps every page: the largest whole-page budget
      const int budget = layer < dense ? std::numeric_limits<int>::max() / sel.p.page_size * sel.p.page_size : B;
      const std::vector<int> budgets(static_cast<std::size_t>(h), budget);
      kvsift::index_sets pages;
      sel.select(r.group, budgets, pages);
      out.put_i32("pages", {h, pages.size(0)}, pages.values);
    }};

const kc::registrar trigger_query_cosine{
    "trigger.query_cosine", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("query");
      const auto& prev = c.in("prev_query");
      const int hq = dim(q, 0), d = dim(q, 2), G = param(c, "G");
      if (G <= 0 || hq % G != 0) {
        throw kc::runner_error("G " + std::to_string(G) + " does not divide the query heads " +
                               std::to_string(hq));
      }
      const int h = hq / G;
      kvsift::trigger::query_cosine trig({.tau = c.param_d("tau")});
      std::vector<float> cos(static_cast<std::size_t>(h));
      std::vector<std::int32_t> correct(static_cast<std::size_t>(h));
      for (int kv = 0; kv < h; ++kv) {
        const std::size_t at = static_cast<std::size_t>(kv) * G * d;
        // the stateful path, as the method uses it: observe q_{t-1}, then q_t
        const auto none = trig.observe(kv, prev.f32.data() + at, G, d);
        if (!none.first) throw kc::runner_error("a first observation compared with something");
        const auto dec = trig.observe(kv, q.f32.data() + at, G, d);
        cos[kv] = dec.cos_mean;
        correct[kv] = dec.correct ? 1 : 0;
      }
      out.put_f32("cos_mean", {h}, std::move(cos));
      out.put_i32("correct", {h}, std::move(correct));
    }};

void put_csr(kc::outputs& out, const std::string& name, const kvsift::index_sets& sets) {
  out.put_i32(name, {static_cast<std::int64_t>(sets.values.size())}, sets.values);
  out.put_i32(name + "_offsets", {static_cast<std::int64_t>(sets.offsets.size())}, sets.offsets);
}

const kc::registrar method_freekv_decode{
    "method.freekv.decode", [](const kc::case_data& c, kc::outputs& out) {
      const auto& k = c.in("keys");
      const auto& v = c.in("values");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int T = dim(sq, 0), hq = dim(sq, 1);
      const int layer = param(c, "layer"), ps = param(c, "page_size");
      kvsift::store::tiered<float> st(model_shape{layer + 1, hq, h, d}, 1, n + T, ps);
      kvsift::freekv<float> m(st, {.page_size = ps,
                                   .budget = param(c, "budget"),
                                   .sink = param(c, "sink"),
                                   .window = param(c, "window"),
                                   .tau = c.param_d("tau"),
                                   .merge = kvsift::score::parse_freekv_merge(c.param_s("merge")),
                                   .dense_layers = param(c, "dense_layers")});
      m.prefill(layer, kvsift::prefill_chunk<float>{.request = 0,
                                                    .keys = head_major(k.f32.data(), h, n, d),
                                                    .values = head_major(v.f32.data(), h, n, d),
                                                    .queries = {},
                                                    .first_position = 0,
                                                    .last = true});
      kvsift::index_sets plan, pages;
      std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
      std::vector<std::int32_t> correct;
      for (int t = 0; t < T; ++t) {
        const kvsift::decode_token<float> tok{
            0, sq.f32.data() + static_cast<std::size_t>(t) * hq * d,
            sk.f32.data() + static_cast<std::size_t>(t) * h * d,
            sv.f32.data() + static_cast<std::size_t>(t) * h * d};
        const auto& pl = m.decode(layer, tok);
        for (int hh = 0; hh < h; ++hh) {
          plan.push_back(pl.positions[hh]);
          pages.push_back(pl.pages[hh]);
          correct.push_back(m.corrections()[hh]);
        }
        m.attend(layer, std::span<const kvsift::decode_token<float>>(&tok, 1),
                 o.data() + static_cast<std::size_t>(t) * hq * d);
        m.after_attention(layer, tok);
        st.verify();
      }
      put_csr(out, "plan", plan);
      out.put_f32("out", {T, hq, d}, std::move(o));
      put_csr(out, "pages", pages);
      out.put_i32("correct", {T, h}, std::move(correct));
    }};

}  // namespace
