// SPDX-License-Identifier: Apache-2.0
#pragma once

// Recency scores (StreamingLLM) with Thrust. Mirrors score::recency: the score of a token is its
// original position as a float, so a top-k keeps the newest tokens; with the sink protected
// (thrust::segmented_topk's topk_protection) that is StreamingLLM's sink + recent window.
// One thread per token; no workspace. Cost O(N).

#include <kvsift/thrust/common.hpp>

#include <kvsift/score/simple.hpp>
#include <kvsift/thrust/round.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvsift::thrust {

namespace detail {

struct recency_fn {
  const std::int32_t* offsets;
  const std::int32_t* positions;
  int num_segments;
  float* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    if (positions != nullptr) {
      out[e] = static_cast<float>(positions[e]);
      return;
    }
    const int s = segment_of(offsets, num_segments, e);
    out[e] = static_cast<float>(e - offsets[s]);
  }
};

}  // namespace detail

// out[e] = float(position of token e) over num_items tokens in CSR `offsets` ([num_segments + 1]).
//   positions  [num_items] original positions (packed like the scores), or null: token j of its
//              segment is at position j (a store that has not been compacted).
template <class Policy>
void recency_scores(const Policy& exec, const std::int32_t* offsets, const std::int32_t* positions,
                    int num_segments, std::int64_t num_items, float* out) {
  constexpr std::string_view where = "thrust::recency_scores";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(num_items >= 0, where, "num_items", num_items, ">= 0");
  require(num_items == 0 || positions != nullptr || offsets != nullptr, where, "offsets", "null",
          "[num_segments + 1] CSR offsets (or positions)");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_items,
                       detail::recency_fn{offsets, positions, num_segments, out});
}

// score::recency's round over one (request, layer) of a device store (device/evict.hpp): the
// slot index, which orders the tokens as their positions do (positions ascend within a head).
inline std::size_t score_round_workspace_bytes(const score::recency&, const round_shape&) {
  return 0;
}
template <class Policy, Element T>
void score_round(const Policy& exec, const score::recency&, const round_input<T>& in, float* out,
                 void*, std::size_t) {
  recency_scores(exec, in.keys.offsets, nullptr, in.keys.num_segments, in.num_items, out);
}

}  // namespace kvsift::thrust
