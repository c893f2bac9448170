// SPDX-License-Identifier: Apache-2.0
#pragma once

// budget::inverse_stability — HeteroCache's per-head budgets (HeteroCache; METHODS.md
// "HeteroCache" / Budgets, SPEC budget.heterocache).
//
// Head roles come from calibration (calibrate/star_cluster.hpp): volatile and pivot heads keep
// their full KV on the device; anchors and satellites are compressed. Over the WHOLE model
// (every KV head of every layer):
//
//   F    = volatile + pivot heads,  N = all KV heads,  N_c = N - F (compressed heads)
//   base = floor((rho * N - F) * n / N_c)
//   w_h  = 1 / (s_h + 1e-6)         (s_h: the head's calibrated stability)
//   cap_h = min(n, floor(base * w_h * N_c / sum(w)))   sum over the compressed heads
//
// so that F n + sum(cap) <= rho N n: less stable heads get more tokens. Volatile and pivot heads
// get cap n. Every count follows METHODS.md's real-to-integer rule (count_floor: floor(x + 1e-9
// max(1, |x|)) in double), so equal stabilities give exactly cap = base.
// Infeasible roles are a kvsift::error naming the layer with the most full-KV heads, the count F
// and the fraction that would work: no compressed head at all, or base < 0 (rho N < F: the
// full-KV heads alone exceed the budget; rho >= F / N works).
// Parameters: rho 0.5 (METHODS.md). Cost: O(L H) per call.

#include <kvsift/calibrate/star_cluster.hpp>
#include <kvsift/concepts.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/math.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace kvsift::budget {

// The budgets of one prompt length n: base and the per-head caps, [layers * kv_heads]
// layer-major (n for volatile and pivot heads).
struct heterocache_caps {
  int base = 0;
  std::vector<int> cap;
};

// A head keeps its full KV on the device (volatile or pivot).
[[nodiscard]] constexpr bool full_kv(calibrate::head_role r) noexcept {
  return r == calibrate::head_role::volatile_head || r == calibrate::head_role::pivot;
}

// Checks roles ([layers * kv_heads], layer-major), stability (same size, finite, >= 0) and rho,
// then whether the roles are feasible at rho; throws kvsift::error before returning anything.
inline void check_inverse_stability(std::span<const calibrate::head_role> roles,
                                    std::span<const float> stability, int kv_heads, double rho,
                                    std::string_view where = "budget::inverse_stability") {
  require(kv_heads > 0, where, "kv_heads", kv_heads, "> 0");
  require(!roles.empty() && roles.size() % static_cast<std::size_t>(kv_heads) == 0, where,
          "roles.size", roles.size(),
          "a positive multiple of kv_heads = " + std::to_string(kv_heads) + " (layers x kv_heads)");
  require(stability.size() == roles.size(), where, "stability.size", stability.size(),
          "roles.size = " + std::to_string(roles.size()));
  require(std::isfinite(rho) && rho >= 0.0 && rho <= 1.0, where, "rho", rho, "in [0, 1]");
  const int N = static_cast<int>(roles.size());
  const int layers = N / kv_heads;
  int F = 0, worst_layer = 0, worst = -1;
  for (int l = 0; l < layers; ++l) {
    int f = 0;
    for (int h = 0; h < kv_heads; ++h) {
      const auto i = static_cast<std::size_t>(l) * kv_heads + h;
      const int code = static_cast<int>(roles[i]);
      require(code >= 0 && code <= 3, where, "roles[" + std::to_string(i) + "]", code,
              "0 anchor, 1 volatile, 2 pivot or 3 satellite");
      require(std::isfinite(stability[i]) && stability[i] >= 0.0f, where,
              "stability[" + std::to_string(i) + "]", stability[i], "a finite number >= 0");
      f += full_kv(roles[i]) ? 1 : 0;
    }
    F += f;
    if (f > worst) {
      worst = f;
      worst_layer = l;
    }
  }
  const auto where_full = [&] {
    return std::to_string(F) + " of the N = " + std::to_string(N) +
           " KV heads keep full KV (volatile + pivot; layer " + std::to_string(worst_layer) +
           " has " + std::to_string(worst) + " of " + std::to_string(kv_heads) + ")";
  };
  require(F < N, where, "roles", "no anchor or satellite",
          "at least one compressed head (anchor or satellite): " + where_full());
  if (count_floor((rho * N - F) / static_cast<double>(N - F)) < 0) {
    std::ostringstream need;
    need.precision(6);
    need << static_cast<double>(F) / N;
    throw make_error(where, "rho", rho,
                     ">= F / N = " + std::to_string(F) + " / " + std::to_string(N) + " = " +
                         need.str() + ": " + where_full() +
                         ", so a smaller rho leaves the compressed heads a negative base budget");
  }
}

