// SPDX-License-Identifier: Apache-2.0
// thrust::dense_store (thrust/dense_store.hpp): store::dense over exec::sim memory. Its laws:
// after the same appends, retains and resets it holds what store::dense holds (rows, positions,
// lengths, next positions, in slot order); side columns move with their rows; once warm, append
// and retain allocate nothing and read nothing back (the capture laws R1/R2 of REDESIGN §3.5);
// host-visible bad input throws kvsift::error and changes nothing; bad device slots are caught on
// the device and raised by check(). Under the CPP system always, and OMP in OpenMP builds.

#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/thrust/dense_store.hpp>
#include <kvsift/thrust/exec.hpp>

#include <thrust/copy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <limits>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace exec = kvsift::exec;
using kvsift::model_shape;
using kvsift::nhd;
using kvsift::thrust::buffer;
using kvsift::thrust::copy_to_device;
using kvsift::thrust::copy_to_host;
using kvsift::thrust::sim_arena;

#if defined(_OPENMP)
using store_execs = std::tuple<exec::sim_cpp, exec::sim_omp>;
#else
using store_execs = std::tuple<exec::sim_cpp>;
#endif

// The column a test writes after each append: a function of the row's sequence and position,
// so a column value that did not move with its row shows as a mismatch.
struct mark_fn {
  float* column;
  const std::int32_t* positions;
  std::int64_t capacity;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t row) const {
    column[row] = static_cast<float>(positions[row]) * 0.5f + static_cast<float>(row / capacity);
  }
};

template <class E>
struct fixture {
  model_shape shape{2, 4, 2, 8};  // layers, q_heads, kv_heads, head_dim
  int requests = 3;
  int capacity = 40;
  sim_arena arena;
  E e{arena};
  kvsift::thrust::dense_store<float, E> dev{e, shape, requests, capacity, 1};
  kvsift::store::dense<float> ref{shape, requests, capacity};
  buffer<float, E> k_in{e, static_cast<std::size_t>(capacity) * shape.kv_heads * shape.head_dim};
  buffer<float, E> v_in{e, k_in.size()};
  buffer<std::int32_t, E> kept_in{e, static_cast<std::size_t>(shape.kv_heads) * capacity};

