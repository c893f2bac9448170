// SPDX-License-Identifier: Apache-2.0
// StreamingLLM and H2O decode in place (issue 29): in steady state a step evicts one token per
// head-sequence and the next step's token is written into the row it freed, so no resident row
// ever moves; the plan handed to attention stays sorted by position while the rows are not; the
// outputs are attention over the kept positions (checked against attention::attend_row over the
// test's own copy of every token, by position); and H2O's running scores, which schedule::evict
// now takes from the step's own attention (attend()'s plan_weights), equal bit for bit a second
// pass over the keys, as well as the scores of an engine that attends with its own kernel (no
// attend() call: the two-pass fallback). Ragged batches (three prompts of different lengths, one
// request sitting out every third step), dense and paged stores, f32 and bf16.

#include <kvsift/kvsift.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <utility>
#include <vector>

namespace {

using kvsift::bfloat16;
using kvsift::model_shape;

constexpr model_shape kShape{.layers = 2, .q_heads = 8, .kv_heads = 2, .head_dim = 16};
constexpr int kSteps = 24;
const std::vector<int> kPrompts{40, 23, 57};  // a ragged batch

template <class T>
struct dense_of {
  using element = T;
  using store = kvsift::store::dense<T>;
  static store make() { return store(kShape, 3, 96); }
};
template <class T>
struct paged_of {
  using element = T;
  using store = kvsift::store::paged<T>;
  static store make() { return store(kShape, 3, 4, 3 * kShape.layers * kShape.kv_heads * 24); }
};

// Every token of every (request, layer): keys/values [positions, kv_heads, d] as the store's
// element type (what the store holds, so a reference over them reads the same numbers), queries
// [positions, q_heads, d].
template <class T>
struct tokens {
  std::vector<std::vector<T>> k, v;   // [requests * layers]
  std::vector<std::vector<float>> q;  // [requests * layers]
  explicit tokens(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int r = 0; r < 3; ++r) {
      for (int l = 0; l < kShape.layers; ++l) {
        const std::size_t n = static_cast<std::size_t>(kPrompts[r] + kSteps);
        std::vector<T> kk(n * kShape.kv_heads * kShape.head_dim), vv(kk.size());
        std::vector<float> qq(n * kShape.q_heads * kShape.head_dim);
        for (auto& x : kk) x = kvsift::from_float<T>(1.5f * nd(rng));
        for (auto& x : vv) x = kvsift::from_float<T>(nd(rng));
        for (auto& x : qq) x = 1.5f * nd(rng);
        k.push_back(std::move(kk));
        v.push_back(std::move(vv));
        q.push_back(std::move(qq));
      }
    }
  }
  [[nodiscard]] std::size_t at(int r, int l) const {
    return static_cast<std::size_t>(r) * kShape.layers + l;
  }
  const T* key(int r, int l, int pos, int h) const {
    return k[at(r, l)].data() +
           (static_cast<std::size_t>(pos) * kShape.kv_heads + h) * kShape.head_dim;
  }
  const T* value(int r, int l, int pos, int h) const {
    return v[at(r, l)].data() +
           (static_cast<std::size_t>(pos) * kShape.kv_heads + h) * kShape.head_dim;
  }
  const float* query(int r, int l, int pos) const {
    return q[at(r, l)].data() + static_cast<std::size_t>(pos) * kShape.q_heads * kShape.head_dim;
  }
};

template <class M, class T>
void prefill(M& m, const tokens<T>& x) {
  using kview = kvsift::kv_view<const T, kvsift::nhd>;
  using qview = kvsift::kv_view<const float, kvsift::nhd>;
  for (int l = 0; l < kShape.layers; ++l) {
    std::vector<kvsift::prefill_chunk<T>> chunks;
    for (int r = 0; r < 3; ++r) {
      const int n = kPrompts[r];
      chunks.push_back(
          {.request = r,
           .keys = kview::contiguous(x.key(r, l, 0, 0), n, kShape.kv_heads, kShape.head_dim),
           .values = kview::contiguous(x.value(r, l, 0, 0), n, kShape.kv_heads, kShape.head_dim),
           .queries = qview::contiguous(x.query(r, l, 0), n, kShape.q_heads, kShape.head_dim),
           .first_position = 0,
           .last = true});
    }
    m.prefill(l, chunks);
  }
}

// Step t's batch: every request but request 1 on every third step (ragged and uneven).
std::vector<int> batch_of(int t) {
  return t % 3 == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1, 2};
}

