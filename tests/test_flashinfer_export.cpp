// SPDX-License-Identifier: Apache-2.0
// The FlashInfer export of a plan over a paged store (kvsift/store/flashinfer.hpp), checked
// against the store itself: every exported index names the physical row or page of the pool
// that holds the kept slot's key and value (bytes compared through key_pool() / value_pool()),
// a FlashInfer-style reader (paged_kv_view, one head) of the table reads exactly the kept
// tokens in order, and bad plans are rejected with kvsift::error. Ragged batch: requests of
// different lengths, one empty, KV heads of different lengths after retain, pages handed out
// interleaved and reused out of order.

#include <kvsift/core/view.hpp>
#include <kvsift/method/baselines.hpp>
#include <kvsift/store/flashinfer.hpp>
#include <kvsift/store/paged.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

namespace {

using kvsift::bfloat16;

// A paged store filled so that pages are interleaved between head-sequences and reused out of
// order: round-robin chunks over (request, layer), then a retain that frees pages in the middle of
// the pool and gives the KV heads different lengths, then more chunks that take the freed pages.
template <class T>
struct paged_batch {
  kvsift::model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  int page_size = 4;
  std::vector<int> lengths{13, 0, 6, 9};  // per request, before the retain
  kvsift::store::paged<T> store{shape, 4, page_size, 64};
  std::mt19937 rng;

  explicit paged_batch(std::uint32_t seed) : rng(seed) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int H = shape.kv_heads;
    const int d = shape.head_dim;
    auto append = [&](int r, int l, int n) {
      std::vector<T> k(static_cast<std::size_t>(n) * H * d), v(k.size());
      for (auto& x : k) x = kvsift::from_float<T>(nd(rng));
      for (auto& x : v) x = kvsift::from_float<T>(nd(rng));
      using view = kvsift::kv_view<const T, kvsift::nhd>;
      store.append(r, l, view::contiguous(k.data(), n, H, d), view::contiguous(v.data(), n, H, d),
                   store.next_position(r, l));
    };
    for (int round = 0; round * 3 < 13; ++round) {
      for (int r = 0; r < 4; ++r) {
        for (int l = 0; l < shape.layers; ++l) {
          const int n = std::min(3, lengths[r] - round * 3);
          if (n > 0) append(r, l, n);
        }
      }
    }
    // Request 0, layer 1: head 0 keeps 5 of 13 slots, head 1 keeps 2 (pages go back to the pool).
    kvsift::index_sets kept;
    kept.push_back(std::vector<std::int32_t>{0, 3, 4, 9, 12});
    kept.push_back(std::vector<std::int32_t>{1, 11});
    store.retain(0, 1, kept);
    // More tokens: request 2 and 0 grow into the freed pages (the free list is a stack).
    append(2, 1, 7);
    append(0, 1, 6);
    append(3, 1, 2);
  }

  [[nodiscard]] std::int64_t seq(int r, int layer, int h) const { return shape.sequence(r, layer, h); }
};

// A random ascending subset of [0, n): each element with probability `p`, `last` forced in or out
// (-1: random) so plans both keep and skip a head-sequence's last (partial) page.
std::vector<std::int32_t> subset(std::mt19937& rng, int n, double p, int last = -1) {
  std::bernoulli_distribution keep(p);
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i) {
    const bool k = (i == n - 1 && last >= 0) ? last == 1 : keep(rng);
    if (k) out.push_back(i);
  }
  return out;
}

template <class T>
bool same_row(const T* a, const T* b, int d) {
  return std::memcmp(a, b, sizeof(T) * d) == 0;
}

template <class T>
const T* pool_row(const T* pool, std::int64_t row, int d) {
  return pool + row * d;
}

}  // namespace

TEMPLATE_TEST_CASE("flashinfer export: the pages really are out of order and interleaved",
                   "[flashinfer]", float, bfloat16) {
  paged_batch<TestType> b(7);
  const auto t0 = b.store.page_table(0, 1);
  const auto t2 = b.store.page_table(2, 1);
  // Head-sequences of request 0 / layer 1 and request 2 / layer 1 hold pages that are neither
  // contiguous nor ascending: the export cannot get away with "page = first + i".
  bool unordered = false;
  for (const auto* t : {&t0, &t2}) {
    for (std::size_t i = 1; i < t->indices.size(); ++i) {
      if (t->indices[i] != t->indices[i - 1] + 1) unordered = true;
    }
  }
  REQUIRE(unordered);
  REQUIRE(b.store.length(0, 1, 0) != b.store.length(0, 1, 1));
}

