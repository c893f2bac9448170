// SPDX-License-Identifier: Apache-2.0
// LagKV (Liang et al., 2025) laws: the recursion around every trigger length, the resident size
// after prefill in closed form against the store, independence of the engine's chunking, decode
// rounds, ragged batches, GQA, element types, paged stores, constant channels, the variants and
// bad parameters. The exact scores and kept sets are pinned by the conformance vectors.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace {

using kvsift::bfloat16;
using kvsift::half;
using kvsift::model_shape;
using kvsift::score::lag_variant;

// A prompt's keys and values, [n, kv_heads, d] (nhd), random normal.
struct prompt {
  int n = 0, heads = 0, d = 0;
  std::vector<float> k, v;
  [[nodiscard]] float& key(int t, int h, int c) {
    return k[(static_cast<std::size_t>(t) * heads + h) * d + c];
  }
  [[nodiscard]] float& value(int t, int h, int c) {
    return v[(static_cast<std::size_t>(t) * heads + h) * d + c];
  }
};

prompt make_prompt(int n, int heads, int d, unsigned seed) {
  prompt p{n, heads, d, {}, {}};
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  p.k.resize(static_cast<std::size_t>(n) * heads * d);
  p.v.resize(p.k.size());
  for (auto& x : p.k) x = nd(gen);
  for (auto& x : p.v) x = nd(gen);
  return p;
}

template <class T>
std::vector<T> as(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = kvsift::from_float<T>(x[i]);
  return out;
}

// The closed form checked below (docs/methods/lagkv.md): resident tokens per head-sequence after
// a prefill of n tokens. P = floor((n - S) / L) full partitions follow the sink; once P >= 2
// the P - 1 older ones hold k = floor(r L) tokens each: n - (P - 1)(L - k). Rounds run: P - 1.
int rounds_after_prefill(int n, int S, int L) { return n >= S + 2 * L ? (n - S) / L - 1 : 0; }
int resident_after_prefill(int n, int S, int L, int k) {
  return n - rounds_after_prefill(n, S, L) * (L - k);
}

template <class Store>
using lag_method = kvsift::lagkv<Store>;

// Feeds request r's prompt to layer 0 in chunks of the given sizes (the last one is `last`).
template <class Store, class T>
void feed(lag_method<Store>& m, int r, const std::vector<T>& k, const std::vector<T>& v, int n,
          int heads, int d, const std::vector<int>& chunks) {
  int first = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    kvsift::prefill_chunk<T> c;
    c.request = r;
    c.keys = kvsift::kv_view<const T, kvsift::nhd>::contiguous(k.data(), n, heads, d)
                 .slice(first, chunks[i]);
    c.values = kvsift::kv_view<const T, kvsift::nhd>::contiguous(v.data(), n, heads, d)
                   .slice(first, chunks[i]);
    c.first_position = first;
    c.last = i + 1 == chunks.size();
    m.prefill(0, c);
    first += chunks[i];
  }
}

std::vector<int> one_chunk(int n) { return {n}; }
std::vector<int> lag_chunks(int n, int S, int L) {  // SPEC: first min(n, S + 2L), then L
  std::vector<int> c{std::min(n, S + 2 * L)};
  for (int at = c[0]; at < n; at += L) c.push_back(std::min(L, n - at));
  return c;
}
std::vector<int> token_chunks(int n) { return std::vector<int>(static_cast<std::size_t>(n), 1); }
std::vector<int> odd_chunks(int n) {  // arbitrary engine chunking: 7, 50, 3, 29, 7, 50, ...
  const int pattern[] = {7, 50, 3, 29};
  std::vector<int> c;
  for (int at = 0, i = 0; at < n; ++i) {
    c.push_back(std::min(pattern[i % 4], n - at));
    at += c.back();
  }
  return c;
}

// Kept original positions of (request, layer 0), per KV head.
template <class Store>
std::vector<std::vector<int>> kept_positions(const Store& st, int r) {
  std::vector<std::vector<int>> out;
  for (int h = 0; h < st.shape().kv_heads; ++h) {
    const auto seq = st.shape().sequence(r, 0, h);
    std::vector<int> pos;
    for (int j = 0; j < st.length(seq); ++j) pos.push_back(st.position(seq, j));
    out.push_back(pos);
  }
  return out;
}

