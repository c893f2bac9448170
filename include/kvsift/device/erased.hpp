// SPDX-License-Identifier: Apache-2.0
#pragma once

// A method over device memory behind the host's erased lifecycle, and a registry of them:
//
//   device::staged_method<M>       M = method<thrust::dense_store<T, E>, Recipe, E> or
//                                  method<thrust::paged_store<T, E>, Recipe, E> (the one-tier
//                                  methods) or a two-tier method over a thrust::tiered_store<T, E>
//                                  (synckv, heterocache, freekv) on a device exec
//                                  (exec::sim_cpp / sim_omp; exec::cuda, cuda/exec.cuh, under
//                                  nvcc), as an any_kv_method<T>: it owns its arena, its exec,
//                                  its store and M; host inputs are staged into E memory, the
//                                  plan and the attention output read back
//   device::method_registry_on<T, E>  a method_registry<T> whose eleven built-in entries build
//                                  their method that way, the one-tier ones over a
//                                  thrust::paged_store when given a page size (the one-tier name
//                                  -> composition map is
//                                  detail::visit_one_tier, the host's; the two-tier methods'
//                                  params are the host registry's: detail::synckv_params_of,
//                                  heterocache_params_of, freekv_params_of)
//
//   auto reg = kvsift::device::method_registry_on<float, kvsift::exec::sim_omp>(
//       kvsift::default_method_registry<float>());
//   auto m = reg.make("snapkv", config);     // an any_kv_method<float> over device memory
//
// For whole-engine parity runs (`kvsift eval --exec thrust-omp`; docs/device.md), not for driving
// a device: every call stages its inputs and reads the plan back, so a step is not capturable.
//
// The working-set accessors follow the store: length() and next_position() are host shadows;
// position(seq, i) is one counted D2H read (a dense store's slot i; a tiered store's i-th
// resident position, as store::tiered's slot i). Once a tiered store holds far slots
// (far_tier::attend), length() and position() leave them out, as the host's working set does
// (its far rows are the plan's far part), at three counted D2H reads a call. key() and value()
// throw (the rows are not host memory, so contiguous_rows() is false and a caller uses
// attend()). The host lifecycle's checks
// all hold: views and counts are validated before anything is staged, and the activations'
// finiteness is checked on the host as the host path does, so a NaN is a kvsift::error with
// nothing changed. A tiered store's host pool and device tier both hold `capacity` tokens.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/device/deferred_recall.hpp>
#include <kvsift/device/evict.hpp>
#include <kvsift/device/sparse_read.hpp>
#include <kvsift/device/speculative.hpp>
#include <kvsift/method/any_method.hpp>
#include <kvsift/method/erased.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/paged_store.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsift::device {

template <class M>
class staged_method final : public any_kv_method<typename M::element_type> {
 public:
  using T = typename M::element_type;
  using E = typename M::exec_type;
  using Store = typename M::store_type;
  static_assert(thrust::DeviceExec<E>, "device::staged_method runs a method on a device exec");
  static constexpr bool tiered = std::is_same_v<Store, thrust::tiered_store<T, E>>;
  static constexpr bool paged = std::is_same_v<Store, thrust::paged_store<T, E>>;
  static_assert(tiered || paged || std::is_same_v<Store, thrust::dense_store<T, E>>,
                "device::staged_method: M must be a method over thrust::dense_store<T, E>, "
                "thrust::paged_store<T, E> or thrust::tiered_store<T, E>");

  // The method `name` with params p over a store of `requests` request slots of `capacity`
  // tokens per head-sequence (a dense store: one side column, H2O's running scores; a paged
  // store: the same, in pages of `page_size` tokens from one pool of the pages a full cache of
  // the slots needs; a tiered store: `capacity` in its host pool and in its device tier).
  staged_method(std::string name, const model_shape& shape, int requests, int capacity,
                typename M::params p, int page_size = 16)
      : name_(std::move(name)),
        arena_(std::make_unique<thrust::device_arena>(thrust::device_arena::default_max_cached_bytes,
                                                      E::backing())),
        exec_(*arena_),
        store_(make_store(exec_, shape, requests, capacity, page_size)),
        m_(std::make_unique<M>(*store_, std::move(p))),
        query_(exec_, one_token_each(shape, requests, shape.q_heads)),
        key_(exec_, one_token_each(shape, requests, shape.kv_heads)),
        value_(exec_, one_token_each(shape, requests, shape.kv_heads)),
        out_(exec_, one_token_each(shape, requests, shape.q_heads)) {}
  staged_method(const staged_method&) = delete;
  staged_method& operator=(const staged_method&) = delete;
  ~staged_method() override = default;  // members go in reverse order: the arena last

