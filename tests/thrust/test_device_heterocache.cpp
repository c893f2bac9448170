// SPDX-License-Identifier: Apache-2.0
// HeteroCache over device memory (device/deferred_recall.hpp, device/roles_stars.hpp): method<thrust::tiered_store<T,
// E>, heterocache_recipe, E> on exec::sim, run beside kvsift::heterocache<T> on exec::host over
// store::tiered with the same inputs: heads of all four roles (one layer with two monitored
// pivots, one with a pivot without satellites), ragged batches (a random subset of the requests
// each step, in random order), chunked prefill, a reset request re-prefilled mid-decode,
// f32/f16/bf16, CPP and (OpenMP builds) OMP, drift windows 2 and 3 (many checks, drift events and
// checks without one). Laws:
//   parity   every plan (requests, per-head counts, original positions) equals the host's (slots
//            differ by design: the device tier's slots are unordered), attend()'s output equals
//            the host's to 2e-5 relative; the drift checks' medians and decisions per head, the
//            pivots' references, recall_pending, the budgets (base, caps, layer budgets), resident
//            tokens, drift_stats (checks, drift events, recalled rows) and the bytes recalled too;
//   capture  every decode step (decode + attend + after_attention) after the first, checking or
//            not, allocates nothing and reads nothing back (exec::sim's counters).
// And: a recorded retrieval that is not installed leaves the satellites' old (stale) rows; bad
// input is a kvsift::error naming the argument, and leaves the store unchanged. Under
// far_tier::attend the plans (resident and far positions), outputs and far rows equal the host's
// with nothing recalled.

#include "../plan_reads.hpp"

#include <kvsift/device/deferred_recall.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/thrust/exec.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace exec = kvsift::exec;
using kvsift::model_shape;
using kvsift::nhd;
using kvsift::thrust::buffer;
using kvsift::thrust::copy_to_device;
using kvsift::thrust::sim_arena;
using role = kvsift::calibrate::head_role;
using layer_roles = kvsift::heterocache_recipe::layer_roles;

#if defined(_OPENMP)
using device_execs = std::tuple<exec::sim_cpp, exec::sim_omp>;
#else
using device_execs = std::tuple<exec::sim_cpp>;
#endif

constexpr model_shape shape{.layers = 3, .q_heads = 8, .kv_heads = 4, .head_dim = 16};
constexpr int requests = 3;
constexpr int host_capacity = 96;
constexpr int tier_capacity = 96;

// Calibrated-looking roles (calibration's output: role, leader, stability per KV head).
// Layer 0: pivot 0 with satellites 1 and 2, anchor 3. Layer 1: volatile 0, satellite 1 of pivot 3,
// a pivot 2 without satellites (never checked). Layer 2: two stars, pivot 0 with satellite 1 and
// pivot 2 with satellite 3. F = 6 full-KV heads of N = 12; stabilities differ, so the caps differ.
std::vector<layer_roles> roles() {
  return {{{role::pivot, role::satellite, role::satellite, role::anchor},
           {0, 0, 0, -1},
           {0.9f, 0.7f, 0.4f, 0.8f}},
          {{role::volatile_head, role::satellite, role::pivot, role::pivot},
           {-1, 3, 2, 3},
           {0.1f, 0.3f, 0.6f, 0.95f}},
          {{role::pivot, role::satellite, role::pivot, role::satellite},
           {0, 0, 2, 2},
           {0.85f, 0.5f, 0.7f, 0.2f}}};
}
kvsift::heterocache_recipe::params params_of(int window, double tau_drift) {
  kvsift::heterocache_recipe::params p;
  p.drift_window = window;
  p.tau_drift = tau_drift;
  p.rho = 0.75;  // base = floor((0.75 * 12 - 6) n / 6) = n / 2
  p.roles = roles();
  return p;
}

template <class T, class E>
struct twin {
  std::vector<T> host;
  buffer<T, E> device;
  twin(const E& e, std::vector<T> h) : host(std::move(h)), device(e, host.size()) {
    copy_to_device(e, std::span<const T>(host), device);
  }
};

