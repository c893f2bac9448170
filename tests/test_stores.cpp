// SPDX-License-Identifier: Apache-2.0
// Store laws: append in chunks, retain keeps exactly the kept rows with their original
// positions, memory really drops (paged: pages return to the pool), the paged table is
// FlashInfer-consistent, a dense store can wrap engine memory, nhd and hnd inputs agree.

#include <kvsift/kvsift.hpp>
#include <kvsift/store/flashinfer.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <set>
#include <vector>

namespace {

using kvsift::bfloat16;
using kvsift::half;
using kvsift::model_shape;

// Deterministic content of (request, layer, position, head, channel).
float content(int r, int l, int pos, int h, int c) {
  return static_cast<float>(((r * 31 + l * 17 + pos * 7 + h * 5 + c * 3) % 97) - 48) / 8.0f;
}

// [tokens, kv_heads, d] chunk of request r / layer l starting at position first (nhd).
template <class T>
std::vector<T> chunk_nhd(const model_shape& sh, int r, int l, int first, int tokens, float sign = 1) {
  std::vector<T> out(static_cast<std::size_t>(tokens) * sh.kv_heads * sh.head_dim);
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < sh.kv_heads; ++h)
      for (int c = 0; c < sh.head_dim; ++c)
        out[(static_cast<std::size_t>(t) * sh.kv_heads + h) * sh.head_dim + c] =
            kvsift::from_float<T>(sign * content(r, l, first + t, h, c));
  return out;
}
template <class T>
std::vector<T> nhd_to_hnd(const std::vector<T>& in, int tokens, int heads, int d) {
  std::vector<T> out(in.size());
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      std::memcpy(&out[(static_cast<std::size_t>(h) * tokens + t) * d],
                  &in[(static_cast<std::size_t>(t) * heads + h) * d], sizeof(T) * d);
  return out;
}

template <class T>
bool same_bits(const T* a, const T* b, int d) {
  return std::memcmp(a, b, sizeof(T) * d) == 0;
}

template <class T>
struct dense_of {
  using element = T;
  using store = kvsift::store::dense<T>;
  static constexpr bool paged = false;
  static store make(const model_shape& sh, int requests, int capacity) {
    return store(sh, requests, capacity);
  }
};
template <class T, int P = 4>  // P: page size (3: the division path of store::paged::flat)
struct paged_of {
  using element = T;
  using store = kvsift::store::paged<T>;
  static constexpr bool paged = true;
  static constexpr int page_size = P;
  static store make(const model_shape& sh, int requests, int capacity) {
    const int pages_per_seq = (capacity + page_size - 1) / page_size;
    return store(sh, requests, page_size,
                 pages_per_seq * requests * static_cast<int>(sh.sequences_per_request()));
  }
};

template <class Store>
void append_chunk(Store& s, int r, int l, int first, int tokens) {
  using T = typename Store::element_type;
  const auto& sh = s.shape();
  const auto k = chunk_nhd<T>(sh, r, l, first, tokens);
  const auto v = chunk_nhd<T>(sh, r, l, first, tokens, -1);
  s.append(r, l,
           kvsift::kv_view<const T, kvsift::nhd>::contiguous(k.data(), tokens, sh.kv_heads, sh.head_dim),
           kvsift::kv_view<const T, kvsift::nhd>::contiguous(v.data(), tokens, sh.kv_heads, sh.head_dim),
           first);
}

// Every resident row of every head-sequence holds the content of its original position.
template <class Store>
void require_contents(const Store& s) {
  using T = typename Store::element_type;
  const auto& sh = s.shape();
  for (int r = 0; r < s.requests(); ++r) {
    for (int l = 0; l < sh.layers; ++l) {
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(r, l, h);
        for (int i = 0; i < s.length(seq); ++i) {
          const int pos = s.position(seq, i);
          if (i > 0) REQUIRE(pos > s.position(seq, i - 1));
          for (int c = 0; c < sh.head_dim; ++c) {
            CAPTURE(r, l, h, i, pos, c);
            REQUIRE(s.key(seq, i)[c] == kvsift::from_float<T>(content(r, l, pos, h, c)));
            REQUIRE(s.value(seq, i)[c] == kvsift::from_float<T>(-content(r, l, pos, h, c)));
          }
        }
      }
    }
  }
}

