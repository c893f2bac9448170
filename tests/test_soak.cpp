// SPDX-License-Identifier: Apache-2.0
// Soak test (docs/reliability.md): every method make_method knows by name decodes many steps on
// a ragged batch of 4 requests (prompts of 97, 200, 333 and 150 tokens, 2 layers, 2 KV heads),
// with the plan's laws checked at every step and the memory each method promises checked to stay
// bounded. Hidden from the default run ("[.soak]"); ctest runs it as the test `soak` (label
// `soak`). KVSIFT_SOAK_STEPS sets the steps (default 10000; ctest uses fewer).
//
// Checked every step, for every request, layer and KV head:
//   - plan.requests is the batch; plan slots ascending and < the head-sequence's length
//     (plan subset of resident); plan positions ascending and equal to the store's positions of
//     those slots; the new token's position is in the plan;
//   - after after_attention, resident tokens <= what the method promises (resident_bound);
//   - attend() gives finite outputs; stats: refreshes, bytes_transferred, stalls never decrease,
//     stats().resident_tokens/bytes equal the store's;
// and at the end: the process's resident set grew by less than 64 MiB after the first 10% of
// the steps (the store is preallocated; plans and scratch must be reused, not accumulated).

#include <kvsift/kvsift.hpp>
#include <kvsift/method/any_method.hpp>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

using store_t = kvsift::store::dense<float>;
using view = kvsift::kv_view<const float, kvsift::nhd>;

int soak_steps() {
  const char* s = std::getenv("KVSIFT_SOAK_STEPS");
  return s && *s ? std::max(1, std::atoi(s)) : 10000;
}

// Resident set size of this process in bytes (Linux /proc/self/statm), 0 where unavailable.
std::int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  std::int64_t pages = 0, resident = 0;
  if (!(f >> pages >> resident)) return 0;
  return resident * static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
}

struct lcg {
  std::uint64_t s;
  float next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>(static_cast<std::int32_t>(s >> 33) % 2001) / 1000.0f;
  }
};

// What each method promises about one head-sequence's resident tokens after `tokens` tokens
// (prompt + decoded) with a budget of `budget` (METHODS.md; docs/methods/*.md):
// full_kv and quest keep everything; streaming_llm and h2o evict back to the budget every step;
// snapkv and pyramidkv compress the prompt once, then append (pyramidkv's layer budgets sum to
// layers * budget, so one layer may hold up to 2 * budget here with 2 layers); dynamickv's
// layers share layers * (budget - window) past tokens (window 8), so one layer keeps at most
// that plus its window of the prompt, then appends; lagkv keeps the sink, the recent lag
// partitions in full and a fraction of every older partition.
std::int64_t resident_bound(const std::string& name, int prompt, int tokens, int budget,
                            int layers) {
  const int decoded = tokens - prompt;
  if (name == "full_kv" || name == "quest") return tokens;
  if (name == "streaming_llm" || name == "h2o") return budget;
  if (name == "snapkv") return std::min(prompt, budget) + decoded;
  if (name == "pyramidkv") return std::min(prompt, 2 * budget) + decoded;
  if (name == "dynamickv") return std::min(prompt, layers * (budget - 8) + 8) + decoded;
  if (name == "lagkv") return tokens;  // tightened below by the fraction check
  return tokens;
}

}  // namespace

