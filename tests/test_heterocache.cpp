// SPDX-License-Identifier: Apache-2.0
// HeteroCache laws over store::tiered + transfer::async: the inverse-stability budgets (caps sum,
// equal stabilities give base exactly, infeasible roles name the layer, F and the rho that works),
// the drift median, the plan of every head at every step (volatile and pivot heads read
// everything, anchors and satellites their prefill part ∪ decode tokens), resident KV against
// rho, prefill placement and every retrieval against an independent reference (a satellite gets
// exactly its pivot's top cap_s by the newest query, over the prefill keys only), outputs against
// a reference over the original rows, a recall in flight while steps proceed (the next decode
// waits: a stall, same result), a ragged batch of two equal to two single runs, reset, bad roles,
// and the adapter from a roles file. The exact sets are pinned by the conformance vectors
// (method.heterocache.prefill, method.heterocache.decode).

#include "request_tokens.hpp"

#include <kvsift/budget/inverse_stability.hpp>
#include <kvsift/calibrate/roles_file.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/trigger/drift_median.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <random>
#include <span>
#include <thread>
#include <vector>

namespace {

using kvsift::model_shape;
using method_t = kvsift::heterocache<float>;
using store_t = kvsift::store::tiered<float>;
using role = kvsift::calibrate::head_role;
using Catch::Matchers::ContainsSubstring;

using kvsift_test::make_tokens;
using kvsift_test::tokens;

// Layer 0: pivot 0 with satellites 1, 2; anchor 3. Layer 1: volatile 0, satellite 1 of pivot 3,
// anchor 2. F = 3 full-KV heads of N = 8; stabilities differ, so the caps differ.
std::vector<method_t::layer_roles> two_layer_roles() {
  return {{{role::pivot, role::satellite, role::satellite, role::anchor}, {0, 0, 0, -1},
           {0.9f, 0.7f, 0.4f, 0.8f}},
          {{role::volatile_head, role::satellite, role::anchor, role::pivot}, {-1, 3, -1, 3},
           {0.1f, 0.3f, 0.6f, 0.95f}}};
}

method_t::params params_of(double tau_drift, std::vector<method_t::layer_roles> roles = two_layer_roles()) {
  method_t::params p;
  p.tau_drift = tau_drift;
  p.roles = std::move(roles);
  return p;
}

void prefill(method_t& m, const tokens& x, int request) {
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

// Independent reference of HeteroCache's scores: the query at position `qpos` of KV head h's
// group, softmax over the prompt keys [0, n) of head h (double), avg-pool 5 with zero padding
// (divided by 5), max over the group; then the top k (ties to the lower index), ascending.
std::vector<std::int32_t> top_over_prompt(const tokens& x, int l, int h, int qpos, int k) {
  const int G = x.hq / x.hkv;
  std::vector<double> best(static_cast<std::size_t>(x.n), -1.0);
  for (int g = 0; g < G; ++g) {
    const float* q = x.q.data() + x.q_at(l, qpos) + static_cast<std::size_t>(h * G + g) * x.d;
    std::vector<double> w(static_cast<std::size_t>(x.n));
    double mx = -1e300;
    for (int j = 0; j < x.n; ++j) {
      const float* kk = x.k.data() + x.kv_at(l, j) + static_cast<std::size_t>(h) * x.d;
      double s = 0;
      for (int c = 0; c < x.d; ++c) s += static_cast<double>(q[c]) * kk[c];
      w[j] = s / std::sqrt(static_cast<double>(x.d));
      mx = std::max(mx, w[j]);
    }
    double z = 0;
    for (auto& e : w) z += (e = std::exp(e - mx));
    for (int j = 0; j < x.n; ++j) {
      double acc = 0;
      for (int i = j - 2; i <= j + 2; ++i) {
        if (i >= 0 && i < x.n) acc += w[i] / z;
      }
      best[j] = std::max(best[j], acc / 5.0);
    }
  }
  std::vector<std::int32_t> idx(static_cast<std::size_t>(x.n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return best[a] > best[b]; });
  idx.resize(static_cast<std::size_t>(std::min(k, x.n)));
  std::sort(idx.begin(), idx.end());
  return idx;
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

struct trace {
  std::vector<std::vector<std::int32_t>> plans;
  std::vector<std::vector<float>> outs;
  std::vector<int> drifts;
};

void record(trace& tr, const kvsift::attention_plan& plan, int slot, int hkv) {
  for (int h = 0; h < hkv; ++h) {
    const auto p = plan.positions[slot * hkv + h];
    tr.plans.emplace_back(p.begin(), p.end());
  }
}

trace run_single(const tokens& x, double tau_drift) {
  store_t st(model_shape{x.layers, x.hq, x.hkv, x.d}, 1, x.n + x.T);
  method_t m(st, params_of(tau_drift));
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
      for (int h = 0; h < x.hkv; ++h) tr.drifts.push_back(m.drifted(0, l, h) ? 1 : 0);
    }
  }
  return tr;
}

std::vector<role> flat_roles() {
  std::vector<role> r;
  for (const auto& l : two_layer_roles()) r.insert(r.end(), l.roles.begin(), l.roles.end());
  return r;
}
std::vector<float> flat_stability() {
  std::vector<float> s;
  for (const auto& l : two_layer_roles()) s.insert(s.end(), l.stability.begin(), l.stability.end());
  return s;
}

}  // namespace

