// SPDX-License-Identifier: Apache-2.0
// Faults in transfer, per method that recalls (issue 18): SyncKV, HeteroCache and FreeKV each
// drive a small decode until a recall is submitted, with transfer::async told to fail it
// (fault::copy_fails: the worker stops half way; fault::submit_fails: submit() throws). The step
// that needs the recall throws kvsift::error naming the injected fault, the tiered store's
// verify() passes (both tiers consistent, no partial row installed), and the following steps
// still work (FreeKV, which appends before it settles, falls back to its synchronous recall
// instead of throwing): valid plans (ascending positions, each resident) that contain the new token.
// The method's decision state must match what the store holds (issue 26, item 4): a decision is
// committed only once its recall is installed, so the failed layer's decisions (SyncKV's dynamic
// sets, HeteroCache's references) are those from before the failed recall, and every step
// SyncKV's followers hold exactly static ∪ dynamic of their cluster below the prompt end.

#include <kvsift/method/freekv.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/synckv.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::ContainsSubstring;
using kvsift::model_shape;
using kvsift::transfer::fault;
using store_t = kvsift::store::tiered<float>;
using view = kvsift::kv_view<const float, kvsift::nhd>;

// One request's prompt and decode tokens, [layers][tokens, heads, d].
struct script {
  model_shape sh;
  int n = 0, steps = 0;
  std::vector<std::vector<float>> k, v, q;
  script(model_shape s, int prompt, int t, unsigned seed) : sh(s), n(prompt), steps(t) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int l = 0; l < sh.layers; ++l) {
      k.emplace_back(static_cast<std::size_t>(n + t) * sh.kv_heads * sh.head_dim);
      v.emplace_back(k.back().size());
      q.emplace_back(static_cast<std::size_t>(n + t) * sh.q_heads * sh.head_dim);
      for (auto& e : k.back()) e = 2.0f * nd(rng);
      for (auto& e : v.back()) e = nd(rng);
      for (auto& e : q.back()) e = 2.0f * nd(rng);
    }
  }
  [[nodiscard]] kvsift::prefill_chunk<float> prompt(int layer) const {
    return {.request = 0,
            .keys = view::contiguous(k[layer].data(), n, sh.kv_heads, sh.head_dim),
            .values = view::contiguous(v[layer].data(), n, sh.kv_heads, sh.head_dim),
            .queries = view::contiguous(q[layer].data() + static_cast<std::size_t>(n - 1) * sh.q_heads * sh.head_dim,
                                        1, sh.q_heads, sh.head_dim),
            .first_position = 0,
            .last = true};
  }
  // Decode step t (1..steps): the token at position n + t - 1.
  [[nodiscard]] kvsift::decode_token<float> token(int layer, int t) const {
    const std::size_t pos = static_cast<std::size_t>(n + t - 1);
    return {0, q[layer].data() + pos * sh.q_heads * sh.head_dim,
            k[layer].data() + pos * sh.kv_heads * sh.head_dim,
            v[layer].data() + pos * sh.kv_heads * sh.head_dim};
  }
};

// The plan of request 0 on `layer` is valid: per KV head, ascending positions that are resident
// and include the token just appended.
void check_plan(const store_t& st, const kvsift::attention_plan& plan, int layer) {
  const auto& sh = st.shape();
  REQUIRE(plan.requests == std::vector<int>{0});
  REQUIRE(plan.positions.segments() == sh.kv_heads);
  const std::int32_t newest = st.next_position(0, layer) - 1;
  for (int h = 0; h < sh.kv_heads; ++h) {
    CAPTURE(layer, h);
    const auto p = plan.positions[h];
    REQUIRE(std::adjacent_find(p.begin(), p.end(), std::greater_equal<>()) == p.end());
    REQUIRE(std::find(p.begin(), p.end(), newest) != p.end());
    for (const auto pos : p) REQUIRE(st.resident(sh.sequence(0, layer, h), pos));
  }
}