TEMPLATE_TEST_CASE("flashinfer export, tokens form: each index is the kept slot's physical row",
                   "[flashinfer]", float, bfloat16) {
  using T = TestType;
  const std::uint32_t seed = GENERATE(1u, 2u, 3u);
  const int layer = GENERATE(0, 1);
  CAPTURE(seed, layer);
  paged_batch<T> b(seed);
  const auto& sh = b.shape;
  const int d = sh.head_dim;
  const std::vector<int> requests{3, 0, 1, 2};  // not in id order; request 1 is empty
  kvsift::index_sets slots;
  for (const int r : requests) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      const int n = b.store.length(r, layer, h);
      slots.push_back(r == 3 && h == 1 ? std::vector<std::int32_t>{}  // kept nothing
                                       : subset(b.rng, n, 0.5));
    }
  }
  const auto t = kvsift::flashinfer_tokens(b.store, layer, requests, slots);
  REQUIRE(t.page_size == 1);
  REQUIRE(t.entries() == static_cast<int>(requests.size()) * sh.kv_heads);
  REQUIRE(t.indptr == slots.offsets);
  REQUIRE(t.indices.size() == slots.values.size());
  REQUIRE(t.last_page_len.size() == static_cast<std::size_t>(t.entries()));

  // A FlashInfer reader: pool as [rows, 1, 1 head, d], one batch entry per (request, KV head).
  const int rows = (b.store.used_pages() + b.store.free_pages()) * b.page_size;
  kvsift::paged_kv_view<const T, kvsift::paged_nhd> kv{
      b.store.key_pool(), rows, 1, 1, d, t.entries(), t.indptr.data(), t.indices.data(),
      t.last_page_len.data()};
  auto vv = kv;
  vv.data = b.store.value_pool();
  REQUIRE_NOTHROW(kv.validate("test", "kv", 1, d));
  for (int s = 0; s < t.entries(); ++s) {
    const int r = requests[s / sh.kv_heads];
    const int h = s % sh.kv_heads;
    const auto seq = b.seq(r, layer, h);
    const auto kept = slots[s];
    CAPTURE(s, r, h, kept.size());
    REQUIRE(t.last_page_len[s] == (kept.empty() ? 0 : 1));
    REQUIRE(t.seq_len(s) == static_cast<int>(kept.size()));
    REQUIRE(kv.length(s) == static_cast<int>(kept.size()));
    for (std::size_t i = 0; i < kept.size(); ++i) {
      const std::int32_t row = t.indices[t.indptr[s] + i];
      CAPTURE(i, kept[i], row);
      REQUIRE(row >= 0);
      REQUIRE(row < rows);
      REQUIRE(same_row(pool_row(b.store.key_pool(), row, d), b.store.key(seq, kept[i]), d));
      REQUIRE(same_row(pool_row(b.store.value_pool(), row, d), b.store.value(seq, kept[i]), d));
      REQUIRE(same_row(kv.row(s, static_cast<int>(i), 0), b.store.key(seq, kept[i]), d));
      REQUIRE(same_row(vv.row(s, static_cast<int>(i), 0), b.store.value(seq, kept[i]), d));
    }
  }
  // No row is named twice across the batch (distinct (request, head) entries).
  std::set<std::int32_t> distinct(t.indices.begin(), t.indices.end());
  REQUIRE(distinct.size() == t.indices.size());
}

