// SPDX-License-Identifier: Apache-2.0
#pragma once

// Helpers shared by the Thrust backend's conformance handlers (kinds_thrust*.cpp): host <-> device
// copies, the layout shuffles between the vectors' [heads, tokens, d] tensors and the backend's
// ragged batches, and the two compositions every method kind uses: device_topk (thrust::
// segmented_topk with a protected sink / window) and gather_kept (thrust::gather_rows of the kept
// rows, whose gathered positions are a method's output). Window scores (SnapKV / PyramidKV /
// DynamicKV) are here too since several families score with them, and LagKV's prompt top-k
// (lag_prompt_topk: its prefill kind and its decode kind's prompt round). Host code only; every array
// the algorithms read or write is a thrust::device_vector.

#include "../runner.hpp"

#include <kvsift/core/error.hpp>
#include <kvsift/score/lag.hpp>
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

// The backend these handlers register under: `thrust` (CPP/OMP systems, g++), or `cuda` when
// kvsift-conformance-cuda compiles the same files with nvcc under Thrust's CUDA system.
#ifndef KVSIFT_CONFORMANCE_BACKEND
#define KVSIFT_CONFORMANCE_BACKEND thrust
#endif

namespace kvsift::conformance::thrust_kinds {
namespace kc = kvsift::conformance;
inline constexpr kc::backend handlers_backend = kc::backend::KVSIFT_CONFORMANCE_BACKEND;
namespace kt = kvsift::thrust;
using kc::dim;
using kc::param;
using i32 = std::int32_t;
template <class T>
using dvec = ::thrust::device_vector<T>;

template <class T>
dvec<T> to_device(const std::vector<T>& v) {
  return dvec<T>(v.begin(), v.end());
}
template <class T>
std::vector<T> to_host(const dvec<T>& v) {
  std::vector<T> h(v.size());
  ::thrust::copy(v.begin(), v.end(), h.begin());
  return h;
}
template <class T>
T* raw(dvec<T>& v) {
  return ::thrust::raw_pointer_cast(v.data());
}
template <class T>
const T* raw(const dvec<T>& v) {
  return ::thrust::raw_pointer_cast(v.data());
}

// CSR offsets of `segments` segments of `n` each.
inline std::vector<i32> uniform_offsets(int segments, int n) {
  std::vector<i32> o(static_cast<std::size_t>(segments) + 1);
  for (int s = 0; s <= segments; ++s) o[s] = s * n;
  return o;
}

// Every block of `block` values of src repeated `copies_each` times in a row: KV head h's keys
// once per query head of its group.
template <class T>
std::vector<T> repeat_blocks(const std::vector<T>& src, std::size_t block, int copies_each) {
  std::vector<T> out;
  out.reserve(src.size() * static_cast<std::size_t>(copies_each));
  for (std::size_t b = 0; b * block < src.size(); ++b) {
    for (int c = 0; c < copies_each; ++c) {
      out.insert(out.end(), src.begin() + b * block, src.begin() + (b + 1) * block);
    }
  }
  return out;
}

// [A, B, d] -> [B, A, d]: a case's [Hq, w, d] queries as the backend's [w, Hq, d].
inline std::vector<float> swap_outer(const float* src, int a, int b, int d) {
  std::vector<float> out(static_cast<std::size_t>(a) * b * d);
  for (int i = 0; i < a; ++i) {
    for (int j = 0; j < b; ++j) {
      std::copy_n(src + (static_cast<std::size_t>(i) * b + j) * d, d,
                  out.data() + (static_cast<std::size_t>(j) * a + i) * d);
    }
  }
  return out;
}

// The first `take` of every `row` values from `first`: [rows, take] out of [rows, row].
inline std::vector<float> slice_rows(const std::vector<float>& v, int rows, int row, int first, int take) {
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(rows) * take);
  for (int r = 0; r < rows; ++r) {
    const auto at = v.begin() + static_cast<std::ptrdiff_t>(r) * row + first;
    out.insert(out.end(), at, at + take);
  }
  return out;
}

// A segmented top-k on the device: per segment min(budgets[s], n_s) indices, the first `sink`
// and last window[s] protected, ascending. Returns the CSR on the device.
struct device_sets {
  dvec<i32> offsets, values;
  std::int64_t total = 0;
};