// The positions of a head-sequence's slots, and each one's key row address.
template <class Store>
std::map<std::int32_t, const void*> rows_by_position(const Store& s, std::int64_t seq) {
  std::map<std::int32_t, const void*> out;
  for (int i = 0; i < s.length(seq); ++i) out[s.position(seq, i)] = s.key(seq, i);
  return out;
}

// Runs kSteps decode steps of method M over a ragged batch and checks, at every step and layer:
// resident rows never move, the new token lands in the row the last eviction freed, the plan is
// position-sorted, out equals a reference by position, and (H2O) the running scores equal a
// second pass. `evicted(seq, positions, running)` names the position the step must evict.
template <class M, class S, class Evicted>
void check_in_place(M& m, S& s, const tokens<typename S::element_type>& x, int budget,
                    Evicted&& evicted) {
  using T = typename S::element_type;
  constexpr bool h2o =
      std::is_same_v<typename M::recipe::scorer, kvsift::score::cumulative_attention>;
  const int H = kShape.kv_heads, G = kShape.group_size(), d = kShape.head_dim;
  std::vector<int> steps(3, 0);
  std::map<std::int64_t, const void*> freed;  // the row each head-sequence's last eviction freed
  int steady = 0;                             // head-sequence steps that evicted in place
  for (int t = 0; t < kSteps; ++t) {
    const auto batch = batch_of(t);
    for (int l = 0; l < kShape.layers; ++l) {
      CAPTURE(t, l);
      std::vector<kvsift::decode_token<T>> toks;
      std::map<std::int64_t, std::map<std::int32_t, const void*>> before;
      for (const int r : batch) {
        const int pos = kPrompts[r] + steps[r];
        toks.push_back({r, x.query(r, l, pos), x.key(r, l, pos, 0), x.value(r, l, pos, 0)});
        for (int h = 0; h < H; ++h) {
          const auto seq = kShape.sequence(r, l, h);
          before[seq] = rows_by_position(s, seq);
        }
      }
      const auto& plan = m.decode(l, toks);
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const int r = batch[i];
        const int newest = kPrompts[r] + steps[r];
        for (int h = 0; h < H; ++h) {
          const auto seq = kShape.sequence(r, l, h);
          const int seg = static_cast<int>(i) * H + h;
          const auto pos = plan.positions[seg];
          CAPTURE(r, h);
          // the plan: every resident slot, strictly ascending positions, the new token last
          REQUIRE(static_cast<int>(pos.size()) == s.length(seq));
          REQUIRE(std::adjacent_find(pos.begin(), pos.end(), std::greater_equal<>()) == pos.end());
          REQUIRE(pos.back() == newest);
          // the append moved nothing, and the new token took the row the last eviction freed
          auto now = rows_by_position(s, seq);
          for (const auto& [p, row] : before[seq]) REQUIRE(now.at(p) == row);
          if (freed.count(seq) != 0) REQUIRE(now.at(newest) == freed[seq]);
        }
      }
      // out against attention over the kept positions, read from the test's own tokens
      std::vector<float> out(toks.size() * kShape.q_heads * d, 0.0f);
      m.attend(l, toks, out.data());
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const int r = batch[i];
        for (int h = 0; h < H; ++h) {
          const auto pos = plan.positions[static_cast<int>(i) * H + h];
          for (int g = 0; g < G; ++g) {
            const int qh = h * G + g;
            std::vector<float> want(static_cast<std::size_t>(d));
            kvsift::attention::attend_row(
                toks[i].query + static_cast<std::size_t>(qh) * d, d, static_cast<int>(pos.size()),
                [&](int j) { return x.key(r, l, pos[j], h); },
                [&](int j) { return x.value(r, l, pos[j], h); }, want.data());
            for (int c = 0; c < d; ++c) {
              const float got = out[(i * kShape.q_heads + qh) * d + c];
              REQUIRE(std::abs(got - want[c]) <= 2e-5f + 1e-4f * std::abs(want[c]));
            }
          }
        }
      }
      // H2O: the running scores after the step, by position, from a second pass over the keys
      std::map<std::int64_t, std::map<std::int32_t, float>> expected;
      if constexpr (h2o) {
        for (std::size_t i = 0; i < batch.size(); ++i) {
          for (int h = 0; h < H; ++h) {
            const auto seq = kShape.sequence(batch[i], l, h);
            const auto slots = plan.slots[static_cast<int>(i) * H + h];
            const auto run = m.scorer_state().running(seq);
            std::vector<float> probs(static_cast<std::size_t>(G) * slots.size());
            std::vector<float> reduced(slots.size());
            kvsift::cpu::attention_rows_over(
                s, seq, toks[i].query + static_cast<std::size_t>(h) * G * d, G, slots, probs);
            kvsift::cpu::reduce_group(probs, G, reduced, kvsift::gqa_reduce::mean);
            for (std::size_t j = 0; j < slots.size(); ++j) {
              const float base = slots[j] < static_cast<int>(run.size()) ? run[slots[j]] : 0.0f;
              expected[seq][s.position(seq, slots[j])] = base + reduced[j];
            }
          }
        }
      }
      std::map<std::int64_t, std::map<std::int32_t, const void*>> during;
      std::map<std::int64_t, std::int32_t> victim;
      for (const int r : batch) {
        for (int h = 0; h < H; ++h) {
          const auto seq = kShape.sequence(r, l, h);
          during[seq] = rows_by_position(s, seq);
          victim[seq] = s.length(seq) > budget ? evicted(seq, during[seq], expected[seq]) : -1;
        }
      }
      m.after_attention(l, toks);
      for (const int r : batch) {
        for (int h = 0; h < H; ++h) {
          const auto seq = kShape.sequence(r, l, h);
          CAPTURE(r, h, victim[seq]);
          auto after = rows_by_position(s, seq);
          // exactly the victim left, and every token that stays kept its row
          REQUIRE(after.size() + (victim[seq] >= 0 ? 1 : 0) == during[seq].size());
          REQUIRE(after.count(victim[seq]) == 0);
          for (const auto& [p, row] : after) REQUIRE(during[seq].at(p) == row);
          if (victim[seq] >= 0) {
            freed[seq] = during[seq].at(victim[seq]);
            // the freed row waits for the next append, or was the last row in use (then the
            // rows in use simply end before it): either way the next token goes there
            REQUIRE(s.row_extent(seq) >= s.length(seq));
            REQUIRE(s.row_extent(seq) <= s.length(seq) + 1);
            ++steady;
          }
          if constexpr (h2o) {
            const auto run = m.scorer_state().running(seq);
            REQUIRE(static_cast<int>(run.size()) == s.length(seq));
            for (int j = 0; j < s.length(seq); ++j) {
              CAPTURE(j, s.position(seq, j));
              REQUIRE(run[j] == expected[seq].at(s.position(seq, j)));  // bit for bit
            }
          }
        }
      }
    }
    for (const int r : batch) ++steps[r];
  }
  REQUIRE(steady >= kSteps);  // the check ran in steady state, not only while filling
}

}  // namespace

