// SPDX-License-Identifier: Apache-2.0
// The usage examples of docs/methods/*.md, one per baseline and one for choosing a method by name.
// Each example is cut from here between `// example-begin NAME` / `// example-end NAME` markers
// (test_docs checks the pages quote them verbatim) and REQUIREs the outcome it shows: the tokens
// and positions kept, what a decode step reads, what stays resident.

#include <kvsift/kvsift.hpp>
#include <kvsift/method/any_method.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <numeric>
#include <span>
#include <vector>

namespace {

// The original positions resident in one head-sequence, ascending.
template <class Store>
std::vector<std::int32_t> resident(const Store& store, int request, int layer, int head) {
  const auto seq = store.shape().sequence(request, layer, head);
  std::vector<std::int32_t> out;
  for (int j = 0; j < store.length(seq); ++j) out.push_back(store.position(seq, j));
  return out;
}

std::vector<std::int32_t> range(std::int32_t first, std::int32_t last) {  // [first, last)
  std::vector<std::int32_t> out(static_cast<std::size_t>(last - first));
  std::iota(out.begin(), out.end(), first);
  return out;
}

std::vector<std::int32_t> join(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::int32_t> as_vector(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

}  // namespace

TEST_CASE("full_kv: usage example", "[method][example][full_kv]") {
  // example-begin full_kv
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const kvsift::model_shape shape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  store_t store(shape, /*requests=*/1, /*capacity=*/128);
  kvsift::full_kv<store_t> m(store, kvsift::full_kv_params<store_t>());

  const int n = 100;  // the prompt: keys and values [n + 1, kv_heads, d], the last row for decode
  std::vector<float> k((n + 1) * 2 * 8, 0.25f), v((n + 1) * 2 * 8, 1.0f), q(4 * 8, 0.5f);
  m.prefill(/*layer=*/0, {.request = 0,
                          .keys = view::contiguous(k.data(), n, 2, 8),
                          .values = view::contiguous(v.data(), n, 2, 8),
                          .queries = {}});  // full_kv needs no queries
  REQUIRE(store.length(0, 0, 0) == n);

  const kvsift::decode_token<float> tok{0, q.data(), &k[n * 2 * 8], &v[n * 2 * 8]};
  const auto& plan = m.decode(/*layer=*/0, tok);
  REQUIRE(plan.positions[0].size() == n + 1);  // every prompt token plus the new one
  REQUIRE(plan.positions[0].back() == n);
  m.after_attention(0, tok);  // nothing to decide
  REQUIRE(store.length(0, 0, 1) == n + 1);
  // example-end full_kv
  REQUIRE(resident(store, 0, 0, 0) == range(0, n + 1));
  static_assert(kvsift::full_kv<store_t>::caps.needs_queries == false);
}

TEST_CASE("streaming_llm: usage example", "[method][example][streaming_llm]") {
  // example-begin streaming_llm
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  store_t store({.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 8}, /*requests=*/1,
                /*capacity=*/128);
  // a budget of 16 tokens per head-sequence: the 4 sinks plus the newest 12
  kvsift::streaming_llm<store_t> m(store, kvsift::streaming_llm_params<store_t>(/*budget=*/16));

  const int n = 100;
  std::vector<float> k((n + 1) * 2 * 8, 0.25f), v((n + 1) * 2 * 8, 1.0f);
  m.prefill(/*layer=*/0, {.request = 0,
                          .keys = view::contiguous(k.data(), n, 2, 8),
                          .values = view::contiguous(v.data(), n, 2, 8),
                          .queries = {}});  // recency needs no queries
  std::vector<std::int32_t> sinks{0, 1, 2, 3};
  REQUIRE(resident(store, 0, 0, 0) == join(sinks, range(88, 100)));

  // a decode step reads the kept set plus its new token (position 100) ...
  const kvsift::decode_token<float> tok{0, nullptr, &k[n * 2 * 8], &v[n * 2 * 8]};
  const auto& plan = m.decode(/*layer=*/0, tok);
  REQUIRE(as_vector(plan.positions[0]) == join(sinks, range(88, 101)));
  // ... and afterwards the oldest non-sink token (88) is dropped: 16 again
  m.after_attention(0, tok);
  REQUIRE(resident(store, 0, 0, 0) == join(sinks, range(89, 101)));
  // example-end streaming_llm
  REQUIRE(resident(store, 0, 0, 1) == join(sinks, range(89, 101)));
  REQUIRE(m.stats().resident_tokens == 2 * 16);
}

TEST_CASE("streaming_llm: a budget below the sinks is an error once it must evict",
          "[method][streaming_llm][bad_input]") {
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  store_t store({.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 4}, 1, 16);
  kvsift::streaming_llm<store_t> m(store, kvsift::streaming_llm_params<store_t>(3));
  std::vector<float> k(16 * 4, 0.5f);
  const view five = view::contiguous(k.data(), 5, 1, 4);
  REQUIRE_THROWS_AS(m.prefill(0, {.request = 0, .keys = five, .values = five, .queries = {}}), kvsift::error);
  REQUIRE(store.length(0, 0, 0) == 0);  // nothing appended
  // a prompt that fits the budget passes (SPEC: B < S is an error only when n > B); the first
  // decode step that would overflow it throws before its token is appended
  const view two = view::contiguous(k.data(), 2, 1, 4);
  m.prefill(0, {.request = 0, .keys = two, .values = two, .queries = {}});
  const kvsift::decode_token<float> tok{0, nullptr, k.data(), k.data()};
  m.decode(0, tok);
  m.after_attention(0, tok);  // 3 tokens: fits
  REQUIRE_THROWS_AS(m.decode(0, tok), kvsift::error);  // 4 > 3 and 3 < sink 4
  REQUIRE(store.length(0, 0, 0) == 3);  // the step's token was not appended
}

TEST_CASE("h2o: usage example", "[method][example][h2o]") {
  // example-begin h2o
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const int n = 32, d = 4, q_heads = 2, kv_heads = 1;
  store_t store({.layers = 1, .q_heads = q_heads, .kv_heads = kv_heads, .head_dim = d},
                /*requests=*/1, /*capacity=*/64);
  // budget 8: the recent window floor(8 / 2) = 4 plus the 4 heaviest hitters
  kvsift::h2o<store_t> m(store, kvsift::h2o_params<store_t>(/*budget=*/8));

  // every key is 0 except token 10's, which every query matches: from query 10 on, all the
  // attention goes to token 10; before it, attention is uniform over the causal prefix
  std::vector<float> k((n + 1) * kv_heads * d, 0.0f), v = k;
  std::vector<float> q((n + 1) * q_heads * d, 0.0f);
  k[10 * kv_heads * d] = 5.0f;
  for (int i = 0; i <= n; ++i) {
    for (int h = 0; h < q_heads; ++h) q[(i * q_heads + h) * d] = 5.0f;
  }
  m.prefill(/*layer=*/0, {.request = 0,
                          .keys = view::contiguous(k.data(), n, kv_heads, d),
                          .values = view::contiguous(v.data(), n, kv_heads, d),
                          .queries = view::contiguous(q.data(), n, q_heads, d)});  // all n
  // cumulative attention: token 10 first, then 0, 1, 2 (seen by the most uniform queries)
  REQUIRE(resident(store, 0, 0, 0) == std::vector<std::int32_t>{0, 1, 2, 10, 28, 29, 30, 31});

  // decode: the step reads the 8 kept tokens plus its own (position 32) ...
  const kvsift::decode_token<float> tok{0, &q[n * q_heads * d], &k[n * kv_heads * d],
                                        &v[n * kv_heads * d]};
  REQUIRE(m.decode(/*layer=*/0, tok).positions[0].size() == 9);
  // ... then its attention joins the running scores and, 9 > 8, the lowest-scored token older
  // than the newest 4 goes: 28, which has just left the recent window and is no heavy hitter
  m.after_attention(0, tok);
  REQUIRE(resident(store, 0, 0, 0) == std::vector<std::int32_t>{0, 1, 2, 10, 29, 30, 31, 32});
  // example-end h2o
  REQUIRE(m.scorer_state().running(store.shape().sequence(0, 0, 0)).size() == 8);
}

TEST_CASE("snapkv: usage example", "[method][example][snapkv]") {
  // example-begin snapkv
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const int n = 32, d = 4, q_heads = 2, kv_heads = 1, w = 4;
  store_t store({.layers = 1, .q_heads = q_heads, .kv_heads = kv_heads, .head_dim = d},
                /*requests=*/1, /*capacity=*/64);
  // budget 11 = the observation window (4 here, 32 by default) + the top 7 past tokens;
  // kernel 7, avg pooling and GQA mean are the defaults
  kvsift::snapkv<store_t> m(store, kvsift::snapkv_params<store_t>(/*budget=*/11, /*window=*/w));

  // every key is 0 except token 10's, which the window's queries match
  std::vector<float> k((n + 1) * kv_heads * d, 0.0f), v = k;
  std::vector<float> q((n + 1) * q_heads * d, 0.0f);
  k[10 * kv_heads * d] = 5.0f;
  for (int i = 0; i <= n; ++i) {
    for (int h = 0; h < q_heads; ++h) q[(i * q_heads + h) * d] = 5.0f;
  }
  // an engine may hand over only the newest w queries (rows n - w .. n - 1)
  m.prefill(/*layer=*/0, {.request = 0,
                          .keys = view::contiguous(k.data(), n, kv_heads, d),
                          .values = view::contiguous(v.data(), n, kv_heads, d),
                          .queries = view::contiguous(&q[(n - w) * q_heads * d], w, q_heads, d)});
  // pooling (kernel 7) spreads token 10's vote over 7..13: they are the top 7 of [0, 28)
  REQUIRE(resident(store, 0, 0, 0) ==
          std::vector<std::int32_t>{7, 8, 9, 10, 11, 12, 13, 28, 29, 30, 31});

  // decoding appends and never evicts: 11 + 1 read, 12 resident afterwards
  const kvsift::decode_token<float> tok{0, &q[n * q_heads * d], &k[n * kv_heads * d],
                                        &v[n * kv_heads * d]};
  REQUIRE(m.decode(/*layer=*/0, tok).positions[0].size() == 12);
  m.after_attention(0, tok);
  REQUIRE(store.length(0, 0, 0) == 12);
  // example-end snapkv
}

TEST_CASE("snapkv: a budget below the window is an error when the prompt exceeds it",
          "[method][snapkv][bad_input]") {
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  store_t store({.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 4}, 1, 64);
  std::vector<float> k(40 * 4, 0.5f), q(40 * 2 * 4, 0.5f);
  const auto chunk = [&](int n) {
    return kvsift::prefill_chunk<float>{.request = 0,
                                        .keys = view::contiguous(k.data(), n, 1, 4),
                                        .values = view::contiguous(k.data(), n, 1, 4),
                                        .queries = view::contiguous(q.data(), n, 2, 4)};
  };
  {
    kvsift::snapkv<store_t> m(store, kvsift::snapkv_params<store_t>(3, 4));  // B < w
    REQUIRE_THROWS_AS(m.prefill(0, chunk(10)), kvsift::error);                  // n > B
    REQUIRE(store.length(0, 0, 0) == 0);
    m.prefill(0, chunk(3));  // n <= B: nothing to evict, no error
    REQUIRE(store.length(0, 0, 0) == 3);
  }
  store.reset(0);
  {
    kvsift::snapkv<store_t> m(store, kvsift::snapkv_params<store_t>(4, 4));  // B == w
    m.prefill(0, chunk(10));
    REQUIRE(resident(store, 0, 0, 0) == range(6, 10));  // the window alone
  }
}

TEST_CASE("pyramidkv: usage example", "[method][example][pyramidkv]") {
  // example-begin pyramidkv
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const kvsift::model_shape shape{.layers = 4, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  const int n = 64, w = 4;
  store_t store(shape, /*requests=*/1, /*capacity=*/128);
  // average budget C = 12 with a window of 4 (32 by default); kernel 7, beta 20
  kvsift::pyramidkv<store_t> m(store, kvsift::pyramidkv_params<store_t>(/*budget=*/12, w));

  std::vector<float> k(n * 2 * 8), v(n * 2 * 8), q(n * 4 * 8);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>((i * 37) % 11) - 5.0f;
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 17) % 7) - 3.0f;
  for (int layer = 0; layer < shape.layers; ++layer) {
    m.prefill(layer, {.request = 0,
                      .keys = view::contiguous(k.data(), n, 2, 8),
                      .values = view::contiguous(v.data(), n, 2, 8),
                      .queries = view::contiguous(q.data(), n, 4, 8)});  // the last w are read
  }
  // C - w = 8 past tokens on average: min = 8 / 20 = 0, max = 2 * 8 - 0 = 16,
  // step = (16 - 0) / (4 - 1) = 5, so the layers keep 16, 11, 6, 1 past tokens plus the window
  REQUIRE(m.stats().layer_budgets == std::vector<int>{20, 15, 10, 5});
  for (int layer = 0; layer < shape.layers; ++layer) {
    for (int h = 0; h < shape.kv_heads; ++h) {
      REQUIRE(store.length(0, layer, h) == m.stats().layer_budgets[layer]);
    }
  }
  // example-end pyramidkv
  for (int layer = 0; layer < shape.layers; ++layer) {
    const auto kept = resident(store, 0, layer, 1);
    REQUIRE(std::vector<std::int32_t>(kept.end() - w, kept.end()) == range(n - w, n));
  }
  REQUIRE_THROWS_AS(kvsift::pyramidkv<store_t>(store, kvsift::pyramidkv_params<store_t>(4, 4)),
                    kvsift::error);  // C <= w, at construction
}

TEST_CASE("quest: usage example", "[method][example][quest]") {
  // example-begin quest
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const kvsift::model_shape shape{.layers = 3, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  const int n = 100;  // pages of 16: 0..5 complete, page 6 holds 96..99 and the decode tokens
  store_t store(shape, /*requests=*/1, /*capacity=*/128);
  // budget 64 tokens = 4 pages per step, the current one included; layers 0 and 1 stay dense
  kvsift::quest<store_t> m(store, kvsift::quest_params<store_t>(/*budget=*/64));

  // keys are 0 except one token in pages 1, 3 and 5 (channel 0 = 1, 3, 2)
  std::vector<float> k((n + 1) * 2 * 8, 0.0f), v((n + 1) * 2 * 8, 1.0f), q(4 * 8, 0.0f);
  for (const auto& [token, x] : {std::pair{20, 1.0f}, {50, 3.0f}, {90, 2.0f}}) {
    for (int h = 0; h < 2; ++h) k[(token * 2 + h) * 8] = x;
  }
  for (int h = 0; h < 4; ++h) q[h * 8] = 1.0f;
  for (int layer = 0; layer < shape.layers; ++layer) {  // prefill only appends: no queries
    m.prefill(layer, {.request = 0,
                      .keys = view::contiguous(k.data(), n, 2, 8),
                      .values = view::contiguous(v.data(), n, 2, 8),
                      .queries = {}});
  }

  const kvsift::decode_token<float> tok{0, q.data(), &k[n * 2 * 8], &v[n * 2 * 8]};
  for (int layer = 0; layer < shape.layers; ++layer) {
    const auto& plan = m.decode(layer, tok);  // selects with this step's query, before attention
    if (layer < 2) {
      REQUIRE(plan.positions[0].size() == n + 1);  // dense layer: every token
    } else {
      // the current page 6, then the top 3 complete pages by sum_c max(q_c kmax_c, q_c kmin_c)
      REQUIRE(as_vector(plan.pages[0]) == std::vector<std::int32_t>{1, 3, 5, 6});
      REQUIRE(plan.positions[0].size() == 3 * 16 + 5);  // page 6 holds 96..100
      REQUIRE(plan.positions[0].back() == n);
    }
    m.after_attention(layer, tok);
  }
  REQUIRE(store.length(0, 2, 0) == n + 1);  // full KV stays resident: Quest saves bandwidth
  // example-end quest
  REQUIRE(store.resident_tokens() == 3 * 2 * (n + 1));
  REQUIRE(m.stats().refreshes == 1);  // one page selection: layer 2's
  static_assert(!kvsift::quest<store_t>::caps.changes_physical_length);
}

TEST_CASE("make_method: choosing a method by name", "[method][example][any_method]") {
  // example-begin methods_by_name
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const kvsift::model_shape shape{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  const int n = 400;  // the prompt; row n is the decode token
  std::vector<float> k((n + 1) * 2 * 8), v((n + 1) * 2 * 8, 1.0f), q((n + 1) * 4 * 8);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>((i * 37) % 11) - 5.0f;
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 17) % 7) - 3.0f;

  std::map<std::string, int> resident_after_one_step;
  for (const std::string& name : kvsift::method_names()) {  // or a --method flag
    store_t store(shape, /*requests=*/1, /*capacity=*/512);
    const std::unique_ptr<kvsift::any_method<store_t>> m =
        kvsift::make_method(name, store, /*budget=*/64);
    const kvsift::prefill_chunk<float> prompt{
        .request = 0,
        .keys = view::contiguous(k.data(), n, 2, 8),
        .values = view::contiguous(v.data(), n, 2, 8),
        .queries = view::contiguous(q.data(), n, 4, 8)};  // all of them: H2O reads every one
    m->prefill(/*layer=*/0, std::span(&prompt, 1));
    const kvsift::decode_token<float> tok{0, &q[n * 4 * 8], &k[n * 2 * 8], &v[n * 2 * 8]};
    const kvsift::attention_plan& plan = m->decode(/*layer=*/0, std::span(&tok, 1));
    (void)plan;  // the engine attends over plan.slots / plan.positions here
    m->after_attention(/*layer=*/0, std::span(&tok, 1));
    resident_after_one_step[name] = store.length(0, 0, 0);
  }
  REQUIRE(resident_after_one_step == std::map<std::string, int>{
                                         {"full_kv", 401},       // everything
                                         {"streaming_llm", 64},  // evicts after every step
                                         {"h2o", 64},            // likewise
                                         {"snapkv", 65},         // compressed once, then appends
                                         {"pyramidkv", 65},      // one layer: the budget C
                                         {"quest", 401},         // selects pages, evicts nothing
                                         {"lagkv", 273},         // 2 rounds kept 64 of 128
                                         {"dynamickv", 65}});

  store_t spare(shape, 1, 8);
  REQUIRE_THROWS_AS(kvsift::make_method("snap_kv", spare, 64), kvsift::error);  // unknown name
  // example-end methods_by_name
}