// The decisions a recall realises, of one layer (compared before and after a failed recall), and
// the check that they match what the store holds where that can be read off the store.
std::vector<std::int32_t> decisions(const kvsift::synckv<float>& m, const store_t& st, int layer) {
  std::vector<std::int32_t> out;
  const auto& roles = m.parameters().roles[layer];
  for (int c = 0; c < roles.clusters(); ++c) {
    const auto dy = m.dynamic_set(0, layer, c);
    out.insert(out.end(), dy.begin(), dy.end());
    out.push_back(-1);
    // every follower of cluster c holds exactly static ∪ dynamic below the prompt end
    std::vector<std::int32_t> want;
    const auto s = m.static_set(0, layer, c);
    std::set_union(s.begin(), s.end(), dy.begin(), dy.end(), std::back_inserter(want));
    for (int h = 0; h < st.shape().kv_heads; ++h) {
      if (roles.assign[h] != c || roles.is_representative(h)) continue;
      std::vector<std::int32_t> held;
      const auto seq = st.shape().sequence(0, layer, h);
      for (int i = 0; i < st.length(seq); ++i) {
        if (st.position(seq, i) < m.prompt_end(0, layer)) held.push_back(st.position(seq, i));
      }
      CAPTURE(layer, c, h);
      REQUIRE(held == want);
    }
  }
  return out;
}
std::vector<std::int32_t> decisions(const kvsift::heterocache<float>& m, const store_t& st, int layer) {
  std::vector<std::int32_t> out;
  for (int h = 0; h < st.shape().kv_heads; ++h) {
    const auto ref = m.reference(0, layer, h);
    out.insert(out.end(), ref.begin(), ref.end());
    out.push_back(-1);
  }
  return out;
}
std::vector<std::int32_t> decisions(const kvsift::freekv<float>&, const store_t&, int) { return {}; }

// One full step t on every layer; checks each plan and the store.
template <class Method>
void step(Method& m, store_t& st, const script& sc, int t) {
  for (int l = 0; l < sc.sh.layers; ++l) {
    const auto tok = sc.token(l, t);
    check_plan(st, m.decode(l, tok), l);
    std::vector<float> out(static_cast<std::size_t>(sc.sh.q_heads) * sc.sh.head_dim);
    m.attend(l, std::span(&tok, 1), out.data());
    for (const float x : out) REQUIRE(std::isfinite(x));
    m.after_attention(l, tok);
  }
  REQUIRE_NOTHROW(st.verify());
}

// Drives `m` to step `fail_at`, whose after_attention submits a recall (asserted through the
// transfer's counters) that fails as `f` says; the run then goes on to `sc.steps`. Returns how
// many calls threw kvsift::error naming the fault.
template <class Method>
int run_with_fault(Method& m, store_t& st, const script& sc, int fail_at, fault f) {
  for (int l = 0; l < sc.sh.layers; ++l) m.prefill(l, sc.prompt(l));
  REQUIRE_NOTHROW(st.verify());
  for (int t = 1; t < fail_at; ++t) step(m, st, sc, t);
  auto& xfer = m.transfer_state();
  int errors = 0;
  std::vector<std::vector<std::int32_t>> decided;  // [layers] decisions before the failed recall
  for (int l = 0; l < sc.sh.layers; ++l) decided.push_back(decisions(m, st, l));
  // step fail_at: the first layer whose after_attention submits a recall gets the fault
  bool injected = false;
  int failed_layer = -1;
  for (int l = 0; l < sc.sh.layers; ++l) {
    const auto tok = sc.token(l, fail_at);
    check_plan(st, m.decode(l, tok), l);
    const auto issued = xfer.stats().recalls_issued;
    if (!injected) xfer.inject(f);
    try {
      m.after_attention(l, tok);
    } catch (const kvsift::error& e) {
      REQUIRE(f == fault::submit_fails);
      CHECK_THAT(std::string(e.what()), ContainsSubstring("submit_fails"));
      ++errors;
      injected = true;
    }
    REQUIRE_NOTHROW(st.verify());
    if (!injected && xfer.stats().recalls_issued > issued) injected = true;
    if (injected && failed_layer < 0) failed_layer = l;
    xfer.inject(fault::none);  // a layer with nothing to recall leaves the fault to the next one
  }
  REQUIRE(injected);
  // step fail_at + 1 needs the recall: the failed one throws before the token is appended, the
  // store stays consistent, and a second decode of the same token works
  const int t = fail_at + 1;
  for (int l = 0; l < sc.sh.layers; ++l) {
    const auto tok = sc.token(l, t);
    const auto before = st.host_length(0, l);
    try {
      check_plan(st, m.decode(l, tok), l);
    } catch (const kvsift::error& e) {
      CHECK_THAT(std::string(e.what()), ContainsSubstring("copy_fails"));
      ++errors;
      REQUIRE_NOTHROW(st.verify());
      REQUIRE(st.host_length(0, l) == before);  // thrown before the token was appended
      check_plan(st, m.decode(l, tok), l);
    }
    REQUIRE_NOTHROW(st.verify());
    // the failed recall's decision was never committed: the layer decides as before it
    if (l == failed_layer) CHECK(decisions(m, st, l) == decided[static_cast<std::size_t>(l)]);
    (void)decisions(m, st, l);  // and what the method decided is what the store holds
    std::vector<float> out(static_cast<std::size_t>(sc.sh.q_heads) * sc.sh.head_dim);
    m.attend(l, std::span(&tok, 1), out.data());
    m.after_attention(l, tok);
  }
  for (int s = t + 1; s <= sc.steps; ++s) {
    step(m, st, sc, s);
    for (int l = 0; l < sc.sh.layers; ++l) (void)decisions(m, st, l);
  }
  REQUIRE(xfer.outstanding() <= static_cast<std::size_t>(sc.sh.layers));  // nothing leaked
  return errors;
}

