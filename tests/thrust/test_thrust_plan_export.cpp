// SPDX-License-Identifier: Apache-2.0
// Device-resident plans (thrust/plan.hpp) and the Thrust FlashInfer export
// (thrust/flashinfer.hpp) against the host reference (store/flashinfer.hpp), under the device
// system this binary is compiled for (CPP or OMP) and under thrust::cpp::par. Laws: the device
// table equals the host table exactly (both forms, f32 and bf16 stores, ragged batches with
// empty entries and out-of-order pages); the host table names the rows holding the kept keys
// (bytes compared through key_pool()); bad plans throw kvsift::error and leave the outputs as
// they were. The host reference is tested on its own in tests/test_flashinfer_export.cpp.

#include <kvsift/store/flashinfer.hpp>
#include <kvsift/store/paged.hpp>
#include <kvsift/thrust/all.hpp>

#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using kvsift::bfloat16;
using dvec = ::thrust::device_vector<std::int32_t>;

template <class F>
void for_each_policy(F&& f) {
  f(::thrust::device, std::string("device(" KVSIFT_THRUST_SYSTEM_NAME ")"));
  f(::thrust::cpp::par, std::string("cpp::par"));
}

// A ragged paged store: requests of 0..max_len tokens per layer, chunks appended round-robin
// (pages interleaved), then retains with per-head kept sets (different head lengths, pages freed
// in the middle of the pool) and more chunks (freed pages reused out of order).
template <class T>
struct ragged_paged {
  kvsift::model_shape shape;
  int page_size;
  int requests;
  kvsift::store::paged<T> store;
  std::mt19937 rng;

  ragged_paged(int kv_heads, int page_size_, int requests_, int max_len, std::uint32_t seed)
      : shape{.layers = 2, .q_heads = 2 * kv_heads, .kv_heads = kv_heads, .head_dim = 4},
        page_size(page_size_),
        requests(requests_),
        store(shape, requests_, page_size_,
              requests_ * 2 * kv_heads * ((2 * max_len + 8) / page_size_ + 2)),
        rng(seed) {
    std::uniform_int_distribution<int> len(0, max_len);
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
    std::vector<int> want(static_cast<std::size_t>(requests));
    for (int& n : want) n = len(rng);
    if (requests > 1) want[1] = 0;  // one empty request
    for (int round = 0; round * 3 < max_len; ++round) {
      for (int r = 0; r < requests; ++r) {
        for (int l = 0; l < shape.layers; ++l) {
          const int n = std::min(3, want[r] - round * 3);
          if (n > 0) append(r, l, n);
        }
      }
    }
    for (int r = 0; r < requests; r += 2) {
      for (int l = 0; l < shape.layers; ++l) {
        kvsift::index_sets kept;
        for (int h = 0; h < H; ++h) {
          std::vector<std::int32_t> k;
          for (int i = 0; i < store.length(r, l, h); ++i) {
            if (std::bernoulli_distribution(0.3 + 0.2 * h)(rng)) k.push_back(i);
          }
          kept.push_back(k);
        }
        store.retain(r, l, kept);
        append(r, l, 1 + static_cast<int>(rng() % 5));
      }
    }
  }
};

std::vector<std::int32_t> subset(std::mt19937& rng, int n, double p) {
  std::bernoulli_distribution keep(p);
  std::vector<std::int32_t> out;
  for (int i = 0; i < n; ++i) {
    if (keep(rng)) out.push_back(i);
  }
  return out;
}

template <class T>
bool same_row(const T* a, const T* b, int d) {
  return std::memcmp(a, b, sizeof(T) * d) == 0;
}

void require_same(const kvsift::flashinfer_table& got, const kvsift::flashinfer_table& want) {
  REQUIRE(got.page_size == want.page_size);
  REQUIRE(got.indptr == want.indptr);
  REQUIRE(got.indices == want.indices);
  REQUIRE(got.last_page_len == want.last_page_len);
}

}  // namespace

