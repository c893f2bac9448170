// SPDX-License-Identifier: Apache-2.0
// Page-level selection composed under the evict schedule (the default) must not compile, and the
// error must name the schedule that reads a sparse subset per step.
// expect-error: static assertion failed: kvsift::recipe: page-level selection reads a sparse subset per step
#include <kvsift/kvsift.hpp>

using bad = kvsift::method<kvsift::store::dense<float>,
                           kvsift::recipe<kvsift::score::page_minmax, kvsift::select::page_topk,
                                          kvsift::budget::uniform, kvsift::trigger::every_step>>;

int main() {
  kvsift::store::dense<float> store({.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 4}, 1, 8);
  bad m(store);
  return 0;
}
