// SPDX-License-Identifier: Apache-2.0
// A page-level scorer composed with a token selector must not compile, and the error must say
// why: the Scorer and the Selector work at different granularities.
// expect-error: static assertion failed: kvsift::recipe: the Scorer and the Selector must work at the same granularity
#include <kvsift/kvsift.hpp>

using bad = kvsift::method<kvsift::store::dense<float>,
    kvsift::recipe<kvsift::score::page_minmax, kvsift::select::topk, kvsift::budget::uniform, kvsift::trigger::every_step>>;

int main() {
  bad::params p{};  // instantiates the composition
  (void)p;
}
