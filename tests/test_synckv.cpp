// SPDX-License-Identifier: Apache-2.0
// SyncKV (Zhou et al., 2025) laws over store::tiered + transfer::async: the follower budget and
// its k < 0 error, the static/dynamic split, the plan of every head at every step (R-heads read
// everything, followers static ∪ dynamic ∪ decode tokens), resident KV against M, attention
// outputs against a reference over the original rows (recalled rows are the right data), a recall
// still in flight when the next layer's step runs (the next decode waits: a stall, same result),
// a ragged batch of two equal to two single runs, reset with a recall pending, bad roles.
// The exact sets are pinned by the conformance vectors (method.synckv.decode).

#include "request_tokens.hpp"

#include <kvsift/budget/synckv.hpp>
#include <kvsift/method/synckv.hpp>
#include <kvsift/select/shared_by_cluster.hpp>
#include <kvsift/select/static_dynamic.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <thread>
#include <vector>

namespace {

using kvsift::model_shape;
using method_t = kvsift::synckv<float>;
using store_t = kvsift::store::tiered<float>;

using kvsift_test::make_tokens;
using kvsift_test::tokens;

std::vector<kvsift::select::cluster_roles> two_layer_roles() {
  return {{{0, 0, 1, 1}, {0, 3}}, {{1, 0, 0, 1}, {2, 0}}};
}

method_t::params params_of(double m, std::vector<kvsift::select::cluster_roles> roles) {
  return {.clusters = static_cast<int>(roles.front().representatives.size()), .stride = 5,
          .rho = 0.5, .memory_fraction = m, .roles = std::move(roles)};
}

template <class M>
void prefill(M& m, const tokens& x, int request) {
  for (int l = 0; l < x.layers; ++l) {
    m.prefill(l, kvsift::prefill_chunk<float>{
                     .request = request,
                     .keys = kvsift::kv_view<const float, kvsift::nhd>::contiguous(
                         x.k.data() + x.kv_at(l, 0), x.n, x.hkv, x.d),
                     .values = kvsift::kv_view<const float, kvsift::nhd>::contiguous(
                         x.v.data() + x.kv_at(l, 0), x.n, x.hkv, x.d),
                     .queries = kvsift::kv_view<const float, kvsift::nhd>::contiguous(
                         x.q.data() + x.q_at(l, x.n - 1), 1, x.hq, x.d),
                     .first_position = 0,
                     .last = true});
  }
}

kvsift::decode_token<float> token_of(const tokens& x, int request, int l, int t /*1..T*/) {
  const int pos = x.n + t - 1;
  return {request, x.q.data() + x.q_at(l, pos), x.k.data() + x.kv_at(l, pos),
          x.v.data() + x.kv_at(l, pos)};
}

// softmax(q . k / sqrt(d)) over the listed positions of KV head h, applied to the values.
std::vector<float> reference(const tokens& x, int l, int t, int qh, std::span<const std::int32_t> pos) {
  const int G = x.hq / x.hkv, h = qh / G;
  const float* q = x.q.data() + x.q_at(l, x.n + t - 1) + static_cast<std::size_t>(qh) * x.d;
  std::vector<double> w(pos.size());
  double mx = -1e300;
  for (std::size_t i = 0; i < pos.size(); ++i) {
    const float* k = x.k.data() + x.kv_at(l, pos[i]) + static_cast<std::size_t>(h) * x.d;
    double s = 0;
    for (int c = 0; c < x.d; ++c) s += static_cast<double>(q[c]) * k[c];
    w[i] = s / std::sqrt(static_cast<double>(x.d));
    mx = std::max(mx, w[i]);
  }
  double z = 0;
  for (auto& e : w) z += (e = std::exp(e - mx));
  std::vector<float> out(static_cast<std::size_t>(x.d), 0.0f);
  for (int c = 0; c < x.d; ++c) {
    double acc = 0;
    for (std::size_t i = 0; i < pos.size(); ++i) {
      acc += w[i] / z * x.v[x.kv_at(l, pos[i]) + static_cast<std::size_t>(h) * x.d + c];
    }
    out[c] = static_cast<float>(acc);
  }
  return out;
}

// What one request's decode produced: per step, layer and head its plan; per step and layer the
// attention output [q_heads, d].
struct trace {
  std::vector<std::vector<std::int32_t>> plans;
  std::vector<std::vector<float>> outs;
};

void record(trace& tr, const kvsift::attention_plan& plan, int slot, int hkv) {
  for (int h = 0; h < hkv; ++h) {
    const auto p = plan.positions[slot * hkv + h];
    tr.plans.emplace_back(p.begin(), p.end());
  }
}

trace run_single(const tokens& x, double mf, unsigned /*tag*/ = 0) {
  store_t st(model_shape{x.layers, x.hq, x.hkv, x.d}, 1, x.n + x.T);
  method_t m(st, params_of(mf, two_layer_roles()));
  prefill(m, x, 0);
  trace tr;
  for (int t = 1; t <= x.T; ++t) {
    for (int l = 0; l < x.layers; ++l) {
      const auto tok = token_of(x, 0, l, t);
      record(tr, m.decode(l, tok), 0, x.hkv);
      std::vector<float> o(static_cast<std::size_t>(x.hq) * x.d);
      m.attend(l, std::span(&tok, 1), o.data());
      tr.outs.push_back(o);
      m.after_attention(l, tok);
    }
  }
  return tr;
}

}  // namespace

