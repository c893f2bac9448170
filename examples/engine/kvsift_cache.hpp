// SPDX-License-Identifier: Apache-2.0
#pragma once

// The engine's KV cache as a kvsift store driven by a kvsift method: any named method
// (make_method) or a user's own composition plugs in behind `kv_cache`.
//
//   kvsift::examples::kvsift_cache cache("snapkv", /*budget_fraction=*/0.25);
//   auto out = model.generate_greedy(ids, 7, cache);
//   cache.stats().resident_bytes;   // the store's resident KV now
//
//   using mine = kvsift::method<kvsift::examples::cache_store, kvsift::score::key_norm,
//                               kvsift::select::topk, kvsift::budget::memory_fraction,
//                               kvsift::transfer::none, kvsift::trigger::never>;
//   kvsift::examples::method_cache<mine> custom("key_norm", [](const cache_shape&) {
//     return mine::params{.selector = {.sink = 4, .window = 16}, .budgeter = {.keep_fraction = 0.25}};
//   });
//
// Per sequence (kv_cache::start): a store::dense<float> with one request and capacity max_len,
// and a fresh method over it. Named methods get the tiny-recall protocol's budget
// B = floor(budget_fraction * prompt_len) tokens per KV head, every kept token counted
// (budget::tokens_from_keep_fraction); LagKV, which has no token budget, keeps that fraction of
// each lag partition. prefill(layer) hands the layer's K/V/Q (after RoPE) to the method as one
// prefill_chunk marked last (the compression round runs there). decode(layer) is the method's
// decode (append + attention plan), then the library's attention over the plan, straight from
// the store's memory into the engine's output (no copy of KV); after_attention(layer) is the
// method's after_attention.

#include "llama.hpp"

#include <kvsift/budget/memory_fraction.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/method/any_method.hpp>
#include <kvsift/store/dense.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvsift::examples {

// The store behind the engine's cache: float32 rows, [layers, kv_heads, capacity, d].
using cache_store = store::dense<float>;

// Which kernel computes decode attention over the method's plan. `library` (the default) is
// the method's attend(): kvsift's reference attention reading the store. `engine` is the
// engine's vectorised attend_decode over the same store memory, the plan's slots as row index
// (no copy either way; a dense store only).
enum class attention_kernel { library, engine };

class kvsift_cache : public kv_cache {
 public:
  // Makes the method of a sequence over its store; called by start().
  using factory =
      std::function<std::unique_ptr<any_method<cache_store>>(cache_store&, const cache_shape&)>;

  // A named method (one of method_names()) at budget floor(budget_fraction * prompt_len) tokens
  // per KV head; `keep_fraction` (LagKV) defaults to budget_fraction. Throws kvsift::error for
  // an unknown name or a fraction outside (0, 1].
  explicit kvsift_cache(std::string name, double budget_fraction = 0.25,
                        std::optional<double> keep_fraction = std::nullopt)
      : name_(std::move(name)), budget_fraction_(budget_fraction),
        keep_fraction_(keep_fraction.value_or(budget_fraction)) {
    require(budget_fraction > 0.0 && budget_fraction <= 1.0, "examples::kvsift_cache",
            "budget_fraction", budget_fraction, "in (0, 1]");
    require(keep_fraction_ > 0.0 && keep_fraction_ <= 1.0, "examples::kvsift_cache",
            "keep_fraction", keep_fraction_, "in (0, 1]");
    bool known = false;
    for (const auto& n : method_names()) known = known || n == name_;
    if (!known) {
      std::string all;
      for (const auto& n : method_names()) all += (all.empty() ? "" : ", ") + n;
      throw make_error("examples::kvsift_cache", "name", name_, "one of " + all);
    }
    make_ = [this](cache_store& st, const cache_shape& s) {
      budget_tokens_ = budget::tokens_from_keep_fraction(s.prompt_len, budget_fraction_);
      return make_method(name_, st, budget_tokens_, keep_fraction_);
    };
  }

  // A custom method: `make(store, shape)` builds it for each sequence (see method_cache).
  kvsift_cache(std::string label, factory make) : name_(std::move(label)), make_(std::move(make)) {
    require(static_cast<bool>(make_), "examples::kvsift_cache", "factory", "empty",
            "a callable");
  }

  // The named-method factory refers to this object: not copyable nor movable.
  kvsift_cache(const kvsift_cache&) = delete;
  kvsift_cache& operator=(const kvsift_cache&) = delete;

  void start(const cache_shape& s) override {
    require(s.num_layers > 0 && s.num_kv_heads > 0 && s.head_dim > 0 && s.max_len > 0,
            "examples::kvsift_cache::start", "shape", s.max_len, "positive sizes");
    shape_ = s;
    method_.reset();  // before the store it points to
    store_.reset();
    const model_shape ms{.layers = s.num_layers, .q_heads = s.num_q_heads,
                         .kv_heads = s.num_kv_heads, .head_dim = s.head_dim};
    store_ = std::make_unique<cache_store>(ms, /*requests=*/1, /*capacity=*/s.max_len);
    method_ = make_(*store_, s);
    require(method_ != nullptr, "examples::kvsift_cache::start", "factory", "null",
            "a method over the store");
    plan_ = nullptr;
    attended_tokens_ = 0;
    full_tokens_ = 0;
  }

