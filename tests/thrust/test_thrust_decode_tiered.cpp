// SPDX-License-Identifier: Apache-2.0
// Laws of the Thrust algorithms of the two-tier methods (SyncKV, HeteroCache, FreeKV), each
// against its CPU reference on random inputs of several sizes, under the compiled device system
// (CPP or OMP) and thrust::cpp::par:
//   query_attention_scores  == score::last_query_attention (nq = 1) and the drift probe's
//                              per-query scores (cpu::attention_row, pool1d, reduce_group)
//   static_dynamic_split / _refresh / merge_sets == select::static_dynamic
//   leader_gather           == select::shared_by_cluster::share
//   drift_medians           == trigger::drift_probe
//   page_digest_append      == thrust::page_digest of the grown pool; pages_to_positions ==
//                              domain::pool_pages::page_positions; choose_sets
// plus kept ⊆ input and the counts the host gives.

#include <kvsift/cpu/attention_rows.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/domain/pool_pages.hpp>
#include <kvsift/score/last_query_attention.hpp>
#include <kvsift/select/shared_by_cluster.hpp>
#include <kvsift/select/static_dynamic.hpp>
#include <kvsift/store/dense.hpp>
#include <kvsift/store/tiered.hpp>
#include <kvsift/thrust/drift_median.hpp>
#include <kvsift/thrust/freekv_pages.hpp>
#include <kvsift/thrust/last_query_attention.hpp>
#include <kvsift/thrust/page_minmax.hpp>
#include <kvsift/thrust/roles.hpp>
#include <kvsift/thrust/static_dynamic.hpp>
#include <kvsift/trigger/drift_probe.hpp>

#include <thrust/execution_policy.h>
#include <thrust/system/cpp/execution_policy.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

namespace kt = kvsift::thrust;
using i32 = std::int32_t;

template <class F>
void for_each_policy(F&& f) {
  f(::thrust::device, std::string("device(" KVSIFT_THRUST_SYSTEM_NAME ")"));
  f(::thrust::cpp::par, std::string("cpp::par"));
}

std::vector<i32> csr(const std::vector<i32>& counts) {
  std::vector<i32> o{0};
  for (const auto c : counts) o.push_back(o.back() + c);
  return o;
}

bool subset_ascending(std::span<const i32> a, int n) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] < 0 || a[i] >= n || (i > 0 && a[i] <= a[i - 1])) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("thrust query_attention_scores matches score::last_query_attention", "[thrust][decode-tiered]") {
  const int kernel = GENERATE(1, 5);
  const int group = GENERATE(1, 2);
  const int n_max = GENERATE(7, 40);
  CAPTURE(kernel, group, n_max);
  const int H = 3, d = 16, R = 2;
  const kvsift::model_shape sh{1, H * group, H, d};
  std::mt19937 rng(7 + kernel + n_max);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::vector<int> lens{n_max, n_max / 2 + 1};
  kvsift::store::dense<float> store(sh, R, n_max);
  std::vector<float> packed;
  std::vector<i32> offsets{0};
  for (int r = 0; r < R; ++r) {
    std::vector<float> k(static_cast<std::size_t>(lens[r]) * H * d);
    for (auto& x : k) x = nd(rng);
    using view = kvsift::kv_view<const float, kvsift::nhd>;
    store.append(r, 0, view::contiguous(k.data(), lens[r], H, d), view::contiguous(k.data(), lens[r], H, d), 0);
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < lens[r]; ++t) {
        const auto* row = k.data() + (static_cast<std::size_t>(t) * H + h) * d;
        packed.insert(packed.end(), row, row + d);
      }
      offsets.push_back(offsets.back() + lens[r]);
    }
  }
  std::vector<float> q(static_cast<std::size_t>(R) * sh.q_heads * d);
  for (auto& x : q) x = nd(rng);
  std::vector<kvsift::kv_view<const float, kvsift::nhd>> qv;
  std::vector<i32> qpos;
  std::vector<int> ids;
  for (int r = 0; r < R; ++r) {
    qv.push_back(kvsift::kv_view<const float, kvsift::nhd>::contiguous(
        q.data() + static_cast<std::size_t>(r) * sh.q_heads * d, 1, sh.q_heads, d));
    qpos.push_back(lens[r] - 1 - r);  // request 1's query sees all but its last token
    ids.push_back(r);
  }
  kvsift::score_input<kvsift::store::dense<float>> in;
  in.store = &store;
  in.requests = ids;
  in.queries = qv;
  in.query_position = qpos;
  const kvsift::score::last_query_attention sc{
      {.kernel = kernel, .pool = kvsift::pooling::avg, .gqa = kvsift::gqa_reduce::max}};
  kvsift::score_sets want;
  sc.score(in, want);
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    const kt::segmented_rows<float> rows{packed.data(), offsets.data(), nullptr, 0, R * H, d};
    const kt::window_queries wq{q.data(), qpos.data(), 1, H, group};
    const std::int64_t N = offsets.back();
    std::vector<float> got(static_cast<std::size_t>(N), -1.0f);
    std::vector<std::byte> ws(kt::query_attention_workspace_bytes(N, group, 1));
    kt::query_attention_scores(exec, rows, wq, N, kernel, kvsift::pooling::avg,
                               kvsift::gqa_reduce::max, got.data(), ws.data(), ws.size());
    REQUIRE(got == want.values);
  });
}