TEMPLATE_TEST_CASE("streaming_llm decode moves no resident row; the new token takes the freed row",
                   "[evict][inplace][streaming_llm]", dense_of<float>, dense_of<bfloat16>,
                   paged_of<float>, paged_of<bfloat16>) {
  using S = typename TestType::store;
  using T = typename TestType::element;
  const int budget = GENERATE(12, 30);
  const int seed = GENERATE(1, 2);
  CAPTURE(budget, seed, kvsift::element_name<T>);
  const tokens<T> x(static_cast<unsigned>(seed));
  auto s = TestType::make();
  kvsift::streaming_llm<S> m(s, kvsift::streaming_llm_params<S>(budget, 4));
  prefill(m, x);
  // the oldest token after the four sinks
  check_in_place(
      m, s, x, budget,
      [](std::int64_t, const std::map<std::int32_t, const void*>& rows,
         const std::map<std::int32_t, float>&) { return std::next(rows.begin(), 4)->first; });
}

TEMPLATE_TEST_CASE("h2o decode moves no resident row; running scores from the step's attention",
                   "[evict][inplace][h2o]", dense_of<float>, dense_of<bfloat16>, paged_of<float>,
                   paged_of<bfloat16>) {
  using S = typename TestType::store;
  using T = typename TestType::element;
  const int budget = GENERATE(12, 30);
  const int seed = GENERATE(1, 2);
  CAPTURE(budget, seed, kvsift::element_name<T>);
  const tokens<T> x(static_cast<unsigned>(seed));
  auto s = TestType::make();
  kvsift::h2o<S> m(s, kvsift::h2o_params<S>(budget));
  prefill(m, x);
  // METHODS.md: the lowest running score among positions older than the recent floor(B / 2)
  // (exact tie: the higher index)
  const int recent = budget / 2;
  check_in_place(m, s, x, budget,
                 [&](std::int64_t, const std::map<std::int32_t, const void*>& rows,
                     const std::map<std::int32_t, float>& score) {
                   const int n = static_cast<int>(rows.size());
                   std::int32_t victim = -1;
                   int j = 0;
                   for (const auto& [p, row] : rows) {
                     if (j++ >= n - recent) break;
                     if (victim < 0 || score.at(p) <= score.at(victim)) victim = p;
                   }
                   return victim;
                 });
}

