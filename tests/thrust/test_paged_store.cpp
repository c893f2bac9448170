// SPDX-License-Identifier: Apache-2.0
// thrust::paged_store (thrust/paged_store.hpp): a paged KV cache over exec::sim memory. Its laws:
// after the same appends, retains and resets it holds what store::dense holds (rows read through
// its page tables, positions, lengths, next positions, in slot order), side columns move with
// their rows; it holds exactly ceil(row_extent / P) pages per head-sequence (its tokens and at
// most one waiting hole), so a retain returns pages to the one pool that every request shares
// and another request takes them; an append the pool cannot serve is refused with nothing changed (admission); a one-token eviction moves no
// row and returns no page, and the next append fills its hole; once warm, a decode-like step
// allocates nothing and reads nothing back; over an engine's pool it writes the engine's memory;
// its page lists (thrust::page_lists) export every engine's index format of a plan, each naming
// exactly the plan's rows (attention over each equals attention over the plan).
// Under the CPP system always, and OMP in OpenMP builds.

#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/engine_tables.hpp>
#include <kvsift/thrust/engine_tables.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/flashinfer.hpp>
#include <kvsift/thrust/paged_store.hpp>
#include <kvsift/thrust/plan.hpp>

#include <thrust/device_vector.h>

#include "../engine_rows.hpp"

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <tuple>
#include <vector>

namespace {

namespace exec = kvsift::exec;
using kvsift::model_shape;
using kvsift::nhd;
using kvsift::thrust::buffer;
using kvsift::thrust::copy_to_device;
using kvsift::thrust::sim_arena;
using Catch::Matchers::ContainsSubstring;

#if defined(_OPENMP)
using store_execs = std::tuple<exec::sim_cpp, exec::sim_omp>;
#else
using store_execs = std::tuple<exec::sim_cpp>;
#endif

// Column 0 := f(sequence, position) for every slot: a value that did not move with its row shows.
struct mark_fn {
  float* column;
  const std::int32_t* positions;
  std::int64_t capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t row) const {
    column[row] = static_cast<float>(positions[row]) * 0.5f + static_cast<float>(row / capacity);
  }
};

// Reads n values at a device pointer (the test's inspection of sim memory, not counted).
template <class U>
std::vector<U> peek(const U* p, std::int64_t n) {
  return std::vector<U>(p, p + n);
}

std::vector<float> random_rows(std::mt19937& rng, int tokens, int heads, int d) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(tokens) * heads * d);
  for (float& f : x) f = u(rng);
  return x;
}

template <class E>
struct fixture {
  model_shape shape{2, 4, 2, 8};  // layers, q_heads, kv_heads, head_dim
  int requests = 3;
  int capacity = 40;
  int page = 6;
  int pool;
  sim_arena arena;
  E e{arena};
  kvsift::thrust::paged_store<float, E> dev;
  kvsift::store::dense<float> ref{shape, requests, capacity};
  buffer<float, E> k_in{e, static_cast<std::size_t>(capacity) * shape.kv_heads * shape.head_dim};
  buffer<float, E> v_in{e, k_in.size()};
  buffer<std::int32_t, E> kept_in{e, static_cast<std::size_t>(shape.kv_heads) * capacity};

  explicit fixture(int pool_pages = 0, float* keys = nullptr, float* values = nullptr)
      : pool(pool_pages > 0 ? pool_pages : 3 * 2 * 2 * 7),
        dev(e, shape, requests, capacity, page, pool, 1, keys, values) {}

