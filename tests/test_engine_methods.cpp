// SPDX-License-Identifier: Apache-2.0
// kvsift methods behind the example engine's KV cache (examples/engine/kvsift_cache.hpp), on the
// shipped model and prompts: full_kv reproduces the engine's own full cache, budgets and
// resident bytes follow the store, StreamingLLM's decode plans keep the sinks, and a user's own
// composition plugs in through method_cache.

#include <kvsift/budget/memory_fraction.hpp>
#include <kvsift/kvsift.hpp>

#include "../examples/engine/eval_harness.hpp"
#include "../examples/engine/kvsift_cache.hpp"
#include "../examples/engine/llama.hpp"

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace ex = kvsift::examples;

namespace {

const std::string data_dir = std::string(KVSIFT_SOURCE_DIR) + "/data";

const ex::llama_model& shipped_model() {
  static const ex::llama_model model = ex::llama_model::load(data_dir + "/tiny-recall");
  return model;
}

// The first passkey prompt (512 bytes) and the second chain prompt (1024 bytes) shipped.
const std::vector<ex::eval_item>& shipped_prompts() {
  static const std::vector<ex::eval_item> items = [] {
    std::vector<ex::eval_item> out;
    out.push_back(ex::load_eval_jsonl(data_dir + "/eval/passkey.jsonl").at(0));
    out.push_back(ex::load_eval_jsonl(data_dir + "/eval/chain.jsonl").at(1));
    return out;
  }();
  return items;
}

// Resident bytes of the cache's store, from the kept tokens the cache reports.
std::int64_t kept_bytes(const ex::kvsift_cache& cache, const ex::llama_config& cfg) {
  std::int64_t tokens = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    for (int h = 0; h < cfg.num_kv_heads; ++h) tokens += cache.kept_tokens(l, h);
  }
  return tokens * 2 * cfg.head_dim * static_cast<std::int64_t>(sizeof(float));
}

// Checks every decode plan of a StreamingLLM cache: sinks 0..3, then the newest tokens.
class checking_streaming_cache : public ex::kvsift_cache {
 public:
  explicit checking_streaming_cache(double fraction) : kvsift_cache("streaming_llm", fraction) {}
  void decode(int layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, int position, std::span<float> out) override {
    kvsift_cache::decode(layer, q, k, v, position, out);
    const auto* plan = last_plan();
    REQUIRE(plan != nullptr);
    const int B = budget_tokens();
    for (int s = 0; s < plan->positions.segments(); ++s) {
      const auto pos = plan->positions[s];
      // the kept set between steps is B tokens; the step's plan adds the new token
      REQUIRE(static_cast<int>(pos.size()) == B + 1);
      for (int i = 0; i < 4; ++i) CHECK(pos[static_cast<std::size_t>(i)] == i);
      // then the newest B - 4 tokens and the new one, contiguous, ending at `position`
      for (std::size_t i = 4; i < pos.size(); ++i) {
        CHECK(pos[i] == position - static_cast<int>(pos.size() - 1 - i));
      }
    }
    ++plans;
  }
  int plans = 0;
};

}  // namespace

TEST_CASE("engine methods: full_kv through kvsift equals the engine's full cache",
          "[engine][methods]") {
  const auto& model = shipped_model();
  for (const auto& item : shipped_prompts()) {
    CAPTURE(item.id);
    const auto ids = ex::byte_tokenize(item.prompt);
    const int n_new = static_cast<int>(item.answer.size());
    ex::full_cache ref;
    std::vector<std::vector<float>> ref_steps;
    const auto ref_out = model.generate_greedy(ids, n_new, ref, nullptr, &ref_steps);

    ex::kvsift_cache cache("full_kv", 0.25);
    std::vector<std::vector<float>> steps;
    const auto out = model.generate_greedy(ids, n_new, cache, nullptr, &steps);
    CHECK(out == ref_out);
    REQUIRE(steps.size() == ref_steps.size());
    // the prefill logits do not involve the cache; every later step reads it: the library's
    // attention and the engine's differ only by float32 rounding (exp, summation order)
    CHECK(steps.front() == ref_steps.front());
    float max_rel = 0.0f;
    for (std::size_t s = 1; s < steps.size(); ++s) {
      for (std::size_t i = 0; i < steps[s].size(); ++i) {
        max_rel = std::max(max_rel, std::abs(steps[s][i] - ref_steps[s][i]) /
                                        std::max(1.0f, std::abs(ref_steps[s][i])));
      }
    }
    CAPTURE(max_rel);
    CHECK(max_rel <= 1e-5f);
    for (int l = 0; l < model.config().num_layers; ++l) {
      for (int h = 0; h < model.config().num_kv_heads; ++h) {
        CHECK(cache.kept_tokens(l, h) == ref.kept_tokens(l, h));
      }
    }
    CHECK(cache.stats().resident_bytes == kept_bytes(cache, model.config()));

    // the engine's kernel over the plan and the store's memory is the full cache's arithmetic
    ex::kvsift_cache fast("full_kv", 0.25);
    fast.set_attention_kernel(ex::attention_kernel::engine);
    std::vector<std::vector<float>> fast_steps;
    CHECK(model.generate_greedy(ids, n_new, fast, nullptr, &fast_steps) == ref_out);
    CHECK(fast_steps == ref_steps);
  }
}