TEST_CASE("budget::inverse_stability: base, caps by inverse stability, the rho N n bound",
          "[heterocache]") {
  const auto roles = flat_roles();
  const auto stab = flat_stability();
  for (const int n : {0, 1, 7, 64, 1000, 4097}) {
    for (const double rho : {0.375, 0.5, 0.75, 1.0}) {
      CAPTURE(n, rho);
      const auto c = kvsift::budget::inverse_stability_caps(roles, stab, 4, n, rho);
      // F = 3, N = 8, N_c = 5
      CHECK(c.base == static_cast<int>(std::floor((rho * 8 - 3) * n / 5 + 1e-9)));
      // METHODS.md: w_h = 1 / (s_h + 1e-6), sum(w) over the compressed heads,
      // cap_h = min(n, floor(base * w_h * N_c / sum(w))) under the real-to-integer rule
      double sum_w = 0.0;
      for (std::size_t i = 0; i < roles.size(); ++i) {
        if (!kvsift::budget::full_kv(roles[i])) sum_w += 1.0 / (static_cast<double>(stab[i]) + 1e-6);
      }
      std::int64_t resident = 0;
      for (std::size_t i = 0; i < roles.size(); ++i) {
        CAPTURE(i);
        if (kvsift::budget::full_kv(roles[i])) {
          CHECK(c.cap[i] == n);
        } else {
          const double x = c.base * (1.0 / (static_cast<double>(stab[i]) + 1e-6)) * 5 / sum_w;
          const auto want = static_cast<int>(std::floor(x + 1e-9 * std::max(1.0, std::abs(x))));
          CHECK(c.cap[i] == std::min(n, want));
        }
        resident += c.cap[i];
      }
      CHECK(static_cast<double>(resident) <= rho * 8 * n + 1e-9);
      // less stable compressed heads get at least as many tokens
      for (std::size_t i = 0; i < roles.size(); ++i) {
        for (std::size_t j = 0; j < roles.size(); ++j) {
          if (!kvsift::budget::full_kv(roles[i]) && !kvsift::budget::full_kv(roles[j]) &&
              stab[i] < stab[j]) {
            CHECK(c.cap[i] >= c.cap[j]);
          }
        }
      }
    }
  }
  // equal stabilities: every cap is exactly base (6 anchors of stability 1, n = 30: base 15)
  const std::vector<role> six(6, role::anchor);
  for (const float s : {1.0f, 0.3f, 0.7f, 0.1f}) {
    const std::vector<float> st(6, s);
    for (const int n : {30, 999, 1000, 77}) {
      const auto c = kvsift::budget::inverse_stability_caps(six, st, 6, n, 0.5);
      CAPTURE(s, n);
      CHECK(c.base == n / 2);
      for (const int x : c.cap) CHECK(x == c.base);
    }
  }
  // the Budgeter model hands each head-sequence its cap for its length
  kvsift::budget::inverse_stability b{{.roles = roles, .stability = stab, .kv_heads = 4, .rho = 0.5}};
  b.validate("t");
  const int lengths[] = {64, 64, 64, 64, 10, 10, 10, 10};
  std::vector<int> out;
  b.budgets(kvsift::budget_context{1, 2, 4, lengths}, out);
  const auto c64 = b.caps(4, 64), c10 = b.caps(4, 10);
  for (int h = 0; h < 4; ++h) {
    CHECK(out[h] == c64.cap[4 + h]);
    CHECK(out[4 + h] == c10.cap[4 + h]);
  }
}

