// SPDX-License-Identifier: Apache-2.0
// Thrust handlers of the two-tier methods' kinds that have no device state in the library yet:
// method.freekv.decode, method.heterocache.prefill, method.heterocache.decode (method.synckv.decode
// is the library's SyncKV over device memory: ../two_tier_kinds.hpp, kinds_thrust_methods.cpp).
// Conventions as kinds_thrust.cpp (no CPU scorer, selector or method runs; host code is parameter
// arithmetic and budgets only).
//
// Each handler is the method's lifecycle over the device, written so the step loop can be lifted
// into the library's device path: the prompt's round, then per decode step install (the recall
// the CPU schedule decided after the previous step) -> append -> plan -> attention -> the step's
// decisions. The store is store::tiered's two tiers (thrust/pool.hpp): the device tier holds each
// KV head's working set (rows sorted by position) and the host pool every token (plain host
// memory; under CUDA pinned, mapped memory: host_pool_array). A "recall" is thrust::tier_install
// copying the missing rows from the pool into the device tier, in the step the CPU schedule
// installs them (deferred_recall: step t+1 after the decision of step t; speculative: the step the
// selection is used). Shapes on the host, contents on the device: every count (working-set
// lengths, kept counts, pages) follows from host lengths and budgets; device data decides only
// which positions. Device data comes back to the host only for the case's outputs (plans, out,
// flags), and, where a method's decision is a host branch in the CPU code, the decision is
// computed on the device and applied there by shape-preserving choices (FreeKV's corrections:
// thrust::choose_sets; HeteroCache's drift: the satellites' new parts chosen per pivot on the
// device), so no flag is read back inside a step.

#include "helpers.hpp"

#include <kvsift/budget/synckv.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/score/freekv_pages.hpp>
#include <kvsift/select/freekv_pages.hpp>
#include <kvsift/thrust/attention.hpp>
#include <kvsift/thrust/drift_median.hpp>
#include <kvsift/thrust/freekv_pages.hpp>
#include <kvsift/thrust/last_query_attention.hpp>
#include <kvsift/thrust/pool.hpp>
#include <kvsift/thrust/query_cosine.hpp>
#include <kvsift/thrust/roles.hpp>
#include <kvsift/thrust/segmented_topk.hpp>
#include <kvsift/thrust/static_dynamic.hpp>

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/universal_vector.h>
#include <thrust/execution_policy.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace {
using namespace kvsift::conformance::thrust_kinds;  // kc, kt, dvec, to_device, to_host, raw, ...

std::vector<i32> csr_of(const std::vector<i32>& counts) {
  std::vector<i32> o{0};
  for (const auto c : counts) o.push_back(o.back() + c);
  return o;
}

// A host pool array: host memory the device reads in place, as store::tiered's recall does.
// Plain host memory under Thrust's CPP/OMP systems; pinned and mapped under CUDA (a kernel
// cannot read pageable host memory).
template <class T>
struct host_pool_array {
  ::thrust::universal_host_pinned_vector<T> v;
  explicit host_pool_array(std::size_t n) : v(n, T{}) {}
  T* data() { return ::thrust::raw_pointer_cast(v.data()); }
  const T* data() const { return ::thrust::raw_pointer_cast(v.data()); }
  T* begin() { return data(); }
  T& operator[](std::size_t i) { return data()[i]; }
};

// The two tiers of one request and one layer (store::tiered): the device tier [S, cap, d] and the
// host pool [S, cap, d], positions of every row, lengths on the host.
struct device_tiers {
  int S = 0, cap = 0, d = 0;
  dvec<float> k, v;
  dvec<i32> pos;
  std::vector<i32> len;  // host: resident rows per segment (a shape)
  dvec<i32> off;         // device copy of csr_of(len)
  host_pool_array<float> pool_k, pool_v;  // host pool
  host_pool_array<i32> pool_pos, pool_off;
  int pool_len = 0;
  dvec<unsigned char> ws;

