// SPDX-License-Identifier: Apache-2.0
#pragma once

// Choosing a method by name at run time (a CLI flag, an engine config): a type-erased handle
// over any composition, and a factory for the named methods with their paper defaults.
// The compositions themselves stay compile-time; only this thin layer is virtual.

#include <kvsift/method/baselines.hpp>
#include <kvsift/method/dynamickv.hpp>
#include <kvsift/method/lagkv.hpp>
#include <kvsift/method/method.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift {

template <KvStore Store>
class any_method {
 public:
  using element_type = typename Store::element_type;
  virtual ~any_method() = default;
  virtual void prefill(int layer, std::span<const prefill_chunk<element_type>> chunks) = 0;
  virtual const attention_plan& decode(int layer,
                                       std::span<const decode_token<element_type>> tokens) = 0;
  virtual void attend(int layer, std::span<const decode_token<element_type>> tokens,
                      float* out) const = 0;
  virtual void after_attention(int layer, std::span<const decode_token<element_type>> tokens) = 0;
  virtual void reset(int request) = 0;
  [[nodiscard]] virtual method_stats stats() const = 0;
  [[nodiscard]] virtual capabilities caps() const = 0;
  [[nodiscard]] virtual const std::string& name() const = 0;
};

// any_method over a concrete composition M.
template <class M>
class erased_method final : public any_method<typename M::store_type> {
 public:
  using T = typename M::element_type;
  erased_method(std::string name, typename M::store_type& store, typename M::params p)
      : name_(std::move(name)), m_(store, p) {}
  void prefill(int layer, std::span<const prefill_chunk<T>> chunks) override {
    m_.prefill(layer, chunks);
  }
  const attention_plan& decode(int layer, std::span<const decode_token<T>> tokens) override {
    return m_.decode(layer, tokens);
  }
  void attend(int layer, std::span<const decode_token<T>> tokens, float* out) const override {
    m_.attend(layer, tokens, out);
  }
  void after_attention(int layer, std::span<const decode_token<T>> tokens) override {
    m_.after_attention(layer, tokens);
  }
  void reset(int request) override { m_.reset(request); }
  [[nodiscard]] method_stats stats() const override { return m_.stats(); }
  [[nodiscard]] capabilities caps() const override { return M::caps; }
  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] M& get() { return m_; }

 private:
  std::string name_;
  M m_;
};

// The names make_method knows, in the order tables list them.
inline std::vector<std::string> method_names() {
  return {"full_kv", "streaming_llm", "h2o", "snapkv", "pyramidkv", "quest", "lagkv", "dynamickv"};
}

// The named method `name` with its paper defaults for a budget of `budget` tokens per
// head-sequence. LagKV has no token budget: it keeps a fraction of each lag partition, taken
// from `keep_fraction` (default: its paper's 0.5). Throws kvsift::error for an unknown name or an
// invalid budget.
template <KvStore Store>
std::unique_ptr<any_method<Store>> make_method(std::string_view name, Store& store, int budget,
                                               double keep_fraction = 0.5) {
  const auto make = [&]<class M>(typename M::params p) -> std::unique_ptr<any_method<Store>> {
    return std::make_unique<erased_method<M>>(std::string(name), store, p);
  };
  if (name == "full_kv") return make.template operator()<full_kv<Store>>(full_kv_params<Store>());
  require(budget > 0, "make_method", "budget", budget, "> 0 tokens");
  if (name == "streaming_llm") {
    return make.template operator()<streaming_llm<Store>>(streaming_llm_params<Store>(budget));
  }
  if (name == "h2o") return make.template operator()<h2o<Store>>(h2o_params<Store>(budget));
  if (name == "snapkv") return make.template operator()<snapkv<Store>>(snapkv_params<Store>(budget));
  if (name == "pyramidkv") {
    return make.template operator()<pyramidkv<Store>>(pyramidkv_params<Store>(budget));
  }
  if (name == "quest") return make.template operator()<quest<Store>>(quest_params<Store>(budget));
  if (name == "lagkv") {
    return make.template operator()<lagkv<Store>>(lagkv_params<Store>(16, 128, keep_fraction));
  }
  if (name == "dynamickv") {
    return make.template operator()<dynamickv<Store>>(dynamickv_params<Store>(budget));
  }
  std::string known;
  for (const auto& n : method_names()) known += (known.empty() ? "" : ", ") + n;
  throw make_error("make_method", "name", name, "one of " + known);
}

}  // namespace kvsift
