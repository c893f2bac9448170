// SPDX-License-Identifier: Apache-2.0
// Laws every token selector / method composition obeys, swept over sizes, budgets and seeds on
// ragged batches (several requests of different lengths in one prefill call): kept sets are
// subsets of the input, ascending, of the right size, with the protected tokens and original
// positions; decode plans include the new token; results do not depend on the thread count;
// chunked prefill equals one-chunk prefill.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

namespace {

using kvsift::model_shape;
using store_t = kvsift::store::dense<float>;

constexpr model_shape kShape{.layers = 3, .q_heads = 4, .kv_heads = 2, .head_dim = 8};

// Random prompt of every (request, layer): keys/values [n, kv_heads, d], queries [n, q_heads, d].
struct prompt {
  int n = 0;
  std::vector<float> k, v, q;
};

struct batch {
  std::vector<int> lengths;
  std::vector<prompt> prompts;  // [requests * layers]
  const prompt& at(int r, int l) const { return prompts[r * kShape.layers + l]; }
};

batch make_batch(std::vector<int> lengths, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  batch b;
  b.lengths = lengths;
  for (int n : lengths) {
    for (int l = 0; l < kShape.layers; ++l) {
      prompt p;
      p.n = n;
      const int total = n + 16;  // room for decode tokens
      p.k.resize(static_cast<std::size_t>(total) * kShape.kv_heads * kShape.head_dim);
      p.v.resize(p.k.size());
      p.q.resize(static_cast<std::size_t>(total) * kShape.q_heads * kShape.head_dim);
      for (auto& x : p.k) x = 2.0f * nd(rng);
      for (auto& x : p.v) x = nd(rng);
      for (auto& x : p.q) x = 2.0f * nd(rng);
      b.prompts.push_back(std::move(p));
    }
  }
  return b;
}

// Prefills every layer of every request of `b`, all requests in one call per layer and chunk
// round. `chunk` = 0 means one chunk per prompt.
template <class M>
void prefill_all(M& m, const batch& b, int chunk = 0) {
  const int R = static_cast<int>(b.lengths.size());
  const int kvh = kShape.kv_heads, qh = kShape.q_heads, d = kShape.head_dim;
  for (int l = 0; l < kShape.layers; ++l) {
    std::vector<int> done(static_cast<std::size_t>(R), 0);
    while (true) {
      std::vector<kvsift::prefill_chunk<float>> chunks;
      for (int r = 0; r < R; ++r) {
        const auto& p = b.at(r, l);
        if (done[r] >= p.n) continue;
        const int t = chunk == 0 ? p.n : std::min(chunk + r, p.n - done[r]);  // ragged chunking
        const std::size_t kv_off = static_cast<std::size_t>(done[r]) * kvh * d;
        const std::size_t q_off = static_cast<std::size_t>(done[r]) * qh * d;
        chunks.push_back(kvsift::prefill_chunk<float>{
            .request = r,
            .keys = kvsift::kv_view<const float, kvsift::nhd>::contiguous(p.k.data() + kv_off, t, kvh, d),
            .values = kvsift::kv_view<const float, kvsift::nhd>::contiguous(p.v.data() + kv_off, t, kvh, d),
            .queries = kvsift::kv_view<const float, kvsift::nhd>::contiguous(p.q.data() + q_off, t, qh, d),
            .first_position = done[r],
            .last = done[r] + t == p.n});
        done[r] += t;
      }
      if (chunks.empty()) break;
      m.prefill(l, chunks);
    }
  }
}

// Decode token `t` (1-based) of every request for one layer.
std::vector<kvsift::decode_token<float>> decode_tokens(const batch& b, int l, int t) {
  std::vector<kvsift::decode_token<float>> out;
  const int kvh = kShape.kv_heads, qh = kShape.q_heads, d = kShape.head_dim;
  for (int r = 0; r < static_cast<int>(b.lengths.size()); ++r) {
    const auto& p = b.at(r, l);
    const std::size_t i = static_cast<std::size_t>(p.n + t - 1);
    out.push_back({r, p.q.data() + i * qh * d, p.k.data() + i * kvh * d, p.v.data() + i * kvh * d});
  }
  return out;
}

// Original positions resident in each head-sequence, [requests * layers * kv_heads].
std::vector<std::vector<std::int32_t>> resident_positions(const store_t& s) {
  std::vector<std::vector<std::int32_t>> out;
  for (std::int64_t seq = 0; seq < s.requests() * s.shape().sequences_per_request(); ++seq) {
    std::vector<std::int32_t> pos;
    for (int i = 0; i < s.length(seq); ++i) pos.push_back(s.position(seq, i));
    out.push_back(pos);
  }
  return out;
}

// Kept set of every head-sequence: a strictly ascending subset of [0, n) whose keys are the
// input keys of those positions (rows travel with their positions).
void require_subset_of_input(const store_t& s, const batch& b, int extra_tokens = 0) {
  const auto& sh = s.shape();
  for (int r = 0; r < s.requests(); ++r) {
    for (int l = 0; l < sh.layers; ++l) {
      const auto& p = b.at(r, l);
      for (int h = 0; h < sh.kv_heads; ++h) {
        const auto seq = sh.sequence(r, l, h);
        for (int i = 0; i < s.length(seq); ++i) {
          const int pos = s.position(seq, i);
          CAPTURE(r, l, h, i, pos);
          REQUIRE(pos >= 0);
          REQUIRE(pos < p.n + extra_tokens);
          if (i > 0) REQUIRE(pos > s.position(seq, i - 1));
          const float* in = p.k.data() + (static_cast<std::size_t>(pos) * sh.kv_heads + h) * sh.head_dim;
          REQUIRE(std::equal(in, in + sh.head_dim, s.key(seq, i)));
          const float* vin = p.v.data() + (static_cast<std::size_t>(pos) * sh.kv_heads + h) * sh.head_dim;
          REQUIRE(std::equal(vin, vin + sh.head_dim, s.value(seq, i)));
        }
      }
    }
  }
}

bool contains_all(const std::vector<std::int32_t>& kept, int first, int last) {
  for (int j = first; j < last; ++j) {
    if (!std::binary_search(kept.begin(), kept.end(), j)) return false;
  }
  return true;
}

template <class M>
void require_stats_consistent(const M& m, const store_t& s) {
  const auto st = m.stats();
  REQUIRE(st.resident_bytes == s.resident_bytes());
  REQUIRE(st.resident_tokens == s.resident_tokens());
  REQUIRE(st.resident_bytes ==
          st.resident_tokens * 2 * s.shape().head_dim * static_cast<std::int64_t>(sizeof(float)));
  REQUIRE(st.bytes_transferred == 0);
}

// Independent PyramidKV budget of one layer (METHODS.md), protected window included.
int pyramid_budget(int n, int C, int w, int l, int L, int beta) {
  if (n < C) return n;
  const int cw = C - w;
  if (L == 1 || n < 2 * cw) return cw + w;
  int mn = cw / beta;
  int mx = 2 * cw - mn;
  if (mx >= n - w) {
    mx = n - w;
    mn = 2 * cw - mx;
  }
  const int step = (mx - mn) / (L - 1);
  return mx - l * step + w;
}

void set_threads(int t) {
#if defined(_OPENMP)
  omp_set_num_threads(t);
#else
  (void)t;
#endif
}

std::vector<int> ragged_lengths(int seed, int max_n) {
  std::mt19937 rng(static_cast<unsigned>(seed) * 7919u);
  // always one tiny request, one at the maximum, one in between
  return {1 + static_cast<int>(rng() % 3), max_n, 2 + static_cast<int>(rng() % max_n)};
}

}  // namespace