  device_tiers(int segments, int capacity, int dim)
      : S(segments), cap(capacity), d(dim),
        k(static_cast<std::size_t>(segments) * capacity * dim),
        v(k.size()),
        pos(static_cast<std::size_t>(segments) * capacity, 0),
        len(static_cast<std::size_t>(segments), 0),
        pool_k(k.size()),
        pool_v(k.size()),
        pool_pos(pos.size()),
        pool_off(static_cast<std::size_t>(segments) + 1) {
    upload();
  }
  kt::tier_rows<float> tier() { return {raw(k), raw(v), raw(pos), S, cap, d}; }
  void upload() { off = to_device(csr_of(len)); }
  [[nodiscard]] std::int64_t total() const {
    return std::accumulate(len.begin(), len.end(), std::int64_t{0});
  }
  kt::segmented_rows<float> keys() { return tier().key_rows(raw(off)); }
  kt::segmented_rows<float> values() { return tier().value_rows(raw(off)); }
  kt::segmented_rows<float> pool_keys() const {
    return {pool_k.data(), pool_off.data(), pool_pos.data(), static_cast<std::int64_t>(cap) * d, S, d};
  }
  kt::segmented_rows<float> pool_values() const {
    return {pool_v.data(), pool_off.data(), pool_pos.data(), static_cast<std::int64_t>(cap) * d, S, d};
  }

  // The prompt: n tokens of each segment ([S, n, d] head-major), positions 0..n-1, written
  // through to the pool; the device tier holds them all (the prompt's K/V come from the device).
  void prompt(const float* keys_in, const float* values_in, int n) {
    std::vector<float> tk(k.size(), 0.0f), tv(k.size(), 0.0f);
    std::vector<i32> tp(pos.size(), 0);
    for (int s = 0; s < S; ++s) {
      const std::size_t from = static_cast<std::size_t>(s) * n * d;
      const std::size_t to = static_cast<std::size_t>(s) * cap * d;
      std::copy_n(keys_in + from, static_cast<std::size_t>(n) * d, pool_k.begin() + to);
      std::copy_n(values_in + from, static_cast<std::size_t>(n) * d, pool_v.begin() + to);
      std::copy_n(keys_in + from, static_cast<std::size_t>(n) * d, tk.begin() + to);
      std::copy_n(values_in + from, static_cast<std::size_t>(n) * d, tv.begin() + to);
      for (int j = 0; j < n; ++j) {
        pool_pos[static_cast<std::size_t>(s) * cap + j] = j;
        tp[static_cast<std::size_t>(s) * cap + j] = j;
      }
      len[s] = n;
    }
    k = to_device(tk);
    v = to_device(tv);
    pos = to_device(tp);
    pool_len = n;
    for (int s = 0; s <= S; ++s) pool_off[s] = s * pool_len;
    upload();
  }

  // One decode token per segment (rows [S, d] of keys and values) at `position`: written through
  // to the pool (host) and appended to the device tier (tier_append).
  void append(const float* krows, const float* vrows, i32 position) {
    for (int s = 0; s < S; ++s) {
      const std::size_t at = (static_cast<std::size_t>(s) * cap + pool_len) * d;
      std::copy_n(krows + static_cast<std::size_t>(s) * d, d, pool_k.begin() + at);
      std::copy_n(vrows + static_cast<std::size_t>(s) * d, d, pool_v.begin() + at);
      pool_pos[static_cast<std::size_t>(s) * cap + pool_len] = position;
    }
    ++pool_len;
    for (int s = 0; s <= S; ++s) pool_off[s] = s * pool_len;
    const dvec<float> dk(krows, krows + static_cast<std::size_t>(S) * d);
    const dvec<float> dv(vrows, vrows + static_cast<std::size_t>(S) * d);
    const dvec<i32> p(static_cast<std::size_t>(S), position);
    kt::tier_append(::thrust::device, tier(), raw(off), raw(dk), raw(dv), raw(p));
    for (auto& l : len) ++l;
    upload();
  }