TEMPLATE_TEST_CASE("h2o: an engine attending with its own kernel gets the same running scores",
                   "[evict][inplace][h2o]", dense_of<float>, paged_of<bfloat16>) {
  using S = typename TestType::store;
  using T = typename TestType::element;
  const tokens<T> x(7);
  auto s_lib = TestType::make();
  auto s_own = TestType::make();
  kvsift::h2o<S> lib(s_lib, kvsift::h2o_params<S>(20));  // attend(): the kept probabilities
  kvsift::h2o<S> own(s_own, kvsift::h2o_params<S>(20));  // no attend(): observe's second pass
  prefill(lib, x);
  prefill(own, x);
  std::vector<int> steps(3, 0);
  std::vector<float> out(3 * kShape.q_heads * kShape.head_dim);
  for (int t = 0; t < kSteps; ++t) {
    const auto batch = batch_of(t);
    for (int l = 0; l < kShape.layers; ++l) {
      std::vector<kvsift::decode_token<T>> toks;
      for (const int r : batch) {
        const int pos = kPrompts[r] + steps[r];
        toks.push_back({r, x.query(r, l, pos), x.key(r, l, pos, 0), x.value(r, l, pos, 0)});
      }
      (void)lib.decode(l, toks);
      lib.attend(l, toks, out.data());
      lib.after_attention(l, toks);
      (void)own.decode(l, toks);
      own.after_attention(l, toks);
      for (const int r : batch) {
        for (int h = 0; h < kShape.kv_heads; ++h) {
          const auto seq = kShape.sequence(r, l, h);
          CAPTURE(t, l, r, h);
          REQUIRE(s_lib.length(seq) == s_own.length(seq));
          const auto a = lib.scorer_state().running(seq);
          const auto b = own.scorer_state().running(seq);
          REQUIRE(std::vector<float>(a.begin(), a.end()) == std::vector<float>(b.begin(), b.end()));
          for (int j = 0; j < s_lib.length(seq); ++j)
            REQUIRE(s_lib.position(seq, j) == s_own.position(seq, j));
        }
      }
    }
    for (const int r : batch) ++steps[r];
  }
}

// The weighted form of the batch attention H2O's schedule asks for: each (token, KV head)'s
// probabilities equal cpu::attention_rows_over's bit for bit (what observe's second pass derives),
// and the output equals the fused kernels' within their bound, on every SIMD path the CPU has,
// head_dim 12 (no vector path), 16 and 64, GQA groups 1, 3 and 5, ragged plans (an empty one).
TEMPLATE_TEST_CASE("attend_plan_batch with weights: exact probabilities, the same output",
                   "[evict][inplace][decode_attention]", float, bfloat16) {
  const int d = GENERATE(12, 16, 64);
  const int G = GENERATE(1, 3, 5);
  const auto level =
      GENERATE(kvsift::cpu::simd::portable, kvsift::cpu::simd::avx2, kvsift::cpu::simd::avx512);
  CAPTURE(d, G, kvsift::cpu::simd_name(level));
  const kvsift::cpu::scoped_simd pin(level);  // a level above the CPU's runs the CPU's best
  const model_shape sh{.layers = 1, .q_heads = 2 * G, .kv_heads = 2, .head_dim = d};
  kvsift::store::paged<TestType> store(sh, 2, 8, 200);
  std::mt19937 rng(static_cast<unsigned>(d * 10 + G));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int lens[2] = {150, 9};
  for (int r = 0; r < 2; ++r) {
    std::vector<TestType> k(static_cast<std::size_t>(lens[r]) * 2 * d), v(k.size());
    for (auto& x : k) x = kvsift::from_float<TestType>(2.0f * nd(rng));
    for (auto& x : v) x = kvsift::from_float<TestType>(nd(rng));
    using view = kvsift::kv_view<const TestType, kvsift::nhd>;
    store.append(r, 0, view::contiguous(k.data(), lens[r], 2, d),
                 view::contiguous(v.data(), lens[r], 2, d), 0);
  }
  const std::vector<int> requests{0, 1};
  kvsift::index_sets plan;
  for (const int r : requests) {
    for (int h = 0; h < 2; ++h) {
      std::vector<std::int32_t> set;
      for (int i = h; i < lens[r] && !(r == 1 && h == 1); i += 1 + h) set.push_back(i);
      plan.push_back(set);
    }
  }
  const std::size_t per = static_cast<std::size_t>(sh.q_heads) * d;
  std::vector<float> q(2 * per);
  for (float& x : q) x = nd(rng);
  const auto request_of = [&](std::size_t i) { return requests[i]; };
  const auto query_of = [&](std::size_t i) { return q.data() + i * per; };
  std::vector<float> fused(q.size()), weighted(q.size(), -7.0f);
  kvsift::attention::plan_weights w;
  kvsift::attention::attend_plan_batch(store, 0, 2, request_of, query_of, plan, fused.data());
  kvsift::attention::attend_plan_batch(store, 0, 2, request_of, query_of, plan, weighted.data(),
                                       &w);
  REQUIRE(w.offsets.size() == 5);
  for (int s = 0; s < 4; ++s) {
    const int r = requests[s / 2], h = s % 2;
    const auto slots = plan[s];
    std::vector<float> want(static_cast<std::size_t>(G) * slots.size());
    kvsift::cpu::attention_rows_over(store, sh.sequence(r, 0, h),
                                     query_of(s / 2) + static_cast<std::size_t>(h) * G * d, G,
                                     slots, want);
    const auto got = w.segment(s);
    REQUIRE(std::vector<float>(got.begin(), got.end()) == want);  // bit for bit
  }
  for (std::size_t i = 0; i < q.size(); ++i) {
    REQUIRE(std::abs(weighted[i] - fused[i]) <= 2e-5f + 1e-4f * std::abs(fused[i]));
  }
  // asked for a reduction, the attention's threads also reduce each segment over its group: the
  // same bits as reduce_group over the kept probabilities
  for (const auto mode : {kvsift::gqa_reduce::mean, kvsift::gqa_reduce::max}) {
    kvsift::attention::plan_weights wr;
    wr.reduction = mode;
    std::vector<float> out(q.size());
    kvsift::attention::attend_plan_batch(store, 0, 2, request_of, query_of, plan, out.data(), &wr);
    REQUIRE(wr.group == G);
    REQUIRE(out == weighted);
    for (int s = 0; s < 4; ++s) {
      REQUIRE(std::vector<float>(wr.segment(s).begin(), wr.segment(s).end()) ==
              std::vector<float>(w.segment(s).begin(), w.segment(s).end()));
      std::vector<float> want(plan[s].size());
      kvsift::cpu::reduce_group(w.segment(s), G, want, mode);
      const auto got = wr.reduced_segment(s);
      CAPTURE(s, static_cast<int>(mode));
      REQUIRE(std::vector<float>(got.begin(), got.end()) == want);
    }
  }
}

