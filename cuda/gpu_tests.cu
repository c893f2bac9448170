// SPDX-License-Identifier: Apache-2.0
// GPU tests of the CUDA backend against CPU references written here. Every test that needs a
// device SKIPs with a message without one; the error-path tests run everywhere.

#include "instantiations.cuh"

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace kc = kvsift::cuda;
using i32 = std::int32_t;

namespace {

bool has_device() { return kc::device_count() > 0; }

#define KVSIFT_REQUIRE_GPU()                                                                    \
  do {                                                                                          \
    if (!has_device()) {                                                                        \
      SKIP("no CUDA device (cudaGetDeviceCount failed or returned 0)");                         \
    }                                                                                           \
  } while (false)

template <class T>
kc::device_buffer<T> upload(const std::vector<T>& h) {
  kc::device_buffer<T> d(h.size());
  if (!h.empty()) {
    kc::check(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
              "upload");
  }
  return d;
}

template <class T>
std::vector<T> download(const kc::device_buffer<T>& d) {
  std::vector<T> h(d.size());
  if (!h.empty()) {
    kc::check(cudaMemcpy(h.data(), d.data(), h.size() * sizeof(T), cudaMemcpyDeviceToHost),
              "download");
  }
  return h;
}

std::vector<i32> csr(const std::vector<i32>& sizes) {
  std::vector<i32> o(sizes.size() + 1, 0);
  std::partial_sum(sizes.begin(), sizes.end(), o.begin() + 1);
  return o;
}

// CPU reference of the top-k contract: score desc (NaN last, -0 == +0), ties to lower index,
// result ascending.
std::vector<i32> topk_reference(const std::vector<float>& s, const std::vector<i32>& off,
                                const std::vector<i32>& out_off) {
  std::vector<i32> out;
  for (std::size_t seg = 0; seg + 1 < off.size(); ++seg) {
    std::vector<i32> idx(off[seg + 1] - off[seg]);
    std::iota(idx.begin(), idx.end(), 0);
    const float* x = s.data() + off[seg];
    std::sort(idx.begin(), idx.end(), [&](i32 a, i32 b) {
      const bool na = std::isnan(x[a]);
      const bool nb = std::isnan(x[b]);
      if (na != nb) {
        return nb;
      }
      if (!na && x[a] != x[b]) {
        return x[a] > x[b];
      }
      return a < b;
    });
    idx.resize(out_off[seg + 1] - out_off[seg]);
    std::sort(idx.begin(), idx.end());
    out.insert(out.end(), idx.begin(), idx.end());
  }
  return out;
}

}  // namespace

