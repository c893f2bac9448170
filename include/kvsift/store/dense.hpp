// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/core/kv_memory.hpp>
#include <kvsift/store/basic.hpp>

#include <string>
#include <vector>

namespace kvsift::store {

// Dense store: every head-sequence owns `capacity` contiguous slots, laid out
// [requests, layers, kv_heads, capacity, d] (HND per layer). It owns its memory, or wraps an
// engine's: `dense(shape, requests, capacity, keys, values)` uses caller memory of that shape
// without copying. The resident tokens of a head-sequence are its rows [0, n) (and a released row
// among them that the next append fills: basic.hpp, "Slots and rows"); released rows are free for
// later appends. Cost: append writes one row per token; retain moves only the kept rows past the
// new length, none for one token evicted per decode step.
template <Element T, HostAccessible Space = host_space>
class dense : public basic_store<dense<T, Space>, T, Space> {
  using base = basic_store<dense<T, Space>, T, Space>;
  friend base;

 public:
  dense(model_shape shape, int requests, int capacity)
      : base(shape, requests, "store::dense"), capacity_(check_capacity(capacity)) {
    check_pool_size();
    const std::size_t n = static_cast<std::size_t>(this->sequences()) * capacity_ * shape.head_dim;
    owned_keys_.resize(n);
    owned_values_.resize(n);
    keys_ = owned_keys_.data();
    values_ = owned_values_.data();
    positions_.resize(static_cast<std::size_t>(this->sequences()) * capacity_);
    rows_.resize(positions_.size());
  }

  // Wraps engine-owned memory: keys and values [requests * layers * kv_heads, capacity, d].
  dense(model_shape shape, int requests, int capacity, T* keys, T* values)
      : base(shape, requests, "store::dense"), capacity_(check_capacity(capacity)) {
    require(keys != nullptr, "store::dense", "keys", "null", "engine key memory");
    require(values != nullptr, "store::dense", "values", "null", "engine value memory");
    check_pool_size();  // the engine's arrays have this size: slot addresses must not overflow
    keys_ = keys;
    values_ = values;
    positions_.resize(static_cast<std::size_t>(this->sequences()) * capacity_);
    rows_.resize(positions_.size());
  }

  // A store is a unique owner of (or view into) KV memory: it moves, it does not copy.
  dense(const dense&) = delete;
  dense& operator=(const dense&) = delete;
  dense(dense&&) noexcept = default;
  dense& operator=(dense&&) noexcept = default;

  [[nodiscard]] int capacity(std::int64_t = 0) const { return capacity_; }

 private:
  static int check_capacity(int capacity) {
    require(capacity > 0, "store::dense", "capacity", capacity, "> 0");
    return capacity;
  }
  void check_pool_size() const {
    this->check_size("store::dense", ", capacity " + std::to_string(capacity_),
                     "keys and values [requests x layers x kv_heads, capacity, head_dim]",
                     this->sequences(), capacity_, this->shape_.head_dim, sizeof(T));
    this->check_size("store::dense", ", capacity " + std::to_string(capacity_),
                     "positions [requests x layers x kv_heads, capacity]", this->sequences(),
                     capacity_, sizeof(std::int32_t));
  }
  // Index of (seq, slot) in the [sequences, capacity] arrays (rows: times head_dim).
  [[nodiscard]] std::int64_t flat(std::int64_t seq, int slot) const { return seq * capacity_ + slot; }
  [[nodiscard]] T* key_slot(std::int64_t seq, int slot) const {
    return keys_ + (seq * capacity_ + slot) * this->shape_.head_dim;
  }
  [[nodiscard]] T* value_slot(std::int64_t seq, int slot) const {
    return values_ + (seq * capacity_ + slot) * this->shape_.head_dim;
  }
  [[nodiscard]] std::int32_t* position_slot(std::int64_t seq, int slot) const {
    return const_cast<std::int32_t*>(positions_.data()) + seq * capacity_ + slot;
  }
  [[nodiscard]] std::int32_t* row_slot(std::int64_t seq, int slot) const {
    return const_cast<std::int32_t*>(rows_.data()) + seq * capacity_ + slot;
  }
  // Slots from `slot` on whose entries are adjacent: the rest of the head-sequence's capacity.
  [[nodiscard]] int adjacent_slots(std::int64_t, int slot) const { return capacity_ - slot; }
  [[nodiscard]] bool can_grow(std::int64_t, int new_length) const { return new_length <= capacity_; }
  void grow(std::int64_t, int) {}
  void shrink(std::int64_t, int) {}

  int capacity_ = 0;
  T* keys_ = nullptr;
  T* values_ = nullptr;
  kv_vector<T> owned_keys_, owned_values_;  // huge-page advised (core/kv_memory.hpp)
  std::vector<std::int32_t> positions_;  // [sequences, capacity] original positions, per slot
  std::vector<std::int32_t> rows_;       // [sequences, capacity] the row of each slot
};

static_assert(KvStore<dense<float>>);
static_assert(KvStore<dense<half>>);
static_assert(KvStore<dense<bfloat16>>);

}  // namespace kvsift::store
