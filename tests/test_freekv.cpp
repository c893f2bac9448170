// SPDX-License-Identifier: Apache-2.0
// kvsift::freekv (FreeKV over store::tiered + transfer::async): laws of the decode lifecycle.

#include <kvsift/method/any_method.hpp>
#include <kvsift/method/freekv.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using kvsift::model_shape;
using view = kvsift::kv_view<const float, kvsift::nhd>;

std::vector<float> normal(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// One request's prompt and decode tokens for every layer: keys/values [layers][tokens, H, d],
// queries [layers][steps, Hq, d].
struct script {
  model_shape sh;
  int n = 0, steps = 0;
  std::vector<std::vector<float>> k, v, q;
  script(model_shape s, int prompt, int t, std::uint32_t seed) : sh(s), n(prompt), steps(t) {
    for (int l = 0; l < sh.layers; ++l) {
      k.push_back(normal(static_cast<std::size_t>(n + t) * sh.kv_heads * sh.head_dim, seed + 10 * l));
      v.push_back(normal(k.back().size(), seed + 10 * l + 1));
      q.push_back(normal(static_cast<std::size_t>(t) * sh.q_heads * sh.head_dim, seed + 10 * l + 2));
    }
  }
  [[nodiscard]] kvsift::prefill_chunk<float> prompt(int request, int layer) const {
    return {.request = request,
            .keys = view::contiguous(k[layer].data(), n, sh.kv_heads, sh.head_dim),
            .values = view::contiguous(v[layer].data(), n, sh.kv_heads, sh.head_dim),
            .queries = {},
            .first_position = 0,
            .last = true};
  }
  [[nodiscard]] kvsift::decode_token<float> token(int request, int layer, int t) const {
    const std::size_t kv = static_cast<std::size_t>(n + t) * sh.kv_heads * sh.head_dim;
    return {request, q[layer].data() + static_cast<std::size_t>(t) * sh.q_heads * sh.head_dim,
            k[layer].data() + kv, v[layer].data() + kv};
  }
};

using params = kvsift::freekv<float>::params;
params small_params() {
  return {.page_size = 8, .budget = 64, .sink = 8, .window = 16, .tau = 0.8, .dense_layers = 1};
}

std::vector<std::int32_t> as_vector(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

// FreeKV's recipe with a budgeter of twice the params' budget: the schedule selects and keeps
// what the recipe's Budgeter gives (the params' B only shapes the budgeter FreeKV builds).
struct freekv_wider : kvsift::freekv_recipe {
  static parts make_parts(const params& p) {
    auto x = kvsift::freekv_recipe::make_parts(p);
    x.budgeter.p.tokens = 2 * p.budget;
    return x;
  }
};

}  // namespace

TEST_CASE("freekv: the schedule calls the recipe's budgeter", "[freekv]") {
  const model_shape sh{2, 4, 2, 8};
  const script sc(sh, 300, 6, 3);
  kvsift::store::tiered<float> st(sh, 1, sc.n + sc.steps, 8);
  const auto prm = small_params();  // B = 64: 8 pages; the budgeter's 128: 16
  kvsift::method<kvsift::store::tiered<float>, freekv_wider, kvsift::exec::host> m(st, prm);
  for (int l = 0; l < sh.layers; ++l) m.prefill(l, sc.prompt(0, l));
  CHECK(m.stats().layer_budgets == std::vector<int>{-1, 2 * prm.budget});
  for (int t = 0; t < sc.steps; ++t) {
    for (int l = 0; l < sh.layers; ++l) {
      const auto tok = sc.token(0, l, t);
      const auto& plan = m.decode(l, tok);
      if (l == 1) {
        for (int h = 0; h < sh.kv_heads; ++h) {
          CAPTURE(t, h);
          CHECK(static_cast<int>(plan.pages[h].size()) == 2 * prm.budget / prm.page_size);
          CHECK(st.length(sh.sequence(0, 1, h)) <= 2 * prm.budget);
          CHECK(st.length(sh.sequence(0, 1, h)) > prm.budget);
        }
      }
      std::vector<float> out(static_cast<std::size_t>(sh.q_heads) * sh.head_dim);
      m.attend(l, std::span<const kvsift::decode_token<float>>(&tok, 1), out.data());
      m.after_attention(l, tok);
    }
  }
}

TEST_CASE("freekv: every sparse step reads B/p pages, sink and window always in, working set = plan",
          "[freekv]") {
  const int group = GENERATE(1, 4);
  const auto merge = GENERATE(kvsift::score::freekv_merge::softmax_mean,
                              kvsift::score::freekv_merge::mean, kvsift::score::freekv_merge::max);
  const double tau = GENERATE(-1.0, 0.2, 1.0);  // never, sometimes, always corrected
  CAPTURE(group, static_cast<int>(merge), tau);
  const model_shape sh{2, 2 * group, 2, 8};
  const script sc(sh, 150, 30, 7);
  kvsift::store::tiered<float> st(sh, 1, sc.n + sc.steps, 8);
  auto prm = small_params();
  prm.merge = merge;
  prm.tau = tau;
  kvsift::freekv<float> m(st, prm);
  for (int l = 0; l < sh.layers; ++l) m.prefill(l, sc.prompt(0, l));
  // after prefill the sparse layer holds the sink and step 1's window only
  REQUIRE(st.length(sh.sequence(0, 1, 0)) < sc.n);
  REQUIRE(st.length(sh.sequence(0, 0, 0)) == sc.n);
  const int ps = prm.page_size;
  for (int t = 0; t < sc.steps; ++t) {
    CAPTURE(t);
    for (int l = 0; l < sh.layers; ++l) {
      const auto tok = sc.token(0, l, t);
      const auto& plan = m.decode(l, tok);
      const int len = sc.n + t + 1;
      const int P = (len + ps - 1) / ps;
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto pages = as_vector(plan.pages[h]);
        const auto pos = as_vector(plan.positions[h]);
        REQUIRE(std::is_sorted(pages.begin(), pages.end()));
        REQUIRE(std::adjacent_find(pages.begin(), pages.end()) == pages.end());
        std::vector<std::int32_t> want;  // the plan is the real tokens of the pages
        for (const auto pg : pages) {
          for (int i = pg * ps; i < std::min(len, (pg + 1) * ps); ++i) want.push_back(i);
        }
        REQUIRE(pos == want);
        REQUIRE(pos.back() == len - 1);  // the new token
        if (l == 0) {
          REQUIRE(static_cast<int>(pages.size()) == P);  // dense layer
          continue;
        }
        REQUIRE(static_cast<int>(pages.size()) == prm.budget / ps);
        for (int pg = 0; pg < prm.sink / ps; ++pg) REQUIRE(std::binary_search(pages.begin(), pages.end(), pg));
        for (int pg = P - prm.window / ps; pg < P; ++pg) {
          REQUIRE(std::binary_search(pages.begin(), pages.end(), pg));
        }
        // the working set holds exactly the selected pages' tokens
        REQUIRE(st.length(sh.sequence(0, l, h)) == static_cast<int>(pos.size()));
        REQUIRE(st.length(sh.sequence(0, l, h)) <= prm.budget);
      }
      std::vector<float> out(static_cast<std::size_t>(sh.q_heads) * sh.head_dim);
      m.attend(l, std::span<const kvsift::decode_token<float>>(&tok, 1), out.data());
      m.after_attention(l, tok);
    }
    st.verify();
  }
  const auto s = m.stats();
  REQUIRE(s.bytes_transferred > 0);
  REQUIRE(s.resident_tokens <= static_cast<std::int64_t>(sh.kv_heads) * (prm.budget + sc.n + sc.steps));
  if (tau == 1.0) REQUIRE(m.corrections_made() > 0);
  if (tau == -1.0) REQUIRE(m.corrections_made() == 0);
}