std::vector<kvsift::select::cluster_roles> synckv_roles() {
  return {{{0, 0, 1, 1}, {0, 3}}, {{1, 0, 0, 1}, {2, 0}}};
}

kvsift::synckv<float>::params synckv_params() {
  return {.clusters = 2, .stride = 5, .rho = 0.5, .memory_fraction = 0.75, .roles = synckv_roles()};
}

kvsift::heterocache<float>::params heterocache_params() {
  using role = kvsift::calibrate::head_role;
  kvsift::heterocache<float>::params p;
  p.tau_drift = 2.0;  // every drift check drifts: a retrieval at steps 5, 10, ...
  p.roles = {{{role::pivot, role::satellite, role::satellite, role::anchor}, {0, 0, 0, -1},
              {0.9f, 0.7f, 0.4f, 0.8f}},
             {{role::volatile_head, role::satellite, role::anchor, role::pivot}, {-1, 3, -1, 3},
              {0.1f, 0.3f, 0.6f, 0.95f}}};
  return p;
}

kvsift::freekv<float>::params freekv_params() {
  return {.page_size = 8, .budget = 48, .sink = 8, .window = 16, .tau = -1.0, .dense_layers = 1};
}

}  // namespace

TEST_CASE("faults: synckv survives a recall whose copy fails", "[faults][synckv]") {
  const script sc(model_shape{2, 8, 4, 16}, 64, 12, 3);
  store_t st(sc.sh, 1, sc.n + sc.steps);
  kvsift::synckv<float> m(st, synckv_params());
  CHECK(run_with_fault(m, st, sc, 5, fault::copy_fails) == 1);
  CHECK(m.stats().refreshes >= 2);  // the anticipation at step 10 ran and installed
}

