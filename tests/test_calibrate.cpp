// SPDX-License-Identifier: Apache-2.0
// Offline calibration (include/kvsift/calibrate/) laws: overlap is symmetric and in [0, 1],
// stability of unchanging sets is 1 and follows the median rule, profiling top-k sets agree
// with the selection they reuse, k-means is deterministic and assigns every head to a cluster
// whose representative it shares, star clustering partitions the heads into the four roles
// with no edge left between unclustered heads, and the head-roles file round-trips and rejects a
// file that does not match the model, naming the field. Exact outputs are pinned by the
// calibrate.* conformance vectors.

#include <kvsift/calibrate/all.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace cal = kvsift::calibrate;
using Catch::Matchers::ContainsSubstring;

// A random ascending subset of 0..n-1 with `size` elements.
std::vector<std::int32_t> random_set(std::mt19937& rng, int n, int size) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<std::size_t>(size));
  std::sort(all.begin(), all.end());
  return all;
}

// A symmetric similarity of H heads: `groups` blocks of high mutual overlap plus noise.
std::vector<float> block_similarity(std::mt19937& rng, int H, int groups) {
  std::uniform_real_distribution<float> noise(0.0f, 0.2f);
  std::vector<float> s(static_cast<std::size_t>(H) * H);
  for (int i = 0; i < H; ++i) {
    for (int j = i; j < H; ++j) {
      const float v = i == j ? 1.0f : (i % groups == j % groups ? 0.7f : 0.1f) + noise(rng);
      s[static_cast<std::size_t>(i) * H + j] = v;
      s[static_cast<std::size_t>(j) * H + i] = v;
    }
  }
  return s;
}

}  // namespace

