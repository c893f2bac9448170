// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/core/kv_memory.hpp>
#include <kvsift/store/basic.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace kvsift::store {

// Paged store: a pool of fixed-size pages shared by all head-sequences; each head-sequence (one
// KV head of one layer of one request) owns a list of pages, so per-head compression really
// returns pages to the pool. Pages are [page_size, d] for keys and for values.
// `page_table(request, layer)` exports the per-KV-head block table in FlashInfer's CSR form: the
// pages of a head-sequence hold its rows [0, row_extent) (its n resident tokens, and between a
// decode step's eviction and the next append one released row: basic.hpp, "Slots and rows"),
// every page full but the last, in row order, which is position order until a retain reorders
// them (`row(seq, slot)` maps a slot to its row; attention over the table is order-free).
// Cost: retain moves only the kept rows past the new length into released rows (none for one
// token evicted per step), then frees every page past the rows in use.
template <Element T, HostAccessible Space = host_space>
class paged : public basic_store<paged<T, Space>, T, Space> {
  using base = basic_store<paged<T, Space>, T, Space>;
  friend base;

 public:
  paged(model_shape shape, int requests, int page_size, int total_pages)
      : paged(shape, requests, page_size, total_pages, nullptr, nullptr) {}

  // Wraps an engine-owned page pool without copying: keys and values
  // [total_pages, page_size, d] each. The store allocates pages of that pool to head-sequences
  // and returns them on compaction; the engine keeps ownership of the memory.
  paged(model_shape shape, int requests, int page_size, int total_pages, T* keys, T* values)
      : base(shape, requests, "store::paged"), page_size_(page_size), total_pages_(total_pages) {
    require(page_size > 0, "store::paged", "page_size", page_size, "> 0");
    if ((page_size & (page_size - 1)) == 0) page_shift_ = std::countr_zero(static_cast<unsigned>(page_size));
    require(total_pages > 0, "store::paged", "total_pages", total_pages, "> 0");
    // slots and capacities are int: the pool's slot count must fit one (checked before allocating)
    require(static_cast<std::int64_t>(total_pages) * page_size <= std::numeric_limits<int>::max(),
            "store::paged", "total_pages", total_pages, [&] {
              return "<= " + std::to_string(std::numeric_limits<int>::max() / page_size) +
                     " pages of " + std::to_string(page_size) + " (slot numbers are int)";
            });
    this->check_size("store::paged",
                     ", page_size " + std::to_string(page_size) + ", total_pages " +
                         std::to_string(total_pages),
                     "key and value pools [total_pages, page_size, head_dim]", total_pages,
                     page_size, shape.head_dim, sizeof(T));
    require((keys == nullptr) == (values == nullptr), "store::paged", "keys/values",
            keys == nullptr ? "null keys" : "null values", "both engine pools or neither");
    const std::size_t n = static_cast<std::size_t>(total_pages) * page_size * shape.head_dim;
    if (keys == nullptr) {
      owned_keys_.resize(n);
      owned_values_.resize(n);
      keys = owned_keys_.data();
      values = owned_values_.data();
    }
    keys_ = keys;
    values_ = values;
    positions_.resize(static_cast<std::size_t>(total_pages) * page_size);
    rows_.resize(positions_.size());
    pages_.resize(static_cast<std::size_t>(this->sequences()));
    free_.reserve(static_cast<std::size_t>(total_pages));
    for (int p = total_pages - 1; p >= 0; --p) free_.push_back(p);
  }

  // A store is a unique owner of (or view into) KV memory: it moves, it does not copy.
  paged(const paged&) = delete;
  paged& operator=(const paged&) = delete;
  paged(paged&&) noexcept = default;
  paged& operator=(paged&&) noexcept = default;

  [[nodiscard]] int page_size() const { return page_size_; }
  [[nodiscard]] int free_pages() const { return static_cast<int>(free_.size()); }
  [[nodiscard]] int used_pages() const { return total_pages_ - free_pages(); }
  // Bytes of the pages in use (keys and values): memory is held, and released, page by page.
  [[nodiscard]] std::int64_t resident_bytes() const {
    return static_cast<std::int64_t>(used_pages()) * page_size_ * 2 * this->shape_.head_dim *
           static_cast<std::int64_t>(sizeof(T));
  }
  [[nodiscard]] int capacity(std::int64_t seq) const {
    return (static_cast<int>(pages_[seq].size()) + free_pages()) * page_size_;
  }
  // Pages the pool must give seq for `tokens` more tokens: the first fills a waiting hole (a
  // one-token eviction's released row) without one. What append() takes, for checks before it.
  [[nodiscard]] int pages_to_append(std::int64_t seq, int tokens) const {
    return pages_to_grow(seq, std::max(this->row_extent(seq), this->length(seq) + tokens));
  }

