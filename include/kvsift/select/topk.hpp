// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/cpu/segmented_topk.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace kvsift::select {

// Top-k with a protected sink and recent window — the selector of StreamingLLM, H2O, SnapKV,
// PyramidKV and DynamicKV. Per segment of n scores and budget B: B >= n keeps everything;
// otherwise the first `sink` and the last W tokens are kept, W = max(window,
// floor(window_share * B)), plus the top B - sink - W of the tokens between (higher score first,
// ties to the lower index). Output ascending, |kept| = min(B, n).
// B < sink + W with n > B is a kvsift::error. Parameters: sink 0, window 0, window_share 0
// (H2O uses window_share 0.5: its recent half), check_finite false. Cost: O(n) per segment
// (nth_element).
struct topk {
  using kvsift_role = selector_tag;
  static constexpr hooks kvsift_hooks{.check = true};
  using granularity = token_level;
  struct params {
    int sink = 0;
    int window = 0;
    double window_share = 0.0;
    bool check_finite = false;  // reject inf too among the candidate scores (NaN always is; protected ones ignored)
  };
  params p{};

  [[nodiscard]] int window_for(int budget) const {
    return std::max(p.window, static_cast<int>(count_floor(p.window_share * budget)));
  }

  void validate(std::string_view where) const {
    require(p.sink >= 0, where, "sink", p.sink, ">= 0");
    require(p.window >= 0, where, "window", p.window, ">= 0");
    require(p.window_share >= 0.0 && p.window_share <= 1.0, where, "window_share", p.window_share,
            "in [0, 1]");
  }

  // Throws before writing anything if a budget cannot hold the protected tokens.
  void check(const score_sets& scores, std::span<const int> budgets) const {
    constexpr std::string_view where = "select::topk";
    require(static_cast<int>(budgets.size()) == scores.segments(), where, "budgets.size",
            budgets.size(),
            [&] { return "one budget per segment (" + std::to_string(scores.segments()) + ")"; });
    for (int s = 0; s < scores.segments(); ++s) {
      const int n = scores.size(s);
      const int b = budgets[s];
      const auto arg = [s] { return "budgets[" + std::to_string(s) + "]"; };
      require(b >= 0, where, arg, b, [] { return std::string(">= 0"); });
      if (b < n) {
        require(b >= p.sink + window_for(b), where, arg, b, [&] {
          return ">= the protected tokens: sink " + std::to_string(p.sink) + " + window " +
                 std::to_string(window_for(b));
        });
      }
    }
    // the candidates between sink and window: finite when asked, never NaN
    const auto first = [&](int s) { return budgets[s] < scores.size(s) ? p.sink : 0; };
    const auto last = [&](int s) {
      return budgets[s] < scores.size(s) ? scores.size(s) - window_for(budgets[s]) : 0;
    };
    if (p.check_finite) {
      validate_finite(scores, first, last, where, "scores");
    } else {
      validate_not_nan(scores, first, last, where, "scores");
    }
  }

  // The shape half of a round: what each segment keeps, from its length and budget alone (host
  // arithmetic, the same for every exec: select() below and the evict schedule's device half's
  // thrust::segmented_topk read it). counts[s] = min(B, n); windows[s] the protected recent
  // window where the segment is over its budget (0 where it keeps everything).
  struct shape {
    std::vector<int> counts, windows;
    bool shrinks = false;   // some segment keeps fewer slots than it has
    bool one_over = false;  // every segment is exactly one over its budget: each drops one slot
  };
  void shape_of(std::span<const int> lengths, std::span<const int> budgets, shape& out) const {
    out.counts.resize(lengths.size());
    out.windows.resize(lengths.size());
    out.shrinks = false;
    out.one_over = !lengths.empty();
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      const int n = lengths[s], b = budgets[s];
      out.counts[s] = std::min(b, n);
      out.windows[s] = b < n ? window_for(b) : 0;
      out.shrinks = out.shrinks || b < n;
      out.one_over = out.one_over && n == b + 1;
    }
  }

  void select(const score_sets& scores, std::span<const int> budgets, index_sets& kept) const {
    check(scores, budgets);
    // scratch, nothing allocated once warm; `sh` names the calling thread's, which the pool's
    // threads read below (a thread_local named inside the lambda would be each thread's own)
    thread_local shape scratch;
    thread_local std::vector<int> lengths;
    shape& sh = scratch;
    lengths.resize(static_cast<std::size_t>(scores.segments()));
    for (int s = 0; s < scores.segments(); ++s) lengths[s] = scores.size(s);
    shape_of(lengths, budgets, sh);
    kept.resize(sh.counts);
    cpu::parallel_for(scores.segments(), [&](std::int64_t s64) {
      const int s = static_cast<int>(s64);
      const int n = scores.size(s);
      const int b = budgets[s];
      auto out = kept[s];
      if (b >= n) {
        std::iota(out.begin(), out.end(), 0);
        return;
      }
      const int w = sh.windows[s];
      // the sink, the top of the tokens between, the window: b slots, ascending (b >= sink + w)
      std::iota(out.begin(), out.begin() + p.sink, 0);
      cpu::topk_range(scores[s], p.sink, n - w, b - p.sink - w, out.subspan(p.sink, b - p.sink - w));
      std::iota(out.end() - w, out.end(), n - w);
    }, cpu::par, static_cast<std::int64_t>(scores.values.size()) / std::max(1, scores.segments()));
  }
};
static_assert(Selector<topk>);

}  // namespace kvsift::select
