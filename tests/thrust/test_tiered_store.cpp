// SPDX-License-Identifier: Apache-2.0
// thrust::tiered_store (thrust/tiered_store.hpp): store::tiered over exec::sim memory. Its laws:
// after the same appends, retains, installs (store::tiered::promote) and resets, each working set
// maps the same positions to the same K/V rows as store::tiered's (compared by position: the
// physical slot order differs by design), its plan ascends and equals store::tiered's positions,
// the pools hold the same rows, every count equals; an install moves no resident row (a row
// resident before and after keeps its slot and bytes); once warm, append, retain, install and
// plan_sorted allocate nothing and read nothing back (the capture laws R1/R2 of REDESIGN §3.5);
// host-visible bad input throws kvsift::error naming the argument and changes nothing; bad
// device data is caught on the device, leaves a valid store and is raised by check().
// f32, f16 and bf16; under the CPP system always, and OMP in OpenMP builds.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/core/shape.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/exec.hpp>
#include <kvsift/thrust/tiered_store.hpp>

#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

namespace exec = kvsift::exec;
using kvsift::model_shape;
using kvsift::nhd;
using kvsift::thrust::buffer;
using kvsift::thrust::copy_to_device;
using kvsift::thrust::copy_to_host;
using kvsift::thrust::sim_arena;
using i32 = std::int32_t;

template <class T_, class E_>
struct config {
  using T = T_;
  using E = E_;
};

#if defined(_OPENMP)
using store_configs =
    std::tuple<config<float, exec::sim_cpp>, config<kvsift::half, exec::sim_cpp>,
               config<kvsift::bfloat16, exec::sim_cpp>, config<float, exec::sim_omp>,
               config<kvsift::half, exec::sim_omp>, config<kvsift::bfloat16, exec::sim_omp>>;
#else
using store_configs =
    std::tuple<config<float, exec::sim_cpp>, config<kvsift::half, exec::sim_cpp>,
               config<kvsift::bfloat16, exec::sim_cpp>>;
#endif

template <class T>
std::vector<T> random_rows(std::mt19937& rng, int tokens, int heads, int d) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<T> x(static_cast<std::size_t>(tokens) * heads * d);
  for (T& f : x) f = kvsift::from_float<T>(u(rng));
  return x;
}

// What the device holds, read back (counted copies, outside any step).
template <class T>
struct snapshot {
  std::vector<i32> plan_slots, plan_positions, slot_positions, pool_positions;
  std::vector<T> tier_keys, tier_values, pool_keys, pool_values;
};

template <class C>
struct fixture {
  using T = typename C::T;
  using E = typename C::E;
  model_shape shape{2, 4, 2, 8};  // layers, q_heads, kv_heads, head_dim
  int requests = 3;
  int host_capacity = 48;
  int tier_capacity = 20;
  sim_arena arena;
  E e{arena};
  kvsift::thrust::tiered_store<T, E> dev{e, shape, requests, host_capacity, tier_capacity};
  kvsift::store::tiered<T> ref{shape, requests, host_capacity, 4};
  std::int64_t S = static_cast<std::int64_t>(requests) * shape.sequences_per_request();
  buffer<T, E> k_in{e, static_cast<std::size_t>(host_capacity) * shape.kv_heads * shape.head_dim};
  buffer<T, E> v_in{e, k_in.size()};
  buffer<i32, E> idx_in{e, static_cast<std::size_t>(S) * tier_capacity};
  buffer<i32, E> plan_offsets{e, static_cast<std::size_t>(S) + 1};
  buffer<i32, E> plan_slots{e, static_cast<std::size_t>(S) * tier_capacity};
  buffer<i32, E> plan_positions{e, static_cast<std::size_t>(S) * tier_capacity};
  std::vector<std::int64_t> all_seqs;

  fixture() {
    for (std::int64_t s = 0; s < S; ++s) all_seqs.push_back(s);
  }

  [[nodiscard]] std::size_t d() const { return static_cast<std::size_t>(shape.head_dim); }
  [[nodiscard]] std::size_t row_bytes() const { return d() * sizeof(T); }

