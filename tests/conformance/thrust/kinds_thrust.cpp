// SPDX-License-Identifier: Apache-2.0
// The conformance kinds the Thrust backend (include/kvsift/thrust/) implements, registered for
// `--backend thrust`. Compiled only into kvsift-conformance-thrust-cpp / -omp (g++ with
// THRUST_DEVICE_SYSTEM = CPP or OMP); the same code compiled by nvcc runs on a GPU
// (kvsift-conformance-cuda, `--backend cuda`), the methods' kinds over exec::cuda.
//
// Thrust kinds (29: every kind but calibrate.*; kinds.cmake's KVSIFT_CONFORMANCE_THRUST_KINDS,
// `--list-kinds --backend thrust`), by file:
//   kinds_thrust.cpp           select.topk, score.snapkv, score.quest_pages, method.quest.select,
//                              score.lagkv, score.freekv_pages, method.freekv.select
//   kinds_thrust_baselines.cpp attention.decode, score.h2o_prefill
//   kinds_thrust_freekv.cpp    trigger.query_cosine
//   kinds_thrust_dynamickv.cpp budget.dynamickv
//   kinds_thrust_methods.cpp   method.snapkv.prefill, method.pyramidkv.prefill, method.h2o.prefill,
//                              method.streaming_llm.prefill, method.streaming_llm.decode,
//                              method.h2o.decode, method.quest.decode, method.lagkv.prefill,
//                              method.lagkv.decode, method.dynamickv.prefill,
//                              method.synckv.decode, method.freekv.decode,
//                              method.heterocache.prefill, method.heterocache.decode
//   kinds_thrust_host.cpp      budget.fraction, budget.pyramidkv, budget.synckv,
//                              budget.heterocache: host arithmetic on every backend (budgets are
//                              shapes, computed on the host), the CPU handlers' own bodies
//                              (../kinds_host.hpp)
// helpers.hpp holds what the files share (copies, layouts, device_topk, gather_kept).
//
// Two kinds of handler:
//   methods            (method.snapkv / pyramidkv / h2o / streaming_llm / quest / lagkv /
//                      dynamickv / synckv / freekv / heterocache kinds) the CPU backend's
//                      handler bodies (../method_kinds.hpp, ../two_tier_kinds.hpp) instantiated
//                      on the device backend (device_backend.hpp): the library's
//                      method<thrust::dense_store<float, E> (thrust::tiered_store), Recipe, E> on
//                      exec::sim_cpp / sim_omp / cuda behind device::staged_method. The component
//                      parts of two method kinds (method.quest.select's per_query_head form,
//                      method.heterocache.prefill's scores) are composed here.
//   components         (everything else) composed by hand: each handler copies the case's
//                      inputs into thrust::device_vector, calls kvsift::thrust functions with
//                      the `thrust::device` policy on raw device pointers, copies the results
//                      back and puts them as outputs. No such handler calls a CPU scorer or
//                      selector: the only library code run on the host is parameter arithmetic
//                      (select::page_topk::pages_for, score::freekv_pages::layout, the
//                      selectors' parameter checks) and host budgeters (budget::dynamic_layer,
//                      and the budget.* kinds above); a budget too small for the protected
//                      tokens is rejected by thrust::segmented_topk itself.
// The runner compares every output exactly as it compares the CPU handlers' (SPEC §4).

#include "device_backend.hpp"
#include "helpers.hpp"

#include <kvsift/core/error.hpp>
#include <kvsift/score/freekv_pages.hpp>
#include <kvsift/score/lag.hpp>
#include <kvsift/select/freekv_pages.hpp>
#include <kvsift/select/page_topk.hpp>
#include <kvsift/thrust/all.hpp>
#include <kvsift/thrust/freekv_pages.hpp>

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#ifndef KVSIFT_THRUST_SYSTEM_NAME
#error "define KVSIFT_THRUST_SYSTEM_NAME (cpp, omp, cuda) for the runner's backend description"
#endif

namespace {
using namespace kvsift::conformance::thrust_kinds;  // kc, kt, dvec, device_topk, gather_kept, ...

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
// The CUDA system needs a device: without one the runner says so and exits 4 (skipped).
std::string no_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return "no CUDA device (cudaGetDeviceCount failed or returned 0)";
  }
  return {};
}
#else
std::string no_device() { return {}; }
#endif

const kc::backend_available thrust_backend{
    handlers_backend,
    "thrust (THRUST_DEVICE_SYSTEM " KVSIFT_THRUST_SYSTEM_NAME ", policy thrust::device)",
    no_device};

// ---- select.topk -----------------------------------------------------------------------------

