// SPDX-License-Identifier: Apache-2.0
// Regression tests for issue 69 (host side; item 1 is in tests/test_engine_methods.cpp, item 7 in
// tests/thrust/test_thrust_plan_export.cpp). Each failed on the code before its fix:
//   2 prefill() of a request in the pending step ends that step: attend() / after_attention()
//     refuse its old plan (SnapKV attended slots that held other tokens; H2O wrote scores past
//     its vector);
//   3 the evict schedule's prefill checks count the request's earlier chunks of the same call
//     (window queries, budgets): nothing is appended when the round would fail or score with
//     fewer queries than its window;
//   4 the one-tier page checks ask no page for a token that fills a waiting hole (StreamingLLM
//     over a pool sized for its window decodes on);
//   5 int32 positions never wrap: stores, the shell's prefill and decode refuse them first;
//   6 run_decode() takes a planned step once, and only while nothing changed the method since.

#include <kvsift/method/baselines.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/paged.hpp>
#include <kvsift/store/tiered.hpp>

#include "store_contents.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::ContainsSubstring;
using dense_t = kvsift::store::dense<float>;
using paged_t = kvsift::store::paged<float>;
using view = kvsift::kv_view<const float, kvsift::nhd>;
using qview = kvsift::kv_view<const float, kvsift::nhd>;

constexpr kvsift::model_shape kShape{.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 8};
constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();

std::vector<float> wave(std::size_t n, float a, float b = 0.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(a * static_cast<float>(i) + b);
  return v;
}

// One request's prompt chunk with its own arrays: `tokens` tokens from `first` on, the newest
// `nq` of them with queries.
struct chunk_data {
  std::vector<float> k, v, q;
  kvsift::prefill_chunk<float> c;
  chunk_data(int request, std::int32_t first, int tokens, int nq, bool last, float seed = 0.3f)
      : k(wave(static_cast<std::size_t>(tokens) * kShape.kv_heads * kShape.head_dim, 0.7f + seed,
               static_cast<float>(first))),
        v(wave(k.size(), 0.4f + seed, 1.0f)),
        q(wave(static_cast<std::size_t>(nq) * kShape.q_heads * kShape.head_dim, 0.9f + seed,
               static_cast<float>(first) * 0.5f)) {
    c.request = request;
    c.keys = view::contiguous(k.data(), tokens, kShape.kv_heads, kShape.head_dim);
    c.values = view::contiguous(v.data(), tokens, kShape.kv_heads, kShape.head_dim);
    c.queries = qview::contiguous(q.data(), nq, kShape.q_heads, kShape.head_dim);
    c.first_position = first;
    c.last = last;
  }
};

// A decode token's arrays.
struct token_data {
  std::vector<float> q, k, v;
  explicit token_data(float seed)
      : q(wave(static_cast<std::size_t>(kShape.q_heads) * kShape.head_dim, 0.8f, seed)),
        k(wave(static_cast<std::size_t>(kShape.kv_heads) * kShape.head_dim, 1.1f, seed)),
        v(wave(k.size(), 0.6f, seed)) {}
  [[nodiscard]] kvsift::decode_token<float> at(int request) const {
    return {request, q.data(), k.data(), v.data()};
  }
};

using kvsift_test::contents;

template <class M>
void prefill(M& m, const std::vector<const chunk_data*>& chunks) {
  std::vector<kvsift::prefill_chunk<float>> cs;
  for (const auto* c : chunks) cs.push_back(c->c);
  m.prefill(0, cs);
}

}  // namespace

// ---- 2. prefill ends the pending step of the requests it extends ----------------------------