  void append(int r, int l, const std::vector<float>& k, const std::vector<float>& v, int tokens,
              std::int32_t first) {
    const int H = shape.kv_heads, d = shape.head_dim;
    ref.append(r, l, kvsift::kv_view<const float, nhd>::contiguous(k.data(), tokens, H, d),
               kvsift::kv_view<const float, nhd>::contiguous(v.data(), tokens, H, d), first);
    copy_to_device(e, std::span<const float>(k), k_in);
    copy_to_device(e, std::span<const float>(v), v_in);
    using dview = kvsift::kv_view<const float, nhd, typename E::memory_space>;
    dev.append(r, l, dview::contiguous(k_in.data(), tokens, H, d),
               dview::contiguous(v_in.data(), tokens, H, d), first);
  }
  void mark_column() {  // column 0 := f(sequence, position) for every row
    ::thrust::for_each_n(e.policy(), ::thrust::counting_iterator<std::int64_t>(0),
                         dev.sequences() * capacity, mark_fn{dev.column(0), dev.positions(), capacity});
  }
  void retain(int r, int l, const kvsift::index_sets& kept) {
    ref.retain(r, l, kept);
    std::vector<int> counts;
    for (int h = 0; h < kept.segments(); ++h) counts.push_back(static_cast<int>(kept.size(h)));
    copy_to_device(e, std::span<const std::int32_t>(kept.values), kept_in);
    dev.retain(r, l, counts, kept_in.data());
  }
  // Every resident row, position and column value of the device store equals the reference's.
  void expect_equal() {
    const int d = shape.head_dim;
    const std::size_t rows = static_cast<std::size_t>(dev.sequences()) * capacity;
    std::vector<float> keys(rows * d), values(rows * d), column(rows);
    std::vector<std::int32_t> positions(rows);
    // The whole arrays, through buffers the store exposes only as pointers: read via a
    // temporary copy of each (counted, outside any step).
    buffer<float, E> kb{e, rows * d}, vb{e, rows * d}, cb{e, rows};
    buffer<std::int32_t, E> pb{e, rows};
    ::thrust::copy_n(e.policy(), dev.keys(), rows * d, kb.data());
    ::thrust::copy_n(e.policy(), dev.values(), rows * d, vb.data());
    ::thrust::copy_n(e.policy(), dev.column(0), rows, cb.data());
    ::thrust::copy_n(e.policy(), dev.positions(), rows, pb.data());
    copy_to_host(e, kb, std::span<float>(keys));
    copy_to_host(e, vb, std::span<float>(values));
    copy_to_host(e, cb, std::span<float>(column));
    copy_to_host(e, pb, std::span<std::int32_t>(positions));
    REQUIRE(dev.resident_tokens() == ref.resident_tokens());
    // key_rows()'s offsets (scanned on the device after each change) give every length
    const auto kr = dev.key_rows();
    REQUIRE(kr.offsets == dev.value_rows().offsets);
    std::vector<std::int32_t> offsets(static_cast<std::size_t>(dev.sequences()) + 1);
    buffer<std::int32_t, E> ob{e, offsets.size()};
    ::thrust::copy_n(e.policy(), kr.offsets, offsets.size(), ob.data());
    copy_to_host(e, ob, std::span<std::int32_t>(offsets));
    for (std::int64_t seq = 0; seq < dev.sequences(); ++seq) {
      REQUIRE(offsets[seq + 1] - offsets[seq] == ref.length(seq));
    }
    for (int r = 0; r < requests; ++r) {
      for (int l = 0; l < shape.layers; ++l) {
        REQUIRE(dev.next_position(r, l) == ref.next_position(r, l));
        for (int h = 0; h < shape.kv_heads; ++h) {
          const auto seq = shape.sequence(r, l, h);
          REQUIRE(dev.length(seq) == ref.length(seq));
          for (int i = 0; i < ref.length(seq); ++i) {
            const std::size_t row = static_cast<std::size_t>(seq) * capacity + i;
            REQUIRE(positions[row] == ref.position(seq, i));
            REQUIRE(std::equal(keys.begin() + row * d, keys.begin() + (row + 1) * d, ref.key(seq, i)));
            REQUIRE(std::equal(values.begin() + row * d, values.begin() + (row + 1) * d,
                               ref.value(seq, i)));
            REQUIRE(column[row] == static_cast<float>(ref.position(seq, i)) * 0.5f +
                                       static_cast<float>(seq));
          }
        }
      }
    }
  }
};

std::vector<float> random_rows(std::mt19937& rng, int tokens, int heads, int d) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(tokens) * heads * d);
  for (float& f : x) f = u(rng);
  return x;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("thrust::dense_store equals store::dense over random appends, retains "
                        "and resets; columns move with their rows",
                        "[thrust][dense_store]", store_execs) {
  fixture<TestType> f;
  std::mt19937 rng(7);
  const int H = f.shape.kv_heads, d = f.shape.head_dim;
  for (int op = 0; op < 300; ++op) {
    const int r = static_cast<int>(rng() % f.requests);
    const int l = static_cast<int>(rng() % f.shape.layers);
    const int kind = static_cast<int>(rng() % 10);
    int room = f.capacity;
    for (int h = 0; h < H; ++h) room = std::min(room, f.capacity - f.ref.length(f.shape.sequence(r, l, h)));
    if (kind < 5 && room > 0) {
      const int tokens = 1 + static_cast<int>(rng() % std::min(room, 8));
      const std::int32_t first = f.ref.next_position(r, l) + static_cast<int>(rng() % 3);
      f.append(r, l, random_rows(rng, tokens, H, d), random_rows(rng, tokens, H, d), tokens, first);
      f.mark_column();  // only rows appended since the last mark change value: the rest equal f
    } else if (kind < 9) {
      kvsift::index_sets kept;
      for (int h = 0; h < H; ++h) {
        const int n = f.ref.length(f.shape.sequence(r, l, h));
        std::vector<std::int32_t> slots;
        for (int i = 0; i < n; ++i) {
          if (rng() % 3 != 0) slots.push_back(i);
        }
        kept.push_back(slots);
      }
      f.retain(r, l, kept);
    } else {
      f.ref.reset(r);
      f.dev.reset(r);
    }
    f.expect_equal();
  }
  REQUIRE_NOTHROW(f.dev.check());
}