// The waiting hole at the store level, around the decode path: a chunk appended into it (its
// first token takes the hole), a second one-token retain while a hole waits (filled the usual
// way), the newest token released from rows in order (the hole at the end: slot i stays row i), a
// bulk retain, reset. After each, every slot's key and value hold the token appended at its
// position, rows are distinct and below row_extent, and a paged store holds exactly the pages of
// row_extent rows.
TEMPLATE_TEST_CASE("stores: the waiting hole across appends, retains and reset",
                   "[evict][inplace][store]", dense_of<float>, paged_of<bfloat16>) {
  using S = typename TestType::store;
  using T = typename TestType::element;
  constexpr model_shape sh{.layers = 1, .q_heads = 2, .kv_heads = 2, .head_dim = 8};
  auto s = [&] {
    if constexpr (std::is_same_v<S, kvsift::store::dense<T>>) {
      return S(sh, 1, 64);
    } else {
      return S(sh, 1, 4, 40);
    }
  }();
  // token at position p, head h: every channel p * 4 + h (exact in bf16 below 256)
  const auto append = [&](int count) {
    const int first = s.next_position(0, 0);
    std::vector<T> kv(static_cast<std::size_t>(count) * 2 * 8);
    for (int t = 0; t < count; ++t) {
      for (int h = 0; h < 2; ++h) {
        for (int c = 0; c < 8; ++c) {
          kv[(t * 2 + h) * 8 + c] = kvsift::from_float<T>(static_cast<float>((first + t) * 4 + h));
        }
      }
    }
    using view = kvsift::kv_view<const T, kvsift::nhd>;
    const auto k = view::contiguous(kv.data(), count, 2, 8);
    s.append(0, 0, k, k, first);
  };
  const auto retain = [&](std::vector<std::int32_t> keep) {
    kvsift::index_sets kept;
    kept.push_back(keep);
    kept.push_back(keep);
    s.retain(0, 0, kept);
  };
  const auto check = [&](const std::vector<std::int32_t>& positions, int extent) {
    int pages = 0;
    for (int h = 0; h < 2; ++h) {
      const auto seq = sh.sequence(0, 0, h);
      CAPTURE(h, positions);
      REQUIRE(s.length(seq) == static_cast<int>(positions.size()));
      REQUIRE(s.row_extent(seq) == extent);
      std::vector<int> seen(static_cast<std::size_t>(extent), 0);
      for (int i = 0; i < s.length(seq); ++i) {
        REQUIRE(s.position(seq, i) == positions[i]);
        const float want = static_cast<float>(positions[i] * 4 + h);
        for (int c = 0; c < 8; ++c) {
          REQUIRE(kvsift::to_float(s.key(seq, i)[c]) == want);
          REQUIRE(kvsift::to_float(s.value(seq, i)[c]) == want);
        }
        REQUIRE(s.row(seq, i) < extent);
        REQUIRE(seen[s.row(seq, i)]++ == 0);
      }
      pages += (extent + 3) / 4;
    }
    if constexpr (!std::is_same_v<S, kvsift::store::dense<T>>) REQUIRE(s.used_pages() == pages);
  };
  append(10);
  check({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 10);
  retain({0, 1, 3, 4, 5, 6, 7, 8, 9});  // position 2 released: its row waits
  check({0, 1, 3, 4, 5, 6, 7, 8, 9}, 10);
  REQUIRE_FALSE(s.rows_in_slot_order(sh.sequence(0, 0, 0)));
  append(3);  // 10 into the hole, 11 and 12 after the rows in use
  check({0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 12);
  retain({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10});  // the newest (slot 11, position 12) released
  check({0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 12);
  retain({0, 2, 3, 4, 5, 6, 7, 8, 9, 10});  // position 1, while a hole waits: filled as usual
  check({0, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 10);
  retain({0, 4, 9});  // a bulk release
  check({0, 6, 11}, 3);
  append(1);
  check({0, 6, 11, 13}, 4);
  s.reset(0);
  check({}, 0);
  append(5);  // after a reset: in order again
  retain({0, 1, 2, 3});  // the newest released from rows in order: slot i stays row i
  check({0, 1, 2, 3}, 5);
  REQUIRE(s.rows_in_slot_order(sh.sequence(0, 0, 0)));
  append(2);
  check({0, 1, 2, 3, 5, 6}, 6);
  REQUIRE(s.rows_in_slot_order(sh.sequence(0, 0, 0)));
}

// A sliding window's steps on page sizes that split the row map at every place (1, 3: not a
// power of two, 4, 16) and on a dense store: every retain that releases one token (the waiting
// hole, the row map shifted run by run) or a few, against a list of the resident positions; the
// recency scorer's positions_prefix and a plan's positions_of equal position() slot by slot.
TEMPLATE_TEST_CASE("stores: one-token releases on every page size keep slots, rows and positions",
                   "[evict][inplace][store]", kvsift::store::dense<float>,
                   kvsift::store::paged<float>) {
  using S = TestType;
  constexpr model_shape sh{.layers = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 4};
  for (const int page : {1, 3, 4, 16}) {
    if (std::is_same_v<S, kvsift::store::dense<float>> && page != 1) continue;
    auto s = [&] {
      if constexpr (std::is_same_v<S, kvsift::store::dense<float>>) {
        return S(sh, 1, 200);
      } else {
        return S(sh, 1, page, (200 + page - 1) / page + 1);
      }
    }();
    std::mt19937 rng(static_cast<unsigned>(page));
    std::vector<std::int32_t> resident;  // the model: positions in slot order
    const auto append = [&](int count) {
      const int first = s.next_position(0, 0);
      std::vector<float> kv(static_cast<std::size_t>(count) * 4);
      for (int t = 0; t < count; ++t) {
        for (int c = 0; c < 4; ++c) kv[t * 4 + c] = static_cast<float>(first + t);
        resident.push_back(first + t);
      }
      using view = kvsift::kv_view<const float, kvsift::nhd>;
      const auto k = view::contiguous(kv.data(), count, 1, 4);
      s.append(0, 0, k, k, first);
    };
    append(40);
    for (int step = 0; step < 300; ++step) {
      CAPTURE(page, step);
      const int n = static_cast<int>(resident.size());
      std::vector<std::int32_t> keep;
      const int drops = step % 17 == 0 ? 3 : 1;  // mostly one (the hole), now and then a few
      std::vector<int> gone;
      for (int i = 0; i < drops; ++i) gone.push_back(static_cast<int>(rng() % static_cast<unsigned>(n)));
      for (int i = 0; i < n; ++i) {
        if (std::find(gone.begin(), gone.end(), i) == gone.end()) keep.push_back(i);
      }
      kvsift::index_sets kept;
      kept.push_back(keep);
      s.retain(0, 0, kept);
      std::vector<std::int32_t> next;
      for (const int i : keep) next.push_back(resident[i]);
      resident = next;
      append(1 + static_cast<int>(rng() % 2) * (step % 5 == 0 ? 1 : 0));
      if (static_cast<int>(resident.size()) > 150) {  // stay within the capacity
        kvsift::index_sets half;
        std::vector<std::int32_t> h;
        for (int i = 60; i < static_cast<int>(resident.size()); ++i) h.push_back(i);
        half.push_back(h);
        s.retain(0, 0, half);
        resident.erase(resident.begin(), resident.begin() + 60);
      }
      const auto seq = sh.sequence(0, 0, 0);
      REQUIRE(s.length(seq) == static_cast<int>(resident.size()));
      std::vector<float> prefix(resident.size());
      s.positions_prefix(seq, static_cast<int>(resident.size()), prefix.data());
      std::vector<int> seen(static_cast<std::size_t>(s.row_extent(seq)), 0);
      for (std::size_t i = 0; i < resident.size(); ++i) {
        REQUIRE(s.position(seq, static_cast<int>(i)) == resident[i]);
        REQUIRE(prefix[i] == static_cast<float>(resident[i]));
        REQUIRE(s.key(seq, static_cast<int>(i))[0] == static_cast<float>(resident[i]));
        REQUIRE(s.value(seq, static_cast<int>(i))[3] == static_cast<float>(resident[i]));
        REQUIRE(seen[s.row(seq, static_cast<int>(i))]++ == 0);
      }
      // the attention's address table: every slot (consecutive), a tail, every other slot, and
      // every slot but the second to last (one gap, at the end: not a consecutive run)
      const int len = s.length(seq);
      for (const int from : {0, len / 3}) {
        for (const int stride : {1, 2, 0}) {
          std::vector<std::int32_t> slots;
          for (int i = from; i < len; i += std::max(stride, 1)) {
            if (stride != 0 || i != len - 2 || i == from) slots.push_back(i);
          }
          std::vector<const float*> keys(slots.size()), values(slots.size());
          s.row_addresses(seq, slots, keys.data(), values.data());
          std::vector<std::int32_t> positions(slots.size());
          s.positions_of(seq, slots, positions.data());  // a plan's positions, same walks
          for (std::size_t i = 0; i < slots.size(); ++i) {
            REQUIRE(keys[i] == s.key(seq, slots[i]));
            REQUIRE(values[i] == s.value(seq, slots[i]));
            REQUIRE(positions[i] == s.position(seq, slots[i]));
          }
        }
      }
    }
  }
}

// cumulative_attention adds a step's probabilities reduced over the GQA group (cpu::reduce_group):
// over a whole-cache plan (consecutive slots, H2O's) as one contiguous add per head, elsewhere by
// a scatter through the plan's slots. Both equal, bit for bit, the reduction added slot by slot,
// for the mean, the sum and the max, with a group of 3, over 300 slots, then a plan of every third
// slot, then the consecutive slots from 100 on (an add that starts inside the running scores).
TEST_CASE("cumulative_attention: reduced probabilities added contiguously or scattered, same bits",
          "[evict][h2o][scorer]") {
  constexpr model_shape sh{.layers = 1, .q_heads = 6, .kv_heads = 2, .head_dim = 8};  // G = 3
  constexpr int n = 300;
  const int G = sh.group_size();
  kvsift::store::dense<float> store(sh, 1, n);
  std::vector<float> kv(static_cast<std::size_t>(n) * sh.kv_heads * sh.head_dim, 0.5f);
  const auto rows = kvsift::kv_view<const float, kvsift::nhd>::contiguous(kv.data(), n, sh.kv_heads,
                                                                         sh.head_dim);
  store.append(0, 0, rows, rows, 0);
  const auto mode =
      GENERATE(kvsift::gqa_reduce::mean, kvsift::gqa_reduce::sum, kvsift::gqa_reduce::max);
  CAPTURE(static_cast<int>(mode));
  // the probabilities only; also reduced by the attention (the scorer's reduction: used as is);
  // reduced another way (ignored: the scorer reduces them itself)
  const int given = GENERATE(0, 1, 2);
  CAPTURE(given);
  kvsift::score::cumulative_attention scorer({.gqa = mode});
  REQUIRE(scorer.weights_reduction() == mode);
  const auto other = mode == kvsift::gqa_reduce::max ? kvsift::gqa_reduce::sum : kvsift::gqa_reduce::max;
  std::vector<std::vector<float>> expect(sh.kv_heads, std::vector<float>(n, 0.0f));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (const auto& [first, stride] : {std::pair{0, 1}, std::pair{0, 3}, std::pair{100, 1}}) {
    kvsift::index_sets plan;
    std::vector<int> sizes(sh.kv_heads, (n - first + stride - 1) / stride);
    plan.resize(sizes);
    kvsift::attention::plan_weights w;
    w.offsets.push_back(0);
    for (int h = 0; h < sh.kv_heads; ++h) {
      auto seg = plan[h];
      for (std::size_t i = 0; i < seg.size(); ++i) {
        seg[i] = first + static_cast<std::int32_t>(i) * stride;
      }
      for (std::size_t i = 0; i < G * seg.size(); ++i) w.values.push_back(u(rng));
      w.offsets.push_back(w.values.size());
    }
    w.group = G;
    if (given > 0) {
      w.reduction = given == 1 ? mode : other;
      w.reduced.assign(w.values.size() / G, -1.0f);
      for (int h = 0; h < sh.kv_heads; ++h) {
        kvsift::cpu::reduce_group(w.segment(h), G, w.reduced_segment(h), *w.reduction);
      }
    }
    scorer.observe_weights(store, 0, 0, plan, w);
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto slots = plan[h];
      std::vector<float> reduced(slots.size());
      kvsift::cpu::reduce_group(w.segment(h), G, reduced, mode);
      for (std::size_t i = 0; i < slots.size(); ++i) expect[h][slots[i]] += reduced[i];
      const auto got = scorer.running(sh.sequence(0, 0, h));
      CAPTURE(first, stride, h);
      REQUIRE(std::vector<float>(got.begin(), got.end()) == expect[h]);
    }
  }
}

// The whole-cache plan (detail::one_tier::plan_everything) reuses a plan of the same sizes
// without rewriting it, but only where its slots are already every slot: a plan of the same sizes
// holding other slots (another layer's selection, from a page method's sparse layer, or a caller's
// edits) is written again. Its positions follow the store's per-slot positions after a one-token
// eviction that leaves rows out of order.
TEST_CASE("plan_everything: a plan of the same sizes is reused only when it reads every slot",
          "[evict][inplace][plan]") {
  using S = kvsift::store::paged<float>;
  constexpr model_shape sh{.layers = 2, .q_heads = 2, .kv_heads = 2, .head_dim = 8};
  S store(sh, 1, 4, 64);
  constexpr int n = 11;
  std::vector<float> kv(static_cast<std::size_t>(n) * sh.kv_heads * sh.head_dim, 0.25f);
  const auto rows = kvsift::kv_view<const float, kvsift::nhd>::contiguous(kv.data(), n, sh.kv_heads,
                                                                         sh.head_dim);
  store.append(0, 1, rows, rows, 100);  // positions 100 .. 110
  struct owner {
    S* s;
    [[nodiscard]] const S& store() const { return *s; }
  } m{&store};
  kvsift::detail::one_tier<S> tier(m);
  kvsift::attention_plan plan;
  plan.requests = {0};
  const auto expect = [&](const std::vector<std::int32_t>& positions) {
    for (int h = 0; h < sh.kv_heads; ++h) {
      const auto slots = plan.slots[h];
      const auto pos = plan.positions[h];
      REQUIRE(slots.size() == positions.size());
      for (std::size_t i = 0; i < slots.size(); ++i) {
        CAPTURE(h, i);
        REQUIRE(slots[i] == static_cast<std::int32_t>(i));
        REQUIRE(pos[i] == positions[i]);
      }
    }
  };
  std::vector<std::int32_t> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = 100 + i;
  tier.plan_everything(m, 1, plan);
  expect(positions);
  // the same sizes, other slots in one segment (a selection's): written again
  plan.slots[1][3] = 7;
  plan.slots[1][n - 1] = 0;
  tier.plan_everything(m, 1, plan);
  expect(positions);
  // a one-token eviction (slot 4: position 104) leaves rows out of order; the next token fills the
  // released row: positions shift down past slot 4 and the new one is last
  kvsift::index_sets kept;
  for (int h = 0; h < sh.kv_heads; ++h) {
    std::vector<std::int32_t> set;
    for (int i = 0; i < n; ++i) {
      if (i != 4) set.push_back(i);
    }
    kept.push_back(set);
  }
  store.retain(0, 1, kept);
  REQUIRE_FALSE(store.rows_in_slot_order(sh.sequence(0, 1, 0)));
  store.append(0, 1, kvsift::kv_view<const float, kvsift::nhd>::contiguous(kv.data(), 1, sh.kv_heads,
                                                                          sh.head_dim),
               kvsift::kv_view<const float, kvsift::nhd>::contiguous(kv.data(), 1, sh.kv_heads,
                                                                    sh.head_dim),
               111);
  positions.erase(positions.begin() + 4);
  positions.push_back(111);
  plan.slots[0][0] = 5;  // the same sizes again, one entry off
  tier.plan_everything(m, 1, plan);
  expect(positions);
}