TEST_CASE("issue 69.2: a prefill of a request in the pending step ends that step",
          "[defects][lifecycle]") {
  const token_data t(0.2f);
  const auto tok = t.at(0);
  std::vector<float> out(static_cast<std::size_t>(kShape.q_heads) * kShape.head_dim);

  SECTION("SnapKV: attend and after_attention refuse the plan the prefill made stale") {
    dense_t s(kShape, 1, 64);
    kvsift::snapkv<dense_t> m(s, kvsift::snapkv_params<dense_t>(8, 4, 3));
    const chunk_data a(0, 0, 20, 4, true);
    prefill(m, {&a});
    m.decode(0, tok);
    const chunk_data more(0, 21, 12, 4, true, 0.9f);  // more prompt: a round compacts the store
    prefill(m, {&more});
    REQUIRE_THROWS_WITH(m.attend(0, tok, out.data()), ContainsSubstring("argument 'layer'"));
    REQUIRE_THROWS_WITH(m.after_attention(0, tok), ContainsSubstring("argument 'layer'"));
    REQUIRE_NOTHROW(m.decode(0, tok));  // the next step starts with decode()
    REQUIRE_NOTHROW(m.attend(0, tok, out.data()));
    REQUIRE_NOTHROW(m.after_attention(0, tok));
  }
  SECTION("H2O: after_attention refuses the old plan (it wrote scores past its vector)") {
    dense_t s(kShape, 1, 64);
    kvsift::h2o<dense_t> m(s, kvsift::h2o_params<dense_t>(8));
    const chunk_data a(0, 0, 12, 12, true);
    prefill(m, {&a});
    m.decode(0, tok);
    m.attend(0, tok, out.data());
    const chunk_data more(0, 13, 6, 6, true, 0.5f);
    prefill(m, {&more});
    const auto before = contents(s);
    REQUIRE_THROWS_WITH(m.after_attention(0, tok), ContainsSubstring("argument 'layer'"));
    REQUIRE(contents(s) == before);
  }
  SECTION("a prefill of another request leaves the pending step bound") {
    dense_t s(kShape, 2, 64);
    kvsift::snapkv<dense_t> m(s, kvsift::snapkv_params<dense_t>(8, 4, 3));
    const chunk_data a(0, 0, 20, 4, true);
    prefill(m, {&a});
    m.decode(0, tok);
    const chunk_data other(1, 0, 16, 4, true, 0.6f);
    prefill(m, {&other});
    REQUIRE_NOTHROW(m.attend(0, tok, out.data()));
    REQUIRE_NOTHROW(m.after_attention(0, tok));
  }
}

// ---- 3. the evict schedule's prefill checks count the call's earlier chunks -----------------

TEST_CASE("issue 69.3: SnapKV's window check counts the queries the round will read",
          "[defects][lifecycle][bad_input]") {
  dense_t s(kShape, 1, 64);
  kvsift::snapkv<dense_t> m(s, kvsift::snapkv_params<dense_t>(8, 8, 3));
  SECTION("2 of 8 window queries: refused, nothing appended") {
    // 10 tokens without queries, then 2 with theirs: the window needs the prompt's newest 8
    const chunk_data a(0, 0, 10, 0, false), b(0, 10, 2, 2, true);
    const auto before = contents(s);
    REQUIRE_THROWS_WITH(prefill(m, {&a, &b}),
                        ContainsSubstring("argument 'queries.tokens'") && ContainsSubstring("8"));
    REQUIRE(contents(s) == before);
  }
  SECTION("the window's queries split over two chunks of the call: accepted, the same round") {
    const chunk_data a(0, 0, 10, 6, false), b(0, 10, 2, 2, true);
    REQUIRE_NOTHROW(prefill(m, {&a, &b}));
    // the same prompt in one chunk with its newest 8 queries keeps the same tokens
    dense_t s1(kShape, 1, 64);
    kvsift::snapkv<dense_t> one(s1, kvsift::snapkv_params<dense_t>(8, 8, 3));
    chunk_data whole(0, 0, 12, 8, true);
    std::copy(a.k.begin(), a.k.end(), whole.k.begin());
    std::copy(b.k.begin(), b.k.end(), whole.k.begin() + static_cast<std::ptrdiff_t>(a.k.size()));
    std::copy(a.v.begin(), a.v.end(), whole.v.begin());
    std::copy(b.v.begin(), b.v.end(), whole.v.begin() + static_cast<std::ptrdiff_t>(a.v.size()));
    std::copy(a.q.begin(), a.q.end(), whole.q.begin());
    std::copy(b.q.begin(), b.q.end(), whole.q.begin() + static_cast<std::ptrdiff_t>(a.q.size()));
    prefill(one, {&whole});
    REQUIRE(s.length(0) == 8);
    REQUIRE(contents(s) == contents(s1));
  }
}