TEMPLATE_LIST_TEST_CASE("thrust::dense_store: once warm, a decode-like step (append one token, "
                        "evict one, address the rows) allocates nothing and reads nothing back",
                        "[thrust][dense_store]", store_execs) {
  fixture<TestType> f;
  std::mt19937 rng(3);
  const int H = f.shape.kv_heads, d = f.shape.head_dim;
  f.append(0, 1, random_rows(rng, 16, H, d), random_rows(rng, 16, H, d), 16, 0);
  f.mark_column();
  const auto step = [&](int t) {
    f.append(0, 1, random_rows(rng, 1, H, d), random_rows(rng, 1, H, d), 1, 16 + t);
    (void)f.dev.key_rows();
    kvsift::index_sets kept;  // a sliding window over a sink of 2: drop slot 2
    for (int h = 0; h < H; ++h) {
      const int n = f.ref.length(f.shape.sequence(0, 1, h));
      std::vector<std::int32_t> slots{0, 1};
      for (int i = 3; i < n; ++i) slots.push_back(i);
      kept.push_back(slots);
    }
    f.retain(0, 1, kept);
  };
  step(0);  // warm-up: Thrust's scan scratch comes from the arena once
  f.arena.reset_counters();
  for (int t = 1; t <= 10; ++t) step(t);
  const auto c = f.arena.counters();
  CHECK(c.allocations == 0);
  CHECK(c.d2h_reads == 0);
  // per step: the token's keys and values, the kept slots (the test's copies) and the retain's
  // offsets (the store's descriptor)
  CHECK(c.h2d_writes == 10 * 4);
  f.mark_column();
  f.expect_equal();
}

TEMPLATE_LIST_TEST_CASE("thrust::dense_store: bad input throws kvsift::error naming it and "
                        "changes nothing; bad device slots are raised by check()",
                        "[thrust][dense_store]", store_execs) {
  fixture<TestType> f;
  std::mt19937 rng(11);
  const int H = f.shape.kv_heads, d = f.shape.head_dim;
  f.append(1, 0, random_rows(rng, 6, H, d), random_rows(rng, 6, H, d), 6, 0);
  f.mark_column();
  using dview = kvsift::kv_view<const float, nhd, typename TestType::memory_space>;
  const auto k = dview::contiguous(f.k_in.data(), 1, H, d);
  const auto too_many = dview::contiguous(f.k_in.data(), f.capacity, H, d);
  const auto wrong_heads = dview::contiguous(f.k_in.data(), 1, H + 1, d);
  CHECK_THROWS_AS(f.dev.append(1, 0, k, k, 3), kvsift::error);  // position behind the newest
  CHECK_THROWS_AS(f.dev.append(1, 0, too_many, too_many, 6), kvsift::error);  // no room
  CHECK_THROWS_AS(f.dev.append(1, 0, wrong_heads, wrong_heads, 6), kvsift::error);
  CHECK_THROWS_AS(f.dev.append(5, 0, k, k, 6), kvsift::error);  // request out of range
  const std::vector<int> over{7, 2}, short_counts{2};
  CHECK_THROWS_AS(f.dev.retain(1, 0, over, f.kept_in.data()), kvsift::error);
  CHECK_THROWS_AS(f.dev.retain(1, 0, short_counts, f.kept_in.data()), kvsift::error);
  f.expect_equal();  // nothing changed
  try {
    f.dev.retain(1, 0, over, f.kept_in.data());
  } catch (const kvsift::error& e) {
    CHECK(std::string(e.what()).find("kept_counts[0]") != std::string::npos);
  }
  // Slots the host cannot see: out of range and descending. The retain stays inside each head.
  const std::vector<std::int32_t> bad{0, 9, 3, 1};  // head 0: {0, 9}; head 1: {3, 1}
  copy_to_device(f.e, std::span<const std::int32_t>(bad), f.kept_in);
  const std::vector<int> counts{2, 2};
  f.dev.retain(1, 0, counts, f.kept_in.data());
  CHECK(f.dev.length(f.shape.sequence(1, 0, 0)) == 2);
  CHECK_THROWS_AS(f.dev.check(), kvsift::error);
  CHECK_NOTHROW(f.dev.check());  // raised once
}

