// SPDX-License-Identifier: Apache-2.0
#pragma once

// thrust::dense_store — store::dense over an exec's memory (REDESIGN §3.3, §3.4): the device half
// of a one-tier store.
//
//   kvsift::thrust::sim_arena arena;
//   kvsift::exec::sim_cpp e{arena};
//   kvsift::thrust::dense_store<float, kvsift::exec::sim_cpp> st(e, shape, requests, capacity,
//                                                                 /*columns=*/1);
//   st.append(request, layer, k, v, first_position);   // k, v: kv_view in E's memory
//   st.retain(request, layer, kept_counts, kept);       // host counts, device slots
//   auto rows = st.key_rows();                          // segmented_rows for the algorithms
//
// Who owns what. The K/V rows are E memory: views of the engine's arrays (the constructor taking
// keys/values) or buffers the store allocates once. The store owns its metadata, all allocated
// once at construction: per-row original positions, `columns` per-slot float side columns (a
// scorer's per-token state — H2O's running scores — that must move with its row), the
// per-sequence lengths and CSR offsets the Thrust algorithms address rows by, and the scratch of
// a retain. Nothing is allocated after construction except Thrust's own scan scratch, which E's
// policy takes from its arena (served from the cache after the first call).
//
// Contract: counts are host shadows (the data decides which slots a retain keeps, the host how
// many); append and retain read nothing back and, once warm, allocate nothing. Host-visible
// arguments are checked before anything changes; bad kept slots and NaN/Inf keys or values are
// found on the device and raised by the next check(), after the append or retain ran. Laws
// (tests/thrust/test_dense_store.cpp): rows, positions and lengths equal store::dense's in slot
// order after the same calls. Layout, errors and laws in full: docs/architecture.md, "Design
// notes from the headers".

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/thrust/common.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/gather.hpp>

#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/scan.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsift::thrust {

namespace detail {

// Copies tokens [0, tokens) of every KV head of a (request, layer) from an nhd/hnd view into rows
// lengths[seq0 + h] + t of the store, with position first + t and 0 in every column.
template <class T, class L, class Space>
struct append_rows_fn {
  kv_view<const T, L, Space> k, v;
  T* keys;
  T* values;
  std::int32_t* positions;
  float* columns;                 // [columns, sequences, capacity] or null
  int num_columns;
  std::int64_t column_stride;     // sequences * capacity
  const std::int32_t* lengths;    // before the append
  std::int64_t seq0;
  std::int64_t capacity;
  std::int32_t first;
  int* nonfinite;                 // set to 1 when a key or value is NaN or Inf
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int d = k.dim;
    const int c = static_cast<int>(e % d);
    const std::int64_t th = e / d;
    const int h = static_cast<int>(th % k.heads);
    const int t = static_cast<int>(th / k.heads);
    const std::int64_t row = (seq0 + h) * capacity + lengths[seq0 + h] + t;
    const T key = k.row(t, h)[c];
    const T value = v.row(t, h)[c];
    keys[row * d + c] = key;
    values[row * d + c] = value;
    const float fk = to_float(key), fv = to_float(value);
    if (!(fk - fk == 0.0f && fv - fv == 0.0f)) *nonfinite = 1;  // x - x is NaN for NaN and Inf
    if (c == 0) {
      positions[row] = first + t;
      for (int j = 0; j < num_columns; ++j) columns[j * column_stride + row] = 0.0f;
    }
  }
};

// The kept slots of a retain, checked against the heads' lengths before it: a slot outside
// [0, length) or not above its predecessor sets *error and is replaced by its own index i (a
// slot the head has, since counts <= lengths), so a bad set never addresses another sequence.
struct check_kept_fn {
  const std::int32_t* kept;          // caller's, [num_kept]
  const std::int32_t* kept_offsets;  // [heads + 1]
  const std::int32_t* lengths;       // before the retain
  std::int64_t seq0;
  int heads;
  std::int32_t* checked;             // [num_kept]
  int* error;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int h = segment_of(kept_offsets, heads, t);
    const std::int32_t i = static_cast<std::int32_t>(t - kept_offsets[h]);
    const std::int32_t s = kept[t];
    const bool ok = s >= 0 && s < lengths[seq0 + h] && (i == 0 || kept[t - 1] < s);
    if (!ok) *error = 1;
    checked[t] = ok ? s : i;
  }
};