// One prefill of `p` through a dense float store; returns the kept positions and the method's
// base / rounds.
struct run_result {
  std::vector<std::vector<int>> kept;
  int base = 0;
  std::int64_t rounds = 0;
  std::int64_t resident_tokens = 0;
  std::int64_t resident_bytes = 0;
};
run_result run_prefill(const prompt& p,
                       const kvsift::lagkv<kvsift::store::dense<float>>::params& prm,
                       const std::vector<int>& chunks) {
  using store_t = kvsift::store::dense<float>;
  store_t st({.layers = 1, .q_heads = p.heads, .kv_heads = p.heads, .head_dim = p.d}, 1, p.n);
  lag_method<store_t> m(st, prm);
  feed(m, 0, p.k, p.v, p.n, p.heads, p.d, chunks);
  return {kept_positions(st, 0), kvsift::lagkv_base(m, 0, 0, 0), m.stats().refreshes,
          m.stats().resident_tokens, m.stats().resident_bytes};
}

using dense_f = kvsift::store::dense<float>;

}  // namespace

TEST_CASE("lagkv: recursion around every trigger length, closed-form resident size",
          "[lagkv][recursion]") {
  const int S = GENERATE(4, 16);
  const int L = GENERATE(8, 32);
  const double r = GENERATE(0.25, 0.5);
  const int k = static_cast<int>(kvsift::count_floor(r * L));
  for (int m = 2; m <= 5; ++m) {
    for (const int n : {S + m * L - 1, S + m * L, S + m * L + 1}) {
      CAPTURE(S, L, r, n);
      const auto p = make_prompt(n, 2, 8, static_cast<unsigned>(n * 7 + S));
      const auto prm = kvsift::lagkv_params<dense_f>(S, L, r);
      const auto chunked = run_prefill(p, prm, lag_chunks(n, S, L));
      // the closed form, measured on the store (tokens and bytes)
      const int expect = resident_after_prefill(n, S, L, k);
      for (const auto& kept : chunked.kept) CHECK(static_cast<int>(kept.size()) == expect);
      CHECK(chunked.resident_tokens == 2 * expect);
      CHECK(chunked.resident_bytes ==
            2 * expect * 2 * 8 * static_cast<std::int64_t>(sizeof(float)));
      CHECK(chunked.rounds == rounds_after_prefill(n, S, L));
      CHECK(chunked.base == S + rounds_after_prefill(n, S, L) * k);
      // the sink and the raw tail (everything from base on) are kept as they are
      for (const auto& kept : chunked.kept) {
        for (int j = 0; j < S; ++j) CHECK(kept[j] == j);
        const int tail_first = S + rounds_after_prefill(n, S, L) * L;
        const int tail = n - tail_first;
        CHECK(tail < 2 * L);
        for (int j = 0; j < tail; ++j) CHECK(kept[kept.size() - tail + j] == tail_first + j);
        // each compressed partition keeps exactly k of its L tokens
        for (int q = 0; q < rounds_after_prefill(n, S, L); ++q) {
          const auto in_part = std::count_if(kept.begin(), kept.end(), [&](int x) {
            return x >= S + q * L && x < S + (q + 1) * L;
          });
          CHECK(in_part == k);
        }
      }
      // the engine's chunking does not matter: one chunk, token by token, arbitrary chunks
      for (const auto& chunks : {one_chunk(n), token_chunks(n), odd_chunks(n)}) {
        const auto other = run_prefill(p, prm, chunks);
        CHECK(other.kept == chunked.kept);
        CHECK(other.base == chunked.base);
        // stats().refreshes counts the rounds of the recursion, however many ran at once
        CHECK(other.rounds == chunked.rounds);
      }
    }
  }
}

