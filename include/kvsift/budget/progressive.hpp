// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a progressive budgeter (DynamicKV) sees after a compression round, and the orders it
// gives back: kvsift::method calls `revise(round, revisions)` after every round of a budgeter
// that declares `kvsift_hooks{.revise = true}`, then retains what each revision keeps. These
// types live with the budgeters, so budget/ never includes method/.

#include <kvsift/concepts.hpp>

#include <span>
#include <vector>

namespace kvsift {

// A finished compression round of one layer, as a progressive budgeter sees it.
struct budget_round {
  int layer = 0;
  int layers = 1;
  int kv_heads = 1;
  lifecycle_event event = lifecycle_event::prefill_end;
  std::span<const int> requests;       // [R] the requests compressed in this round
  const score_sets* scores = nullptr;  // [R * kv_heads] the round's scores, one per slot before retain
  const index_sets* kept = nullptr;    // [R * kv_heads] the slots the round kept, ascending
};

// A progressive budgeter's order to shrink a layer it has already seen: (request, layer) keeps
// exactly the resident slots `kept` (one ascending segment per KV head), `budget` tokens each.
struct budget_revision {
  int request = 0;
  int layer = 0;
  int budget = 0;   // tokens kept per KV head after the revision (protected ones included)
  index_sets kept;  // [kv_heads] resident slots to keep
};

// A budgeter that revises earlier layers after each round (DynamicKV's progressive update).
template <class B>
concept ProgressiveBudgeter =
    Budgeter<B> && requires(B& b, const budget_round& round, std::vector<budget_revision>& out) {
      b.revise(round, out);
    };

namespace detail {
// The former name (method.hpp found the hook by signature); kept for existing code.
template <class B>
concept progressive_budgeter = ProgressiveBudgeter<B>;
}  // namespace detail

}  // namespace kvsift