TEST_CASE("overlap is symmetric, in [0, 1], 1 on identical and 0 on empty sets", "[calibrate]") {
  const unsigned seed = GENERATE(1u, 2u, 3u, 4u);
  CAPTURE(seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> size(0, 30);
  for (int trial = 0; trial < 50; ++trial) {
    const auto a = random_set(rng, 40, size(rng));
    const auto b = random_set(rng, 40, size(rng));
    const double ab = cal::overlap(a, b);
    REQUIRE(ab == cal::overlap(b, a));
    REQUIRE(ab >= 0.0);
    REQUIRE(ab <= 1.0);
    REQUIRE(cal::overlap(a, a) == (a.empty() ? 0.0 : 1.0));
    if (a.empty() || b.empty()) REQUIRE(ab == 0.0);
  }
  // a subset overlaps its superset fully
  REQUIRE(cal::overlap(std::vector<std::int32_t>{2, 5}, std::vector<std::int32_t>{1, 2, 5, 9}) ==
          1.0);
  REQUIRE(cal::overlap(std::vector<std::int32_t>{1, 3}, std::vector<std::int32_t>{3, 4, 5}) ==
          0.5);
}

TEST_CASE("overlap_matrix is symmetric with a unit diagonal for non-empty sets", "[calibrate]") {
  std::mt19937 rng(7);
  cal::head_sets sets;
  for (int r = 0; r < 6; ++r) sets.push_back(random_set(rng, 50, r == 3 ? 0 : 10));
  const auto m = cal::overlap_matrix(sets);
  REQUIRE(m.size() == 36);
  for (int i = 0; i < 6; ++i) {
    REQUIRE(m[static_cast<std::size_t>(i) * 6 + i] == (i == 3 ? 0.0f : 1.0f));
    for (int j = 0; j < 6; ++j) {
      REQUIRE(m[static_cast<std::size_t>(i) * 6 + j] == m[static_cast<std::size_t>(j) * 6 + i]);
    }
  }
}

TEST_CASE("overlap rejects sets that are not strictly ascending", "[calibrate]") {
  const std::vector<std::int32_t> good{1, 2, 3}, unsorted{3, 1}, dup{1, 1};
  REQUIRE_THROWS_AS(cal::overlap(good, unsorted), kvsift::error);
  REQUIRE_THROWS_WITH(cal::overlap(dup, good), ContainsSubstring("argument 'a[1]'"));
  REQUIRE_THROWS_AS(cal::overlap_matrix({good, unsorted}), kvsift::error);
}

TEST_CASE("median takes the mean of the two middle values of an even count", "[calibrate]") {
  REQUIRE(cal::median({3.0}) == 3.0);
  REQUIRE(cal::median({0.9, 0.1, 0.5}) == 0.5);
  REQUIRE(cal::median({0.9, 0.1, 0.5, 0.2}) == 0.35);
  REQUIRE_THROWS_AS(cal::median({}), kvsift::error);
}

TEST_CASE("stability of unchanging sets is 1; it is the median step overlap", "[calibrate]") {
  std::mt19937 rng(11);
  cal::head_sets prefill;
  for (int h = 0; h < 4; ++h) prefill.push_back(random_set(rng, 60, 12));
  const int T = GENERATE(1, 2, 5);
  CAPTURE(T);
  const std::vector<cal::head_sets> same(static_cast<std::size_t>(T), prefill);
  for (const float s : cal::stability(prefill, same)) REQUIRE(s == 1.0f);

  std::vector<cal::head_sets> steps;
  for (int t = 0; t < T; ++t) {
    cal::head_sets st;
    for (int h = 0; h < 4; ++h) st.push_back(random_set(rng, 60, 12));
    steps.push_back(std::move(st));
  }
  const auto s = cal::stability(prefill, steps);
  for (int h = 0; h < 4; ++h) {
    std::vector<double> o;
    for (int t = 0; t < T; ++t) o.push_back(cal::overlap(prefill[h], steps[t][h]));
    std::sort(o.begin(), o.end());
    const double want = T % 2 ? o[T / 2] : 0.5 * (o[T / 2 - 1] + o[T / 2]);
    REQUIRE(s[static_cast<std::size_t>(h)] == static_cast<float>(want));
  }
  REQUIRE_THROWS_WITH(cal::stability(prefill, {}), ContainsSubstring("'steps.size()'"));
  std::vector<cal::head_sets> short_step{cal::head_sets(3)};
  REQUIRE_THROWS_WITH(cal::stability(prefill, short_step), ContainsSubstring("'steps[0].size()'"));
}

TEST_CASE("topk_sets keeps min(k, n) ascending tokens per KV head, GQA-reduced", "[calibrate]") {
  const int G = GENERATE(1, 2, 4);
  const int n = GENERATE(7, 64);
  const int k = GENERATE(0, 5, 100);
  CAPTURE(G, n, k);
  const int H = 2, hq = H * G;
  std::mt19937 rng(static_cast<unsigned>(G * 1000 + n * 10 + k));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> att(static_cast<std::size_t>(hq) * n);
  for (auto& x : att) x = u(rng);
  cal::head_sets sets;
  cal::topk_sets(att, hq, n, {.k = k, .group = G, .kernel = 1, .gqa = kvsift::gqa_reduce::max},
                 sets);
  REQUIRE(sets.size() == static_cast<std::size_t>(H));
  for (int h = 0; h < H; ++h) {
    const auto& s = sets[static_cast<std::size_t>(h)];
    REQUIRE(static_cast<int>(s.size()) == std::min(k, n));
    REQUIRE(std::is_sorted(s.begin(), s.end()));
    // every kept token scores at least as high as every dropped one (GQA max of the group)
    const auto score = [&](int t) {
      float m = 0.0f;
      for (int g = 0; g < G; ++g) {
        m = std::max(m, att[(static_cast<std::size_t>(h) * G + g) * n + t]);
      }
      return m;
    };
    const std::set<int> kept(s.begin(), s.end());
    for (int t = 0; t < n; ++t) {
      if (kept.count(t)) continue;
      for (const int x : kept) REQUIRE(score(x) >= score(t));
    }
  }
  REQUIRE_THROWS_WITH(cal::topk_sets(att, hq, n + 1, {.k = k, .group = G}, sets),
                      ContainsSubstring("'attention.size()'"));
  REQUIRE_THROWS_WITH(cal::topk_sets(att, hq, n, {.k = k, .group = G, .kernel = 2}, sets),
                      ContainsSubstring("'kernel'"));
}

TEST_CASE("last_query_attention rows are softmax distributions", "[calibrate]") {
  const int hq = 4, H = 2, d = 8, n = 33;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(hq) * d), k(static_cast<std::size_t>(n) * H * d);
  for (auto& x : q) x = nd(rng);
  for (auto& x : k) x = nd(rng);
  std::vector<float> att;
  cal::last_query_attention(q, k, n, hq, H, d, att);
  REQUIRE(att.size() == static_cast<std::size_t>(hq) * n);
  for (int h = 0; h < hq; ++h) {
    double sum = 0.0;
    for (int t = 0; t < n; ++t) {
      const float a = att[static_cast<std::size_t>(h) * n + t];
      REQUIRE(a >= 0.0f);
      sum += a;
    }
    REQUIRE(std::abs(sum - 1.0) < 1e-5);
  }
  // the same query against a copy of KV head 0 in KV head 1 gives the same row
  for (int t = 0; t < n; ++t) {
    std::copy_n(k.begin() + (static_cast<std::ptrdiff_t>(t) * H) * d, d,
                k.begin() + (static_cast<std::ptrdiff_t>(t) * H + 1) * d);
  }
  std::copy_n(q.begin(), d, q.begin() + 2 * d);  // query head 2 reads KV head 1
  cal::last_query_attention(q, k, n, hq, H, d, att);
  for (int t = 0; t < n; ++t) REQUIRE(att[static_cast<std::size_t>(t)] == att[2 * n + t]);
}

