// SPDX-License-Identifier: Apache-2.0
// The far-tier policy (far_tier, method/lifecycle.hpp) of the two-tier methods: with
// far_tier::attend, SyncKV, HeteroCache and FreeKV read at every step the same rows as with
// far_tier::recall (the plan's resident slots plus its far positions are the recall plan's
// positions), their attention equals recall's within 2e-5 relative (two partials merged by
// log-sum-exp against one softmax over the union), nothing is recalled (bytes_transferred 0) and
// the far rows are counted; ragged batches of two requests with two-chunk prompts; a reset while
// far rows are held. Over device memory: the [far_tier] cases of
// tests/thrust/test_device_{synckv,heterocache,freekv}.cpp.

#include "request_tokens.hpp"

#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace {

using kvsift::far_tier;
using kvsift::model_shape;
using role = kvsift::calibrate::head_role;

using kvsift_test::make_tokens;
using kvsift_test::tokens;

// What a run saw at every step and layer: per segment the positions read (resident and far
// together, ascending), the far positions alone, and the attention output.
struct trace {
  std::vector<std::vector<std::int32_t>> read, far;
  std::vector<std::vector<float>> outs;
  kvsift::method_stats stats;
};

// Prefills every request in two chunks (the second carries all its queries), then decodes `steps`
// steps of the ragged batch; `reset_at` (>= 1) resets request 1 before that step and prefills it
// again.
template <class M>
trace run(typename M::params p, std::span<const tokens> xs, int steps, int reset_at = -1) {
  const auto& x0 = xs.front();
  int cap = 0;
  for (const auto& x : xs) cap = std::max(cap, x.n + x.T);
  const model_shape shape{x0.layers, x0.hq, x0.hkv, x0.d};
  const int page = [&] {
    if constexpr (requires { p.page_size; }) return p.page_size;
    return 16;
  }();
  kvsift::store::tiered<float> st(shape, static_cast<int>(xs.size()), cap, page);
  M m(st, std::move(p));
  const auto prefill = [&](int r) {
    const auto& x = xs[r];
    const int first = x.n / 2;
    for (int l = 0; l < x.layers; ++l) {
      std::vector<kvsift::prefill_chunk<float>> chunks;
      for (const int c : {0, 1}) {
        const int at = c == 0 ? 0 : first, len = c == 0 ? first : x.n - first;
        chunks.push_back(
            {.request = r,
             .keys = kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.k.data() + x.kv_at(l, at), len, x.hkv, x.d),
             .values = kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.v.data() + x.kv_at(l, at), len, x.hkv, x.d),
             .queries = c == 0 ? kvsift::kv_view<const float, kvsift::nhd>{}
                               : kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.q.data() + x.q_at(l, at), len, x.hq, x.d),
             .first_position = at,
             .last = c == 1});
      }
      m.prefill(l, std::span<const kvsift::prefill_chunk<float>>(chunks));
    }
  };
  for (int r = 0; r < static_cast<int>(xs.size()); ++r) prefill(r);
  trace tr;
  std::vector<int> decoded(xs.size(), 0);
  for (int t = 1; t <= steps; ++t) {
    if (t == reset_at) {
      m.reset(1);
      decoded[1] = 0;
      prefill(1);
    }
    for (int l = 0; l < x0.layers; ++l) {
      std::vector<kvsift::decode_token<float>> toks;
      for (int r = 0; r < static_cast<int>(xs.size()); ++r) {
        const auto& x = xs[r];
        const int at = x.n + decoded[r];
        toks.push_back({r, x.q.data() + x.q_at(l, at), x.k.data() + x.kv_at(l, at), x.v.data() + x.kv_at(l, at)});
      }
      const auto& plan = m.decode(l, toks);
      for (int s = 0; s < plan.positions.segments(); ++s) {
        std::vector<std::int32_t> all(plan.positions[s].begin(), plan.positions[s].end());
        std::vector<std::int32_t> far;
        if (plan.far.segments() > 0) far.assign(plan.far[s].begin(), plan.far[s].end());
        all.insert(all.end(), far.begin(), far.end());
        std::sort(all.begin(), all.end());
        tr.read.push_back(std::move(all));
        tr.far.push_back(std::move(far));
      }
      std::vector<float> out(toks.size() * static_cast<std::size_t>(x0.hq) * x0.d);
      m.attend(l, toks, out.data());
      tr.outs.push_back(std::move(out));
      m.after_attention(l, toks);
    }
    for (auto& d : decoded) ++d;
  }
  tr.stats = m.stats();
  return tr;
}

std::size_t far_count(const trace& tr) {
  std::size_t n = 0;
  for (const auto& f : tr.far) n += f.size();
  return n;
}