TEST_CASE("full_kv keeps everything, through prefill and decode", "[laws][full_kv]") {
  const int seed = GENERATE(1, 2);
  const int max_n = GENERATE(5, 40);
  const auto lengths = ragged_lengths(seed, max_n);
  CAPTURE(seed, max_n, lengths);
  const auto b = make_batch(lengths, seed);
  store_t s(kShape, 3, max_n + 16);
  kvsift::full_kv<store_t> m(s, kvsift::full_kv_params<store_t>());
  prefill_all(m, b);
  for (int r = 0; r < 3; ++r)
    for (int l = 0; l < kShape.layers; ++l)
      for (int h = 0; h < kShape.kv_heads; ++h) REQUIRE(s.length(r, l, h) == lengths[r]);
  require_subset_of_input(s, b);
  for (int t = 1; t <= 3; ++t) {
    for (int l = 0; l < kShape.layers; ++l) {
      const auto toks = decode_tokens(b, l, t);
      const auto& plan = m.decode(l, toks);
      for (int r = 0; r < 3; ++r) {
        for (int h = 0; h < kShape.kv_heads; ++h) {
          const auto pos = plan.positions[r * kShape.kv_heads + h];
          REQUIRE(static_cast<int>(pos.size()) == lengths[r] + t);
          REQUIRE(pos.back() == lengths[r] + t - 1);
        }
      }
      m.after_attention(l, toks);
    }
  }
  require_subset_of_input(s, b, 3);
  require_stats_consistent(m, s);
}

