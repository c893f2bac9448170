// SPDX-License-Identifier: Apache-2.0
// Head roles that follow a leader's scores (SyncKV's clusters under schedule::deferred_recall)
// composed with a scorer that reads no queries must not compile, and the error must say why.
// expect-error: static assertion failed: kvsift::schedule::deferred_recall: head roles place and follow a leader's scores
#include <kvsift/kvsift.hpp>

struct key_norm_clusters : kvsift::synckv_recipe {
  using scorer = kvsift::score::key_norm;  // attention-free: no query to follow
};
using bad = kvsift::method<kvsift::store::tiered<float>, key_norm_clusters>;

int main() {
  kvsift::store::tiered<float>* store = nullptr;
  bad m(*store);
  return 0;
}
