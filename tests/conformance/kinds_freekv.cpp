// SPDX-License-Identifier: Apache-2.0
// FreeKV's kinds (SPEC.md §5): score.freekv_pages, method.freekv.select, trigger.query_cosine
// call the components (score::freekv_pages, select::freekv_pages, trigger::query_cosine) on a
// store::dense; method.freekv.decode runs FreeKV's recipe over a store::tiered (its asynchronous
// transfer inside), the way an engine would: the handler body of two_tier_kinds.hpp on the host
// backend.

#include "runner.hpp"
#include "two_tier_kinds.hpp"

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

const kc::registrar method_freekv_decode{
    "method.freekv.decode", kc::two_tier_kinds::freekv_decode<kc::method_kinds::host_backend>};

}  // namespace
