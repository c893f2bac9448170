// SPDX-License-Identifier: Apache-2.0
// method<> over device memory (device/evict.hpp, device/sparse_read.hpp): full KV, StreamingLLM,
// H2O, SnapKV, PyramidKV, DynamicKV, LagKV and Quest
// as method<thrust::dense_store<T, E>, Recipe, E> on exec::sim, run beside the same method on
// exec::host over store::dense with the same inputs: ragged batches (a random subset of the
// requests each step, in random order), chunked prefill, a reset request re-prefilled
// mid-decode, f32/f16/bf16, CPP and (OpenMP builds) OMP. Laws:
//   parity   every plan (requests, per-head counts, original positions) equals the host's, the
//            resident tokens and per-layer budgets too, and attend()'s output equals the host's
//            to 2e-5 (the host attention's exp is its own vectorised one, within 2e-5 of the
//            reference's; the device's selections read no attention output but their own);
//   capture  every decode step (decode + attend + after_attention) after the first allocates
//            nothing and reads nothing back (exec::sim's counters: R1, R2).
// The test reads device results by pointer after the counters are sampled: the inspection is the
// test's, not the method's.

#include <kvsift/method/baselines.hpp>
#include <kvsift/method/dynamickv.hpp>
#include <kvsift/method/lagkv.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/device/evict.hpp>
#include <kvsift/device/sparse_read.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/paged_store.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
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

constexpr model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 16};
constexpr int requests = 3;
constexpr int capacity = 64;

// The five compositions, each as (host method, device method, params for either).
template <class T, class E, class DeviceStore = kvsift::thrust::dense_store<T, E>>
struct compositions {
  using host_store = kvsift::store::dense<T>;
  using device_store = DeviceStore;
  template <template <class, class> class M>
  using pair = std::pair<M<host_store, exec::host>, M<device_store, E>>;
};

template <class S, class E> using full_kv_t = kvsift::full_kv<S, E>;
template <class S, class E> using streaming_t = kvsift::streaming_llm<S, E>;
template <class S, class E> using h2o_t = kvsift::h2o<S, E>;
template <class S, class E> using snapkv_t = kvsift::snapkv<S, E>;
template <class S, class E> using pyramidkv_t = kvsift::pyramidkv<S, E>;
template <class S, class E> using lagkv_t = kvsift::lagkv<S, E>;
template <class S, class E> using dynamickv_t = kvsift::dynamickv<S, E>;
template <class S, class E> using quest_t = kvsift::quest<S, E>;
// Recipes that recombine parts across papers: H2O's running attention under PyramidKV's budgets,
// and SnapKV's window vote re-run after every decode step (StreamingLLM's trigger) under them.
template <class S, class E>
using h2o_pyramid_t = kvsift::method<S,
                                     kvsift::recipe<kvsift::score::cumulative_attention, kvsift::select::topk,
                                                    kvsift::budget::pyramid, kvsift::trigger::every_step>,
                                     E>;
template <class S, class E>
using snapkv_rolling_t = kvsift::method<S,
                                        kvsift::recipe<kvsift::score::window_attention, kvsift::select::topk,
                                                       kvsift::budget::pyramid, kvsift::trigger::every_step>,
                                        E>;

// Host arrays of T and their device copies.
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

// Reads n values at a device pointer (the test's inspection of sim memory, not counted).
template <class U>
std::vector<U> peek(const U* p, std::int64_t n) {
  return std::vector<U>(p, p + n);
}

// The device store of a run: a thrust::dense_store, or a thrust::paged_store of pages of 5 tokens
// (a last page part-full) whose pool holds a full cache's pages, with the side column H2O needs.
constexpr int page = 5;
template <class DS, class E>
std::unique_ptr<DS> make_device_store(const E& e, const model_shape& sh) {
  if constexpr (std::is_same_v<DS, kvsift::thrust::dense_store<typename DS::element_type, E>>) {
    return std::make_unique<DS>(e, sh, requests, capacity, /*columns=*/1);
  } else {
    const int pool = requests * sh.layers * sh.kv_heads * ((capacity + page - 1) / page);
    return std::make_unique<DS>(e, sh, requests, capacity, page, pool, /*columns=*/1);
  }
}

