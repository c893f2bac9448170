// SPDX-License-Identifier: Apache-2.0
// Every public entry validates its input: it throws kvsift::error naming the argument, and the
// store is exactly as it was (lengths, positions, resident bytes, key and value bytes).

#include <kvsift/io/safetensors.hpp>
#include <kvsift/kvsift.hpp>
#include <kvsift/method/any_method.hpp>
#include <kvsift/method/freekv.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/method/synckv.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Catch::Matchers::ContainsSubstring;
using kvsift::model_shape;

constexpr model_shape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 4};

// Everything observable about a store.
struct snapshot {
  std::vector<int> lengths;
  std::vector<std::int32_t> positions;
  std::vector<unsigned char> bytes;  // key and value bytes of every resident row
  std::int64_t resident_bytes = 0;
  std::int64_t resident_tokens = 0;
  std::vector<std::int32_t> next;
  bool operator==(const snapshot&) const = default;
};

template <class Store>
snapshot take(const Store& s) {
  using T = typename Store::element_type;
  snapshot out;
  const auto& sh = s.shape();
  for (std::int64_t seq = 0; seq < s.requests() * sh.sequences_per_request(); ++seq) {
    out.lengths.push_back(s.length(seq));
    for (int i = 0; i < s.length(seq); ++i) {
      out.positions.push_back(s.position(seq, i));
      const auto* k = reinterpret_cast<const unsigned char*>(s.key(seq, i));
      const auto* v = reinterpret_cast<const unsigned char*>(s.value(seq, i));
      out.bytes.insert(out.bytes.end(), k, k + sh.head_dim * sizeof(T));
      out.bytes.insert(out.bytes.end(), v, v + sh.head_dim * sizeof(T));
    }
  }
  for (int r = 0; r < s.requests(); ++r)
    for (int l = 0; l < sh.layers; ++l) out.next.push_back(s.next_position(r, l));
  out.resident_bytes = s.resident_bytes();
  out.resident_tokens = s.resident_tokens();
  return out;
}

// f() must throw kvsift::error naming `arg`, and leave the store unchanged.
#define REQUIRE_REJECTS(store, expr, arg)                                              \
  do {                                                                                 \
    const auto before_ = take(store);                                                  \
    REQUIRE_THROWS_AS(expr, kvsift::error);                                            \
    REQUIRE_THROWS_WITH(expr, ContainsSubstring(std::string("argument '") + (arg)));   \
    REQUIRE(take(store) == before_);                                                   \
  } while (0)

template <class T>
std::vector<T> filled(std::size_t n, float base) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = kvsift::from_float<T>(base + static_cast<float>(i % 13));
  return v;
}

template <class T>
using view = kvsift::kv_view<const T, kvsift::nhd>;

// A store holding some tokens in every (request, layer), one request partly compressed.
template <class Store>
void populate(Store& s) {
  using T = typename Store::element_type;
  for (int r = 0; r < s.requests(); ++r) {
    for (int l = 0; l < kShape.layers; ++l) {
      const int n = 3 + r + l;
      const auto k = filled<T>(static_cast<std::size_t>(n) * 2 * 4, static_cast<float>(r + l));
      const auto v = filled<T>(k.size(), -1.0f);
      s.append(r, l, view<T>::contiguous(k.data(), n, 2, 4), view<T>::contiguous(v.data(), n, 2, 4), 0);
    }
  }
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{0, 2});
  kept.push_back(std::vector<std::int32_t>{1});
  s.retain(0, 1, kept);  // positions {0, 2} and {1}; next position stays 4
}

}  // namespace

TEMPLATE_TEST_CASE("store.append and store.retain reject bad input and change nothing",
                   "[bad_input][store]", (kvsift::store::dense<float>),
                   (kvsift::store::dense<kvsift::half>), (kvsift::store::paged<kvsift::bfloat16>),
                   (kvsift::store::paged<float>)) {
  using Store = TestType;
  using T = typename Store::element_type;
  auto s = [] {
    if constexpr (std::is_same_v<Store, kvsift::store::dense<T>>) {
      return Store(kShape, 2, 12);
    } else {
      return Store(kShape, 2, 4, 2 * 2 * 2 * 3);  // 3 pages of 4 per head-sequence
    }
  }();
  populate(s);
  const auto k = filled<T>(5 * 2 * 4, 0.5f);
  const auto v = filled<T>(5 * 2 * 4, 1.5f);
  const auto k3 = filled<T>(5 * 3 * 4, 0.5f);
  const auto good_k = view<T>::contiguous(k.data(), 5, 2, 4);
  const auto good_v = view<T>::contiguous(v.data(), 5, 2, 4);

  SECTION("view heads and dim must match the shape") {
    REQUIRE_REJECTS(s, s.append(1, 0, view<T>::contiguous(k3.data(), 5, 3, 4), good_v, 10), "k.heads");
    REQUIRE_REJECTS(s, s.append(1, 0, good_k, view<T>::contiguous(k3.data(), 5, 3, 4), 10), "v.heads");
    REQUIRE_REJECTS(s, s.append(1, 0, view<T>::contiguous(k.data(), 5, 2, 3), good_v, 10), "k.dim");
    REQUIRE_REJECTS(s, s.append(1, 0, good_k, view<T>::contiguous(v.data(), 4, 2, 4), 10), "v.tokens");
    REQUIRE_REJECTS(s, s.append(1, 0, view<T>::contiguous(nullptr, 5, 2, 4), good_v, 10), "k.data");
  }
  SECTION("request and layer must be in range") {
    REQUIRE_REJECTS(s, s.append(2, 0, good_k, good_v, 10), "request");
    REQUIRE_REJECTS(s, s.append(-1, 0, good_k, good_v, 10), "request");
    REQUIRE_REJECTS(s, s.append(0, 2, good_k, good_v, 10), "layer");
    kvsift::index_sets kept;
    kept.push_back(std::vector<std::int32_t>{0});
    kept.push_back(std::vector<std::int32_t>{0});
    REQUIRE_REJECTS(s, s.retain(5, 0, kept), "request");
    REQUIRE_REJECTS(s, s.retain(0, -1, kept), "layer");
    REQUIRE_REJECTS(s, s.reset(2), "request");
  }
  SECTION("first_position must not go backwards, even behind evicted tokens") {
    REQUIRE_REJECTS(s, s.append(1, 1, good_k, good_v, 4), "first_position");  // 5 resident: 0..4
    REQUIRE_REJECTS(s, s.append(0, 1, good_k, good_v, 3), "first_position");  // newest kept is 2, appended 3
    REQUIRE_NOTHROW(s.append(0, 1, good_k, good_v, 4));
    REQUIRE(s.position(kShape.sequence(0, 1, 1), 1) == 4);
  }
  SECTION("appending beyond capacity") {
    const auto big_k = filled<T>(64 * 2 * 4, 0.0f);
    const auto big_v = filled<T>(64 * 2 * 4, 0.0f);
    // request 1 layer 1 holds 5 tokens; 64 more fit neither 12 dense slots nor the free pages
    REQUIRE_REJECTS(s, s.append(1, 1, view<T>::contiguous(big_k.data(), 64, 2, 4),
                                view<T>::contiguous(big_v.data(), 64, 2, 4), 10),
                    "k.tokens");
  }
  SECTION("retain: one ascending in-range segment per KV head") {
    kvsift::index_sets one;
    one.push_back(std::vector<std::int32_t>{0});
    REQUIRE_REJECTS(s, s.retain(1, 0, one), "kept.segments");
    kvsift::index_sets out_of_range;
    out_of_range.push_back(std::vector<std::int32_t>{0, 1});
    out_of_range.push_back(std::vector<std::int32_t>{2, 4});  // request 1 layer 0 has 4 tokens
    REQUIRE_REJECTS(s, s.retain(1, 0, out_of_range), "kept[1][1]");
    kvsift::index_sets negative;
    negative.push_back(std::vector<std::int32_t>{-1});
    negative.push_back(std::vector<std::int32_t>{0});
    REQUIRE_REJECTS(s, s.retain(1, 0, negative), "kept[0][0]");
    kvsift::index_sets descending;
    descending.push_back(std::vector<std::int32_t>{0, 1});
    descending.push_back(std::vector<std::int32_t>{2, 1});
    REQUIRE_REJECTS(s, s.retain(1, 0, descending), "kept[1][1]");
    kvsift::index_sets repeated;
    repeated.push_back(std::vector<std::int32_t>{1, 1});
    repeated.push_back(std::vector<std::int32_t>{0});
    REQUIRE_REJECTS(s, s.retain(1, 0, repeated), "kept[0][1]");
  }
}

