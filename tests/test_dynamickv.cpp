// SPDX-License-Identifier: Apache-2.0
// DynamicKV laws (METHODS.md "DynamicKV"): the progressive budgeter on its own (update schedule,
// integer shares, only-shrink, causality in layers, n <= C, n < w), and the named method through
// the lifecycle as an engine prefills layer by layer (memory really shrinks per KV head, chunked
// prefill, ragged batches budgeted per request, request reuse); budget::per_layer, and replaying
// DynamicKV's budgets through it with SnapKV-style scoring.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

namespace {

using kvsift::model_shape;
using store_t = kvsift::store::dense<float>;

// ---- the budgeter alone, driven as the method drives it ----------------------------------------

struct budget_run {
  std::vector<int> past;                          // [L] final past budgets
  std::vector<std::vector<int>> history;          // [U][L]
  std::vector<std::vector<std::int32_t>> kept;    // [L * H] resident token indices
};

// scores [L][H][M] of one request with n = M + w tokens; the window slots score 0.
budget_run run_budgeter(const kvsift::budget::dynamic_layer::params& p,
                        const std::vector<std::vector<std::vector<float>>>& scores, int n) {
  const int L = static_cast<int>(scores.size());
  const int H = static_cast<int>(scores[0].size());
  kvsift::budget::dynamic_layer b{p};
  const kvsift::select::topk sel{{.window = p.window}};
  budget_run out;
  out.kept.resize(static_cast<std::size_t>(L) * H);
  const int request = 0;
  std::vector<kvsift::budget_revision> revisions;
  for (int l = 0; l < L; ++l) {
    kvsift::score_sets s;
    for (int h = 0; h < H; ++h) {
      std::vector<float> row(static_cast<std::size_t>(n), 0.0f);
      std::copy(scores[l][h].begin(), scores[l][h].end(), row.begin());
      s.push_back(row);
    }
    std::vector<int> budgets;
    const std::vector<int> lengths(static_cast<std::size_t>(H), n);
    b.budgets(kvsift::budget_context{l, L, H, lengths}, budgets);
    kvsift::index_sets k;
    sel.select(s, budgets, k);
    for (int h = 0; h < H; ++h) {
      out.kept[static_cast<std::size_t>(l) * H + h].assign(k[h].begin(), k[h].end());
    }
    revisions.clear();
    b.revise({l, L, H, kvsift::lifecycle_event::prefill_end, {&request, 1}, &s, &k}, revisions);
    for (const auto& rv : revisions) {
      REQUIRE(rv.layer <= l);
      for (int h = 0; h < H; ++h) {
        auto& set = out.kept[static_cast<std::size_t>(rv.layer) * H + h];
        std::vector<std::int32_t> next;
        for (const auto slot : rv.kept[h]) next.push_back(set.at(static_cast<std::size_t>(slot)));
        set = next;
      }
    }
  }
  out.past = b.past_budgets(0);
  out.history = b.history(0);
  return out;
}

std::vector<std::vector<std::vector<float>>> random_scores(int L, int H, int M, unsigned seed,
                                                           int levels = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<std::vector<std::vector<float>>> s(
      static_cast<std::size_t>(L), std::vector<std::vector<float>>(static_cast<std::size_t>(H)));
  for (int l = 0; l < L; ++l) {
    const float layer_scale = 0.25f + u(rng);  // layers differ, so budgets move
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < M; ++t) {
        float x = u(rng) * layer_scale;
        if (levels > 0) x = std::floor(x * levels) / levels;  // quantised: exact ties
        s[l][h].push_back(x);
      }
    }
  }
  return s;
}