  void prefill(int layer, std::span<const prefill_chunk<T>> chunks) override {
    const auto& sh = store_->shape();
    const std::string where = name_ + ".prefill";
    std::size_t kv_rows = 0, q_rows = 0;
    for (const auto& c : chunks) {  // what staging reads, checked before it reads
      c.keys.validate(where, "keys", sh.kv_heads, sh.head_dim);
      c.values.validate(where, "values", sh.kv_heads, sh.head_dim);
      require(c.values.tokens == c.keys.tokens, where, "values.tokens", c.values.tokens,
              "keys.tokens (" + std::to_string(c.keys.tokens) + ")");
      const bool queries = M::caps.needs_queries && c.queries.tokens > 0;
      if (queries) c.queries.validate(where, "queries", sh.q_heads, sh.head_dim);
      require_finite(where, c, M::caps.needs_queries);
      kv_rows += static_cast<std::size_t>(c.keys.tokens) * sh.kv_heads;
      q_rows += queries ? static_cast<std::size_t>(c.queries.tokens) * sh.q_heads : 0;
    }
    const auto d = static_cast<std::size_t>(sh.head_dim);
    grow(prompt_keys_, kv_rows * d);
    grow(prompt_values_, kv_rows * d);
    grow(prompt_queries_, q_rows * d);
    host_k_.clear();
    host_v_.clear();
    host_q_.clear();
    for (const auto& c : chunks) {
      pack(c.keys, host_k_);
      pack(c.values, host_v_);
      if (M::caps.needs_queries && c.queries.tokens > 0) pack(c.queries, host_q_);
    }
    thrust::copy_to_device(exec_, std::span<const T>(host_k_), prompt_keys_);
    thrust::copy_to_device(exec_, std::span<const T>(host_v_), prompt_values_);
    if (!host_q_.empty()) thrust::copy_to_device(exec_, std::span<const float>(host_q_), prompt_queries_);
    using space = typename E::memory_space;
    std::vector<typename M::chunk_type> staged;
    staged.reserve(chunks.size());
    std::size_t k_at = 0, q_at = 0;
    for (const auto& c : chunks) {
      const bool queries = M::caps.needs_queries && c.queries.tokens > 0;
      staged.push_back({c.request,
                        kv_view<const T, nhd, space>::contiguous(prompt_keys_.data() + k_at, c.keys.tokens,
                                                                 sh.kv_heads, sh.head_dim),
                        kv_view<const T, nhd, space>::contiguous(prompt_values_.data() + k_at, c.keys.tokens,
                                                                 sh.kv_heads, sh.head_dim),
                        queries ? kv_view<const float, nhd, space>::contiguous(
                                      prompt_queries_.data() + q_at, c.queries.tokens, sh.q_heads,
                                      sh.head_dim)
                                : kv_view<const float, nhd, space>{},
                        c.first_position, c.last});
      k_at += static_cast<std::size_t>(c.keys.tokens) * sh.kv_heads * d;
      q_at += queries ? static_cast<std::size_t>(c.queries.tokens) * sh.q_heads * d : 0;
    }
    m_->prefill(layer, std::span<const typename M::chunk_type>(staged));
  }

  const attention_plan& decode(int layer, std::span<const decode_token<T>> tokens) override {
    const auto& dp = m_->decode(layer, stage(name_ + ".decode", tokens, /*check_finite=*/true));
    plan_.requests = dp.requests;
    plan_.slots.offsets.assign(dp.offsets.begin(), dp.offsets.end());
    plan_.positions.offsets = plan_.slots.offsets;
    plan_.slots.values.resize(static_cast<std::size_t>(dp.size()));
    plan_.positions.values.resize(static_cast<std::size_t>(dp.size()));
    if constexpr (tiered) {
      // a tiered plan reads every resident token in position order: slot j of a segment is its
      // j-th resident token, as store::tiered's slots are (the device's physical tier slots are
      // its own business, and position(seq, j) reads the j-th)
      for (int g = 0; g + 1 < static_cast<int>(plan_.slots.offsets.size()); ++g) {
        auto seg = plan_.slots[g];
        for (std::size_t j = 0; j < seg.size(); ++j) seg[j] = static_cast<std::int32_t>(j);
      }
    } else {
      thrust::copy_to_host(exec_, dp.slots, std::span<std::int32_t>(plan_.slots.values));
    }
    thrust::copy_to_host(exec_, dp.positions, std::span<std::int32_t>(plan_.positions.values));
    if (dp.page_offsets.empty()) {
      plan_.pages.clear();
    } else {
      plan_.pages.offsets.assign(dp.page_offsets.begin(), dp.page_offsets.end());
      plan_.pages.values.resize(static_cast<std::size_t>(dp.page_offsets.back()));
      thrust::copy_to_host(exec_, dp.pages, std::span<std::int32_t>(plan_.pages.values));
    }
    return plan_;
  }

