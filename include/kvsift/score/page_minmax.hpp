// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/cpu/simd.hpp>
#include <kvsift/score/context.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvsift::cpu {

// One key row into a page's running per-channel min and max, through std::min / std::max's
// comparison (x < m ? x : m), so a NaN channel keeps what it had, as in a plain loop. The key row
// never aliases the digest, so the loop vectorises; the AVX-512 copy is the same loop compiled
// for that path (cpu/simd.hpp), chosen once per digest where the CPU has it.
#define KVSIFT_DIGEST_ROW_BODY                 \
  for (int c = 0; c < d; ++c) {                \
    const float x = to_float(k[c]);            \
    mn[c] = x < mn[c] ? x : mn[c];             \
    mx[c] = mx[c] < x ? x : mx[c];             \
  }
template <class T>
inline void digest_row(const T* __restrict k, float* __restrict mn, float* __restrict mx, int d) {
  KVSIFT_DIGEST_ROW_BODY
}
#if KVSIFT_HAVE_X86_SIMD_PATH
template <class T>
KVSIFT_TARGET_AVX512 void digest_row_avx512(const T* __restrict k, float* __restrict mn,
                                            float* __restrict mx, int d) {
  KVSIFT_DIGEST_ROW_BODY
}
#endif
#undef KVSIFT_DIGEST_ROW_BODY

// Per page and channel min and max of a head-sequence's keys: pages of `page_size` slots from
// slot 0, the last one possibly partial. kmin, kmax: [pages, d].
// Pages before `first_page` are left as they are (an incremental update after appends).
template <class Store>
void page_digest(const Store& store, std::int64_t seq, int page_size, std::span<float> kmin,
                 std::span<float> kmax, int first_page = 0) {
  const int n = store.length(seq);
  const int d = store.shape().head_dim;
  const int pages = (n + page_size - 1) / page_size;
#if KVSIFT_HAVE_X86_SIMD_PATH
  const bool wide = active_simd() >= simd::avx512;
#endif
  for (int pg = first_page; pg < pages; ++pg) {
    float* mn = kmin.data() + static_cast<std::size_t>(pg) * d;
    float* mx = kmax.data() + static_cast<std::size_t>(pg) * d;
    std::fill(mn, mn + d, std::numeric_limits<float>::infinity());
    std::fill(mx, mx + d, -std::numeric_limits<float>::infinity());
    for (int j = pg * page_size; j < std::min(n, (pg + 1) * page_size); ++j) {
#if KVSIFT_HAVE_X86_SIMD_PATH
      if (wide) {
        digest_row_avx512(store.key(seq, j), mn, mx, d);
        continue;
      }
#endif
      digest_row(store.key(seq, j), mn, mx, d);
    }
  }
}

// Quest's upper bound of q . k over a page: sum_c max(q_c * kmax_c, q_c * kmin_c) (no scale).
inline float page_bound(const float* q, const float* kmin, const float* kmax, int d) {
  return kvsift::page_bound(q, kmin, kmax, d);
}

