// SPDX-License-Identifier: Apache-2.0
#pragma once

// schedule::evict — one tier; a compression round when the trigger fires:
//
//   prefill   appends every chunk; a round for the requests whose chunk is `last` (and, between
//             chunks, for those whose trigger fires: LagKV)
//   decode    appends each request's token; the plan reads every resident token
//   after     the scorer observes the step's attention (H2O: the probabilities method::attend
//             kept, attention_weights(); a second pass over the keys only where the engine
//             attended with its own kernel), the step's query joins the history, and a round runs
//             where the trigger fires (StreamingLLM, H2O, LagKV)
//
// A round of a layer of a ragged batch: Scorer -> Budgeter -> Selector -> the store's retain(),
// which compacts each head-sequence in place so memory is really reclaimed; a progressive
// budgeter (DynamicKV) may then shrink layers already compressed. A selector declaring
// `keeps_everything` (full KV) runs no round at all.

#include <kvsift/attention/reference.hpp>
#include <kvsift/budget/progressive.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/method/composition.hpp>
#include <kvsift/method/lifecycle.hpp>
#include <kvsift/method/recipe.hpp>
#include <kvsift/method/schedule/one_tier.hpp>
#include <kvsift/score/context.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvsift {

struct schedule::evict {
  static constexpr int tiers = 1;
  template <class Store, class Recipe>
  class state;
};

// What every evict state shares, whatever memory its store is in (exec::host here, a device exec
// in device/evict.hpp): the budget checks before anything is appended and the trigger's choice of
// the requests whose round runs. All host arithmetic on lengths and budgets (shapes); `frozen(seq)`
// is a head-sequence's final prefix, `steps` the per-(request, layer) decode steps.
namespace detail {

// The newest contiguous queries the history will hold for c's request once c is remembered,
// after the call's earlier chunks (tot: what the shell counted of them): the simulation of
// query_history::remember over the call, so a check sees what the round will read.
template <class M, class Chunk, class History>
int evict_query_rows(const M& m, int layer, const Chunk& c, const History& history,
                     prefill_totals& tot) {
  const auto r = static_cast<std::size_t>(c.request);
  int& rows = tot.query_rows[r];
  std::int32_t& end = tot.query_end[r];
  if (rows < 0) {  // the request's first chunk of the call: what is buffered already
    const auto s = m.slot(c.request, layer);
    rows = history.rows(s);
    end = history.first(s) + rows;
  }
  const std::int32_t first = c.first_position + c.keys.tokens - c.queries.tokens;
  if (rows > 0 && end != first) rows = 0;  // not contiguous: remember() drops the buffer
  rows += c.queries.tokens;
  end = first + c.queries.tokens;
  return rows;
}

// A chunk's queries for the scorer: every prompt query (a scorer reading all of them) or the
// chunk's newest ones, and on the prompt's last chunk enough newest queries for the scorer's
// window, counting what `history` (method's query_history, or the device half's) buffered and what
// the call's earlier chunks of the request add (tot). Returns the rows buffered after c.
template <class M, class Chunk, class History>
int evict_check_queries(const M& m, std::string_view where, int layer, const Chunk& c,
                        const History& history, prefill_totals& tot) {
  const auto& sc = m.parts().scorer;
  const auto& st = m.store();
  if (sc.query_window() < 0) {
    require(c.queries.tokens == c.keys.tokens, where, "queries.tokens", c.queries.tokens,
            "keys.tokens (" + std::to_string(c.keys.tokens) + "): this scorer reads every prompt query");
  } else {
    require(c.queries.tokens >= 0 && c.queries.tokens <= c.keys.tokens, where, "queries.tokens",
            c.queries.tokens,
            "in [0, keys.tokens = " + std::to_string(c.keys.tokens) + "]: the chunk's newest queries");
  }
  const int have = evict_query_rows(m, layer, c, history, tot);
  if (c.last && layer >= m.parameters().dense_layers && sc.query_window() > 0) {
    const int prompt = st.length(st.shape().sequence(c.request, layer, 0)) +
                       tot.added[static_cast<std::size_t>(c.request)] + c.keys.tokens;
    const int need = std::min(sc.query_window(), prompt);
    require(have >= need, where, "queries.tokens", c.queries.tokens,
            "enough newest queries for the scorer's window: " + std::to_string(need) +
                " ending at the prompt's last token (" + std::to_string(have) + " available)");
  }
  return have;
}

// Segments of the given sizes whose scores are all 0, for a selector's check of budgets against
// lengths before any score exists (the check reads the sizes, and finds no NaN among zeros). Per
// thread and reused: nothing is written to the scores, so a warm call allocates and clears none.
inline const score_sets& zero_scores(std::span<const int> sizes) {
  thread_local score_sets zeros;
  std::int64_t total = 0;
  bool negative = false;
  for (const int n : sizes) {
    total += n;
    negative = negative || n < 0;
  }
  if (negative || total > score_sets::max_offset) zeros.resize(sizes);  // segmented.resize's error
  zeros.offsets.resize(sizes.size() + 1);
  for (std::size_t s = 0; s < sizes.size(); ++s) zeros.offsets[s + 1] = zeros.offsets[s] + sizes[s];
  zeros.values.resize(static_cast<std::size_t>(total));  // new entries 0; the rest still 0
  return zeros;
}

// A budget that cannot hold the protected tokens is an error before anything is appended: the
// selector's check of the budgets of the prompts that end in `chunks`, at their lengths after
// every chunk of the call (tot.added: a request's earlier chunks count too).
template <class M, class Chunk>
void evict_check_prefill(const M& m, int layer, std::span<const Chunk> chunks,
                         const prefill_totals& tot) {
  if (layer < m.parameters().dense_layers) return;
  const auto& sh = m.store().shape();
  std::vector<int> lengths;
  for (const auto& c : chunks) {
    if (!c.last) continue;
    for (int h = 0; h < sh.kv_heads; ++h) {
      lengths.push_back(m.store().length(sh.sequence(c.request, layer, h)) +
                        tot.added[static_cast<std::size_t>(c.request)]);
    }
  }
  std::vector<int> budgets;
  m.parts().budgeter.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths}, budgets);
  m.parts().selector.check(zero_scores(lengths), budgets);
}

