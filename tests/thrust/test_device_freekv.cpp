// SPDX-License-Identifier: Apache-2.0
// FreeKV over device memory (device/speculative.hpp): method<thrust::tiered_store<T, E>,
// freekv_recipe, E> on exec::sim, run beside kvsift::freekv<T> on exec::host over store::tiered
// with the same inputs: ragged batches (a random subset of the requests each step, in random
// order), chunked prefill (the last chunk with or without queries), a reset request re-prefilled
// mid-decode, f32/f16/bf16, CPP and (OpenMP builds) OMP, dense_layers 0 and 1, small pages
// (p = 4, B = 32, S = 4, W = 8) so that prompts start under and over the budget, queries that
// drift around the trigger's threshold (both corrections and speculative reuses happen). Laws:
//   parity   every plan (requests, per-head counts, original positions, pages) equals the host's
//            (slots differ by design: the device tier's slots are unordered), the corrections per
//            segment and in all, steps, resident tokens, refreshes and layer budgets too, and
//            attend()'s output equals the host's to 2e-5 relative;
//   capture  every decode step (decode + attend + after_attention) after the first, correcting
//            or not, allocates nothing and reads nothing back (exec::sim's counters).
// Under far_tier::attend the plans (resident and far positions), outputs and far rows equal the
// host's with nothing recalled. And: a chosen selection that is not installed leaves stale rows;
// bad input throws
// kvsift::error and leaves the store (and the method) as they were; a device tier too small for
// a call's chunks or a step's working set is refused before anything changes.

#include "../plan_reads.hpp"

#include <kvsift/device/erased.hpp>
#include <kvsift/device/speculative.hpp>
#include <kvsift/method/freekv.hpp>
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

#if defined(_OPENMP)
using device_execs = std::tuple<exec::sim_cpp, exec::sim_omp>;
#else
using device_execs = std::tuple<exec::sim_cpp>;
#endif

template <class U, class Space = kvsift::host_space>
using cview = kvsift::kv_view<const U, nhd, Space>;

constexpr model_shape shape{.layers = 3, .q_heads = 8, .kv_heads = 4, .head_dim = 16};
constexpr int requests = 3;
constexpr int host_capacity = 96;
constexpr int tier_capacity = 96;
constexpr int page = 4;

kvsift::freekv_recipe::params params_of(int dense_layers) {
  return {.page_size = page, .budget = 32, .sink = 4, .window = 8, .tau = 0.8,
          .dense_layers = dense_layers};
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
std::vector<std::int32_t> values_of(const kvsift::index_sets& s) {
  return std::vector<std::int32_t>(s.values.begin(), s.values.end());
}
std::vector<std::int32_t> offsets_of(const kvsift::index_sets& s) {
  return std::vector<std::int32_t>(s.offsets.begin(), s.offsets.end());
}

// Every head-sequence's working set holds the same positions on both (the device's plan order is
// by position, as store::tiered's slots).
template <class T, class E>
void check_working_sets(const kvsift::store::tiered<T>& hs,
                        const kvsift::thrust::tiered_store<T, E>& ds) {
  for (std::int64_t seq = 0; seq < ds.sequences(); ++seq) {
    INFO("head-sequence " << seq);
    REQUIRE(ds.length(seq) == hs.length(seq));
    std::vector<std::int32_t> want;
    for (int i = 0; i < hs.length(seq); ++i) want.push_back(hs.position(seq, i));
    CHECK(peek(ds.plan_positions() + seq * ds.tier_capacity(), ds.length(seq)) == want);
  }
}

// Each request's query per layer drifts: q_t = 0.8 q_{t-1} + 0.6 noise (a group-mean cosine
// around 0.8, the trigger's threshold), so some heads correct and others reuse.
struct drifting_queries {
  static constexpr int row_size = shape.q_heads * shape.head_dim;
  std::vector<float> q;  // [requests, layers, q_heads, d]
  explicit drifting_queries(std::mt19937& rng)
      : q(random_array<float>(rng, static_cast<std::size_t>(requests) * shape.layers * row_size)) {}
  const float* next(std::mt19937& rng, int r, int l) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    float* row = q.data() + (static_cast<std::size_t>(r) * shape.layers + l) * row_size;
    for (int j = 0; j < row_size; ++j) row[j] = 0.8f * row[j] + 0.6f * nd(rng);
    return row;
  }
};

