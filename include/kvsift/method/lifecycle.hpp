// SPDX-License-Identifier: Apache-2.0
#pragma once

// The types of the method lifecycle (method/method.hpp): what an engine hands to prefill() and
// decode(), the attention plan decode() returns, the stats and the capabilities a composition
// promises. Apart so that other lifecycles (store::tiered's) share them without the template.

#include <kvsift/core/element.hpp>
#include <kvsift/core/segments.hpp>
#include <kvsift/core/view.hpp>

#include <kvsift/core/error.hpp>
#include <kvsift/core/shape.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
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

// One request's prompt chunk for one layer. Its views are host memory for a method on
// exec::host, and the exec's memory for a device exec (method<...>::chunk_type).
template <Element T, MemorySpace Space = host_space>
struct prefill_chunk {
  int request = 0;
  kv_view<const T, nhd, Space> keys;    // [tokens, kv_heads, d] (keys after RoPE)
  kv_view<const T, nhd, Space> values;  // [tokens, kv_heads, d]
  // [nq, q_heads, d]: the queries of the chunk's LAST nq tokens (0 <= nq <= tokens), or empty
  // when the scorer needs none. Engines usually keep only the observation window, so a chunk may
  // carry just its newest queries (query i sits at position first_position + tokens - nq + i).
  // A scorer that reads every prompt query (H2O, query_window() < 0) needs nq == tokens; one
  // reading the newest w queries needs, on the `last` chunk, min(w, prompt tokens) queries that
  // end at the prompt's last token (this chunk's, continued by earlier chunks' when contiguous).
  kv_view<const float, nhd, Space> queries;
  std::int32_t first_position = 0;   // original position of the chunk's first token
  bool last = true;                  // the prompt ends with this chunk
};

// One request's decode token for one layer: host arrays for a method on exec::host, the exec's
// memory for a device exec.
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
  // A two-tier method under far_tier::attend: [R * kv_heads] positions of the host pool that the
  // step also reads where they lie (not resident, never recalled; attention/far_tier.hpp attends
  // them and merges by log-sum-exp). Empty otherwise: `slots` is everything the step reads.
  index_sets far;
};

// Where a two-tier method (SyncKV, HeteroCache, FreeKV) reads the host-pool rows a step needs
// that are not resident:
//   recall  copies them into the resident tier (a recall, counted in bytes_transferred) and
//           attends the resident tier only (the papers' behaviour, the default);
//   attend  leaves them in the host pool and attends them there (attention_plan::far), merging
//           the two partial attentions by log-sum-exp; nothing is recalled. Same rows, same
//           output up to rounding; what moves is compute, not bytes.
// Over a device exec (device/two_tier.hpp) attend places the far positions in far slots of the
// device tier, which hold no bytes (the plan lists them; thrust::working_rows reads them in the
// pool), and the step attends them there and merges the same way.
enum class far_tier { recall, attend };

[[nodiscard]] inline std::string_view to_string(far_tier f) {
  return f == far_tier::attend ? "attend" : "recall";
}

namespace detail {
// A recipe's far-tier policy: its params' `far` (SyncKV, HeteroCache, FreeKV), recall when its
// params have none.
template <class Params>
[[nodiscard]] far_tier far_policy_of(const Params& p) {
  if constexpr (requires { { p.far } -> std::convertible_to<far_tier>; }) {
    return p.far;
  } else {
    return far_tier::recall;
  }
}
}  // namespace detail

// Non-finite activations are rejected at the lifecycle boundary (prefill, decode), before
// anything is appended: a NaN or infinite key, value or query makes every score and attention
// output that reads it NaN, and selections over NaN are no selection (select::topk and the other
// selectors reject NaN scores too, but by then the token would be in the store). One pass over
// what the call hands over, the same order as copying it.
namespace detail {
template <class T>
void require_finite_row(std::string_view where, std::string_view arg, const T* row, int n) {
  if (all_finite(row, n)) [[likely]] return;
  for (int j = 0; j < n; ++j) {  // name the first one
    const float x = to_float(row[j]);
    if (!std::isfinite(x)) {
      throw make_error(where, std::string(arg) + "[" + std::to_string(j) + "]", x,
                       "a finite number (NaN/Inf activations poison every score that reads them)");
    }
  }
}
template <class V>
void require_finite_view(std::string_view where, std::string_view arg, const V& v) {
  for (int t = 0; t < v.tokens; ++t) {
    for (int h = 0; h < v.heads; ++h) {
      const auto* row = v.row(t, h);
      if (all_finite(row, v.dim)) [[likely]] continue;
      for (int j = 0; j < v.dim; ++j) {
        const float x = to_float(row[j]);
        if (!std::isfinite(x)) [[unlikely]] {
          throw make_error(where,
                           std::string(arg) + "[" + std::to_string(t) + "][" + std::to_string(h) +
                               "][" + std::to_string(j) + "]",
                           x, "a finite number (NaN/Inf activations poison every score that reads them)");
        }
      }
    }
  }
}
}  // namespace detail