// `e` runs the method (its arena is the one counted); `engine` holds what the engine hands over
// (the prompts and the step's tokens), in E's memory space but allocated apart, as an engine's
// activations are its own. A prompt comes in 1-3 chunks, handed over one call each or all in one
// prefill call.
template <class T, class E, class HostM, class DevM, class Params>
void run_pair(const E& e, sim_arena& arena, const E& engine, const Params& params,
              std::uint32_t seed, const std::string& name, const model_shape& shape) {
  INFO(name << " seed " << seed << " q_heads " << shape.q_heads << " kv_heads " << shape.kv_heads);
  std::mt19937 rng(seed);
  kvsift::store::dense<T> hs(shape, requests, capacity);
  const auto dsp = make_device_store<typename DevM::store_type>(e, shape);
  auto& ds = *dsp;
  HostM hm(hs, params);
  DevM dm(ds, params);
  const int H = shape.kv_heads, Q = shape.q_heads, d = shape.head_dim;
  using space = typename E::memory_space;
  using dchunk = typename DevM::chunk_type;

  // A prompt for request r: `n` tokens in 1-3 chunks, every query handed over; the chunks of a
  // layer in one prefill call or one call each.
  const auto prefill = [&](int r, int n) {
    const auto k = random_array<T>(rng, static_cast<std::size_t>(shape.layers) * n * H * d);
    const auto v = random_array<T>(rng, k.size());
    std::vector<float> q(static_cast<std::size_t>(shape.layers) * n * Q * d);
    for (auto& x : q) x = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    twin<T, E> kd(engine, k), vd(engine, v);
    twin<float, E> qd(engine, q);
    const int pieces = 1 + static_cast<int>(rng() % 3);
    const bool one_call = rng() % 2 == 0;
    for (int l = 0; l < shape.layers; ++l) {
      std::vector<kvsift::prefill_chunk<T>> hcs;
      std::vector<dchunk> dcs;
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
        if (one_call) {
          hcs.push_back(hc);
          dcs.push_back(dc);
        } else {
          hm.prefill(l, hc);
          dm.prefill(l, dc);
        }
        at += len;
      }
      if (one_call) {
        hm.prefill(l, std::span<const kvsift::prefill_chunk<T>>(hcs));
        dm.prefill(l, std::span<const dchunk>(dcs));
      }
    }
  };
  for (int r = 0; r < requests; ++r) prefill(r, 10 + static_cast<int>(rng() % 31));
  ds.check();

  buffer<float, E> out_d(engine, static_cast<std::size_t>(requests) * Q * d);
  std::vector<float> out_h(out_d.size());
  for (int step = 0; step < 14; ++step) {
    if (step == 6) {  // continuous batching: request 1 ends, a new prompt takes its slot
      hm.reset(1);
      dm.reset(1);
      prefill(1, 12 + static_cast<int>(rng() % 20));
    }
    std::vector<int> batch(requests);
    std::iota(batch.begin(), batch.end(), 0);
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(1 + rng() % requests);
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
      hm.after_attention(l, th);
      const auto& plan_requests = dp.requests;
      const auto plan_offsets = dp.offsets;
      const auto positions = peek(dp.positions, dp.size());
      const auto slots = peek(dp.slots, dp.size());
      dm.after_attention(l, td);
      const auto after = arena.counters();
      INFO("step " << step << " layer " << l);
      if (step > 0) {  // the capture laws after the warm-up step
        CHECK(after.allocations == before.allocations);
        CHECK(after.d2h_reads == before.d2h_reads);
      }
      REQUIRE(plan_requests == hp.requests);
      REQUIRE(plan_offsets == std::vector<std::int32_t>(hp.positions.offsets.begin(),
                                                        hp.positions.offsets.end()));
      CHECK(positions == std::vector<std::int32_t>(hp.positions.values.begin(),
                                                   hp.positions.values.end()));
      CHECK(slots == std::vector<std::int32_t>(hp.slots.values.begin(), hp.slots.values.end()));
      if (!hp.pages.offsets.empty() && hp.pages.segments() > 0) {  // a page-level method's pages
        CHECK(dp.page_offsets ==
              std::vector<std::int32_t>(hp.pages.offsets.begin(), hp.pages.offsets.end()));
        CHECK(peek(dp.pages, dp.page_offsets.back()) ==
              std::vector<std::int32_t>(hp.pages.values.begin(), hp.pages.values.end()));
      }
      const auto od = peek(out_d.data(), static_cast<std::int64_t>(B) * Q * d);
      float worst = 0.0f;
      for (std::size_t j = 0; j < od.size(); ++j) {
        worst = std::max(worst, std::abs(od[j] - out_h[j]) / (1.0f + std::abs(out_h[j])));
      }
      CHECK(worst <= 2e-5f);
      CHECK(ds.resident_tokens() == hs.resident_tokens());
      if constexpr (requires { ds.used_pages(); }) {  // a paged store holds whole pages, no more
        // (its tokens' rows and at most one waiting hole per head-sequence)
        std::int64_t need = 0;
        for (std::int64_t seq = 0; seq < ds.sequences(); ++seq) {
          CHECK(ds.row_extent(seq) - ds.length(seq) <= 1);
          need += (ds.row_extent(seq) + page - 1) / page;
        }
        CHECK(ds.used_pages() == need);
        CHECK(ds.used_pages() + ds.free_pages() == ds.pool_pages());
        CHECK(dm.stats().resident_bytes == ds.used_pages() * page * 2 * d * static_cast<std::int64_t>(sizeof(T)));
      }
    }
    CHECK(dm.stats().layer_budgets == hm.stats().layer_budgets);
    CHECK(dm.stats().refreshes == hm.stats().refreshes);
  }
  ds.check();
}

