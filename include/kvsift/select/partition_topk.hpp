// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/concepts.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/cpu/segmented_topk.hpp>

#include <algorithm>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace kvsift::select {

// Per-partition top-k — LagKV (Liang et al., 2025, "LagKV: Lag-Relative Information of the KV
// Cache Tells Which Tokens Are Important").
//
// Per segment of n scores with a frozen prefix F (slots before it are final): base =
// max(F, sink); P = floor((n - base) / lag) full partitions of [base, n). With P >= 2 it keeps
// [0, base), the top k = floor(keep_fraction * lag) of each partition 0..P-2 (higher score first,
// ties to the lower index) and the raw tail [base + (P-1) lag, n); the new frozen prefix is
// base + (P-1) k (the kept tokens are frozen: never rescored). With P < 2 it keeps everything.
// Output ascending. Budgets are ignored: LagKV's size follows from keep_fraction, not a budget.
//
// The 4-argument select() is the method's frozen-prefix hook: it reads F per segment from
// `frozen`, writes the new prefix back, and returns the compression rounds the call amounts to
// (P - 1: a call that finds more than two partitions runs, at once and with the same result,
// the rounds of LagKV's chunk-by-chunk recursion; 0 when nothing was compressed). The
// 3-argument form treats every segment as fresh (F = 0).
//
// Parameters (paper defaults): sink 16, lag 128, keep_fraction 0.5; floor(keep_fraction * lag)
// must be in [1, lag]. Cost: O(n) per segment (nth_element per partition).
struct partition_topk {
  using kvsift_role = selector_tag;
  static constexpr hooks kvsift_hooks{.freeze = true};
  using granularity = token_level;
  struct params {
    int sink = 16;               // S: slots [0, S) are never compressed
    int lag = 128;               // L: partition length
    double keep_fraction = 0.5;  // r: each scored partition keeps floor(r * L) tokens
  };
  params p{};

  [[nodiscard]] int keep_per_partition() const {
    return static_cast<int>(count_floor(p.keep_fraction * p.lag));
  }

  void validate(std::string_view where) const {
    require(p.sink > 0, where, "sink", p.sink, "> 0");
    require(p.lag > 0, where, "lag", p.lag, "> 0");
    require(p.keep_fraction > 0.0 && p.keep_fraction <= 1.0 && keep_per_partition() >= 1, where,
            "keep_fraction", p.keep_fraction,
            "in (0, 1] with floor(keep_fraction * lag) >= 1 (lag " + std::to_string(p.lag) + ")");
  }

  // The shape half of a round: each segment's layout from its length n and frozen prefix F alone
  // (host arithmetic, the same for every exec: select() below and the evict schedule's device
  // half's descriptors read it). bases[s] = min(max(F, sink), n); parts[s] = floor((n - base) /
  // lag) full partitions; scored(s) = parts - 1 of them compressed where parts >= 2 (else none);
  // counts[s] = n - scored(s) (lag - k) kept; frozen_after[s] = base + scored(s) k where a
  // partition is scored (else F); rounds = max scored(s), the recursion's rounds the call runs.
  struct shape {
    std::vector<int> bases, parts, counts, frozen_after;
    int rounds = 0;
    bool shrinks = false;  // some segment keeps fewer slots than it has
    [[nodiscard]] int scored(std::size_t s) const { return parts[s] >= 2 ? parts[s] - 1 : 0; }
  };
  void shape_of(std::span<const int> lengths, std::span<const int> frozen, shape& out) const {
    const int L = p.lag, k = keep_per_partition();
    const std::size_t S = lengths.size();
    out.bases.resize(S);
    out.parts.resize(S);
    out.counts.resize(S);
    out.frozen_after.resize(S);
    out.rounds = 0;
    out.shrinks = false;
    for (std::size_t s = 0; s < S; ++s) {
      const int n = lengths[s];
      out.bases[s] = std::min(std::max(frozen[s], p.sink), n);
      out.parts[s] = (n - out.bases[s]) / L;
      const int scored = out.scored(s);
      out.counts[s] = n - scored * (L - k);
      out.frozen_after[s] = scored > 0 ? out.bases[s] + scored * k : frozen[s];
      out.rounds = std::max(out.rounds, scored);
      out.shrinks = out.shrinks || out.counts[s] < n;
    }
  }

  void select(const score_sets& scores, std::span<const int> budgets, index_sets& kept) const {
    std::vector<int> frozen(static_cast<std::size_t>(scores.segments()), 0);
    (void)select(scores, budgets, kept, std::span<int>(frozen));
  }

  int select(const score_sets& scores, std::span<const int> /*budgets*/, index_sets& kept,
             std::span<int> frozen) const {
    constexpr std::string_view where = "select::partition_topk";
    validate(where);
    require(static_cast<int>(frozen.size()) == scores.segments(), where, "frozen.size",
            frozen.size(),
            "one frozen prefix per segment (" + std::to_string(scores.segments()) + ")");
    const int L = p.lag;
    const int k = keep_per_partition();
    std::vector<int> lengths(static_cast<std::size_t>(scores.segments()));
    for (int s = 0; s < scores.segments(); ++s) lengths[s] = scores.size(s);
    shape sh;
    shape_of(lengths, frozen, sh);
    const auto& bases = sh.bases;
    const auto& parts = sh.parts;
    validate_not_nan(
        scores, [&](int s) { return bases[s]; },
        [&](int s) { return parts[s] >= 2 ? bases[s] + (parts[s] - 1) * L : 0; }, where, "scores");
    kept.resize(sh.counts);
    cpu::parallel_for(scores.segments(), [&](std::int64_t s64) {
      const int s = static_cast<int>(s64);
      const int n = scores.size(s);
      auto out = kept[s];
      if (parts[s] < 2) {
        std::iota(out.begin(), out.end(), 0);
        return;
      }
      const int base = bases[s];
      const int tail = base + (parts[s] - 1) * L;
      std::vector<std::int32_t> picked;
      picked.reserve(out.size());
      for (int j = 0; j < base; ++j) picked.push_back(j);
      for (int part = 0; part + 1 < parts[s]; ++part) {
        cpu::topk_range(scores[s], base + part * L, base + (part + 1) * L, k, picked);
      }
      for (int j = tail; j < n; ++j) picked.push_back(j);
      std::copy(picked.begin(), picked.end(), out.begin());
    });
    std::copy(sh.frozen_after.begin(), sh.frozen_after.end(), frozen.begin());
    return sh.rounds;
  }
};
static_assert(Selector<partition_topk>);

}  // namespace kvsift::select
