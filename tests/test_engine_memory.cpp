// SPDX-License-Identifier: Apache-2.0
// Engine-owned memory: stores that wrap an engine's buffers (dense and paged page pools) are
// compressed in place, and a method on them gives the same kept sets as on library memory.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace {

template <class Store>
std::vector<std::int32_t> positions_of(const Store& s, int layer, int head) {
  std::vector<std::int32_t> out;
  const auto seq = s.shape().sequence(0, layer, head);
  for (int j = 0; j < s.length(seq); ++j) out.push_back(s.position(seq, j));
  return out;
}

template <class Store>
std::vector<std::int32_t> positions_of_request(const Store& s, int request, int layer, int head) {
  std::vector<std::int32_t> out;
  const auto seq = s.shape().sequence(request, layer, head);
  for (int j = 0; j < s.length(seq); ++j) out.push_back(s.position(seq, j));
  return out;
}

}  // namespace

TEST_CASE("a paged store over an engine-owned page pool compresses in place", "[store][paged]") {
  using kvsift::bfloat16;
  const kvsift::model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 16};
  const int page_size = 16, pages = 256;
  std::vector<bfloat16> engine_k(static_cast<std::size_t>(pages) * page_size * 16);
  std::vector<bfloat16> engine_v(engine_k.size());
  kvsift::store::paged<bfloat16> wrapped(shape, 1, page_size, pages, engine_k.data(), engine_v.data());
  kvsift::store::paged<bfloat16> owned(shape, 1, page_size, pages);
  REQUIRE(wrapped.key_pool() == engine_k.data());

  const int n = GENERATE(300, 400);
  CAPTURE(n);
  std::vector<bfloat16> k(static_cast<std::size_t>(n) * 2 * 16), v(k.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = bfloat16(std::sin(0.31f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 7)));
    v[i] = bfloat16(std::cos(0.17f * static_cast<float>(i)));
  }
  using view = kvsift::kv_view<const bfloat16, kvsift::nhd>;
  const auto params = kvsift::lagkv_params<kvsift::store::paged<bfloat16>>(4, 32, 0.5);
  kvsift::lagkv<kvsift::store::paged<bfloat16>> on_engine(wrapped, params);
  kvsift::lagkv<kvsift::store::paged<bfloat16>> on_library(owned, params);
  for (int l = 0; l < 2; ++l) {
    const kvsift::prefill_chunk<bfloat16> c{.request = 0,
                                            .keys = view::contiguous(k.data(), n, 2, 16),
                                            .values = view::contiguous(v.data(), n, 2, 16),
                                            .queries = {}};
    on_engine.prefill(l, c);
    on_library.prefill(l, c);
  }
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      REQUIRE(positions_of(wrapped, l, h) == positions_of(owned, l, h));
      REQUIRE(static_cast<int>(positions_of(wrapped, l, h).size()) < n);  // really compressed
      // the kept rows live in the engine's pool: read them back through the page table
      const auto seq = shape.sequence(0, l, h);
      const auto table = wrapped.page_table(0, l);
      const int first_page = table.indices[table.indptr[h]];
      REQUIRE(wrapped.key(seq, 0) == engine_k.data() + static_cast<std::size_t>(first_page) * page_size * 16);
      for (int c = 0; c < 16; ++c) {
        REQUIRE(wrapped.key(seq, 0)[c] == owned.key(seq, 0)[c]);
      }
    }
  }
  REQUIRE(wrapped.resident_bytes() == owned.resident_bytes());
  REQUIRE(wrapped.used_pages() < 2 * 2 * ((n + page_size - 1) / page_size));  // pages came back
}

TEST_CASE("a paged store rejects half an engine pool", "[store][paged][bad_input]") {
  std::vector<float> k(16 * 16 * 4);
  REQUIRE_THROWS_AS(kvsift::store::paged<float>({.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 4},
                                                1, 16, 16, k.data(), nullptr),
                    kvsift::error);
}

