// SPDX-License-Identifier: Apache-2.0
// SyncKV over device memory (device/deferred_recall.hpp): method<thrust::tiered_store<T, E>,
// synckv_recipe, E> on exec::sim, run beside kvsift::synckv<T> on exec::host over store::tiered
// with the same inputs: ragged batches (a random subset of the requests each step, in random
// order), chunked prefill, a reset request re-prefilled mid-decode, f32/f16/bf16, CPP and (OpenMP
// builds) OMP, stride 2 and 3 (many anticipations). Laws:
//   parity   every plan (requests, per-head counts, original positions) equals the host's (slots
//            differ by design: the device tier's slots are unordered), the anticipation steps,
//            resident tokens, refreshes and per-layer budgets too, and attend()'s output equals
//            the host's to 2e-5 relative;
//   capture  every decode step (decode + attend + after_attention) after the first, anticipating
//            or not, allocates nothing and reads nothing back (exec::sim's counters).
// And: a recorded recall that is not installed leaves the followers' old (stale) rows; under
// far_tier::attend the plans (resident and far positions), outputs and far rows equal the host's
// with nothing recalled.

#include "../plan_reads.hpp"

#include <kvsift/device/all.hpp>
#include <kvsift/device/deferred_recall.hpp>
#include <kvsift/method/synckv.hpp>
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
#include <type_traits>
#include <vector>

// One spelling per method for every exec: the alias over the default two-tier store in E's memory.
static_assert(std::is_same_v<kvsift::synckv<float, kvsift::exec::sim_cpp>::store_type,
                             kvsift::thrust::tiered_store<float, kvsift::exec::sim_cpp>>);
static_assert(std::is_same_v<kvsift::heterocache<kvsift::bfloat16, kvsift::exec::sim_omp>::store_type,
                             kvsift::thrust::tiered_store<kvsift::bfloat16, kvsift::exec::sim_omp>>);
static_assert(std::is_same_v<kvsift::freekv<float, kvsift::exec::sim_cpp>::store_type,
                             kvsift::thrust::tiered_store<float, kvsift::exec::sim_cpp>>);
static_assert(std::is_same_v<kvsift::freekv<float>::store_type, kvsift::store::tiered<float>>);
static_assert(std::is_same_v<kvsift::synckv<float>::exec_type, kvsift::exec::host>);