  void append(int r, int l, const std::vector<float>& k, const std::vector<float>& v, int tokens,
              std::int32_t first) {
    const int H = shape.kv_heads, d = shape.head_dim;
    copy_to_device(e, std::span<const float>(k), k_in);
    copy_to_device(e, std::span<const float>(v), v_in);
    using dview = kvsift::kv_view<const float, nhd, typename E::memory_space>;
    dev.append(r, l, dview::contiguous(k_in.data(), tokens, H, d),
               dview::contiguous(v_in.data(), tokens, H, d), first);
    ref.append(r, l, kvsift::kv_view<const float, nhd>::contiguous(k.data(), tokens, H, d),
               kvsift::kv_view<const float, nhd>::contiguous(v.data(), tokens, H, d), first);
  }
  void mark_column() {
    ::thrust::for_each_n(e.policy(), ::thrust::counting_iterator<std::int64_t>(0),
                         dev.sequences() * capacity, mark_fn{dev.column(0), dev.positions(), capacity});
  }
  void retain(int r, int l, const kvsift::index_sets& kept) {
    std::vector<int> counts;
    for (int h = 0; h < kept.segments(); ++h) counts.push_back(static_cast<int>(kept.size(h)));
    copy_to_device(e, std::span<const std::int32_t>(kept.values), kept_in);
    dev.retain(r, l, counts, kept_in.data());
    ref.retain(r, l, kept);
  }
  // Every resident row (through the row map and the page table), position and column value
  // equals the reference's; each head-sequence holds ceil(row_extent / P) distinct pages, none
  // shared, its slots in distinct rows below the extent, which is its length or (a waiting hole)
  // one more.
  void expect_equal() {
    const int d = shape.head_dim;
    const auto table = peek(dev.page_table(), dev.sequences() * dev.table_stride());
    const auto row_map = peek(dev.row_map(), dev.sequences() * capacity);
    const auto keys = peek(dev.key_pool(), static_cast<std::int64_t>(pool) * page * d);
    const auto values = peek(dev.value_pool(), static_cast<std::int64_t>(pool) * page * d);
    const auto positions = peek(dev.positions(), dev.sequences() * capacity);
    const auto column = peek(dev.column(0), dev.sequences() * capacity);
    std::vector<int> owner(static_cast<std::size_t>(pool), -1);
    int held = 0;
    for (std::int64_t seq = 0; seq < dev.sequences(); ++seq) {
      REQUIRE(dev.length(seq) == ref.length(seq));
      const int extent = dev.row_extent(seq);
      REQUIRE((extent == ref.length(seq) || extent == ref.length(seq) + 1));
      const int pages = (extent + page - 1) / page;
      held += pages;
      for (int p = 0; p < pages; ++p) {
        const int id = table[seq * dev.table_stride() + p];
        REQUIRE(id >= 0);
        REQUIRE(id < pool);
        REQUIRE(owner[id] == -1);  // no page held twice
        owner[id] = static_cast<int>(seq);
      }
      std::vector<char> used(static_cast<std::size_t>(extent), 0);
      for (int i = 0; i < ref.length(seq); ++i) {
        const std::size_t slot = static_cast<std::size_t>(seq) * capacity + i;
        const int r = row_map[slot];
        REQUIRE(r >= 0);
        REQUIRE(r < extent);
        REQUIRE(used[r] == 0);
        used[r] = 1;
        if (dev.rows_in_slot_order(seq)) REQUIRE(r == i);
        const std::size_t row =
            static_cast<std::size_t>(table[seq * dev.table_stride() + r / page]) * page + r % page;
        REQUIRE(positions[slot] == ref.position(seq, i));
        REQUIRE(std::equal(keys.begin() + row * d, keys.begin() + (row + 1) * d, ref.key(seq, i)));
        REQUIRE(std::equal(values.begin() + row * d, values.begin() + (row + 1) * d, ref.value(seq, i)));
        REQUIRE(column[slot] == static_cast<float>(ref.position(seq, i)) * 0.5f + static_cast<float>(seq));
      }
    }
    REQUIRE(dev.used_pages() == held);
    REQUIRE(dev.free_pages() == pool - held);
    REQUIRE(dev.resident_tokens() == ref.resident_tokens());
    REQUIRE(dev.resident_bytes() == static_cast<std::int64_t>(held) * page * 2 * d * 4);
    for (int r = 0; r < requests; ++r) {
      for (int l = 0; l < shape.layers; ++l) REQUIRE(dev.next_position(r, l) == ref.next_position(r, l));
    }
  }
};

