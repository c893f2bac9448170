// SPDX-License-Identifier: Apache-2.0
#pragma once

// store::tiered — a host pool that always holds every token of every head-sequence, and a
// working set (the device tier) that holds, per KV head, the tokens attention reads now.
//
// The dynamic methods (SyncKV, HeteroCache, FreeKV) keep the complete KV on the host and a small
// working set on the device, and move tokens or whole pages between the two while decoding goes
// on. This store is that split, on the CPU backend:
//
//   host pool    per (request, layer), HND pages [pages, kv_heads, 2, p, d] (FreeKV's host
//                layout): page g of KV head h is one contiguous block, its p keys then its p
//                values. Write-through: every appended token lands here first and stays until
//                reset(request). Demoting a token therefore moves no bytes.
//   working set  per head-sequence, its resident rows [n_resident, d] of K and of V plus their
//                original positions, in a SEPARATE allocation (the bytes are real: a demoted
//                token's row leaves it, its buffers shrink once less than a quarter is in use, and
//                resident_bytes() counts only what is resident).
//
// The working set is kept sorted by original position at all times (slot order is position
// order), so every KvStore law of a compacting store holds; install() merges. The working set is what the KvStore concept sees (length/position/key/value/retain), so the
// library's attention, scorers and the plan machinery work over it unchanged. The host pool has
// its own accessors (host_length, host_key, host_page, ...). Moving rows host -> working set is
// either synchronous (promote) or the install of a completed asynchronous recall
// (transfer::async, which fills a `landing` on a worker thread; see transfer/async.hpp).
//
// Thread-safety: the host pool has a fixed capacity allocated at construction and is only ever
// appended to, so a recall in flight reads rows that no other call writes. reset(request) must
// not run while a recall of that request is in flight (the methods cancel theirs first).
//
// Cost: append writes each row twice; retain, promote and install work in place (no allocation
// past the high-water mark); the rest: docs/architecture.md, "Design notes from the headers".

#include <kvsift/concepts.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/exec.hpp>
#include <kvsift/core/kv_memory.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvsift::transfer {
template <Element T>
class async;
}  // namespace kvsift::transfer

namespace kvsift::store {

// Byte and event counts of the two tiers.
struct tier_stats {
  std::int64_t host_bytes = 0;       // K+V bytes held by the host pool (tokens in it)
  std::int64_t device_bytes = 0;     // K+V bytes resident in the working set
  std::int64_t bytes_to_device = 0;  // bytes copied host pool -> working set (promote, install)
  std::int64_t bytes_to_host = 0;    // bytes copied working set -> host pool (0: write-through pool)
  std::int64_t promotes = 0;         // synchronous promote() calls that copied at least one row
  std::int64_t installs = 0;         // install() calls (completed asynchronous recalls applied)
};

// Rows recalled from the host pool, as an asynchronous transfer delivers them: for each recalled
// head-sequence `seqs[r]`, its positions (ascending) and their K and V rows, [rows, d] each, in
// the order of `positions`. Filled by transfer::async on its worker thread; read by install().
template <Element T>
struct landing {
  int dim = 0;
  std::vector<std::int64_t> seqs;  // [R]
  index_sets positions;            // [R] ascending per segment
  std::vector<T> keys, values;     // [positions.values.size(), dim]

  [[nodiscard]] int find(std::int64_t seq) const {
    const auto it = std::find(seqs.begin(), seqs.end(), seq);
    return it == seqs.end() ? -1 : static_cast<int>(it - seqs.begin());
  }
  [[nodiscard]] const T* key(int r, int i) const {
    return keys.data() + (static_cast<std::size_t>(positions.offsets[r]) + i) * dim;
  }
  [[nodiscard]] const T* value(int r, int i) const {
    return values.data() + (static_cast<std::size_t>(positions.offsets[r]) + i) * dim;
  }
  [[nodiscard]] std::int64_t bytes() const {
    return static_cast<std::int64_t>(keys.size() + values.size()) * static_cast<std::int64_t>(sizeof(T));
  }
};

template <Element T>
class tiered {
 public:
  using kvsift_role = store_tag;
  using element_type = T;
  using memory_space = host_space;
  // Its Transfer slot: what moves its recalls from the host pool (worker threads, RecallTransfer;
  // transfer/async.hpp). The two-tier schedules hold one and submit through it.
  using transfer_type = transfer::async<T>;