TEST_CASE("thrust device_index_sets round-trips index_sets", "[thrust][flashinfer]") {
  kvsift::index_sets h;
  h.push_back(std::vector<std::int32_t>{1, 4, 9});
  h.push_back(std::vector<std::int32_t>{});
  h.push_back(std::vector<std::int32_t>{0});
  const auto d = kvsift::thrust::to_device<dvec>(h);
  REQUIRE(d.segments() == 3);
  REQUIRE(d.size() == 4);
  const auto back = kvsift::thrust::to_host(d);
  REQUIRE(back.offsets == h.offsets);
  REQUIRE(back.values == h.values);
  const auto v = d.view();
  REQUIRE(v.num_segments == 3);
}

TEMPLATE_TEST_CASE("thrust::flashinfer_tokens / flashinfer_pages equal the host reference",
                   "[thrust][flashinfer]", float, bfloat16) {
  using T = TestType;
  const int kv_heads = GENERATE(1, 3);
  const int page_size = GENERATE(1, 4, 16);
  const int requests = GENERATE(1, 5);
  const std::uint32_t seed = GENERATE(1u, 2u);
  const bool check = GENERATE(true, false);  // the device-side plan check on or off
  CAPTURE(kv_heads, page_size, requests, seed, check);
  ragged_paged<T> b(kv_heads, page_size, requests, 40, seed);
  const auto& sh = b.shape;
  const int d = sh.head_dim;
  for (int layer = 0; layer < sh.layers; ++layer) {
    CAPTURE(layer);
    // The batch in a shuffled order.
    std::vector<int> batch(static_cast<std::size_t>(requests));
    for (int r = 0; r < requests; ++r) batch[r] = r;
    std::shuffle(batch.begin(), batch.end(), b.rng);
    // The pages form needs slots in row order (store/flashinfer.hpp): it runs over the requests
    // whose head-sequences a retain left in order; the tokens form over the whole batch.
    std::vector<int> ordered;
    for (const int r : batch) {
      bool in_order = true;
      for (int h = 0; h < kv_heads; ++h) {
        in_order = in_order && b.store.rows_in_slot_order(sh.sequence(r, layer, h));
      }
      if (in_order) ordered.push_back(r);
    }
    kvsift::index_sets slots, pages;
    for (const int r : batch) {
      for (int h = 0; h < kv_heads; ++h) {
        slots.push_back(subset(b.rng, b.store.length(r, layer, h), 0.4));
      }
    }
    for (const int r : ordered) {
      for (int h = 0; h < kv_heads; ++h) {
        const int n = b.store.length(r, layer, h);
        pages.push_back(subset(b.rng, (n + page_size - 1) / page_size, 0.6));
      }
    }
    const kvsift::head_pages hp = kvsift::page_lists(b.store, layer, batch);
    const kvsift::head_pages hp_ordered = kvsift::page_lists(b.store, layer, ordered);
    REQUIRE(hp_ordered.rows.segments() <= 0);
    const auto want_t = kvsift::flashinfer_tokens(hp, slots);
    const auto want_p = kvsift::flashinfer_pages(hp_ordered, pages, page_size);
    REQUIRE(want_t.indices == kvsift::flashinfer_tokens(b.store, layer, batch, slots).indices);

    // The reference names the rows and pages that hold the kept keys (checked through the pool).
    for (int s = 0; s < want_t.entries(); ++s) {
      const auto seq = sh.sequence(batch[s / kv_heads], layer, s % kv_heads);
      for (int i = 0; i < slots.size(s); ++i) {
        const std::int64_t row = want_t.indices[want_t.indptr[s] + i];
        REQUIRE(same_row(b.store.key_pool() + row * d, b.store.key(seq, slots[s][i]), d));
      }
      REQUIRE(want_t.seq_len(s) == slots.size(s));
    }
    for (int s = 0; s < want_p.entries(); ++s) {
      const auto seq = sh.sequence(ordered[s / kv_heads], layer, s % kv_heads);
      const int n = b.store.length(seq);
      int kept_tokens = 0;
      for (int i = 0; i < pages.size(s); ++i) {
        const std::int64_t page = want_p.indices[want_p.indptr[s] + i];
        for (int o = 0; o < page_size && pages[s][i] * page_size + o < n; ++o, ++kept_tokens) {
          REQUIRE(same_row(b.store.key_pool() + (page * page_size + o) * d,
                           b.store.key(seq, pages[s][i] * page_size + o), d));
        }
      }
      REQUIRE(want_p.seq_len(s) == kept_tokens);
    }

    const auto dhp = kvsift::thrust::to_device<dvec>(hp);
    const auto dhp_ordered = kvsift::thrust::to_device<dvec>(hp_ordered);
    const auto dslots = kvsift::thrust::to_device<dvec>(slots);
    const auto dpages = kvsift::thrust::to_device<dvec>(pages);
    const bool reordered = hp.rows.segments() > 0;
    if (reordered) {  // a page plan over reordered rows is refused, host and device alike
      REQUIRE_THROWS_AS(kvsift::flashinfer_pages(hp, slots, page_size), kvsift::error);
    }
    for_each_policy([&](const auto& exec, const std::string& name) {
      CAPTURE(name);
      require_same(kvsift::thrust::to_host(kvsift::thrust::flashinfer_tokens(exec, dhp, dslots, check)),
                   want_t);
      require_same(kvsift::thrust::to_host(kvsift::thrust::flashinfer_pages(
                       exec, dhp_ordered, dpages, page_size, check)),
                   want_p);
      if (reordered) {
        REQUIRE_THROWS_AS(kvsift::thrust::flashinfer_pages(exec, dhp, dslots, page_size, check),
                          kvsift::error);
      }
    });
  }
}

