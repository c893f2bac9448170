// SPDX-License-Identifier: Apache-2.0
#pragma once

// SyncKV head clustering (Liu et al., SyncKV; METHODS.md "SyncKV" / Calibration): the KV heads of
// one layer are grouped by how much their top-k sets overlap, and each group's representative
// (R-head) is the head whose attention the group's followers will borrow at decode.
//
// Features: the rows of D = max(S) - S, S the H x H mean-overlap matrix and max(S) its maximum
// over the whole matrix. k-means with `clusters` N_r (default 2) centroids:
//   - initialisation by farthest-point traversal from head 0: the next centroid is the head whose
//     squared distance to its nearest chosen centroid is largest (ties: lower head index);
//   - Lloyd iterations (assign to the nearest centroid, ties to the lower cluster index; move
//     each centroid to its members' mean, an empty cluster keeps its centroid) until the
//     assignment stops changing, at most `max_iter` (default 100) assignments;
//   - representative of a cluster = its member nearest the members' mean (ties: lower head
//     index).
// No cluster is left empty (issue 26 item 8): the cluster count used is
// N = min(N_r, number of distinct feature rows) — heads with identical rows of D cannot be told
// apart, so fewer distinct profiles than N_r give N clusters (representative.size() == N); and a
// cluster that Lloyd's iterations empty anyway is dropped, the clusters after it renumbered in
// order. Every returned cluster has a member and a representative (a valid head-roles file).
// Squared Euclidean distances in double. Cost: O(max_iter H^2 N_r).

#include <kvsift/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace kvsift::calibrate {

struct kmeans_params {
  int clusters = 2;    // N_r
  int max_iter = 100;  // Lloyd assignments at most
};

struct kmeans_result {
  std::vector<std::int32_t> assign;          // [H] cluster of each head, 0..N-1
  std::vector<std::int32_t> representative;  // [N] R-head of each cluster, N <= N_r (see above)
  int iterations = 0;                        // Lloyd assignments made
  bool converged = false;                    // assignment unchanged before max_iter ran out
};

