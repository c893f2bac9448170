// SPDX-License-Identifier: Apache-2.0
// Quest's schedule (sparse_read) has no state over device memory yet: method<> over a
// thrust::dense_store on exec::sim says so, naming the one that does (device/evict.hpp).
// expect-error: this schedule has no device state yet
#include <kvsift/device/evict.hpp>
#include <kvsift/method/baselines.hpp>

using store = kvsift::thrust::dense_store<float, kvsift::exec::sim_cpp>;
using bad = kvsift::quest<store, kvsift::exec::sim_cpp>;

int main() {
  kvsift::thrust::sim_arena arena;
  kvsift::exec::sim_cpp e{arena};
  store st(e, kvsift::model_shape{}, 1, 16);
  bad m(st, kvsift::quest_params<store, kvsift::exec::sim_cpp>(16));
  (void)m;
}