  // out: [tokens.size(), q_heads, d] host floats, as the host lifecycle's attend().
  void attend(int layer, std::span<const decode_token<T>> tokens, float* out) const override {
    m_->attend(layer, stage(name_ + ".attend", tokens, /*check_finite=*/false), out_.data());
    const auto& sh = store_->shape();
    const auto n = tokens.size() * static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
    require(out != nullptr || n == 0, name_ + ".attend", "out", "null", "host memory for the output");
    thrust::copy_to_host(exec_, out_, std::span<float>(out, n));
  }

  void after_attention(int layer, std::span<const decode_token<T>> tokens) override {
    m_->after_attention(layer, stage(name_ + ".after_attention", tokens, /*check_finite=*/false));
  }

  void reset(int request) override { m_->reset(request); }
  [[nodiscard]] method_stats stats() const override { return m_->stats(); }
  [[nodiscard]] std::int64_t pages() const override {
    if constexpr (paged) {
      return store_->used_pages();
    } else {
      return -1;
    }
  }
  [[nodiscard]] capabilities caps() const override { return M::caps; }
  [[nodiscard]] const std::string& name() const override { return name_; }
  [[nodiscard]] model_shape shape() const override { return store_->shape(); }
  [[nodiscard]] int length(std::int64_t seq) const override {
    if constexpr (tiered) {
      if (store_->far_installed()) return static_cast<int>(resident_positions(seq).size());
    }
    return store_->length(seq);
  }
  [[nodiscard]] std::int32_t position(std::int64_t seq, int slot) const override {
    require(seq >= 0 && seq < store_->sequences(), name_ + ".position", "seq", seq,
            "a head-sequence of the store");
    const auto in_range = [&](int n) {
      require(slot >= 0 && slot < n, name_ + ".position", "slot", slot,
              "< the head-sequence's length (" + std::to_string(n) + ")");
    };
    if constexpr (tiered) {
      if (store_->far_installed()) {
        const auto resident = resident_positions(seq);
        in_range(static_cast<int>(resident.size()));
        return resident[static_cast<std::size_t>(slot)];
      }
    }
    in_range(store_->length(seq));
    std::int32_t p = 0;
    const std::int32_t* at = nullptr;
    if constexpr (tiered) {
      at = store_->plan_positions();
    } else {
      at = store_->positions();
    }
    thrust::copy_to_host(exec_, at + seq * store_->capacity() + slot, std::span<std::int32_t>(&p, 1));
    return p;
  }
  [[nodiscard]] const T* key(std::int64_t, int) const override { throw not_host_memory("key"); }
  [[nodiscard]] const T* value(std::int64_t, int) const override { throw not_host_memory("value"); }
  [[nodiscard]] std::int32_t next_position(int request, int layer) const override {
    return store_->next_position(request, layer);
  }
  [[nodiscard]] std::int64_t resident_bytes() const override { return store_->resident_bytes(); }
  [[nodiscard]] bool contiguous_rows(std::int64_t) const override { return false; }

  [[nodiscard]] M& get() { return *m_; }
  [[nodiscard]] const Store& store() const { return *store_; }
  [[nodiscard]] thrust::device_arena& arena() const { return *arena_; }

