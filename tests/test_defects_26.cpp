// SPDX-License-Identifier: Apache-2.0
// Regression tests for the defects found by reading the tiered code (issue 26, items 1-7): each
// one failed on the code before its fix. Recall validation in transfer::async and
// store::tiered::install, one token per request in SyncKV's decode, attend/after_attention bound
// to the last decode in the three tiered methods, a chunk after a request's last chunk, and the
// per-request accessors before a prompt ends or after reset. Item 4 (decisions committed only
// after their recall installs) is tested in tests/test_transfer_faults.cpp.

#include <kvsift/method/freekv.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/synckv.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::ContainsSubstring;
using kvsift::model_shape;
using store_t = kvsift::store::tiered<float>;
using view = kvsift::kv_view<const float, kvsift::nhd>;
using token_t = kvsift::decode_token<float>;

// Random K/V/Q for `requests` requests of `tokens` tokens each, per layer: [r][l][tokens, heads, d].
struct data {
  model_shape sh;
  int tokens = 0;
  std::vector<std::vector<std::vector<float>>> k, v, q;
  data(model_shape s, int requests, int t, unsigned seed) : sh(s), tokens(t) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    k.resize(requests);
    v.resize(requests);
    q.resize(requests);
    for (int r = 0; r < requests; ++r) {
      for (int l = 0; l < sh.layers; ++l) {
        k[r].emplace_back(static_cast<std::size_t>(t) * sh.kv_heads * sh.head_dim);
        v[r].emplace_back(k[r].back().size());
        q[r].emplace_back(static_cast<std::size_t>(t) * sh.q_heads * sh.head_dim);
        for (auto& e : k[r].back()) e = 2.0f * nd(rng);
        for (auto& e : v[r].back()) e = nd(rng);
        for (auto& e : q[r].back()) e = 2.0f * nd(rng);
      }
    }
  }
  // Tokens [first, first + count) of request r as a prefill chunk with its last query.
  [[nodiscard]] kvsift::prefill_chunk<float> chunk(int r, int layer, int first, int count, bool last) const {
    const std::size_t kv = static_cast<std::size_t>(sh.kv_heads) * sh.head_dim;
    const std::size_t qr = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
    return {.request = r,
            .keys = view::contiguous(k[r][layer].data() + first * kv, count, sh.kv_heads, sh.head_dim),
            .values = view::contiguous(v[r][layer].data() + first * kv, count, sh.kv_heads, sh.head_dim),
            .queries = view::contiguous(q[r][layer].data() + (first + count - 1) * qr, 1, sh.q_heads, sh.head_dim),
            .first_position = first,
            .last = last};
  }
  [[nodiscard]] token_t token(int r, int layer, int pos) const {
    return {r, q[r][layer].data() + static_cast<std::size_t>(pos) * sh.q_heads * sh.head_dim,
            k[r][layer].data() + static_cast<std::size_t>(pos) * sh.kv_heads * sh.head_dim,
            v[r][layer].data() + static_cast<std::size_t>(pos) * sh.kv_heads * sh.head_dim};
  }
};

constexpr model_shape shape4{.layers = 2, .q_heads = 8, .kv_heads = 4, .head_dim = 16};

kvsift::synckv<float>::params synckv_params() {
  return {.clusters = 2, .stride = 2, .rho = 0.5, .memory_fraction = 0.75,
          .roles = {{{0, 0, 1, 1}, {0, 3}}, {{1, 0, 0, 1}, {2, 0}}}};
}

kvsift::heterocache<float>::params heterocache_params() {
  using role = kvsift::calibrate::head_role;
  kvsift::heterocache<float>::params p;
  p.tau_drift = 2.0;  // every drift check drifts
  p.drift_window = 2;
  p.roles = {{{role::pivot, role::satellite, role::satellite, role::anchor}, {0, 0, 0, -1},
              {0.9f, 0.7f, 0.4f, 0.8f}},
             {{role::volatile_head, role::satellite, role::anchor, role::pivot}, {-1, 3, -1, 3},
              {0.1f, 0.3f, 0.6f, 0.95f}}};
  return p;
}

kvsift::freekv<float>::params freekv_params() {
  return {.page_size = 8, .budget = 48, .sink = 8, .window = 16, .tau = -1.0, .dense_layers = 1};
}

// Two requests, prompts of n tokens ended on every layer.
template <class Method>
void prefill_all(Method& m, const data& x, int n, int requests = 2) {
  for (int l = 0; l < x.sh.layers; ++l) {
    for (int r = 0; r < requests; ++r) m.prefill(l, x.chunk(r, l, 0, n, true));
  }
}

