// SPDX-License-Identifier: Apache-2.0
#pragma once

// What every CPU store shares: validation, append, retain (in-place compaction) and gather,
// written once over the derived store's row addressing (CRTP). A derived store provides
//   T* key_slot(seq, row), T* value_slot(seq, row), std::int32_t* position_slot(seq, i),
//   std::int32_t* row_slot(seq, i), int adjacent_slots(seq, i) (how many slots from i on have
//   adjacent position and row-map entries: to the end of i's page), bool can_grow(seq, new_length) const,
//   void grow(seq, new_length), void shrink(seq, new_length); optionally int adjacent_run(seq, i,
//   limit) (the same on through the pages that follow in memory, as far as limit: for_each_run's
//   runs then span them).
//
// Slots and rows. A head-sequence of n resident tokens occupies the physical rows [0, n) of its
// memory, or [0, n + 1) with one released row among them that the next append fills (the waiting
// hole: "leave the hole", below): row_extent(seq). Its slots are the same tokens in position order:
// slot i is row row(seq, i) (the row map, one int32 per token, kept beside the positions, written
// and read only once the rows are out of order: a store that never reorders pays nothing). Positions
// are kept by slot, not by row: slot i's position is entry i, so a plan's positions over consecutive
// slots (a whole-cache plan: StreamingLLM's, H2O's) are a copy of adjacent entries, page by page,
// whatever rows hold the tokens, and a retain compacts them as it compacts the row map. Scorers,
// selectors and plans speak slots; only an export to an engine's kernel speaks rows. Attention is
// order-free over keys, so rows need no order. retain picks the cheapest of three ways to close
// the gaps the released tokens leave:
//   compact     shift the kept rows down in order (slot i stays row i): chosen while the rows
//               are in slot order and it moves at most four times the rows of the other way;
//   fill holes  move only the kept rows past the new length into the lowest released rows and
//               rewrite the row numbers;
//   leave the hole  when exactly one token is released and no hole waits already (a decode
//               step's eviction: StreamingLLM, H2O), nothing moves: the released row waits as
//               the head-sequence's hole, and the next append writes its first token there.
// rows_in_slot_order(seq) says whether slot i is row i (a hole waits in order only at the end).

#include <kvsift/concepts.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace kvsift::store {

template <class Derived, Element T, HostAccessible Space>
class basic_store {
 public:
  using kvsift_role = store_tag;
  using element_type = T;
  using memory_space = Space;

