// SPDX-License-Identifier: Apache-2.0
// A store whose memory is host memory cannot serve a composition on the simulated device: its
// lifecycle would read the store where the exec's memory is not host-visible. The method says
// the store's memory must be the Exec's (compiled with the CCCL headers and Thrust's CPP system).
// expect-error: the Store.s memory must be the Exec.s
#include <kvsift/kvsift.hpp>
#include <kvsift/thrust/exec.hpp>

static_assert(kvsift::Exec<kvsift::exec::sim_cpp>);
static_assert(kvsift::KvStore<kvsift::store::dense<float>>);

using bad = kvsift::method<kvsift::store::dense<float>,
                           kvsift::recipe<kvsift::score::window_attention, kvsift::select::topk,
                                          kvsift::budget::uniform, kvsift::trigger::never>,
                           kvsift::exec::sim_cpp>;

int main() {
  bad::params p{};
  (void)p;
}
