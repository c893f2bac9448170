// SPDX-License-Identifier: Apache-2.0
#pragma once

// HeteroCache head roles (HeteroCache; METHODS.md "HeteroCache" / Roles): greedy star clustering
// of one layer's KV heads on their prefill-set similarity, then a stability split of the rest.
//   - edge i - j (i != j) when similarity[i, j] >= tau_sim (default 0.5);
//   - repeatedly, the unassigned head with the most unassigned neighbours (ties: lower index),
//     while that count is > 0, becomes a pivot and those neighbours its satellites;
//   - every remaining head is an anchor if its stability s_h >= tau_stable (default 0.5), else
//     volatile.
// Role codes are SPEC.md §3's: 0 anchor, 1 volatile, 2 pivot, 3 satellite. leader[h] is a
// satellite's pivot, a pivot's own index, -1 for anchors and volatile heads.
// Cost: O(H^3) at most (H is a layer's KV heads).

#include <kvsift/core/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::calibrate {

enum class head_role : std::int32_t { anchor = 0, volatile_head = 1, pivot = 2, satellite = 3 };

// "anchor", "volatile", "pivot", "satellite".
[[nodiscard]] constexpr std::string_view role_name(head_role r) noexcept {
  switch (r) {
    case head_role::anchor:
      return "anchor";
    case head_role::volatile_head:
      return "volatile";
    case head_role::pivot:
      return "pivot";
    case head_role::satellite:
      return "satellite";
  }
  return "?";
}

struct star_cluster_params {
  double tau_sim = 0.5;     // edge when similarity >= tau_sim
  double tau_stable = 0.5;  // anchor when stability >= tau_stable
};

struct star_cluster_result {
  std::vector<head_role> roles;     // [H]
  std::vector<std::int32_t> leader; // [H] pivot of a satellite, itself for a pivot, else -1
};

// Roles of one layer from similarity [heads, heads] (row-major, symmetric) and stability [heads].
// Throws kvsift::error for sizes that disagree, a non-finite value or an asymmetric similarity.
[[nodiscard]] inline star_cluster_result star_cluster(std::span<const float> similarity,
                                                      std::span<const float> stability,
                                                      const star_cluster_params& p = {}) {
  constexpr std::string_view where = "calibrate::star_cluster";
  const std::size_t H = stability.size();
  require(H > 0, where, "stability.size()", H, "> 0");
  require(similarity.size() == H * H, where, "similarity.size()", similarity.size(),
          "stability.size()^2 = " + std::to_string(H * H));
  for (std::size_t i = 0; i < H; ++i) {
    require(std::isfinite(stability[i]), where, "stability[" + std::to_string(i) + "]",
            stability[i], "a finite number");
    for (std::size_t j = 0; j < H; ++j) {
      const float v = similarity[i * H + j];
      require(std::isfinite(v), where,
              "similarity[" + std::to_string(i) + "," + std::to_string(j) + "]", v,
              "a finite number");
      require(v == similarity[j * H + i], where,
              "similarity[" + std::to_string(i) + "," + std::to_string(j) + "]", v,
              "a symmetric matrix (similarity[" + std::to_string(j) + "," + std::to_string(i) +
                  "] = " + std::to_string(similarity[j * H + i]) + ")");
    }
  }
  const auto edge = [&](std::size_t i, std::size_t j) {
    return i != j && static_cast<double>(similarity[i * H + j]) >= p.tau_sim;
  };
  star_cluster_result r;
  r.roles.assign(H, head_role::anchor);
  r.leader.assign(H, -1);
  std::vector<bool> assigned(H, false);
  for (;;) {
    std::size_t best = 0, best_count = 0;
    for (std::size_t i = 0; i < H; ++i) {
      if (assigned[i]) {
        continue;
      }
      std::size_t count = 0;
      for (std::size_t j = 0; j < H; ++j) {
        count += !assigned[j] && edge(i, j) ? 1 : 0;
      }
      if (count > best_count) {
        best_count = count;
        best = i;
      }
    }
    if (best_count == 0) {
      break;
    }
    r.roles[best] = head_role::pivot;
    r.leader[best] = static_cast<std::int32_t>(best);
    assigned[best] = true;
    for (std::size_t j = 0; j < H; ++j) {
      if (!assigned[j] && edge(best, j)) {
        r.roles[j] = head_role::satellite;
        r.leader[j] = static_cast<std::int32_t>(best);
        assigned[j] = true;
      }
    }
  }
  for (std::size_t i = 0; i < H; ++i) {
    if (!assigned[i]) {
      r.roles[i] = static_cast<double>(stability[i]) >= p.tau_stable ? head_role::anchor
                                                                      : head_role::volatile_head;
    }
  }
  return r;
}

}  // namespace kvsift::calibrate