template <class Store>
std::int64_t expected_bytes(const Store& s) {
  using T = typename Store::element_type;
  return s.resident_tokens() * 2 * s.shape().head_dim * static_cast<std::int64_t>(sizeof(T));
}

template <class M>
void require_page_table_consistent(const typename M::store& s) {
  if constexpr (M::paged) {
    using T = typename M::element;
    const auto& sh = s.shape();
    std::set<std::int32_t> all_pages;
    int pages_in_tables = 0;
    for (int r = 0; r < s.requests(); ++r) {
      for (int l = 0; l < sh.layers; ++l) {
        const auto t = s.page_table(r, l);
        REQUIRE(t.indptr.size() == static_cast<std::size_t>(sh.kv_heads + 1));
        REQUIRE(t.last_page_len.size() == static_cast<std::size_t>(sh.kv_heads));
        REQUIRE(t.indptr.front() == 0);
        REQUIRE(t.indptr.back() == static_cast<std::int32_t>(t.indices.size()));
        for (int h = 0; h < sh.kv_heads; ++h) {
          // the pages hold the rows in use: the tokens and at most one released row that the
          // next append fills (a decode step's eviction)
          const int n = s.row_extent(sh.sequence(r, l, h));
          REQUIRE(n >= s.length(sh.sequence(r, l, h)));
          REQUIRE(n <= s.length(sh.sequence(r, l, h)) + 1);
          const int np = t.indptr[h + 1] - t.indptr[h];
          CAPTURE(r, l, h, n, np);
          REQUIRE(np == (n + s.page_size() - 1) / s.page_size());
          if (n > 0) REQUIRE(t.last_page_len[h] == n - (np - 1) * s.page_size());
        }
        for (auto p : t.indices) all_pages.insert(p);
        pages_in_tables += static_cast<int>(t.indices.size());
        // The table addresses the pool exactly like a FlashInfer paged view with one "request"
        // per KV head.
        kvsift::paged_kv_view<const T, kvsift::paged_nhd> kv{
            s.key_pool(), s.used_pages() + s.free_pages(), s.page_size(), 1, sh.head_dim,
            sh.kv_heads, t.indptr.data(), t.indices.data(), t.last_page_len.data()};
        kvsift::paged_kv_view<const T, kvsift::paged_nhd> vv = kv;
        vv.data = s.value_pool();
        if (!t.indices.empty()) REQUIRE_NOTHROW(kv.validate("test", "kv", 1, sh.head_dim));
        for (int h = 0; h < sh.kv_heads; ++h) {
          const auto seq = sh.sequence(r, l, h);
          REQUIRE(kv.length(h) == s.row_extent(seq));
          // rows [0, extent) hold the resident tokens, slot i at row s.row(seq, i), each once
          std::vector<int> seen(static_cast<std::size_t>(s.row_extent(seq)), 0);
          for (int i = 0; i < s.length(seq); ++i) {
            const int row = s.row(seq, i);
            REQUIRE(row >= 0);
            REQUIRE(row < s.row_extent(seq));
            REQUIRE(seen[row]++ == 0);
            REQUIRE(kv.row(h, row, 0) == s.key(seq, i));
            REQUIRE(vv.row(h, row, 0) == s.value(seq, i));
          }
        }
      }
    }
    REQUIRE(static_cast<int>(all_pages.size()) == pages_in_tables);  // no page shared
    REQUIRE(pages_in_tables == s.used_pages());
  }
}

}  // namespace