// k-means roles of one layer from its similarity S [heads, heads] (row-major). Throws
// kvsift::error unless 1 <= clusters <= heads, max_iter >= 1, S has heads^2 finite entries.
[[nodiscard]] inline kmeans_result kmeans_roles(std::span<const float> similarity, int heads,
                                                const kmeans_params& p = {}) {
  constexpr std::string_view where = "calibrate::kmeans_roles";
  require(heads > 0, where, "heads", heads, "> 0");
  require(p.clusters >= 1 && p.clusters <= heads, where, "clusters", p.clusters,
          "1 <= clusters <= heads (" + std::to_string(heads) + ")");
  require(p.max_iter >= 1, where, "max_iter", p.max_iter, ">= 1");
  const auto H = static_cast<std::size_t>(heads);
  require(similarity.size() == H * H, where, "similarity.size()", similarity.size(),
          "heads * heads = " + std::to_string(H * H));
  for (std::size_t i = 0; i < similarity.size(); ++i) {
    require(std::isfinite(similarity[i]), where, "similarity[" + std::to_string(i) + "]",
            similarity[i], "a finite number");
  }
  // features x_i = row i of D = max(S) - S
  const double mx = *std::max_element(similarity.begin(), similarity.end());
  std::vector<double> x(H * H);
  for (std::size_t i = 0; i < H * H; ++i) {
    x[i] = mx - static_cast<double>(similarity[i]);
  }
  // N = min(N_r, distinct rows of D): more clusters than distinct profiles would stay empty
  std::size_t distinct = 0;
  for (std::size_t i = 0; i < H; ++i) {
    bool seen = false;
    for (std::size_t j = 0; j < i && !seen; ++j) {
      seen = std::equal(x.begin() + static_cast<std::ptrdiff_t>(i * H),
                        x.begin() + static_cast<std::ptrdiff_t>((i + 1) * H),
                        x.begin() + static_cast<std::ptrdiff_t>(j * H));
    }
    distinct += seen ? 0 : 1;
  }
  std::size_t C = std::min(static_cast<std::size_t>(p.clusters), distinct);
  const auto dist = [&](const double* a, const double* b) {
    double s = 0.0;
    for (std::size_t c = 0; c < H; ++c) {
      const double t = a[c] - b[c];
      s += t * t;
    }
    return s;
  };
  // farthest-point initialisation from head 0
  std::vector<double> cent(C * H);
  std::copy_n(x.begin(), H, cent.begin());
  std::vector<double> nearest(H, std::numeric_limits<double>::infinity());
  for (std::size_t c = 1; c < C; ++c) {
    std::size_t best = 0;
    double best_d = -1.0;
    for (std::size_t i = 0; i < H; ++i) {
      nearest[i] = std::min(nearest[i], dist(&x[i * H], &cent[(c - 1) * H]));
      if (nearest[i] > best_d) {
        best_d = nearest[i];
        best = i;
      }
    }
    std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(best * H), H,
                cent.begin() + static_cast<std::ptrdiff_t>(c * H));
  }
  kmeans_result r;
  r.assign.assign(H, -1);
  std::vector<std::int32_t> next(H);
  std::vector<std::size_t> count(C);
  for (int it = 0; it < p.max_iter; ++it) {
    for (std::size_t i = 0; i < H; ++i) {
      std::size_t best = 0;
      double best_d = dist(&x[i * H], &cent[0]);
      for (std::size_t c = 1; c < C; ++c) {
        const double d = dist(&x[i * H], &cent[c * H]);
        if (d < best_d) {
          best_d = d;
          best = c;
        }
      }
      next[i] = static_cast<std::int32_t>(best);
    }
    ++r.iterations;
    if (next == r.assign) {
      r.converged = true;
      break;
    }
    r.assign = next;
    std::vector<double> sum(C * H, 0.0);
    std::fill(count.begin(), count.end(), 0);
    for (std::size_t i = 0; i < H; ++i) {
      const auto c = static_cast<std::size_t>(r.assign[i]);
      ++count[c];
      for (std::size_t k = 0; k < H; ++k) {
        sum[c * H + k] += x[i * H + k];
      }
    }
    for (std::size_t c = 0; c < C; ++c) {
      if (count[c] == 0) {
        continue;  // an empty cluster keeps its centroid
      }
      for (std::size_t k = 0; k < H; ++k) {
        cent[c * H + k] = sum[c * H + k] / static_cast<double>(count[c]);
      }
    }
  }
  // a cluster the iterations emptied is dropped; the later ones move down (order kept)
  {
    std::vector<std::int32_t> renumber(C, -1);
    std::int32_t kept = 0;
    for (std::size_t c = 0; c < C; ++c) {
      if (std::find(r.assign.begin(), r.assign.end(), static_cast<std::int32_t>(c)) !=
          r.assign.end()) {
        renumber[c] = kept++;
      }
    }
    for (auto& a : r.assign) a = renumber[static_cast<std::size_t>(a)];
    C = static_cast<std::size_t>(kept);
  }
  // representatives: the member nearest its cluster's mean (the mean of the final assignment)
  r.representative.assign(C, -1);
  for (std::size_t c = 0; c < C; ++c) {
    std::vector<double> mean(H, 0.0);
    std::size_t members = 0;
    for (std::size_t i = 0; i < H; ++i) {
      if (static_cast<std::size_t>(r.assign[i]) != c) {
        continue;
      }
      ++members;
      for (std::size_t k = 0; k < H; ++k) {
        mean[k] += x[i * H + k];
      }
    }
    if (members == 0) {
      continue;
    }
    for (double& m : mean) {
      m /= static_cast<double>(members);
    }
    double best_d = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < H; ++i) {
      if (static_cast<std::size_t>(r.assign[i]) != c) {
        continue;
      }
      const double d = dist(&x[i * H], mean.data());
      if (d < best_d) {
        best_d = d;
        r.representative[c] = static_cast<std::int32_t>(i);
      }
    }
  }
  return r;
}

}  // namespace kvsift::calibrate
