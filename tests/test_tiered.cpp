// SPDX-License-Identifier: Apache-2.0
// store::tiered and transfer::async: the tiers' invariants (host pool complete, resident ⊆ host,
// working set sorted by position, rows equal to the pool's), demotion and recall, stalls,
// cancellation and injected faults. Built also under ThreadSanitizer (ctest label `tsan`).

#include <kvsift/store/tiered.hpp>
#include <kvsift/transfer/async.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

using kvsift::index_sets;
using kvsift::kv_view;
using kvsift::model_shape;
using kvsift::nhd;

constexpr model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};

// Deterministic K/V: element (token, head, c) of key = position*100 + head*10 + c (values negated).
template <class T>
std::vector<T> rows(int first_position, int tokens, int heads, int d, float sign) {
  std::vector<T> out(static_cast<std::size_t>(tokens) * heads * d);
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int c = 0; c < d; ++c)
        out[(static_cast<std::size_t>(t) * heads + h) * d + c] =
            T(sign * static_cast<float>(((first_position + t) % 50) * 4 + h * 2 + c % 2));
  return out;
}

template <class T>
void append(kvsift::store::tiered<T>& s, int request, int layer, int first, int tokens) {
  const auto k = rows<T>(first, tokens, shape.kv_heads, shape.head_dim, 1.0f);
  const auto v = rows<T>(first, tokens, shape.kv_heads, shape.head_dim, -1.0f);
  s.append(request, layer, kv_view<const T, nhd>::contiguous(k.data(), tokens, shape.kv_heads, shape.head_dim),
           kv_view<const T, nhd>::contiguous(v.data(), tokens, shape.kv_heads, shape.head_dim), first);
}

std::vector<std::int32_t> resident_positions(const kvsift::store::tiered<float>& s, std::int64_t seq) {
  std::vector<std::int32_t> p;
  for (int i = 0; i < s.length(seq); ++i) p.push_back(s.position(seq, i));
  return p;
}

// A snapshot of both tiers, byte for byte, to assert "unchanged after an error".
std::vector<float> snapshot(const kvsift::store::tiered<float>& s) {
  std::vector<float> out;
  for (int r = 0; r < s.requests(); ++r)
    for (int l = 0; l < shape.layers; ++l)
      for (int h = 0; h < shape.kv_heads; ++h) {
        const auto seq = shape.sequence(r, l, h);
        out.push_back(static_cast<float>(s.length(seq)));
        for (int i = 0; i < s.length(seq); ++i) {
          out.push_back(static_cast<float>(s.position(seq, i)));
          out.insert(out.end(), s.key(seq, i), s.key(seq, i) + shape.head_dim);
          out.insert(out.end(), s.value(seq, i), s.value(seq, i) + shape.head_dim);
        }
        out.push_back(static_cast<float>(s.host_length(r, l)));
        for (int i = 0; i < s.host_length(r, l); ++i)
          out.insert(out.end(), s.host_key(seq, i), s.host_key(seq, i) + shape.head_dim);
      }
  return out;
}

index_sets keep_every(int n_heads, const std::vector<std::int32_t>& slots) {
  index_sets k;
  for (int h = 0; h < n_heads; ++h) k.push_back(slots);
  return k;
}

}  // namespace