// FreeKV's recipe with a budgeter of 48 tokens where the params say 32: both execs keep what the
// recipe's Budgeter gives.
struct freekv_wider : kvsift::freekv_recipe {
  static parts make_parts(const params& p) {
    auto x = kvsift::freekv_recipe::make_parts(p);
    x.budgeter.p.tokens = p.budget + 16;
    return x;
  }
};

template <class T, class E, class Recipe = kvsift::freekv_recipe>
void run_pair(std::uint32_t seed, int dense_layers, kvsift::far_tier far = kvsift::far_tier::recall) {
  auto params = params_of(dense_layers);
  params.far = far;
  const bool attend = far == kvsift::far_tier::attend;
  INFO("seed " << seed << " dense_layers " << dense_layers << " far " << kvsift::to_string(far));
  sim_arena engine_arena, arena;
  const E engine{engine_arena}, e{arena};
  std::mt19937 rng(seed);
  kvsift::store::tiered<T> hs(shape, requests, host_capacity, page);
  kvsift::thrust::tiered_store<T, E> ds(e, shape, requests, host_capacity, tier_capacity);
  using device_method = kvsift::method<kvsift::thrust::tiered_store<T, E>, Recipe, E>;
  kvsift::method<kvsift::store::tiered<T>, Recipe, exec::host> hm(hs, params);
  device_method dm(ds, params);
  const int H = shape.kv_heads, Q = shape.q_heads, d = shape.head_dim;
  using space = typename E::memory_space;
  using dchunk = typename device_method::chunk_type;
  drifting_queries queries(rng);

  // A prompt for request r: `n` tokens in 1-3 chunks; the chunks carry their newest queries,
  // but the last chunk carries none when `last_queries` is false (FreeKV then places sink and
  // window).
  const auto prefill = [&](int r, int n, bool last_queries) {
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
        const int qt = last && !last_queries ? 0 : len;
        kvsift::prefill_chunk<T> hc{r, cview<T>::contiguous(k.data() + ko, len, H, d),
                                    cview<T>::contiguous(v.data() + ko, len, H, d),
                                    cview<float>::contiguous(q.data() + qo, qt, Q, d), at, last};
        dchunk dc{r, cview<T, space>::contiguous(kd.device.data() + ko, len, H, d),
                  cview<T, space>::contiguous(vd.device.data() + ko, len, H, d),
                  cview<float, space>::contiguous(qd.device.data() + qo, qt, Q, d), at, last};
        hm.prefill(l, hc);
        dm.prefill(l, dc);
        at += len;
      }
    }
  };
  // request 0 over the budget without a query at its end, the others random
  prefill(0, 33 + static_cast<int>(rng() % 12), false);
  for (int r = 1; r < requests; ++r) prefill(r, 14 + static_cast<int>(rng() % 31), rng() % 3 != 0);
  ds.check();
  check_working_sets(hs, ds);

  buffer<float, E> out_d(engine, static_cast<std::size_t>(requests) * Q * d);
  std::vector<float> out_h(out_d.size());
  int corrections = 0, reuses = 0;
  std::int64_t attends = 0;  // layer attentions
  for (int step = 0; step < 24; ++step) {
    if (step == 9) {  // continuous batching: request 1 ends, a new prompt takes its slot
      hm.reset(1);
      dm.reset(1);
      prefill(1, 12 + static_cast<int>(rng() % 30), rng() % 3 != 0);
      if (!attend) check_working_sets(hs, ds);  // attend: the host's far rows are not resident
    }
    std::vector<int> batch(requests);
    std::iota(batch.begin(), batch.end(), 0);
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(step % 4 == 0 ? requests : 1 + rng() % requests);
    const std::size_t B = batch.size();
    const auto k = random_array<T>(rng, static_cast<std::size_t>(shape.layers) * B * H * d);
    const auto v = random_array<T>(rng, k.size());
    std::vector<float> q(static_cast<std::size_t>(shape.layers) * B * Q * d);
    for (int l = 0; l < shape.layers; ++l) {
      for (std::size_t i = 0; i < B; ++i) {
        const float* row = queries.next(rng, batch[i], l);
        std::copy_n(row, Q * d, q.data() + (static_cast<std::size_t>(l) * B + i) * Q * d);
      }
    }
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
      const auto plan_requests = dp.requests;
      const auto plan_offsets = dp.offsets;
      const auto page_offsets = dp.page_offsets;
      const auto positions = peek(dp.positions, dp.size());
      const auto pages = peek(dp.pages, dp.page_offsets.back());
      hm.after_attention(l, th);
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
      REQUIRE(page_offsets == offsets_of(hp.pages));
      CHECK(pages == values_of(hp.pages));
      const auto& flags = dm.corrections();  // read back, outside the step
      REQUIRE(flags == hm.corrections());
      for (std::size_t s = 0; s < flags.size(); ++s) {
        const int r = batch[s / H];
        const bool over =
            hp.pages.size(static_cast<int>(s)) == params.budget / page && l >= dense_layers;
        corrections += flags[s];
        reuses += over && hm.step(r, l) >= 2 && flags[s] == 0 ? 1 : 0;
      }
      for (const int r : batch) CHECK(dm.step(r, l) == hm.step(r, l));
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
    if (!attend) check_working_sets(hs, ds);
    CHECK(dm.corrections_made() == hm.corrections_made());
    CHECK(dm.stats().layer_budgets == hm.stats().layer_budgets);
    CHECK(hm.stats().layer_budgets.back() == hm.parts().budgeter.p.tokens);  // the recipe's
    CHECK(dm.stats().refreshes == hm.stats().refreshes);
  }
  CHECK(corrections > 0);
  CHECK(reuses > 0);
  CHECK(dm.corrections_made() == corrections);
  // rows recalled: the rows installs copied into the working set, counted alike on both execs
  // (a speculation discarded by a correction, or still pending, is not counted)
  CHECK((dm.stats().bytes_transferred > 0) == !attend);  // attend reads them where they lie
  CHECK(dm.stats().bytes_transferred == hm.stats().bytes_transferred);
  CHECK((dm.stats().far_rows > 0) == attend);
  CHECK(dm.stats().far_rows == hm.stats().far_rows);
  // attend: every step's far partials ran as a host task beside its device part (exec::sim)
  CHECK(dm.stats().far_overlaps == (attend ? attends : 0));
  CHECK(dm.stats().stalls == 0);
  ds.check();
  ds.verify();
}

