// SPDX-License-Identifier: Apache-2.0
#pragma once

// The component concepts. Every component opts in by name (`using kvsift_role = ..._tag;`) and
// then must provide the required expressions; a type never models a concept by accident.
// Scorers and selectors also name their granularity (`token_level` or `page_level`), so a page
// selector composed with token scores does not compile.

#include <kvsift/core/element.hpp>
#include <kvsift/core/memory_space.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/core/shape.hpp>

#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvsift {

template <class Store>
struct score_input;  // score/context.hpp: what a scorer is given

// Opt-in role tags.
struct store_tag {};
struct scorer_tag {};
struct selector_tag {};
struct budgeter_tag {};
struct transfer_tag {};
struct trigger_tag {};

// Granularity of scores and selections.
struct token_level {};  // one score / one kept index per token
struct page_level {};   // one score / one kept index per page of tokens

// When a trigger is asked whether a selection should be refreshed.
enum class lifecycle_event {
  prefill_chunk,  // after a chunk of a layer's prompt was appended (not the last one)
  prefill_end,    // after the last chunk of a layer's prompt was appended
  decode_step     // after a decode step's attention (effects show from the next step)
};

// What a trigger sees about one head-sequence when it is asked.
struct trigger_context {
  lifecycle_event event = lifecycle_event::prefill_end;
  int step = 0;         // decode step t (1-based); 0 during prefill
  int length = 0;       // resident tokens of the head-sequence
  int frozen = 0;       // tokens before this slot are final (never rescored), e.g. LagKV's base
  int budget = 0;       // the head-sequence's budget in tokens
};

// What a budgeter is asked: the budget of every head-sequence of one layer of a ragged batch.
struct budget_context {
  int layer = 0;                     // the layer being compressed
  int layers = 1;                    // layers of the model
  int kv_heads = 1;                  // segments per request
  std::span<const int> lengths;      // [requests * kv_heads] resident tokens per head-sequence
};

// Optional lifecycle hooks. A component opts in to each hook it implements by name,
//   static constexpr kvsift::hooks kvsift_hooks{.observe = true, .compact = true, .reset = true};
// and kvsift::method then requires the hook's signature (StatefulScorer, ProgressiveBudgeter,
// ...): a misspelt or mistyped hook is a concept error, never a silently skipped call. A
// component with a hook's member but no declaration is an error too (method says which).
struct hooks {
  bool observe = false;  // scorer: observe(store, request, layer, q, plan, first_segment) after attention
  bool compact = false;  // scorer: compact(store, request, layer, kept) after the store's retain
  bool reset = false;    // scorer: reset(store, request); budgeter: reset(request) — per-request state
  bool revise = false;   // budgeter: revise(round, revisions) after each round (DynamicKV)
  bool freeze = false;   // selector: select(scores, budgets, kept, frozen) -> rounds (LagKV)
  bool check = false;    // selector: check(sizes, budgets) throws before anything is appended
};

namespace detail {
template <class T>
constexpr hooks declared_hooks() {
  if constexpr (requires { T::kvsift_hooks; }) {
    static_assert(std::same_as<std::remove_cvref_t<decltype(T::kvsift_hooks)>, hooks>,
                  "kvsift: kvsift_hooks must be a kvsift::hooks constant");
    return T::kvsift_hooks;
  } else {
    return hooks{};
  }
}
}  // namespace detail
// The hooks a component declares (none when it declares no kvsift_hooks).
template <class T>
inline constexpr hooks hooks_of = detail::declared_hooks<T>();

namespace detail {
template <class T, class Tag>
concept opts_in = requires { typename T::kvsift_role; } &&
                  std::same_as<typename T::kvsift_role, Tag>;
template <class T>
concept has_granularity = requires { typename T::granularity; } &&
                          (std::same_as<typename T::granularity, token_level> ||
                           std::same_as<typename T::granularity, page_level>);
}  // namespace detail

// KvStore: where each head-sequence's keys and values live.
// A type S models KvStore if:
//  1. it opts in with `using kvsift_role = kvsift::store_tag;` and names its `element_type`
//     (float, half or bfloat16) and `memory_space`;
//  2. `length(seq)` is the number of resident tokens of head-sequence `seq`
//     (shape().sequence(request, layer, head)), `position(seq, slot)` the original position of
//     its slot-th resident token; positions ascend with slots and survive compaction;
//  3. `key(seq, slot)` / `value(seq, slot)` point at `shape().head_dim` contiguous elements;
//  4. `retain(request, layer, kept)` keeps exactly the listed slots of each KV head (one
//     ascending segment per head) and really releases the rest: `resident_bytes()` drops;
//     it validates everything before it mutates anything;
//  5. `resident_bytes()` counts the key and value bytes resident in the store's space.
template <class S>
concept KvStore =
    detail::opts_in<S, store_tag> && Element<typename S::element_type> &&
    MemorySpace<typename S::memory_space> &&
    requires(S& s, const S& cs, std::int64_t seq, int slot, int request, int layer,
             const index_sets& kept) {
      { cs.shape() } -> std::convertible_to<model_shape>;
      { cs.length(seq) } -> std::convertible_to<int>;
      { cs.position(seq, slot) } -> std::convertible_to<std::int32_t>;
      { cs.key(seq, slot) } -> std::convertible_to<const typename S::element_type*>;
      { cs.value(seq, slot) } -> std::convertible_to<const typename S::element_type*>;
      { cs.resident_bytes() } -> std::convertible_to<std::int64_t>;
      s.retain(request, layer, kept);
    };

