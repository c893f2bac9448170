// SPDX-License-Identifier: Apache-2.0
// A tagged scorer whose score() does not take the store's score_input fails with a concept
// error naming ScorerFor, not deep inside the lifecycle.
// expect-error: the Scorer must provide score
#include <kvsift/kvsift.hpp>

struct no_score {
  using kvsift_role = kvsift::scorer_tag;
  using granularity = kvsift::token_level;
  static constexpr bool needs_queries = false;
  struct params {};
  params p{};
  void score(int, kvsift::score_sets&) const {}
};

using bad = kvsift::method<kvsift::store::dense<float>,
    kvsift::recipe<no_score, kvsift::select::topk, kvsift::budget::uniform, kvsift::trigger::never>>;

int main() {
  bad::params p{};
  (void)p;
}
