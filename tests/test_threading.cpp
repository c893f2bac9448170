// SPDX-License-Identifier: Apache-2.0
// The engine's control of threading (issue 29): cpu::scoped_threading runs every parallel loop of
// the library on the calling thread, or hands it to the engine's executor; the choice is scoped
// and per thread, exceptions still reach the caller as kvsift::error, and a method's plans and
// outputs do not depend on it. cpu::host_task, the library's worker beside the caller (the host
// part of far_tier::attend on the simulated device): its task overlaps the caller's work.

#include <kvsift/cpu/host_task.hpp>
#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

// An engine's pool of two threads (the caller waits): counts the loops and items it ran.
class two_thread_executor final : public kvsift::cpu::executor {
 public:
  void bulk(std::int64_t n, void (*body)(void*, std::int64_t), void* ctx) override {
    ++loops;
    std::atomic<std::int64_t> next{0};
    auto work = [&] {
      for (std::int64_t i; (i = next.fetch_add(1)) < n;) {
        body(ctx, i);
        ++items;
      }
    };
    std::thread a(work), b(work);
    a.join();
    b.join();
  }
  std::atomic<int> loops{0};
  std::atomic<std::int64_t> items{0};
};

// Thread ids that ran the iterations of a big parallel loop (above the OpenMP threshold).
std::set<std::thread::id> threads_of_loop(std::int64_t n) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  kvsift::cpu::parallel_for(n, [&](std::int64_t) {
    std::lock_guard lock(mu);
    ids.insert(std::this_thread::get_id());
  }, kvsift::cpu::par, kvsift::cpu::parallel_threshold);
  return ids;
}

}  // namespace

// The OpenMP loop (cpu::detail::run_shares): a share of [0, n) per thread, run first by its own
// thread, the rest taken over by whoever is free. Whatever the team and n, each item runs once.
TEST_CASE("threading: the pool's loop runs every item exactly once, for any team and size",
          "[threading]") {
  for (const int threads : {1, 2, 3, 4, 7, 8, 65, 100}) {  // 65, 100: more than 64 shares
    for (const std::int64_t n : {2, 3, 5, 8, 9, 63, 64, 65, 257, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
      kvsift::cpu::parallel_for(n, [&](std::int64_t i) { runs[static_cast<std::size_t>(i)]++; },
                                kvsift::cpu::par_t{.threads = threads},
                                kvsift::cpu::parallel_threshold);
      int wrong = 0;
      for (const auto& r : runs) wrong += r.load() != 1;
      INFO("threads " << threads << ", n " << n);
      REQUIRE(wrong == 0);
    }
  }
}

TEST_CASE("threading: a parallel loop inside a parallel loop's item runs every inner item once",
          "[threading]") {
  constexpr std::int64_t outer = 6, inner = 37;
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(outer * inner));
  kvsift::cpu::parallel_for(outer, [&](std::int64_t o) {
    kvsift::cpu::parallel_for(inner, [&](std::int64_t i) {
      runs[static_cast<std::size_t>(o * inner + i)]++;
    }, kvsift::cpu::par, kvsift::cpu::parallel_threshold);
  }, kvsift::cpu::par_t{.threads = 3}, kvsift::cpu::parallel_threshold);
  int wrong = 0;
  for (const auto& r : runs) wrong += r.load() != 1;
  REQUIRE(wrong == 0);
}

TEST_CASE("threading: caller runs every loop on the calling thread, executor gets every loop",
          "[threading]") {
  const auto me = std::this_thread::get_id();
  {
    kvsift::cpu::scoped_threading serial(kvsift::cpu::threading::caller);
    CHECK(threads_of_loop(64) == std::set<std::thread::id>{me});
  }
  two_thread_executor pool;
  {
    kvsift::cpu::scoped_threading on_pool(pool);
    const auto ids = threads_of_loop(64);
    CHECK(ids.count(me) == 0);  // the pool's threads ran it
    CHECK(pool.loops == 1);
    CHECK(pool.items == 64);
    {  // scopes nest and restore
      kvsift::cpu::scoped_threading serial(kvsift::cpu::threading::caller);
      CHECK(threads_of_loop(8) == std::set<std::thread::id>{me});
    }
    (void)threads_of_loop(8);
    CHECK(pool.loops == 2);
  }
  (void)threads_of_loop(8);
  CHECK(pool.loops == 2);  // out of scope: not the pool any more
  // per thread: another thread's loops do not see this thread's choice
  kvsift::cpu::scoped_threading on_pool(pool);
  std::thread other([] { (void)threads_of_loop(8); });
  other.join();
  CHECK(pool.loops == 2);
}

