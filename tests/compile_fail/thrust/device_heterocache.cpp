// SPDX-License-Identifier: Apache-2.0
// HeteroCache's schedule (deferred_recall) has two tiers: over a one-tier device store
// (thrust::dense_store) method<> says it needs a two-tier one (thrust::tiered_store on a device
// exec: device/deferred_recall.hpp, kvsift::heterocache<T, E>).
// expect-error: a two-tier schedule \(deferred_recall, speculative\) needs a two-tier store
#include <kvsift/device/all.hpp>
#include <kvsift/method/heterocache.hpp>

using store = kvsift::thrust::dense_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store, kvsift::heterocache_recipe, kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16);
  bad m(st);
  (void)m;
}