// One random operation on both stores: an append of 1-8 tokens (sometimes a gap in positions), a
// retain (per head: about two thirds of its slots, all but one, or all), or a reset.
template <class F>
void random_op(F& f, std::mt19937& rng) {
  const int H = f.shape.kv_heads, d = f.shape.head_dim;
  const int r = static_cast<int>(rng() % f.requests);
  const int l = static_cast<int>(rng() % f.shape.layers);
  const int kind = static_cast<int>(rng() % 10);
  int room = f.capacity;
  for (int h = 0; h < H; ++h) room = std::min(room, f.capacity - f.ref.length(f.shape.sequence(r, l, h)));
  if (kind < 5 && room > 0) {
    const int tokens = 1 + static_cast<int>(rng() % std::min(room, 8));
    const std::int32_t first = f.ref.next_position(r, l) + static_cast<int>(rng() % 3);
    f.append(r, l, random_rows(rng, tokens, H, d), random_rows(rng, tokens, H, d), tokens, first);
    f.mark_column();
  } else if (kind < 9) {
    // heads release about a third of their slots, exactly one (a decode step's eviction: it
    // leaves a hole), or none, mixed within one call
    kvsift::index_sets kept;
    for (int h = 0; h < H; ++h) {
      const int n = f.ref.length(f.shape.sequence(r, l, h));
      const int how = static_cast<int>(rng() % 4);
      const int gone = n > 0 ? static_cast<int>(rng() % n) : 0;
      std::vector<std::int32_t> slots;
      for (int i = 0; i < n; ++i) {
        if (how == 0 ? rng() % 3 != 0 : how == 3 || i != gone) slots.push_back(i);
      }
      kept.push_back(slots);
    }
    f.retain(r, l, kept);
  } else {
    f.ref.reset(r);
    f.dev.reset(r);
  }
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("thrust::paged_store equals store::dense over random appends, retains and "
                        "resets; pages are exactly ceil(row_extent / P) per head-sequence",
                        "[thrust][paged_store]", store_execs) {
  fixture<TestType> f;
  std::mt19937 rng(7);
  for (int op = 0; op < 300; ++op) {
    random_op(f, rng);
    f.expect_equal();
  }
  REQUIRE_NOTHROW(f.dev.check());
}

TEMPLATE_LIST_TEST_CASE("thrust::paged_store: pages an eviction frees admit another request; a "
                        "request the pool cannot serve is refused with nothing changed",
                        "[thrust][paged_store]", store_execs) {
  // a pool of 8 pages of 6: request 0 takes them all (2 layers x 2 heads x 2 pages of 12 tokens)
  fixture<TestType> f(8);
  std::mt19937 rng(5);
  const int H = f.shape.kv_heads, d = f.shape.head_dim;
  for (int l = 0; l < 2; ++l) f.append(0, l, random_rows(rng, 12, H, d), random_rows(rng, 12, H, d), 12, 0);
  f.mark_column();
  REQUIRE(f.dev.free_pages() == 0);
  // request 1 does not fit: refused, every table, length and page unchanged
  const auto table = peek(f.dev.page_table(), f.dev.sequences() * f.dev.table_stride());
  REQUIRE_THROWS_WITH(
      f.append(1, 0, random_rows(rng, 3, H, d), random_rows(rng, 3, H, d), 3, 0),
      ContainsSubstring("pages in the pool: 2 needed, 0 free"));
  CHECK(peek(f.dev.page_table(), f.dev.sequences() * f.dev.table_stride()) == table);
  f.expect_equal();
  // request 0's layer 0 keeps 5 of 12 tokens per head: one page each returns to the pool
  kvsift::index_sets kept;
  for (int h = 0; h < H; ++h) kept.push_back(std::vector<std::int32_t>{0, 1, 4, 9, 11});
  f.retain(0, 0, kept);
  f.expect_equal();
  REQUIRE(f.dev.free_pages() == 2);
  // now request 1 fits in the freed pages, and its rows are right
  f.append(1, 0, random_rows(rng, 6, H, d), random_rows(rng, 6, H, d), 6, 0);
  f.mark_column();
  f.expect_equal();
  REQUIRE(f.dev.free_pages() == 0);
  // the store's capacity for a head-sequence is what its table and the pool allow
  CHECK(f.dev.capacity(f.shape.sequence(1, 0, 0)) == 6);
  CHECK(f.dev.pages_to_append(f.shape.sequence(0, 0, 0), 1) == 0);  // 5 tokens in a page of 6
  CHECK(f.dev.pages_to_append(f.shape.sequence(0, 0, 0), 2) == 1);
  // a reset returns every page of the request
  f.ref.reset(0);
  f.dev.reset(0);
  f.expect_equal();
  REQUIRE(f.dev.free_pages() == 6);
  REQUIRE_NOTHROW(f.dev.check());
}

TEMPLATE_LIST_TEST_CASE("thrust::paged_store: bad input is refused before anything changes",
                        "[thrust][paged_store][bad_input]", store_execs) {
  using E = TestType;
  fixture<E> f;
  std::mt19937 rng(9);
  const int H = f.shape.kv_heads, d = f.shape.head_dim;
  f.append(0, 0, random_rows(rng, 7, H, d), random_rows(rng, 7, H, d), 7, 0);
  f.mark_column();
  const int before = f.dev.used_pages();
  std::vector<int> counts{8, 7};  // more than the head holds
  REQUIRE_THROWS_WITH(f.dev.retain(0, 0, counts, f.kept_in.data()), ContainsSubstring("kept_counts"));
  REQUIRE_THROWS_AS(f.append(0, 0, random_rows(rng, 1, H, d), random_rows(rng, 1, H, d), 1, 3),
                    kvsift::error);  // a position behind the next one
  REQUIRE_THROWS_AS(f.dev.reset(5), kvsift::error);
  CHECK(f.dev.used_pages() == before);
  f.expect_equal();
  REQUIRE_THROWS_AS((kvsift::thrust::paged_store<float, E>(f.e, f.shape, 1, 16, 0, 4)), kvsift::error);
  REQUIRE_THROWS_AS((kvsift::thrust::paged_store<float, E>(f.e, f.shape, 1, 16, 4, 0)), kvsift::error);
}

TEMPLATE_LIST_TEST_CASE("thrust::paged_store: once warm, a decode-like step (append one token, "
                        "evict one) allocates nothing and reads nothing back",
                        "[thrust][paged_store]", store_execs) {
  fixture<TestType> f;
  std::mt19937 rng(3);
  const int H = f.shape.kv_heads, d = f.shape.head_dim;
  f.append(0, 1, random_rows(rng, 16, H, d), random_rows(rng, 16, H, d), 16, 0);
  const auto k = random_rows(rng, 1, H, d);
  copy_to_device(f.e, std::span<const float>(k), f.k_in);
  std::vector<std::int32_t> kept;
  for (int h = 0; h < H; ++h) {
    for (int i = 1; i <= 16; ++i) kept.push_back(i);  // drop slot 0 of 17
  }
  copy_to_device(f.e, std::span<const std::int32_t>(kept), f.kept_in);
  using dview = kvsift::kv_view<const float, nhd, typename TestType::memory_space>;
  const std::vector<int> counts(static_cast<std::size_t>(H), 16);
  for (int t = 0; t < 40; ++t) {
    const auto before = f.arena.counters();
    f.dev.append(0, 1, dview::contiguous(f.k_in.data(), 1, H, d), dview::contiguous(f.k_in.data(), 1, H, d),
                 16 + t);
    f.dev.retain(0, 1, counts, f.kept_in.data());
    const auto after = f.arena.counters();
    CHECK(after.allocations == before.allocations);
    CHECK(after.d2h_reads == before.d2h_reads);
    CHECK(f.dev.used_pages() == H * 3);  // 16 tokens in pages of 6, per head
  }
  REQUIRE_NOTHROW(f.dev.check());
}

TEMPLATE_LIST_TEST_CASE("thrust::paged_store over an engine's pool writes the engine's pages",
                        "[thrust][paged_store]", store_execs) {
  using E = TestType;
  sim_arena engine_arena;
  const E engine{engine_arena};
  const int pool = 40, page = 6, d = 8;
  buffer<float, E> keys(engine, static_cast<std::size_t>(pool) * page * d);
  buffer<float, E> values(engine, keys.size());
  fixture<E> f(pool, keys.data(), values.data());
  REQUIRE(f.dev.key_pool() == keys.data());
  REQUIRE(f.dev.value_pool() == values.data());
  std::mt19937 rng(2);
  const int H = f.shape.kv_heads;
  f.append(2, 1, random_rows(rng, 9, H, d), random_rows(rng, 9, H, d), 9, 0);
  f.mark_column();
  f.expect_equal();  // reads the rows from key_pool(): the engine's buffer
  // the store's own allocations hold no pool: what a store owning its pool allocates, less it
  const kvsift::thrust::paged_store<float, E> owning(f.e, f.shape, f.requests, f.capacity, page, pool, 1);
  CHECK(f.dev.allocated_bytes() == owning.allocated_bytes() - keys.bytes() - values.bytes());
  REQUIRE_THROWS_WITH((kvsift::thrust::paged_store<float, E>(f.e, f.shape, 1, 16, page, pool, 0,
                                                              keys.data(), nullptr)),
                      ContainsSubstring("both engine pools or neither"));
}

namespace {

// Softmax attention in double of one query over rows given as (key, value) pointers.
std::vector<double> attend(const std::vector<float>& q, const std::vector<std::pair<const float*, const float*>>& rows) {
  const std::size_t d = q.size();
  std::vector<double> out(d, 0.0);
  if (rows.empty()) return out;
  std::vector<double> logit(rows.size());
  double top = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double dot = 0.0;
    for (std::size_t c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * rows[i].first[c];
    logit[i] = dot / std::sqrt(static_cast<double>(d));
    top = std::max(top, logit[i]);
  }
  double sum = 0.0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double w = std::exp(logit[i] - top);
    sum += w;
    for (std::size_t c = 0; c < d; ++c) out[c] += w * rows[i].second[c];
  }
  for (double& x : out) x /= sum;
  return out;
}

using kvsift_test::rows_of;

}  // namespace