TEST_CASE("cuda_error carries the CUDA error name and string", "[cuda][error]") {
  try {
    kc::check(cudaErrorInvalidValue, "unit");
    FAIL("no exception");
  } catch (const kvsift::cuda_error& e) {
    const std::string what = e.what();
    CHECK(e.code() == cudaErrorInvalidValue);
    CHECK(what.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(what.find("unit") != std::string::npos);
  }
  CHECK_NOTHROW(kc::check(cudaSuccess, "unit"));
}

TEST_CASE("segmented_topk validates its counts before touching the device", "[cuda][error]") {
  CHECK_THROWS_AS(kc::make_segmented_topk_plan(-1, 1, 0), kvsift::error);
  CHECK_THROWS_AS(kc::make_segmented_topk_plan(4, 1, 5), kvsift::error);
  CHECK_THROWS_AS(kc::streamed_recall<float>(kc::recall_shape{32, 2, 64, 0}), kvsift::error);
  // the split path: chosen for a few long segments, forced or refused by `chunks`
  const auto few_long = kc::make_segmented_topk_plan(131072 * 32, 32, 13107 * 32);
  CHECK(few_long.chunks == 16);
  CHECK(few_long.workspace_bytes >= 32 * (16 * 8 + 256 * 4 + 8));
  const auto many = kc::make_segmented_topk_plan(32768 * 256, 256, 3276 * 256);
  CHECK(many.chunks == 1);
  CHECK(many.workspace_bytes == 0);
  CHECK(kc::make_segmented_topk_plan(1000, 4, 10).chunks == 1);
  CHECK(kc::make_segmented_topk_plan(1000, 4, 10, 5).chunks == 5);
  CHECK(kc::make_segmented_topk_plan(1 << 20, 2, 10, 1).chunks == 1);
  CHECK(kc::make_segmented_topk_plan(1 << 20, 2, 10, 1).workspace_bytes == 0);
  CHECK_THROWS_AS(kc::make_segmented_topk_plan(1000, 4, 10, 65), kvsift::error);
  CHECK_THROWS_AS(kc::make_segmented_topk_plan(100000, 128, 10, 2), kvsift::error);
  CHECK_THROWS_AS(kc::make_segmented_topk_plan(1000, 4, 10, -1), kvsift::error);
  // a split plan refuses a workspace smaller than it asks for, before any launch
  const auto split = kc::make_segmented_topk_plan(1000, 4, 10, 5);
  CHECK_THROWS_AS(kc::segmented_topk(kc::par{}, split, nullptr, split.workspace_bytes - 1,
                                     static_cast<const float*>(nullptr), nullptr, nullptr, nullptr),
                  kvsift::error);
}

// Issue 19: device entry points validate what the host can see, before any launch (no device
// needed): counts past CUB's int32, null arrays, slot ids.
TEST_CASE("device entry points reject counts past int32, null arrays and bad slots",
          "[cuda][error][defects]") {
  CHECK_THROWS_AS(kc::make_segmented_topk_plan(std::int64_t{1} << 31, 1, 0), kvsift::error);
  CHECK_THROWS_AS(kc::segmented_topk_workspace_bytes(std::int64_t{1} << 32, 1, 0), kvsift::error);
  CHECK_THROWS_AS(kc::make_segmented_topk_plan(4, std::int64_t{1} << 31, 1), kvsift::error);

  const i32 lens[1] = {8};
  const auto kv = kc::make_dense_nhd<float>(nullptr, nullptr, lens, 8, 2, 64);
  i32 off[3] = {0, 1, 2};
  i32 idx[2] = {0, 0};
  CHECK_THROWS_AS(kc::expand_pages(kc::par{}, kv, kc::page_set{nullptr, idx, 4}, 2, off, idx),
                  kvsift::error);
  CHECK_THROWS_AS(kc::expand_pages(kc::par{}, kv, kc::page_set{off, idx, 4}, 2, nullptr, idx),
                  kvsift::error);
  CHECK_THROWS_AS(kc::expand_pages(kc::par{}, kv, kc::page_set{off, idx, 4}, -1, off, idx),
                  kvsift::error);

  // sparse attention: plans and launches are checked against each other and the view
  const kc::sparse_attention_shape ashape{1, 4, 0.0f};
  CHECK_THROWS_AS(kc::make_sparse_attention_plan(ashape, 2, 96, 10), kvsift::error);
  CHECK_THROWS_AS(kc::make_sparse_attention_plan(ashape, 3, 64, 10), kvsift::error);
  CHECK_THROWS_AS(kc::make_sparse_attention_plan(ashape, 2, 64, -1), kvsift::error);
  const auto plan = kc::make_sparse_attention_plan(ashape, 2, 64, 4096);
  CHECK(plan.num_splits > 1);
  CHECK(plan.workspace_bytes > 0);
  CHECK(std::int64_t{plan.num_splits} * plan.chunk >= 4096);
  CHECK(std::int64_t{plan.num_splits - 1} * plan.chunk < 4096);
  CHECK(kc::make_sparse_attention_plan(ashape, 2, 64, 0).num_splits == 1);
  CHECK(kc::make_sparse_attention_plan(ashape, 2, 64, 4096, 1, 1).num_splits == 1);
  alignas(16) float fq[256] = {};
  const kc::token_set tset{off, idx};
  // a plan for another shape, a workspace too small, rows not 16-byte aligned
  CHECK_THROWS_AS(kc::sparse_decode_attention(kc::par{}, plan, fq, plan.workspace_bytes, fq, kv,
                                              tset, kc::sparse_attention_shape{2, 4, 0.0f}, fq),
                  kvsift::error);
  CHECK_THROWS_AS(kc::sparse_decode_attention(kc::par{}, plan, fq, plan.workspace_bytes - 1, fq,
                                              kv, tset, ashape, fq),
                  kvsift::error);
  const kc::dense_kv<float> odd{fq + 1, fq + 1, lens, 0, 64, 128, 2, 64};
  CHECK_THROWS_AS(kc::sparse_decode_attention(kc::par{}, fq, odd, tset, ashape, fq),
                  kvsift::error);

  float dummy[1] = {};
  const std::vector<i32> slots{0, 3};
  kc::recall_shape shape{.page_size = 4, .num_kv_heads = 2, .head_dim = 64};
  CHECK_THROWS_AS(kc::hnd_pages_to_nhd<float>(kc::par{}, shape, nullptr, slots, dummy, dummy),
                  kvsift::error);
  CHECK_THROWS_AS(kc::hnd_pages_to_nhd<float>(kc::par{}, shape, dummy, slots, nullptr, dummy),
                  kvsift::error);
  const std::vector<i32> negative{0, -1};
  CHECK_THROWS_AS(kc::hnd_pages_to_nhd<float>(kc::par{}, shape, dummy, negative, dummy, dummy),
                  kvsift::error);
  shape.num_slots = 3;
  CHECK_THROWS_AS(kc::hnd_pages_to_nhd<float>(kc::par{}, shape, dummy, slots, dummy, dummy),
                  kvsift::error);
}

TEST_CASE("segmented_topk matches the CPU reference, ties and NaN included", "[cuda][topk]") {
  KVSIFT_REQUIRE_GPU();
  const unsigned seed = GENERATE(1u, 2u, 3u);
  const int segments = GENERATE(1, 7, 300);
  const int levels = GENERATE(3, 1000000);  // few levels: many ties
  // segments up to 70000 scores: with 1 segment the average can pass detail::topk_long_segment,
  // where the plan splits the segment (chunks 0) or the 1024-thread kernel runs (chunks 1)
  const int longest = GENERATE(5000, 70000);
  // 0: the plan chooses; 1: one block per segment; 5 and 64: the split path forced (fewer than
  // 128 segments only; 64 slices of short segments leave most slices empty)
  const int asked = GENERATE(0, 1, 5, 64);
  const int chunks = segments < kc::detail::topk_split_max_segments ? asked : 0;
  CAPTURE(seed, segments, levels, longest, chunks);
  std::mt19937 rng(seed);
  std::vector<i32> sizes(segments), kept(segments);
  for (int s = 0; s < segments; ++s) {
    sizes[s] = std::uniform_int_distribution<i32>(0, s % 5 == 0 ? longest : 300)(rng);
    kept[s] = sizes[s] == 0 ? 0 : std::uniform_int_distribution<i32>(0, sizes[s])(rng);
  }
  const auto off = csr(sizes);
  const auto out_off = csr(kept);
  std::vector<float> scores(off.back());
  std::uniform_int_distribution<int> level(0, levels - 1);
  for (auto& x : scores) {
    x = static_cast<float>(level(rng)) - static_cast<float>(levels / 2);
  }
  for (std::size_t i = 0; i < scores.size(); i += 97) {
    scores[i] = std::numeric_limits<float>::quiet_NaN();
  }
  for (std::size_t i = 5; i < scores.size(); i += 89) {
    scores[i] = (i % 2) ? -0.0f : std::numeric_limits<float>::infinity();
  }
  const auto plan = kc::make_segmented_topk_plan(off.back(), segments, out_off.back(), chunks);
  if (chunks > 0) {
    CHECK(plan.chunks == chunks);
  }
  kc::device_buffer<std::byte> ws(plan.workspace_bytes);
  if (ws.size() > 0) {  // garbage in the workspace: the call initialises what it uses
    kc::check(cudaMemset(ws.data(), 0xab, ws.size()), "test");
  }
  auto d_scores = upload(scores);
  auto d_off = upload(off);
  auto d_out_off = upload(out_off);
  kc::device_buffer<i32> d_out(out_off.back());
  kc::stream st;
  const auto expected = topk_reference(scores, off, out_off);
  for (int launch = 0; launch < 2; ++launch) {  // the second launch reuses the workspace
    kc::check(cudaMemset(d_out.data(), 0xff, d_out.size() * sizeof(i32)), "test");
    kc::segmented_topk(kc::par{st.get()}, plan, ws.data(), ws.size(), d_scores.data(),
                       d_off.data(), d_out_off.data(), d_out.data());
    st.synchronize();
    CHECK(download(d_out) == expected);
  }
}

TEST_CASE("segmented_topk's 1024-thread kernel and split path: several long segments, one "
          "empty, ties",
          "[cuda][topk]") {
  KVSIFT_REQUIRE_GPU();
  const unsigned seed = GENERATE(4u, 5u);
  const int asked = GENERATE(0, 1);  // the plan's choice (the split path), one block a segment
  CAPTURE(seed, asked);
  std::mt19937 rng(seed);
  const std::vector<i32> sizes{50000, 0, 40000, 30001, 17};  // average >= topk_long_segment
  std::vector<i32> kept;
  for (const i32 n : sizes) kept.push_back(std::uniform_int_distribution<i32>(0, n)(rng));
  const auto off = csr(sizes);
  const auto out_off = csr(kept);
  REQUIRE(off.back() / static_cast<i32>(sizes.size()) >= kc::detail::topk_long_segment);
  std::vector<float> scores(off.back());
  std::uniform_int_distribution<int> level(0, 999);  // 1000 levels: ties at every threshold
  for (auto& x : scores) x = static_cast<float>(level(rng));
  for (std::size_t i = 3; i < scores.size(); i += 101) {
    scores[i] = std::numeric_limits<float>::quiet_NaN();
  }
  const auto plan = kc::make_segmented_topk_plan(off.back(), sizes.size(), out_off.back(), asked);
  CHECK(plan.chunks == (asked == 1 ? 1 : 3));  // 5 segments averaging 24003 scores: 3 slices
  kc::device_buffer<std::byte> ws(plan.workspace_bytes);
  auto d_scores = upload(scores);
  auto d_off = upload(off);
  auto d_out_off = upload(out_off);
  kc::device_buffer<i32> d_out(std::max(out_off.back(), 1));
  kc::segmented_topk(kc::par{}, plan, ws.data(), ws.size(), d_scores.data(), d_off.data(),
                     d_out_off.data(), d_out.data());
  kc::check(cudaDeviceSynchronize(), "test");
  auto got = download(d_out);
  got.resize(static_cast<std::size_t>(out_off.back()));
  CHECK(got == topk_reference(scores, off, out_off));
}

namespace {

enum class view_kind { dense_nhd, dense_hnd, paged_nhd, paged_hnd };

// A small KV cache held both on the host (as float, for the references) and on the device in
// the layout under test.
template <class T>
struct test_cache {
  int requests, heads, d, capacity, page_size = 16;
  std::vector<i32> lens;
  std::vector<float> k, v;  // [r][h][t][c] reference values (already rounded to T)
  std::vector<kc::device_buffer<T>> storage;
  kc::device_buffer<i32> d_lens, d_indptr, d_indices, d_last;
  view_kind kind;

  float& at(std::vector<float>& x, int r, int h, int t, int c) {
    return x[((std::size_t(r) * heads + h) * capacity + t) * d + c];
  }

  test_cache(view_kind kind_, std::vector<i32> lens_, int heads_, int d_, std::mt19937& rng)
      : requests(static_cast<int>(lens_.size())), heads(heads_), d(d_),
        capacity(*std::max_element(lens_.begin(), lens_.end())), lens(std::move(lens_)),
        kind(kind_) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    k.resize(std::size_t(requests) * heads * capacity * d);
    v.resize(k.size());
    for (auto* x : {&k, &v}) {
      for (auto& e : *x) {
        e = kvsift::to_float(kvsift::from_float<T>(u(rng)));
      }
    }
    d_lens = upload(lens);
    if (kind == view_kind::dense_nhd || kind == view_kind::dense_hnd) {
      for (auto* x : {&k, &v}) {
        std::vector<T> h(x->size());
        for (int r = 0; r < requests; ++r) {
          for (int hh = 0; hh < heads; ++hh) {
            for (int t = 0; t < capacity; ++t) {
              for (int c = 0; c < d; ++c) {
                const std::size_t e =
                    kind == view_kind::dense_nhd
                        ? ((std::size_t(r) * capacity + t) * heads + hh) * d + c
                        : ((std::size_t(r) * heads + hh) * capacity + t) * d + c;
                h[e] = kvsift::from_float<T>(at(*x, r, hh, t, c));
              }
            }
          }
        }
        storage.push_back(upload(h));
      }
    } else {
      std::vector<i32> indptr{0}, last;
      int pages = 0;
      for (int r = 0; r < requests; ++r) {
        const int np = (lens[r] + page_size - 1) / page_size;
        pages += np;
        indptr.push_back(pages);
        last.push_back(lens[r] - (np - 1) * page_size);
      }
      std::vector<i32> phys(pages);
      std::iota(phys.begin(), phys.end(), 0);
      std::shuffle(phys.begin(), phys.end(), rng);  // physical order unrelated to logical
      for (auto* x : {&k, &v}) {
        std::vector<T> h(std::size_t(pages) * page_size * heads * d, kvsift::from_float<T>(9.0f));
        for (int r = 0; r < requests; ++r) {
          for (int hh = 0; hh < heads; ++hh) {
            for (int t = 0; t < lens[r]; ++t) {
              const std::size_t p = phys[indptr[r] + t / page_size];
              const std::size_t o = t % page_size;
              for (int c = 0; c < d; ++c) {
                const std::size_t e = kind == view_kind::paged_nhd
                                          ? ((p * page_size + o) * heads + hh) * d + c
                                          : ((p * heads + hh) * page_size + o) * d + c;
                h[e] = kvsift::from_float<T>(at(*x, r, hh, t, c));
              }
            }
          }
        }
        storage.push_back(upload(h));
      }
      d_indptr = upload(indptr);
      d_indices = upload(phys);
      d_last = upload(last);
    }
  }

  kc::dense_kv<T> dense() const {
    return kind == view_kind::dense_nhd
               ? kc::make_dense_nhd(storage[0].data(), storage[1].data(), d_lens.data(),
                                    capacity, heads, d)
               : kc::make_dense_hnd(storage[0].data(), storage[1].data(), d_lens.data(),
                                    capacity, heads, d);
  }
  kc::paged_kv<T> paged() const {
    return {storage[0].data(), storage[1].data(), d_indptr.data(), d_indices.data(),
            d_last.data(),     page_size,         heads,           d,
            kind == view_kind::paged_nhd ? kc::kv_layout::nhd : kc::kv_layout::hnd};
  }
  template <class F>
  void with_view(F&& f) const {
    if (kind == view_kind::dense_nhd || kind == view_kind::dense_hnd) {
      f(dense());
    } else {
      f(paged());
    }
  }
};

// Random ascending token subsets per segment (one segment left empty when allowed).
std::vector<std::vector<i32>> random_token_sets(const std::vector<i32>& lens, int heads,
                                                std::mt19937& rng, bool allow_empty) {
  std::vector<std::vector<i32>> sets;
  for (std::size_t r = 0; r < lens.size(); ++r) {
    for (int h = 0; h < heads; ++h) {
      std::vector<i32> s;
      for (i32 t = 0; t < lens[r]; ++t) {
        if (std::bernoulli_distribution(0.4)(rng) || t == lens[r] - 1) {
          s.push_back(t);
        }
      }
      if (allow_empty && r == 1 && h == 0) {
        s.clear();
      }
      sets.push_back(std::move(s));
    }
  }
  return sets;
}

std::pair<std::vector<i32>, std::vector<i32>> flatten(const std::vector<std::vector<i32>>& sets) {
  std::vector<i32> sizes, flat;
  for (const auto& s : sets) {
    sizes.push_back(static_cast<i32>(s.size()));
    flat.insert(flat.end(), s.begin(), s.end());
  }
  return {csr(sizes), flat};
}

const char* kind_name(view_kind k) {
  switch (k) {
    case view_kind::dense_nhd: return "dense_nhd";
    case view_kind::dense_hnd: return "dense_hnd";
    case view_kind::paged_nhd: return "paged_nhd";
    default: return "paged_hnd";
  }
}

}  // namespace

