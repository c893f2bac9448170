// SPDX-License-Identifier: Apache-2.0
// Regression tests for the defects found by reading the code (issue 19): each one failed before
// its fix. Memory safety of the decode lifecycle, stale per-request state, exceptions inside
// parallel regions, size overflow, unchecked inputs, eager error messages, stale comments.

#include <kvsift/cpu/parallel.hpp>
#include <kvsift/io/safetensors.hpp>
#include <kvsift/kvsift.hpp>

#include "store_contents.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <regex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

// Counts this thread's heap allocations (item 7: messages are built only on failure).
namespace {
thread_local std::int64_t g_allocations = 0;
void* counted_alloc(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace
void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): every form that the
// replaced deletes may free must come from malloc, or ASan reports an alloc-dealloc mismatch.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  ++g_allocations;
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  ++g_allocations;
  return std::malloc(n == 0 ? 1 : n);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using Catch::Matchers::ContainsSubstring;
using kvsift::model_shape;
using dense_t = kvsift::store::dense<float>;
using paged_t = kvsift::store::paged<float>;
template <class T>
using view = kvsift::kv_view<const T, kvsift::nhd>;

constexpr model_shape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 4};

std::vector<float> wave(std::size_t n, float a, float b = 0.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(a * static_cast<float>(i) + b);
  return v;
}

// A prompt of n tokens with all its queries.
struct prompt {
  std::vector<float> k, v, q;
  int n;
  prompt(int tokens, float a) : k(wave(tokens * 8u, a)), v(wave(tokens * 8u, 0.7f * a, 1.0f)),
                                q(wave(tokens * 16u, 0.3f * a, 2.0f)), n(tokens) {}
  [[nodiscard]] kvsift::prefill_chunk<float> chunk(int request, int first = 0) const {
    return {.request = request,
            .keys = view<float>::contiguous(k.data(), n, 2, 4),
            .values = view<float>::contiguous(v.data(), n, 2, 4),
            .queries = view<float>::contiguous(q.data(), n, 4, 4),
            .first_position = first,
            .last = true};
  }
};

using kvsift_test::contents;

}  // namespace

// 1. after_attention and attend must be the step decode() planned: same layer, same requests in
// the same order, queries present; a mismatch used another layer's plan (out-of-bounds writes in
// H2O's running scores).
TEST_CASE("after_attention and attend are checked against the last decode", "[defects]") {
  dense_t s(kShape, 2, 64);
  kvsift::h2o<dense_t> m(s, kvsift::h2o_params<dense_t>(32));
  const prompt p0(8, 0.37f), p1(12, 0.21f);
  for (int l = 0; l < kShape.layers; ++l) {
    m.prefill(l, std::vector<kvsift::prefill_chunk<float>>{p0.chunk(0), p1.chunk(1)});
  }
  const auto q = wave(16, 0.5f), k = wave(8, 0.9f);
  const std::vector<kvsift::decode_token<float>> step{{0, q.data(), k.data(), k.data()},
                                                      {1, q.data(), k.data(), k.data()}};
  std::vector<float> out(2 * 16);

  SECTION("before any decode") {
    REQUIRE_THROWS_WITH(m.after_attention(0, step), ContainsSubstring("argument 'layer'"));
    REQUIRE_THROWS_WITH(m.attend(0, step, out.data()), ContainsSubstring("argument 'layer'"));
  }
  m.decode(0, step);
  const auto running_before = std::vector<float>(m.scorer_state().running(0).begin(),
                                                 m.scorer_state().running(0).end());
  const auto before = contents(s);
  SECTION("another layer") {
    REQUIRE_THROWS_WITH(m.after_attention(1, step), ContainsSubstring("argument 'layer'"));
    REQUIRE_THROWS_WITH(m.attend(1, step, out.data()), ContainsSubstring("argument 'layer'"));
  }
  SECTION("other requests, another order, another count") {
    const std::vector<kvsift::decode_token<float>> swapped{step[1], step[0]};
    REQUIRE_THROWS_WITH(m.after_attention(0, swapped), ContainsSubstring("argument 'tokens[0].request'"));
    REQUIRE_THROWS_WITH(m.attend(0, swapped, out.data()), ContainsSubstring("argument 'tokens[0].request'"));
    REQUIRE_THROWS_WITH(m.after_attention(0, std::span(step).first(1)),
                        ContainsSubstring("argument 'tokens.size'"));
    REQUIRE_THROWS_WITH(m.attend(0, std::span(step).first(1), out.data()),
                        ContainsSubstring("argument 'tokens.size'"));
  }
  SECTION("a null query or output") {
    auto bad = step;
    bad[1].query = nullptr;
    REQUIRE_THROWS_WITH(m.after_attention(0, bad), ContainsSubstring("argument 'tokens[1].query'"));
    REQUIRE_THROWS_WITH(m.attend(0, bad, out.data()), ContainsSubstring("argument 'tokens[1].query'"));
    REQUIRE_THROWS_WITH(m.attend(0, step, nullptr), ContainsSubstring("argument 'out'"));
  }
  SECTION("a step is applied once: after after_attention the plan is spent") {
    m.after_attention(0, step);
    const auto running_after = std::vector<float>(m.scorer_state().running(0).begin(),
                                                  m.scorer_state().running(0).end());
    const auto after = contents(s);
    REQUIRE_THROWS_WITH(m.after_attention(0, step), ContainsSubstring("argument 'layer'"));
    REQUIRE(contents(s) == after);
    REQUIRE(std::vector<float>(m.scorer_state().running(0).begin(),
                               m.scorer_state().running(0).end()) == running_after);
    return;
  }
  REQUIRE(contents(s) == before);
  REQUIRE(std::vector<float>(m.scorer_state().running(0).begin(),
                             m.scorer_state().running(0).end()) == running_before);
  m.after_attention(0, step);  // the right call still works
}