namespace detail {

#if KVSIFT_HAVE_X86_SIMD_PATH
// out[g * ld + j] = page_bound(q[g], kmin + j * d, kmax + j * d, d) for GC <= 4 heads and the P
// pages at kmin / kmax, bit for bit: lane l of an 8-wide accumulator sums the channels c = l (mod 8) by two multiplies, a
// max(b, a) (MAXPS returns its second operand unless the first is greater: page_bound's
// `a < b ? b : a`, NaN and signed zeros included) and an add, as page_bound's acc[l] does; the
// lanes then combine in combine8's pairs. Compiled without FMA (nothing to fuse in any case).
template <int GC, int P>
KVSIFT_TARGET_AVX2_NOFMA void page_bounds_block(const float* const* q, const float* kmin,
                                                const float* kmax, int d, float* out,
                                                std::size_t ld) {
  __m256 acc[P][GC];
  KVSIFT_UNROLL
  for (int p = 0; p < P; ++p) {
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) acc[p][g] = _mm256_setzero_ps();
  }
  for (int c = 0; c < d; c += 8) {
    __m256 hi[P], lo[P];
    KVSIFT_UNROLL
    for (int p = 0; p < P; ++p) {
      hi[p] = _mm256_loadu_ps(kmax + static_cast<std::size_t>(p) * d + c);
      lo[p] = _mm256_loadu_ps(kmin + static_cast<std::size_t>(p) * d + c);
    }
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) {
      const __m256 qv = _mm256_loadu_ps(q[g] + c);
      KVSIFT_UNROLL
      for (int p = 0; p < P; ++p) {
        const __m256 a = _mm256_mul_ps(qv, hi[p]);
        const __m256 b = _mm256_mul_ps(qv, lo[p]);
        acc[p][g] = _mm256_add_ps(acc[p][g], _mm256_max_ps(b, a));
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    for (int g = 0; g < GC; ++g) {
      // (a0 + a4, a1 + a5, a2 + a6, a3 + a7), then ((b0 + b1) + (b2 + b3)): combine8
      const __m128 b = _mm_add_ps(_mm256_castps256_ps128(acc[p][g]), _mm256_extractf128_ps(acc[p][g], 1));
      __m128 h = _mm_hadd_ps(b, b);
      h = _mm_hadd_ps(h, h);
      const float tail = 0.0f;  // d % 8 == 0: page_bound's empty tail, still added (-0 + 0 = +0)
      out[static_cast<std::size_t>(g) * ld + p] = _mm_cvtss_f32(h) + tail;
    }
  }
}
#endif

}  // namespace detail

// rows[g * ld + j] = page_bound(q[g], kmin + j * d, kmax + j * d, d) for g < G and j < pages, bit
// for bit, each page's digest read once for the whole group (four heads at a time, two pages at
// a time on AVX2: eight independent chains), where a loop per head re-reads every digest G times.
inline void page_bounds(const float* const* q, int G, const float* kmin, const float* kmax,
                        int pages, int d, float* rows, std::size_t ld, simd level = active_simd()) {
#if KVSIFT_HAVE_X86_SIMD_PATH
  if (level >= simd::avx2 && d % 8 == 0) {
    for (int g0 = 0; g0 < G; g0 += 4) {
      detail::with_heads<4>(std::min(4, G - g0), [&]<int GC>() {
        int j = 0;
        for (; j + 2 <= pages; j += 2) {
          const std::size_t at = static_cast<std::size_t>(j) * d;
          detail::page_bounds_block<GC, 2>(q + g0, kmin + at, kmax + at, d,
                                           rows + static_cast<std::size_t>(g0) * ld + j, ld);
        }
        if (j < pages) {
          const std::size_t at = static_cast<std::size_t>(j) * d;
          detail::page_bounds_block<GC, 1>(q + g0, kmin + at, kmax + at, d,
                                           rows + static_cast<std::size_t>(g0) * ld + j, ld);
        }
      });
    }
    return;
  }
#endif
  (void)level;
  for (int j = 0; j < pages; ++j) {
    const float* mn = kmin + static_cast<std::size_t>(j) * d;
    const float* mx = kmax + static_cast<std::size_t>(j) * d;
    for (int g = 0; g < G; ++g) rows[static_cast<std::size_t>(g) * ld + j] = page_bound(q[g], mn, mx, d);
  }
}

// A head-sequence's cached page digests (Quest's and FreeKV's page scorers), brought up to the
// store's tokens by refresh(): while the store only appends, from the last cached page on (the
// one that was partial); after a compaction, from page 0. Growing past its capacity, the cache
// reserves twice what it needs: the reserve is address space until a page is digested into it,
// and a cache sized exactly by the prompt's prefill otherwise reallocated, copied and faulted in
// every head-sequence's digests at the first page a decode step completes (a 32K bf16 Quest
// step of 1.4 ms took 7-8 ms there, every request, on a 2-core Intel Xeon VM:
// docs/performance.md, "2026-12-02").
struct page_digests {
  std::vector<float> kmin, kmax;  // [pages, d]
  int length = 0;                 // tokens the digest covers
  std::int32_t last_position = -1;

