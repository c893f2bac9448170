// SPDX-License-Identifier: Apache-2.0
// Concept tests: every model in the headers models its concept (opt-in by name, then structure),
// and look-alikes without the tag, or with the wrong role or granularity, do not.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// Has every member a Scorer needs, but never opted in.
struct untagged_scorer {
  using granularity = kvsift::token_level;
  static constexpr bool needs_queries = false;
  struct params {};
  params p{};
  [[nodiscard]] int query_window() const { return 0; }
};
// Same, opted in: now it is a Scorer.
struct tagged_scorer : untagged_scorer {
  using kvsift_role = kvsift::scorer_tag;
};
// Opted in under the wrong role.
struct mislabelled_scorer : untagged_scorer {
  using kvsift_role = kvsift::selector_tag;
};
// Opted in, but its granularity is neither token_level nor page_level.
struct odd_granularity_scorer {
  using kvsift_role = kvsift::scorer_tag;
  using granularity = int;
  struct params {};
};
// A selector-shaped type without the tag.
struct untagged_selector {
  using granularity = kvsift::token_level;
  struct params {};
  params p{};
  void select(const kvsift::score_sets&, std::span<const int>, kvsift::index_sets&) const {}
};
struct tagged_selector : untagged_selector {
  using kvsift_role = kvsift::selector_tag;
};
// A store look-alike without the tag.
struct untagged_store {
  using element_type = float;
  using memory_space = kvsift::host_space;
  kvsift::model_shape shape() const { return {}; }
  int length(std::int64_t) const { return 0; }
  std::int32_t position(std::int64_t, int) const { return 0; }
  const float* key(std::int64_t, int) const { return nullptr; }
  const float* value(std::int64_t, int) const { return nullptr; }
  std::int64_t resident_bytes() const { return 0; }
  void retain(int, int, const kvsift::index_sets&) {}
};
struct tagged_store : untagged_store {
  using kvsift_role = kvsift::store_tag;
};
struct tagged_store_bad_element : tagged_store {
  using element_type = double;
};
struct untagged_budgeter {
  struct params {};
  void budgets(const kvsift::budget_context&, std::vector<int>&) const {}
};
struct untagged_trigger {
  struct params {};
  bool fires(const kvsift::trigger_context&) const { return true; }
};
struct untagged_transfer {
  std::int64_t bytes_moved() const { return 0; }
  void wait() {}
};

// Tagged, but missing what kvsift::method uses: needs_queries; query_window() when it needs
// queries; construction from params; a page selector's page_size.
struct scorer_without_needs_queries {
  using kvsift_role = kvsift::scorer_tag;
  using granularity = kvsift::token_level;
  struct params {};
  params p{};
};
struct query_scorer_without_window {
  using kvsift_role = kvsift::scorer_tag;
  using granularity = kvsift::token_level;
  static constexpr bool needs_queries = true;
  struct params {};
  params p{};
};
struct scorer_without_params_constructor {
  using kvsift_role = kvsift::scorer_tag;
  using granularity = kvsift::token_level;
  [[maybe_unused]] static constexpr bool needs_queries = false;
  struct params {};
  explicit scorer_without_params_constructor(int) {}
};
struct page_selector_without_page_size {
  using kvsift_role = kvsift::selector_tag;
  using granularity = kvsift::page_level;
  struct params {};
  params p{};
  void select(const kvsift::score_sets&, std::span<const int>, kvsift::index_sets&) const {}
};
// A scorer whose score() takes the wrong input is a Scorer but not a ScorerFor a store.
struct scorer_with_wrong_score : tagged_scorer {
  void score(int, kvsift::score_sets&) const {}
};

}  // namespace