TEMPLATE_TEST_CASE("stores: chunked append, retain and memory release", "[store]",
                   dense_of<float>, dense_of<half>, dense_of<bfloat16>, paged_of<float>,
                   paged_of<half>, paged_of<bfloat16>) {
  using M = TestType;
  using T = typename M::element;
  const int kv_heads = GENERATE(1, 2);
  const int d = GENERATE(1, 8);
  const int seed = GENERATE(1, 2, 3);
  CAPTURE(kv_heads, d, seed, kvsift::element_name<T>, M::paged);
  const model_shape sh{.layers = 2, .q_heads = 2 * kv_heads, .kv_heads = kv_heads, .head_dim = d};
  const int requests = 3;
  auto s = M::make(sh, requests, 40);
  REQUIRE(s.resident_bytes() == 0);
  REQUIRE(s.resident_tokens() == 0);

  std::mt19937 rng(static_cast<unsigned>(seed));
  // ragged chunks: each request and layer gets its own chunk sizes
  std::vector<int> lengths(static_cast<std::size_t>(requests * sh.layers), 0);
  for (int round = 0; round < 3; ++round) {
    for (int r = 0; r < requests; ++r) {
      for (int l = 0; l < sh.layers; ++l) {
        const int tokens = 1 + static_cast<int>(rng() % 9);
        auto& n = lengths[r * sh.layers + l];
        append_chunk(s, r, l, n, tokens);
        n += tokens;
      }
    }
  }
  for (int r = 0; r < requests; ++r) {
    for (int l = 0; l < sh.layers; ++l) {
      REQUIRE(s.next_position(r, l) == lengths[r * sh.layers + l]);
      for (int h = 0; h < kv_heads; ++h) {
        REQUIRE(s.length(r, l, h) == lengths[r * sh.layers + l]);
        for (int i = 0; i < s.length(r, l, h); ++i) REQUIRE(s.position(sh.sequence(r, l, h), i) == i);
      }
    }
  }
  require_contents(s);
  require_page_table_consistent<M>(s);
  if constexpr (M::paged) {
    REQUIRE(s.resident_bytes() >= expected_bytes(s));
    REQUIRE(s.resident_bytes() ==
            static_cast<std::int64_t>(s.used_pages()) * s.page_size() * 2 * d * static_cast<std::int64_t>(sizeof(T)));
  } else {
    REQUIRE(s.resident_bytes() == expected_bytes(s));
  }

  // retain a random subset per head of request 1, layer 0 (different per head)
  const std::int64_t before = s.resident_bytes();
  const int free_before = [&] {
    if constexpr (M::paged) return s.free_pages();
    else return 0;
  }();
  const int n = lengths[1 * sh.layers + 0];
  kvsift::index_sets kept;
  std::vector<std::vector<std::int32_t>> kept_positions;
  int pages_released = 0;
  for (int h = 0; h < kv_heads; ++h) {
    std::vector<std::int32_t> seg;
    const int keep = h == 0 ? 1 : n / 2;
    std::vector<std::int32_t> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    seg.assign(all.begin(), all.begin() + keep);
    std::sort(seg.begin(), seg.end());
    kept.push_back(seg);
    kept_positions.push_back(seg);  // positions == slots before retain
    if constexpr (M::paged) pages_released += (n + 3) / 4 - (keep + 3) / 4;
  }
  s.retain(1, 0, kept);
  for (int h = 0; h < kv_heads; ++h) {
    const auto seq = sh.sequence(1, 0, h);
    REQUIRE(s.length(seq) == static_cast<int>(kept_positions[h].size()));
    for (int i = 0; i < s.length(seq); ++i) REQUIRE(s.position(seq, i) == kept_positions[h][i]);
  }
  require_contents(s);  // kept rows carry their original content
  require_page_table_consistent<M>(s);
  REQUIRE(s.resident_bytes() < before);
  if constexpr (M::paged) {
    REQUIRE(s.free_pages() == free_before + pages_released);
  } else {
    REQUIRE(s.resident_bytes() == expected_bytes(s));
  }
  // other head-sequences untouched
  REQUIRE(s.length(0, 0, 0) == lengths[0]);
  REQUIRE(s.length(1, 1, 0) == lengths[1 * sh.layers + 1]);

  // appending after a retain continues at later positions and reuses released memory
  append_chunk(s, 1, 0, n + 3, 5);
  for (int h = 0; h < kv_heads; ++h) {
    const auto seq = sh.sequence(1, 0, h);
    const int len = s.length(seq);
    REQUIRE(len == static_cast<int>(kept_positions[h].size()) + 5);
    REQUIRE(s.position(seq, len - 5) == n + 3);
    REQUIRE(s.position(seq, len - 1) == n + 7);
  }
  require_contents(s);
  require_page_table_consistent<M>(s);

  // reset drops every token of one request
  s.reset(2);
  for (int l = 0; l < sh.layers; ++l) REQUIRE(s.length(2, l, 0) == 0);
  REQUIRE(s.next_position(2, 0) == 0);
  require_page_table_consistent<M>(s);
  if constexpr (!M::paged) REQUIRE(s.resident_bytes() == expected_bytes(s));
}