TEMPLATE_LIST_TEST_CASE("thrust::paged_store exports every engine's index format: attention over "
                        "each equals attention over the plan",
                        "[thrust][paged_store][flashinfer][engine_tables]", store_execs) {
  using dvec = ::thrust::device_vector<std::int32_t>;
  fixture<TestType> f;
  std::mt19937 rng(11);
  const int d = f.shape.head_dim, P = f.page;
  const auto policy = f.e.policy();
  int exported = 0, page_rounds = 0, hole_rounds = 0;
  for (int round = 0; round < 60; ++round) {
    for (int op = 0; op < 6; ++op) random_op(f, rng);
    const int l = static_cast<int>(rng() % f.shape.layers);
    std::vector<int> batch(static_cast<std::size_t>(f.requests));
    std::iota(batch.begin(), batch.end(), 0);
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(rng() % (batch.size() + 1));  // 0 .. all requests, in any order
    const auto hp = kvsift::thrust::page_lists<dvec>(f.dev, l, batch);
    REQUIRE(hp.entries() == static_cast<int>(batch.size()) * f.shape.kv_heads);

    // a token plan and a page plan per entry, and the slots each reads
    kvsift::index_sets slots, pages;
    std::vector<std::vector<int>> want_tokens, want_pages;
    std::vector<std::int64_t> seqs;
    for (const int r : batch) {
      for (int h = 0; h < f.shape.kv_heads; ++h) {
        const auto seq = f.shape.sequence(r, l, h);
        const int n = f.ref.length(seq);
        std::vector<std::int32_t> s, p;
        std::vector<int> ws, wp;
        for (int i = 0; i < n; ++i) {
          if (rng() % 2 == 0) {
            s.push_back(i);
            ws.push_back(i);
          }
        }
        for (int pg = 0; pg * P < n; ++pg) {
          if (rng() % 3 != 0) {
            p.push_back(pg);
            for (int i = pg * P; i < std::min(n, (pg + 1) * P); ++i) wp.push_back(i);
          }
        }
        slots.push_back(s);
        pages.push_back(p);
        want_tokens.push_back(ws);
        want_pages.push_back(wp);
        seqs.push_back(seq);
      }
    }
    const auto keys = peek(f.dev.key_pool(), static_cast<std::int64_t>(f.pool) * P * d);
    const auto values = peek(f.dev.value_pool(), static_cast<std::int64_t>(f.pool) * P * d);
    const std::int64_t pool_rows = static_cast<std::int64_t>(f.pool) * P;
    const auto tokens_t = kvsift::thrust::flashinfer_tokens(policy, hp, kvsift::thrust::to_device<dvec>(slots));
    // the pages form names whole store pages: only while every entry's rows are in slot order
    const bool in_order = hp.row_indptr.empty();
    kvsift::thrust::device_flashinfer_table<dvec> pages_t;
    if (in_order) {
      pages_t = kvsift::thrust::flashinfer_pages(policy, hp, kvsift::thrust::to_device<dvec>(pages), P);
      ++page_rounds;
    } else {
      REQUIRE_THROWS_WITH(kvsift::thrust::flashinfer_pages(policy, hp, kvsift::thrust::to_device<dvec>(pages), P),
                          ContainsSubstring("head_pages.rows"));
      ++hole_rounds;
    }
    for (const bool page_form : {false, true}) {
      if (page_form && !in_order) continue;
      INFO("round " << round << (page_form ? " pages form" : " tokens form"));
      const auto& dt = page_form ? pages_t : tokens_t;
      const auto& want = page_form ? want_pages : want_tokens;
      const auto table = kvsift::thrust::to_host(dt);
      const auto blocks = kvsift::thrust::block_tables(policy, dt);
      const auto padded = kvsift::thrust::block_tables(policy, dt, -1);
      const auto mask = kvsift::thrust::kv_mask<::thrust::device_vector<float>>(policy, dt, pool_rows);
      for (std::size_t s = 0; s < seqs.size(); ++s) {
        const int e = static_cast<int>(s);
        std::vector<float> q(static_cast<std::size_t>(d));
        for (float& x : q) x = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
        std::vector<std::pair<const float*, const float*>> plan_rows;
        for (const int i : want[s]) plan_rows.emplace_back(f.ref.key(seqs[s], i), f.ref.value(seqs[s], i));
        const auto expect = attend(q, plan_rows);
        const auto check = [&](const std::vector<std::int64_t>& rows, const char* format) {
          INFO(format << " entry " << s);
          REQUIRE(rows.size() == want[s].size());
          std::vector<std::pair<const float*, const float*>> got_rows;
          for (const auto r : rows) {
            REQUIRE(r >= 0);
            REQUIRE(r < pool_rows);
            got_rows.emplace_back(keys.data() + r * d, values.data() + r * d);
          }
          const auto got = attend(q, got_rows);
          for (int c = 0; c < d; ++c) REQUIRE(std::abs(got[c] - expect[c]) <= 1e-12 * (1.0 + std::abs(expect[c])));
        };
        check(rows_of(table, e), "flashinfer");
        check(rows_of(blocks, e, false), "block tables");
        check(rows_of(padded, e, true), "padded pages");
        check(rows_of(mask, e), "kv mask");
        exported += static_cast<int>(want[s].size());
      }
    }
  }
  REQUIRE(exported > 500);  // the rounds exported real plans, not only empty ones
  REQUIRE(page_rounds > 5);  // both forms, over rows in order and out of order
  REQUIRE(hole_rounds > 5);

  // a request or layer out of range is named
  REQUIRE_THROWS_WITH(kvsift::thrust::page_lists<dvec>(f.dev, 0, std::vector<int>{0, f.requests}),
                      ContainsSubstring("requests[1]"));
  REQUIRE_THROWS_WITH(kvsift::thrust::page_lists<dvec>(f.dev, f.shape.layers, std::vector<int>{0}),
                      ContainsSubstring("'layer'"));
}

