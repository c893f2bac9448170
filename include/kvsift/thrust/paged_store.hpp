// SPDX-License-Identifier: Apache-2.0
#pragma once

// thrust::paged_store — a paged KV cache in an exec's memory, as engines hold theirs: one pool of
// pages shared by every request, layer and KV head, a page table per head-sequence, and pages
// returned to the pool when an eviction round empties them. The device half of store::paged, as
// thrust::dense_store is of store::dense.
//
//   kvsift::thrust::sim_arena arena;
//   kvsift::exec::sim_cpp e{arena};
//   kvsift::thrust::paged_store<float, kvsift::exec::sim_cpp> st(e, shape, requests,
//       /*capacity=*/4096, /*page_size=*/16, /*pool_pages=*/2048, /*columns=*/1);
//   st.append(request, layer, k, v, first_position);   // takes pages from the pool
//   st.retain(request, layer, kept_counts, kept);       // leaves a hole, or compacts and
//                                                       // returns the emptied pages
//   st.reset(request);                                  // returns every page of the request
//   auto [k, v] = st.head_rows(seq0, offsets);          // segmented_rows through the page table
//
// Layout. The pool: keys and values [pool_pages, page_size, d] each (HND pages: a page holds
// page_size tokens of one KV head), owned or a view of the engine's pool (the constructor taking
// keys/values). Page table: [sequences, ceil(capacity / page_size)] page ids; the first
// ceil(row_extent / page_size) entries of a head-sequence are its pages, its row r in page
// r / P at r % P. Slots and rows (store/basic.hpp's "Slots and rows", on the device): slot i (the
// i-th resident token by position) is in row row_map[i]; the rows in use are [0, length), or
// [0, length + 1) with one released row among them (the waiting hole) that the next append
// fills. Free pages: a stack in E memory whose height is a host shadow. Per-slot metadata, the
// row map, the original positions and `columns` float side columns (H2O's running scores), stay
// dense [sequences, capacity], as in thrust::dense_store: 4 bytes a token each against 4d (bf16)
// of K and V.
//
// Contract (thrust::dense_store's): counts are host shadows (the data decides which slots a retain
// keeps, the host how many, hence how many pages move), so append, retain and reset read nothing
// back and allocate nothing after construction: the page ids move on the device, from the stack
// to the table and back. A retain keeps kept slot i as slot i (positions, columns and row map
// compacted: slot for slot, what a thrust::dense_store holds after the same calls), and picks per
// head from the counts alone (host arithmetic): one token released and no hole waiting (a decode
// step's eviction) leaves the hole: no K/V row moves, the released row waits for the next append
// and the pages stay; any other round compacts the rows (slot i into row i) and returns the pages
// past ceil(kept / P); nothing released changes nothing. Host-visible arguments are checked before anything
// changes: an append the pool cannot serve is refused (kvsift::error naming the pages needed and
// free) with every table and the pool unchanged, which is admission control for a continuous
// batch. Bad kept slots and NaN/Inf keys or values are found on the device and raised by the next
// check(), as thrust::dense_store does.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/thrust/common.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/exec.hpp>

#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sequence.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsift::thrust {

namespace detail {

// Page ids from the top of the free stack into the page tables: entry i of the run of head-
// sequence r goes to table[seqs[r] * stride + first[r] + i] (desc: [R + 1] CSR of the runs, then
// R first entries, then R head-sequences).
struct take_pages_fn {
  const std::int32_t* desc;
  int runs;
  const std::int32_t* stack;
  std::int64_t top;  // stack height before
  std::int32_t* table;
  std::int64_t stride;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int r = segment_of(desc, runs, t);
    const std::int64_t i = t - desc[r];
    const std::int64_t seq = desc[2 * runs + 1 + r];
    table[seq * stride + desc[runs + 1 + r] + i] = stack[top - 1 - t];
  }
};

// The reverse: table entries [first[r], first[r] + count[r]) of each run pushed onto the stack.
struct give_pages_fn {
  const std::int32_t* desc;
  int runs;
  std::int32_t* stack;
  std::int64_t top;
  const std::int32_t* table;
  std::int64_t stride;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int r = segment_of(desc, runs, t);
    const std::int64_t i = t - desc[r];
    const std::int64_t seq = desc[2 * runs + 1 + r];
    stack[top + t] = table[seq * stride + desc[runs + 1 + r] + i];
  }
};

