// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the one-tier schedules' device content halves share (device/evict.hpp,
// device/sparse_read.hpp), as detail::one_tier is for their host halves: a decode step over a
// device one-tier store (thrust::dense_store or thrust::paged_store: thrust::DeviceOneTierStore) on
// a device exec. The host appends each request's token through the store (a device copy), builds
// the step's descriptor from shapes (each request's local CSR of tokens and of the plan, its query
// position, the batch) and uploads it (counted host-to-device writes); the plan (slots and original
// positions) and the library's attention run on the device, reading rows through the store's
// head_rows() (strided, or through a page table). Every buffer is allocated once, at construction,
// for the store's requests and capacity.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/schedule/one_tier.hpp>
#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/paged_store.hpp>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kvsift::thrust {

// The attention plan of a device step: shapes on the host, indices in E memory. Segment
// i * kv_heads + h is what KV head h of the i-th request of the batch reads, ascending.
struct device_plan {
  std::vector<int> requests;          // [R] the batch, in call order
  std::vector<std::int32_t> offsets;  // [R * kv_heads + 1] host CSR of each segment's slots
  const std::int32_t* device_offsets = nullptr;  // the same CSR, E memory
  // [size()] E memory: store slots. Over a thrust::tiered_store under far_tier::attend a slot may
  // be far (its row lies in the pool): read slots through the store's rows() (working_rows).
  const std::int32_t* slots = nullptr;
  const std::int32_t* positions = nullptr;       // [size()] E memory: their original positions
  // page-level methods (Quest): the selected pages per segment (every page in a dense layer)
  std::vector<std::int32_t> page_offsets;  // [R * kv_heads + 1] host CSR; empty otherwise
  const std::int32_t* pages = nullptr;     // E memory, ascending per segment
  [[nodiscard]] std::int64_t size() const { return offsets.empty() ? 0 : offsets.back(); }
};

namespace detail {

// A plan reading every resident slot of a batch: slot j of segment s, and its position.
struct plan_every_slot_fn {
  const std::int32_t* offsets;    // [S + 1] the plan's CSR
  int segments;
  const std::int32_t* requests;   // [S / kv_heads] the batch
  int kv_heads;
  int layers;
  int layer;
  std::int64_t capacity;
  const std::int32_t* store_positions;  // [sequences, capacity]
  std::int32_t* slots;
  std::int32_t* positions;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(offsets, segments, e);
    const int j = static_cast<int>(e - offsets[s]);
    const std::int64_t seq =
        (static_cast<std::int64_t>(requests[s / kv_heads]) * layers + layer) * kv_heads +
        s % kv_heads;
    slots[e] = j;
    positions[e] = store_positions[seq * capacity + j];
  }
};

}  // namespace detail
// A one-tier store in a device exec's memory that the device one-tier states run over: host
// shadows of lengths, dense positions and side columns, a retain by host counts and device
// slots, and head_rows() for the Thrust algorithms (strided or through a page table).
template <class S>
concept DeviceOneTierStore =
    requires(S& s, const S& cs, std::int64_t seq, const std::int32_t* offsets,
             std::span<const int> counts) {
      typename S::exec_type;
      { cs.head_rows(seq, offsets) };
      { cs.positions() } -> std::convertible_to<const std::int32_t*>;
      { s.column(0) } -> std::convertible_to<float*>;
      s.retain(0, 0, counts, offsets);
      s.check();
    };

}  // namespace kvsift::thrust

namespace kvsift::detail {

template <class Store>
class device_one_tier : public one_tier<Store> {
 protected:
  using T = typename Store::element_type;
  using E = typename Store::exec_type;
  using base = one_tier<Store>;
  using space = typename E::memory_space;

 public:
  using plan_type = thrust::device_plan;

  // The library's attention over the step's plan: out [tokens, q_heads, d] in E memory.
  template <class M>
  void attend(const M& m, int layer, std::span<const decode_token<T>> tokens, float* out) const {
    const auto& sh = m.store().shape();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      attend_one(m, layer, i, tokens[i], out + i * sh.q_heads * sh.head_dim, nullptr);
    }
  }

 protected:
  template <class M>
  explicit device_one_tier(const M& m)
      : base(m),
        exec_(m.store().exec()),
        H_(m.store().shape().kv_heads),
        G_(m.store().shape().q_heads / m.store().shape().kv_heads),
        cap_(m.store().capacity()),
        plan_offsets_(exec_, batch_segments(m) + 1),
        plan_slots_(exec_, static_cast<std::size_t>(m.store().requests()) * per_round()),
        plan_positions_(exec_, plan_slots_.size()),
        batch_(exec_, static_cast<std::size_t>(m.store().requests())),
        step_offsets_(exec_, static_cast<std::size_t>(m.store().requests()) * (H_ + 1)),
        plan_local_d_(exec_, step_offsets_.size()),
        step_positions_(exec_, static_cast<std::size_t>(m.store().requests())),
        attention_ws_(exec_, thrust::attention_workspace_bytes(per_round(), G_, 1)) {}

  [[nodiscard]] std::size_t per_round() const { return static_cast<std::size_t>(H_) * cap_; }
  template <class M>
  [[nodiscard]] std::size_t batch_segments(const M& m) const {
    return static_cast<std::size_t>(m.store().requests()) * H_;
  }

