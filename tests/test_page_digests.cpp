// SPDX-License-Identifier: Apache-2.0
// cpu::page_digests, the page digest cache of Quest's and FreeKV's page scorers
// (score/page_minmax.hpp): equal to a digest from scratch through appends and compactions, and
// no reallocation of the cache when decode steps complete pages after a prompt's prefill (a
// cache sized exactly by the prefill copied and faulted in every head-sequence's digests at the
// first page a decode step completed: a 7-8 ms step among 1.4 ms ones, docs/performance.md
// "2026-12-02"). And cpu::page_bounds, Quest's page scores of a GQA group: page_bound's bits on
// every path; cpu::page_digest: std::min / std::max's bits on every path.

#include <kvsift/cpu/simd.hpp>
#include <kvsift/score/page_minmax.hpp>
#include <kvsift/store/paged.hpp>

#include <catch2/catch_test_macros.hpp>

#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

using kvsift::model_shape;

constexpr int kPage = 16;

// Appends `tokens` tokens at positions first.. to `request`, layer 0: keys vary with position,
// head and channel.
void append(kvsift::store::paged<float>& s, int first, int tokens, int request = 0) {
  const auto& sh = s.shape();
  std::vector<float> k(static_cast<std::size_t>(tokens) * sh.kv_heads * sh.head_dim);
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      for (int c = 0; c < sh.head_dim; ++c) {
        k[(static_cast<std::size_t>(t) * sh.kv_heads + h) * sh.head_dim + c] =
            std::sin(0.37f * static_cast<float>(first + t) + 1.3f * h + 0.11f * c);
      }
    }
  }
  const std::vector<float> v(k.size(), 0.5f);
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  s.append(request, 0, view::contiguous(k.data(), tokens, sh.kv_heads, sh.head_dim),
           view::contiguous(v.data(), tokens, sh.kv_heads, sh.head_dim), first);
}

// The cached digest of seq equals page_digest over the store's tokens from scratch.
void require_fresh(const kvsift::cpu::page_digests& dg, const kvsift::store::paged<float>& s,
                   std::int64_t seq) {
  const int n = s.length(seq);
  const int d = s.shape().head_dim;
  const std::size_t size = static_cast<std::size_t>((n + kPage - 1) / kPage) * d;
  std::vector<float> kmin(size), kmax(size);
  kvsift::cpu::page_digest(s, seq, kPage, kmin, kmax);
  REQUIRE(dg.length == n);
  REQUIRE(dg.kmin == kmin);
  REQUIRE(dg.kmax == kmax);
}

}  // namespace

TEST_CASE("page_digests: equal to a digest from scratch through appends and a compaction") {
  const model_shape sh{1, 2, 1, 8};
  kvsift::store::paged<float> s(sh, 1, kPage, 64);
  const std::int64_t seq = sh.sequence(0, 0, 0);
  kvsift::cpu::page_digests dg;
  append(s, 0, 37);  // two full pages and a partial one
  dg.refresh(s, seq, kPage);
  require_fresh(dg, s, seq);
  for (int t = 37; t < 70; ++t) {  // decode steps: the partial page fills, new ones start
    append(s, t, 1);
    dg.refresh(s, seq, kPage);
    require_fresh(dg, s, seq);
  }
  // a compaction moves tokens between pages: the cache starts again from page 0
  kvsift::index_sets kept;
  std::vector<std::int32_t> slots;
  for (int j = 0; j < s.length(seq); j += 3) slots.push_back(j);
  kept.push_back(slots);
  s.retain(0, 0, kept);
  dg.refresh(s, seq, kPage);
  require_fresh(dg, s, seq);
  append(s, 70, 5);
  dg.refresh(s, seq, kPage);
  require_fresh(dg, s, seq);
}

TEST_CASE("page_digests: decode steps after a prefill complete pages without reallocating") {
  const model_shape sh{1, 4, 2, 16};
  const int prompt = 64 * kPage;
  kvsift::store::paged<float> s(sh, 1, kPage, 2 * (prompt / kPage) * 4);
  const std::int64_t seq = sh.sequence(0, 0, 1);
  kvsift::cpu::page_digests dg;
  append(s, 0, prompt);  // the prompt: whole pages, as a prefill leaves them
  dg.refresh(s, seq, kPage);
  const float* kmin = dg.kmin.data();
  const float* kmax = dg.kmax.data();
  for (int t = prompt; t < prompt + 8 * kPage; ++t) {  // eight more pages, a token a step
    append(s, t, 1);
    dg.refresh(s, seq, kPage);
  }
  REQUIRE(dg.kmin.data() == kmin);
  REQUIRE(dg.kmax.data() == kmax);
  require_fresh(dg, s, seq);
}