TEMPLATE_TEST_CASE("tiered: append lands in both tiers; retain demotes without losing the pool",
                   "[tiered]", float, kvsift::half, kvsift::bfloat16) {
  kvsift::store::tiered<TestType> s(shape, 2, 64, 4);
  append(s, 0, 1, 0, 10);
  append(s, 0, 1, 12, 3);  // a gap in positions is allowed (chunked prefill with holes)
  const auto seq = shape.sequence(0, 1, 1);
  REQUIRE(s.length(seq) == 13);
  REQUIRE(s.host_length(0, 1) == 13);
  REQUIRE(s.next_position(0, 1) == 15);
  REQUIRE(s.host_index(0, 1, 12) == 10);
  REQUIRE(s.host_index(0, 1, 11) == -1);
  const auto before = s.stats();
  REQUIRE(before.device_bytes == before.host_bytes);

  s.retain(0, 1, keep_every(shape.kv_heads, {0, 3, 12}));
  REQUIRE(s.length(seq) == 3);
  REQUIRE(s.position(seq, 2) == 14);
  REQUIRE(s.host_length(0, 1) == 13);
  const auto after = s.stats();
  REQUIRE(after.host_bytes == before.host_bytes);  // the pool keeps every token
  REQUIRE(after.device_bytes == 2 * 3 * 2 * shape.head_dim * static_cast<std::int64_t>(sizeof(TestType)));
  REQUIRE(after.bytes_to_host == 0);               // write-through pool: demotion moves nothing
  REQUIRE_NOTHROW(s.verify());
}

TEST_CASE("tiered: promote brings tokens back between resident ones, sorted, rows exact", "[tiered]") {
  kvsift::store::tiered<float> s(shape, 1, 64, 4);
  append(s, 0, 0, 0, 20);
  const auto seq = shape.sequence(0, 0, 0);
  s.retain(0, 0, keep_every(shape.kv_heads, {0, 1, 18, 19}));
  const std::vector<std::int32_t> want{0, 1, 5, 6, 7, 18, 19};
  s.promote(seq, want);
  REQUIRE(resident_positions(s, seq) == want);
  REQUIRE(s.stats().bytes_to_device == 3 * 2 * shape.head_dim * static_cast<std::int64_t>(sizeof(float)));
  for (int i = 0; i < s.length(seq); ++i) {
    const int hi = s.host_index(0, 0, s.position(seq, i));
    REQUIRE(std::memcmp(s.key(seq, i), s.host_key(seq, hi), shape.head_dim * sizeof(float)) == 0);
    REQUIRE(std::memcmp(s.value(seq, i), s.host_value(seq, hi), shape.head_dim * sizeof(float)) == 0);
  }
  REQUIRE_NOTHROW(s.verify());
  // the other head was not touched
  REQUIRE(s.length(shape.sequence(0, 0, 1)) == 4);
}

TEST_CASE("tiered: bad targets throw kvsift::error and leave both tiers unchanged", "[tiered]") {
  kvsift::store::tiered<float> s(shape, 1, 16, 4);
  append(s, 0, 0, 0, 10);
  s.retain(0, 0, keep_every(shape.kv_heads, {1, 2}));
  const auto seq = shape.sequence(0, 0, 0);
  const auto before = snapshot(s);
  const std::vector<std::int32_t> unsorted{3, 2};
  const std::vector<std::int32_t> absent{2, 10};
  REQUIRE_THROWS_WITH(s.promote(seq, unsorted), Catch::Matchers::ContainsSubstring("positions[1]"));
  REQUIRE_THROWS_WITH(s.promote(seq, absent), Catch::Matchers::ContainsSubstring("host pool"));
  REQUIRE_THROWS_AS(s.promote(999, absent), kvsift::error);
  REQUIRE_THROWS_AS(s.retain(0, 0, keep_every(shape.kv_heads, {5})), kvsift::error);  // slot >= length
  REQUIRE_THROWS_WITH(append(s, 0, 0, 10, 7), Catch::Matchers::ContainsSubstring("host pool"));
  REQUIRE_THROWS_AS(append(s, 0, 0, 3, 1), kvsift::error);  // position going back
  kvsift::store::landing<float> empty;
  empty.dim = shape.head_dim;
  const std::vector<std::int32_t> needs_recall{1, 2, 4};
  REQUIRE_THROWS_WITH(s.install(seq, needs_recall, empty), Catch::Matchers::ContainsSubstring("completed recall"));
  REQUIRE(snapshot(s) == before);
}

