// SPDX-License-Identifier: Apache-2.0
#pragma once

// The types of the method lifecycle (method/method.hpp): what an engine hands to prefill() and
// decode(), the attention plan decode() returns, the stats and the capabilities a composition
// promises. Apart so that other lifecycles (store::tiered's) share them without the template.

#include <kvsift/core/element.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/core/view.hpp>

#include <cstdint>
#include <vector>

namespace kvsift {

// What a composition can promise an engine (DESIGN §7.2), as constexpr flags.
struct capabilities {
  bool changes_physical_length = false;  // kept sets compact the store (memory is reclaimed)
  bool safe_with_shared_prefix = true;   // never mutates a block another request shares
  bool needs_queries = false;            // prefill/decode must hand over queries
  bool cuda_graph_safe = false;          // decode path capturable in a CUDA graph
  bool speculative_decoding = false;     // decode steps may be rolled back
};

// One request's prompt chunk for one layer.
template <Element T>
struct prefill_chunk {
  int request = 0;
  kv_view<const T, nhd> keys;        // [tokens, kv_heads, d] (keys after RoPE)
  kv_view<const T, nhd> values;      // [tokens, kv_heads, d]
  // [nq, q_heads, d]: the queries of the chunk's LAST nq tokens (0 <= nq <= tokens), or empty
  // when the scorer needs none. Engines usually keep only the observation window, so a chunk may
  // carry just its newest queries (query i sits at position first_position + tokens - nq + i).
  // A scorer that reads every prompt query (H2O, query_window() < 0) needs nq == tokens; one
  // reading the newest w queries needs, on the `last` chunk, min(w, prompt tokens) queries that
  // end at the prompt's last token (this chunk's, continued by earlier chunks' when contiguous).
  kv_view<const float, nhd> queries;
  std::int32_t first_position = 0;   // original position of the chunk's first token
  bool last = true;                  // the prompt ends with this chunk
};

// One request's decode token for one layer.
template <Element T>
struct decode_token {
  int request = 0;
  const float* query = nullptr;  // [q_heads, d]
  const T* key = nullptr;        // [kv_heads, d]
  const T* value = nullptr;      // [kv_heads, d]
};

// The attention plan of one decode step for a ragged batch: segment r * kv_heads + h holds what
// KV head h of the r-th request of the batch reads, ascending.
struct attention_plan {
  std::vector<int> requests;  // [R] the batch, in call order
  index_sets slots;           // [R * kv_heads] store slots to read
  index_sets positions;       // [R * kv_heads] their original positions
  index_sets pages;           // page-level methods: [R * kv_heads] selected pages (every page in
                              // a dense layer); empty otherwise
};

struct method_stats {
  std::int64_t resident_bytes = 0;     // key + value bytes resident in the store's space
  std::int64_t resident_tokens = 0;    // tokens resident, summed over head-sequences
  std::int64_t bytes_transferred = 0;  // bytes the Transfer moved
  std::int64_t refreshes = 0;          // compression / selection rounds run
  std::int64_t stalls = 0;             // waits for a transfer inside a step
  std::vector<int> layer_budgets;      // [layers] last budget (tokens) applied per layer, -1 if none
};

}  // namespace kvsift