// 2. decode checked head 0's room per token, not the page pool over the batch: a nearly full
// pool half-applied a batch. Duplicate requests in one batch were accepted.
TEST_CASE("decode applies a whole batch or nothing", "[defects]") {
  // page 4, 2 KV heads: each request's 4-token prompt fills one page per head (4 pages used);
  // each decode token then needs 2 new pages. 6 pages: request 0's token fits, request 1's not.
  paged_t s(kShape, 2, 4, 6);
  kvsift::full_kv<paged_t> m(s, kvsift::full_kv_params<paged_t>());
  const prompt p0(4, 0.3f), p1(4, 0.6f);
  m.prefill(0, std::vector<kvsift::prefill_chunk<float>>{p0.chunk(0), p1.chunk(1)});
  const auto q = wave(16, 0.5f), k = wave(8, 0.9f);
  const std::vector<kvsift::decode_token<float>> step{{0, q.data(), k.data(), k.data()},
                                                      {1, q.data(), k.data(), k.data()}};
  const auto before = contents(s);
  REQUIRE_THROWS_AS(m.decode(0, step), kvsift::error);
  REQUIRE(contents(s) == before);
  REQUIRE(m.step(0, 0) == 0);
  REQUIRE(m.step(1, 0) == 0);

  const std::vector<kvsift::decode_token<float>> twice{step[0], step[0]};
  REQUIRE_THROWS_WITH(m.decode(0, twice), ContainsSubstring("argument 'tokens[1].request'"));
  REQUIRE(contents(s) == before);
  m.decode(0, std::span(step).first(1));  // one request alone fits
  REQUIRE(s.length(0, 0, 0) == 5);
}

