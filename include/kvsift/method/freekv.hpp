// SPDX-License-Identifier: Apache-2.0
#pragma once

// kvsift::freekv — FreeKV (Liu et al., 2025, "FreeKV: Boosting KV Cache Retrieval for Efficient
// LLM Inference"): speculative page retrieval with correction, over a tiered store.
//
//   store::tiered<T>     host pool = every token, HND pages [pages, kv_heads, 2, p, d];
//                        working set (the device tier) = the selected pages only, NHD rows
//   score::freekv_pages  Quest min-max digest + bound per query head, softmax over the candidate
//                        pages per query head, mean over the group (one page set per KV head)
//   select::freekv_pages sink pages + top B/p - S/p - W/p candidates + window pages
//   trigger::query_cosine per KV head, mean over the group of cos(q_t, q_{t-1}) < tau => correct
//   transfer::async<T>   background recall of missing pages (double-buffered HND -> NHD)
//
// Lifecycle (METHODS.md "FreeKV", SPEC method.freekv.decode), per sparse layer:
//   prefill   appends the prompt to both tiers; at the last chunk, when the prompt is over the
//             budget, the working set is cut to the budget's pages for step 1's layout: sink,
//             window and, when the chunk carries queries, the candidates the prompt's last query
//             selects (without queries: sink and window only). The rest lives on in the host
//             pool only.
//   decode    step t appends k_t, v_t (always resident). Step 1 selects with q_1. From step 2,
//             for each KV head: if the trigger asks for a correction the head selects with q_t
//             and recalls the missing pages now, synchronously (a stall); otherwise it takes the
//             selection made with q_{t-1} after step t-1 and installs the pages recalled in the
//             background since then (waiting only if the recall has not finished: a stall).
//             Either selection is on step t's page layout, so every step reads exactly B/p
//             pages once the sequence has more. The working set becomes exactly the selected
//             pages' tokens (pages leaving it are demoted, only missing pages move); the plan
//             reads all of it.
//   attend    reference attention over the plan.
//   after_attention  selects with q_t for step t+1's layout (one token ahead) and submits the
//             recall of its missing pages; decode of other layers proceeds meanwhile.
// Layers [0, dense_layers) keep everything resident and read every page.
//
// Parameters (paper defaults): page_size 32, budget 2048, sink 512, window 512 (tokens, whole
// pages), tau 0.8, merge softmax_mean, dense_layers 1. The store's page size must equal
// page_size. Cost per sparse layer and step: O(G P d) scoring (digests kept incrementally) plus
// the rows of newly selected pages copied once; resident K+V about B tokens per KV head.

#include <kvsift/attention/reference.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/score/freekv_pages.hpp>
#include <kvsift/select/freekv_pages.hpp>
#include <kvsift/method/detail/tiered_lifecycle.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>
#include <kvsift/trigger/query_cosine.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kvsift {

namespace detail {
// The host pool of a tiered store seen as a store (length = tokens in the pool), so that the
// page scorer's digests cover every token, resident or not.
template <Element T>
struct host_pool_view {
  using element_type = T;
  const store::tiered<T>* st = nullptr;
  [[nodiscard]] const model_shape& shape() const { return st->shape(); }
  [[nodiscard]] int length(std::int64_t seq) const {
    const auto [r, l] = st->request_layer(seq);
    return st->host_length(r, l);
  }
  [[nodiscard]] std::int32_t position(std::int64_t seq, int i) const {
    const auto [r, l] = st->request_layer(seq);
    return st->host_position(r, l, i);
  }
  [[nodiscard]] const T* key(std::int64_t seq, int i) const { return st->host_key(seq, i); }
};
}  // namespace detail

template <Element T>
class freekv {
 public:
  using store_type = store::tiered<T>;
  using transfer_type = transfer::async<T>;
  using scorer = score::freekv_pages;
  using selector = select::freekv_pages;
  using trigger = trigger::query_cosine;
  using element_type = T;