// The same check before a decode step's token is appended, for the requests whose trigger will
// fire after it (a rolling StreamingLLM window whose budget cannot hold its sinks, say): the
// error comes before the step, never from after_attention.
template <class M, class T, class Frozen>
void evict_check_decode(const M& m, int layer, std::span<const decode_token<T>> tokens,
                        const std::vector<int>& steps, Frozen frozen) {
  if (layer < m.parameters().dense_layers) return;
  const auto& sh = m.store().shape();
  // scratch per thread, as every decode step runs this: nothing allocated once warm
  thread_local std::vector<int> lengths, budgets, firing_lengths, firing_budgets;
  lengths.clear();
  for (const auto& t : tokens) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      lengths.push_back(m.store().length(sh.sequence(t.request, layer, h)) + 1);
    }
  }
  m.parts().budgeter.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths}, budgets);
  firing_lengths.clear();
  firing_budgets.clear();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto s = i * sh.kv_heads + h;
      const trigger_context ctx{lifecycle_event::decode_step,
                                steps[m.slot(tokens[i].request, layer)] + 1, lengths[s],
                                frozen(sh.sequence(tokens[i].request, layer, h)), budgets[s]};
      if (m.parts().trigger.fires(ctx)) {
        firing_lengths.push_back(lengths[s]);
        firing_budgets.push_back(budgets[s]);
      }
    }
  }
  m.parts().selector.check(zero_scores(firing_lengths), firing_budgets);
}