TEMPLATE_TEST_CASE("flashinfer export, pages form: kept pages, the last one possibly partial",
                   "[flashinfer]", float, bfloat16) {
  using T = TestType;
  const std::uint32_t seed = GENERATE(1u, 2u, 3u, 4u);
  const int layer = GENERATE(0, 1);
  CAPTURE(seed, layer);
  paged_batch<T> b(seed);
  const auto& sh = b.shape;
  const int d = sh.head_dim;
  const int ps = b.page_size;
  const std::vector<int> requests{2, 1, 0, 3};
  kvsift::index_sets pages;
  int e = 0;
  for (const int r : requests) {
    for (int h = 0; h < sh.kv_heads; ++h, ++e) {
      const int np = (b.store.length(r, layer, h) + ps - 1) / ps;
      pages.push_back(subset(b.rng, np, 0.5, e % 2));  // alternately keep / skip the last page
    }
  }
  const auto t = kvsift::flashinfer_pages(b.store, layer, requests, pages, ps);
  REQUIRE(t.page_size == ps);
  REQUIRE(t.indptr == pages.offsets);
  const int total_pages = b.store.used_pages() + b.store.free_pages();
  kvsift::paged_kv_view<const T, kvsift::paged_nhd> kv{
      b.store.key_pool(), total_pages, ps, 1, d, t.entries(), t.indptr.data(), t.indices.data(),
      t.last_page_len.data()};
  auto vv = kv;
  vv.data = b.store.value_pool();
  REQUIRE_NOTHROW(kv.validate("test", "kv", 1, d));
  bool partial_kept = false;
  bool partial_skipped = false;
  for (int s = 0; s < t.entries(); ++s) {
    const int r = requests[s / sh.kv_heads];
    const int h = s % sh.kv_heads;
    const auto seq = b.seq(r, layer, h);
    const int n = b.store.length(seq);
    const auto kept = pages[s];
    CAPTURE(s, r, h, n, kept.size());
    // Tokens the plan keeps: the kept pages' rows, counted from the store's length alone.
    std::vector<std::int32_t> slots;
    for (const int p : kept) {
      for (int o = 0; o < ps && p * ps + o < n; ++o) slots.push_back(p * ps + o);
    }
    if (!kept.empty() && kept.back() == (n + ps - 1) / ps - 1 && n % ps != 0) partial_kept = true;
    if (!kept.empty() && kept.back() != (n + ps - 1) / ps - 1) partial_skipped = true;
    REQUIRE(t.seq_len(s) == static_cast<int>(slots.size()));
    REQUIRE(kv.length(s) == static_cast<int>(slots.size()));
    REQUIRE(t.last_page_len[s] ==
            (kept.empty() ? 0 : static_cast<int>(slots.size()) - (static_cast<int>(kept.size()) - 1) * ps));
    for (std::size_t i = 0; i < kept.size(); ++i) {
      const std::int32_t page = t.indices[t.indptr[s] + i];
      REQUIRE(page >= 0);
      REQUIRE(page < total_pages);
      for (int o = 0; o < ps && kept[i] * ps + o < n; ++o) {
        CAPTURE(i, kept[i], page, o);
        const std::int64_t row = static_cast<std::int64_t>(page) * ps + o;
        REQUIRE(same_row(pool_row(b.store.key_pool(), row, d), b.store.key(seq, kept[i] * ps + o), d));
        REQUIRE(same_row(pool_row(b.store.value_pool(), row, d), b.store.value(seq, kept[i] * ps + o), d));
      }
    }
    // What FlashInfer reads for this entry, token by token, is the kept tokens in order.
    for (std::size_t j = 0; j < slots.size(); ++j) {
      CAPTURE(j, slots[j]);
      REQUIRE(same_row(kv.row(s, static_cast<int>(j), 0), b.store.key(seq, slots[j]), d));
      REQUIRE(same_row(vv.row(s, static_cast<int>(j), 0), b.store.value(seq, slots[j]), d));
    }
  }
  CHECK(partial_kept);
  CHECK(partial_skipped);
}

