// SPDX-License-Identifier: Apache-2.0
#pragma once

// kvsift::method — the composition template every named method is an alias of.
//
//   method<Store, Scorer, Selector, Budgeter, Transfer, Trigger>
//
// re-exports its parts (`scorer`, `selector`, ...), checks at compile time that they agree, and
// runs the one lifecycle every engine integration follows (DESIGN §3):
//
//   1. prefill(layer, chunks)      per layer and per prompt chunk, as the engine finishes that
//                                  layer's prefill KV. The chunk marked `last` ends the prompt:
//                                  a compression round runs then (and between chunks when the
//                                  trigger says so, e.g. LagKV).
//   2. decode(layer, tokens)       appends each request's new token and returns the attention
//                                  plan of this step: per KV head, the resident slots (and their
//                                  original positions) attention must read, the new token
//                                  included.
//   3. the engine attends over the plan (its kernel, or attend()).
//   4. after_attention(layer, tokens)  applies what the method decides from this step (an H2O
//                                  eviction, a StreamingLLM roll, ...); effects show from the
//                                  next step (METHODS.md, decode steps).
//   5. stats()                     resident bytes, bytes transferred, refreshes, stalls.
//
// A compression round of a layer of a ragged batch: Scorer -> Budgeter -> Selector -> the
// store's retain(), which compacts each head-sequence in place so memory is really reclaimed.
// Page-level compositions (Quest) keep full KV resident and select pages per step instead.
//
// Engine rules kept here (DESIGN §7): original positions travel with every plan; no scorer
// needs attention probabilities from the engine (attention-based scorers recompute them from
// the queries handed to prefill/decode); ragged batches and chunked prefill are the normal case.

#include <kvsift/attention/reference.hpp>
#include <kvsift/budget/progressive.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/method/composition.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/score/context.hpp>
#include <kvsift/select/page_topk.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvsift {

template <KvStore Store_, Scorer Scorer_, Selector Selector_, Budgeter Budgeter_,
          Transfer Transfer_, Trigger Trigger_>
class method {
  static_assert(std::is_same_v<typename Scorer_::granularity, typename Selector_::granularity>,
                "kvsift::method: the Scorer and the Selector must work at the same granularity "
                "(token_level scores need a token selector, page_level scores a page selector)");
  static_assert(HostAccessible<typename Store_::memory_space>,
                "kvsift::method: the CPU lifecycle needs a host-accessible Store; use the CUDA "
                "backend for device stores");
  static_assert(detail::composition_checked<Store_, Scorer_, Selector_, Budgeter_>);

  // Optional hooks run only when the component declares them (method/composition.hpp).
  static constexpr hooks scorer_hooks = hooks_of<Scorer_>;
  static constexpr hooks selector_hooks = hooks_of<Selector_>;
  static constexpr hooks budgeter_hooks = hooks_of<Budgeter_>;

 public:
  using store_type = Store_;
  using scorer = Scorer_;
  using selector = Selector_;
  using budgeter = Budgeter_;
  using transfer = Transfer_;
  using trigger = Trigger_;
  using element_type = typename Store_::element_type;
  using granularity = typename Scorer_::granularity;
  static constexpr bool page_level_selection = std::is_same_v<granularity, page_level>;

  // The composition's parameters: one aggregate per component, paper defaults.
  struct params {
    typename Scorer_::params scorer{};
    typename Selector_::params selector{};
    typename Budgeter_::params budgeter{};
    typename Trigger_::params trigger{};
    int dense_layers = 0;  // layers [0, dense_layers) are never compressed nor sparsified
  };

  // A selector that declares `keeps_everything` (full KV) makes every round a no-op: none runs.
  static constexpr bool compresses = !requires { requires Selector_::keeps_everything; };

  static constexpr capabilities caps{
      .changes_physical_length = compresses && !page_level_selection,
      .safe_with_shared_prefix = !compresses || page_level_selection,
      .needs_queries = Scorer_::needs_queries,
      .cuda_graph_safe = false,
      .speculative_decoding = false,
  };