TEST_CASE("streaming_llm keeps the sinks and the newest tokens", "[laws][streaming_llm]") {
  const int seed = GENERATE(1, 2, 3);
  const int max_n = GENERATE(6, 33, 70);
  const int B = GENERATE(4, 5, 12, 40);
  const int sink = GENERATE(0, 4);
  const auto lengths = ragged_lengths(seed, max_n);
  CAPTURE(seed, max_n, B, sink, lengths);
  const auto b = make_batch(lengths, seed);
  store_t s(kShape, 3, max_n + 16);
  kvsift::streaming_llm<store_t> m(s, kvsift::streaming_llm_params<store_t>(B, sink));
  prefill_all(m, b);
  require_subset_of_input(s, b);
  auto expect = [&](int n) {
    std::vector<std::int32_t> e;
    for (int j = 0; j < n; ++j) {
      if (n <= B || j < sink || j >= n - (B - sink)) e.push_back(j);
    }
    return e;
  };
  const auto check_all = [&](int t) {
    const auto pos = resident_positions(s);
    for (int r = 0; r < 3; ++r)
      for (int l = 0; l < kShape.layers; ++l)
        for (int h = 0; h < kShape.kv_heads; ++h) {
          CAPTURE(r, l, h, t);
          REQUIRE(pos[kShape.sequence(r, l, h)] == expect(lengths[r] + t));
        }
  };
  check_all(0);
  require_stats_consistent(m, s);
  for (int t = 1; t <= 5; ++t) {
    for (int l = 0; l < kShape.layers; ++l) {
      const auto toks = decode_tokens(b, l, t);
      const auto& plan = m.decode(l, toks);
      for (int r = 0; r < 3; ++r) {
        for (int h = 0; h < kShape.kv_heads; ++h) {
          // the step reads the kept set plus its own new token
          auto e = expect(lengths[r] + t - 1);
          e.push_back(lengths[r] + t - 1);
          const auto pos = plan.positions[r * kShape.kv_heads + h];
          REQUIRE(std::vector<std::int32_t>(pos.begin(), pos.end()) == e);
        }
      }
      m.after_attention(l, toks);
    }
    check_all(t);
  }
  require_subset_of_input(s, b, 5);
  require_stats_consistent(m, s);
}

