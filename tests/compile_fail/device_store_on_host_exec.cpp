// SPDX-License-Identifier: Apache-2.0
// A store whose memory is device memory, composed to run on exec::host (the CPU lifecycle reads
// the store directly), must not compile, and the error must say why.
// expect-error: static assertion failed: kvsift::method: the Store's memory must be the Exec's
#include <kvsift/kvsift.hpp>

struct device_store : kvsift::store::dense<float> {
  using kvsift::store::dense<float>::dense;
  using memory_space = kvsift::device_space;
};

using bad = kvsift::snapkv<device_store>;

int main() {
  device_store store({.layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 4}, 1, 8);
  bad m(store, kvsift::snapkv_params<device_store>(4, 2, 1));
  return 0;
}