TEST_CASE("concepts require what kvsift::method uses", "[concepts]") {
  using namespace kvsift;
  using dense = store::dense<float>;
  STATIC_REQUIRE_FALSE(Scorer<scorer_without_needs_queries>);
  STATIC_REQUIRE_FALSE(Scorer<query_scorer_without_window>);
  STATIC_REQUIRE_FALSE(Scorer<scorer_without_params_constructor>);
  STATIC_REQUIRE_FALSE(Selector<page_selector_without_page_size>);
  STATIC_REQUIRE(Scorer<scorer_with_wrong_score>);
  STATIC_REQUIRE_FALSE(ScorerFor<scorer_with_wrong_score, dense>);
  STATIC_REQUIRE(ScorerFor<score::window_attention, dense>);
  STATIC_REQUIRE(ScorerFor<score::page_minmax, store::paged<half>>);
  // hooks: declared explicitly, and each declared hook has its signature
  STATIC_REQUIRE(hooks_of<score::cumulative_attention>.observe);
  STATIC_REQUIRE(hooks_of<score::cumulative_attention>.compact);
  STATIC_REQUIRE(hooks_of<score::cumulative_attention>.reset);
  STATIC_REQUIRE(StatefulScorer<score::cumulative_attention, dense>);
  STATIC_REQUIRE(ResettableScorer<score::cumulative_attention, dense>);
  STATIC_REQUIRE(hooks_of<score::page_minmax>.reset);
  STATIC_REQUIRE(ResettableScorer<score::page_minmax, dense>);
  STATIC_REQUIRE_FALSE(hooks_of<score::window_attention>.observe);
  STATIC_REQUIRE_FALSE(StatefulScorer<score::window_attention, dense>);
  STATIC_REQUIRE(hooks_of<select::partition_topk>.freeze);
  STATIC_REQUIRE(FreezingSelector<select::partition_topk>);
  STATIC_REQUIRE(hooks_of<select::topk>.check);
  STATIC_REQUIRE(CheckingSelector<select::topk>);
  STATIC_REQUIRE_FALSE(CheckingSelector<select::page_topk>);
  STATIC_REQUIRE(hooks_of<budget::dynamic_layer>.revise);
  STATIC_REQUIRE(ProgressiveBudgeter<budget::dynamic_layer>);
  STATIC_REQUIRE(ResettableBudgeter<budget::dynamic_layer>);
  STATIC_REQUIRE_FALSE(ProgressiveBudgeter<budget::uniform>);
  STATIC_REQUIRE_FALSE(hooks_of<budget::uniform>.revise);
}

TEST_CASE("every model in the headers models its concept", "[concepts]") {
  using namespace kvsift;
  STATIC_REQUIRE(KvStore<store::dense<float>>);
  STATIC_REQUIRE(KvStore<store::dense<half>>);
  STATIC_REQUIRE(KvStore<store::dense<bfloat16>>);
  STATIC_REQUIRE(KvStore<store::dense<float, pinned_host_space>>);
  STATIC_REQUIRE(KvStore<store::paged<float>>);
  STATIC_REQUIRE(KvStore<store::paged<half>>);
  STATIC_REQUIRE(KvStore<store::paged<bfloat16>>);
  STATIC_REQUIRE(Scorer<score::recency>);
  STATIC_REQUIRE(Scorer<score::key_norm>);
  STATIC_REQUIRE(Scorer<score::window_attention>);
  STATIC_REQUIRE(Scorer<score::cumulative_attention>);
  STATIC_REQUIRE(Scorer<score::last_query_attention>);
  STATIC_REQUIRE(Scorer<score::page_minmax>);
  STATIC_REQUIRE(Selector<select::topk>);
  STATIC_REQUIRE(Selector<select::page_topk>);
  STATIC_REQUIRE(Budgeter<budget::uniform>);
  STATIC_REQUIRE(Budgeter<budget::pyramid>);
  STATIC_REQUIRE(Budgeter<budget::memory_fraction>);
  STATIC_REQUIRE(Transfer<transfer::none>);
  STATIC_REQUIRE(Transfer<transfer::sync_copy>);
  STATIC_REQUIRE(Trigger<trigger::never>);
  STATIC_REQUIRE(Trigger<trigger::every_step>);
  STATIC_REQUIRE(Trigger<trigger::stride>);
  STATIC_REQUIRE(SameGranularity<score::window_attention, select::topk>);
  STATIC_REQUIRE(SameGranularity<score::page_minmax, select::page_topk>);
  STATIC_REQUIRE(Element<float> && Element<half> && Element<bfloat16>);
  STATIC_REQUIRE(HostAccessible<host_space> && HostAccessible<pinned_host_space>);
  // the baselines are compositions of those models, with their parts re-exported
  using sk = snapkv<store::dense<half>>;
  STATIC_REQUIRE(std::is_same_v<sk::scorer, score::window_attention>);
  STATIC_REQUIRE(std::is_same_v<sk::selector, select::topk>);
  STATIC_REQUIRE(std::is_same_v<sk::budgeter, budget::uniform>);
  STATIC_REQUIRE(std::is_same_v<sk::element_type, half>);
  STATIC_REQUIRE(sk::caps.changes_physical_length);
  STATIC_REQUIRE(sk::caps.needs_queries);
  using qu = quest<store::paged<float>>;
  STATIC_REQUIRE(qu::page_level_selection);
  STATIC_REQUIRE_FALSE(qu::caps.changes_physical_length);
  STATIC_REQUIRE_FALSE(streaming_llm<store::dense<float>>::caps.needs_queries);
  STATIC_REQUIRE(std::is_same_v<h2o<store::dense<float>>::scorer, score::cumulative_attention>);
  STATIC_REQUIRE(std::is_same_v<pyramidkv<store::dense<float>>::budgeter, budget::pyramid>);
  STATIC_REQUIRE(std::is_same_v<full_kv<store::dense<float>>::trigger, trigger::never>);
}