// Host pool lengths of every (request, layer): an "unchanged store" witness for appends.
std::vector<int> host_lengths(const store_t& st) {
  std::vector<int> out;
  for (int r = 0; r < st.requests(); ++r)
    for (int l = 0; l < st.shape().layers; ++l) out.push_back(st.host_length(r, l));
  return out;
}

std::vector<std::int32_t> resident(const store_t& st, std::int64_t seq) {
  std::vector<std::int32_t> p;
  for (int i = 0; i < st.length(seq); ++i) p.push_back(st.position(seq, i));
  return p;
}

}  // namespace

// ---- item 1: transfer::async::submit validates every position of a pool run -----------------

TEST_CASE("26.1: submit rejects a descending list whose tail falls past the pool's last token",
          "[defects26][async]") {
  const model_shape sh{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 4};
  // capacity 8, 5 tokens: positions 0..4 in the pool, pool slots 5..7 hold no position
  store_t st(sh, 1, 8, 8);
  const data x(sh, 1, 8, 1);
  st.append(0, 0, x.chunk(0, 0, 0, 5, true).keys, x.chunk(0, 0, 0, 5, true).values, 0);
  kvsift::transfer::async<float> xfer;
  // {4, 0}: 4 is the pool's last token; the run scan once compared pos[1] = 0 with the empty
  // slot after it (position 0) and took it as the next row of the run
  REQUIRE_THROWS_WITH(xfer.submit(st, {{0, {4, 0}}}), ContainsSubstring("ascending"));
  REQUIRE(xfer.outstanding() == 0);
  // a full pool: the scan once read past the positions' buffer (ASan)
  store_t full(sh, 1, 5, 8);
  full.append(0, 0, x.chunk(0, 0, 0, 5, true).keys, x.chunk(0, 0, 0, 5, true).values, 0);
  REQUIRE_THROWS_WITH(xfer.submit(full, {{0, {4, 0}}}), ContainsSubstring("ascending"));
  REQUIRE_THROWS_WITH(xfer.submit(full, {{0, {4, 4}}}), ContainsSubstring("ascending"));
  // a valid run at the pool's end still lands exactly the pool's rows
  const auto t = xfer.submit(full, {{0, {3, 4}}});
  const auto& landed = xfer.wait(t);
  REQUIRE(landed.positions[0].size() == 2);
  CHECK(std::equal(landed.key(0, 1), landed.key(0, 1) + 4, full.host_key(0, 4)));
  xfer.release(t);
}

// ---- item 6: store::tiered::install validates the landing ----------------------------------

TEST_CASE("26.6: install rejects a landing with too few rows or unordered positions", "[defects26][tiered]") {
  const model_shape sh{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 4};
  store_t st(sh, 1, 16, 8);
  const data x(sh, 1, 16, 2);
  st.append(0, 0, x.chunk(0, 0, 0, 10, true).keys, x.chunk(0, 0, 0, 10, true).values, 0);
  st.retain(0, 0, [] { kvsift::index_sets k; k.push_back(std::vector<std::int32_t>{9}); return k; }());
  const std::vector<std::int32_t> want{2, 5, 9};
  const auto before = resident(st, 0);

  // A landing of head-sequence 0 as the transfer would fill it, but for the parts a test breaks.
  // Its rows are the pool's rows of its first `rows` positions.
  const auto landing_of = [&st](std::vector<std::int32_t> positions, int rows, bool segment = true) {
    kvsift::store::landing<float> l;
    l.dim = 4;
    l.seqs = {0};
    if (segment) l.positions.push_back(positions);
    for (int i = 0; i < rows; ++i) {
      const int index = st.host_index(0, 0, positions[static_cast<std::size_t>(i)]);
      l.keys.insert(l.keys.end(), st.host_key(0, index), st.host_key(0, index) + 4);
      l.values.insert(l.values.end(), st.host_value(0, index), st.host_value(0, index) + 4);
    }
    return l;
  };
  // two positions, one row; both rows with positions out of order; a seq without its CSR segment
  REQUIRE_THROWS_WITH(st.install(0, want, landing_of({2, 5}, 1)), ContainsSubstring("from.keys.size"));
  CHECK(resident(st, 0) == before);
  REQUIRE_THROWS_WITH(st.install(0, want, landing_of({5, 2}, 2)), ContainsSubstring("ascending"));
  CHECK(resident(st, 0) == before);
  REQUIRE_THROWS_WITH(st.install(0, want, landing_of({2, 5}, 2, false)), ContainsSubstring("offsets"));
  CHECK(resident(st, 0) == before);
  // the same landing, well formed, installs
  REQUIRE_NOTHROW(st.install(0, want, landing_of({2, 5}, 2)));
  CHECK(resident(st, 0) == want);
  REQUIRE_NOTHROW(st.verify());
}