TEST_CASE("paged store: a pool too small for every KV head's pages rejects the append",
          "[bad_input][store]") {
  // each of 2 heads needs 2 pages (8 tokens, pages of 4) but only 3 pages are free: every head
  // alone fits, together they do not
  kvsift::store::paged<float> s(kShape, 1, 4, 3);
  const auto k = filled<float>(8 * 2 * 4, 0.0f);
  REQUIRE_REJECTS(s, s.append(0, 0, view<float>::contiguous(k.data(), 8, 2, 4),
                              view<float>::contiguous(k.data(), 8, 2, 4), 0),
                  "k.tokens");
  REQUIRE(s.free_pages() == 3);
  REQUIRE_NOTHROW(s.append(0, 0, view<float>::contiguous(k.data(), 4, 2, 4),
                           view<float>::contiguous(k.data(), 4, 2, 4), 0));
  REQUIRE(s.free_pages() == 1);  // one page per head
}

TEST_CASE("constructors validate shape, capacity and pool", "[bad_input][shape]") {
  auto bad = kShape;
  bad.q_heads = 3;  // not divisible by kv_heads = 2
  REQUIRE_THROWS_AS(kvsift::store::dense<float>(bad, 1, 8), kvsift::error);
  REQUIRE_THROWS_WITH(kvsift::store::dense<float>(bad, 1, 8), ContainsSubstring("'shape.q_heads'"));
  bad = kShape;
  bad.kv_heads = 0;
  REQUIRE_THROWS_WITH(kvsift::store::dense<float>(bad, 1, 8), ContainsSubstring("'shape.kv_heads'"));
  bad = kShape;
  bad.head_dim = 0;
  REQUIRE_THROWS_WITH(kvsift::store::paged<float>(bad, 1, 4, 4), ContainsSubstring("'shape.head_dim'"));
  REQUIRE_THROWS_WITH(kvsift::store::dense<float>(kShape, 0, 8), ContainsSubstring("'requests'"));
  REQUIRE_THROWS_WITH(kvsift::store::dense<float>(kShape, 1, 0), ContainsSubstring("'capacity'"));
  REQUIRE_THROWS_WITH(kvsift::store::dense<float>(kShape, 1, 4, nullptr, nullptr),
                      ContainsSubstring("'keys'"));
  REQUIRE_THROWS_WITH(kvsift::store::paged<float>(kShape, 1, 0, 4), ContainsSubstring("'page_size'"));
  REQUIRE_THROWS_WITH(kvsift::store::paged<float>(kShape, 1, 4, 0), ContainsSubstring("'total_pages'"));
  using snap = kvsift::snapkv<kvsift::store::dense<float>>;
  bad = kShape;
  bad.q_heads = 5;
  REQUIRE_THROWS_WITH(snap::can_implement(bad, kvsift::snapkv_params<kvsift::store::dense<float>>(64)),
                      ContainsSubstring("'shape.q_heads'"));
  using pyr = kvsift::pyramidkv<kvsift::store::dense<float>>;
  kvsift::store::dense<float> s(kShape, 1, 8);
  REQUIRE_THROWS_WITH(pyr(s, kvsift::pyramidkv_params<kvsift::store::dense<float>>(32, 32)),
                      ContainsSubstring("'budget'"));
  REQUIRE_THROWS_WITH(snap(s, kvsift::snapkv_params<kvsift::store::dense<float>>(64, 8, 4)),
                      ContainsSubstring("'kernel'"));
  REQUIRE_THROWS_WITH(kvsift::budget::tokens_from_keep_fraction(10, 1.5),
                      ContainsSubstring("'keep_fraction'"));
  REQUIRE_THROWS_WITH(kvsift::budget::tokens_from_evict_fraction(10, -0.1),
                      ContainsSubstring("'evict_fraction'"));
}

namespace {

using store_t = kvsift::store::dense<float>;

struct prompt {
  std::vector<float> k, v, q;
  explicit prompt(int n, int q_heads = kShape.q_heads)
      : k(filled<float>(static_cast<std::size_t>(n) * 2 * 4, 0.25f)),
        v(filled<float>(k.size(), -0.5f)),
        q(filled<float>(static_cast<std::size_t>(n) * q_heads * 4, 0.1f)) {}
  kvsift::prefill_chunk<float> chunk(int request, int first, bool last = true) const {
    const int n = static_cast<int>(k.size() / 8);
    return {.request = request,
            .keys = view<float>::contiguous(k.data(), n, 2, 4),
            .values = view<float>::contiguous(v.data(), n, 2, 4),
            .queries = kvsift::kv_view<const float, kvsift::nhd>::contiguous(
                q.data(), n, static_cast<int>(q.size() / (static_cast<std::size_t>(n) * 4)), 4),
            .first_position = first,
            .last = last};
  }
};

}  // namespace

TEST_CASE("method.prefill rejects bad chunks before appending anything", "[bad_input][method]") {
  store_t s(kShape, 3, 40);
  populate(s);  // requests 0..2 hold 3..5 tokens per layer
  kvsift::snapkv<store_t> m(s, kvsift::snapkv_params<store_t>(16, 4, 3));
  const prompt p20(20);

  SECTION("snapkv: a budget below the observation window, with n > B") {
    kvsift::snapkv<store_t> tight(s, kvsift::snapkv_params<store_t>(5, 8, 3));  // B = 5 < w = 8
    const auto c = p20.chunk(1, 10);
    REQUIRE_REJECTS(s, tight.prefill(0, c), "budgets[");
    REQUIRE_THROWS_WITH(tight.prefill(0, c), ContainsSubstring("window 8"));
  }
  SECTION("streaming_llm: a budget below the sinks") {
    kvsift::streaming_llm<store_t> st(s, kvsift::streaming_llm_params<store_t>(3, 4));
    REQUIRE_REJECTS(s, st.prefill(0, p20.chunk(1, 10)), "budgets[");
    REQUIRE_THROWS_WITH(st.prefill(0, p20.chunk(1, 10)), ContainsSubstring("sink 4"));
  }
  SECTION("an empty chunk") {
    const prompt p0(0);
    auto c = p20.chunk(1, 10);
    c.keys.tokens = c.values.tokens = c.queries.tokens = 0;
    REQUIRE_REJECTS(s, m.prefill(0, c), "keys.tokens");
  }
  SECTION("mismatched heads, dims and token counts") {
    auto c = p20.chunk(1, 10);
    c.keys.heads = 1;
    c.keys.token_stride = 4;
    REQUIRE_REJECTS(s, m.prefill(0, c), "keys.heads");
    c = p20.chunk(1, 10);
    c.values.dim = 3;
    REQUIRE_REJECTS(s, m.prefill(0, c), "values.dim");
    c = p20.chunk(1, 10);
    c.values.tokens = 19;
    REQUIRE_REJECTS(s, m.prefill(0, c), "values.tokens");
    const prompt p_wrong_q(20, 2);  // queries for 2 heads, the shape has 4
    REQUIRE_REJECTS(s, m.prefill(0, p_wrong_q.chunk(1, 10)), "queries.heads");
    c = p20.chunk(1, 10);
    c.queries.tokens = 21;  // more queries than tokens
    REQUIRE_REJECTS(s, m.prefill(0, c), "queries.tokens");
    c = p20.chunk(1, 10);
    c.queries = {};  // snapkv needs queries
    REQUIRE_REJECTS(s, m.prefill(0, c), "queries.");
  }
  SECTION("request, layer, first_position, capacity") {
    REQUIRE_REJECTS(s, m.prefill(0, p20.chunk(3, 10)), "request");
    REQUIRE_REJECTS(s, m.prefill(2, p20.chunk(1, 10)), "layer");
    REQUIRE_REJECTS(s, m.prefill(-1, p20.chunk(1, 10)), "layer");
    REQUIRE_REJECTS(s, m.prefill(0, p20.chunk(1, 3)), "first_position");  // 4 tokens resident
    const prompt p40(40);
    REQUIRE_REJECTS(s, m.prefill(0, p40.chunk(1, 10)), "keys.tokens");
  }
  SECTION("a bad chunk anywhere in a ragged batch rejects the whole call") {
    auto bad = p20.chunk(2, 10);
    bad.values.dim = 5;
    const std::vector<kvsift::prefill_chunk<float>> batch{p20.chunk(0, 10), p20.chunk(1, 10), bad};
    REQUIRE_REJECTS(s, m.prefill(0, batch), "values.dim");
  }
  SECTION("two chunks of one request that together overflow, or go backwards") {
    const std::vector<kvsift::prefill_chunk<float>> overflow{p20.chunk(1, 10, false),
                                                             p20.chunk(1, 30)};  // 4 + 40 > 40
    REQUIRE_REJECTS(s, m.prefill(0, overflow), "keys.tokens");
    const prompt p10(10);
    const std::vector<kvsift::prefill_chunk<float>> backwards{p10.chunk(0, 10, false),
                                                              p10.chunk(0, 15)};  // 15 < 10 + 10
    REQUIRE_REJECTS(s, m.prefill(0, backwards), "first_position");
  }
}