template <class T>
std::vector<T> random_array(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<T> v(n);
  for (auto& x : v) x = T(d(rng));
  return v;
}

template <class U>
std::vector<U> peek(const U* p, std::int64_t n) {
  return std::vector<U>(p, p + n);
}

// The host method's per-head state of (r, l) against the device's (read back: outside steps).
template <class HM, class DM>
void check_heads(const HM& hm, const DM& dm, int r, int l) {
  const auto& st = dm.schedule_state();
  const auto slot = dm.checked_slot("test", r, l);
  CHECK(dm.base(r, l) == hm.base(r, l));
  CHECK(dm.recall_pending(r, l) == hm.recall_pending(r, l));
  for (int h = 0; h < shape.kv_heads; ++h) {
    INFO("request " << r << " layer " << l << " head " << h);
    CHECK(dm.cap(r, l, h) == hm.cap(r, l, h));
    CHECK(st.drift_median(slot, h) == hm.drift_median(r, l, h));
    CHECK(st.drifted(slot, h) == hm.drifted(r, l, h));
    const auto ref = hm.reference(r, l, h);
    CHECK(st.reference(slot, h) == std::vector<std::int32_t>(ref.begin(), ref.end()));
  }
}

// Fixed budgets instead of budget::inverse_stability's: base 10 and per-head caps (a full-KV
// head's cap is not used; caps above n are cut to n).
kvsift::heterocache_recipe::params fixed_params_of(int window, double tau_drift) {
  auto p = params_of(window, tau_drift);
  p.fixed =
      kvsift::heterocache_recipe::fixed_budget{10, {99, 8, 14, 6, 99, 9, 99, 99, 99, 50, 99, 7}};
  return p;
}