// Issue 69.7: a one-token eviction leaves its row as a hole the next append fills; the page
// lists then carry extents (rows in use: the tokens and the hole), which the host export accepts.
// The Thrust export dropped them and refused every such entry whose hole opened a page.
TEST_CASE("thrust FlashInfer export of page lists with a waiting hole", "[thrust][flashinfer]") {
  const kvsift::model_shape sh{.layers = 1, .q_heads = 2, .kv_heads = 2, .head_dim = 4};
  const int ps = 4;
  kvsift::store::paged<float> store(sh, 2, ps, 16);
  std::vector<float> k(static_cast<std::size_t>(9) * sh.kv_heads * sh.head_dim);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i);
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  for (int r = 0; r < 2; ++r) {
    const int n = r == 0 ? 8 : 9;
    store.append(r, 0, view::contiguous(k.data(), n, sh.kv_heads, sh.head_dim),
                 view::contiguous(k.data(), n, sh.kv_heads, sh.head_dim), 0);
  }
  // request 0 head 0 releases its newest token (8 -> 7 of 2 pages, a hole in order), request 1
  // head 1 its slot 2 (9 -> 8, its third page kept for the hole: 8 tokens in 3 pages)
  kvsift::index_sets keep0, keep1;
  keep0.push_back(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6});
  keep0.push_back(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
  keep1.push_back(std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  keep1.push_back(std::vector<std::int32_t>{0, 1, 3, 4, 5, 6, 7, 8});
  store.retain(0, 0, keep0);
  store.retain(1, 0, keep1);
  REQUIRE(store.row_extent(sh.sequence(1, 0, 1)) == 9);
  const std::vector<int> batch{1, 0};
  const auto hp = kvsift::page_lists(store, 0, batch);
  REQUIRE_FALSE(hp.extents.empty());
  kvsift::index_sets slots;
  for (const int r : batch) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      std::vector<std::int32_t> all(static_cast<std::size_t>(store.length(r, 0, h)));
      for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int32_t>(i);
      slots.push_back(all);
    }
  }
  const auto want = kvsift::flashinfer_tokens(hp, slots);
  const auto dhp = kvsift::thrust::to_device<dvec>(hp);
  const auto dslots = kvsift::thrust::to_device<dvec>(slots);
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    for (const bool check : {true, false}) {
      require_same(kvsift::thrust::to_host(kvsift::thrust::flashinfer_tokens(exec, dhp, dslots, check)),
                   want);
    }
  });
  // an extent that is neither the length nor one more is still refused, as on the host
  auto bad = hp;
  bad.extents[0] = bad.lengths[0] + 2;
  REQUIRE_THROWS_AS(kvsift::flashinfer_tokens(bad, slots), kvsift::error);
  const auto dbad = kvsift::thrust::to_device<dvec>(bad);
  REQUIRE_THROWS_AS(kvsift::thrust::flashinfer_tokens(::thrust::device, dbad, dslots), kvsift::error);
}