TEST_CASE("method.decode rejects bad tokens before appending anything", "[bad_input][method]") {
  store_t s(kShape, 2, 8);
  populate(s);  // request 1 layer 1: 5 tokens
  kvsift::h2o<store_t> m(s, kvsift::h2o_params<store_t>(16));
  const auto q = filled<float>(4 * 4, 0.1f);
  const auto k = filled<float>(2 * 4, 0.2f);
  const kvsift::decode_token<float> good{1, q.data(), k.data(), k.data()};
  REQUIRE_REJECTS(s, m.decode(0, kvsift::decode_token<float>{2, q.data(), k.data(), k.data()}), "request");
  REQUIRE_REJECTS(s, m.decode(2, good), "layer");
  REQUIRE_REJECTS(s, m.decode(0, kvsift::decode_token<float>{1, q.data(), nullptr, k.data()}), "key/value");
  REQUIRE_REJECTS(s, m.decode(0, kvsift::decode_token<float>{1, nullptr, k.data(), k.data()}), "query");
  const std::vector<kvsift::decode_token<float>> mixed{good, {0, q.data(), k.data(), nullptr}};
  REQUIRE_REJECTS(s, m.decode(0, mixed), "key/value");
  // fill request 1 layer 1 to capacity, then one more token is rejected
  for (int i = 0; i < 3; ++i) {
    m.decode(1, good);
    m.after_attention(1, good);
  }
  REQUIRE(s.length(1, 1, 0) == 8);
  REQUIRE_REJECTS(s, m.decode(1, good), "request");
}

TEST_CASE("selectors and budgeters validate their own inputs", "[bad_input][select]") {
  kvsift::score_sets scores;
  const std::vector<int> sizes{10, 3};
  scores.resize(sizes);
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{7});
  const auto kept_before = kept.values;
  const kvsift::select::topk sel{{.sink = 2, .window = 3}};
  const std::vector<int> one{5};
  REQUIRE_THROWS_WITH(sel.select(scores, one, kept), ContainsSubstring("'budgets.size'"));
  const std::vector<int> small{4, 1};  // 4 < sink 2 + window 3 with n = 10 > 4
  REQUIRE_THROWS_AS(sel.select(scores, small, kept), kvsift::error);
  REQUIRE_THROWS_WITH(sel.select(scores, small, kept), ContainsSubstring("'budgets[0]'"));
  REQUIRE(kept.values == kept_before);  // nothing written
  const std::vector<int> fits{5, 1};  // segment 1: budget 1 < 5 protected but n = 3 > 1
  REQUIRE_THROWS_WITH(sel.select(scores, fits, kept), ContainsSubstring("'budgets[1]'"));
  const std::vector<int> ok{5, 3};  // n <= budget keeps everything, no protection needed
  REQUIRE_NOTHROW(sel.select(scores, ok, kept));
  const std::vector<int> negative{-1, 3};
  REQUIRE_THROWS_WITH(kvsift::select::page_topk{}.select(scores, negative, kept),
                      ContainsSubstring("'budgets[0]'"));
  REQUIRE_THROWS_WITH(kvsift::select::topk{{.window_share = 1.5}}.validate("t"),
                      ContainsSubstring("'window_share'"));
}

TEST_CASE("method.decode checks the whole batch: page pool, duplicates", "[bad_input][method]") {
  // 4-token pages, 2 KV heads: each request's next token needs a fresh page per head
  kvsift::store::paged<float> s(kShape, 3, 4, 8);
  using full = kvsift::full_kv<kvsift::store::paged<float>>;
  full m(s, kvsift::full_kv_params<kvsift::store::paged<float>>());
  const prompt p4(4);
  m.prefill(0, std::vector<kvsift::prefill_chunk<float>>{p4.chunk(0, 0), p4.chunk(1, 0)});
  REQUIRE(s.free_pages() == 4);
  const auto q = filled<float>(4 * 4, 0.1f);
  const auto k = filled<float>(2 * 4, 0.2f);
  const kvsift::decode_token<float> t0{0, q.data(), k.data(), k.data()};
  const kvsift::decode_token<float> t1{1, q.data(), k.data(), k.data()};
  const kvsift::decode_token<float> t2{2, q.data(), k.data(), k.data()};
  // 0 and 1 need 2 pages each (4 free); request 2 is empty and needs 2 more: the batch does not fit
  REQUIRE_REJECTS(s, m.decode(0, std::vector{t0, t1, t2}), "request");
  REQUIRE(m.step(0, 0) == 0);
  REQUIRE_REJECTS(s, m.decode(0, std::vector{t0, t1, t0}), "tokens[2].request");
  m.decode(0, std::vector{t0, t1});  // fits exactly
  REQUIRE(s.free_pages() == 0);
}

TEST_CASE("attend and after_attention reject a step decode() did not plan", "[bad_input][method]") {
  store_t s(kShape, 2, 16);
  kvsift::h2o<store_t> m(s, kvsift::h2o_params<store_t>(8));
  const prompt p6(6);
  m.prefill(1, p6.chunk(0, 0));
  const auto q = filled<float>(4 * 4, 0.1f);
  const auto k = filled<float>(2 * 4, 0.2f);
  const kvsift::decode_token<float> good{0, q.data(), k.data(), k.data()};
  std::vector<float> out(16);
  m.decode(1, good);
  REQUIRE_REJECTS(s, m.after_attention(0, good), "layer");
  REQUIRE_REJECTS(s, m.after_attention(1, kvsift::decode_token<float>{1, q.data()}), "tokens[0].request");
  REQUIRE_REJECTS(s, m.after_attention(1, kvsift::decode_token<float>{0, nullptr}), "tokens[0].query");
  const kvsift::decode_token<float> no_query{0, nullptr, k.data(), k.data()};
  REQUIRE_REJECTS(s, m.attend(1, std::span(&no_query, 1), out.data()), "tokens[0].query");
  m.attend(1, std::span(&good, 1), out.data());
  m.after_attention(1, good);
  REQUIRE_REJECTS(s, m.after_attention(1, good), "layer");  // the step was applied already
  REQUIRE_REJECTS(s, m.attend(1, std::span(&good, 1), out.data()), "layer");
}

TEST_CASE("can_implement cross-checks parameters two parts share", "[bad_input][method]") {
  using quest_t = kvsift::quest<store_t>;
  auto qp = kvsift::quest_params<store_t>(64, 16);
  qp.selector.page_size = 8;
  REQUIRE_THROWS_WITH(quest_t::can_implement(kShape, qp), ContainsSubstring("argument 'selector.page_size'"));
  using snap_t = kvsift::snapkv<store_t>;
  auto sp = kvsift::snapkv_params<store_t>(64, 8, 3);
  sp.selector.window = 4;
  REQUIRE_THROWS_WITH(snap_t::can_implement(kShape, sp), ContainsSubstring("argument 'selector.window'"));
  using lag_t = kvsift::lagkv<store_t>;
  auto lp = kvsift::lagkv_params<store_t>(16, 32);
  lp.trigger.lag = 64;
  REQUIRE_THROWS_WITH(lag_t::can_implement(kShape, lp), ContainsSubstring("argument 'selector.lag'"));
  lp = kvsift::lagkv_params<store_t>(16, 32);
  lp.scorer.sink = 8;
  REQUIRE_THROWS_WITH(lag_t::can_implement(kShape, lp), ContainsSubstring("argument 'selector.sink'"));
  REQUIRE_NOTHROW(quest_t::can_implement(kShape, kvsift::quest_params<store_t>(64, 16)));
  REQUIRE_NOTHROW(lag_t::can_implement(kShape, kvsift::lagkv_params<store_t>(16, 32)));
}

TEST_CASE("budgeters and io reject parameters that were never checked", "[bad_input][select]") {
  kvsift::budget::memory_fraction b{{.keep_fraction = 0.25, .min_tokens = -3}};
  REQUIRE_THROWS_WITH(b.validate("t"), ContainsSubstring("argument 'min_tokens'"));
  REQUIRE_THROWS_WITH(kvsift::io::shape_numel({std::int64_t{1} << 62, 4}),
                      ContainsSubstring("argument 'shape'"));
}

// ---- issue 18: the catalogue over the remaining public entry points -------------------------

TEST_CASE("make_method: an unknown name lists the known ones", "[bad_input][method]") {
  store_t s(kShape, 1, 8);
  REQUIRE_REJECTS(s, kvsift::make_method("snapkvv", s, 16), "name");
  REQUIRE_THROWS_WITH(kvsift::make_method("snapkvv", s, 16),
                      ContainsSubstring("'name' = snapkvv") && ContainsSubstring("one of ") &&
                          ContainsSubstring("snapkv"));
}