template <class T, class E>
void run_pair(int window, double tau, std::uint32_t seed, bool fixed = false,
              kvsift::far_tier far = kvsift::far_tier::recall) {
  auto params = fixed ? fixed_params_of(window, tau) : params_of(window, tau);
  params.far = far;
  const bool attend = far == kvsift::far_tier::attend;
  INFO("window " << window << " tau " << tau << " seed " << seed
                 << (fixed ? " fixed budgets" : "") << " far " << kvsift::to_string(far));
  sim_arena engine_arena, arena;
  const E engine{engine_arena}, e{arena};
  std::mt19937 rng(seed);
  kvsift::store::tiered<T> hs(shape, requests, host_capacity);
  kvsift::thrust::tiered_store<T, E> ds(e, shape, requests, host_capacity, tier_capacity);
  kvsift::heterocache<T> hm(hs, params);
  kvsift::heterocache<T, E> dm(ds, params);
  const int H = shape.kv_heads, Q = shape.q_heads, d = shape.head_dim;
  using space = typename E::memory_space;
  using dchunk = typename kvsift::heterocache<T, E>::chunk_type;

  // A prompt for request r: `n` tokens in 1-3 chunks; the chunks carry their newest queries.
  const auto prefill = [&](int r, int n) {
    const auto k = random_array<T>(rng, static_cast<std::size_t>(shape.layers) * n * H * d);
    const auto v = random_array<T>(rng, k.size());
    const auto q = random_array<float>(rng, static_cast<std::size_t>(shape.layers) * n * Q * d);
    twin<T, E> kd(engine, k), vd(engine, v);
    twin<float, E> qd(engine, q);
    const int pieces = 1 + static_cast<int>(rng() % 3);
    for (int l = 0; l < shape.layers; ++l) {
      int at = 0;
      for (int p = 0; p < pieces && at < n; ++p) {
        const int len = p + 1 == pieces ? n - at : std::max(1, n / pieces);
        const std::size_t ko = (static_cast<std::size_t>(l) * n + at) * H * d;
        const std::size_t qo = (static_cast<std::size_t>(l) * n + at) * Q * d;
        const bool last = at + len == n;
        kvsift::prefill_chunk<T> hc{
            r,
            kvsift::kv_view<const T, nhd>::contiguous(k.data() + ko, len, H, d),
            kvsift::kv_view<const T, nhd>::contiguous(v.data() + ko, len, H, d),
            kvsift::kv_view<const float, nhd>::contiguous(q.data() + qo, len, Q, d),
            at,
            last};
        dchunk dc{
            r,
            kvsift::kv_view<const T, nhd, space>::contiguous(kd.device.data() + ko, len, H, d),
            kvsift::kv_view<const T, nhd, space>::contiguous(vd.device.data() + ko, len, H, d),
            kvsift::kv_view<const float, nhd, space>::contiguous(qd.device.data() + qo, len, Q, d),
            at,
            last};
        hm.prefill(l, hc);
        dm.prefill(l, dc);
        at += len;
      }
    }
  };
  for (int r = 0; r < requests; ++r) prefill(r, 20 + static_cast<int>(rng() % 21));
  ds.check();
  CHECK(ds.resident_tokens() == hs.resident_tokens());
  for (int r = 0; r < requests; ++r) {
    for (int l = 0; l < shape.layers; ++l) check_heads(hm, dm, r, l);
  }

  buffer<float, E> out_d(engine, static_cast<std::size_t>(requests) * Q * d);
  std::vector<float> out_h(out_d.size());
  std::int64_t attends = 0;  // layer attentions
  for (int step = 0; step < 16; ++step) {
    if (step == 7) {  // continuous batching: request 1 ends, a new prompt takes its slot
      hm.reset(1);
      dm.reset(1);
      prefill(1, 18 + static_cast<int>(rng() % 20));
    }
    std::vector<int> batch(requests);
    std::iota(batch.begin(), batch.end(), 0);
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(step % 4 == 0 ? requests : 1 + rng() % requests);
    const std::size_t B = batch.size();
    const auto k = random_array<T>(rng, static_cast<std::size_t>(shape.layers) * B * H * d);
    const auto v = random_array<T>(rng, k.size());
    const auto q = random_array<float>(rng, static_cast<std::size_t>(shape.layers) * B * Q * d);
    twin<T, E> kd(engine, k), vd(engine, v);
    twin<float, E> qd(engine, q);
    for (int l = 0; l < shape.layers; ++l) {
      std::vector<kvsift::decode_token<T>> th(B), td(B);
      for (std::size_t i = 0; i < B; ++i) {
        const std::size_t o = (static_cast<std::size_t>(l) * B + i);
        th[i] = {batch[i], q.data() + o * Q * d, k.data() + o * H * d, v.data() + o * H * d};
        td[i] = {batch[i], qd.device.data() + o * Q * d, kd.device.data() + o * H * d,
                 vd.device.data() + o * H * d};
      }
      const auto before = arena.counters();
      const auto& hp = hm.decode(l, th);
      const auto& dp = dm.decode(l, td);
      hm.attend(l, th, out_h.data());
      dm.attend(l, td, out_d.data());
      ++attends;
      hm.after_attention(l, th);
      const auto plan_requests = dp.requests;
      const auto plan_offsets = dp.offsets;
      const auto positions = peek(dp.positions, dp.size());
      dm.after_attention(l, td);
      const auto after = arena.counters();
      INFO("step " << step << " layer " << l);
      if (step > 0) {  // the capture laws after the warm-up step
        CHECK(after.allocations == before.allocations);
        CHECK(after.d2h_reads == before.d2h_reads);
      }
      REQUIRE(plan_requests == hp.requests);
      const auto want = kvsift_test::reads_of(hp);  // resident and far rows (attend)
      REQUIRE(plan_offsets == want.offsets);
      CHECK(positions == want.positions);
      for (const int r : batch) {
        CHECK(dm.step(r, l) == hm.step(r, l));
        CHECK(dm.prompt_end(r, l) == hm.prompt_end(r, l));
        check_heads(hm, dm, r, l);
      }
      const auto od = peek(out_d.data(), static_cast<std::int64_t>(B) * Q * d);
      float worst = 0.0f;
      for (std::size_t j = 0; j < od.size(); ++j) {
        worst = std::max(worst, std::abs(od[j] - out_h[j]) / (1.0f + std::abs(out_h[j])));
      }
      CHECK(worst <= 2e-5f);
      // a far row holds a tier slot but no row there: resident as the host counts it
      CHECK(ds.resident_tokens() == hs.resident_tokens());
      if (!attend) CHECK(ds.far_tokens() == 0);
    }
    CHECK(dm.stats().layer_budgets == hm.stats().layer_budgets);
    CHECK(dm.stats().refreshes == hm.stats().refreshes);
    const auto dd = dm.drift_stats(), hd = hm.drift_stats();
    CHECK(dd.drift_checks == hd.drift_checks);
    CHECK(dd.drift_events == hd.drift_events);
    CHECK(dd.rows_recalled == hd.rows_recalled);
  }
  // checks ran, some drifted and some did not (both outcomes of the device's choice)
  const auto dd = dm.drift_stats();
  CHECK(dd.drift_checks > 0);
  CHECK(dd.drift_events > 0);
  CHECK(dd.drift_events < dd.drift_checks);
  CHECK((dd.rows_recalled > 0) == !attend);  // attend asks the pool for nothing
  // the rows recalled: the rows installs copied, counted alike on both execs (a recall still
  // pending, or cancelled by reset, is counted on neither)
  CHECK(dm.stats().bytes_transferred == hm.stats().bytes_transferred);
  CHECK(dm.stats().far_rows == hm.stats().far_rows);
  // attend: every step's far partials ran as a host task beside its device part (exec::sim)
  CHECK(dm.stats().far_overlaps == (attend ? attends : 0));
  CHECK((dm.stats().bytes_transferred > 0) == !attend);  // attend reads them where they lie
  CHECK((dm.stats().far_rows > 0) == attend);
  ds.check();
  ds.verify();
}