  // Validates params against a model shape without touching any store; throws kvsift::error.
  static void can_implement(const model_shape& shape, const params& p) {
    shape.validate("method");
    require(p.dense_layers >= 0, "method", "dense_layers", p.dense_layers, ">= 0");
    if constexpr (requires { Scorer_{p.scorer}.validate(""); }) Scorer_{p.scorer}.validate("method");
    if constexpr (requires { Selector_{p.selector}.validate(""); }) Selector_{p.selector}.validate("method");
    if constexpr (requires { Budgeter_{p.budgeter}.validate(""); }) Budgeter_{p.budgeter}.validate("method");
    if constexpr (requires { Trigger_{p.trigger}.validate(""); }) Trigger_{p.trigger}.validate("method");
    // Parameters two parts share must agree (Quest's page size, SnapKV's window, LagKV's sink
    // and lag): a mismatch would score one page or window and keep another.
    detail::same_shared_params(p.scorer, p.selector, "scorer", "selector");
    detail::same_shared_params(p.budgeter, p.selector, "budgeter", "selector");
    detail::same_shared_params(p.trigger, p.selector, "trigger", "selector");
    detail::same_shared_params(p.scorer, p.trigger, "scorer", "trigger");
  }

  explicit method(Store_& store, params p = {})
      : store_(&store), p_(p), scorer_{p.scorer}, selector_{p.selector}, budgeter_{p.budgeter},
        trigger_{p.trigger} {
    can_implement(store.shape(), p);
    const auto& sh = store.shape();
    const auto slots = static_cast<std::size_t>(store.requests()) * sh.layers;
    queries_.resize(slots);
    query_position_.assign(slots, 0);
    steps_.assign(slots, 0);
    frozen_.assign(slots * sh.kv_heads, 0);
    layer_budgets_.assign(static_cast<std::size_t>(sh.layers), -1);
    in_batch_.assign(static_cast<std::size_t>(store.requests()), 0);
  }

  [[nodiscard]] const params& parameters() const { return p_; }
  [[nodiscard]] Store_& store() { return *store_; }
  [[nodiscard]] const Store_& store() const { return *store_; }
  [[nodiscard]] Scorer_& scorer_state() { return scorer_; }
  [[nodiscard]] Budgeter_& budgeter_state() { return budgeter_; }
  [[nodiscard]] Transfer_& transfer_state() { return transfer_; }

