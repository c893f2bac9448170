// SPDX-License-Identifier: Apache-2.0
#pragma once

// Helpers shared by the Thrust backend's hand-composed conformance handlers (kinds_thrust*.cpp):
// host <-> device copies, the layout shuffles between the vectors' [heads, tokens, d] tensors
// and the backend's ragged batches, device_topk (thrust::segmented_topk with a protected sink /
// window), gather_kept (thrust::gather_rows of the kept rows, whose gathered positions are
// budget.dynamickv's output) and window scores (score.snapkv). Host code only; every array the
// algorithms read or write is a thrust::device_vector. The one-tier method kinds use none of
// this: they run the library's methods on the device (device_backend.hpp).

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