TEST_CASE("engine methods: snapkv at 25% keeps floor(0.25 n) tokens per KV head after prefill",
          "[engine][methods]") {
  const auto& model = shipped_model();
  const auto& cfg = model.config();
  for (const auto& item : shipped_prompts()) {
    CAPTURE(item.id);
    const auto ids = ex::byte_tokenize(item.prompt);
    const int n = static_cast<int>(ids.size());
    const int n_new = static_cast<int>(item.answer.size());
    ex::kvsift_cache cache("snapkv", 0.25);
    const auto logits = model.prefill(ids, cache, n_new);
    const int B = n / 4;
    CHECK(cache.budget_tokens() == B);
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (int h = 0; h < cfg.num_kv_heads; ++h) CHECK(cache.kept_tokens(l, h) == B);
    }
    const auto st = cache.stats();
    CHECK(st.resident_bytes == kept_bytes(cache, cfg));
    CHECK(st.resident_bytes == cache.store().resident_bytes());
    CHECK(st.resident_tokens == static_cast<std::int64_t>(B) * cfg.num_layers * cfg.num_kv_heads);
    // the resident share the eval reports: B of n tokens
    const double full = static_cast<double>(n) * cfg.num_layers * cfg.num_kv_heads * 2 *
                        cfg.head_dim * sizeof(float);
    CHECK(std::abs(static_cast<double>(st.resident_bytes) / full - static_cast<double>(B) / n) <
          1e-12);
    // decoding appends without evicting
    int position = n;
    auto next = ex::llama_model::argmax(logits);
    for (int s = 0; s < 3; ++s) next = ex::llama_model::argmax(model.decode(next, position++, cache));
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (int h = 0; h < cfg.num_kv_heads; ++h) CHECK(cache.kept_tokens(l, h) == B + 3);
    }
    CHECK(cache.stats().resident_bytes == kept_bytes(cache, cfg));
  }
}

TEST_CASE("engine methods: streaming_llm's decode plans keep the sinks and the newest tokens",
          "[engine][methods]") {
  const auto& model = shipped_model();
  const auto& item = shipped_prompts().back();
  const auto ids = ex::byte_tokenize(item.prompt);
  const int n_new = static_cast<int>(item.answer.size());
  checking_streaming_cache cache(0.25);
  (void)model.generate_greedy(ids, n_new, cache);
  CHECK(cache.plans == (n_new - 1) * model.config().num_layers);
  const int B = static_cast<int>(ids.size()) / 4;
  CHECK(cache.kept_tokens(0, 0) == B);  // back at B after each step's eviction
  CHECK(cache.stats().resident_tokens ==
        static_cast<std::int64_t>(B) * model.config().num_layers * model.config().num_kv_heads);
}

TEST_CASE("engine methods: a custom composition plugs in through method_cache",
          "[engine][methods]") {
  using my_method = kvsift::method<ex::cache_store, kvsift::score::key_norm, kvsift::select::topk,
                                   kvsift::budget::memory_fraction, kvsift::transfer::none,
                                   kvsift::trigger::never>;
  int starts = 0;
  ex::method_cache<my_method> cache("key_norm", [&starts](const ex::cache_shape& s) {
    ++starts;
    CHECK(s.prompt_len > 0);
    return my_method::params{.selector = {.sink = 4, .window = 16},
                             .budgeter = {.keep_fraction = 0.25}};
  });
  CHECK(cache.name() == "key_norm");
  const auto& model = shipped_model();
  const auto& cfg = model.config();
  for (const auto& item : shipped_prompts()) {
    CAPTURE(item.id);
    const auto ids = ex::byte_tokenize(item.prompt);
    const int n = static_cast<int>(ids.size());
    const int n_new = static_cast<int>(item.answer.size());
    const auto logits = model.prefill(ids, cache, n_new);
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (int h = 0; h < cfg.num_kv_heads; ++h) {
        CHECK(cache.kept_tokens(l, h) == kvsift::budget::tokens_from_keep_fraction(n, 0.25));
      }
    }
    CHECK(cache.store().position(0, 0) == 0);  // the sinks stay
    // the whole evaluation path runs through it too
    const auto r = ex::run_item(model, item, cache);
    CHECK(r.output.size() == item.answer.size());
    CHECK(cache.kept_tokens(0, 0) == n / 4 + n_new - 1);  // trigger::never: decode appends
    CHECK(ex::llama_model::argmax(logits) >= 0);
  }
  CHECK(starts == 4);
}

TEST_CASE("engine methods: kvsift_cache rejects unknown names and bad fractions",
          "[engine][methods]") {
  CHECK_THROWS_AS(ex::kvsift_cache("no_such_method", 0.25), kvsift::error);
  CHECK_THROWS_AS(ex::kvsift_cache("snapkv", 0.0), kvsift::error);
  CHECK_THROWS_AS(ex::kvsift_cache("snapkv", 1.5), kvsift::error);
  for (const auto& name : kvsift::method_names()) CHECK_NOTHROW(ex::kvsift_cache(name, 0.25));
}