const kc::registrar select_topk{
    handlers_backend, "select.topk", [](const kc::case_data& c, kc::outputs& out) {
      const auto& sc = c.in("scores");
      const int rows = dim(sc, 0), n = dim(sc, 1);
      const int sink = param(c, "sink");
      const std::vector<i32> budgets(static_cast<std::size_t>(rows), param(c, "budget"));
      const std::vector<i32> window(static_cast<std::size_t>(rows), param(c, "window"));
      const auto kept = device_topk(to_device(sc.f32), to_device(uniform_offsets(rows, n)), rows,
                                    budgets, sink, window);
      put_dense(out, "kept", to_host(kept.offsets), to_host(kept.values));
    }};

// ---- SnapKV: window_attention_scores (window_scores in helpers.hpp) ----------------------------

const kc::registrar score_snapkv{
    handlers_backend, "score.snapkv", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("queries");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), w = dim(q, 1), d = dim(q, 2), h = dim(k, 0), n = dim(k, 1);
      const int G = hq / h;
      const auto qs = swap_outer(q.f32.data(), hq, w, d);
      const auto s = to_host(window_scores(k.f32, qs, 1, h, G, n, w, d,
                                           window_params(c, param(c, "kernel"))));
      out.put_f32("scores", {h, n - w}, slice_rows(s, h, n, 0, n - w));
      // window_mean: the same scores unpooled (kernel 1), per query head: query head x gets its
      // own copy of KV head x / G (group 1).
      const auto kq = repeat_blocks(k.f32, static_cast<std::size_t>(n) * d, G);
      const auto m = to_host(window_scores(kq, qs, 1, hq, 1, n, w, d, window_params(c, 1)));
      out.put_f32("window_mean", {hq, n - w}, slice_rows(m, hq, n, 0, n - w));
    }};

// ---- Quest: page_digest, page_scores -------------------------------------------------------------

struct digests {
  int pages_per_head = 0;
  dvec<i32> page_offsets;
  dvec<float> kmin, kmax;
};

digests digest(const dvec<float>& keys, int h, int n, int d, int page_size) {
  const auto exec = ::thrust::device;
  const dvec<i32> offsets = to_device(uniform_offsets(h, n));
  digests r;
  r.pages_per_head = (n + page_size - 1) / page_size;
  r.page_offsets.resize(static_cast<std::size_t>(h) + 1);
  kt::page_offsets(exec, raw(offsets), h, page_size, raw(r.page_offsets));
  const std::int64_t pages = r.page_offsets.back();
  if (pages != static_cast<std::int64_t>(h) * r.pages_per_head) {
    throw kc::runner_error("thrust::page_offsets: " + std::to_string(pages) + " pages");
  }
  r.kmin.resize(static_cast<std::size_t>(pages) * d);
  r.kmax.resize(r.kmin.size());
  const kt::segmented_rows<float> rows{raw(keys), raw(offsets), nullptr, 0, h, d};
  kt::page_digest(exec, rows, raw(r.page_offsets), pages, page_size, raw(r.kmin), raw(r.kmax));
  return r;
}

// Quest bounds [H, P] (group G reduced with `gqa`), or per query head [Hq, P] (`per_query_head`:
// every query head scores the digests of its KV head, i.e. group 1 over repeated digests).
dvec<float> quest_scores(const digests& dg, const dvec<float>& query, int h, int G, int d,
                         kvsift::gqa_reduce gqa, bool per_query_head) {
  const auto exec = ::thrust::device;
  const int P = dg.pages_per_head;
  if (!per_query_head) {
    dvec<float> out(static_cast<std::size_t>(h) * P);
    kt::page_scores(exec, raw(query), h, G, d, raw(dg.kmin), raw(dg.kmax), raw(dg.page_offsets), h,
                    static_cast<std::int64_t>(h) * P, gqa, raw(out));
    return out;
  }
  const int hq = h * G;
  const std::size_t block = static_cast<std::size_t>(P) * d;
  dvec<float> kmin(static_cast<std::size_t>(hq) * block), kmax(kmin.size());
  for (int x = 0; x < hq; ++x) {  // device-to-device copies of KV head x / G's digests
    const auto from = static_cast<std::ptrdiff_t>((x / G) * block);
    const auto to = static_cast<std::ptrdiff_t>(x * block);
    ::thrust::copy_n(exec, dg.kmin.begin() + from, block, kmin.begin() + to);
    ::thrust::copy_n(exec, dg.kmax.begin() + from, block, kmax.begin() + to);
  }
  const dvec<i32> poff = to_device(uniform_offsets(hq, P));
  dvec<float> out(static_cast<std::size_t>(hq) * P);
  kt::page_scores(exec, raw(query), hq, 1, d, raw(kmin), raw(kmax), raw(poff), hq,
                  static_cast<std::int64_t>(hq) * P, kvsift::gqa_reduce::max, raw(out));
  return out;
}