  void append(int r, int l, const std::vector<T>& k, const std::vector<T>& v, int tokens,
              i32 first) {
    const int H = shape.kv_heads, dd = shape.head_dim;
    ref.append(r, l, kvsift::kv_view<const T, nhd>::contiguous(k.data(), tokens, H, dd),
               kvsift::kv_view<const T, nhd>::contiguous(v.data(), tokens, H, dd), first);
    copy_to_device(e, std::span<const T>(k), k_in);
    copy_to_device(e, std::span<const T>(v), v_in);
    using dview = kvsift::kv_view<const T, nhd, typename E::memory_space>;
    dev.append(r, l, dview::contiguous(k_in.data(), tokens, H, dd),
               dview::contiguous(v_in.data(), tokens, H, dd), first);
  }
  // Every (request, layer) gets a prompt of lo + rng() % span tokens from position 0.
  void fill_prompts(std::mt19937& rng, int lo, int span) {
    const int H = shape.kv_heads, dd = shape.head_dim;
    for (int r = 0; r < requests; ++r) {
      for (int l = 0; l < shape.layers; ++l) {
        const int n = lo + static_cast<int>(rng() % span);
        append(r, l, random_rows<T>(rng, n, H, dd), random_rows<T>(rng, n, H, dd), n, 0);
      }
    }
  }
  void retain(int r, int l, const kvsift::index_sets& kept) {
    ref.retain(r, l, kept);
    retain_dev(r, l, kept);
  }
  void retain_dev(int r, int l, const kvsift::index_sets& kept) {
    std::vector<int> counts;
    for (int h = 0; h < kept.segments(); ++h) counts.push_back(kept.size(h));
    copy_to_device(e, std::span<const i32>(kept.values), idx_in);
    dev.retain(r, l, counts, idx_in.data());
  }
  void install_dev(const std::vector<std::int64_t>& seqs, const std::vector<std::vector<i32>>& sets,
                   bool far = false) {
    std::vector<int> counts;
    std::vector<i32> flat;
    for (const auto& s : sets) {
      counts.push_back(static_cast<int>(s.size()));
      flat.insert(flat.end(), s.begin(), s.end());
    }
    copy_to_device(e, std::span<const i32>(flat), idx_in);
    dev.install(seqs, counts, idx_in.data(), far);
  }
  void install(const std::vector<std::int64_t>& seqs, const std::vector<std::vector<i32>>& sets) {
    for (std::size_t r = 0; r < seqs.size(); ++r) ref.promote(seqs[r], sets[r]);
    install_dev(seqs, sets);
  }
  void reset(int r) {
    ref.reset(r);
    dev.reset(r);
  }

  snapshot<T> read() {
    snapshot<T> s;
    const std::size_t ts = static_cast<std::size_t>(S) * tier_capacity;
    const std::size_t ps = static_cast<std::size_t>(S) * host_capacity;
    s.plan_slots.resize(ts);
    s.plan_positions.resize(ts);
    s.slot_positions.resize(ts);
    s.pool_positions.resize(ps);
    s.tier_keys.resize(ts * d());
    s.tier_values.resize(ts * d());
    s.pool_keys.resize(ps * d());
    s.pool_values.resize(ps * d());
    copy_to_host(e, dev.plan_slots(), std::span<i32>(s.plan_slots));
    copy_to_host(e, dev.plan_positions(), std::span<i32>(s.plan_positions));
    copy_to_host(e, dev.slot_positions(), std::span<i32>(s.slot_positions));
    copy_to_host(e, dev.pool_positions(), std::span<i32>(s.pool_positions));
    copy_to_host(e, dev.tier_keys(), std::span<T>(s.tier_keys));
    copy_to_host(e, dev.tier_values(), std::span<T>(s.tier_values));
    copy_to_host(e, dev.pool_keys(), std::span<T>(s.pool_keys));
    copy_to_host(e, dev.pool_values(), std::span<T>(s.pool_values));
    return s;
  }

  // Everything the device store holds equals the reference's: counts, each working set as a
  // position -> (key, value) map in plan order, the plan from plan_sorted, the pools.
  void expect_equal() {
    const auto s = read();
    REQUIRE(dev.resident_tokens() == ref.resident_tokens());
    REQUIRE(dev.resident_bytes() == ref.resident_bytes());
    REQUIRE(dev.host_tokens() == ref.host_tokens());
    REQUIRE(dev.host_bytes() == ref.host_bytes());
    // plan_sorted over every head-sequence: offsets, slots and positions
    const auto total = dev.plan_sorted(all_seqs, plan_offsets.data(), plan_slots.data(),
                                       plan_positions.data());
    REQUIRE(total == ref.resident_tokens());
    std::vector<i32> offsets(static_cast<std::size_t>(S) + 1), pslots(static_cast<std::size_t>(total)),
        ppos(static_cast<std::size_t>(total));
    copy_to_host(e, plan_offsets, std::span<i32>(offsets));
    copy_to_host(e, plan_slots, std::span<i32>(pslots));
    copy_to_host(e, plan_positions, std::span<i32>(ppos));
    const std::size_t Ct = static_cast<std::size_t>(tier_capacity);
    const std::size_t Ch = static_cast<std::size_t>(host_capacity);
    for (int r = 0; r < requests; ++r) {
      for (int l = 0; l < shape.layers; ++l) {
        REQUIRE(dev.next_position(r, l) == ref.next_position(r, l));
        REQUIRE(dev.host_length(r, l) == ref.host_length(r, l));
        for (int h = 0; h < shape.kv_heads; ++h) {
          const auto seq = shape.sequence(r, l, h);
          const int n = ref.length(seq);
          REQUIRE(dev.length(seq) == n);
          REQUIRE(offsets[seq + 1] - offsets[seq] == n);
          for (int i = 0; i < n; ++i) {
            const std::size_t at = static_cast<std::size_t>(seq) * Ct + i;
            const i32 pos = ref.position(seq, i);
            REQUIRE(s.plan_positions[at] == pos);  // plan order = store::tiered's slot order
            REQUIRE(ppos[offsets[seq] + i] == pos);
            const i32 slot = s.plan_slots[at];
            REQUIRE(pslots[offsets[seq] + i] == slot);
            REQUIRE(slot >= 0);
            REQUIRE(slot < tier_capacity);
            REQUIRE(s.slot_positions[static_cast<std::size_t>(seq) * Ct + slot] == pos);
            const std::size_t row = static_cast<std::size_t>(seq) * Ct + slot;
            REQUIRE(std::memcmp(s.tier_keys.data() + row * d(), ref.key(seq, i), row_bytes()) == 0);
            REQUIRE(std::memcmp(s.tier_values.data() + row * d(), ref.value(seq, i), row_bytes()) == 0);
          }
          const int m = ref.host_length(r, l);
          for (int i = 0; i < m; ++i) {
            const std::size_t row = static_cast<std::size_t>(seq) * Ch + i;
            REQUIRE(s.pool_positions[row] == ref.host_position(r, l, i));
            REQUIRE(std::memcmp(s.pool_keys.data() + row * d(), ref.host_key(seq, i), row_bytes()) == 0);
            REQUIRE(std::memcmp(s.pool_values.data() + row * d(), ref.host_value(seq, i), row_bytes()) == 0);
          }
        }
      }
    }
    const auto ds = dev.stats();
    const auto rs = ref.stats();
    REQUIRE(ds.bytes_to_device == rs.bytes_to_device);
    REQUIRE(ds.host_bytes == rs.host_bytes);
    REQUIRE(ds.device_bytes == rs.device_bytes);
    REQUIRE_NOTHROW(dev.verify());
  }

