// SPDX-License-Identifier: Apache-2.0
#pragma once

// The engine's KV cache as a kvsift store driven by a kvsift method: any named method
// (make_method) or a user's own composition plugs in behind `kv_cache`.
//
//   kvsift::examples::kvsift_cache cache("snapkv", /*budget_fraction=*/0.25);
//   auto out = model.generate_greedy(ids, 7, cache);
//   cache.stats().resident_bytes;   // the store's resident KV now
//
//   using mine = kvsift::method<kvsift::examples::cache_store,
//                               kvsift::recipe<kvsift::score::key_norm, kvsift::select::topk,
//                                              kvsift::budget::memory_fraction,
//                                              kvsift::trigger::never>>;
//   kvsift::examples::method_cache<mine> custom("key_norm", [](const cache_shape&) {
//     return mine::params{.selector = {.sink = 4, .window = 16}, .budgeter = {.keep_fraction = 0.25}};
//   });
//
// Per sequence (kv_cache::start) the cache asks a factory for a fresh method over element type
// float; the method OWNS its store (any_kv_method<float>), so a method over store::dense and one
// over store::tiered (SyncKV, HeteroCache, FreeKV) plug in the same way. Named methods come from
// kvsift::default_method_registry<float>() (include/kvsift/method/any_method.hpp, where new
// methods register): the config has the model shape, one request, capacity max_len, the prompt
// length, the tiny-recall protocol's budget B = floor(budget_fraction * prompt_len) tokens per KV
// head (every kept token counted; budget::tokens_from_keep_fraction), LagKV's keep fraction (it
// has no token budget) and an optional head-roles file. With match_resident, the budget fraction
// is instead the target device-resident share of the prompt's KV at the end of the prompt, and
// the registry's for_resident_fraction hook sets each method's parameter for it (methods without
// one, full_kv and Quest, keep the whole prompt resident).
// prefill(layer) hands the layer's K/V/Q (after RoPE) to the method as one prefill_chunk marked
// last (the compression round runs there). decode(layer) is the method's decode (append +
// attention plan), then the library's attention over the plan, straight from the store's memory
// into the engine's output (no copy of KV); after_attention(layer) is the method's
// after_attention.

#include "llama.hpp"

#include <kvsift/budget/memory_fraction.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/method/any_method.hpp>
#include <kvsift/store/dense.hpp>

#include <algorithm>
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

// Options of a named method in kvsift_cache.
struct cache_options {
  std::optional<double> keep_fraction;  // LagKV's kept share of a partition (default: the budget)
  std::string roles_file;               // head-roles file (SyncKV, HeteroCache)
  bool match_resident = false;          // the fraction is the resident KV share (see above)
  // Where the name is looked up (null: kvsift::default_method_registry<float>()).
  const method_registry<float>* registry = nullptr;
};

class kvsift_cache : public kv_cache {
 public:
  // Makes the method of a sequence (and its store) from the sequence's config; called by start().
  using factory = std::function<std::unique_ptr<any_kv_method<float>>(const method_config&)>;

  // A named method (one of default_method_registry<float>().names()) at budget
  // floor(budget_fraction * prompt_len) tokens per KV head; `keep_fraction` (LagKV) defaults to
  // budget_fraction. Throws kvsift::error for an unknown name or a fraction outside (0, 1].
  explicit kvsift_cache(std::string name, double budget_fraction = 0.25,
                        std::optional<double> keep_fraction = std::nullopt)
      : kvsift_cache(std::move(name), budget_fraction,
                     cache_options{.keep_fraction = keep_fraction, .roles_file = {},
                                   .match_resident = false, .registry = nullptr}) {}