TEST_CASE("page_bounds: page_bound's bits for every head and page, on every vector path") {
  using kvsift::cpu::simd;
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int d : {8, 64, 128, 12}) {  // 12: no vector path (d % 8 != 0)
    for (const int G : {1, 3, 4, 5, 8}) {
      for (const int pages : {1, 2, 7}) {
        std::vector<float> q(static_cast<std::size_t>(G) * d), kmin(static_cast<std::size_t>(pages) * d),
            kmax(kmin.size());
        for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7f * static_cast<float>(i) + 0.1f * G);
        for (std::size_t i = 0; i < kmin.size(); ++i) {
          const float a = std::sin(1.3f * static_cast<float>(i) + 0.2f * d);
          const float b = std::cos(0.9f * static_cast<float>(i) - 0.3f * pages);
          kmin[i] = std::min(a, b) * 3.0f;
          kmax[i] = std::max(a, b) * 3.0f;
        }
        // the cases page_bound's `a < b ? b : a` decides by operand order: signed zeros, NaN,
        // infinities, and a page of zeros whose bound is -0 + 0
        q[0] = -0.0f;
        kmin[1 % d] = -0.0f;
        kmax[1 % d] = 0.0f;
        if (d > 4) {
          q[2] = nan;
          kmax[3] = inf;
          kmin[4] = -inf;
        }
        std::vector<const float*> heads;
        for (int g = 0; g < G; ++g) heads.push_back(q.data() + static_cast<std::size_t>(g) * d);
        if (pages > 1) {
          std::fill(kmin.begin() + d, kmin.begin() + 2 * d, -0.0f);
          std::fill(kmax.begin() + d, kmax.begin() + 2 * d, -0.0f);
        }
        for (const simd level : {simd::portable, simd::avx2, simd::avx512}) {
          if (level > kvsift::cpu::detected_simd()) continue;
          const std::size_t ld = static_cast<std::size_t>(pages) + 3;  // rows' stride > pages
          std::vector<float> rows(static_cast<std::size_t>(G) * ld, 42.0f);
          kvsift::cpu::page_bounds(heads.data(), G, kmin.data(), kmax.data(), pages, d, rows.data(),
                                   ld, level);
          for (int g = 0; g < G; ++g) {
            for (int j = 0; j < pages; ++j) {
              const float want = kvsift::cpu::page_bound(heads[g], kmin.data() + static_cast<std::size_t>(j) * d,
                                                         kmax.data() + static_cast<std::size_t>(j) * d, d);
              const float got = rows[static_cast<std::size_t>(g) * ld + j];
              INFO("d " << d << " G " << G << " page " << j << " head " << g << " level "
                        << kvsift::cpu::simd_name(level));
              REQUIRE(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want));
            }
            for (std::size_t j = static_cast<std::size_t>(pages); j < ld; ++j) {
              REQUIRE(rows[static_cast<std::size_t>(g) * ld + j] == 42.0f);  // nothing past pages
            }
          }
        }
      }
    }
  }
}