// Tokens [0, tokens) of every KV head of a (request, layer) into slots lengths[seq0 + h] + t,
// through the page table, with position first + t and 0 in every column.
template <class T, class L, class Space>
struct append_paged_fn {
  kv_view<const T, L, Space> k, v;
  T* keys;
  T* values;
  const std::int32_t* table;  // [sequences, stride]
  std::int64_t stride;
  int page_size;
  std::int32_t* positions;    // [sequences, capacity]
  float* columns;             // [columns, sequences, capacity] or null
  int num_columns;
  std::int64_t column_stride;
  const std::int32_t* lengths;
  const std::int32_t* holes;  // [sequences] the waiting hole's row, or -1
  std::int32_t* row_map;      // [sequences, capacity]
  std::int64_t seq0;
  std::int64_t capacity;
  std::int32_t first;
  int* nonfinite;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int d = k.dim;
    const int c = static_cast<int>(e % d);
    const std::int64_t th = e / d;
    const int h = static_cast<int>(th % k.heads);
    const int t = static_cast<int>(th / k.heads);
    const std::int64_t seq = seq0 + h;
    const std::int64_t slot = lengths[seq] + t;
    // the first token fills the waiting hole; the rest go past the rows in use
    const std::int32_t r = t == 0 && holes[seq] >= 0 ? holes[seq] : static_cast<std::int32_t>(slot);
    const std::int64_t row =
        static_cast<std::int64_t>(table[seq * stride + r / page_size]) * page_size + r % page_size;
    const T key = k.row(t, h)[c];
    const T value = v.row(t, h)[c];
    keys[row * d + c] = key;
    values[row * d + c] = value;
    const float fk = to_float(key), fv = to_float(value);
    if (!(fk - fk == 0.0f && fv - fv == 0.0f)) *nonfinite = 1;
    if (c == 0) {
      positions[seq * capacity + slot] = first + t;
      row_map[seq * capacity + slot] = r;
      for (int j = 0; j < num_columns; ++j) columns[j * column_stride + seq * capacity + slot] = 0.0f;
    }
  }
};

// How a retain treats each KV head (paged_store::retain picks it from the counts).
enum retain_mode : std::int32_t { retain_compacts = 0, retain_leaves_hole = 1, retain_unchanged = 2 };

// Kept row t (slot kept[t] of head s) of a retain into packed[t], through the page table and the
// row map; heads that do not compact skip.
template <class T>
struct gather_kept_fn {
  segmented_rows<T> src;  // the heads' rows before the retain (paged)
  const std::int32_t* kept_offsets;
  const std::int32_t* modes;  // [heads]
  const std::int32_t* kept;
  T* packed;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t t = e / src.dim;
    const int c = static_cast<int>(e % src.dim);
    const int s = segment_of(kept_offsets, src.num_segments, t);
    if (modes[s] != retain_compacts) return;
    packed[e] = src.row(s, kept[t])[c];
  }
};

// packed[t] into row t - kept_offsets[s] of a compacting head s, through the page table.
template <class T>
struct scatter_kept_fn {
  T* data;
  const std::int32_t* table;  // the first head's row
  std::int64_t stride;
  int page_size;
  int heads;
  int dim;
  const std::int32_t* kept_offsets;
  const std::int32_t* modes;
  const T* packed;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t t = e / dim;
    const int c = static_cast<int>(e % dim);
    const int s = segment_of(kept_offsets, heads, t);
    if (modes[s] != retain_compacts) return;
    const std::int64_t i = t - kept_offsets[s];
    const std::int64_t row =
        static_cast<std::int64_t>(table[s * stride + i / page_size]) * page_size + i % page_size;
    data[row * dim + c] = packed[e];
  }
};