// Top `k` of `scores` (higher first, ties to the lower index), ascending.
std::vector<std::int32_t> top_of(const std::vector<float>& scores, int k) {
  std::vector<std::int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](auto a, auto b) { return scores[a] > scores[b]; });
  idx.resize(static_cast<std::size_t>(std::min<std::size_t>(k, idx.size())));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST_CASE("dynamic_layer: update schedule, integer shares, only shrink, kept = top + window",
          "[dynamickv][budget]") {
  const int L = GENERATE(1, 3, 4, 5, 6, 9);
  const int m = GENERATE(1, 2, 4);
  const int H = GENERATE(1, 2);
  const int levels = GENERATE(0, 4);  // 4: heavy exact ties
  const unsigned seed = GENERATE(1u, 2u);
  const int w = 8, C = 20, n = 120, r_max = GENERATE(2, 10);
  const int base = C - w, M = n - w;
  CAPTURE(L, m, H, levels, seed, r_max);
  const auto scores = random_scores(L, H, M, seed, levels);
  const auto r = run_budgeter({.tokens = C, .window = w, .r_max = r_max, .interval = m}, scores, n);

  // one row per update: after layers m-1, 2m-1, ... and always after the last
  std::vector<int> update_layers;
  for (int l = 0; l < L; ++l) {
    if ((l + 1) % m == 0 || l == L - 1) update_layers.push_back(l);
  }
  REQUIRE(r.history.size() == update_layers.size());
  std::vector<int> prev(static_cast<std::size_t>(L), std::min(r_max * base, M));
  for (std::size_t u = 0; u < update_layers.size(); ++u) {
    const int l = update_layers[u];
    const auto& row = r.history[u];
    long long sum = 0;
    for (int j = 0; j < L; ++j) {
      if (j > l) {
        CHECK(row[j] == -1);  // not yet prefilled
        continue;
      }
      CHECK(row[j] >= 0);
      CHECK(row[j] <= prev[j]);  // budgets only shrink
      sum += row[j];
    }
    // the shares sum to base * L exactly; capping at the current count can only lose some
    CHECK(sum <= static_cast<long long>(base) * L);
    // the newest layer takes the remainder, so it is never below floor(count share) — and a
    // layer whose share was capped keeps exactly its previous count
    for (int j = 0; j <= l; ++j) prev[j] = row[j];
  }
  REQUIRE(r.past == r.history.back());
  // kept sets: the top past_j of each head by score, plus the window
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < H; ++h) {
      auto expect = top_of(scores[l][h], r.past[l]);
      for (int t = M; t < n; ++t) expect.push_back(t);
      CHECK(r.kept[static_cast<std::size_t>(l) * H + h] == expect);
    }
  }
}

TEST_CASE("dynamic_layer: the shares of an update sum to base * L_total when no cap binds",
          "[dynamickv][budget]") {
  // r_max large and M large: no layer's share exceeds its first-pass count unless it takes
  // nearly everything, so the final budgets sum exactly to base * L.
  const int L = GENERATE(2, 5, 7, 8);
  const int m = GENERATE(3, 4);
  const unsigned seed = GENERATE(3u, 4u, 5u);
  const int w = 4, C = 12, n = 2000, H = 2, base = C - w;
  CAPTURE(L, m, seed);
  auto scores = random_scores(L, H, n - w, seed);
  const auto r = run_budgeter({.tokens = C, .window = w, .r_max = 1000, .interval = m}, scores, n);
  const int total = std::accumulate(r.past.begin(), r.past.end(), 0);
  CHECK(total == base * L);
}

TEST_CASE("dynamic_layer_shares: floor of the count share, remainder to the newest layer",
          "[dynamickv][budget]") {
  const std::vector<std::int64_t> counts{5, 3, 1};
  const auto s = kvsift::budget::dynamic_layer_shares(counts, 20);  // 20*5/9=11, 20*3/9=6, 2
  CHECK(s[0] == 100 / 9);
  CHECK(s[1] == 60 / 9);
  CHECK(s[0] + s[1] + s[2] == 20);
  CHECK(s[2] == 20 - 100 / 9 - 60 / 9);
  CHECK_THROWS_AS(kvsift::budget::dynamic_layer_shares(std::vector<std::int64_t>{0, 0}, 5),
                  kvsift::error);
}

TEST_CASE("dynamic_layer: layer l's budgets depend only on layers <= l", "[dynamickv][budget]") {
  const int L = 7, m = 2, H = 2, w = 8, C = 24, n = 150;
  auto a = random_scores(L, H, n - w, 11);
  auto b = a;
  // change every layer from 4 on: rows of updates after layers 1 and 3 must not move
  const auto other = random_scores(L, H, n - w, 12);
  for (int l = 4; l < L; ++l) b[l] = other[l];
  const kvsift::budget::dynamic_layer::params p{
      .tokens = C, .window = w, .r_max = 3, .interval = m};
  const auto ra = run_budgeter(p, a, n);
  const auto rb = run_budgeter(p, b, n);
  REQUIRE(ra.history.size() == 4);  // after layers 1, 3, 5, 6
  CHECK(ra.history[0] == rb.history[0]);
  CHECK(ra.history[1] == rb.history[1]);
}