  // 1. Appends each request's chunk to the store, then runs a compression round for the requests
  // whose chunk is `last` (and, between chunks, for those whose trigger fires). Every chunk is
  // validated before anything is appended.
  void prefill(int layer, std::span<const prefill_chunk<element_type>> chunks) {
    constexpr std::string_view where = "method.prefill";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    // several chunks of one request (and, for a paged pool, of all requests) must fit together
    std::vector<int> pending(static_cast<std::size_t>(store_->requests()), 0);
    std::vector<std::int32_t> pending_next(static_cast<std::size_t>(store_->requests()), -1);
    int pool_pages = 0;
    for (const auto& c : chunks) {
      check_request(where, c.request);
      c.keys.validate(where, "keys", sh.kv_heads, sh.head_dim);
      c.values.validate(where, "values", sh.kv_heads, sh.head_dim);
      require(c.values.tokens == c.keys.tokens, where, "values.tokens", c.values.tokens,
              "keys.tokens (" + std::to_string(c.keys.tokens) + ")");
      require(c.keys.tokens > 0, where, "keys.tokens", c.keys.tokens, "> 0 (a non-empty chunk)");
      if constexpr (Scorer_::needs_queries) {
        if (c.queries.tokens > 0) c.queries.validate(where, "queries", sh.q_heads, sh.head_dim);
      }
      if constexpr (Scorer_::needs_queries) {
        if (scorer_.query_window() < 0) {
          require(c.queries.tokens == c.keys.tokens, where, "queries.tokens", c.queries.tokens,
                  "keys.tokens (" + std::to_string(c.keys.tokens) +
                      "): this scorer reads every prompt query");
        } else {
          require(c.queries.tokens >= 0 && c.queries.tokens <= c.keys.tokens, where,
                  "queries.tokens", c.queries.tokens,
                  "in [0, keys.tokens = " + std::to_string(c.keys.tokens) +
                      "]: the chunk's newest queries");
        }
        if (c.last && !page_level_selection && layer >= p_.dense_layers &&
            scorer_.query_window() > 0) {
          const int have = contiguous_queries(c.request, layer, c);
          const int need = std::min(scorer_.query_window(),
                                    store_->length(sh.sequence(c.request, layer, 0)) + c.keys.tokens);
          require(have >= need, where, "queries.tokens", c.queries.tokens,
                  "enough newest queries for the scorer's window: " + std::to_string(need) +
                      " ending at the prompt's last token (" + std::to_string(have) + " available)");
        }
      }
      // after every view and token count is checked: it reads them
      require_finite(where, c, Scorer_::needs_queries);
      const int room = store_->capacity(sh.sequence(c.request, layer, 0)) -
                       store_->length(sh.sequence(c.request, layer, 0)) - pending[c.request];
      require(c.keys.tokens <= room, where, "keys.tokens", c.keys.tokens,
              "<= the room left in the store (" + std::to_string(room) + ")");
      if constexpr (requires { store_->free_pages(); store_->page_size(); }) {
        const int ps = store_->page_size();
        for (int h = 0; h < sh.kv_heads; ++h) {
          const int have = store_->length(sh.sequence(c.request, layer, h)) + pending[c.request];
          pool_pages += (have + c.keys.tokens + ps - 1) / ps - (have + ps - 1) / ps;
        }
        require(pool_pages <= store_->free_pages(), where, "keys.tokens", c.keys.tokens,
                "room in the page pool for the whole batch (" + std::to_string(pool_pages) +
                    " pages needed, " + std::to_string(store_->free_pages()) + " free)");
      }
      const auto next = pending_next[c.request] >= 0 ? pending_next[c.request]
                                                     : store_->next_position(c.request, layer);
      require(c.first_position >= next, where, "first_position", c.first_position,
              ">= " + std::to_string(next));
      pending[c.request] += c.keys.tokens;
      pending_next[c.request] = c.first_position + c.keys.tokens;
    }
    check_budgets_after_prefill(layer, chunks);
    std::vector<int> ended, between;
    for (const auto& c : chunks) {
      store_->append(c.request, layer, c.keys, c.values, c.first_position);
      if constexpr (Scorer_::needs_queries) {
        remember_queries(c.request, layer, c.queries,
                         c.first_position + c.keys.tokens - c.queries.tokens);
      }
      (c.last ? ended : between).push_back(c.request);
    }
    if (compresses && layer >= p_.dense_layers && !page_level_selection) {
      compress(layer, between, lifecycle_event::prefill_chunk);
      compress(layer, ended, lifecycle_event::prefill_end);
    }
    // The prompt's queries have served its round (H2O buffers all of them, as large as the
    // uncompressed cache): free them; decode-time scoring uses decode queries.
    for (const int r : ended) {
      std::vector<float>().swap(queries_[slot(r, layer)]);
    }
  }
  void prefill(int layer, const prefill_chunk<element_type>& chunk) {
    prefill(layer, std::span<const prefill_chunk<element_type>>(&chunk, 1));
  }