  // The working set of each targets[r] becomes positions[offsets[r] .. offsets[r + 1]).
  void install(const std::vector<i32>& targets, const dvec<i32>& offsets, const dvec<i32>& positions,
               const std::vector<i32>& counts) {
    if (targets.empty()) return;
    const dvec<i32> tg = to_device(targets);
    const auto rows = static_cast<std::int64_t>(positions.size());
    ws.resize(kt::tier_install_workspace_bytes<float>(rows, d));
    kt::tier_install(::thrust::device, tier(), raw(off), pool_keys(), pool_values(), raw(tg),
                     static_cast<int>(targets.size()), raw(offsets), raw(positions), rows,
                     raw(ws), ws.size());
    for (std::size_t r = 0; r < targets.size(); ++r) len[targets[r]] = counts[r];
    upload();
  }

  // The plan (every resident row of each segment): its positions, for the outputs.
  [[nodiscard]] kvsift::index_sets positions() const {
    const auto all = to_host(pos);
    kvsift::index_sets out;
    for (int s = 0; s < S; ++s) {
      const auto at = all.begin() + static_cast<std::ptrdiff_t>(s) * cap;
      out.push_back(std::vector<i32>(at, at + len[s]));
    }
    return out;
  }

  // thrust::attention_over every resident row: q [q_heads, d] (one request, one query at qpos).
  void attend(const dvec<float>& q, int group, i32 qpos, float* out_host) {
    const dvec<i32> first(1, qpos);
    const kt::window_queries wq{raw(q), raw(first), 1, S, group};
    const std::int64_t n = total();
    dvec<unsigned char> aws(kt::attention_workspace_bytes(n, group, 1));
    dvec<float> o(static_cast<std::size_t>(S) * group * d);
    kt::attention_over(::thrust::device, keys(), values(), wq, kt::attention_plan{}, n, n, raw(o),
                       nullptr, raw(aws), aws.size());
    ::thrust::copy(o.begin(), o.end(), out_host);
  }
};

// score::last_query_attention's scores of one query per request (thrust::
// query_attention_scores) over the tier's working sets: [total rows] in the tier's CSR.
dvec<float> last_query_scores(device_tiers& t, const dvec<float>& q, int group, i32 qpos,
                              int kernel) {
  const dvec<i32> first(1, qpos);
  const kt::window_queries wq{raw(q), raw(first), 1, t.S, group};
  const std::int64_t n = t.total();
  dvec<float> out(static_cast<std::size_t>(n));
  dvec<unsigned char> ws(kt::query_attention_workspace_bytes(n, group, 1));
  kt::query_attention_scores(::thrust::device, t.keys(), wq, n, kernel, kvsift::pooling::avg,
                             kvsift::gqa_reduce::max, raw(out), raw(ws), ws.size());
  return out;
}

// A CSR of device sets; counts by head.
struct dsets {
  dvec<i32> offsets, values;
  std::vector<i32> counts;
};
// pending_recalls' working set of each target: part ∪ its resident positions >= boundary
// (`decode` of them, a shape), installed.
void install_with_decode_tokens(device_tiers& t, const std::vector<i32>& targets, const dsets& part,
                                i32 boundary, int decode) {
  std::vector<i32> counts;
  for (const auto c : part.counts) counts.push_back(c + decode);
  const auto o = csr_of(counts);
  const dvec<i32> off = to_device(o);
  dvec<i32> ws(static_cast<std::size_t>(o.back()));
  const dvec<i32> tg = to_device(targets);
  const dvec<i32> b(targets.size(), boundary);
  kt::working_set_positions(::thrust::device, raw(part.offsets), raw(part.values), raw(tg),
                            static_cast<int>(targets.size()), raw(t.pos), raw(t.off), t.cap, raw(b),
                            raw(off), o.back(), raw(ws));
  t.install(targets, off, ws, counts);
}

// ---- FreeKV ---------------------------------------------------------------------------------------