TEST_CASE("kmeans_roles is deterministic and every head belongs to a represented cluster",
          "[calibrate]") {
  const int H = GENERATE(2, 5, 8, 16);
  const int C = GENERATE(1, 2, 3);
  if (C > H) return;
  CAPTURE(H, C);
  std::mt19937 rng(static_cast<unsigned>(H * 10 + C));
  const auto S = block_similarity(rng, H, C);
  const auto a = cal::kmeans_roles(S, H, {.clusters = C});
  const auto b = cal::kmeans_roles(S, H, {.clusters = C});
  REQUIRE(a.assign == b.assign);
  REQUIRE(a.representative == b.representative);
  REQUIRE(a.assign.size() == static_cast<std::size_t>(H));
  REQUIRE(a.representative.size() == static_cast<std::size_t>(C));
  REQUIRE(a.converged);
  for (const auto c : a.assign) REQUIRE((c >= 0 && c < C));
  for (int c = 0; c < C; ++c) {
    const int r = a.representative[static_cast<std::size_t>(c)];
    REQUIRE(r >= 0);
    REQUIRE(a.assign[static_cast<std::size_t>(r)] == c);
  }
  // with clear blocks, heads of one block share a cluster
  for (int i = 0; i < H; ++i) {
    REQUIRE(a.assign[static_cast<std::size_t>(i)] ==
            a.assign[static_cast<std::size_t>(i % C)]);
  }
}

TEST_CASE("kmeans_roles: duplicated heads tie to the lower index; bad input throws",
          "[calibrate]") {
  // heads 0 and 1 identical, heads 2 and 3 identical
  const std::vector<float> S{1.0f, 1.0f, 0.0f, 0.0f,  //
                             1.0f, 1.0f, 0.0f, 0.0f,  //
                             0.0f, 0.0f, 1.0f, 1.0f,  //
                             0.0f, 0.0f, 1.0f, 1.0f};
  const auto r = cal::kmeans_roles(S, 4, {.clusters = 2});
  REQUIRE(r.assign == std::vector<std::int32_t>{0, 0, 1, 1});
  REQUIRE(r.representative == std::vector<std::int32_t>{0, 2});
  REQUIRE_THROWS_WITH(cal::kmeans_roles(S, 4, {.clusters = 5}), ContainsSubstring("'clusters'"));
  REQUIRE_THROWS_WITH(cal::kmeans_roles(S, 3, {.clusters = 2}),
                      ContainsSubstring("'similarity.size()'"));
  REQUIRE_THROWS_WITH(cal::kmeans_roles(S, 4, {.clusters = 2, .max_iter = 0}),
                      ContainsSubstring("'max_iter'"));
}