// A one-layer FreeKV pair over one request with a prompt of n tokens (all with queries).
template <class E>
struct single {
  static constexpr model_shape one{.layers = 1, .q_heads = 8, .kv_heads = 4, .head_dim = 16};
  sim_arena engine_arena, arena;
  E engine{engine_arena}, e{arena};
  kvsift::store::tiered<float> hs;
  kvsift::thrust::tiered_store<float, E> ds;
  kvsift::freekv<float> hm;
  kvsift::freekv<float, E> dm;
  std::mt19937 rng{5};
  std::vector<float> sk, sv, sq;
  buffer<float, E> skd{engine, 0}, svd{engine, 0}, sqd{engine, 0};

  single(int n, int steps, const kvsift::freekv_recipe::params& p, int tier)
      : hs(one, 1, n + steps, p.page_size), ds(e, one, 1, n + steps, tier), hm(hs, p), dm(ds, p) {
    const int H = one.kv_heads, Q = one.q_heads, d = one.head_dim;
    using space = typename E::memory_space;
    const auto k = random_array<float>(rng, static_cast<std::size_t>(n) * H * d);
    const auto v = random_array<float>(rng, k.size());
    const auto q = random_array<float>(rng, static_cast<std::size_t>(n) * Q * d);
    twin<float, E> kd(engine, k), vd(engine, v), qd(engine, q);
    hm.prefill(0, kvsift::prefill_chunk<float>{0, cview<float>::contiguous(k.data(), n, H, d),
                                               cview<float>::contiguous(v.data(), n, H, d),
                                               cview<float>::contiguous(q.data(), n, Q, d), 0,
                                               true});
    dm.prefill(0, typename kvsift::freekv<float, E>::chunk_type{
                      0, cview<float, space>::contiguous(kd.device.data(), n, H, d),
                      cview<float, space>::contiguous(vd.device.data(), n, H, d),
                      cview<float, space>::contiguous(qd.device.data(), n, Q, d), 0, true});
    sk = random_array<float>(rng, static_cast<std::size_t>(steps) * H * d);
    sv = random_array<float>(rng, sk.size());
    sq = random_array<float>(rng, static_cast<std::size_t>(steps) * Q * d);
    for (int t = 1; t < steps; ++t) {  // drifting queries
      for (int j = t * Q * d; j < (t + 1) * Q * d; ++j) sq[j] = 0.8f * sq[j - Q * d] + 0.6f * sq[j];
    }
    skd = buffer<float, E>(engine, sk.size());
    svd = buffer<float, E>(engine, sv.size());
    sqd = buffer<float, E>(engine, sq.size());
    copy_to_device(engine, std::span<const float>(sk), skd);
    copy_to_device(engine, std::span<const float>(sv), svd);
    copy_to_device(engine, std::span<const float>(sq), sqd);
  }
  kvsift::decode_token<float> host(int t) const {
    const int H = one.kv_heads, Q = one.q_heads, d = one.head_dim;
    return {0, sq.data() + t * Q * d, sk.data() + t * H * d, sv.data() + t * H * d};
  }
  kvsift::decode_token<float> device(int t) const {
    const int H = one.kv_heads, Q = one.q_heads, d = one.head_dim;
    return {0, sqd.data() + t * Q * d, skd.data() + t * H * d, svd.data() + t * H * d};
  }
  // A full step on both; returns the device plan's positions of head h.
  std::vector<std::int32_t> step(int t, int h) {
    hm.decode(0, host(t));
    const auto& dp = dm.decode(0, device(t));
    auto got = peek(dp.positions + dp.offsets[h], dp.offsets[h + 1] - dp.offsets[h]);
    hm.after_attention(0, host(t));
    dm.after_attention(0, device(t));
    return got;
  }
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("device freekv: method<thrust::tiered_store> on exec::sim equals "
                        "exec::host",
                        "[thrust][method][freekv]", device_execs) {
  using E = TestType;
  for (const int dense_layers : {0, 1}) {
    for (const std::uint32_t seed : {41u, 42u}) {
      const std::string tag =
          " dense " + std::to_string(dense_layers) + " seed " + std::to_string(seed);
      SECTION("f32" + tag) { run_pair<float, E>(seed, dense_layers); }
      SECTION("bf16" + tag) { run_pair<kvsift::bfloat16, E>(seed, dense_layers); }
      SECTION("f16" + tag) { run_pair<kvsift::half, E>(seed, dense_layers); }
    }
  }
}

// far_tier::attend over device memory: the pages a step needs stay in the pool; every plan reads
// the host's rows (resident and far), the merged attention equals the host's merged attention,
// nothing is recalled and the far rows counted are the host's.
TEMPLATE_LIST_TEST_CASE("device freekv: far attend reads the pool where it lies, as on the host",
                        "[thrust][method][freekv][far_tier]", device_execs) {
  using E = TestType;
  SECTION("f32 dense 0") { run_pair<float, E>(61u, 0, kvsift::far_tier::attend); }
  SECTION("bf16 dense 1") { run_pair<kvsift::bfloat16, E>(62u, 1, kvsift::far_tier::attend); }
}

TEMPLATE_LIST_TEST_CASE("device freekv: a recipe with its own budgeter equals exec::host",
                        "[thrust][method][freekv]", device_execs) {
  using E = TestType;
  run_pair<float, E, freekv_wider>(43u, 1);
  run_pair<kvsift::bfloat16, E, freekv_wider>(44u, 0);
}

// The speculative selection recorded after step t is installed by step t + 1's decode. Skipped,
// the working set keeps its old rows plus the new token (stale: not what the plan's pages say);
// the next step's install brings the chosen pages again and the plans agree.
TEMPLATE_LIST_TEST_CASE("device freekv: a selection not installed leaves stale rows",
                        "[thrust][method][freekv]", device_execs) {
  const kvsift::freekv_recipe::params p{.page_size = 4, .budget = 32, .sink = 4, .window = 8,
                                        .tau = -1.0, .dense_layers = 0};  // never corrects
  single<TestType> s(64, 7, p, 80);
  std::vector<std::int32_t> before;  // head 1's working set at step 4 (68 tokens, 17 pages)
  for (int t = 0; t < 4; ++t) before = s.step(t, 1);
  REQUIRE(s.dm.schedule_state().selection_pending(0));
  s.dm.schedule_state().debug_skip_installs(true);
  // step 5 opens page 17: the window moves, the pages chosen differ from the rows held
  const auto& hp = s.hm.decode(0, s.host(4));
  const auto& dp = s.dm.decode(0, s.device(4));
  const auto stale = peek(dp.positions + dp.offsets[1], dp.offsets[2] - dp.offsets[1]);
  const auto want = std::vector<std::int32_t>(hp.positions[1].begin(), hp.positions[1].end());
  CHECK(stale != want);
  before.push_back(64 + 4);  // the rows of step 4, plus the new token: deterministic
  CHECK(stale == before);
  // the plan's pages still say what was chosen
  CHECK(peek(dp.pages + dp.page_offsets[1], dp.page_offsets[2] - dp.page_offsets[1]) ==
        std::vector<std::int32_t>(hp.pages[1].begin(), hp.pages[1].end()));
  s.hm.after_attention(0, s.host(4));
  s.dm.after_attention(0, s.device(4));
  s.dm.schedule_state().debug_skip_installs(false);
  s.hm.decode(0, s.host(5));
  const auto& dp2 = s.dm.decode(0, s.device(5));
  const auto& hp2 = s.hm.plan();
  CHECK(peek(dp2.positions, dp2.size()) ==
        std::vector<std::int32_t>(hp2.positions.values.begin(), hp2.positions.values.end()));
  s.ds.verify();
}

// The capture laws over a longer context: 120 decode steps after a 300-token prompt (p = 16,
// B = 128): selections every step, corrections and reuses, installs of the chosen pages; no step
// after the first allocates or reads back.
TEMPLATE_LIST_TEST_CASE("device freekv: no allocation or read-back in 120 decode steps",
                        "[thrust][method][freekv]", device_execs) {
  using E = TestType;
  const kvsift::freekv_recipe::params p{.page_size = 16, .budget = 128, .sink = 16, .window = 32,
                                        .tau = 0.8, .dense_layers = 0};
  const int steps = 120, n = 300;
  single<E> s(n, steps, p, n + steps);
  constexpr model_shape one = single<E>::one;
  buffer<float, E> out(s.engine, static_cast<std::size_t>(one.q_heads) * one.head_dim);
  int allocating_steps = 0, reading_steps = 0;
  for (int t = 0; t < steps; ++t) {
    const auto tok = s.device(t);
    const auto before = s.arena.counters();
    s.dm.decode(0, tok);
    s.dm.attend(0, tok, out.data());
    s.dm.after_attention(0, tok);
    const auto after = s.arena.counters();
    if (t > 0 && after.allocations != before.allocations) ++allocating_steps;
    if (after.d2h_reads != before.d2h_reads) ++reading_steps;
  }
  CHECK(allocating_steps == 0);
  CHECK(reading_steps == 0);
  const auto made = s.dm.corrections_made();
  CHECK(made > 0);
  CHECK(made < static_cast<std::int64_t>(steps - 1) * one.kv_heads);  // some reuse
  CHECK(s.dm.stats().bytes_transferred > 0);
  // B/p - 1 full pages and the current one
  const int pool = n + steps;
  const int held = (128 / 16 - 1) * 16 + pool - (pool - 1) / 16 * 16;
  CHECK(s.ds.resident_tokens() == one.kv_heads * held);
  s.ds.check();
  s.ds.verify();
}

// Bad input: each refused call throws kvsift::error naming the argument, and the store and the
// method are as before (the pair stays equal afterwards).
TEMPLATE_LIST_TEST_CASE("device freekv: bad input throws and leaves the store unchanged",
                        "[thrust][method][freekv]", device_execs) {
  using E = TestType;
  const kvsift::freekv_recipe::params p{.page_size = 4, .budget = 32, .sink = 4, .window = 8,
                                        .tau = 0.8, .dense_layers = 0};
  single<E> s(40, 8, p, 48);
  using space = typename E::memory_space;
  for (int t = 0; t < 2; ++t) s.step(t, 0);
  const auto resident = s.ds.resident_tokens();
  const auto pool = s.ds.host_length(0, 0);
  const auto before = s.dm.stats();
  // a prompt chunk while a selection is pending
  buffer<float, E> kv(s.engine, static_cast<std::size_t>(4) * 16);
  const auto view = cview<float, space>::contiguous(kv.data(), 1, 4, 16);
  const typename kvsift::freekv<float, E>::chunk_type chunk{0, view, view, {}, 100, true};
  REQUIRE_THROWS_WITH(s.dm.prefill(0, chunk), Catch::Matchers::ContainsSubstring("reset it first"));
  // a request out of range, a layer out of range, a null query
  auto tok = s.device(2);
  tok.request = 3;
  REQUIRE_THROWS_AS(s.dm.decode(0, tok), kvsift::error);
  REQUIRE_THROWS_AS(s.dm.decode(1, s.device(2)), kvsift::error);
  tok = s.device(2);
  tok.query = nullptr;
  REQUIRE_THROWS_WITH(s.dm.decode(0, tok), Catch::Matchers::ContainsSubstring("query"));
  // bad params: a budget below sink + window
  auto bad = p;
  bad.budget = 8;
  REQUIRE_THROWS_WITH((kvsift::freekv<float, E>(s.ds, bad)),
                      Catch::Matchers::ContainsSubstring("budget"));
  CHECK(s.ds.resident_tokens() == resident);
  CHECK(s.ds.host_length(0, 0) == pool);
  CHECK(s.dm.stats().refreshes == before.refreshes);
  s.ds.verify();
  // still the host's twin
  for (int t = 2; t < 8; ++t) {
    s.step(t, 0);
    const auto& hp = s.hm.plan();
    const auto& dp = s.dm.plan();
    CHECK(peek(dp.positions, dp.size()) ==
          std::vector<std::int32_t>(hp.positions.values.begin(), hp.positions.values.end()));
    CHECK(s.dm.corrections() == s.hm.corrections());
  }
}

// A device tier too small for the prompt: the chunk is refused before anything is appended; a
// tier too small for a step's working set refuses the step before its token is appended.
TEMPLATE_LIST_TEST_CASE("device freekv: no room in the device tier is refused up front",
                        "[thrust][method][freekv]", device_execs) {
  using E = TestType;
  sim_arena arena;
  const E e{arena};
  constexpr model_shape one{.layers = 1, .q_heads = 8, .kv_heads = 4, .head_dim = 16};
  kvsift::thrust::tiered_store<float, E> ds(e, one, 1, 64, 24);
  kvsift::freekv<float, E> dm(
      ds, {.page_size = 4, .budget = 32, .sink = 4, .window = 8, .dense_layers = 0});
  using space = typename E::memory_space;
  buffer<float, E> kv(e, static_cast<std::size_t>(30) * 4 * 16);
  ::thrust::fill_n(e.policy(), kv.data(), kv.size(), 0.5f);
  // two chunks in one call: 20 tokens fit, 20 + 10 do not; the first is not appended either
  using chunk = typename kvsift::freekv<float, E>::chunk_type;
  const auto v20 = cview<float, space>::contiguous(kv.data(), 20, 4, 16);
  const auto v10 = cview<float, space>::contiguous(kv.data(), 10, 4, 16);
  const std::vector<chunk> chunks{{0, v20, v20, {}, 0, false}, {0, v10, v10, {}, 20, true}};
  REQUIRE_THROWS_WITH(dm.prefill(0, chunks), Catch::Matchers::ContainsSubstring("device tier"));
  CHECK(ds.host_length(0, 0) == 0);
  CHECK(ds.resident_tokens() == 0);
  // a 24-token prompt fits; its first step needs 25 rows
  const auto v24 = cview<float, space>::contiguous(kv.data(), 24, 4, 16);
  dm.prefill(0, chunk{0, v24, v24, {}, 0, true});
  CHECK(ds.resident_tokens() == 4 * 24);
  const kvsift::decode_token<float> tok{0, kv.data(), kv.data(), kv.data()};
  REQUIRE_THROWS_WITH(dm.decode(0, tok), Catch::Matchers::ContainsSubstring("device tier"));
  CHECK(dm.step(0, 0) == 0);
  CHECK(ds.host_length(0, 0) == 24);
  CHECK(ds.resident_tokens() == 4 * 24);
  ds.verify();
}

// The lead's integration path: device::staged_method runs freekv<T, E> behind the type-erased
// interface (host arrays in, a host plan out) and answers as freekv<T> on exec::host does.
TEST_CASE("device freekv: through device::staged_method, as on exec::host",
          "[thrust][method][freekv]") {
  using E = exec::sim_cpp;
  const auto p = params_of(1);
  kvsift::device::staged_method<kvsift::freekv<float, E>> dm("freekv", shape, requests,
                                                                 host_capacity, p);
  kvsift::store::tiered<float> hs(shape, requests, host_capacity, page);
  kvsift::freekv<float> hm(hs, p);
  std::mt19937 rng(77);
  const int H = shape.kv_heads, Q = shape.q_heads, d = shape.head_dim;
  for (int r = 0; r < requests; ++r) {
    const int n = 30 + 5 * r;
    const auto k = random_array<float>(rng, static_cast<std::size_t>(n) * H * d);
    const auto v = random_array<float>(rng, k.size());
    const auto q = random_array<float>(rng, static_cast<std::size_t>(n) * Q * d);
    const kvsift::prefill_chunk<float> c{r, cview<float>::contiguous(k.data(), n, H, d),
                                         cview<float>::contiguous(v.data(), n, H, d),
                                         cview<float>::contiguous(q.data(), n, Q, d), 0, true};
    for (int l = 0; l < shape.layers; ++l) {
      hm.prefill(l, c);
      dm.prefill(l, std::span<const kvsift::prefill_chunk<float>>(&c, 1));
    }
  }
  drifting_queries queries(rng);
  std::vector<float> out_h(static_cast<std::size_t>(requests) * Q * d), out_d(out_h.size());
  for (int step = 0; step < 12; ++step) {
    for (int l = 0; l < shape.layers; ++l) {
      INFO("step " << step << " layer " << l);
      const auto k = random_array<float>(rng, static_cast<std::size_t>(requests) * H * d);
      const auto v = random_array<float>(rng, k.size());
      std::vector<float> q(static_cast<std::size_t>(requests) * Q * d);
      std::vector<kvsift::decode_token<float>> tokens(requests);
      for (int r = 0; r < requests; ++r) {
        std::copy_n(queries.next(rng, r, l), Q * d, q.data() + static_cast<std::size_t>(r) * Q * d);
        tokens[r] = {r, q.data() + static_cast<std::size_t>(r) * Q * d,
                     k.data() + static_cast<std::size_t>(r) * H * d,
                     v.data() + static_cast<std::size_t>(r) * H * d};
      }
      const auto& hp = hm.decode(l, tokens);
      const auto& dp = dm.decode(l, tokens);
      CHECK(values_of(dp.positions) == values_of(hp.positions));
      CHECK(offsets_of(dp.pages) == offsets_of(hp.pages));
      CHECK(values_of(dp.pages) == values_of(hp.pages));
      hm.attend(l, tokens, out_h.data());
      dm.attend(l, tokens, out_d.data());
      for (std::size_t j = 0; j < out_h.size(); ++j) {
        CHECK(std::abs(out_d[j] - out_h[j]) <= 2e-5f * (1.0f + std::abs(out_h[j])));
      }
      hm.after_attention(l, tokens);
      dm.after_attention(l, tokens);
    }
  }
  CHECK(dm.stats().refreshes == hm.stats().refreshes);
  CHECK(dm.stats().resident_tokens == hm.stats().resident_tokens);
  CHECK(hm.corrections_made() > 0);
}