  // 2. Appends each request's new token and returns the step's attention plan (the new token
  // included). Page-level methods select their pages here, with this step's query.
  const attention_plan& decode(int layer, std::span<const decode_token<element_type>> tokens) {
    constexpr std::string_view where = "method.decode";
    const auto& sh = store_->shape();
    check_layer(where, layer);
    // The whole batch is checked before any token is appended: every KV head's room and, for a
    // paged pool, the pages of the whole batch; each request at most once.
    int pool_pages = 0;
    std::size_t i = 0;
    try {
      for (; i < tokens.size(); ++i) {
        const auto& t = tokens[i];
        check_request(where, t.request);
        require(in_batch_[t.request] == 0, where,
                [&] { return "tokens[" + std::to_string(i) + "].request"; }, t.request,
                [] { return std::string("a request at most once per batch"); });
        in_batch_[t.request] = 1;
        require(t.key != nullptr && t.value != nullptr, where, "key/value", "null",
                "[kv_heads, d] arrays");
        require(!Scorer_::needs_queries || t.query != nullptr, where, "query", "null",
                "a [q_heads, d] array (this method's scorer needs queries)");
        require_finite(where, i, t, sh, Scorer_::needs_queries);
        for (int h = 0; h < sh.kv_heads; ++h) {
          const auto seq = sh.sequence(t.request, layer, h);
          require(store_->length(seq) < store_->capacity(seq), where, "request", t.request,
                  "a head-sequence with room for one more token");
          if constexpr (requires { store_->free_pages(); store_->page_size(); }) {
            pool_pages += store_->length(seq) % store_->page_size() == 0 ? 1 : 0;
          }
        }
        if constexpr (requires { store_->free_pages(); store_->page_size(); }) {
          require(pool_pages <= store_->free_pages(), where, "request", t.request, [&] {
            return "room in the page pool for the whole batch (" + std::to_string(pool_pages) +
                   " pages needed up to this request, " + std::to_string(store_->free_pages()) +
                   " free)";
          });
        }
      }
    } catch (...) {
      for (std::size_t j = 0; j <= i && j < tokens.size(); ++j) {
        if (tokens[j].request >= 0 && tokens[j].request < store_->requests()) {
          in_batch_[tokens[j].request] = 0;
        }
      }
      throw;
    }
    for (const auto& t : tokens) in_batch_[t.request] = 0;
    check_budgets_after_step(layer, tokens);
    binding_.unbind();
    plan_.requests.clear();
    for (const auto& t : tokens) {
      const auto pos = store_->next_position(t.request, layer);
      store_->append(t.request, layer,
                     kv_view<const element_type, nhd>::contiguous(t.key, 1, sh.kv_heads, sh.head_dim),
                     kv_view<const element_type, nhd>::contiguous(t.value, 1, sh.kv_heads, sh.head_dim),
                     pos);
      ++steps_[slot(t.request, layer)];
      plan_.requests.push_back(t.request);
    }
    if constexpr (page_level_selection) {
      if (layer >= p_.dense_layers) {
        select_pages(layer, tokens);
        binding_.bind(layer);
        return plan_;
      }
    }
    auto& sizes = sizes_;
    sizes.clear();
    for (const int r : plan_.requests) {
      for (int h = 0; h < sh.kv_heads; ++h) sizes.push_back(store_->length(sh.sequence(r, layer, h)));
    }
    plan_.slots.resize(sizes);
    plan_.pages.clear();
    for (int s = 0; s < plan_.slots.segments(); ++s) {
      auto seg = plan_.slots[s];
      std::iota(seg.begin(), seg.end(), 0);
    }
    if constexpr (page_level_selection) {  // a dense layer of a page method reads every page
      const int ps = selector_.p.page_size;
      for (int& n : sizes) n = (n + ps - 1) / ps;
      plan_.pages.resize(sizes);
      for (int s = 0; s < plan_.pages.segments(); ++s) {
        auto seg = plan_.pages[s];
        std::iota(seg.begin(), seg.end(), 0);
      }
    }
    fill_positions(layer);
    binding_.bind(layer);
    return plan_;
  }
  const attention_plan& decode(int layer, const decode_token<element_type>& token) {
    return decode(layer, std::span<const decode_token<element_type>>(&token, 1));
  }