TEST_CASE("lagkv: compression ratio tends to keep_fraction", "[lagkv][ratio]") {
  // resident / n = (n - (P - 1)(L - k)) / n -> k / L as n grows (paper Eq. 10-11 in closed form)
  const int S = 16, L = 32, k = 16;
  const int n = 4096;
  const auto p = make_prompt(n, 1, 4, 5);
  const auto res = run_prefill(p, kvsift::lagkv_params<dense_f>(S, L, 0.5), one_chunk(n));
  const double ratio = static_cast<double>(res.kept[0].size()) / n;
  CHECK(static_cast<int>(res.kept[0].size()) == resident_after_prefill(n, S, L, k));
  CHECK(ratio > 0.5);
  CHECK(ratio < 0.5 + static_cast<double>(S + 2 * L) / n);
}

TEST_CASE("lagkv: decode rounds every L steps; the triggering step reads the uncompressed cache",
          "[lagkv][decode]") {
  const int S = 4, L = 8, n = S + 3 * L + 3, T = 4 * L, H = 2, Hq = 4, d = 8;
  const int k = 4;
  const auto p = make_prompt(n + T, H, d, 11);
  dense_f st({.layers = 1, .q_heads = Hq, .kv_heads = H, .head_dim = d}, 1, n + T);
  lag_method<dense_f> m(st, kvsift::lagkv_params<dense_f>(S, L, 0.5));
  feed(m, 0, p.k, p.v, n + T, H, d, {n});
  std::vector<float> q(static_cast<std::size_t>(Hq) * d, 0.25f),
      out(static_cast<std::size_t>(Hq) * d);
  int base = kvsift::lagkv_base(m, 0, 0, 0);
  int resident = st.length(0, 0, 0);
  CHECK(resident - base == L + 3);
  const auto initial = kept_positions(st, 0)[0];
  std::vector<int> frozen_positions(initial.begin(), initial.begin() + base);
  for (int t = 1; t <= T; ++t) {
    CAPTURE(t);
    const kvsift::decode_token<float> tok{0, q.data(),
                                          p.k.data() + static_cast<std::size_t>(n + t - 1) * H * d,
                                          p.v.data() + static_cast<std::size_t>(n + t - 1) * H * d};
    const auto& plan = m.decode(0, tok);
    // the step reads everything resident, its own token included
    REQUIRE(plan.positions.size(0) == resident + 1);
    CHECK(plan.positions[0].back() == n + t - 1);
    m.attend(0, std::span<const kvsift::decode_token<float>>(&tok, 1), out.data());
    for (const float x : out) CHECK(std::isfinite(x));
    m.after_attention(0, tok);
    const bool round = resident + 1 - base == 2 * L;  // the uncompressed tail reached 2L
    CHECK(st.length(0, 0, 0) == (round ? resident + 1 - (L - k) : resident + 1));
    CHECK(kvsift::lagkv_base(m, 0, 0, 0) == (round ? base + k : base));
    base = kvsift::lagkv_base(m, 0, 0, 0);
    resident = st.length(0, 0, 0);
    // kept tokens are frozen: never rescored, never dropped
    const auto now = kept_positions(st, 0)[0];
    CHECK(std::equal(frozen_positions.begin(), frozen_positions.end(), now.begin()));
    frozen_positions.assign(now.begin(), now.begin() + base);
  }
  CHECK(m.stats().refreshes == rounds_after_prefill(n + T, S, L));
  // decode rounds land where the prefill recursion would have put them
  CHECK(kept_positions(st, 0) ==
        run_prefill(p, kvsift::lagkv_params<dense_f>(S, L, 0.5), one_chunk(n + T)).kept);
}

TEST_CASE("lagkv: a ragged batch compresses every request independently", "[lagkv][ragged]") {
  const int S = 4, L = 8, H = 2, d = 8;
  const int n0 = S + 5 * L + 3, n1 = S + 2 * L - 1, n2 = S + 2 * L;
  const prompt ps[] = {make_prompt(n0, H, d, 1), make_prompt(n1, H, d, 2),
                       make_prompt(n2, H, d, 3)};
  dense_f st({.layers = 1, .q_heads = H, .kv_heads = H, .head_dim = d}, 3, n0);
  lag_method<dense_f> m(st, kvsift::lagkv_params<dense_f>(S, L, 0.5));
  std::vector<kvsift::prefill_chunk<float>> chunks;
  for (int r = 0; r < 3; ++r) {
    kvsift::prefill_chunk<float> c;
    c.request = r;
    c.keys = kvsift::kv_view<const float, kvsift::nhd>::contiguous(ps[r].k.data(), ps[r].n, H, d);
    c.values = kvsift::kv_view<const float, kvsift::nhd>::contiguous(ps[r].v.data(), ps[r].n, H, d);
    chunks.push_back(c);
  }
  m.prefill(0, chunks);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto solo =
        run_prefill(ps[r], kvsift::lagkv_params<dense_f>(S, L, 0.5), one_chunk(ps[r].n));
    CHECK(kept_positions(st, r) == solo.kept);
    CHECK(kvsift::lagkv_base(m, r, 0, 0) == solo.base);
  }
  CHECK(st.length(1, 0, 0) == n1);  // below the trigger: untouched
}