TEST_CASE("budget::inverse_stability: infeasible roles name the layer, F and the rho that works",
          "[heterocache]") {
  auto roles = flat_roles();
  const auto stab = flat_stability();
  // F = 3 of N = 8: rho below 3/8 leaves the compressed heads a negative base
  CHECK_THROWS_WITH(kvsift::budget::inverse_stability_caps(roles, stab, 4, 100, 0.25),
                    ContainsSubstring("rho") && ContainsSubstring("F / N = 3 / 8 = 0.375") &&
                        ContainsSubstring("layer 1 has 2 of 4"));
  CHECK(kvsift::budget::inverse_stability_caps(roles, stab, 4, 100, 0.375).base == 0);
  // no compressed head at all
  for (auto& r : roles) r = role::volatile_head;
  CHECK_THROWS_WITH(kvsift::budget::inverse_stability_caps(roles, stab, 4, 100, 1.0),
                    ContainsSubstring("at least one compressed head") &&
                        ContainsSubstring("8 of the N = 8") && ContainsSubstring("layer 0 has 4 of 4"));
  // bad arguments
  CHECK_THROWS_AS(kvsift::budget::inverse_stability_caps(flat_roles(), stab, 4, 100, 1.5), kvsift::error);
  CHECK_THROWS_AS(kvsift::budget::inverse_stability_caps(flat_roles(), stab, 3, 100, 0.5), kvsift::error);
  CHECK_THROWS_AS(kvsift::budget::inverse_stability_caps(flat_roles(), std::vector<float>(8, -1.0f), 4,
                                                         100, 0.5),
                  kvsift::error);
  // the method reports it at construction, before any store is touched
  store_t st(model_shape{2, 8, 4, 8}, 1, 64);
  auto p = params_of(0.5);
  p.rho = 0.25;
  CHECK_THROWS_WITH(method_t(st, p), ContainsSubstring("F / N = 3 / 8"));
  CHECK(st.resident_tokens() == 0);
}

TEST_CASE("trigger::drift_median: schedule, median (even W: mean of the middle two), strict",
          "[heterocache]") {
  const kvsift::trigger::drift_median d{{.window = 5, .tau_drift = 0.5}};
  using ctx = kvsift::trigger_context;
  CHECK_FALSE(d.fires(ctx{kvsift::lifecycle_event::prefill_end, 0, 0, 0, 0}));
  for (int t = 1; t <= 20; ++t) {
    CHECK(d.fires(ctx{kvsift::lifecycle_event::decode_step, t, 0, 0, 0}) == (t % 5 == 0));
  }
  const double odd[] = {0.9, 0.1, 0.5, 0.2, 0.8};
  CHECK(kvsift::trigger::drift_median::median(odd) == 0.5);
  CHECK_FALSE(d.decide(odd).drift);  // equal to tau: no drift (strict)
  const double low[] = {0.9, 0.1, 0.4, 0.2, 0.8};
  CHECK(d.decide(low).drift);
  const double even[] = {0.2, 0.9, 0.4, 0.6};
  CHECK(kvsift::trigger::drift_median::median(even) == 0.5);
  CHECK_THROWS_AS(d.decide(even), kvsift::error);  // W = 5 overlaps expected
  CHECK_THROWS_AS(kvsift::trigger::drift_median::median(std::span<const double>{}), kvsift::error);
}