  // A random new working set for seq: each resident position kept with probability 2/3, each
  // pool position not resident added with probability 1/3, at most tier_capacity of them.
  std::vector<i32> random_working_set(std::mt19937& rng, std::int64_t seq) {
    const auto [r, l] = ref.request_layer(seq);
    std::vector<i32> out;
    for (const i32 pos : ref.host_positions(r, l)) {
      const bool res = ref.resident(seq, pos);
      if (res ? rng() % 3 != 0 : rng() % 3 == 0) out.push_back(pos);
    }
    while (static_cast<int>(out.size()) > tier_capacity) {
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(rng() % out.size()));
    }
    return out;
  }
};

}  // namespace

TEMPLATE_LIST_TEST_CASE("thrust::tiered_store equals store::tiered over random appends, "
                        "retains, installs and resets; an install moves no resident row",
                        "[thrust][tiered_store]", store_configs) {
  fixture<TestType> f;
  using T = typename TestType::T;
  std::mt19937 rng(17);
  const int H = f.shape.kv_heads, dd = f.shape.head_dim;
  const std::size_t Ct = static_cast<std::size_t>(f.tier_capacity);
  int installs = 0, recalled_rows = 0, stayed_rows = 0;
  for (int op = 0; op < 240; ++op) {
    const int r = static_cast<int>(rng() % f.requests);
    const int l = static_cast<int>(rng() % f.shape.layers);
    const int kind = static_cast<int>(rng() % 12);
    CAPTURE(op, kind, r, l);
    int room = f.host_capacity - f.ref.host_length(r, l);
    for (int h = 0; h < H; ++h) {
      room = std::min(room, f.tier_capacity - f.ref.length(f.shape.sequence(r, l, h)));
    }
    if (kind < 5 && room > 0) {
      const int tokens = 1 + static_cast<int>(rng() % std::min(room, 7));
      const i32 first = f.ref.next_position(r, l) + static_cast<int>(rng() % 3);
      f.append(r, l, random_rows<T>(rng, tokens, H, dd), random_rows<T>(rng, tokens, H, dd), tokens, first);
    } else if (kind < 8) {
      kvsift::index_sets kept;
      for (int h = 0; h < H; ++h) {
        const int n = f.ref.length(f.shape.sequence(r, l, h));
        std::vector<i32> slots;
        for (int i = 0; i < n; ++i) {
          if (rng() % 3 != 0) slots.push_back(i);
        }
        kept.push_back(slots);
      }
      f.retain(r, l, kept);
    } else if (kind < 11) {
      // targets: a random subset of every head-sequence, in random order
      std::vector<std::int64_t> seqs;
      for (std::int64_t s = 0; s < f.S; ++s) {
        if (rng() % 3 == 0) seqs.push_back(s);
      }
      std::shuffle(seqs.begin(), seqs.end(), rng);
      std::vector<std::vector<i32>> sets;
      for (const auto s : seqs) sets.push_back(f.random_working_set(rng, s));
      const auto before = f.read();
      std::vector<std::map<i32, i32>> resident_before;  // per target: position -> slot
      for (const auto s : seqs) {
        std::map<i32, i32> m;
        for (int i = 0; i < f.ref.length(s); ++i) {
          m[before.plan_positions[static_cast<std::size_t>(s) * Ct + i]] =
              before.plan_slots[static_cast<std::size_t>(s) * Ct + i];
        }
        resident_before.push_back(m);
      }
      f.install(seqs, sets);
      ++installs;
      // a row resident before and after keeps its slot and its bytes; the others arrive
      const auto after = f.read();
      for (std::size_t t = 0; t < seqs.size(); ++t) {
        const std::size_t base = static_cast<std::size_t>(seqs[t]) * Ct;
        for (std::size_t i = 0; i < sets[t].size(); ++i) {
          const auto it = resident_before[t].find(sets[t][i]);
          if (it == resident_before[t].end()) {
            ++recalled_rows;
            continue;
          }
          ++stayed_rows;
          REQUIRE(after.plan_slots[base + i] == it->second);
          const std::size_t row = (base + static_cast<std::size_t>(it->second)) * f.d();
          REQUIRE(std::memcmp(after.tier_keys.data() + row, before.tier_keys.data() + row, f.row_bytes()) == 0);
          REQUIRE(std::memcmp(after.tier_values.data() + row, before.tier_values.data() + row, f.row_bytes()) == 0);
        }
      }
      // rows of head-sequences not named are untouched, bit for bit (free slots hold whatever
      // the arena's reused block held, NaN patterns included: compared as bytes)
      for (std::int64_t s = 0; s < f.S; ++s) {
        if (std::find(seqs.begin(), seqs.end(), s) != seqs.end()) continue;
        const std::size_t base = static_cast<std::size_t>(s) * Ct;
        REQUIRE(std::memcmp(after.tier_keys.data() + base * f.d(), before.tier_keys.data() + base * f.d(),
                            Ct * f.row_bytes()) == 0);
        REQUIRE(std::equal(after.plan_slots.begin() + base, after.plan_slots.begin() + base + Ct,
                           before.plan_slots.begin() + base));
      }
    } else {
      f.reset(r);
    }
    f.expect_equal();
  }
  // the random walk exercised what it is about
  CHECK(installs > 30);
  CHECK(recalled_rows > 100);
  CHECK(stayed_rows > 100);
  CHECK(f.dev.stats().installs == installs);
  REQUIRE_NOTHROW(f.dev.check());
}