TEST_CASE("dynamic_layer: n <= C keeps everything and runs no update; n smaller than the window",
          "[dynamickv][budget]") {
  const int w = 8;
  const int n = GENERATE(3, 8, 9, 30, 40);  // budget 40: n <= C, including n < w
  const int L = 5, H = 2;
  CAPTURE(n);
  const auto scores = random_scores(L, H, std::max(n - w, 0), 7);
  const auto r = run_budgeter({.tokens = 40, .window = w, .r_max = 10, .interval = 2}, scores, n);
  CHECK(r.history.empty());
  CHECK(r.past == std::vector<int>(L, std::max(n - w, 0)));
  for (const auto& k : r.kept) CHECK(static_cast<int>(k.size()) == n);
}

TEST_CASE("dynamic_layer: C <= window is an error", "[dynamickv][budget]") {
  const kvsift::budget::dynamic_layer b{{.tokens = 8, .window = 8}};
  CHECK_THROWS_AS(b.validate("test"), kvsift::error);
  store_t st(model_shape{2, 2, 2, 4}, 1, 64);
  CHECK_THROWS_AS(kvsift::dynamickv<store_t>(st, kvsift::dynamickv_params<store_t>(8)),
                  kvsift::error);
  const kvsift::budget::dynamic_layer zero{{.tokens = 20, .window = 8, .r_max = 0}};
  CHECK_THROWS_AS(zero.validate("test"), kvsift::error);
}

// ---- the method through the lifecycle ----------------------------------------------------------

// Random prompt of one request: keys/values [L][n, kv_heads, d], queries [L][n, q_heads, d].
struct prompt {
  int n = 0;
  std::vector<std::vector<float>> keys, values, queries;
};
prompt make_prompt(const model_shape& sh, int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  prompt p;
  p.n = n;
  for (int l = 0; l < sh.layers; ++l) {
    std::vector<float> k(static_cast<std::size_t>(n) * sh.kv_heads * sh.head_dim);
    std::vector<float> v(k.size());
    std::vector<float> q(static_cast<std::size_t>(n) * sh.q_heads * sh.head_dim);
    for (auto& x : k) x = 2.0f * g(rng);
    for (auto& x : v) x = g(rng);
    for (auto& x : q) x = g(rng);
    p.keys.push_back(std::move(k));
    p.values.push_back(std::move(v));
    p.queries.push_back(std::move(q));
  }
  return p;
}

template <class M>
void prefill_layer(M& m, const model_shape& sh, int request, int layer, const prompt& pr,
                   int first = 0, int tokens = -1, bool last = true) {
  if (tokens < 0) tokens = pr.n - first;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const std::size_t kv_row = static_cast<std::size_t>(sh.kv_heads) * sh.head_dim;
  const std::size_t q_row = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
  m.prefill(layer, kvsift::prefill_chunk<float>{
                       .request = request,
                       .keys = view::contiguous(pr.keys[layer].data() + first * kv_row, tokens,
                                                sh.kv_heads, sh.head_dim),
                       .values = view::contiguous(pr.values[layer].data() + first * kv_row, tokens,
                                                  sh.kv_heads, sh.head_dim),
                       .queries = view::contiguous(pr.queries[layer].data() + first * q_row,
                                                   tokens, sh.q_heads, sh.head_dim),
                       .first_position = first,
                       .last = last});
}

std::vector<std::vector<std::int32_t>> positions(const store_t& st, int request) {
  const auto& sh = st.shape();
  std::vector<std::vector<std::int32_t>> out;
  for (int l = 0; l < sh.layers; ++l) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto seq = sh.sequence(request, l, h);
      std::vector<std::int32_t> pos;
      for (int i = 0; i < st.length(seq); ++i) pos.push_back(st.position(seq, i));
      out.push_back(pos);
    }
  }
  return out;
}

