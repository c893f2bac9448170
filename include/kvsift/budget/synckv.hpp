// SPDX-License-Identifier: Apache-2.0
#pragma once

// budget::synckv — SyncKV's follower budget (Zhou et al., 2025, "SyncKV: Synchronized KV
// cache compression with representative heads and periodic anticipation"; METHODS.md "SyncKV").
//
// R-heads (one representative per head cluster) keep their full KV on the device. With N KV heads
// in the whole model (layers x kv_heads), N_R of them representatives, and a device memory
// fraction M of the prefill KV, each follower keeps
//
//   k        = floor((M * N - N_R) * n / (N - N_R))   (METHODS.md real-to-integer rule)
//   k_static = floor(rho * k)                        kept for the whole decode
//   k_dyn    = k - k_static                          refreshed every m steps from the R-head
//
// so that N_R * n + (N - N_R) * k <= M * N * n. k < 0 (M * N < N_R: the R-heads alone do not fit)
// is a kvsift::error naming the smallest memory fraction that works, N_R / N. M in [0, 1],
// rho in [0, 1], 0 <= N_R < N. Cost: O(1) per head-sequence.

#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/math.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace kvsift::budget {

// A follower's budget split: k = k_static + k_dynamic tokens of the prefill.
struct synckv_split {
  int k = 0;
  int k_static = 0;
  int k_dynamic = 0;
};

// Validates the arguments and computes the split for a prompt of n tokens. Throws kvsift::error
// (before anything else happens) on heads <= representatives, a fraction outside [0, 1], or k < 0.
inline synckv_split synckv_budget(int heads, int representatives, int n, double memory_fraction,
                                  double rho) {
  constexpr std::string_view where = "budget::synckv";
  require(heads > 0, where, "heads", heads, "> 0 (KV heads of the whole model)");
  require(representatives >= 0 && representatives < heads, where, "representatives",
          representatives,
          "in [0, heads = " + std::to_string(heads) + "): at least one follower head");
  require(n >= 0, where, "n", n, ">= 0");
  require(memory_fraction >= 0.0 && memory_fraction <= 1.0, where, "memory_fraction",
          memory_fraction, "in [0, 1]");
  require(rho >= 0.0 && rho <= 1.0, where, "rho", rho, "in [0, 1]");
  const double x = (memory_fraction * heads - representatives) * static_cast<double>(n) /
                   static_cast<double>(heads - representatives);
  const std::int64_t k = count_floor(x);
  if (k < 0) {
    std::ostringstream smallest;
    smallest.precision(6);
    smallest << static_cast<double>(representatives) / heads;
    throw make_error(where, "memory_fraction", memory_fraction,
            ">= N_R / N = " + std::to_string(representatives) + " / " + std::to_string(heads) +
                " = " + smallest.str() +
                ": the R-heads alone keep their full KV, so a smaller fraction leaves the "
                "followers a negative budget (k = " + std::to_string(k) + ")");
  }
  synckv_split s;
  s.k = static_cast<int>(std::min<std::int64_t>(k, n));
  s.k_static = static_cast<int>(count_floor(rho * s.k));
  s.k_dynamic = s.k - s.k_static;
  return s;
}

// The Budgeter model: every head-sequence of length n gets a follower's k (R-heads ignore it; the
// method keeps them whole). params: heads N and representatives N_R of the whole model, memory
// fraction M (paper: 0.3 .. 0.5), rho 0.5 (only k is a budget; the split is synckv_budget's).
struct synckv {
  using kvsift_role = budgeter_tag;
  struct params {
    int heads = 1;
    int representatives = 0;
    double memory_fraction = 0.3;
    double rho = 0.5;
  };
  params p{};
  void validate(std::string_view where) const {
    (void)where;
    (void)synckv_budget(p.heads, p.representatives, 1, p.memory_fraction, p.rho);  // k < 0 iff M N < N_R
  }
  [[nodiscard]] synckv_split split(int n) const {
    return synckv_budget(p.heads, p.representatives, n, p.memory_fraction, p.rho);
  }
  void budgets(const budget_context& ctx, std::vector<int>& out) const {
    out.resize(ctx.lengths.size());
    for (std::size_t s = 0; s < ctx.lengths.size(); ++s) out[s] = split(ctx.lengths[s]).k;
  }
};
static_assert(Budgeter<synckv>);

}  // namespace kvsift::budget