// lengths[seq0 + h] = kept_offsets[h + 1] - kept_offsets[h].
struct set_lengths_fn {
  std::int32_t* lengths;
  const std::int32_t* kept_offsets;
  std::int64_t seq0;
  KVSIFT_HOST_DEVICE void operator()(int h) const {
    lengths[seq0 + h] = kept_offsets[h + 1] - kept_offsets[h];
  }
};

}  // namespace detail

// What a one-tier device store keeps on the host (thrust::dense_store, thrust::paged_store):
// the shape, every head-sequence's length and each (request, layer)'s next position, as host
// shadows, so every count a step needs is known without reading device memory; and the checks
// of an append (request and layer in range, the views' shape, ascending positions, room in each
// head-sequence's `capacity` tokens) before anything changes.
class one_tier_shadow {
 public:
  [[nodiscard]] const model_shape& shape() const { return shape_; }
  [[nodiscard]] int requests() const { return requests_; }
  [[nodiscard]] std::int64_t sequences() const { return static_cast<std::int64_t>(length_.size()); }
  [[nodiscard]] int length(std::int64_t seq) const { return length_[seq]; }
  [[nodiscard]] int length(int request, int layer, int head) const {
    return length_[shape_.sequence(request, layer, head)];
  }
  [[nodiscard]] std::int32_t next_position(int request, int layer) const {
    return next_[static_cast<std::size_t>(request) * shape_.layers + layer];
  }
  [[nodiscard]] std::int64_t resident_tokens() const {
    std::int64_t t = 0;
    for (const int n : length_) t += n;
    return t;
  }

 protected:
  one_tier_shadow(std::string_view where, model_shape shape, int requests, int capacity)
      : shape_(checked(where, shape, requests, capacity)), requests_(requests), capacity_(capacity),
        length_(static_cast<std::size_t>(requests) * shape_.sequences_per_request(), 0),
        next_(static_cast<std::size_t>(requests) * shape_.layers, 0) {}

  void check_request(std::string_view where, int request) const {
    require(request >= 0 && request < requests_, where, "request", request,
            [&] { return "in [0, " + std::to_string(requests_) + ")"; });
  }
  void check_request_layer(std::string_view where, int request, int layer) const {
    check_request(where, request);
    require(layer >= 0 && layer < shape_.layers, where, "layer", layer,
            [&] { return "in [0, " + std::to_string(shape_.layers) + ")"; });
  }
  // An append of k, v to (request, layer) at first_position: everything but the store's own
  // resources (a paged store's pool) checked.
  template <class K>
  void check_append(std::string_view where, int request, int layer, const K& k, const K& v,
                    std::int32_t first_position) const {
    check_request_layer(where, request, layer);
    validate_kv_pair(where, k, v, shape_.kv_heads, shape_.head_dim);
    const std::int32_t next = next_position(request, layer);
    require(first_position >= next, where, "first_position", first_position, [&] {
      return ">= " + std::to_string(next) + " (positions ascend within a head-sequence)";
    });
    require_positions_fit(where, "first_position", first_position, k.tokens);
    const std::int64_t seq0 = shape_.sequence(request, layer, 0);
    for (int h = 0; h < shape_.kv_heads; ++h) {
      require(length_[seq0 + h] + k.tokens <= capacity_, where, "k.tokens", k.tokens, [&] {
        return "room in head-sequence (request " + std::to_string(request) + ", layer " +
               std::to_string(layer) + ", head " + std::to_string(h) + "): " +
               std::to_string(length_[seq0 + h]) + " resident of capacity " +
               std::to_string(capacity_);
      });
    }
  }
  // The shadows after an append of `tokens` to (request, layer) that ends before `next`.
  void appended(int request, int layer, int tokens, std::int32_t next) {
    const std::int64_t seq0 = shape_.sequence(request, layer, 0);
    for (int h = 0; h < shape_.kv_heads; ++h) length_[seq0 + h] += tokens;
    next_[static_cast<std::size_t>(request) * shape_.layers + layer] = next;
  }
  // The shadows after a reset of `request`.
  void forget(int request) {
    const std::int64_t per = shape_.sequences_per_request();
    for (std::int64_t s = 0; s < per; ++s) length_[request * per + s] = 0;
    for (int l = 0; l < shape_.layers; ++l) next_[static_cast<std::size_t>(request) * shape_.layers + l] = 0;
  }

  model_shape shape_;
  int requests_;
  int capacity_;
  std::vector<int> length_;         // host shadow: [sequences]
  std::vector<std::int32_t> next_;  // host shadow: [requests * layers]

