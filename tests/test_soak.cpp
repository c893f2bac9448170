// SPDX-License-Identifier: Apache-2.0
// Soak test (docs/reliability.md): EVERY named method decodes many steps on a ragged batch of 4
// requests (prompts of 97, 200, 333 and 150 tokens, 2 layers, 2 KV heads), with the plan's laws
// checked at every step and the memory each method promises checked to stay bounded. The methods
// make_method knows run over a caller-owned store::dense<float>; the dynamic ones (SyncKV,
// HeteroCache, FreeKV: store::tiered) are built by the default method_registry with synthetic
// head roles for this shape. Hidden from the default run ("[.soak]"); ctest runs it as the test
// `soak` (label `soak`). KVSIFT_SOAK_STEPS sets the steps (default 10000; ctest uses fewer).
//
// Checked every step, for every request, layer and KV head:
//   - plan.requests is the batch; plan slots ascending and < the head-sequence's length
//     (plan subset of resident); plan positions ascending and equal to the store's positions of
//     those slots; the new token's position is in the plan;
//   - attend() gives finite outputs;
//   - after after_attention, resident tokens <= what the method promises (resident_bound), and
//     the resident bytes of the whole store <= the sum of those bounds;
//   - stats: refreshes, bytes_transferred, stalls never decrease; stats().resident_tokens/bytes
//     equal the store's;
//   - store::tiered methods: the host pool is complete (host_length == the tokens so far, every
//     request and layer) and store.verify() passes (working sets ascending, resident ⊆ host with
//     the same bytes, the pool ends at next_position);
// and at the end: the process's resident set grew by less than 64 MiB after the first 10% of
// the steps (the stores are preallocated; plans and scratch must be reused, not accumulated).
// Each method's line gives its wall time, max resident K+V, RSS growth and peak RSS (VmHWM,
// reset per method through /proc/self/clear_refs where the kernel allows it).

#include <kvsift/kvsift.hpp>
#include <kvsift/budget/inverse_stability.hpp>
#include <kvsift/budget/synckv.hpp>
#include <kvsift/method/any_method.hpp>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

using dense_t = kvsift::store::dense<float>;
using tiered_t = kvsift::store::tiered<float>;
using view = kvsift::kv_view<const float, kvsift::nhd>;
using role = kvsift::calibrate::head_role;

int soak_steps() {
  const char* s = std::getenv("KVSIFT_SOAK_STEPS");
  return s && *s ? std::max(1, std::atoi(s)) : 10000;
}

// A "Vm...:" line of /proc/self/status in bytes (VmRSS: resident set now, VmHWM: its peak);
// 0 where unavailable.
std::int64_t proc_status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream in(line.substr(key.size() + 1));
      std::int64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
  }
  return 0;
}
std::int64_t rss_bytes() { return proc_status_bytes("VmRSS"); }
std::int64_t peak_rss_bytes() { return proc_status_bytes("VmHWM"); }
// Resets VmHWM to the current RSS (Linux >= 4.0: "5" > /proc/self/clear_refs), so that each
// method's peak is its own; false where the kernel does not allow it (the peak is then the
// process's since it started).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

struct lcg {
  std::uint64_t s;
  float next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    // in [-1, 1]: signed queries and keys, so that attention moves from step to step (drift)
    return static_cast<float>(static_cast<std::int32_t>(s >> 33) % 2001 - 1000) / 1000.0f;
  }
};

constexpr int kLayers = 2, kKvHeads = 2, kBudget = 64;