TEMPLATE_TEST_CASE("stores: nhd and hnd input views build the same store", "[store]",
                   dense_of<float>, dense_of<half>, dense_of<bfloat16>, paged_of<float>,
                   paged_of<half>, paged_of<bfloat16>) {
  using M = TestType;
  using T = typename M::element;
  const int tokens = GENERATE(1, 5, 13);
  const model_shape sh{.layers = 1, .q_heads = 3, .kv_heads = 3, .head_dim = 4};
  CAPTURE(tokens);
  auto a = M::make(sh, 1, 16);
  auto b = M::make(sh, 1, 16);
  const auto k = chunk_nhd<T>(sh, 0, 0, 0, tokens);
  const auto v = chunk_nhd<T>(sh, 0, 0, 0, tokens, -1);
  const auto kh = nhd_to_hnd(k, tokens, sh.kv_heads, sh.head_dim);
  const auto vh = nhd_to_hnd(v, tokens, sh.kv_heads, sh.head_dim);
  a.append(0, 0, kvsift::kv_view<const T, kvsift::nhd>::contiguous(k.data(), tokens, 3, 4),
           kvsift::kv_view<const T, kvsift::nhd>::contiguous(v.data(), tokens, 3, 4), 0);
  b.append(0, 0, kvsift::kv_view<const T, kvsift::hnd>::contiguous(kh.data(), tokens, 3, 4),
           kvsift::kv_view<const T, kvsift::hnd>::contiguous(vh.data(), tokens, 3, 4), 0);
  // a strided nhd view (a sub-range of heads of a wider [tokens, 5, d] buffer) works as well
  auto c = M::make(sh, 1, 16);
  std::vector<T> wide_k(static_cast<std::size_t>(tokens) * 5 * 4), wide_v(wide_k.size());
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < 3; ++h)
      for (int e = 0; e < 4; ++e) {
        wide_k[(t * 5 + h + 1) * 4 + e] = k[(t * 3 + h) * 4 + e];
        wide_v[(t * 5 + h + 1) * 4 + e] = v[(t * 3 + h) * 4 + e];
      }
  const kvsift::kv_view<const T, kvsift::nhd> wk{wide_k.data() + 4, tokens, 3, 4, 20, 4};
  const kvsift::kv_view<const T, kvsift::nhd> wv{wide_v.data() + 4, tokens, 3, 4, 20, 4};
  c.append(0, 0, wk, wv, 0);
  for (int h = 0; h < 3; ++h) {
    REQUIRE(a.length(h) == tokens);
    REQUIRE(b.length(h) == tokens);
    REQUIRE(c.length(h) == tokens);
    for (int i = 0; i < tokens; ++i) {
      CAPTURE(h, i);
      REQUIRE(same_bits(a.key(h, i), b.key(h, i), 4));
      REQUIRE(same_bits(a.value(h, i), b.value(h, i), 4));
      REQUIRE(same_bits(a.key(h, i), c.key(h, i), 4));
      REQUIRE(same_bits(a.value(h, i), c.value(h, i), 4));
      REQUIRE(a.position(h, i) == b.position(h, i));
    }
  }
  require_contents(a);
  REQUIRE(a.resident_bytes() == b.resident_bytes());
}

TEMPLATE_TEST_CASE("dense store wraps engine memory without copying", "[store]", float, half,
                   bfloat16) {
  using T = TestType;
  const model_shape sh{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 4};
  const int requests = 2, capacity = 10;
  const std::size_t total = static_cast<std::size_t>(requests) * sh.layers * sh.kv_heads * capacity * 4;
  std::vector<T> engine_k(total), engine_v(total);
  kvsift::store::dense<T> s(sh, requests, capacity, engine_k.data(), engine_v.data());
  append_chunk(s, 1, 1, 0, 7);
  // the store's rows are the engine's memory, in [seq, capacity, d]
  for (int h = 0; h < 2; ++h) {
    const auto seq = sh.sequence(1, 1, h);
    for (int i = 0; i < 7; ++i) {
      CAPTURE(h, i);
      REQUIRE(s.key(seq, i) == engine_k.data() + (seq * capacity + i) * 4);
      REQUIRE(s.value(seq, i) == engine_v.data() + (seq * capacity + i) * 4);
      REQUIRE(engine_k[(seq * capacity + i) * 4 + 2] == kvsift::from_float<T>(content(1, 1, i, h, 2)));
    }
  }
  // an engine write is seen by the store
  const auto seq0 = sh.sequence(1, 1, 0);
  engine_k[(seq0 * capacity + 3) * 4] = kvsift::from_float<T>(42.0f);
  REQUIRE(kvsift::to_float(s.key(seq0, 3)[0]) == 42.0f);
  engine_k[(seq0 * capacity + 3) * 4] = kvsift::from_float<T>(content(1, 1, 3, 0, 0));
  // retain compacts in the engine's buffer
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{2, 5});
  kept.push_back(std::vector<std::int32_t>{0, 3, 6});
  s.retain(1, 1, kept);
  REQUIRE(engine_k[(seq0 * capacity + 1) * 4 + 1] == kvsift::from_float<T>(content(1, 1, 5, 0, 1)));
  REQUIRE(engine_v[(seq0 * capacity + 1) * 4 + 1] == kvsift::from_float<T>(-content(1, 1, 5, 0, 1)));
  REQUIRE(s.position(seq0, 1) == 5);
  require_contents(s);
  REQUIRE(s.resident_bytes() == 5 * 2 * 4 * static_cast<std::int64_t>(sizeof(T)));
}

