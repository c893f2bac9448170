// SPDX-License-Identifier: Apache-2.0
// Thrust handlers of the baselines' decode kinds: method.streaming_llm.decode, method.h2o.decode,
// method.quest.decode, method.lagkv.decode (the CPU handlers: ../kinds_baselines.cpp run_decode,
// ../kinds_lagkv.cpp). Each is the method's lifecycle over a device store, a dense
// [kv_heads, capacity, d] array of keys and values plus [kv_heads, capacity] positions whose
// lengths the host keeps (shapes on the host, contents on the device):
//
//   prompt   the method's prefill round on the device (scorer -> budget -> segmented top-k ->
//            gather_rows into the store), as kinds_thrust*.cpp compose the prefill kinds
//   step t   append_rows (the token's K, V, position) -> the plan (every slot, or Quest's
//            pages) -> attention_over -> the step's decisions:
//              StreamingLLM  recency of the packed positions -> segmented_evict_one (sink
//                            protected) -> compact_rows: the oldest non-sink token leaves
//              H2O           cumulative_attention_observe (the step's weights into the running
//                            scores, a per-slot side column) -> segmented_evict_one over the
//                            packed running scores (recent half protected) -> compact_rows of
//                            K, V, positions and the running scores
//              Quest         page_digest_tail (the page the token landed in) -> page_scores ->
//                            top-k of pages (the current page protected) -> expand_page_slots
//                            (before the attention: the plan)
//              LagKV         when len - base reaches 2L: lag_scores -> top-k (the frozen prefix
//                            and the last partition protected) -> compact_rows
//
// Inside a step only what the case outputs is copied back (plan positions, out, evicted, pages:
// the step's top-k take their counts from the host, step_topk / evict_one); every count
// (lengths, kept, pages, slots, whether a round runs) is host arithmetic on lengths and budgets,
// as the CPU methods compute it (select::topk::window_for, select::page_topk::pages_for,
// select::partition_topk::keep_per_partition, trigger::length's condition). No CPU scorer,
// selector or method runs.

#include "helpers.hpp"