TEST_CASE("issue 69.3: a budget below the window is refused before chunks of one call are appended",
          "[defects][lifecycle][bad_input]") {
  dense_t s(kShape, 1, 64);
  kvsift::snapkv<dense_t> m(s, kvsift::snapkv_params<dense_t>(6, 8, 3));
  const chunk_data a(0, 0, 10, 2, false), b(0, 10, 6, 6, true);
  const auto before = contents(s);
  REQUIRE_THROWS_AS(prefill(m, {&a, &b}), kvsift::error);
  REQUIRE(contents(s) == before);  // was: 16 tokens resident, uncompressed
  REQUIRE(s.length(0) == 0);
  // the request can still be prefilled (a prompt that fits the budget)
  const chunk_data c(0, 0, 5, 5, true);
  REQUIRE_NOTHROW(prefill(m, {&c}));
  REQUIRE(s.length(0) == 5);
}

// ---- 4. a token that fills a waiting hole needs no page -------------------------------------

TEST_CASE("issue 69.4: StreamingLLM over a page pool sized for its window decodes on",
          "[defects][paged]") {
  // budget 8 = 4 sinks + 4 recent, pages of 4: the window and the step's new token take 3 pages
  paged_t s(kShape, 1, 4, 3);
  kvsift::streaming_llm<paged_t> m(s, kvsift::streaming_llm_params<paged_t>(8, 4));
  const chunk_data a(0, 0, 8, 0, true);
  prefill(m, {&a});
  for (int step = 0; step < 20; ++step) {
    CAPTURE(step);
    const token_data t(0.1f * static_cast<float>(step));
    const auto& plan = m.decode(0, t.at(0));  // was refused at step 1: "room in the page pool"
    const auto pos = plan.positions[0];
    REQUIRE(pos.size() == 9);
    for (int i = 0; i < 4; ++i) REQUIRE(pos[static_cast<std::size_t>(i)] == i);
    REQUIRE(pos.back() == 8 + step);
    m.after_attention(0, t.at(0));
    REQUIRE(s.length(0) == 8);
    REQUIRE(s.free_pages() == 0);
  }
  // a prefill chunk that starts in the hole takes pages only for the rest
  REQUIRE(s.row_extent(0) == 9);
  REQUIRE(s.pages_to_append(0, 1) == 0);
  REQUIRE(s.pages_to_append(0, 4) == 0);
  REQUIRE(s.pages_to_append(0, 5) == 1);
}

TEST_CASE("issue 69.4: a full shared pool is refused before the step, not after an eviction",
          "[defects][paged][bad_input]") {
  // two requests share 5 pages; request 1 holds 2 of them
  paged_t s(kShape, 2, 4, 5);
  kvsift::streaming_llm<paged_t> m(s, kvsift::streaming_llm_params<paged_t>(8, 4));
  const chunk_data a(0, 0, 8, 0, true), b(1, 0, 8, 0, true, 0.7f);
  prefill(m, {&a, &b});
  REQUIRE(s.free_pages() == 1);
  const token_data t(0.3f);
  m.decode(0, t.at(0));  // request 0 takes the last page
  m.after_attention(0, t.at(0));
  REQUIRE(s.free_pages() == 0);
  for (int step = 0; step < 5; ++step) {  // request 0 decodes on in its hole
    m.decode(0, t.at(0));
    m.after_attention(0, t.at(0));
  }
  // request 1 needs a page for its first decode token: refused, nothing changed
  const auto before = contents(s);
  REQUIRE_THROWS_AS(m.decode(0, t.at(1)), kvsift::error);
  REQUIRE(contents(s) == before);
}

// ---- 5. int32 positions never wrap --------------------------------------------------------