TEST_CASE("make_method: a budget out of range", "[bad_input][method]") {
  store_t s(kShape, 1, 8);
  REQUIRE_REJECTS(s, kvsift::make_method("h2o", s, 0), "budget");
  REQUIRE_THROWS_WITH(kvsift::make_method("h2o", s, -4),
                      ContainsSubstring("'budget' = -4") && ContainsSubstring("> 0 tokens"));
}

TEST_CASE("safetensors: a file shorter than its length field", "[bad_input][io]") {
  std::vector<std::byte> buf(5, std::byte{0});
  REQUIRE_THROWS_WITH(kvsift::io::safetensors_file::from_bytes(buf, "t"),
                      ContainsSubstring("'file size' = 5") && ContainsSubstring("at least 8 bytes"));
}

TEST_CASE("safetensors: a header length past the end of the file", "[bad_input][io]") {
  std::vector<std::byte> buf(16, std::byte{0});
  buf[0] = std::byte{200};  // 200 header bytes announced, 8 present
  REQUIRE_THROWS_WITH(kvsift::io::safetensors_file::from_bytes(buf, "t"),
                      ContainsSubstring("'header length' = 200") && ContainsSubstring("at most the 8 bytes"));
}

namespace {
kvsift::store::tiered<float> tiered_with_demoted() {
  kvsift::store::tiered<float> t(kShape, 1, 16, 4);
  const auto k = filled<float>(6 * 2 * 4, 0.5f);
  t.append(0, 0, view<float>::contiguous(k.data(), 6, 2, 4), view<float>::contiguous(k.data(), 6, 2, 4), 0);
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{0, 5});
  kept.push_back(std::vector<std::int32_t>{1});
  t.retain(0, 0, kept);
  return t;
}
}  // namespace

TEST_CASE("store::tiered.promote: a position not in the host pool", "[bad_input][tiered]") {
  auto t = tiered_with_demoted();
  const std::vector<std::int32_t> pos{0, 9};
  REQUIRE_REJECTS(t, t.promote(0, pos), "positions[1]");
  REQUIRE_THROWS_WITH(t.promote(0, pos), ContainsSubstring("= 9") && ContainsSubstring("in the host pool"));
  REQUIRE_NOTHROW(t.verify());
}

TEST_CASE("store::tiered.promote: a head-sequence id that does not exist", "[bad_input][tiered]") {
  auto t = tiered_with_demoted();
  const std::vector<std::int32_t> pos{0};
  REQUIRE_REJECTS(t, t.promote(99, pos), "seq");
  REQUIRE_THROWS_WITH(t.promote(-1, pos), ContainsSubstring("'seq' = -1") && ContainsSubstring("in [0, "));
}

TEST_CASE("store::tiered.install: positions the landing does not hold", "[bad_input][tiered]") {
  auto t = tiered_with_demoted();
  kvsift::store::landing<float> empty;
  empty.dim = 4;
  const std::vector<std::int32_t> pos{0, 2, 5};  // 2 was demoted and is not in the landing
  REQUIRE_REJECTS(t, t.install(0, pos, empty), "positions");
  REQUIRE_THROWS_WITH(t.install(0, pos, empty),
                      ContainsSubstring("= 2") && ContainsSubstring("resident or in the completed recall"));
  empty.dim = 3;
  REQUIRE_REJECTS(t, t.install(0, std::vector<std::int32_t>{0}, empty), "from.dim");
}

TEST_CASE("transfer::async.submit: ids not in the host pool, nothing queued", "[bad_input][tiered]") {
  // submit() reads a const store: what a rejection must leave unchanged is the transfer (nothing
  // queued, nothing counted), and a valid recall after it must still land exactly its rows
  auto t = tiered_with_demoted();
  kvsift::transfer::async<float> x;
  const auto rejects = [&](auto&& f, const std::string& arg) {
    REQUIRE_THROWS_WITH(f(), ContainsSubstring("argument '" + arg));
    REQUIRE(x.outstanding() == 0);
    REQUIRE(x.stats().recalls_issued == 0);
    REQUIRE(x.stats().bytes_moved == 0);
  };
  rejects([&] { return x.submit(t, {{0, {2, 40}}}); }, "what[0].positions[1]");
  REQUIRE_THROWS_WITH(x.submit(t, {{0, {2, 40}}}),
                      ContainsSubstring("= 40") && ContainsSubstring("host pool of head-sequence 0"));
  rejects([&] { return x.submit(t, {{0, {3, 2}}}); }, "what[0].positions[1]");
  rejects([&] { return x.submit(t, {{77, {0}}}); }, "what[0].seq");
  // a partly valid request (its first head-sequence fine) queues nothing either
  rejects([&] { return x.submit(t, {{0, {2}}, {0, {1, 1}}}); }, "what[1].positions[1]");
  const auto ticket = x.submit(t, {{0, {2}}});
  const auto& landed = x.wait(ticket);
  REQUIRE(landed.bytes() == 2 * t.shape().head_dim * static_cast<std::int64_t>(sizeof(float)));
  REQUIRE(std::memcmp(landed.key(0, 0), t.host_key(0, 2), t.shape().head_dim * sizeof(float)) == 0);
  x.release(ticket);
  REQUIRE(x.stats().recalls_issued == 1);
}

TEST_CASE("store::tiered: page size and capacity out of range", "[bad_input][tiered]") {
  REQUIRE_THROWS_WITH(kvsift::store::tiered<float>(kShape, 1, 16, 0),
                      ContainsSubstring("'page_size' = 0") && ContainsSubstring("> 0"));
  REQUIRE_THROWS_WITH(kvsift::store::tiered<float>(kShape, 1, -1),
                      ContainsSubstring("'host_capacity' = -1"));
}

TEST_CASE("synckv: clusters out of range, roles for another model", "[bad_input][synckv]") {
  kvsift::store::tiered<float> t(kShape, 1, 16);
  kvsift::synckv<float>::params p{.clusters = 3, .roles = {{{0, 1}, {0, 1}}, {{0, 1}, {0, 1}}}};
  REQUIRE_REJECTS(t, kvsift::synckv<float>(t, p), "clusters");
  REQUIRE_THROWS_WITH(kvsift::synckv<float>(t, p), ContainsSubstring("'clusters' = 3") &&
                                                       ContainsSubstring("kv_heads = 2"));
  p.clusters = 2;
  p.roles.pop_back();  // one layer of roles for a 2-layer model
  REQUIRE_THROWS_WITH(kvsift::synckv<float>(t, p), ContainsSubstring("'roles.size' = 1"));
  p.roles.push_back(p.roles.front());
  p.stride = 0;
  REQUIRE_THROWS_AS(kvsift::synckv<float>(t, p), kvsift::error);
}

TEST_CASE("heterocache: rho out of range", "[bad_input][heterocache]") {
  using role = kvsift::calibrate::head_role;
  kvsift::store::tiered<float> t(kShape, 1, 16);
  kvsift::heterocache<float>::params p;
  p.roles = {{{role::anchor, role::anchor}, {-1, -1}, {0.9f, 0.9f}},
             {{role::anchor, role::anchor}, {-1, -1}, {0.9f, 0.9f}}};
  p.rho = 1.5;
  REQUIRE_REJECTS(t, kvsift::heterocache<float>(t, p), "rho");
  REQUIRE_THROWS_WITH(kvsift::heterocache<float>(t, p), ContainsSubstring("'rho' = 1.5") &&
                                                            ContainsSubstring("in [0, 1]"));
  p.rho = 0.5;
  p.roles.pop_back();
  REQUIRE_THROWS_WITH(kvsift::heterocache<float>(t, p), ContainsSubstring("'roles.size' = 1"));
}

TEST_CASE("freekv: a page size that does not match the store, a budget of part pages",
          "[bad_input][freekv]") {
  kvsift::store::tiered<float> t(kShape, 1, 64, 8);
  kvsift::freekv<float>::params p{.page_size = 8, .budget = 60, .sink = 8, .window = 16};
  REQUIRE_REJECTS(t, kvsift::freekv<float>(t, p), "budget");
  p = {.page_size = 16, .budget = 64, .sink = 16, .window = 16};
  REQUIRE_REJECTS(t, kvsift::freekv<float>(t, p), "page_size");
  REQUIRE_THROWS_WITH(kvsift::freekv<float>(t, p), ContainsSubstring("'page_size' = 16"));
}

// ---- issue 18, continued: non-finite input, missing requests, plans past the store, the
// registry, roles files from disk, safetensors headers, budgets and shapes ---------------------