// The requests of a round whose trigger fires (any of their KV heads), and their heads' budgets
// [firing * kv_heads]; `lengths` and `budgets` are scratch (every request's heads).
template <class M, class Frozen>
void evict_firing(const M& m, int layer, const std::vector<int>& requests, lifecycle_event event,
                  const std::vector<int>& steps, Frozen frozen, std::vector<int>& lengths,
                  std::vector<int>& budgets, std::vector<int>& firing,
                  std::vector<int>& firing_budgets) {
  const auto& store = m.store();
  const auto& sh = store.shape();
  lengths.clear();
  firing.clear();
  firing_budgets.clear();
  for (const int r : requests) {
    for (int h = 0; h < sh.kv_heads; ++h) lengths.push_back(store.length(sh.sequence(r, layer, h)));
  }
  m.parts().budgeter.budgets(budget_context{layer, sh.layers, sh.kv_heads, lengths}, budgets);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    bool fire = false;
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto s = i * sh.kv_heads + h;
      const trigger_context ctx{event, steps[m.slot(requests[i], layer)], lengths[s],
                                frozen(sh.sequence(requests[i], layer, h)), budgets[s]};
      fire = fire || m.parts().trigger.fires(ctx);
    }
    if (fire) {
      firing.push_back(requests[i]);
      for (int h = 0; h < sh.kv_heads; ++h) firing_budgets.push_back(budgets[i * sh.kv_heads + h]);
    }
  }
}

}  // namespace detail

// The content half of an evict state: where the scorer's queries are kept, the step's plan, and a
// round's scores, selection and retain over the firing requests. This one runs over host memory
// (the cpu/ leaves through the parts); device/evict.hpp specialises it for a store in a device
// exec's memory (the thrust/ leaves). The control flow both share is schedule::evict::state.
namespace detail {

template <class Store, class Recipe>
class evict_content : public one_tier<Store> {
  using T = typename Store::element_type;
  using Scorer = typename Recipe::scorer;
  using Selector = typename Recipe::selector;
  using Budgeter = typename Recipe::budgeter;
  static_assert(composition_checked<Store, Scorer, Selector, Budgeter>);
  static constexpr hooks scorer_hooks = hooks_of<Scorer>;
  static constexpr hooks selector_hooks = hooks_of<Selector>;
  static constexpr hooks budgeter_hooks = hooks_of<Budgeter>;
  // The scorer adds the probabilities the step's attention kept (H2O), not only a recomputation.
  static constexpr bool observes_weights =
      scorer_hooks.observe && requires(Scorer& s, const Store& st, const index_sets& plan,
                                       const attention::plan_weights& w) {
        s.observe_weights(st, 0, 0, plan, w, 0);
      };

 public:
  using chunk_type = prefill_chunk<T>;

  template <class M>
  explicit evict_content(const M& m) : one_tier<Store>(m) {}

  // Appends each request's token; the plan reads every resident token.
  template <class M>
  void decode(M& m, int layer, std::span<const decode_token<T>> tokens, attention_plan& plan) {
    weights_.offsets.clear();  // none kept for this step until attend() runs
    this->append_tokens(m, layer, tokens);
    this->plan_everything(m, layer, plan);
  }

  // Where method::attend keeps the step's attention probabilities for after_attention (a scorer
  // that observes, on a compressed layer), or null: the attention computes them anyway, so the
  // running scores need no second pass over the keys. A cache of the pending step, hence mutable.
  template <class M>
  [[nodiscard]] attention::plan_weights* attention_weights(const M& m, int layer) const {
    if constexpr (observes_weights) {
      if (layer >= m.parameters().dense_layers) {
        // the group reduction the scorer adds, done by the attention's own threads
        if constexpr (requires { m.parts().scorer.weights_reduction(); }) {
          weights_.reduction = m.parts().scorer.weights_reduction();
        }
        return &weights_;
      }
    }
    return nullptr;
  }

