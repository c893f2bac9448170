// SPDX-License-Identifier: Apache-2.0
#pragma once

// Profiling top-k sets (SyncKV and HeteroCache calibration, METHODS.md "Calibration" and
// "Profiling"): the last query's attention of one profiled step, per query head, is pooled along
// tokens, reduced over each GQA group to one row per KV head, and its top-k tokens are kept
// (higher score first, ties to the lower index, returned ascending).
//
//   SyncKV:       kernel 1 (no pooling), GQA max, k a parameter (default floor(n / 5)).
//   HeteroCache:  kernel 5 avg pooling, GQA mean, k = min(1024, floor(n / 5)).
//
// Built from the CPU kernels the runtime scorers use (cpu::pool1d, cpu::reduce_group,
// cpu::topk_range), so calibration and score::last_query_attention agree bit for bit.
// Cost: O(Hq n kernel) to pool plus O(n) per KV head for the selection.

#include <kvsift/core/error.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/segmented_topk.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kvsift::calibrate {

// One index set per KV head (ascending original positions).
using head_sets = std::vector<std::vector<std::int32_t>>;

// How a step's attention rows become one top-k set per KV head.
struct topk_params {
  int k = 0;                           // tokens per set; min(k, n) are kept
  int group = 1;                       // G, query heads per KV head
  int kernel = 1;                      // pooling kernel (odd; 1 = no pooling)
  pooling pool = pooling::avg;         // used when kernel > 1
  gqa_reduce gqa = gqa_reduce::mean;   // SyncKV uses max

  void validate(std::string_view where) const {
    require(k >= 0, where, "k", k, ">= 0");
    require(group > 0, where, "group", group, "> 0");
    require(kernel > 0 && kernel % 2 == 1, where, "kernel", kernel, "a positive odd number");
  }
};

// attention [q_heads, n] (row h = query head h's softmax over the n keys it sees) -> out[h]
// for h < q_heads / group: the top-min(k, n) tokens of KV head h, ascending. Throws
// kvsift::error for bad parameters, q_heads not a multiple of group, a wrong attention size or a
// non-finite attention value.
inline void topk_sets(std::span<const float> attention, int q_heads, int n, const topk_params& p,
                      head_sets& out) {
  constexpr std::string_view where = "calibrate::topk_sets";
  p.validate(where);
  require(q_heads > 0 && q_heads % p.group == 0, where, "q_heads", q_heads,
          "a positive multiple of group (" + std::to_string(p.group) + ")");
  require(n >= 0, where, "n", n, ">= 0");
  require(attention.size() == static_cast<std::size_t>(q_heads) * static_cast<std::size_t>(n),
          where, "attention.size()", attention.size(),
          "q_heads * n = " + std::to_string(static_cast<std::int64_t>(q_heads) * n));
  for (std::size_t i = 0; i < attention.size(); ++i) {
    require(std::isfinite(attention[i]), where, "attention[" + std::to_string(i) + "]",
            attention[i], "a finite number");
  }
  const int heads = q_heads / p.group;
  const auto N = static_cast<std::size_t>(n);
  out.assign(static_cast<std::size_t>(heads), {});
  std::vector<float> rows(static_cast<std::size_t>(p.group) * N);
  std::vector<float> reduced(N);
  for (int h = 0; h < heads; ++h) {
    for (int g = 0; g < p.group; ++g) {
      const auto src = attention.subspan((static_cast<std::size_t>(h) * p.group + g) * N, N);
      cpu::pool1d(src, std::span<float>(rows.data() + static_cast<std::size_t>(g) * N, N),
                  p.kernel, p.pool);
    }
    cpu::reduce_group(rows, p.group, reduced, p.gqa);
    cpu::topk_range(reduced, 0, n, p.k, out[static_cast<std::size_t>(h)]);
  }
}

}  // namespace kvsift::calibrate