#include <kvsift/calibrate/roles_file.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <unistd.h>

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A tiered store's host pool (what the working-set snapshot does not see).
struct host_snapshot {
  std::vector<int> lengths;
  std::vector<std::int32_t> positions;
  std::vector<unsigned char> bytes;
  bool operator==(const host_snapshot&) const = default;
};
template <class T>
host_snapshot take_host(const kvsift::store::tiered<T>& t) {
  host_snapshot out;
  const auto& sh = t.shape();
  for (int r = 0; r < t.requests(); ++r) {
    for (int l = 0; l < sh.layers; ++l) {
      const int n = t.host_length(r, l);
      out.lengths.push_back(n);
      for (int i = 0; i < n; ++i) out.positions.push_back(t.host_position(r, l, i));
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(r, l, h);
        for (int i = 0; i < n; ++i) {
          const auto* k = reinterpret_cast<const unsigned char*>(t.host_key(seq, i));
          const auto* v = reinterpret_cast<const unsigned char*>(t.host_value(seq, i));
          out.bytes.insert(out.bytes.end(), k, k + sh.head_dim * sizeof(T));
          out.bytes.insert(out.bytes.end(), v, v + sh.head_dim * sizeof(T));
        }
      }
    }
  }
  return out;
}

// REQUIRE_REJECTS for a tiered store: the working set AND the host pool are unchanged.
#define REQUIRE_REJECTS_TIERED(store, expr, arg)   \
  do {                                             \
    const auto host_before_ = take_host(store);    \
    REQUIRE_REJECTS(store, expr, arg);             \
    REQUIRE(take_host(store) == host_before_);     \
  } while (0)

// Argument name, value and a word of the expectation, all in the message of the throw.
#define REQUIRE_MESSAGE(expr, arg, value, expect)                                              \
  REQUIRE_THROWS_WITH(expr, ContainsSubstring(std::string("argument '") + (arg)) &&            \
                                ContainsSubstring(value) && ContainsSubstring(expect))

kvsift::score_sets scores_of(const std::vector<std::vector<float>>& segs) {
  kvsift::score_sets s;
  std::vector<int> sizes;
  for (const auto& x : segs) sizes.push_back(static_cast<int>(x.size()));
  s.resize(sizes);
  std::size_t o = 0;
  for (const auto& x : segs) {
    std::copy(x.begin(), x.end(), s.values.begin() + static_cast<std::ptrdiff_t>(o));
    o += x.size();
  }
  return s;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvsift_bad_input_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// A tiered store of kShape with request 0's prompt (12 tokens) on layer 0, half of it demoted.
kvsift::store::tiered<float> tiered_prompt(int requests = 2) {
  kvsift::store::tiered<float> t(kShape, requests, 32, 4);
  const auto k = filled<float>(12 * 2 * 4, 0.5f);
  t.append(0, 0, view<float>::contiguous(k.data(), 12, 2, 4), view<float>::contiguous(k.data(), 12, 2, 4), 0);
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{0, 1, 10, 11});
  kept.push_back(std::vector<std::int32_t>{0, 5, 11});
  t.retain(0, 0, kept);
  return t;
}

}  // namespace

TEST_CASE("select::topk: a NaN score among the candidates is rejected, check_finite or not",
          "[bad_input][select][nonfinite]") {
  // segment 0: the top 2 of 8 would be {6, 7}; a NaN at 3 used to pick an unspecified set
  auto scores = scores_of({{0, 1, 2, kNaN, 4, 5, 6, 7}, {1, 2}});
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{9});
  const auto before = kept.values;
  const std::vector<int> budgets{2, 2};
  REQUIRE_THROWS_AS(kvsift::select::topk{}.select(scores, budgets, kept), kvsift::error);
  REQUIRE_MESSAGE(kvsift::select::topk{}.select(scores, budgets, kept), "scores[0][3]", "nan", "not NaN");
  REQUIRE(kept.values == before);
  // with check_finite, infinities too; without, +inf is an ordinary (highest) score
  scores.values[3] = kInf;
  const kvsift::select::topk strict{{.check_finite = true}};
  REQUIRE_MESSAGE(strict.select(scores, budgets, kept), "scores[0][3]", "inf", "finite");
  REQUIRE(kept.values == before);
  kvsift::select::topk{}.select(scores, budgets, kept);
  REQUIRE(std::vector<std::int32_t>(kept[0].begin(), kept[0].end()) == std::vector<std::int32_t>{3, 7});
  // a NaN in a protected (sink) slot changes no choice and is allowed
  scores.values[3] = 3;
  scores.values[0] = kNaN;
  REQUIRE_NOTHROW(kvsift::select::topk{{.sink = 1}}.select(scores, budgets, kept));
}

TEST_CASE("select::page_topk and static_dynamic: NaN page or token scores", "[bad_input][select][nonfinite]") {
  const auto pages = scores_of({{4, kNaN, 1, 9, 2}});
  kvsift::index_sets kept;
  const std::vector<int> budget{16 * 3};
  REQUIRE_MESSAGE(kvsift::select::page_topk{}.select(pages, budget, kept), "scores[0][1]", "nan", "not NaN");
  REQUIRE(kept.segments() == 0);
  const auto tokens = scores_of({{1, 2, 3}, {5, kNaN, 0, 2}});
  const std::vector<int> b2{2, 2};
  REQUIRE_MESSAGE(kvsift::select::static_dynamic{}.select(tokens, b2, kept), "scores[1][1]", "nan",
                  "not NaN");
  REQUIRE_MESSAGE((kvsift::select::page_topk{{.check_finite = true}}.select(
                      scores_of({{4, -kInf, 1, 9, 2}}), budget, kept)),
                  "scores[0][1]", "-inf", "finite");
}

TEST_CASE("budget::inverse_stability: NaN and negative stabilities, NaN rho", "[bad_input][budget][nonfinite]") {
  using role = kvsift::calibrate::head_role;
  kvsift::budget::inverse_stability b{{.roles = {role::anchor, role::satellite, role::pivot, role::anchor},
                                       .stability = {0.5f, kNaN, 0.2f, 0.1f},
                                       .kv_heads = 2,
                                       .rho = 0.5}};
  REQUIRE_MESSAGE(b.validate("t"), "stability[1]", "nan", "finite number >= 0");
  b.p.stability[1] = -0.25f;
  REQUIRE_MESSAGE(b.validate("t"), "stability[1]", "-0.25", ">= 0");
  b.p.stability[1] = 0.3f;
  b.p.rho = std::nan("");
  REQUIRE_MESSAGE(b.validate("t"), "rho", "nan", "in [0, 1]");
  b.p.rho = 0.5;
  std::vector<int> out{7};
  const std::vector<int> lengths{10, 10, 10};  // 3 lengths for a context of 2 layers x 2 heads
  REQUIRE_MESSAGE(b.budgets({.layer = 0, .layers = 3, .kv_heads = 2, .lengths = lengths}, out),
                  "roles.size", "4", "layers x kv_heads = 6");
  REQUIRE(out == std::vector<int>{7});
}

TEST_CASE("budgeters: budgets out of range for each", "[bad_input][budget]") {
  REQUIRE_MESSAGE((kvsift::budget::uniform{{.tokens = -1}}.validate("t")), "budget", "-1", ">= 0");
  REQUIRE_MESSAGE((kvsift::budget::memory_fraction{{.keep_fraction = std::nan("")}}.validate("t")),
                  "keep_fraction", "nan", "in [0, 1]");
  REQUIRE_MESSAGE((kvsift::budget::memory_fraction{{.keep_fraction = 1.25}}.validate("t")),
                  "keep_fraction", "1.25", "in [0, 1]");
  REQUIRE_MESSAGE((kvsift::budget::dynamic_layer{{.tokens = 8, .window = 8}}.validate("t")), "budget",
                  "8", "> window (8)");
  REQUIRE_MESSAGE((kvsift::budget::dynamic_layer{{.tokens = 64, .window = 8, .r_max = 0}}.validate("t")),
                  "r_max", "0", ">= 1");
  REQUIRE_MESSAGE(kvsift::budget::dynamic_layer_shares(std::vector<std::int64_t>{0, 0}, 10),
                  "sum(counts)", "0", "> 0");
  REQUIRE_MESSAGE(kvsift::budget::dynamic_layer_shares(std::vector<std::int64_t>{3, -1}, 10), "counts[]",
                  "-1", ">= 0");
}

TEST_CASE("method.decode: a NaN or infinite key, value or query is rejected before the append",
          "[bad_input][method][nonfinite]") {
  store_t s(kShape, 2, 16);
  populate(s);
  kvsift::h2o<store_t> m(s, kvsift::h2o_params<store_t>(8));
  auto q = filled<float>(4 * 4, 0.1f);
  auto k = filled<float>(2 * 4, 0.2f);
  const auto v = filled<float>(2 * 4, 0.3f);
  k[5] = kNaN;
  const kvsift::decode_token<float> bad_k{1, q.data(), k.data(), v.data()};
  REQUIRE_REJECTS(s, m.decode(0, bad_k), "tokens[0].key[5]");
  REQUIRE_MESSAGE(m.decode(0, bad_k), "tokens[0].key[5]", "nan", "finite");
  k[5] = 0.2f;
  q[15] = -kInf;
  const kvsift::decode_token<float> good0{0, q.data(), k.data(), v.data()};
  // the bad token is the second of the batch: the first is not appended either
  const std::vector<kvsift::decode_token<float>> batch{good0, {1, q.data(), k.data(), v.data()}};
  std::vector<float> q_ok = filled<float>(4 * 4, 0.1f);
  const std::vector<kvsift::decode_token<float>> mixed{{0, q_ok.data(), k.data(), v.data()},
                                                       {1, q.data(), k.data(), v.data()}};
  REQUIRE_REJECTS(s, m.decode(0, mixed), "tokens[1].query[15]");
  REQUIRE_MESSAGE(m.decode(0, mixed), "tokens[1].query[15]", "-inf", "finite");
  REQUIRE(m.step(0, 0) == 0);
  REQUIRE_NOTHROW(m.decode(0, kvsift::decode_token<float>{0, q_ok.data(), k.data(), v.data()}));
}