// The dynamic methods' settings for this shape (2 layers x 2 KV heads), built the way their unit
// tests build them: synthetic roles, not a calibration.
// SyncKV: one cluster per layer, head 0 the representative (keeps everything), head 1 its
// follower; M = 0.6 (>= N_R / N = 0.5), so a follower keeps k = floor((0.6 * 4 - 2) n / 2) of a
// prompt of n, static share 0.5, anticipation every 5 steps.
constexpr double kSyncM = 0.6, kSyncRho = 0.5;
std::vector<kvsift::select::cluster_roles> synckv_roles() {
  return std::vector<kvsift::select::cluster_roles>(kLayers, {{0, 0}, {0}});
}
// HeteroCache: layer 0 a pivot (head 0, keeps everything) with satellite head 1 (drift-recalled),
// layer 1 an anchor (head 0) and a volatile head (1, keeps everything); rho = 0.75 (>= F / N =
// 0.5). Caps by inverse stability.
constexpr double kHeteroRho = 0.75;
const std::vector<role> kHeteroRoles{role::pivot, role::satellite, role::anchor, role::volatile_head};
const std::vector<float> kHeteroStability{0.9f, 0.4f, 0.8f, 0.1f};
std::vector<kvsift::method_config::heterocache_layer> heterocache_roles() {
  return {{{role::pivot, role::satellite}, {0, 0}, {0.9f, 0.4f}},
          {{role::anchor, role::volatile_head}, {-1, -1}, {0.8f, 0.1f}}};
}
// FreeKV: the registry's page size 16 and one dense layer; budget 64 tokens = 4 pages (sink,
// two candidates, window).
constexpr int kFreePage = 16, kFreeDense = 1;

bool is_tiered(const std::string& name) {
  return name == "synckv" || name == "heterocache" || name == "freekv";
}

// What each method promises about one head-sequence's resident tokens after `tokens` tokens
// (prompt + decoded) with a budget of `budget` (METHODS.md; docs/methods/*.md):
// full_kv and quest keep everything; streaming_llm and h2o evict back to the budget every step;
// snapkv and pyramidkv compress the prompt once, then append (pyramidkv's layer budgets sum to
// layers * budget, so one layer may hold up to 2 * budget here with 2 layers); dynamickv's
// layers share layers * (budget - window) past tokens (window 8), so one layer keeps at most
// that plus its window of the prompt, then appends; lagkv keeps the sink, the recent lag
// partitions in full and a fraction of every older partition (checked separately);
// synckv: representatives keep everything, followers k (budget::synckv) of the prompt plus every
// decoded token; heterocache: volatile and pivot heads keep everything, anchors and satellites
// their cap (budget::inverse_stability for their prompt) plus every decoded token; freekv: the
// dense layer keeps everything, a sparse layer exactly its budget's pages (B tokens at most).
std::int64_t resident_bound(const std::string& name, int layer, int head, int prompt, int tokens) {
  const int decoded = tokens - prompt;
  const int budget = kBudget, layers = kLayers;
  if (name == "full_kv" || name == "quest") return tokens;
  if (name == "streaming_llm" || name == "h2o") return budget;
  if (name == "snapkv") return std::min(prompt, budget) + decoded;
  if (name == "pyramidkv") return std::min(prompt, 2 * budget) + decoded;
  if (name == "dynamickv") return std::min(prompt, layers * (budget - 8) + 8) + decoded;
  if (name == "lagkv") return tokens;  // tightened by the fraction check
  if (name == "synckv") {
    if (head == synckv_roles()[static_cast<std::size_t>(layer)].representatives[0]) return tokens;
    return kvsift::budget::synckv_budget(layers * kKvHeads, layers, prompt, kSyncM, kSyncRho).k +
           decoded;
  }
  if (name == "heterocache") {
    const auto i = static_cast<std::size_t>(layer * kKvHeads + head);
    if (kvsift::budget::full_kv(kHeteroRoles[i])) return tokens;
    return kvsift::budget::inverse_stability_caps(kHeteroRoles, kHeteroStability, kKvHeads, prompt,
                                                  kHeteroRho)
               .cap[i] +
           decoded;
  }
  if (name == "freekv") return layer < kFreeDense ? tokens : budget;
  return -1;  // a method the soak has no bound for: fails
}