 protected:
  // The scorer's queries: the method's query_history.
  template <class M>
  static const auto& history(const M& m) { return m.history(); }
  template <class M>
  void check_history(const M&, std::string_view, const chunk_type&, int) const {}
  template <class M>
  void remember(M& m, int layer, const chunk_type& c) {
    m.history().remember(m.slot(c.request, layer), m.parts().scorer.query_window(), c.queries,
                         c.first_position + c.keys.tokens - c.queries.tokens);
  }
  template <class M>
  void remember_step(M& m, int layer, const decode_token<T>& t) {
    m.history().remember_row(m.slot(t.request, layer), m.parts().scorer.query_window(), t.query,
                             m.store().next_position(t.request, layer) - 1);
  }
  template <class M>
  void forget(M& m, int layer, int request) { m.history().clear(m.slot(request, layer)); }
  template <class M>
  void forget_request(M& m, int request) {
    if constexpr (scorer_hooks.reset) m.parts().scorer.reset(std::as_const(m.store()), request);
  }

  // The step's attention into the scorer: the probabilities attend() kept for every (token, KV
  // head), or a second pass over the keys where the engine used its own kernel.
  template <class M>
  void observe(M& m, int layer, std::span<const decode_token<T>> tokens) {
    const auto& sh = m.store().shape();
    const bool kept = weights_.offsets.size() == tokens.size() * sh.kv_heads + 1;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const int first = static_cast<int>(i) * sh.kv_heads;
      if constexpr (observes_weights) {
        if (kept) {
          m.parts().scorer.observe_weights(m.store(), tokens[i].request, layer, m.plan().slots,
                                           weights_, first);
          continue;
        }
      }
      m.parts().scorer.observe(m.store(), tokens[i].request, layer, tokens[i].query,
                               m.plan().slots, first);
    }
  }

  // A round of `firing` (their heads' budgets [firing * kv_heads]) in one pass over the batch:
  // score, select (a freezing selector advances `frozen_all`), retain; a progressive budgeter's
  // revisions after it.
  template <class M>
  void round(M& m, int layer, lifecycle_event event, const std::vector<int>& firing,
             const std::vector<int>& firing_budgets, std::vector<int>& frozen_all) {
    auto& store = m.store();
    auto& parts = m.parts();
    const auto& sh = store.shape();
    auto& qs = round_.queries;
    auto& qpos = round_.query_position;
    qs.clear();
    qpos.clear();
    for (const int r : firing) {
      qs.push_back(m.history().view(m.slot(r, layer)));
      qpos.push_back(m.history().first(m.slot(r, layer)));
    }
    auto& frozen = round_.frozen;  // [firing * kv_heads] final prefix of each head-sequence
    frozen.clear();
    for (const int r : firing) {
      for (int h = 0; h < sh.kv_heads; ++h) frozen.push_back(frozen_all[sh.sequence(r, layer, h)]);
    }
    score_input<Store> in{&store, layer, event, firing, qs, qpos, frozen};
    parts.scorer.score(in, scores_);
    // The selector throws before any store is touched; a freezing one advances `frozen`.
    if constexpr (selector_hooks.freeze) {
      this->refreshes_ += parts.selector.select(scores_, firing_budgets, kept_, std::span<int>(frozen));
      for (std::size_t i = 0; i < firing.size(); ++i) {
        for (int h = 0; h < sh.kv_heads; ++h) {
          frozen_all[sh.sequence(firing[i], layer, h)] = frozen[i * sh.kv_heads + h];
        }
      }
    } else {
      parts.selector.select(scores_, firing_budgets, kept_);
      ++this->refreshes_;
    }
    for (std::size_t i = 0; i < firing.size(); ++i) {
      bool shrinks = false;
      for (int h = 0; h < sh.kv_heads; ++h) {
        const int s = static_cast<int>(i) * sh.kv_heads + h;
        shrinks = shrinks || kept_.size(s) < store.length(sh.sequence(firing[i], layer, h));
      }
      if (!shrinks) continue;
      // the request's kept sets: kept_ itself when it is the round's only one (a decode step of
      // one request: no copy), else copied out of it
      const index_sets* per_request = &kept_;
      if (firing.size() > 1) {
        round_.kept.clear();
        for (int h = 0; h < sh.kv_heads; ++h) {
          round_.kept.push_back(kept_[static_cast<int>(i) * sh.kv_heads + h]);
        }
        per_request = &round_.kept;
      }
      store.retain(firing[i], layer, *per_request);
      if constexpr (scorer_hooks.compact) parts.scorer.compact(store, firing[i], layer, *per_request);
    }
    // Progressive budgeters see the round, then may shrink layers already compressed, in place.
    if constexpr (budgeter_hooks.revise) {
      revisions_.clear();
      parts.budgeter.revise(budget_round{layer, sh.layers, sh.kv_heads, event, firing, &scores_, &kept_},
                            revisions_);
      for (const auto& rv : revisions_) {
        store.retain(rv.request, rv.layer, rv.kept);
        if constexpr (scorer_hooks.compact) parts.scorer.compact(store, rv.request, rv.layer, rv.kept);
        if (rv.request == firing.front()) this->layer_budgets_[rv.layer] = rv.budget;
      }
    }
  }

