// SPDX-License-Identifier: Apache-2.0
#pragma once

// Merging partial attentions. A partial attention over a subset of a head's rows is its softmax-
// weighted values normalised over that subset, with the subset's log-sum-exp of the scaled logits
// (cpu::attend_group_at's `lse`). Two partials over disjoint subsets A and B merge into the
// attention over A u B exactly, up to rounding (max-shifted, so no exp overflows):
//
//   m = max(lse_a, lse_b),  w_a = exp(lse_a - m),  w_b = exp(lse_b - m)
//   out = (w_a out_a + w_b out_b) / (w_a + w_b),     lse = m + log(w_a + w_b)
//
// An empty subset has lse = -inf and any output: it contributes nothing. This is how a step may
// attend the rows of the host tier on the CPU and the resident rows on the device, then combine.
//
// A partial that finite keys, values and queries cannot give (an lse that is NaN or +inf, a NaN or
// infinite output of a non-empty part: a poisoned row reached one side) is a kvsift::error naming
// the side, the head and the value, raised before anything is written, as the library raises a
// non-finite input at its boundaries (method/lifecycle.hpp).

#include <kvsift/core/config.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/exp.hpp>

#include <cmath>
#include <limits>
#include <string>

namespace kvsift::attention {

namespace detail {
inline void check_partial(const char* side, int G, int d, const float* out, const float* lse) {
  constexpr std::string_view where = "attention::merge_partials";
  for (int g = 0; g < G; ++g) {
    const float l = lse[g];
    require(!std::isnan(l) && l != std::numeric_limits<float>::infinity(), where,
            [&] { return std::string("lse_") + side + "[" + std::to_string(g) + "]"; }, l,
            [] { return std::string("a finite log-sum-exp, or -inf for an empty part"); });
    if (l == -std::numeric_limits<float>::infinity()) continue;  // empty: its output is unused
    const float* o = out + static_cast<std::size_t>(g) * d;
    for (int c = 0; c < d; ++c) {
      require(std::isfinite(o[c]), where,
              [&] {
                return std::string("out_") + side + "[" + std::to_string(g) + " * d + " +
                       std::to_string(c) + "]";
              },
              o[c], [] { return std::string("finite (a non-empty part's attention output)"); });
    }
  }
}
}  // namespace detail

// One head's merge, the formula above, on the host and on a device alike (the device's far-tier
// step, device/two_tier.hpp, runs it one thread per query head): o[0, d) from (oa, la) and
// (ob, lb); returns top and the weight sum, lse = top + log(weight). Both parts empty (top =
// -inf): o is zeros and weight 0. o may be oa or ob. exp is exact_expf, so the host and a device
// give one result where neither compiler contracts the weighted sum into FMAs.
struct merged_weight {
  float top;
  float weight;
};
KVSIFT_HOST_DEVICE inline merged_weight merge_row(int d, const float* oa, float la, const float* ob,
                                                  float lb, float* o) {
  const float none = kvsift::detail::bits_float(0xff800000u);  // -inf
  const float top = la > lb ? la : lb;
  if (top == none) {
    for (int c = 0; c < d; ++c) o[c] = 0.0f;
    return {top, 0.0f};
  }
  const float wa = la == none ? 0.0f : kvsift::exact_expf(la - top);
  const float wb = lb == none ? 0.0f : kvsift::exact_expf(lb - top);
  const float inv = 1.0f / (wa + wb);
  const float fa = wa * inv, fb = wb * inv;
  for (int c = 0; c < d; ++c) {
    o[c] = (fa == 0.0f ? 0.0f : fa * oa[c]) + (fb == 0.0f ? 0.0f : fb * ob[c]);
  }
  return {top, wa + wb};
}

// out[g, :] and lse[g] for G heads of d channels from the partials (out_a, lse_a) and (out_b,
// lse_b). out may be out_a or out_b (in place); lse may be null, or lse_a or lse_b.
inline void merge_partials(int G, int d, const float* out_a, const float* lse_a, const float* out_b,
                           const float* lse_b, float* out, float* lse = nullptr) {
  detail::check_partial("a", G, d, out_a, lse_a);
  detail::check_partial("b", G, d, out_b, lse_b);
  for (int g = 0; g < G; ++g) {
    const auto at = static_cast<std::size_t>(g) * d;
    const merged_weight m = merge_row(d, out_a + at, lse_a[g], out_b + at, lse_b[g], out + at);
    if (lse != nullptr) lse[g] = m.weight == 0.0f ? m.top : m.top + std::log(m.weight);
  }
}

}  // namespace kvsift::attention
