// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::speculative over a device store: the state method<thrust::tiered_store<T, E>,
// freekv_recipe, E> runs (the host state is method/schedule/speculative.hpp; this file is its
// Thrust mirror for FreeKV).
//
//   kvsift::thrust::sim_arena arena;
//   kvsift::exec::sim_cpp e{arena};
//   kvsift::thrust::tiered_store<float, kvsift::exec::sim_cpp> st(e, shape, requests, 4096, 4096);
//   kvsift::freekv<float, kvsift::exec::sim_cpp> m(st, params);   // freekv_recipe's params
//   m.prefill(layer, chunk);                 // chunk views in E's memory
//   const auto& plan = m.decode(layer, tokens);   // thrust::device_plan (slots are tier slots)
//   m.attend(layer, tokens, out);            // queries and out in E's memory
//   m.after_attention(layer, tokens);        // the speculative selection for step t + 1
//
// Contract: the host state's semantics (METHODS.md "FreeKV"): the same plans (as positions and
// pages), corrections and resident tokens; layers [0, dense_layers) keep and read everything.
// Shapes are computed on the host, contents stay on the device (the data decides which pages,
// never how many); q_t's selection and the correction test run on the device every step, so no
// flag is read back. Every buffer is allocated at construction; a decode step uploads descriptors
// and reads nothing back. tier_capacity >= the longest prompt and >= B (>= prompt + steps with
// dense layers). corrections() and corrections_made() make one counted read each.
// The steps, cost and what is not mirrored: docs/architecture.md, "Design notes from the headers".

#include <kvsift/budget/uniform.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/device/one_tier.hpp>
#include <kvsift/device/two_tier.hpp>
#include <kvsift/method/freekv.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/schedule/speculative.hpp>
#include <kvsift/score/freekv_pages.hpp>
#include <kvsift/select/freekv_pages.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/freekv_pages.hpp>
#include <kvsift/thrust/page_minmax.hpp>
#include <kvsift/thrust/query_cosine.hpp>
#include <kvsift/thrust/segmented_topk.hpp>
#include <kvsift/thrust/tiered_store.hpp>
#include <kvsift/trigger/query_cosine.hpp>

#include <thrust/copy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace kvsift::thrust::detail {

// The CSRs of one request's page selection: heads segments of P pages, then a padding segment up
// to `padded` pages; kp kept per head, none of the padding.
struct freekv_page_csr_fn {
  int P, kp, heads;
  std::int32_t padded;
  std::int32_t* offsets;  // [heads + 2]
  std::int32_t* kept;     // [heads + 2]
  KVSIFT_HOST_DEVICE void operator()(int g) const {
    offsets[g] = g <= heads ? g * P : padded;
    kept[g] = g <= heads ? g * kp : heads * kp;
  }
};

// out[g] = g * n: the CSR of segments of n rows each.
struct freekv_rows_csr_fn {
  int n;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(int g) const { out[g] = g * n; }
};

// Row `row` of a query view, packed [q_heads, d].
template <class Space>
struct freekv_query_row_fn {
  kv_view<const float, nhd, Space> q;
  int row;
  float* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    out[e] = q.row(row, static_cast<int>(e / q.dim))[e % q.dim];
  }
};

// Every page of P per head: out[e] = e % P.
struct freekv_every_page_fn {
  int P;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    out[e] = static_cast<std::int32_t>(e % P);
  }
};

// Sink and window pages of a layout of P pages, per head: [0, sink) then [P - window, P).
struct freekv_sink_window_fn {
  int sink, window, P;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int j = static_cast<int>(e % (sink + window));
    out[e] = j < sink ? j : P - window + (j - sink);
  }
};

// The pool positions of kp selected pages per head (ascending, all full but the last): head h's
// count tokens at out[h * count], token i of them the pool's index pages[h kp + i / p] p + i % p.
struct freekv_page_positions_fn {
  const std::int32_t* pages;           // [heads, kp]
  int kp, count, page_size;
  const std::int32_t* pool_positions;  // of head 0 of the (request, layer): [heads, host_capacity]
  std::int64_t host_capacity;
  std::int32_t* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t h = e / count;
    const int i = static_cast<int>(e % count);
    const std::int64_t index =
        static_cast<std::int64_t>(pages[h * kp + i / page_size]) * page_size + i % page_size;
    out[e] = pool_positions[h * host_capacity + index];
  }
};

