// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the two-tier schedules' device states share (device/deferred_recall.hpp: SyncKV,
// device/deferred_recall_stars.hpp: HeteroCache, device/speculative.hpp: FreeKV), as
// detail::two_tier is for their host states:
// a prefill chunk's checks and a decode step over a thrust::tiered_store on a device exec.
//
//   detail::device_two_tier<T, E> step(store);        // buffers for the store's requests
//   step.check_chunk(store, where, paper, layer, chunk, totals, prompt_open);
//   step.append_and_plan(store, layer, tokens, plan);  // after the state's installs
//   step.attend(store, layer, tokens, plan, out);
//
// The host appends each request's token through the store (a device copy), packs the step's plan
// (every resident token of each KV head, ascending by position: tiered_store::plan_sorted per
// request) and uploads the plan's CSR and the tokens' positions (counted host-to-device writes);
// the library's attention runs over the plan on the device. Nothing is read back. Every buffer is
// allocated once, at construction, for the store's requests and tier capacity. Cost per step:
// one plan_sorted and one attention_over per request.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/device/one_tier.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::detail {

template <Element T, thrust::DeviceExec E>
class device_two_tier {
 public:
  using Store = thrust::tiered_store<T, E>;
  using chunk_type = prefill_chunk<T, typename E::memory_space>;

  explicit device_two_tier(const Store& st)
      : exec_(st.exec()),
        H_(st.shape().kv_heads),
        G_(st.shape().q_heads / st.shape().kv_heads),
        cap_(st.tier_capacity()),
        plan_offsets_(exec_, static_cast<std::size_t>(st.requests()) * H_ + 1),
        local_offsets_(exec_, static_cast<std::size_t>(st.requests()) * (H_ + 1)),
        plan_slots_(exec_, static_cast<std::size_t>(st.requests()) * per_request()),
        plan_positions_(exec_, plan_slots_.size()),
        step_positions_(exec_, static_cast<std::size_t>(st.requests())),
        attention_ws_(exec_, thrust::attention_workspace_bytes(
                                 static_cast<std::int64_t>(per_request()), G_, 1)) {}

  // The host state's chunk checks (detail::two_tier::check_chunk: the prompt still open, the
  // chunk's newest queries, the last chunk's query, room in the host pool) plus room in the
  // device tier: every head holds the whole prompt until its end.
  void check_chunk(const Store& st, std::string_view where, std::string_view paper, int layer,
                   const chunk_type& c, const prefill_totals& tot, bool prompt_open) const {
    require(prompt_open, where, "request", c.request,
            "a request whose prompt has not ended on this layer (reset() it first)");
    require(c.queries.tokens <= c.keys.tokens, where, "queries.tokens", c.queries.tokens,
            "<= keys.tokens (the chunk's newest queries)");
    if (c.last) {
      require(c.queries.tokens >= 1, where, "queries.tokens", c.queries.tokens,
              ">= 1 on the last chunk: " + std::string(paper) + " scores the prompt's last query");
    }
    const int room = st.host_capacity() - st.host_length(c.request, layer);
    require(tot.added[c.request] + c.keys.tokens <= room, where, "keys.tokens", c.keys.tokens,
            "<= the room left in the host pool (" + std::to_string(room) + ")");
    const int tier_room = cap_ - st.host_length(c.request, layer);
    require(tot.added[c.request] + c.keys.tokens <= tier_room, where, "keys.tokens", c.keys.tokens,
            "<= the room left in the device tier (" + std::to_string(tier_room) +
                "): the whole prompt is resident until its end");
  }

  // Appends each request's token at its next position, then packs the step's plan: segment
  // i * kv_heads + h reads every resident token of KV head h of tokens[i]'s request, by position.
  void append_and_plan(Store& st, int layer, std::span<const decode_token<T>> tokens,
                       thrust::device_plan& plan) {
    const auto& sh = st.shape();
    using view = kv_view<const T, nhd, typename E::memory_space>;
    host_positions_.clear();
    for (const auto& t : tokens) {
      const std::int32_t pos = st.next_position(t.request, layer);
      st.append(t.request, layer, view::contiguous(t.key, 1, H_, sh.head_dim),
                view::contiguous(t.value, 1, H_, sh.head_dim), pos);
      host_positions_.push_back(pos);
    }
    plan.offsets.assign(1, 0);
    plan_base_.clear();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      plan_base_.push_back(plan.offsets.back());
      seqs_.clear();
      for (int h = 0; h < H_; ++h) seqs_.push_back(sh.sequence(tokens[i].request, layer, h));
      st.plan_sorted(seqs_, local_offsets_.data() + i * (H_ + 1),
                     plan_slots_.data() + plan_base_.back(),
                     plan_positions_.data() + plan_base_.back());
      for (int h = 0; h < H_; ++h) {
        plan.offsets.push_back(plan.offsets.back() + st.length(seqs_[h]));
      }
    }
    plan.page_offsets.clear();
    plan.pages = nullptr;
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(plan.offsets), plan_offsets_);
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(host_positions_), step_positions_);
    plan.device_offsets = plan_offsets_.data();
    plan.slots = plan_slots_.data();
    plan.positions = plan_positions_.data();
  }

  // The library's attention over the step's plan: out [tokens, q_heads, d] in E memory.
  void attend(const Store& st, int layer, std::span<const decode_token<T>> tokens,
              const thrust::device_plan& plan, float* out) const {
    const auto& sh = st.shape();
    const int d = sh.head_dim;
    const std::int64_t stride = static_cast<std::int64_t>(cap_) * d;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::int64_t seq0 = sh.sequence(tokens[i].request, layer, 0);
      const thrust::segmented_rows<T> k{st.tier_keys() + seq0 * stride, st.slot_offsets(),
                                        st.slot_positions() + seq0 * cap_, stride, H_, d};
      auto v = k;
      v.data = st.tier_values() + seq0 * stride;
      const thrust::window_queries q{tokens[i].query, step_positions_.data() + i, 1, H_, G_};
      const std::int64_t base = plan_base_[i];
      const std::int64_t total = plan.offsets[(i + 1) * H_] - base;
      const thrust::attention_plan local{local_offsets_.data() + i * (H_ + 1),
                                         plan_slots_.data() + base};
      thrust::attention_over(exec_.policy(), k, v, q, local, static_cast<std::int64_t>(H_) * cap_,
                             total, out + i * sh.q_heads * d, nullptr, attention_ws_.data(),
                             attention_ws_.size());
    }
  }

 private:
  [[nodiscard]] std::size_t per_request() const { return static_cast<std::size_t>(H_) * cap_; }

  E exec_;
  int H_, G_, cap_;
  // E memory: the plan (CSR, slots, positions), each request's local CSR, the tokens' positions,
  // attention's scratch
  thrust::buffer<std::int32_t, E> plan_offsets_, local_offsets_, plan_slots_, plan_positions_,
      step_positions_;
  mutable thrust::buffer<std::byte, E> attention_ws_;  // attend() is const
  // host: the step's descriptor
  std::vector<std::int64_t> seqs_, plan_base_;
  std::vector<std::int32_t> host_positions_;
};

}  // namespace kvsift::detail
