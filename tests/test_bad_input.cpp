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
  auto t = tiered_with_demoted();
  kvsift::transfer::async<float> x;
  REQUIRE_REJECTS(t, x.submit(t, {{0, {2, 40}}}), "what[0].positions[1]");
  REQUIRE_THROWS_WITH(x.submit(t, {{0, {2, 40}}}),
                      ContainsSubstring("= 40") && ContainsSubstring("host pool of head-sequence 0"));
  REQUIRE_REJECTS(t, x.submit(t, {{0, {3, 2}}}), "what[0].positions[1]");
  REQUIRE_REJECTS(t, x.submit(t, {{77, {0}}}), "what[0].seq");
  REQUIRE(x.outstanding() == 0);
  REQUIRE(x.stats().recalls_issued == 0);
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