// One request, one layer (layer 0 of roles()): the device method and its host twin after a
// prompt of n tokens.
template <class E>
struct one_layer {
  static constexpr model_shape one{.layers = 1, .q_heads = 8, .kv_heads = 4, .head_dim = 16};
  static constexpr int H = one.kv_heads, Q = one.q_heads, d = one.head_dim;
  using space = typename E::memory_space;
  using device_method = kvsift::heterocache<float, E>;
  sim_arena engine_arena, arena;
  E engine{engine_arena}, e{arena};
  std::mt19937 rng;
  kvsift::store::tiered<float> hs;
  kvsift::thrust::tiered_store<float, E> ds;
  kvsift::heterocache<float> hm;
  device_method dm;
  twin<float, E> sk, sv, sq;  // decode tokens
  static kvsift::heterocache_recipe::params params(int window, double tau) {
    auto p = params_of(window, tau);
    p.roles.resize(1);
    return p;
  }
  one_layer(int n, int steps, int tier, int window, double tau, std::uint32_t seed)
      : rng(seed),
        hs(one, 1, n + steps),
        ds(e, one, 1, n + steps, tier),
        hm(hs, params(window, tau)),
        dm(ds, params(window, tau)),
        sk(engine, random_array<float>(rng, static_cast<std::size_t>(steps) * H * d)),
        sv(engine, random_array<float>(rng, sk.host.size())),
        sq(engine, random_array<float>(rng, static_cast<std::size_t>(steps) * Q * d)) {
    const twin<float, E> k(engine, random_array<float>(rng, static_cast<std::size_t>(n) * H * d));
    const twin<float, E> v(engine, random_array<float>(rng, k.host.size()));
    const twin<float, E> q(engine, random_array<float>(rng, static_cast<std::size_t>(n) * Q * d));
    hm.prefill(0,
               kvsift::prefill_chunk<float>{
                   0, kvsift::kv_view<const float, nhd>::contiguous(k.host.data(), n, H, d),
                   kvsift::kv_view<const float, nhd>::contiguous(v.host.data(), n, H, d),
                   kvsift::kv_view<const float, nhd>::contiguous(q.host.data(), n, Q, d), 0, true});
    dm.prefill(
        0, typename device_method::chunk_type{
               0, kvsift::kv_view<const float, nhd, space>::contiguous(k.device.data(), n, H, d),
               kvsift::kv_view<const float, nhd, space>::contiguous(v.device.data(), n, H, d),
               kvsift::kv_view<const float, nhd, space>::contiguous(q.device.data(), n, Q, d), 0,
               true});
  }
  kvsift::decode_token<float> host_token(int t) const {
    return {0, sq.host.data() + t * Q * d, sk.host.data() + t * H * d, sv.host.data() + t * H * d};
  }
  kvsift::decode_token<float> device_token(int t) const {
    return {0, sq.device.data() + t * Q * d, sk.device.data() + t * H * d,
            sv.device.data() + t * H * d};
  }
};