TEST_CASE("async: a recall completes in the background and installs exactly the pool's rows",
          "[tiered][async][tsan]") {
  kvsift::store::tiered<float> s(shape, 2, 256, 16);
  append(s, 1, 1, 0, 200);
  const auto seq0 = shape.sequence(1, 1, 0), seq1 = shape.sequence(1, 1, 1);
  s.retain(1, 1, keep_every(shape.kv_heads, {0, 199}));
  const bool staged = GENERATE(false, true);
  CAPTURE(staged);
  kvsift::transfer::async<float> xfer({.chunk_rows = 7, .staged = staged});  // several chunks
  std::vector<std::int32_t> page(16);
  std::iota(page.begin(), page.end(), 32);  // one whole page (block copy)
  std::vector<std::int32_t> scattered{3, 50, 51, 120, 198};
  const auto t = xfer.submit(s, {{seq0, page}, {seq1, scattered}});
  const auto& landed = xfer.wait(t);
  std::vector<std::int32_t> want0{0};
  want0.insert(want0.end(), page.begin(), page.end());
  want0.push_back(199);
  std::vector<std::int32_t> want1{0, 3, 50, 51, 120, 198, 199};
  s.install(seq0, want0, landed);
  s.install(seq1, want1, landed);
  xfer.release(t);
  REQUIRE(resident_positions(s, seq0) == want0);
  REQUIRE(resident_positions(s, seq1) == want1);
  REQUIRE_NOTHROW(s.verify());
  REQUIRE(xfer.bytes_moved() == (16 + 5) * 2 * shape.head_dim * static_cast<std::int64_t>(sizeof(float)));
  REQUIRE(xfer.stats().recalls_completed == 1);
  REQUIRE(xfer.outstanding() == 0);
}

TEST_CASE("async: waiting on a recall still in flight is a stall, and the data is complete",
          "[tiered][async][tsan]") {
  kvsift::store::tiered<float> s(shape, 1, 128, 8);
  append(s, 0, 0, 0, 100);
  const auto seq = shape.sequence(0, 0, 1);
  s.retain(0, 0, keep_every(shape.kv_heads, {99}));
  kvsift::transfer::async<float> xfer;
  xfer.pause(true);
  std::vector<std::int32_t> want(40);
  std::iota(want.begin(), want.end(), 10);
  const auto t = xfer.submit(s, {{seq, want}});
  REQUIRE_FALSE(xfer.ready(t));
  // decode steps go on while the recall is in flight: new tokens land in both tiers
  append(s, 0, 0, 100, 1);
  append(s, 0, 0, 101, 1);
  REQUIRE(s.length(seq) == 3);
  std::jthread release_later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    xfer.pause(false);
  });
  const auto& landed = xfer.wait(t);
  REQUIRE(xfer.stats().stalls == 1);
  REQUIRE(xfer.stats().wait_seconds > 0.0);
  want.insert(want.end(), {99, 100, 101});
  s.install(seq, want, landed);
  xfer.release(t);
  REQUIRE(resident_positions(s, seq) == want);
  REQUIRE_NOTHROW(s.verify());
  // a recall that completed before its wait is not a stall
  std::vector<std::int32_t> one{5};
  const auto t2 = xfer.submit(s, {{seq, one}});
  xfer.wait();
  REQUIRE(xfer.ready(t2));
  (void)xfer.wait(t2);
  REQUIRE(xfer.stats().stalls == 1);
  xfer.release(t2);
}