// 3. Quest's page digests are per request: reset(request) must drop them (a new prompt of the
// same length passed the "appended only" test and kept the old prompt's digests).
TEST_CASE("quest forgets a reset request's page digests", "[defects]") {
  const model_shape sh{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 4};
  const auto params = kvsift::quest_params<dense_t>(12, 4, 0);  // 3 pages of 4
  const prompt a(32, 0.37f), b(32, 1.91f);
  const auto q = wave(16, 0.5f, 0.3f), k = wave(8, 0.9f);
  const kvsift::decode_token<float> tok{0, q.data(), k.data(), k.data()};
  auto pages_after = [&](const std::vector<const prompt*>& prompts) {
    dense_t s(sh, 1, 64);
    kvsift::quest<dense_t> m(s, params);
    for (const auto* p : prompts) {
      m.reset(0);
      m.prefill(0, p->chunk(0));
      m.decode(0, tok);
      m.after_attention(0, tok);
    }
    return m.plan().pages.values;
  };
  const auto fresh_a = pages_after({&a});
  const auto fresh_b = pages_after({&b});
  REQUIRE(fresh_a != fresh_b);  // the two prompts select different pages
  REQUIRE(pages_after({&a, &b}) == fresh_b);
}

namespace {
// Prompts `prompts` one after another in request 0 (reset between), each followed by `steps`
// decode steps; returns the last prompt's plans (slots, positions, pages) step by step.
template <class Method>
std::vector<std::vector<std::int32_t>> plans_after(const typename Method::params& params,
                                                   const std::vector<const prompt*>& prompts,
                                                   int steps) {
  const model_shape sh{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 4};
  dense_t s(sh, 1, 128);
  Method m(s, params);
  std::vector<std::vector<std::int32_t>> out;
  for (const auto* p : prompts) {
    m.reset(0);
    out.clear();
    for (int l = 0; l < sh.layers; ++l) m.prefill(l, p->chunk(0));
    for (int t = 0; t < steps; ++t) {
      const auto q = wave(16, 0.5f + 0.1f * t, 0.3f), k = wave(8, 0.9f + 0.05f * t);
      const kvsift::decode_token<float> tok{0, q.data(), k.data(), k.data()};
      for (int l = 0; l < sh.layers; ++l) {
        const auto& plan = m.decode(l, tok);
        out.push_back(plan.slots.values);
        out.push_back(plan.positions.values);
        out.push_back(plan.pages.values);
        m.after_attention(l, tok);
      }
    }
  }
  return out;
}
}  // namespace

TEST_CASE("reset(request) leaves no trace of the previous prompt, for every baseline", "[defects]") {
  const prompt a(40, 0.37f), b(40, 1.91f);
  auto same_as_fresh = [&](auto tag, const auto& params) {
    using M = typename decltype(tag)::type;
    const auto fresh = plans_after<M>(params, {&b}, 6);
    REQUIRE(plans_after<M>(params, {&a, &b}, 6) == fresh);
  };
  same_as_fresh(std::type_identity<kvsift::quest<dense_t>>{}, kvsift::quest_params<dense_t>(12, 4, 0));
  same_as_fresh(std::type_identity<kvsift::h2o<dense_t>>{}, kvsift::h2o_params<dense_t>(16));
  same_as_fresh(std::type_identity<kvsift::snapkv<dense_t>>{}, kvsift::snapkv_params<dense_t>(16, 4, 3));
  same_as_fresh(std::type_identity<kvsift::streaming_llm<dense_t>>{},
                kvsift::streaming_llm_params<dense_t>(12, 2));
  same_as_fresh(std::type_identity<kvsift::lagkv<dense_t>>{}, kvsift::lagkv_params<dense_t>(4, 8));
  same_as_fresh(std::type_identity<kvsift::dynamickv<dense_t>>{},
                kvsift::dynamickv_params<dense_t>(16, 4, 3, 10, 1));
}

namespace {
template <class S, class Store>
concept scores_through_const = requires(const S& s, const kvsift::score_input<Store>& in,
                                        kvsift::score_sets& out) { s.score(in, out); };
}  // namespace

TEST_CASE("quest's cached digests are not written through a const score()", "[defects]") {
  STATIC_REQUIRE_FALSE(scores_through_const<kvsift::score::page_minmax, dense_t>);
  STATIC_REQUIRE(kvsift::score::page_minmax::kvsift_hooks.reset);
}