inline device_sets device_topk(const dvec<float>& scores, const dvec<i32>& offsets, int segments,
                        const std::vector<i32>& budgets, int sink, const std::vector<i32>& window) {
  const auto exec = ::thrust::device;
  const std::int64_t n = static_cast<std::int64_t>(scores.size());
  const dvec<i32> b = to_device(budgets);
  const dvec<i32> w = to_device(window);
  device_sets r;
  r.offsets.resize(static_cast<std::size_t>(segments) + 1);
  kt::kept_offsets(exec, raw(offsets), raw(b), segments, raw(r.offsets));
  r.total = r.offsets.back();
  r.values.resize(static_cast<std::size_t>(r.total));
  dvec<unsigned char> ws(kt::segmented_topk_workspace_bytes(n));
  kt::segmented_topk(exec, raw(scores), raw(offsets), segments, n, raw(r.offsets), r.total,
                     raw(r.values), raw(ws), ws.size(), kt::topk_protection{sink, raw(w)});
  return r;
}

// The case's `variant` as the Thrust backend's enum (score::parse_lag_variant's names).
inline kt::lag_variant lag_variant_of(const kc::case_data& c) {
  return kt::variant_of(kvsift::score::parse_lag_variant(c.param_s("variant")));
}
// LagKV's prompt on the device (method.lagkv.prefill, and the prompt round of
// method.lagkv.decode). The rounds of SPEC's chunk-by-chunk recursion (first S + 2L tokens, then
// chunks of L) score partition p against raw partition p + 1 whatever the chunking, so they run
// at once, as kvsift::lagkv's prefill runs them: lag_scores over [S, n) with base S, one
// segmented top-k whose segments per head are the sink, each scored partition (keeping k) and
// the raw tail (kept whole; both score +inf). `kept` holds per sub-segment (per_head of them per
// head) the kept slots, head-local.
struct lag_prompt {
  device_sets kept;
  int per_head = 0;  // sub-segments per head: the sink, the scored partitions, the tail
  int scored = 0;    // partitions compressed (= rounds)
  int base0 = 0;     // min(S, n)
};

// Head-local index of kept entry t: its sub-segment's start minus the head's first token.
struct head_local_fn {
  const i32* sub_offsets;   // [H * per_head + 1] token offsets of the sub-segments
  const i32* kept_offsets;  // [H * per_head + 1] CSR of the kept sub-segment-local indices
  int num_sub;
  int per_head;
  int n;
  i32* kept;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t t) const {
    const int s = kt::detail::segment_of(kept_offsets, num_sub, t);
    kept[t] += sub_offsets[s] - (s / per_head) * n;
  }
};

inline lag_prompt lag_prompt_topk(const dvec<float>& kd, const dvec<float>& vd, int H, int n, int d,
                                  int S, int L, int k, const kt::lag_params& p) {
  const auto exec = ::thrust::device;
  lag_prompt r;
  r.base0 = std::min(S, n);
  const int P = (n - r.base0) / L;  // full partitions of [base0, n)
  r.scored = P >= 2 ? P - 1 : 0;
  const std::int64_t N = static_cast<std::int64_t>(H) * n;
  const dvec<i32> offsets = to_device(uniform_offsets(H, n));
  const dvec<i32> base = to_device(std::vector<i32>(static_cast<std::size_t>(H), r.base0));
  dvec<float> scores(static_cast<std::size_t>(N));
  {
    const kt::segmented_rows<float> rk{raw(kd), raw(offsets), nullptr, 0, H, d};
    const kt::segmented_rows<float> rv{raw(vd), raw(offsets), nullptr, 0, H, d};
    dvec<unsigned char> ws(kt::lag_workspace_bytes(N, H, d, L));
    kt::lag_scores(exec, rk, rv, raw(base), N, p, raw(scores), raw(ws), ws.size());
  }
  r.per_head = r.scored + 2;
  std::vector<i32> sub{0}, budgets;
  for (int h = 0; h < H; ++h) {
    sub.push_back(h * n + r.base0);
    budgets.push_back(r.base0);
    for (int q = 0; q < r.scored; ++q) {
      sub.push_back(sub.back() + L);
      budgets.push_back(k);
    }
    sub.push_back((h + 1) * n);
    budgets.push_back(n - r.base0 - r.scored * L);
  }
  const int num_sub = H * r.per_head;
  const dvec<i32> sub_d = to_device(sub);
  r.kept = device_topk(scores, sub_d, num_sub, budgets, 0,
                       std::vector<i32>(static_cast<std::size_t>(num_sub), 0));
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), r.kept.total,
                       head_local_fn{raw(sub_d), raw(r.kept.offsets), num_sub, r.per_head, n,
                                     raw(r.kept.values)});
  return r;
}