// The same two for per-slot metadata in a dense [heads, capacity] block (positions, a column).
// Heads that release nothing skip (their kept list is every slot, in order).
template <class U>
struct gather_slots_fn {
  const U* src;
  std::int64_t capacity;
  int heads;
  const std::int32_t* kept_offsets;
  const std::int32_t* modes;
  const std::int32_t* kept;
  U* packed;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(kept_offsets, heads, t);
    if (modes[s] == retain_unchanged) return;
    packed[t] = src[s * capacity + kept[t]];
  }
};
template <class U>
struct scatter_slots_fn {
  U* dst;
  std::int64_t capacity;
  int heads;
  const std::int32_t* kept_offsets;
  const std::int32_t* modes;
  const U* packed;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(kept_offsets, heads, t);
    if (modes[s] == retain_unchanged) return;
    dst[s * capacity + (t - kept_offsets[s])] = packed[t];
  }
};

// A head that leaves a hole released exactly one slot e of its n: its kept run (checked) is
// 0, 1, ..., e - 1, e + 1, ..., n - 1, so e is the first i with kept[i] != i (n - 1 if none), a
// binary search; the hole is e's row. One thread per head, so one writer even when a bad list
// (flagged by check_kept_fn) breaks the pattern.
struct hole_row_fn {
  const std::int32_t* kept;  // checked
  const std::int32_t* kept_offsets;
  const std::int32_t* modes;
  const std::int32_t* row_map;  // [sequences, capacity], before the retain
  std::int32_t* holes;
  std::int64_t seq0;
  std::int64_t capacity;
  KVSIFT_HOST_DEVICE void operator()(int h) const {
    if (modes[h] != retain_leaves_hole) return;
    const std::int32_t* run = kept + kept_offsets[h];
    int lo = 0;
    int hi = kept_offsets[h + 1] - kept_offsets[h];
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (run[mid] == mid) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    holes[seq0 + h] = row_map[(seq0 + h) * capacity + lo];
  }
};
// After a compacting head's rows moved: slot i is row i.
struct identity_rows_fn {
  std::int32_t* row_map;
  const std::int32_t* kept_offsets;
  const std::int32_t* modes;
  std::int64_t seq0;
  std::int64_t capacity;
  int heads;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = segment_of(kept_offsets, heads, t);
    if (modes[s] != retain_compacts) return;
    const std::int64_t i = t - kept_offsets[s];
    row_map[(seq0 + s) * capacity + i] = static_cast<std::int32_t>(i);
  }
};
// A retain's new lengths; a compacting head has no hole left.
struct retain_lengths_fn {
  std::int32_t* lengths;
  std::int32_t* holes;
  const std::int32_t* kept_offsets;
  const std::int32_t* modes;
  std::int64_t seq0;
  KVSIFT_HOST_DEVICE void operator()(int h) const {
    lengths[seq0 + h] = kept_offsets[h + 1] - kept_offsets[h];
    if (modes[h] == retain_compacts) holes[seq0 + h] = -1;
  }
};
// An append's new lengths; its first token filled any waiting hole.
struct append_lengths_fn {
  std::int32_t* lengths;
  std::int32_t* holes;
  std::int64_t seq0;
  int tokens;
  KVSIFT_HOST_DEVICE void operator()(int h) const {
    lengths[seq0 + h] += tokens;
    holes[seq0 + h] = -1;
  }
};

}  // namespace detail

template <Element T, DeviceExec E>
class paged_store : public one_tier_shadow {
 public:
  using element_type = T;
  using exec_type = E;
  using memory_space = typename E::memory_space;

  // A store whose pool it allocates in E's memory: pool_pages pages of page_size tokens.
  paged_store(const E& exec, model_shape shape, int requests, int capacity, int page_size,
              int pool_pages, int columns = 0)
      : paged_store(exec, shape, requests, capacity, page_size, pool_pages, columns, nullptr, nullptr) {}