TEST_CASE("async: overlapping and cancelled recalls leave the tiers consistent", "[tiered][async][tsan]") {
  kvsift::store::tiered<float> s(shape, 1, 64, 8);
  append(s, 0, 1, 0, 50);
  const auto seq = shape.sequence(0, 1, 0);
  s.retain(0, 1, keep_every(shape.kv_heads, {49}));
  kvsift::transfer::async<float> xfer;
  xfer.pause(true);
  const std::vector<std::int32_t> a{1, 2, 3, 4}, b{3, 4, 5, 6};
  const auto ta = xfer.submit(s, {{seq, a}});
  const auto tb = xfer.submit(s, {{seq, b}});  // overlaps a
  xfer.cancel(ta);  // queued: never runs (the worker is paused), so it copied nothing
  REQUIRE_THROWS_AS(xfer.ready(ta), kvsift::error);  // a cancelled ticket is gone
  REQUIRE(xfer.stats().recalls_completed == 0);
  REQUIRE(xfer.bytes_moved() == 0);
  REQUIRE(xfer.outstanding() == 1);
  xfer.pause(false);
  const auto& landed = xfer.wait(tb);
  const std::vector<std::int32_t> want{3, 4, 5, 6, 49};
  s.install(seq, want, landed);
  xfer.release(tb);
  REQUIRE(resident_positions(s, seq) == want);
  REQUIRE(xfer.stats().recalls_cancelled == 1);
  REQUIRE(xfer.outstanding() == 0);
  REQUIRE_NOTHROW(s.verify());
}

TEST_CASE("async: injected faults throw kvsift::error, change nothing, and the next recall works",
          "[tiered][async][tsan]") {
  kvsift::store::tiered<float> s(shape, 1, 64, 8);
  append(s, 0, 0, 0, 40);
  const auto seq = shape.sequence(0, 0, 0);
  s.retain(0, 0, keep_every(shape.kv_heads, {39}));
  const auto before = snapshot(s);
  const bool staged = GENERATE(false, true);
  CAPTURE(staged);
  kvsift::transfer::async<float> xfer({.chunk_rows = 4, .staged = staged});
  std::vector<std::int32_t> want(20);
  std::iota(want.begin(), want.end(), 0);

  xfer.inject(kvsift::transfer::fault::submit_fails);
  REQUIRE_THROWS_WITH(xfer.submit(s, {{seq, want}}), Catch::Matchers::ContainsSubstring("submit_fails"));
  REQUIRE(xfer.outstanding() == 0);

  xfer.inject(kvsift::transfer::fault::copy_fails);
  const auto t = xfer.submit(s, {{seq, want}});
  REQUIRE_THROWS_WITH(xfer.wait(t), Catch::Matchers::ContainsSubstring("copy_fails"));
  // a failed recall keeps throwing (its partial landing is never handed out) until released
  REQUIRE(xfer.ready(t));
  REQUIRE_THROWS_WITH(xfer.wait(t), Catch::Matchers::ContainsSubstring("copy_fails"));
  xfer.release(t);
  REQUIRE(xfer.bytes_moved() == 0);
  REQUIRE(xfer.outstanding() == 0);
  // what the failures counted: the submit that failed was never accepted; the copy that failed
  // was accepted, with nothing moved (the store is const to the transfer: nothing to check
  // there; test_transfer_faults.cpp checks the methods' stores around such failures)
  REQUIRE(xfer.stats().recalls_issued == 1);
  REQUIRE(xfer.stats().bytes_moved == 0);
  REQUIRE(resident_positions(s, seq) == std::vector<std::int32_t>{39});

  const auto t2 = xfer.submit(s, {{seq, want}});
  want.push_back(39);
  s.install(seq, want, xfer.wait(t2));
  xfer.release(t2);
  REQUIRE(resident_positions(s, seq) == want);
  REQUIRE_NOTHROW(s.verify());

  // bad input is rejected on the caller's thread before anything is queued
  const std::vector<std::int32_t> absent{60};
  REQUIRE_THROWS_WITH(xfer.submit(s, {{seq, absent}}), Catch::Matchers::ContainsSubstring("host pool"));
  REQUIRE_THROWS_AS(xfer.submit(s, {{-1, absent}}), kvsift::error);
  REQUIRE(xfer.outstanding() == 0);
}