const kc::registrar method_freekv_decode{
    handlers_backend, "method.freekv.decode", [](const kc::case_data& c, kc::outputs& out) {
      const auto& k = c.in("keys");
      const auto& v = c.in("values");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2);
      const int T = dim(sq, 0), hq = dim(sq, 1), G = hq / h;
      const int layer = param(c, "layer"), ps = param(c, "page_size"), B = param(c, "budget");
      const int sink = param(c, "sink"), window = param(c, "window");
      const double tau = c.param_d("tau");
      const auto merge = kvsift::score::parse_freekv_merge(c.param_s("merge"));
      const kvsift::score::freekv_pages sc{{.page_size = ps, .sink = sink, .window = window, .merge = merge}};
      const kvsift::select::freekv_pages sel{{.page_size = ps, .sink = sink, .window = window}};
      sc.validate("method.freekv.decode");
      sel.validate_budget("method.freekv.decode", "budget", B);
      kvsift::require(sel.selectable(B) >= 0, "method.freekv.decode", "budget", B,
                      ">= sink + window (" + std::to_string(sink + window) + " tokens)");
      const bool dense = layer < param(c, "dense_layers");
      const int cap = n + T;
      const int P_max = (cap + ps - 1) / ps;
      const int budget_pages = B / ps;
      const auto exec = ::thrust::device;

      device_tiers t(h, cap, d);
      t.prompt(k.f32.data(), v.f32.data(), n);
      // the pool's page digests, kept on the device ([h, P_max, d]) and grown by each append
      dvec<float> kmin(static_cast<std::size_t>(h) * P_max * d), kmax(kmin.size());
      {
        const dvec<i32> poff = to_device(uniform_offsets(h, P_max));
        kt::page_digest(exec, t.keys(), raw(poff), static_cast<std::int64_t>(h) * P_max, ps,
                        raw(kmin), raw(kmax));
      }
      // Pages [h] selected with query q on the layout of `tokens` tokens (select::freekv_pages:
      // sink, top candidates by group score, window; every page when they fit the budget).
      const auto select = [&](const dvec<float>& q, int tokens) {
        const auto lay = sc.layout(tokens);
        const int P = lay.pages;
        const dvec<i32> poff = to_device(uniform_offsets(h, P));
        dvec<float> scores(static_cast<std::size_t>(h) * P);
        dvec<unsigned char> ws(kt::freekv_workspace_bytes(h, G));
        kt::freekv_group_scores_strided(exec, raw(q), h, G, d, raw(kmin), raw(kmax), P_max,
                                        raw(poff), h, static_cast<std::int64_t>(h) * P, ps, sink,
                                        window, merge, raw(scores), raw(ws), ws.size());
        return device_topk(scores, poff, h, std::vector<i32>(static_cast<std::size_t>(h), budget_pages),
                           sink / ps, std::vector<i32>(static_cast<std::size_t>(h), window / ps));
      };
      // prefill: a prompt over the budget keeps step 1's sink and window pages (no queries)
      if (!dense) {
        const auto lay = sc.layout(n + 1);
        if (lay.pages > budget_pages) {
          std::vector<i32> keep, targets, counts;
          for (int x = 0; x < h; ++x) {
            int cnt = 0;
            for (int j = 0; j < n; ++j) {
              const int pg = j / ps;
              if (pg < lay.candidates_first || pg >= lay.candidates_last) {
                keep.push_back(j);
                ++cnt;
              }
            }
            targets.push_back(x);
            counts.push_back(cnt);
          }
          t.install(targets, to_device(csr_of(counts)), to_device(keep), counts);
        }
      }

      kvsift::index_sets plan, pages_out;
      std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
      std::vector<i32> correct;
      dvec<float> prev;     // q_{t-1} (trigger::query_cosine's state)
      device_sets spec;     // the selection made after step t-1 (for step t's layout)
      std::vector<i32> all_heads(static_cast<std::size_t>(h));
      std::iota(all_heads.begin(), all_heads.end(), 0);
      for (int step = 1; step <= T; ++step) {
        const std::size_t t0 = static_cast<std::size_t>(step - 1);
        const i32 qpos = n + step - 1;
        t.append(sk.f32.data() + t0 * h * d, sv.f32.data() + t0 * h * d, qpos);
        {
          const dvec<float> kd(sk.f32.begin() + static_cast<std::ptrdiff_t>(t0 * h * d),
                               sk.f32.begin() + static_cast<std::ptrdiff_t>((t0 + 1) * h * d));
          kt::page_digest_append(exec, raw(kd), h, d, t.pool_len - 1, ps, P_max, raw(kmin), raw(kmax));
        }
        const dvec<float> qt(sq.f32.begin() + static_cast<std::ptrdiff_t>(t0 * hq * d),
                             sq.f32.begin() + static_cast<std::ptrdiff_t>((t0 + 1) * hq * d));
        const int N = t.pool_len;
        const auto lay = sc.layout(N);
        if (dense) {
          for (int x = 0; x < h; ++x) {
            std::vector<i32> pg(static_cast<std::size_t>(lay.pages));
            std::iota(pg.begin(), pg.end(), 0);
            pages_out.push_back(pg);
            correct.push_back(0);
          }
        } else {
          // step 1 and corrected heads select with q_t; the others take the speculative selection
          // (the trigger's decision stays on the device: choose_sets per head, same shapes)
          auto fresh = select(qt, N);
          device_sets chosen;
          dvec<i32> flags(static_cast<std::size_t>(h), 0);
          if (step > 1) {
            kt::query_cosine_decisions(exec, raw(qt), raw(prev), h, G, d, tau, nullptr, raw(flags));
            chosen.offsets = fresh.offsets;
            chosen.total = fresh.total;
            chosen.values.resize(fresh.values.size());
            kt::choose_sets(exec, raw(fresh.offsets), h, fresh.total, raw(flags), raw(fresh.values),
                            raw(spec.values), raw(chosen.values));
          } else {
            chosen = std::move(fresh);
          }
          // the working set becomes exactly the chosen pages' tokens (recalled where missing)
          const int kp = std::min(lay.pages, budget_pages);
          const int last_page = N - (lay.pages - 1) * ps;
          const std::vector<i32> counts(static_cast<std::size_t>(h), (kp - 1) * ps + last_page);
          const auto co = csr_of(counts);
          const dvec<i32> coff = to_device(co);
          dvec<i32> positions(static_cast<std::size_t>(co.back()));
          kt::pages_to_positions(exec, raw(chosen.offsets), raw(chosen.values), h, ps, raw(coff),
                                 co.back(), raw(positions));
          t.install(all_heads, coff, positions, counts);
          const auto po = to_host(chosen.offsets), pv = to_host(chosen.values);
          for (int x = 0; x < h; ++x) {
            pages_out.push_back(std::vector<i32>(pv.begin() + po[x], pv.begin() + po[x + 1]));
          }
          const auto fl = to_host(flags);
          correct.insert(correct.end(), fl.begin(), fl.end());
        }
        const auto pl = t.positions();
        for (int x = 0; x < h; ++x) plan.push_back(pl[x]);
        t.attend(qt, G, qpos, o.data() + t0 * hq * d);
        // after the attention: select with q_t on step t+1's layout (recalled in the background)
        if (!dense) {
          spec = select(qt, N + 1);
          prev = qt;
        }
      }
      put_csr(out, "plan", plan);
      out.put_f32("out", {T, hq, d}, std::move(o));
      put_csr(out, "pages", pages_out);
      out.put_i32("correct", {T, h}, std::move(correct));
    }};

