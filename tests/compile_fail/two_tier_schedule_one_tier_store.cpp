// SPDX-License-Identifier: Apache-2.0
// A two-tier schedule (FreeKV's speculative recall) composed over a one-tier store must not
// compile, and the error must name the store it needs.
// expect-error: static assertion failed: kvsift::method: a two-tier schedule \(deferred_recall, speculative\) needs a two-tier store
#include <kvsift/kvsift.hpp>

using bad = kvsift::method<kvsift::store::dense<float>, kvsift::freekv_recipe>;

int main() {
  kvsift::store::dense<float> store({.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 4}, 1, 8);
  bad m(store);
  return 0;
}