TEST_CASE("threading: an exception inside an executor's loop reaches the caller", "[threading]") {
  two_thread_executor pool;
  kvsift::cpu::scoped_threading on_pool(pool);
  std::atomic<int> ran{0};
  REQUIRE_THROWS_WITH(kvsift::cpu::parallel_for(100, [&](std::int64_t i) {
                        ++ran;
                        kvsift::require(i != 37, "loop", "i", i, "not 37");
                      }),
                      Catch::Matchers::ContainsSubstring("not 37"));
  CHECK(ran <= 100);
}

TEST_CASE("threading: SnapKV's plans and outputs are the same on the caller's thread, an executor "
          "and the default pool", "[threading]") {
  const kvsift::model_shape sh{.layers = 1, .q_heads = 8, .kv_heads = 4, .head_dim = 64};
  const int n = 4096, B = 2;  // big enough for the scorer's and the attention's loops to go parallel
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> k(B), v(B), q(B);
  for (int r = 0; r < B; ++r) {
    k[r].resize(static_cast<std::size_t>(n + 1) * sh.kv_heads * sh.head_dim);
    v[r].resize(k[r].size());
    q[r].resize(static_cast<std::size_t>(n + 1) * sh.q_heads * sh.head_dim);
    for (auto* a : {&k[r], &v[r], &q[r]})
      for (auto& x : *a) x = nd(rng);
  }
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  auto run = [&] {
    kvsift::store::dense<float> st(sh, B, n + 1);
    using store_t = kvsift::store::dense<float>;
    kvsift::snapkv<store_t> m(st, kvsift::snapkv_params<store_t>(1024));
    for (int r = 0; r < B; ++r) {
      m.prefill(0, kvsift::prefill_chunk<float>{
                       .request = r,
                       .keys = view::contiguous(k[r].data(), n, sh.kv_heads, sh.head_dim),
                       .values = view::contiguous(v[r].data(), n, sh.kv_heads, sh.head_dim),
                       .queries = view::contiguous(q[r].data(), n, sh.q_heads, sh.head_dim),
                       .first_position = 0,
                       .last = true});
    }
    std::vector<kvsift::decode_token<float>> toks;
    for (int r = 0; r < B; ++r) {
      toks.push_back({r, q[r].data() + static_cast<std::size_t>(n) * sh.q_heads * sh.head_dim,
                      k[r].data() + static_cast<std::size_t>(n) * sh.kv_heads * sh.head_dim,
                      v[r].data() + static_cast<std::size_t>(n) * sh.kv_heads * sh.head_dim});
    }
    const auto plan = m.decode(0, toks).positions;
    std::vector<float> out(static_cast<std::size_t>(B) * sh.q_heads * sh.head_dim);
    m.attend(0, toks, out.data());
    return std::make_pair(plan.values, out);
  };
  const auto base = run();
  {
    kvsift::cpu::scoped_threading serial(kvsift::cpu::threading::caller);
    CHECK(run() == base);
  }
  two_thread_executor pool;
  {
    kvsift::cpu::scoped_threading on_pool(pool);
    CHECK(run() == base);
  }
  CHECK(pool.loops > 0);  // the method's loops went to the engine's pool
}