  struct params {
    int page_size = 32;    // p (the store's page size)
    int budget = 2048;     // B tokens per KV head, sink and window included (whole pages)
    int sink = 512;        // S tokens (whole pages)
    int window = 512;      // W tokens (whole pages), the current page included
    double tau = 0.8;      // correction threshold on the group-mean query cosine
    score::freekv_merge merge = score::freekv_merge::softmax_mean;
    int dense_layers = 1;  // layers [0, dense_layers) keep and read everything
  };

  static constexpr capabilities caps{
      .changes_physical_length = true,   // the working set holds the selected pages only
      .safe_with_shared_prefix = false,  // demotes and recalls rows of each head-sequence
      .needs_queries = true,             // decode needs q_t; prefill needs none
      .cuda_graph_safe = false,
      .speculative_decoding = false,
  };

  // Validates params against a model shape; throws kvsift::error naming the parameter.
  static void can_implement(const model_shape& shape, const params& p) {
    constexpr std::string_view where = "method::freekv";
    shape.validate(where);
    require(p.page_size > 0, where, "page_size", p.page_size, "> 0");
    scorer_of(p).validate(where);
    const selector sel = selector_of(p);
    sel.validate_budget(where, "budget", p.budget);
    require(sel.selectable(p.budget) >= 0, where, "budget", p.budget,
            ">= sink + window (" + std::to_string(p.sink + p.window) + " tokens)");
    trigger({.tau = p.tau}).validate(where);
    require(p.dense_layers >= 0, where, "dense_layers", p.dense_layers, ">= 0");
  }

  freekv(store_type& store, params p = {})
      : store_(&store), p_(p), scorer_(scorer_of(p)), selector_(selector_of(p)),
        trigger_({.tau = p.tau}) {
    can_implement(store.shape(), p);
    require(store.page_size() == p.page_size, "method::freekv", "page_size", p.page_size,
            "the store's page size (" + std::to_string(store.page_size()) +
                "): FreeKV recalls whole host pages");
    const auto& sh = store.shape();
    const auto slots = static_cast<std::size_t>(store.requests()) * sh.layers;
    steps_.assign(slots, 0);
    pending_.resize(slots);
  }
  freekv(const freekv&) = delete;
  freekv& operator=(const freekv&) = delete;
  ~freekv() {
    for (auto& pd : pending_) {
      if (pd.ticket) transfer_.cancel(*pd.ticket);
    }
    cancel_discarded();
  }

  [[nodiscard]] const params& parameters() const { return p_; }
  [[nodiscard]] store_type& store() { return *store_; }
  [[nodiscard]] const store_type& store() const { return *store_; }
  [[nodiscard]] transfer_type& transfer_state() { return transfer_; }
  [[nodiscard]] const attention_plan& plan() const { return plan_; }
  // Decode steps of (request, layer) since its last reset.
  [[nodiscard]] int step(int request, int layer) const {
    check_request("method::freekv.step", request);
    check_layer("method::freekv.step", layer);
    return steps_[slot(request, layer)];
  }
  // Per segment of the last plan: 1 when that KV head was corrected (selected with q_t from
  // step 2 on), 0 otherwise (step 1, speculative reuse, dense layers).
  [[nodiscard]] const std::vector<std::uint8_t>& corrections() const { return corrected_; }