  // `host_capacity` tokens per head-sequence in the pool (fixed: the pool never reallocates, so
  // recalls in flight stay valid); `page_size` is the pool's page p (FreeKV recalls whole pages).
  tiered(model_shape shape, int requests, int host_capacity, int page_size = 16)
      : shape_(shape), requests_(requests), capacity_(host_capacity), page_(page_size) {
    constexpr std::string_view where = "store::tiered";
    shape_.validate(where);
    require(requests > 0, where, "requests", requests, "> 0");
    require(host_capacity > 0, where, "host_capacity", host_capacity, "> 0 tokens");
    require(page_size > 0, where, "page_size", page_size, "> 0 tokens");
    pages_ = static_cast<int>((std::int64_t{capacity_} + page_ - 1) / page_);
    // every array's size without overflow: a wrapped product would build a pool too small
    if (!checked_product(max_allocation_bytes, requests, shape_.layers, pages_, shape_.kv_heads,
                         2, page_, shape_.head_dim, sizeof(T)) ||
        !checked_product(max_allocation_bytes, requests, shape_.layers, shape_.kv_heads,
                         sizeof(working_rows)) ||
        !checked_product(max_allocation_bytes, requests, shape_.layers, capacity_,
                         sizeof(std::int32_t))) {
      throw make_error(where, "shape",
                       "requests " + std::to_string(requests) + ", layers " +
                           std::to_string(shape_.layers) + ", kv_heads " +
                           std::to_string(shape_.kv_heads) + ", head_dim " +
                           std::to_string(shape_.head_dim) + ", host_capacity " +
                           std::to_string(capacity_) + ", page_size " + std::to_string(page_),
                       "a host pool [requests x layers x pages, kv_heads, 2, page_size, "
                       "head_dim] of at most " + std::to_string(max_allocation_bytes) +
                           " bytes (the size overflows)");
    }
    const std::size_t rl = static_cast<std::size_t>(requests) * shape_.layers;
    const std::size_t pool = rl * static_cast<std::size_t>(pages_) * shape_.kv_heads * 2 *
                             static_cast<std::size_t>(page_) * shape_.head_dim;
    pool_.resize(pool);
    host_positions_.assign(rl * static_cast<std::size_t>(capacity_), 0);
    host_length_.assign(rl, 0);
    next_.assign(rl, 0);
    work_.resize(rl * shape_.kv_heads);
  }
  tiered(const tiered&) = delete;
  tiered& operator=(const tiered&) = delete;
  tiered(tiered&&) noexcept = default;
  tiered& operator=(tiered&&) noexcept = default;

  // ---- KvStore over the working set -------------------------------------------------------
  [[nodiscard]] const model_shape& shape() const { return shape_; }
  [[nodiscard]] int requests() const { return requests_; }
  [[nodiscard]] int length(std::int64_t seq) const { return work_[seq].length(); }
  [[nodiscard]] int length(int request, int layer, int head) const {
    return length(shape_.sequence(request, layer, head));
  }
  [[nodiscard]] std::int32_t position(std::int64_t seq, int slot) const {
    return work_[seq].positions[slot];
  }
  [[nodiscard]] const T* key(std::int64_t seq, int slot) const {
    return work_[seq].keys.data() + static_cast<std::size_t>(slot) * shape_.head_dim;
  }
  [[nodiscard]] const T* value(std::int64_t seq, int slot) const {
    return work_[seq].values.data() + static_cast<std::size_t>(slot) * shape_.head_dim;
  }
  // A head-sequence can hold every token of the pool in its working set.
  [[nodiscard]] int capacity(std::int64_t = 0) const { return capacity_; }
  [[nodiscard]] std::int32_t next_position(int request, int layer) const {
    return next_[rl(request, layer)];
  }
  [[nodiscard]] std::int64_t resident_tokens() const {
    std::int64_t t = 0;
    for (const auto& w : work_) t += w.length();
    return t;
  }
  [[nodiscard]] std::int64_t resident_bytes() const { return resident_tokens() * row_pair_bytes(); }