  // A store over the engine's page pool in E's space: keys and values [pool_pages, page_size, d]
  // (its page size and layout: HND pages of one KV head each). The store owns its page tables,
  // free stack and per-slot metadata; the engine keeps the pool.
  paged_store(const E& exec, model_shape shape, int requests, int capacity, int page_size,
              int pool_pages, int columns, T* keys, T* values)
      : one_tier_shadow("thrust::paged_store", shape, requests, capacity), exec_(exec),
        page_(page_size), pool_pages_(pool_pages), columns_(columns),
        sequences_(checked_sequences(shape, requests, capacity, page_size, pool_pages, columns)),
        stride_((capacity + page_size - 1) / page_size),
        own_keys_(exec, keys == nullptr ? pool_elements() : 0),
        own_values_(exec, values == nullptr ? pool_elements() : 0),
        keys_(keys != nullptr ? keys : own_keys_.data()),
        values_(values != nullptr ? values : own_values_.data()),
        table_(exec, static_cast<std::size_t>(sequences_) * stride_),
        stack_(exec, static_cast<std::size_t>(pool_pages)),
        positions_(exec, static_cast<std::size_t>(sequences_) * capacity_),
        columns_data_(exec, static_cast<std::size_t>(columns_) * sequences_ * capacity_),
        lengths_(exec, static_cast<std::size_t>(sequences_)),
        row_map_(exec, static_cast<std::size_t>(sequences_) * capacity_),
        holes_(exec, static_cast<std::size_t>(sequences_)),
        kept_offsets_(exec, 2 * static_cast<std::size_t>(shape_.kv_heads) + 1),
        kept_(exec, static_cast<std::size_t>(shape_.kv_heads) * capacity_),
        page_desc_(exec, 3 * static_cast<std::size_t>(shape_.sequences_per_request()) + 1),
        packed_(exec, static_cast<std::size_t>(shape_.kv_heads) * capacity_ * shape_.head_dim),
        packed_meta_(exec, static_cast<std::size_t>(shape_.kv_heads) * capacity_),
        error_(exec, 2),
        host_offsets_(2 * static_cast<std::size_t>(shape_.kv_heads) + 1, 0),
        hole_(static_cast<std::size_t>(sequences_), 0),
        ordered_(static_cast<std::size_t>(sequences_), 1),
        free_(pool_pages) {
    constexpr std::string_view where = "thrust::paged_store";
    require((keys == nullptr) == (values == nullptr), where, keys == nullptr ? "keys" : "values",
            "null", "both engine pools or neither");
    const auto policy = exec_.policy();
    ::thrust::fill_n(policy, lengths_.data(), sequences_, 0);
    ::thrust::fill_n(policy, holes_.data(), sequences_, -1);
    ::thrust::fill_n(policy, table_.data(), static_cast<std::int64_t>(sequences_) * stride_, -1);
    // the stack's top is page 0, so a fresh store hands out pages 0, 1, 2, ... in order
    ::thrust::sequence(policy, stack_.data(), stack_.data() + pool_pages, pool_pages - 1, -1);
    ::thrust::fill_n(policy, error_.data(), 2, 0);
  }

  paged_store(const paged_store&) = delete;
  paged_store& operator=(const paged_store&) = delete;

  // ---- the host shadow: shapes, never E memory ----
  [[nodiscard]] int columns() const { return columns_; }
  [[nodiscard]] int page_size() const { return page_; }
  [[nodiscard]] int pool_pages() const { return pool_pages_; }
  [[nodiscard]] int free_pages() const { return free_; }
  [[nodiscard]] int used_pages() const { return pool_pages_ - free_; }
  // Tokens a head-sequence can hold: its table's length, and the pages it has and the pool has.
  [[nodiscard]] int capacity(std::int64_t seq = -1) const {
    if (seq < 0) return capacity_;
    const std::int64_t most = (static_cast<std::int64_t>(pages_of(row_extent(seq))) + free_) * page_;
    return static_cast<int>(std::min<std::int64_t>(capacity_, most));
  }
  // Pages the pool must give seq for `tokens` more tokens (what append() takes, for checks): the
  // first fills a waiting hole.
  [[nodiscard]] int pages_to_append(std::int64_t seq, int tokens) const {
    const int extent = row_extent(seq);
    return pages_of(std::max(extent, length_[seq] + tokens)) - pages_of(extent);
  }
  // Rows a head-sequence's pages hold: its tokens, and a released row (the waiting hole) the next
  // append fills. Its pages are the first ceil(row_extent / P) of its table.
  [[nodiscard]] int row_extent(std::int64_t seq) const { return length_[seq] + hole_[seq]; }
  // Whether slot i is row i for every slot (a host shadow, conservative: false from a round that
  // left a hole until a round compacts or a reset).
  [[nodiscard]] bool rows_in_slot_order(std::int64_t seq) const { return ordered_[seq] != 0; }
  // Bytes of the pages in use (keys and values): memory is held, and released, page by page.
  [[nodiscard]] std::int64_t resident_bytes() const {
    return static_cast<std::int64_t>(used_pages()) * page_ * 2 * shape_.head_dim *
           static_cast<std::int64_t>(sizeof(T));
  }