TEST_CASE("soak: every named method decodes many steps on a ragged batch", "[.soak]") {
  const kvsift::model_shape shape{.layers = 2, .q_heads = 4, .kv_heads = 2, .head_dim = 8};
  const int H = shape.kv_heads, Hq = shape.q_heads, d = shape.head_dim;
  const std::vector<int> prompts{97, 200, 333, 150};
  const int R = static_cast<int>(prompts.size());
  const int steps = soak_steps();
  const int budget = 64;
  const int capacity = *std::max_element(prompts.begin(), prompts.end()) + steps + 1;

  for (const std::string& name : kvsift::method_names()) {
    DYNAMIC_SECTION(name << ", " << steps << " steps") {
      const auto t0 = std::chrono::steady_clock::now();
      store_t store(shape, R, capacity);
      auto m = kvsift::make_method(name, store, budget);
      lcg rng{0x9e3779b97f4a7c15ULL ^ std::hash<std::string>{}(name)};

      // prefill: each request's prompt, every query (H2O reads them all)
      for (int l = 0; l < shape.layers; ++l) {
        for (int r = 0; r < R; ++r) {
          const int n = prompts[static_cast<std::size_t>(r)];
          std::vector<float> k(static_cast<std::size_t>(n) * H * d), v(k.size()),
              q(static_cast<std::size_t>(n) * Hq * d);
          for (auto* a : {&k, &v, &q}) {
            for (auto& x : *a) x = rng.next();
          }
          const kvsift::prefill_chunk<float> c{.request = r,
                                               .keys = view::contiguous(k.data(), n, H, d),
                                               .values = view::contiguous(v.data(), n, H, d),
                                               .queries = view::contiguous(q.data(), n, Hq, d)};
          m->prefill(l, std::span(&c, 1));
        }
      }

      std::vector<float> q(static_cast<std::size_t>(R) * Hq * d), k(static_cast<std::size_t>(R) * H * d),
          v(k.size()), out(q.size());
      std::vector<kvsift::decode_token<float>> batch(static_cast<std::size_t>(R));
      kvsift::method_stats last = m->stats();
      std::int64_t rss_early = 0, max_resident_bytes = 0;
      std::int64_t failures = 0;  // counted, so that one bad step does not flood the log
      const auto check = [&](bool ok, const char* what, int step, int r, int l, int h) {
        if (!ok && failures++ < 5) {
          UNSCOPED_INFO(name << ": " << what << " at step " << step << ", request " << r
                             << ", layer " << l << ", head " << h);
        }
      };

      for (int t = 0; t < steps; ++t) {
        for (int l = 0; l < shape.layers; ++l) {
          for (int r = 0; r < R; ++r) {
            for (int i = 0; i < Hq * d; ++i) q[static_cast<std::size_t>(r * Hq * d + i)] = rng.next();
            for (int i = 0; i < H * d; ++i) {
              k[static_cast<std::size_t>(r * H * d + i)] = rng.next();
              v[static_cast<std::size_t>(r * H * d + i)] = rng.next();
            }
            batch[static_cast<std::size_t>(r)] = {r, &q[static_cast<std::size_t>(r * Hq * d)],
                                                  &k[static_cast<std::size_t>(r * H * d)],
                                                  &v[static_cast<std::size_t>(r * H * d)]};
          }
          const kvsift::attention_plan& plan = m->decode(l, batch);
          check(plan.requests == std::vector<int>{0, 1, 2, 3}, "plan.requests", t, -1, l, -1);
          check(plan.slots.segments() == R * H && plan.positions.segments() == R * H,
                "plan segments", t, -1, l, -1);
          for (int r = 0; r < R && plan.slots.segments() == R * H; ++r) {
            const std::int32_t newest = prompts[static_cast<std::size_t>(r)] + t;
            for (int h = 0; h < H; ++h) {
              const int seg = r * H + h;
              const auto seq = shape.sequence(r, l, h);
              const auto slots = plan.slots[seg];
              const auto pos = plan.positions[seg];
              const int len = store.length(seq);
              check(slots.size() == pos.size() && !slots.empty(), "plan sizes", t, r, l, h);
              check(std::adjacent_find(slots.begin(), slots.end(), std::greater_equal<>()) ==
                        slots.end(), "slots ascending", t, r, l, h);
              check(std::adjacent_find(pos.begin(), pos.end(), std::greater_equal<>()) ==
                        pos.end(), "positions ascending", t, r, l, h);
              bool in_store = true;
              for (std::size_t j = 0; j < slots.size() && j < pos.size(); ++j) {
                in_store = in_store && slots[j] >= 0 && slots[j] < len &&
                           store.position(seq, slots[j]) == pos[j];
              }
              check(in_store, "plan subset of resident, positions = store positions", t, r, l, h);
              check(std::binary_search(pos.begin(), pos.end(), newest), "new token in the plan",
                    t, r, l, h);
            }
          }
          m->attend(l, batch, out.data());
          check(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }),
                "finite attention output", t, -1, l, -1);
          m->after_attention(l, batch);
          for (int r = 0; r < R; ++r) {
            const int n = prompts[static_cast<std::size_t>(r)];
            const auto bound = resident_bound(name, n, n + t + 1, budget, shape.layers);
            for (int h = 0; h < H; ++h) {
              const int len = store.length(r, l, h);
              check(len <= bound, "resident tokens <= the method's bound", t, r, l, h);
              if (name == "lagkv") {
                // sink + 2 full lag partitions + keep_fraction (0.5) of the rest, rounded up per
                // partition of 128
                const int tokens = n + t + 1;
                check(len <= 16 + 2 * 128 + (tokens + 1) / 2 + tokens / 128 + 1,
                      "lagkv keeps about half of the old partitions", t, r, l, h);
              }
            }
          }
        }
        const kvsift::method_stats s = m->stats();
        check(s.refreshes >= last.refreshes && s.bytes_transferred >= last.bytes_transferred &&
                  s.stalls >= last.stalls,
              "stats monotone", t, -1, -1, -1);
        check(s.resident_tokens == store.resident_tokens() &&
                  s.resident_bytes == store.resident_bytes(),
              "stats resident = store resident", t, -1, -1, -1);
        max_resident_bytes = std::max(max_resident_bytes, s.resident_bytes);
        last = s;
        if (t == steps / 10) rss_early = rss_bytes();
      }
      const auto rss_end = rss_bytes();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("soak %-14s %6d steps x 4 requests x 2 layers: %7.2f s, max resident %8.1f KiB, "
                  "rss growth after 10%% %+.1f MiB, refreshes %lld\n",
                  name.c_str(), steps, seconds, max_resident_bytes / 1024.0,
                  (rss_end - rss_early) / 1048576.0, static_cast<long long>(last.refreshes));
      std::fflush(stdout);
      CHECK(failures == 0);
      if (rss_early > 0) CHECK(rss_end - rss_early < 64LL << 20);
    }
  }
}