// The step's correction counts: counters[0] += corrected heads; counters[1] += heads when any
// head corrected (the host then selects with q_t for every head: a refresh of each). One thread.
struct freekv_count_fn {
  const std::int32_t* flags;  // [heads]
  int heads;
  std::int64_t* counters;     // [2]
  KVSIFT_HOST_DEVICE void operator()(int) const {
    std::int64_t n = 0;
    for (int h = 0; h < heads; ++h) n += flags[h] != 0 ? 1 : 0;
    counters[0] += n;
    if (n > 0) counters[1] += heads;
  }
};

}  // namespace kvsift::thrust::detail

namespace kvsift {

template <Element T, thrust::DeviceExec E, class Recipe>
class schedule::speculative::state<thrust::tiered_store<T, E>, Recipe> {
  using Store = thrust::tiered_store<T, E>;
  using space = typename E::memory_space;
  using chunk_type = prefill_chunk<T, space>;
  static_assert(std::is_same_v<typename Recipe::scorer, score::freekv_pages> &&
                    std::is_same_v<typename Recipe::selector, select::freekv_pages> &&
                    std::is_same_v<typename Recipe::trigger, trigger::query_cosine>,
                "kvsift::method on a device exec: the device speculative state is FreeKV's recipe "
                "(score::freekv_pages, select::freekv_pages, trigger::query_cosine)");
  static_assert(std::is_same_v<typename Recipe::budgeter, budget::uniform>,
                "kvsift::method on a device exec: the device speculative state sizes its page "
                "buffers by one budget for every KV head, so its recipe's budgeter is budget::uniform");

 public:
  using plan_type = thrust::device_plan;
  // The host shadow of (request, layer).
  struct slot_state {
    int steps = 0;            // decode steps since the prompt (or the last reset)
    bool pending = false;     // a speculative selection recorded, for the layout of `tokens`
    int pending_tokens = 0;
  };

  template <class R>
  static constexpr capabilities caps{
      .changes_physical_length = true,
      .safe_with_shared_prefix = false,
      .needs_queries = true,
      .cuda_graph_safe = false,  // the laws hold on exec::sim; exec::cuda captures no step yet
      .speculative_decoding = false,
  };
  static constexpr bool after_attention_reads_queries = true;

  template <class M>
  explicit state(const M& m)
      : exec_(m.store().exec()),
        H_(m.store().shape().kv_heads),
        G_(m.store().shape().q_heads / m.store().shape().kv_heads),
        d_(m.store().shape().head_dim),
        cap_(m.store().tier_capacity()),
        pool_cap_(m.store().host_capacity()),
        ps_(m.parameters().page_size),
        page_cap_((pool_cap_ + 1 + ps_ - 1) / ps_),  // a layout one token past a full pool
        budget_pages_(m.parts().budgeter.p.tokens / ps_),  // the recipe's budgeter: B
        sink_pages_(m.parameters().sink / ps_),
        window_pages_(m.parameters().window / ps_),
        slots_(static_cast<std::size_t>(m.store().requests()) * m.store().shape().layers),
        kmin_(exec_, static_cast<std::size_t>(m.store().sequences()) * page_cap_ * d_),
        kmax_(exec_, kmin_.size()),
        prev_q_(exec_, slots_.size() * H_ * G_ * d_),
        query_(exec_, static_cast<std::size_t>(H_) * G_ * d_),
        page_scores_(exec_, static_cast<std::size_t>(H_) * page_cap_),
        page_offsets_(exec_, static_cast<std::size_t>(H_) + 2),
        kept_offsets_(exec_, static_cast<std::size_t>(H_) + 2),
        rows_offsets_(exec_, static_cast<std::size_t>(H_) + 1),
        window_(exec_, static_cast<std::size_t>(H_) + 1),
        fresh_(exec_, static_cast<std::size_t>(H_) * budget_pages_),
        spec_pages_(exec_, slots_.size() * H_ * budget_pages_),
        flags_(exec_, static_cast<std::size_t>(H_)),
        corrected_(exec_, static_cast<std::size_t>(m.store().requests()) * H_),
        counters_(exec_, 2),
        positions_(exec_, static_cast<std::size_t>(H_) *
                              std::min<std::int64_t>(static_cast<std::int64_t>(budget_pages_) * ps_,
                                                     pool_cap_)),
        score_ws_(exec_, thrust::freekv_workspace_bytes(H_, G_)),
        topk_ws_(exec_, thrust::segmented_topk_workspace_bytes(static_cast<std::int64_t>(H_) *
                                                               page_cap_)),
        plan_pages_(exec_, static_cast<std::size_t>(m.store().requests()) * H_ * page_cap_),
        step_(m.store(), detail::far_policy_of(m.parameters())) {
    const auto policy = exec_.policy();
    std::vector<std::int32_t> window(static_cast<std::size_t>(H_) + 1, window_pages_);
    window.back() = 0;  // the padding segment protects nothing
    thrust::copy_to_device(exec_, std::span<const std::int32_t>(window), window_);
    ::thrust::fill_n(policy, page_scores_.data(), page_scores_.size(), 0.0f);
    ::thrust::fill_n(policy, counters_.data(), 2, std::int64_t{0});
    ::thrust::fill_n(policy, corrected_.data(), corrected_.size(), 0);
    // warm the selection's sorts once at the one size every selection over the budget has
    // (H + 1 segments of H * page_cap pages, H * B/p kept): their scratch then comes from the
    // arena's cache in every decode step
    if (budget_pages_ > 0 && budget_pages_ < page_cap_) select_pages(page_cap_, fresh_.data());
  }
  state(state&&) noexcept = default;