// DeviceStore: a one-tier store whose rows live in a device exec's memory
// (thrust::dense_store). The host sees shapes only (lengths, capacities, next positions: a host
// shadow, never read back); rows, positions and per-slot side columns are read and written by
// the exec's algorithms. method<> runs over one with a device exec (device/evict.hpp).
template <class S>
concept DeviceStore =
    Element<typename S::element_type> && MemorySpace<typename S::memory_space> &&
    !HostAccessible<typename S::memory_space> &&
    requires(const S& cs, std::int64_t seq, int request, int layer) {
      { cs.shape() } -> std::convertible_to<model_shape>;
      { cs.requests() } -> std::convertible_to<int>;
      { cs.length(seq) } -> std::convertible_to<int>;
      { cs.capacity(seq) } -> std::convertible_to<int>;
      { cs.next_position(request, layer) } -> std::convertible_to<std::int32_t>;
      { cs.resident_bytes() } -> std::convertible_to<std::int64_t>;
    };

// TieredStore: a KvStore with a second tier (store::tiered): every token lives in a host pool,
// a working set of it is resident; demote/promote/install move tokens between the two.
template <class S>
concept TieredStore = KvStore<S> && requires(S& s, const S& cs, int request, int layer) {
  { cs.host_length(request, layer) } -> std::convertible_to<int>;
  { cs.host_capacity() } -> std::convertible_to<int>;
};

// DeviceTieredStore: a DeviceStore with a host pool beside its device tier
// (thrust::tiered_store): method<> runs a two-tier schedule over one (device/deferred_recall.hpp).
template <class S>
concept DeviceTieredStore = DeviceStore<S> && requires(const S& cs, int request, int layer) {
  { cs.host_length(request, layer) } -> std::convertible_to<int>;
  { cs.host_capacity() } -> std::convertible_to<int>;
};

// Scorer: how important each token (or page) of a head-sequence is.
// A type T models Scorer if:
//  1. it opts in with `using kvsift_role = kvsift::scorer_tag;`, names its `granularity`
//     and has a `params` aggregate whose defaults are the paper's;
//  2. for a store and a batch it writes one score segment per head-sequence of the layer
//     (request-major, then KV head): higher means more important; for token_level one score
//     per resident slot, for page_level one per page;
//  3. it never needs attention probabilities from the engine's kernel: attention-based
//     scorers recompute what they need from the queries they are given and the stored keys;
//  4. the result is deterministic and independent of thread count.
//  5. it states `static constexpr bool needs_queries` and, when true, `query_window()`: how many
//     of the newest queries it reads (-1: every prompt query);
//  6. it is constructible from its params (`T{p}`); `validate(where)` checks them when present.
template <class T>
concept Scorer = detail::opts_in<T, scorer_tag> && detail::has_granularity<T> &&
                 requires { typename T::params; } && std::is_aggregate_v<typename T::params> &&
                 requires(const typename T::params& p) { T{p}; } &&
                 requires {
                   { T::needs_queries } -> std::convertible_to<bool>;
                 } &&
                 (!T::needs_queries || requires(const T& t) {
                   { t.query_window() } -> std::convertible_to<int>;
                 });

// ScorerFor: a Scorer that scores a batch of `Store`'s head-sequences, score(input, out).
template <class T, class Store>
concept ScorerFor = Scorer<T> && requires(T& t, const score_input<Store>& in, score_sets& out) {
  t.score(in, out);
};

// A scorer with per-slot state that follows decode and compaction (H2O's running scores).
template <class T, class Store>
concept StatefulScorer =
    Scorer<T> && requires(T& t, const Store& st, const index_sets& sets, const float* q) {
      t.observe(st, 0, 0, q, sets, 0);
      t.compact(st, 0, 0, sets);
    };

// A component holding per-request state that method::reset(request) must clear.
template <class T, class Store>
concept ResettableScorer = Scorer<T> && requires(T& t, const Store& st) { t.reset(st, 0); };

