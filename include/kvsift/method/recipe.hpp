// SPDX-License-Identifier: Apache-2.0
#pragma once

// kvsift::recipe — what a method is made of, as a struct of parts (CUTLASS's GemmUniversal
// takes a mainloop, an epilogue and a scheduler the same way):
//
//   recipe<Scorer, Selector, Budgeter, Trigger, Schedule = schedule::evict>
//
// A Schedule owns the lifecycle points (method/schedule/):
//   schedule::evict            a round (score -> budget -> select -> retain) when the trigger
//                              fires: at the prompt's end, between chunks, after decode steps
//   schedule::sparse_read      full KV stays resident; each decode step selects what to read
//   schedule::deferred_recall  two tiers: decide after step t's attention, recall in the
//                              background, install at step t+1 (SyncKV, HeteroCache)
//   schedule::speculative      two tiers: select one token ahead, recall in the background,
//                              correct heads whose query moved (FreeKV)
// The two-tier schedules add parts of their own (head roles, a candidate domain, data triggers);
// their recipes are structs with the same members (method/synckv.hpp, heterocache.hpp,
// freekv.hpp). Every recipe provides:
//
//   scorer, selector, budgeter, trigger, schedule     the parts' types
//   name                                              "method", "synckv", ...: error messages
//   params                                            the user's parameters (paper defaults)
//   parts, make_parts(params)                         the parts' objects, built from params
//   can_implement(shape, params)                      validation without a store
//   interface<M> (optional)                           a method's own accessors (CRTP mixin)

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/method/composition.hpp>

#include <string_view>

namespace kvsift {

namespace schedule {
// Lifecycle tags; each defines `template <class Method> class state` in method/schedule/.
struct evict;
struct sparse_read;
struct deferred_recall;
struct speculative;
}  // namespace schedule

template <Scorer Scorer_, Selector Selector_, Budgeter Budgeter_, Trigger Trigger_,
          class Schedule_ = schedule::evict>
struct recipe {
  static_assert(std::is_same_v<typename Scorer_::granularity, typename Selector_::granularity>,
                "kvsift::recipe: the Scorer and the Selector must work at the same granularity "
                "(token_level scores need a token selector, page_level scores a page selector)");
  static_assert(std::is_same_v<typename Scorer_::granularity, token_level> ||
                    std::is_same_v<Schedule_, schedule::sparse_read>,
                "kvsift::recipe: page-level selection reads a sparse subset per step: compose it "
                "with schedule::sparse_read");

  using scorer = Scorer_;
  using selector = Selector_;
  using budgeter = Budgeter_;
  using trigger = Trigger_;
  using schedule = Schedule_;
  static constexpr std::string_view name = "method";

  // One aggregate per component, paper defaults.
  struct params {
    typename Scorer_::params scorer{};
    typename Selector_::params selector{};
    typename Budgeter_::params budgeter{};
    typename Trigger_::params trigger{};
    int dense_layers = 0;  // layers [0, dense_layers) are never compressed nor sparsified
  };
  struct parts {
    Scorer_ scorer;
    Selector_ selector;
    Budgeter_ budgeter;
    Trigger_ trigger;
  };
  static parts make_parts(const params& p) {
    return {Scorer_{p.scorer}, Selector_{p.selector}, Budgeter_{p.budgeter}, Trigger_{p.trigger}};
  }

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
};

namespace detail {
struct no_interface {};
template <class R, class M>
struct interface_of {
  using type = no_interface;
};
template <class R, class M>
  requires requires { typename R::template interface<M>; }
struct interface_of<R, M> {
  using type = typename R::template interface<M>;
};
}  // namespace detail

}  // namespace kvsift
