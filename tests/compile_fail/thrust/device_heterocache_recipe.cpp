// SPDX-License-Identifier: Apache-2.0
// The device half of roles::stars (device/roles_stars.hpp) mirrors HeteroCache's
// recipe only: roles::stars under another trigger (here trigger::stride instead of the drift
// check) over a thrust::tiered_store says so.
// expect-error: the device deferred_recall state of roles::stars is HeteroCache's recipe
#include <kvsift/device/all.hpp>
#include <kvsift/method/heterocache.hpp>
#include <kvsift/trigger/basic.hpp>

struct stride_stars : kvsift::heterocache_recipe {
  using trigger = kvsift::trigger::stride;
};
using store = kvsift::thrust::tiered_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store, stride_stars, kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16, 16);
  bad m(st);
  (void)m;
}