  // The first page refresh() recomputes: while the store only appended, the page of the first
  // token since the last refresh; else (a compaction, a new prompt) page 0.
  template <class Store>
  [[nodiscard]] int first_stale_page(const Store& store, std::int64_t seq, int page_size) const {
    const int n = store.length(seq);
    const bool appended_only =
        length > 0 && length <= n && store.position(seq, length - 1) == last_position;
    return appended_only ? length / page_size : 0;
  }

  template <class Store>
  void refresh(const Store& store, std::int64_t seq, int page_size) {
    const int n = store.length(seq);
    const int d = store.shape().head_dim;
    const int pages = (n + page_size - 1) / page_size;
    const int first_page = first_stale_page(store, seq, page_size);
    const std::size_t need = static_cast<std::size_t>(pages) * d;
    if (need > kmin.capacity()) {
      kmin.reserve(2 * need);
      kmax.reserve(2 * need);
    }
    kmin.resize(need);
    kmax.resize(need);
    page_digest(store, seq, page_size, kmin, kmax, first_page);
    length = n;
    last_position = n > 0 ? store.position(seq, n - 1) : -1;
  }
};

// A page scorer's digest cache (Quest's, FreeKV's): one digest per head-sequence.
struct digest_cache {
  std::unordered_map<std::int64_t, page_digests> digests;
  std::vector<std::pair<page_digests*, std::int64_t>> stale;  // refresh()'s list, kept for its capacity

  // Brings the digests of the input's head-sequences up to the store's current tokens, before
  // any read of them: the entries are found (or made) serially, then each digest is refreshed
  // on its own, in parallel where there is a prompt's worth of work (a decode step's one-page
  // refreshes stay on the calling thread, off the engine's executor too); a sequence named twice
  // is refreshed once.
  template <class Store>
  void refresh(const score_input<Store>& in, int page_size) {
    stale.clear();
    std::int64_t most = 0;  // the most tokens one refresh reads
    for (int s = 0; s < in.segments(); ++s) {
      const auto seq = in.sequence(s);
      page_digests* dg = &digests[seq];  // unordered_map: stays put while later entries are added
      stale.emplace_back(dg, seq);
      most = std::max<std::int64_t>(
          most, in.store->length(seq) - dg->first_stale_page(*in.store, seq, page_size) * page_size);
    }
    const auto by_sequence = [](const auto& a, const auto& b) { return a.second < b.second; };
    const auto same_sequence = [](const auto& a, const auto& b) { return a.second == b.second; };
    std::sort(stale.begin(), stale.end(), by_sequence);
    stale.erase(std::unique(stale.begin(), stale.end(), same_sequence), stale.end());
    const auto n = static_cast<std::int64_t>(stale.size());
    const std::int64_t work = most * in.store->shape().head_dim;  // per head-sequence, at most
    const auto one = [&](std::int64_t i) {
      const auto [dg, seq] = stale[static_cast<std::size_t>(i)];
      dg->refresh(*in.store, seq, page_size);
    };
    if (n * work < parallel_threshold) {
      for (std::int64_t i = 0; i < n; ++i) one(i);
    } else {
      parallel_for(n, one, par, work);
    }
  }
};

}  // namespace kvsift::cpu

namespace kvsift::score {

// Page min-max bound — Quest (Tang et al., 2024). Pages of `page_size` tokens from token 0; each
// page's digest is the per-channel min and max of its keys; a query scores a page with
// sum_c max(q_c kmax_c, q_c kmin_c), and the G query heads of a group are reduced with `gqa`
// (default max). Parameters: page_size 16, GQA max. Cost: O(n d) digests, O(n/p d) per query.
struct page_minmax {
  using kvsift_role = scorer_tag;
  static constexpr hooks kvsift_hooks{.reset = true};
  using granularity = page_level;
  static constexpr bool needs_queries = true;
  struct params {
    int page_size = 16;
    gqa_reduce gqa = gqa_reduce::max;
  };
  params p{};

  page_minmax() = default;
  explicit page_minmax(params prm) : p(prm) {}

  [[nodiscard]] int query_window() const { return 1; }
  void validate(std::string_view where) const {
    require(p.page_size > 0, where, "page_size", p.page_size, "> 0");
  }