TEMPLATE_TEST_CASE("gather copies the selected rows of every layout", "[cuda][gather]", float,
                   kvsift::half, kvsift::bfloat16) {
  KVSIFT_REQUIRE_GPU();
  const auto kind = GENERATE(view_kind::dense_nhd, view_kind::dense_hnd, view_kind::paged_nhd,
                             view_kind::paged_hnd);
  const int d = GENERATE(64, 100);
  CAPTURE(kind_name(kind), d);
  std::mt19937 rng(7);
  const std::vector<i32> lens{37, 100, 1};
  const int heads = 3;
  test_cache<TestType> cache(kind, lens, heads, d, rng);
  const auto sets = random_token_sets(lens, heads, rng, true);
  const auto [off, flat] = flatten(sets);
  auto d_off = upload(off);
  auto d_idx = upload(flat);
  const i32 rows = off.back();
  kc::device_buffer<TestType> dk(std::size_t(rows) * d), dv(std::size_t(rows) * d);
  cache.with_view([&](const auto& view) {
    kc::gather(kc::par{}, view, kc::token_set{d_off.data(), d_idx.data()},
               static_cast<i32>(sets.size()), rows, dk.data(), dv.data());
  });
  kc::check(cudaDeviceSynchronize(), "test");
  const auto hk = download(dk);
  const auto hv = download(dv);
  for (std::size_t s = 0; s < sets.size(); ++s) {
    const int r = static_cast<int>(s) / heads;
    const int h = static_cast<int>(s) % heads;
    for (std::size_t j = 0; j < sets[s].size(); ++j) {
      for (int c = 0; c < d; ++c) {
        const std::size_t e = (off[s] + j) * d + c;
        REQUIRE(kvsift::to_float(hk[e]) == cache.at(cache.k, r, h, sets[s][j], c));
        REQUIRE(kvsift::to_float(hv[e]) == cache.at(cache.v, r, h, sets[s][j], c));
      }
    }
  }
}