TEST_CASE("kmeans_roles: fewer distinct head profiles than clusters leaves no cluster empty",
          "[calibrate]") {
  // issue 26 item 8: four heads with two distinct profiles (0 = 1, 2 = 3) and three clusters
  // left cluster 2 empty (representative -1) and the roles file could not be written. The
  // cluster count is reduced to the number of distinct profiles.
  const std::vector<float> S{1.0f, 1.0f, 0.2f, 0.2f,  //
                             1.0f, 1.0f, 0.2f, 0.2f,  //
                             0.2f, 0.2f, 1.0f, 1.0f,  //
                             0.2f, 0.2f, 1.0f, 1.0f};
  for (int C : {2, 3, 4}) {
    CAPTURE(C);
    const auto r = cal::kmeans_roles(S, 4, {.clusters = C});
    REQUIRE(r.assign == std::vector<std::int32_t>{0, 0, 1, 1});
    REQUIRE(r.representative == std::vector<std::int32_t>{0, 2});
  }
  // every head identical: one cluster
  const std::vector<float> same(9, 0.5f);
  const auto one = cal::kmeans_roles(same, 3, {.clusters = 3});
  REQUIRE(one.assign == std::vector<std::int32_t>{0, 0, 0});
  REQUIRE(one.representative == std::vector<std::int32_t>{0});
  // and the result is a valid roles file for a 4-head model
  cal::synckv_roles roles;
  roles.model = {.layers = 1, .q_heads = 4, .kv_heads = 4, .head_dim = 8, .config_hash = ""};
  const auto km = cal::kmeans_roles(S, 4, {.clusters = 3});
  roles.layers.push_back({km.assign, km.representative, S});
  const auto path = (std::filesystem::temp_directory_path() / "kvsift-kmeans-roles.json").string();
  REQUIRE_NOTHROW(cal::write_roles(path, roles));
  const auto back = cal::read_synckv_roles(path, roles.model);
  REQUIRE(back.layers.at(0).representatives == km.representative);
}

TEST_CASE("star_cluster partitions the heads into anchors, volatile, pivots and satellites",
          "[calibrate]") {
  const unsigned seed = GENERATE(1u, 2u, 3u, 4u, 5u, 6u);
  const int H = GENERATE(1, 4, 9);
  CAPTURE(seed, H);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> S(static_cast<std::size_t>(H) * H), s(static_cast<std::size_t>(H));
  for (int i = 0; i < H; ++i) {
    s[static_cast<std::size_t>(i)] = u(rng);
    for (int j = i; j < H; ++j) {
      const float v = i == j ? 1.0f : u(rng) * 0.9f;
      S[static_cast<std::size_t>(i) * H + j] = v;
      S[static_cast<std::size_t>(j) * H + i] = v;
    }
  }
  const cal::star_cluster_params p{.tau_sim = 0.5, .tau_stable = 0.5};
  const auto r = cal::star_cluster(S, s, p);
  REQUIRE(r.roles.size() == static_cast<std::size_t>(H));
  const auto edge = [&](int i, int j) { return i != j && S[static_cast<std::size_t>(i) * H + j] >= 0.5f; };
  using cal::head_role;
  for (int h = 0; h < H; ++h) {
    const auto role = r.roles[static_cast<std::size_t>(h)];
    const int lead = r.leader[static_cast<std::size_t>(h)];
    switch (role) {
      case head_role::pivot:
        REQUIRE(lead == h);
        break;
      case head_role::satellite:
        REQUIRE(r.roles[static_cast<std::size_t>(lead)] == head_role::pivot);
        REQUIRE(edge(h, lead));
        break;
      case head_role::anchor:
        REQUIRE(lead == -1);
        REQUIRE(s[static_cast<std::size_t>(h)] >= 0.5f);
        break;
      case head_role::volatile_head:
        REQUIRE(lead == -1);
        REQUIRE(s[static_cast<std::size_t>(h)] < 0.5f);
        break;
    }
    // an unclustered head has no edge to another unclustered head (the greedy loop ran out)
    const bool free_h = role == head_role::anchor || role == head_role::volatile_head;
    for (int j = 0; j < H && free_h; ++j) {
      const auto rj = r.roles[static_cast<std::size_t>(j)];
      if (rj == head_role::anchor || rj == head_role::volatile_head) REQUIRE_FALSE(edge(h, j));
    }
  }
  // a pivot has at least one satellite
  for (int h = 0; h < H; ++h) {
    if (r.roles[static_cast<std::size_t>(h)] != head_role::pivot) continue;
    REQUIRE(std::count(r.leader.begin(), r.leader.end(), h) >= 2);
  }
}