 private:
  static model_shape checked(std::string_view where, model_shape shape, int requests, int capacity) {
    shape.validate(where);
    require(requests > 0, where, "requests", requests, "> 0");
    require(capacity > 0, where, "capacity", capacity, "> 0");
    return shape;
  }
};

template <Element T, DeviceExec E>
class dense_store : public one_tier_shadow {
 public:
  using element_type = T;
  using exec_type = E;
  using memory_space = typename E::memory_space;

  // A store that allocates its K/V rows in E's memory: [requests * layers * kv_heads, capacity, d].
  dense_store(const E& exec, model_shape shape, int requests, int capacity, int columns = 0)
      : dense_store(exec, shape, requests, capacity, columns, nullptr, nullptr) {}

  // A store over the engine's K/V memory in E's space: keys and values
  // [requests * layers * kv_heads, capacity, d]; the store owns only its metadata.
  dense_store(const E& exec, model_shape shape, int requests, int capacity, int columns, T* keys,
              T* values)
      : one_tier_shadow("thrust::dense_store", shape, requests, capacity), exec_(exec),
        columns_(columns), sequences_(checked_sequences(shape, requests, capacity, columns)),
        own_keys_(exec, keys == nullptr ? rows_elements() : 0),
        own_values_(exec, values == nullptr ? rows_elements() : 0),
        keys_(keys != nullptr ? keys : own_keys_.data()),
        values_(values != nullptr ? values : own_values_.data()),
        positions_(exec, static_cast<std::size_t>(sequences_) * capacity_),
        columns_data_(exec, static_cast<std::size_t>(columns_) * sequences_ * capacity_),
        lengths_(exec, static_cast<std::size_t>(sequences_)),
        offsets_(exec, static_cast<std::size_t>(sequences_) + 1),
        kept_offsets_(exec, static_cast<std::size_t>(shape_.kv_heads) + 1),
        kept_(exec, static_cast<std::size_t>(shape_.kv_heads) * capacity_),
        error_(exec, 2),
        workspace_(exec, workspace_bytes(shape_, capacity_)),
        host_offsets_(static_cast<std::size_t>(shape_.kv_heads) + 1, 0) {
    constexpr std::string_view where = "thrust::dense_store";
    require((keys == nullptr) == (values == nullptr), where, keys == nullptr ? "keys" : "values",
            "null", "both engine arrays or neither");
    const auto policy = exec_.policy();
    ::thrust::fill_n(policy, lengths_.data(), sequences_, 0);
    ::thrust::fill_n(policy, offsets_.data(), sequences_ + 1, 0);
    ::thrust::fill_n(policy, error_.data(), 2, 0);
  }

  dense_store(const dense_store&) = delete;
  dense_store& operator=(const dense_store&) = delete;

  // ---- the host shadow: shapes, never E memory ----
  [[nodiscard]] int capacity(std::int64_t = 0) const { return capacity_; }
  [[nodiscard]] int columns() const { return columns_; }
  [[nodiscard]] std::int64_t resident_bytes() const {
    return resident_tokens() * 2 * shape_.head_dim * static_cast<std::int64_t>(sizeof(T));
  }

  // ---- E memory, for the Thrust algorithms run on exec().policy() ----
  [[nodiscard]] const E& exec() const { return exec_; }
  [[nodiscard]] T* keys() { return keys_; }
  [[nodiscard]] T* values() { return values_; }
  [[nodiscard]] std::int32_t* positions() { return positions_.data(); }
  [[nodiscard]] const T* keys() const { return keys_; }
  [[nodiscard]] const T* values() const { return values_; }
  [[nodiscard]] const std::int32_t* positions() const { return positions_.data(); }
  [[nodiscard]] const std::int32_t* lengths() const { return lengths_.data(); }
  // Side column j: [sequences, capacity] floats, slot i of seq at j's seq * capacity + i.
  [[nodiscard]] float* column(int j) {
    require(j >= 0 && j < columns_, "thrust::dense_store.column", "j", j,
            [&] { return "in [0, " + std::to_string(columns_) + ")"; });
    return columns_data_.data() + static_cast<std::size_t>(j) * sequences_ * capacity_;
  }
  // The KV heads seq0, seq0 + 1, ... as segments of a local CSR `offsets` (E memory): keys and
  // values strided by capacity, with their positions (thrust::paged_store has the same call).
  [[nodiscard]] std::pair<segmented_rows<T>, segmented_rows<T>> head_rows(
      std::int64_t seq0, const std::int32_t* offsets) const {
    const std::int64_t stride = static_cast<std::int64_t>(capacity_) * shape_.head_dim;
    const segmented_rows<T> k{keys_ + seq0 * stride, offsets, positions_.data() + seq0 * capacity_,
                              stride, shape_.kv_heads, shape_.head_dim};
    auto v = k;
    v.data = values_ + seq0 * stride;
    return {k, v};
  }
  // Every head-sequence's keys (values) as segmented rows with their positions: the offsets are
  // refreshed from the device lengths on the device (one scan after a change, shared by both;
  // nothing read back).
  [[nodiscard]] segmented_rows<T> key_rows() { return rows_of(keys_); }
  [[nodiscard]] segmented_rows<T> value_rows() { return rows_of(values_); }