template <class P>
std::vector<std::int32_t> device_head(const P& plan, int head) {
  return peek(plan.positions + plan.offsets[head], plan.offsets[head + 1] - plan.offsets[head]);
}
template <class P>
std::vector<std::int32_t> host_head(const P& plan, int head) {
  const auto s = plan.positions[head];
  return {s.begin(), s.end()};
}

}  // namespace

TEMPLATE_LIST_TEST_CASE(
    "device heterocache: method<thrust::tiered_store> on exec::sim equals exec::host",
    "[thrust][method][heterocache]", device_execs) {
  using E = TestType;
  for (const int window : {2, 3}) {
    for (const std::uint32_t seed : {41u, 42u}) {
      SECTION("f32 W " + std::to_string(window) + " seed " + std::to_string(seed)) {
        run_pair<float, E>(window, 0.5, seed);
      }
      SECTION("bf16 W " + std::to_string(window) + " seed " + std::to_string(seed)) {
        run_pair<kvsift::bfloat16, E>(window, 0.5, seed);
      }
      SECTION("f16 W " + std::to_string(window) + " seed " + std::to_string(seed)) {
        run_pair<kvsift::half, E>(window, 0.5, seed);
      }
    }
  }
}

// far_tier::attend over device memory: the satellites' retrieved rows stay in the pool; every
// plan reads the host's rows (resident and far), the merged attention equals the host's merged
// attention, nothing is recalled and the far rows counted are the host's.
TEMPLATE_LIST_TEST_CASE("device heterocache: far attend reads the pool where it lies, as on the host",
                        "[thrust][method][heterocache][far_tier]", device_execs) {
  using E = TestType;
  SECTION("f32") { run_pair<float, E>(2, 0.5, 51u, false, kvsift::far_tier::attend); }
  SECTION("bf16") { run_pair<kvsift::bfloat16, E>(3, 0.5, 52u, false, kvsift::far_tier::attend); }
  SECTION("fixed budgets") { run_pair<float, E>(2, 0.3, 53u, true, kvsift::far_tier::attend); }
}

TEMPLATE_LIST_TEST_CASE("device heterocache: fixed budgets, as on the host",
                        "[thrust][method][heterocache]", device_execs) {
  run_pair<float, TestType>(2, 0.3, 43u, /*fixed=*/true);
}

// The lazy copy queue: a drift check after step t records the satellites' next prompt parts;
// they show from step t + 1's decode, which installs them. Skipped, the satellites keep their
// old rows (stale) and the plan differs from the host's; installed at the next step, it equals
// the host's again (with every decode token).
TEMPLATE_LIST_TEST_CASE("device heterocache: a retrieval not installed leaves stale rows",
                        "[thrust][method][heterocache]", device_execs) {
  const int n = 64;
  one_layer<TestType> x(n, 4, 128, /*window=*/2, /*tau=*/2.0, 5);  // tau 2: every check drifts
  std::vector<std::int32_t> before;  // satellite 1's working set at step 2
  for (int t = 0; t < 2; ++t) {      // steps 1, 2: the check after step 2
    x.hm.decode(0, x.host_token(t));
    before = device_head(x.dm.decode(0, x.device_token(t)), 1);
    x.hm.after_attention(0, x.host_token(t));
    x.dm.after_attention(0, x.device_token(t));
  }
  auto& st = x.dm.schedule_state();
  REQUIRE(x.hm.recall_pending(0, 0));
  REQUIRE(st.recorded(0));
  REQUIRE(x.dm.recall_pending(0, 0));
  REQUIRE(st.satellites(0) == std::vector<int>{1, 2});
  const int k = x.dm.cap(0, 0, 1);
  const auto recorded = peek(st.recorded_parts(0), k);  // satellite 1's next prompt part
  // step 3 without the install: head 1 reads its old working set (+ the new token)
  st.debug_skip_installs(true);
  const auto& hp = x.hm.decode(0, x.host_token(2));
  const auto stale = device_head(x.dm.decode(0, x.device_token(2)), 1);
  auto want = host_head(hp, 1);
  // what the install would have brought: the host's prompt part
  CHECK(std::vector<std::int32_t>(want.begin(), want.begin() + k) == recorded);
  CHECK(stale != want);
  before.push_back(n + 2);
  CHECK(stale == before);  // deterministic: the rows of step 2 plus the new token
  CHECK(st.recorded(0));   // still queued
  x.hm.after_attention(0, x.host_token(2));
  x.dm.after_attention(0, x.device_token(2));
  // step 4 installs it, with every decode token so far: the host's plan again
  st.debug_skip_installs(false);
  const auto& hp4 = x.hm.decode(0, x.host_token(3));
  const auto& dp4 = x.dm.decode(0, x.device_token(3));
  for (int h = 0; h < one_layer<TestType>::H; ++h) CHECK(device_head(dp4, h) == host_head(hp4, h));
  CHECK_FALSE(st.recorded(0));
}

