// SPDX-License-Identifier: Apache-2.0
// Laws of the Thrust algorithms the baselines' decode steps add (the device methods' decode,
// include/kvsift/device/), each against the CPU code it mirrors, bit for bit, on random inputs
// of several sizes, under the compiled device system and thrust::cpp::par:
//   append_rows / pack_rows / gather_positions + compact_rows   a device store follows
//                                                               store::dense through appends
//                                                               and retains
//   cumulative_attention_observe                                score::cumulative_attention::
//                                                               observe (+ compact) over steps
//   page_digest_tail + page_scores(digest_stride)               cpu::page_digest / the packed
//                                                               page_scores, step by step
//   expand_page_slots                                           select::expand_pages
//   segmented_evict_one                                         segmented_topk and the CPU
//                                                               top-k (sink, middle, window)

#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/segmented_topk.hpp>
#include <kvsift/score/cumulative_attention.hpp>
#include <kvsift/score/page_minmax.hpp>
#include <kvsift/select/page_topk.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/thrust/all.hpp>

#include <thrust/execution_policy.h>
#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

namespace kt = kvsift::thrust;
using i32 = std::int32_t;
using store_t = kvsift::store::dense<float>;
using view = kvsift::kv_view<const float, kvsift::nhd>;

template <class F>
void for_each_policy(F&& f) {
  f(::thrust::device, std::string("device(" KVSIFT_THRUST_SYSTEM_NAME ")"));
  f(::thrust::cpp::par, std::string("cpp::par"));
}

std::vector<float> normals(std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<i32> uniform_offsets(int segments, int n) {
  std::vector<i32> o(static_cast<std::size_t>(segments) + 1);
  for (int s = 0; s <= segments; ++s) o[s] = s * n;
  return o;
}

// A device store in host memory (the CPP / OMP systems reach it): [H, cap, d] keys and values,
// [H, cap] positions, every head at `length`.
struct mirror {
  int H, cap, d, length = 0;
  std::vector<float> keys, values;
  std::vector<i32> positions, offsets;
  mirror(int h, int c, int dd)
      : H(h), cap(c), d(dd), keys(static_cast<std::size_t>(h) * c * dd, 0.0f),
        values(keys.size(), 0.0f), positions(static_cast<std::size_t>(h) * c, -1),
        offsets(uniform_offsets(h, 0)) {}
  void set_length(int n) {
    length = n;
    offsets = uniform_offsets(H, n);
  }
  [[nodiscard]] kt::segmented_rows<float> rows(const std::vector<float>& data) const {
    return {data.data(), offsets.data(), positions.data(), static_cast<std::int64_t>(cap) * d, H, d};
  }
  [[nodiscard]] std::int64_t items() const { return static_cast<std::int64_t>(H) * length; }
  // token rows [H, d] at position pos
  template <class P>
  void append(const P& exec, const float* k, const float* v, i32 pos) {
    const std::vector<i32> p(static_cast<std::size_t>(H), pos);
    kt::append_rows(exec, keys.data(), positions.data(), H, cap, d, offsets.data(), k, p.data());
    kt::append_rows(exec, values.data(), static_cast<i32*>(nullptr), H, cap, d, offsets.data(), v,
                    static_cast<const i32*>(nullptr));
    set_length(length + 1);
  }
  template <class P>
  void retain(const P& exec, const kvsift::index_sets& kept, std::vector<float>* column = nullptr) {
    const auto total = static_cast<std::int64_t>(kept.values.size());
    std::vector<std::byte> ws(kt::compact_workspace_bytes<float>(total, d, true));
    kt::compact_rows(exec, keys.data(), positions.data(), H, cap, d, kept.offsets.data(),
                     kept.values.data(), total, ws.data(), ws.size());
    kt::compact_rows(exec, values.data(), static_cast<i32*>(nullptr), H, cap, d,
                     kept.offsets.data(), kept.values.data(), total, ws.data(), ws.size());
    if (column != nullptr) {
      kt::compact_rows(exec, column->data(), static_cast<i32*>(nullptr), H, cap, 1,
                       kept.offsets.data(), kept.values.data(), total, ws.data(), ws.size());
    }
    set_length(kept.size(0));
  }
};

// [tokens, H, d] from [H, d] rows of a token (the store's nhd layout for one token is the same).
void store_append(store_t& st, const float* k, const float* v, int H, int d) {
  st.append(0, 0, view::contiguous(k, 1, H, d), view::contiguous(v, 1, H, d),
            st.next_position(0, 0));
}

// A random kept set per head: every slot kept with probability 3/4, the same count per head
// (the first `keep` of a shuffled order, sorted), ascending.
kvsift::index_sets random_kept(int H, int n, int keep, std::mt19937& rng) {
  kvsift::index_sets kept;
  for (int h = 0; h < H; ++h) {
    std::vector<i32> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(static_cast<std::size_t>(keep));
    std::sort(all.begin(), all.end());
    kept.push_back(std::span<const i32>(all));
  }
  return kept;
}

}  // namespace