TEST_CASE("lagkv: GQA selects per KV head, from that head's keys and values only", "[lagkv][gqa]") {
  const int S = 4, L = 8, H = 2, Hq = 8, d = 16, n = S + 4 * L + 5;
  const auto p = make_prompt(n, H, d, 21);
  dense_f st({.layers = 1, .q_heads = Hq, .kv_heads = H, .head_dim = d}, 1, n);
  lag_method<dense_f> m(st, kvsift::lagkv_params<dense_f>(S, L, 0.5));
  STATIC_REQUIRE_FALSE(lag_method<dense_f>::caps.needs_queries);
  feed(m, 0, p.k, p.v, n, H, d, one_chunk(n));
  const auto kept = kept_positions(st, 0);
  CHECK(kept[0] != kept[1]);  // independent heads choose differently
  for (int h = 0; h < H; ++h) {
    prompt single{n, 1, d, {}, {}};
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < d; ++c) {
        single.k.push_back(p.k[(static_cast<std::size_t>(t) * H + h) * d + c]);
        single.v.push_back(p.v[(static_cast<std::size_t>(t) * H + h) * d + c]);
      }
    }
    CHECK(run_prefill(single, kvsift::lagkv_params<dense_f>(S, L, 0.5), one_chunk(n)).kept[0] ==
          kept[h]);
  }
}

TEMPLATE_TEST_CASE("lagkv: every element type, dense and paged stores", "[lagkv][types]", float,
                   half, bfloat16) {
  using T = TestType;
  const int S = 16, L = 16, H = 2, d = 16, n = S + 6 * L + 9, ps = 8;
  const auto variant = GENERATE(lag_variant::lag, lag_variant::local, lag_variant::knorm);
  CAPTURE(kvsift::score::to_string(variant));
  auto p = make_prompt(n, H, d, 33);
  const auto k = as<T>(p.k), v = as<T>(p.v);
  // the float reference sees the same values, rounded to T
  for (std::size_t i = 0; i < p.k.size(); ++i) {
    p.k[i] = kvsift::to_float(k[i]);
    p.v[i] = kvsift::to_float(v[i]);
  }
  const auto ref =
      run_prefill(p, kvsift::lagkv_params<dense_f>(S, L, 0.5, 1.0, variant), one_chunk(n));
  const model_shape sh{.layers = 1, .q_heads = H, .kv_heads = H, .head_dim = d};

  using dense_t = kvsift::store::dense<T>;
  dense_t ds(sh, 1, n);
  lag_method<dense_t> dm(ds, kvsift::lagkv_params<dense_t>(S, L, 0.5, 1.0, variant));
  feed(dm, 0, k, v, n, H, d, odd_chunks(n));
  CHECK(kept_positions(ds, 0) == ref.kept);
  CHECK(ds.resident_bytes() == ref.resident_tokens * 2 * d * static_cast<std::int64_t>(sizeof(T)));

  using paged_t = kvsift::store::paged<T>;
  paged_t pg(sh, 1, ps, 2 * ((n + ps - 1) / ps));
  lag_method<paged_t> pm(pg, kvsift::lagkv_params<paged_t>(S, L, 0.5, 1.0, variant));
  feed(pm, 0, k, v, n, H, d, lag_chunks(n, S, L));
  CHECK(kept_positions(pg, 0) == ref.kept);
  const int resident = resident_after_prefill(n, S, L, L / 2);
  CHECK(pg.used_pages() == H * ((resident + ps - 1) / ps));  // compressed pages went back
  CHECK(pm.stats().resident_bytes ==
        pg.used_pages() * ps * 2 * d * static_cast<std::int64_t>(sizeof(T)));
}