// ---- HeteroCache ----------------------------------------------------------------------------------

void check_heterocache_scoring(const kc::case_data& c, std::string_view where) {
  kvsift::require(c.param_s("pooling") == "avg", where, "pooling", c.param_s("pooling"),
                  "\"avg\" (HeteroCache pools its last-query attention with avg)");
  kvsift::require(c.param_s("gqa") == "max", where, "gqa", c.param_s("gqa"),
                  "\"max\" (HeteroCache's runtime scores)");
}

// Rows `leader[i]` of a CSR of equal rows of `row` floats/ints, as a new CSR (one per i).
template <class V>
dvec<V> rows_of(const dvec<V>& in, int in_rows, int row, const std::vector<i32>& leader) {
  const dvec<i32> in_off = to_device(uniform_offsets(in_rows, row));
  const dvec<i32> out_off = to_device(uniform_offsets(static_cast<int>(leader.size()), row));
  const dvec<i32> ld = to_device(leader);
  dvec<V> out(leader.size() * static_cast<std::size_t>(row));
  kt::leader_gather(::thrust::device, raw(in_off), raw(in), raw(ld), static_cast<int>(leader.size()),
                    raw(out_off), static_cast<std::int64_t>(out.size()), raw(out));
  return out;
}

// The top min(n, caps[i]) of each of R score rows of n (no protected tokens), ascending.
device_sets top_of_rows(const dvec<float>& rows, int R, int n, const std::vector<i32>& caps) {
  std::vector<i32> b;
  for (const auto x : caps) b.push_back(std::min(x, n));
  return device_topk(rows, to_device(uniform_offsets(R, n)), R, b, 0,
                     std::vector<i32>(static_cast<std::size_t>(R), 0));
}