TEST_CASE("freekv: a background recall is in flight while the next layer decodes", "[freekv]") {
  const model_shape sh{3, 4, 2, 8};
  const script sc(sh, 200, 12, 11);
  kvsift::store::tiered<float> st(sh, 1, sc.n + sc.steps, 8);
  kvsift::freekv<float> m(st, {.page_size = 8, .budget = 48, .sink = 8, .window = 16, .tau = -1.0,
                               .dense_layers = 1});
  for (int l = 0; l < sh.layers; ++l) m.prefill(l, sc.prompt(0, l));
  auto& xfer = m.transfer_state();
  int overlapped = 0;
  for (int t = 0; t < sc.steps; ++t) {
    for (int l = 0; l < sh.layers; ++l) {
      const auto tok = sc.token(0, l, t);
      m.decode(l, tok);
      xfer.pause(l == 1);  // layer 1's recall cannot start before layer 2 has decoded
      const auto before = xfer.outstanding();
      m.after_attention(l, tok);
      if (l == 1 && xfer.outstanding() > before) {
        // layer 2 decodes, attends and submits its own recall while layer 1's waits
        const auto tok2 = sc.token(0, 2, t);
        m.decode(2, tok2);
        m.after_attention(2, tok2);
        ++overlapped;
        xfer.pause(false);
        break;
      }
      xfer.pause(false);
    }
  }
  REQUIRE(overlapped > 0);
  REQUIRE(m.stats().bytes_transferred > 0);
}