TEST_CASE("method.prefill: a NaN key in a chunk, nothing appended", "[bad_input][method][nonfinite]") {
  store_t s(kShape, 3, 40);
  populate(s);
  kvsift::snapkv<store_t> m(s, kvsift::snapkv_params<store_t>(8, 4, 3));
  prompt p20(20);
  prompt bad(20);
  bad.k[2 * 8 + 4 + 1] = kNaN;  // token 2, head 1, channel 1
  const std::vector<kvsift::prefill_chunk<float>> batch{p20.chunk(0, 10), bad.chunk(1, 10)};
  REQUIRE_REJECTS(s, m.prefill(0, batch), "keys[2][1][1]");
  REQUIRE_MESSAGE(m.prefill(0, batch), "keys[2][1][1]", "nan", "finite");
  bad = prompt(20);
  bad.q[19 * 16 + 3] = kInf;  // the last query, which SnapKV's window reads
  REQUIRE_MESSAGE(m.prefill(0, bad.chunk(1, 10)), "queries[19][0][3]", "inf", "finite");
  REQUIRE_REJECTS(s, m.prefill(0, bad.chunk(1, 10)), "queries[19]");
}

TEST_CASE("synckv, heterocache, freekv decode: a NaN key leaves both tiers unchanged",
          "[bad_input][tiered][nonfinite]") {
  using role = kvsift::calibrate::head_role;
  const prompt p16(16);
  auto q = filled<float>(4 * 4, 0.1f);
  auto k = filled<float>(2 * 4, 0.2f);
  k[0] = kNaN;
  const kvsift::decode_token<float> bad{0, q.data(), k.data(), k.data()};
  SECTION("synckv") {
    kvsift::store::tiered<float> t(kShape, 1, 64);
    kvsift::synckv<float> m(t, {.clusters = 1, .memory_fraction = 0.6, .roles = {{{0, 0}, {0}}, {{0, 0}, {0}}}});
    m.prefill(0, p16.chunk(0, 0));
    REQUIRE_REJECTS_TIERED(t, m.decode(0, bad), "tokens[0].key[0]");
    REQUIRE_MESSAGE(m.decode(0, bad), "tokens[0].key[0]", "nan", "finite");
  }
  SECTION("heterocache") {
    kvsift::store::tiered<float> t(kShape, 1, 64);
    kvsift::heterocache<float>::params p;
    p.roles = {{{role::anchor, role::anchor}, {-1, -1}, {0.9f, 0.9f}},
               {{role::anchor, role::anchor}, {-1, -1}, {0.9f, 0.9f}}};
    kvsift::heterocache<float> m(t, p);
    m.prefill(0, p16.chunk(0, 0));
    REQUIRE_REJECTS_TIERED(t, m.decode(0, bad), "tokens[0].key[0]");
  }
  SECTION("freekv") {
    kvsift::store::tiered<float> t(kShape, 1, 64, 4);
    kvsift::freekv<float> m(t, {.page_size = 4, .budget = 12, .sink = 4, .window = 4});
    m.prefill(0, p16.chunk(0, 0));
    REQUIRE_REJECTS_TIERED(t, m.decode(0, bad), "tokens[0].key[0]");
  }
}

TEST_CASE("a request id that does not exist: dense, paged and tiered methods", "[bad_input][request]") {
  const auto q = filled<float>(4 * 4, 0.1f);
  const auto k = filled<float>(2 * 4, 0.2f);
  const prompt p8(8);
  SECTION("dense: decode, prefill, reset on request == requests and < 0") {
    store_t s(kShape, 2, 16);
    populate(s);
    kvsift::streaming_llm<store_t> m(s, kvsift::streaming_llm_params<store_t>(8, 2));
    for (const int r : {2, -1, 1000}) {
      REQUIRE_REJECTS(s, m.decode(0, kvsift::decode_token<float>{r, q.data(), k.data(), k.data()}), "request");
      REQUIRE_REJECTS(s, m.prefill(0, p8.chunk(r, 10)), "request");
      REQUIRE_REJECTS(s, m.reset(r), "request");
    }
    REQUIRE_MESSAGE(m.reset(2), "request", "2", "in [0, 2)");
    REQUIRE_MESSAGE(m.decode(1, kvsift::decode_token<float>{-1, q.data(), k.data(), k.data()}), "request",
                    "-1", "in [0, 2)");
  }
  SECTION("paged: decode and the store's reset") {
    kvsift::store::paged<float> s(kShape, 2, 4, 16);
    populate(s);
    kvsift::full_kv<kvsift::store::paged<float>> m(s, {});
    REQUIRE_REJECTS(s, m.decode(0, kvsift::decode_token<float>{3, q.data(), k.data(), k.data()}), "request");
    REQUIRE_MESSAGE(s.reset(-2), "request", "-2", "in [0, 2)");
    REQUIRE_REJECTS(s, s.reset(-2), "request");
  }
  SECTION("tiered: synckv and freekv decode/prefill/reset, the store's append") {
    kvsift::store::tiered<float> t(kShape, 2, 64, 4);
    kvsift::synckv<float> m(t, {.clusters = 1, .memory_fraction = 0.6, .roles = {{{0, 0}, {0}}, {{0, 0}, {0}}}});
    m.prefill(0, p8.chunk(0, 0));
    const kvsift::decode_token<float> far{7, q.data(), k.data(), k.data()};
    REQUIRE_REJECTS_TIERED(t, m.decode(0, far), "request");
    REQUIRE_MESSAGE(m.decode(0, far), "request", "7", "in [0, 2)");
    REQUIRE_REJECTS_TIERED(t, m.prefill(0, p8.chunk(-1, 0)), "request");
    REQUIRE_REJECTS_TIERED(t, m.reset(2), "request");
    REQUIRE_REJECTS_TIERED(t, t.append(2, 0, view<float>::contiguous(k.data(), 1, 2, 4),
                                       view<float>::contiguous(k.data(), 1, 2, 4), 0),
                           "request");
    kvsift::store::tiered<float> t2(kShape, 2, 64, 4);
    kvsift::freekv<float> f(t2, {.page_size = 4, .budget = 12, .sink = 4, .window = 4});
    REQUIRE_REJECTS_TIERED(t2, f.decode(0, far), "request");
    REQUIRE_REJECTS_TIERED(t2, f.prefill(0, p8.chunk(5, 0)), "request");
  }
}

TEST_CASE("any_kv_method from the registry: a request that does not exist", "[bad_input][request][registry]") {
  kvsift::method_config c;
  c.shape = kShape;
  c.requests = 2;
  c.capacity = 32;
  c.prompt_len = 8;
  c.budget = 8;
  auto m = kvsift::default_method_registry<float>().make("h2o", c);
  const prompt p8(8);
  const auto c0 = p8.chunk(0, 0);
  m->prefill(0, std::span(&c0, 1));
  const auto q = filled<float>(4 * 4, 0.1f);
  const auto k = filled<float>(2 * 4, 0.2f);
  const kvsift::decode_token<float> t{2, q.data(), k.data(), k.data()};
  const auto len_before = m->length(0);
  REQUIRE_MESSAGE(m->decode(0, std::span(&t, 1)), "request", "2", "in [0, 2)");
  REQUIRE_MESSAGE(m->reset(-1), "request", "-1", "in [0, 2)");
  REQUIRE(m->length(0) == len_before);
  REQUIRE(m->next_position(0, 0) == 8);
}

TEST_CASE("method_registry: an unknown name lists the known ones, builds nothing", "[bad_input][registry]") {
  const auto& reg = kvsift::default_method_registry<float>();
  kvsift::method_config c;
  c.shape = kShape;
  c.capacity = 16;
  c.budget = 8;
  REQUIRE(reg.find("h2oo") == nullptr);
  REQUIRE_MESSAGE(reg.make("h2oo", c), "name", "h2oo", "one of ");
  REQUIRE_THROWS_WITH(reg.at("H2O"), ContainsSubstring("streaming_llm") && ContainsSubstring("freekv"));
  REQUIRE_MESSAGE(reg.for_resident_fraction("", c, 0.5), "name", "'name' = ,", "one of");
  REQUIRE_MESSAGE(reg.for_resident_fraction("h2o", c, 1.5), "fraction", "1.5", "in (0, 1]");
  kvsift::method_registry<float> mine;
  REQUIRE_MESSAGE(mine.at("h2o"), "name", "h2o", "one of");
  mine.add(reg.at("h2o"));
  REQUIRE_MESSAGE(mine.add(reg.at("h2o")), "name", "h2o", "a new name");
  REQUIRE(mine.names() == std::vector<std::string>{"h2o"});
}

