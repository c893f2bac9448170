// SPDX-License-Identifier: Apache-2.0
// The shell every method is (method<Store, Recipe, Exec>): plan_decode is the host part of a
// step and changes nothing; run_decode(plan_decode(..)) is decode; a failed plan leaves every
// store and method as it was; the aliases are the compositions they name; caps follow the
// schedule.
#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/catch_template_test_macros.hpp>

#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

namespace {

using store_t = kvsift::store::dense<float>;
const kvsift::model_shape kShape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
constexpr int kPrompt = 96;

struct inputs {
  std::vector<float> k, v, q;
};
inputs random_inputs(int tokens, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  inputs in;
  in.k.resize(std::size_t(tokens) * kShape.kv_heads * kShape.head_dim);
  in.v.resize(in.k.size());
  in.q.resize(std::size_t(tokens) * kShape.q_heads * kShape.head_dim);
  for (auto* vec : {&in.k, &in.v, &in.q}) {
    for (auto& x : *vec) x = g(rng);
  }
  return in;
}

template <class M>
void prefill_all(M& m, const inputs& p) {
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  for (int r = 0; r < 2; ++r) {
    for (int l = 0; l < kShape.layers; ++l) {
      m.prefill(l, {.request = r, .keys = view::contiguous(p.k.data(), kPrompt, 2, 8),
                    .values = view::contiguous(p.v.data(), kPrompt, 2, 8),
                    .queries = view::contiguous(p.q.data(), kPrompt, 4, 8), .last = true});
    }
  }
}

// The store's whole content: lengths, positions and rows of every head-sequence.
std::vector<float> snapshot(const store_t& st) {
  std::vector<float> out;
  for (std::int64_t s = 0; s < std::int64_t(2) * kShape.layers * kShape.kv_heads; ++s) {
    out.push_back(float(st.length(s)));
    for (int i = 0; i < st.length(s); ++i) {
      out.push_back(float(st.position(s, i)));
      out.insert(out.end(), st.key(s, i), st.key(s, i) + kShape.head_dim);
      out.insert(out.end(), st.value(s, i), st.value(s, i) + kShape.head_dim);
    }
  }
  return out;
}

template <class M>
typename M::params params_for() {
  if constexpr (std::is_same_v<M, kvsift::snapkv<store_t>>) return kvsift::snapkv_params<store_t>(32, 8, 3);
  if constexpr (std::is_same_v<M, kvsift::h2o<store_t>>) return kvsift::h2o_params<store_t>(32);
  if constexpr (std::is_same_v<M, kvsift::streaming_llm<store_t>>) return kvsift::streaming_llm_params<store_t>(32);
  if constexpr (std::is_same_v<M, kvsift::quest<store_t>>) return kvsift::quest_params<store_t>(32, 8, 1);
  if constexpr (std::is_same_v<M, kvsift::lagkv<store_t>>) return kvsift::lagkv_params<store_t>(4, 16);
  if constexpr (std::is_same_v<M, kvsift::dynamickv<store_t>>) return kvsift::dynamickv_params<store_t>(32);
}

}  // namespace

TEMPLATE_TEST_CASE("plan_decode changes nothing; run_decode(plan_decode(..)) is decode", "[composition]",
                   kvsift::snapkv<store_t>, kvsift::h2o<store_t>, kvsift::streaming_llm<store_t>,
                   kvsift::quest<store_t>, kvsift::lagkv<store_t>, kvsift::dynamickv<store_t>) {
  const auto prompt = random_inputs(kPrompt, 7);
  store_t s1(kShape, 2, 256), s2(kShape, 2, 256);
  TestType a(s1, params_for<TestType>()), b(s2, params_for<TestType>());
  prefill_all(a, prompt);
  prefill_all(b, prompt);
  for (int t = 0; t < 12; ++t) {
    const auto tok = random_inputs(2, 100 + t);
    std::vector<kvsift::decode_token<float>> batch;
    for (int r : {1, 0}) {  // out of request order: a batch is any order
      batch.push_back({.request = r, .query = tok.q.data() + r * 32, .key = tok.k.data() + r * 16,
                       .value = tok.v.data() + r * 16});
    }
    for (int l = 0; l < kShape.layers; ++l) {
      const auto before = snapshot(s1);
      const auto step = a.plan_decode(l, batch);
      REQUIRE(snapshot(s1) == before);  // the host part touches nothing
      REQUIRE(step.layer() == l);
      REQUIRE(step.tokens().size() == batch.size());
      const auto plan_a = a.run_decode(step);
      const auto plan_b = b.decode(l, batch);
      REQUIRE(plan_a.requests == plan_b.requests);
      REQUIRE(plan_a.slots.values == plan_b.slots.values);
      REQUIRE(plan_a.slots.offsets == plan_b.slots.offsets);
      REQUIRE(plan_a.positions.values == plan_b.positions.values);
      a.after_attention(l, batch);
      b.after_attention(l, batch);
      REQUIRE(snapshot(s1) == snapshot(s2));
    }
  }
  REQUIRE(a.stats().resident_bytes == b.stats().resident_bytes);
  REQUIRE(a.stats().refreshes == b.stats().refreshes);
}