  void prefill(int layer, int n, std::span<const float> k_rot, std::span<const float> v,
               std::span<const float> q_rot) override {
    using view = kv_view<const float, nhd>;
    const int kvh = shape_.num_kv_heads;
    const int d = shape_.head_dim;
    const prefill_chunk<float> chunk{
        .request = 0,
        .keys = view::contiguous(k_rot.data(), n, kvh, d),
        .values = view::contiguous(v.data(), n, kvh, d),
        .queries = view::contiguous(q_rot.data(), n, shape_.num_q_heads, d),
        .first_position = 0,
        .last = true};
    method_->prefill(layer, std::span<const prefill_chunk<float>>(&chunk, 1));
  }

  void decode(int layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, int position, std::span<float> out) override {
    require(position == store_->next_position(0, layer), "examples::kvsift_cache::decode",
            "position", position,
            "the layer's next position (" + std::to_string(store_->next_position(0, layer)) + ")");
    const decode_token<float> tok{.request = 0, .query = q.data(), .key = k.data(),
                                  .value = v.data()};
    const std::span<const decode_token<float>> toks(&tok, 1);
    plan_ = &method_->decode(layer, toks);
    attended_tokens_ += static_cast<std::int64_t>(plan_->slots.values.size());
    full_tokens_ += static_cast<std::int64_t>(position + 1) * shape_.num_kv_heads;
    if (kernel_ == attention_kernel::library) {
      method_->attend(layer, toks, out.data());
      return;
    }
    const int d = shape_.head_dim;
    views_.resize(static_cast<std::size_t>(shape_.num_kv_heads));
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const auto seq = store_->shape().sequence(0, layer, h);
      const auto slots = plan_->slots[h];
      views_[static_cast<std::size_t>(h)] = {store_->key(seq, 0), store_->value(seq, 0), d,
                                             slots.data(), static_cast<int>(slots.size())};
    }
    attend_decode(q, shape_.num_q_heads, d, views_, out);
  }

  void after_attention(int layer, std::span<const float> q) override {
    const decode_token<float> tok{.request = 0, .query = q.data()};
    method_->after_attention(layer, std::span<const decode_token<float>>(&tok, 1));
  }

  // The decode attention kernel (library by default); applies from the next decode().
  void set_attention_kernel(attention_kernel k) { kernel_ = k; }
  [[nodiscard]] attention_kernel kernel() const { return kernel_; }

  [[nodiscard]] std::int64_t kept_tokens(int layer, int kv_head) const override {
    return store_ ? store_->length(0, layer, kv_head) : 0;
  }

  // The method's name (or a custom method's label).
  [[nodiscard]] const std::string& name() const { return name_; }
  // Budget of the current sequence in tokens per KV head (named methods; 0 for custom ones).
  [[nodiscard]] int budget_tokens() const { return budget_tokens_; }
  [[nodiscard]] double budget_fraction() const { return budget_fraction_; }
  // The current sequence's method and store (after start()).
  [[nodiscard]] any_method<cache_store>& method() { return *method_; }
  [[nodiscard]] const cache_store& store() const { return *store_; }
  [[nodiscard]] method_stats stats() const { return method_ ? method_->stats() : method_stats{}; }
  // The plan of the last decode() (valid until the next decode()).
  [[nodiscard]] const attention_plan* last_plan() const { return plan_; }
  // Tokens attention read over all decode steps of the sequence, per KV head summed, and what a
  // full cache would have read (the share of KV a step reads: Quest's saving).
  [[nodiscard]] std::int64_t attended_tokens() const { return attended_tokens_; }
  [[nodiscard]] std::int64_t full_attended_tokens() const { return full_tokens_; }

 private:
  std::string name_;
  double budget_fraction_ = 0.0;
  double keep_fraction_ = 0.0;
  int budget_tokens_ = 0;
  factory make_;
  cache_shape shape_;
  std::unique_ptr<cache_store> store_;
  std::unique_ptr<any_method<cache_store>> method_;
  attention_kernel kernel_ = attention_kernel::library;
  std::vector<kv_head_view> views_;
  const attention_plan* plan_ = nullptr;
  std::int64_t attended_tokens_ = 0;
  std::int64_t full_tokens_ = 0;
};

// A user's own composition M = kvsift::method<cache_store, ...>: `params(shape)` gives its
// parameters for each sequence (e.g. a budget from shape.prompt_len).
template <class M>
class method_cache : public kvsift_cache {
 public:
  using params_fn = std::function<typename M::params(const cache_shape&)>;
  method_cache(std::string label, params_fn params)
      : kvsift_cache(label, [label, params = std::move(params)](cache_store& st,
                                                                const cache_shape& s) {
          return std::unique_ptr<any_method<cache_store>>(
              std::make_unique<erased_method<M>>(label, st, params(s)));
        }) {}
};

}  // namespace kvsift::examples
