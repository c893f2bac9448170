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

#include "device_backend.hpp"
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
namespace mk = kvsift::conformance::method_kinds;

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

// ---- FreeKV ---------------------------------------------------------------------------------------

const kc::registrar method_freekv_decode{
    handlers_backend, "method.freekv.decode",
    kvsift::conformance::two_tier_kinds::freekv_decode<mk::device>};

// ---- HeteroCache ----------------------------------------------------------------------------------

// method.heterocache.prefill's `scores`: the prefill scorer on its own (Thrust's
// query_attention_scores, kernel-pooled, GQA max); the kind's placement and decode lifecycle are
// the library's heterocache_on (../two_tier_kinds.hpp on the device backend).
void device_scores(const kc::case_data& c, kc::outputs& out) {
  const auto& k = c.in("keys");
  const auto& q = c.in("query");
  const int h = dim(k, 0), n = dim(k, 1), d = dim(k, 2), hq = dim(q, 0);
  device_tiers t(h, n, d);
  t.prompt(k.f32.data(), k.f32.data(), n);  // the kind's values are its keys
  const auto scores = last_query_scores(t, to_device(q.f32), hq / h, n - 1, param(c, "kernel"));
  out.put_f32("scores", {h, n}, to_host(scores));
}

const kc::registrar method_heterocache_prefill{
    handlers_backend, "method.heterocache.prefill", [](const kc::case_data& c, kc::outputs& out) {
      kvsift::conformance::two_tier_kinds::heterocache_prefill<mk::device>(c, out, device_scores);
    }};

const kc::registrar method_heterocache_decode{
    handlers_backend, "method.heterocache.decode",
    kvsift::conformance::two_tier_kinds::heterocache_decode<mk::device>};

}  // namespace