const kc::registrar score_quest_pages{
    handlers_backend, "score.quest_pages", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("query");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int G = hq / h;
      const dvec<float> keys = to_device(k.f32);
      const dvec<float> query = to_device(q.f32);  // [Hq, 1, d] = [requests 1, Hq, d]
      const auto dg = digest(keys, h, n, d, param(c, "page_size"));
      const int P = dg.pages_per_head;
      out.put_f32("page_min", {h, P, d}, to_host(dg.kmin));
      out.put_f32("page_max", {h, P, d}, to_host(dg.kmax));
      out.put_f32("page_scores", {hq, P},
                  to_host(quest_scores(dg, query, h, G, d, kvsift::gqa_reduce::max, true)));
      out.put_f32("page_scores_kv", {h, P},
                  to_host(quest_scores(dg, query, h, G, d, kvsift::gqa_reduce::max, false)));
    }};

// method.quest.select, gqa "per_query_head": Quest's per-query-head option, one page set per
// query head (page_scores per query head, then the top pages); the gqa "max" form is the method,
// method_kinds::quest_select on the device backend.
void quest_per_query_head(const kc::case_data& c, kc::outputs& out) {
  const auto& q = c.in("query");
  const auto& k = c.in("keys");
  const int hq = dim(q, 0), h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
  const int ps = param(c, "page_size");
  const dvec<float> keys = to_device(k.f32);
  const dvec<float> query = to_device(q.f32);
  const auto dg = digest(keys, h, n, d, ps);
  const int P = dg.pages_per_head;
  const auto scores = quest_scores(dg, query, h, hq / h, d, kvsift::gqa_reduce::max, true);
  // Quest's budget in pages (select::page_topk, min 3 pages); a dense layer takes every page.
  const kvsift::select::page_topk sel{{.page_size = ps, .min_pages = 3}};
  sel.validate("method.quest.select");
  const int pages = param(c, "layer") < param(c, "dense_layers") ? P
                                                                 : sel.pages_for(param(c, "budget"));
  // the current (last) page is always taken: protected as a one-page window
  const auto kept = device_topk(scores, to_device(uniform_offsets(hq, P)), hq,
                                std::vector<i32>(hq, pages), 0, std::vector<i32>(hq, 1));
  put_dense(out, "pages", to_host(kept.offsets), to_host(kept.values));
}

const kc::registrar method_quest_select{
    handlers_backend, "method.quest.select", [](const kc::case_data& c, kc::outputs& out) {
      kvsift::conformance::method_kinds::quest_select<kvsift::conformance::method_kinds::device>(
          c, out, quest_per_query_head);
    }};

// ---- LagKV: lag_scores ---------------------------------------------------------------------------

const kc::registrar score_lagkv{
    handlers_backend, "score.lagkv", [](const kc::case_data& c, kc::outputs& out) {
      const auto& keys = c.in("keys");
      const auto& values = c.in("values");
      const int H = dim(keys, 0), n = dim(keys, 1), d = dim(keys, 2);
      const int lag = param(c, "lag");
      const int base = std::min(param(c, "base"), n);
      const kt::lag_params p{.lag = lag,
                             .value_weight = c.param_d("value_weight"),
                             .variant = lag_variant_of(c)};
      const auto exec = ::thrust::device;
      const dvec<float> k = to_device(keys.f32), v = to_device(values.f32);
      const dvec<i32> offsets = to_device(uniform_offsets(H, n));
      const dvec<i32> b = to_device(std::vector<i32>(static_cast<std::size_t>(H), base));
      const std::int64_t N = static_cast<std::int64_t>(H) * n;
      const int P = lag > 0 && n > base ? (n - base) / lag : 0;
      const int m = P >= 2 ? (P - 1) * lag : 0;
      // scores of keys `a` and values `b` with value weight `vw`
      const auto run = [&](const dvec<float>& a, const dvec<float>& bb, double vw) {
        kt::lag_params pp = p;
        pp.value_weight = vw;
        const kt::segmented_rows<float> ra{raw(a), raw(offsets), nullptr, 0, H, d};
        const kt::segmented_rows<float> rb{raw(bb), raw(offsets), nullptr, 0, H, d};
        dvec<float> o(static_cast<std::size_t>(N));
        dvec<unsigned char> ws(kt::lag_workspace_bytes(N, H, d, lag));
        kt::lag_scores(exec, ra, rb, raw(b), N, pp, raw(o), raw(ws), ws.size());
        return slice_rows(to_host(o), H, n, base, m);
      };
      out.put_f32("scores", {H, m}, run(k, v, p.value_weight));
      if (p.variant != kt::lag_variant::knorm) {
        // Each side alone: weight 0 leaves s_K (+ 0 * s_V); swapping keys and values gives s_V.
        out.put_f32("score_k", {H, m}, run(k, v, 0.0));
        out.put_f32("score_v", {H, m}, run(v, k, 0.0));
      }
    }};