  // The same with options: a head-roles file, --match resident, another registry.
  kvsift_cache(std::string name, double budget_fraction, cache_options opt)
      : name_(std::move(name)), budget_fraction_(budget_fraction), opt_(std::move(opt)) {
    require(budget_fraction > 0.0 && budget_fraction <= 1.0, "examples::kvsift_cache",
            "budget_fraction", budget_fraction, "in (0, 1]");
    const double keep = opt_.keep_fraction.value_or(budget_fraction);
    require(keep > 0.0 && keep <= 1.0, "examples::kvsift_cache", "keep_fraction", keep,
            "in (0, 1]");
    const auto& reg = opt_.registry ? *opt_.registry : default_method_registry<float>();
    (void)reg.at(name_);  // throws for an unknown name, listing the known ones
    make_ = [this, keep, &reg](const method_config& base) {
      method_config c = base;
      c.roles_file = opt_.roles_file;
      c.options["keep_fraction"] = keep;
      c.budget = budget::tokens_from_keep_fraction(c.prompt_len, budget_fraction_);
      if (opt_.match_resident) {
        if (auto m = reg.for_resident_fraction(name_, c, budget_fraction_)) c = std::move(*m);
      }
      budget_tokens_ = c.budget;
      note_ = c.note;
      return reg.make(name_, c);
    };
  }