TEST_CASE("a plan_decode that throws leaves the store and the step binding as they were", "[composition]") {
  const auto prompt = random_inputs(kPrompt, 11);
  store_t st(kShape, 2, kPrompt + 1);  // room for exactly one decode token
  kvsift::snapkv<store_t> m(st, kvsift::snapkv_params<store_t>(kPrompt, 8, 3));  // keeps everything
  prefill_all(m, prompt);
  const auto tok = random_inputs(2, 5);
  const kvsift::decode_token<float> t0{.request = 0, .query = tok.q.data(), .key = tok.k.data(),
                                       .value = tok.v.data()};
  m.decode(0, t0);
  m.after_attention(0, t0);
  const auto before = snapshot(st);
  // request 0 has no room left on layer 0; request 1 appears twice; a null key
  REQUIRE_THROWS_AS(m.plan_decode(0, std::span(&t0, 1)), kvsift::error);
  const kvsift::decode_token<float> twice[2] = {{.request = 1, .query = tok.q.data(), .key = tok.k.data(), .value = tok.v.data()},
                                                {.request = 1, .query = tok.q.data(), .key = tok.k.data(), .value = tok.v.data()}};
  REQUIRE_THROWS_AS(m.plan_decode(1, twice), kvsift::error);
  const kvsift::decode_token<float> null_key{.request = 1, .query = tok.q.data(), .key = nullptr, .value = tok.v.data()};
  REQUIRE_THROWS_AS(m.plan_decode(1, std::span(&null_key, 1)), kvsift::error);
  REQUIRE(snapshot(st) == before);
  // nothing is pending: after_attention without a decode is refused
  REQUIRE_THROWS_AS(m.after_attention(1, twice[0]), kvsift::error);
  // and the batch scratch was cleared: request 1 alone is fine now
  const auto step = m.plan_decode(1, std::span(&twice[0], 1));
  m.run_decode(step);
  m.after_attention(1, twice[0]);
  REQUIRE(st.length(1, 1, 0) == kPrompt + 1);
}

TEST_CASE("the named methods are the compositions they name", "[composition]") {
  using namespace kvsift;
  STATIC_REQUIRE(std::is_same_v<snapkv<store_t>,
                                method<store_t, recipe<score::window_attention, select::topk, budget::uniform,
                                                       trigger::never>, exec::host>>);
  STATIC_REQUIRE(std::is_same_v<quest<store_t>::schedule, schedule::sparse_read>);
  STATIC_REQUIRE(std::is_same_v<h2o<store_t>::schedule, schedule::evict>);
  STATIC_REQUIRE(std::is_same_v<freekv<float>::schedule, schedule::speculative>);
  STATIC_REQUIRE(std::is_same_v<freekv<float>::exec_type, exec::host>);
  STATIC_REQUIRE(Exec<exec::host>);
  // caps follow the schedule: eviction changes lengths, sparse reading and full KV do not
  STATIC_REQUIRE(snapkv<store_t>::caps.changes_physical_length);
  STATIC_REQUIRE_FALSE(quest<store_t>::caps.changes_physical_length);
  STATIC_REQUIRE(quest<store_t>::caps.safe_with_shared_prefix);
  STATIC_REQUIRE_FALSE(full_kv<store_t>::caps.changes_physical_length);
  STATIC_REQUIRE(freekv<float>::caps.changes_physical_length);
}