TEST_CASE("dynamickv: layer by layer, memory shrinks per KV head, stats carry the budgets",
          "[dynamickv][method]") {
  const int L = GENERATE(4, 6);  // 6 with m = 4: updates after layers 3 and 5
  const int kv_heads = GENERATE(1, 2);
  const int G = GENERATE(1, 2);
  CAPTURE(L, kv_heads, G);
  const model_shape sh{L, kv_heads * G, kv_heads, 16};
  const int n = 160, C = 24, w = 8, base = C - w;
  const auto pr = make_prompt(sh, n, 100 + L * 10 + kv_heads * 3 + G);

  // example-begin dynamickv
  store_t store(sh, /*requests=*/1, /*capacity=*/n + 64);  // kvsift::store::dense<float>
  kvsift::dynamickv<store_t> dkv(store, kvsift::dynamickv_params<store_t>(/*budget=*/24));
  const auto rows = [&](const std::vector<float>& x, int heads) {  // [n, heads, d] token-major
    return kvsift::kv_view<const float, kvsift::nhd>::contiguous(x.data(), n, heads, sh.head_dim);
  };
  for (int layer = 0; layer < sh.layers; ++layer) {
    // as the engine finishes this layer's prefill
    const kvsift::prefill_chunk<float> chunk{
        .request = 0,
        .keys = rows(pr.keys[layer], sh.kv_heads),
        .values = rows(pr.values[layer], sh.kv_heads),
        .queries = rows(pr.queries[layer], sh.q_heads),  // only the last 8 (the window) are read
        .first_position = 0,
        .last = true};
    dkv.prefill(layer, chunk);
  }
  const std::vector<int> past = dkv.budgeter_state().past_budgets(0);  // per layer, window excluded
  const std::vector<int> tokens = dkv.stats().layer_budgets;          // per layer, window included
  // example-end dynamickv

  const int updates = L / 4 + (L % 4 != 0 ? 1 : 0);
  CHECK(static_cast<int>(dkv.budgeter_state().history(0).size()) == updates);
  long long resident = 0;
  for (int l = 0; l < L; ++l) {
    CHECK(tokens[l] == past[l] + w);
    for (int h = 0; h < kv_heads; ++h) {
      CHECK(store.length(sh.sequence(0, l, h)) == past[l] + w);  // per KV head, not per query head
      resident += past[l] + w;
    }
  }
  CHECK(store.resident_tokens() == resident);
  CHECK(dkv.stats().resident_bytes == resident * 2 * sh.head_dim * 4);
  CHECK(std::accumulate(past.begin(), past.end(), 0) <= base * L);
  // the window survives in every layer, with original positions
  for (const auto& set : positions(store, 0)) {
    REQUIRE(set.size() >= static_cast<std::size_t>(w));
    for (int i = 0; i < w; ++i) CHECK(set[set.size() - w + i] == n - w + i);
  }
}

TEST_CASE("dynamickv: its per-layer budgets replayed through budget::per_layer with SnapKV-style "
          "scoring give the same kept sets",
          "[dynamickv][per_layer]") {
  const model_shape sh{5, 4, 2, 16};
  const int n = 140, w = 8;
  const unsigned seed = GENERATE(21u, 22u, 23u);
  const auto pr = make_prompt(sh, n, seed);
  store_t a(sh, 1, n);
  kvsift::dynamickv<store_t> dkv(a, kvsift::dynamickv_params<store_t>(20, w, 7, 10, 2));
  for (int l = 0; l < sh.layers; ++l) prefill_layer(dkv, sh, 0, l, pr);
  const auto budgets = dkv.stats().layer_budgets;

  using replay = kvsift::method<store_t,
    kvsift::recipe<kvsift::score::window_attention, kvsift::select::topk, kvsift::budget::per_layer, kvsift::trigger::never>>;
  store_t b(sh, 1, n);
  replay::params p{.scorer = {.window = w, .kernel = 7},
                   .selector = {.window = w},
                   .budgeter = {.tokens = budgets}};
  replay m(b, p);
  for (int l = 0; l < sh.layers; ++l) prefill_layer(m, sh, 0, l, pr);
  CHECK(positions(a, 0) == positions(b, 0));
  CHECK(m.stats().layer_budgets == budgets);
}