  // Slot of `position` in the working set of `seq`, or -1 if it is not resident.
  [[nodiscard]] int slot_of(std::int64_t seq, std::int32_t position) const {
    const auto& p = work_[seq].positions;
    const auto it = std::lower_bound(p.begin(), p.end(), position);
    return it != p.end() && *it == position ? static_cast<int>(it - p.begin()) : -1;
  }
  [[nodiscard]] bool resident(std::int64_t seq, std::int32_t position) const {
    return slot_of(seq, position) >= 0;
  }

  // ---- host pool ------------------------------------------------------------------------------
  [[nodiscard]] int page_size() const { return page_; }
  [[nodiscard]] int host_capacity() const { return capacity_; }
  [[nodiscard]] int host_length(int request, int layer) const { return host_length_[rl(request, layer)]; }
  [[nodiscard]] std::int32_t host_position(int request, int layer, int index) const {
    return host_positions_[rl(request, layer) * static_cast<std::size_t>(capacity_) + index];
  }
  // The positions of the pool of (request, layer), ascending: [host_length(request, layer)].
  [[nodiscard]] std::span<const std::int32_t> host_positions(int request, int layer) const {
    return {host_positions_.data() + rl(request, layer) * static_cast<std::size_t>(capacity_),
            static_cast<std::size_t>(host_length(request, layer))};
  }
  // Index of `position` in the pool of (request, layer), or -1 if absent. `from` is a hint: an
  // index at or before the answer (callers walking ascending positions pass the previous one).
  [[nodiscard]] int host_index(int request, int layer, std::int32_t position, int from = 0) const {
    const auto* base = host_positions_.data() + rl(request, layer) * static_cast<std::size_t>(capacity_);
    const int n = host_length(request, layer);
    from = std::clamp(from, 0, n);
    if (from < n && base[from] == position) return from;  // the next row of a run
    const auto* it = std::lower_bound(base + from, base + n, position);
    return it != base + n && *it == position ? static_cast<int>(it - base) : -1;
  }
  [[nodiscard]] const T* host_key(std::int64_t seq, int index) const { return host_row(seq, index, 0); }
  [[nodiscard]] const T* host_value(std::int64_t seq, int index) const { return host_row(seq, index, 1); }
  // The [2, p, d] block of page `page` of head-sequence seq: its keys, then its values.
  [[nodiscard]] const T* host_page(std::int64_t seq, int page) const {
    return pool_.data() + page_offset(seq, page);
  }
  [[nodiscard]] std::int64_t host_tokens() const {
    std::int64_t t = 0;
    for (const int n : host_length_) t += n;
    return t * shape_.kv_heads;
  }
  [[nodiscard]] std::int64_t host_bytes() const { return host_tokens() * row_pair_bytes(); }

  [[nodiscard]] tier_stats stats() const {
    tier_stats s = counters_;
    s.host_bytes = host_bytes();
    s.device_bytes = resident_bytes();
    return s;
  }