TEMPLATE_LIST_TEST_CASE("thrust::dense_store: a NaN or Inf key or value appended is found on the "
                        "device and raised by the next check()",
                        "[thrust][dense_store]", store_execs) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const bool in_values : {false, true}) {
      fixture<TestType> f;
      std::mt19937 rng(5);
      const int H = f.shape.kv_heads, d = f.shape.head_dim;
      f.append(0, 1, random_rows(rng, 3, H, d), random_rows(rng, 3, H, d), 3, 0);
      CHECK_NOTHROW(f.dev.check());  // finite rows: nothing found
      auto k = random_rows(rng, 2, H, d), v = random_rows(rng, 2, H, d);
      (in_values ? v : k)[static_cast<std::size_t>(H) * d + d + 3] = bad;  // token 1, head 1
      f.append(0, 1, k, v, 2, 3);
      try {
        f.dev.check();
        FAIL("check() did not raise the non-finite row");
      } catch (const kvsift::error& e) {
        CHECK(std::string(e.what()).find("NaN or Inf") != std::string::npos);
      }
      CHECK_NOTHROW(f.dev.check());  // raised once
    }
  }
  // both found before one check(): the slot error is raised and names the other too
  fixture<TestType> f;
  std::mt19937 rng(6);
  const int H = f.shape.kv_heads, d = f.shape.head_dim;
  auto k = random_rows(rng, 4, H, d);
  k[1] = std::numeric_limits<float>::quiet_NaN();
  f.append(2, 0, k, random_rows(rng, 4, H, d), 4, 0);
  const std::vector<std::int32_t> bad{3, 1, 0, 1};  // head 0 descending
  copy_to_device(f.e, std::span<const std::int32_t>(bad), f.kept_in);
  f.dev.retain(2, 0, std::vector<int>{2, 2}, f.kept_in.data());
  try {
    f.dev.check();
    FAIL("check() did not raise");
  } catch (const kvsift::error& e) {
    const std::string what = e.what();
    CHECK(what.find("kept") != std::string::npos);
    CHECK(what.find("also: a NaN or Inf") != std::string::npos);
  }
  CHECK_NOTHROW(f.dev.check());
}

TEMPLATE_LIST_TEST_CASE("thrust::dense_store over engine memory allocates only its metadata",
                        "[thrust][dense_store]", store_execs) {
  sim_arena arena;
  TestType e{arena};
  const model_shape shape{1, 2, 1, 16};
  buffer<float, TestType> keys{e, 4 * 32 * 16}, values{e, 4 * 32 * 16};
  const auto before = arena.live_bytes();
  kvsift::thrust::dense_store<float, TestType> st(e, shape, 4, 32, 0, keys.data(), values.data());
  CHECK(st.keys() == keys.data());
  CHECK(st.values() == values.data());
  CHECK(arena.live_bytes() - before < keys.bytes());  // positions, lengths, scratch: not the rows
  CHECK_THROWS_AS((kvsift::thrust::dense_store<float, TestType>(e, shape, 4, 32, 0, keys.data(),
                                                                 nullptr)),
                  kvsift::error);
}