  // Appends each request's token (counts the step), and uploads the step's descriptor: the
  // batch, each request's local CSR of tokens and its token's position.
  template <class M>
  void append_step(M& m, int layer, std::span<const decode_token<T>> tokens,
                   const std::vector<int>& requests) {
    auto& st = m.store();
    const auto& sh = st.shape();
    using view = kv_view<const T, nhd, space>;
    host_local_.clear();
    host_positions_.clear();
    for (const auto& t : tokens) {
      st.append(t.request, layer, view::contiguous(t.key, 1, sh.kv_heads, sh.head_dim),
                view::contiguous(t.value, 1, sh.kv_heads, sh.head_dim),
                st.next_position(t.request, layer));
      ++this->steps_[m.slot(t.request, layer)];
      host_local_.push_back(0);
      for (int h = 0; h < H_; ++h) {
        host_local_.push_back(host_local_.back() + st.length(sh.sequence(t.request, layer, h)));
      }
      host_positions_.push_back(st.next_position(t.request, layer) - 1);
    }
    thrust::copy_to_device(exec_, std::span<const int>(requests), batch_);
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(host_local_), step_offsets_);
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(host_positions_), step_positions_);
  }

  // The plan reading every resident slot of each request of the step (after append_step).
  template <class M>
  void plan_every_slot(M& m, int layer, thrust::device_plan& plan) {
    const int R = static_cast<int>(plan.requests.size());
    plan.offsets.assign(1, 0);
    for (int i = 0; i < R; ++i) {
      for (int h = 0; h < H_; ++h) {
        plan.offsets.push_back(plan.offsets.back() + host_local_[i * (H_ + 1) + h + 1] -
                               host_local_[i * (H_ + 1) + h]);
      }
    }
    plan.page_offsets.clear();
    plan.pages = nullptr;
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(plan.offsets), plan_offsets_);
    ::thrust::for_each_n(exec_.policy(), ::thrust::counting_iterator<std::int64_t>(0), plan.size(),
                         thrust::detail::plan_every_slot_fn{
                             plan_offsets_.data(), R * H_, batch_.data(), H_,
                             m.store().shape().layers, layer, cap_, m.store().positions(),
                             plan_slots_.data(), plan_positions_.data()});
    every_slot_ = true;
    publish(plan);
  }

  // A plan of selected slots (Quest's pages): request i's local CSR of the plan (host) and where
  // its slots start in plan_slots_; uploads the local CSRs and the plan's CSR.
  void plan_selected(thrust::device_plan& plan, std::span<const std::int32_t> local) {
    plan_local_.assign(local.begin(), local.end());
    const int R = static_cast<int>(plan.requests.size());
    plan.offsets.assign(1, 0);
    plan_base_.clear();
    for (int i = 0; i < R; ++i) {
      plan_base_.push_back(plan.offsets.back());
      for (int h = 0; h < H_; ++h) {
        plan.offsets.push_back(plan_base_.back() + plan_local_[i * (H_ + 1) + h + 1]);
      }
    }
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(plan.offsets), plan_offsets_);
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(plan_local_), plan_local_d_);
    every_slot_ = false;
    publish(plan);
  }

  void publish(thrust::device_plan& plan) const {
    plan.device_offsets = plan_offsets_.data();
    plan.slots = plan_slots_.data();
    plan.positions = plan_positions_.data();
  }

  // The rows of (request, layer)'s KV heads as segments with a local CSR (E memory).
  template <class M>
  [[nodiscard]] static std::pair<thrust::segmented_rows<T>, thrust::segmented_rows<T>> rows_of(
      const M& m, int request, int layer, const std::int32_t* offsets) {
    const Store& st = m.store();
    return st.head_rows(st.shape().sequence(request, layer, 0), offsets);
  }

  // Request i of the step: its KV heads' local CSR of tokens (E memory) and tokens in all.
  [[nodiscard]] const std::int32_t* local_offsets(std::size_t i) const {
    return step_offsets_.data() + i * (H_ + 1);
  }
  [[nodiscard]] std::int64_t local_items(std::size_t i) const {
    return host_local_[i * (H_ + 1) + H_];
  }

  // Attention of the step's token i over its plan: out [q_heads, d] (required by
  // attention_over) and, when given, the weights [G * items].
  template <class M>
  void attend_one(const M& m, int layer, std::size_t i, const decode_token<T>& t, float* out,
                  float* weights) const {
    const auto [k, v] = rows_of(m, t.request, layer, local_offsets(i));
    const thrust::window_queries q{t.query, step_positions_.data() + i, 1, H_, G_};
    const std::int64_t n = local_items(i);
    thrust::attention_plan plan{};
    std::int64_t candidates = n;
    if (!every_slot_) {
      plan = {plan_local_d_.data() + i * (H_ + 1), plan_slots_.data() + plan_base_[i]};
      candidates = plan_local_[i * (H_ + 1) + H_];
    }
    thrust::attention_over(exec_.policy(), k, v, q, plan, n, candidates, out, weights,
                           attention_ws_.data(), attention_ws_.size());
  }

  E exec_;
  int H_, G_, cap_;
  // E memory: the plan (CSR, slots, positions), the batch, each request's local CSRs of tokens
  // and of the plan, the tokens' positions, attention's scratch
  thrust::buffer<std::int32_t, E> plan_offsets_, plan_slots_, plan_positions_, batch_,
      step_offsets_, plan_local_d_, step_positions_;
  mutable thrust::buffer<std::byte, E> attention_ws_;  // attend() is const
  // host: the step's descriptor
  std::vector<std::int32_t> host_local_, host_positions_, plan_local_, plan_base_;
  bool every_slot_ = true;
};

}  // namespace kvsift::detail