TEST_CASE("heterocache: placement, plans, resident KV, outputs, and every retrieval installs the "
          "pivot's set (GQA, two layers)",
          "[heterocache]") {
  const int L = 2, n = 64, T = 16, hkv = 4, hq = 8, d = 16;
  const auto roles = two_layer_roles();
  for (const double tau : {2.0, -1.0}) {  // every check drifts / none does
    CAPTURE(tau);
    const auto x = make_tokens(L, n, T, hkv, hq, d, 11);
    store_t st(model_shape{L, hq, hkv, d}, 1, n + T);
    method_t m(st, params_of(tau));
    STATIC_REQUIRE(method_t::caps.needs_queries);
    prefill(m, x, 0);
    const auto b = m.budget(n);
    REQUIRE(b.base == 12);  // floor((0.5 * 8 - 3) * 64 / 5)
    // resident after prefill: F n + sum(cap) <= rho N n
    std::int64_t want_resident = 0;
    for (const int c : b.cap) want_resident += c;
    CHECK(st.resident_tokens() == want_resident);
    CHECK(static_cast<double>(st.resident_tokens()) <= 0.5 * L * hkv * n);
    CHECK(st.host_tokens() == static_cast<std::int64_t>(L) * hkv * n);
    // the prefill part of every compressed head: its own top cap by the last prompt query
    std::vector<std::vector<std::int32_t>> part(static_cast<std::size_t>(L * hkv));
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < hkv; ++h) {
        CHECK(m.cap(0, l, h) == b.cap[l * hkv + h]);
        if (!kvsift::budget::full_kv(roles[l].roles[h])) {
          part[l * hkv + h] = top_over_prompt(x, l, h, n - 1, b.cap[l * hkv + h]);
        }
        if (roles[l].roles[h] == role::pivot) {
          const auto ref = m.reference(0, l, h);
          CHECK(std::ranges::equal(ref, top_over_prompt(x, l, h, n - 1, b.base)));
        }
      }
    }
    std::int64_t drifts = 0;
    // a drift's new reference, committed once the next decode() installed the satellites' rows
    std::vector<std::vector<std::int32_t>> next_ref(static_cast<std::size_t>(L * hkv));
    for (int t = 1; t <= T; ++t) {
      for (int l = 0; l < L; ++l) {
        const auto tok = token_of(x, 0, l, t);
        const auto& plan = m.decode(l, tok);
        for (int h = 0; h < hkv; ++h) {
          auto& want_ref = next_ref[l * hkv + h];
          if (want_ref.empty()) continue;
          CAPTURE(t, l, h);
          CHECK(std::ranges::equal(m.reference(0, l, h), want_ref));
          want_ref.clear();
        }
        for (int h = 0; h < hkv; ++h) {
          CAPTURE(t, l, h);
          const auto p = plan.positions[h];
          std::vector<std::int32_t> want;
          if (kvsift::budget::full_kv(roles[l].roles[h])) {
            want.resize(static_cast<std::size_t>(n + t));
            std::iota(want.begin(), want.end(), 0);
          } else {
            want = part[l * hkv + h];
            for (int j = n; j < n + t; ++j) want.push_back(j);
          }
          CHECK(std::ranges::equal(p, want));
        }
        std::vector<float> o(static_cast<std::size_t>(hq) * d);
        m.attend(l, std::span(&tok, 1), o.data());
        for (int qh = 0; qh < hq; ++qh) {
          const auto ref = reference(x, l, t, qh, plan.positions[qh / (hq / hkv)]);
          for (int c = 0; c < d; ++c) {
            CHECK(std::fabs(o[qh * d + c] - ref[c]) <= 1e-4f + 1e-4f * std::fabs(ref[c]));
          }
        }
        std::vector<std::vector<std::int32_t>> ref_before;
        for (int h = 0; h < hkv; ++h) {
          const auto r = m.reference(0, l, h);
          ref_before.emplace_back(r.begin(), r.end());
        }
        m.after_attention(l, tok);
        for (int h = 0; h < hkv; ++h) {
          CAPTURE(t, l, h);
          const bool checked = roles[l].roles[h] == role::pivot && t % 5 == 0;
          CHECK((m.drift_median(0, l, h) >= 0.0) == checked);
          CHECK(m.drifted(0, l, h) == (checked && tau > 1.0));
          if (!m.drifted(0, l, h)) continue;
          ++drifts;
          // the reference becomes q_t's top base; each satellite's prefill part becomes the
          // pivot's top min(n, cap_s) by q_t over the prompt keys
          const auto newest = top_over_prompt(x, l, h, n + t - 1, b.base);
          // decided, not yet the reference: it becomes one with the next decode's install
          CHECK(std::ranges::equal(m.reference(0, l, h), ref_before[static_cast<std::size_t>(h)]));
          next_ref[l * hkv + h] = newest;
          CHECK(m.recall_pending(0, l));
          for (int s = 0; s < hkv; ++s) {
            if (roles[l].roles[s] == role::satellite && roles[l].leader[s] == h) {
              part[l * hkv + s] = top_over_prompt(x, l, h, n + t - 1, std::min(n, b.cap[l * hkv + s]));
            }
          }
        }
      }
    }
    const auto s = m.stats();
    CHECK(drifts == (tau > 1.0 ? 3 * L : 0));  // one pivot with satellites per layer, steps 5, 10, 15
    CHECK(s.refreshes == drifts);
    CHECK(m.drift_stats().drift_events == drifts);
    CHECK(m.drift_stats().drift_checks == 3 * L);
    CHECK(s.layer_budgets == std::vector<int>{12, 12});
    // bytes recalled: the rows installs copied (the store's count); a recall submitted after the
    // last step is not installed yet, so the rows asked for bound it, equal when none is pending
    const auto asked = m.drift_stats().rows_recalled * 2 * d * static_cast<std::int64_t>(sizeof(float));
    bool pending = false;
    for (int l = 0; l < L; ++l) pending = pending || m.recall_pending(0, l);
    CHECK(s.bytes_transferred == st.stats().bytes_to_device);
    CHECK(s.bytes_transferred <= asked);
    if (!pending) CHECK(s.bytes_transferred == asked);
    if (tau > 1.0) CHECK(s.bytes_transferred > 0);
    st.verify();
  }
}

