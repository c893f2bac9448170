// SPDX-License-Identifier: Apache-2.0
// schedule::speculative's device state (device/speculative.hpp) sizes its page buffers by one
// budget for every KV head: a FreeKV recipe with a per-layer budgeter over a thrust::tiered_store
// says so.
// expect-error: its recipe's budgeter is budget::uniform
#include <kvsift/budget/per_layer.hpp>
#include <kvsift/device/speculative.hpp>
#include <kvsift/method/freekv.hpp>

struct freekv_per_layer : kvsift::freekv_recipe {
  using budgeter = kvsift::budget::per_layer;
};

using store = kvsift::thrust::tiered_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store, freekv_per_layer, kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16, 16);
  bad m(st);
  (void)m;
}