  // ---- mutation -------------------------------------------------------------------------------
  // Appends k, v ([tokens, kv_heads, d], any dense layout) to the pool of (request, layer) and to
  // the working set of each of its KV heads (new tokens are always resident), at positions
  // first_position, first_position + 1, ... Validates everything first.
  template <class L>
  void append(int request, int layer, kv_view<const T, L> k, kv_view<const T, L> v,
              std::int32_t first_position) {
    constexpr std::string_view where = "store::tiered.append";
    check_request_layer(where, request, layer);
    validate_kv_pair(where, k, v, shape_.kv_heads, shape_.head_dim);
    const std::int32_t next = next_position(request, layer);
    require(first_position >= next, where, "first_position", first_position,
            ">= " + std::to_string(next) + " (positions ascend within a head-sequence)");
    require_positions_fit(where, "first_position", first_position, k.tokens);
    const int have = host_length(request, layer);
    require(k.tokens <= capacity_ - have, where, "k.tokens", k.tokens,
            "<= the room left in the host pool (" + std::to_string(capacity_ - have) + " of " +
                std::to_string(capacity_) + " tokens)");
    const std::size_t row = static_cast<std::size_t>(shape_.head_dim);
    for (int h = 0; h < shape_.kv_heads; ++h) {
      const auto seq = shape_.sequence(request, layer, h);
      auto& w = work_[seq];
      for (int t = 0; t < k.tokens; ++t) {
        std::memcpy(host_row_mut(seq, have + t, 0), k.row(t, h), row * sizeof(T));
        std::memcpy(host_row_mut(seq, have + t, 1), v.row(t, h), row * sizeof(T));
        w.keys.insert(w.keys.end(), k.row(t, h), k.row(t, h) + row);
        w.values.insert(w.values.end(), v.row(t, h), v.row(t, h) + row);
        w.positions.push_back(first_position + t);
      }
    }
    auto* pos = host_positions_.data() + rl(request, layer) * static_cast<std::size_t>(capacity_);
    for (int t = 0; t < k.tokens; ++t) pos[have + t] = first_position + t;
    host_length_[rl(request, layer)] = have + k.tokens;
    next_[rl(request, layer)] = first_position + k.tokens;
  }

  // Keeps, for each KV head h of (request, layer), exactly the working-set slots kept[h]
  // (ascending) and demotes the others: they leave the working set (kept rows move down over them) and
  // stay in the host pool, from where promote()/install() can bring them back.
  void retain(int request, int layer, const index_sets& kept) {
    constexpr std::string_view where = "store::tiered.retain";
    check_request_layer(where, request, layer);
    require(kept.segments() == shape_.kv_heads, where, "kept.segments", kept.segments(),
            "one segment per KV head (" + std::to_string(shape_.kv_heads) + ")");
    validate_index_sets(
        kept, [&](int h) { return length(shape_.sequence(request, layer, h)); }, where, "kept");
    const int d = shape_.head_dim;
    for (int h = 0; h < shape_.kv_heads; ++h) {
      auto& w = work_[shape_.sequence(request, layer, h)];
      const auto slots = kept[h];
      // slots ascend, so slot slots[j] >= j: moving rows down in order never overwrites a row
      // still to be moved
      for (std::size_t j = 0; j < slots.size(); ++j) {
        if (static_cast<std::size_t>(slots[j]) != j) w.move_row(slots[j], static_cast<int>(j), d);
      }
      w.resize(slots.size(), d);
      w.release_slack();
    }
  }

  // Sets the working set of `seq` to exactly `positions` (ascending, each in the host pool).
  // Resident positions keep their rows; the others are copied from the host pool now.
  void promote(std::int64_t seq, std::span<const std::int32_t> positions) {
    constexpr std::string_view where = "store::tiered.promote";
    // not a structured binding: a lambda below uses them (clang 14 cannot capture a binding)
    const auto request_layer_of_seq = check_target(where, seq, positions);
    const int request = request_layer_of_seq.first, layer = request_layer_of_seq.second;
    const std::int64_t before = counters_.bytes_to_device;
    const std::size_t d = static_cast<std::size_t>(shape_.head_dim);
    rebuild(seq, positions, [&](std::size_t a, std::size_t b, T* keys, T* values) {
      for (std::size_t j = a; j < b; ++j) {
        const int i = host_index(request, layer, positions[j]);
        std::memcpy(keys + j * d, host_key(seq, i), row_bytes());
        std::memcpy(values + j * d, host_value(seq, i), row_bytes());
      }
    });
    if (counters_.bytes_to_device != before) ++counters_.promotes;
  }