TEST_CASE("freekv: a ragged batch of two requests equals two single runs", "[freekv]") {
  const model_shape sh{2, 4, 2, 8};
  const script a(sh, 130, 20, 21), b(sh, 77, 20, 31);
  const auto prm = small_params();
  struct trace {
    std::vector<std::vector<std::int32_t>> pos;
    std::vector<float> out;
  };
  const auto single = [&](const script& sc) {
    kvsift::store::tiered<float> st(sh, 1, sc.n + sc.steps, 8);
    kvsift::freekv<float> m(st, prm);
    trace tr;
    for (int l = 0; l < sh.layers; ++l) m.prefill(l, sc.prompt(0, l));
    for (int t = 0; t < sc.steps; ++t) {
      for (int l = 0; l < sh.layers; ++l) {
        const auto tok = sc.token(0, l, t);
        const auto& plan = m.decode(l, tok);
        for (int h = 0; h < sh.kv_heads; ++h) tr.pos.push_back(as_vector(plan.positions[h]));
        std::vector<float> o(static_cast<std::size_t>(sh.q_heads) * sh.head_dim);
        m.attend(l, std::span<const kvsift::decode_token<float>>(&tok, 1), o.data());
        tr.out.insert(tr.out.end(), o.begin(), o.end());
        m.after_attention(l, tok);
      }
    }
    return tr;
  };
  const trace ta = single(a), tb = single(b);
  kvsift::store::tiered<float> st(sh, 2, 200, 8);
  kvsift::freekv<float> m(st, prm);
  for (int l = 0; l < sh.layers; ++l) {
    const std::vector<kvsift::prefill_chunk<float>> chunks{a.prompt(0, l), b.prompt(1, l)};
    m.prefill(l, chunks);
  }
  trace ga, gb;
  for (int t = 0; t < a.steps; ++t) {
    for (int l = 0; l < sh.layers; ++l) {
      const std::vector<kvsift::decode_token<float>> toks{b.token(1, l, t), a.token(0, l, t)};
      const auto& plan = m.decode(l, toks);
      for (int h = 0; h < sh.kv_heads; ++h) gb.pos.push_back(as_vector(plan.positions[h]));
      for (int h = 0; h < sh.kv_heads; ++h) ga.pos.push_back(as_vector(plan.positions[sh.kv_heads + h]));
      std::vector<float> o(2 * static_cast<std::size_t>(sh.q_heads) * sh.head_dim);
      m.attend(l, toks, o.data());
      const std::size_t half = o.size() / 2;
      gb.out.insert(gb.out.end(), o.begin(), o.begin() + static_cast<std::ptrdiff_t>(half));
      ga.out.insert(ga.out.end(), o.begin() + static_cast<std::ptrdiff_t>(half), o.end());
      m.after_attention(l, toks);
    }
    st.verify();
  }
  REQUIRE(ga.pos == ta.pos);
  REQUIRE(gb.pos == tb.pos);
  REQUIRE(ga.out == ta.out);
  REQUIRE(gb.out == tb.out);

  // reset(request) lets the slot take the same prompt again, with the same plans
  m.reset(0);
  for (int l = 0; l < sh.layers; ++l) m.prefill(l, a.prompt(0, l));
  trace again;
  for (int t = 0; t < a.steps; ++t) {
    for (int l = 0; l < sh.layers; ++l) {
      const auto tok = a.token(0, l, t);
      const auto& plan = m.decode(l, tok);
      for (int h = 0; h < sh.kv_heads; ++h) again.pos.push_back(as_vector(plan.positions[h]));
      m.after_attention(l, tok);
    }
  }
  REQUIRE(again.pos == ta.pos);
}