#include <kvsift/score/lag.hpp>
#include <kvsift/select/page_topk.hpp>
#include <kvsift/select/partition_topk.hpp>
#include <kvsift/select/topk.hpp>
#include <kvsift/thrust/all.hpp>

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace {
using namespace kvsift::conformance::thrust_kinds;  // kc, kt, dvec, device_topk, ...

// ---- the device store ---------------------------------------------------------------------------

struct device_store {
  int heads = 0, capacity = 0, dim = 0;
  int length = 0;                 // every head holds the same count (host-side shape)
  dvec<float> keys, values;       // [heads, capacity, dim]
  dvec<i32> positions;            // [heads, capacity]
  dvec<i32> offsets;              // [heads + 1] CSR of `length` per head

  device_store(int h, int cap, int d)
      : heads(h), capacity(cap), dim(d),
        keys(static_cast<std::size_t>(h) * cap * d, 0.0f),
        values(keys.size(), 0.0f),
        positions(static_cast<std::size_t>(h) * cap, -1) {
    set_length(0);
  }
  void set_length(int n) {
    length = n;
    offsets = to_device(uniform_offsets(heads, n));
  }
  [[nodiscard]] std::int64_t items() const { return static_cast<std::int64_t>(heads) * length; }
  [[nodiscard]] kt::segmented_rows<float> key_rows() const {
    return {raw(keys), raw(offsets), raw(positions),
            static_cast<std::int64_t>(capacity) * dim, heads, dim};
  }
  [[nodiscard]] kt::segmented_rows<float> value_rows() const {
    return {raw(values), raw(offsets), raw(positions),
            static_cast<std::int64_t>(capacity) * dim, heads, dim};
  }
  // A per-slot side column [heads, capacity] (running scores) with the store's addressing.
  [[nodiscard]] kt::segmented_rows<float> column(const dvec<float>& col) const {
    return {raw(col), raw(offsets), raw(positions), capacity, heads, 1};
  }

  // The prompt's kept rows (CSR of local indices into packed [heads, n, dim] keys / values at
  // positions 0..n-1) installed as the store's contents; `side` gathers a packed [heads * n]
  // column along (H2O's prefill scores -> running scores).
  void install(const dvec<float>& k, const dvec<float>& v, int n, const device_sets& kept,
               int kept_per_head, const dvec<float>* side = nullptr, dvec<float>* column = nullptr) {
    const auto exec = ::thrust::device;
    const dvec<i32> off = to_device(uniform_offsets(heads, n));
    const kt::segmented_rows<float> sk{raw(k), raw(off), nullptr, 0, heads, dim};
    const kt::segmented_rows<float> sv{raw(v), raw(off), nullptr, 0, heads, dim};
    kt::gather_rows(exec, sk, raw(kept.offsets), raw(kept.values), kept.total, raw(keys), capacity,
                    raw(positions));
    kt::gather_rows(exec, sv, raw(kept.offsets), raw(kept.values), kept.total, raw(values),
                    capacity);
    if (side != nullptr) {
      const kt::segmented_rows<float> ss{raw(*side), raw(off), nullptr, 0, heads, 1};
      kt::gather_rows(exec, ss, raw(kept.offsets), raw(kept.values), kept.total, raw(*column),
                      capacity);
    }
    set_length(kept_per_head);
  }

  // Step t's token: row h of key / value [heads, dim] at position `pos` in every head.
  void append(const float* key, const float* value, i32 pos) {
    const auto exec = ::thrust::device;
    const dvec<float> k(key, key + static_cast<std::size_t>(heads) * dim);
    const dvec<float> v(value, value + static_cast<std::size_t>(heads) * dim);
    const dvec<i32> p(static_cast<std::size_t>(heads), pos);
    kt::append_rows(exec, raw(keys), raw(positions), heads, capacity, dim, raw(offsets), raw(k),
                    raw(p));
    kt::append_rows(exec, raw(values), static_cast<i32*>(nullptr), heads, capacity, dim,
                    raw(offsets), raw(v), static_cast<const i32*>(nullptr));
    set_length(length + 1);
  }

  // The positions of every resident slot, packed [heads * length] (a plan reading everything).
  [[nodiscard]] dvec<i32> packed_positions() const {
    dvec<i32> out(static_cast<std::size_t>(items()));
    kt::pack_rows(::thrust::device, key_rows(), items(), static_cast<float*>(nullptr), raw(out));
    return out;
  }

  // Keeps `kept` (local slots, ascending, kept_per_head per head): K, V, positions, and the side
  // column when given, compacted in place.
  void retain(const device_sets& kept, int kept_per_head, dvec<float>* column = nullptr) {
    const auto exec = ::thrust::device;
    dvec<unsigned char> ws(kt::compact_workspace_bytes<float>(kept.total, dim, true));
    kt::compact_rows(exec, raw(keys), raw(positions), heads, capacity, dim, raw(kept.offsets),
                     raw(kept.values), kept.total, raw(ws), ws.size());
    kt::compact_rows(exec, raw(values), static_cast<i32*>(nullptr), heads, capacity, dim,
                     raw(kept.offsets), raw(kept.values), kept.total, raw(ws), ws.size());
    if (column != nullptr) {
      kt::compact_rows(exec, raw(*column), static_cast<i32*>(nullptr), heads, capacity, 1,
                       raw(kept.offsets), raw(kept.values), kept.total, raw(ws), ws.size());
    }
    set_length(kept_per_head);
  }

  // Attention of one decode query [q_heads, d] at position `pos` over every slot (plan null) or
  // a plan (CSR of slots, `candidates` in all); out [q_heads, d]; weights [G * items] optional.
  void attend(const dvec<float>& query, i32 pos, int group, const kt::attention_plan& plan,
              std::int64_t candidates, float* out, float* weights) const {
    const dvec<i32> first(1, pos);
    const kt::window_queries wq{raw(query), raw(first), 1, heads, group};
    dvec<unsigned char> ws(kt::attention_workspace_bytes(candidates, group, 1));
    kt::attention_over(::thrust::device, key_rows(), value_rows(), wq, plan, items(), candidates,
                       out, weights, raw(ws), ws.size());
  }
};

// The CSR of a step's plan as host output: kept_per_head positions per head.
void append_plan(const std::vector<i32>& pos, int heads, std::vector<i32>& plan,
                 std::vector<i32>& offsets) {
  const std::size_t per = heads > 0 ? pos.size() / static_cast<std::size_t>(heads) : 0;
  for (int h = 0; h < heads; ++h) {
    plan.insert(plan.end(), pos.begin() + static_cast<std::ptrdiff_t>(h * per),
                pos.begin() + static_cast<std::ptrdiff_t>((h + 1) * per));
    offsets.push_back(static_cast<i32>(plan.size()));
  }
}

// A decode round of a store one token over its budget B (every decode round after the prompt's:
// the prompt's round leaves min(B, n), each step adds one): segmented_evict_one drops the worst
// unprotected token of each head (what a top-k of B keeps, without the sort). `victims` [heads]
// receives the dropped local slots.
device_sets evict_one(const dvec<float>& scores, const device_store& st, int B, int sink,
                      const dvec<i32>& window, dvec<i32>& victims) {
  if (st.length != B + 1) {
    throw kc::runner_error("a decode round at length " + std::to_string(st.length) +
                           " (budget " + std::to_string(B) + ")");
  }
  device_sets kept{to_device(uniform_offsets(st.heads, B)), {}, static_cast<std::int64_t>(st.heads) * B};
  kept.values.resize(static_cast<std::size_t>(kept.total));
  victims.resize(static_cast<std::size_t>(st.heads));
  kt::segmented_evict_one(::thrust::device, raw(scores), raw(st.offsets), st.heads,
                          raw(kept.offsets), kept.total, raw(kept.values), raw(victims),
                          kt::topk_protection{sink, raw(window)});
  return kept;
}

// A step's top-k whose counts are host arithmetic: k per segment (<= every n_s), the first
// `sink` and the last window[s] protected. Unlike device_topk (helpers.hpp), nothing is read back:
// the kept offsets come from the host and segmented_topk's check (a reduction read by the host)
// is off, as in a captured decode step.
device_sets step_topk(const dvec<float>& scores, const dvec<i32>& offsets, int segments, int k,
                      int sink, const std::vector<i32>& window) {
  device_sets r{to_device(uniform_offsets(segments, k)), {},
                static_cast<std::int64_t>(segments) * k};
  r.values.resize(static_cast<std::size_t>(r.total));
  const dvec<i32> w = to_device(window);
  const auto n = static_cast<std::int64_t>(scores.size());
  dvec<unsigned char> ws(kt::segmented_topk_workspace_bytes(n));
  kt::segmented_topk(::thrust::device, raw(scores), raw(offsets), segments, n, raw(r.offsets),
                     r.total, raw(r.values), raw(ws), ws.size(), kt::topk_protection{sink, raw(w)},
                     /*check=*/false);
  return r;
}

// The original position of each head's dropped slot (-1: none): the case's `evicted`, read from
// the store's positions before the compaction.
struct victim_position_fn {
  const i32* victims;
  const i32* positions;  // [S, capacity]
  std::int64_t capacity;
  i32* out;
  KVSIFT_HOST_DEVICE void operator()(int s) const {
    out[s] = victims[s] < 0 ? -1 : positions[s * capacity + victims[s]];
  }
};

// Step inputs: [T, heads, d] slices.
const float* step_row(const kc::tensor& t, int step) {
  return t.f32.data() + static_cast<std::size_t>(step) * dim(t, 1) * dim(t, 2);
}

// ---- StreamingLLM ---------------------------------------------------------------------------------

const kc::registrar method_streaming_llm_decode{
    handlers_backend, "method.streaming_llm.decode",
    [](const kc::case_data& c, kc::outputs& out) {
      const auto& k = c.in("keys");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int T = dim(sq, 0), hq = dim(sq, 1);
      const int B = param(c, "budget"), S = param(c, "sink");
      const kvsift::select::topk sel{{.sink = S}};
      sel.validate("method.streaming_llm.decode");
      const auto exec = ::thrust::device;
      device_store st(h, n + T, d);
      const std::vector<i32> budgets(static_cast<std::size_t>(h), B);
      const std::vector<i32> no_window(static_cast<std::size_t>(h), 0);
      // prompt: recency scores (position j), sink + newest B - S
      {
        const dvec<i32> off = to_device(uniform_offsets(h, n));
        dvec<float> scores(static_cast<std::size_t>(h) * n);
        kt::recency_scores(exec, raw(off), nullptr, h, static_cast<std::int64_t>(h) * n,
                           raw(scores));
        const auto kept = device_topk(scores, off, h, budgets, S, no_window);
        st.install(to_device(k.f32), to_device(c.in("values").f32), n, kept, std::min(B, n));
      }
      std::vector<i32> plan, plan_offsets{0};
      dvec<float> o(static_cast<std::size_t>(T) * hq * d);
      for (int t = 0; t < T; ++t) {
        const i32 pos = n + t;
        st.append(step_row(sk, t), step_row(sv, t), pos);
        append_plan(to_host(st.packed_positions()), h, plan, plan_offsets);
        const dvec<float> q(step_row(sq, t), step_row(sq, t) + static_cast<std::size_t>(hq) * d);
        st.attend(q, pos, hq / h, {}, st.items(), raw(o) + static_cast<std::size_t>(t) * hq * d,
                  nullptr);
        if (st.length > B) {  // the round: recency of the resident positions, sink protected
          const dvec<i32> packed = st.packed_positions();
          dvec<float> scores(packed.size());
          kt::recency_scores(exec, raw(st.offsets), raw(packed), h, st.items(), raw(scores));
          dvec<i32> victims;
          const auto kept = evict_one(scores, st, B, S, to_device(no_window), victims);
          st.retain(kept, B);
        }
      }
      out.put_i32("plan", {static_cast<std::int64_t>(plan.size())}, plan);
      out.put_i32("plan_offsets", {static_cast<std::int64_t>(plan_offsets.size())}, plan_offsets);
      out.put_f32("out", {T, hq, d}, to_host(o));
    }};

// ---- H2O ------------------------------------------------------------------------------------------

const kc::registrar method_h2o_decode{
    handlers_backend, "method.h2o.decode", [](const kc::case_data& c, kc::outputs& out) {
      const auto& k = c.in("keys");
      const auto& q = c.in("queries");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int T = dim(sq, 0), hq = dim(sq, 1), G = hq / h, nq = dim(q, 1);
      const int B = param(c, "budget");
      const auto gqa = kvsift::parse_gqa_reduce(c.param_s("gqa"));
      // H2O's recent half: window floor(B / 2) (h2o_params: window_share 0.5), no sink
      const kvsift::select::topk sel{{.window_share = 0.5}};
      sel.validate("method.h2o.decode");
      const auto exec = ::thrust::device;
      device_store st(h, n + T, d);
      dvec<float> running(static_cast<std::size_t>(h) * (n + T), 0.0f);  // side column
      const std::vector<i32> budgets(static_cast<std::size_t>(h), B);
      const std::vector<i32> window(static_cast<std::size_t>(h), sel.window_for(B));
      const dvec<i32> window_d = to_device(window);
      // prompt: cumulative attention of every prompt query, the round, the running scores kept
      {
        const dvec<float> kd = to_device(k.f32);
        const dvec<float> qd = to_device(swap_outer(q.f32.data(), hq, nq, d));  // [nq, Hq, d]
        const dvec<i32> off = to_device(uniform_offsets(h, n));
        const dvec<i32> first = to_device(std::vector<i32>{n - nq});
        const kt::segmented_rows<float> keys{raw(kd), raw(off), nullptr, 0, h, d};
        const kt::window_queries wq{raw(qd), raw(first), nq, h, G};
        const std::int64_t N = static_cast<std::int64_t>(h) * n;
        dvec<float> scores(static_cast<std::size_t>(N));
        dvec<unsigned char> ws(kt::cumulative_attention_workspace_bytes(N, h, G, nq));
        kt::cumulative_attention_scores(exec, keys, wq, N, gqa, raw(scores), raw(ws), ws.size());
        const auto kept = device_topk(scores, off, h, budgets, 0, window);
        st.install(kd, to_device(c.in("values").f32), n, kept, std::min(B, n), &scores, &running);
      }
      std::vector<i32> plan, plan_offsets{0}, evicted;
      dvec<float> o(static_cast<std::size_t>(T) * hq * d);
      for (int t = 0; t < T; ++t) {
        const i32 pos = n + t;
        const int seen = st.length;  // slots with a running score; the new one starts at 0
        st.append(step_row(sk, t), step_row(sv, t), pos);
        append_plan(to_host(st.packed_positions()), h, plan, plan_offsets);
        const dvec<float> qt(step_row(sq, t), step_row(sq, t) + static_cast<std::size_t>(hq) * d);
        dvec<float> weights(static_cast<std::size_t>(st.items()) * G);
        st.attend(qt, pos, G, {}, st.items(), raw(o) + static_cast<std::size_t>(t) * hq * d,
                  raw(weights));
        const dvec<i32> seen_d(static_cast<std::size_t>(h), seen);
        kt::cumulative_attention_observe(exec, raw(weights), raw(st.offsets), h, st.items(), G, gqa,
                                         raw(seen_d), raw(running), st.capacity);
        if (st.length <= B) {
          evicted.insert(evicted.end(), static_cast<std::size_t>(h), -1);
          continue;
        }
        // the round: top-k of the running scores, the recent half protected; one token leaves
        dvec<float> scores(static_cast<std::size_t>(st.items()));
        kt::pack_rows(exec, st.column(running), st.items(), raw(scores),
                      static_cast<i32*>(nullptr));
        dvec<i32> victims;
        const auto kept = evict_one(scores, st, B, 0, window_d, victims);
        dvec<i32> gone(static_cast<std::size_t>(h));
        ::thrust::for_each_n(exec, ::thrust::counting_iterator<int>(0), h,
                             victim_position_fn{raw(victims), raw(st.positions), st.capacity,
                                                raw(gone)});
        const auto g = to_host(gone);
        evicted.insert(evicted.end(), g.begin(), g.end());
        st.retain(kept, B, &running);
      }
      out.put_i32("plan", {static_cast<std::int64_t>(plan.size())}, plan);
      out.put_i32("plan_offsets", {static_cast<std::int64_t>(plan_offsets.size())}, plan_offsets);
      out.put_f32("out", {T, hq, d}, to_host(o));
      out.put_i32("evicted", {T, h}, evicted);
    }};

// ---- Quest ----------------------------------------------------------------------------------------

const kc::registrar method_quest_decode{
    handlers_backend, "method.quest.decode", [](const kc::case_data& c, kc::outputs& out) {
      kvsift::require(c.param_s("gqa") == "max", "method.quest.decode", "gqa", c.param_s("gqa"),
                      "\"max\"");
      const auto& k = c.in("keys");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int T = dim(sq, 0), hq = dim(sq, 1), G = hq / h;
      const int ps = param(c, "page_size");
      const bool dense = param(c, "layer") < param(c, "dense_layers");
      const kvsift::select::page_topk sel{{.page_size = ps, .min_pages = 3}};
      sel.validate("method.quest.decode");
      const int want = sel.pages_for(param(c, "budget"));
      const auto exec = ::thrust::device;
      const int cap = n + T;
      const int page_cap = (cap + ps - 1) / ps;
      device_store st(h, cap, d);
      {  // prompt: appended whole (Quest evicts nothing), every page digested
        std::vector<i32> all;
        for (int hh = 0; hh < h; ++hh) {
          for (int j = 0; j < n; ++j) all.push_back(j);
        }
        const device_sets every{to_device(uniform_offsets(h, n)), to_device(all),
                                static_cast<std::int64_t>(h) * n};
        st.install(to_device(k.f32), to_device(c.in("values").f32), n, every, n);
      }
      dvec<float> kmin(static_cast<std::size_t>(h) * page_cap * d);
      dvec<float> kmax(kmin.size());
      kt::page_digest_tail(exec, st.key_rows(), ps, page_cap, raw(kmin), raw(kmax), page_cap);
      std::vector<i32> plan, plan_offsets{0}, pages, pages_offsets{0};
      dvec<float> o(static_cast<std::size_t>(T) * hq * d);
      for (int t = 0; t < T; ++t) {
        const i32 pos = n + t;
        st.append(step_row(sk, t), step_row(sv, t), pos);
        kt::page_digest_tail(exec, st.key_rows(), ps, 1, raw(kmin), raw(kmax), page_cap);
        const int len = st.length;
        const int P = (len + ps - 1) / ps;
        const int kp = dense ? P : std::min(want, P);
        const dvec<float> qt(step_row(sq, t), step_row(sq, t) + static_cast<std::size_t>(hq) * d);
        // pages: bounds of q_t (GQA max), the current page protected, the top kp - 1 of the rest
        const dvec<i32> poff = to_device(uniform_offsets(h, P));
        dvec<float> scores(static_cast<std::size_t>(h) * P);
        kt::page_scores(exec, raw(qt), h, G, d, raw(kmin), raw(kmax), raw(poff), h,
                        static_cast<std::int64_t>(h) * P, kvsift::gqa_reduce::max, raw(scores),
                        page_cap);
        const auto sel_pages = step_topk(scores, poff, h, kp, 0, std::vector<i32>(h, 1));
        // their slots: every page full but the current one
        const int per_head = kp >= P ? len : len - (P - kp) * ps;
        const dvec<i32> slot_off = to_device(uniform_offsets(h, per_head));
        const std::int64_t M = static_cast<std::int64_t>(h) * per_head;
        dvec<i32> slots(static_cast<std::size_t>(M));
        kt::expand_page_slots(exec, raw(sel_pages.offsets), raw(sel_pages.values), h, ps,
                              raw(slot_off), M, raw(slots));
        dvec<i32> plan_pos(static_cast<std::size_t>(M));
        kt::gather_positions(exec, st.key_rows(), raw(slot_off), raw(slots), M, raw(plan_pos));
        append_plan(to_host(plan_pos), h, plan, plan_offsets);
        append_plan(to_host(sel_pages.values), h, pages, pages_offsets);
        st.attend(qt, pos, G, kt::attention_plan{raw(slot_off), raw(slots)}, M,
                  raw(o) + static_cast<std::size_t>(t) * hq * d, nullptr);
      }
      out.put_i32("plan", {static_cast<std::int64_t>(plan.size())}, plan);
      out.put_i32("plan_offsets", {static_cast<std::int64_t>(plan_offsets.size())}, plan_offsets);
      out.put_f32("out", {T, hq, d}, to_host(o));
      out.put_i32("pages", {static_cast<std::int64_t>(pages.size())}, pages);
      out.put_i32("pages_offsets", {static_cast<std::int64_t>(pages_offsets.size())},
                  pages_offsets);
    }};

// ---- LagKV ----------------------------------------------------------------------------------------

const kc::registrar method_lagkv_decode{
    handlers_backend, "method.lagkv.decode", [](const kc::case_data& c, kc::outputs& out) {
      const auto& keys = c.in("keys");
      const auto& values = c.in("values");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int H = dim(keys, 0), n = dim(keys, 1), d = dim(keys, 2);
      const int T = dim(sq, 0), hq = dim(sq, 1);
      const kvsift::select::partition_topk sel{{.sink = param(c, "sink"),
                                                .lag = param(c, "lag"),
                                                .keep_fraction = c.param_d("keep_fraction")}};
      sel.validate("method.lagkv.decode");
      const int S = sel.p.sink, L = sel.p.lag, k = sel.keep_per_partition();
      const kt::lag_params p{.lag = L,
                             .value_weight = c.param_d("value_weight"),
                             .variant = lag_variant_of(c)};
      const auto exec = ::thrust::device;
      device_store st(H, n + T, d);
      int frozen = 0;  // the frozen prefix of every head (host: it follows from the rounds)
      // prompt: the rounds of the chunked recursion at once (kinds_thrust.cpp's prefill)
      {
        const dvec<float> kd = to_device(keys.f32), vd = to_device(values.f32);
        auto [kept, per_head, scored, base0] = lag_prompt_topk(kd, vd, H, n, d, S, L, k, p);
        const int kept_per_head = n - scored * (L - k);
        device_sets per_head_sets{to_device(uniform_offsets(H, kept_per_head)),
                                  std::move(kept.values), kept.total};
        st.install(kd, vd, n, per_head_sets, kept_per_head);
        if (scored > 0) frozen = base0 + scored * k;
      }
      std::vector<i32> plan, plan_offsets{0}, compressed, bases;
      dvec<float> o(static_cast<std::size_t>(T) * hq * d);
      for (int t = 0; t < T; ++t) {
        const i32 pos = n + t;
        st.append(step_row(sk, t), step_row(sv, t), pos);
        append_plan(to_host(st.packed_positions()), H, plan, plan_offsets);
        const dvec<float> qt(step_row(sq, t), step_row(sq, t) + static_cast<std::size_t>(hq) * d);
        st.attend(qt, pos, hq / H, {}, st.items(), raw(o) + static_cast<std::size_t>(t) * hq * d,
                  nullptr);
        const int len = st.length;
        const bool fires = len - std::max(frozen, S) >= 2 * L;  // trigger::length
        compressed.push_back(fires ? 1 : 0);
        if (fires) {
          // One round: P = 2 partitions of [base, len) (decode fires exactly at 2L), the first
          // scored against the second and keeping its top k; [0, base) and the last partition
          // protected.
          const int base = std::min(std::max(frozen, S), len);
          const int P = (len - base) / L;
          if (P != 2) throw kc::runner_error("LagKV decode round with " + std::to_string(P) + " partitions");
          const dvec<i32> base_d(static_cast<std::size_t>(H), base);
          dvec<float> scores(static_cast<std::size_t>(st.items()));
          dvec<unsigned char> ws(kt::lag_workspace_bytes(st.items(), H, d, L));
          kt::lag_scores(exec, st.key_rows(), st.value_rows(), raw(base_d), st.items(), p,
                         raw(scores), raw(ws), ws.size());
          const int keep = len - (L - k);
          const auto kept = step_topk(scores, st.offsets, H, keep, base,
                                      std::vector<i32>(H, len - base - L));
          st.retain(kept, keep);
          frozen = base + k;
        }
        bases.push_back(std::max(frozen, S));
      }
      out.put_i32("plan", {static_cast<std::int64_t>(plan.size())}, plan);
      out.put_i32("plan_offsets", {static_cast<std::int64_t>(plan_offsets.size())}, plan_offsets);
      out.put_f32("out", {T, hq, d}, to_host(o));
      out.put_i32("compressed", {T}, compressed);
      out.put_i32("base", {T}, bases);
    }};

}  // namespace