TEST_CASE("paged store: pages are shared by all head-sequences through one pool", "[store]") {
  const model_shape sh{.layers = 1, .q_heads = 2, .kv_heads = 2, .head_dim = 2};
  kvsift::store::paged<float> s(sh, 2, 4, 6);
  REQUIRE(s.free_pages() == 6);
  append_chunk(s, 0, 0, 0, 9);  // 3 pages per head
  REQUIRE(s.used_pages() == 6);
  REQUIRE(s.capacity(sh.sequence(1, 0, 0)) == 0);
  REQUIRE(s.capacity(sh.sequence(0, 0, 0)) == 12);
  kvsift::index_sets kept;
  kept.push_back(std::vector<std::int32_t>{8});
  kept.push_back(std::vector<std::int32_t>{0, 1, 2, 3, 4});
  s.retain(0, 0, kept);
  REQUIRE(s.used_pages() == 3);
  REQUIRE(s.free_pages() == 3);
  REQUIRE(s.resident_bytes() == 3 * 4 * 2 * 2 * 4);
  // request 1 can now use the released pages
  append_chunk(s, 1, 0, 0, 4);
  REQUIRE(s.used_pages() == 5);
  require_contents(s);
  require_page_table_consistent<paged_of<float>>(s);
}

// A sliding window (StreamingLLM's decode: append one token, release the oldest one after the
// sink) moves at most one row per step: every other kept token stays in its row, and the rows
// stay a permutation of [0, n) (a valid FlashInfer cache of exactly the resident tokens).
TEMPLATE_TEST_CASE("stores: a sliding window moves one row per step, not the window",
                   "[store][rows]", dense_of<float>, dense_of<bfloat16>, paged_of<float>,
                   paged_of<half>, (paged_of<float, 3>)) {
  using M = TestType;
  const int kv_heads = GENERATE(1, 2);
  const int sink = GENERATE(0, 2);
  CAPTURE(kv_heads, sink, M::paged);
  const model_shape sh{.layers = 1, .q_heads = kv_heads, .kv_heads = kv_heads, .head_dim = 8};
  auto s = M::make(sh, 1, 24);
  const int window = 13;
  append_chunk(s, 0, 0, 0, window);
  kvsift::index_sets evict_one;  // every slot but `sink`, per KV head
  std::vector<std::int32_t> keep(static_cast<std::size_t>(window));
  for (int i = 0, j = 0; i <= window; ++i) {
    if (i != sink) keep[j++] = i;
  }
  for (int h = 0; h < kv_heads; ++h) evict_one.push_back(keep);
  for (int step = 0; step < 40; ++step) {
    CAPTURE(step);
    append_chunk(s, 0, 0, window + step, 1);
    std::vector<std::vector<int>> row_before(static_cast<std::size_t>(kv_heads));
    for (int h = 0; h < kv_heads; ++h) {
      const auto seq = sh.sequence(0, 0, h);
      for (int i = 0; i <= window; ++i) row_before[h].push_back(s.row(seq, i));
    }
    s.retain(0, 0, evict_one);
    for (int h = 0; h < kv_heads; ++h) {
      const auto seq = sh.sequence(0, 0, h);
      REQUIRE(s.length(seq) == window);
      int moved = 0;
      for (int i = 0; i < window; ++i) moved += s.row(seq, i) != row_before[h][keep[i]] ? 1 : 0;
      REQUIRE(moved <= 1);
      // the window: the sink, then the newest window - sink positions
      for (int i = 0; i < sink; ++i) REQUIRE(s.position(seq, i) == i);
      REQUIRE(s.position(seq, window - 1) == window + step);
      REQUIRE(s.position(seq, sink) == sink + step + 1);
    }
    require_contents(s);
    require_page_table_consistent<M>(s);
    // row_addresses (the decode attention's address table) is key() and value() of each slot,
    // rows out of slot order and a waiting hole included; every slot, then every third
    using T = typename std::remove_cvref_t<decltype(s)>::element_type;
    for (int h = 0; h < kv_heads; ++h) {
      const auto seq = sh.sequence(0, 0, h);
      for (const int stride : {1, 3}) {
        std::vector<std::int32_t> slots;
        for (int i = 0; i < window; i += stride) slots.push_back(i);
        std::vector<const T*> k(slots.size()), v(slots.size());
        s.row_addresses(seq, slots, k.data(), v.data());
        std::vector<std::int32_t> pos(slots.size());
        s.positions_of(seq, slots, pos.data());
        for (std::size_t i = 0; i < slots.size(); ++i) {
          CAPTURE(h, stride, i);
          REQUIRE(k[i] == s.key(seq, slots[i]));
          REQUIRE(v[i] == s.value(seq, slots[i]));
          REQUIRE(pos[i] == s.position(seq, slots[i]));
        }
      }
      std::vector<float> prefix(static_cast<std::size_t>(window), -1.0f);  // as the recency scorer
      s.positions_prefix(seq, window - 1, prefix.data());
      for (int i = 0; i + 1 < window; ++i) REQUIRE(prefix[i] == static_cast<float>(s.position(seq, i)));
      REQUIRE(prefix[window - 1] == -1.0f);  // n slots written, no more
    }
  }
  if constexpr (M::paged) {
    // the exports follow the rows: the tokens form addresses each kept slot's own row, and the
    // pages form (logical pages = store pages) refuses reordered rows
    const std::vector<int> requests{0};
    kvsift::index_sets all;
    std::vector<std::int32_t> every(static_cast<std::size_t>(window));
    std::iota(every.begin(), every.end(), 0);
    for (int h = 0; h < kv_heads; ++h) all.push_back(every);
    const auto table = kvsift::flashinfer_tokens(s, 0, requests, all);
    for (int h = 0; h < kv_heads; ++h) {
      const auto seq = sh.sequence(0, 0, h);
      for (int i = 0; i < window; ++i) {
        REQUIRE(s.key_pool() + static_cast<std::size_t>(table.indices[table.indptr[h] + i]) * 8 ==
                s.key(seq, i));
      }
    }
    REQUIRE_FALSE(s.rows_in_slot_order(sh.sequence(0, 0, 0)));
    kvsift::index_sets pages;
    for (int h = 0; h < kv_heads; ++h) pages.push_back(std::vector<std::int32_t>{0});
    try {
      (void)kvsift::flashinfer_pages(s, 0, requests, pages, s.page_size());
      FAIL("flashinfer_pages accepted reordered rows");
    } catch (const kvsift::error& e) {
      REQUIRE(std::string(e.what()).find("head_pages.rows") != std::string::npos);
    }
  }
}

