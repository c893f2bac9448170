// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a scorer's Thrust round is handed (device/evict.hpp): the rows of one (request, layer) of
// a device store, its kv_heads head-sequences as segments with a local CSR, and the queries the
// scorer reads (the device query history's rows). Each scorer's round lives beside its Thrust
// algorithm, in the file of the same name (thrust/recency.hpp, thrust/window_attention.hpp,
// thrust/cumulative_attention.hpp):
//
//   std::size_t score_round_workspace_bytes(const Scorer&, const round_shape&);
//   void score_round(policy, const Scorer&, const round_input<T>&, float* out, void* ws, bytes);
//
// out[keys.offsets[h] + j] is the score of slot j of KV head h, as the CPU scorer's segment h.

#include <kvsift/core/element.hpp>
#include <kvsift/thrust/common.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace kvsift::thrust {

// The largest round a workspace is sized for (allocated once, at the state's construction).
struct round_shape {
  std::int64_t num_items = 0;  // tokens in all (kv_heads * capacity)
  int segments = 0;            // kv_heads
  int group = 1;               // query heads per KV head
  int queries = 0;             // the most buffered queries a round reads
  int dim = 1;                 // head_dim
};

template <class T>
struct round_input {
  segmented_rows<T> keys;        // kv_heads segments of one (request, layer), local CSR
  segmented_rows<T> values;      // the same layout
  std::int64_t num_items = 0;    // host copy of keys.offsets[kv_heads]
  const float* queries = nullptr;           // [num_queries, q_heads, d], oldest first
  const std::int32_t* query_first = nullptr;  // [1] original position of query 0
  int num_queries = 0;
  int kv_heads = 1;
  int group = 1;
  // [kv_heads] first unfrozen slot of each head, min(max(frozen prefix, sink), n): what a
  // freezing selector (LagKV's partition_topk) has finalised; null for the others
  const std::int32_t* base = nullptr;
};

// A scorer with a Thrust round (what the device evict schedule runs).
template <class Sc, class T, class Policy>
concept ThrustScorer = requires(const Sc& sc, const round_shape& r, const round_input<T>& in,
                                const Policy& p, float* out, void* ws) {
  { score_round_workspace_bytes(sc, r) } -> std::convertible_to<std::size_t>;
  score_round(p, sc, in, out, ws, std::size_t{0});
};

}  // namespace kvsift::thrust
