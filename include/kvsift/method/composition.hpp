// SPDX-License-Identifier: Apache-2.0
#pragma once

// Compile-time and parameter checks of a composition method<Store, Scorer, Selector, Budgeter,
// Transfer, Trigger> (method/method.hpp), apart from the lifecycle:
//  - the parts model what the lifecycle uses (ScorerFor<Scorer, Store>, concepts.hpp);
//  - hooks are explicit: each hook a part declares in `kvsift_hooks` must have its signature
//    (a misspelt observe() is an error naming it), and a member matching a hook must be
//    declared (never found by signature alone);
//  - parameters two parts share (sink, window, lag, page_size) agree (can_implement).

#include <kvsift/budget/progressive.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/score/context.hpp>

#include <string>
#include <string_view>

namespace kvsift::detail {

template <class Store, class Sc, class Se, class B>
struct composition_checks {
  static_assert(ScorerFor<Sc, Store>,
                "kvsift::method: the Scorer must provide score(const score_input<Store>&, "
                "score_sets&)");

  static constexpr hooks scorer_hooks = hooks_of<Sc>;
  static constexpr hooks selector_hooks = hooks_of<Se>;
  static constexpr hooks budgeter_hooks = hooks_of<B>;
  static_assert(scorer_hooks.observe == scorer_hooks.compact,
                "kvsift::method: a Scorer declares the observe and compact hooks together (its "
                "per-slot state must follow the store's compaction)");
  static_assert(!scorer_hooks.observe || StatefulScorer<Sc, Store>,
                "kvsift::method: the Scorer declares kvsift_hooks.observe/compact but lacks "
                "observe(store, request, layer, q, plan, first_segment) or "
                "compact(store, request, layer, kept)");
  static_assert(scorer_hooks.observe || !StatefulScorer<Sc, Store>,
                "kvsift::method: the Scorer has observe()/compact() but does not declare them: "
                "add `static constexpr kvsift::hooks kvsift_hooks{.observe = true, .compact = true}`");
  static_assert(!scorer_hooks.reset || ResettableScorer<Sc, Store>,
                "kvsift::method: the Scorer declares kvsift_hooks.reset but lacks "
                "reset(store, request)");
  static_assert(scorer_hooks.reset || !ResettableScorer<Sc, Store>,
                "kvsift::method: the Scorer has reset(store, request) but does not declare it in "
                "kvsift_hooks (.reset = true)");
  static_assert(!selector_hooks.freeze || FreezingSelector<Se>,
                "kvsift::method: the Selector declares kvsift_hooks.freeze but lacks "
                "int select(scores, budgets, kept, frozen)");
  static_assert(selector_hooks.freeze || !FreezingSelector<Se>,
                "kvsift::method: the Selector has select(scores, budgets, kept, frozen) but does "
                "not declare it in kvsift_hooks (.freeze = true)");
  static_assert(!selector_hooks.check || CheckingSelector<Se>,
                "kvsift::method: the Selector declares kvsift_hooks.check but lacks "
                "check(scores, budgets)");
  static_assert(selector_hooks.check || !CheckingSelector<Se>,
                "kvsift::method: the Selector has check(scores, budgets) but does not declare it "
                "in kvsift_hooks (.check = true)");
  static_assert(!budgeter_hooks.revise || ProgressiveBudgeter<B>,
                "kvsift::method: the Budgeter declares kvsift_hooks.revise but lacks "
                "revise(const budget_round&, std::vector<budget_revision>&)");
  static_assert(budgeter_hooks.revise || !ProgressiveBudgeter<B>,
                "kvsift::method: the Budgeter has revise(round, revisions) but does not declare "
                "it in kvsift_hooks (.revise = true)");
  static_assert(!budgeter_hooks.reset || ResettableBudgeter<B>,
                "kvsift::method: the Budgeter declares kvsift_hooks.reset but lacks reset(request)");
  static_assert(budgeter_hooks.reset || !ResettableBudgeter<B>,
                "kvsift::method: the Budgeter has reset(request) but does not declare it in "
                "kvsift_hooks (.reset = true)");
  static constexpr bool ok = true;
};
template <class Store, class Sc, class Se, class B>
inline constexpr bool composition_checked = composition_checks<Store, Sc, Se, B>::ok;

// Each of sink, window, lag and page_size that both parts' params name must be equal: a
// mismatch would, say, score pages of one size and select pages of another. Throws
// kvsift::error naming `<bn>.<param>`.
template <class A, class B>
void same_shared_params(const A& a, const B& b, std::string_view an, std::string_view bn) {
  const auto check = [&](std::string_view name, auto va, auto vb) {
    require(va == vb, "method", [&] { return std::string(bn) + "." + std::string(name); }, vb,
            [&] {
              return "the " + std::string(an) + "'s " + std::string(name) + " (" +
                     std::to_string(va) + "): the parts share it";
            });
  };
  if constexpr (requires { a.sink; b.sink; }) check("sink", a.sink, b.sink);
  if constexpr (requires { a.window; b.window; }) check("window", a.window, b.window);
  if constexpr (requires { a.lag; b.lag; }) check("lag", a.lag, b.lag);
  if constexpr (requires { a.page_size; b.page_size; }) check("page_size", a.page_size, b.page_size);
}

}  // namespace kvsift::detail