// A paged store's per-slot entries run on through the pages that follow in the pool
// (adjacent_run): four head-sequences appended in turns of 1 to 37 tokens leave page lists with
// runs of adjacent pages of every length and breaks between them, some pages freed and taken
// again by another sequence. positions_prefix, row_addresses over consecutive slots (from the
// start, from within a page, up to a page's end) and a one-token release (its entries shifted
// down run by run) then agree with position(), key() and value() slot by slot.
TEST_CASE("paged store: runs across adjacent pages give every slot's entries", "[store]") {
  constexpr model_shape sh{.layers = 1, .q_heads = 2, .kv_heads = 2, .head_dim = 4};
  for (const int page : {1, 4, 5}) {
    kvsift::store::paged<float> s(sh, 2, page, 4 * (300 / page + 2));
    std::mt19937 rng(static_cast<unsigned>(page) + 7);
    const auto append = [&](int r, int count) {
      const int first = s.next_position(r, 0);
      std::vector<float> kv(static_cast<std::size_t>(count) * 2 * 4);
      for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(first * 100 + r * 10) + static_cast<float>(i % 8);
      const auto v = kvsift::kv_view<const float, kvsift::nhd>::contiguous(kv.data(), count, 2, 4);
      s.append(r, 0, v, v, first);
    };
    for (int turn = 0; turn < 24; ++turn) {
      append(turn % 2, 1 + static_cast<int>(rng() % 37));
      if (turn == 11) s.reset(1);  // its pages back to the pool, taken again in other orders
    }
    for (int r = 0; r < 2; ++r) {
      for (int h = 0; h < 2; ++h) {
        const auto seq = sh.sequence(r, 0, h);
        for (int round = 0; round < 2; ++round) {
          CAPTURE(page, r, h, round);
          const int n = s.length(seq);
          std::vector<std::int32_t> prefix(static_cast<std::size_t>(n) + 1, -1);
          s.positions_prefix(seq, n, prefix.data());
          for (int i = 0; i < n; ++i) REQUIRE(prefix[i] == s.position(seq, i));
          REQUIRE(prefix[n] == -1);
          for (const int from : {0, 1, page - 1, n / 2}) {
            for (const int to : {n, n - 1, (n / page) * page}) {
              if (from >= to) continue;
              std::vector<std::int32_t> slots(static_cast<std::size_t>(to - from));
              std::iota(slots.begin(), slots.end(), from);
              std::vector<const float*> k(slots.size()), v(slots.size());
              s.row_addresses(seq, slots, k.data(), v.data());
              for (std::size_t i = 0; i < slots.size(); ++i) {
                REQUIRE(k[i] == s.key(seq, slots[i]));
                REQUIRE(v[i] == s.value(seq, slots[i]));
              }
            }
          }
          // release one token from the middle: the later slots' positions shift down one
          std::vector<std::int32_t> before(static_cast<std::size_t>(n));
          for (int i = 0; i < n; ++i) before[i] = s.position(seq, i);
          std::vector<std::int32_t> keep;
          for (int i = 0; i < n; ++i) {
            if (i != n / 3) keep.push_back(i);
          }
          kvsift::index_sets kept;
          for (int hh = 0; hh < 2; ++hh) kept.push_back(keep);
          s.retain(r, 0, kept);
          for (int i = 0; i + 1 < n; ++i) REQUIRE(s.position(seq, i) == before[i < n / 3 ? i : i + 1]);
        }
      }
    }
  }
}