TEST_CASE("budget::synckv: k, its split, and k < 0 names the smallest memory fraction", "[synckv]") {
  const auto s = kvsift::budget::synckv_budget(32, 4, 5000, 0.3, 0.5);
  CHECK(s.k == 1000);  // (9.6 - 4) * 5000 / 28
  CHECK(s.k_static == 500);
  CHECK(s.k_dynamic == 500);
  CHECK(kvsift::budget::synckv_budget(8, 2, 100, 1.0, 0.5).k == 100);  // M = 1 keeps everything
  CHECK(kvsift::budget::synckv_budget(8, 2, 100, 0.25, 0.5).k == 0);   // exactly N_R / N
  // N = 8, N_R = 2: fractions below 0.25 leave the followers a negative budget.
  CHECK_THROWS_WITH(kvsift::budget::synckv_budget(8, 2, 100, 0.2, 0.5),
                    Catch::Matchers::ContainsSubstring("memory_fraction") &&
                        Catch::Matchers::ContainsSubstring("N_R / N = 2 / 8 = 0.25"));
  CHECK_THROWS_AS(kvsift::budget::synckv_budget(8, 8, 100, 0.5, 0.5), kvsift::error);
  CHECK_THROWS_AS(kvsift::budget::synckv_budget(8, 2, 100, 1.5, 0.5), kvsift::error);
  // the method reports it at construction, before any store is touched
  store_t st(model_shape{2, 8, 4, 8}, 1, 64);
  CHECK_THROWS_WITH(method_t(st, params_of(0.4, two_layer_roles())),
                    Catch::Matchers::ContainsSubstring("N_R / N = 4 / 8 = 0.5"));
  CHECK(st.resident_tokens() == 0);
}

TEST_CASE("select::static_dynamic: static = top floor(rho k), dynamic = the next ranks", "[synckv]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (const int n : {0, 1, 9, 50}) {
    for (const int k : {0, 1, 7, 50, 80}) {
      kvsift::score_sets sc;
      std::vector<float> v(static_cast<std::size_t>(n));
      for (auto& e : v) e = u(rng);
      sc.push_back(v);
      kvsift::select::static_dynamic sel{{.rho = 0.3}};
      kvsift::index_sets st, dyn, kept;
      const int budget[] = {k};
      sel.split(sc, budget, st, dyn);
      sel.select(sc, budget, kept);
      const int kk = std::min(k, n);
      CAPTURE(n, k);
      CHECK(static_cast<int>(st[0].size()) == sel.static_count(kk));
      CHECK(static_cast<int>(st[0].size() + dyn[0].size()) == kk);
      CHECK(static_cast<int>(kept[0].size()) == kk);
      CHECK(std::is_sorted(st[0].begin(), st[0].end()));
      CHECK(std::is_sorted(dyn[0].begin(), dyn[0].end()));
      // every static score >= every dynamic score >= every dropped score
      float min_static = 2.0f, max_dyn = -1.0f, min_dyn = 2.0f, max_drop = -1.0f;
      for (const auto i : st[0]) min_static = std::min(min_static, v[i]);
      for (const auto i : dyn[0]) {
        max_dyn = std::max(max_dyn, v[i]);
        min_dyn = std::min(min_dyn, v[i]);
      }
      for (int i = 0; i < n; ++i) {
        if (!std::binary_search(kept[0].begin(), kept[0].end(), i)) max_drop = std::max(max_drop, v[i]);
      }
      CHECK((dyn[0].empty() || st[0].empty() || min_static >= max_dyn));
      CHECK((dyn[0].empty() || min_dyn >= max_drop));
      // refresh: the top k_dyn of [0, limit) outside the static set
      kvsift::index_sets fresh;
      const int limit[] = {n / 2};
      const int kd[] = {kk - sel.static_count(kk)};
      sel.refresh(sc, st, limit, kd, fresh);
      for (const auto i : fresh[0]) {
        CHECK(i < n / 2);
        CHECK_FALSE(std::binary_search(st[0].begin(), st[0].end(), i));
      }
    }
  }
}