TEST_CASE("heterocache: a recall in flight while the next layer's step runs; the next decode waits",
          "[heterocache]") {
  const int L = 2, n = 80, T = 7, hkv = 4, hq = 8, d = 16;
  const auto x = make_tokens(L, n, T, hkv, hq, d, 5);
  const auto expected = run_single(x, 2.0);
  store_t st(model_shape{L, hq, hkv, d}, 1, n + T);
  method_t m(st, params_of(2.0));
  prefill(m, x, 0);
  trace tr;
  std::jthread opener;
  for (int t = 1; t <= T; ++t) {
    for (int l = 0; l < L; ++l) {
      if (t == 6 && l == 0) {
        // Step 5's retrievals of both layers are still held by the paused worker: decode waits.
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
      for (int h = 0; h < hkv; ++h) tr.drifts.push_back(m.drifted(0, l, h) ? 1 : 0);
    }
  }
  const auto s = m.stats();
  CHECK(s.stalls >= 1);
  CHECK(s.refreshes == 2);
  CHECK(s.bytes_transferred > 0);
  CHECK(tr.plans == expected.plans);
  CHECK(tr.outs == expected.outs);  // never stale or partial rows: bit-identical to the free run
  CHECK(tr.drifts == expected.drifts);
}

TEST_CASE("heterocache: a ragged batch of two requests equals two single runs", "[heterocache]") {
  const int L = 2, T = 11, hkv = 4, hq = 8, d = 8;
  for (const double tau : {2.0, 0.5}) {
    CAPTURE(tau);
    const auto a = make_tokens(L, 70, T, hkv, hq, d, 21);
    const auto b = make_tokens(L, 33, T, hkv, hq, d, 22);
    const auto ta = run_single(a, tau);
    const auto tb = run_single(b, tau);
    store_t st(model_shape{L, hq, hkv, d}, 2, 70 + T);
    method_t m(st, params_of(tau));
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
        for (int h = 0; h < hkv; ++h) {
          ra.drifts.push_back(m.drifted(0, l, h) ? 1 : 0);
          rb.drifts.push_back(m.drifted(1, l, h) ? 1 : 0);
        }
      }
    }
    CHECK(ra.plans == ta.plans);
    CHECK(rb.plans == tb.plans);
    CHECK(ra.outs == ta.outs);
    CHECK(rb.outs == tb.outs);
    CHECK(ra.drifts == ta.drifts);
    CHECK(rb.drifts == tb.drifts);
    CHECK(m.base(0, 0) != m.base(1, 0));  // each request's own budget
  }
}

