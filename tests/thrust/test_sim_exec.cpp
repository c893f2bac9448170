// SPDX-License-Identifier: Apache-2.0
// exec::sim (thrust/exec.hpp): a device on the CPU. Its arena counts allocations (cache hits are
// not allocations) and explicit host<->device copies; a decode-like step of Thrust components
// with caller workspace, run through its policy, allocates nothing and reads nothing back after
// its first run (the CUDA-graph capture laws R1/R2, REDESIGN §3.5), and keeps what the host
// reference keeps. Under the CPP system always, and the OMP system in OpenMP builds.

#include <kvsift/core/exec.hpp>
#include <kvsift/core/memory_space.hpp>
#include <kvsift/core/view.hpp>
#include <kvsift/cpu/segmented_topk.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/thrust/all.hpp>
#include <kvsift/thrust/exec.hpp>

#include <thrust/sort.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

namespace exec = kvsift::exec;
using kvsift::thrust::buffer;
using kvsift::thrust::copy_to_device;
using kvsift::thrust::copy_to_host;
using kvsift::thrust::sim_arena;
using cpp_space = kvsift::sim_space<::thrust::system::cpp::tag>;
using omp_space = kvsift::sim_space<::thrust::system::omp::tag>;

// (c) exec::sim is an Exec whose memory the lifecycle may not dereference.
static_assert(kvsift::Exec<exec::sim_cpp> && kvsift::Exec<exec::sim_omp>);
static_assert(kvsift::MemorySpace<cpp_space> && kvsift::MemorySpace<omp_space>);
static_assert(!kvsift::HostAccessible<cpp_space> && !kvsift::HostAccessible<omp_space>);
static_assert(!exec::sim_cpp::host_visible);
static_assert(std::is_same_v<exec::sim_cpp::memory_space, cpp_space>);
static_assert(!std::is_same_v<cpp_space, omp_space>);
static_assert(exec::sim_cpp::name == std::string_view("sim-cpp") &&
              exec::sim_omp::name == std::string_view("sim-omp"));
static_assert(cpp_space::name == std::string_view("sim"));
// exec::host may not run over sim memory; sim runs over its own.
static_assert(!kvsift::runs_over<exec::host, cpp_space>);
static_assert(kvsift::runs_over<exec::sim_cpp, cpp_space>);
// MemorySpace is opt-in and open: views take sim_space, host-only stores refuse it.
static_assert(!kvsift::MemorySpace<int> && !kvsift::MemorySpace<exec::sim_cpp>);
static_assert(
    std::is_same_v<kvsift::kv_view<float, kvsift::nhd, cpp_space>::memory_space, cpp_space>);
template <class Space>
concept dense_store_over = requires { typename kvsift::store::dense<float, Space>; };
static_assert(dense_store_over<kvsift::host_space> && !dense_store_over<cpp_space>);
static_assert(kvsift::HostAccessible<kvsift::host_space> &&
              !kvsift::HostAccessible<kvsift::device_space>);
// Buffers are tagged with their exec's space.
static_assert(std::is_same_v<buffer<float, exec::sim_cpp>::memory_space, cpp_space>);

#if defined(_OPENMP)
using sim_execs = std::tuple<exec::sim_cpp, exec::sim_omp>;
#else
using sim_execs = std::tuple<exec::sim_cpp>;
#endif