  // FlashInfer-style CSR block table over the KV heads of (request, layer).
  struct page_table_t {
    std::vector<std::int32_t> indptr;         // [kv_heads + 1]
    std::vector<std::int32_t> indices;        // [indptr.back()] page ids
    std::vector<std::int32_t> last_page_len;  // [kv_heads]
  };
  [[nodiscard]] page_table_t page_table(int request, int layer) const {
    this->check_request_layer("store::paged::page_table", request, layer);
    page_table_t t;
    t.indptr.push_back(0);
    for (int h = 0; h < this->shape_.kv_heads; ++h) {
      const auto seq = this->shape_.sequence(request, layer, h);
      const auto& pl = pages_[seq];
      t.indices.insert(t.indices.end(), pl.begin(), pl.end());
      t.indptr.push_back(static_cast<std::int32_t>(t.indices.size()));
      const int n = this->extent_[seq];  // rows in the pages: a waiting hole's row included
      t.last_page_len.push_back(n == 0 ? 0 : n - (static_cast<int>(pl.size()) - 1) * page_size_);
    }
    return t;
  }
  // Page pool in the paged HND-per-head layout [pages, page_size, d].
  [[nodiscard]] const T* key_pool() const { return keys_; }
  [[nodiscard]] const T* value_pool() const { return values_; }

 private:
  // Index of (seq, slot) in the pool's [total_pages, page_size] rows: a shift and a mask for a
  // power-of-two page size (every lookup of a row's address or position goes through here).
  [[nodiscard]] std::int64_t flat(std::int64_t seq, int slot) const {
    const auto& pl = pages_[seq];
    if (page_shift_ >= 0) [[likely]] {
      return (static_cast<std::int64_t>(pl[static_cast<std::size_t>(slot >> page_shift_)]) << page_shift_) |
             (slot & (page_size_ - 1));
    }
    return static_cast<std::int64_t>(pl[static_cast<std::size_t>(slot / page_size_)]) * page_size_ +
           slot % page_size_;
  }
  // Slots from `slot` on whose entries are adjacent: the rest of slot's page.
  [[nodiscard]] int adjacent_slots(std::int64_t, int slot) const {
    return page_shift_ >= 0 ? page_size_ - (slot & (page_size_ - 1)) : page_size_ - slot % page_size_;
  }
  // The same, on through the pages that follow slot's page in the pool (a prompt's pages are
  // mostly allocated in a row), as far as `limit` slots: one run where adjacent_slots gives one
  // per page. A whole 32K head-sequence's positions or row addresses are then a few long loops
  // instead of 2048 of 16 entries each (basic.hpp's for_each_run).
  [[nodiscard]] int adjacent_run(std::int64_t seq, int slot, int limit) const {
    const auto& pl = pages_[static_cast<std::size_t>(seq)];
    std::size_t p = static_cast<std::size_t>(slot / page_size_);
    int n = adjacent_slots(seq, slot);
    while (n < limit && p + 1 < pl.size() && pl[p + 1] == pl[p] + 1) {
      n += page_size_;
      ++p;
    }
    return n;
  }
  [[nodiscard]] T* key_slot(std::int64_t seq, int slot) const {
    return keys_ + flat(seq, slot) * this->shape_.head_dim;
  }
  [[nodiscard]] T* value_slot(std::int64_t seq, int slot) const {
    return values_ + flat(seq, slot) * this->shape_.head_dim;
  }
  [[nodiscard]] std::int32_t* position_slot(std::int64_t seq, int slot) const {
    return const_cast<std::int32_t*>(positions_.data()) + flat(seq, slot);
  }
  // The row map and the positions are per slot: slot i's entries at the address of row i.
  [[nodiscard]] std::int32_t* row_slot(std::int64_t seq, int slot) const {
    return const_cast<std::int32_t*>(rows_.data()) + flat(seq, slot);
  }
  [[nodiscard]] static int pages_for(int n, int ps) { return (n + ps - 1) / ps; }
  [[nodiscard]] int pages_to_grow(std::int64_t seq, int new_length) const {
    return std::max(0, pages_for(new_length, page_size_) - static_cast<int>(pages_[seq].size()));
  }
  [[nodiscard]] bool can_grow(std::int64_t seq, int new_length) const {
    return pages_for(new_length, page_size_) - static_cast<int>(pages_[seq].size()) <= free_pages();
  }
  void grow(std::int64_t seq, int new_length) {
    while (static_cast<int>(pages_[seq].size()) < pages_for(new_length, page_size_)) {
      pages_[seq].push_back(free_.back());
      free_.pop_back();
    }
  }
  void shrink(std::int64_t seq, int new_length) {
    while (static_cast<int>(pages_[seq].size()) > pages_for(new_length, page_size_)) {
      free_.push_back(pages_[seq].back());
      pages_[seq].pop_back();
    }
  }

  int page_size_ = 0;
  int page_shift_ = -1;  // log2(page_size_) when it is a power of two
  int total_pages_ = 0;
  T* keys_ = nullptr;                               // [total_pages, page_size, d] (owned or the engine's)
  T* values_ = nullptr;
  kv_vector<T> owned_keys_, owned_values_;  // huge-page advised (core/kv_memory.hpp)
  std::vector<std::int32_t> positions_;             // [total_pages, page_size] per slot
  std::vector<std::int32_t> rows_;                  // [total_pages, page_size] row of each slot
  std::vector<std::vector<std::int32_t>> pages_;    // per head-sequence: its pages, in order
  std::vector<std::int32_t> free_;                  // free page ids (stack)
};

static_assert(KvStore<paged<float>>);
static_assert(KvStore<paged<bfloat16>>);

}  // namespace kvsift::store