TEST_CASE("thrust::append_rows / pack_rows / gather_positions follow store::dense through appends "
          "and retains", "[thrust][decode-baselines]") {
  // std::tie, not a structured binding: clang 14 cannot capture bindings in a lambda
  int H, d, n, steps;
  std::tie(H, d, n, steps) = GENERATE(std::tuple{1, 4, 5, 6}, std::tuple{2, 8, 17, 9},
                                      std::tuple{3, 16, 40, 12});
  CAPTURE(H, d, n, steps);
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::mt19937 rng(17u + static_cast<unsigned>(n));
    const int cap = n + steps;
    store_t st(kvsift::model_shape{1, H, H, d}, 1, cap);
    mirror m(H, cap, d);
    for (int t = 0; t < n + steps; ++t) {
      const auto k = normals(static_cast<std::size_t>(H) * d, rng);
      const auto v = normals(k.size(), rng);
      store_append(st, k.data(), v.data(), H, d);
      m.append(exec, k.data(), v.data(), t);
      if (t >= n && t % 3 == 0) {  // a retain now and then, as a decode round does
        const int len = st.length(0);
        const auto kept = random_kept(H, len, (len * 3 + 3) / 4, rng);
        st.retain(0, 0, kept);
        m.retain(exec, kept);
      }
      REQUIRE(m.length == st.length(0));
      // pack_rows: every resident row and position, packed
      std::vector<float> pk(static_cast<std::size_t>(m.items()) * d);
      std::vector<i32> pp(static_cast<std::size_t>(m.items()));
      kt::pack_rows(exec, m.rows(m.keys), m.items(), pk.data(), pp.data());
      std::vector<float> pv(pk.size());
      kt::pack_rows(exec, m.rows(m.values), m.items(), pv.data(), static_cast<i32*>(nullptr));
      for (int h = 0; h < H; ++h) {
        const auto seq = st.shape().sequence(0, 0, h);
        for (int j = 0; j < m.length; ++j) {
          const std::size_t e = static_cast<std::size_t>(h) * m.length + j;
          REQUIRE(pp[e] == st.position(seq, j));
          for (int c = 0; c < d; ++c) {
            REQUIRE(pk[e * d + c] == st.key(seq, j)[c]);
            REQUIRE(pv[e * d + c] == st.value(seq, j)[c]);
          }
        }
      }
      // gather_positions of a random plan = the store's positions of those slots (kept ⊆ slots)
      const int take = std::max(1, m.length / 2);
      const auto plan = random_kept(H, m.length, take, rng);
      std::vector<i32> got(plan.values.size(), -7);
      kt::gather_positions(exec, m.rows(m.keys), plan.offsets.data(), plan.values.data(),
                           static_cast<std::int64_t>(plan.values.size()), got.data());
      for (int h = 0; h < H; ++h) {
        const auto seq = st.shape().sequence(0, 0, h);
        for (int i = 0; i < take; ++i) {
          REQUIRE(got[static_cast<std::size_t>(h) * take + i] == st.position(seq, plan[h][i]));
        }
      }
    }
  });
}