TEST_CASE("roles files read from disk for another model name the mismatching field",
          "[bad_input][roles][io]") {
  namespace cal = kvsift::calibrate;
  cal::synckv_roles sr;
  sr.model = {.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 4, .config_hash = ""};
  sr.layers = {{.assign = {0, 0}, .representatives = {0}, .similarity = {}},
               {.assign = {0, 1}, .representatives = {0, 1}, .similarity = {}}};
  const auto spath = temp_path("synckv.json");
  cal::write_roles(spath, sr);
  REQUIRE(cal::read_synckv_roles(spath, sr.model).layers.size() == 2);  // the right model reads
  auto other = sr.model;
  other.kv_heads = 8;
  other.q_heads = 8;
  REQUIRE_MESSAGE(cal::read_synckv_roles(spath, other), "model.q_heads", "4", "the model's q_heads = 8");
  other = sr.model;
  other.layers = 3;
  REQUIRE_MESSAGE(cal::read_synckv_roles(spath, other), "model.layers", "2", "the model's layers = 3");
  other = sr.model;
  other.head_dim = 64;
  REQUIRE_MESSAGE(cal::read_synckv_roles(spath, other), "model.head_dim", "4", "the model's head_dim = 64");
  // a SyncKV file handed to the HeteroCache reader
  REQUIRE_MESSAGE(cal::read_heterocache_roles(spath, sr.model), "method", "synckv", "\"heterocache\"");

  using role = cal::head_role;
  cal::heterocache_roles hr;
  hr.model = {.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 4, .config_hash = "fnv1a64:0123456789abcdef"};
  hr.layers = {{.roles = {role::anchor, role::volatile_head},
                .leader = {-1, -1},
                .stability = {0.9f, 0.1f},
                .similarity = {}}};
  const auto hpath = temp_path("heterocache.json");
  cal::write_roles(hpath, hr);
  auto h_other = hr.model;
  h_other.config_hash = "fnv1a64:fedcba9876543210";
  REQUIRE_MESSAGE(cal::read_heterocache_roles(hpath, h_other), "model.config_hash",
                  "fnv1a64:0123456789abcdef", "config.json hash fnv1a64:fedcba9876543210");
  h_other = hr.model;
  h_other.kv_heads = 4;
  REQUIRE_MESSAGE(cal::read_heterocache_roles(hpath, h_other), "model.kv_heads", "2", "the model's kv_heads = 4");
  std::filesystem::remove(spath);
  std::filesystem::remove(hpath);
  REQUIRE_MESSAGE(cal::read_synckv_roles(spath, sr.model), "path", spath, "readable");
}

namespace {
std::vector<std::byte> safetensors_image(const std::string& header, std::size_t data_bytes,
                                         std::uint64_t announced) {
  std::vector<std::byte> buf(8 + header.size() + data_bytes, std::byte{0});
  for (int i = 0; i < 8; ++i) buf[static_cast<std::size_t>(i)] = std::byte((announced >> (8 * i)) & 0xff);
  std::memcpy(buf.data() + 8, header.data(), header.size());
  return buf;
}
}  // namespace

TEST_CASE("safetensors: an oversized header length is refused before any parse", "[bad_input][io]") {
  const std::string h = "{}";
  // 2^40 bytes announced: past both the format's 100 MB limit and this 10-byte file
  const auto buf = safetensors_image(h, 0, std::uint64_t{1} << 40);
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(buf, "t"), "header length", "1099511627776",
                  "at most 100000000 bytes");
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(safetensors_image(h, 0, ~std::uint64_t{0}), "t"),
                  "header length", "18446744073709551615", "header limit");
  // within the limit but past the end: the truncation message
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(safetensors_image(h, 0, 3), "t"), "header length",
                  "3", "truncated");
}

TEST_CASE("safetensors: a header that is not JSON, or not an object", "[bad_input][io]") {
  const std::string bad = "{\"a\": [1, 2";  // cut off
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(safetensors_image(bad, 0, bad.size()), "t"),
                  "header", "parse error", "a JSON object");
  const std::string arr = "[1, 2]";
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(safetensors_image(arr, 0, arr.size()), "t"),
                  "header", "array", "a JSON object");
  const std::string entry = R"({"w": {"dtype": "F32", "shape": [2]}})";
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(safetensors_image(entry, 0, entry.size()), "t"),
                  "tensor \"w\" header entry", "\"shape\":[2]", "data_offsets");
}

TEST_CASE("safetensors: tensor data_offsets past the file, or disagreeing with the shape",
          "[bad_input][io]") {
  const std::string past = R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(safetensors_image(past, 8, past.size()), "t"),
                  "tensor \"w\" data_offsets", "[0,16]", "within the data section of 8 bytes");
  const std::string back = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})";
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(safetensors_image(back, 8, back.size()), "t"),
                  "tensor \"w\" data_offsets", "[8,4]", "begin <= end");
  const std::string wrong = R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})";
  REQUIRE_MESSAGE(kvsift::io::safetensors_file::from_bytes(safetensors_image(wrong, 16, wrong.size()), "t"),
                  "tensor \"w\" byte length", "8", "12 bytes for F32");
  const std::string ok = R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  REQUIRE_NOTHROW(kvsift::io::safetensors_file::from_bytes(safetensors_image(ok, 8, ok.size()), "t"));
}

TEST_CASE("attention::attend_plan: a plan longer than the store or past its slots", "[bad_input][attention]") {
  store_t s(kShape, 2, 16);
  populate(s);  // request 1 layer 0: 4 tokens per head
  const auto q = filled<float>(4 * 4, 0.1f);
  std::vector<float> out(16, -7.0f);
  const auto out_before = out;
  kvsift::index_sets plan;
  plan.push_back(std::vector<std::int32_t>{0, 1, 2, 3});
  plan.push_back(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});  // 6 slots, 4 resident
  REQUIRE_REJECTS(s, kvsift::attention::attend_plan(s, 1, 0, q.data(), plan, out.data()), "plan[1][4]");
  REQUIRE_MESSAGE(kvsift::attention::attend_plan(s, 1, 0, q.data(), plan, out.data()), "plan[1][4]", "4",
                  "a resident slot in [0, 4)");
  REQUIRE(out == out_before);
  kvsift::index_sets one;
  one.push_back(std::vector<std::int32_t>{0});  // one segment for 2 KV heads
  REQUIRE_MESSAGE(kvsift::attention::attend_plan(s, 1, 0, q.data(), one, out.data()), "first_segment", "0",
                  "kv_heads = 2");
  plan.values.assign(plan.values.size(), 0);
  REQUIRE_MESSAGE(kvsift::attention::attend_plan(s, 2, 0, q.data(), plan, out.data()), "request", "2", "in [0, 2)");
  REQUIRE_MESSAGE(kvsift::attention::attend_plan(s, 1, 5, q.data(), plan, out.data()), "layer", "5", "in [0, 2)");
  REQUIRE(out == out_before);
}

TEST_CASE("store retain with more slots than resident; tiered retain and promote past the pool",
          "[bad_input][store][tiered]") {
  auto t = tiered_prompt();
  kvsift::index_sets longer;
  longer.push_back(std::vector<std::int32_t>{0, 1, 2, 3, 4});  // 4 resident on head 0
  longer.push_back(std::vector<std::int32_t>{0});
  REQUIRE_REJECTS_TIERED(t, t.retain(0, 0, longer), "kept[0][4]");
  REQUIRE_MESSAGE(t.retain(0, 0, longer), "kept[0][4]", "4", "in [0, 4)");
  kvsift::index_sets three;
  for (int i = 0; i < 3; ++i) three.push_back(std::vector<std::int32_t>{0});
  REQUIRE_REJECTS_TIERED(t, t.retain(0, 0, three), "kept.segments");
  const std::vector<std::int32_t> past{0, 12};  // the host pool holds positions 0..11
  REQUIRE_REJECTS_TIERED(t, t.promote(0, past), "positions[1]");
  REQUIRE_MESSAGE(t.promote(0, past), "positions[1]", "12", "host pool");
  REQUIRE_NOTHROW(t.verify());
}