  // 3. The library's attention over the current plan: out [tokens.size(), q_heads, d].
  // The call must be the step of the last decode(): same layer, same requests in the same
  // order, a query each (kvsift::error otherwise).
  void attend(int layer, std::span<const decode_token<element_type>> tokens, float* out) const {
    constexpr std::string_view where = "method.attend";
    check_step(where, layer, tokens, true);
    require(out != nullptr || tokens.empty(), where, "out", "null",
            "a [tokens, q_heads, d] output array");
    const auto& sh = store_->shape();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      attention::attend_plan(*store_, tokens[i].request, layer, tokens[i].query, plan_.slots,
                             out + i * static_cast<std::size_t>(sh.q_heads) * sh.head_dim,
                             static_cast<int>(i) * sh.kv_heads);
    }
  }

  // 4. Applies this step's decisions; they show from the next step.
  // The call must be the step of the last decode() (same layer, same requests in the same
  // order, queries when the scorer needs them), once: the step's plan is spent afterwards.
  void after_attention(int layer, std::span<const decode_token<element_type>> tokens) {
    check_step("method.after_attention", layer, tokens, Scorer_::needs_queries);
    binding_.unbind();  // applied once; the next step starts with decode()
    if (layer < p_.dense_layers || page_level_selection) return;
    const auto& sh = store_->shape();
    if constexpr (scorer_hooks.observe) {
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        scorer_.observe(*store_, tokens[i].request, layer, tokens[i].query, plan_.slots,
                        static_cast<int>(i) * sh.kv_heads);
      }
    }
    auto& batch = batch_;
    batch.clear();
    for (const auto& t : tokens) {
      // A scorer reading every query (H2O, window -1) follows decode through observe(): keeping
      // each decode query too would grow a buffer by q_heads * d floats per step, unused.
      if constexpr (Scorer_::needs_queries) {
        if (scorer_.query_window() > 0) {
          remember_queries(
              t.request, layer,
              kv_view<const float, nhd>::contiguous(t.query, 1, sh.q_heads, sh.head_dim),
              store_->next_position(t.request, layer) - 1);
        }
      }
      batch.push_back(t.request);
    }
    compress(layer, batch, lifecycle_event::decode_step);
  }
  void after_attention(int layer, const decode_token<element_type>& token) {
    after_attention(layer, std::span<const decode_token<element_type>>(&token, 1));
  }

  // Ends a request: drops its tokens from the store and its state from the method (decode
  // steps, frozen prefixes, buffered queries, a budgeter's per-request state), so the slot can
  // take a new prompt in a continuous batch.
  void reset(int request) {
    check_request("method.reset", request);
    const auto& sh = store_->shape();
    store_->reset(request);
    for (int l = 0; l < sh.layers; ++l) {
      steps_[slot(request, l)] = 0;
      std::vector<float>().swap(queries_[slot(request, l)]);
      for (int h = 0; h < sh.kv_heads; ++h) frozen_[sh.sequence(request, l, h)] = 0;
    }
    if constexpr (scorer_hooks.reset) scorer_.reset(std::as_const(*store_), request);
    if constexpr (budgeter_hooks.reset) budgeter_.reset(request);
    binding_.unbind();  // a pending step may have included the request
  }

  // 5.
  [[nodiscard]] method_stats stats() const {
    method_stats s;
    s.resident_bytes = store_->resident_bytes();
    s.resident_tokens = store_->resident_tokens();
    s.bytes_transferred = transfer_.bytes_moved();
    s.refreshes = refreshes_;
    s.stalls = 0;
    s.layer_budgets = layer_budgets_;
    return s;
  }

  [[nodiscard]] const attention_plan& plan() const { return plan_; }
  [[nodiscard]] int step(int request, int layer) const { return steps_[slot(request, layer)]; }
  // Final prefix of a head-sequence: its slots before this one are never rescored (advanced by a
  // freezing selector, e.g. LagKV's base; 0 otherwise).
  [[nodiscard]] int frozen(int request, int layer, int head) const {
    return frozen_[store_->shape().sequence(request, layer, head)];
  }

 private:
  [[nodiscard]] std::size_t slot(int request, int layer) const {
    return static_cast<std::size_t>(request) * store_->shape().layers + layer;
  }
  void check_layer(std::string_view where, int layer) const {
    require(layer >= 0 && layer < store_->shape().layers, where, "layer", layer,
            [&] { return "in [0, " + std::to_string(store_->shape().layers) + ")"; });
  }
  void check_request(std::string_view where, int request) const {
    require(request >= 0 && request < store_->requests(), where, "request", request,
            [&] { return "in [0, " + std::to_string(store_->requests()) + ")"; });
  }
  // attend / after_attention: the step planned by the last decode(), not yet applied.
  void check_step(std::string_view where, int layer,
                  std::span<const decode_token<element_type>> tokens, bool needs_query) const {
    binding_.check(where, layer, tokens, plan_.requests, needs_query);
  }

  // Queries available for the window ending at chunk c's last token: c's own, plus the buffered
  // ones when they continue right before c's first query.
  int contiguous_queries(int request, int layer, const prefill_chunk<element_type>& c) const {
    const auto& sh = store_->shape();
    const std::size_t row = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
    const int buffered = static_cast<int>(queries_[slot(request, layer)].size() / row);
    const std::int32_t first = c.first_position + c.keys.tokens - c.queries.tokens;
    const bool continues = buffered > 0 && query_position_[slot(request, layer)] + buffered == first;
    return c.queries.tokens + (continues ? buffered : 0);
  }

  // Keeps the newest queries the scorer needs (all of them for a window of -1), across chunks.
  // `first` is the position of q's first row; buffered queries that do not end right before it
  // are dropped (a chunk that carried only its newest queries leaves a gap).
  void remember_queries(int request, int layer, kv_view<const float, nhd> q, std::int32_t first) {
    const auto& sh = store_->shape();
    const int keep = scorer_.query_window();
    if (keep == 0) return;
    auto& buf = queries_[slot(request, layer)];
    const std::size_t row = static_cast<std::size_t>(sh.q_heads) * sh.head_dim;
    if (!buf.empty() && query_position_[slot(request, layer)] +
                                static_cast<std::int32_t>(buf.size() / row) != first) {
      buf.clear();
    }
    if (q.tokens == 0) return;
    if (keep > 0 && q.tokens > keep) {  // only the newest `keep` rows can matter: copy just those
      buf.clear();
      first += q.tokens - keep;
      q = q.slice(q.tokens - keep, keep);
    }
    const int have = static_cast<int>(buf.size() / row);
    if (have == 0) query_position_[slot(request, layer)] = first;
    for (int t = 0; t < q.tokens; ++t) {
      for (int h = 0; h < sh.q_heads; ++h) {
        const float* src = q.row(t, h);
        buf.insert(buf.end(), src, src + sh.head_dim);
      }
    }
    const int total = have + q.tokens;
    if (keep > 0 && total > keep) {
      buf.erase(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>((total - keep) * row));
      query_position_[slot(request, layer)] = first + q.tokens - keep;
    }
  }

  // A budget that cannot hold the protected tokens is an error before anything is appended.
  void check_budgets_after_prefill(int layer,
                                   std::span<const prefill_chunk<element_type>> chunks) const {
    if constexpr (!page_level_selection && selector_hooks.check) {
      if (layer < p_.dense_layers) return;
      const auto& sh = store_->shape();
      std::vector<int> lengths;
      for (const auto& c : chunks) {
        if (!c.last) continue;
        for (int h = 0; h < sh.kv_heads; ++h) {
          lengths.push_back(store_->length(sh.sequence(c.request, layer, h)) + c.keys.tokens);
        }
      }
      std::vector<int> budgets;
      budgeter_.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths}, budgets);
      score_sets sizes_only;
      sizes_only.resize(lengths);
      selector_.check(sizes_only, budgets);
    }
  }

  // The same check before a decode step's token is appended, for the requests whose trigger will
  // fire after it (a rolling StreamingLLM window whose budget cannot hold its sinks, say): the
  // error comes before the step, never from after_attention with the token already appended.
  void check_budgets_after_step(int layer,
                                std::span<const decode_token<element_type>> tokens) const {
    if constexpr (compresses && !page_level_selection && selector_hooks.check) {
      if (layer < p_.dense_layers) return;
      const auto& sh = store_->shape();
      std::vector<int> lengths;
      for (const auto& t : tokens) {
        for (int h = 0; h < sh.kv_heads; ++h) {
          lengths.push_back(store_->length(sh.sequence(t.request, layer, h)) + 1);
        }
      }
      std::vector<int> budgets;
      budgeter_.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths}, budgets);
      std::vector<int> firing_lengths, firing_budgets;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        for (int h = 0; h < sh.kv_heads; ++h) {
          const auto s = i * sh.kv_heads + h;
          const trigger_context ctx{lifecycle_event::decode_step,
                                    steps_[slot(tokens[i].request, layer)] + 1, lengths[s],
                                    frozen_[sh.sequence(tokens[i].request, layer, h)], budgets[s]};
          if (trigger_.fires(ctx)) {
            firing_lengths.push_back(lengths[s]);
            firing_budgets.push_back(budgets[s]);
          }
        }
      }
      score_sets sizes_only;
      sizes_only.resize(firing_lengths);
      selector_.check(sizes_only, firing_budgets);
    }
  }

  // One round for `requests` of `layer`: score, budget, select, retain — if the trigger fires.
  void compress(int layer, const std::vector<int>& requests, lifecycle_event event) {
    if (requests.empty()) return;
    const auto& sh = store_->shape();
    auto& lengths = lengths_;
    lengths.clear();
    for (const int r : requests) {
      for (int h = 0; h < sh.kv_heads; ++h) lengths.push_back(store_->length(sh.sequence(r, layer, h)));
    }
    budgeter_.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths}, budgets_);
    std::vector<int> firing;
    std::vector<int> firing_budgets;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      bool fire = false;
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto s = i * sh.kv_heads + h;
        trigger_context ctx{event, steps_[slot(requests[i], layer)], lengths[s],
                            frozen_[sh.sequence(requests[i], layer, h) % frozen_.size()],
                            budgets_[s]};
        fire = fire || trigger_.fires(ctx);
      }
      if (fire) {
        firing.push_back(requests[i]);
        for (int h = 0; h < sh.kv_heads; ++h) firing_budgets.push_back(budgets_[i * sh.kv_heads + h]);
      }
    }
    if (firing.empty()) return;

    std::vector<kv_view<const float, nhd>> qs;
    std::vector<std::int32_t> qpos;
    for (const int r : firing) {
      const auto& buf = queries_[slot(r, layer)];
      const int rows = static_cast<int>(buf.size() / (static_cast<std::size_t>(sh.q_heads) * sh.head_dim));
      qs.push_back(kv_view<const float, nhd>::contiguous(buf.data(), rows, sh.q_heads, sh.head_dim));
      qpos.push_back(query_position_[slot(r, layer)]);
    }
    std::vector<int> frozen;  // [firing * kv_heads] final prefix of each head-sequence
    for (const int r : firing) {
      for (int h = 0; h < sh.kv_heads; ++h) frozen.push_back(frozen_[sh.sequence(r, layer, h)]);
    }
    score_input<Store_> in{store_, layer, event, firing, qs, qpos, frozen};
    scorer_.score(in, scores_);
    // The selector throws before any store is touched; a freezing one advances `frozen`.
    if constexpr (selector_hooks.freeze) {
      refreshes_ += selector_.select(scores_, firing_budgets, kept_, std::span<int>(frozen));
      for (std::size_t i = 0; i < firing.size(); ++i) {
        for (int h = 0; h < sh.kv_heads; ++h) {
          frozen_[sh.sequence(firing[i], layer, h)] = frozen[i * sh.kv_heads + h];
        }
      }
    } else {
      selector_.select(scores_, firing_budgets, kept_);
      ++refreshes_;
    }
    layer_budgets_[layer] = firing_budgets.empty() ? -1 : firing_budgets.front();
    for (std::size_t i = 0; i < firing.size(); ++i) {
      index_sets per_request;
      bool shrinks = false;
      for (int h = 0; h < sh.kv_heads; ++h) {
        const int s = static_cast<int>(i) * sh.kv_heads + h;
        per_request.push_back(kept_[s]);
        shrinks = shrinks || kept_.size(s) < store_->length(sh.sequence(firing[i], layer, h));
      }
      if (!shrinks) continue;
      store_->retain(firing[i], layer, per_request);
      if constexpr (scorer_hooks.compact) {
        scorer_.compact(*store_, firing[i], layer, per_request);
      }
    }
    // Progressive budgeters see the round, then may shrink layers already compressed, in place.
    if constexpr (budgeter_hooks.revise) {
      revisions_.clear();
      budgeter_.revise(budget_round{layer, sh.layers, sh.kv_heads, event, firing, &scores_, &kept_},
                       revisions_);
      for (const auto& rv : revisions_) {
        store_->retain(rv.request, rv.layer, rv.kept);
        if constexpr (scorer_hooks.compact) {
          scorer_.compact(*store_, rv.request, rv.layer, rv.kept);
        }
        if (rv.request == firing.front()) layer_budgets_[rv.layer] = rv.budget;
      }
    }
  }

  void select_pages(int layer, std::span<const decode_token<element_type>> tokens) {
    const auto& sh = store_->shape();
    std::vector<kv_view<const float, nhd>> qs;
    std::vector<std::int32_t> qpos;
    std::vector<int> lengths;
    for (const auto& t : tokens) {
      qs.push_back(kv_view<const float, nhd>::contiguous(t.query, 1, sh.q_heads, sh.head_dim));
      qpos.push_back(store_->next_position(t.request, layer) - 1);
      for (int h = 0; h < sh.kv_heads; ++h) {
        lengths.push_back(store_->length(sh.sequence(t.request, layer, h)));
      }
    }
    score_input<Store_> in{store_, layer, lifecycle_event::decode_step, plan_.requests, qs, qpos, {}};
    scorer_.score(in, scores_);
    budgeter_.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths}, budgets_);
    selector_.select(scores_, budgets_, plan_.pages);
    select::expand_pages(plan_.pages, lengths, selector_.p.page_size, plan_.slots, sizes_);
    ++refreshes_;
    fill_positions(layer);
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

  Store_* store_;
  params p_;
  Scorer_ scorer_;
  Selector_ selector_;
  Budgeter_ budgeter_;
  Transfer_ transfer_{};
  Trigger_ trigger_;
  std::vector<std::vector<float>> queries_;   // [requests * layers] newest queries, [rows, q_heads, d]
  std::vector<std::int32_t> query_position_;  // [requests * layers] position of the first buffered query
  std::vector<int> steps_;                    // [requests * layers] decode steps taken
  std::vector<int> frozen_;                   // [requests * layers * kv_heads] final prefix length
  std::vector<int> layer_budgets_;            // [layers]
  std::int64_t refreshes_ = 0;
  score_sets scores_;
  std::vector<int> budgets_;
  index_sets kept_;
  std::vector<budget_revision> revisions_;  // a progressive budgeter's orders after a round
  attention_plan plan_;
  step_binding binding_;               // the pending step (decode() done, not yet applied)
  std::vector<int> sizes_;             // scratch: plan segment sizes
  std::vector<int> batch_, lengths_;   // scratch: after_attention's batch, a round's lengths
  std::vector<unsigned char> in_batch_;  // [requests] scratch: requests seen in a decode batch
};

}  // namespace kvsift
