// SPDX-License-Identifier: Apache-2.0
// Components cannot swap roles: a Budgeter in the Selector slot names the Selector concept.
// expect-error: satisfaction of [^A-Za-z]*Selector<Selector_>[^A-Za-z]* \[with Selector_ = kvsift::budget::uniform\]
#include <kvsift/kvsift.hpp>

using bad = kvsift::method<kvsift::store::dense<float>,
    kvsift::recipe<kvsift::score::key_norm, kvsift::budget::uniform, kvsift::budget::uniform, kvsift::trigger::never>>;

int main() {
  bad::params p{};
  (void)p;
}
