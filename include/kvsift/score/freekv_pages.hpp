// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/score/context.hpp>
#include <kvsift/score/page_minmax.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvsift::score {

// How FreeKV merges the G query heads of a KV head into one score per candidate page.
enum class freekv_merge {
  softmax_mean,  // softmax over the candidate pages of each query head's bounds, then the mean
  mean,          // mean of the raw bounds
  max,           // max of the raw bounds
};

inline freekv_merge parse_freekv_merge(std::string_view s) {
  if (s == "softmax_mean") return freekv_merge::softmax_mean;
  if (s == "mean") return freekv_merge::mean;
  require(s == "max", "score::freekv_pages", "merge", s, "\"softmax_mean\", \"mean\" or \"max\"");
  return freekv_merge::max;
}

// FreeKV's page layout of a head-sequence of `tokens` tokens: pages of p from token 0, the last
// one possibly partial; sink = pages [0, S/p); window = the last W/p pages (the current, possibly
// partial, page counted); candidates = the pages between, [S/p, P - W/p) (empty when none).
struct freekv_layout {
  int pages = 0;             // P = ceil(tokens / p)
  int candidates_first = 0;  // S / p
  int candidates_last = 0;   // max(S / p, P - W / p)

  freekv_layout(int tokens, int page_size, int sink, int window)
      : pages((tokens + page_size - 1) / page_size),
        candidates_first(sink / page_size),
        candidates_last(std::max(sink / page_size, pages - window / page_size)) {}
  [[nodiscard]] int candidates() const { return candidates_last - candidates_first; }
};

}  // namespace kvsift::score

namespace kvsift::cpu {

// FreeKV's group-consistent score of one KV head. `bounds` [G, P] holds each query head's Quest
// bound of every page; out[i] scores candidate page first + i, i < last - first:
//   softmax_mean  (1/G) sum_g softmax_{candidates}(bounds[g])[first + i]   (sum over g in order)
//   mean          (1/G) sum_g bounds[g][first + i]
//   max           max_g bounds[g][first + i]
inline void freekv_group_scores(std::span<const float> bounds, int group, int pages, int first,
                                int last, score::freekv_merge merge, std::span<float> out) {
  const int n = last - first;
  if (n <= 0) return;
  if (merge != score::freekv_merge::softmax_mean) {
    std::vector<float> rows(static_cast<std::size_t>(group) * n);
    for (int g = 0; g < group; ++g) {
      std::copy_n(bounds.data() + static_cast<std::size_t>(g) * pages + first, n,
                  rows.data() + static_cast<std::size_t>(g) * n);
    }
    reduce_group(rows, group, out.first(static_cast<std::size_t>(n)),
                 merge == score::freekv_merge::max ? gqa_reduce::max : gqa_reduce::mean);
    return;
  }
  std::vector<float> row(static_cast<std::size_t>(n));
  std::fill_n(out.begin(), n, 0.0f);
  for (int g = 0; g < group; ++g) {
    std::copy_n(bounds.data() + static_cast<std::size_t>(g) * pages + first, n, row.data());
    softmax(row);
    for (int i = 0; i < n; ++i) out[i] += row[i];
  }
  for (int i = 0; i < n; ++i) out[i] /= static_cast<float>(group);
}

}  // namespace kvsift::cpu

namespace kvsift::score {

// Group-consistent page score — FreeKV (Liu et al., 2025, "FreeKV: Boosting KV Cache Retrieval
// for Efficient LLM Inference"). Pages of p tokens from token 0 carry Quest's min-max digest
// (cpu::page_digest) and each query head bounds a page with Quest's sum_c max(q_c kmax_c,
// q_c kmin_c) (cpu::page_bound, no scale). FreeKV keeps ONE page set per KV head, so the G query
// heads of a group must agree: over the candidate pages [S/p, P - W/p) (sink and window pages are
// always kept and not scored), each query head's bounds go through a softmax and the G
// distributions are averaged (`softmax_mean`; options `mean`, `max` of the raw bounds).
//
// Output of score(): one segment per head-sequence with P entries (the page layout of the
// head-sequence's length, or of `layout_tokens` when given); candidate pages hold the group
// score, sink and window pages 0 (select::freekv_pages ignores them, like select::topk's
// protected positions).
// Parameters (paper defaults): page_size 32, sink 512, window 512 (whole pages), merge
// softmax_mean. Cost: O(n d) digests (kept incrementally while the store only appends),
// O(G P d) bounds and O(G Pc) merge per query.
struct freekv_pages {
  using kvsift_role = scorer_tag;
  using granularity = page_level;
  static constexpr bool needs_queries = true;
  struct params {
    int page_size = 32;
    int sink = 512;    // S tokens, whole pages
    int window = 512;  // W tokens, whole pages, the current page included
    freekv_merge merge = freekv_merge::softmax_mean;
  };
  params p{};

  freekv_pages() = default;
  explicit freekv_pages(params prm) : p(prm) {}