  [[nodiscard]] const model_shape& shape() const { return shape_; }
  [[nodiscard]] int requests() const { return requests_; }
  [[nodiscard]] int length(std::int64_t seq) const { return length_[seq]; }
  [[nodiscard]] int length(int request, int layer, int head) const {
    return length_[shape_.sequence(request, layer, head)];
  }
  [[nodiscard]] std::int32_t position(std::int64_t seq, int slot) const {
    return *self().position_slot(seq, slot);
  }
  [[nodiscard]] const T* key(std::int64_t seq, int slot) const {
    return self().key_slot(seq, row(seq, slot));
  }
  [[nodiscard]] const T* value(std::int64_t seq, int slot) const {
    return self().value_slot(seq, row(seq, slot));
  }
  // key(seq, slots[i]) and value(seq, slots[i]) for every i, for kernels that read many rows (the
  // decode attention's address table): inline, one index computation per row when rows are in
  // slot order and two (the row map's, the row's) when not — the row map's once per page when the
  // slots are consecutive — where key() and value() each repeat them (out of order through an
  // out-of-line call). Slots must be resident (unchecked).
  void row_addresses(std::int64_t seq, std::span<const std::int32_t> slots, const T** keys,
                     const T** values) const {
    const Derived& d = self();
    const std::size_t dim = static_cast<std::size_t>(shape_.head_dim);
    const bool ordered = ordered_[seq] != 0;
    const std::size_t m = slots.size();
    // consecutive slots (a whole-cache plan: full KV's, StreamingLLM's, H2O's): piece by piece of
    // consecutive rows (for_each_piece: in row order a run, across the pages that follow each
    // other in a paged pool), not through a page lookup per slot
    if (consecutive(slots)) {
      const int first = slots[0];
      for_each_piece(seq, first, first + static_cast<int>(m), [&](int slot, std::int64_t f0, int count) {
        const auto i = static_cast<std::size_t>(slot - first);
        const T* k = d.keys_ + static_cast<std::size_t>(f0) * dim;
        const T* v = d.values_ + static_cast<std::size_t>(f0) * dim;
        for (int t = 0; t < count; ++t) {
          keys[i + t] = k + static_cast<std::size_t>(t) * dim;
          values[i + t] = v + static_cast<std::size_t>(t) * dim;
        }
      });
      return;
    }
    for (std::size_t i = 0; i < m; ++i) {
      const int r = ordered ? slots[i] : d.rows_[static_cast<std::size_t>(d.flat(seq, slots[i]))];
      const auto f = static_cast<std::size_t>(d.flat(seq, r));
      keys[i] = d.keys_ + f * dim;
      values[i] = d.values_ + f * dim;
    }
  }
  // position(seq, slots[i]) for every i (a plan's positions), and position(seq, j) for j in
  // [0, n) converted to V (a recency score): inline, one index computation per slot, and over
  // consecutive slots a copy of adjacent entries, page by page.
  void positions_of(std::int64_t seq, std::span<const std::int32_t> slots, std::int32_t* out) const {
    if (consecutive(slots)) {  // a whole-cache plan: run by run, as positions_prefix
      positions_range(seq, slots.front(), slots.front() + static_cast<int>(slots.size()), out);
      return;
    }
    gather_positions(seq, slots.size(), [slots](std::size_t i) { return slots[i]; }, out);
  }
  template <class V>
  void positions_prefix(std::int64_t seq, int n, V* out) const {
    positions_range(seq, 0, n, out);
  }
  // Writable key row, for in-place key transforms such as RoPE re-rotation (core/rope.hpp).
  [[nodiscard]] T* mutable_key(std::int64_t seq, int slot) {
    return self().key_slot(seq, row(seq, slot));
  }
  // The physical row (in [0, row_extent(seq))) that holds slot `slot`: what an export to an
  // engine's kernel addresses (store/flashinfer.hpp).
  [[nodiscard]] int row(std::int64_t seq, int slot) const {
    if (ordered_[seq]) [[likely]] return slot;  // in order: no map to read
    return mapped_row(seq, slot);
  }
  // Whether slot i is row i for every resident token of seq (true until a retain fills holes
  // out of order; a page plan over the store's own pages needs it).
  [[nodiscard]] bool rows_in_slot_order(std::int64_t seq) const { return ordered_[seq] != 0; }
  // Rows [0, row_extent(seq)) are the head-sequence's memory in use: its length(seq) resident
  // tokens and, after a retain that left one (basic.hpp, "Slots and rows"), one released row the
  // next append fills. An export of a store's pages covers this many rows.
  [[nodiscard]] int row_extent(std::int64_t seq) const { return extent_[seq]; }
  // Position one past the newest token ever appended to a request's layer (0 after construction
  // or reset). It survives compaction: a retain that releases the newest tokens (StreamingLLM with
  // budget = sink) does not move it back.
  [[nodiscard]] std::int32_t next_position(int request, int layer) const {
    return next_[static_cast<std::size_t>(request) * shape_.layers + layer];
  }

  [[nodiscard]] std::int64_t resident_tokens() const {
    std::int64_t t = 0;
    for (int n : length_) t += n;
    return t;
  }
  // Key and value bytes resident in this store's memory space.
  [[nodiscard]] std::int64_t resident_bytes() const {
    return resident_tokens() * 2 * shape_.head_dim * static_cast<std::int64_t>(sizeof(T));
  }