// ---- item 2: SyncKV's decode takes one token per request -----------------------------------

TEST_CASE("26.2: synckv.decode rejects two tokens of one request, appending nothing", "[defects26][synckv]") {
  const int n = 40;
  const data x(shape4, 2, n + 8, 3);
  store_t st(shape4, 2, n + 8);
  kvsift::synckv<float> m(st, synckv_params());
  prefill_all(m, x, n);
  const auto before = host_lengths(st);
  const std::vector<token_t> twice{x.token(0, 0, n), x.token(1, 0, n), x.token(0, 0, n + 1)};
  REQUIRE_THROWS_WITH(m.decode(0, twice), ContainsSubstring("one token per request"));
  CHECK(host_lengths(st) == before);
  CHECK(m.step(0, 0) == 0);
}

// ---- item 3: attend / after_attention bound to the last decode -----------------------------

namespace {
template <class Method>
void check_binding(Method& m, const data& x, int n, int layer) {
  const auto t0 = x.token(0, layer, n), t1 = x.token(1, layer, n);
  std::vector<float> out(2 * static_cast<std::size_t>(x.sh.q_heads) * x.sh.head_dim);
  // nothing decoded yet: no step to attend or apply
  REQUIRE_THROWS_WITH(m.attend(layer, std::span(&t0, 1), out.data()), ContainsSubstring("decode() first"));
  REQUIRE_THROWS_WITH(m.after_attention(layer, t0), ContainsSubstring("decode() first"));
  (void)m.decode(layer, t0);
  // another request's attention over request 0's plan
  REQUIRE_THROWS_WITH(m.attend(layer, std::span(&t1, 1), out.data()), ContainsSubstring("as in the last decode()"));
  // another layer
  const int other = (layer + 1) % x.sh.layers;
  const auto t0o = x.token(0, other, n);
  REQUIRE_THROWS_WITH(m.attend(other, std::span(&t0o, 1), out.data()), ContainsSubstring("the layer of the last decode()"));
  // a bigger batch than decoded
  const std::vector<token_t> both{t0, t1};
  REQUIRE_THROWS_WITH(m.attend(layer, both, out.data()), ContainsSubstring("batch size"));
  REQUIRE_THROWS_WITH(m.after_attention(layer, both), ContainsSubstring("batch size"));
  REQUIRE_NOTHROW(m.attend(layer, std::span(&t0, 1), out.data()));
  REQUIRE_NOTHROW(m.after_attention(layer, t0));
  // applied once: a second after_attention of the same step is refused
  REQUIRE_THROWS_WITH(m.after_attention(layer, t0), ContainsSubstring("decode() first"));
  // and the next step works
  const auto t0b = x.token(0, layer, n + 1);
  REQUIRE_NOTHROW(m.decode(layer, t0b));
  REQUIRE_NOTHROW(m.attend(layer, std::span(&t0b, 1), out.data()));
  REQUIRE_NOTHROW(m.after_attention(layer, t0b));
  // reset ends a pending step
  (void)m.decode(layer, x.token(0, layer, n + 2));
  m.reset(0);
  const auto t0c = x.token(0, layer, n + 2);
  REQUIRE_THROWS_WITH(m.after_attention(layer, t0c), ContainsSubstring("decode() first"));
}
}  // namespace

TEST_CASE("26.3: synckv binds attend/after_attention to the last decode; anticipates once per step",
          "[defects26][synckv]") {
  const int n = 40;
  const data x(shape4, 2, n + 8, 4);
  store_t st(shape4, 2, n + 8);
  auto p = synckv_params();
  p.stride = 1;  // every step anticipates
  kvsift::synckv<float> m(st, p);
  prefill_all(m, x, n);
  check_binding(m, x, n, 0);
  // the anticipations: one per applied step (steps 1 and 2 of request 0 on layer 0), never two
  CHECK(m.stats().refreshes == 2);
}

TEST_CASE("26.3: heterocache binds attend/after_attention to the last decode", "[defects26][heterocache]") {
  const int n = 48;
  const data x(shape4, 2, n + 8, 5);
  store_t st(shape4, 2, n + 8);
  kvsift::heterocache<float> m(st, heterocache_params());
  prefill_all(m, x, n);
  check_binding(m, x, n, 0);
}