TEST_CASE("method.attend over a plan after the store shrank under it", "[bad_input][attention][method]") {
  // decode() plans 5 slots; retaining fewer before attend() makes the plan longer than the store
  store_t s(kShape, 1, 16);
  kvsift::full_kv<store_t> m(s, {});
  const prompt p4(4);
  m.prefill(0, p4.chunk(0, 0));
  const auto q = filled<float>(4 * 4, 0.1f);
  const auto k = filled<float>(2 * 4, 0.2f);
  const kvsift::decode_token<float> t{0, q.data(), k.data(), k.data()};
  m.decode(0, t);
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{0, 1});
  kept.push_back(std::vector<std::int32_t>{0, 1});
  s.retain(0, 0, kept);
  std::vector<float> out(16, 0.0f);
  REQUIRE_REJECTS(s, m.attend(0, std::span(&t, 1), out.data()), "plan[0][2]");
  REQUIRE_MESSAGE(m.attend(0, std::span(&t, 1), out.data()), "plan[0][2]", "2", "a resident slot in [0, 2)");
}

TEST_CASE("attention::causal: q heads not a multiple of kv heads, head_dim and index mismatches",
          "[bad_input][attention][shape]") {
  const auto k = filled<float>(6 * 2 * 4, 0.2f);
  const auto q3 = filled<float>(2 * 3 * 4, 0.1f);
  const auto q4 = filled<float>(2 * 4 * 4, 0.1f);
  std::vector<float> out(2 * 4 * 4, 0.0f);
  using fview = kvsift::kv_view<const float, kvsift::nhd>;
  const auto keys = fview::contiguous(k.data(), 6, 2, 4);
  REQUIRE_MESSAGE(kvsift::attention::causal(fview::contiguous(q3.data(), 2, 3, 4), 4, keys, keys, out.data()),
                  "queries.heads", "3", "a multiple of keys.heads = 2");
  REQUIRE_MESSAGE(kvsift::attention::causal(fview::contiguous(q4.data(), 2, 4, 4), 4, keys,
                                            fview::contiguous(k.data(), 4, 2, 6), out.data()),
                  "values.dim", "6", "4");
  REQUIRE_MESSAGE(kvsift::attention::causal(fview::contiguous(q4.data(), 4, 2, 8), 4, keys, keys, out.data()),
                  "queries.dim", "8", "4");
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{0, 6});
  kept.push_back(std::vector<std::int32_t>{1});
  REQUIRE_MESSAGE(kvsift::attention::causal(fview::contiguous(q4.data(), 2, 4, 4), 4, keys, keys, out.data(),
                                            nullptr, &kept),
                  "kept[0][1]", "6", "in [0, 6)");
  REQUIRE(out == std::vector<float>(2 * 4 * 4, 0.0f));
}

TEST_CASE("head_dim of a chunk against the store, q heads against kv heads in a method",
          "[bad_input][shape][method]") {
  kvsift::store::tiered<float> t(kShape, 1, 64);
  kvsift::synckv<float> m(t, {.clusters = 1, .memory_fraction = 0.6, .roles = {{{0, 0}, {0}}, {{0, 0}, {0}}}});
  const auto k8 = filled<float>(8 * 2 * 8, 0.2f);
  const auto q = filled<float>(8 * 4 * 4, 0.1f);
  kvsift::prefill_chunk<float> c{.request = 0,
                                 .keys = view<float>::contiguous(k8.data(), 8, 2, 8),
                                 .values = view<float>::contiguous(k8.data(), 8, 2, 8),
                                 .queries = view<float>::contiguous(q.data(), 8, 4, 4)};
  REQUIRE_REJECTS_TIERED(t, m.prefill(0, c), "keys.dim");
  REQUIRE_MESSAGE(m.prefill(0, c), "keys.dim", "8", "4");
  c.keys = c.values = view<float>::contiguous(k8.data(), 8, 2, 4);
  c.queries = view<float>::contiguous(q.data(), 8, 3, 4);  // 3 query heads, the model has 4
  REQUIRE_MESSAGE(m.prefill(0, c), "queries.heads", "3", "4");
  auto bad = kShape;
  bad.q_heads = 6;
  bad.kv_heads = 4;  // 6 % 4 != 0
  REQUIRE_MESSAGE((kvsift::store::tiered<float>(bad, 1, 16)), "shape.q_heads", "6", "kv_heads");
}

TEST_CASE("page sizes that do not divide: paged store, Quest, FreeKV", "[bad_input][pages]") {
  // Quest's selector pages must be the scorer's (and a paged store's) page size
  using pq = kvsift::store::paged<float>;
  auto qp = kvsift::quest_params<pq>(64, 16);
  qp.selector.page_size = 12;
  REQUIRE_MESSAGE(kvsift::quest<pq>::can_implement(kShape, qp), "selector.page_size", "12", "16");
  // FreeKV: sink and window whole pages of the selector, the store's page equal to it
  kvsift::select::freekv_pages fp{{.page_size = 8, .sink = 12, .window = 16}};
  REQUIRE_MESSAGE(fp.validate("t"), "sink", "12", "multiple");
  kvsift::select::freekv_pages ok{{.page_size = 8, .sink = 8, .window = 16}};
  kvsift::index_sets kept;
  const auto s = scores_of({{1, 2, 3, 4, 5, 6}});
  REQUIRE_MESSAGE(ok.select(s, std::vector<int>{36}, kept), "budgets[0]", "36", "whole pages");
  kvsift::store::tiered<float> t(kShape, 1, 64, 8);
  REQUIRE_MESSAGE((kvsift::freekv<float>(t, {.page_size = 8, .budget = 64, .sink = 8, .window = 12})),
                  "window", "12", "8");
  // a page of zero tokens for a paged store
  REQUIRE_MESSAGE((kvsift::store::paged<float>(kShape, 1, 0, 4)), "page_size", "0", "> 0");
}

TEST_CASE("freekv.prefill: chunks of one request going backwards are rejected before any append",
          "[bad_input][freekv][tiered]") {
  kvsift::store::tiered<float> t(kShape, 1, 64, 4);
  kvsift::freekv<float> m(t, {.page_size = 4, .budget = 12, .sink = 4, .window = 4});
  const prompt p8(8);
  const std::vector<kvsift::prefill_chunk<float>> backwards{p8.chunk(0, 0, false), p8.chunk(0, 4)};
  REQUIRE_REJECTS_TIERED(t, m.prefill(0, backwards), "first_position");
  REQUIRE_MESSAGE(m.prefill(0, backwards), "first_position", "4", ">= 8");
  auto empty = p8.chunk(0, 0);
  empty.keys.tokens = empty.values.tokens = empty.queries.tokens = 0;
  REQUIRE_REJECTS_TIERED(t, m.prefill(0, empty), "keys.tokens");
  REQUIRE_NOTHROW(m.prefill(0, p8.chunk(0, 0)));
}

// The boundary checks' one-pass scan (detail::indices_within, run by validate_index_sets and the
// attention's plan check) against its definition, element by element, on short segments of
// extreme and ordinary values: in [0, n) and, when asked, strictly ascending.
TEST_CASE("detail::indices_within equals the element-by-element definition", "[bad_input][segments]") {
  const std::vector<std::int32_t> values{INT32_MIN, -2, -1, 0, 1, 2, 3, 6, 7, 8, INT32_MAX};
  const auto definition = [](const std::vector<std::int32_t>& seg, int n, bool ascending) {
    for (std::size_t i = 0; i < seg.size(); ++i) {
      if (seg[i] < 0 || seg[i] >= n) return false;
      if (ascending && i > 0 && seg[i] <= seg[i - 1]) return false;
    }
    return true;
  };
  int agreed = 0, accepted = 0;
  std::vector<std::int32_t> seg;
  for (std::size_t len = 0; len <= 3; ++len) {
    std::size_t combos = 1;
    for (std::size_t i = 0; i < len; ++i) combos *= values.size();
    for (std::size_t c = 0; c < combos; ++c) {
      seg.clear();
      for (std::size_t i = 0, r = c; i < len; ++i, r /= values.size()) seg.push_back(values[r % values.size()]);
      for (const int n : {0, 1, 7, INT32_MAX}) {
        for (const bool ascending : {false, true}) {
          const bool want = definition(seg, n, ascending);
          REQUIRE(kvsift::detail::indices_within(seg, n, ascending) == want);
          ++agreed;
          accepted += want;
        }
      }
    }
  }
  REQUIRE(accepted > 0);
  REQUIRE(accepted < agreed);
  // a long ascending run with one repeat near its end (past any vector width) is refused
  std::vector<std::int32_t> run(100);
  for (int i = 0; i < 100; ++i) run[i] = 3 * i;
  REQUIRE(kvsift::detail::indices_within(run, 300, true));
  REQUIRE_FALSE(kvsift::detail::indices_within(run, 297, true));
  run[97] = run[96];
  REQUIRE_FALSE(kvsift::detail::indices_within(run, 300, true));
  REQUIRE(kvsift::detail::indices_within(run, 300, false));
}