TEST_CASE("star_cluster picks the head with most neighbours, ties to the lower index",
          "[calibrate]") {
  // edges 0-1, 2-1, 2-3, 2-4: head 2 (3 neighbours) is the pivot of 1, 3, 4; 0 is left alone
  const int H = 5;
  std::vector<float> S(H * H, 0.0f);
  const auto set = [&](int i, int j) { S[i * H + j] = S[j * H + i] = 0.5f; };
  set(0, 1);
  set(2, 1);
  set(2, 3);
  set(2, 4);
  const std::vector<float> stab{0.2f, 0.9f, 0.9f, 0.9f, 0.9f};
  const auto r = cal::star_cluster(S, stab);
  using cal::head_role;
  REQUIRE(r.roles == std::vector<head_role>{head_role::volatile_head, head_role::satellite,
                                            head_role::pivot, head_role::satellite,
                                            head_role::satellite});
  REQUIRE(r.leader == std::vector<std::int32_t>{-1, 2, 2, 2, 2});
  S[0 * H + 1] = 0.4f;  // asymmetric
  REQUIRE_THROWS_WITH(cal::star_cluster(S, stab), ContainsSubstring("'similarity[0,1]'"));
  REQUIRE_THROWS_WITH(cal::star_cluster(S, std::vector<float>(4, 0.5f)),
                      ContainsSubstring("'similarity.size()'"));
}

namespace {

cal::model_fingerprint test_model() { return {2, 8, 4, 16, cal::fnv1a64_hex("{\"test\": 1}")}; }

cal::synckv_roles make_synckv() {
  std::mt19937 rng(3);
  cal::synckv_roles r;
  r.model = test_model();
  r.parameters = {{"clusters", 2}};
  for (int l = 0; l < 2; ++l) {
    const auto S = block_similarity(rng, 4, 2);
    const auto km = cal::kmeans_roles(S, 4, {.clusters = 2});
    r.layers.push_back({km.assign, km.representative, S});
  }
  return r;
}

cal::heterocache_roles make_heterocache() {
  cal::heterocache_roles r;
  r.model = test_model();
  r.parameters = {{"tau_sim", 0.5}};
  using cal::head_role;
  r.layers.push_back({{head_role::pivot, head_role::satellite, head_role::anchor,
                       head_role::volatile_head},
                      {0, 0, -1, -1},
                      {0.5f, 0.25f, 0.75f, 0.125f},
                      {}});
  r.layers.push_back({{head_role::anchor, head_role::anchor, head_role::satellite,
                       head_role::pivot},
                      {-1, -1, 3, 3},
                      {1.0f, 0.5f, 0.0f, 0.3f},
                      std::vector<float>(16, 0.25f)});
  return r;
}

std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

}  // namespace

TEST_CASE("roles files round-trip", "[calibrate]") {
  const auto sk = make_synckv();
  const std::string p1 = temp_path("kvsift_test_roles_synckv.json");
  cal::write_roles(p1, sk);
  const auto sk2 = cal::read_synckv_roles(p1, test_model());
  REQUIRE(sk2.model.config_hash == sk.model.config_hash);
  REQUIRE(sk2.parameters == sk.parameters);
  REQUIRE(sk2.layers.size() == 2);
  for (std::size_t l = 0; l < 2; ++l) {
    REQUIRE(sk2.layers[l].assign == sk.layers[l].assign);
    REQUIRE(sk2.layers[l].representatives == sk.layers[l].representatives);
    REQUIRE(sk2.layers[l].similarity == sk.layers[l].similarity);
  }
  for (int h = 0; h < 4; ++h) {
    const int rep = sk2.representative_of(0, h);
    REQUIRE(sk2.is_representative(0, rep));
    REQUIRE(sk2.layers[0].assign[static_cast<std::size_t>(rep)] ==
            sk2.layers[0].assign[static_cast<std::size_t>(h)]);
  }

  const auto hc = make_heterocache();
  const std::string p2 = temp_path("kvsift_test_roles_heterocache.json");
  cal::write_roles(p2, hc);
  const auto hc2 = cal::read_heterocache_roles(p2, test_model());
  for (std::size_t l = 0; l < 2; ++l) {
    REQUIRE(hc2.layers[l].roles == hc.layers[l].roles);
    REQUIRE(hc2.layers[l].leader == hc.layers[l].leader);
    REQUIRE(hc2.layers[l].stability == hc.layers[l].stability);
    REQUIRE(hc2.layers[l].similarity == hc.layers[l].similarity);
  }
  // a file of one method is not read as the other
  REQUIRE_THROWS_WITH(cal::read_heterocache_roles(p1, test_model()),
                      ContainsSubstring("'method'"));
  std::filesystem::remove(p1);
  std::filesystem::remove(p2);
}