TEST_CASE("per_layer: each layer's budget, validated against the model's layers",
          "[per_layer][budget]") {
  const kvsift::budget::per_layer b{{.tokens = {10, 20, 30}}};
  std::vector<int> out;
  const std::vector<int> lengths{50, 60};
  b.budgets(kvsift::budget_context{1, 3, 2, lengths}, out);
  CHECK(out == std::vector<int>{20, 20});
  CHECK_THROWS_AS(b.budgets(kvsift::budget_context{1, 4, 2, lengths}, out), kvsift::error);
  const kvsift::budget::per_layer empty{};
  CHECK_THROWS_AS(empty.validate("test"), kvsift::error);
  const kvsift::budget::per_layer negative{{.tokens = {4, -1}}};
  CHECK_THROWS_AS(negative.validate("test"), kvsift::error);
  static_assert(kvsift::Budgeter<kvsift::budget::per_layer>);

  // a mismatched vector fails before the store is touched
  const model_shape sh{2, 2, 2, 8};
  const auto pr = make_prompt(sh, 40, 5);
  store_t st(sh, 1, 40);
  using snap_per_layer = kvsift::method<store_t,
    kvsift::recipe<kvsift::score::window_attention, kvsift::select::topk, kvsift::budget::per_layer, kvsift::trigger::never>>;
  snap_per_layer m(st, {.scorer = {.window = 4}, .selector = {.window = 4},
                        .budgeter = {.tokens = {12, 16, 20}}});
  CHECK_THROWS_AS(prefill_layer(m, sh, 0, 0, pr), kvsift::error);
  CHECK(st.resident_tokens() == 0);
  snap_per_layer ok(st, {.scorer = {.window = 4}, .selector = {.window = 4},
                         .budgeter = {.tokens = {12, 16}}});
  prefill_layer(ok, sh, 0, 0, pr);
  prefill_layer(ok, sh, 0, 1, pr);
  CHECK(st.length(sh.sequence(0, 0, 1)) == 12);
  CHECK(st.length(sh.sequence(0, 1, 0)) == 16);
}

TEST_CASE("dynamickv: chunked prefill gives the same result as one chunk", "[dynamickv][method]") {
  const model_shape sh{4, 2, 1, 8};
  const int n = 90;
  const auto pr = make_prompt(sh, n, 31);
  store_t a(sh, 1, n), b(sh, 1, n);
  const auto p = kvsift::dynamickv_params<store_t>(16, 8, 7, 3, 2);
  kvsift::dynamickv<store_t> one(a, p), chunked(b, p);
  for (int l = 0; l < sh.layers; ++l) {
    prefill_layer(one, sh, 0, l, pr);
    prefill_layer(chunked, sh, 0, l, pr, 0, 37, false);
    prefill_layer(chunked, sh, 0, l, pr, 37, n - 37, true);
  }
  CHECK(positions(a, 0) == positions(b, 0));
  CHECK(one.budgeter_state().history(0) == chunked.budgeter_state().history(0));
}