  // 1. Appends each chunk to both tiers. At a request's last chunk of a sparse layer whose
  // prompt is over the budget, the working set keeps only the pages of step 1's layout that the
  // prompt's last query selects (sink and window only when the chunk has no queries). Every
  // chunk is validated before anything is appended.
  void prefill(int layer, std::span<const prefill_chunk<T>> chunks) {
    constexpr std::string_view where = "method::freekv.prefill";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    std::vector<int> room(static_cast<std::size_t>(store_->requests()), -1);
    std::vector<std::int32_t> next(static_cast<std::size_t>(store_->requests()), -1);
    for (const auto& c : chunks) {
      check_request(where, c.request);
      c.keys.validate(where, "keys", sh.kv_heads, sh.head_dim);
      c.values.validate(where, "values", sh.kv_heads, sh.head_dim);
      if (c.queries.tokens > 0) c.queries.validate(where, "queries", sh.q_heads, sh.head_dim);
      require(c.values.tokens == c.keys.tokens, where, "values.tokens", c.values.tokens, "keys.tokens");
      require(c.keys.tokens > 0, where, "keys.tokens", c.keys.tokens, "> 0 (a non-empty chunk)");
      require(c.queries.tokens <= c.keys.tokens, where, "queries.tokens", c.queries.tokens,
              "<= keys.tokens (the chunk's newest queries)");
      require_finite(where, c, true);  // after every view and token count is checked: it reads them
      // positions ascend across a request's chunks (checked here: the store would reject a
      // later chunk only after the earlier ones were appended)
      auto& first = next[c.request];
      if (first < 0) first = store_->next_position(c.request, layer);
      require(c.first_position >= first, where, "first_position", c.first_position,
              ">= " + std::to_string(first));
      first = c.first_position + c.keys.tokens;
      require(!pending_[slot(c.request, layer)].ticket, where, "request", c.request,
              "a request not decoding (reset it first)");
      int& left = room[c.request];
      if (left < 0) left = store_->host_capacity() - store_->host_length(c.request, layer);
      require(c.keys.tokens <= left, where, "keys.tokens", c.keys.tokens,
              "<= the room left in the host pool (" + std::to_string(left) + " tokens)");
      left -= c.keys.tokens;
    }
    for (const auto& c : chunks) {
      store_->append(c.request, layer, c.keys, c.values, c.first_position);
      if (!c.last || layer < p_.dense_layers) continue;
      const int n1 = store_->host_length(c.request, layer) + 1;  // step 1's layout
      const auto lay = scorer_.layout(n1);
      if (lay.pages <= p_.budget / p_.page_size) continue;
      // With the prompt's last query, the budget's pages are placed as that query would select
      // them (step 1 still selects with q_1 and recalls what differs); without, sink + window.
      std::vector<std::vector<std::int32_t>> placed;
      if (c.queries.tokens > 0) {
        std::vector<float> q(static_cast<std::size_t>(sh.q_heads) * sh.head_dim);
        for (int hq = 0; hq < sh.q_heads; ++hq) {
          std::copy_n(c.queries.row(c.queries.tokens - 1, hq), sh.head_dim,
                      q.data() + static_cast<std::size_t>(hq) * sh.head_dim);
        }
        placed = select_pages(c.request, layer, q.data(), n1);
      }
      index_sets keep;
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(c.request, layer, h);
        std::vector<std::int32_t> slots;
        for (int s = 0; s < store_->length(seq); ++s) {
          const int i = store_->host_index(c.request, layer, store_->position(seq, s));
          const int pg = i / p_.page_size;
          const bool kept = placed.empty()
                                ? pg < lay.candidates_first || pg >= lay.candidates_last
                                : std::binary_search(placed[h].begin(), placed[h].end(), pg);
          if (kept) slots.push_back(s);
        }
        keep.push_back(slots);
      }
      store_->retain(c.request, layer, keep);
    }
  }
  void prefill(int layer, const prefill_chunk<T>& chunk) {
    prefill(layer, std::span<const prefill_chunk<T>>(&chunk, 1));
  }

  // 2. Appends each request's token, settles each KV head's selection for this step (step 1 /
  // correction: select with q_t and recall now; otherwise the speculative selection and its
  // background recall) and returns the plan: per KV head the working set, which is exactly the
  // selected pages' tokens (new token included).
  const attention_plan& decode(int layer, std::span<const decode_token<T>> tokens) {
    constexpr std::string_view where = "method::freekv.decode";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    std::vector<char> seen(static_cast<std::size_t>(store_->requests()), 0);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto& t = tokens[i];
      check_request(where, t.request);
      require(!seen[t.request], where, "request", t.request, "at most one token per request");
      seen[t.request] = 1;
      require(t.query != nullptr && t.key != nullptr && t.value != nullptr, where,
              "query/key/value", "null", "[q_heads, d] and [kv_heads, d] arrays");
      require_finite(where, i, t, sh, true);
      require(store_->host_length(t.request, layer) < store_->host_capacity(), where, "request",
              t.request, "a head-sequence with room for one more token in the host pool");
    }
    binding_.unbind();
    plan_.requests.clear();
    plan_.slots.clear();
    plan_.pages.clear();
    corrected_.clear();
    for (const auto& t : tokens) {
      plan_.requests.push_back(t.request);
      store_->append(t.request, layer,
                     kv_view<const T, nhd>::contiguous(t.key, 1, sh.kv_heads, sh.head_dim),
                     kv_view<const T, nhd>::contiguous(t.value, 1, sh.kv_heads, sh.head_dim),
                     store_->next_position(t.request, layer));
      ++steps_[slot(t.request, layer)];
      if (layer < p_.dense_layers) {
        dense_plan(t.request, layer);
      } else {
        settle(t, layer);
      }
    }
    fill_positions(layer);
    store_->debug_verify();
    binding_.bind(layer);
    return plan_;
  }
  const attention_plan& decode(int layer, const decode_token<T>& token) {
    return decode(layer, std::span<const decode_token<T>>(&token, 1));
  }

  // 3. Reference attention over the current plan: out [tokens.size(), q_heads, d]. The call must
  // be the step of the last decode(): same layer, same requests in the same order, a query each
  // (kvsift::error otherwise).
  void attend(int layer, std::span<const decode_token<T>> tokens, float* out) const {
    binding_.check("method::freekv.attend", layer, tokens, plan_.requests, true);
    detail::attend_over_plan(*store_, layer, tokens, plan_, out);
  }

  // 4. Speculative retrieval: selects with q_t on step t+1's layout and submits the recall of
  // the selected pages not resident; decode(layer) of step t+1 installs them.
  void after_attention(int layer, std::span<const decode_token<T>> tokens) {
    constexpr std::string_view where = "method::freekv.after_attention";
    check_layer(where, layer);
    binding_.check(where, layer, tokens, plan_.requests, true);  // once per decode(), dense layers too
    binding_.unbind();
    if (layer < p_.dense_layers) return;
    const auto& sh = store_->shape();
    sweep();
    for (const auto& t : tokens) {
      auto& pd = pending_[slot(t.request, layer)];
      drop(pd);
      const int next = store_->host_length(t.request, layer) + 1;
      pd.pages = select_pages(t.request, layer, t.query, next);
      pd.tokens = next;
      std::vector<transfer::recall_request> what;
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(t.request, layer, h);
        auto missing = missing_positions(t.request, layer, seq, pd.pages[h]);
        if (!missing.empty()) what.push_back({seq, std::move(missing)});
      }
      if (!what.empty()) pd.ticket = transfer_.submit(*store_, std::move(what));
      pd.active = true;
    }
  }
  void after_attention(int layer, const decode_token<T>& token) {
    after_attention(layer, std::span<const decode_token<T>>(&token, 1));
  }

  // Ends a request: cancels its recalls, drops its tokens from both tiers and its state.
  void reset(int request) {
    check_request("method::freekv.reset", request);
    const auto& sh = store_->shape();
    for (int l = 0; l < sh.layers; ++l) {
      auto& pd = pending_[slot(request, l)];
      if (pd.ticket) transfer_.cancel(*pd.ticket);
      pd = {};
      steps_[slot(request, l)] = 0;
      for (int h = 0; h < sh.kv_heads; ++h) {
        trigger_.forget(sh.sequence(request, l, h));
        scorer_.forget(sh.sequence(request, l, h));
      }
    }
    cancel_discarded();  // recalls of any request: none may read a pool being reset
    store_->reset(request);
    binding_.unbind();  // a pending step may have included the request
  }

  // 5. Working-set bytes, bytes recalled (background recalls by the transfer, plus the
  // synchronous recalls of step 1 and corrections), selections made, stalls (a synchronous
  // recall that moved bytes, or a wait for a background recall not done in time).
  [[nodiscard]] method_stats stats() const {
    method_stats s;
    const auto ts = transfer_.stats();
    s.resident_bytes = store_->resident_bytes();
    s.resident_tokens = store_->resident_tokens();
    s.bytes_transferred = ts.bytes_moved + sync_bytes_;
    s.refreshes = refreshes_;
    s.stalls = ts.stalls + sync_stalls_;
    for (int l = 0; l < store_->shape().layers; ++l) {
      s.layer_budgets.push_back(l < p_.dense_layers ? -1 : p_.budget);
    }
    return s;
  }
  // Corrections made so far (KV-head steps that selected with q_t from step 2 on).
  [[nodiscard]] std::int64_t corrections_made() const { return corrections_made_; }

 private:
  struct pending_selection {
    bool active = false;                         // a speculative selection for the next step
    int tokens = 0;                              // the layout it was made for
    std::vector<std::vector<std::int32_t>> pages;  // [kv_heads] ascending pages
    std::optional<typename transfer_type::ticket> ticket;  // its recall, if anything was missing
  };

  static scorer scorer_of(const params& p) {
    return scorer{{.page_size = p.page_size, .sink = p.sink, .window = p.window, .merge = p.merge}};
  }
  static selector selector_of(const params& p) {
    return selector{{.page_size = p.page_size, .sink = p.sink, .window = p.window}};
  }
  [[nodiscard]] std::size_t slot(int request, int layer) const {
    return static_cast<std::size_t>(request) * store_->shape().layers + layer;
  }
  void check_layer(std::string_view where, int layer) const {
    require(layer >= 0 && layer < store_->shape().layers, where, "layer", layer,
            "in [0, " + std::to_string(store_->shape().layers) + ")");
  }
  void check_request(std::string_view where, int request) const {
    require(request >= 0 && request < store_->requests(), where, "request", request,
            "in [0, " + std::to_string(store_->requests()) + ")");
  }
  // Drops a pending selection. Its recall, if any, is not waited for: a finished one is released
  // now, a running one later (sweep), so a corrected step never blocks on a copy it discards.
  void drop(pending_selection& pd) {
    if (pd.ticket) {
      if (transfer_.ready(*pd.ticket)) {
        transfer_.release(*pd.ticket);
      } else {
        discarded_.push_back(*pd.ticket);
      }
    }
    pd = {};
  }
  void sweep() {
    std::erase_if(discarded_, [&](auto tk) {
      if (!transfer_.ready(tk)) return false;
      transfer_.release(tk);
      return true;
    });
  }
  void cancel_discarded() {
    for (const auto tk : discarded_) transfer_.cancel(tk);
    discarded_.clear();
  }

  // Page sets [kv_heads] of (request, layer) selected with query q ([q_heads, d]) on the page
  // layout of `tokens` tokens (the pool's length, or one more).
  std::vector<std::vector<std::int32_t>> select_pages(int request, int layer, const float* q,
                                                      int tokens) {
    const auto& sh = store_->shape();
    const detail::host_pool_view<T> pool{store_};
    const auto qv = kv_view<const float, nhd>::contiguous(q, 1, sh.q_heads, sh.head_dim);
    const std::int32_t qpos = store_->next_position(request, layer) - 1;
    const std::vector<int> layout(static_cast<std::size_t>(sh.kv_heads), tokens);
    score_input<detail::host_pool_view<T>> in{&pool, layer, lifecycle_event::decode_step,
                                              {&request, 1}, {&qv, 1}, {&qpos, 1}, {}};
    scorer_.score(in, scores_, layout);
    const std::vector<int> budgets(static_cast<std::size_t>(sh.kv_heads), p_.budget);
    selector_.select(scores_, budgets, kept_);
    std::vector<std::vector<std::int32_t>> out(static_cast<std::size_t>(sh.kv_heads));
    for (int h = 0; h < sh.kv_heads; ++h) out[h].assign(kept_[h].begin(), kept_[h].end());
    refreshes_ += sh.kv_heads;
    return out;
  }

  // Positions of the tokens of `pages` in the pool (pages past the pool contribute what exists).
  std::vector<std::int32_t> page_positions(int request, int layer,
                                           std::span<const std::int32_t> pages) const {
    const int n = store_->host_length(request, layer);
    std::vector<std::int32_t> out;
    for (const auto pg : pages) {
      for (int i = pg * p_.page_size; i < std::min(n, (pg + 1) * p_.page_size); ++i) {
        out.push_back(store_->host_position(request, layer, i));
      }
    }
    return out;
  }
  std::vector<std::int32_t> missing_positions(int request, int layer, std::int64_t seq,
                                              std::span<const std::int32_t> pages) const {
    std::vector<std::int32_t> out;
    for (const auto pos : page_positions(request, layer, pages)) {
      if (!store_->resident(seq, pos)) out.push_back(pos);
    }
    return out;
  }

  // A dense layer's plan segment: every resident token (everything), every page.
  void dense_plan(int request, int layer) {
    const auto& sh = store_->shape();
    for (int h = 0; h < sh.kv_heads; ++h) {
      const int n = store_->length(sh.sequence(request, layer, h));
      std::vector<std::int32_t> slots(static_cast<std::size_t>(n));
      std::iota(slots.begin(), slots.end(), 0);
      plan_.slots.push_back(slots);
      std::vector<std::int32_t> pages(static_cast<std::size_t>((n + p_.page_size - 1) / p_.page_size));
      std::iota(pages.begin(), pages.end(), 0);
      plan_.pages.push_back(pages);
      corrected_.push_back(0);
    }
  }

  // Settles step t's selection of every KV head of one request of a sparse layer and makes the
  // working set exactly the selected pages' tokens.
  void settle(const decode_token<T>& t, int layer) {
    const auto& sh = store_->shape();
    const int G = sh.group_size();
    const int d = sh.head_dim;
    const int n = store_->host_length(t.request, layer);
    auto& pd = pending_[slot(t.request, layer)];
    const bool speculative_ready = pd.active && pd.tokens == n;
    std::vector<char> now(static_cast<std::size_t>(sh.kv_heads), 0);
    std::vector<std::uint8_t> flag(static_cast<std::size_t>(sh.kv_heads), 0);
    bool any_now = false, any_spec = false;
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto dec = trigger_.observe(sh.sequence(t.request, layer, h),
                                        t.query + static_cast<std::size_t>(h) * G * d, G, d);
      now[h] = !speculative_ready || dec.first || dec.correct;
      flag[h] = speculative_ready && !dec.first && dec.correct;
      corrections_made_ += flag[h];
      any_now = any_now || now[h];
      any_spec = any_spec || !now[h];
    }
    std::vector<std::vector<std::int32_t>> pages(static_cast<std::size_t>(sh.kv_heads));
    // A background recall that failed (transfer::fault, an allocation failure) is not installed:
    // its heads fall back to the synchronous path below, so the step never throws after its
    // token was appended and never reads a partial row (tests/test_transfer_faults.cpp).
    store::landing<T> none;
    none.dim = d;
    const store::landing<T>* landed = &none;
    if (any_spec && pd.ticket) {
      try {
        landed = &transfer_.wait(*pd.ticket);
      } catch (const error&) {
        for (int h = 0; h < sh.kv_heads; ++h) now[h] = 1;
        any_now = true;
        any_spec = false;
      }
    }
    // speculative heads: the selection made after step t-1, its background recall installed
    if (any_spec) {
      for (int h = 0; h < sh.kv_heads; ++h) {
        if (now[h]) continue;
        pages[h] = pd.pages[h];
        const auto seq = sh.sequence(t.request, layer, h);
        store_->install(seq, page_positions(t.request, layer, pages[h]), *landed);
      }
      if (pd.ticket) transfer_.release(*pd.ticket);
      pd.ticket.reset();
    }
    drop(pd);
    // step 1 and corrected heads: select with q_t, recall what is missing and wait for it
    if (any_now) {
      auto fresh = select_pages(t.request, layer, t.query, n);
      for (int h = 0; h < sh.kv_heads; ++h) {
        if (!now[h]) continue;
        pages[h] = std::move(fresh[h]);
        // a synchronous recall on this thread (no hand-off to the worker): the step waits for it
        const auto before = store_->stats().bytes_to_device;
        store_->promote(sh.sequence(t.request, layer, h), page_positions(t.request, layer, pages[h]));
        const auto moved = store_->stats().bytes_to_device - before;
        sync_bytes_ += moved;
        sync_stalls_ += moved > 0 ? 1 : 0;
      }
    }
    for (int h = 0; h < sh.kv_heads; ++h) {
      const int len = store_->length(sh.sequence(t.request, layer, h));
      std::vector<std::int32_t> slots(static_cast<std::size_t>(len));
      std::iota(slots.begin(), slots.end(), 0);
      plan_.slots.push_back(slots);
      plan_.pages.push_back(pages[h]);
      corrected_.push_back(flag[h]);
    }
  }

  void fill_positions(int layer) {
    const auto& sh = store_->shape();
    plan_.positions.offsets = plan_.slots.offsets;
    plan_.positions.values.resize(plan_.slots.values.size());
    for (int s = 0; s < plan_.slots.segments(); ++s) {
      const auto seq = sh.sequence(plan_.requests[s / sh.kv_heads], layer, s % sh.kv_heads);
      const auto in = plan_.slots[s];
      auto out = plan_.positions[s];
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = store_->position(seq, in[i]);
    }
  }

  store_type* store_;
  params p_;
  scorer scorer_;
  selector selector_;
  trigger trigger_;
  transfer_type transfer_{};
  std::vector<int> steps_;                     // [requests * layers]
  std::vector<pending_selection> pending_;     // [requests * layers]
  std::int64_t refreshes_ = 0;
  std::int64_t corrections_made_ = 0;
  std::int64_t sync_bytes_ = 0;   // bytes recalled synchronously (step 1, corrections)
  std::int64_t sync_stalls_ = 0;  // synchronous recalls that moved bytes
  score_sets scores_;
  index_sets kept_;
  attention_plan plan_;
  step_binding binding_;  // attend / after_attention: the step of the last decode()
  std::vector<std::uint8_t> corrected_;        // [plan segments]
  std::vector<typename transfer_type::ticket> discarded_;  // dropped recalls still running
};