  [[nodiscard]] int steps(std::size_t slot) const { return slots_[slot].steps; }
  [[nodiscard]] const slot_state& at(std::size_t slot) const { return slots_[slot]; }
  // Whether a speculative selection is recorded for (request, layer)'s next decode.
  [[nodiscard]] bool selection_pending(std::size_t slot) const { return slots_[slot].pending; }
  // The recorded speculative selection of a slot (E memory): [kv_heads, min(P, B/p)] ascending
  // pages of the layout of at(slot).pending_tokens tokens, valid while selection_pending(slot)
  // and that layout is over the budget.
  [[nodiscard]] const std::int32_t* speculative_pages(std::size_t slot) const {
    return spec_pages_.data() + slot * H_ * budget_pages_;
  }
  // Per segment of the last plan: 1 when that KV head was corrected (selected with q_t from step
  // 2 on), 0 otherwise (step 1, speculative reuse, dense layers). Device data: one counted
  // device-to-host read (outside a step).
  [[nodiscard]] const std::vector<std::uint8_t>& corrections() const {
    std::vector<std::int32_t> flags(static_cast<std::size_t>(plan_segments_));
    thrust::copy_to_host(exec_, corrected_, std::span<std::int32_t>(flags));
    corrections_host_.assign(flags.begin(), flags.end());
    return corrections_host_;
  }
  // Corrections made so far (KV-head steps that selected with q_t from step 2 on). Device data:
  // one counted device-to-host read (outside a step).
  [[nodiscard]] std::int64_t corrections_made() const { return device_counters()[0]; }
  // Tests only: while true, decode() does not install the chosen pages (the working set keeps
  // its old rows plus the new token: stale, as a forgotten install would leave them); the plan
  // and its pages still say what was chosen.
  void debug_skip_installs(bool skip) { skip_installs_ = skip; }

  // The host state's chunk checks plus room in the device tier (the whole prompt is resident
  // until its end).
  template <class M>
  void check_chunk(const M& m, std::string_view where, int layer, const chunk_type& c,
                   prefill_totals& tot) const {
    const auto& st = m.store();
    require(c.queries.tokens <= c.keys.tokens, where, "queries.tokens", c.queries.tokens,
            "<= keys.tokens (the chunk's newest queries)");
    require(!slots_[m.slot(c.request, layer)].pending, where, "request", c.request,
            "a request not decoding (reset it first)");
    const int left = st.host_capacity() - st.host_length(c.request, layer) - tot.added[c.request];
    require(c.keys.tokens <= left, where, "keys.tokens", c.keys.tokens,
            "<= the room left in the host pool (" + std::to_string(left) + " tokens)");
    for (int h = 0; h < H_; ++h) {
      const int room = cap_ - st.length(c.request, layer, h) - tot.added[c.request];
      require(c.keys.tokens <= room, where, "keys.tokens", c.keys.tokens,
              "<= the room left in the device tier of KV head " + std::to_string(h) + " (" +
                  std::to_string(room) + "): the whole prompt is resident until its end");
    }
  }
  template <class M>
  void check_prefill(const M&, std::string_view, int, std::span<const chunk_type>,
                     const prefill_totals&) const {}