// The invariants store::tiered::verify() checks, with the same public accessors and without
// building a message per token: every working set ascends by position; every resident token is in
// the host pool (resident ⊆ host) with the same key and value bytes; every pool ends before
// next_position. Returns what failed, or nullptr. O(resident * d) (the host rows are found by a
// walk from the previous one).
const char* tiers_consistent(const tiered_t& st) {
  const auto& sh = st.shape();
  const std::size_t row = static_cast<std::size_t>(sh.head_dim) * sizeof(float);
  for (int r = 0; r < st.requests(); ++r) {
    for (int l = 0; l < sh.layers; ++l) {
      const int n = st.host_length(r, l);
      if (n > 0 && st.host_position(r, l, n - 1) >= st.next_position(r, l)) {
        return "host pool past next_position";
      }
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(r, l, h);
        int hint = 0;
        for (int s = 0; s < st.length(seq); ++s) {
          const auto pos = st.position(seq, s);
          if (s > 0 && pos <= st.position(seq, s - 1)) return "working set not ascending";
          const int i = st.host_index(r, l, pos, hint);
          if (i < 0) return "a resident token not in the host pool (resident not within host)";
          if (std::memcmp(st.key(seq, s), st.host_key(seq, i), row) != 0 ||
              std::memcmp(st.value(seq, s), st.host_value(seq, i), row) != 0) {
            return "resident rows differ from the host pool's";
          }
          hint = i + 1;
        }
      }
    }
  }
  return nullptr;
}

struct soak_result {
  double seconds = 0;
  std::int64_t max_resident_bytes = 0, rss_growth = 0, peak_rss = 0, refreshes = 0, stalls = 0,
               bytes_transferred = 0, failures = 0;
};