TEST_CASE("a roles file that does not match the model is rejected, naming the field",
          "[calibrate]") {
  const auto j = cal::to_json(make_synckv());
  struct mismatch {
    const char* field;
    int layers, q_heads, kv_heads, head_dim;
  };
  const mismatch cases[] = {{"'model.layers'", 3, 8, 4, 16},
                            {"'model.q_heads'", 2, 16, 4, 16},
                            {"'model.kv_heads'", 2, 8, 8, 16},
                            {"'model.head_dim'", 2, 8, 4, 32}};
  for (const auto& m : cases) {
    CAPTURE(m.field);
    const cal::model_fingerprint want{m.layers, m.q_heads, m.kv_heads, m.head_dim, ""};
    REQUIRE_THROWS_AS(cal::synckv_roles_from_json(j, want), kvsift::error);
    REQUIRE_THROWS_WITH(cal::synckv_roles_from_json(j, want), ContainsSubstring(m.field));
  }
  auto other = test_model();
  other.config_hash = cal::fnv1a64_hex("{\"test\": 2}");
  REQUIRE_THROWS_WITH(cal::synckv_roles_from_json(j, other),
                      ContainsSubstring("'model.config_hash'"));
  REQUIRE_NOTHROW(cal::synckv_roles_from_json(j, test_model()));

  auto bad = j;
  bad["version"] = 2;
  REQUIRE_THROWS_WITH(cal::synckv_roles_from_json(bad), ContainsSubstring("'version'"));
  bad = j;
  bad["layers"][1]["assign"] = {0, 1, 0};
  REQUIRE_THROWS_WITH(cal::synckv_roles_from_json(bad),
                      ContainsSubstring("'layers[1].assign size'"));
  bad = j;
  bad["layers"][0]["representatives"] = {0, 0};
  REQUIRE_THROWS_WITH(cal::synckv_roles_from_json(bad),
                      ContainsSubstring("'layers[0].representatives["));
  bad = j;
  bad["layers"].erase(1);
  REQUIRE_THROWS_WITH(cal::synckv_roles_from_json(bad), ContainsSubstring("'layers size'"));

  auto h = cal::to_json(make_heterocache());
  h["layers"][0]["leader"][1] = 2;  // a satellite led by an anchor
  REQUIRE_THROWS_WITH(cal::heterocache_roles_from_json(h),
                      ContainsSubstring("'layers[0].leader[1]'"));
  h = cal::to_json(make_heterocache());
  h["layers"][1]["roles"][0] = 7;
  REQUIRE_THROWS_WITH(cal::heterocache_roles_from_json(h),
                      ContainsSubstring("'layers[1].roles[0]'"));
  // writing validates too
  auto r = make_heterocache();
  r.layers[0].stability.pop_back();
  REQUIRE_THROWS_WITH(cal::write_roles(temp_path("kvsift_never_written.json"), r),
                      ContainsSubstring("'layers[0].stability size'"));
}

