// SPDX-License-Identifier: Apache-2.0
#pragma once

// Layer-adaptive progressive budgets — DynamicKV (Zhou et al., 2024, "DynamicKV: Task-Aware
// Adaptive KV Cache Compression for Long Context LLMs"). METHODS.md "DynamicKV" is the contract.

#include <kvsift/concepts.hpp>
#include <kvsift/cpu/segmented_topk.hpp>
#include <kvsift/budget/progressive.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace kvsift::budget {

// DynamicKV's integer budget rule for one update (METHODS.md): with `counts[j]` the global top-k
// hits of seen layer j, budget_j = floor(counts[j] * total / sum(counts)) in integer arithmetic,
// and the remainder total - sum(budget) goes to the newest layer (the last entry). `total` is
// base * L_total. Budgets are not yet capped ("only shrink" is the caller's step).
inline std::vector<std::int64_t> dynamic_layer_shares(std::span<const std::int64_t> counts,
                                                      std::int64_t total) {
  constexpr std::string_view where = "budget::dynamic_layer_shares";
  require(!counts.empty(), where, "counts.size", 0, "> 0");
  require(total >= 0, where, "total", total, ">= 0");
  std::int64_t sum = 0;
  for (const auto c : counts) {
    require(c >= 0, where, "counts[]", c, ">= 0");
    sum += c;
  }
  require(sum > 0, where, "sum(counts)", sum, "> 0");
  std::vector<std::int64_t> out(counts.size());
  std::int64_t given = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    out[j] = counts[j] * total / sum;
    given += out[j];
  }
  out.back() += total - given;
  return out;
}

// dynamic_layer — DynamicKV's progressive layer budgets (Zhou et al., 2024), a Budgeter that also
// revises layers it has already seen (the method's progressive hook, budget_round/revise).
//
// Per request, with average budget C = `tokens` per head-sequence, base = C - window, n the
// prompt length and M = n - window past tokens:
//  1. as layer l finishes prefill it keeps, per KV head, its top min(r_max * base, M) past tokens
//     plus the window (`budgets()`; n <= C keeps everything);
//  2. after layers interval-1, 2*interval-1, ... and always after the last layer, `revise()`
//     flattens the saved pooled scores of every seen layer in (layer, head, token) order, takes
//     the global top T = base * H * (seen layers) (ties: the earlier flattened index), counts the
//     hits of each layer, shares base * L_total by dynamic_layer_shares() and shrinks each seen
//     layer to min(its share, its current past count) past tokens — its top-scored ones — plus
//     the window. Budgets only shrink.
// Layer l's budget depends on layers <= l only, so it runs as an engine prefills layer by layer.
// Each request of a ragged batch is budgeted independently (its own n, its own global top-k), as
// the paper's batch-1 code does. Past budgets are per layer, the same for every KV head.
//
// State: the pooled scores of every past token of each seen layer (H * M floats per layer and
// request, whether the token is still resident or not: the contract counts hits over all of
// them), the resident past tokens and the history of updates. A new prompt for a request (a
// round for a layer at or below the newest one seen) or reset(request) clears it.
//
// Parameters: tokens C (2048; no paper default, a budget is always given), window 8, r_max 10,
// interval m 4. C <= window is an error.
// Cost: budgets() O(segments); an update O(seen layers * H * M) (nth_element), ceil(L / m)
// updates per request; memory O(L * H * M) floats per request.
struct dynamic_layer {
  using kvsift_role = budgeter_tag;
  static constexpr hooks kvsift_hooks{.reset = true, .revise = true};
  struct params {
    int tokens = 2048;  // average budget C per head-sequence, window included
    int window = 8;     // observation window w (kept, never scored)
    int r_max = 10;     // first-pass cap: a layer keeps at most r_max * base past tokens
    int interval = 4;   // update after every interval-th layer (and the last)
  };
  params p{};

  dynamic_layer() = default;
  dynamic_layer(params params_) : p(params_) {}  // NOLINT: built from params like the aggregates

  void validate(std::string_view where) const {
    require(p.window >= 0, where, "window", p.window, ">= 0");
    require(p.tokens > p.window, where, "budget", p.tokens,
            "> window (" + std::to_string(p.window) + ")");
    require(p.r_max >= 1, where, "r_max", p.r_max, ">= 1");
    require(p.interval >= 1, where, "interval", p.interval, ">= 1");
  }

  [[nodiscard]] int base() const { return p.tokens - p.window; }