// 4. An exception inside an OpenMP region called std::terminate.
TEST_CASE("parallel_for rethrows an iteration's exception on the caller", "[defects]") {
  std::atomic<int> ran{0};
  auto body = [&](std::int64_t i) {
    ++ran;
    if (i == 17) throw kvsift::error("kvsift: iteration 17 failed");
  };
  REQUIRE_THROWS_WITH(kvsift::cpu::parallel_for(64, body, kvsift::cpu::par,
                                                kvsift::cpu::parallel_threshold),
                      ContainsSubstring("iteration 17"));
  REQUIRE(ran.load() >= 1);
  REQUIRE_THROWS_AS(kvsift::cpu::parallel_for(
                        64, [](std::int64_t i) { if (i % 7 == 3) throw std::bad_alloc(); },
                        kvsift::cpu::par_t{.threads = 4}, kvsift::cpu::parallel_threshold),
                    std::bad_alloc);
}

// 5. Sizes: CSR offsets, safetensors element counts, paged capacity.
TEST_CASE("sizes that overflow are errors, not wrapped values", "[defects]") {
  kvsift::index_sets sets;
  const std::vector<int> huge{std::numeric_limits<std::int32_t>::max(), 1};
  REQUIRE_THROWS_WITH(sets.resize(huge), ContainsSubstring("argument 'sizes[1]'"));
  REQUIRE(sets.segments() == 0);
  const std::vector<int> negative{3, -1};
  REQUIRE_THROWS_WITH(sets.resize(negative), ContainsSubstring("argument 'sizes[1]'"));

  const kvsift::io::shape_t hostile{std::int64_t{1} << 40, std::int64_t{1} << 40};
  REQUIRE_THROWS_WITH(kvsift::io::shape_numel(hostile), ContainsSubstring("argument 'shape'"));
  REQUIRE_THROWS_WITH(kvsift::io::shape_numel({4, -2}), ContainsSubstring("argument 'shape'"));
  REQUIRE(kvsift::io::shape_numel({3, 5, 7}) == 105);

  // 2^16 pages of 2^16 slots: slot numbers do not fit an int. Rejected before any allocation.
  float dummy = 0.0f;
  REQUIRE_THROWS_WITH(paged_t(kShape, 1, 1 << 16, 1 << 16, &dummy, &dummy),
                      ContainsSubstring("argument 'total_pages'"));
}

// 6. Parameters never validated.
TEST_CASE("memory_fraction validates min_tokens", "[defects]") {
  kvsift::budget::memory_fraction b{{.keep_fraction = 0.5, .min_tokens = -1}};
  REQUIRE_THROWS_WITH(b.validate("t"), ContainsSubstring("argument 'min_tokens'"));
}

// 7. require() built its message for every call; decode allocated per token and layer.
TEST_CASE("require builds its message only on failure", "[defects]") {
  int built = 0;
  auto message = [&] {
    ++built;
    return "in [0, " + std::to_string(7) + ")";
  };
  kvsift::require(true, "t", "x", 3, message);
  REQUIRE(built == 0);
  REQUIRE_THROWS_WITH(kvsift::require(false, "t", "x", 9, message),
                      ContainsSubstring("argument 'x' = 9, expected in [0, 7)"));
  REQUIRE(built == 1);
  // the old form still compiles and works
  REQUIRE_THROWS_WITH(kvsift::require(false, "t", "y", 1, std::string("> 1")),
                      ContainsSubstring("expected > 1"));
}

TEST_CASE("store.append and a dense decode step allocate nothing", "[defects]") {
  dense_t s(kShape, 2, 64);
  const auto k = wave(8, 0.3f), q = wave(16, 0.2f);
  s.append(0, 0, view<float>::contiguous(k.data(), 1, 2, 4), view<float>::contiguous(k.data(), 1, 2, 4), 0);
  g_allocations = 0;
  s.append(0, 0, view<float>::contiguous(k.data(), 1, 2, 4), view<float>::contiguous(k.data(), 1, 2, 4), 1);
  const auto append_allocations = g_allocations;
  REQUIRE(append_allocations == 0);

  kvsift::full_kv<dense_t> m(s, kvsift::full_kv_params<dense_t>());
  const std::vector<kvsift::decode_token<float>> step{{0, q.data(), k.data(), k.data()},
                                                      {1, q.data(), k.data(), k.data()}};
  m.decode(1, step);  // warms the plan's buffers
  m.after_attention(1, step);
  // 16 steps: the plan's buffers grow geometrically (a few reallocations in all), nothing is
  // allocated per step or per token (before: messages built for every token's append).
  constexpr int steps = 16;
  g_allocations = 0;
  for (int i = 0; i < steps; ++i) {
    m.decode(1, step);
    m.after_attention(1, step);
  }
  const auto decode_allocations = g_allocations;
  REQUIRE(decode_allocations < steps);
}