TEST_CASE("select::shared_by_cluster: followers take their representative's selection", "[synckv]") {
  kvsift::select::shared_by_cluster<> sel{{.roles = {{1, 0, 0, 1}, {2, 0}}, .inner = {.rho = 0.5}}};
  kvsift::score_sets sc;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int h = 0; h < 8; ++h) {  // two requests x four heads
    std::vector<float> v(20);
    for (auto& e : v) e = u(rng);
    sc.push_back(v);
  }
  kvsift::index_sets kept;
  const std::vector<int> budgets(8, 6);
  sel.select(sc, budgets, kept);
  for (int r = 0; r < 2; ++r) {
    CHECK(kept.size(r * 4 + 0) == 20);  // R-head of cluster 1
    CHECK(kept.size(r * 4 + 2) == 20);  // R-head of cluster 0
    CHECK(std::ranges::equal(kept[r * 4 + 1], kept[r * 4 + 2]) == false);
    CHECK(kept.size(r * 4 + 1) == 6);
    CHECK(kept.size(r * 4 + 3) == 6);
  }
  kvsift::index_sets own, shared;
  kvsift::select::static_dynamic{{.rho = 0.5}}.select(sc, budgets, own);
  CHECK(std::ranges::equal(kept[1], own[2]));  // head 1 follows head 2
  CHECK(std::ranges::equal(kept[3], own[0]));  // head 3 follows head 0
  CHECK(std::ranges::equal(kept[7], own[4]));
  kvsift::select::shared_by_cluster<>::share(sel.p.roles, own, shared);
  CHECK(std::ranges::equal(shared[5], own[6]));
  CHECK_THROWS_AS((kvsift::select::cluster_roles{{0, 1, 1, 0}, {1, 0}}.validate("t", 4)), kvsift::error);
}

