// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::one_tier — what the one-tier schedules (evict, sparse_read) share: room checks of a
// store (and of a paged store's page pool), appending a decode token, the plan that reads every
// resident token, and the per-(request, layer) step counters.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/method/lifecycle.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::detail {

template <class Store>
class one_tier {
 public:
  using T = typename Store::element_type;

  template <class M>
  explicit one_tier(const M& m)
      : steps_(static_cast<std::size_t>(m.store().requests()) * m.store().shape().layers, 0),
        layer_budgets_(static_cast<std::size_t>(m.store().shape().layers), -1) {}

  [[nodiscard]] int steps(std::size_t slot) const { return steps_[slot]; }
  template <class M>
  void release(M&) {}

  // Room for chunk c after what the call's earlier chunks add; a paged pool must hold every
  // chunk of the call (`pool_pages` accumulates across them).
  template <class M, class Chunk>
  static void check_room(const M& m, std::string_view where, int layer, const Chunk& c,
                         int pending, int& pool_pages) {
    const auto& st = m.store();
    const auto& sh = st.shape();
    const auto seq0 = sh.sequence(c.request, layer, 0);
    const int room = st.capacity(seq0) - st.length(seq0) - pending;
    require(c.keys.tokens <= room, where, "keys.tokens", c.keys.tokens,
            "<= the room left in the store (" + std::to_string(room) + ")");
    if constexpr (requires { st.free_pages(); st.pages_to_append(seq0, 1); }) {
      for (int h = 0; h < sh.kv_heads; ++h) {  // a waiting hole takes the first token, no page
        const auto seq = sh.sequence(c.request, layer, h);
        pool_pages += st.pages_to_append(seq, pending + c.keys.tokens) - st.pages_to_append(seq, pending);
      }
      require(pool_pages <= st.free_pages(), where, "keys.tokens", c.keys.tokens,
              "room in the page pool for the whole batch (" + std::to_string(pool_pages) +
                  " pages needed, " + std::to_string(st.free_pages()) + " free)");
    }
  }