TEST_CASE("thrust FlashInfer export of an empty batch and of empty entries", "[thrust][flashinfer]") {
  ragged_paged<float> b(2, 4, 3, 10, 9);
  const std::vector<int> none;
  const auto hp0 = kvsift::page_lists(b.store, 0, none);
  const kvsift::index_sets empty;
  const auto want0 = kvsift::flashinfer_tokens(hp0, empty);
  REQUIRE(want0.indptr == std::vector<std::int32_t>{0});
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    const auto got = kvsift::thrust::to_host(kvsift::thrust::flashinfer_tokens(
        exec, kvsift::thrust::to_device<dvec>(hp0), kvsift::thrust::to_device<dvec>(empty)));
    require_same(got, want0);
  });
  // Every entry keeps nothing: indptr all zero, last_page_len all zero.
  const std::vector<int> batch{2, 1, 0};
  const auto hp = kvsift::page_lists(b.store, 1, batch);
  kvsift::index_sets nothing;
  for (int s = 0; s < hp.entries(); ++s) nothing.push_back(std::vector<std::int32_t>{});
  const auto want = kvsift::flashinfer_pages(hp, nothing, 4);
  REQUIRE(want.last_page_len == std::vector<std::int32_t>(6, 0));
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    require_same(kvsift::thrust::to_host(kvsift::thrust::flashinfer_pages(
                     exec, kvsift::thrust::to_device<dvec>(hp),
                     kvsift::thrust::to_device<dvec>(nothing), 4)),
                 want);
  });
}

