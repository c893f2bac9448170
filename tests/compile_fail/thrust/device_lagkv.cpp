// SPDX-License-Identifier: Apache-2.0
// LagKV's selector (partition_topk) has no Thrust round in the device evict state yet:
// method<> over a thrust::dense_store on exec::sim says which part is missing.
// expect-error: partition_topk runs on exec::host only
#include <kvsift/device/evict.hpp>
#include <kvsift/method/lagkv.hpp>

using store = kvsift::thrust::dense_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store,
                           kvsift::recipe<kvsift::score::lag_relative, kvsift::select::partition_topk,
                                          kvsift::budget::uniform, kvsift::trigger::length>,
                           kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16);
  bad m(st);
  (void)m;
}