TEST_CASE("tiered: a random walk of demotes, promotes and recalls keeps every invariant",
          "[tiered][async][tsan]") {
  kvsift::store::tiered<float> s(shape, 2, 300, 16);
  kvsift::transfer::async<float> xfer({.chunk_rows = 16});
  std::mt19937 rng(7);
  for (int r = 0; r < 2; ++r)
    for (int l = 0; l < shape.layers; ++l) append(s, r, l, 0, 100 + 30 * r);
  for (int step = 0; step < 60; ++step) {
    const int r = static_cast<int>(rng() % 2), l = static_cast<int>(rng() % shape.layers);
    append(s, r, l, s.next_position(r, l), 1);
    const int h = static_cast<int>(rng() % shape.kv_heads);
    const auto seq = shape.sequence(r, l, h);
    std::vector<std::int32_t> target;
    for (int i = 0; i < s.host_length(r, l); ++i)
      if (rng() % 3 == 0 || i == s.host_length(r, l) - 1) target.push_back(s.host_position(r, l, i));
    if (step % 2 == 0) {
      s.promote(seq, target);
    } else {
      std::vector<std::int32_t> missing;
      for (const auto p : target)
        if (!s.resident(seq, p)) missing.push_back(p);
      const auto t = xfer.submit(s, {{seq, missing}});
      s.install(seq, target, xfer.wait(t));
      xfer.release(t);
    }
    REQUIRE(resident_positions(s, seq) == target);
    REQUIRE_NOTHROW(s.verify());
  }
  REQUIRE(xfer.outstanding() == 0);
}

TEST_CASE("async: a waiting thread copies the claims the worker has not taken; rows are the pool's",
          "[tiered][async][tsan]") {
  // Many small claims, waited on at once: the worker and the waiting thread split them (which
  // one copies what varies from run to run); every row must still be the pool's, every time.
  kvsift::store::tiered<float> s(shape, 1, 512, 16);
  append(s, 0, 0, 0, 500);
  const auto seq = shape.sequence(0, 0, 1);
  s.retain(0, 0, keep_every(shape.kv_heads, {499}));
  const int chunk = GENERATE(1, 3, 64);
  CAPTURE(chunk);
  kvsift::transfer::async<float> xfer({.chunk_rows = chunk});
  std::vector<std::int32_t> want;
  for (int p = 0; p < 499; p += (p % 32 < 16 ? 1 : 7)) want.push_back(p);  // pages and scattered
  for (int round = 0; round < 20; ++round) {
    const auto t = xfer.submit(s, {{seq, want}});
    const auto& landed = xfer.wait(t);
    REQUIRE(landed.positions[0].size() == want.size());
    bool same = true;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const int index = s.host_index(0, 0, want[i]);
      same = same && std::memcmp(landed.key(0, static_cast<int>(i)), s.host_key(seq, index), 8 * sizeof(float)) == 0 &&
             std::memcmp(landed.value(0, static_cast<int>(i)), s.host_value(seq, index), 8 * sizeof(float)) == 0;
    }
    REQUIRE(same);
    xfer.release(t);
  }
  REQUIRE(xfer.stats().recalls_completed == 20);
  REQUIRE(xfer.bytes_moved() == 20 * static_cast<std::int64_t>(want.size() * 2 * 8 * sizeof(float)));
  // cancelled while the worker may be half way through (or already done): a recall counts its
  // bytes whole or not at all, the ticket is gone, nothing is left over
  const auto moved = xfer.bytes_moved();
  const auto recall_bytes = static_cast<std::int64_t>(want.size() * 2 * 8 * sizeof(float));
  for (int round = 0; round < 20; ++round) {
    const auto t = xfer.submit(s, {{seq, want}});
    xfer.cancel(t);
    REQUIRE_THROWS_AS(xfer.ready(t), kvsift::error);
  }
  REQUIRE((xfer.bytes_moved() - moved) % recall_bytes == 0);
  REQUIRE(xfer.bytes_moved() - moved <= 20 * recall_bytes);
  REQUIRE(xfer.outstanding() == 0);
  REQUIRE(xfer.stats().recalls_cancelled == 20);
}