TEMPLATE_LIST_TEST_CASE("thrust::tiered_store: once warm, a decode-like step (append a token, "
                        "evict one, recall one, plan) allocates nothing and reads nothing back",
                        "[thrust][tiered_store]", store_configs) {
  fixture<TestType> f;
  using T = typename TestType::T;
  std::mt19937 rng(3);
  const int H = f.shape.kv_heads, dd = f.shape.head_dim;
  f.append(0, 1, random_rows<T>(rng, 16, H, dd), random_rows<T>(rng, 16, H, dd), 16, 0);
  f.append(2, 0, random_rows<T>(rng, 5, H, dd), random_rows<T>(rng, 5, H, dd), 5, 0);
  std::vector<std::int64_t> heads;
  for (int h = 0; h < H; ++h) heads.push_back(f.shape.sequence(0, 1, h));
  const auto step = [&](int t) {
    f.append(0, 1, random_rows<T>(rng, 1, H, dd), random_rows<T>(rng, 1, H, dd), 1, 16 + t);
    kvsift::index_sets kept;  // evict plan index 2 of every head
    for (int h = 0; h < H; ++h) {
      const int n = f.ref.length(heads[h]);
      std::vector<i32> slots{0, 1};
      for (int i = 3; i < n; ++i) slots.push_back(i);
      kept.push_back(slots);
    }
    f.retain(0, 1, kept);
    std::vector<std::vector<i32>> sets;  // drop plan index 3, recall the oldest evicted token
    for (int h = 0; h < H; ++h) {
      std::vector<i32> set;
      for (int i = 0; i < f.ref.length(heads[h]); ++i) {
        if (i != 3) set.push_back(f.ref.position(heads[h], i));
      }
      for (const i32 pos : f.ref.host_positions(0, 1)) {
        if (!f.ref.resident(heads[h], pos)) {
          set.push_back(pos);
          break;
        }
      }
      std::sort(set.begin(), set.end());
      sets.push_back(set);
    }
    f.install(heads, sets);
    (void)f.dev.plan_sorted(f.all_seqs, f.plan_offsets.data(), f.plan_slots.data(),
                            f.plan_positions.data());
  };
  step(0);  // warm-up
  f.arena.reset_counters();
  for (int t = 1; t <= 10; ++t) step(t);
  const auto c = f.arena.counters();
  CHECK(c.allocations == 0);
  CHECK(c.allocated_bytes == 0);
  CHECK(c.cache_hits == 0);  // not even Thrust temporary storage from the cache
  CHECK(c.d2h_reads == 0);
  // per step: the token's keys and values, the kept indices and the new positions (the test's
  // copies), and the descriptors of retain, install and plan_sorted (the store's)
  CHECK(c.h2d_writes == 10 * 7);
  f.expect_equal();
  CHECK(f.ref.stats().bytes_to_device > 0);
}