namespace {

// page_digest on one vector path against a plain loop: per page and channel, std::min and
// std::max over the page's rows in row order, bit for bit (a zero's sign is decided by the
// operands' order), for pages shorter and longer than a vector's rows and head dims with and
// without a whole vector.
template <class T>
void check_digest_paths() {
  using kvsift::cpu::simd;
  for (const int d : {8, 12, 24, 64, 72, 128, 136}) {  // whole vectors, tails, both
    for (const int page : {5, 16, 40}) {
      const model_shape sh{1, 1, 1, d};
      kvsift::store::paged<T> s(sh, 1, page, 8);
      const std::int64_t seq = sh.sequence(0, 0, 0);
      const int n = 3 * page + 2;  // three full pages and a partial one
      std::vector<T> k(static_cast<std::size_t>(n) * d), v(k.size(), T(0.5f));
      for (int t = 0; t < n; ++t) {
        for (int c = 0; c < d; ++c) {
          float x = 4.0f * std::sin(0.37f * static_cast<float>(t) + 0.11f * static_cast<float>(c));
          if ((t + c) % 7 == 0 || c % 5 == 1) x = t % 2 ? -0.0f : 0.0f;  // c % 5 == 1: zeros only
          k[static_cast<std::size_t>(t) * d + c] = T(x);
        }
      }
      using view = kvsift::kv_view<const T, kvsift::nhd>;
      s.append(0, 0, view::contiguous(k.data(), n, 1, d), view::contiguous(v.data(), n, 1, d), 0);
      const int pages = (n + page - 1) / page;
      const std::size_t size = static_cast<std::size_t>(pages) * d;
      std::vector<float> want_min(size, std::numeric_limits<float>::infinity());
      std::vector<float> want_max(size, -std::numeric_limits<float>::infinity());
      for (int t = 0; t < n; ++t) {
        const std::size_t at = static_cast<std::size_t>(t / page) * d;
        for (int c = 0; c < d; ++c) {
          const float x = kvsift::to_float(s.key(seq, t)[c]);
          want_min[at + c] = std::min(want_min[at + c], x);
          want_max[at + c] = std::max(want_max[at + c], x);
        }
      }
      for (const simd level : {simd::portable, simd::avx2, simd::avx512}) {
        if (level > kvsift::cpu::detected_simd()) continue;
        const kvsift::cpu::scoped_simd pin(level);
        std::vector<float> kmin(size, 42.0f), kmax(size, 42.0f);
        kvsift::cpu::page_digest(s, seq, page, kmin, kmax);
        for (std::size_t i = 0; i < size; ++i) {
          INFO("d " << d << " page " << page << " at " << i << " level " << kvsift::cpu::simd_name(level));
          REQUIRE(std::bit_cast<std::uint32_t>(kmin[i]) == std::bit_cast<std::uint32_t>(want_min[i]));
          REQUIRE(std::bit_cast<std::uint32_t>(kmax[i]) == std::bit_cast<std::uint32_t>(want_max[i]));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("page_digest: std::min / std::max's bits on every vector path, f32, f16 and bf16 keys") {
  check_digest_paths<float>();
  check_digest_paths<kvsift::half>();
  check_digest_paths<kvsift::bfloat16>();
}

namespace {

// An engine's executor that runs a loop's odd items on a thread of its own and the even ones on
// the caller's: counts the loops and the items handed to it.
class split_executor final : public kvsift::cpu::executor {
 public:
  void bulk(std::int64_t n, void (*body)(void*, std::int64_t), void* ctx) override {
    ++loops;
    items += n;
    std::thread odd([&] {
      for (std::int64_t i = 1; i < n; i += 2) body(ctx, i);
    });
    for (std::int64_t i = 0; i < n; i += 2) body(ctx, i);
    odd.join();
  }
  std::atomic<int> loops{0};
  std::atomic<std::int64_t> items{0};
};

}  // namespace

TEST_CASE("digest_cache: a prompt's digests on the engine's executor, a decode step's on the caller") {
  const model_shape sh{1, 4, 2, 128};
  kvsift::store::paged<float> s(sh, 2, kPage, 4 * 80);  // 80 pages per head-sequence
  const int prompt = 1100;  // 2 x 2 head-sequences x 1100 tokens x 128 channels: a parallel loop
  append(s, 0, prompt, 0);
  append(s, 0, prompt, 1);
  const std::vector<int> requests{0, 1, 0};  // request 0 twice: its digests refreshed once
  kvsift::score_input<kvsift::store::paged<float>> in{&s, 0, kvsift::lifecycle_event::prefill_end,
                                                      requests, {}, {}, {}};
  kvsift::cpu::digest_cache cache;
  split_executor exec;
  const kvsift::cpu::scoped_threading on_exec(exec);
  cache.refresh(in, kPage);
  REQUIRE(exec.loops == 1);
  REQUIRE(exec.items == 4);  // 6 segments, 4 head-sequences: each refreshed once
  REQUIRE(cache.digests.size() == 4);
  for (int r = 0; r < 2; ++r) {
    for (int h = 0; h < 2; ++h) require_fresh(cache.digests.at(sh.sequence(r, 0, h)), s, sh.sequence(r, 0, h));
  }
  // a decode step: one token per request, one page each to refresh, on the calling thread
  append(s, prompt, 1, 0);
  append(s, prompt, 1, 1);
  cache.refresh(in, kPage);
  REQUIRE(exec.loops == 1);
  for (int r = 0; r < 2; ++r) {
    for (int h = 0; h < 2; ++h) require_fresh(cache.digests.at(sh.sequence(r, 0, h)), s, sh.sequence(r, 0, h));
  }
}