TEST_CASE("lagkv: constant channels normalise to 0, never NaN; exact ties keep the lower index",
          "[lagkv][constant]") {
  const int S = 4, L = 8, H = 1, d = 8, n = S + 3 * L;
  auto p = make_prompt(n, H, d, 44);
  // partition 1 constant in every channel of K and V: partition 0 normalises to x' = 0
  for (int t = S + L; t < S + 2 * L; ++t) {
    for (int c = 0; c < d; ++c) {
      p.key(t, 0, c) = 0.5f * c;
      p.value(t, 0, c) = -1.0f;
    }
  }
  // and channel 3 constant everywhere
  for (int t = 0; t < n; ++t) p.key(t, 0, 3) = 2.0f;
  dense_f full({.layers = 1, .q_heads = H, .kv_heads = H, .head_dim = d}, 1, n);
  full.append(0, 0, kvsift::kv_view<const float, kvsift::nhd>::contiguous(p.k.data(), n, H, d),
              kvsift::kv_view<const float, kvsift::nhd>::contiguous(p.v.data(), n, H, d), 0);
  for (const auto variant : {lag_variant::lag, lag_variant::local}) {
    kvsift::score::lag_relative sc{{.sink = S, .lag = L, .value_weight = 1.0, .variant = variant}};
    const std::vector<int> req{0};
    kvsift::score_input<dense_f> in{&full, 0, kvsift::lifecycle_event::prefill_end, req, {},
                                    {},    {}};
    kvsift::score_sets s, sk, sv;
    sc.score(in, s, &sk, &sv);
    for (int j = S; j < S + 2 * L; ++j) {
      CAPTURE(j);
      CHECK(std::isfinite(s[0][j]));
      CHECK(std::isfinite(sk[0][j]));
      CHECK(std::isfinite(sv[0][j]));
    }
    // the softmax sides sum to 1 per partition
    for (int part = 0; part < 2; ++part) {
      double ks = 0, vs = 0;
      for (int j = S + part * L; j < S + (part + 1) * L; ++j) {
        ks += sk[0][j];
        vs += sv[0][j];
      }
      CHECK(std::abs(ks - 1.0) < 1e-5);
      CHECK(std::abs(vs - 1.0) < 1e-5);
    }
    if (variant == lag_variant::lag) {
      for (int j = S; j < S + L; ++j) CHECK(s[0][j] == s[0][S]);  // an exact tie: uniform 2/L
    }
  }
  // the tie keeps the first k tokens of partition 0
  const auto res = run_prefill(p, kvsift::lagkv_params<dense_f>(S, L, 0.5), one_chunk(n));
  for (int j = 0; j < L / 2; ++j) CHECK(res.kept[0][S + j] == S + j);
}