TEST_CASE("thrust FlashInfer export rejects bad plans and writes nothing", "[thrust][flashinfer]") {
  using Catch::Matchers::ContainsSubstring;
  ragged_paged<float> b(2, 4, 4, 20, 3);
  const int layer = 0;
  // requests the fixture never retained (odd ids): slots in row order, so page plans apply
  const std::vector<int> batch{3, 1};
  const auto hp = kvsift::page_lists(b.store, layer, batch);
  REQUIRE(hp.rows.segments() <= 0);
  const int n0 = hp.lengths[0];
  REQUIRE(n0 >= 3);
  // A good token plan: entry 0 keeps {0, 1, n0 - 1}, the others keep slot 0 where they have one.
  kvsift::index_sets good;
  good.push_back(std::vector<std::int32_t>{0, 1, n0 - 1});
  for (int s = 1; s < hp.entries(); ++s) {
    good.push_back(hp.lengths[s] > 0 ? std::vector<std::int32_t>{0} : std::vector<std::int32_t>{});
  }
  const auto dhp = kvsift::thrust::to_device<dvec>(hp);

  struct bad_case {
    std::string what;
    std::string message;
    kvsift::index_sets plan;
    bool pages;
    int page_size;
  };
  std::vector<bad_case> cases;
  {
    auto p = good;
    p.values[2] = n0;  // past the head-sequence
    cases.push_back({"slot past the end", "'slots[0][2]' = " + std::to_string(n0), p, false, 1});
  }
  {
    auto p = good;
    p.values[1] = 0;  // entry 0: {0, 0, n0 - 1}
    cases.push_back({"not ascending", "strictly ascending indices (previous 0)", p, false, 1});
  }
  {
    auto p = good;
    p.values[0] = -1;
    cases.push_back({"negative", "'slots[0][0]' = -1", p, false, 1});
  }
  {
    auto p = good;
    p.offsets.back() += 1;  // offsets[S] != values.size()
    p.values.push_back(0);
    p.offsets.back() -= 2;
    cases.push_back({"offsets end", "'slots.offsets[" + std::to_string(hp.entries()) + "]'", p, false, 1});
  }
  {
    kvsift::index_sets p;
    p.push_back(std::vector<std::int32_t>{(n0 + 3) / 4});  // one page past entry 0's pages
    for (int s = 1; s < hp.entries(); ++s) p.push_back(std::vector<std::int32_t>{});
    cases.push_back({"page past the end", "'pages[0][0]' = " + std::to_string((n0 + 3) / 4), p,
                     true, 4});
  }
  cases.push_back({"page size", "'page_size' = 8", good, true, 8});

  for_each_policy([&](const auto& exec, const std::string& name) {
    for (const auto& c : cases) {
      CAPTURE(name, c.what);
      const auto plan = kvsift::thrust::to_device<dvec>(c.plan);
      dvec indptr(c.plan.offsets.size(), -7), indices(std::max<std::size_t>(1, c.plan.values.size()), -7);
      dvec last(std::max(1, hp.entries()), -7);
      const kvsift::thrust::flashinfer_view out{::thrust::raw_pointer_cast(indptr.data()),
                                                ::thrust::raw_pointer_cast(indices.data()),
                                                ::thrust::raw_pointer_cast(last.data())};
      const auto run = [&] {
        if (c.pages) {
          kvsift::thrust::flashinfer_pages(exec, dhp.view(), plan.view(), plan.size(), c.page_size, out);
        } else {
          kvsift::thrust::flashinfer_tokens(exec, dhp.view(), plan.view(), plan.size(), out);
        }
      };
      REQUIRE_THROWS_AS(run(), kvsift::error);
      REQUIRE_THROWS_WITH(run(), ContainsSubstring(c.message));
      const auto untouched = [](const dvec& v) {
        return std::all_of(v.begin(), v.end(), [](std::int32_t x) { return x == -7; });
      };
      REQUIRE(untouched(indptr));
      REQUIRE(untouched(indices));
      REQUIRE(untouched(last));
      // The host reference rejects the same plan.
      if (c.pages) {
        REQUIRE_THROWS_AS(kvsift::flashinfer_pages(hp, c.plan, c.page_size), kvsift::error);
      } else {
        REQUIRE_THROWS_AS(kvsift::flashinfer_tokens(hp, c.plan), kvsift::error);
      }
    }
    // Page lists that do not match their lengths.
    auto bad_hp = hp;
    bad_hp.lengths[0] += 4;
    const auto dbad = kvsift::thrust::to_device<dvec>(bad_hp);
    const auto plan = kvsift::thrust::to_device<dvec>(good);
    REQUIRE_THROWS_WITH(kvsift::thrust::flashinfer_tokens(exec, dbad, plan),
                        ContainsSubstring("'head_pages.lengths[0]' = " + std::to_string(n0 + 4)));
    // A plan with the wrong number of entries (host-side check).
    kvsift::index_sets short_plan;
    short_plan.push_back(std::vector<std::int32_t>{0});
    REQUIRE_THROWS_WITH(
        kvsift::thrust::flashinfer_tokens(exec, dhp, kvsift::thrust::to_device<dvec>(short_plan)),
        ContainsSubstring("'slots.num_segments' = 1"));
  });
}

