// SPDX-License-Identifier: Apache-2.0
// schedule::speculative's device state (device/speculative.hpp) runs FreeKV's recipe only: a
// speculative recipe with another scorer over a thrust::tiered_store says so.
// expect-error: the device speculative state is FreeKV's recipe
#include <kvsift/device/speculative.hpp>
#include <kvsift/method/freekv.hpp>
#include <kvsift/score/page_minmax.hpp>

struct quest_pages_speculative : kvsift::freekv_recipe {
  using scorer = kvsift::score::page_minmax;
};

using store = kvsift::thrust::tiered_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store, quest_pages_speculative, kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16, 16);
  bad m(st);
  (void)m;
}