const kc::registrar method_heterocache_prefill{
    handlers_backend, "method.heterocache.prefill", [](const kc::case_data& c, kc::outputs& out) {
      check_heterocache_scoring(c, "method.heterocache.prefill");
      const auto& k = c.in("keys");
      const auto& q = c.in("query");
      const auto& cap = c.in("cap");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
      device_tiers t(h, n, d);
      t.prompt(k.f32.data(), k.f32.data(), n);  // the kind's values are its keys
      const auto scores = last_query_scores(t, to_device(q.f32), hq / h, n - 1, param(c, "kernel"));
      out.put_f32("scores", {h, n}, to_host(scores));
      // every head an anchor: its own top min(n, cap_h), installed (the rest stays in the pool)
      const auto kept = top_of_rows(scores, h, n, cap.i32);
      std::vector<i32> heads(static_cast<std::size_t>(h)), counts;
      std::iota(heads.begin(), heads.end(), 0);
      for (const auto x : cap.i32) counts.push_back(std::min(x, n));
      t.install(heads, kept.offsets, kept.values, counts);
      put_csr(out, "kept", t.positions());
    }};

const kc::registrar method_heterocache_decode{
    handlers_backend, "method.heterocache.decode", [](const kc::case_data& c, kc::outputs& out) {
      check_heterocache_scoring(c, "method.heterocache.decode");
      const auto& k = c.in("keys");
      const auto& v = c.in("values");
      const auto& q = c.in("query");
      const auto& sq = c.in("step_queries");
      const auto& sk = c.in("step_keys");
      const auto& sv = c.in("step_values");
      const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
      const int T = dim(sq, 0), G = hq / h;
      const int W = param(c, "drift_window"), kernel = param(c, "kernel");
      const double tau = c.param_d("tau_drift");
      const auto& roles = c.in("roles").i32;
      const auto& leader = c.in("leader").i32;
      // host: roles (0 anchor, 1 volatile, 2 pivot, 3 satellite) and the fixed budgets
      const int base = std::min(c.in("base").i32.at(0), n);
      std::vector<i32> caps;
      for (const auto x : c.in("cap").i32) caps.push_back(std::min(x, n));
      std::vector<i32> capped, capped_caps, pivots, sats, sat_pivot, sat_caps;
      for (int x = 0; x < h; ++x) {
        if (roles[x] == 0 || roles[x] == 3) {
          capped.push_back(x);
          capped_caps.push_back(caps[x]);
        }
      }
      for (int x = 0; x < h; ++x) {  // pivots with satellites (the monitored ones)
        if (roles[x] != 2) continue;
        bool any = false;
        for (int y = 0; y < h; ++y) any = any || (roles[y] == 3 && leader[y] == x);
        if (any) pivots.push_back(x);
      }
      const int P = static_cast<int>(pivots.size());
      for (int p = 0; p < P; ++p) {
        for (int y = 0; y < h; ++y) {
          if (roles[y] != 3 || leader[y] != pivots[p]) continue;
          sats.push_back(y);
          sat_pivot.push_back(p);
          sat_caps.push_back(caps[y]);
        }
      }
      const auto exec = ::thrust::device;
      device_tiers t(h, n + T, d);
      t.prompt(k.f32.data(), v.f32.data(), n);
      // prefill: capped heads keep their own top cap_h of the last query's scores; a monitored
      // pivot's reference is its own top `base`
      const auto scores0 = last_query_scores(t, to_device(q.f32), G, n - 1, kernel);
      if (!capped.empty()) {
        const auto kept =
            top_of_rows(rows_of(scores0, h, n, capped), static_cast<int>(capped.size()), n, capped_caps);
        t.install(capped, kept.offsets, kept.values, capped_caps);
      }
      dvec<i32> ref;  // [P, base]
      if (P > 0) {
        ref = top_of_rows(rows_of(scores0, h, n, pivots), P, n, std::vector<i32>(P, base)).values;
      }
      const dvec<i32> ref_off = to_device(uniform_offsets(P, base));

      // the probe's view: each monitored pivot's n prefill rows (a full head: slots = positions)
      std::vector<i32> probe_len(static_cast<std::size_t>(h), 0);
      for (const auto x : pivots) probe_len[x] = n;
      const auto probe_o = csr_of(probe_len);
      const dvec<i32> probe_off = to_device(probe_o);
      dvec<float> history(static_cast<std::size_t>(W) * hq * d);  // the newest W decode queries

      kvsift::index_sets plan;
      std::vector<float> o(static_cast<std::size_t>(T) * hq * d);
      std::vector<i32> drift_out;
      std::vector<float> median_out;
      bool pending = false;
      dvec<i32> drift, new_ref, new_part;  // the last check's decisions (device)
      for (int step = 1; step <= T; ++step) {
        const std::size_t t0 = static_cast<std::size_t>(step - 1);
        // 1. the recall decided after the previous check: each satellite's prefill part becomes
        // its pivot's new top cap_s where the pivot drifted, else stays (chosen on the device)
        if (pending) {
          const auto sat_flags = rows_of(drift, P, 1, sat_pivot);
          const auto cur = [&] {  // each satellite's current prefill part: its first cap_s rows
            const dvec<i32> in_off = to_device(uniform_offsets(h, t.cap));
            const auto so = csr_of(sat_caps);
            const dvec<i32> out_off = to_device(so);
            const dvec<i32> ld = to_device(sats);
            dvec<i32> r(static_cast<std::size_t>(so.back()));
            kt::leader_gather(exec, raw(in_off), raw(t.pos), raw(ld), static_cast<int>(sats.size()),
                              raw(out_off), so.back(), raw(r));
            return r;
          }();
          dsets part;
          part.counts = sat_caps;
          part.offsets = to_device(csr_of(sat_caps));
          part.values.resize(cur.size());
          kt::choose_sets(exec, raw(part.offsets), static_cast<int>(sats.size()),
                          static_cast<std::int64_t>(cur.size()), raw(sat_flags), raw(new_part),
                          raw(cur), raw(part.values));
          install_with_decode_tokens(t, sats, part, n, step - 1);
          dvec<i32> r2(ref.size());
          kt::choose_sets(exec, raw(ref_off), P, static_cast<std::int64_t>(ref.size()), raw(drift),
                          raw(new_ref), raw(ref), raw(r2));
          ref = std::move(r2);
          pending = false;
        }
        // 2. append, remember q_t in the drift window, 3. the plan, 4. attention
        t.append(sk.f32.data() + t0 * h * d, sv.f32.data() + t0 * h * d, n + step - 1);
        const dvec<float> qt(sq.f32.begin() + static_cast<std::ptrdiff_t>(t0 * hq * d),
                             sq.f32.begin() + static_cast<std::ptrdiff_t>((t0 + 1) * hq * d));
        ::thrust::copy(qt.begin(), qt.end(),
                       history.begin() + static_cast<std::ptrdiff_t>((t0 % W) * hq * d));
        const auto pl = t.positions();
        for (int x = 0; x < h; ++x) plan.push_back(pl[x]);
        t.attend(qt, G, n + step - 1, o.data() + t0 * hq * d);
        // 5. the drift check after steps W, 2W, ... (trigger::drift_median)
        std::vector<float> med(static_cast<std::size_t>(h), -1.0f);
        std::vector<i32> dr(static_cast<std::size_t>(h), 0);
        if (P > 0 && step % W == 0) {
          // the window's queries, oldest first: [W, Hq, d]
          dvec<float> win(history.size());
          for (int w = 0; w < W; ++w) {
            const std::size_t from = static_cast<std::size_t>((step - W + w) % W) * hq * d;
            ::thrust::copy_n(history.begin() + static_cast<std::ptrdiff_t>(from), hq * d,
                             win.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(w) * hq * d));
          }
          // each window query over each monitored pivot's prefill keys: [P, W, n]
          const dvec<i32> first(1, n - 1);  // every query sees exactly the n prompt keys
          const kt::window_queries wq{raw(win), raw(first), W, h, G};
          const kt::segmented_rows<float> keys{raw(t.k), raw(probe_off), raw(t.pos),
                                               static_cast<std::int64_t>(t.cap) * d, h, d};
          const std::int64_t N = probe_o.back();
          dvec<float> probe(static_cast<std::size_t>(N) * W);
          dvec<unsigned char> ws(kt::query_attention_workspace_bytes(N, G, W));
          kt::query_attention_scores(exec, keys, wq, N, kernel, kvsift::pooling::avg,
                                     kvsift::gqa_reduce::max, raw(probe), raw(ws), ws.size());
          const auto sets = top_of_rows(probe, P * W, n, std::vector<i32>(static_cast<std::size_t>(P) * W, base));
          dvec<double> medians(static_cast<std::size_t>(P));
          drift.resize(static_cast<std::size_t>(P));
          dvec<unsigned char> dws(kt::drift_medians_workspace_bytes(P, W));
          kt::drift_medians(exec, raw(sets.offsets), raw(sets.values), raw(ref_off), raw(ref), P, W,
                            tau, raw(medians), raw(drift), raw(dws), dws.size());
          // a drift's decision and parts, for both outcomes: the newest query's set becomes the
          // reference, each satellite's part its pivot's top cap_s by the newest query's scores
          std::vector<i32> newest;
          for (int p = 0; p < P; ++p) newest.push_back(p * W + W - 1);
          new_ref = rows_of(sets.values, P * W, base, newest);
          std::vector<i32> sat_rows;
          for (const auto p : sat_pivot) sat_rows.push_back(p * W + W - 1);
          new_part = top_of_rows(rows_of(probe, P * W, n, sat_rows), static_cast<int>(sats.size()),
                                 n, sat_caps)
                         .values;
          pending = true;
          // outputs (read back for the case only)
          const auto mh = to_host(medians);
          const auto dh = to_host(drift);
          for (int p = 0; p < P; ++p) {
            med[pivots[p]] = static_cast<float>(mh[p]);
            dr[pivots[p]] = dh[p];
          }
        }
        drift_out.insert(drift_out.end(), dr.begin(), dr.end());
        median_out.insert(median_out.end(), med.begin(), med.end());
      }
      put_csr(out, "plan", plan);
      out.put_f32("out", {T, hq, d}, std::move(o));
      out.put_i32("drift", {T, h}, std::move(drift_out));
      out.put_f32("drift_median", {T, h}, std::move(median_out));
    }};

}  // namespace