TEST_CASE("synckv: plans, resident KV and outputs at every step (GQA, two layers)", "[synckv]") {
  const int L = 2, n = 64, T = 12, hkv = 4, hq = 8, d = 16;
  const double mf = 0.75;  // N = 8, N_R = 4: k = floor((6 - 4) * 64 / 4) = 32
  const auto x = make_tokens(L, n, T, hkv, hq, d, 11);
  store_t st(model_shape{L, hq, hkv, d}, 1, n + T);
  method_t m(st, params_of(mf, two_layer_roles()));
  STATIC_REQUIRE(method_t::caps.needs_queries);
  prefill(m, x, 0);
  const auto split = m.split(n);
  REQUIRE(split.k == 32);
  REQUIRE(split.k_static == 16);
  // resident after prefill: N_R n + (N - N_R) k <= M N n
  CHECK(st.resident_tokens() == 4 * n + 4 * split.k);
  CHECK(static_cast<double>(st.resident_tokens()) <= mf * L * hkv * n);
  CHECK(st.host_tokens() == static_cast<std::int64_t>(L) * hkv * n);
  const auto roles = two_layer_roles();
  for (int t = 1; t <= T; ++t) {
    for (int l = 0; l < L; ++l) {
      const auto tok = token_of(x, 0, l, t);
      const auto& plan = m.decode(l, tok);
      for (int h = 0; h < hkv; ++h) {
        CAPTURE(t, l, h);
        const auto p = plan.positions[h];
        CHECK(std::is_sorted(p.begin(), p.end()));
        std::vector<std::int32_t> want;
        if (roles[l].is_representative(h)) {
          want.resize(static_cast<std::size_t>(n + t));
          std::iota(want.begin(), want.end(), 0);
        } else {
          const int c = roles[l].assign[h];
          const auto s = m.static_set(0, l, c);
          const auto dy = m.dynamic_set(0, l, c);
          CHECK(static_cast<int>(s.size()) == split.k_static);
          CHECK(static_cast<int>(s.size() + dy.size()) == split.k);
          std::set_union(s.begin(), s.end(), dy.begin(), dy.end(), std::back_inserter(want));
          CHECK(static_cast<int>(want.size()) == split.k);  // disjoint
          for (int j = n; j < n + t; ++j) want.push_back(j);
        }
        CHECK(std::ranges::equal(p, want));
      }
      std::vector<float> o(static_cast<std::size_t>(hq) * d);
      m.attend(l, std::span(&tok, 1), o.data());
      for (int qh = 0; qh < hq; ++qh) {
        const auto ref = reference(x, l, t, qh, plan.positions[qh / (hq / hkv)]);
        for (int c = 0; c < d; ++c) CHECK(std::fabs(o[qh * d + c] - ref[c]) <= 1e-4f + 1e-4f * std::fabs(ref[c]));
      }
      m.after_attention(l, tok);
      CHECK(m.anticipated(0, l) == (t % 5 == 0));
      CHECK(m.recall_pending(0, l) == (t % 5 == 0));
    }
    // the working set is the plan: R-heads n + t, followers k + t, per layer
    CHECK(st.resident_tokens() == static_cast<std::int64_t>(L) * (2 * (n + t) + 2 * (split.k + t)));
  }
  const auto s = m.stats();
  CHECK(s.refreshes == 2 * L);  // steps 5 and 10, both layers
  CHECK(s.layer_budgets == std::vector<int>{32, 32});
  CHECK(s.bytes_transferred == st.stats().bytes_to_device);
}

// SyncKV's recipe with a budgeter wider than the one its roles would build from the params
// (memory fraction 0.75 where the params say 0.5): the schedule keeps what the recipe's
// Budgeter gives, at the prompt's end and in its checks.
struct synckv_wider : kvsift::synckv_recipe {
  static parts make_parts(const params& p) {
    auto x = kvsift::synckv_recipe::make_parts(p);
    x.budgeter.p.memory_fraction = 0.75;
    return x;
  }
};

TEST_CASE("synckv: the schedule calls the recipe's budgeter", "[synckv]") {
  const int L = 2, n = 64, hkv = 4, hq = 8, d = 16;
  const auto x = make_tokens(L, n, 2, hkv, hq, d, 5);
  store_t st(model_shape{L, hq, hkv, d}, 1, n + 2);
  kvsift::method<store_t, synckv_wider, kvsift::exec::host> m(st, params_of(0.5, two_layer_roles()));
  prefill(m, x, 0);
  const auto wide = m.parts().budgeter.split(n);          // (6 - 4) * 64 / 4 = 32
  const auto narrow = m.parts().roles.budgeter().split(n);  // (4 - 4) * 64 / 4 = 0
  REQUIRE(wide.k == 32);
  REQUIRE(narrow.k == 0);
  CHECK(m.split(n).k == wide.k);
  CHECK(m.stats().layer_budgets == std::vector<int>{wide.k, wide.k});
  const auto roles = two_layer_roles();
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < hkv; ++h) {
      CAPTURE(l, h);
      CHECK(st.length(st.shape().sequence(0, l, h)) == (roles[l].is_representative(h) ? n : wide.k));
    }
  }
}