TEST_CASE(
    "lagkv: variants — lag is min-max relative to the next partition, local to its own, "
    "knorm keeps the smallest keys",
    "[lagkv][variants]") {
  const int S = 4, L = 16, H = 1, d = 8, n = S + 3 * L;
  const auto p = make_prompt(n, H, d, 55);
  const auto scores = [&](const prompt& x, lag_variant variant) {
    dense_f st({.layers = 1, .q_heads = H, .kv_heads = H, .head_dim = d}, 1, n);
    st.append(0, 0, kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.k.data(), n, H, d),
              kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.v.data(), n, H, d), 0);
    kvsift::score::lag_relative sc{{.sink = S, .lag = L, .value_weight = 0.5, .variant = variant}};
    const std::vector<int> req{0};
    kvsift::score_input<dense_f> in{&st, 0, kvsift::lifecycle_event::prefill_end, req, {}, {}, {}};
    kvsift::score_sets s;
    sc.score(in, s);
    return std::vector<float>(s[0].begin(), s[0].end());
  };
  const auto close = [](const std::vector<float>& a, const std::vector<float>& b, int from,
                        int to) {
    for (int j = from; j < to; ++j) {
      if (std::abs(a[j] - b[j]) > 1e-5f * std::max(1.0f, std::abs(a[j]))) return false;
    }
    return true;
  };
  const auto lag = scores(p, lag_variant::lag);
  const auto local = scores(p, lag_variant::local);
  CHECK_FALSE(close(lag, local, S, S + L));
  // outside the scored partitions: +inf (kept as they are)
  for (int j = 0; j < S; ++j) CHECK(std::isinf(lag[j]));
  for (int j = S + 2 * L; j < n; ++j) CHECK(std::isinf(lag[j]));

  SECTION("a positive per-channel affine map of K and V changes neither") {
    auto q = p;
    for (int t = 0; t < n; ++t) {
      for (int c = 0; c < d; ++c) {
        q.key(t, 0, c) = 3.0f * q.key(t, 0, c) + static_cast<float>(c);
        q.value(t, 0, c) = 0.5f * q.value(t, 0, c) - 2.0f;
      }
    }
    CHECK(close(scores(q, lag_variant::lag), lag, S, S + 2 * L));
    CHECK(close(scores(q, lag_variant::local), local, S, S + 2 * L));
  }
  SECTION("changing partition 1 moves lag's scores of partition 0, not local's") {
    auto q = p;
    for (int t = S + L; t < S + 2 * L; ++t) {
      for (int c = 0; c < d; ++c) q.key(t, 0, c) *= (c % 2 == 0 ? 4.0f : 0.1f);
    }
    CHECK_FALSE(close(scores(q, lag_variant::lag), lag, S, S + L));
    CHECK(close(scores(q, lag_variant::local), local, S, S + L));
  }
  SECTION("knorm keeps, per partition, the k keys of smallest norm") {
    const auto res = run_prefill(
        p, kvsift::lagkv_params<dense_f>(S, L, 0.25, 1.0, lag_variant::knorm), one_chunk(n));
    for (int part = 0; part < 2; ++part) {
      std::vector<std::pair<double, int>> norms;
      for (int t = S + part * L; t < S + (part + 1) * L; ++t) {
        double acc = 0;
        for (int c = 0; c < d; ++c) acc += static_cast<double>(p.k[t * d + c]) * p.k[t * d + c];
        norms.emplace_back(std::sqrt(acc), t);
      }
      std::sort(norms.begin(), norms.end());
      std::vector<int> expect;
      for (int i = 0; i < L / 4; ++i) expect.push_back(norms[i].second);
      std::sort(expect.begin(), expect.end());
      std::vector<int> got;
      for (const int x : res.kept[0]) {
        if (x >= S + part * L && x < S + (part + 1) * L) got.push_back(x);
      }
      CHECK(got == expect);
    }
  }
}

TEST_CASE("lagkv: bad parameters are a kvsift::error at construction", "[lagkv][errors]") {
  dense_f st({.layers = 1, .q_heads = 2, .kv_heads = 2, .head_dim = 8}, 1, 64);
  const auto make = [&](int S, int L, double r, double w = 1.0) {
    lag_method<dense_f> m(st, kvsift::lagkv_params<dense_f>(S, L, r, w));
  };
  CHECK_NOTHROW(make(16, 128, 0.5));
  CHECK_NOTHROW(make(1, 1, 1.0));
  CHECK_THROWS_AS(make(0, 16, 0.5), kvsift::error);  // S must be positive
  CHECK_THROWS_AS(make(-3, 16, 0.5), kvsift::error);
  CHECK_THROWS_AS(make(16, 0, 0.5), kvsift::error);    // L must be positive
  CHECK_THROWS_AS(make(16, 16, 0.05), kvsift::error);  // floor(0.05 * 16) = 0
  CHECK_THROWS_AS(make(16, 16, 0.0), kvsift::error);
  CHECK_THROWS_AS(make(16, 16, 1.5), kvsift::error);  // more than a partition
  CHECK_THROWS_AS(make(16, 16, 0.5, std::numeric_limits<double>::quiet_NaN()), kvsift::error);
  CHECK_NOTHROW(make(16, 10, 0.1));  // floor(0.1 * 10) = 1 despite rounding
  CHECK_THROWS_AS(kvsift::score::parse_lag_variant("lagg"), kvsift::error);
  CHECK(st.resident_tokens() == 0);
}

