// SPDX-License-Identifier: Apache-2.0
// SyncKV's schedule (deferred_recall, two tiers) has no state over device memory yet: method<>
// over a thrust::dense_store on exec::sim says so, naming what does run there.
// expect-error: this schedule has no device state yet
#include <kvsift/device/evict.hpp>
#include <kvsift/device/sparse_read.hpp>
#include <kvsift/method/synckv.hpp>

using store = kvsift::thrust::dense_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store, kvsift::synckv_recipe, kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16);
  bad m(st);
  (void)m;
}