TEST_CASE("thrust::cumulative_attention_observe == score::cumulative_attention::observe over "
          "decode steps with evictions", "[thrust][decode-baselines]") {
  int H, G, d, n, steps;
  std::tie(H, G, d, n, steps) = GENERATE(std::tuple{1, 1, 8, 6, 5}, std::tuple{2, 2, 16, 20, 8},
                                         std::tuple{2, 4, 8, 33, 10});
  const auto mode = GENERATE(kvsift::gqa_reduce::mean, kvsift::gqa_reduce::max,
                             kvsift::gqa_reduce::sum);
  CAPTURE(H, G, d, n, steps, static_cast<int>(mode));
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::mt19937 rng(91u + static_cast<unsigned>(n * 3 + G));
    const int cap = n + steps;
    const int budget = n;  // every step past the prompt evicts one token
    store_t st(kvsift::model_shape{1, H * G, H, d}, 1, cap);
    mirror m(H, cap, d);
    for (int t = 0; t < n; ++t) {
      const auto k = normals(static_cast<std::size_t>(H) * d, rng);
      const auto v = normals(k.size(), rng);
      store_append(st, k.data(), v.data(), H, d);
      m.append(exec, k.data(), v.data(), t);
    }
    kvsift::score::cumulative_attention sc{{.gqa = mode}};
    std::vector<float> running(static_cast<std::size_t>(H) * cap, -1.0f);  // stale until seen
    int seen = 0;
    for (int t = 0; t < steps; ++t) {
      if (t > 0) {  // a decode token
        const auto k = normals(static_cast<std::size_t>(H) * d, rng);
        const auto v = normals(k.size(), rng);
        store_append(st, k.data(), v.data(), H, d);
        m.append(exec, k.data(), v.data(), n + t - 1);
      }
      const auto q = normals(static_cast<std::size_t>(H) * G * d, rng);
      // the CPU scorer: attention over every slot
      kvsift::index_sets plan;
      for (int h = 0; h < H; ++h) {
        std::vector<i32> all(static_cast<std::size_t>(m.length));
        std::iota(all.begin(), all.end(), 0);
        plan.push_back(std::span<const i32>(all));
      }
      sc.observe(st, 0, 0, q.data(), plan);
      // the device: attention_over's weights, then observe
      const std::vector<i32> first{static_cast<i32>(st.next_position(0, 0) - 1)};
      const kt::window_queries wq{q.data(), first.data(), 1, H, G};
      std::vector<float> out(static_cast<std::size_t>(H) * G * d);
      std::vector<float> w(static_cast<std::size_t>(m.items()) * G);
      std::vector<std::byte> ws(kt::attention_workspace_bytes(m.items(), G, 1));
      kt::attention_over(exec, m.rows(m.keys), m.rows(m.values), wq, kt::attention_plan{},
                         m.items(), m.items(), out.data(), w.data(), ws.data(), ws.size());
      const std::vector<i32> seen_v(static_cast<std::size_t>(H), seen);
      kt::cumulative_attention_observe(exec, w.data(), m.offsets.data(), H, m.items(), G, mode,
                                       seen_v.data(), running.data(), cap);
      seen = m.length;
      for (int h = 0; h < H; ++h) {
        const auto want = sc.running(st.shape().sequence(0, 0, h));
        REQUIRE(static_cast<int>(want.size()) == m.length);
        for (int j = 0; j < m.length; ++j) {
          CAPTURE(t, h, j);
          REQUIRE(running[static_cast<std::size_t>(h) * cap + j] == want[j]);
        }
      }
      if (m.length > budget) {  // evict: keep a random budget-sized set, scores follow
        const auto kept = random_kept(H, m.length, budget, rng);
        REQUIRE(kept.size(0) == std::min(budget, m.length));
        st.retain(0, 0, kept);
        sc.compact(st, 0, 0, kept);
        m.retain(exec, kept, &running);
        seen = m.length;
      }
    }
  });
}