TEST_CASE("freekv: bad parameters and calls are kvsift::error before anything changes", "[freekv]") {
  const model_shape sh{2, 4, 2, 8};
  kvsift::store::tiered<float> st(sh, 1, 256, 8);
  const auto bad = [&](params p) { REQUIRE_THROWS_AS(kvsift::freekv<float>(st, p), kvsift::error); };
  auto p = small_params();
  p.budget = 60;  // not whole pages
  bad(p);
  p = small_params();
  p.budget = 16;  // fewer pages than sink + window
  bad(p);
  p = small_params();
  p.budget = -8;
  bad(p);
  p = small_params();
  p.sink = 4;
  bad(p);
  p = small_params();
  p.window = 0;  // the current page is in the window
  bad(p);
  p = small_params();
  p.tau = 2.0;
  bad(p);
  p = small_params();
  p.page_size = 16;  // the store's pages are 8
  p.budget = 64;
  p.sink = 16;
  p.window = 16;
  bad(p);
  p = small_params();
  p.dense_layers = -1;
  bad(p);

  kvsift::freekv<float> m(st, small_params());
  const script sc(sh, 100, 2, 3);
  for (int l = 0; l < sh.layers; ++l) m.prefill(l, sc.prompt(0, l));
  const int before = st.host_length(0, 1);
  const std::vector<kvsift::decode_token<float>> twice{sc.token(0, 1, 0), sc.token(0, 1, 0)};
  REQUIRE_THROWS_AS(m.decode(1, twice), kvsift::error);
  REQUIRE_THROWS_AS(m.decode(2, sc.token(0, 1, 0)), kvsift::error);
  auto no_query = sc.token(0, 1, 0);
  no_query.query = nullptr;
  REQUIRE_THROWS_AS(m.decode(1, no_query), kvsift::error);
  REQUIRE(st.host_length(0, 1) == before);
  // the selector alone: a budget below sink + window with more pages is an error naming it
  const kvsift::select::freekv_pages sel{{.page_size = 8, .sink = 8, .window = 16}};
  kvsift::score_sets scores;
  const std::vector<int> sizes{10};
  scores.resize(sizes);
  kvsift::index_sets kept;
  const std::vector<int> small{16};
  REQUIRE_THROWS_AS(sel.select(scores, small, kept), kvsift::error);
  const std::vector<int> ragged{20};
  REQUIRE_THROWS_AS(sel.select(scores, ragged, kept), kvsift::error);
}

TEST_CASE("freekv: documented example", "[freekv][docs]") {
  // example-begin freekv
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const kvsift::model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  const int n = 60;  // pages of 8: 0..6 complete, page 7 holds 56..59 and the decode tokens
  kvsift::store::tiered<float> store(shape, /*requests=*/1, /*host_capacity=*/128, /*page_size=*/8);
  // 4 pages per step: sink page 0, one selected page, a window of 2 pages; layer 0 stays dense
  kvsift::freekv<float> m(store, {.page_size = 8, .budget = 32, .sink = 8, .window = 16});

  // keys are 0 except token 27 (page 3), channel 0 = 3
  std::vector<float> k((n + 2) * 2 * 8, 0.0f), v((n + 2) * 2 * 8, 1.0f), q(4 * 8, 0.0f);
  for (int h = 0; h < 2; ++h) k[(27 * 2 + h) * 8] = 3.0f;
  for (int h = 0; h < 4; ++h) q[h * 8] = 1.0f;
  for (int layer = 0; layer < shape.layers; ++layer) {  // prefill needs no queries
    m.prefill(layer, {.request = 0,
                      .keys = view::contiguous(k.data(), n, 2, 8),
                      .values = view::contiguous(v.data(), n, 2, 8),
                      .queries = {}});
  }
  REQUIRE(store.length(0, 1, 0) == 8 + 8 + 4);  // layer 1 keeps sink page 0, window pages 6, 7
  REQUIRE(store.host_length(0, 1) == n);         // the host pool keeps every token

  for (int step = 0; step < 2; ++step) {
    const kvsift::decode_token<float> tok{0, q.data(), &k[(n + step) * 2 * 8],
                                          &v[(n + step) * 2 * 8]};
    for (int layer = 0; layer < shape.layers; ++layer) {
      const auto& plan = m.decode(layer, tok);
      if (layer == 1) {
        // step 1 selects with q_1 and recalls page 3 before attention; step 2 reuses the
        // selection made after step 1 (same query: cosine 1 >= tau, no correction)
        REQUIRE(as_vector(plan.pages[0]) == std::vector<std::int32_t>{0, 3, 6, 7});
        REQUIRE(store.length(0, 1, 0) == static_cast<int>(plan.positions[0].size()));
      }
      std::vector<float> out(4 * 8);
      m.attend(layer, {&tok, 1}, out.data());
      m.after_attention(layer, tok);
    }
  }
  REQUIRE(m.corrections_made() == 0);
  // page 3 (8 tokens, K and V, d = 8 floats) of both KV heads moved once
  REQUIRE(m.stats().bytes_transferred == 2 * (8 * 2 * 8 * 4));
  // example-end freekv
}