  template <class M>
  void prefill(M& m, int layer, std::span<const chunk_type> chunks) {
    auto& st = m.store();
    const bool dense = layer < m.parameters().dense_layers;
    for (const auto& c : chunks) {
      const int before = st.host_length(c.request, layer);
      st.append(c.request, layer, c.keys, c.values, c.first_position);
      if (dense) continue;
      digest_pages(m, c.request, layer, before);
      if (!c.last) continue;
      const int n = st.host_length(c.request, layer);
      const int P1 = pages_of(n + 1);  // step 1's layout
      if (P1 <= budget_pages_) continue;
      // With the prompt's last query, the budget's pages are placed as that query selects them
      // (step 1 still selects with q_1 and recalls what differs); without, sink + window.
      int kp = sink_pages_ + window_pages_;
      if (c.queries.tokens > 0) {
        ::thrust::for_each_n(exec_.policy(), ::thrust::counting_iterator<std::int64_t>(0),
                             static_cast<std::int64_t>(H_) * G_ * d_,
                             thrust::detail::freekv_query_row_fn<space>{
                                 c.queries, c.queries.tokens - 1, query_.data()});
        score_pages(m, c.request, layer, query_.data(), P1);
        select_pages(P1, fresh_.data());
        kp = budget_pages_;
        refreshes_ += H_;
      } else {
        ::thrust::for_each_n(exec_.policy(), ::thrust::counting_iterator<std::int64_t>(0),
                             static_cast<std::int64_t>(H_) * kp,
                             thrust::detail::freekv_sink_window_fn{sink_pages_, window_pages_, P1,
                                                                   fresh_.data()});
      }
      install_pages(m, c.request, layer, fresh_.data(), kp, working_set(n, P1, kp));
    }
  }

  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    const auto& st = m.store();
    const bool dense = layer < m.parameters().dense_layers;
    for (const auto& t : tokens) {
      require(st.host_length(t.request, layer) < st.host_capacity(), where, "request", t.request,
              "a head-sequence with room for one more token in the host pool");
      const int n = st.host_length(t.request, layer) + 1;
      const int P = pages_of(n);
      const bool installs = !dense && !skip_installs_ && P > budget_pages_;
      for (int h = 0; h < H_; ++h) {
        const int rows = installs ? working_set(n, P, budget_pages_)
                                  : st.length(t.request, layer, h) + 1;
        require(rows <= cap_, where, "request", t.request,
                "room in the device tier of KV head " + std::to_string(h) + " for this step (" +
                    std::to_string(rows) + " rows of tier_capacity " + std::to_string(cap_) + ")");
      }
    }
  }