TEST_CASE("dynamickv: a ragged batch budgets each request independently", "[dynamickv][method]") {
  const int L = GENERATE(3, 6);
  const model_shape sh{L, 4, 2, 16};
  const int C = 24, w = 8, base = C - w;
  const std::vector<int> lengths{400, 250, 20};  // the last one is shorter than C: kept whole
  CAPTURE(L);
  std::vector<prompt> prompts;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    prompts.push_back(make_prompt(sh, lengths[r], 40 + static_cast<unsigned>(r)));
  }
  const auto p = kvsift::dynamickv_params<store_t>(C, w, 7, 10, 4);
  store_t batch(sh, 3, 400);
  kvsift::dynamickv<store_t> m(batch, p);
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  for (int l = 0; l < L; ++l) {
    std::vector<kvsift::prefill_chunk<float>> chunks;
    for (int r = 0; r < 3; ++r) {
      const auto& pr = prompts[r];
      chunks.push_back({.request = r,
                        .keys = view::contiguous(pr.keys[l].data(), pr.n, sh.kv_heads, sh.head_dim),
                        .values = view::contiguous(pr.values[l].data(), pr.n, sh.kv_heads,
                                                   sh.head_dim),
                        .queries = view::contiguous(pr.queries[l].data(), pr.n, sh.q_heads,
                                                    sh.head_dim),
                        .first_position = 0,
                        .last = true});
    }
    m.prefill(l, chunks);
  }
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    // the same request alone gives the same kept sets and budgets
    store_t alone(sh, 1, 400);
    kvsift::dynamickv<store_t> single(alone, p);
    for (int l = 0; l < L; ++l) prefill_layer(single, sh, 0, l, prompts[r]);
    CHECK(positions(batch, r) == positions(alone, 0));
    const auto past = m.budgeter_state().past_budgets(r);
    CHECK(past == single.budgeter_state().past_budgets(0));
    const int n = lengths[r];
    if (n <= C) {
      CHECK(m.budgeter_state().history(r).empty());
      CHECK(past == std::vector<int>(L, std::max(n - w, 0)));
      continue;
    }
    // budgets of a compressed request share base * L: an update's shares sum to it exactly (the
    // remainder goes to the newest layer); here the first pass keeps r_max * base = 160 past
    // tokens, more than any share, so the first update is never capped and sums exactly; a later
    // one may cap a layer at its current count (only shrink) and so sum to less.
    const auto history = m.budgeter_state().history(r);
    REQUIRE(history.size() == static_cast<std::size_t>(L / 4 + (L % 4 != 0 ? 1 : 0)));
    int first_sum = 0;
    for (const int b : history.front()) first_sum += std::max(b, 0);
    CHECK(first_sum == base * L);
    const int total = std::accumulate(past.begin(), past.end(), 0);
    CHECK(total <= base * L);
    if (history.size() == 1) CHECK(total == base * L);
    for (int l = 0; l < L; ++l) CHECK(past[l] <= std::min(10 * base, n - w));
  }
  // the requests really differ: the long one was compressed, the short one kept whole
  CHECK(m.budgeter_state().past_budgets(0) != m.budgeter_state().past_budgets(1));
}

TEST_CASE("dynamickv: a reused request slot starts a fresh prompt", "[dynamickv][method]") {
  const model_shape sh{4, 2, 2, 8};
  const auto first = make_prompt(sh, 120, 61);
  const auto second = make_prompt(sh, 100, 62);
  store_t st(sh, 1, 128), fresh(sh, 1, 128);
  const auto p = kvsift::dynamickv_params<store_t>(16, 8, 7, 10, 4);
  kvsift::dynamickv<store_t> m(st, p), ref(fresh, p);
  for (int l = 0; l < sh.layers; ++l) prefill_layer(m, sh, 0, l, first);
  st.reset(0);
  for (int l = 0; l < sh.layers; ++l) {
    prefill_layer(m, sh, 0, l, second);
    prefill_layer(ref, sh, 0, l, second);
  }
  CHECK(positions(st, 0) == positions(fresh, 0));
  CHECK(m.budgeter_state().history(0) == ref.budgeter_state().history(0));
  CHECK(m.budgeter_state().history(0).size() == 1);
}

TEST_CASE("dynamickv: prompts no longer than the budget are kept whole, also below the window",
          "[dynamickv][method]") {
  const int n = GENERATE(1, 5, 8, 20, 24);  // budget 24, window 8
  CAPTURE(n);
  const model_shape sh{6, 4, 2, 8};
  const auto pr = make_prompt(sh, n, 71);
  store_t st(sh, 1, 32);
  kvsift::dynamickv<store_t> m(st, kvsift::dynamickv_params<store_t>(24));
  for (int l = 0; l < sh.layers; ++l) prefill_layer(m, sh, 0, l, pr);
  CHECK(st.resident_tokens() == static_cast<long long>(n) * sh.layers * sh.kv_heads);
  CHECK(m.stats().layer_budgets == std::vector<int>(6, n));  // kept count, window included
  CHECK(m.budgeter_state().past_budgets(0) == std::vector<int>(6, std::max(n - 8, 0)));
  CHECK(m.budgeter_state().history(0).empty());
}

static_assert(kvsift::Budgeter<kvsift::budget::dynamic_layer>);
static_assert(kvsift::detail::progressive_budgeter<kvsift::budget::dynamic_layer>);
static_assert(!kvsift::detail::progressive_budgeter<kvsift::budget::pyramid>);

}  // namespace
