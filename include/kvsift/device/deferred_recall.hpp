// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::deferred_recall over a device store: the content that the schedule's one body
// (method/schedule/deferred_recall.hpp) calls when SyncKV or HeteroCache runs as
// method<thrust::tiered_store<T, E>, Recipe, E>: the roles' device halves
// (detail::device_roles: device/roles_clusters.hpp for roles::clusters, device/roles_stars.hpp
// for roles::stars) behind the calls that reach roles/ and the recall queue on the host.
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

namespace kvsift::detail {

template <Element T, thrust::DeviceExec E, class Recipe>
class deferred_recall_content<thrust::tiered_store<T, E>, Recipe>
    : public device_roles<typename Recipe::roles, T, E, Recipe> {
  using half = device_roles<typename Recipe::roles, T, E, Recipe>;

 public:
  using plan_type = thrust::device_plan;
  using typename half::slot_state;

  [[nodiscard]] bool recall_in_flight(std::size_t) const { return false; }  // a lazy copy queue
  // Tests only: while true, decode() does not install recorded recalls (they stay pending and the
  // affected heads keep their old rows: stale, as a forgotten install would leave them). The next
  // refresh still installs a pending one first (decisions apply in order).
  void debug_skip_installs(bool skip) { this->skip_installs_ = skip; }

  // The host content's chunk checks plus room in the device tier (detail::device_two_tier).
  template <class M>
  void check_chunk(const M& m, std::string_view where, int layer,
                   const typename M::chunk_type& c, prefill_totals& tot) const {
    this->step_.check_chunk(m.store(), where, Recipe::paper, layer, c, tot,
                            this->slots_[m.slot(c.request, layer)].prompt_end < 0);
  }
  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    two_tier<thrust::tiered_store<T, E>>::check_step(m, where, layer, tokens, [&](int r) {
      return this->slots_[m.slot(r, layer)].prompt_end >= 0;
    });
    for (const auto& t : tokens) {
      const auto& s = this->slots_[m.slot(t.request, layer)];
      for (int h = 0; h < this->H_; ++h) {
        require(this->installed_length(m, s, t.request, layer, h) < this->cap_, where, "request",
                t.request,
                "room for one more token in the device tier of each KV head (tier_capacity " +
                    std::to_string(this->cap_) + ")");
      }
    }
  }
  // The library's attention over the step's plan: out [tokens, q_heads, d] in E memory.
  template <class M>
  void attend(const M& m, int layer, std::span<const decode_token<T>> tokens, float* out) const {
    this->step_.attend(m.store(), layer, tokens, m.plan(), out);
  }
  // Reads back the store's copied rows (and HeteroCache's drift events): counted D2H reads.
  template <class M>
  void stats(const M& m, method_stats& s) const {
    s.bytes_transferred = m.store().bytes_to_device();
    s.far_rows = this->step_.far_rows();
    s.far_overlaps = this->step_.far_overlaps();
    s.refreshes = this->refreshes();
    s.stalls = 0;
    s.layer_budgets = this->layer_budgets_;
  }
  template <class M>
  void release(M&) {}

 protected:
  template <class M>
  explicit deferred_recall_content(const M& m) : half(m) {}
  deferred_recall_content(deferred_recall_content&&) noexcept = default;

  template <class M>
  void begin(M& m, int layer, std::span<const typename M::chunk_type> chunks) {
    for (const auto& c : chunks) {
      if (!c.last) continue;
      const auto k = m.slot(c.request, layer);
      this->slots_[k].n = m.store().host_length(c.request, layer);
      half::begin(m, layer, c, this->slots_[k], k);
    }
  }
  // A recorded recall is installed by the half's begin_step (device work that raises nothing on
  // the host), so nothing completes ahead of it.
  template <class M>
  void complete(M&, int, const decode_token<T>&) {}
  template <class M>
  void append_and_plan(M& m, int layer, std::span<const decode_token<T>> tokens, plan_type& plan) {
    this->step_.append_and_plan(m.store(), layer, tokens, plan);
  }
  template <class M>
  [[nodiscard]] bool refreshing(const M&, int layer) const { return half::refreshing(layer); }
  template <class M>
  static void end_round(const M&, slot_state& s) { half::end_round(s); }
  template <class M>
  void fire(M& m, int layer, std::span<const decode_token<T>> firing) {
    for (const auto& t : firing) half::fire(m, layer, t);
  }
  template <class M>
  void drop(M&, int) {}  // nothing in flight: a recorded recall lives in the slot's state
};

}  // namespace kvsift::detail