TEST_CASE("kv_allocator: KV arrays of 2 MiB or more are 2 MiB aligned (huge-page advised), "
          "smaller ones ordinary; a store's own arrays use it", "[store]") {
  constexpr std::size_t huge = kvsift::kv_allocator<float>::huge_page_bytes;
  STATIC_REQUIRE(huge == std::size_t{2} << 20);
  // under AddressSanitizer every allocation is std::allocator's (exact sizes, overruns seen):
  // then only the contents are checked
  constexpr bool advised = kvsift::kv_allocator<float>::advises_huge_pages;
  const auto aligned = [](const void* p) {
    return !advised || reinterpret_cast<std::uintptr_t>(p) % huge == 0;
  };
  for (const std::size_t bytes : {huge, huge + 4, 3 * huge + 1000, std::size_t{64} << 20}) {
    CAPTURE(bytes);
    kvsift::kv_vector<float> v(bytes / sizeof(float));
    REQUIRE(aligned(v.data()));
    REQUIRE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));  // value-initialised
    v.back() = 3.0f;
    const kvsift::kv_vector<float> copy = v;  // a copy lands in its own huge allocation
    REQUIRE(copy.back() == 3.0f);
    REQUIRE(aligned(copy.data()));
  }
  kvsift::kv_vector<bfloat16> small(1000);  // below the threshold: std::allocator's memory
  small.resize(huge / sizeof(bfloat16));    // regrown across it: moved into an aligned block
  REQUIRE(aligned(small.data()));
  small.resize(10);
  small.shrink_to_fit();  // and back (deallocate picks the path by the same size rule)
  REQUIRE(small.size() == 10);

  // store::dense owns [requests x layers x kv_heads, capacity, d]: here 2 x 2 x 2 x 4096 x 64 f32
  // = 8 MiB each for keys and values, so its first row starts a huge page
  const model_shape sh{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 64};
  kvsift::store::dense<float> s(sh, 2, 4096);
  append_chunk(s, 0, 0, 0, 1);
  REQUIRE(aligned(s.key(0, 0)));
  REQUIRE(aligned(s.value(0, 0)));
}