  // Appends k, v ([tokens, kv_heads, d] views in E memory) to every KV head of (request, layer)
  // at positions first_position, first_position + 1, ...; checked like store::dense::append
  // (shape, ascending positions, room) from the host shadow before anything changes.
  template <class L>
  void append(int request, int layer, kv_view<const T, L, memory_space> k,
              kv_view<const T, L, memory_space> v, std::int32_t first_position) {
    check_append("thrust::dense_store.append", request, layer, k, v, first_position);
    const std::int64_t seq0 = shape_.sequence(request, layer, 0);
    if (k.tokens == 0) return;
    const auto policy = exec_.policy();
    ::thrust::for_each_n(
        policy, ::thrust::counting_iterator<std::int64_t>(0),
        static_cast<std::int64_t>(k.tokens) * shape_.kv_heads * shape_.head_dim,
        detail::append_rows_fn<T, L, memory_space>{
            k, v, keys_, values_, positions_.data(), columns_data_.data(), columns_,
            sequences_ * capacity_, lengths_.data(), seq0, capacity_, first_position,
            error_.data() + 1});
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), shape_.kv_heads,
                         detail::grow_lengths_fn{lengths_.data(), seq0, k.tokens});
    offsets_stale_ = true;
    appended(request, layer, k.tokens, first_position + k.tokens);
  }

  // Keeps, for each KV head h of (request, layer), kept_counts[h] slots: the h-th run of `kept`
  // (E memory, ascending slots below the head's length, runs back to back). Positions and
  // columns travel with their rows; kept slot i becomes slot i. The counts are host data and
  // checked here (0 <= count <= length); the slots are device data, checked on the device (see
  // Errors above).
  void retain(int request, int layer, std::span<const int> kept_counts, const std::int32_t* kept) {
    constexpr std::string_view where = "thrust::dense_store.retain";
    check_request_layer(where, request, layer);
    const int H = shape_.kv_heads;
    const std::int64_t seq0 = shape_.sequence(request, layer, 0);
    const std::int64_t num_kept =
        detail::retain_offsets(where, kept_counts, length_.data() + seq0, H, host_offsets_.data());
    require(num_kept == 0 || kept != nullptr, where, "kept", "null", "the kept slots in E memory");
    copy_to_device(exec_, std::span<const std::int32_t>(host_offsets_), kept_offsets_);
    const auto policy = exec_.policy();
    if (num_kept > 0) {
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0), num_kept,
                           detail::check_kept_fn{kept, kept_offsets_.data(), lengths_.data(), seq0,
                                                 H, kept_.data(), error_.data()});
    }
    const std::int64_t base = seq0 * capacity_;
    const int d = shape_.head_dim;
    compact_rows(policy, keys_ + base * d, positions_.data() + base, H, capacity_, d,
                 kept_offsets_.data(), kept_.data(), num_kept, workspace_.data(), workspace_.size());
    compact_rows(policy, values_ + base * d, static_cast<std::int32_t*>(nullptr), H, capacity_, d,
                 kept_offsets_.data(), kept_.data(), num_kept, workspace_.data(), workspace_.size());
    for (int j = 0; j < columns_; ++j) {
      compact_rows(policy, column(j) + base, static_cast<std::int32_t*>(nullptr), H, capacity_, 1,
                   kept_offsets_.data(), kept_.data(), num_kept, workspace_.data(),
                   workspace_.size());
    }
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), H,
                         detail::set_lengths_fn{lengths_.data(), kept_offsets_.data(), seq0});
    offsets_stale_ = true;
    for (int h = 0; h < H; ++h) length_[seq0 + h] = kept_counts[h];
  }

  // Drops every token of a request (its slot in a continuous batch becomes free).
  void reset(int request) {
    check_request("thrust::dense_store.reset", request);
    const std::int64_t per = shape_.sequences_per_request();
    ::thrust::fill_n(exec_.policy(), lengths_.data() + request * per, per, 0);
    offsets_stale_ = true;
    forget(request);
  }

  // Raises what the device found since the last check (a retain's slots out of range or not
  // ascending; a NaN or Inf key or value appended) as kvsift::error, and clears it. One counted
  // device-to-host read: call it outside captured steps (between requests, with stats).
  void check() {
    int error[2] = {0, 0};
    copy_to_host(exec_, error_, std::span<int>(error, 2));
    if (error[0] == 0 && error[1] == 0) return;
    ::thrust::fill_n(exec_.policy(), error_.data(), 2, 0);
    const std::string also =
        error[0] != 0 && error[1] != 0 ? "; also: a NaN or Inf key or value was appended" : "";
    if (error[0] != 0) {
      throw make_error("thrust::dense_store.retain", "kept", "slots found invalid on the device",
                       "ascending slots below each head's length (each offending slot i was "
                       "replaced by slot i)" + also);
    }
    throw make_error("thrust::dense_store.append", "k/v", "NaN or Inf found on the device",
                     "finite numbers (NaN/Inf activations poison every score that reads them)");
  }

  // Bytes of E memory the store allocated for its metadata and scratch (and its rows when it
  // owns them): all of it at construction.
  [[nodiscard]] std::size_t allocated_bytes() const {
    return own_keys_.bytes() + own_values_.bytes() + positions_.bytes() + columns_data_.bytes() +
           lengths_.bytes() + offsets_.bytes() + kept_offsets_.bytes() + kept_.bytes() +
           error_.bytes() + workspace_.bytes();
  }

 private:
  static std::int64_t checked_sequences(const model_shape& shape, int requests, int capacity,
                                        int columns) {
    constexpr std::string_view where = "thrust::dense_store";
    require(requests > 0, where, "requests", requests, "> 0");
    require(capacity > 0, where, "capacity", capacity, "> 0");
    require(columns >= 0, where, "columns", columns, ">= 0");
    const std::int64_t seqs = static_cast<std::int64_t>(requests) * shape.sequences_per_request();
    require(checked_product(max_allocation_bytes, seqs, capacity, shape.head_dim, sizeof(T)).has_value(),
            where,
            "capacity", capacity, "a [sequences, capacity, d] array that fits in max_allocation_bytes");
    return seqs;
  }
  static std::size_t workspace_bytes(const model_shape& shape, int capacity) {
    const std::int64_t rows = static_cast<std::int64_t>(shape.kv_heads) * capacity;
    const std::size_t kv = compact_workspace_bytes<T>(rows, shape.head_dim, true);
    const std::size_t col = compact_workspace_bytes<float>(rows, 1, false);
    return kv > col ? kv : col;
  }
  [[nodiscard]] std::size_t rows_elements() const {
    return static_cast<std::size_t>(sequences_) * capacity_ * shape_.head_dim;
  }
  segmented_rows<T> rows_of(const T* data) {
    if (offsets_stale_) {
      ::thrust::inclusive_scan(exec_.policy(), lengths_.data(), lengths_.data() + sequences_,
                               offsets_.data() + 1);
      offsets_stale_ = false;
    }
    return segmented_rows<T>{data,
                             offsets_.data(),
                             positions_.data(),
                             static_cast<std::int64_t>(capacity_) * shape_.head_dim,
                             static_cast<int>(sequences_),
                             shape_.head_dim};
  }

  E exec_;
  int columns_;
  std::int64_t sequences_;
  buffer<T, E> own_keys_, own_values_;  // empty over engine memory
  T* keys_;
  T* values_;
  buffer<std::int32_t, E> positions_;     // [sequences, capacity]
  buffer<float, E> columns_data_;         // [columns, sequences, capacity]
  buffer<std::int32_t, E> lengths_;       // [sequences]
  buffer<std::int32_t, E> offsets_;       // [sequences + 1] CSR of lengths (key_rows())
  bool offsets_stale_ = false;            // lengths changed since offsets_ was scanned
  buffer<std::int32_t, E> kept_offsets_;  // [kv_heads + 1] a retain's descriptor
  buffer<std::int32_t, E> kept_;          // [kv_heads * capacity] a retain's checked slots
  buffer<int, E> error_;                  // [2] set by the device (bad kept slot, NaN/Inf), raised by check()
  buffer<std::byte, E> workspace_;        // compact_rows scratch
  std::vector<std::int32_t> host_offsets_;  // a retain's descriptor, built on the host
};

}  // namespace kvsift::thrust