TEST_CASE("thrust query_attention_scores: W queries over the prompt (the drift probe)", "[thrust][decode-tiered]") {
  const int W = GENERATE(1, 3, 5);
  const int n = GENERATE(9, 33);
  CAPTURE(W, n);
  const int H = 2, G = 2, d = 8;
  std::mt19937 rng(11 + W * n);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> keys(static_cast<std::size_t>(H) * n * d), q(static_cast<std::size_t>(W) * H * G * d);
  for (auto& x : keys) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  // reference: per head and query, per query head softmax over the n keys, pool 5 avg, GQA max
  const kvsift::model_shape sh{1, H * G, H, d};
  kvsift::store::dense<float> store(sh, 1, n);
  std::vector<float> nhd_keys(keys.size());
  for (int h = 0; h < H; ++h) {
    for (int t = 0; t < n; ++t) {
      std::copy_n(keys.data() + (static_cast<std::size_t>(h) * n + t) * d, d,
                  nhd_keys.data() + (static_cast<std::size_t>(t) * H + h) * d);
    }
  }
  using view = kvsift::kv_view<const float, kvsift::nhd>;
  store.append(0, 0, view::contiguous(nhd_keys.data(), n, H, d), view::contiguous(nhd_keys.data(), n, H, d), 0);
  std::vector<float> want;
  for (int h = 0; h < H; ++h) {
    for (int w = 0; w < W; ++w) {
      std::vector<float> rows(static_cast<std::size_t>(G) * n, 0.0f), probs(static_cast<std::size_t>(n));
      for (int g = 0; g < G; ++g) {
        const float* qq = q.data() + (static_cast<std::size_t>(w) * H * G + h * G + g) * d;
        const int v = kvsift::cpu::attention_row(store, sh.sequence(0, 0, h), qq, n - 1, probs);
        kvsift::cpu::pool1d(std::span<const float>(probs.data(), static_cast<std::size_t>(v)),
                            std::span<float>(rows.data() + static_cast<std::size_t>(g) * n, n), 5,
                            kvsift::pooling::avg);
      }
      std::vector<float> out(static_cast<std::size_t>(n));
      kvsift::cpu::reduce_group(rows, G, out, kvsift::gqa_reduce::max);
      want.insert(want.end(), out.begin(), out.end());
    }
  }
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    const std::vector<i32> offsets{0, n, 2 * n};
    const std::vector<i32> first{n - 1};
    const kt::segmented_rows<float> rows{keys.data(), offsets.data(), nullptr, 0, H, d};
    const kt::window_queries wq{q.data(), first.data(), W, H, G};
    std::vector<float> got(static_cast<std::size_t>(H) * n * W, -1.0f);
    std::vector<std::byte> ws(kt::query_attention_workspace_bytes(H * n, G, W));
    kt::query_attention_scores(exec, rows, wq, H * n, 5, kvsift::pooling::avg,
                               kvsift::gqa_reduce::max, got.data(), ws.data(), ws.size());
    REQUIRE(got == want);
  });
}