 private:
  static std::unique_ptr<Store> make_store(const E& e, const model_shape& shape, int requests,
                                           int capacity, int page_size) {
    if constexpr (tiered) {
      return std::make_unique<Store>(e, shape, requests, capacity, capacity);
    } else if constexpr (paged) {
      require(page_size > 0, "device::staged_method", "page_size", page_size, "> 0 tokens");
      const std::int64_t pool = static_cast<std::int64_t>(std::max(requests, 0)) *
                                shape.sequences_per_request() * ((capacity + page_size - 1) / page_size);
      require(pool > 0 && pool <= std::numeric_limits<int>::max(), "device::staged_method",
              "capacity", capacity, "a pool of 1 to 2^31 - 1 pages");
      return std::make_unique<Store>(e, shape, requests, capacity, page_size, static_cast<int>(pool),
                                     /*columns=*/1);
    } else {
      return std::make_unique<Store>(e, shape, requests, capacity, /*columns=*/1);
    }
  }
  // A tiered store's working set of head-sequence seq less its far slots: the positions of its
  // resident rows, ascending (three counted D2H reads: the plan's slots and positions, the
  // slots' pool rows).
  [[nodiscard]] std::vector<std::int32_t> resident_positions(std::int64_t seq) const {
    const int n = store_->length(seq);
    const auto row = seq * store_->capacity();
    std::vector<std::int32_t> slots(static_cast<std::size_t>(n)), at(slots.size()),
        pool(static_cast<std::size_t>(store_->capacity()));
    thrust::copy_to_host(exec_, store_->plan_slots() + row, std::span<std::int32_t>(slots));
    thrust::copy_to_host(exec_, store_->plan_positions() + row, std::span<std::int32_t>(at));
    thrust::copy_to_host(exec_, store_->slot_pool() + row, std::span<std::int32_t>(pool));
    std::vector<std::int32_t> out;
    for (int i = 0; i < n; ++i) {
      if (pool[static_cast<std::size_t>(slots[i])] < 0) out.push_back(at[i]);
    }
    return out;
  }
  // Elements of one token of each request slot: `heads` rows of d each.
  static std::size_t one_token_each(const model_shape& sh, int requests, int heads) {
    return static_cast<std::size_t>(std::max(requests, 0)) * std::max(heads, 0) * std::max(sh.head_dim, 0);
  }

  template <class U>
  void grow(thrust::buffer<U, E>& b, std::size_t n) {
    if (b.size() < n) b = thrust::buffer<U, E>(exec_, n);
  }
  // Appends a host view's rows, token-major (nhd), to `out`.
  template <class U, class L>
  static void pack(const kv_view<const U, L>& v, std::vector<U>& out) {
    for (int t = 0; t < v.tokens; ++t) {
      for (int h = 0; h < v.heads; ++h) {
        const U* row = v.row(t, h);
        out.insert(out.end(), row, row + v.dim);
      }
    }
  }
  // The step's tokens with their arrays copied into E memory (null ones stay null); with
  // `check_finite` (decode, as the host lifecycle checks there) their activations are finite.
  std::span<const decode_token<T>> stage(const std::string& where,
                                         std::span<const decode_token<T>> tokens,
                                         bool check_finite) const {
    const auto& sh = store_->shape();
    require(tokens.size() <= static_cast<std::size_t>(store_->requests()), where, "tokens.size()",
            tokens.size(), "<= the store's request slots (" + std::to_string(store_->requests()) + ")");
    if (check_finite) {
      for (std::size_t i = 0; i < tokens.size(); ++i) require_finite(where, i, tokens[i], sh, M::caps.needs_queries);
    }
    const std::size_t qn = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
    const std::size_t kn = static_cast<std::size_t>(sh.kv_heads) * sh.head_dim;
    step_q_.assign(tokens.size() * qn, 0.0f);
    step_k_.assign(tokens.size() * kn, T{});
    step_v_.assign(tokens.size() * kn, T{});
    staged_tokens_.resize(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto& t = tokens[i];
      if (t.query) std::copy_n(t.query, qn, step_q_.begin() + static_cast<std::ptrdiff_t>(i * qn));
      if (t.key) std::copy_n(t.key, kn, step_k_.begin() + static_cast<std::ptrdiff_t>(i * kn));
      if (t.value) std::copy_n(t.value, kn, step_v_.begin() + static_cast<std::ptrdiff_t>(i * kn));
      staged_tokens_[i] = {t.request, t.query ? query_.data() + i * qn : nullptr,
                           t.key ? key_.data() + i * kn : nullptr,
                           t.value ? value_.data() + i * kn : nullptr};
    }
    thrust::copy_to_device(exec_, std::span<const float>(step_q_), query_);
    thrust::copy_to_device(exec_, std::span<const T>(step_k_), key_);
    thrust::copy_to_device(exec_, std::span<const T>(step_v_), value_);
    return staged_tokens_;
  }
  [[nodiscard]] error not_host_memory(std::string_view what) const {
    return make_error(name_ + "." + std::string(what), "memory", E::name,
                      "host memory: a device store's rows are read by attend() (contiguous_rows() is false)");
  }