  // Per request: the step's pages chosen (and installed, but for the step's own token), then
  // every token appended and the plan packed (detail::device_two_tier).
  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens, plan_type& plan) {
    auto& st = m.store();
    const bool dense = layer < m.parameters().dense_layers;
    const auto policy = exec_.policy();
    const int R = static_cast<int>(tokens.size());
    page_offsets_host_.assign(1, 0);
    for (int i = 0; i < R; ++i) {
      const auto& t = tokens[i];
      auto& s = slots_[m.slot(t.request, layer)];
      ++s.steps;
      const int index = st.host_length(t.request, layer);  // the token's index in the pool
      const int P = pages_of(index + 1);
      const int kp = dense ? P : std::min(P, budget_pages_);
      std::int32_t* pages = plan_pages_.data() + page_offsets_host_.back();
      std::int32_t* corrected = corrected_.data() + static_cast<std::size_t>(i) * H_;
      if (dense) {
        ::thrust::fill_n(policy, corrected, H_, 0);
        ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0),
                             static_cast<std::int64_t>(H_) * kp,
                             thrust::detail::freekv_every_page_fn{P, pages});
      } else {
        settle(m, t, layer, s, index, pages, corrected);
      }
      for (int h = 0; h < H_; ++h) page_offsets_host_.push_back(page_offsets_host_.back() + kp);
    }
    step_.append_and_plan(st, layer, tokens, plan);
    plan.page_offsets = page_offsets_host_;
    plan.pages = plan_pages_.data();
    plan_segments_ = R * H_;
  }

  // The library's attention over the step's plan: out [tokens, q_heads, d] in E memory.
  template <class M>
  void attend(const M& m, int layer, std::span<const decode_token<T>> tokens, float* out) const {
    step_.attend(m.store(), layer, tokens, m.plan(), out);
  }

  // The speculative selection of each request for its next step: q_t on the layout one token
  // ahead, recorded in E memory.
  template <class M>
  void after_attention(M& m, int layer, std::span<const decode_token<T>> tokens) {
    if (layer < m.parameters().dense_layers) return;
    const auto& st = m.store();
    for (const auto& t : tokens) {
      const auto slot = m.slot(t.request, layer);
      auto& s = slots_[slot];
      const int next = st.host_length(t.request, layer) + 1;
      const int P = pages_of(next);
      if (P > budget_pages_) {
        score_pages(m, t.request, layer, t.query, P);
        select_pages(P, spec_pages_.data() + slot * H_ * budget_pages_);
      }  // else every page: nothing to record
      s.pending = true;
      s.pending_tokens = next;
      refreshes_ += H_;
    }
  }

  template <class M>
  void reset(M& m, int request) {
    for (int l = 0; l < m.store().shape().layers; ++l) slots_[m.slot(request, l)] = {};
    m.store().reset(request);
  }
  // Reads E memory: the store's installed rows and the device's count of correcting steps (two
  // counted device-to-host reads; call it outside a step).
  template <class M>
  void stats(const M& m, method_stats& s) const {
    s.bytes_transferred = m.store().bytes_to_device();
    s.far_rows = step_.far_rows();
    s.far_overlaps = step_.far_overlaps();
    s.refreshes = refreshes_ + device_counters()[1];
    s.stalls = 0;
    for (int l = 0; l < m.store().shape().layers; ++l) {
      s.layer_budgets.push_back(l < m.parameters().dense_layers ? -1 : m.parts().budgeter.p.tokens);
    }
  }
  template <class M>
  void release(M&) {}

 private:
  [[nodiscard]] int pages_of(int tokens) const { return (tokens + ps_ - 1) / ps_; }
  // Tokens of kp selected pages of a layout of P pages over a pool of n tokens: every page full
  // but the layout's last (the current page, always selected), which holds n - (P - 1) p.
  [[nodiscard]] int working_set(int n, int P, int kp) const {
    return (kp - 1) * ps_ + n - (P - 1) * ps_;
  }
  [[nodiscard]] std::vector<std::int64_t> device_counters() const {
    std::vector<std::int64_t> c(2);
    thrust::copy_to_host(exec_, counters_, std::span<std::int64_t>(c));
    return c;
  }

  // Recomputes the digests of (request, layer)'s pool pages from the one holding index `from`.
  template <class M>
  void digest_pages(M& m, int request, int layer, int from) {
    auto& st = m.store();
    const std::int64_t seq0 = st.shape().sequence(request, layer, 0);
    const int n = st.host_length(request, layer);
    const auto policy = exec_.policy();
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), H_ + 1,
                         thrust::detail::freekv_rows_csr_fn{n, rows_offsets_.data()});
    const auto pool = st.pool();
    const thrust::segmented_rows<T> keys{pool.keys + seq0 * pool_cap_ * d_, rows_offsets_.data(),
                                         nullptr, static_cast<std::int64_t>(pool_cap_) * d_, H_,
                                         d_};
    const std::int64_t at = seq0 * page_cap_ * d_;
    thrust::page_digest_tail(policy, keys, ps_, pages_of(n) - from / ps_, kmin_.data() + at,
                             kmax_.data() + at, page_cap_);
  }

  // FreeKV's group scores of (request, layer)'s pool pages on a layout of P pages with query q
  // ([q_heads, d], E memory) into page_scores_, and the selection's CSRs (kp = B/p per head).
  template <class M>
  void score_pages(M& m, int request, int layer, const float* q, int P) {
    const auto policy = exec_.policy();
    ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), H_ + 2,
                         thrust::detail::freekv_page_csr_fn{P, std::min(P, budget_pages_), H_,
                                                            H_ * page_cap_, page_offsets_.data(),
                                                            kept_offsets_.data()});
    const std::int64_t at = m.store().shape().sequence(request, layer, 0) * page_cap_ * d_;
    const auto& sp = m.parts().scorer.p;
    thrust::freekv_group_scores_strided(policy, q, H_, G_, d_, kmin_.data() + at, kmax_.data() + at,
                                        page_cap_, page_offsets_.data(), H_,
                                        static_cast<std::int64_t>(H_) * P, ps_, sp.sink, sp.window,
                                        sp.merge, page_scores_.data(), score_ws_.data(),
                                        score_ws_.size());
  }

  // select::freekv_pages over page_scores_ (P > B/p): the sink and window pages and the top
  // candidates, B/p per head, ascending, into out [H, B/p]. One sort of the fixed padded size.
  void select_pages(int P, std::int32_t* out) {
    if (P == page_cap_) {  // the warm-up: the CSRs for a full layout
      ::thrust::for_each_n(exec_.policy(), ::thrust::counting_iterator<int>(0), H_ + 2,
                           thrust::detail::freekv_page_csr_fn{P, budget_pages_, H_, H_ * page_cap_,
                                                              page_offsets_.data(),
                                                              kept_offsets_.data()});
    }
    thrust::segmented_topk(exec_.policy(), page_scores_.data(), page_offsets_.data(), H_ + 1,
                           static_cast<std::int64_t>(H_) * page_cap_, kept_offsets_.data(),
                           static_cast<std::int64_t>(H_) * budget_pages_, out, topk_ws_.data(),
                           topk_ws_.size(), thrust::topk_protection{sink_pages_, window_.data()},
                           /*check=*/false);
  }

  // The working set of every KV head of (request, layer) becomes the first `count` pool tokens
  // of its kp pages (`pages` [H, kp], E memory), the missing rows copied from the pool.
  template <class M>
  void install_pages(M& m, int request, int layer, const std::int32_t* pages, int kp, int count) {
    auto& st = m.store();
    const std::int64_t seq0 = st.shape().sequence(request, layer, 0);
    ::thrust::for_each_n(exec_.policy(), ::thrust::counting_iterator<std::int64_t>(0),
                         static_cast<std::int64_t>(H_) * count,
                         thrust::detail::freekv_page_positions_fn{
                             pages, kp, count, ps_, st.pool().positions + seq0 * pool_cap_,
                             pool_cap_, positions_.data()});
    seqs_.clear();
    counts_.assign(static_cast<std::size_t>(H_), count);
    for (int h = 0; h < H_; ++h) seqs_.push_back(seq0 + h);
    step_.install(st, seqs_, counts_, positions_.data());
  }

  // Step t's selection of every KV head of one request of a sparse layer (`index`: its token's
  // pool index, the token not appended yet): q_t's, or per head the speculative one when the
  // trigger keeps it; the chosen pages into `pages` [H, kp], the correction flags into
  // `corrected`. Over the budget the chosen pages' tokens but the step's own are installed: the
  // token's append then completes the working set.
  template <class M>
  void settle(M& m, const decode_token<T>& t, int layer, slot_state& s, int index,
              std::int32_t* pages, std::int32_t* corrected) {
    auto& st = m.store();
    const auto policy = exec_.policy();
    const auto slot = m.slot(t.request, layer);
    const std::int64_t at = st.shape().sequence(t.request, layer, 0) * page_cap_ * d_;
    thrust::page_digest_append(policy, t.key, H_, d_, index, ps_, page_cap_, kmin_.data() + at,
                               kmax_.data() + at);
    const int n = index + 1;
    const int P = pages_of(n);
    const bool over = P > budget_pages_;
    const int kp = over ? budget_pages_ : P;
    const bool ready = s.pending && s.pending_tokens == n;  // the selection made after step t-1
    s.pending = false;
    // q_t's selection (every page while the layout fits the budget)
    if (over) {
      score_pages(m, t.request, layer, t.query, P);
      select_pages(P, fresh_.data());
    } else {
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<std::int64_t>(0),
                           static_cast<std::int64_t>(H_) * kp,
                           thrust::detail::freekv_every_page_fn{P, fresh_.data()});
    }
    float* prev = prev_q_.data() + slot * H_ * G_ * d_;
    if (ready) {  // per KV head, on the device: correct (q_t's selection) or keep the speculation
      thrust::query_cosine_decisions(policy, t.query, prev, H_, G_, d_,
                                     m.parts().trigger.parameters().tau, nullptr, flags_.data());
      ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), 1,
                           thrust::detail::freekv_count_fn{flags_.data(), H_, counters_.data()});
      ::thrust::copy_n(policy, flags_.data(), H_, corrected);
      if (over) {
        ::thrust::for_each_n(policy, ::thrust::counting_iterator<int>(0), H_ + 1,
                             thrust::detail::freekv_rows_csr_fn{kp, rows_offsets_.data()});
        thrust::choose_sets(policy, rows_offsets_.data(), H_, static_cast<std::int64_t>(H_) * kp,
                            flags_.data(), fresh_.data(),
                            spec_pages_.data() + slot * H_ * budget_pages_, pages);
      } else {
        ::thrust::copy_n(policy, fresh_.data(), static_cast<std::int64_t>(H_) * kp, pages);
      }
    } else {  // step 1 (or a selection for another layout): every head selects with q_t
      refreshes_ += H_;
      ::thrust::fill_n(policy, corrected, H_, 0);
      ::thrust::copy_n(policy, fresh_.data(), static_cast<std::int64_t>(H_) * kp, pages);
    }
    // the trigger's state: q_t becomes the previous query
    ::thrust::copy_n(policy, t.query, static_cast<std::int64_t>(H_) * G_ * d_, prev);
    // the working set becomes the chosen pages' tokens (the whole pool while it fits the budget)
    if (over && !skip_installs_) {
      install_pages(m, t.request, layer, pages, kp, working_set(n, P, kp) - 1);
    }
  }

  E exec_;
  int H_, G_, d_, cap_, pool_cap_, ps_, page_cap_;
  int budget_pages_, sink_pages_, window_pages_;  // B/p, S/p, W/p
  std::vector<slot_state> slots_;                 // [requests * layers]
  std::int64_t refreshes_ = 0;                    // the host-known ones (see stats())
  bool skip_installs_ = false;
  int plan_segments_ = 0;
  // E memory, allocated once
  thrust::buffer<float, E> kmin_, kmax_;          // [sequences, page_cap, d] the pool's digests
  thrust::buffer<float, E> prev_q_;               // [requests * layers, q_heads, d] q_{t-1}
  thrust::buffer<float, E> query_;                // [q_heads, d] a prompt's last query
  thrust::buffer<float, E> page_scores_;          // [H, page_cap] a request's page scores
  thrust::buffer<std::int32_t, E> page_offsets_, kept_offsets_, rows_offsets_, window_;
  thrust::buffer<std::int32_t, E> fresh_;         // [H, B/p] q_t's selection
  thrust::buffer<std::int32_t, E> spec_pages_;    // [requests * layers, H, B/p] recorded selections
  thrust::buffer<std::int32_t, E> flags_;         // [H] the trigger's decisions
  thrust::buffer<std::int32_t, E> corrected_;     // [requests * H] the last plan's corrections
  thrust::buffer<std::int64_t, E> counters_;      // [2] corrections made, correcting refreshes
  thrust::buffer<std::int32_t, E> positions_;     // [H, working set] an install's positions
  thrust::buffer<std::byte, E> score_ws_, topk_ws_;
  thrust::buffer<std::int32_t, E> plan_pages_;    // [requests * H, pages] the plan's pages
  detail::device_two_tier<T, E> step_;            // the decode step's append, plan and attention
  // host scratch
  std::vector<std::int64_t> seqs_;
  std::vector<int> counts_;
  std::vector<std::int32_t> page_offsets_host_;
  mutable std::vector<std::uint8_t> corrections_host_;
};

}  // namespace kvsift