TEST_CASE("thrust::page_digest_tail + strided page_scores == cpu::page_digest and the packed "
          "page_scores, token by token", "[thrust][decode-baselines]") {
  int H, G, d, ps, n, steps;
  std::tie(H, G, d, ps, n, steps) =
      GENERATE(std::tuple{1, 2, 8, 8, 7, 12}, std::tuple{2, 2, 16, 16, 47, 20},
               std::tuple{3, 1, 4, 4, 16, 9});
  CAPTURE(H, G, d, ps, n, steps);
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::mt19937 rng(7u + static_cast<unsigned>(n));
    const int cap = n + steps;
    const int page_cap = (cap + ps - 1) / ps;
    store_t st(kvsift::model_shape{1, H * G, H, d}, 1, cap);
    mirror m(H, cap, d);
    std::vector<float> kmin(static_cast<std::size_t>(H) * page_cap * d, 99.0f);
    std::vector<float> kmax(kmin.size(), -99.0f);
    for (int t = 0; t < n + steps; ++t) {
      const auto k = normals(static_cast<std::size_t>(H) * d, rng);
      const auto v = normals(k.size(), rng);
      store_append(st, k.data(), v.data(), H, d);
      m.append(exec, k.data(), v.data(), t);
      if (t + 1 < n) continue;
      // the prompt's digest of every page, then one page per token
      kt::page_digest_tail(exec, m.rows(m.keys), ps, t + 1 == n ? page_cap : 1, kmin.data(),
                           kmax.data(), page_cap);
      const int P = (m.length + ps - 1) / ps;
      std::vector<float> want_min(static_cast<std::size_t>(P) * d), want_max(want_min.size());
      for (int h = 0; h < H; ++h) {
        kvsift::cpu::page_digest(st, st.shape().sequence(0, 0, h), ps, want_min, want_max);
        for (int pg = 0; pg < P; ++pg) {
          for (int c = 0; c < d; ++c) {
            const std::size_t at = (static_cast<std::size_t>(h) * page_cap + pg) * d + c;
            REQUIRE(kmin[at] == want_min[static_cast<std::size_t>(pg) * d + c]);
            REQUIRE(kmax[at] == want_max[static_cast<std::size_t>(pg) * d + c]);
          }
        }
      }
      // strided scores == the packed digests' scores
      const auto poff = uniform_offsets(H, P);
      std::vector<float> packed_min(static_cast<std::size_t>(H) * P * d), packed_max(packed_min.size());
      kt::page_digest(exec, m.rows(m.keys), poff.data(), static_cast<std::int64_t>(H) * P, ps,
                      packed_min.data(), packed_max.data());
      const auto q = normals(static_cast<std::size_t>(H) * G * d, rng);
      for (const auto mode : {kvsift::gqa_reduce::max, kvsift::gqa_reduce::mean}) {
        std::vector<float> a(static_cast<std::size_t>(H) * P), b(a.size());
        kt::page_scores(exec, q.data(), H, G, d, kmin.data(), kmax.data(), poff.data(), H,
                        static_cast<std::int64_t>(H) * P, mode, a.data(), page_cap);
        kt::page_scores(exec, q.data(), H, G, d, packed_min.data(), packed_max.data(),
                        poff.data(), H, static_cast<std::int64_t>(H) * P, mode, b.data());
        REQUIRE(a == b);
      }
    }
  });
}

TEST_CASE("thrust::expand_page_slots == select::expand_pages", "[thrust][decode-baselines]") {
  int S, ps;
  std::tie(S, ps) = GENERATE(std::pair{1, 4}, std::pair{3, 8}, std::pair{5, 16});
  CAPTURE(S, ps);
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::mt19937 rng(5u + static_cast<unsigned>(S * ps));
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int> lengths;
      kvsift::index_sets pages;
      std::vector<i32> slot_offsets{0};
      for (int s = 0; s < S; ++s) {
        const int n = 1 + static_cast<int>(rng() % 100);
        const int P = (n + ps - 1) / ps;
        const int k = 1 + static_cast<int>(rng() % static_cast<unsigned>(P));
        // the last page and k - 1 others, ascending (Quest's selection)
        std::vector<i32> others(static_cast<std::size_t>(P - 1));
        std::iota(others.begin(), others.end(), 0);
        std::shuffle(others.begin(), others.end(), rng);
        others.resize(static_cast<std::size_t>(k - 1));
        std::sort(others.begin(), others.end());
        others.push_back(P - 1);
        pages.push_back(std::span<const i32>(others));
        lengths.push_back(n);
        slot_offsets.push_back(slot_offsets.back() + n - (P - k) * ps);
      }
      kvsift::index_sets want;
      std::vector<int> scratch;
      kvsift::select::expand_pages(pages, lengths, ps, want, scratch);
      REQUIRE(want.offsets == slot_offsets);  // the host arithmetic of the counts
      std::vector<i32> got(static_cast<std::size_t>(slot_offsets.back()), -1);
      kt::expand_page_slots(exec, pages.offsets.data(), pages.values.data(), S, ps,
                            slot_offsets.data(), slot_offsets.back(), got.data());
      REQUIRE(got == want.values);
      for (int s = 0; s < S; ++s) {  // slots ⊆ [0, n_s), ascending
        for (i32 i = slot_offsets[s]; i < slot_offsets[s + 1]; ++i) {
          REQUIRE(got[i] >= 0);
          REQUIRE(got[i] < lengths[s]);
          if (i > slot_offsets[s]) REQUIRE(got[i - 1] < got[i]);
        }
      }
    }
  });
}