std::vector<std::int32_t> csr(const std::vector<int>& sizes) {
  std::vector<std::int32_t> o(sizes.size() + 1, 0);
  for (std::size_t s = 0; s < sizes.size(); ++s) o[s + 1] = o[s] + sizes[s];
  return o;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("sim_arena counts allocations, not cache hits, and counts copies",
                        "[thrust][sim]", sim_execs) {
  sim_arena arena;
  const TestType e{arena};
  CHECK(arena.counters() == kvsift::thrust::sim_counters{});

  {
    buffer<float, TestType> a(e, 100);  // 400 bytes, rounded to 512
    CHECK(arena.counters().allocations == 1);
    CHECK(arena.counters().allocated_bytes == 512);
    CHECK(arena.live_bytes() == 512);
    CHECK(arena.cached_bytes() == 0);
  }
  CHECK(arena.live_bytes() == 0);
  CHECK(arena.cached_bytes() == 512);

  buffer<float, TestType> b(e, 100);  // the same rounded size: a cache hit
  CHECK(arena.counters().allocations == 1);
  CHECK(arena.counters().allocated_bytes == 512);
  CHECK(arena.counters().cache_hits == 1);
  CHECK(arena.cached_bytes() == 0);
  buffer<std::int32_t, TestType> c(e, 128);  // 512 bytes again, but the cache is empty
  CHECK(arena.counters().allocations == 2);
  CHECK(arena.counters().allocated_bytes == 1024);
  buffer<double, TestType> d(e, 100);  // 800 bytes -> 1024: another size
  CHECK(arena.counters().allocations == 3);
  CHECK(arena.counters().allocated_bytes == 2048);
  CHECK(arena.live_bytes() == 2048);

  // Copies: one count per call, the bytes the host side holds.
  std::vector<float> host(100);
  std::iota(host.begin(), host.end(), 0.5f);
  copy_to_device(e, host, b);
  CHECK(arena.counters().h2d_writes == 1);
  CHECK(arena.counters().h2d_bytes == 400);
  CHECK(arena.counters().d2h_reads == 0);
  std::vector<float> back(10, -1.0f);
  copy_to_host(e, b, back);  // a prefix
  CHECK(arena.counters().d2h_reads == 1);
  CHECK(arena.counters().d2h_bytes == 40);
  CHECK(back == std::vector<float>(host.begin(), host.begin() + 10));
  // Copies allocate nothing.
  CHECK(arena.counters().allocations == 3);

  // Out of range copies and a foreign arena throw before anything is counted.
  std::vector<float> too_many(101);
  CHECK_THROWS_AS(copy_to_device(e, too_many, b), kvsift::error);
  CHECK_THROWS_AS(copy_to_host(e, b, std::span<float>(too_many)), kvsift::error);
  sim_arena other;
  const TestType f{other};
  CHECK_THROWS_AS(copy_to_device(f, host, b), kvsift::error);
  CHECK(arena.counters().h2d_writes == 1);
  CHECK(arena.counters().d2h_reads == 1);

  // Thrust's own temporary storage comes through the policy's allocator: counted on the first
  // sort, served from the cache on a second sort of the same size.
  const std::size_t n = 4096;
  buffer<std::uint64_t, TestType> keys(e, n);
  buffer<std::int32_t, TestType> items(e, n);
  std::vector<std::uint64_t> hk(n);
  std::mt19937_64 rng(7);
  for (auto& k : hk) k = rng() % 1000;
  std::vector<std::int32_t> hi(n);
  std::iota(hi.begin(), hi.end(), 0);
  const auto sort_once = [&] {
    copy_to_device(e, hk, keys);
    copy_to_device(e, hi, items);
    ::thrust::stable_sort_by_key(e.policy(), keys.data(), keys.data() + n, items.data());
  };
  arena.reset_counters();
  CHECK(arena.counters() == kvsift::thrust::sim_counters{});
  sort_once();
  const auto first = arena.counters();
  CHECK(first.allocations > 0);  // the sort's scratch
  CHECK(first.allocated_bytes > 0);
  CHECK(arena.live_bytes() == 2048 + keys.bytes() + items.bytes());
  arena.reset_counters();
  sort_once();
  const auto second = arena.counters();
  CHECK(second.allocations == 0);
  CHECK(second.allocated_bytes == 0);
  CHECK(second.cache_hits == first.allocations + first.cache_hits);
  CHECK(second.h2d_writes == 2);
  CHECK(second.d2h_reads == 0);
  std::vector<std::int32_t> sorted(n);
  copy_to_host(e, items, sorted);
  std::vector<std::int32_t> want(n);
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(),
                   [&](std::int32_t x, std::int32_t y) { return hk[x] < hk[y]; });
  CHECK(sorted == want);
}