TEST_CASE("issue 69.5: positions past INT32_MAX are refused by stores and the shell",
          "[defects][bad_input]") {
  const chunk_data two(0, kMax - 1, 2, 0, true);   // would end at INT32_MAX + 1
  const chunk_data one(0, kMax - 3, 3, 0, true);   // ends at INT32_MAX - 1: next is INT32_MAX
  SECTION("store::dense, store::paged, store::tiered") {
    dense_t d(kShape, 1, 16);
    paged_t p(kShape, 1, 4, 8);
    kvsift::store::tiered<float> t(kShape, 1, 16, 4);
    REQUIRE_THROWS_WITH(d.append(0, 0, two.c.keys, two.c.values, kMax - 1),
                        ContainsSubstring("argument 'first_position'") && ContainsSubstring("INT32_MAX"));
    REQUIRE_THROWS_WITH(p.append(0, 0, two.c.keys, two.c.values, kMax - 1),
                        ContainsSubstring("argument 'first_position'"));
    REQUIRE_THROWS_WITH(t.append(0, 0, two.c.keys, two.c.values, kMax - 1),
                        ContainsSubstring("argument 'first_position'"));
    REQUIRE(d.length(0) == 0);
    REQUIRE(p.length(0) == 0);
    REQUIRE(d.next_position(0, 0) == 0);
    REQUIRE_NOTHROW(d.append(0, 0, one.c.keys, one.c.values, kMax - 3));
    REQUIRE(d.next_position(0, 0) == kMax);
  }
  SECTION("the shell's prefill and decode") {
    dense_t s(kShape, 1, 16);
    kvsift::full_kv<dense_t> m(s, kvsift::full_kv_params<dense_t>());
    REQUIRE_THROWS_WITH(prefill(m, {&two}), ContainsSubstring("argument 'first_position'"));
    REQUIRE(s.length(0) == 0);
    prefill(m, {&one});
    REQUIRE(s.next_position(0, 0) == kMax);
    const token_data t(0.4f);
    const auto before = contents(s);
    REQUIRE_THROWS_WITH(m.decode(0, t.at(0)), ContainsSubstring("argument 'next position'"));
    REQUIRE(contents(s) == before);
  }
}

// ---- 6. a planned step runs once, and only while it is current -------------------------------

TEST_CASE("issue 69.6: run_decode refuses a step that is no longer current", "[defects][lifecycle]") {
  dense_t s(kShape, 2, 64);
  kvsift::h2o<dense_t> m(s, kvsift::h2o_params<dense_t>(16));
  const chunk_data a(0, 0, 10, 10, true), b(1, 0, 12, 12, true, 0.5f);
  prefill(m, {&a, &b});
  const token_data t0(0.1f), t1(0.2f);
  const std::vector<kvsift::decode_token<float>> batch{t0.at(0), t1.at(1)};

  SECTION("a replayed step") {
    const auto step = m.plan_decode(0, batch);
    m.run_decode(step);
    m.after_attention(0, batch);
    const auto before = contents(s);
    REQUIRE_THROWS_WITH(m.run_decode(step), ContainsSubstring("argument 'step'"));
    REQUIRE(contents(s) == before);  // was: request 0 decoded twice, then a throw for request 1
  }
  SECTION("two steps planned, the second run after the first") {
    const auto first = m.plan_decode(0, batch);
    const auto second = m.plan_decode(0, batch);
    m.run_decode(first);
    const auto before = contents(s);
    REQUIRE_THROWS_WITH(m.run_decode(second), ContainsSubstring("argument 'step'"));
    REQUIRE(contents(s) == before);
  }
  SECTION("a prefill or a reset in between") {
    const auto step = m.plan_decode(0, batch);
    m.reset(1);
    REQUIRE_THROWS_WITH(m.run_decode(step), ContainsSubstring("argument 'step'"));
    const std::vector<kvsift::decode_token<float>> alone{t0.at(0)};
    const auto again = m.plan_decode(0, alone);
    const chunk_data c(1, 0, 8, 8, true);
    prefill(m, {&c});
    REQUIRE_THROWS_WITH(m.run_decode(again), ContainsSubstring("argument 'step'"));
    REQUIRE_NOTHROW(m.run_decode(m.plan_decode(0, batch)));  // planned anew: runs
  }
}