TEST_CASE("method.reset frees a request slot for a new prompt in a continuous batch",
          "[method][reset]") {
  using store_t = kvsift::store::dense<float>;
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const kvsift::model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  const auto name = GENERATE(std::string("lagkv"), std::string("h2o"), std::string("dynamickv"),
                             std::string("streaming_llm"), std::string("snapkv"));
  CAPTURE(name);
  const auto prompt = [](int n, float phase) {
    std::vector<float> x(static_cast<std::size_t>(n) * 4 * 8);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(phase + 0.37f * static_cast<float>(i));
    return x;
  };
  const auto run = [&](kvsift::any_method<store_t>& m, int request, int n, float phase) {
    const auto kv = prompt(n, phase);
    const auto q = prompt(n, phase + 1.0f);
    for (int l = 0; l < 2; ++l) {
      const kvsift::prefill_chunk<float> c{request, view::contiguous(kv.data(), n, 2, 8),
                                           view::contiguous(kv.data(), n, 2, 8),
                                           kvsift::kv_view<const float>::contiguous(q.data(), n, 4, 8),
                                           0, true};
      m.prefill(l, std::span<const kvsift::prefill_chunk<float>>(&c, 1));
      for (int t = 0; t < 3; ++t) {
        const kvsift::decode_token<float> tok{request, q.data() + t * 32, kv.data() + t * 16,
                                              kv.data() + t * 16};
        m.decode(l, std::span<const kvsift::decode_token<float>>(&tok, 1));
        m.after_attention(l, std::span<const kvsift::decode_token<float>>(&tok, 1));
      }
    }
  };
  store_t reused(shape, 2, 512), fresh(shape, 2, 512);
  auto m = kvsift::make_method(name, reused, 64, 0.5);
  auto f = kvsift::make_method(name, fresh, 64, 0.5);
  run(*m, 1, 300, 0.0f);   // a first prompt in slot 1
  m->reset(1);
  REQUIRE(reused.length(1, 0, 0) == 0);
  run(*m, 1, 200, 2.0f);   // a second, different prompt in the same slot
  run(*f, 1, 200, 2.0f);   // the same prompt on a fresh method
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      REQUIRE(positions_of_request(reused, 1, l, h) == positions_of_request(fresh, 1, l, h));
    }
  }
}

// method_registry_paged: the one-tier methods over store::paged keep the same tokens as over
// store::dense, and the store holds only the pages its kept tokens need after the prompt's round
// (stats().pages), which is what `kvsift eval --store paged` reports.
TEST_CASE("method_registry_paged: the same kept tokens, the pages they need", "[store][paged][registry]") {
  const kvsift::model_shape sh{2, 4, 2, 16};
  const int n = 200, page = 16;
  std::vector<float> k(static_cast<std::size_t>(n) * sh.kv_heads * sh.head_dim), v(k.size()),
      q(static_cast<std::size_t>(n) * sh.q_heads * sh.head_dim);
  unsigned x = 12345;
  for (auto* a : {&k, &v, &q}) {
    for (float& e : *a) {
      x = x * 1664525u + 1013904223u;
      e = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) - 0.5f;
    }
  }
  kvsift::method_config c;
  c.shape = sh;
  c.capacity = n + 8;
  c.prompt_len = n;
  c.budget = 50;
  c.options["lag"] = 32;
  c.options["sink"] = 4;
  const auto& dense = kvsift::default_method_registry<float>();
  const auto paged = kvsift::method_registry_paged<float>(dense, page);
  REQUIRE_THROWS_AS(kvsift::method_registry_paged<float>(dense, 0), kvsift::error);
  REQUIRE(paged.names() == dense.names());
  for (const auto& name : kvsift::method_names()) {
    auto a = dense.make(name, c);
    auto b = paged.make(name, c);
    using view = kvsift::kv_view<const float, kvsift::nhd>;
    const kvsift::prefill_chunk<float> ch{.request = 0,
                                          .keys = view::contiguous(k.data(), n, sh.kv_heads, sh.head_dim),
                                          .values = view::contiguous(v.data(), n, sh.kv_heads, sh.head_dim),
                                          .queries = view::contiguous(q.data(), n, sh.q_heads, sh.head_dim),
                                          .first_position = 0,
                                          .last = true};
    std::int64_t need = 0;
    for (int l = 0; l < sh.layers; ++l) {
      a->prefill(l, std::span<const kvsift::prefill_chunk<float>>(&ch, 1));
      b->prefill(l, std::span<const kvsift::prefill_chunk<float>>(&ch, 1));
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(0, l, h);
        REQUIRE(a->length(seq) == b->length(seq));
        std::vector<std::int32_t> pa, pb;
        for (int j = 0; j < a->length(seq); ++j) pa.push_back(a->position(seq, j));
        for (int j = 0; j < b->length(seq); ++j) pb.push_back(b->position(seq, j));
        std::sort(pa.begin(), pa.end());
        std::sort(pb.begin(), pb.end());
        CHECK(pa == pb);
      }
    }
    for (int l = 0; l < sh.layers; ++l) {  // after every layer: DynamicKV revises earlier layers
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(0, l, h);
        CHECK(a->length(seq) == b->length(seq));
        need += (b->length(seq) + page - 1) / page;
      }
    }
    INFO(name);
    CHECK(a->stats().pages == -1);
    CHECK(a->pages() == -1);
    CHECK(b->stats().page_size == page);
    CHECK(b->stats().pages == need);
    CHECK(b->pages() == need);  // the engine's per-step question, without building method_stats
    if (name != "full_kv" && name != "quest") {
      CHECK(need < static_cast<std::int64_t>(sh.layers) * sh.kv_heads * ((n + page - 1) / page));
    }
  }
}