// thrust/engine_tables.hpp: block tables, -1-padded page lists and the ggml mask built on the
// device from a device FlashInfer table equal the host reference's (store/engine_tables.hpp,
// whose formats tests/test_engine_tables.cpp checks by attention against the library's), on
// random ragged tables with empty entries; a table or width that does not fit is refused before
// anything is written.
TEST_CASE("thrust engine tables equal the host reference", "[thrust][flashinfer][engine_tables]") {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 60; ++trial) {
    const int page_size = 1 + static_cast<int>(rng() % 8);
    const int pool_pages = 40;
    const int entries = static_cast<int>(rng() % 7);
    kvsift::flashinfer_table t;
    t.page_size = page_size;  // t.indptr starts as {0}
    for (int s = 0; s < entries; ++s) {
      const int n = static_cast<int>(rng() % 6);  // 0: an entry that reads nothing
      for (int i = 0; i < n; ++i) t.indices.push_back(static_cast<std::int32_t>(rng() % pool_pages));
      t.indptr.push_back(t.indptr.back() + n);
      t.last_page_len.push_back(n == 0 ? 0 : 1 + static_cast<int>(rng() % page_size));
    }
    kvsift::thrust::device_flashinfer_table<dvec> d{
        dvec(t.indptr.begin(), t.indptr.end()), dvec(t.indices.begin(), t.indices.end()),
        dvec(t.last_page_len.begin(), t.last_page_len.end()), page_size};
    const std::int64_t pool_rows = static_cast<std::int64_t>(pool_pages) * page_size;
    for_each_policy([&](const auto& exec, const std::string& name) {
      INFO(name << " trial " << trial);
      for (const std::int32_t pad : {0, -1}) {
        const auto want = kvsift::block_tables(t, pad);
        const auto got = kvsift::thrust::block_tables(exec, d, pad);
        CHECK(got.max_blocks == want.max_blocks);
        CHECK(got.block_size == want.block_size);
        CHECK(got.blocks == want.blocks);
        CHECK(got.seq_lens == want.seq_lens);
      }
      const auto want_m = kvsift::kv_mask_of(t, pool_rows);
      const auto got_m = kvsift::thrust::kv_mask<::thrust::device_vector<float>>(exec, d, pool_rows);
      CHECK(got_m.n_kv_max == want_m.n_kv_max);
      CHECK(got_m.mask == want_m.mask);

      // a fixed width below the longest entry, and a pool too small for a block: refused, the
      // outputs as they were
      const auto v = kvsift::thrust::table_view(d);
      const int longest = want_m.entries > 0 ? kvsift::block_tables(t).max_blocks : 0;
      if (longest > 0) {
        dvec blocks(static_cast<std::size_t>(entries) * longest, 7), lens(entries, 7);
        REQUIRE_THROWS_WITH(
            kvsift::thrust::padded_pages(exec, v, longest - 1, ::thrust::raw_pointer_cast(blocks.data()),
                                         ::thrust::raw_pointer_cast(lens.data())),
            Catch::Matchers::ContainsSubstring("'max_blocks'"));
        CHECK(std::all_of(blocks.begin(), blocks.end(), [](std::int32_t x) { return x == 7; }));
        ::thrust::device_vector<float> mask(static_cast<std::size_t>(entries) * 4, 3.0f);
        if (want_m.n_kv_max > 4) {
          REQUIRE_THROWS_WITH(kvsift::thrust::kv_mask(exec, v, 4, ::thrust::raw_pointer_cast(mask.data())),
                              Catch::Matchers::ContainsSubstring("table.indices["));
          CHECK(std::all_of(mask.begin(), mask.end(), [](float x) { return x == 3.0f; }));
        }
      }
    });
  }
  // a bad last_page_len is named as the host names it
  kvsift::flashinfer_table t{.indptr = {0, 2}, .indices = {1, 2}, .last_page_len = {5}, .page_size = 4};
  kvsift::thrust::device_flashinfer_table<dvec> d{dvec(t.indptr.begin(), t.indptr.end()),
                                                  dvec(t.indices.begin(), t.indices.end()),
                                                  dvec(t.last_page_len.begin(), t.last_page_len.end()), 4};
  REQUIRE_THROWS_WITH(kvsift::block_tables(t), Catch::Matchers::ContainsSubstring("table.last_page_len[0]"));
  REQUIRE_THROWS_WITH(kvsift::thrust::block_tables(::thrust::device, d),
                      Catch::Matchers::ContainsSubstring("table.last_page_len[0]"));
}