TEST_CASE("h2o keeps B tokens: the recent half plus heavy hitters, B between decode steps",
          "[laws][h2o]") {
  const int seed = GENERATE(1, 2, 3);
  const int max_n = GENERATE(9, 48);
  const int B = GENERATE(2, 7, 16, 60);
  const auto lengths = ragged_lengths(seed, max_n);
  CAPTURE(seed, max_n, B, lengths);
  const auto b = make_batch(lengths, seed);
  store_t s(kShape, 3, max_n + 16);
  kvsift::h2o<store_t> m(s, kvsift::h2o_params<store_t>(B));
  prefill_all(m, b);
  require_subset_of_input(s, b);
  const int R = B / 2;
  const auto check_all = [&](int t) {
    const auto pos = resident_positions(s);
    for (int r = 0; r < 3; ++r)
      for (int l = 0; l < kShape.layers; ++l)
        for (int h = 0; h < kShape.kv_heads; ++h) {
          const int n = lengths[r] + t;
          const auto& kept = pos[kShape.sequence(r, l, h)];
          CAPTURE(r, l, h, t, n, kept);
          REQUIRE(static_cast<int>(kept.size()) == std::min(B, n));
          REQUIRE(contains_all(kept, std::max(0, n - R), n));  // the recent window
          // running scores travel with the kept slots
          REQUIRE(static_cast<int>(m.scorer_state().running(kShape.sequence(r, l, h)).size()) ==
                  static_cast<int>(kept.size()));
        }
  };
  check_all(0);
  for (int t = 1; t <= 6; ++t) {
    for (int l = 0; l < kShape.layers; ++l) {
      const auto toks = decode_tokens(b, l, t);
      const auto before = resident_positions(s);
      const auto& plan = m.decode(l, toks);
      for (int r = 0; r < 3; ++r) {
        for (int h = 0; h < kShape.kv_heads; ++h) {
          auto e = before[kShape.sequence(r, l, h)];
          e.push_back(lengths[r] + t - 1);
          const auto pos = plan.positions[r * kShape.kv_heads + h];
          REQUIRE(std::vector<std::int32_t>(pos.begin(), pos.end()) == e);
        }
      }
      // Reference of the eviction (METHODS.md): add this step's GQA-mean attention to the
      // running scores, then evict the lowest-scored token older than the last R (ties: the
      // higher index).
      std::vector<std::vector<std::int32_t>> expected_after;
      for (int r = 0; r < 3; ++r) {
        for (int h = 0; h < kShape.kv_heads; ++h) {
          const auto seq = kShape.sequence(r, l, h);
          const auto run_span = m.scorer_state().running(seq);
          std::vector<float> run(run_span.begin(), run_span.end());
          const int n = s.length(seq);
          run.resize(static_cast<std::size_t>(n), 0.0f);
          const int G = kShape.group_size(), d = kShape.head_dim;
          std::vector<float> acc(static_cast<std::size_t>(n), 0.0f);
          for (int g = 0; g < G; ++g) {
            const float* q = toks[r].query + static_cast<std::size_t>(h * G + g) * d;
            std::vector<float> row(static_cast<std::size_t>(n));
            const float scale = 1.0f / std::sqrt(static_cast<float>(d));
            for (int j = 0; j < n; ++j) row[j] = kvsift::cpu::dot(q, s.key(seq, j), d) * scale;
            kvsift::cpu::softmax(row);
            for (int j = 0; j < n; ++j) acc[j] += row[j];
          }
          for (int j = 0; j < n; ++j) run[j] += acc[j] / static_cast<float>(G);
          std::vector<std::int32_t> keep_pos;
          for (int j = 0; j < n; ++j) keep_pos.push_back(s.position(seq, j));
          if (n > B) {
            int victim = -1;
            for (int j = 0; j < n - R; ++j) {
              if (victim < 0 || run[j] <= run[victim]) victim = j;  // <=: ties, higher index
            }
            keep_pos.erase(keep_pos.begin() + victim);
          }
          expected_after.push_back(keep_pos);
        }
      }
      m.after_attention(l, toks);
      const auto after = resident_positions(s);
      for (int r = 0; r < 3; ++r) {
        for (int h = 0; h < kShape.kv_heads; ++h) {
          CAPTURE(r, l, h, t);
          const auto& got = after[kShape.sequence(r, l, h)];
          const auto& want = expected_after[r * kShape.kv_heads + h];
          REQUIRE(got == want);
        }
      }
    }
    check_all(t);
  }
  require_subset_of_input(s, b, 6);
  require_stats_consistent(m, s);
}