TEST_CASE("thrust static_dynamic split, refresh and merge match select::static_dynamic", "[thrust][decode-tiered]") {
  const int n = GENERATE(1, 10, 64, 300);
  const double rho = GENERATE(0.0, 0.25, 0.5, 1.0);
  const bool ties = GENERATE(false, true);
  CAPTURE(n, rho, ties);
  const int S = 4;
  std::mt19937 rng(static_cast<unsigned>(n * 13 + rho * 8 + ties));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  kvsift::score_sets scores;
  scores.resize(std::vector<int>(S, n));
  for (auto& x : scores.values) x = ties ? std::round(nd(rng) * 2.0f) : nd(rng);
  const std::vector<int> budgets{0, n / 3, n, n + 5};
  const kvsift::select::static_dynamic sel{{.rho = rho}};
  kvsift::index_sets want_st, want_dy;
  sel.split(scores, budgets, want_st, want_dy);
  std::vector<i32> ns, nd_;
  for (int s = 0; s < S; ++s) {
    const int k = std::min(budgets[s], n);
    ns.push_back(sel.static_count(k));
    nd_.push_back(k - sel.static_count(k));
  }
  // refresh: limits inside the segment, k_dyn <= candidates
  std::vector<int> limits, kdyn;
  for (int s = 0; s < S; ++s) {
    limits.push_back(s % 2 == 0 ? n : std::max(ns[s], n - 2));
    const int cand = limits.back() - ns[s];
    kdyn.push_back(std::max(0, std::min(nd_[s] + 1, cand)));
  }
  kvsift::index_sets want_ref;
  sel.refresh(scores, want_st, limits, kdyn, want_ref);
  kvsift::index_sets want_kept;
  sel.select(scores, budgets, want_kept);
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    const auto so = csr(ns), dof = csr(nd_);
    std::vector<i32> st(static_cast<std::size_t>(so.back()), -1), dy(static_cast<std::size_t>(dof.back()), -1);
    std::vector<std::byte> ws(kt::static_dynamic_split_workspace_bytes(scores.values.size(), S));
    kt::static_dynamic_split(exec, scores.values.data(), scores.offsets.data(), S,
                             static_cast<std::int64_t>(scores.values.size()), so.data(), so.back(),
                             st.data(), dof.data(), dof.back(), dy.data(), ws.data(), ws.size());
    REQUIRE(so == want_st.offsets);
    REQUIRE(st == want_st.values);
    REQUIRE(dof == want_dy.offsets);
    REQUIRE(dy == want_dy.values);
    for (int s = 0; s < S; ++s) {
      REQUIRE(subset_ascending(std::span<const i32>(st).subspan(so[s], ns[s]), n));
    }
    // refresh
    const std::vector<i32> lim(limits.begin(), limits.end());
    const auto ro = csr(std::vector<i32>(kdyn.begin(), kdyn.end()));
    std::vector<i32> ref(static_cast<std::size_t>(ro.back()), -1);
    std::vector<std::byte> rws(kt::static_dynamic_refresh_workspace_bytes(scores.values.size(), S));
    kt::static_dynamic_refresh(exec, scores.values.data(), scores.offsets.data(), S,
                               static_cast<std::int64_t>(scores.values.size()), lim.data(),
                               so.data(), st.data(), so.back(), ro.data(), ro.back(), ref.data(),
                               rws.data(), rws.size());
    REQUIRE(ro == want_ref.offsets);
    REQUIRE(ref == want_ref.values);
    // merge: static ∪ dynamic = the top min(budget, n)
    const auto mo = csr([&] {
      std::vector<i32> c;
      for (int s = 0; s < S; ++s) c.push_back(ns[s] + nd_[s]);
      return c;
    }());
    std::vector<i32> kept(static_cast<std::size_t>(mo.back()), -1);
    kt::merge_sets(exec, so.data(), st.data(), so.back(), dof.data(), dy.data(), dof.back(), S,
                   mo.data(), kept.data());
    REQUIRE(mo == want_kept.offsets);
    REQUIRE(kept == want_kept.values);
  });
}