// base and caps for a prompt of n tokens (see the header comment). Validates first.
[[nodiscard]] inline heterocache_caps inverse_stability_caps(std::span<const calibrate::head_role> roles,
                                                             std::span<const float> stability,
                                                             int kv_heads, int n, double rho) {
  constexpr std::string_view where = "budget::inverse_stability";
  require(n >= 0, where, "n", n, ">= 0");
  check_inverse_stability(roles, stability, kv_heads, rho, where);
  const int N = static_cast<int>(roles.size());
  int F = 0;
  double sum_w = 0.0;
  for (std::size_t i = 0; i < roles.size(); ++i) {
    if (full_kv(roles[i])) {
      ++F;
    } else {
      sum_w += 1.0 / (static_cast<double>(stability[i]) + 1e-6);
    }
  }
  const int Nc = N - F;
  heterocache_caps out;
  const std::int64_t base = count_floor((rho * N - F) * static_cast<double>(n) / Nc);
  require(base >= 0, where, "rho", rho, ">= F / N (base " + std::to_string(base) + " < 0)");
  out.base = static_cast<int>(std::min<std::int64_t>(base, n));
  out.cap.resize(roles.size());
  for (std::size_t i = 0; i < roles.size(); ++i) {
    if (full_kv(roles[i])) {
      out.cap[i] = n;
      continue;
    }
    const double w = 1.0 / (static_cast<double>(stability[i]) + 1e-6);
    const std::int64_t c = count_floor(static_cast<double>(base) * w * Nc / sum_w);
    out.cap[i] = static_cast<int>(std::clamp<std::int64_t>(c, 0, n));
  }
  return out;
}

// The Budgeter model: the cap of each head-sequence of a layer, from its length n. params: the
// model's roles and stabilities ([layers * kv_heads], layer-major) and rho 0.5; or `fixed`, a
// base and caps given outright (each taken as min(x, n)), which replace the formula.
struct inverse_stability {
  using kvsift_role = budgeter_tag;
  struct params {
    std::vector<calibrate::head_role> roles;  // [layers * kv_heads]
    std::vector<float> stability;             // [layers * kv_heads]
    int kv_heads = 1;                         // KV heads per layer (to name a layer in errors)
    double rho = 0.5;
    std::optional<heterocache_caps> fixed = std::nullopt;  // base, cap [layers * kv_heads] instead
  };
  params p{};
  void validate(std::string_view where) const {
    require(!p.roles.empty(), where, "roles.size", p.roles.size(), "> 0 (layers x kv_heads)");
    if (p.fixed) {
      require(p.fixed->cap.size() == p.roles.size(), where, "fixed.cap.size", p.fixed->cap.size(),
              "layers x kv_heads = " + std::to_string(p.roles.size()));
      return;
    }
    check_inverse_stability(p.roles, p.stability, p.kv_heads, p.rho, where);
  }
  // base and the caps of the whole model ([layers * kv_heads]) for a prompt of n tokens.
  [[nodiscard]] heterocache_caps caps(int kv_heads, int n) const {
    if (p.fixed) {
      heterocache_caps c;
      c.base = std::min(p.fixed->base, n);
      for (const int x : p.fixed->cap) c.cap.push_back(std::min(x, n));
      return c;
    }
    return inverse_stability_caps(p.roles, p.stability, kv_heads, n, p.rho);
  }
  void budgets(const budget_context& ctx, std::vector<int>& out) const {
    require(static_cast<std::size_t>(ctx.layers) * ctx.kv_heads == p.roles.size(),
            "budget::inverse_stability", "roles.size", p.roles.size(),
            "layers x kv_heads = " + std::to_string(ctx.layers * ctx.kv_heads));
    out.resize(ctx.lengths.size());
    for (std::size_t s = 0; s < ctx.lengths.size(); ++s) {
      const auto c = caps(ctx.kv_heads, ctx.lengths[s]);
      out[s] = c.cap[static_cast<std::size_t>(ctx.layer) * ctx.kv_heads +
                     static_cast<int>(s) % ctx.kv_heads];
    }
  }
};
static_assert(Budgeter<inverse_stability>);

}  // namespace kvsift::budget
