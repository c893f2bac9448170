// SPDX-License-Identifier: Apache-2.0
// schedule::deferred_recall's device state (device/deferred_recall.hpp) runs SyncKV's
// roles::clusters only: HeteroCache (roles::stars) over a thrust::tiered_store says so.
// expect-error: HeteroCache's roles::stars has no device state yet
#include <kvsift/device/deferred_recall.hpp>
#include <kvsift/method/heterocache.hpp>

using store = kvsift::thrust::tiered_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store, kvsift::heterocache_recipe, kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16, 16);
  bad m(st);
  (void)m;
}