TEST_CASE("thrust leader_gather matches select::shared_by_cluster::share", "[thrust][decode-tiered]") {
  const int R = GENERATE(1, 3);
  CAPTURE(R);
  const kvsift::select::cluster_roles roles{{0, 1, 0, 2, 1, 2}, {2, 1, 5}};
  const int H = roles.kv_heads();
  std::mt19937 rng(5 + R);
  std::uniform_int_distribution<int> len(0, 9);
  kvsift::index_sets by_head;
  std::vector<i32> sizes;
  for (int s = 0; s < R * H; ++s) {
    std::vector<i32> v(static_cast<std::size_t>(len(rng)));
    std::iota(v.begin(), v.end(), s * 3);
    sizes.push_back(static_cast<i32>(v.size()));
    by_head.push_back(v);
  }
  kvsift::index_sets want;
  kvsift::select::shared_by_cluster<>::share(roles, by_head, want);
  std::vector<i32> leader;
  for (int s = 0; s < R * H; ++s) leader.push_back((s / H) * H + roles.leader(s % H));
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    const auto off = kt::leader_offsets(sizes, leader);
    std::vector<i32> got(static_cast<std::size_t>(off.back()), -1);
    kt::leader_gather(exec, by_head.offsets.data(), by_head.values.data(), leader.data(), R * H,
                      off.data(), off.back(), got.data());
    REQUIRE(off == want.offsets);
    REQUIRE(got == want.values);
  });
}

TEST_CASE("thrust drift_medians matches trigger::drift_probe", "[thrust][decode-tiered]") {
  const int W = GENERATE(1, 4, 5);
  const double tau = GENERATE(0.3, 0.5, 0.8);
  CAPTURE(W, tau);
  const int P = 3, universe = 40;
  std::mt19937 rng(17 + W);
  std::bernoulli_distribution coin(0.3);
  const auto draw = [&] {
    std::vector<i32> s;
    for (int j = 0; j < universe; ++j) {
      if (coin(rng)) s.push_back(j);
    }
    return s;
  };
  kvsift::index_sets sets, refs;
  std::vector<double> want_median;
  std::vector<i32> want_drift;
  const kvsift::trigger::drift_probe probe{kvsift::trigger::drift_median{{.window = W, .tau_drift = tau}}};
  for (int p = 0; p < P; ++p) {
    std::vector<std::vector<i32>> w;
    for (int i = 0; i < W; ++i) {
      w.push_back(p == 2 && i == 0 ? std::vector<i32>{} : draw());
      sets.push_back(w.back());
    }
    const auto r = draw();
    refs.push_back(r);
    const auto dec = probe.check(w, r);
    want_median.push_back(dec.median);
    want_drift.push_back(dec.drift ? 1 : 0);
  }
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    std::vector<double> med(P, -1.0);
    std::vector<i32> drift(P, -1);
    std::vector<std::byte> ws(kt::drift_medians_workspace_bytes(P, W));
    kt::drift_medians(exec, sets.offsets.data(), sets.values.data(), refs.offsets.data(),
                      refs.values.data(), P, W, tau, med.data(), drift.data(), ws.data(), ws.size());
    REQUIRE(med == want_median);
    REQUIRE(drift == want_drift);
  });
}