TEST_CASE("async: a wait on a recall the worker never starts copies it itself (the helping path)",
          "[tiered][async][tsan]") {
  // The worker is paused and never resumed: only the waiting thread can copy the recall. The wait
  // is a stall, it returns (it does not deadlock), and every row is the pool's.
  kvsift::store::tiered<float> s(shape, 1, 256, 16);
  append(s, 0, 0, 0, 200);
  const auto seq = shape.sequence(0, 0, 1);
  s.retain(0, 0, keep_every(shape.kv_heads, {199}));
  const bool staged = GENERATE(false, true);
  CAPTURE(staged);
  kvsift::transfer::async<float> xfer({.chunk_rows = 8, .staged = staged});
  xfer.pause(true);
  std::vector<std::int32_t> want;
  for (int p = 0; p < 199; p += (p % 32 < 16 ? 1 : 5)) want.push_back(p);
  const auto t = xfer.submit(s, {{seq, want}});
  REQUIRE_FALSE(xfer.ready(t));
  const auto& landed = xfer.wait(t);
  REQUIRE(xfer.stats().stalls == 1);
  REQUIRE(xfer.stats().recalls_completed == 1);
  REQUIRE(landed.positions[0].size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const int index = s.host_index(0, 0, want[i]);
    CAPTURE(i);
    REQUIRE(std::memcmp(landed.key(0, static_cast<int>(i)), s.host_key(seq, index), 8 * sizeof(float)) == 0);
    REQUIRE(std::memcmp(landed.value(0, static_cast<int>(i)), s.host_value(seq, index), 8 * sizeof(float)) == 0);
  }
  const std::vector<std::int32_t> target = [&] { auto w = want; w.push_back(199); return w; }();
  s.install(seq, target, landed);
  xfer.release(t);
  REQUIRE(resident_positions(s, seq) == target);
  REQUIRE_NOTHROW(s.verify());
}

TEST_CASE("tiered: install merges in place — kept rows keep their bytes, recalled rows land between",
          "[tiered]") {
  kvsift::store::tiered<float> s(shape, 1, 256, 16);
  append(s, 0, 1, 0, 200);
  const auto seq = shape.sequence(0, 1, 0);
  // resident: every 10th token; recall the ones between some of them, drop others
  std::vector<std::int32_t> resident;
  for (int p = 0; p < 200; p += 10) resident.push_back(p);
  std::vector<std::int32_t> target;
  for (int p = 0; p < 200; ++p)
    if ((p % 10 == 0 && p % 30 != 0) || (p > 45 && p < 60) || p == 199) target.push_back(p);
  index_sets keep;
  for (int h = 0; h < shape.kv_heads; ++h) {
    std::vector<std::int32_t> slots;
    for (const auto p : resident) slots.push_back(p);  // slot == position before any demotion
    keep.push_back(slots);
  }
  s.retain(0, 1, keep);
  REQUIRE(resident_positions(s, seq) == resident);
  std::vector<std::int32_t> missing;
  for (const auto p : target)
    if (!s.resident(seq, p)) missing.push_back(p);
  kvsift::transfer::async<float> xfer;
  const auto t = xfer.submit(s, {{seq, missing}});
  const auto moved_before = s.stats().bytes_to_device;
  s.install(seq, target, xfer.wait(t));
  xfer.release(t);
  REQUIRE(resident_positions(s, seq) == target);
  REQUIRE(s.stats().bytes_to_device - moved_before ==
          static_cast<std::int64_t>(missing.size()) * 2 * 8 * static_cast<std::int64_t>(sizeof(float)));
  REQUIRE_NOTHROW(s.verify());  // every row byte-equal to the pool's
  // shrinking to a few rows gives the buffers' memory back; growing again still verifies
  s.promote(seq, std::vector<std::int32_t>{199});
  REQUIRE(resident_positions(s, seq) == std::vector<std::int32_t>{199});
  s.promote(seq, target);
  REQUIRE(resident_positions(s, seq) == target);
  REQUIRE_NOTHROW(s.verify());
}