 private:
  score_sets scores_;
  index_sets kept_;
  std::vector<budget_revision> revisions_;  // a progressive budgeter's orders after a round
  struct {
    std::vector<int> frozen;
    std::vector<kv_view<const float, nhd>> queries;
    std::vector<std::int32_t> query_position;
    index_sets kept;  // one request's kept sets, handed to retain
  } round_;  // scratch of round(): the firing requests' queries, frozen prefixes and kept sets
  mutable attention::plan_weights weights_;  // the pending step's attention (attention_weights)
};

}  // namespace detail

// The one body of the evict schedule, for every exec: the checks, the order of appends, rounds
// and history, and which requests a round takes (the trigger). What a round computes, where the
// queries live and how a step is planned are the content half's (detail::evict_content).
template <class Store, class Recipe>
class schedule::evict::state : public detail::evict_content<Store, Recipe> {
  using content = detail::evict_content<Store, Recipe>;
  using T = typename Store::element_type;
  using Scorer = typename Recipe::scorer;
  using Selector = typename Recipe::selector;
  using Budgeter = typename Recipe::budgeter;
  using chunk = typename content::chunk_type;
  static constexpr hooks selector_hooks = hooks_of<Selector>;

 public:
  // A selector that declares `keeps_everything` (full KV) makes every round a no-op: none runs.
  static constexpr bool compresses = !requires { requires Selector::keeps_everything; };
  template <class R>
  static constexpr capabilities caps{
      .changes_physical_length = compresses,
      .safe_with_shared_prefix = !compresses,
      .needs_queries = R::scorer::needs_queries,
      .cuda_graph_safe = false,  // the laws hold on exec::sim; exec::cuda captures no step yet
      .speculative_decoding = false,
  };
  static constexpr bool after_attention_reads_queries = Scorer::needs_queries;

  template <class M>
  explicit state(const M& m)
      : content(m),
        frozen_(static_cast<std::size_t>(m.store().requests()) * m.store().shape().layers *
                    m.store().shape().kv_heads, 0) {}

  // Final prefix of a head-sequence: its slots before this one are never rescored (advanced by a
  // freezing selector, e.g. LagKV's base; 0 otherwise).
  [[nodiscard]] int frozen(std::int64_t seq) const { return frozen_[static_cast<std::size_t>(seq)]; }

  template <class M>
  void check_chunk(const M& m, std::string_view where, int layer, const chunk& c,
                   prefill_totals& tot) const {
    if constexpr (Scorer::needs_queries) {
      const int rows = detail::evict_check_queries(m, where, layer, c, this->history(m), tot);
      this->check_history(m, where, c, rows);
    }
    this->check_room(m, where, layer, c, tot.added[c.request], tot.pool_pages);
  }

