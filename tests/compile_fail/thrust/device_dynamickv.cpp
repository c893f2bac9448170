// SPDX-License-Identifier: Apache-2.0
// DynamicKV's progressive budgeter (it revises earlier layers from a round's host scores) has no
// path in the device evict state yet: method<> over a thrust::dense_store on exec::sim says which
// part is missing.
// expect-error: a progressive budgeter .DynamicKV. runs on exec::host only
#include <kvsift/device/evict.hpp>
#include <kvsift/method/dynamickv.hpp>

using store = kvsift::thrust::dense_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store,
                           kvsift::recipe<kvsift::score::window_attention, kvsift::select::topk,
                                          kvsift::budget::dynamic_layer, kvsift::trigger::never>,
                           kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16);
  bad m(st);
  (void)m;
}