// Gathers the kept rows of `segments` packed segments of `n` keys (positions 0..n-1) into a
// dense [segments, n, d] device array and returns the gathered original positions, CSR on the
// host: what a compacted device store holds.
inline kvsift::index_sets gather_kept(const dvec<float>& keys, int segments, int n, int d,
                               const device_sets& kept) {
  const auto exec = ::thrust::device;
  const dvec<i32> offsets = to_device(uniform_offsets(segments, n));
  std::vector<i32> pos(static_cast<std::size_t>(segments) * n);
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<i32>(i % n);
  const dvec<i32> positions = to_device(pos);
  const kt::segmented_rows<float> src{raw(keys), raw(offsets), raw(positions), 0, segments, d};
  dvec<float> dst(static_cast<std::size_t>(segments) * n * d);
  dvec<i32> dst_pos(static_cast<std::size_t>(segments) * n, -1);
  kt::gather_rows(exec, src, raw(kept.offsets), raw(kept.values), kept.total, raw(dst), n,
                  raw(dst_pos));
  const auto off = to_host(kept.offsets);
  const auto gathered = to_host(dst_pos);
  kvsift::index_sets out;
  out.offsets = off;
  for (int s = 0; s < segments; ++s) {
    const auto at = gathered.begin() + static_cast<std::ptrdiff_t>(s) * n;
    out.values.insert(out.values.end(), at, at + (off[s + 1] - off[s]));
  }
  return out;
}

// Index sets of equal size as a dense [rows, k] output.
inline void put_dense(kc::outputs& out, const std::string& name, const std::vector<i32>& offsets,
               const std::vector<i32>& values) {
  const auto rows = static_cast<std::int64_t>(offsets.size()) - 1;
  const std::int64_t k = rows > 0 ? offsets[1] - offsets[0] : 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (offsets[r + 1] - offsets[r] != k) {
      throw kc::runner_error(name + ": rows keep different counts");
    }
  }
  out.put_i32(name, {rows, k}, values);
}

inline void put_csr(kc::outputs& out, const std::string& name, const kvsift::index_sets& sets) {
  out.put_i32(name, {static_cast<std::int64_t>(sets.values.size())}, sets.values);
  out.put_i32(name + "_offsets", {static_cast<std::int64_t>(sets.offsets.size())}, sets.offsets);
}

// ---- SnapKV / PyramidKV: window_attention_scores ------------------------------------------------

inline kt::window_score_params window_params(const kc::case_data& c, int kernel) {
  return {.kernel = kernel,
          .pool = kvsift::parse_pooling(c.param_s("pooling")),
          .gqa = kvsift::parse_gqa_reduce(c.param_s("gqa"))};
}

// Window scores of `requests` x kv_heads packed segments of n keys each; queries
// [requests, w, kv_heads * group, d]; every request's window ends at token n - 1.
inline dvec<float> window_scores(const std::vector<float>& keys, const std::vector<float>& queries,
                          int requests, int kv_heads, int group, int n, int w, int d,
                          kt::window_score_params p) {
  const auto exec = ::thrust::device;
  const int S = requests * kv_heads;
  const dvec<float> k = to_device(keys);
  const dvec<float> q = to_device(queries);
  const dvec<i32> offsets = to_device(uniform_offsets(S, n));
  const dvec<i32> first = to_device(std::vector<i32>(static_cast<std::size_t>(requests), n - w));
  const kt::segmented_rows<float> rows{raw(k), raw(offsets), nullptr, 0, S, d};
  const kt::window_queries wq{raw(q), raw(first), w, kv_heads, group};
  const std::int64_t N = static_cast<std::int64_t>(S) * n;
  dvec<float> scores(static_cast<std::size_t>(N));
  dvec<unsigned char> ws(kt::window_attention_workspace_bytes(N, S, group, w));
  kt::window_attention_scores(exec, rows, wq, N, p, raw(scores), raw(ws), ws.size());
  return scores;
}

}  // namespace kvsift::conformance::thrust_kinds