TEST_CASE("freekv: prefill with the prompt's last query places the budget's pages", "[freekv]") {
  const model_shape sh{2, 4, 2, 8};
  const script sc(sh, 150, 3, 51);
  const auto prm = small_params();
  for (const bool with_queries : {false, true}) {
    CAPTURE(with_queries);
    kvsift::store::tiered<float> st(sh, 1, sc.n + sc.steps, 8);
    kvsift::freekv<float> m(st, prm);
    for (int l = 0; l < sh.layers; ++l) {
      auto chunk = sc.prompt(0, l);
      // the prompt's last query is step 1's query: the placement is step 1's selection
      if (with_queries) chunk.queries = view::contiguous(sc.q[l].data(), 1, sh.q_heads, sh.head_dim);
      m.prefill(l, chunk);
    }
    const int resident = st.length(sh.sequence(0, 1, 0));
    // sink (1 page) + window of step 1's layout (pages 18: 144..149, and 17) [+ 5 selected pages]
    CHECK(resident == (with_queries ? 8 + 5 * 8 + 8 + 6 : 8 + 8 + 6));
    const auto tok = sc.token(0, 1, 0);
    m.decode(0, sc.token(0, 0, 0));
    const auto& plan = m.decode(1, tok);
    REQUIRE(static_cast<int>(plan.pages[0].size()) == prm.budget / prm.page_size);
    // with the placement nothing is missing at step 1: no bytes move
    CHECK((m.stats().bytes_transferred == 0) == with_queries);
  }
}

TEST_CASE("freekv: freekv_params scales sink and window; the registry builds it over store::tiered",
          "[freekv]") {
  const auto paper = kvsift::freekv_params<float>(2048);
  CHECK(paper.budget == 2048);
  CHECK(paper.sink == 512);
  CHECK(paper.window == 512);
  const auto small = kvsift::freekv_params<float>(130, 16);  // 130 -> 8 pages, S = W = 2 pages
  CHECK(small.budget == 128);
  CHECK(small.sink == 32);
  CHECK(small.window == 32);
  CHECK(kvsift::freekv_params<float>(10, 16).budget == 32);  // at least sink + window

  const model_shape sh{4, 4, 2, 8};
  kvsift::method_config c;
  c.shape = sh;
  c.capacity = 600;
  c.prompt_len = 500;
  c.budget = 125;
  const auto& reg = kvsift::default_method_registry<float>();
  // a resident share of 0.5 with one dense layer of four: the sparse layers aim at 1/3
  const auto tuned = reg.for_resident_fraction("freekv", c, 0.5);
  REQUIRE(tuned.has_value());
  CHECK(tuned->budget % 16 == 0);
  CHECK(std::abs(tuned->budget - 16 + 500 % 16 - 500.0 / 3) <= 8);
  auto m = reg.make("freekv", *tuned);
  REQUIRE(m->name() == "freekv");
  const script sc(sh, 500, 2, 61);
  for (int l = 0; l < sh.layers; ++l) {
    const auto chunk = sc.prompt(0, l);
    m->prefill(l, std::span<const kvsift::prefill_chunk<float>>(&chunk, 1));
  }
  const auto tok = sc.token(0, 3, 0);
  const auto& plan = m->decode(3, std::span<const kvsift::decode_token<float>>(&tok, 1));
  CHECK(static_cast<int>(plan.pages[0].size()) == tuned->budget / 16);
}
