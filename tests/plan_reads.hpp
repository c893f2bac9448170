// SPDX-License-Identifier: Apache-2.0
// What a host plan reads per segment, by position: its resident positions and, under
// far_tier::attend, its far positions, merged and ascending. A device plan over a
// thrust::tiered_store lists both (a far row keeps a far slot), so the two-tier methods' device
// tests compare a device plan's CSR and positions with this.
#pragma once

#include <kvsift/method/lifecycle.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvsift_test {

struct plan_reads {
  std::vector<std::int32_t> offsets{0}, positions;
};

inline plan_reads reads_of(const kvsift::attention_plan& plan) {
  plan_reads r;
  for (int s = 0; s < plan.positions.segments(); ++s) {
    std::vector<std::int32_t> all(plan.positions[s].begin(), plan.positions[s].end());
    if (plan.far.segments() > 0) all.insert(all.end(), plan.far[s].begin(), plan.far[s].end());
    std::sort(all.begin(), all.end());
    r.positions.insert(r.positions.end(), all.begin(), all.end());
    r.offsets.push_back(static_cast<std::int32_t>(r.positions.size()));
  }
  return r;
}

}  // namespace kvsift_test