TEST_CASE("lagkv: usage example", "[lagkv][example]") {
  const int n = 1000;
  const auto p = make_prompt(n + 8, 2, 64, 77);
  // example-begin lagkv
  using store_t = kvsift::store::dense<float>;
  store_t store({.layers = 1, .q_heads = 8, .kv_heads = 2, .head_dim = 64}, /*requests=*/1,
                /*capacity=*/2048);
  // LagKV's paper defaults: sink 16, lag 128, keep half of every scored partition
  kvsift::lagkv<store_t> lag(store, kvsift::lagkv_params<store_t>(16, 128, 0.5));

  // the whole prompt in one chunk: compressed as if it had arrived in chunks of 128
  kvsift::prefill_chunk<float> prompt;
  prompt.keys = kvsift::kv_view<const float, kvsift::nhd>::contiguous(p.k.data(), n, 2, 64);
  prompt.values = kvsift::kv_view<const float, kvsift::nhd>::contiguous(p.v.data(), n, 2, 64);
  lag.prefill(/*layer=*/0, prompt);
  // P = floor((1000 - 16) / 128) = 7 partitions; 6 rounds kept 64 of 128 tokens each
  CHECK(store.length(0, 0, 0) == 1000 - 6 * 64);
  CHECK(lag.stats().refreshes == 6);

  // decode: read the plan, attend, then let LagKV compress when the tail reaches 2 * 128
  std::vector<float> q(8 * 64, 0.1f), out(8 * 64);
  for (int t = 0; t < 8; ++t) {
    const kvsift::decode_token<float> tok{0, q.data(), p.k.data() + (n + t) * 2 * 64,
                                          p.v.data() + (n + t) * 2 * 64};
    const auto& plan = lag.decode(/*layer=*/0, tok);  // plan.positions: what attention reads
    (void)plan;
    lag.attend(0, std::span<const kvsift::decode_token<float>>(&tok, 1), out.data());
    lag.after_attention(0, tok);
  }
  // example-end lagkv
  CHECK(store.length(0, 0, 0) == resident_after_prefill(n + 8, 16, 128, 64));
}

TEMPLATE_TEST_CASE("lagkv: the blocked token statistics equal lag_token_std bit for bit", "[lagkv][exact]",
                   float, half, bfloat16) {
  // lag_block_std interleaves up to kLagBlock tokens' sums; each token's arithmetic must stay
  // lag_token_std's, in its order, or selections near a tie would change
  using T = TestType;
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const int d : {1, 2, 3, 8, 13, 64, 128}) {
    for (const int count : {1, 5, 8}) {
      CAPTURE(d, count);
      std::vector<T> rows(static_cast<std::size_t>(count) * d);
      for (auto& x : rows) x = kvsift::from_float<T>(normal(rng));
      std::vector<float> mn(d), mx(d);
      for (int c = 0; c < d; ++c) {
        const float a = normal(rng), b = normal(rng);
        mn[c] = std::min(a, b);
        mx[c] = c % 5 == 0 ? mn[c] : std::max(a, b);  // some constant channels (x' = 0)
      }
      std::vector<double> range(d), flat(d), xt(static_cast<std::size_t>(d) * kvsift::score::detail::kLagBlock);
      for (int c = 0; c < d; ++c) {
        range[c] = static_cast<double>(mx[c]) - mn[c];
        flat[c] = mx[c] == mn[c] ? 1.0 : 0.0;
      }
      auto row = [&](int j) { return rows.data() + static_cast<std::size_t>(j) * d; };
      std::vector<float> got(static_cast<std::size_t>(count), -1.0f);
      kvsift::score::detail::lag_block_std(row, 0, count, mn.data(), range.data(), flat.data(), d,
                                           xt.data(), got.data());
      std::vector<double> xn(d);
      for (int t = 0; t < count; ++t) {
        const float want = kvsift::score::detail::lag_token_std(row(t), mn.data(), mx.data(), d, xn.data());
        CAPTURE(t);
        REQUIRE(std::bit_cast<std::uint32_t>(got[t]) == std::bit_cast<std::uint32_t>(want));
      }
    }
  }
}