  // ---- E memory, for the Thrust algorithms run on exec().policy() ----
  [[nodiscard]] const E& exec() const { return exec_; }
  [[nodiscard]] const T* key_pool() const { return keys_; }
  [[nodiscard]] const T* value_pool() const { return values_; }
  // [sequences, table_stride()] page ids; entries past a head-sequence's pages are stale.
  [[nodiscard]] const std::int32_t* page_table() const { return table_.data(); }
  [[nodiscard]] std::int64_t table_stride() const { return stride_; }
  [[nodiscard]] std::int32_t* positions() { return positions_.data(); }
  [[nodiscard]] const std::int32_t* positions() const { return positions_.data(); }
  [[nodiscard]] const std::int32_t* lengths() const { return lengths_.data(); }
  // [sequences, capacity] the row of each slot (seq * capacity + i), in its pages.
  [[nodiscard]] const std::int32_t* row_map() const { return row_map_.data(); }
  // Side column j: [sequences, capacity] floats, slot i of seq at j's seq * capacity + i.
  [[nodiscard]] float* column(int j) {
    require(j >= 0 && j < columns_, "thrust::paged_store.column", "j", j,
            [&] { return "in [0, " + std::to_string(columns_) + ")"; });
    return columns_data_.data() + static_cast<std::size_t>(j) * sequences_ * capacity_;
  }
  // The KV heads seq0, seq0 + 1, ... as segments of a local CSR `offsets` (E memory): keys and
  // values through the row map and the page table, positions dense.
  [[nodiscard]] std::pair<segmented_rows<T>, segmented_rows<T>> head_rows(
      std::int64_t seq0, const std::int32_t* offsets) const {
    segmented_rows<T> k{keys_, offsets, positions_.data() + seq0 * capacity_,
                        static_cast<std::int64_t>(capacity_) * shape_.head_dim, shape_.kv_heads,
                        shape_.head_dim, table_.data() + seq0 * stride_, stride_, page_,
                        row_map_.data() + seq0 * capacity_, capacity_};
    auto v = k;
    v.data = values_;
    return {k, v};
  }