TEST_CASE("sim_arena's cache is bounded by max_cached_bytes and emptied by trim",
          "[thrust][sim]") {
  sim_arena arena(1024);
  const exec::sim_cpp e{arena};
  {
    buffer<char, exec::sim_cpp> a(e, 1024);
    buffer<char, exec::sim_cpp> b(e, 1024);
  }
  CHECK(arena.cached_bytes() == 1024);  // the second block went back to the system
  CHECK(arena.counters().allocations == 2);
  {
    buffer<char, exec::sim_cpp> a(e, 1024);
    buffer<char, exec::sim_cpp> b(e, 1024);
  }
  CHECK(arena.counters().allocations == 3);  // one hit, one miss
  CHECK(arena.counters().cache_hits == 1);
  arena.trim();
  CHECK(arena.cached_bytes() == 0);
  buffer<char, exec::sim_cpp> c(e, 1);  // rounded to 256; a zero-size buffer takes nothing
  buffer<char, exec::sim_cpp> z(e, 0);
  CHECK(z.data() == nullptr);
  CHECK(arena.live_bytes() == 256);
  // Moving a buffer moves its block; the moved-from buffer holds none.
  buffer<char, exec::sim_cpp> moved(std::move(c));
  CHECK(arena.live_bytes() == 256);
  CHECK(moved.size() == 1);
}