  // First pass: min(r_max * base, n - w) past tokens plus the window; n <= C keeps all n.
  [[nodiscard]] int first_budget(int n) const {
    if (n <= p.tokens) return n;
    const std::int64_t cap = static_cast<std::int64_t>(p.r_max) * base();
    return static_cast<int>(std::min<std::int64_t>(cap, n - p.window)) + p.window;
  }

  void budgets(const budget_context& ctx, std::vector<int>& out) const {
    validate("budget::dynamic_layer");
    out.resize(ctx.lengths.size());
    for (std::size_t s = 0; s < ctx.lengths.size(); ++s) out[s] = first_budget(ctx.lengths[s]);
  }

  // After a round of `round.layer`: saves each request's past scores and resident past tokens,
  // and on an update layer appends the shrink orders of every seen layer to `out`.
  void revise(const budget_round& round, std::vector<budget_revision>& out) {
    if (round.event != lifecycle_event::prefill_end) return;
    const int H = round.kv_heads;
    for (std::size_t i = 0; i < round.requests.size(); ++i) {
      const int r = round.requests[i];
      auto& st = state_of(r, round.layers, H);
      if (st.newest >= round.layer) st = fresh_state(round.layers, H);
      st.newest = round.layer;
      auto& ls = st.layer[round.layer];
      const int n = round.scores->size(static_cast<int>(i) * H);
      const int M = std::max(n - p.window, 0);
      ls = layer_state{};
      ls.seen = true;
      ls.compressed = n > p.tokens;  // n <= C: nothing is evicted, no update runs for it
      ls.past_tokens = M;
      ls.scores.assign(static_cast<std::size_t>(H) * M, 0.0f);
      ls.resident.assign(static_cast<std::size_t>(H), {});
      ls.tail.assign(static_cast<std::size_t>(H), 0);
      for (int h = 0; h < H; ++h) {
        const int s = static_cast<int>(i) * H + h;
        const auto sc = (*round.scores)[s];
        std::copy(sc.begin(), sc.begin() + M,
                  ls.scores.begin() + static_cast<std::ptrdiff_t>(h) * M);
        for (const auto slot : (*round.kept)[s]) {
          if (slot < M) {
            ls.resident[h].push_back(slot);
          } else {
            ++ls.tail[h];
          }
        }
      }
      if (!ls.compressed) {
        st.past_budget[round.layer] = M;
        continue;
      }
      st.past_budget[round.layer] = static_cast<int>(ls.resident[0].size());
      if ((round.layer + 1) % p.interval == 0 || round.layer == round.layers - 1) {
        update(r, st, round.layer, round.layers, H, out);
      }
    }
  }

  // Past budget (tokens per KV head, window excluded) of every layer of a request, -1 for layers
  // not yet prefilled; max(n - w, 0) when n <= C.
  [[nodiscard]] std::vector<int> past_budgets(int request) const {
    if (request < 0 || request >= static_cast<int>(states_.size())) return {};
    return states_[request].past_budget;
  }
  // One row per update run for a request's prompt: each layer's past budget after it, -1 for
  // layers not yet prefilled.
  [[nodiscard]] std::vector<std::vector<int>> history(int request) const {
    if (request < 0 || request >= static_cast<int>(states_.size())) return {};
    return states_[request].history;
  }
  // The saved pooled scores of a request's layer: [kv_heads, n - w], every past token; empty for a
  // layer not seen yet.
  [[nodiscard]] std::span<const float> scores(int request, int layer) const {
    if (request < 0 || request >= static_cast<int>(states_.size())) return {};
    const auto& st = states_[request];
    if (layer < 0 || layer >= static_cast<int>(st.layer.size())) return {};
    return st.layer[layer].scores;
  }
  // Forgets a request (its slot in a continuous batch is reused).
  void reset(int request) {
    if (request >= 0 && request < static_cast<int>(states_.size())) states_[request] = {};
  }

 private:
  struct layer_state {
    bool seen = false;
    bool compressed = false;                      // n > C: takes part in the updates
    int past_tokens = 0;                          // M = n - w
    std::vector<float> scores;                    // [H, M] pooled scores of every past token
    std::vector<std::vector<std::int32_t>> resident;  // [H] resident past tokens, ascending
    std::vector<int> tail;                        // [H] resident slots after the past ones (window)
  };
  struct request_state {
    int newest = -1;                   // newest layer seen for the current prompt
    std::vector<int> past_budget;      // [L]
    std::vector<layer_state> layer;    // [L]
    std::vector<std::vector<int>> history;
  };
  std::vector<request_state> states_;  // indexed by request