// H2O's observe runs its KV heads through parallel_for: the running scores and the plans after
// several steps are the same bits on the caller's thread, an executor and the default pool.
TEST_CASE("threading: H2O's running scores and plans are the same on the caller's thread, an "
          "executor and the default pool", "[threading]") {
  const kvsift::model_shape sh{.layers = 1, .q_heads = 8, .kv_heads = 4, .head_dim = 64};
  const int n = 384, steps = 6;
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(static_cast<std::size_t>(n + steps) * sh.kv_heads * sh.head_dim);
  std::vector<float> v(k.size());
  std::vector<float> q(static_cast<std::size_t>(n + steps) * sh.q_heads * sh.head_dim);
  for (auto* a : {&k, &v, &q})
    for (auto& x : *a) x = nd(rng);
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  using store_t = kvsift::store::dense<float>;
  auto run = [&] {
    store_t st(sh, 1, n + steps);
    kvsift::h2o<store_t> m(st, kvsift::h2o_params<store_t>(96));
    m.prefill(0, kvsift::prefill_chunk<float>{
                     .request = 0,
                     .keys = view::contiguous(k.data(), n, sh.kv_heads, sh.head_dim),
                     .values = view::contiguous(v.data(), n, sh.kv_heads, sh.head_dim),
                     .queries = view::contiguous(q.data(), n, sh.q_heads, sh.head_dim),
                     .first_position = 0,
                     .last = true});
    std::vector<std::int32_t> plans;
    std::vector<float> scores;
    for (int t = n; t < n + steps; ++t) {
      const kvsift::decode_token<float> tok{
          0, q.data() + static_cast<std::size_t>(t) * sh.q_heads * sh.head_dim,
          k.data() + static_cast<std::size_t>(t) * sh.kv_heads * sh.head_dim,
          v.data() + static_cast<std::size_t>(t) * sh.kv_heads * sh.head_dim};
      const auto& plan = m.decode(0, tok).positions;
      plans.insert(plans.end(), plan.values.begin(), plan.values.end());
      m.after_attention(0, tok);
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto run_h = m.scorer_state().running(sh.sequence(0, 0, h));
        scores.insert(scores.end(), run_h.begin(), run_h.end());
      }
    }
    return std::make_pair(plans, scores);
  };
  const auto base = run();
  REQUIRE_FALSE(base.second.empty());
  {
    kvsift::cpu::scoped_threading serial(kvsift::cpu::threading::caller);
    CHECK(run() == base);
  }
  two_thread_executor pool;
  {
    kvsift::cpu::scoped_threading on_pool(pool);
    CHECK(run() == base);
  }
  CHECK(pool.loops > 0);
}

// start() returns once the task has begun on the worker, not once it has ended: a task that waits
// for the caller's signal (sent after start() returns) ends, and its start is an earlier tick
// than anything the caller stamps after start().
TEST_CASE("threading: a host task runs beside the caller, begun before start() returns",
          "[threading][host_task]") {
  kvsift::cpu::host_task task;
  for (int round = 0; round < 3; ++round) {  // one worker for every task
    std::atomic<bool> go{false};
    bool saw_go = false;
    std::thread::id ran_on;
    auto running = task.start([&] {
      ran_on = std::this_thread::get_id();
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!go.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      saw_go = go.load();
    });
    const auto caller_tick = task.now();
    go = true;
    running.finish();
    CHECK(saw_go);  // the task ran while the caller went on
    CHECK(task.started_at() < caller_tick);
    CHECK(ran_on == task.worker());
    CHECK(ran_on != std::this_thread::get_id());
  }
}

TEST_CASE("threading: a host task's exception reaches finish(); the worker runs the next task",
          "[threading][host_task]") {
  kvsift::cpu::host_task task;
  {
    auto failing = task.start([] { kvsift::require(false, "task", "x", 3, "not 3"); });
    REQUIRE_THROWS_WITH(failing.finish(), Catch::Matchers::ContainsSubstring("not 3"));
  }
  int ran = 0;
  task.start([&] { ran = 1; }).finish();
  CHECK(ran == 1);
  // a guard left unfinished (its caller unwinding) waits for the task before its captures go
  std::atomic<bool> done{false};
  try {
    auto running = task.start([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = true;
      kvsift::require(false, "task", "y", 4, "dropped");
    });
    kvsift::require(false, "caller", "z", 5, "unwinding");
  } catch (const kvsift::error& e) {
    CHECK(std::string(e.what()).find("unwinding") != std::string::npos);
    CHECK(done);
  }
  task.start([&] { ran = 2; }).finish();
  CHECK(ran == 2);
}

TEST_CASE("threading: a host task's loops follow the caller's scoped_threading",
          "[threading][host_task]") {
  kvsift::cpu::host_task task;
  two_thread_executor pool;
  std::set<std::thread::id> on_caller;
  {
    kvsift::cpu::scoped_threading serial(kvsift::cpu::threading::caller);
    task.start([&] { on_caller = threads_of_loop(1 << 12); }).finish();
  }
  CHECK(on_caller == std::set<std::thread::id>{task.worker()});
  {
    kvsift::cpu::scoped_threading on_pool(pool);
    task.start([] { kvsift::cpu::parallel_for(100, [](std::int64_t) {}); }).finish();
  }
  CHECK(pool.loops == 1);
  CHECK(pool.items == 100);
}