namespace {

namespace exec = kvsift::exec;
using kvsift::model_shape;
using kvsift::nhd;
using kvsift::thrust::buffer;
using kvsift::thrust::copy_to_device;
using kvsift::thrust::sim_arena;

#if defined(_OPENMP)
using device_execs = std::tuple<exec::sim_cpp, exec::sim_omp>;
#else
using device_execs = std::tuple<exec::sim_cpp>;
#endif

constexpr model_shape shape{.layers = 3, .q_heads = 8, .kv_heads = 4, .head_dim = 16};
constexpr int requests = 3;
constexpr int host_capacity = 96;
constexpr int tier_capacity = 96;

// Layer 0: clusters {0, 1} led by 0 and {2, 3} led by 3; layer 1: {1, 2} led by 2, {0, 3} led by
// 0; layer 2: {0, 1, 2} led by 0 and a lone representative 3 (a cluster without followers).
std::vector<kvsift::select::cluster_roles> roles() {
  return {{{0, 0, 1, 1}, {0, 3}}, {{1, 0, 0, 1}, {2, 0}}, {{0, 0, 0, 1}, {0, 3}}};
}
kvsift::synckv_recipe::params params_of(int stride) {
  return {.clusters = 2, .stride = stride, .rho = 0.5, .memory_fraction = 0.75, .roles = roles()};
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

template <class T, class E>
void run_pair(int stride, std::uint32_t seed,
              const kvsift::synckv_recipe::params& p = {}, int min_anticipations = 6,
              kvsift::far_tier far = kvsift::far_tier::recall) {
  auto params = p.roles.empty() ? params_of(stride) : p;
  params.far = far;
  const bool attend = far == kvsift::far_tier::attend;
  INFO("stride " << stride << " seed " << seed << " far " << kvsift::to_string(far));
  sim_arena engine_arena, arena;
  const E engine{engine_arena}, e{arena};
  std::mt19937 rng(seed);
  kvsift::store::tiered<T> hs(shape, requests, host_capacity);
  kvsift::thrust::tiered_store<T, E> ds(e, shape, requests, host_capacity, tier_capacity);
  kvsift::synckv<T> hm(hs, params);
  kvsift::synckv<T, E> dm(ds, params);
  const int H = shape.kv_heads, Q = shape.q_heads, d = shape.head_dim;
  using space = typename E::memory_space;
  using dchunk = typename kvsift::synckv<T, E>::chunk_type;

  // A prompt for request r: `n` tokens in 1-3 chunks; the chunks carry their newest queries.
  const auto prefill = [&](int r, int n) {
    const auto k = random_array<T>(rng, static_cast<std::size_t>(shape.layers) * n * H * d);
    const auto v = random_array<T>(rng, k.size());
    std::vector<float> q(static_cast<std::size_t>(shape.layers) * n * Q * d);
    for (auto& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
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
        kvsift::prefill_chunk<T> hc{r,
                                    kvsift::kv_view<const T, nhd>::contiguous(k.data() + ko, len, H, d),
                                    kvsift::kv_view<const T, nhd>::contiguous(v.data() + ko, len, H, d),
                                    kvsift::kv_view<const float, nhd>::contiguous(q.data() + qo, len, Q, d),
                                    at, last};
        dchunk dc{r,
                  kvsift::kv_view<const T, nhd, space>::contiguous(kd.device.data() + ko, len, H, d),
                  kvsift::kv_view<const T, nhd, space>::contiguous(vd.device.data() + ko, len, H, d),
                  kvsift::kv_view<const float, nhd, space>::contiguous(qd.device.data() + qo, len, Q, d),
                  at, last};
        hm.prefill(l, hc);
        dm.prefill(l, dc);
        at += len;
      }
    }
  };
  for (int r = 0; r < requests; ++r) prefill(r, 20 + static_cast<int>(rng() % 21));
  ds.check();
  CHECK(ds.resident_tokens() == hs.resident_tokens());

  buffer<float, E> out_d(engine, static_cast<std::size_t>(requests) * Q * d);
  std::vector<float> out_h(out_d.size());
  int anticipations = 0;
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
    std::vector<float> q(static_cast<std::size_t>(shape.layers) * B * Q * d);
    for (auto& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
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
      const auto want = kvsift_test::reads_of(hp);
      REQUIRE(plan_offsets == want.offsets);
      CHECK(positions == want.positions);
      for (const int r : batch) {
        CHECK(dm.anticipated(r, l) == hm.anticipated(r, l));
        CHECK(dm.recall_pending(r, l) == hm.recall_pending(r, l));
        CHECK(dm.step(r, l) == hm.step(r, l));
        CHECK(dm.prompt_end(r, l) == hm.prompt_end(r, l));
        anticipations += dm.anticipated(r, l) ? 1 : 0;
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
  }
  CHECK(anticipations >= min_anticipations);
  // the rows recalled: the rows installs copied, counted alike on both execs (a recall still
  // pending, or cancelled by reset, is counted on neither)
  CHECK(dm.stats().bytes_transferred == hm.stats().bytes_transferred);
  CHECK(dm.stats().far_rows == hm.stats().far_rows);
  // attend: every step's far partials ran as a host task beside its device part (exec::sim)
  CHECK(dm.stats().far_overlaps == (attend ? attends : 0));
  if (attend) {  // what recall would move is read where it lies
    CHECK(dm.stats().bytes_transferred == 0);
    CHECK((dm.stats().far_rows > 0) == (min_anticipations > 0));
    if (ds.far_installed()) {  // one policy per store: a recalling method over it is refused
      auto recall = params;
      recall.far = kvsift::far_tier::recall;
      REQUIRE_THROWS_WITH((kvsift::synckv<T, E>(ds, recall)),
                          Catch::Matchers::ContainsSubstring("one policy per store"));
    }
  } else {
    CHECK((dm.stats().bytes_transferred > 0) == (min_anticipations > 0));  // recalls happened
    CHECK(dm.stats().far_rows == 0);
  }
  ds.check();
  ds.verify();
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("device synckv: method<thrust::tiered_store> on exec::sim equals exec::host",
                        "[thrust][method][synckv]", device_execs) {
  using E = TestType;
  for (const int stride : {2, 3}) {
    for (const std::uint32_t seed : {21u, 22u}) {
      SECTION("f32 stride " + std::to_string(stride) + " seed " + std::to_string(seed)) {
        run_pair<float, E>(stride, seed);
      }
      SECTION("bf16 stride " + std::to_string(stride) + " seed " + std::to_string(seed)) {
        run_pair<kvsift::bfloat16, E>(stride, seed);
      }
      SECTION("f16 stride " + std::to_string(stride) + " seed " + std::to_string(seed)) {
        run_pair<kvsift::half, E>(stride, seed);
      }
    }
  }
}

// far_tier::attend over device memory: the followers' recalled rows stay in the pool; every plan
// reads the host's rows (resident and far), the merged attention equals the host's merged
// attention, nothing is recalled and the far rows counted are the host's.
TEMPLATE_LIST_TEST_CASE("device synckv: far attend reads the pool where it lies, as on the host",
                        "[thrust][method][synckv][far_tier]", device_execs) {
  using E = TestType;
  for (const int stride : {2, 3}) {
    SECTION("f32 stride " + std::to_string(stride)) {
      run_pair<float, E>(stride, 41u + stride, {}, 6, kvsift::far_tier::attend);
    }
    SECTION("bf16 stride " + std::to_string(stride)) {
      run_pair<kvsift::bfloat16, E>(stride, 43u + stride, {}, 6, kvsift::far_tier::attend);
    }
  }
}

// Every KV head its own representative (N_r = kv_heads): no follower, nothing placed, no budget
// (budget::synckv has no split without a follower); both keep every token, layer budgets -1.
TEMPLATE_LIST_TEST_CASE("device synckv: roles without a follower keep every token, as on the host",
                        "[thrust][method][synckv]", device_execs) {
  const std::vector<kvsift::select::cluster_roles> all_reps(
      static_cast<std::size_t>(shape.layers), kvsift::select::cluster_roles{{0, 1, 2, 3}, {0, 1, 2, 3}});
  const kvsift::synckv_recipe::params p{.clusters = shape.kv_heads, .stride = 2, .rho = 0.5,
                                        .memory_fraction = 0.75, .roles = all_reps};
  run_pair<float, TestType>(2, 31u, p, /*min_anticipations=*/0);
}

// The lazy copy queue: an anticipation after step t records the followers' next working sets;
// they show from step t + 1's decode, which installs them. Skipped, the followers keep their old
// rows (stale) and the plan differs from the host's; installed, it equals it again.
TEMPLATE_LIST_TEST_CASE("device synckv: a recall not installed leaves stale rows",
                        "[thrust][method][synckv]", device_execs) {
  using E = TestType;
  sim_arena engine_arena, arena;
  const E engine{engine_arena}, e{arena};
  constexpr model_shape one{.layers = 1, .q_heads = 8, .kv_heads = 4, .head_dim = 16};
  const std::vector<kvsift::select::cluster_roles> r1{{{0, 0, 1, 1}, {0, 3}}};
  const kvsift::synckv_recipe::params p{.clusters = 2, .stride = 2, .rho = 0.5,
                                        .memory_fraction = 0.75, .roles = r1};
  kvsift::store::tiered<float> hs(one, 1, 128);
  kvsift::thrust::tiered_store<float, E> ds(e, one, 1, 128, 128);
  kvsift::synckv<float> hm(hs, p);
  kvsift::synckv<float, E> dm(ds, p);
  std::mt19937 rng(5);
  const int H = one.kv_heads, Q = one.q_heads, d = one.head_dim, n = 64;
  using space = typename E::memory_space;
  const auto k = random_array<float>(rng, static_cast<std::size_t>(n) * H * d);
  const auto v = random_array<float>(rng, k.size());
  const auto q = random_array<float>(rng, static_cast<std::size_t>(n) * Q * d);
  twin<float, E> kd(engine, k), vd(engine, v), qd(engine, q);
  hm.prefill(0, kvsift::prefill_chunk<float>{0, kvsift::kv_view<const float, nhd>::contiguous(k.data(), n, H, d),
                                             kvsift::kv_view<const float, nhd>::contiguous(v.data(), n, H, d),
                                             kvsift::kv_view<const float, nhd>::contiguous(q.data(), n, Q, d),
                                             0, true});
  dm.prefill(0, typename kvsift::synckv<float, E>::chunk_type{
                    0, kvsift::kv_view<const float, nhd, space>::contiguous(kd.device.data(), n, H, d),
                    kvsift::kv_view<const float, nhd, space>::contiguous(vd.device.data(), n, H, d),
                    kvsift::kv_view<const float, nhd, space>::contiguous(qd.device.data(), n, Q, d), 0,
                    true});
  const int steps = 4;
  const auto sk = random_array<float>(rng, static_cast<std::size_t>(steps) * H * d);
  const auto sv = random_array<float>(rng, sk.size());
  const auto sq = random_array<float>(rng, static_cast<std::size_t>(steps) * Q * d);
  twin<float, E> skd(engine, sk), svd(engine, sv), sqd(engine, sq);
  const auto tok_h = [&](int t) {
    return kvsift::decode_token<float>{0, sq.data() + t * Q * d, sk.data() + t * H * d, sv.data() + t * H * d};
  };
  const auto tok_d = [&](int t) {
    return kvsift::decode_token<float>{0, sqd.device.data() + t * Q * d, skd.device.data() + t * H * d,
                                       svd.device.data() + t * H * d};
  };
  const auto follower_positions = [&](const auto& plan, int head) {
    return peek(plan.positions + plan.offsets[head], plan.offsets[head + 1] - plan.offsets[head]);
  };
  const auto host_positions = [&](const auto& plan, int head) {
    const auto s = plan.positions[head];
    return std::vector<std::int32_t>(s.begin(), s.end());
  };
  std::vector<std::int32_t> before;  // head 1's working set at step 2
  for (int t = 0; t < 2; ++t) {  // steps 1, 2: the anticipation after step 2
    hm.decode(0, tok_h(t));
    before = follower_positions(dm.decode(0, tok_d(t)), 1);
    hm.after_attention(0, tok_h(t));
    dm.after_attention(0, tok_d(t));
  }
  REQUIRE(dm.anticipated(0, 0));
  REQUIRE(dm.recall_pending(0, 0));
  auto& st = dm.schedule_state();
  const auto recorded = peek(st.recall_positions(0), st.at(0).pending_count);  // follower head 1
  // step 3 without the install: head 1 reads its old working set (+ the new token)
  st.debug_skip_installs(true);
  const auto& hp = hm.decode(0, tok_h(2));
  const auto old_plan = follower_positions(dm.decode(0, tok_d(2)), 1);
  auto want = host_positions(hp, 1);
  CHECK(want.back() == n + 2);
  want.pop_back();
  CHECK(recorded == want);  // what the install would have brought
  CHECK(old_plan != host_positions(hp, 1));
  CHECK(dm.recall_pending(0, 0));  // still queued
  // the stale state is deterministic: the rows of step 2 plus the new token
  before.push_back(n + 2);
  CHECK(old_plan == before);
}

// The capture laws over a longer context: 120 decode steps after a 300-token prompt, an
// anticipation every 5 (its fixed-size sort, scoring over a growing working set, the install at
// the next step): no step after the first allocates or reads back.
TEMPLATE_LIST_TEST_CASE("device synckv: no allocation or read-back in 120 decode steps",
                        "[thrust][method][synckv]", device_execs) {
  using E = TestType;
  sim_arena engine_arena, arena;
  const E engine{engine_arena}, e{arena};
  constexpr model_shape one{.layers = 1, .q_heads = 8, .kv_heads = 4, .head_dim = 32};
  const std::vector<kvsift::select::cluster_roles> r1{{{0, 0, 1, 0}, {1, 2}}};
  const kvsift::synckv_recipe::params p{.clusters = 2, .stride = 5, .rho = 0.5,
                                        .memory_fraction = 0.6, .roles = r1};
  const int steps = 120, n = 300;
  kvsift::thrust::tiered_store<float, E> ds(e, one, 1, n + steps, n + steps);
  kvsift::synckv<float, E> m(ds, p);
  std::mt19937 rng(9);
  const int H = one.kv_heads, Q = one.q_heads, d = one.head_dim;
  using space = typename E::memory_space;
  twin<float, E> k(engine, random_array<float>(rng, static_cast<std::size_t>(n) * H * d));
  twin<float, E> v(engine, random_array<float>(rng, k.host.size()));
  twin<float, E> q(engine, random_array<float>(rng, static_cast<std::size_t>(n) * Q * d));
  m.prefill(0, typename kvsift::synckv<float, E>::chunk_type{
                   0, kvsift::kv_view<const float, nhd, space>::contiguous(k.device.data(), n, H, d),
                   kvsift::kv_view<const float, nhd, space>::contiguous(v.device.data(), n, H, d),
                   kvsift::kv_view<const float, nhd, space>::contiguous(q.device.data(), n, Q, d), 0,
                   true});
  twin<float, E> sk(engine, random_array<float>(rng, static_cast<std::size_t>(steps) * H * d));
  twin<float, E> sv(engine, random_array<float>(rng, sk.host.size()));
  twin<float, E> sq(engine, random_array<float>(rng, static_cast<std::size_t>(steps) * Q * d));
  buffer<float, E> out(engine, static_cast<std::size_t>(Q) * d);
  int allocating_steps = 0, reading_steps = 0, anticipations = 0;
  for (int t = 0; t < steps; ++t) {
    const kvsift::decode_token<float> tok{0, sq.device.data() + static_cast<std::size_t>(t) * Q * d,
                                          sk.device.data() + static_cast<std::size_t>(t) * H * d,
                                          sv.device.data() + static_cast<std::size_t>(t) * H * d};
    const auto before = arena.counters();
    m.decode(0, tok);
    m.attend(0, tok, out.data());
    m.after_attention(0, tok);
    const auto after = arena.counters();
    if (t > 0 && after.allocations != before.allocations) ++allocating_steps;
    if (after.d2h_reads != before.d2h_reads) ++reading_steps;
    anticipations += m.anticipated(0, 0) ? 1 : 0;
  }
  CHECK(anticipations == steps / 5);
  CHECK(allocating_steps == 0);
  CHECK(reading_steps == 0);
  CHECK(m.stats().bytes_transferred > 0);
  ds.check();
  ds.verify();
}
