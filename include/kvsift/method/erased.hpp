// SPDX-License-Identifier: Apache-2.0
#pragma once

// The erased lifecycle of a method, for choosing one at run time (method/any_method.hpp):
//
//   any_kv_method<T>   the erased lifecycle of ANY method over element type T, whatever its store
//                      (store::dense, store::paged, store::tiered): prefill, decode, attend,
//                      after_attention, reset, stats, caps, plus read access to the working set
//                      attention reads. An engine holds one of these.
//   any_method<Store>  the same for a method over a caller-owned Store, with store() access.
//   erased_method<M>   the one implementation: any composition M behind those interfaces.

#include <kvsift/concepts.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/store/dense.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvsift {

// The erased lifecycle of a method over element type T; it owns or references its store.
template <Element T>
class any_kv_method {
 public:
  using element_type = T;
  virtual ~any_kv_method() = default;
  virtual void prefill(int layer, std::span<const prefill_chunk<T>> chunks) = 0;
  virtual const attention_plan& decode(int layer, std::span<const decode_token<T>> tokens) = 0;
  virtual void attend(int layer, std::span<const decode_token<T>> tokens, float* out) const = 0;
  virtual void after_attention(int layer, std::span<const decode_token<T>> tokens) = 0;
  virtual void reset(int request) = 0;
  [[nodiscard]] virtual method_stats stats() const = 0;
  // Pages a paged store holds now (stats().pages without building the rest of method_stats:
  // nothing allocated, so an engine may ask every step); -1 when the store is not paged.
  [[nodiscard]] virtual std::int64_t pages() const { return stats().pages; }
  [[nodiscard]] virtual capabilities caps() const = 0;
  [[nodiscard]] virtual const std::string& name() const = 0;
  // The working set attention reads (the store's KvStore view): shape, per head-sequence length,
  // the row of a slot and its original position, the next position of (request, layer).
  [[nodiscard]] virtual model_shape shape() const = 0;
  [[nodiscard]] virtual int length(std::int64_t seq) const = 0;
  [[nodiscard]] virtual std::int32_t position(std::int64_t seq, int slot) const = 0;
  [[nodiscard]] virtual const T* key(std::int64_t seq, int slot) const = 0;
  [[nodiscard]] virtual const T* value(std::int64_t seq, int slot) const = 0;
  [[nodiscard]] virtual std::int32_t next_position(int request, int layer) const = 0;
  [[nodiscard]] virtual std::int64_t resident_bytes() const = 0;
  // True while head-sequence seq's slot j is at key(seq, 0) + j * head_dim for every resident j
  // (a store::dense whose rows are in slot order): a kernel may then index its rows by the plan's
  // slots directly. It changes with the method's rounds (a one-token eviction that leaves a hole,
  // a round that fills holes out of order: store/basic.hpp, "Slots and rows"), so ask per step,
  // after decode(); otherwise read each slot through key(seq, slot) and value(seq, slot).
  [[nodiscard]] virtual bool contiguous_rows(std::int64_t seq) const = 0;
};

// any_kv_method over a Store the caller can reach.
template <KvStore Store>
class any_method : public any_kv_method<typename Store::element_type> {
 public:
  [[nodiscard]] virtual Store& store() = 0;
  [[nodiscard]] virtual const Store& store() const = 0;
};

// any_method over a concrete method M (a kvsift::method composition, or any class with the same
// lifecycle and a `store_type`), over a caller-owned store or one it owns (built before M).
template <class M>
class erased_method final : public any_method<typename M::store_type> {
 public:
  using T = typename M::element_type;
  using Store = typename M::store_type;
  erased_method(std::string name, Store& store, typename M::params p)
      : name_(std::move(name)), store_(&store), m_(*store_, std::move(p)) {}
  erased_method(std::string name, std::unique_ptr<Store> owned, typename M::params p)
      : name_(std::move(name)), owned_(std::move(owned)), store_(owned_.get()),
        m_(*store_, std::move(p)) {}
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
  [[nodiscard]] std::int64_t pages() const override {
    if constexpr (requires { store_->used_pages(); }) {
      return store_->used_pages();
    } else {
      return -1;
    }
  }
  [[nodiscard]] capabilities caps() const override { return M::caps; }
  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] model_shape shape() const override { return store_->shape(); }
  [[nodiscard]] int length(std::int64_t seq) const override { return store_->length(seq); }
  [[nodiscard]] std::int32_t position(std::int64_t seq, int slot) const override {
    return store_->position(seq, slot);
  }
  [[nodiscard]] const T* key(std::int64_t seq, int slot) const override {
    return store_->key(seq, slot);
  }
  [[nodiscard]] const T* value(std::int64_t seq, int slot) const override {
    return store_->value(seq, slot);
  }
  [[nodiscard]] std::int32_t next_position(int request, int layer) const override {
    return store_->next_position(request, layer);
  }
  [[nodiscard]] std::int64_t resident_bytes() const override { return store_->resident_bytes(); }
  [[nodiscard]] bool contiguous_rows(std::int64_t seq) const override {
    if constexpr (std::is_same_v<Store, store::dense<T, typename Store::memory_space>>) {
      return store_->rows_in_slot_order(seq);
    } else {
      return false;
    }
  }
  [[nodiscard]] Store& store() override { return *store_; }
  [[nodiscard]] const Store& store() const override { return *store_; }
  [[nodiscard]] M& get() { return m_; }

 private:
  std::string name_;
  std::unique_ptr<Store> owned_;  // null when the caller owns the store
  Store* store_;
  M m_;
};
}  // namespace kvsift