// The capture laws over a longer context: 120 decode steps after a 300-token prompt, a drift
// check every 5 (its fixed-size sort, scoring over the prompt, the install at the next step):
// no step after the first allocates or reads back; the plans stay the host's.
TEMPLATE_LIST_TEST_CASE("device heterocache: no allocation or read-back in 120 decode steps",
                        "[thrust][method][heterocache]", device_execs) {
  const int steps = 120, n = 300;
  // base = 200 of 300: random top sets overlap about 2/3, so tau 0.67 drifts about half the time
  one_layer<TestType> x(n, steps, n + steps, /*window=*/5, /*tau=*/0.67, 9);
  buffer<float, TestType> out(
      x.engine, static_cast<std::size_t>(one_layer<TestType>::Q) * one_layer<TestType>::d);
  int allocating_steps = 0, reading_steps = 0, checks = 0, differing_plans = 0;
  for (int t = 0; t < steps; ++t) {
    const auto tok = x.device_token(t);
    const auto before = x.arena.counters();
    const auto& dp = x.dm.decode(0, tok);
    x.dm.attend(0, tok, out.data());
    x.dm.after_attention(0, tok);
    const auto after = x.arena.counters();
    if (t > 0 && after.allocations != before.allocations) ++allocating_steps;
    if (after.d2h_reads != before.d2h_reads) ++reading_steps;
    checks += x.dm.schedule_state().at(0).checked ? 1 : 0;
    const auto& hp = x.hm.decode(0, x.host_token(t));
    x.hm.after_attention(0, x.host_token(t));
    for (int h = 0; h < one_layer<TestType>::H; ++h) {
      differing_plans += device_head(dp, h) != host_head(hp, h);
    }
  }
  CHECK(checks == steps / 5);
  CHECK(allocating_steps == 0);
  CHECK(reading_steps == 0);
  CHECK(differing_plans == 0);
  CHECK(x.dm.drift_stats().drift_events == x.hm.drift_stats().drift_events);
  CHECK(x.dm.drift_stats().drift_events > 0);
  CHECK(x.dm.drift_stats().drift_events < x.dm.drift_stats().drift_checks);
  CHECK(x.dm.stats().bytes_transferred > 0);
  x.ds.check();
  x.ds.verify();
}