TEST_CASE("synckv: a recall in flight while the next layer's step runs; the next decode waits",
          "[synckv]") {
  const int L = 2, n = 80, T = 7, hkv = 4, hq = 8, d = 16;
  const auto x = make_tokens(L, n, T, hkv, hq, d, 5);
  const auto expected = run_single(x, 0.75);
  store_t st(model_shape{L, hq, hkv, d}, 1, n + T);
  method_t m(st, params_of(0.75, two_layer_roles()));
  prefill(m, x, 0);
  trace tr;
  std::jthread opener;
  for (int t = 1; t <= T; ++t) {
    for (int l = 0; l < L; ++l) {
      if (t == 6 && l == 0) {
        // Step 5's recalls of both layers are still held by the paused worker: decode waits.
        CHECK(m.recall_in_flight(0, 0));
        CHECK(m.recall_in_flight(0, 1));
        opener = std::jthread([&m] {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          m.transfer_state().pause(false);
        });
      }
      const auto tok = token_of(x, 0, l, t);
      record(tr, m.decode(l, tok), 0, hkv);
      std::vector<float> o(static_cast<std::size_t>(hq) * d);
      m.attend(l, std::span(&tok, 1), o.data());
      tr.outs.push_back(o);
      if (t == 5 && l == 0) m.transfer_state().pause(true);  // hold the recall about to be issued
      m.after_attention(l, tok);
    }
  }
  const auto s = m.stats();
  CHECK(s.stalls >= 1);  // layer 0's step 6 (layer 1's may find its copy done by then)
  CHECK(s.refreshes == 2);
  CHECK(s.bytes_transferred > 0);
  CHECK(tr.plans == expected.plans);
  CHECK(tr.outs == expected.outs);  // never stale or partial rows: bit-identical to the free run
}

TEST_CASE("synckv: a ragged batch of two requests equals two single runs", "[synckv]") {
  const int L = 2, T = 11, hkv = 4, hq = 8, d = 8;
  const auto a = make_tokens(L, 70, T, hkv, hq, d, 21);
  const auto b = make_tokens(L, 33, T, hkv, hq, d, 22);
  const auto ta = run_single(a, 0.875);
  const auto tb = run_single(b, 0.875);
  store_t st(model_shape{L, hq, hkv, d}, 2, 70 + T);
  method_t m(st, params_of(0.875, two_layer_roles()));
  prefill(m, b, 1);
  prefill(m, a, 0);
  trace ra, rb;
  for (int t = 1; t <= T; ++t) {
    for (int l = 0; l < L; ++l) {
      const kvsift::decode_token<float> toks[] = {token_of(b, 1, l, t), token_of(a, 0, l, t)};
      const auto& plan = m.decode(l, toks);
      record(rb, plan, 0, hkv);
      record(ra, plan, 1, hkv);
      std::vector<float> o(2 * static_cast<std::size_t>(hq) * d);
      m.attend(l, toks, o.data());
      rb.outs.emplace_back(o.begin(), o.begin() + hq * d);
      ra.outs.emplace_back(o.begin() + hq * d, o.end());
      m.after_attention(l, toks);
    }
  }
  CHECK(ra.plans == ta.plans);
  CHECK(rb.plans == tb.plans);
  CHECK(ra.outs == ta.outs);
  CHECK(rb.outs == tb.outs);
  CHECK(m.split(70).k != m.split(33).k);  // each request's own budget
}

TEST_CASE("synckv: reset cancels a pending recall; bad input leaves the store unchanged", "[synckv]") {
  const int L = 2, n = 40, T = 5, hkv = 4, hq = 8, d = 8;
  const auto x = make_tokens(L, n, T, hkv, hq, d, 9);
  store_t st(model_shape{L, hq, hkv, d}, 1, n + 2 * T);
  method_t m(st, params_of(0.75, two_layer_roles()));
  prefill(m, x, 0);
  const auto before = st.resident_tokens();
  // no query on the last chunk: an error before anything is appended
  CHECK_THROWS_AS(m.prefill(0, kvsift::prefill_chunk<float>{
                                   .request = 0,
                                   .keys = kvsift::kv_view<const float, kvsift::nhd>::contiguous(
                                       x.k.data(), 1, hkv, d),
                                   .values = kvsift::kv_view<const float, kvsift::nhd>::contiguous(
                                       x.v.data(), 1, hkv, d),
                                   .queries = {},
                                   .first_position = n,
                                   .last = true}),
                  kvsift::error);
  CHECK(st.resident_tokens() == before);
  m.transfer_state().pause(true);
  for (int t = 1; t <= T; ++t) {
    for (int l = 0; l < L; ++l) {
      const auto tok = token_of(x, 0, l, t);
      m.decode(l, tok);
      m.after_attention(l, tok);
    }
  }
  CHECK(m.recall_in_flight(0, 0));
  m.reset(0);  // cancels both layers' recalls; the slot takes a new prompt
  m.transfer_state().pause(false);
  CHECK(st.resident_tokens() == 0);
  CHECK(m.transfer_state().outstanding() == 0);
  prefill(m, x, 0);
  CHECK(st.resident_tokens() == before);
  // roles that do not match the shape or N_r
  store_t st2(model_shape{2, 8, 4, 8}, 1, 16);
  auto bad = params_of(0.75, two_layer_roles());
  bad.clusters = 3;
  CHECK_THROWS_AS(method_t(st2, bad), kvsift::error);
  bad = params_of(0.75, {{{0, 0, 1, 1}, {0, 3}}});
  CHECK_THROWS_AS(method_t(st2, bad), kvsift::error);
}