TEST_CASE("thrust page_digest_append, pages_to_positions and choose_sets", "[thrust][decode-tiered]") {
  const int ps = GENERATE(4, 8);
  const int n0 = GENERATE(1, 13, 32);
  CAPTURE(ps, n0);
  const int S = 2, d = 5, steps = 11;
  const int cap = n0 + steps;
  const int P_max = (cap + ps - 1) / ps;
  std::mt19937 rng(23 + ps + n0);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> keys(static_cast<std::size_t>(S) * cap * d);
  for (auto& x : keys) x = std::round(nd(rng) * 2.0f) / 2.0f;  // ties and -0 / +0
  for_each_policy([&](const auto& exec, const std::string& name) {
    CAPTURE(name);
    const std::vector<i32> poff{0, P_max, 2 * P_max};
    std::vector<float> kmin(static_cast<std::size_t>(S) * P_max * d), kmax(kmin.size());
    std::vector<i32> off{0, n0, 2 * n0};
    const kt::segmented_rows<float> prompt{keys.data(), off.data(), nullptr, static_cast<std::int64_t>(cap) * d, S, d};
    kt::page_digest(exec, prompt, poff.data(), S * P_max, ps, kmin.data(), kmax.data());
    for (int n = n0; n < cap; ++n) {
      std::vector<float> row(static_cast<std::size_t>(S) * d);
      for (int s = 0; s < S; ++s) {
        std::copy_n(keys.data() + (static_cast<std::size_t>(s) * cap + n) * d, d, row.data() + static_cast<std::size_t>(s) * d);
      }
      kt::page_digest_append(exec, row.data(), S, d, n, ps, P_max, kmin.data(), kmax.data());
      // == the digest recomputed over n + 1 tokens, page for page (bits)
      std::vector<i32> off2{0, n + 1, 2 * (n + 1)};
      const kt::segmented_rows<float> grown{keys.data(), off2.data(), nullptr, static_cast<std::int64_t>(cap) * d, S, d};
      std::vector<float> wmin(kmin.size()), wmax(kmax.size());
      kt::page_digest(exec, grown, poff.data(), S * P_max, ps, wmin.data(), wmax.data());
      const int pages = (n + 1 + ps - 1) / ps;
      for (int s = 0; s < S; ++s) {
        for (std::size_t e = 0; e < static_cast<std::size_t>(pages) * d; ++e) {
          const std::size_t at = static_cast<std::size_t>(s) * P_max * d + e;
          REQUIRE(kvsift::detail::float_bits(kmin[at]) == kvsift::detail::float_bits(wmin[at]));
          REQUIRE(kvsift::detail::float_bits(kmax[at]) == kvsift::detail::float_bits(wmax[at]));
        }
      }
    }
    // pages_to_positions == pool_pages::page_positions for page sets ending at the current page
    const int N = cap;
    const int P = (N + ps - 1) / ps;
    const kvsift::model_shape sh{1, S, S, d};
    kvsift::store::tiered<float> st(sh, 1, N, ps);
    std::vector<float> nhd(static_cast<std::size_t>(N) * S * d, 0.0f);
    using view = kvsift::kv_view<const float, kvsift::nhd>;
    st.append(0, 0, view::contiguous(nhd.data(), N, S, d), view::contiguous(nhd.data(), N, S, d), 0);
    const kvsift::domain::pool_pages<float> pool{&st};
    kvsift::index_sets pages;
    std::vector<i32> counts;
    std::vector<i32> want;
    for (int s = 0; s < S; ++s) {
      std::vector<i32> pg;
      for (int j = 0; j + 1 < P; ++j) {
        if ((j + s) % 3 != 1) pg.push_back(j);
      }
      pg.push_back(P - 1);
      pages.push_back(pg);
      const auto w = pool.page_positions(0, 0, ps, pg);
      want.insert(want.end(), w.begin(), w.end());
      counts.push_back(static_cast<i32>((pg.size() - 1) * ps + (N - (P - 1) * ps)));
    }
    const auto oo = csr(counts);
    std::vector<i32> got(static_cast<std::size_t>(oo.back()), -1);
    kt::pages_to_positions(exec, pages.offsets.data(), pages.values.data(), S, ps, oo.data(),
                           oo.back(), got.data());
    REQUIRE(got == want);
    // choose_sets: per segment one of two equal shapes
    const std::vector<i32> o3{0, 2, 2, 5};
    const std::vector<i32> a{1, 2, 3, 4, 5}, b{-1, -2, -3, -4, -5}, flags{1, 0, 0};
    std::vector<i32> c(5, 0);
    kt::choose_sets(exec, o3.data(), 3, 5, flags.data(), a.data(), b.data(), c.data());
    REQUIRE(c == std::vector<i32>{1, 2, -3, -4, -5});
  });
}