  // One score per page for the newest query of each request. Digests are cached per
  // head-sequence and, while the store only appends, updated from the last cached page on
  // (a decode step touches one page); after a compaction they are recomputed, and reset(request)
  // (method::reset) drops a request's. The cache is this instance's state: score() is not const,
  // and one instance serves one method (no two threads score through it at once).
  template <class Store>
  void score(const score_input<Store>& in, score_sets& out) {
    const model_shape& sh = in.store->shape();
    const int ps = p.page_size;
    layout_scores(in, out,
                  [&](int s) { return (in.store->length(in.sequence(s)) + ps - 1) / ps; });
    cache_.refresh(in, p.page_size);
    const int G = sh.group_size();
    cpu::parallel_for(in.segments(), [&](std::int64_t s) {
      const int pages = out.size(static_cast<int>(s));
      std::vector<float> rows(static_cast<std::size_t>(G) * pages);
      group_bounds(in, static_cast<int>(s), rows);
      cpu::reduce_group(rows, G, out[static_cast<int>(s)], p.gqa);
    }, cpu::par, static_cast<std::int64_t>(out.values.size()) / std::max(1, in.segments()) * G * sh.head_dim);
  }

  // Quest's per-query-head option: no GQA reduction, one segment per query head (request-major,
  // then query head h, which reads KV head h / G) holding its page scores, for a page selector
  // that keeps one page set per query head. Cost as score().
  template <class Store>
  void score_per_query_head(const score_input<Store>& in, score_sets& out) {
    const model_shape& sh = in.store->shape();
    const int ps = p.page_size;
    const int G = sh.group_size();
    std::vector<int> sizes(static_cast<std::size_t>(in.segments()) * G);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const int s = static_cast<int>(i) / G;
      sizes[i] = (in.store->length(in.sequence(s)) + ps - 1) / ps;
    }
    out.resize(sizes);
    cache_.refresh(in, p.page_size);
    cpu::parallel_for(in.segments(), [&](std::int64_t s) {
      const int pages = sizes[static_cast<std::size_t>(s) * G];
      std::span<float> rows(out.values.data() + out.offsets[static_cast<std::size_t>(s) * G],
                            static_cast<std::size_t>(G) * pages);
      group_bounds(in, static_cast<int>(s), rows);
    });
  }

  // A request ended: forget its head-sequences' digests (a new prompt in the same slot may
  // have the same positions and length, so nothing else could tell them apart).
  template <class Store>
  void reset(const Store& store, int request) {
    const model_shape& sh = store.shape();
    for (int l = 0; l < sh.layers; ++l) {
      for (int h = 0; h < sh.kv_heads; ++h) cache_.digests.erase(sh.sequence(request, l, h));
    }
  }

 private:
  using digest = cpu::page_digests;

  // rows [G, pages]: the bounds of segment s's pages for each query head of its group.
  template <class Store>
  void group_bounds(const score_input<Store>& in, int s, std::span<float> rows) const {
    const model_shape& sh = in.store->shape();
    const int G = sh.group_size();
    const int d = sh.head_dim;
    const int r = s / sh.kv_heads;
    const int h = s % sh.kv_heads;
    const auto seq = in.sequence(s);
    const int pages = (in.store->length(seq) + p.page_size - 1) / p.page_size;
    const auto it = cache_.digests.find(seq);  // refreshed before the parallel reads
    if (it == cache_.digests.end()) [[unlikely]] {
      throw make_error("score::page_minmax", "sequence", seq, "a refreshed page digest");
    }
    const digest& dg = it->second;
    const float* kmin = dg.kmin.data();
    const float* kmax = dg.kmax.data();
    const auto& q = in.queries[r];
    thread_local std::vector<const float*> heads;  // the group's newest query rows
    heads.resize(static_cast<std::size_t>(G));
    for (int g = 0; g < G; ++g) heads[g] = q.row(q.tokens - 1, h * G + g);
    cpu::page_bounds(heads.data(), G, kmin, kmax, pages, d, rows.data(),
                     static_cast<std::size_t>(pages));
  }

  cpu::digest_cache cache_;  // per head-sequence
};
static_assert(Scorer<page_minmax>);

}  // namespace kvsift::score