TEMPLATE_TEST_CASE("sparse decode attention matches the CPU reference, its log-sum-exp too",
                   "[cuda][attention]",
                   float, kvsift::half, kvsift::bfloat16) {
  KVSIFT_REQUIRE_GPU();
  using T = TestType;
  const auto kind = GENERATE(view_kind::dense_nhd, view_kind::dense_hnd, view_kind::paged_nhd,
                             view_kind::paged_hnd);
  const int d = GENERATE(64, 128);
  const bool pages = GENERATE(false, true);
  const int group = GENERATE(1, 4, 6, 8);  // head tiles 1, 4, 2 and two tiles of 4
  // the single-kernel form, the split form with its max_entries hint exact or too small (a
  // segment past the hint is read whole by its last chunk), and the split form with its merge
  // kernel instead of the in-kernel merge
  const int form = GENERATE(0, 1, 2, 3);
  CAPTURE(kind_name(kind), d, pages, group, form);
  std::mt19937 rng(11);
  const std::vector<i32> lens{37, 200, 1, 64};
  const int heads = 2;
  const int q_heads = heads * group;
  const int requests = static_cast<int>(lens.size());
  test_cache<T> cache(kind, lens, heads, d, rng);

  // the token set each segment reads (pages expanded for the reference)
  std::vector<std::vector<i32>> tokens, page_lists;
  if (pages) {
    for (int r = 0; r < requests; ++r) {
      const int np = (lens[r] + cache.page_size - 1) / cache.page_size;
      for (int h = 0; h < heads; ++h) {
        std::vector<i32> pl, tl;
        for (int p = 0; p < np; ++p) {
          if (std::bernoulli_distribution(0.5)(rng) || p == np - 1) {
            pl.push_back(p);
            for (int t = p * cache.page_size; t < std::min((p + 1) * cache.page_size, lens[r]);
                 ++t) {
              tl.push_back(t);
            }
          }
        }
        page_lists.push_back(pl);
        tokens.push_back(tl);
      }
    }
  } else {
    tokens = random_token_sets(lens, heads, rng, true);
  }
  const auto [off, flat] = flatten(pages ? page_lists : tokens);
  auto d_off = upload(off);
  auto d_idx = upload(flat);

  std::vector<float> qf(std::size_t(requests) * q_heads * d);
  std::vector<T> qt(qf.size());
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (std::size_t i = 0; i < qf.size(); ++i) {
    qt[i] = kvsift::from_float<T>(u(rng));
    qf[i] = kvsift::to_float(qt[i]);
  }
  auto d_q = upload(qt);
  kc::device_buffer<T> d_out(qt.size());
  kc::device_buffer<float> d_lse(std::size_t(requests) * q_heads);  // the partial's lse
  const kc::sparse_attention_shape shape{requests, q_heads, 0.0f};
  i32 max_entries = 0;
  for (std::size_t s = 0; s + 1 < off.size(); ++s) {
    max_entries = std::max(max_entries, off[s + 1] - off[s]);
  }
  auto plan = kc::make_sparse_attention_plan(
      shape, heads, d, form == 2 ? max_entries / 3 : max_entries, pages ? cache.page_size : 1,
      /*target_blocks=*/4096, /*min_chunk_tokens=*/8);
  if (form != 0) {
    REQUIRE(plan.num_splits > 1);
  }
  plan.merge_in_kernel = form != 3;
  kc::device_buffer<std::byte> ws(std::max<std::size_t>(plan.workspace_bytes, 1));
  // garbage first: prepare must zero what the in-kernel merge counts with
  kc::check(cudaMemset(ws.data(), 0xff, ws.bytes()), "test");
  kc::prepare_sparse_attention_workspace(kc::par{}, plan, ws.data());
  const auto run = [&](const auto& view, const auto& set) {
    if (form == 0) {
      kc::sparse_decode_attention(kc::par{}, d_q.data(), view, set, shape, d_out.data(),
                                  d_lse.data());
    } else {
      kc::sparse_decode_attention(kc::par{}, plan, ws.data(), ws.size(), d_q.data(), view, set,
                                  shape, d_out.data(), d_lse.data());
    }
  };
  // twice with the same workspace, the output overwritten with NaN between: the second launch
  // must find the in-kernel merge's arrival counters back at zero
  for (int launch = 0; launch < 2; ++launch) {
    kc::check(cudaMemset(d_out.data(), 0xff, d_out.bytes()), "test");
    kc::check(cudaMemset(d_lse.data(), 0xff, d_lse.bytes()), "test");
    cache.with_view([&](const auto& view) {
      if (pages) {
        run(view, kc::page_set{d_off.data(), d_idx.data(), cache.page_size});
      } else {
        run(view, kc::token_set{d_off.data(), d_idx.data()});
      }
    });
  }
  kc::check(cudaDeviceSynchronize(), "test");
  const auto out = download(d_out);
  const auto lse = download(d_lse);

  const double tol = std::is_same_v<T, float> ? 1e-4 : (std::is_same_v<T, kvsift::half> ? 4e-3
                                                                                        : 2e-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int r = 0; r < requests; ++r) {
    for (int hq = 0; hq < q_heads; ++hq) {
      const int h = hq / group;
      const auto& set = tokens[r * heads + h];
      std::vector<double> logits;
      double mx = -std::numeric_limits<double>::infinity();
      for (i32 t : set) {
        double dot = 0;
        for (int c = 0; c < d; ++c) {
          dot += double(qf[(std::size_t(r) * q_heads + hq) * d + c]) * cache.at(cache.k, r, h, t, c);
        }
        logits.push_back(dot * scale);
        mx = std::max(mx, dot * scale);
      }
      double z = 0;
      for (double& x : logits) {
        x = std::exp(x - mx);
        z += x;
      }
      {  // the log-sum-exp of the scaled logits (-inf: an empty set), in float arithmetic
        const double want = set.empty() ? -std::numeric_limits<double>::infinity() : mx + std::log(z);
        const double got = lse[std::size_t(r) * q_heads + hq];
        CAPTURE(r, hq, want, got);
        if (set.empty()) {
          REQUIRE((std::isinf(got) && got < 0));
        } else {
          REQUIRE(std::abs(got - want) <= 2e-4 * (1.0 + std::abs(want)));
        }
      }
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (std::size_t j = 0; j < set.size(); ++j) {
          o += logits[j] * cache.at(cache.v, r, h, set[j], c);
        }
        o = set.empty() ? 0.0 : o / z;
        const double got = kvsift::to_float(out[(std::size_t(r) * q_heads + hq) * d + c]);
        CAPTURE(r, hq, c, o, got);
        REQUIRE(std::abs(got - o) <= tol * (1.0 + std::abs(o)));
      }
    }
  }
}