// A batch of two requests, request 1's recall failing: the decode that needs it throws before any
// request's step is counted, so its retry counts request 0's step once (the schedule completes
// every recall of a step before it changes anything else).
TEST_CASE("faults: a failed recall in a batch leaves the other requests' steps to the retry",
          "[faults][synckv]") {
  const script a(model_shape{2, 8, 4, 16}, 64, 12, 3), b(model_shape{2, 8, 4, 16}, 64, 12, 4);
  store_t st(a.sh, 2, a.n + a.steps);
  kvsift::synckv<float> m(st, synckv_params());
  const auto token = [](const script& sc, int r, int l, int t) {
    auto x = sc.token(l, t);
    x.request = r;
    return x;
  };
  std::vector<float> out(static_cast<std::size_t>(2) * a.sh.q_heads * a.sh.head_dim);
  for (int l = 0; l < a.sh.layers; ++l) {
    m.prefill(l, a.prompt(l));
    auto c = b.prompt(l);
    c.request = 1;
    m.prefill(l, c);
    // request 0 runs one step ahead: at request 1's anticipation (step 5) request 0 is at 6
    const auto x = token(a, 0, l, 1);
    (void)m.decode(l, x);
    m.attend(l, x, out.data());
    m.after_attention(l, x);
  }
  auto& xfer = m.transfer_state();
  int failed_layer = -1;
  for (int t = 1; t <= 5; ++t) {
    for (int l = 0; l < a.sh.layers; ++l) {
      const std::vector<kvsift::decode_token<float>> both{token(a, 0, l, t + 1), token(b, 1, l, t)};
      (void)m.decode(l, both);
      m.attend(l, both, out.data());
      const auto issued = xfer.stats().recalls_issued;
      if (t == 5 && failed_layer < 0) xfer.inject(fault::copy_fails);
      m.after_attention(l, both);
      if (t == 5 && failed_layer < 0 && xfer.stats().recalls_issued > issued) failed_layer = l;
      xfer.inject(fault::none);
    }
  }
  REQUIRE(failed_layer >= 0);
  const int l = failed_layer;
  const std::vector<kvsift::decode_token<float>> both{token(a, 0, l, 7), token(b, 1, l, 6)};
  const auto& state = m.schedule_state();
  const int steps0 = state.steps(m.slot(0, l)), steps1 = state.steps(m.slot(1, l));
  const int len0 = st.host_length(0, l);
  for (int ll = 0; ll < l; ++ll) {
    const std::vector<kvsift::decode_token<float>> ok{token(a, 0, ll, 7), token(b, 1, ll, 6)};
    (void)m.decode(ll, ok);
  }
  CHECK_THROWS_WITH(m.decode(l, both), ContainsSubstring("copy_fails"));
  REQUIRE_NOTHROW(st.verify());
  CHECK(state.steps(m.slot(0, l)) == steps0);  // nothing of the step was kept
  CHECK(st.host_length(0, l) == len0);
  (void)m.decode(l, both);                       // the retry
  CHECK(state.steps(m.slot(0, l)) == steps0 + 1);
  CHECK(state.steps(m.slot(1, l)) == steps1 + 1);
  REQUIRE_NOTHROW(st.verify());
}

TEST_CASE("faults: synckv survives a recall whose submit fails", "[faults][synckv]") {
  const script sc(model_shape{2, 8, 4, 16}, 64, 12, 4);
  store_t st(sc.sh, 1, sc.n + sc.steps);
  kvsift::synckv<float> m(st, synckv_params());
  CHECK(run_with_fault(m, st, sc, 5, fault::submit_fails) == 1);
}

TEST_CASE("faults: heterocache survives a retrieval whose copy fails", "[faults][heterocache]") {
  const script sc(model_shape{2, 8, 4, 16}, 80, 12, 5);
  store_t st(sc.sh, 1, sc.n + sc.steps);
  kvsift::heterocache<float> m(st, heterocache_params());
  CHECK(run_with_fault(m, st, sc, 5, fault::copy_fails) == 1);
}

TEST_CASE("faults: heterocache survives a retrieval whose submit fails", "[faults][heterocache]") {
  const script sc(model_shape{2, 8, 4, 16}, 80, 12, 6);
  store_t st(sc.sh, 1, sc.n + sc.steps);
  kvsift::heterocache<float> m(st, heterocache_params());
  CHECK(run_with_fault(m, st, sc, 5, fault::submit_fails) == 1);
}

TEST_CASE("faults: freekv survives a speculative recall whose copy fails", "[faults][freekv]") {
  const script sc(model_shape{3, 4, 2, 8}, 200, 10, 11);
  store_t st(sc.sh, 1, sc.n + sc.steps, 8);
  kvsift::freekv<float> m(st, freekv_params());
  // FreeKV appends the token before it settles the speculative selection, so it does not throw:
  // the failed recall is not installed and its heads take the synchronous path (the step's own
  // selection, promoted on this thread), exactly as a corrected step does.
  CHECK(run_with_fault(m, st, sc, 2, fault::copy_fails) == 0);
  CHECK(m.transfer_state().outstanding() <= 2);
}

TEST_CASE("faults: freekv survives a speculative recall whose submit fails", "[faults][freekv]") {
  const script sc(model_shape{3, 4, 2, 8}, 200, 10, 12);
  store_t st(sc.sh, 1, sc.n + sc.steps, 8);
  kvsift::freekv<float> m(st, freekv_params());
  CHECK(run_with_fault(m, st, sc, 2, fault::submit_fails) == 1);
}