TEST_CASE("snapkv keeps top B - w plus the observation window", "[laws][snapkv]") {
  const int seed = GENERATE(1, 2, 3);
  const int max_n = GENERATE(10, 57);
  const int w = GENERATE(1, 4);
  const int B = GENERATE(5, 9, 30, 80);
  const auto lengths = ragged_lengths(seed, max_n);
  CAPTURE(seed, max_n, w, B, lengths);
  const auto b = make_batch(lengths, seed);
  store_t s(kShape, 3, max_n + 16);
  kvsift::snapkv<store_t> m(s, kvsift::snapkv_params<store_t>(B, w, 3));
  prefill_all(m, b);
  require_subset_of_input(s, b);
  const auto pos = resident_positions(s);
  for (int r = 0; r < 3; ++r)
    for (int l = 0; l < kShape.layers; ++l)
      for (int h = 0; h < kShape.kv_heads; ++h) {
        const int n = lengths[r];
        const auto& kept = pos[kShape.sequence(r, l, h)];
        CAPTURE(r, l, h, n);
        REQUIRE(static_cast<int>(kept.size()) == std::min(B, n));
        REQUIRE(contains_all(kept, std::max(0, n - w), n));
      }
  require_stats_consistent(m, s);
  // decoding appends without evicting; the plan holds the kept set plus the new token
  for (int t = 1; t <= 3; ++t) {
    for (int l = 0; l < kShape.layers; ++l) {
      const auto toks = decode_tokens(b, l, t);
      const auto& plan = m.decode(l, toks);
      for (int r = 0; r < 3; ++r) {
        for (int h = 0; h < kShape.kv_heads; ++h) {
          const auto p = plan.positions[r * kShape.kv_heads + h];
          REQUIRE(static_cast<int>(p.size()) == std::min(B, lengths[r]) + t);
          REQUIRE(p.back() == lengths[r] + t - 1);
        }
      }
      m.after_attention(l, toks);
    }
  }
  require_subset_of_input(s, b, 3);
  require_stats_consistent(m, s);
}

TEST_CASE("pyramidkv keeps its per-layer pyramid budget", "[laws][pyramidkv]") {
  const int seed = GENERATE(1, 2);
  const int max_n = GENERATE(12, 64);
  const int B = GENERATE(6, 10, 24, 100);
  const int w = 4;
  const int beta = GENERATE(2, 20);
  const auto lengths = ragged_lengths(seed, max_n);
  CAPTURE(seed, max_n, B, beta, lengths);
  const auto b = make_batch(lengths, seed);
  store_t s(kShape, 3, max_n + 16);
  kvsift::pyramidkv<store_t> m(s, kvsift::pyramidkv_params<store_t>(B, w, 3, beta));
  prefill_all(m, b);
  require_subset_of_input(s, b);
  const auto pos = resident_positions(s);
  for (int r = 0; r < 3; ++r)
    for (int l = 0; l < kShape.layers; ++l)
      for (int h = 0; h < kShape.kv_heads; ++h) {
        const int n = lengths[r];
        const int budget = pyramid_budget(n, B, w, l, kShape.layers, beta);
        const auto& kept = pos[kShape.sequence(r, l, h)];
        CAPTURE(r, l, h, n, budget);
        REQUIRE(static_cast<int>(kept.size()) == std::min(budget, n));
        REQUIRE(contains_all(kept, std::max(0, n - w), n));
      }
  require_stats_consistent(m, s);
}