// Prefill, then `steps` decode steps of the whole batch, checking everything listed at the top.
template <class Store>
soak_result soak(const std::string& name, kvsift::any_kv_method<float>& m, Store& store,
                 const std::vector<int>& prompts, int steps) {
  constexpr bool tiered = std::is_same_v<Store, tiered_t>;
  const kvsift::model_shape shape = store.shape();
  const int H = shape.kv_heads, Hq = shape.q_heads, d = shape.head_dim;
  const int R = static_cast<int>(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  lcg rng{0x9e3779b97f4a7c15ULL ^ std::hash<std::string>{}(name)};
  soak_result res;
  auto& failures = res.failures;  // counted, so that one bad step does not flood the log
  const auto check = [&](bool ok, const char* what, int step, int r, int l, int h) {
    if (!ok && failures++ < 5) {
      UNSCOPED_INFO(name << ": " << what << " at step " << step << ", request " << r
                         << ", layer " << l << ", head " << h);
    }
  };
  // The tiers' invariants every step: the test's own pass over them (below), and
  // store::tiered::verify() itself every 64 steps and at the end (it builds its messages for
  // every resident token, which at 10,000 steps would make it most of the soak's time).
  const auto verify = [&](int step, int l, bool library_too) {
    if constexpr (tiered) {
      const char* what = tiers_consistent(store);
      if (what != nullptr && failures++ < 5) {
        UNSCOPED_INFO(name << ": " << what << " at step " << step << ", layer " << l);
      }
      if (!library_too) return;
      try {
        store.verify();
      } catch (const kvsift::error& e) {
        if (failures++ < 5) UNSCOPED_INFO(name << ": step " << step << ", layer " << l << ": " << e.what());
      }
    }
  };

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
      m.prefill(l, std::span(&c, 1));
    }
    verify(-1, l, true);
  }

  std::vector<float> q(static_cast<std::size_t>(R) * Hq * d), k(static_cast<std::size_t>(R) * H * d),
      v(k.size()), out(q.size());
  std::vector<kvsift::decode_token<float>> batch(static_cast<std::size_t>(R));
  const std::vector<int> all_requests{0, 1, 2, 3};
  kvsift::method_stats last = m.stats();
  std::int64_t rss_early = 0;
  const std::int64_t row_pair_bytes = 2 * static_cast<std::int64_t>(d) * sizeof(float);

  // Every rule of resident_bound is affine in the tokens so far (slope 0 or 1): each
  // head-sequence's is evaluated once here, not per step.
  const bool lagkv = name == "lagkv";
  std::vector<std::int64_t> bound_at_prompt, bound_slope;
  for (int r = 0; r < R; ++r) {
    const int n = prompts[static_cast<std::size_t>(r)];
    for (int l = 0; l < shape.layers; ++l) {
      for (int h = 0; h < H; ++h) {
        const auto b0 = resident_bound(name, l, h, n, n);
        bound_at_prompt.push_back(b0);
        bound_slope.push_back(resident_bound(name, l, h, n, n + 1) - b0);
      }
    }
  }

  for (int t = 0; t < steps; ++t) {
    std::int64_t bound_tokens = 0;  // the sum of every head-sequence's bound after this step
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
      const kvsift::attention_plan& plan = m.decode(l, batch);
      check(plan.requests == all_requests, "plan.requests", t, -1, l, -1);
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
          // one pass: slots strictly ascending in [0, len), positions strictly ascending and the
          // store's positions of those slots
          bool slots_ok = true, pos_ok = true, in_store = true;
          for (std::size_t j = 0; j < slots.size() && j < pos.size(); ++j) {
            if (j > 0) {
              slots_ok = slots_ok && slots[j] > slots[j - 1];
              pos_ok = pos_ok && pos[j] > pos[j - 1];
            }
            in_store = in_store && slots[j] >= 0 && slots[j] < len &&
                       store.position(seq, slots[j]) == pos[j];
          }
          check(slots_ok, "slots ascending", t, r, l, h);
          check(pos_ok, "positions ascending", t, r, l, h);
          check(in_store, "plan subset of resident, positions = store positions", t, r, l, h);
          // positions ascend, so the newest token (the largest position) is the last one
          check(!pos.empty() && pos.back() == newest, "new token in the plan", t, r, l, h);
        }
      }
      m.attend(l, batch, out.data());
      check(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }),
            "finite attention output", t, -1, l, -1);
      m.after_attention(l, batch);
      for (int r = 0; r < R; ++r) {
        const int n = prompts[static_cast<std::size_t>(r)];
        const int tokens = n + t + 1;
        if constexpr (tiered) {
          check(store.host_length(r, l) == tokens, "host pool complete (host_length = tokens)", t,
                r, l, -1);
        }
        for (int h = 0; h < H; ++h) {
          const auto b = static_cast<std::size_t>((r * shape.layers + l) * H + h);
          const auto bound = bound_at_prompt[b] + bound_slope[b] * (t + 1);
          bound_tokens += bound;
          const int len = store.length(shape.sequence(r, l, h));
          check(len <= bound, "resident tokens <= the method's bound", t, r, l, h);
          if (lagkv) {
            // sink + 2 full lag partitions + keep_fraction (0.5) of the rest, rounded up per
            // partition of 128
            check(len <= 16 + 2 * 128 + (tokens + 1) / 2 + tokens / 128 + 1,
                  "lagkv keeps about half of the old partitions", t, r, l, h);
          }
        }
      }
      verify(t, l, t % 64 == 0 || t == steps - 1);
    }
    const kvsift::method_stats s = m.stats();
    check(s.refreshes >= last.refreshes && s.bytes_transferred >= last.bytes_transferred &&
              s.stalls >= last.stalls,
          "stats monotone", t, -1, -1, -1);
    check(s.resident_tokens == store.resident_tokens() &&
              s.resident_bytes == store.resident_bytes(),
          "stats resident = store resident", t, -1, -1, -1);
    check(s.resident_bytes <= bound_tokens * row_pair_bytes,
          "resident bytes <= the sum of the bounds", t, -1, -1, -1);
    res.max_resident_bytes = std::max(res.max_resident_bytes, s.resident_bytes);
    last = s;
    if (t == steps / 10) rss_early = rss_bytes();
  }
  res.rss_growth = rss_bytes() - rss_early;
  res.peak_rss = peak_rss_bytes();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.refreshes = last.refreshes;
  res.stalls = last.stalls;
  res.bytes_transferred = last.bytes_transferred;
  if (rss_early <= 0) res.rss_growth = 0;
  return res;
}

}  // namespace

