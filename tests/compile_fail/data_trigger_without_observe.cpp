// SPDX-License-Identifier: Apache-2.0
// FreeKV's speculative schedule decides per KV head from the step's query; composed with a
// trigger that reads no data (every_step has no observe()) it must not compile, and the error
// must name the data trigger it needs.
// expect-error: static assertion failed: kvsift::schedule::speculative: its trigger decides per KV head from the step's query
#include <kvsift/kvsift.hpp>

struct blind_freekv : kvsift::freekv_recipe {
  using trigger = kvsift::trigger::every_step;
};
using bad = kvsift::method<kvsift::store::tiered<float>, blind_freekv>;

int main() {
  kvsift::store::tiered<float>* store = nullptr;
  bad m(*store);
  return 0;
}