TEST_CASE("quest selects min(pages) per step including the current page; KV stays resident",
          "[laws][quest]") {
  const int seed = GENERATE(1, 2, 3);
  const int max_n = GENERATE(3, 30, 61);
  const int B = GENERATE(4, 12, 16, 40);
  const int ps = 4;
  const auto lengths = ragged_lengths(seed, max_n);
  CAPTURE(seed, max_n, B, lengths);
  const auto b = make_batch(lengths, seed);
  store_t s(kShape, 3, max_n + 16);
  kvsift::quest<store_t> m(s, kvsift::quest_params<store_t>(B, ps, 1));
  prefill_all(m, b);
  const auto full_bytes = s.resident_bytes();
  for (int r = 0; r < 3; ++r)
    for (int l = 0; l < kShape.layers; ++l) REQUIRE(s.length(r, l, 0) == lengths[r]);
  for (int t = 1; t <= 4; ++t) {
    for (int l = 0; l < kShape.layers; ++l) {
      const auto toks = decode_tokens(b, l, t);
      const auto& plan = m.decode(l, toks);
      for (int r = 0; r < 3; ++r) {
        const int n = lengths[r] + t;
        const int P = (n + ps - 1) / ps;
        for (int h = 0; h < kShape.kv_heads; ++h) {
          const int seg = r * kShape.kv_heads + h;
          const auto slots = plan.slots[seg];
          const auto positions = plan.positions[seg];
          CAPTURE(t, l, r, h, n, P);
          if (l < 1) {  // dense layer: every page, every token
            const auto all = plan.pages[seg];
            REQUIRE(static_cast<int>(all.size()) == P);
            for (int i = 0; i < P; ++i) REQUIRE(all[i] == i);
            REQUIRE(static_cast<int>(slots.size()) == n);
            REQUIRE(positions.back() == n - 1);
            continue;
          }
          const auto pages = plan.pages[seg];
          REQUIRE(static_cast<int>(pages.size()) == std::min(std::max(3, B / ps), P));
          REQUIRE(std::is_sorted(pages.begin(), pages.end()));
          REQUIRE(std::adjacent_find(pages.begin(), pages.end()) == pages.end());
          REQUIRE(pages.back() == P - 1);  // the current page is always read
          // slots: exactly the tokens of the selected pages, ascending; the new token included
          std::vector<std::int32_t> want;
          for (auto pg : pages)
            for (int j = pg * ps; j < std::min(n, (pg + 1) * ps); ++j) want.push_back(j);
          REQUIRE(std::vector<std::int32_t>(slots.begin(), slots.end()) == want);
          REQUIRE(std::vector<std::int32_t>(positions.begin(), positions.end()) == want);
          REQUIRE(positions.back() == n - 1);
        }
      }
      m.after_attention(l, toks);
    }
  }
  // full KV stays resident (Quest saves bandwidth, not memory)
  for (int r = 0; r < 3; ++r)
    for (int l = 0; l < kShape.layers; ++l) REQUIRE(s.length(r, l, 1) == lengths[r] + 4);
  REQUIRE(s.resident_bytes() > full_bytes);
  require_subset_of_input(s, b, 4);
  require_stats_consistent(m, s);
}

namespace {
// Runs a method over a batch (prefill + 3 decode steps) and returns every plan's positions and
// the final resident positions.
template <template <class...> class Method, class Params>
std::vector<std::vector<std::int32_t>> run_trace(const batch& b, const Params& prm, int chunk = 0,
                                                 int decode_steps = 3) {
  store_t s(kShape, 3, 90);
  Method<store_t> m(s, prm);
  prefill_all(m, b, chunk);
  auto out = resident_positions(s);
  for (int t = 1; t <= decode_steps; ++t) {
    for (int l = 0; l < kShape.layers; ++l) {
      const auto toks = decode_tokens(b, l, t);
      const auto& plan = m.decode(l, toks);
      for (int seg = 0; seg < plan.positions.segments(); ++seg) {
        const auto p = plan.positions[seg];
        out.emplace_back(p.begin(), p.end());
      }
      m.after_attention(l, toks);
    }
  }
  const auto fin = resident_positions(s);
  out.insert(out.end(), fin.begin(), fin.end());
  return out;
}
}  // namespace

TEST_CASE("every baseline is deterministic: 1 and 2 OpenMP threads give identical results",
          "[laws][determinism]") {
  const int seed = GENERATE(1, 2, 3);
  const auto lengths = ragged_lengths(seed, 50);
  CAPTURE(seed, lengths);
  const auto b = make_batch(lengths, seed);
  auto both = [&](auto run) {
    set_threads(1);
    const auto one = run();
    set_threads(2);
    const auto two = run();
    set_threads(2);
    REQUIRE(one == two);
    REQUIRE_FALSE(one.empty());
  };
  both([&] { return run_trace<kvsift::streaming_llm>(b, kvsift::streaming_llm_params<store_t>(12)); });
  both([&] { return run_trace<kvsift::h2o>(b, kvsift::h2o_params<store_t>(14)); });
  both([&] { return run_trace<kvsift::snapkv>(b, kvsift::snapkv_params<store_t>(15, 4, 3)); });
  both([&] { return run_trace<kvsift::pyramidkv>(b, kvsift::pyramidkv_params<store_t>(20, 4, 3)); });
  both([&] { return run_trace<kvsift::quest>(b, kvsift::quest_params<store_t>(12, 4, 1)); });
}