TEMPLATE_LIST_TEST_CASE("thrust::tiered_store: bad host input throws kvsift::error naming it "
                        "and changes nothing",
                        "[thrust][tiered_store]", store_configs) {
  fixture<TestType> f;
  using T = typename TestType::T;
  using E = typename TestType::E;
  std::mt19937 rng(11);
  const int H = f.shape.kv_heads, dd = f.shape.head_dim;
  f.append(1, 0, random_rows<T>(rng, 12, H, dd), random_rows<T>(rng, 12, H, dd), 12, 0);
  kvsift::index_sets kept;
  kept.push_back(std::vector<i32>{0, 2, 4, 6});
  kept.push_back(std::vector<i32>{1, 3});
  f.retain(1, 0, kept);
  f.expect_equal();
  const auto before = f.read();
  const auto names = [&](auto&& call, const std::string& arg) {
    try {
      call();
      FAIL("no kvsift::error for " + arg);
    } catch (const kvsift::error& err) {
      INFO(err.what());
      CHECK(std::string(err.what()).find("'" + arg + "'") != std::string::npos);
    }
  };
  using dview = kvsift::kv_view<const T, nhd, typename E::memory_space>;
  const auto k1 = dview::contiguous(f.k_in.data(), 1, H, dd);
  const auto k17 = dview::contiguous(f.k_in.data(), 17, H, dd);  // pool room 36, tier room 16
  const auto k40 = dview::contiguous(f.k_in.data(), 40, H, dd);
  const auto wrong_heads = dview::contiguous(f.k_in.data(), 1, H + 1, dd);
  names([&] { f.dev.append(1, 0, k1, k1, 11); }, "first_position");
  names([&] { f.dev.append(1, 0, k17, k17, 12); }, "k.tokens");  // the tier's room
  names([&] { f.dev.append(1, 0, k40, k40, 12); }, "k.tokens");  // the pool's room
  names([&] { f.dev.append(1, 0, wrong_heads, wrong_heads, 12); }, "k.heads");
  names([&] { f.dev.append(5, 0, k1, k1, 12); }, "request");
  names([&] { f.dev.append(1, 2, k1, k1, 12); }, "layer");
  names([&] { f.dev.append(1, 0, k1, k1, std::numeric_limits<i32>::max()); }, "first_position");
  const std::vector<int> over{5, 2}, short_counts{2};
  names([&] { f.dev.retain(1, 0, over, f.idx_in.data()); }, "kept_counts[0]");
  names([&] { f.dev.retain(1, 0, short_counts, f.idx_in.data()); }, "kept_counts.size()");
  names([&] { f.dev.retain(1, 0, std::vector<int>{1, 1}, nullptr); }, "kept");
  const auto s0 = f.shape.sequence(1, 0, 0), s1 = f.shape.sequence(1, 0, 1);
  const auto empty = f.shape.sequence(0, 0, 0);  // its pool is empty
  using seqv = std::vector<std::int64_t>;
  names([&] { f.dev.install(seqv{s0, s1}, std::vector<int>{2}, f.idx_in.data()); }, "counts.size()");
  names([&] { f.dev.install(seqv{s0, f.S}, std::vector<int>{2, 2}, f.idx_in.data()); }, "seqs[1]");
  names([&] { f.dev.install(seqv{s0, -1}, std::vector<int>{2, 2}, f.idx_in.data()); }, "seqs[1]");
  names([&] { f.dev.install(seqv{s1, s1}, std::vector<int>{2, 2}, f.idx_in.data()); }, "seqs[1]");
  names([&] { f.dev.install(seqv{s0, s1}, std::vector<int>{2, 13}, f.idx_in.data()); }, "counts[1]");
  names([&] { f.dev.install(seqv{s0}, std::vector<int>{-1}, f.idx_in.data()); }, "counts[0]");
  names([&] { f.dev.install(seqv{s0, empty}, std::vector<int>{2, 1}, f.idx_in.data()); }, "counts[1]");
  names([&] { f.dev.install(seqv{s0}, std::vector<int>{2}, nullptr); }, "positions");
  names([&] { (void)f.dev.plan_sorted(seqv{s0, f.S}, nullptr, f.plan_slots.data(), nullptr); }, "seqs[1]");
  names([&] { f.dev.reset(3); }, "request");
  // counts over tier_capacity: a small store where the pool outgrows the tier
  {
    sim_arena arena;
    E e{arena};
    kvsift::thrust::tiered_store<T, E> small(e, model_shape{1, 1, 1, 4}, 1, 16, 4);
    buffer<T, E> rows{e, 16 * 4};
    buffer<i32, E> pos{e, 16};
    copy_to_device(e, std::span<const T>(std::vector<T>(16 * 4, kvsift::from_float<T>(0.5f))), rows);
    const auto v4 = dview::contiguous(rows.data(), 4, 1, 4);
    for (int c = 0; c < 3; ++c) {
      small.append(0, 0, v4, v4, 4 * c);
      const std::vector<int> none{0};
      small.retain(0, 0, none, nullptr);
    }
    names([&] { small.install(seqv{0}, std::vector<int>{5}, pos.data()); }, "counts[0]");
    names([&] { (void)kvsift::thrust::tiered_store<T, E>(e, model_shape{1, 1, 1, 4}, 1, 16, 0); },
          "tier_capacity");
    names([&] { (void)kvsift::thrust::tiered_store<T, E>(e, model_shape{1, 1, 1, 4}, 1, 0, 4); },
          "host_capacity");
    names([&] { (void)kvsift::thrust::tiered_store<T, E>(e, model_shape{1, 1, 1, 4}, 0, 16, 4); },
          "requests");
  }
  // nothing changed: not the device's contents, not a count
  const auto after = f.read();
  CHECK(after.plan_slots == before.plan_slots);
  CHECK(after.plan_positions == before.plan_positions);
  CHECK(after.slot_positions == before.slot_positions);
  CHECK(after.pool_positions == before.pool_positions);
  CHECK(f.dev.stats().installs == 0);
  f.expect_equal();
  REQUIRE_NOTHROW(f.dev.check());
}