  // Sets the working set of `seq` to exactly `positions` (ascending, each in the host pool);
  // resident positions keep their rows, the others come from `from` (a completed recall), which
  // must hold every one of them. Validates before it mutates.
  void install(std::int64_t seq, std::span<const std::int32_t> positions, const landing<T>& from) {
    constexpr std::string_view where = "store::tiered.install";
    check_target(where, seq, positions);
    check_landing(where, from);
    const int r = from.find(seq);
    const auto landed = r >= 0 ? from.positions[r] : std::span<const std::int32_t>{};
    for (std::size_t i = 1; i < landed.size(); ++i) {  // the merge below needs them ascending
      require(landed[i] > landed[i - 1], where, [&] { return "from.positions[" + std::to_string(r) + "]"; },
              landed[i], [&] {
                return "ascending landed positions without duplicates (head-sequence " + std::to_string(seq) + ")";
              });
    }
    {  // one merge pass (all three ascend): each position is resident or in the landing
      const auto& res = work_[seq].positions;
      std::size_t a = 0, b = 0;
      for (const auto pos : positions) {
        while (a < res.size() && res[a] < pos) ++a;
        if (a < res.size() && res[a] == pos) continue;
        while (b < landed.size() && landed[b] < pos) ++b;
        require(b < landed.size() && landed[b] == pos, where, "positions", pos, [&] {
          return "a position that is resident or in the completed recall of head-sequence " +
                 std::to_string(seq);
        });
      }
    }
    // rebuild fetches runs of slots from the back; rows consecutive in the landing and in the
    // working set are one copy per side
    auto li = static_cast<std::ptrdiff_t>(landed.size()) - 1;
    const std::size_t d = static_cast<std::size_t>(shape_.head_dim);
    rebuild(seq, positions, [&](std::size_t a, std::size_t b, T* keys, T* values) {
      for (std::size_t hi = b; hi > a;) {
        const std::size_t j = hi - 1;
        while (landed[static_cast<std::size_t>(li)] > positions[j]) --li;
        std::size_t run = 1;
        while (j >= a + run && static_cast<std::size_t>(li) >= run &&
               landed[static_cast<std::size_t>(li) - run] == positions[j - run]) {
          ++run;
        }
        const auto first = static_cast<int>(li - static_cast<std::ptrdiff_t>(run) + 1);
        std::memcpy(keys + (j + 1 - run) * d, from.key(r, first), run * row_bytes());
        std::memcpy(values + (j + 1 - run) * d, from.value(r, first), run * row_bytes());
        li -= static_cast<std::ptrdiff_t>(run);
        hi -= run;
      }
    });
    ++counters_.installs;
  }

  // Drops every token of a request from both tiers (a continuous batch reuses the slot).
  void reset(int request) {
    require(request >= 0 && request < requests_, "store::tiered.reset", "request", request,
            "in [0, " + std::to_string(requests_) + ")");
    for (int l = 0; l < shape_.layers; ++l) {
      host_length_[rl(request, l)] = 0;
      next_[rl(request, l)] = 0;
      for (int h = 0; h < shape_.kv_heads; ++h) work_[shape_.sequence(request, l, h)] = {};
    }
  }

  // Copies the listed working-set slots of one head-sequence into contiguous [n, d] arrays.
  void gather(std::int64_t seq, std::span<const std::int32_t> slots, T* keys_out, T* values_out,
              std::int32_t* positions_out = nullptr) const {
    for (std::size_t i = 0; i < slots.size(); ++i) {
      std::memcpy(keys_out + i * shape_.head_dim, key(seq, slots[i]), row_bytes());
      std::memcpy(values_out + i * shape_.head_dim, value(seq, slots[i]), row_bytes());
      if (positions_out != nullptr) positions_out[i] = position(seq, slots[i]);
    }
  }