  // Appends `k`, `v` ([tokens, kv_heads, d] in any dense layout) to every KV head of
  // (request, layer), at original positions first_position, first_position + 1, ...
  // Throws kvsift::error (and changes nothing) on a shape mismatch, a position that does not
  // follow the newest resident one, or a full head-sequence.
  template <class L>
  void append(int request, int layer, kv_view<const T, L, Space> k, kv_view<const T, L, Space> v,
              std::int32_t first_position) {
    constexpr std::string_view where = "store.append";
    check_request_layer(where, request, layer);
    validate_kv_pair(where, k, v, shape_.kv_heads, shape_.head_dim);
    const std::int32_t next = next_position(request, layer);
    require(first_position >= next, where, "first_position", first_position, [&] {
      return ">= " + std::to_string(next) + " (positions ascend within a head-sequence)";
    });
    require_positions_fit(where, "first_position", first_position, k.tokens);
    for (int h = 0; h < shape_.kv_heads; ++h) {
      const auto seq = shape_.sequence(request, layer, h);
      require(self().can_grow(seq, grown_extent(seq, k.tokens)), where, "k.tokens", k.tokens, [&] {
        return "room in head-sequence (request " + std::to_string(request) + ", layer " +
               std::to_string(layer) + ", head " + std::to_string(h) + "): " +
               std::to_string(length_[seq]) + " resident of capacity " +
               std::to_string(self().capacity(seq));
      });
    }
    if constexpr (requires(const Derived& d) { d.pages_to_grow(std::int64_t{}, 0); }) {
      // a shared pool must hold the new pages of every KV head together, not just each alone
      int need = 0;
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const auto seq = shape_.sequence(request, layer, h);
        need += self().pages_to_grow(seq, grown_extent(seq, k.tokens));
      }
      require(need <= self().free_pages(), where, "k.tokens", k.tokens, [&] {
        return "room in the page pool: " + std::to_string(need) +
               " pages needed for all KV heads, " + std::to_string(self().free_pages()) + " free";
      });
    }
    const std::size_t row_bytes = static_cast<std::size_t>(shape_.head_dim) * sizeof(T);
    for (int h = 0; h < shape_.kv_heads; ++h) {
      const auto seq = shape_.sequence(request, layer, h);
      const int base = length_[seq];
      const int extent = extent_[seq];
      const bool hole = extent > base;  // the first token takes the released row (no move)
      self().grow(seq, grown_extent(seq, k.tokens));
      for (int t = 0; t < k.tokens; ++t) {
        // rows [0, extent) are taken but the hole: the next free row is extent
        const int r = hole ? (t == 0 ? hole_[seq] : extent + t - 1) : base + t;
        std::memcpy(self().key_slot(seq, r), k.row(t, h), row_bytes);
        std::memcpy(self().value_slot(seq, r), v.row(t, h), row_bytes);
        *self().position_slot(seq, base + t) = first_position + t;
        if (!ordered_[seq]) *self().row_slot(seq, base + t) = r;  // read only once out of order
      }
      length_[seq] = base + k.tokens;
      extent_[seq] = grown_extent(seq, 0);
    }
    next_[static_cast<std::size_t>(request) * shape_.layers + layer] = first_position + k.tokens;
  }

  // Keeps, for each KV head h of (request, layer), exactly the slots kept[h] (ascending) and
  // releases the others. Original positions travel with the kept tokens; kept slot i becomes
  // slot i. Rows: one released token leaves its row as the hole the next append fills, and
  // nothing moves; otherwise a kept token keeps its row unless that row is past the new length,
  // in which case it moves into the lowest row a released token left free.
  void retain(int request, int layer, const index_sets& kept) {
    constexpr std::string_view where = "store.retain";
    check_request_layer(where, request, layer);
    require(kept.segments() == shape_.kv_heads, where, "kept.segments", kept.segments(),
            [&] { return "one segment per KV head (" + std::to_string(shape_.kv_heads) + ")"; });
    validate_index_sets(
        kept, [&](int h) { return length_[shape_.sequence(request, layer, h)]; }, where, "kept");
    const std::size_t row_bytes = static_cast<std::size_t>(shape_.head_dim) * sizeof(T);
    // scratch per thread (stores of different requests may be compacted concurrently; nothing is
    // allocated once warm)
    thread_local std::vector<std::int32_t> kept_rows;  // the kept slots' rows, in slot order
    thread_local std::vector<unsigned char> taken;     // rows below the new length in use
    for (int h = 0; h < shape_.kv_heads; ++h) {
      const auto seq = shape_.sequence(request, layer, h);
      const auto slots = kept[h];
      const int n = length_[seq];
      const int m = static_cast<int>(slots.size());
      if (m == n) continue;  // ascending and unique: every slot is kept, nothing moves
      if (m + 1 == n && extent_[seq] == n) {
        leave_hole(seq, slots);  // one token released (a decode step's eviction): nothing moves
        continue;
      }
      // Rows still in slot order, and keeping that order (a compaction) moves at most four times
      // the rows filling holes would: compact, so a prompt's compression or a LagKV round leaves
      // logical pages equal to store pages and rows in address order. Otherwise fill holes (one
      // row per token a sliding window releases).
      if (ordered_[seq]) {
        int shifted = 0, past = 0;
        for (int i = 0; i < m; ++i) {
          shifted += slots[i] != i ? 1 : 0;
          past += slots[i] >= m ? 1 : 0;
        }
        if (shifted <= 4 * past) {
          for (int i = 0; i < m; ++i) {
            if (slots[i] != i) move_row(seq, slots[i], i, row_bytes);  // ascending: from > to
          }
          keep_positions(seq, slots);
          length_[seq] = m;
          extent_[seq] = m;
          self().shrink(seq, m);
          continue;
        }
      }
      // read every kept slot's row before any map entry is overwritten
      kept_rows.resize(static_cast<std::size_t>(m));
      taken.assign(static_cast<std::size_t>(m), 0);
      for (int i = 0; i < m; ++i) {
        const int r = row(seq, slots[i]);
        kept_rows[i] = r;
        if (r < m) taken[r] = 1;
      }
      int hole = 0;  // the lowest row below m that no kept token holds
      bool in_order = true;
      for (int i = 0; i < m; ++i) {
        if (kept_rows[i] >= m) {
          while (taken[hole]) ++hole;
          move_row(seq, kept_rows[i], hole, row_bytes);
          kept_rows[i] = hole;
          taken[hole] = 1;
        }
        *self().row_slot(seq, i) = kept_rows[i];
        in_order = in_order && kept_rows[i] == i;
      }
      keep_positions(seq, slots);
      ordered_[seq] = in_order ? 1 : 0;
      length_[seq] = m;
      extent_[seq] = m;
      self().shrink(seq, m);
    }
  }

  // Drops every token of a request (its slot in a continuous batch becomes free).
  void reset(int request) {
    require(request >= 0 && request < requests_, "store.reset", "request", request,
            [&] { return "in [0, " + std::to_string(requests_) + ")"; });
    for (int l = 0; l < shape_.layers; ++l) {
      next_[static_cast<std::size_t>(request) * shape_.layers + l] = 0;
      for (int h = 0; h < shape_.kv_heads; ++h) {
        const auto seq = shape_.sequence(request, l, h);
        length_[seq] = 0;
        extent_[seq] = 0;
        ordered_[seq] = 1;
        self().shrink(seq, 0);
      }
    }
  }

  // Copies the listed slots of one head-sequence into contiguous [slots.size(), d] arrays.
  void gather(std::int64_t seq, std::span<const std::int32_t> slots, T* keys_out, T* values_out,
              std::int32_t* positions_out = nullptr) const {
    const std::size_t row_bytes = static_cast<std::size_t>(shape_.head_dim) * sizeof(T);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      std::memcpy(keys_out + i * shape_.head_dim, key(seq, slots[i]), row_bytes);
      std::memcpy(values_out + i * shape_.head_dim, value(seq, slots[i]), row_bytes);
      if (positions_out != nullptr) positions_out[i] = position(seq, slots[i]);
    }
  }

  void check_request_layer(std::string_view where, int request, int layer) const {
    require(request >= 0 && request < requests_, where, "request", request,
            [&] { return "in [0, " + std::to_string(requests_) + ")"; });
    require(layer >= 0 && layer < shape_.layers, where, "layer", layer,
            [&] { return "in [0, " + std::to_string(shape_.layers) + ")"; });
  }

 protected:
  basic_store(model_shape shape, int requests, std::string_view where)
      : shape_(shape), requests_(requests) {
    shape_.validate(where);
    require(requests > 0, where, "requests", requests, "> 0");
    check_size(where, "", "[requests x layers x kv_heads] head-sequence lengths", requests,
               shape_.layers, shape_.kv_heads, sizeof(int));
    length_.assign(static_cast<std::size_t>(requests) * shape_.sequences_per_request(), 0);
    extent_.assign(length_.size(), 0);
    hole_.assign(length_.size(), 0);
    ordered_.assign(length_.size(), 1);
    next_.assign(static_cast<std::size_t>(requests) * shape_.layers, 0);
  }
  [[nodiscard]] std::int64_t sequences() const { return static_cast<std::int64_t>(length_.size()); }
  // Throws kvsift::error naming the shape (and `extra`, the derived store's sizes: ", capacity
  // 64") unless `factors` (sizeof(T) among them) multiply to one array's bytes without overflow:
  // a wrapped product would build a store too small for its shape. `array` names the array.
  template <std::integral... N>
  void check_size(std::string_view where, std::string_view extra, std::string_view array,
                  N... factors) const {
    if (checked_product(max_allocation_bytes, factors...)) return;
    throw make_error(where, "shape",
                     "requests " + std::to_string(requests_) + ", layers " +
                         std::to_string(shape_.layers) + ", kv_heads " +
                         std::to_string(shape_.kv_heads) + ", head_dim " +
                         std::to_string(shape_.head_dim) + std::string(extra),
                     std::string(array) + " of at most " + std::to_string(max_allocation_bytes) +
                         " bytes (the size overflows)");
  }

  model_shape shape_;
  int requests_ = 0;
  std::vector<int> length_;  // [requests * layers * kv_heads] resident tokens per head-sequence
  std::vector<int> extent_;  // [sequences] rows in use: length_, plus 1 while a hole waits
  std::vector<int> hole_;    // [sequences] the waiting hole's row (read while extent_ > length_)
  std::vector<std::int32_t> next_;  // [requests * layers] position after the newest appended token
  std::vector<std::uint16_t> ordered_;  // [sequences] slot i is row i for every resident token (not a char type: a char may alias every store, so a char flag is reloaded in every loop that writes)

 private:
  // retain's one-token case (n = m + 1 rows in use, slots ascending): the released slot's row
  // becomes the waiting hole and the later slots' map entries shift down one; no row is copied.
  // Slot i stays row i when the released slot is the newest and the rows were in order.
  void leave_hole(std::int64_t seq, std::span<const std::int32_t> slots) {
    const int m = static_cast<int>(slots.size());
    int k = 0;  // the released slot: the first one missing
    while (k < m && slots[k] == k) ++k;
    hole_[seq] = row(seq, k);
    if (ordered_[seq] && k < m) {
      for_each_run(seq, 0, m, [&](int i, int run) {
        std::int32_t* entry = self().row_slot(seq, i);
        for (int j = 0; j < run; ++j) entry[j] = i + j < k ? i + j : i + j + 1;
      });
      ordered_[seq] = 0;
    } else if (!ordered_[seq]) {
      shift_down(seq, k, m, [&](int i) { return self().row_slot(seq, i); });
    }
    shift_down(seq, k, m, [&](int i) { return self().position_slot(seq, i); });
    length_[seq] = m;
    extent_[seq] = m + 1;
  }
  // Entries k .. m - 1 of a per-slot array (entry(i): slot i's, the row map's or the positions')
  // take entries k + 1 .. m, run by run of adjacent entries (a page's): within a run one memmove,
  // and its last entry the next run's first (read before that run is touched; entry m, the
  // released slot's old last, is still in the store's memory).
  template <class Entry>
  void shift_down(std::int64_t seq, int k, int m, Entry entry) {
    for_each_run(seq, k, m, [&](int i, int run) {
      std::int32_t* e = entry(i);
      std::memmove(e, e + 1, static_cast<std::size_t>(run - 1) * sizeof(std::int32_t));
      e[run - 1] = *entry(i + run);
    });
  }
  // f(i, run) for runs that cover slots [first, last) in order, each run the slots from i whose
  // per-slot entries (the row map's, the positions') lie side by side in memory: a page's and the
  // pages that follow it in the pool (adjacent_run), or a dense store's whole head-sequence
  // (adjacent_slots).
  template <class F>
  void for_each_run(std::int64_t seq, int first, int last, F&& f) const {
    for (int i = first; i < last;) {
      int run = 0;
      if constexpr (requires { self().adjacent_run(seq, i, last - i); }) {
        run = std::min(self().adjacent_run(seq, i, last - i), last - i);  // across pages
      } else {
        run = std::min(self().adjacent_slots(seq, i), last - i);
      }
      f(i, run);
      i += run;
    }
  }
  // Rows in use after appending `tokens` more: the first fills a waiting hole.
  [[nodiscard]] int grown_extent(std::int64_t seq, int tokens) const {
    return std::max(extent_[seq], length_[seq] + tokens);
  }
  // out[i - first] = position(seq, i) for i in [first, last), converted to V: run by run of
  // adjacent entries (a page's), one address per run, whatever rows hold the slots
  template <class V>
  void positions_range(std::int64_t seq, int first, int last, V* out) const {
    for_each_run(seq, first, last, [&](int i, int run) {
      V* o = out + (i - first);
      const std::int32_t* pos = self().position_slot(seq, i);
      for (int t = 0; t < run; ++t) o[t] = static_cast<V>(pos[t]);
    });
  }
  // Slot i takes slot slots[i]'s position, i < slots.size() (ascending: slots[i] >= i, so in place
  // front to back), after a retain: the kept prefix (slots[i] == i) is left as it is.
  void keep_positions(std::int64_t seq, std::span<const std::int32_t> slots) {
    const int m = static_cast<int>(slots.size());
    int k = 0;  // slots before k are kept in place
    while (k < m && slots[k] == k) ++k;
    for (int i = k; i < m; ++i) *self().position_slot(seq, i) = *self().position_slot(seq, slots[i]);
  }
  // f(i, f0, count) for pieces that cover slots [first, last) in order, each piece the slots
  // i .. i + count - 1 held by the adjacent flat rows f0 .. f0 + count - 1 (keys at keys_ + f0 * d,
  // values at values_ + f0 * d): in slot order a run (for_each_run); out of order, a stretch of a
  // run whose rows are consecutive within one page, found by one compare per slot. A sliding
  // window's evictions, each hole refilled by the next token, leave the rows a rotation: about
  // two pieces per page of slots (the row map's pages and the rows' pages out of step), not a
  // page lookup per slot. Scattered rows (H2O's) give pieces of one.
  template <class F>
  void for_each_piece(std::int64_t seq, int first, int last, F&& f) const {
    const Derived& d = self();
    if (ordered_[seq]) {
      for_each_run(seq, first, last, [&](int i, int run) { f(i, d.flat(seq, i), run); });
      return;
    }
    for_each_run(seq, first, last, [&](int i, int run) {
      const std::int32_t* rows = d.row_slot(seq, i);
      for (int j = 0; j < run;) {
        const int r = rows[j];
        const int room = std::min(run - j, d.adjacent_slots(seq, r));
        int k = 1;
        while (k < room && rows[j + k] == r + k) ++k;
        f(i + j, d.flat(seq, r), k);
        j += k;
      }
    });
  }
  template <class SlotAt, class V>
  void gather_positions(std::int64_t seq, std::size_t n, SlotAt slot_at, V* out) const {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<V>(*self().position_slot(seq, slot_at(i)));
  }
  // Out of line: keeps row() (inlined into every key()/value() of the attention loops) small.
  [[gnu::noinline]] int mapped_row(std::int64_t seq, int slot) const {
    return *self().row_slot(seq, slot);
  }
  // Copies a row's key and value (its position stays with its slot: keep_positions).
  void move_row(std::int64_t seq, int from, int to, std::size_t row_bytes) {
    std::memcpy(self().key_slot(seq, to), self().key_slot(seq, from), row_bytes);
    std::memcpy(self().value_slot(seq, to), self().value_slot(seq, from), row_bytes);
  }
  const Derived& self() const { return static_cast<const Derived&>(*this); }
  Derived& self() { return static_cast<Derived&>(*this); }
};

}  // namespace kvsift::store