// Each seed a run; the GQA group of `sh` (q_heads / kv_heads) is the attention's and scorers'.
struct runs {
  model_shape sh = shape;
  std::vector<std::uint32_t> seeds{11u, 12u};
};

template <class T, class E, class DS, template <class, class> class M, class Params>
void run_composition(const Params& params, const std::string& name, const runs& how) {
  for (const std::uint32_t seed : how.seeds) {
    sim_arena engine_arena, arena;
    const E engine{engine_arena}, e{arena};
    using P = typename compositions<T, E, DS>::template pair<M>;
    run_pair<T, E, typename P::first_type, typename P::second_type>(e, arena, engine, params, seed,
                                                                    name, how.sh);
  }
}

template <class T, class E, class DS = kvsift::thrust::dense_store<T, E>>
void run_all(const runs& how = {}) {
  using C = compositions<T, E, DS>;
  using HS = typename C::host_store;
  run_composition<T, E, DS, full_kv_t>(kvsift::full_kv_params<HS>(), "full_kv", how);
  run_composition<T, E, DS, streaming_t>(kvsift::streaming_llm_params<HS>(16, 4), "streaming_llm", how);
  run_composition<T, E, DS, h2o_t>(kvsift::h2o_params<HS>(16), "h2o", how);
  run_composition<T, E, DS, snapkv_t>(kvsift::snapkv_params<HS>(20, 8, 3), "snapkv", how);
  run_composition<T, E, DS, pyramidkv_t>(kvsift::pyramidkv_params<HS>(20, 8, 3), "pyramidkv", how);
  run_composition<T, E, DS, quest_t>(kvsift::quest_params<HS>(20, 4, 1), "quest", how);
  run_composition<T, E, DS, dynamickv_t>(kvsift::dynamickv_params<HS>(18, 6, 3, 2, 1), "dynamickv", how);
  run_composition<T, E, DS, lagkv_t>(kvsift::lagkv_params<HS>(4, 6, 0.5), "lagkv", how);
  run_composition<T, E, DS, lagkv_t>(
      kvsift::lagkv_params<HS>(3, 5, 0.4, 1.0, kvsift::score::lag_variant::knorm), "lagkv knorm", how);
  run_composition<T, E, DS, h2o_pyramid_t>(
      typename h2o_pyramid_t<HS, exec::host>::params{
          .selector = {.window = 4}, .budgeter = {.tokens = 20, .window = 4, .beta = 3}},
      "h2o scores, pyramid budgets", how);
  run_composition<T, E, DS, snapkv_rolling_t>(
      typename snapkv_rolling_t<HS, exec::host>::params{
          .scorer = {.window = 6, .kernel = 3}, .selector = {.window = 6},
          .budgeter = {.tokens = 22, .window = 6, .beta = 3}},
      "snapkv scores every step, pyramid budgets", how);
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("device methods: the evict baselines on exec::sim equal exec::host",
                        "[thrust][method]", device_execs) {
  using E = TestType;
  SECTION("f32") { run_all<float, E>(); }
  SECTION("bf16") { run_all<kvsift::bfloat16, E>(); }
  SECTION("f16") { run_all<kvsift::half, E>(); }
}

// GQA groups of 1 and 4 (the runs above have groups of 2): every method's plans, outputs, budgets
// and resident tokens equal the host's, one seed each.
TEMPLATE_LIST_TEST_CASE("device methods: GQA groups of 1 and 4 on exec::sim equal exec::host",
                        "[thrust][method]", device_execs) {
  using E = TestType;
  SECTION("group 1, f32") {
    run_all<float, E>({.sh = {.layers = 2, .q_heads = 3, .kv_heads = 3, .head_dim = 16}, .seeds = {21u}});
  }
  SECTION("group 4, bf16") {
    run_all<kvsift::bfloat16, E>(
        {.sh = {.layers = 2, .q_heads = 8, .kv_heads = 2, .head_dim = 16}, .seeds = {22u}});
  }
}

// The same runs over a paged device store (thrust::paged_store): the plans, outputs, budgets and
// resident tokens of every method equal the host's over store::dense, as over thrust::dense_store.
TEMPLATE_LIST_TEST_CASE("device methods: over thrust::paged_store on exec::sim equal exec::host",
                        "[thrust][method][paged]", device_execs) {
  using E = TestType;
  SECTION("f32") { run_all<float, E, kvsift::thrust::paged_store<float, E>>(); }
  SECTION("bf16") { run_all<kvsift::bfloat16, E, kvsift::thrust::paged_store<kvsift::bfloat16, E>>(); }
}

// The capture laws over a longer context, where a step's shapes grow past the arena's 256-byte
// size classes: Quest's page count grows every page_size tokens (and, after a short prompt, its
// first selection comes mid-decode), H2O's and StreamingLLM's windows roll. 300 decode steps of
// one request after a 900-token (or 100-token) prompt.
// Over a thrust::dense_store, and over a thrust::paged_store (pages of 16, a pool of the pages the
// whole context needs), whose page moves are device work too.
template <class E, class S>
void capture_laws() {
  constexpr model_shape big{.layers = 1, .q_heads = 8, .kv_heads = 2, .head_dim = 32};
  constexpr int steps = 300;
  const auto run = [&](auto tag, auto params, const char* name, int prompt = 900) {
    using M = typename decltype(tag)::type;
    INFO(name);
    sim_arena engine_arena, arena;
    const E engine{engine_arena}, e{arena};
    std::unique_ptr<S> stp;
    const model_shape sh = big;
    const int tokens = 900 + steps;
    if constexpr (std::is_same_v<S, kvsift::thrust::dense_store<float, E>>) {
      stp = std::make_unique<S>(e, sh, 1, tokens, 1);
    } else {
      stp = std::make_unique<S>(e, sh, 1, tokens, 16, sh.kv_heads * (tokens / 16 + 1), 1);
    }
    auto& st = *stp;
    M m(st, params);
    std::mt19937 rng(7);
    const int H = big.kv_heads, Q = big.q_heads, d = big.head_dim;
    twin<float, E> k(engine, random_array<float>(rng, static_cast<std::size_t>(prompt) * H * d));
    twin<float, E> v(engine, random_array<float>(rng, k.host.size()));
    twin<float, E> q(engine, random_array<float>(rng, static_cast<std::size_t>(prompt) * Q * d));
    using space = typename E::memory_space;
    m.prefill(0, typename M::chunk_type{
                     0, kvsift::kv_view<const float, nhd, space>::contiguous(k.device.data(), prompt, H, d),
                     kvsift::kv_view<const float, nhd, space>::contiguous(v.device.data(), prompt, H, d),
                     kvsift::kv_view<const float, nhd, space>::contiguous(q.device.data(), prompt, Q, d),
                     0, true});
    twin<float, E> sk(engine, random_array<float>(rng, static_cast<std::size_t>(steps) * H * d));
    twin<float, E> sv(engine, random_array<float>(rng, sk.host.size()));
    twin<float, E> sq(engine, random_array<float>(rng, static_cast<std::size_t>(steps) * Q * d));
    buffer<float, E> out(engine, static_cast<std::size_t>(Q) * d);
    int allocating_steps = 0, reading_steps = 0;
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
    }
    CHECK(allocating_steps == 0);
    CHECK(reading_steps == 0);
    st.check();
  };
  run(std::type_identity<kvsift::quest<S, E>>{}, kvsift::quest_params<S, E>(256, 16, 0), "quest");
  run(std::type_identity<kvsift::quest<S, E>>{}, kvsift::quest_params<S, E>(256, 16, 0),
      "quest, first selection at step 157", 100);
  run(std::type_identity<kvsift::h2o<S, E>>{}, kvsift::h2o_params<S, E>(256), "h2o");
  run(std::type_identity<kvsift::streaming_llm<S, E>>{}, kvsift::streaming_llm_params<S, E>(256),
      "streaming_llm");
  run(std::type_identity<kvsift::lagkv<S, E>>{}, kvsift::lagkv_params<S, E>(16, 64), "lagkv");
}