  // Checks the tiers' invariants and throws kvsift::error naming the first violation: every
  // working set ascends by position, every resident token is in the host pool (resident ⊆ host)
  // with the same key and value bytes, and the pool ends at next_position. O(resident * d):
  // tests call it every step, and methods do when built with KVSIFT_CHECK_INVARIANTS.
  void verify() const {
    constexpr std::string_view where = "store::tiered.verify";
    for (std::int64_t seq = 0; seq < static_cast<std::int64_t>(work_.size()); ++seq) {
      const auto [request, layer] = request_layer(seq);
      const auto& w = work_[seq];
      for (int s = 0; s < w.length(); ++s) {
        const auto pos = w.positions[s];
        // messages built only on failure: this loop runs once per resident token
        require(s == 0 || pos > w.positions[s - 1], where, "position", pos,
                [&] { return "ascending working-set positions in head-sequence " + std::to_string(seq); });
        const int i = host_index(request, layer, pos);
        require(i >= 0, where, "position", pos, [&] {
          return "a resident token held by the host pool (head-sequence " + std::to_string(seq) + ")";
        });
        require(std::memcmp(key(seq, s), host_key(seq, i), row_bytes()) == 0 &&
                    std::memcmp(value(seq, s), host_value(seq, i), row_bytes()) == 0,
                where, "position", pos, [&] {
                  return "resident rows equal to the host pool's (head-sequence " + std::to_string(seq) + ")";
                });
      }
      const int n = host_length(request, layer);
      require(n == 0 || host_position(request, layer, n - 1) < next_position(request, layer), where,
              "next_position", next_position(request, layer), "past the pool's newest token");
    }
  }

  // verify(), when built with -DKVSIFT_CHECK_INVARIANTS (the sanitizer preset is); nothing
  // otherwise. The dynamic methods call it at the end of every decode().
  void debug_verify() const {
#ifdef KVSIFT_CHECK_INVARIANTS
    verify();
#endif
  }

  void check_request_layer(std::string_view where, int request, int layer) const {
    require(request >= 0 && request < requests_, where, "request", request,
            "in [0, " + std::to_string(requests_) + ")");
    require(layer >= 0 && layer < shape_.layers, where, "layer", layer,
            "in [0, " + std::to_string(shape_.layers) + ")");
  }
  // (request, layer) of a head-sequence id.
  [[nodiscard]] std::pair<int, int> request_layer(std::int64_t seq) const {
    const auto per_request = shape_.sequences_per_request();
    return {static_cast<int>(seq / per_request),
            static_cast<int>((seq % per_request) / shape_.kv_heads)};
  }

 private:
  // Rows of a working set are written right after they are made room for: a buffer that does not
  // zero-fill them first writes each byte once (the allocator's value-less construct()
  // default-initialises).
  template <class U>
  struct uninitialised_allocator : std::allocator<U> {
    template <class V>
    struct rebind {
      using other = uninitialised_allocator<V>;
    };
    uninitialised_allocator() = default;
    template <class V>
    uninitialised_allocator(const uninitialised_allocator<V>&) noexcept {}
    template <class V>
    void construct(V* p) noexcept(std::is_nothrow_default_constructible_v<V>) {
      ::new (static_cast<void*>(p)) V;
    }
    template <class V, class... A>
    void construct(V* p, A&&... a) {
      ::new (static_cast<void*>(p)) V(std::forward<A>(a)...);
    }
  };
  template <class U>
  using row_vector = std::vector<U, uninitialised_allocator<U>>;

  // The working set of one head-sequence: rows in position order.
  struct working_rows {
    row_vector<T> keys, values;          // [n, d]
    row_vector<std::int32_t> positions;  // [n] ascending
    [[nodiscard]] int length() const { return static_cast<int>(positions.size()); }
    void resize(std::size_t n, int d) {
      keys.resize(n * d);
      values.resize(n * d);
      positions.resize(n);
    }
    // Row `from` (key, value, position) to slot `to` (a different slot).
    void move_row(int from, int to, int d) {
      const std::size_t bytes = static_cast<std::size_t>(d) * sizeof(T);
      std::memcpy(keys.data() + static_cast<std::size_t>(to) * d,
                  keys.data() + static_cast<std::size_t>(from) * d, bytes);
      std::memcpy(values.data() + static_cast<std::size_t>(to) * d,
                  values.data() + static_cast<std::size_t>(from) * d, bytes);
      positions[to] = positions[from];
    }
    // Gives memory back once less than a quarter of the buffers is in use (and more than a
    // little would be freed): the working set's allocation follows what is resident — after the
    // prompt, down to the budget — without reallocating every step as a working set that grows
    // by a recall and shrinks back would.
    void release_slack() {
      const std::size_t n = positions.size();
      if (positions.capacity() > 4 * n + 256) {
        keys.shrink_to_fit();
        values.shrink_to_fit();
        positions.shrink_to_fit();
      }
    }
  };