// (b) The capture law at component level: a decode-like step (segmented top-k with a protected
// sink and window, then a gather of the kept K rows and positions), run through exec::sim's
// policy with caller workspace and buffers allocated once. Shapes are fixed (they are host-known;
// the step's data changes which tokens are kept, never how many): the first step may allocate
// (Thrust's sort scratch, warm-up); steps 2..10 allocate 0 bytes and read 0 bytes back, and
// every step keeps what cpu::topk_of keeps.
TEMPLATE_LIST_TEST_CASE("exec::sim: a decode-like step allocates nothing and reads nothing back "
                        "after warm-up, keeping what the host reference keeps",
                        "[thrust][sim][capture]", sim_execs) {
  const std::vector<int> lengths = {40, 33, 57, 12, 64, 25};  // (request, KV head) segments
  const int S = static_cast<int>(lengths.size());
  const int capacity = 64;
  const int dim = 8;
  const int budget = 16;
  const int sink = 2;
  const int steps = 10;

  const std::vector<std::int32_t> offsets = csr(lengths);
  const std::int64_t num_items = offsets.back();
  std::vector<int> kept_counts(lengths.size());
  for (int s = 0; s < S; ++s) kept_counts[s] = std::min(budget, lengths[s]);
  const std::vector<std::int32_t> kept_offsets = csr(kept_counts);  // host-known shapes
  const std::int64_t num_kept = kept_offsets.back();
  std::vector<std::int32_t> window(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) window[s] = 3 + s % 3;

  // Keys [S, capacity, dim] and positions [S, capacity] (strided, as store::dense keeps them).
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> keys(static_cast<std::size_t>(S) * capacity * dim);
  for (auto& k : keys) k = unit(rng);
  std::vector<std::int32_t> positions(static_cast<std::size_t>(S) * capacity);
  for (int s = 0; s < S; ++s)
    for (int j = 0; j < capacity; ++j) positions[s * capacity + j] = 3 * j + s;
  // Per-step scores, quantised to eighths so that ties occur (ties go to the lower index).
  std::vector<std::vector<float>> scores(steps, std::vector<float>(num_items));
  for (auto& step_scores : scores)
    for (auto& x : step_scores) x = static_cast<float>(static_cast<int>(unit(rng) * 16)) / 8.0f;

  sim_arena arena;
  const TestType e{arena};
  using E = TestType;
  // Everything the step touches, allocated once and uploaded once.
  buffer<float, E> d_keys(e, keys.size());
  buffer<std::int32_t, E> d_positions(e, positions.size());
  buffer<std::int32_t, E> d_offsets(e, offsets.size());
  buffer<std::int32_t, E> d_kept_offsets(e, kept_offsets.size());
  buffer<std::int32_t, E> d_window(e, window.size());
  buffer<float, E> d_scores(e, static_cast<std::size_t>(num_items));
  const std::size_t ws_bytes = kvsift::thrust::segmented_topk_workspace_bytes(num_items);
  buffer<std::byte, E> d_ws(e, ws_bytes);
  std::vector<buffer<std::int32_t, E>> d_kept;
  std::vector<buffer<float, E>> d_rows;
  std::vector<buffer<std::int32_t, E>> d_rows_pos;
  for (int t = 0; t < steps; ++t) {
    d_kept.emplace_back(e, static_cast<std::size_t>(num_kept));
    d_rows.emplace_back(e, static_cast<std::size_t>(S) * budget * dim);
    d_rows_pos.emplace_back(e, static_cast<std::size_t>(S) * budget);
  }
  copy_to_device(e, keys, d_keys);
  copy_to_device(e, positions, d_positions);
  copy_to_device(e, offsets, d_offsets);
  copy_to_device(e, kept_offsets, d_kept_offsets);
  copy_to_device(e, window, d_window);

  kvsift::thrust::segmented_rows<float> src;
  src.data = d_keys.data();
  src.offsets = d_offsets.data();
  src.positions = d_positions.data();
  src.segment_stride = static_cast<std::int64_t>(capacity) * dim;
  src.num_segments = S;
  src.dim = dim;

  const auto step = [&](int t) {
    copy_to_device(e, scores[t], d_scores);  // the step's input (a fixed pinned buffer on a GPU)
    kvsift::thrust::segmented_topk(e.policy(), d_scores.data(), d_offsets.data(), S, num_items,
                                   d_kept_offsets.data(), num_kept, d_kept[t].data(), d_ws.data(),
                                   ws_bytes, {sink, d_window.data()}, /*check=*/false);
    kvsift::thrust::gather_rows(e.policy(), src, d_kept_offsets.data(), d_kept[t].data(),
                                num_kept, d_rows[t].data(), budget, d_rows_pos[t].data());
  };

  arena.reset_counters();
  step(0);  // warm-up: may allocate Thrust's scratch
  const auto warm = arena.counters();
  CHECK(warm.allocations > 0);  // Thrust's sort scratch does go through the arena
  CHECK(warm.d2h_reads == 0);
  CHECK(warm.h2d_writes == 1);
  INFO("warm-up allocations: " << warm.allocations << " (" << warm.allocated_bytes << " bytes)");

  arena.reset_counters();
  for (int t = 1; t < steps; ++t) step(t);
  const auto steady = arena.counters();
  CHECK(steady.allocations == 0);
  CHECK(steady.allocated_bytes == 0);
  CHECK(steady.d2h_reads == 0);
  CHECK(steady.d2h_bytes == 0);
  CHECK(steady.h2d_writes == steps - 1);
  CHECK(steady.h2d_bytes == static_cast<std::int64_t>((steps - 1) * num_items * sizeof(float)));
  CHECK(steady.cache_hits == (steps - 1) * (warm.allocations + warm.cache_hits));

  // Outside the steps: read every step's results back and compare with the host reference.
  for (int t = 0; t < steps; ++t) {
    CAPTURE(t);
    std::vector<std::int32_t> kept(static_cast<std::size_t>(num_kept));
    std::vector<float> rows(static_cast<std::size_t>(S) * budget * dim);
    std::vector<std::int32_t> rows_pos(static_cast<std::size_t>(S) * budget);
    copy_to_host(e, d_kept[t], kept);
    copy_to_host(e, d_rows[t], rows);
    copy_to_host(e, d_rows_pos[t], rows_pos);
    for (int s = 0; s < S; ++s) {
      CAPTURE(s);
      const int n = lengths[s];
      const int k = kept_counts[s];
      const int w = window[s];
      const std::span<const float> seg(scores[t].data() + offsets[s], static_cast<std::size_t>(n));
      std::vector<std::int32_t> want;
      if (k == n) {
        want.resize(static_cast<std::size_t>(n));
        std::iota(want.begin(), want.end(), 0);
      } else {
        std::vector<std::int32_t> candidates(static_cast<std::size_t>(n - sink - w));
        std::iota(candidates.begin(), candidates.end(), sink);
        kvsift::cpu::topk_of(seg, candidates, k - sink - w, want);
        for (int j = 0; j < sink; ++j) want.push_back(j);
        for (int j = n - w; j < n; ++j) want.push_back(j);
        std::sort(want.begin(), want.end());
      }
      const std::vector<std::int32_t> got(kept.begin() + kept_offsets[s],
                                          kept.begin() + kept_offsets[s + 1]);
      REQUIRE(got == want);
      for (int i = 0; i < k; ++i) {
        const int j = want[i];
        CHECK(rows_pos[s * budget + i] == positions[s * capacity + j]);
        for (int c = 0; c < dim; ++c) {
          CHECK(rows[(s * budget + i) * dim + c] == keys[(s * capacity + j) * dim + c]);
        }
      }
    }
  }
  const auto after = arena.counters();
  CHECK(after.d2h_reads == steady.d2h_reads + 3 * steps);
}