// A prefill chunk's keys, values and, with `queries` (a scorer that reads them; their view
// validated), its queries are finite. Call after the views are validated.
template <Element T>
void require_finite(std::string_view where, const prefill_chunk<T>& c, bool queries) {
  detail::require_finite_view(where, "keys", c.keys);
  detail::require_finite_view(where, "values", c.values);
  if (queries && c.queries.tokens > 0) detail::require_finite_view(where, "queries", c.queries);
}
// tokens[i]'s key, value and, with `query` (a scorer that reads it), query are finite; null
// pointers are skipped (the caller checks those).
template <Element T>
void require_finite(std::string_view where, std::size_t i, const decode_token<T>& t,
                    const model_shape& sh, bool query) {
  const auto arg = [&](const char* what) { return "tokens[" + std::to_string(i) + "]." + what; };
  const int kv = sh.kv_heads * sh.head_dim;
  if (t.key != nullptr) detail::require_finite_row(where, arg("key"), t.key, kv);
  if (t.value != nullptr) detail::require_finite_row(where, arg("value"), t.value, kv);
  if (query && t.query != nullptr) detail::require_finite_row(where, arg("query"), t.query, sh.q_heads * sh.head_dim);
}

// Binds attend() and after_attention() to the step the last decode() planned: the same layer,
// the same requests in the same order, a query each where one is needed, and after_attention()
// once (the step's plan is spent afterwards). Every method owns one: decode() unbinds first and
// binds when it returned its plan; after_attention() and reset() unbind.
class step_binding {
 public:
  void bind(int layer) { layer_ = layer; }
  void unbind() { layer_ = -1; }
  [[nodiscard]] bool bound() const { return layer_ >= 0; }

  // Throws kvsift::error unless `tokens` is the bound step of `layer` (the planned `requests`).
  template <Element T>
  void check(std::string_view where, int layer, std::span<const decode_token<T>> tokens,
             const std::vector<int>& requests, bool needs_query) const {
    require(layer_ >= 0 && layer == layer_, where, "layer", layer, [&] {
      return layer_ < 0 ? std::string("the layer of a decode() not yet applied (none is pending: call "
                                      "decode() first, once per step)")
                        : "the layer of the last decode() (" + std::to_string(layer_) + ")";
    });
    require(tokens.size() == requests.size(), where, "tokens.size", tokens.size(), [&] {
      return "the last decode()'s batch size (" + std::to_string(requests.size()) + ")";
    });
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      require(tokens[i].request == requests[i], where,
              [&] { return "tokens[" + std::to_string(i) + "].request"; }, tokens[i].request,
              [&] { return "request " + std::to_string(requests[i]) + ", as in the last decode()"; });
      require(!needs_query || tokens[i].query != nullptr, where,
              [&] { return "tokens[" + std::to_string(i) + "].query"; }, "null",
              [] { return std::string("a [q_heads, d] array"); });
    }
  }

 private:
  int layer_ = -1;  // layer of the pending step (decode() done, after_attention() not yet)
};

// Throws kvsift::error when a request appears twice in one decode batch (one token per request
// and step: a second token would be planned to read the first before either was attended).
// `requests` is the store's request count (request ids were checked against it).
template <Element T>
void require_distinct_requests(std::string_view where, std::span<const decode_token<T>> tokens,
                               int requests) {
  std::vector<int> first(static_cast<std::size_t>(requests), -1);  // token index of each request
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    int& f = first[static_cast<std::size_t>(tokens[i].request)];
    require(f < 0, where, [&] { return "tokens[" + std::to_string(i) + "].request"; }, tokens[i].request,
            [&] { return "a request not already in this step (tokens[" + std::to_string(f) +
                         "]): one token per request in a step"; });
    f = static_cast<int>(i);
  }
}

// What the shell checked of a prefill call, for the schedule: per request, the tokens its
// chunks add and whether one of them ends its prompt.
struct prefill_totals {
  std::vector<int> added;           // [requests]
  std::vector<std::int32_t> next;   // [requests] position after the request's chunks, -1 if none
  std::vector<char> ended;          // [requests] its `last` chunk was seen
  // [requests] the newest contiguous queries buffered after the call's chunks so far, as the
  // query history will hold them (-1 before the request's first chunk), ending at query_end
  std::vector<int> query_rows;
  std::vector<std::int32_t> query_end;
  int pool_pages = 0;               // pages a paged pool must find for the call so far
};

struct method_stats {
  std::int64_t resident_bytes = 0;     // key + value bytes resident in the store's space
  std::int64_t resident_tokens = 0;    // tokens resident, summed over head-sequences
  std::int64_t bytes_transferred = 0;  // bytes recalls copied into the resident tier (installed)
  std::int64_t refreshes = 0;          // compression / selection rounds run
  std::int64_t stalls = 0;             // waits for a transfer inside a step
  std::vector<int> layer_budgets;      // [layers] last budget (tokens) applied per layer, -1 if none
  std::int64_t far_rows = 0;           // host-pool rows attended where they lie (far_tier::attend),
                                       // summed over the steps' plans
  std::int64_t far_overlaps = 0;       // steps (layer attentions) whose host part of attend
                                       // began before their device part ended, on another
                                       // thread (device_two_tier on exec::sim; else 0)
  std::int64_t pages = -1;             // pages a paged store holds now (-1: the store is not paged)
  int page_size = 0;                   // its tokens per page (0: not paged)
};

}  // namespace kvsift