TEST_CASE("flashinfer export: a whole-page plan and the store's own page table agree",
          "[flashinfer]") {
  // Keeping every page of every head must reproduce store::paged::page_table exactly.
  paged_batch<float> b(11);
  const int layer = 1;
  const std::vector<int> requests{0, 1, 2, 3};
  kvsift::index_sets all;
  for (const int r : requests) {
    for (int h = 0; h < b.shape.kv_heads; ++h) {
      std::vector<std::int32_t> p((b.store.length(r, layer, h) + b.page_size - 1) / b.page_size);
      for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>(i);
      all.push_back(p);
    }
  }
  const auto t = kvsift::flashinfer_pages(b.store, layer, requests, all, b.page_size);
  std::size_t at = 0;
  for (const int r : requests) {
    const auto pt = b.store.page_table(r, layer);
    for (int h = 0; h < b.shape.kv_heads; ++h) {
      const int s = static_cast<int>(at);
      CAPTURE(r, h);
      REQUIRE(std::vector<std::int32_t>(t.indices.begin() + t.indptr[s], t.indices.begin() + t.indptr[s + 1]) ==
              std::vector<std::int32_t>(pt.indices.begin() + pt.indptr[h], pt.indices.begin() + pt.indptr[h + 1]));
      REQUIRE(t.last_page_len[s] == pt.last_page_len[h]);
      ++at;
    }
  }
}

TEST_CASE("flashinfer export rejects bad plans, naming argument, value and expectation",
          "[flashinfer][bad_input]") {
  using Catch::Matchers::ContainsSubstring;
  paged_batch<float> b(5);
  const int layer = 0;
  const std::vector<int> requests{0, 2};  // lengths 13 and 6: 4 and 2 pages of 4
  auto good_slots = [] {
    kvsift::index_sets s;
    s.push_back(std::vector<std::int32_t>{0, 12});
    s.push_back(std::vector<std::int32_t>{});
    s.push_back(std::vector<std::int32_t>{5});
    s.push_back(std::vector<std::int32_t>{1, 2});
    return s;
  };
  auto good_pages = [] {
    kvsift::index_sets s;
    s.push_back(std::vector<std::int32_t>{0, 3});
    s.push_back(std::vector<std::int32_t>{});
    s.push_back(std::vector<std::int32_t>{1});
    s.push_back(std::vector<std::int32_t>{0});
    return s;
  };
  REQUIRE_NOTHROW(kvsift::flashinfer_tokens(b.store, layer, requests, good_slots()));
  REQUIRE_NOTHROW(kvsift::flashinfer_pages(b.store, layer, requests, good_pages(), 4));
  const auto tokens = [&](const std::vector<int>& req, int l, const kvsift::index_sets& s) {
    return kvsift::flashinfer_tokens(b.store, l, req, s);
  };
  const auto pages = [&](const kvsift::index_sets& s, int ps) {
    return kvsift::flashinfer_pages(b.store, layer, requests, s, ps);
  };

  REQUIRE_THROWS_WITH(tokens({0, 4}, layer, good_slots()),
                      ContainsSubstring("'requests[1]' = 4") && ContainsSubstring("in [0, 4)"));
  REQUIRE_THROWS_WITH(tokens(requests, 2, good_slots()),
                      ContainsSubstring("'layer' = 2") && ContainsSubstring("in [0, 2)"));
  REQUIRE_THROWS_WITH(tokens({0}, layer, good_slots()),
                      ContainsSubstring("'slots.segments' = 4") && ContainsSubstring("(2)"));
  {
    auto s = good_slots();
    s.values[1] = 13;  // slot past the head-sequence's 13 tokens
    REQUIRE_THROWS_WITH(tokens(requests, layer, s),
                        ContainsSubstring("'slots[0][1]' = 13") && ContainsSubstring("[0, 13)"));
  }
  {
    auto s = good_slots();
    s.values[4] = 1;  // entry 3: {1, 1}
    REQUIRE_THROWS_WITH(tokens(requests, layer, s),
                        ContainsSubstring("'slots[3][1]' = 1") && ContainsSubstring("strictly ascending"));
  }
  {
    auto s = good_slots();
    s.offsets[2] = 1;  // offsets 0 2 1 ...: decreasing
    REQUIRE_THROWS_WITH(tokens(requests, layer, s),
                        ContainsSubstring("'slots.offsets[2]' = 1"));
  }
  {
    auto s = good_slots();
    s.values.push_back(3);  // one value too many for offsets.back()
    REQUIRE_THROWS_WITH(tokens(requests, layer, s), ContainsSubstring("offsets.back"));
  }
  REQUIRE_THROWS_WITH(pages(good_pages(), 8),
                      ContainsSubstring("'page_size' = 8") && ContainsSubstring("tokens form"));
  {
    auto s = good_pages();
    s.values[2] = 2;  // entry 2 (request 2, head 0) has 2 pages
    REQUIRE_THROWS_WITH(pages(s, 4),
                        ContainsSubstring("'pages[2][0]' = 2") && ContainsSubstring("[0, 2)"));
  }
  {
    kvsift::head_pages hp = kvsift::page_lists(b.store, layer, requests);
    hp.lengths[1] = 20;  // does not fill the entry's 4 pages
    REQUIRE_THROWS_WITH(kvsift::flashinfer_tokens(hp, good_slots()),
                        ContainsSubstring("'head_pages.lengths[1]' = 20"));
  }
}