// Bad input at the boundary: a kvsift::error naming the argument, and nothing changes.
TEMPLATE_LIST_TEST_CASE("device heterocache: bad input is an error and leaves the store unchanged",
                        "[thrust][method][heterocache]", device_execs) {
  using E = TestType;
  using X = one_layer<E>;
  const int n = 30;
  X x(n, 4, n + 2, /*window=*/2, /*tau=*/0.5, 17);  // the tier holds the prompt and 2 more tokens
  const auto resident = x.ds.resident_tokens();
  const auto pooled = x.ds.host_tokens();
  const auto unchanged = [&] {
    CHECK(x.ds.resident_tokens() == resident);
    CHECK(x.ds.host_tokens() == pooled);
    x.ds.verify();
  };
  SECTION("a prompt that has ended cannot take another chunk") {
    const twin<float, E> k(x.engine,
                           std::vector<float>(static_cast<std::size_t>(X::H) * X::d, 0.5f));
    const twin<float, E> q(x.engine,
                           std::vector<float>(static_cast<std::size_t>(X::Q) * X::d, 0.5f));
    using view = kvsift::kv_view<const float, nhd, typename X::space>;
    CHECK_THROWS_WITH(x.dm.prefill(0,
                                   typename X::device_method::chunk_type{
                                       0, view::contiguous(k.device.data(), 1, X::H, X::d),
                                       view::contiguous(k.device.data(), 1, X::H, X::d),
                                       view::contiguous(q.device.data(), 1, X::Q, X::d), n, true}),
                      Catch::Matchers::ContainsSubstring("heterocache.prefill") &&
                          Catch::Matchers::ContainsSubstring("request") &&
                          Catch::Matchers::ContainsSubstring("has not ended"));
    unchanged();
  }
  SECTION("a prompt longer than the device tier") {
    kvsift::thrust::tiered_store<float, E> small(x.e, X::one, 1, 64, 16);
    typename X::device_method m(small, X::params(2, 0.5));
    const twin<float, E> k(x.engine,
                           std::vector<float>(static_cast<std::size_t>(20) * X::H * X::d, 0.5f));
    const twin<float, E> q(x.engine,
                           std::vector<float>(static_cast<std::size_t>(20) * X::Q * X::d, 0.5f));
    using view = kvsift::kv_view<const float, nhd, typename X::space>;
    CHECK_THROWS_WITH(m.prefill(0,
                                typename X::device_method::chunk_type{
                                    0, view::contiguous(k.device.data(), 20, X::H, X::d),
                                    view::contiguous(k.device.data(), 20, X::H, X::d),
                                    view::contiguous(q.device.data(), 20, X::Q, X::d), 0, true}),
                      Catch::Matchers::ContainsSubstring("keys.tokens") &&
                          Catch::Matchers::ContainsSubstring("20") &&
                          Catch::Matchers::ContainsSubstring("device tier"));
    CHECK(small.resident_tokens() == 0);
    CHECK(small.host_tokens() == 0);
    small.verify();
  }
  SECTION("a decode with no room left in the device tier") {
    for (int t = 0; t < 2; ++t) {
      x.dm.decode(0, x.device_token(t));
      x.dm.after_attention(0, x.device_token(t));
    }
    const auto full = x.ds.resident_tokens();
    const auto full_pool = x.ds.host_tokens();
    CHECK_THROWS_WITH(
        x.dm.decode(0, x.device_token(2)),
        Catch::Matchers::ContainsSubstring("heterocache.decode") &&
            Catch::Matchers::ContainsSubstring("room for one more token in the device tier"));
    CHECK(x.ds.resident_tokens() == full);
    CHECK(x.ds.host_tokens() == full_pool);
    x.ds.verify();
  }
  SECTION("a decode before the request's prompt ended") {
    kvsift::thrust::tiered_store<float, E> other(x.e, X::one, 2, 64, 64);
    typename X::device_method m(other, X::params(2, 0.5));
    auto tok = x.device_token(0);
    tok.request = 1;
    CHECK_THROWS_WITH(m.decode(0, tok), Catch::Matchers::ContainsSubstring("request") &&
                                            Catch::Matchers::ContainsSubstring("prompt ended"));
    CHECK(other.resident_tokens() == 0);
    other.verify();
  }
  SECTION("roles that do not fit the model") {
    auto p = X::params(2, 0.5);
    p.roles[0].leader[1] = 3;  // a satellite led by an anchor
    CHECK_THROWS_WITH(typename X::device_method(x.ds, p),
                      Catch::Matchers::ContainsSubstring("leader[1]") &&
                          Catch::Matchers::ContainsSubstring("a pivot"));
    unchanged();
  }
}