// recall and attend over the same tokens: the same rows at every step, outputs within 2e-5
// relative (of the row's largest magnitude), nothing recalled under attend.
void check_same_reads(const trace& recall, const trace& attend) {
  REQUIRE(recall.read.size() == attend.read.size());
  for (std::size_t i = 0; i < recall.read.size(); ++i) {
    CAPTURE(i);
    CHECK(recall.far[i].empty());
    REQUIRE(attend.read[i] == recall.read[i]);
  }
  REQUIRE(recall.outs.size() == attend.outs.size());
  float worst = 0.0f;
  for (std::size_t i = 0; i < recall.outs.size(); ++i) {
    float scale = 0.0f;
    for (const float v : recall.outs[i]) scale = std::max(scale, std::abs(v));
    for (std::size_t j = 0; j < recall.outs[i].size(); ++j) {
      worst = std::max(worst, std::abs(recall.outs[i][j] - attend.outs[i][j]) / std::max(scale, 1e-6f));
    }
  }
  CHECK(worst <= 2e-5f);
  CHECK(recall.stats.bytes_transferred > 0);  // the case recalls something...
  CHECK(far_count(attend) > 0);               // ...which attend reads where it lies
  CHECK(attend.stats.bytes_transferred == 0);
  CHECK(attend.stats.far_rows == static_cast<std::int64_t>(far_count(attend)));
  CHECK(recall.stats.far_rows == 0);
  CHECK(attend.stats.refreshes == recall.stats.refreshes);
  CHECK(attend.stats.resident_bytes <= recall.stats.resident_bytes);
}

std::vector<tokens> ragged(int layers, int hkv, int hq, int d, int T) {
  return {make_tokens(layers, 96, T, hkv, hq, d, 11), make_tokens(layers, 61, T, hkv, hq, d, 12)};
}

kvsift::synckv<float>::params synckv_params(far_tier far) {
  return {.clusters = 2, .stride = 3, .rho = 0.5, .memory_fraction = 0.75,
          .roles = {{{0, 0, 1, 1}, {0, 3}}, {{1, 0, 0, 1}, {2, 0}}}, .far = far};
}

kvsift::heterocache<float>::params heterocache_params(far_tier far) {
  kvsift::heterocache<float>::params p;
  p.tau_drift = 0.99;  // drift at every check: retrieval at steps W, 2W, ...
  p.drift_window = 2;
  p.roles = {{{role::pivot, role::satellite, role::satellite, role::anchor}, {0, 0, 0, -1},
              {0.9f, 0.7f, 0.4f, 0.8f}},
             {{role::volatile_head, role::satellite, role::anchor, role::pivot}, {-1, 3, -1, 3},
              {0.1f, 0.3f, 0.6f, 0.95f}}};
  p.far = far;
  return p;
}

kvsift::freekv<float>::params freekv_params(far_tier far, double tau) {
  auto p = kvsift::freekv_params<float>(32, 4, tau, 0);  // 8 pages of 4: sink 2, window 2
  p.far = far;
  return p;
}

}  // namespace

TEST_CASE("far attend: SyncKV reads recall's rows, merged, with nothing recalled", "[far_tier][synckv]") {
  const auto xs = ragged(2, 4, 8, 16, 9);
  const auto recall = run<kvsift::synckv<float>>(synckv_params(far_tier::recall), xs, 9);
  const auto attend = run<kvsift::synckv<float>>(synckv_params(far_tier::attend), xs, 9);
  check_same_reads(recall, attend);
}

TEST_CASE("far attend: HeteroCache reads recall's rows, merged, with nothing recalled",
          "[far_tier][heterocache]") {
  const auto xs = ragged(2, 4, 8, 16, 9);
  const auto recall = run<kvsift::heterocache<float>>(heterocache_params(far_tier::recall), xs, 9);
  const auto attend = run<kvsift::heterocache<float>>(heterocache_params(far_tier::attend), xs, 9);
  check_same_reads(recall, attend);
}

TEST_CASE("far attend: FreeKV's speculative and corrected heads read recall's rows", "[far_tier][freekv]") {
  const auto xs = ragged(2, 2, 8, 16, 8);
  for (const double tau : {-1.0, 0.5, 1.0}) {  // never, sometimes, (almost) always correct
    CAPTURE(tau);
    const auto recall = run<kvsift::freekv<float>>(freekv_params(far_tier::recall, tau), xs, 8);
    const auto attend = run<kvsift::freekv<float>>(freekv_params(far_tier::attend, tau), xs, 8);
    check_same_reads(recall, attend);
  }
}

TEST_CASE("far attend: a reset drops the request's far rows; its new prompt starts clean",
          "[far_tier][reset]") {
  const auto xs = ragged(2, 4, 8, 16, 12);
  const auto recall = run<kvsift::synckv<float>>(synckv_params(far_tier::recall), xs, 8, 5);
  const auto attend = run<kvsift::synckv<float>>(synckv_params(far_tier::attend), xs, 8, 5);
  check_same_reads(recall, attend);
  const auto frecall = run<kvsift::freekv<float>>(freekv_params(far_tier::recall, 0.5), xs, 8, 4);
  const auto fattend = run<kvsift::freekv<float>>(freekv_params(far_tier::attend, 0.5), xs, 8, 4);
  check_same_reads(frecall, fattend);
}

TEST_CASE("far attend: the plan's far rows are host-pool positions that are not resident",
          "[far_tier]") {
  const auto xs = ragged(2, 4, 8, 16, 9);
  const auto attend = run<kvsift::synckv<float>>(synckv_params(far_tier::attend), xs, 9);
  for (std::size_t i = 0; i < attend.far.size(); ++i) {
    CAPTURE(i);
    CHECK(std::is_sorted(attend.far[i].begin(), attend.far[i].end()));
    CHECK(std::adjacent_find(attend.read[i].begin(), attend.read[i].end()) == attend.read[i].end());
  }
  CHECK(kvsift::to_string(far_tier::attend) == "attend");
  CHECK(kvsift::to_string(far_tier::recall) == "recall");
}