TEMPLATE_LIST_TEST_CASE("thrust::tiered_store: bad device data leaves a valid store and is "
                        "raised by check()",
                        "[thrust][tiered_store]", store_configs) {
  fixture<TestType> f;
  using T = typename TestType::T;
  std::mt19937 rng(5);
  const int H = f.shape.kv_heads, dd = f.shape.head_dim;
  f.append(2, 1, random_rows<T>(rng, 10, H, dd), random_rows<T>(rng, 10, H, dd), 10, 0);
  f.append(0, 0, random_rows<T>(rng, 6, H, dd), random_rows<T>(rng, 6, H, dd), 6, 3);
  kvsift::index_sets kept;
  kept.push_back(std::vector<i32>{0, 1, 2, 8});
  kept.push_back(std::vector<i32>{5, 6, 7, 9});
  f.retain(2, 1, kept);
  f.expect_equal();
  CHECK_NOTHROW(f.dev.check());
  const auto a = f.shape.sequence(2, 1, 0), b = f.shape.sequence(2, 1, 1), c = f.shape.sequence(0, 0, 1);

  SECTION("install: descending positions and a position not in the pool") {
    // a: descending (bad); b: fine; c: 2 is not in its pool (3..8) (bad)
    const std::vector<std::vector<i32>> sets{{0, 5, 3}, {1, 2, 6}, {2, 4}};
    f.install_dev({a, b, c}, sets);
    // the reference: a bad target gets its pool's newest counts[r] positions
    f.ref.promote(a, std::vector<i32>{7, 8, 9});
    f.ref.promote(b, sets[1]);
    f.ref.promote(c, std::vector<i32>{7, 8});
    f.expect_equal();
    try {
      f.dev.check();
      FAIL("check() did not raise");
    } catch (const kvsift::error& err) {
      CHECK(std::string(err.what()).find("'positions'") != std::string::npos);
      CHECK(std::string(err.what()).find("install") != std::string::npos);
    }
    CHECK_NOTHROW(f.dev.check());  // raised once
  }
  SECTION("retain: an index past the length and a descending set") {
    const std::vector<i32> bad{0, 9, 3, 1};  // head 0: {0, 9} (9 >= 4); head 1: {3, 1}
    copy_to_device(f.e, std::span<const i32>(bad), f.idx_in);
    f.dev.retain(2, 1, std::vector<int>{2, 2}, f.idx_in.data());
    kvsift::index_sets first;  // a bad head keeps its first rows
    first.push_back(std::vector<i32>{0, 1});
    first.push_back(std::vector<i32>{0, 1});
    f.ref.retain(2, 1, first);
    f.expect_equal();
    try {
      f.dev.check();
      FAIL("check() did not raise");
    } catch (const kvsift::error& err) {
      CHECK(std::string(err.what()).find("'kept'") != std::string::npos);
    }
    CHECK_NOTHROW(f.dev.check());
  }
  SECTION("append: a NaN key; with a bad retain before one check(), both named") {
    auto k = random_rows<T>(rng, 2, H, dd);
    k[static_cast<std::size_t>(H) * dd + dd + 3] =
        kvsift::from_float<T>(std::numeric_limits<float>::quiet_NaN());
    f.append(2, 1, k, random_rows<T>(rng, 2, H, dd), 2, 10);
    try {
      f.dev.check();
      FAIL("check() did not raise the non-finite row");
    } catch (const kvsift::error& err) {
      CHECK(std::string(err.what()).find("NaN or Inf") != std::string::npos);
    }
    CHECK_NOTHROW(f.dev.check());
    f.append(2, 1, k, random_rows<T>(rng, 2, H, dd), 2, 12);
    const std::vector<i32> bad{1, 0};
    copy_to_device(f.e, std::span<const i32>(bad), f.idx_in);
    f.dev.retain(2, 1, std::vector<int>{2, 0}, f.idx_in.data());
    try {
      f.dev.check();
      FAIL("check() did not raise");
    } catch (const kvsift::error& err) {
      const std::string what = err.what();
      CHECK(what.find("'kept'") != std::string::npos);
      CHECK(what.find("also: a NaN or Inf") != std::string::npos);
    }
  }
}