// Selector: which tokens (or pages) to keep given scores and a budget.
// A type T models Selector if:
//  1. it opts in with `using kvsift_role = kvsift::selector_tag;` and names its `granularity`;
//  2. `select(scores, budgets, kept)` writes per segment the kept indices, ascending, with
//     |kept| = min(budget, n) for token budgets, protected indices (sink, window) always kept;
//  3. ties break deterministically: higher score first, then the lower index;
//  4. a budget smaller than the protected tokens is a kvsift::error, thrown before any output.
//  5. it is constructible from its params; a page_level selector names its `p.page_size`.
template <class T>
concept Selector = detail::opts_in<T, selector_tag> && detail::has_granularity<T> &&
                   requires { typename T::params; } &&
                   requires(const typename T::params& p) { T{p}; } &&
                   requires(const T& sel, const score_sets& scores, std::span<const int> budgets,
                            index_sets& kept) { sel.select(scores, budgets, kept); } &&
                   (!std::same_as<typename T::granularity, page_level> ||
                    requires(const T& sel) {
                      { sel.p.page_size } -> std::convertible_to<int>;
                    });

// A selector that keeps each head-sequence's frozen prefix (LagKV's base): select(scores,
// budgets, kept, frozen) reads the prefix per segment (slots before it are final, never
// rescored), writes the prefix after the selection, and returns the compression rounds the call
// amounts to (stats().refreshes adds them).
template <class T>
concept FreezingSelector = Selector<T> && requires(const T& s, const score_sets& sc,
                                                   std::span<const int> b, index_sets& k,
                                                   std::span<int> f) {
  { s.select(sc, b, k, f) } -> std::convertible_to<int>;
};

// A selector that can check sizes and budgets alone, before the tokens are appended.
template <class T>
concept CheckingSelector = Selector<T> && requires(const T& s, const score_sets& sc,
                                                   std::span<const int> b) { s.check(sc, b); };

// Budgeter: how many tokens each head-sequence may keep.
// A type T models Budgeter if:
//  1. it opts in with `using kvsift_role = kvsift::budgeter_tag;` and has a `params` aggregate;
//  2. `budgets(ctx, out)` writes one budget in tokens per head-sequence of ctx (every kept token
//     counts, protected ones included); a budget >= the length keeps everything.
template <class T>
concept Budgeter = detail::opts_in<T, budgeter_tag> && requires { typename T::params; } &&
                   requires(const typename T::params& p) { T{p}; } &&
                   requires(const T& b, const budget_context& ctx, std::vector<int>& out) {
                     b.budgets(ctx, out);
                   };

// A budgeter holding per-request state (method::reset(request) calls reset(request)).
template <class T>
concept ResettableBudgeter = Budgeter<T> && requires(T& b) { b.reset(0); };

// Transfer: how KV moves between memory spaces.
// A type T models Transfer if:
//  1. it opts in with `using kvsift_role = kvsift::transfer_tag;`;
//  2. `bytes_moved()` counts every byte it has moved; a copy it starts is complete, at the
//     latest, when `wait()` returns (synchronous transfers complete before returning).
template <class T>
concept Transfer = detail::opts_in<T, transfer_tag> && requires(T& t, const T& ct) {
  { ct.bytes_moved() } -> std::convertible_to<std::int64_t>;
  t.wait();
};

// RecallTransfer: a Transfer that recalls rows of a two-tier Store's host pool asynchronously,
// what a two-tier store names as its `transfer_type` and the two-tier schedules submit through.
// A type X models RecallTransfer<X, Store> if, besides Transfer:
//  1. `submit(store, what)` (what: a vector of X::request_type) queues one recall and returns its
//     `X::ticket` at once, or throws kvsift::error with nothing queued;
//  2. `ready(t)` says whether the recall completed; `wait(t)` returns its landing (blocking, and
//     counting a stall, if it has not); `release(t)` frees the landing; `cancel(t)` drops it;
//  3. `stats()` counts recalls issued, completed and cancelled, bytes moved and stalls.
template <class X, class Store>
concept RecallTransfer =
    Transfer<X> && requires(X& x, const X& cx, const Store& st,
                            std::vector<typename X::request_type> what, typename X::ticket t) {
      { x.submit(st, std::move(what)) } -> std::same_as<typename X::ticket>;
      { cx.ready(t) } -> std::convertible_to<bool>;
      x.wait(t);
      x.release(t);
      x.cancel(t);
      cx.stats();
    };

// Trigger: when a selection is refreshed.
// A type T models Trigger if:
//  1. it opts in with `using kvsift_role = kvsift::trigger_tag;` and has a `params` aggregate;
//  2. `fires(ctx)` answers for one head-sequence at one lifecycle event, deterministically.
template <class T>
concept Trigger = detail::opts_in<T, trigger_tag> && requires { typename T::params; } &&
                  requires(const typename T::params& p) { T{p}; } &&
                  requires(const T& t, const trigger_context& ctx) {
                    { t.fires(ctx) } -> std::convertible_to<bool>;
                  };

// A scorer and a selector compose when they work at the same granularity.
template <class Sc, class Se>
concept SameGranularity = Scorer<Sc> && Selector<Se> &&
                          std::same_as<typename Sc::granularity, typename Se::granularity>;

}  // namespace kvsift