TEST_CASE("26.3: freekv binds attend/after_attention to the last decode, dense layers included",
          "[defects26][freekv]") {
  const model_shape sh{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  const int n = 120;
  const data x(sh, 2, n + 8, 6);
  store_t st(sh, 2, n + 8, 8);
  kvsift::freekv<float> m(st, freekv_params());
  prefill_all(m, x, n);
  check_binding(m, x, n, 0);  // layer 0 is dense (dense_layers = 1)
  m.reset(1);
  prefill_all(m, x, n, 1);
  for (int l = 0; l < sh.layers; ++l) m.prefill(l, x.chunk(1, l, 0, n, true));
  check_binding(m, x, n, 1);  // a sparse layer
}

// ---- item 5: no chunk after a request's last chunk in one prefill call ---------------------

namespace {
template <class Method>
void check_chunk_after_last(Method& m, const store_t& st, const data& x, int n) {
  const std::vector<kvsift::prefill_chunk<float>> chunks{x.chunk(0, 0, 0, n, true),
                                                         x.chunk(0, 0, n, 4, true)};
  REQUIRE_THROWS_WITH(m.prefill(0, chunks), ContainsSubstring("after the request's `last` chunk"));
  CHECK(st.host_length(0, 0) == 0);  // nothing appended
  CHECK(m.prompt_end(0, 0) == -1);
  // chunks of one prompt in one call, last one last, still work
  const std::vector<kvsift::prefill_chunk<float>> ok{x.chunk(0, 0, 0, n - 8, false), x.chunk(0, 0, n - 8, 8, true)};
  REQUIRE_NOTHROW(m.prefill(0, ok));
  CHECK(m.prompt_end(0, 0) == n);
}
}  // namespace

TEST_CASE("26.5: synckv and heterocache reject a chunk after the last one, appending nothing",
          "[defects26][synckv][heterocache]") {
  const int n = 40;
  const data x(shape4, 1, n + 8, 7);
  {
    store_t st(shape4, 1, n + 8);
    kvsift::synckv<float> m(st, synckv_params());
    check_chunk_after_last(m, st, x, n);
  }
  {
    store_t st(shape4, 1, n + 8);
    kvsift::heterocache<float> m(st, heterocache_params());
    check_chunk_after_last(m, st, x, n);
  }
}

// ---- item 7: per-request accessors throw kvsift::error instead of crashing -----------------

TEST_CASE("26.7: accessors before a prompt ends, after reset and out of range throw kvsift::error",
          "[defects26][synckv][heterocache][freekv]") {
  const int n = 40;
  const data x(shape4, 1, n + 8, 8);
  {
    store_t st(shape4, 1, n + 8);
    kvsift::synckv<float> m(st, synckv_params());
    REQUIRE_THROWS_WITH(m.static_set(0, 0, 0), ContainsSubstring("prompt ended"));
    REQUIRE_THROWS_WITH(m.dynamic_set(0, 0, 0), ContainsSubstring("prompt ended"));
    REQUIRE_THROWS_AS(m.step(1, 0), kvsift::error);
    REQUIRE_THROWS_AS(m.step(0, 2), kvsift::error);
    REQUIRE_THROWS_AS(m.prompt_end(-1, 0), kvsift::error);
    prefill_all(m, x, n, 1);
    CHECK(static_cast<int>(m.static_set(0, 0, 0).size()) == m.split(n).k_static);
    REQUIRE_THROWS_WITH(m.static_set(0, 0, 2), ContainsSubstring("cluster"));
    REQUIRE_THROWS_AS(m.dynamic_set(0, 0, -1), kvsift::error);
    m.reset(0);
    REQUIRE_THROWS_WITH(m.static_set(0, 1, 1), ContainsSubstring("prompt ended"));
    CHECK(m.step(0, 0) == 0);
  }
  {
    store_t st(shape4, 1, n + 8);
    kvsift::heterocache<float> m(st, heterocache_params());
    REQUIRE_THROWS_AS(m.cap(0, 0, 0), kvsift::error);  // was std::out_of_range
    REQUIRE_THROWS_AS(m.reference(0, 0, 0), kvsift::error);
    REQUIRE_THROWS_AS(m.drift_median(0, 0, 0), kvsift::error);
    REQUIRE_THROWS_AS(m.drifted(0, 0, 0), kvsift::error);
    REQUIRE_THROWS_AS(m.step(0, 5), kvsift::error);
    prefill_all(m, x, n, 1);
    CHECK(m.cap(0, 0, 1) == m.budget(n).cap[1]);
    REQUIRE_THROWS_WITH(m.cap(0, 0, 4), ContainsSubstring("KV head"));
    REQUIRE_THROWS_AS(m.reference(0, 1, -1), kvsift::error);
    m.reset(0);
    REQUIRE_THROWS_AS(m.reference(0, 0, 0), kvsift::error);
  }
  {
    const model_shape sh{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
    store_t st(sh, 1, 64, 8);
    kvsift::freekv<float> m(st, freekv_params());
    REQUIRE_THROWS_AS(m.step(1, 0), kvsift::error);
    REQUIRE_THROWS_AS(m.step(0, 2), kvsift::error);
    CHECK(m.step(0, 1) == 0);
  }
}
