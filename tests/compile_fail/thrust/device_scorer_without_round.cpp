// SPDX-License-Identifier: Apache-2.0
// A scorer without a Thrust round (score::key_norm has no thrust::score_round) cannot serve the
// device evict state: method<> over a thrust::dense_store on exec::sim says which part is missing.
// expect-error: the Scorer needs a Thrust round
#include <kvsift/device/evict.hpp>
#include <kvsift/method/baselines.hpp>

using store = kvsift::thrust::dense_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::method<store,
                           kvsift::recipe<kvsift::score::key_norm, kvsift::select::topk,
                                          kvsift::budget::uniform, kvsift::trigger::never>,
                           kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16);
  bad m(st);
  (void)m;
}