// FreeKV's parameters for a budget of `budget` tokens per KV head: B rounded down to whole pages
// of p, sink = window = B/4 rounded down to whole pages (the paper's 512 of 2048), at least one
// page each, and B at least S + W. freekv_params(2048) is the paper's configuration; for short
// prompts (512-2048 tokens) p = 16 keeps sink and window one or more pages each.
template <Element T>
typename freekv<T>::params freekv_params(int budget, int page_size = 32, double tau = 0.8,
                                         int dense_layers = 1) {
  require(page_size > 0, "freekv_params", "page_size", page_size, "> 0");
  require(budget >= 0, "freekv_params", "budget", budget, ">= 0");
  const int quarter = std::max(1, budget / 4 / page_size) * page_size;
  const int b = std::max(budget / page_size * page_size, 2 * quarter);
  return {.page_size = page_size, .budget = b, .sink = quarter, .window = quarter, .tau = tau,
          .dense_layers = dense_layers};
}

// The budget (tokens, whole pages) whose working set right after a prompt of n tokens is closest
// to `target` tokens. That working set is B - p + (n mod p): the budget's pages for step 1's
// layout, whose current page holds the prompt's last n mod p tokens (0 when the first decode
// token opens a page). At least 3 pages (sink, one candidate, window under freekv_params).
inline int freekv_budget_for_resident(double target, int n, int page_size) {
  require(page_size > 0, "freekv_budget_for_resident", "page_size", page_size, "> 0");
  const double pages = (target + page_size - n % page_size) / page_size;
  return std::max(3, static_cast<int>(std::lround(pages))) * page_size;
}

}  // namespace kvsift
