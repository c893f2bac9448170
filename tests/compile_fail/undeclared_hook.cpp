// SPDX-License-Identifier: Apache-2.0
// A budgeter with a revise() member that does not declare it in kvsift_hooks is a compile error:
// hooks are explicit, never found by signature alone.
// expect-error: has revise\(round, revisions\) but does not declare
#include <kvsift/kvsift.hpp>

struct quiet_budgeter : kvsift::budget::uniform {
  void revise(const kvsift::budget_round&, std::vector<kvsift::budget_revision>&) {}
};

using bad = kvsift::method<kvsift::store::dense<float>,
    kvsift::recipe<kvsift::score::recency, kvsift::select::topk, quiet_budgeter, kvsift::trigger::never>>;

int main() {
  bad::params p{};
  (void)p;
}