TEST_CASE("synckv: the documented example", "[synckv]") {
  const int n = 48, d = 8;
  const auto x = make_tokens(1, n, 10, 4, 8, d, 1);
  const auto keys = kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.k.data(), n, 4, d);
  const auto values = kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.v.data(), n, 4, d);
  const auto last_query =
      kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.q.data() + x.q_at(0, n - 1), 1, 8, d);
  std::vector<kvsift::decode_token<float>> steps;
  for (int t = 1; t <= 10; ++t) steps.push_back(token_of(x, 0, 0, t));
  const auto token = [&](int t) -> const kvsift::decode_token<float>& { return steps[t - 1]; };
  std::vector<float> out_buffer(8 * d);
  float* out = out_buffer.data();
  // example-begin synckv
  // One layer, 8 query heads over 4 KV heads; heads 0, 1 follow R-head 0, head 2 follows R-head 3.
  kvsift::store::tiered<float> store(kvsift::model_shape{1, 8, 4, d}, /*requests=*/1,
                                     /*host_capacity=*/n + 10);
  kvsift::synckv<float> m(store, {.clusters = 2, .stride = 5, .rho = 0.5, .memory_fraction = 0.75,
                                  .roles = {{.assign = {0, 0, 1, 1}, .representatives = {0, 3}}}});
  m.prefill(0, kvsift::prefill_chunk<float>{.request = 0, .keys = keys, .values = values,
                                            .queries = last_query, .first_position = 0});
  for (int t = 1; t <= 10; ++t) {
    const auto& plan = m.decode(0, token(t));  // installs step t-1's recall (waits if not done)
    (void)plan;
    m.attend(0, std::span(&token(t), 1), out);  // or the engine's kernel over plan.positions
    m.after_attention(0, token(t));             // at t % 5 == 0: anticipate, submit the recall
  }
  // followers keep k = floor((0.75 * 4 - 2) * 48 / 2) = 24 prefill tokens each
  // example-end synckv
  CHECK(m.split(n).k == 24);
  CHECK(m.stats().refreshes == 2);
  CHECK(store.resident_tokens() == 2 * (n + 10) + 2 * (24 + 10));
}

// The roles' shape half, read by the host's anticipation and the device state alike: one segment
// per cluster with followers, in cluster order; each follower (ascending) with its segment.
TEST_CASE("synckv: roles::clusters::segments", "[synckv][roles]") {
  // cluster 0 {0, 4} led by 4; cluster 1 {1} alone; cluster 2 {2, 3, 5} led by 5
  const kvsift::roles::clusters r{{.layers = {{{0, 1, 2, 2, 0, 2}, {4, 1, 5}}, {{0, 1}, {0, 1}}}}};
  const auto s = r.segments(0);
  CHECK(s.clusters == std::vector<int>{0, 2});
  CHECK(s.representatives == std::vector<int>{4, 5});
  CHECK(s.followers == std::vector<int>{0, 2, 3});
  CHECK(s.segment == std::vector<int>{0, 1, 1});
  CHECK(r.refreshes(0));
  const auto all_reps = r.segments(1);  // every head its own representative: nothing to refresh
  CHECK(all_reps.clusters.empty());
  CHECK(all_reps.followers.empty());
  CHECK_FALSE(r.refreshes(1));
}