TEST_CASE("the committed roles files match their model and came from calibration prompts",
          "[calibrate]") {
  // recall-8kv: N_r = 2; tiny-recall (2 KV heads per layer): N_r = 1, the only count that
  // leaves a follower (issue 27)
  for (const auto& [name, clusters] : {std::pair<const char*, std::size_t>{"recall-8kv", 2},
                                       {"tiny-recall", 1}}) {
    CAPTURE(name);
    const std::string dir = std::string(KVSIFT_SOURCE_DIR) + "/data/" + name;
    std::ifstream in(dir + "/config.json");
    REQUIRE(in);
    const auto cfg = nlohmann::json::parse(in);
    const cal::model_fingerprint model{cfg["num_hidden_layers"].get<int>(),
                                       cfg["num_attention_heads"].get<int>(),
                                       cfg["num_key_value_heads"].get<int>(),
                                       cfg["head_dim"].get<int>(),
                                       cal::config_hash_of(dir + "/config.json")};
    const auto sk = cal::read_synckv_roles(dir + "/roles-synckv.json", model);
    REQUIRE(sk.layers.size() == 4);
    for (const auto& l : sk.layers) REQUIRE(l.representatives.size() == clusters);
    const auto hc = cal::read_heterocache_roles(dir + "/roles-heterocache.json", model);
    REQUIRE(hc.layers.size() == 4);
    // calibrated on the model's calibration prompts, never on evaluation prompts
    CHECK(sk.parameters.value("prompts_file", "") == "calibration.jsonl");
    CHECK(hc.parameters.value("prompts_file", "") == "calibration.jsonl");
    CHECK(sk.parameters.value("prompts", 0) == 24);
    CHECK(hc.parameters.value("prompts", 0) == 24);
    // a model with other heads is refused
    auto other = model;
    other.kv_heads = model.kv_heads == 2 ? 8 : 2;
    other.q_heads = 8;
    REQUIRE_THROWS_WITH(cal::read_synckv_roles(dir + "/roles-synckv.json", other),
                        ContainsSubstring("'model.kv_heads'"));
  }
}

TEST_CASE("example: one layer's roles from profiled top-k sets", "[calibrate]") {
  // example-begin calibrate-one-layer
  namespace cal = kvsift::calibrate;
  // the top-k sets of 4 KV heads at the prefill step and at two decode steps
  const cal::head_sets prefill{{1, 2, 3}, {1, 2, 4}, {7, 8, 9}, {5, 8, 9}};
  const std::vector<cal::head_sets> steps{{{1, 2, 3}, {1, 2, 5}, {6, 8, 9}, {0, 1, 2}},
                                          {{1, 2, 3}, {2, 4, 6}, {7, 8, 9}, {0, 1, 3}}};
  // HeteroCache: similarity of the prefill sets, stability over the decode steps, star clusters
  const auto prof = cal::heterocache_profile(prefill, steps);
  const auto hc = cal::star_cluster(prof.similarity, prof.stability);
  // SyncKV: mean overlap over every profiled step, then k-means with N_r = 2
  std::vector<cal::head_sets> all{prefill};
  all.insert(all.end(), steps.begin(), steps.end());
  const auto km = cal::kmeans_roles(cal::synckv_similarity(all), 4, {.clusters = 2});
  // example-end calibrate-one-layer
  using cal::head_role;
  // edges 0-1 and 2-3 (overlap 2/3): heads 0 and 2 are pivots
  REQUIRE(hc.roles == std::vector<head_role>{head_role::pivot, head_role::satellite,
                                             head_role::pivot, head_role::satellite});
  REQUIRE(hc.leader == std::vector<std::int32_t>{0, 0, 2, 2});
  // stability: head 2 has overlaps 2/3 and 1 (even count: their mean), head 3 none
  REQUIRE(prof.stability[0] == 1.0f);
  REQUIRE(prof.stability[1] == static_cast<float>(2.0 / 3.0));
  REQUIRE(prof.stability[2] == static_cast<float>(0.5 * (2.0 / 3.0 + 1.0)));
  REQUIRE(prof.stability[3] == 0.0f);
  // S_01 = 5/9, S_03 = 4/9, S_13 = S_23 = 2/9, head 2 farthest from head 0: its own cluster
  REQUIRE(km.assign == std::vector<std::int32_t>{0, 0, 1, 0});
  REQUIRE(km.representative == std::vector<std::int32_t>{0, 2});
}