  [[nodiscard]] std::size_t rl(int request, int layer) const {
    return static_cast<std::size_t>(request) * shape_.layers + layer;
  }
  [[nodiscard]] std::size_t row_bytes() const { return static_cast<std::size_t>(shape_.head_dim) * sizeof(T); }
  [[nodiscard]] std::int64_t row_pair_bytes() const { return 2 * static_cast<std::int64_t>(row_bytes()); }
  [[nodiscard]] std::size_t page_offset(std::int64_t seq, int page) const {
    const auto [request, layer] = request_layer(seq);
    const int head = static_cast<int>(seq % shape_.kv_heads);
    const std::size_t block = 2 * static_cast<std::size_t>(page_) * shape_.head_dim;
    return ((rl(request, layer) * pages_ + page) * shape_.kv_heads + head) * block;
  }
  [[nodiscard]] const T* host_row(std::int64_t seq, int index, int kv) const {
    return pool_.data() + page_offset(seq, index / page_) +
           (static_cast<std::size_t>(kv) * page_ + index % page_) * shape_.head_dim;
  }
  [[nodiscard]] T* host_row_mut(std::int64_t seq, int index, int kv) {
    return const_cast<T*>(host_row(seq, index, kv));
  }

  // Validates a landing's structure (a landing is filled by transfer::async, but install is
  // public): the head dimension, one CSR segment per recalled head-sequence, and exactly one K
  // and one V row per landed position. O(recalled head-sequences).
  void check_landing(std::string_view where, const landing<T>& from) const {
    require(from.dim == shape_.head_dim, where, "from.dim", from.dim, std::to_string(shape_.head_dim));
    const auto& off = from.positions.offsets;
    require(!off.empty() && off.size() == from.seqs.size() + 1, where, "from.positions.offsets.size",
            off.size(), [&] { return "from.seqs.size() + 1 = " + std::to_string(from.seqs.size() + 1); });
    require(off.front() == 0, where, "from.positions.offsets[0]", off.front(), "0");
    for (std::size_t s = 1; s < off.size(); ++s) {
      require(off[s] >= off[s - 1], where, [&] { return "from.positions.offsets[" + std::to_string(s) + "]"; },
              off[s], [&] { return ">= offsets[" + std::to_string(s - 1) + "] (CSR offsets)"; });
    }
    const std::size_t rows = from.positions.values.size();
    require(static_cast<std::size_t>(off.back()) == rows, where, "from.positions.offsets.back", off.back(),
            [&] { return "the landed position count " + std::to_string(rows); });
    const std::size_t elems = rows * static_cast<std::size_t>(shape_.head_dim);
    require(from.keys.size() == elems, where, "from.keys.size", from.keys.size(),
            [&] { return std::to_string(rows) + " rows x head_dim " + std::to_string(shape_.head_dim); });
    require(from.values.size() == elems, where, "from.values.size", from.values.size(),
            [&] { return std::to_string(rows) + " rows x head_dim " + std::to_string(shape_.head_dim); });
  }