  // A budget that cannot hold the protected tokens is an error before anything is appended.
  template <class M>
  void check_prefill(const M& m, std::string_view, int layer, std::span<const chunk> chunks,
                     const prefill_totals& tot) const {
    if constexpr (selector_hooks.check) detail::evict_check_prefill(m, layer, chunks, tot);
  }

  template <class M>
  void prefill(M& m, int layer, std::span<const chunk> chunks) {
    std::vector<int> ended, between;
    for (const auto& c : chunks) {
      m.store().append(c.request, layer, c.keys, c.values, c.first_position);
      if constexpr (Scorer::needs_queries) this->remember(m, layer, c);
      (c.last ? ended : between).push_back(c.request);
    }
    if constexpr (compresses) {
      if (layer >= m.parameters().dense_layers) {
        compress(m, layer, between, lifecycle_event::prefill_chunk);
        compress(m, layer, ended, lifecycle_event::prefill_end);
      }
    }
    // The prompt's queries have served its round (H2O buffers all of them, as large as the
    // uncompressed cache): free them; decode-time scoring uses decode queries.
    for (const int r : ended) this->forget(m, layer, r);
  }

  template <class M>
  void check_decode(const M& m, std::string_view where, int layer,
                    std::span<const decode_token<T>> tokens) const {
    this->check_decode_room(m, where, layer, tokens);
    if constexpr (compresses && selector_hooks.check) {
      detail::evict_check_decode(m, layer, tokens, this->steps_,
                                 [&](std::int64_t seq) { return frozen_[seq]; });
    }
  }

  template <class M>
  void after_attention(M& m, int layer, std::span<const decode_token<T>> tokens) {
    if (layer < m.parameters().dense_layers) return;
    if constexpr (hooks_of<Scorer>.observe) this->observe(m, layer, tokens);
    batch_.clear();
    for (const auto& t : tokens) {
      // A scorer reading every query (H2O, window -1) follows decode through observe(): keeping
      // each decode query too would grow a buffer by q_heads * d floats per step, unused.
      if constexpr (Scorer::needs_queries) {
        if (m.parts().scorer.query_window() > 0) this->remember_step(m, layer, t);
      }
      batch_.push_back(t.request);
    }
    if constexpr (compresses) compress(m, layer, batch_, lifecycle_event::decode_step);
  }

  template <class M>
  void reset(M& m, int request) {
    const auto& sh = m.store().shape();
    m.store().reset(request);
    this->reset_steps(m, request);
    for (int l = 0; l < sh.layers; ++l) {
      for (int h = 0; h < sh.kv_heads; ++h) frozen_[sh.sequence(request, l, h)] = 0;
    }
    this->forget_request(m, request);
    if constexpr (hooks_of<Budgeter>.reset) m.parts().budgeter.reset(request);
  }

  template <class M>
  void stats(const M&, method_stats& s) const { this->fill_stats(s); }

 private:
  // One round for `requests` of `layer`: those whose trigger fires, their budgets, then the
  // content half's score, select and retain.
  template <class M>
  void compress(M& m, int layer, const std::vector<int>& requests, lifecycle_event event) {
    if (requests.empty()) return;
    detail::evict_firing(m, layer, requests, event, this->steps_,
                         [&](std::int64_t seq) { return frozen_[seq]; }, lengths_, budgets_, firing_,
                         firing_budgets_);
    if (firing_.empty()) return;
    this->layer_budgets_[layer] = firing_budgets_.front();
    this->round(m, layer, event, firing_, firing_budgets_, frozen_);
  }

  std::vector<int> frozen_;  // [requests * layers * kv_heads] final prefix length
  // scratch: after_attention's batch; a round's lengths, budgets, firing requests and theirs
  std::vector<int> batch_, lengths_, budgets_, firing_, firing_budgets_;
};

}  // namespace kvsift