TEST_CASE("async_transfer round-trips through the device and reports completion",
          "[cuda][transfer]") {
  KVSIFT_REQUIRE_GPU();
  const std::size_t n = 1 << 20;
  kc::pinned_buffer<float> src(n), back(n);
  for (std::size_t i = 0; i < n; ++i) {
    src[i] = static_cast<float>(i) * 0.5f;
    back[i] = -1.0f;
  }
  kc::device_buffer<float> dev(n);
  kc::stream copy, compute;
  kc::async_transfer up, down;
  CHECK(up.poll());  // nothing submitted yet
  up.submit(kc::par{copy.get()}, dev.data(), src.data(), n);
  up.wait_on(kc::par{compute.get()});
  down.submit(kc::par{compute.get()}, back.data(), dev.data(), n);
  down.synchronize();
  CHECK(down.poll());
  CHECK(up.bytes_submitted() == n * sizeof(float));
  CHECK(std::equal(src.data(), src.data() + n, back.data()));
}

TEMPLATE_TEST_CASE("streamed_recall converts HND host pages into NHD device slots",
                   "[cuda][transfer][freekv]", float, kvsift::half, kvsift::bfloat16) {
  KVSIFT_REQUIRE_GPU();
  using T = TestType;
  const int chunk = GENERATE(1, 3, 64);
  const bool gather = GENERATE(false, true);  // streamed_recall, or the recall_gather kernel
  CAPTURE(chunk, gather);
  const kc::recall_shape shape{4, 3, 8, chunk};
  const int pages = 9, slots = 5;
  const std::size_t blk = 2 * shape.page_size * shape.head_dim;
  kc::pinned_buffer<T> pool(std::size_t(pages) * shape.num_kv_heads * blk);
  for (std::size_t i = 0; i < pool.size(); ++i) {
    pool[i] = kvsift::from_float<T>(static_cast<float>(i % 251));
  }
  std::vector<kc::recall_item> items;
  for (int h = 0; h < shape.num_kv_heads; ++h) {
    for (int s = 0; s < slots; ++s) {
      items.push_back({(s * 2 + h) % pages, h, s});
    }
  }
  const std::size_t slot_elems = std::size_t(shape.page_size) * shape.num_kv_heads * shape.head_dim;
  kc::device_buffer<T> k(slots * slot_elems), v(slots * slot_elems);
  kc::device_buffer<std::byte> ws(kc::streamed_recall<T>::workspace_bytes(shape));
  kc::stream compute, copy;
  kc::streamed_recall<T> recall(shape);
  // slots the list never names keep a sentinel: nothing but the items' rows is written
  const std::vector<T> sentinel(slots * slot_elems, kvsift::from_float<T>(-7.0f));
  kc::check(cudaMemcpy(k.data(), sentinel.data(), k.bytes(), cudaMemcpyHostToDevice), "test");
  kc::check(cudaMemcpy(v.data(), sentinel.data(), v.bytes(), cudaMemcpyHostToDevice), "test");
  const int unused_slot = slots - 1;
  std::erase_if(items, [&](const kc::recall_item& it) { return it.slot == unused_slot; });
  if (gather) {
    // plus items out of range, which the kernel skips
    auto listed = items;
    listed.push_back({pages, 0, 0});
    listed.push_back({0, shape.num_kv_heads, 0});
    listed.push_back({0, 0, -1});
    const auto d_items = upload(listed);
    kc::recall_gather<T>(kc::par{compute.get()}, shape, pool.data(), pages, d_items.data(),
                         static_cast<i32>(listed.size()), k.data(), v.data());
  } else {
    recall.run(kc::par{compute.get()}, copy.get(), pool.data(), items, k.data(), v.data(),
               ws.data(), ws.size());
  }
  compute.synchronize();
  const auto hk = download(k);
  const auto hv = download(v);
  for (const auto& it : items) {
    for (int t = 0; t < shape.page_size; ++t) {
      for (int c = 0; c < shape.head_dim; ++c) {
        const std::size_t src = (std::size_t(it.host_page) * shape.num_kv_heads + it.head) * blk;
        const std::size_t dst =
            ((std::size_t(it.slot) * shape.page_size + t) * shape.num_kv_heads + it.head) *
                shape.head_dim + c;
        REQUIRE(hk[dst] == pool[src + t * shape.head_dim + c]);
        REQUIRE(hv[dst] == pool[src + (shape.page_size + t) * shape.head_dim + c]);
      }
    }
  }
  for (int h = 0; h < shape.num_kv_heads; ++h) {
    for (int t = 0; t < shape.page_size; ++t) {
      for (int c = 0; c < shape.head_dim; ++c) {
        const std::size_t dst =
            ((std::size_t(unused_slot) * shape.page_size + t) * shape.num_kv_heads + h) *
                shape.head_dim + c;
        REQUIRE(hk[dst] == sentinel[dst]);
        REQUIRE(hv[dst] == sentinel[dst]);
      }
    }
  }
  CHECK(recall.bytes_recalled() == (gather ? 0 : items.size() * blk * sizeof(T)));
}
