// SPDX-License-Identifier: Apache-2.0
// A type with every member of a scorer but no `using kvsift_role = kvsift::scorer_tag;` is not a
// Scorer, and composing it names the unsatisfied concept.
// expect-error: satisfaction of [^A-Za-z]*Scorer<Scorer_>[^A-Za-z]* \[with Scorer_ = almost_a_scorer\]
#include <kvsift/kvsift.hpp>

struct almost_a_scorer {  // no kvsift_role
  using granularity = kvsift::token_level;
  static constexpr bool needs_queries = false;
  struct params {};
  params p{};
  int query_window() const { return 0; }
  template <class Store>
  void score(const kvsift::score_input<Store>&, kvsift::score_sets&) const {}
};

using bad = kvsift::method<kvsift::store::dense<float>,
    kvsift::recipe<almost_a_scorer, kvsift::select::topk, kvsift::budget::uniform, kvsift::trigger::never>>;

int main() {
  bad::params p{};
  (void)p;
}