TEMPLATE_LIST_TEST_CASE("thrust::paged_store: a one-token eviction leaves a hole that the next "
                        "append fills; a larger round compacts and returns pages",
                        "[thrust][paged_store]", store_execs) {
  fixture<TestType> f;
  std::mt19937 rng(5);
  const int H = f.shape.kv_heads, d = f.shape.head_dim, P = f.page;
  const int r = 1, l = 0;
  f.append(r, l, random_rows(rng, 12, H, d), random_rows(rng, 12, H, d), 12, 0);  // 2 pages a head
  f.mark_column();
  const std::int64_t elems = static_cast<std::int64_t>(f.pool) * P * d;
  const int used = f.dev.used_pages();
  REQUIRE(used == 2 * H);

  // a decode step's eviction: head 0 releases slot 3, head 1 its last slot; nothing moves
  const auto keys_before = peek(f.dev.key_pool(), elems);
  const auto values_before = peek(f.dev.value_pool(), elems);
  kvsift::index_sets one;
  std::vector<std::int32_t> k0, k1;
  for (int i = 0; i < 12; ++i) {
    if (i != 3) k0.push_back(i);
    if (i != 11) k1.push_back(i);
  }
  one.push_back(k0);
  one.push_back(k1);
  f.retain(r, l, one);
  f.expect_equal();
  CHECK(peek(f.dev.key_pool(), elems) == keys_before);
  CHECK(peek(f.dev.value_pool(), elems) == values_before);
  CHECK(f.dev.used_pages() == used);
  for (int h = 0; h < H; ++h) {
    const auto seq = f.shape.sequence(r, l, h);
    CHECK(f.dev.length(seq) == 11);
    CHECK(f.dev.row_extent(seq) == 12);
  }
  CHECK_FALSE(f.dev.rows_in_slot_order(f.shape.sequence(r, l, 0)));

  // the next token fills each hole: no page taken, one row written per head, and it is the hole
  f.append(r, l, random_rows(rng, 1, H, d), random_rows(rng, 1, H, d), 1, 12);
  f.mark_column();
  f.expect_equal();
  CHECK(f.dev.used_pages() == used);
  const auto keys_after = peek(f.dev.key_pool(), elems);
  const auto row_map = peek(f.dev.row_map(), f.dev.sequences() * f.capacity);
  std::int64_t changed_rows = 0;
  for (std::int64_t row = 0; row < static_cast<std::int64_t>(f.pool) * P; ++row) {
    changed_rows += !std::equal(keys_after.begin() + row * d, keys_after.begin() + (row + 1) * d,
                                keys_before.begin() + row * d);
  }
  CHECK(changed_rows == H);
  for (int h = 0; h < H; ++h) {
    const auto seq = f.shape.sequence(r, l, h);
    CHECK(f.dev.row_extent(seq) == 12);
    // slot 11 (the new token) is in the released row: row 3 for head 0 (its rows were in slot
    // order), row 11 for head 1
    CHECK(row_map[seq * f.capacity + 11] == (h == 0 ? 3 : 11));
  }

  // a second eviction in a row with no hole waiting leaves another; two at once compact
  f.retain(r, l, one);
  f.expect_equal();
  CHECK(f.dev.used_pages() == used);
  kvsift::index_sets two;
  two.push_back(std::vector<std::int32_t>{0, 2, 4, 5, 6, 7, 8, 9, 10});
  two.push_back(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6});
  f.retain(r, l, two);
  f.expect_equal();
  CHECK(f.dev.used_pages() == 2 + 1);  // ceil(9 / 6) + ceil(6 / 6): the other pages returned
  for (int h = 0; h < H; ++h) {
    CHECK(f.dev.rows_in_slot_order(f.shape.sequence(r, l, h)));
    CHECK(f.dev.row_extent(f.shape.sequence(r, l, h)) == f.dev.length(f.shape.sequence(r, l, h)));
  }
  // a reset returns the pages of a request whose rows hold a hole too
  f.retain(r, l, [&] {
    kvsift::index_sets s1;
    s1.push_back(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
    s1.push_back(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5});
    return s1;
  }());
  f.ref.reset(r);
  f.dev.reset(r);
  f.expect_equal();
  CHECK(f.dev.used_pages() == 0);
  REQUIRE_NOTHROW(f.dev.check());
}