TEST_CASE("snapkv: chunked prefill keeps the same set as one chunk", "[laws][snapkv][chunked]") {
  const int seed = GENERATE(1, 2, 3, 4);
  const int chunk = GENERATE(1, 3, 8, 17);
  const int w = GENERATE(2, 6);
  const auto lengths = ragged_lengths(seed, 45);
  CAPTURE(seed, chunk, w, lengths);
  const auto b = make_batch(lengths, seed);
  const auto prm = kvsift::snapkv_params<store_t>(12, w, 3);
  const auto whole = run_trace<kvsift::snapkv>(b, prm, 0, 0);
  const auto chunked = run_trace<kvsift::snapkv>(b, prm, chunk, 0);
  REQUIRE(whole == chunked);
  // and it did compress something
  std::size_t total = 0;
  for (const auto& p : whole) total += p.size();
  REQUIRE(total < static_cast<std::size_t>((lengths[0] + lengths[1] + lengths[2]) * 2 *
                                           kShape.layers * kShape.kv_heads));
}

TEST_CASE("README: composing a method from components", "[laws][example]") {
  using store_t = kvsift::store::dense<kvsift::half>;
  using my_method =
      kvsift::method<store_t, kvsift::recipe<kvsift::score::key_norm, kvsift::select::topk,
                                             kvsift::budget::memory_fraction, kvsift::trigger::never>>;
  const kvsift::model_shape shape{.layers = 1, .q_heads = 8, .kv_heads = 2, .head_dim = 64};
  store_t store(shape, /*requests=*/1, /*capacity=*/1024);
  my_method m(store, {.selector = {.sink = 4, .window = 16},
                      .budgeter = {.keep_fraction = 0.25}});

  std::vector<kvsift::half> keys(1000 * 2 * 64, kvsift::half(0.5f)), values = keys;
  using view = kvsift::kv_view<const kvsift::half, kvsift::nhd>;
  m.prefill(/*layer=*/0, {.request = 0,
                          .keys = view::contiguous(keys.data(), 1000, 2, 64),
                          .values = view::contiguous(values.data(), 1000, 2, 64),
                          .queries = {}});  // key_norm needs no queries

  REQUIRE(store.length(0, 0, 0) == 250);  // floor(0.25 * 1000) tokens per KV head
  REQUIRE(m.stats().resident_bytes == 2 * 250 * 2 * 64 * sizeof(kvsift::half));
}

// Parts from two papers in one recipe: H2O's cumulative attention (every prompt query's attention,
// summed) ranks the prompt, PyramidKV's pyramid sizes each layer's budget, one round at the
// prompt's end (schedule::evict); decoding then appends. The README's "Compose your own" quotes it.
TEST_CASE("README: a composition across papers (H2O scores, PyramidKV budgets)", "[laws][example]") {
  constexpr int n = 256, steps = 6, d = 16;
  // example-begin composition
  using store_t = kvsift::store::dense<float>;
  using h2o_pyramid = kvsift::method<
      store_t, kvsift::recipe<kvsift::score::cumulative_attention,  // H2O
                              kvsift::select::topk,                 // protected window of 8
                              kvsift::budget::pyramid,              // PyramidKV
                              kvsift::trigger::never>>;             // at the prompt's end only
  const kvsift::model_shape shape{.layers = 4, .q_heads = 4, .kv_heads = 2, .head_dim = d};
  store_t store(shape, /*requests=*/1, /*capacity=*/512);
  h2o_pyramid m(store, {.selector = {.window = 8},
                        .budgeter = {.tokens = 64, .window = 8, .beta = 4}});
  // example-end composition

  std::mt19937 rng(2024);
  std::normal_distribution<float> g(0.0f, 1.0f);
  auto fill = [&](std::size_t count) {
    std::vector<float> v(count);
    for (auto& x : v) x = g(rng);
    return v;
  };
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  std::vector<int> budget(shape.layers);
  for (int l = 0; l < shape.layers; ++l) {
    const auto k = fill(std::size_t{n} * 2 * d), v = fill(std::size_t{n} * 2 * d);
    const auto q = fill(std::size_t{n} * 4 * d);  // H2O reads every prompt query
    m.prefill(l, {.request = 0, .keys = view::contiguous(k.data(), n, 2, d),
                  .values = view::contiguous(v.data(), n, 2, d),
                  .queries = view::contiguous(q.data(), n, 4, d), .last = true});
    budget[l] = kvsift::budget::pyramid_past_budget(n, 64, 8, l, shape.layers, 4) + 8;
    for (int h = 0; h < 2; ++h) REQUIRE(store.length(0, l, h) == budget[l]);
  }
  REQUIRE(m.stats().layer_budgets == budget);
  REQUIRE(budget.front() > budget.back());  // the pyramid: lower layers keep more
  for (int t = 0; t < steps; ++t) {
    for (int l = 0; l < shape.layers; ++l) {
      const auto k = fill(2 * d), v = fill(2 * d), q = fill(4 * d);
      const kvsift::decode_token<float> tok{.request = 0, .query = q.data(), .key = k.data(),
                                            .value = v.data()};
      const auto& plan = m.decode(l, tok);
      for (int h = 0; h < 2; ++h) {
        const auto pos = plan.positions[h];
        REQUIRE(static_cast<int>(pos.size()) == budget[l] + t + 1);  // the new token included
        REQUIRE(pos.back() == n + t);
        REQUIRE(std::is_sorted(pos.begin(), pos.end()));
        REQUIRE(std::adjacent_find(pos.begin(), pos.end()) == pos.end());
        // the protected window: the prompt's newest 8 positions stayed resident
        REQUIRE(pos[budget[l] - 8] == n - 8);
      }
      m.after_attention(l, tok);  // no round after a decode step: the trigger fires at the end only
      for (int h = 0; h < 2; ++h) REQUIRE(store.length(0, l, h) == budget[l] + t + 1);
    }
  }
}