// The evicting methods' whole decode step (decode, the library's attention, after_attention with
// its eviction round) allocates nothing once warm either, on the caller's thread (the counter is
// this thread's): before, the budget check before each step built four vectors and a score set.
TEMPLATE_TEST_CASE("an evicting method's decode step allocates nothing once warm", "[defects]",
                   dense_t, paged_t) {
  using store_t = TestType;
  kvsift::cpu::scoped_threading serial(kvsift::cpu::threading::caller);
  const auto run = [](auto& m, const prompt& p) {
    const std::vector<kvsift::prefill_chunk<float>> chunks{p.chunk(0)};
    m.prefill(1, chunks);
    const auto k = wave(8, 0.3f), q = wave(16, 0.2f);
    const std::vector<kvsift::decode_token<float>> step{{0, q.data(), k.data(), k.data()}};
    std::vector<float> out(16);
    const auto one_step = [&] {
      m.decode(1, step);
      m.attend(1, step, out.data());
      m.after_attention(1, step);
    };
    for (int i = 0; i < 4; ++i) one_step();  // warms the plan, the weights and the scratch
    g_allocations = 0;
    for (int i = 0; i < 16; ++i) one_step();
    return g_allocations;
  };
  const prompt p(24, 0.4f);
  const auto fresh = [] {
    if constexpr (std::is_same_v<store_t, dense_t>) {
      return dense_t(kShape, 2, 64);
    } else {
      return paged_t(kShape, 2, 4, 2 * 2 * 2 * 16);  // 4-slot pages, 64 slots per head-sequence
    }
  };
  {
    store_t s = fresh();
    kvsift::h2o<store_t> m(s, kvsift::h2o_params<store_t>(8));
    CHECK(run(m, p) == 0);
    CHECK(s.length(0, 1, 0) == 8);  // it evicted every step
  }
  {
    store_t s = fresh();
    kvsift::streaming_llm<store_t> m(s, kvsift::streaming_llm_params<store_t>(8, 2));
    CHECK(run(m, p) == 0);
    CHECK(s.length(0, 1, 0) == 8);
  }
}

// 9. "Mirrors ..." comments name files that exist.
TEST_CASE("header comments name files that exist", "[defects]") {
  const std::filesystem::path root = KVSIFT_SOURCE_DIR;
  const std::regex file_name(R"(([A-Za-z0-9_]+/)+[A-Za-z0-9_]+\.(hpp|cuh|cpp|cu))");
  int checked = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root / "include" / "kvsift")) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path());
    std::string line, next;
    std::vector<std::string> lines;
    while (std::getline(in, line)) lines.push_back(line);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].find("Mirrors") == std::string::npos) continue;
      std::string text = lines[i].substr(lines[i].find("Mirrors"));
      if (text.find('.') == text.size() - 1 || text.find(". ") == std::string::npos) {
        if (i + 1 < lines.size()) text += " " + lines[i + 1];  // the sentence may wrap
      }
      text = text.substr(0, text.find(". ") == std::string::npos ? text.size() : text.find(". "));
      for (std::sregex_iterator it(text.begin(), text.end(), file_name), end; it != end; ++it) {
        const std::string named = it->str();
        INFO(e.path().string() << " names " << named);
        CHECK((std::filesystem::exists(root / "include" / "kvsift" / named) ||
               std::filesystem::exists(root / named)));
        ++checked;
      }
    }
  }
  REQUIRE(checked > 0);
}