TEMPLATE_LIST_TEST_CASE("thrust::tiered_store allocates everything at construction and "
                        "fills an empty tier's slots in order",
                        "[thrust][tiered_store]", store_configs) {
  using T = typename TestType::T;
  using E = typename TestType::E;
  sim_arena arena;
  E e{arena};
  const model_shape shape{1, 2, 1, 16};
  const auto before = arena.live_bytes();
  kvsift::thrust::tiered_store<T, E> st(e, shape, 2, 64, 8);
  CHECK(arena.live_bytes() - before >= st.allocated_bytes());
  CHECK(st.allocated_bytes() >= 2 * (64 + 8) * 16 * 2 * sizeof(T));  // pool and tier rows
  const auto c = arena.counters();
  buffer<T, E> rows{e, 5 * 16};
  copy_to_device(e, std::span<const T>(std::vector<T>(5 * 16, kvsift::from_float<T>(0.5f))), rows);
  using dview = kvsift::kv_view<const T, nhd, typename E::memory_space>;
  const auto v5 = dview::contiguous(rows.data(), 5, 1, 16);
  st.append(1, 0, v5, v5, 0);
  std::vector<i32> slots(5);
  copy_to_host(e, st.plan_slots() + 8, std::span<i32>(slots));
  CHECK(slots == std::vector<i32>{0, 1, 2, 3, 4});
  CHECK(arena.counters().allocations == c.allocations + 1);  // the test's rows only
}

TEMPLATE_LIST_TEST_CASE("thrust::tiered_store: attention over the unordered slots through "
                        "plan_sorted equals attention over store::tiered's working sets",
                        "[thrust][tiered_store]", store_configs) {
  fixture<TestType> f;
  using T = typename TestType::T;
  using E = typename TestType::E;
  std::mt19937 rng(23);
  const int H = f.shape.kv_heads, dd = f.shape.head_dim, G = f.shape.q_heads / H;
  const int RL = f.requests * f.shape.layers;  // attention's "requests": one per (request, layer)
  f.fill_prompts(rng, 6, 12);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::int64_t> seqs;
    std::vector<std::vector<i32>> sets;
    for (std::int64_t s = 0; s < f.S; ++s) {
      if (s % 3 == 0) continue;  // some head-sequences keep everything
      seqs.push_back(s);
      auto set = f.random_working_set(rng, s);
      if (set.empty()) set.push_back(f.ref.position(s, f.ref.length(s) - 1));
      sets.push_back(set);
    }
    f.install(seqs, sets);
    for (int r = 0; r < f.requests; ++r) {  // new tokens land in slots freed by the install
      f.append(r, 1, random_rows<T>(rng, 2, H, dd), random_rows<T>(rng, 2, H, dd), 2,
               f.ref.next_position(r, 1));
    }
  }
  f.expect_equal();
  // one query per (request, layer), at a position that hides the newest tokens of some heads
  std::vector<float> q(static_cast<std::size_t>(RL) * H * G * dd);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : q) x = u(rng);
  std::vector<i32> qpos(static_cast<std::size_t>(RL));
  for (int r = 0; r < f.requests; ++r) {
    for (int l = 0; l < f.shape.layers; ++l) qpos[r * f.shape.layers + l] = f.ref.next_position(r, l) - 2;
  }
  const std::size_t out_size = q.size();
  // device: the slots as they lie, read through the plan
  buffer<float, E> dq{f.e, q.size()}, dout{f.e, out_size};
  buffer<i32, E> dqpos{f.e, qpos.size()};
  copy_to_device(f.e, std::span<const float>(q), dq);
  copy_to_device(f.e, std::span<const i32>(qpos), dqpos);
  const auto total = f.dev.plan_sorted(f.all_seqs, f.plan_offsets.data(), f.plan_slots.data(), nullptr);
  const std::size_t ws_bytes = kvsift::thrust::attention_workspace_bytes(total, G, 1);
  buffer<std::byte, E> dws{f.e, ws_bytes};
  kvsift::thrust::attention_over(
      f.e.policy(), f.dev.slot_key_rows(), f.dev.slot_value_rows(),
      kvsift::thrust::window_queries{dq.data(), dqpos.data(), 1, H, G},
      kvsift::thrust::attention_plan{f.plan_offsets.data(), f.plan_slots.data()},
      f.S * f.tier_capacity, total, dout.data(), nullptr, dws.data(), ws_bytes);
  std::vector<float> out(out_size);
  copy_to_host(f.e, dout, std::span<float>(out));
  std::vector<i32> plan(static_cast<std::size_t>(total));
  copy_to_host(f.e, f.plan_slots, std::span<i32>(plan));
  std::vector<i32> plan_offsets(static_cast<std::size_t>(f.S) + 1);
  copy_to_host(f.e, f.plan_offsets, std::span<i32>(plan_offsets));
  int unordered = 0;  // head-sequences whose slots do lie out of position order
  for (std::int64_t s = 0; s < f.S; ++s) {
    if (!std::is_sorted(plan.begin() + plan_offsets[s], plan.begin() + plan_offsets[s + 1])) ++unordered;
  }
  CHECK(unordered > f.S / 4);
  // reference: store::tiered's working sets packed in slot (= position) order, no plan
  std::vector<T> keys, values;
  std::vector<i32> positions, offsets{0};
  for (std::int64_t s = 0; s < f.S; ++s) {
    for (int i = 0; i < f.ref.length(s); ++i) {
      keys.insert(keys.end(), f.ref.key(s, i), f.ref.key(s, i) + dd);
      values.insert(values.end(), f.ref.value(s, i), f.ref.value(s, i) + dd);
      positions.push_back(f.ref.position(s, i));
    }
    offsets.push_back(static_cast<i32>(positions.size()));
  }
  REQUIRE(static_cast<std::int64_t>(positions.size()) == total);
  const auto seg = [&](const std::vector<T>& rows) {
    return kvsift::thrust::segmented_rows<T>{rows.data(), offsets.data(), positions.data(), 0,
                                             static_cast<int>(f.S), dd};
  };
  std::vector<float> want(out_size);
  std::vector<std::byte> ws(ws_bytes);
  kvsift::thrust::attention_over(::thrust::cpp::par, seg(keys), seg(values),
                                 kvsift::thrust::window_queries{q.data(), qpos.data(), 1, H, G},
                                 kvsift::thrust::attention_plan{}, total, total, want.data(),
                                 nullptr, ws.data(), ws_bytes);
  CHECK(out == want);
  CHECK(std::any_of(want.begin(), want.end(), [](float x) { return x != 0.0f; }));
}