  // Validates a target working set: a real head-sequence, positions ascending, each in the pool.
  std::pair<int, int> check_target(std::string_view where, std::int64_t seq,
                                   std::span<const std::int32_t> positions) const {
    require(seq >= 0 && seq < static_cast<std::int64_t>(work_.size()), where, "seq", seq,
            "in [0, " + std::to_string(work_.size()) + ")");
    const auto rl_of_seq = request_layer(seq);  // no structured binding: lambdas below use both
    const int request = rl_of_seq.first, layer = rl_of_seq.second;
    const auto name = [&](std::size_t i) { return [i] { return "positions[" + std::to_string(i) + "]"; }; };
    int hint = 0;  // positions ascend: each lookup starts where the last one ended
    for (std::size_t i = 0; i < positions.size(); ++i) {
      if (i > 0) {
        require(positions[i] > positions[i - 1], where, name(i), positions[i], [&] {
          return "> positions[" + std::to_string(i - 1) + "] (ascending, no duplicates)";
        });
      }
      const int index = host_index(request, layer, positions[i], hint);
      require(index >= 0, where, name(i), positions[i], [&] {
        return "a position in the host pool of (request " + std::to_string(request) + ", layer " +
               std::to_string(layer) + ")";
      });
      hint = index + 1;
    }
    return {request, layer};
  }

  // New working set = `positions` (validated: ascending, each resident or fetchable), in place:
  // first the resident rows that stay move down over the ones that go (as retain), then the
  // buffers grow to the new size and a merge from the back puts each kept row in its final slot
  // (a row moves only if a fetched row lands before it) and fetches the missing rows straight into
  // their slots: fetch(a, b, keys, values) fills slots [a, b) (runs, from the back).
  template <class Fetch>
  void rebuild(std::int64_t seq, std::span<const std::int32_t> positions, Fetch&& fetch) {
    const int d = shape_.head_dim;
    auto& w = work_[seq];
    std::ptrdiff_t kept = 0;
    for (std::size_t s = 0, j = 0; s < w.positions.size(); ++s) {
      const auto pos = w.positions[s];
      while (j < positions.size() && positions[j] < pos) ++j;
      if (j < positions.size() && positions[j] == pos) {
        if (static_cast<std::ptrdiff_t>(s) != kept) w.move_row(static_cast<int>(s), static_cast<int>(kept), d);
        ++kept;
        ++j;
      }
    }
    const auto n = static_cast<std::ptrdiff_t>(positions.size());
    w.resize(static_cast<std::size_t>(n), d);  // kept <= n: kept rows are among `positions`
    std::ptrdiff_t i = kept - 1;  // the last kept row not yet placed
    for (std::ptrdiff_t j = n - 1; j >= 0 && i != j;) {  // i == j: the rest is in place
      if (i >= 0 && w.positions[i] == positions[j]) {
        w.move_row(static_cast<int>(i), static_cast<int>(j), d);
        --i;
        --j;
        continue;
      }
      // slots [lo, j] are fetched: down to the slot of the next kept row (all of them above i)
      std::ptrdiff_t lo = j;
      while (lo > 0 && !(i >= 0 && w.positions[i] == positions[lo - 1])) --lo;
      fetch(static_cast<std::size_t>(lo), static_cast<std::size_t>(j) + 1, w.keys.data(), w.values.data());
      std::copy(positions.begin() + lo, positions.begin() + j + 1, w.positions.begin() + lo);
      counters_.bytes_to_device += (j - lo + 1) * row_pair_bytes();
      j = lo - 1;
    }
    w.release_slack();
  }

  model_shape shape_;
  int requests_ = 0;
  int capacity_ = 0;  // host pool tokens per head-sequence
  int page_ = 16;
  int pages_ = 0;     // host pool pages per head-sequence
  kv_vector<T> pool_;  // [requests * layers, pages, kv_heads, 2, p, d] (core/kv_memory.hpp)
  std::vector<std::int32_t> host_positions_;  // [requests * layers, capacity]
  std::vector<int> host_length_;              // [requests * layers]
  std::vector<std::int32_t> next_;            // [requests * layers]
  std::vector<working_rows> work_;            // [requests * layers * kv_heads]
  tier_stats counters_;
};

static_assert(KvStore<tiered<float>>);
static_assert(KvStore<tiered<half>>);
static_assert(KvStore<tiered<bfloat16>>);

}  // namespace kvsift::store

namespace kvsift {
template <class T>
struct default_tiered_store<T, exec::host> {
  using type = store::tiered<T>;
};
}  // namespace kvsift