TEST_CASE("thrust::segmented_evict_one keeps what segmented_topk and the CPU top-k keep",
          "[thrust][decode-baselines]") {
  int S, sink, max_n;
  std::tie(S, sink, max_n) = GENERATE(std::tuple{1, 0, 5}, std::tuple{4, 4, 40},
                                      std::tuple{7, 2, 300});
  CAPTURE(S, sink, max_n);
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::mt19937 rng(3u + static_cast<unsigned>(S * max_n));
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<i32> offsets{0}, kept_offsets{0}, window;
      std::vector<float> scores;
      for (int s = 0; s < S; ++s) {
        const int w = static_cast<int>(rng() % 4);
        const int n = sink + w + 1 + static_cast<int>(rng() % static_cast<unsigned>(max_n));
        const bool full = rng() % 5 == 0;  // a segment within its budget keeps everything
        for (int j = 0; j < n; ++j) {      // few distinct values: ties
          scores.push_back(static_cast<float>(static_cast<int>(rng() % 7)) * 0.5f - 1.0f);
        }
        offsets.push_back(offsets.back() + n);
        kept_offsets.push_back(kept_offsets.back() + (full ? n : n - 1));
        window.push_back(w);
      }
      const std::int64_t N = offsets.back(), K = kept_offsets.back();
      const kt::topk_protection protect{sink, window.data()};
      std::vector<i32> got(static_cast<std::size_t>(K), -1), victims(static_cast<std::size_t>(S), -9);
      kt::segmented_evict_one(exec, scores.data(), offsets.data(), S, kept_offsets.data(), K,
                              got.data(), victims.data(), protect);
      std::vector<i32> want(static_cast<std::size_t>(K), -1);
      std::vector<std::byte> ws(kt::segmented_topk_workspace_bytes(N));
      kt::segmented_topk(exec, scores.data(), offsets.data(), S, N, kept_offsets.data(), K,
                         want.data(), ws.data(), ws.size(), protect);
      REQUIRE(got == want);
      for (int s = 0; s < S; ++s) {
        CAPTURE(trial, s);
        const int n = offsets[s + 1] - offsets[s];
        const int k = kept_offsets[s + 1] - kept_offsets[s];
        // the CPU selector's composition: sink, top of the middle, window
        std::vector<i32> cpu;
        for (int j = 0; j < sink; ++j) cpu.push_back(j);
        const std::span<const float> seg(scores.data() + offsets[s], static_cast<std::size_t>(n));
        kvsift::cpu::topk_range(seg, sink, n - window[s], k - sink - window[s], cpu);
        for (int j = n - window[s]; j < n; ++j) cpu.push_back(j);
        if (k == n) {
          cpu.resize(static_cast<std::size_t>(n));
          std::iota(cpu.begin(), cpu.end(), 0);
        }
        REQUIRE(std::vector<i32>(got.begin() + kept_offsets[s], got.begin() + kept_offsets[s + 1]) ==
                cpu);
        // |kept| = min(budget, n), the victim is the one slot missing
        REQUIRE(static_cast<int>(cpu.size()) == k);
        if (k == n) {
          REQUIRE(victims[s] == -1);
        } else {
          REQUIRE(victims[s] >= sink);
          REQUIRE(victims[s] < n - window[s]);
          REQUIRE(std::find(cpu.begin(), cpu.end(), victims[s]) == cpu.end());
        }
      }
    }
  });
}