TEST_CASE("look-alikes without the opt-in tag, or with the wrong role, do not model", "[concepts]") {
  using namespace kvsift;
  // the positive control: the same members with the tag model the concept
  STATIC_REQUIRE(Scorer<tagged_scorer>);
  STATIC_REQUIRE(Selector<tagged_selector>);
  STATIC_REQUIRE(KvStore<tagged_store>);
  // no tag: no model, whatever the members
  STATIC_REQUIRE_FALSE(Scorer<untagged_scorer>);
  STATIC_REQUIRE_FALSE(Selector<untagged_selector>);
  STATIC_REQUIRE_FALSE(KvStore<untagged_store>);
  STATIC_REQUIRE_FALSE(Budgeter<untagged_budgeter>);
  STATIC_REQUIRE_FALSE(Trigger<untagged_trigger>);
  STATIC_REQUIRE_FALSE(Transfer<untagged_transfer>);
  // wrong role or malformed parts
  STATIC_REQUIRE_FALSE(Scorer<mislabelled_scorer>);
  STATIC_REQUIRE_FALSE(Scorer<odd_granularity_scorer>);
  STATIC_REQUIRE_FALSE(KvStore<tagged_store_bad_element>);
  // roles do not cross
  STATIC_REQUIRE_FALSE(Selector<score::window_attention>);
  STATIC_REQUIRE_FALSE(Selector<score::page_minmax>);
  STATIC_REQUIRE_FALSE(Scorer<select::topk>);
  STATIC_REQUIRE_FALSE(Budgeter<select::topk>);
  STATIC_REQUIRE_FALSE(Trigger<budget::uniform>);
  STATIC_REQUIRE_FALSE(KvStore<score::recency>);
  STATIC_REQUIRE_FALSE(Transfer<trigger::never>);
  // granularity must agree
  STATIC_REQUIRE_FALSE(SameGranularity<score::page_minmax, select::topk>);
  STATIC_REQUIRE_FALSE(SameGranularity<score::window_attention, select::page_topk>);
  STATIC_REQUIRE_FALSE(SameGranularity<select::topk, select::topk>);
  // element types and memory spaces
  STATIC_REQUIRE_FALSE(Element<double>);
  STATIC_REQUIRE_FALSE(Element<std::uint16_t>);
  STATIC_REQUIRE_FALSE(HostAccessible<device_space>);
  STATIC_REQUIRE_FALSE(MemorySpace<int>);
}

namespace {
// A look-alike of the two-tier store's transfer without cancel(): a schedule could not drop a
// request's recall on reset, so it does not model RecallTransfer.
struct recall_without_cancel {
  using kvsift_role = kvsift::transfer_tag;
  using ticket = std::uint64_t;
  using request_type = kvsift::transfer::recall_request;
  [[nodiscard]] std::int64_t bytes_moved() const { return 0; }
  void wait() {}
  ticket submit(const kvsift::store::tiered<float>&, std::vector<request_type>) { return 1; }
  [[nodiscard]] bool ready(ticket) const { return true; }
  const kvsift::store::landing<float>& wait(ticket) { return landing_; }
  void release(ticket) {}
  [[nodiscard]] kvsift::transfer::transfer_stats stats() const { return {}; }
  kvsift::store::landing<float> landing_;
};
}  // namespace

TEST_CASE("the two-tier store names its Transfer slot, which the two-tier methods hold", "[concepts]") {
  using namespace kvsift;
  using tiered_f = store::tiered<float>;
  STATIC_REQUIRE(RecallTransfer<tiered_f::transfer_type, tiered_f>);
  STATIC_REQUIRE(RecallTransfer<store::tiered<bfloat16>::transfer_type, store::tiered<bfloat16>>);
  STATIC_REQUIRE_FALSE(RecallTransfer<transfer::sync_copy, tiered_f>);  // copies, recalls nothing
  STATIC_REQUIRE(Transfer<recall_without_cancel>);
  STATIC_REQUIRE_FALSE(RecallTransfer<recall_without_cancel, tiered_f>);
  // every two-tier method holds the store's transfer, whatever its schedule
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(std::declval<synckv<float>&>().transfer_state())>,
                                tiered_f::transfer_type>);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(std::declval<heterocache<float>&>().transfer_state())>,
                                tiered_f::transfer_type>);
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(std::declval<freekv<float>&>().transfer_state())>,
                                tiered_f::transfer_type>);
}