  [[nodiscard]] int query_window() const { return 1; }
  void validate(std::string_view where) const {
    require(p.page_size > 0, where, "page_size", p.page_size, "> 0");
    require(p.sink >= 0 && p.sink % p.page_size == 0, where, "sink", p.sink,
            "whole pages (a multiple of page_size " + std::to_string(p.page_size) + ", >= 0)");
    require(p.window > 0 && p.window % p.page_size == 0, where, "window", p.window,
            "whole pages (a positive multiple of page_size " + std::to_string(p.page_size) +
                "; the current page is in the window)");
  }
  [[nodiscard]] freekv_layout layout(int tokens) const {
    return {tokens, p.page_size, p.sink, p.window};
  }

  // Group scores of the newest query of each request. layout_tokens, when not empty, gives per
  // segment the length whose page layout is scored (>= the store's length; FreeKV selects after
  // step t-1 for step t, one token ahead): candidate pages must then hold known tokens only,
  // which the window (>= one page) guarantees for one token ahead.
  template <class Store>
  void score(const score_input<Store>& in, score_sets& out,
             std::span<const int> layout_tokens = {}) const {
    validate("score::freekv_pages");
    const model_shape& sh = in.store->shape();
    const int G = sh.group_size();
    std::vector<int> sizes(static_cast<std::size_t>(in.segments()));
    for (int s = 0; s < in.segments(); ++s) {
      const int n = in.store->length(in.sequence(s));
      const int t = layout_tokens.empty() ? n : layout_tokens[s];
      require(t >= n, "score::freekv_pages", "layout_tokens[" + std::to_string(s) + "]", t,
              ">= the head-sequence's length " + std::to_string(n));
      const auto lay = layout(t);
      require(lay.candidates() == 0 || lay.candidates_last * p.page_size <= n,
              "score::freekv_pages", "layout_tokens[" + std::to_string(s) + "]", t,
              "a layout whose candidate pages hold only known tokens (" + std::to_string(n) +
                  " tokens known)");
      sizes[s] = lay.pages;
    }
    out.resize(sizes);
    cache_.refresh(in, p.page_size);
    cpu::parallel_for(in.segments(), [&](std::int64_t s64) {
      const int s = static_cast<int>(s64);
      const int P = sizes[s];
      std::vector<float> rows(static_cast<std::size_t>(G) * P);
      group_bounds(in, s, P, rows);
      auto seg = out[s];
      std::fill(seg.begin(), seg.end(), 0.0f);
      const auto lay = layout(P * p.page_size);
      cpu::freekv_group_scores(rows, G, P, lay.candidates_first, lay.candidates_last, p.merge,
                               seg.subspan(static_cast<std::size_t>(lay.candidates_first)));
    });
  }

  // Each query head's Quest bound of every page: one segment per query head (request-major, then
  // query head h, which reads KV head h / G), P entries each. Cost as score().
  template <class Store>
  void bounds(const score_input<Store>& in, score_sets& out) const {
    validate("score::freekv_pages");
    const int G = in.store->shape().group_size();
    std::vector<int> sizes(static_cast<std::size_t>(in.segments()) * G);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      sizes[i] = layout(in.store->length(in.sequence(static_cast<int>(i) / G))).pages;
    }
    out.resize(sizes);
    cache_.refresh(in, p.page_size);
    for (int s = 0; s < in.segments(); ++s) {
      const int P = sizes[static_cast<std::size_t>(s) * G];
      group_bounds(in, s, P, std::span<float>(out.values.data() + out.offsets[static_cast<std::size_t>(s) * G],
                                              static_cast<std::size_t>(G) * P));
    }
  }

  // Drops the cached digest of one head-sequence (its request was reset: a new prompt at the same
  // positions would otherwise look like an append), or of all.
  void forget(std::int64_t seq) { cache_.digests.erase(seq); }
  void forget() { cache_.digests.clear(); }

 private:
  using digest = cpu::page_digests;

  // rows [G, P]: segment s's query heads' bounds of its pages; pages past the known tokens
  // (a layout one token ahead) score 0.
  template <class Store>
  void group_bounds(const score_input<Store>& in, int s, int P, std::span<float> rows) const {
    const model_shape& sh = in.store->shape();
    const int G = sh.group_size();
    const int d = sh.head_dim;
    const int r = s / sh.kv_heads;
    const int h = s % sh.kv_heads;
    const digest& dg = cache_.digests.at(in.sequence(s));
    const int known = (dg.length + p.page_size - 1) / p.page_size;
    const auto& q = in.queries[r];
    for (int g = 0; g < G; ++g) {
      const float* qv = q.row(q.tokens - 1, h * G + g);
      for (int pg = 0; pg < P; ++pg) {
        rows[static_cast<std::size_t>(g) * P + pg] =
            pg < known ? cpu::page_bound(qv, dg.kmin.data() + static_cast<std::size_t>(pg) * d,
                                         dg.kmax.data() + static_cast<std::size_t>(pg) * d, d)
                       : 0.0f;
      }
    }
  }

  mutable cpu::digest_cache cache_;  // per head-sequence
};
static_assert(Scorer<freekv_pages>);

}  // namespace kvsift::score