// The selectors' shape halves (host arithmetic that the device state reads too) agree with what
// select() keeps: counts = |kept| per segment, shrinks, one_over, and partition_topk's frozen
// prefixes and rounds; randomized lengths, budgets and frozen prefixes.
TEST_CASE("selector shapes equal what select() keeps", "[laws][select][shape]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int segments = 1 + static_cast<int>(rng() % 5);
    std::vector<int> lengths(segments), budgets(segments), frozen(segments);
    for (int s = 0; s < segments; ++s) {
      lengths[s] = static_cast<int>(rng() % 300);
      budgets[s] = 12 + static_cast<int>(rng() % 300);
      if (trial % 3 == 0) budgets[s] = std::max(12, lengths[s] - 1);  // one over: evict one
      frozen[s] = static_cast<int>(rng() % (lengths[s] + 1));
    }
    kvsift::score_sets scores;
    scores.resize(lengths);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : scores.values) x = u(rng);

    const kvsift::select::topk top{{.sink = 4, .window = 2, .window_share = 0.25}};
    kvsift::select::topk::shape ts;
    top.shape_of(lengths, budgets, ts);
    kvsift::index_sets kept;
    top.select(scores, budgets, kept);
    bool shrinks = false, one_over = true;
    for (int s = 0; s < segments; ++s) {
      CHECK(ts.counts[s] == kept.size(s));
      CHECK(ts.counts[s] == std::min(budgets[s], lengths[s]));
      CHECK(ts.windows[s] == (budgets[s] < lengths[s] ? top.window_for(budgets[s]) : 0));
      shrinks = shrinks || kept.size(s) < lengths[s];
      one_over = one_over && lengths[s] == budgets[s] + 1;
    }
    CHECK(ts.shrinks == shrinks);
    CHECK(ts.one_over == one_over);

    const kvsift::select::partition_topk part{{.sink = 3, .lag = 16, .keep_fraction = 0.25}};
    kvsift::select::partition_topk::shape ps;
    part.shape_of(lengths, frozen, ps);
    std::vector<int> after = frozen;
    const int rounds = part.select(scores, budgets, kept, std::span<int>(after));
    CHECK(rounds == ps.rounds);
    shrinks = false;
    for (int s = 0; s < segments; ++s) {
      CHECK(ps.counts[s] == kept.size(s));
      CHECK(ps.frozen_after[s] == after[s]);
      shrinks = shrinks || kept.size(s) < lengths[s];
    }
    CHECK(ps.shrinks == shrinks);
  }
}
