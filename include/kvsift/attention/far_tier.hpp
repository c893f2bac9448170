// SPDX-License-Identifier: Apache-2.0
#pragma once

// Attention of a decode step split by tier, over a two-tier store (store::tiered): the rows of the
// working set (resident: on the device in a deployment) and rows of the host pool that are not
// resident, each attended where it lies as a partial attention with its log-sum-exp, then merged
// (attention/merge.hpp). The merge equals the attention over both sets together, which is what
// recalling the host rows first and attending the working set would give, up to rounding; no row
// moves between tiers. This is the host half of the far-tier policy `attend`:
//
//   attend_host_rows(store, seq, positions, q, G, out, lse)   the host pool's rows at `positions`
//   attend_slots(store, seq, slots, q, G, out, lse)           the working set's rows at `slots`
//   attention::merge_partials(...)                           the two combined
//
// q is the G query heads [G, d] of KV head seq's group; out [G, d], lse [G]. Positions ascend and
// are in the host pool; slots ascend and are resident. Checked (kvsift::error, nothing written).

#include <kvsift/attention/merge.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/decode_attention.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/store/tiered.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvsift::attention {

namespace detail {
// seq is a head-sequence of st; q, out and lse are arrays.
template <Element T>
void check_step(std::string_view where, const store::tiered<T>& st, std::int64_t seq, const float* q,
                const float* out, const float* lse) {
  require(seq >= 0 && seq < static_cast<std::int64_t>(st.requests()) * st.shape().sequences_per_request(),
          where, "seq", seq, "a head-sequence of the store");
  require(q != nullptr && out != nullptr && lse != nullptr, where, "q/out/lse", "null",
          "[G, d], [G, d] and [G] arrays");
}

template <Element T>
void attend_rows_partial(int d, std::span<const T* const> keys, std::span<const T* const> values,
                         const float* q, int G, float* out, float* lse) {
  thread_local std::vector<float> logits;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  cpu::attend_group_at<T>(q, G, d, keys.size(), keys.data(), values.data(), out, scale, logits, lse);
}
}  // namespace detail

// The partial attention of q over the host pool rows of head-sequence seq at `positions`.
template <Element T>
void attend_host_rows(const store::tiered<T>& st, std::int64_t seq, std::span<const std::int32_t> positions,
                      const float* q, int G, float* out, float* lse) {
  constexpr std::string_view where = "attention::attend_host_rows";
  detail::check_step(where, st, seq, q, out, lse);
  const auto [request, layer] = st.request_layer(seq);
  thread_local std::vector<const T*> keys, values;
  keys.clear();
  values.clear();
  int at = 0;
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const int idx = st.host_index(request, layer, positions[i], at);
    require(idx >= 0 && (i == 0 || positions[i] > positions[i - 1]), where,
            [i] { return "positions[" + std::to_string(i) + "]"; }, positions[i],
            [] { return std::string("ascending positions of the head-sequence's host pool"); });
    keys.push_back(st.host_key(seq, idx));
    values.push_back(st.host_value(seq, idx));
    at = idx + 1;
  }
  detail::attend_rows_partial<T>(st.shape().head_dim, keys, values, q, G, out, lse);
}

// The partial attention of q over the working-set slots `slots` of head-sequence seq.
template <Element T>
void attend_slots(const store::tiered<T>& st, std::int64_t seq, std::span<const std::int32_t> slots,
                  const float* q, int G, float* out, float* lse) {
  constexpr std::string_view where = "attention::attend_slots";
  detail::check_step(where, st, seq, q, out, lse);
  thread_local std::vector<const T*> keys, values;
  keys.clear();
  values.clear();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    require(slots[i] >= 0 && slots[i] < st.length(seq) && (i == 0 || slots[i] > slots[i - 1]), where,
            [i] { return "slots[" + std::to_string(i) + "]"; }, slots[i],
            [&] { return "ascending slots in [0, " + std::to_string(st.length(seq)) + ")"; });
    keys.push_back(st.key(seq, slots[i]));
    values.push_back(st.value(seq, slots[i]));
  }
  detail::attend_rows_partial<T>(st.shape().head_dim, keys, values, q, G, out, lse);
}

// A decode step's attention under far_tier::attend: for the tokens of a batch (token i is
// request plan.requests[i], its query [q_heads, d] at query_of(i)), each KV head attends its
// resident slots plan.slots[s] and its host-pool positions plan.far[s] (s = i * kv_heads + h) as
// two partials, merged by log-sum-exp into out [tokens, q_heads, d]. Equal to attending the union
// of the two sets of rows, up to rounding. Segments run in parallel (cpu::parallel_for): each one
// computes both of its partials, so the host part of one head overlaps the resident part of
// another.
template <Element T, class QueryOf>
void attend_plan_far(const store::tiered<T>& st, int layer, std::size_t tokens, QueryOf&& query_of,
                     const index_sets& slots, const index_sets& far, std::span<const int> requests,
                     float* out) {
  constexpr std::string_view where = "attention::attend_plan_far";
  const auto& sh = st.shape();
  const auto jobs = static_cast<std::int64_t>(tokens) * sh.kv_heads;
  require(slots.segments() == jobs && far.segments() == jobs && requests.size() == tokens, where,
          "plan segments", far.segments(), [&] {
            return "one slot and one far segment per token and KV head (" + std::to_string(jobs) + ")";
          });
  const int G = sh.group_size(), d = sh.head_dim;
  const std::size_t out_stride = static_cast<std::size_t>(sh.q_heads) * d;
  const std::int64_t work =
      static_cast<std::int64_t>(slots.values.size() + far.values.size()) * d * (G + 1) / std::max<std::int64_t>(jobs, 1);
  cpu::parallel_for(jobs, [&](std::int64_t job) {
    thread_local std::vector<float> near_out, near_lse, far_out, far_lse;
    near_out.resize(static_cast<std::size_t>(G) * d);
    far_out.resize(near_out.size());
    near_lse.resize(static_cast<std::size_t>(G));
    far_lse.resize(near_lse.size());
    const auto i = static_cast<std::size_t>(job / sh.kv_heads);
    const int h = static_cast<int>(job % sh.kv_heads);
    const auto seq = sh.sequence(requests[i], layer, h);
    const float* q = query_of(i) + static_cast<std::size_t>(h) * G * d;
    attend_slots(st, seq, slots[static_cast<int>(job)], q, G, near_out.data(), near_lse.data());
    attend_host_rows(st, seq, far[static_cast<int>(job)], q, G, far_out.data(), far_lse.data());
    merge_partials(G, d, near_out.data(), near_lse.data(), far_out.data(), far_lse.data(),
                   out + i * out_stride + static_cast<std::size_t>(h) * G * d);
  }, cpu::par, work);
}

}  // namespace kvsift::attention