TEST_CASE("flashinfer export of a Quest decode plan over a paged store", "[flashinfer]") {
  // A real page plan: Quest with pages of the store's page size, a ragged batch of three
  // requests decoded together. Its pages form and its slots in the tokens form must name the
  // same pool rows, in the same order.
  using store_t = kvsift::store::paged<float>;
  const kvsift::model_shape sh{.layers = 1, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  const int ps = 4;
  store_t s(sh, 3, ps, 64);
  kvsift::quest<store_t> m(s, kvsift::quest_params<store_t>(/*budget=*/8, ps, /*dense_layers=*/0));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto fill = [&](std::size_t n) {
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    return x;
  };
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  const std::vector<int> lengths{13, 6, 23};
  for (int r = 0; r < 3; ++r) {
    const auto k = fill(static_cast<std::size_t>(lengths[r]) * sh.kv_heads * sh.head_dim);
    const auto v = fill(k.size());
    m.prefill(0, {.request = r,
                  .keys = view::contiguous(k.data(), lengths[r], sh.kv_heads, sh.head_dim),
                  .values = view::contiguous(v.data(), lengths[r], sh.kv_heads, sh.head_dim),
                  .queries = {}});
  }
  const auto q = fill(3u * sh.q_heads * sh.head_dim);
  const auto k = fill(3u * sh.kv_heads * sh.head_dim);
  const auto v = fill(k.size());
  std::vector<kvsift::decode_token<float>> tokens;
  for (const int r : {2, 0, 1}) {
    tokens.push_back({.request = r,
                      .query = q.data() + r * sh.q_heads * sh.head_dim,
                      .key = k.data() + r * sh.kv_heads * sh.head_dim,
                      .value = v.data() + r * sh.kv_heads * sh.head_dim});
  }
  // example-begin flashinfer-export
  const kvsift::attention_plan& plan = m.decode(/*layer=*/0, tokens);
  // Quest keeps pages of the store's page size: hand FlashInfer physical pages...
  const kvsift::flashinfer_table tp =
      kvsift::flashinfer_pages(s, /*layer=*/0, plan.requests, plan.pages, /*page_size=*/ps);
  // ...or, for any plan, physical rows (page_size 1).
  const kvsift::flashinfer_table tt =
      kvsift::flashinfer_tokens(s, /*layer=*/0, plan.requests, plan.slots);
  // example-end flashinfer-export
  REQUIRE(plan.pages.segments() == 3 * sh.kv_heads);
  bool selective = false;
  for (int e = 0; e < tp.entries(); ++e) {
    CAPTURE(e);
    std::vector<std::int32_t> rows;
    for (int i = tp.indptr[e]; i < tp.indptr[e + 1]; ++i) {
      const int n = i + 1 == tp.indptr[e + 1] ? tp.last_page_len[e] : ps;
      for (int o = 0; o < n; ++o) rows.push_back(tp.indices[i] * ps + o);
    }
    REQUIRE(rows == std::vector<std::int32_t>(tt.indices.begin() + tt.indptr[e],
                                              tt.indices.begin() + tt.indptr[e + 1]));
    const auto seq = sh.sequence(plan.requests[e / sh.kv_heads], 0, e % sh.kv_heads);
    if (tp.seq_len(e) < s.length(seq)) selective = true;
  }
  REQUIRE(selective);  // the plan really drops pages somewhere
}