TEMPLATE_LIST_TEST_CASE("device methods: no allocation or read-back in 300 decode steps",
                        "[thrust][method]", device_execs) {
  using E = TestType;
  SECTION("thrust::dense_store") { capture_laws<E, kvsift::thrust::dense_store<float, E>>(); }
  SECTION("thrust::paged_store") { capture_laws<E, kvsift::thrust::paged_store<float, E>>(); }
}

// H2O's running scores live in the store's side column 0: a store without one is refused when the
// method is built, before any prompt is appended.
TEMPLATE_LIST_TEST_CASE("device methods: H2O needs a store with a side column", "[thrust][method]",
                        device_execs) {
  using E = TestType;
  using S = kvsift::thrust::dense_store<float, E>;
  sim_arena arena;
  const E e{arena};
  using h2o = kvsift::h2o<S, E>;
  using snapkv = kvsift::snapkv<S, E>;
  const auto build_h2o = [](S& st) { h2o m(st, kvsift::h2o_params<S, E>(8)); };
  const auto build_snapkv = [](S& st) { snapkv m(st, kvsift::snapkv_params<S, E>(8, 4)); };
  S no_column(e, shape, 1, 16, /*columns=*/0);
  CHECK_THROWS_WITH(build_h2o(no_column), Catch::Matchers::ContainsSubstring("store.columns()") &&
                                              Catch::Matchers::ContainsSubstring("side column 0"));
  S one_column(e, shape, 1, 16, /*columns=*/1);
  CHECK_NOTHROW(build_h2o(one_column));
  CHECK_NOTHROW(build_snapkv(no_column));  // only an observing scorer needs the column
}