  // A custom method: `make(config)` builds it and its store for each sequence (see method_cache).
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
    method_.reset();  // and the store it owns
    method_config c;
    c.shape = {.layers = s.num_layers, .q_heads = s.num_q_heads, .kv_heads = s.num_kv_heads,
               .head_dim = s.head_dim};
    c.requests = 1;
    c.capacity = s.max_len;
    c.prompt_len = s.prompt_len;
    method_ = make_(c);
    require(method_ != nullptr, "examples::kvsift_cache::start", "factory", "null",
            "a method and its store");
    plan_ = nullptr;
    attended_tokens_ = 0;
    full_tokens_ = 0;
    engine_kernel_steps_ = 0;
    prompt_resident_bytes_ = 0;
    const auto st = method_->stats();
    page_size_ = st.pages >= 0 ? st.page_size : 0;
    peak_pages_ = st.pages;
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
    // a paged store takes the chunk's pages before the round frees any: the call's peak is the
    // pages held before it plus ceil(n / page) per KV head (the layer's sequences start empty)
    const std::int64_t before = page_size_ > 0 ? method_->pages() : -1;
    method_->prefill(layer, std::span<const prefill_chunk<float>>(&chunk, 1));
    if (page_size_ > 0) {
      note_pages(before + static_cast<std::int64_t>(kvh) * ((n + page_size_ - 1) / page_size_));
      note_pages(method_->pages());
    }
    if (layer == shape_.num_layers - 1) prompt_resident_bytes_ = method_->resident_bytes();
  }

  void decode(int layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, int position, std::span<float> out) override {
    const auto next = method_->next_position(0, layer);
    require(position == next, "examples::kvsift_cache::decode", "position", position,
            "the layer's next position (" + std::to_string(next) + ")");
    const decode_token<float> tok{.request = 0, .query = q.data(), .key = k.data(),
                                  .value = v.data()};
    const std::span<const decode_token<float>> toks(&tok, 1);
    plan_ = &method_->decode(layer, toks);
    if (page_size_ > 0) note_pages(method_->pages());  // the token appended, none evicted yet
    attended_tokens_ += static_cast<std::int64_t>(plan_->slots.values.size() + plan_->far.values.size());
    full_tokens_ += static_cast<std::int64_t>(position + 1) * shape_.num_kv_heads;
    const auto ms = method_->shape();
    bool contiguous = kernel_ == attention_kernel::engine;
    for (int h = 0; contiguous && h < shape_.num_kv_heads; ++h) {
      contiguous = method_->contiguous_rows(ms.sequence(0, layer, h));  // this step's rows
    }
    if (!contiguous) {
      method_->attend(layer, toks, out.data());
      return;
    }
    ++engine_kernel_steps_;
    const int d = shape_.head_dim;
    views_.resize(static_cast<std::size_t>(shape_.num_kv_heads));
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const auto seq = ms.sequence(0, layer, h);
      const auto slots = plan_->slots[h];
      views_[static_cast<std::size_t>(h)] = {method_->key(seq, 0), method_->value(seq, 0), d,
                                             slots.data(), static_cast<int>(slots.size())};
    }
    attend_decode(q, shape_.num_q_heads, d, views_, out);
  }

  void after_attention(int layer, std::span<const float> q) override {
    const decode_token<float> tok{.request = 0, .query = q.data()};
    method_->after_attention(layer, std::span<const decode_token<float>>(&tok, 1));
  }

  // The decode attention kernel (library by default); applies from the next decode(). The engine
  // kernel indexes rows by slots, so it runs on the steps whose head-sequences have their rows in
  // slot order (a dense store before a round reorders them); other steps use attend().
  void set_attention_kernel(attention_kernel k) { kernel_ = k; }
  [[nodiscard]] attention_kernel kernel() const { return kernel_; }
  // Decode steps (of every layer) the engine kernel attended since the sequence started.
  [[nodiscard]] std::int64_t engine_kernel_steps() const { return engine_kernel_steps_; }

  [[nodiscard]] std::int64_t kept_tokens(int layer, int kv_head) const override {
    return method_ ? method_->length(method_->shape().sequence(0, layer, kv_head)) : 0;
  }

  // The method's name (or a custom method's label).
  [[nodiscard]] const std::string& name() const { return name_; }
  // Budget of the current sequence in tokens per KV head (named methods; 0 for custom ones).
  [[nodiscard]] int budget_tokens() const { return budget_tokens_; }
  [[nodiscard]] double budget_fraction() const { return budget_fraction_; }
  // What a resident-fraction hook set for the current sequence ("B=126", "lag 16, keep 3").
  [[nodiscard]] const std::string& parameter_note() const { return note_; }
  // The current sequence's method, which also reads its store's working set (after start()).
  [[nodiscard]] any_kv_method<float>& method() { return *method_; }
  [[nodiscard]] const any_kv_method<float>& method() const { return *method_; }
  [[nodiscard]] method_stats stats() const { return method_ ? method_->stats() : method_stats{}; }
  // Device-resident KV bytes right after the prompt's last layer was prefilled.
  [[nodiscard]] std::int64_t prompt_resident_bytes() const { return prompt_resident_bytes_; }
  // The plan of the last decode() (valid until the next decode()).
  [[nodiscard]] const attention_plan* last_plan() const { return plan_; }
  // Tokens attention read over all decode steps of the sequence, per KV head summed, and what a
  // full cache would have read (the share of KV a step reads: Quest's saving).
  [[nodiscard]] std::int64_t attended_tokens() const { return attended_tokens_; }
  [[nodiscard]] std::int64_t full_attended_tokens() const { return full_tokens_; }
  // A paged store's most pages held at once since the sequence started (-1: the store is not
  // paged), and its page size (0: not paged).
  [[nodiscard]] std::int64_t peak_pages() const { return peak_pages_; }
  [[nodiscard]] int page_size() const { return page_size_; }

 private:
  std::string name_;
  double budget_fraction_ = 0.0;
  cache_options opt_;
  int budget_tokens_ = 0;
  std::string note_;
  factory make_;
  cache_shape shape_;
  std::unique_ptr<any_kv_method<float>> method_;
  attention_kernel kernel_ = attention_kernel::library;
  std::vector<kv_head_view> views_;
  const attention_plan* plan_ = nullptr;
  std::int64_t attended_tokens_ = 0;
  std::int64_t full_tokens_ = 0;
  std::int64_t engine_kernel_steps_ = 0;
  std::int64_t prompt_resident_bytes_ = 0;
  int page_size_ = 0;
  std::int64_t peak_pages_ = -1;

  void note_pages(std::int64_t pages) { peak_pages_ = std::max(peak_pages_, pages); }
};

// A user's own composition M = kvsift::method<cache_store, ...>: `params(shape)` gives its
// parameters for each sequence (e.g. a budget from shape.prompt_len); the cache builds its store.
template <class M>
class method_cache : public kvsift_cache {
 public:
  using params_fn = std::function<typename M::params(const cache_shape&)>;
  method_cache(std::string label, params_fn params)
      : kvsift_cache(label, [label, params = std::move(params)](const method_config& c) {
          const cache_shape s{.num_layers = c.shape.layers, .num_q_heads = c.shape.q_heads,
                              .num_kv_heads = c.shape.kv_heads, .head_dim = c.shape.head_dim,
                              .prompt_len = c.prompt_len, .max_len = c.capacity};
          auto st = std::make_unique<typename M::store_type>(c.shape, c.requests, c.capacity);
          return std::unique_ptr<any_kv_method<float>>(
              std::make_unique<erased_method<M>>(label, std::move(st), params(s)));
        }) {}
};

}  // namespace kvsift::examples