// ---- FreeKV: freekv_group_scores -----------------------------------------------------------------

kvsift::score::freekv_pages freekv_scorer(const kc::case_data& c) {
  return kvsift::score::freekv_pages{{.page_size = param(c, "page_size"),
                                      .sink = param(c, "sink"),
                                      .window = param(c, "window"),
                                      .merge = kvsift::score::parse_freekv_merge(c.param_s("merge"))}};
}

dvec<float> freekv_scores(const kc::case_data& c, const digests& dg, const dvec<float>& query,
                          int h, int G, int d) {
  const auto sc = freekv_scorer(c);
  const std::int64_t pages = static_cast<std::int64_t>(h) * dg.pages_per_head;
  dvec<float> out(static_cast<std::size_t>(pages));
  dvec<unsigned char> ws(kt::freekv_workspace_bytes(h, G));
  kt::freekv_group_scores(::thrust::device, raw(query), h, G, d, raw(dg.kmin), raw(dg.kmax),
                          raw(dg.page_offsets), h, pages, sc.p.page_size, sc.p.sink, sc.p.window,
                          sc.p.merge, raw(out), raw(ws), ws.size());
  return out;
}

const kc::registrar score_freekv_pages{
    handlers_backend, "score.freekv_pages", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("query");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const auto sc = freekv_scorer(c);
      sc.validate("score.freekv_pages");
      const auto lay = sc.layout(n);
      const dvec<float> keys = to_device(k.f32);
      const dvec<float> query = to_device(q.f32);
      const auto dg = digest(keys, h, n, d, sc.p.page_size);
      const int P = dg.pages_per_head;
      if (P != lay.pages) throw kc::runner_error("page count differs from the layout's");
      std::vector<i32> cand;
      for (int pg = lay.candidates_first; pg < lay.candidates_last; ++pg) cand.push_back(pg);
      out.put_i32("candidates", {lay.candidates()}, cand);
      out.put_f32("page_scores", {hq, P},
                  to_host(quest_scores(dg, query, h, hq / h, d, kvsift::gqa_reduce::max, true)));
      const auto group = to_host(freekv_scores(c, dg, query, h, hq / h, d));
      out.put_f32("group_scores", {h, lay.candidates()},
                  slice_rows(group, h, P, lay.candidates_first, lay.candidates()));
    }};

const kc::registrar method_freekv_select{
    handlers_backend, "method.freekv.select", [](const kc::case_data& c, kc::outputs& out) {
      const auto& q = c.in("query");
      const auto& k = c.in("keys");
      const int hq = dim(q, 0), h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int ps = param(c, "page_size"), B = param(c, "budget");
      const kvsift::select::freekv_pages sel{
          {.page_size = ps, .sink = param(c, "sink"), .window = param(c, "window")}};
      sel.validate("method.freekv.select");
      sel.validate_budget("method.freekv.select", "budget", B);
      const dvec<float> keys = to_device(k.f32);
      const dvec<float> query = to_device(q.f32);
      const auto dg = digest(keys, h, n, d, ps);
      const int P = dg.pages_per_head;
      const bool dense = param(c, "layer") < param(c, "dense_layers");
      const int pages = dense ? P : B / ps;
      if (!dense && P > pages) {
        kvsift::require(sel.selectable(B) >= 0, "method.freekv.select", "budget", B,
                        ">= sink + window (" + std::to_string(sel.p.sink + sel.p.window) +
                            " tokens)");
      }
      const auto scores = freekv_scores(c, dg, query, h, hq / h, d);
      // sink and window pages protected, the top candidates by group score between them
      const auto kept = device_topk(scores, to_device(uniform_offsets(h, P)), h,
                                    std::vector<i32>(h, pages), sel.p.sink / ps,
                                    std::vector<i32>(h, sel.p.window / ps));
      put_dense(out, "pages", to_host(kept.offsets), to_host(kept.values));
    }};

}  // namespace
