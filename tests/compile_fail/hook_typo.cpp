// SPDX-License-Identifier: Apache-2.0
// A scorer that declares the observe/compact hooks but misspells observe() is a compile error
// naming the hook (before, hooks were found by signature: the typo silently disabled H2O's
// observe).
// expect-error: declares kvsift_hooks.observe/compact but lacks
#include <kvsift/kvsift.hpp>

struct typo_scorer : kvsift::score::cumulative_attention {
  typo_scorer() = default;
  explicit typo_scorer(params prm) : cumulative_attention(prm) {}
  // hides the base's observe: only the misspelt one is left
  template <class Store>
  void observe(const Store&, int, int, const float*, const kvsift::index_sets&, int, int extra) {}
  template <class Store>
  void obsrve(const Store&, int, int, const float*, const kvsift::index_sets&, int = 0) {}
};

using bad = kvsift::method<kvsift::store::dense<float>,
    kvsift::recipe<typo_scorer, kvsift::select::topk, kvsift::budget::uniform, kvsift::trigger::every_step>>;

int main() {
  bad::params p{};
  (void)p;
}