TEST_CASE("heterocache: reset cancels a pending retrieval; bad input leaves the store unchanged",
          "[heterocache]") {
  const int L = 2, n = 40, T = 5, hkv = 4, hq = 8, d = 8;
  const auto x = make_tokens(L, n, T, hkv, hq, d, 9);
  store_t st(model_shape{L, hq, hkv, d}, 1, n + 2 * T);
  method_t m(st, params_of(2.0));
  prefill(m, x, 0);
  const auto before = st.resident_tokens();
  // a second prompt on a layer whose prompt ended, and a decode token without a query
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
  const auto tok0 = token_of(x, 0, 0, 1);
  CHECK_THROWS_AS(m.decode(0, kvsift::decode_token<float>{0, nullptr, tok0.key, tok0.value}), kvsift::error);
  CHECK_THROWS_AS(m.decode(2, tok0), kvsift::error);
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
  m.reset(0);  // cancels both layers' retrievals; the slot takes a new prompt
  m.transfer_state().pause(false);
  CHECK(st.resident_tokens() == 0);
  CHECK(m.transfer_state().outstanding() == 0);
  prefill(m, x, 0);
  CHECK(st.resident_tokens() == before);
  // roles that do not fit the shape or each other
  store_t st2(model_shape{2, 8, 4, 8}, 1, 16);
  auto bad = params_of(0.5);
  bad.roles.pop_back();
  CHECK_THROWS_WITH(method_t(st2, bad), ContainsSubstring("roles.size"));
  bad = params_of(0.5);
  bad.roles[0].leader[1] = 3;  // a satellite led by an anchor
  CHECK_THROWS_WITH(method_t(st2, bad), ContainsSubstring("roles[0].leader[1]"));
  bad = params_of(0.5);
  bad.roles[1].leader[0] = 3;  // a volatile head with a leader
  CHECK_THROWS_AS(method_t(st2, bad), kvsift::error);
  bad = params_of(0.5);
  bad.drift_window = 0;
  CHECK_THROWS_AS(method_t(st2, bad), kvsift::error);
  bad = params_of(0.5);
  bad.kernel = 4;
  CHECK_THROWS_AS(method_t(st2, bad), kvsift::error);
  CHECK(st2.resident_tokens() == 0);
}

TEST_CASE("heterocache: roles from a roles file (calibrate::heterocache_roles)", "[heterocache]") {
  kvsift::calibrate::heterocache_roles file;
  file.model = {2, 8, 4, 16, ""};
  for (const auto& l : two_layer_roles()) {
    file.layers.push_back({l.roles, l.leader, l.stability, {}});
  }
  kvsift::calibrate::validate(file);
  method_t::params p;
  p.roles = method_t::roles_from(file);
  const auto x = make_tokens(2, 64, 0, 4, 8, 16, 3);
  store_t st(file.model.shape(), 1, 64);
  method_t m(st, p);
  prefill(m, x, 0);
  CHECK(m.base(0, 1) == 12);
  CHECK(st.resident_tokens() == [&] {
    std::int64_t s = 0;
    for (const int c : m.budget(64).cap) s += c;
    return s;
  }());
}