  std::string name_;
  std::unique_ptr<thrust::device_arena> arena_;  // first in, last out: every buffer below is its memory
  E exec_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<M> m_;
  // E memory: one token per request slot (decode), and the prompt's chunks (grown as needed)
  mutable thrust::buffer<float, E> query_;
  mutable thrust::buffer<T, E> key_, value_;
  mutable thrust::buffer<float, E> out_;
  thrust::buffer<T, E> prompt_keys_{exec_, 0}, prompt_values_{exec_, 0};
  thrust::buffer<float, E> prompt_queries_{exec_, 0};
  // host staging
  std::vector<T> host_k_, host_v_;
  std::vector<float> host_q_;
  mutable std::vector<float> step_q_;
  mutable std::vector<T> step_k_, step_v_;
  mutable std::vector<decode_token<T>> staged_tokens_;
  attention_plan plan_;
};

// `base`'s entries (names, order, resident-fraction hooks) with the built-in names' `make`
// REPLACED: a wrapper `base` put around a built-in entry's make (a config transform, another
// composition under that name) is not kept, so apply such wrappers to the result (as `kvsift
// eval` gives SyncKV and HeteroCache their roles after choosing the exec). The one-tier ones
// build their built-in composition (detail::visit_one_tier), SyncKV, HeteroCache and FreeKV
// synckv / heterocache / freekv, over device memory on exec E, each method with its own
// arena (staged_method); another entry (a user's own) throws kvsift::error when made.
// With page_size > 0 the one-tier methods run over a thrust::paged_store of pages of that many
// tokens (one pool per method, a full cache's pages: `kvsift eval --store paged --exec ...`).
template <Element T, thrust::DeviceExec E>
method_registry<T> method_registry_on(const method_registry<T>& base, int page_size = 0) {
  require(page_size >= 0, "device::method_registry_on", "page_size", page_size,
          ">= 0 (0: a dense store; > 0: pages of that many tokens)");
  method_registry<T> out;
  for (const auto& name : base.names()) {
    method_entry<T> e = base.at(name);
    if (kvsift::detail::is_one_tier_method(name)) {
      e.make = [name, page_size](const method_config& c) {
        require(c.capacity > 0, "method_registry", "capacity", c.capacity, "> 0 tokens");
        const auto build = [&]<class Store>() {
          return kvsift::detail::visit_one_tier<Store, E>(
              name, c, [&]<class M>(typename M::params p) -> std::unique_ptr<any_kv_method<T>> {
                return std::make_unique<staged_method<M>>(name, c.shape, c.requests, c.capacity,
                                                          std::move(p), page_size);
              });
        };
        return page_size > 0 ? build.template operator()<thrust::paged_store<T, E>>()
                             : build.template operator()<thrust::dense_store<T, E>>();
      };
    } else if (name == "synckv") {
      e.make = [name](const method_config& c) -> std::unique_ptr<any_kv_method<T>> {
        require(c.capacity > 0, "method_registry", "capacity", c.capacity, "> 0 tokens");
        return std::make_unique<staged_method<synckv<T, E>>>(
            name, c.shape, c.requests, c.capacity, kvsift::detail::synckv_params_of<T>(c));
      };
    } else if (name == "freekv") {
      e.make = [name](const method_config& c) -> std::unique_ptr<any_kv_method<T>> {
        require(c.capacity > 0, "method_registry", "capacity", c.capacity, "> 0 tokens");
        return std::make_unique<staged_method<freekv<T, E>>>(
            name, c.shape, c.requests, c.capacity, kvsift::detail::freekv_params_of<T>(c));
      };
    } else if (name == "heterocache") {
      e.make = [name](const method_config& c) -> std::unique_ptr<any_kv_method<T>> {
        require(c.capacity > 0, "method_registry", "capacity", c.capacity, "> 0 tokens");
        return std::make_unique<staged_method<heterocache<T, E>>>(
            name, c.shape, c.requests, c.capacity, kvsift::detail::heterocache_params_of<T>(c));
      };
    } else {
      e.make = [name](const method_config&) -> std::unique_ptr<any_kv_method<T>> {
        std::string known;
        for (const auto& n : method_names()) known += (known.empty() ? "" : ", ") + n;
        throw make_error("method_registry on exec " + std::string(E::name), "name", name,
                         "a built-in method (" + known +
                             ", synckv, heterocache, freekv): a user's own entry has no device "
                             "composition here");
      };
    }
    out.add(std::move(e));
  }
  return out;
}

}  // namespace kvsift::device