// far_tier::attend's install (install(..., far = true)): every working set holds the positions
// store::tiered's promote gives it, but a missing position is placed in a far slot that names its
// pool row instead of copying it: nothing is counted in bytes_to_device, and working_rows reads
// each plan entry's key and value as store::tiered's working set holds them (far slots from the
// pool, resident slots from the tier). Appends after it are resident; verify() holds throughout.
TEMPLATE_LIST_TEST_CASE("thrust::tiered_store: a far install places rows without copying; "
                        "working_rows reads them in the pool",
                        "[thrust][tiered_store][far_tier]", store_configs) {
  fixture<TestType> f;
  using T = typename TestType::T;
  std::mt19937 rng(31);
  const int H = f.shape.kv_heads, dd = f.shape.head_dim;
  f.fill_prompts(rng, 10, 8);
  int far_slots = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<std::int64_t> seqs;
    std::vector<std::vector<i32>> sets;
    for (std::int64_t s = 0; s < f.S; ++s) {
      seqs.push_back(s);
      sets.push_back(f.random_working_set(rng, s));
      if (sets.back().size() > 16) sets.back().resize(16);  // room for the round's append
    }
    for (std::size_t r = 0; r < seqs.size(); ++r) f.ref.promote(seqs[r], sets[r]);
    f.install_dev(seqs, sets, /*far=*/true);
    CHECK(f.dev.stats().bytes_to_device == 0);  // what recall would copy stays in the pool
    REQUIRE_NOTHROW(f.dev.verify());
    const auto rows = f.dev.rows();
    std::int64_t round_far = 0;
    for (std::int64_t seq = 0; seq < f.S; ++seq) {
      REQUIRE(f.dev.length(seq) == f.ref.length(seq));
      for (int i = 0; i < f.ref.length(seq); ++i) {
        const i32 slot = f.dev.plan_slots()[seq * f.tier_capacity + i];
        REQUIRE(f.dev.plan_positions()[seq * f.tier_capacity + i] == f.ref.position(seq, i));
        round_far += rows.far(seq, slot) ? 1 : 0;
        REQUIRE(std::memcmp(rows.key(seq, slot), f.ref.key(seq, i), f.row_bytes()) == 0);
        REQUIRE(std::memcmp(rows.value(seq, slot), f.ref.value(seq, i), f.row_bytes()) == 0);
      }
    }
    far_slots += static_cast<int>(round_far);
    // a far slot holds no row in the tier: resident counts the rest
    CHECK(f.dev.far_tokens() == round_far);
    CHECK(f.dev.resident_tokens() == f.dev.held_slots() - round_far);
    CHECK(f.dev.resident_bytes() ==
          f.dev.resident_tokens() * static_cast<std::int64_t>(2 * f.row_bytes()));
    for (int r = 0; r < f.requests; ++r) {  // new tokens are resident, in freed slots
      f.append(r, 0, random_rows<T>(rng, 1, H, dd), random_rows<T>(rng, 1, H, dd), 1,
               f.ref.next_position(r, 0));
      for (int h = 0; h < H; ++h) {
        const auto seq = f.shape.sequence(r, 0, h);
        const i32 slot = f.dev.plan_slots()[seq * f.tier_capacity + f.dev.length(seq) - 1];
        CHECK_FALSE(rows.far(seq, slot));
      }
    }
    CHECK(f.dev.far_tokens() == round_far);  // appends are resident
    REQUIRE_NOTHROW(f.dev.verify());
  }
  CHECK(f.ref.stats().bytes_to_device > 0);
  CHECK(far_slots > 0);
  // one policy per store: a copying install after far ones is refused, the store unchanged
  CHECK(f.dev.far_installed());
  const auto before = f.read();
  const auto plan_before = before.plan_positions;
  REQUIRE_THROWS_AS(f.install_dev({0}, {{f.ref.position(0, 0)}}, /*far=*/false), kvsift::error);
  CHECK(f.read().plan_positions == plan_before);
  REQUIRE_NOTHROW(f.dev.verify());
}