  // Room for one more token in every KV head of each request (and pages for the whole batch).
  template <class M>
  static void check_decode_room(const M& m, std::string_view where, int layer,
                                std::span<const decode_token<T>> tokens) {
    const auto& st = m.store();
    const auto& sh = st.shape();
    int pool_pages = 0;
    for (const auto& t : tokens) {
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(t.request, layer, h);
        require(st.length(seq) < st.capacity(seq), where, "request", t.request,
                "a head-sequence with room for one more token");
        if constexpr (requires { st.free_pages(); st.pages_to_append(seq, 1); }) {
          pool_pages += st.pages_to_append(seq, 1);  // none into a waiting hole
        }
      }
      if constexpr (requires { st.free_pages(); st.pages_to_append(std::int64_t{}, 1); }) {
        require(pool_pages <= st.free_pages(), where, "request", t.request, [&] {
          return "room in the page pool for the whole batch (" + std::to_string(pool_pages) +
                 " pages needed up to this request, " + std::to_string(st.free_pages()) + " free)";
        });
      }
    }
  }

  // Appends each request's token at its next position; counts the step.
  template <class M>
  void append_tokens(M& m, int layer, std::span<const decode_token<T>> tokens) {
    auto& st = m.store();
    const auto& sh = st.shape();
    for (const auto& t : tokens) {
      st.append(t.request, layer, kv_view<const T, nhd>::contiguous(t.key, 1, sh.kv_heads, sh.head_dim),
                kv_view<const T, nhd>::contiguous(t.value, 1, sh.kv_heads, sh.head_dim),
                st.next_position(t.request, layer));
      ++steps_[m.slot(t.request, layer)];
    }
  }

  // The plan reading every resident token of each head-sequence of plan.requests; with
  // page_size > 0 also every page (a dense layer of a page method).
  template <class M>
  void plan_everything(const M& m, int layer, attention_plan& plan, int page_size = 0) {
    const auto& st = m.store();
    const auto& sh = st.shape();
    sizes_.clear();
    for (const int r : plan.requests) {
      for (int h = 0; h < sh.kv_heads; ++h) sizes_.push_back(st.length(sh.sequence(r, layer, h)));
    }
    // The last plan (this layer's last step, or another layer's of the same lengths) is often
    // already every slot: then nothing is written. The attention's threads read these entries;
    // rewriting them every step would take each cache line back from the core that read it.
    bool same = plan.slots.segments() == static_cast<int>(sizes_.size());
    for (std::size_t s = 0; same && s < sizes_.size(); ++s) {
      same = plan.slots.size(static_cast<int>(s)) == sizes_[s];
    }
    if (!same) plan.slots.reshape(sizes_);  // fill_positions writes every segment's slots
    plan.pages.clear();
    if (page_size > 0) {
      for (int& n : sizes_) n = (n + page_size - 1) / page_size;
      plan.pages.resize(sizes_);
      for (int s = 0; s < plan.pages.segments(); ++s) {
        auto seg = plan.pages[s];
        std::iota(seg.begin(), seg.end(), 0);
      }
    }
    fill_positions(m, layer, plan, same ? slots::check : slots::write);
  }

  // What fill_positions does with each segment's slots first: nothing (they are the plan), or
  // make them [0, n): `check` where they may already be (rewritten only where they differ: the
  // attention's threads read these entries, and a rewrite would take each cache line back from
  // the core that read it), `write` where they are not (a plan laid out anew: every segment after
  // the first moved, so a check would read the whole plan to learn that).
  enum class slots { keep, check, write };

  // plan.positions from plan.slots, segment by segment (every segment's slots first made [0, n)
  // unless `how` is keep). In parallel over the segments when the plan is large: a whole 32K
  // cache's positions are gathered page by page (a page's 16 entries one cache line, the next
  // page's elsewhere), ~0.4 ms for 8 heads on one core, which the attention's threads waited for.
  template <class M>
  static void fill_positions(const M& m, int layer, attention_plan& plan, slots how = slots::keep) {
    const bool slots_too = how != slots::keep;
    const auto& st = m.store();
    const auto& sh = st.shape();
    plan.positions.offsets = plan.slots.offsets;
    plan.positions.values.resize(plan.slots.values.size());
    const int segments = plan.slots.segments();
    cpu::parallel_for(segments, [&](std::int64_t s64) {
      const int s = static_cast<int>(s64);
      const auto seq = sh.sequence(plan.requests[s / sh.kv_heads], layer, s % sh.kv_heads);
      const auto in = plan.slots[s];
      if (slots_too) {  // slots [0, n); with `check` written only where they are not already
        std::int32_t differs = how == slots::write ? 1 : 0;
        if (how == slots::check) {  // one vector pass
          for (std::size_t i = 0; i < in.size(); ++i) differs |= in[i] ^ static_cast<std::int32_t>(i);
        }
        if (differs != 0) std::iota(in.begin(), in.end(), 0);
      }
      auto out = plan.positions[s];
      if constexpr (requires { st.positions_prefix(seq, 0, out.data()); }) {
        if (slots_too) {  // slots [0, n): the positions' runs copied, no slot read
          st.positions_prefix(seq, static_cast<int>(in.size()), out.data());
          return;
        }
      }
      if constexpr (requires { st.positions_of(seq, in, out.data()); }) {
        st.positions_of(seq, in, out.data());  // one lookup per slot, inline
      } else {
        for (std::size_t i = 0; i < in.size(); ++i) out[i] = st.position(seq, in[i]);
      }
    }, cpu::par, static_cast<std::int64_t>(plan.slots.values.size()) / std::max(1, segments));
  }

  template <class M>
  void reset_steps(const M& m, int request) {
    for (int l = 0; l < m.store().shape().layers; ++l) steps_[m.slot(request, l)] = 0;
  }

  void fill_stats(method_stats& s) const {
    s.refreshes = refreshes_;
    s.stalls = 0;
    s.bytes_transferred = 0;
    s.layer_budgets = layer_budgets_;
  }

 protected:
  std::vector<int> steps_;          // [requests * layers] decode steps taken
  std::vector<int> layer_budgets_;  // [layers] last budget applied, -1 if none
  std::int64_t refreshes_ = 0;
  std::vector<int> sizes_;          // scratch: plan segment sizes
};

}  // namespace kvsift::detail