  static request_state fresh_state(int layers, int) {
    request_state st;
    st.past_budget.assign(static_cast<std::size_t>(layers), -1);
    st.layer.assign(static_cast<std::size_t>(layers), {});
    return st;
  }
  request_state& state_of(int request, int layers, int H) {
    if (request >= static_cast<int>(states_.size())) {
      states_.resize(static_cast<std::size_t>(request) + 1);
    }
    auto& st = states_[request];
    if (static_cast<int>(st.layer.size()) != layers) st = fresh_state(layers, H);
    return st;
  }

  // One progressive update after layer l of a request: global top-k over the seen layers, shares,
  // then shrink orders for the layers whose share is below their resident past count.
  void update(int request, request_state& st, int l, int layers, int H,
              std::vector<budget_revision>& out) const {
    std::vector<int> seen;
    std::vector<std::int64_t> first;  // flattened index of each seen layer's first score
    std::int64_t total_scores = 0, flat = 0;
    for (int j = 0; j <= l; ++j) {
      const auto& ls = st.layer[j];
      if (ls.seen && ls.compressed) {
        seen.push_back(j);
        first.push_back(flat);
        total_scores += static_cast<std::int64_t>(ls.scores.size());
      }
      flat += static_cast<std::int64_t>(H) * ls.past_tokens;
    }
    if (seen.empty() || seen.back() != l) return;
    const std::int64_t T = std::min<std::int64_t>(
        static_cast<std::int64_t>(base()) * H * static_cast<std::int64_t>(seen.size()),
        total_scores);
    // candidates as (seen-layer ordinal, index within the layer); compare by score, then flat index
    std::vector<std::pair<int, std::int32_t>> cand;
    cand.reserve(static_cast<std::size_t>(total_scores));
    for (std::size_t k = 0; k < seen.size(); ++k) {
      const auto n = static_cast<std::int32_t>(st.layer[seen[k]].scores.size());
      for (std::int32_t t = 0; t < n; ++t) cand.emplace_back(static_cast<int>(k), t);
    }
    const auto better = [&](const std::pair<int, std::int32_t>& a,
                            const std::pair<int, std::int32_t>& b) {
      const float sa = st.layer[seen[a.first]].scores[a.second];
      const float sb = st.layer[seen[b.first]].scores[b.second];
      if (sa != sb) return sa > sb;
      return first[a.first] + a.second < first[b.first] + b.second;
    };
    std::nth_element(cand.begin(), cand.begin() + T, cand.end(), better);
    std::vector<std::int64_t> counts(seen.size(), 0);
    for (std::int64_t c = 0; c < T; ++c) ++counts[cand[c].first];
    const auto shares =
        dynamic_layer_shares(counts, static_cast<std::int64_t>(base()) * layers);
    for (std::size_t k = 0; k < seen.size(); ++k) {
      const int j = seen[k];
      auto& ls = st.layer[j];
      const int now = static_cast<int>(ls.resident[0].size());
      const int keep = static_cast<int>(std::min<std::int64_t>(shares[k], now));
      st.past_budget[j] = keep;
      if (keep == now) continue;
      budget_revision rv;
      rv.request = request;
      rv.layer = j;
      rv.budget = keep + ls.tail[0];
      std::vector<std::int32_t> picked;
      for (int h = 0; h < H; ++h) {
        const std::span<const float> sc(
            ls.scores.data() + static_cast<std::size_t>(h) * ls.past_tokens,
            static_cast<std::size_t>(ls.past_tokens));
        cpu::topk_of(sc, ls.resident[h], keep, picked);
        std::vector<std::int32_t> slots;  // resident slots of the picked tokens, then the tail
        slots.reserve(picked.size() + static_cast<std::size_t>(ls.tail[h]));
        std::size_t at = 0;
        for (const auto tok : picked) {
          while (ls.resident[h][at] != tok) ++at;
          slots.push_back(static_cast<std::int32_t>(at));
        }
        const int old = static_cast<int>(ls.resident[h].size());
        for (int t = 0; t < ls.tail[h]; ++t) slots.push_back(old + t);
        rv.kept.push_back(slots);
        ls.resident[h] = picked;
      }
      out.push_back(std::move(rv));
    }
    std::vector<int> row(static_cast<std::size_t>(layers), -1);
    for (int j = 0; j <= l; ++j) row[j] = st.past_budget[j];
    st.history.push_back(std::move(row));
  }
};
static_assert(Budgeter<dynamic_layer>);
static_assert(ProgressiveBudgeter<dynamic_layer>);

}  // namespace kvsift::budget
