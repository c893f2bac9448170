// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::deferred_recall over a device store: the one device body of SyncKV and HeteroCache,
// method<thrust::tiered_store<T, E>, Recipe, E>. The host body is
// method/schedule/deferred_recall.hpp; this one has the same control flow and calls the roles'
// device content half (detail::device_roles: device/roles_clusters.hpp for roles::clusters,
// device/roles_stars.hpp for roles::stars) where the host body calls roles/.
//
//   kvsift::thrust::sim_arena arena;
//   kvsift::exec::sim_cpp e{arena};
//   kvsift::thrust::tiered_store<float, kvsift::exec::sim_cpp> st(e, shape, requests, 4096, 4096);
//   kvsift::synckv<float, kvsift::exec::sim_cpp> m(st, params);   // or heterocache<T, E>
//   m.prefill(layer, chunk);                 // chunk views in E's memory
//   const auto& plan = m.decode(layer, tokens);   // thrust::device_plan (slots are tier slots)
//   m.attend(layer, tokens, out);            // queries and out in E's memory
//   m.after_attention(layer, tokens);
//
//   prefill   appends every chunk to both tiers; at a prompt's end the roles place its heads
//   decode t  installs the recall recorded after the request's previous step (a lazy copy queue),
//             appends the token and plans every resident token (detail::device_two_tier)
//   after t   where the trigger fires, the roles refresh and record the next recall
// Every buffer is allocated at construction; a decode step uploads descriptors and reads nothing
// back.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/device/roles_clusters.hpp>
#include <kvsift/device/roles_stars.hpp>
#include <kvsift/device/two_tier.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/schedule/deferred_recall.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace kvsift {

template <Element T, thrust::DeviceExec E, class Recipe>
class schedule::deferred_recall::state<thrust::tiered_store<T, E>, Recipe>
    : public detail::device_roles<typename Recipe::roles, T, E, Recipe> {
  using content = detail::device_roles<typename Recipe::roles, T, E, Recipe>;
  using chunk_type = prefill_chunk<T, typename E::memory_space>;
  using content::slots_;
  using content::step_;

 public:
  using plan_type = thrust::device_plan;
  using typename content::slot_state;

  template <class R>
  static constexpr capabilities caps{
      .changes_physical_length = true,
      .safe_with_shared_prefix = false,
      .needs_queries = true,
      .cuda_graph_safe = false,  // the laws hold on exec::sim; exec::cuda captures no step yet
      .speculative_decoding = false,
  };
  static constexpr bool after_attention_reads_queries = content::reads_step_query;

  template <class M>
  explicit state(const M& m) : content(m) {}
  state(state&&) noexcept = default;

  [[nodiscard]] int steps(std::size_t slot) const { return slots_[slot].steps; }
  [[nodiscard]] const slot_state& at(std::size_t slot) const { return slots_[slot]; }
  [[nodiscard]] bool recall_in_flight(std::size_t) const { return false; }  // a lazy copy queue
  // Tests only: while true, decode() does not install recorded recalls (they stay pending and the
  // affected heads keep their old rows: stale, as a forgotten install would leave them). The next
  // refresh still installs a pending one first (decisions apply in order).
  void debug_skip_installs(bool skip) { this->skip_installs_ = skip; }

  // The host state's chunk checks plus room in the device tier (detail::device_two_tier).
  template <class M>
  void check_chunk(const M& m, std::string_view where, int layer, const chunk_type& c,
                   prefill_totals& tot) const {
    step_.check_chunk(m.store(), where, Recipe::paper, layer, c, tot,
                      slots_[m.slot(c.request, layer)].prompt_end < 0);
  }
  template <class M>
  void check_prefill(const M& m, std::string_view where, int layer,
                     std::span<const chunk_type> chunks, const prefill_totals& tot) const {
    for (const auto& c : chunks) {
      const int n = m.store().host_length(c.request, layer) + tot.added[c.request];
      if (c.last) m.parts().roles.check_prompt(where, n, m.parts().budgeter);
    }
  }
  template <class M>
  void prefill(M& m, int layer, std::span<const chunk_type> chunks) {
    auto& st = m.store();
    for (const auto& c : chunks) {
      st.append(c.request, layer, c.keys, c.values, c.first_position);
      if (!c.last) continue;
      const auto k = m.slot(c.request, layer);
      auto& s = slots_[k];
      s = {};
      s.prompt_end = st.next_position(c.request, layer);
      s.n = st.host_length(c.request, layer);
      m.history().clear(k);
      this->begin(m, layer, c, s, k);
    }
  }

  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    const auto& st = m.store();
    for (const auto& t : tokens) {
      const auto& s = slots_[m.slot(t.request, layer)];
      require(s.prompt_end >= 0, where, "request", t.request,
              "a request whose prompt ended on this layer (prefill with last = true first)");
      require(st.host_length(t.request, layer) < st.host_capacity(), where, "request", t.request,
              "a head-sequence with room for one more token in the host pool");
      for (int h = 0; h < this->H_; ++h) {
        require(this->installed_length(m, s, t.request, layer, h) < this->cap_, where, "request",
                t.request,
                "room for one more token in the device tier of each KV head (tier_capacity " +
                    std::to_string(this->cap_) + ")");
      }
    }
  }
  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens, plan_type& plan) {
    for (const auto& t : tokens) {
      this->begin_step(m, layer, t);
      ++slots_[m.slot(t.request, layer)].steps;
    }
    step_.append_and_plan(m.store(), layer, tokens, plan);
  }
  // The library's attention over the step's plan: out [tokens, q_heads, d] in E memory.
  template <class M>
  void attend(const M& m, int layer, std::span<const decode_token<T>> tokens, float* out) const {
    step_.attend(m.store(), layer, tokens, m.plan(), out);
  }
  template <class M>
  void after_attention(M& m, int layer, std::span<const decode_token<T>> tokens) {
    const bool any = this->refreshing(layer);
    for (const auto& t : tokens) {
      auto& s = slots_[m.slot(t.request, layer)];
      content::end_round(s);
      const trigger_context ctx{lifecycle_event::decode_step, s.steps, 0, 0, 0};
      if (any && m.parts().trigger.fires(ctx)) this->fire(m, layer, t);
    }
  }

  template <class M>
  void reset(M& m, int request) {
    for (int l = 0; l < this->layers_; ++l) slots_[m.slot(request, l)] = {};
    m.store().reset(request);
  }
  // Reads back the store's copied rows (and HeteroCache's drift events): counted D2H reads.
  template <class M>
  void stats(const M& m, method_stats& s) const {
    s.bytes_transferred = m.store().bytes_to_device();
    s.far_rows = step_.far_rows();
    s.far_overlaps = step_.far_overlaps();
    s.refreshes = this->refreshes();
    s.stalls = 0;
    s.layer_budgets = this->layer_budgets_;
  }
  template <class M>
  void release(M&) {}
};

}  // namespace kvsift