TEST_CASE("soak: every named method decodes many steps on a ragged batch", "[.soak]") {
  const kvsift::model_shape shape{.layers = kLayers, .q_heads = 4, .kv_heads = kKvHeads, .head_dim = 8};
  const std::vector<int> prompts{97, 200, 333, 150};
  const int R = static_cast<int>(prompts.size());
  const int steps = soak_steps();
  const int capacity = *std::max_element(prompts.begin(), prompts.end()) + steps + 1;
  const auto& registry = kvsift::default_method_registry<float>();

  // every method the registry knows: make_method's over a dense store, the others by the registry
  std::vector<std::string> names = kvsift::method_names();
  for (const auto& n : registry.names()) {
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }

  for (const std::string& name : names) {
    DYNAMIC_SECTION(name << ", " << steps << " steps") {
      INFO(name);
      REQUIRE(resident_bound(name, 0, 0, 1, 1) >= 0);  // the soak knows what the method promises
      const bool own_peak = reset_peak_rss();
      soak_result res;
      if (!is_tiered(name)) {
        dense_t store(shape, R, capacity);
        auto m = kvsift::make_method(name, store, kBudget);
        res = soak(name, *m, store, prompts, steps);
      } else {
        kvsift::method_config c;
        c.shape = shape;
        c.requests = R;
        c.capacity = capacity;
        c.prompt_len = prompts.front();
        c.budget = kBudget;
        if (name == "synckv") {
          c.synckv_roles = synckv_roles();
          c.options = {{"memory_fraction", kSyncM}, {"static_share", kSyncRho}};
        } else if (name == "heterocache") {
          c.heterocache_roles = heterocache_roles();
          c.options = {{"rho", kHeteroRho}};
        } else {
          c.options = {{"page_size", kFreePage}, {"dense_layers", kFreeDense}};
        }
        auto m = registry.make(name, c);
        auto* erased = dynamic_cast<kvsift::any_method<tiered_t>*>(m.get());
        REQUIRE(erased != nullptr);
        res = soak(name, *m, erased->store(), prompts, steps);
      }
      std::printf("soak %-14s %6d steps x 4 requests x 2 layers: %7.2f s, max resident %8.1f KiB, "
                  "rss growth after 10%% %+.1f MiB, peak rss %.1f MiB%s, refreshes %lld, "
                  "stalls %lld, transferred %.1f MiB\n",
                  name.c_str(), steps, res.seconds, res.max_resident_bytes / 1024.0,
                  res.rss_growth / 1048576.0, res.peak_rss / 1048576.0,
                  own_peak ? "" : " (process)", static_cast<long long>(res.refreshes),
                  static_cast<long long>(res.stalls), res.bytes_transferred / 1048576.0);
      std::fflush(stdout);
      CHECK(res.failures == 0);
      // Under AddressSanitizer freed blocks sit in its quarantine (256 MiB by default) before they
      // are reused, so the resident set grows with allocation churn whether or not anything
      // leaks; LeakSanitizer checks leaks in that build. The bound applies elsewhere.
      if (!kAddressSanitizer) CHECK(res.rss_growth < 64LL << 20);
      // the dynamic methods' recall path ran (transfer::async moved rows from the host pool)
      if (is_tiered(name) && steps >= 100) CHECK(res.bytes_transferred > 0);
    }
  }
}