TEST_CASE("heterocache: the documented example", "[heterocache]") {
  const int n = 60, d = 8;
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
  // example-begin heterocache
  // One layer, 8 query heads over 4 KV heads: pivot 0 with satellites 1 and 2, anchor 3.
  using role = kvsift::calibrate::head_role;
  kvsift::store::tiered<float> store(kvsift::model_shape{1, 8, 4, d}, /*requests=*/1,
                                     /*host_capacity=*/n + 10);
  kvsift::heterocache<float>::params p;  // tau_drift 0.5, W 5, rho 0.5, kernel 5
  p.roles = {{.roles = {role::pivot, role::satellite, role::satellite, role::anchor},
              .leader = {0, 0, 0, -1},
              .stability = {0.9f, 0.4f, 0.6f, 0.8f}}};
  // (from a roles file: p.roles = kvsift::heterocache<float>::roles_from(
  //      kvsift::calibrate::read_heterocache_roles(path, model));)
  kvsift::heterocache<float> m(store, p);
  m.prefill(0, kvsift::prefill_chunk<float>{.request = 0, .keys = keys, .values = values,
                                            .queries = last_query, .first_position = 0});
  for (int t = 1; t <= 10; ++t) {
    const auto& plan = m.decode(0, token(t));  // installs step t-1's retrieval (waits if not done)
    (void)plan;
    m.attend(0, std::span(&token(t), 1), out);  // or the engine's kernel over plan.positions
    m.after_attention(0, token(t));             // at t = 5, 10: drift check, maybe a retrieval
  }
  // F = 1 full-KV head of N = 4: base = floor((0.5 * 4 - 1) * 60 / 3) = 20
  // example-end heterocache
  CHECK(m.base(0, 0) == 20);
  CHECK(m.drift_stats().drift_checks == 2);
  const auto b = m.budget(n);
  CHECK(store.resident_tokens() == (n + 10) + (b.cap[1] + 10) + (b.cap[2] + 10) + (b.cap[3] + 10));
}

// The roles' shape half, read by the host's drift checks and the device state alike: monitored
// pivots (with satellites) ascending, then the other pivots; satellites by pivot, then by head.
TEST_CASE("heterocache: roles::stars::layout orders pivots and satellites", "[heterocache][roles]") {
  kvsift::roles::stars::params p;
  // h0 pivot without satellites, h1 satellite of 4, h2 pivot of 5, h3 anchor, h4 pivot of 1,
  // h5 satellite of 2; layer 1: pivot 0 alone, the rest anchors and volatile heads
  p.layers = {{{role::pivot, role::satellite, role::pivot, role::anchor, role::pivot, role::satellite},
               {0, 4, 2, -1, 4, 2}, std::vector<float>(6, 0.5f)},
              {{role::pivot, role::anchor, role::volatile_head, role::anchor, role::anchor, role::anchor},
               {0, -1, -1, -1, -1, -1}, std::vector<float>(6, 0.5f)}};
  const kvsift::roles::stars r(p);
  const auto l0 = r.layout(0);
  CHECK(l0.pivots == std::vector<int>{2, 4, 0});
  CHECK(l0.monitored == 2);
  CHECK(l0.satellites == std::vector<int>{5, 1});
  CHECK(l0.satellite_pivot == std::vector<int>{0, 1});
  CHECK(r.refreshes(0));
  const auto l1 = r.layout(1);
  CHECK(l1.pivots == std::vector<int>{0});
  CHECK(l1.monitored == 0);
  CHECK(l1.satellites.empty());
  CHECK_FALSE(r.refreshes(1));
}