TEMPLATE_LIST_TEST_CASE("thrust::paged_store: bad kept slots in every retain mode are raised by "
                        "check(), memory stays consistent, and a hole fills with no page free",
                        "[thrust][paged_store]", store_execs) {
  using E = TestType;
  const int H = 2, d = 8;
  for (const int mode : {0, 1, 2}) {  // the bad list's head: compacts, leaves a hole, unchanged
    INFO("mode " << mode);
    fixture<E> f;
    std::mt19937 rng(9 + static_cast<std::uint32_t>(mode));
    f.append(0, 0, random_rows(rng, 10, H, d), random_rows(rng, 10, H, d), 10, 0);
    // head 0: a list the host cannot tell from a good one (right count), bad on the device
    std::vector<std::int32_t> bad;
    const int count = mode == 0 ? 5 : mode == 1 ? 9 : 10;
    for (int i = 0; i < count; ++i) bad.push_back(i == 1 ? 7 : i == 2 ? 0 : i);  // out of order
    std::vector<std::int32_t> good;  // head 1 keeps its first 8
    for (int i = 0; i < 8; ++i) good.push_back(i);
    std::vector<std::int32_t> all = bad;
    all.insert(all.end(), good.begin(), good.end());
    copy_to_device(f.e, std::span<const std::int32_t>(all), f.kept_in);
    const std::vector<int> counts{count, 8};
    f.dev.retain(0, 0, counts, f.kept_in.data());
    CHECK_THROWS_AS(f.dev.check(), kvsift::error);
    CHECK_NOTHROW(f.dev.check());  // raised once
    // the counts hold and the pages match them; every slot's row is below the extent
    const auto row_map = peek(f.dev.row_map(), f.dev.sequences() * f.capacity);
    for (int h = 0; h < H; ++h) {
      const auto seq = f.shape.sequence(0, 0, h);
      CHECK(f.dev.length(seq) == counts[h]);
      const int extent = f.dev.row_extent(seq);
      std::vector<char> used(static_cast<std::size_t>(extent), 0);
      for (int i = 0; i < counts[h]; ++i) {
        const int r = row_map[seq * f.capacity + i];
        REQUIRE(r >= 0);
        REQUIRE(r < extent);
        // a compacting head rewrites its rows in slot order; the others keep the flagged list's
        // rows (in range, perhaps repeated: the data is lost, the memory is not)
        if (h == 1 || mode == 0) CHECK(used[r] == 0);
        used[r] = 1;
      }
    }
    // the store goes on: a reset returns every page
    f.dev.reset(0);
    CHECK(f.dev.used_pages() == 0);
  }

  // a token that fills a hole needs no page: taken with the pool empty
  fixture<E> f(/*pool_pages=*/4);  // 4 pages of 6: two heads of 12 tokens
  std::mt19937 rng(3);
  f.append(2, 1, random_rows(rng, 12, H, d), random_rows(rng, 12, H, d), 12, 0);
  f.mark_column();
  REQUIRE(f.dev.free_pages() == 0);
  for (int h = 0; h < H; ++h) CHECK(f.dev.capacity(f.shape.sequence(2, 1, h)) == 12);
  REQUIRE_THROWS_WITH(f.append(2, 1, random_rows(rng, 1, H, d), random_rows(rng, 1, H, d), 1, 12),
                      ContainsSubstring("pages in the pool"));
  kvsift::index_sets one;
  for (int h = 0; h < H; ++h) {
    std::vector<std::int32_t> k;
    for (int i = 0; i < 12; ++i) {
      if (i != 5 + h) k.push_back(i);
    }
    one.push_back(k);
  }
  f.dev.retain(2, 1, std::vector<int>{11, 11}, [&] {
    std::vector<std::int32_t> flat;
    for (int h = 0; h < H; ++h) flat.insert(flat.end(), one[h].begin(), one[h].end());
    copy_to_device(f.e, std::span<const std::int32_t>(flat), f.kept_in);
    return f.kept_in.data();
  }());
  CHECK(f.dev.free_pages() == 0);  // the hole holds its page
  // the refused append left its token in k_in / v_in: it goes in now, into the holes
  REQUIRE_NOTHROW(f.dev.append(2, 1,
                               kvsift::kv_view<const float, nhd, typename E::memory_space>::contiguous(
                                   f.k_in.data(), 1, H, d),
                               kvsift::kv_view<const float, nhd, typename E::memory_space>::contiguous(
                                   f.v_in.data(), 1, H, d),
                               12));
  CHECK(f.dev.free_pages() == 0);
  for (int h = 0; h < H; ++h) {
    const auto seq = f.shape.sequence(2, 1, h);
    CHECK(f.dev.length(seq) == 12);
    CHECK(f.dev.row_extent(seq) == 12);
  }
  REQUIRE_NOTHROW(f.dev.check());
}
