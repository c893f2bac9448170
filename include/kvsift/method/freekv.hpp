// SPDX-License-Identifier: Apache-2.0
#pragma once

// kvsift::freekv — FreeKV (Liu et al., 2025, "FreeKV: Boosting KV Cache Retrieval for Efficient
// LLM Inference"): speculative page retrieval with correction, over a tiered store. A recipe
// over the shell (method/method.hpp):
//
//   store::tiered<T>       host pool = every token; working set = the selected pages only
//   domain::pool_pages     candidates: every host-pool page, one token ahead
//   score::freekv_pages    Quest min-max digest + bound per query head, softmax over the
//                          candidate pages per query head, mean over the group
//   select::freekv_pages   sink pages + top B/p - S/p - W/p candidates + window pages
//   trigger::query_cosine  per KV head, mean over the group of cos(q_t, q_{t-1}) < tau => correct
//   schedule::speculative  select after step t for step t+1, recall in the background
//                          (transfer::async), correct the heads whose query moved
//
// Parameters (paper defaults): page_size 32, budget 2048, sink 512, window 512 (tokens, whole
// pages), tau 0.8, merge softmax_mean, dense_layers 1. The store's page size must equal
// page_size. Cost per sparse layer and step: O(G P d) scoring (digests kept incrementally) plus
// the rows of newly selected pages copied once; resident K+V about B tokens per KV head.

#include <kvsift/budget/uniform.hpp>
#include <kvsift/method/method.hpp>
#include <kvsift/method/schedule/speculative.hpp>
#include <kvsift/score/freekv_pages.hpp>
#include <kvsift/select/freekv_pages.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/trigger/query_cosine.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift {

struct freekv_recipe {
  using scorer = kvsift::score::freekv_pages;
  using selector = kvsift::select::freekv_pages;
  using budgeter = kvsift::budget::uniform;  // one budget B for every KV head of a sparse layer
  using trigger = kvsift::trigger::query_cosine;
  using schedule = kvsift::schedule::speculative;
  static constexpr std::string_view name = "freekv";

  struct params {
    int page_size = 32;    // p (the store's page size)
    int budget = 2048;     // B tokens per KV head, sink and window included (whole pages)
    int sink = 512;        // S tokens (whole pages)
    int window = 512;      // W tokens (whole pages), the current page included
    double tau = 0.8;      // correction threshold on the group-mean query cosine
    kvsift::score::freekv_merge merge = kvsift::score::freekv_merge::softmax_mean;
    int dense_layers = 1;  // layers [0, dense_layers) keep and read everything
    far_tier far = far_tier::recall;  // host-pool rows a step needs: recalled, or attended there
  };
  struct parts {
    kvsift::score::freekv_pages scorer;
    kvsift::select::freekv_pages selector;
    kvsift::trigger::query_cosine trigger;
    kvsift::budget::uniform budgeter;  // B for every KV head (the schedule asks it)
  };
  static parts make_parts(const params& p) {
    return {scorer_of(p), selector_of(p), trigger({.tau = p.tau}), budgeter{{.tokens = p.budget}}};
  }

  // Validates params against a model shape; throws kvsift::error naming the parameter.
  static void can_implement(const model_shape& shape, const params& p) {
    shape.validate(name);
    require(p.page_size > 0, name, "page_size", p.page_size, "> 0");
    scorer_of(p).validate(name);
    const selector sel = selector_of(p);
    sel.validate_budget(name, "budget", p.budget);
    require(sel.selectable(p.budget) >= 0, name, "budget", p.budget,
            ">= sink + window (" + std::to_string(p.sink + p.window) + " tokens)");
    trigger({.tau = p.tau}).validate(name);
    require(p.dense_layers >= 0, name, "dense_layers", p.dense_layers, ">= 0");
  }

  // FreeKV's own accessors on the method.
  template <class M>
  struct interface {
    // Per segment of the last plan: 1 when that KV head was corrected (selected with q_t from
    // step 2 on), 0 otherwise (step 1, speculative reuse, dense layers).
    [[nodiscard]] const std::vector<std::uint8_t>& corrections() const {
      return static_cast<const M&>(*this).schedule_state().corrections();
    }
    // Corrections made so far (KV-head steps that selected with q_t from step 2 on).
    [[nodiscard]] std::int64_t corrections_made() const {
      return static_cast<const M&>(*this).schedule_state().corrections_made();
    }
  };

 private:
  static scorer scorer_of(const params& p) {
    return scorer{{.page_size = p.page_size, .sink = p.sink, .window = p.window, .merge = p.merge}};
  }
  static selector selector_of(const params& p) {
    return selector{{.page_size = p.page_size, .sink = p.sink, .window = p.window}};
  }
};

// The method over the default two-tier store in E's memory (store::tiered<T> on exec::host,
// thrust::tiered_store<T, E> on a device exec with <kvsift/device/all.hpp>): one spelling for
// every exec.
template <Element T, Exec E = exec::host>
using freekv = method<default_tiered_store_t<T, E>, freekv_recipe, E>;

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