  // Appends k, v ([tokens, kv_heads, d] views in E memory) to every KV head of (request, layer)
  // at positions first_position, first_position + 1, ...; checked like thrust::dense_store's
  // (shape, ascending positions, room in each head's table) and for pages in the pool, before
  // anything changes.
  template <class L>
  void append(int request, int layer, kv_view<const T, L, memory_space> k,
              kv_view<const T, L, memory_space> v, std::int32_t first_position) {
    constexpr std::string_view where = "thrust::paged_store.append";
    check_append(where, request, layer, k, v, first_position);
    const int H = shape_.kv_heads;
    const std::int64_t seq0 = shape_.sequence(request, layer, 0);
    int pages = 0;
    for (int h = 0; h < H; ++h) pages += pages_to_append(seq0 + h, k.tokens);
    require(pages <= free_, where, "k.tokens", k.tokens, [&] {
      return "pages in the pool: " + std::to_string(pages) + " needed, " + std::to_string(free_) +
             " free of " + std::to_string(pool_pages_);
    });
    if (k.tokens == 0) return;
    desc_.assign(1, 0);
    first_.clear();
    seqs_.clear();
    for (int h = 0; h < H; ++h) {
      const int n = pages_to_append(seq0 + h, k.tokens);
      if (n == 0) continue;
      desc_.push_back(desc_.back() + n);
      first_.push_back(pages_of(row_extent(seq0 + h)));
      seqs_.push_back(static_cast<std::int32_t>(seq0 + h));
    }
    move_pages(/*take=*/true);
    const auto policy = exec_.policy();
    ::thrust::for_each_n(
        policy, ::thrust::counting_iterator<std::int64_t>(0),
        static_cast<std::int64_t>(k.tokens) * H * shape_.head_dim,
        detail::append_paged_fn<T, L, memory_space>{
            k, v, keys_, values_, table_.data(), stride_, page_, positions_.data(),
            columns_data_.data(), columns_, sequences_ * capacity_, lengths_.data(), holes_.data(),
            row_map_.data(), seq0, capacity_, first_position, error_.data() + 1});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), H,
                         detail::append_lengths_fn{lengths_.data(), holes_.data(), seq0, k.tokens});
    for (int h = 0; h < H; ++h) hole_[seq0 + h] = 0;
    appended(request, layer, k.tokens, first_position + k.tokens);
  }

  // Keeps, for each KV head h of (request, layer), kept_counts[h] slots: the h-th run of `kept`
  // (E memory, ascending slots below the head's length, runs back to back); kept slot i becomes
  // slot i (positions, columns and row map with it). Per head, from the counts: one slot released
  // with no hole waiting leaves its row as the hole (no row moves, no page returns); any other
  // release compacts the rows (kept slot i into row i) and returns the pages past
  // ceil(kept_counts[h] / P); none released changes nothing. Counts checked here; slots on the
  // device (check()).
  void retain(int request, int layer, std::span<const int> kept_counts, const std::int32_t* kept) {
    constexpr std::string_view where = "thrust::paged_store.retain";
    check_request_layer(where, request, layer);
    const int H = shape_.kv_heads;
    const int d = shape_.head_dim;
    const std::int64_t seq0 = shape_.sequence(request, layer, 0);
    const std::int64_t num_kept =
        detail::retain_offsets(where, kept_counts, length_.data() + seq0, H, host_offsets_.data());
    require(num_kept == 0 || kept != nullptr, where, "kept", "null", "the kept slots in E memory");
    std::int32_t* modes = host_offsets_.data() + H + 1;
    bool moves = false, holes = false;
    for (int h = 0; h < H; ++h) {
      const std::int64_t seq = seq0 + h;
      modes[h] = kept_counts[h] == length_[seq]                       ? detail::retain_unchanged
                 : kept_counts[h] == length_[seq] - 1 && !hole_[seq] ? detail::retain_leaves_hole
                                                                      : detail::retain_compacts;
      moves = moves || modes[h] == detail::retain_compacts;
      holes = holes || modes[h] == detail::retain_leaves_hole;
    }
    copy_to_device(exec_, std::span<const std::int32_t>(host_offsets_), kept_offsets_);
    const std::int32_t* dev_modes = kept_offsets_.data() + H + 1;
    const auto policy = exec_.policy();
    const ::thrust::counting_iterator<std::int64_t> zero(0);
    if (num_kept > 0) {
      ::thrust::for_each_n(policy, zero, num_kept,
                           detail::check_kept_fn{kept, kept_offsets_.data(), lengths_.data(), seq0,
                                                 H, kept_.data(), error_.data()});
    }
    if (holes) {  // the released rows, before the row map compacts
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), H,
                           detail::hole_row_fn{kept_.data(), kept_offsets_.data(), dev_modes,
                                               row_map_.data(), holes_.data(), seq0, capacity_});
    }
    if (num_kept > 0) {
      if (moves) {
        const auto [k, v] = head_rows(seq0, kept_offsets_.data());
        for (const auto& rows : {k, v}) {
          T* data = rows.data == keys_ ? keys_ : values_;
          ::thrust::for_each_n(policy, zero, num_kept * d,
                               detail::gather_kept_fn<T>{rows, kept_offsets_.data(), dev_modes,
                                                         kept_.data(), packed_.data()});
          ::thrust::for_each_n(policy, zero, num_kept * d,
                               detail::scatter_kept_fn<T>{data, table_.data() + seq0 * stride_, stride_,
                                                          page_, H, d, kept_offsets_.data(),
                                                          dev_modes, packed_.data()});
        }
      }
      compact_slots(positions_.data() + seq0 * capacity_, num_kept);
      // a compacting head's row map is rewritten below (slot i is row i): compacted only when
      // some head keeps its rows in place
      if (holes) compact_slots(row_map_.data() + seq0 * capacity_, num_kept);
      for (int j = 0; j < columns_; ++j) {
        compact_slots(column(j) + seq0 * capacity_, num_kept);
      }
      if (moves) {
        ::thrust::for_each_n(policy, zero, num_kept,
                             detail::identity_rows_fn{row_map_.data(), kept_offsets_.data(), dev_modes,
                                                      seq0, capacity_, H});
      }
    }
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), H,
                         detail::retain_lengths_fn{lengths_.data(), holes_.data(), kept_offsets_.data(),
                                                   dev_modes, seq0});
    desc_.assign(1, 0);
    first_.clear();
    seqs_.clear();
    for (int h = 0; h < H; ++h) {
      const std::int64_t seq = seq0 + h;
      const int before = pages_of(row_extent(seq));
      if (modes[h] == detail::retain_leaves_hole) {
        hole_[seq] = 1;
        ordered_[seq] = 0;
      } else if (modes[h] == detail::retain_compacts) {
        hole_[seq] = 0;
        ordered_[seq] = 1;
      }
      length_[seq] = kept_counts[h];
      const int after = pages_of(row_extent(seq));
      if (before > after) {
        desc_.push_back(desc_.back() + before - after);
        first_.push_back(after);
        seqs_.push_back(static_cast<std::int32_t>(seq));
      }
    }
    move_pages(/*take=*/false);
  }

  // Drops every token of a request and returns its pages to the pool.
  void reset(int request) {
    check_request("thrust::paged_store.reset", request);
    const std::int64_t per = shape_.sequences_per_request();
    desc_.assign(1, 0);
    first_.clear();
    seqs_.clear();
    for (std::int64_t s = request * per; s < (request + 1) * per; ++s) {
      if (row_extent(s) > 0) {
        desc_.push_back(desc_.back() + pages_of(row_extent(s)));
        first_.push_back(0);
        seqs_.push_back(static_cast<std::int32_t>(s));
      }
      hole_[s] = 0;
      ordered_[s] = 1;
    }
    move_pages(/*take=*/false);
    ::thrust::fill_n(exec_.policy(), lengths_.data() + request * per, per, 0);
    ::thrust::fill_n(exec_.policy(), holes_.data() + request * per, per, -1);
    forget(request);
  }

  // Raises what the device found since the last check (a retain's bad slots; a NaN or Inf key or
  // value appended) as kvsift::error, and clears it. One counted device-to-host read.
  void check() {
    int error[2] = {0, 0};
    copy_to_host(exec_, error_, std::span<int>(error, 2));
    if (error[0] == 0 && error[1] == 0) return;
    ::thrust::fill_n(exec_.policy(), error_.data(), 2, 0);
    if (error[0] != 0) {
      throw make_error("thrust::paged_store.retain", "kept", "slots found invalid on the device",
                       "ascending slots below each head's length (each offending slot i was "
                       "replaced by slot i)");
    }
    throw make_error("thrust::paged_store.append", "k/v", "NaN or Inf found on the device",
                     "finite numbers (NaN/Inf activations poison every score that reads them)");
  }

  // Bytes of E memory the store allocated (the pool when it owns it, tables, metadata, scratch):
  // all of it at construction.
  [[nodiscard]] std::size_t allocated_bytes() const {
    return own_keys_.bytes() + own_values_.bytes() + table_.bytes() + stack_.bytes() +
           positions_.bytes() + columns_data_.bytes() + lengths_.bytes() + row_map_.bytes() +
           holes_.bytes() + kept_offsets_.bytes() +
           kept_.bytes() + page_desc_.bytes() + packed_.bytes() + packed_meta_.bytes() + error_.bytes();
  }

 private:
  [[nodiscard]] int pages_of(int tokens) const { return (tokens + page_ - 1) / page_; }
  static std::int64_t checked_sequences(const model_shape& shape, int requests, int capacity,
                                        int page_size, int pool_pages, int columns) {
    constexpr std::string_view where = "thrust::paged_store";
    require(page_size > 0, where, "page_size", page_size, "> 0 tokens per page");
    require(pool_pages > 0, where, "pool_pages", pool_pages, "> 0");
    require(columns >= 0, where, "columns", columns, ">= 0");
    require(checked_product(max_allocation_bytes, pool_pages, page_size, shape.head_dim, sizeof(T))
                .has_value() &&
                static_cast<std::int64_t>(pool_pages) * page_size <= std::numeric_limits<std::int32_t>::max(),
            where, "pool_pages", pool_pages,
            "a [pool_pages, page_size, d] pool that fits in max_allocation_bytes, rows int32");
    const std::int64_t seqs = static_cast<std::int64_t>(requests) * shape.sequences_per_request();
    require(checked_product(max_allocation_bytes, seqs, capacity, sizeof(std::int32_t)).has_value(),
            where, "capacity", capacity, "[sequences, capacity] positions that fit in max_allocation_bytes");
    return seqs;
  }
  [[nodiscard]] std::size_t pool_elements() const {
    return static_cast<std::size_t>(pool_pages_) * page_ * shape_.head_dim;
  }
  // Moves the runs in desc_ / first_ / seqs_ between the free stack and the page tables (take:
  // stack -> tables) on the device: one upload of the runs, one kernel; the stack's height is the
  // host shadow free_.
  void move_pages(bool take) {
    const int runs = static_cast<int>(seqs_.size());
    if (runs == 0) return;
    const std::int64_t total = desc_.back();
    host_desc_.assign(desc_.begin(), desc_.end());
    host_desc_.insert(host_desc_.end(), first_.begin(), first_.end());
    host_desc_.insert(host_desc_.end(), seqs_.begin(), seqs_.end());
    copy_to_device(exec_, std::span<const std::int32_t>(host_desc_), page_desc_);
    const auto policy = exec_.policy();
    if (take) {
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), total,
                           detail::take_pages_fn{page_desc_.data(), runs, stack_.data(), free_,
                                                 table_.data(), stride_});
      free_ -= static_cast<int>(total);
    } else {
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), total,
                           detail::give_pages_fn{page_desc_.data(), runs, stack_.data(), free_,
                                                 table_.data(), stride_});
      free_ += static_cast<int>(total);
    }
  }
  // Kept slot i of each head of a dense [kv_heads, capacity] block becomes slot i.
  template <class U>
  void compact_slots(U* block, std::int64_t num_kept) {
    const auto policy = exec_.policy();
    const int H = shape_.kv_heads;
    U* packed = reinterpret_cast<U*>(packed_meta_.data());
    static_assert(sizeof(U) == sizeof(std::int32_t));
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), num_kept,
                         detail::gather_slots_fn<U>{block, capacity_, H, kept_offsets_.data(),
                                                    kept_offsets_.data() + H + 1, kept_.data(), packed});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), num_kept,
                         detail::scatter_slots_fn<U>{block, capacity_, H, kept_offsets_.data(),
                                                     kept_offsets_.data() + H + 1, packed});
  }

  E exec_;
  int page_;
  int pool_pages_;
  int columns_;
  std::int64_t sequences_;
  std::int64_t stride_;                   // page-table entries per head-sequence
  buffer<T, E> own_keys_, own_values_;    // empty over an engine's pool
  T* keys_;
  T* values_;
  buffer<std::int32_t, E> table_;         // [sequences, stride] page ids
  buffer<std::int32_t, E> stack_;         // [pool_pages] free page ids, the top at free_ - 1
  buffer<std::int32_t, E> positions_;     // [sequences, capacity]
  buffer<float, E> columns_data_;         // [columns, sequences, capacity]
  buffer<std::int32_t, E> lengths_;       // [sequences]
  buffer<std::int32_t, E> row_map_;       // [sequences, capacity] each slot's row
  buffer<std::int32_t, E> holes_;         // [sequences] the waiting hole's row, or -1
  buffer<std::int32_t, E> kept_offsets_;  // [2 kv_heads + 1] a retain's CSR, then each head's mode
  buffer<std::int32_t, E> kept_;          // [kv_heads * capacity] a retain's checked slots
  buffer<std::int32_t, E> page_desc_;     // a page move's runs: CSR, first entries, seqs
  buffer<T, E> packed_;                   // [kv_heads * capacity, d] a retain's kept rows
  buffer<std::int32_t, E> packed_meta_;   // [kv_heads * capacity] a retain's positions / column
  buffer<int, E> error_;                  // [2] bad kept slot, NaN/Inf: raised by check()
  std::vector<std::int32_t> host_offsets_;  // a retain's descriptor, built on the host
  std::vector<char> hole_;                // host shadow: a hole waits in seq's rows
  std::vector<char> ordered_;             // host shadow: slot i is row i (conservative)
  int free_;                              // host shadow: free pages (the stack's height)
  std::vector<std::int32_t> desc_, first_, seqs_, host_desc_;  // a page move's runs (host)
};

}  // namespace kvsift::thrust
