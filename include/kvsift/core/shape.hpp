// SPDX-License-Identifier: Apache-2.0
#pragma once

// The model shape a method is built for, and the indexing of head-sequences in a ragged batch.

#include <kvsift/core/error.hpp>

#include <cstdint>

namespace kvsift {

// Attention geometry of a model. GQA: query head h reads KV head h / group_size().
struct model_shape {
  int layers = 1;
  int q_heads = 1;
  int kv_heads = 1;
  int head_dim = 1;

  [[nodiscard]] constexpr int group_size() const { return q_heads / kv_heads; }

  // Throws kvsift::error unless every extent is positive and q_heads divides into kv_heads groups.
  void validate(std::string_view where) const {
    require(layers > 0, where, "shape.layers", layers, "> 0");
    require(kv_heads > 0, where, "shape.kv_heads", kv_heads, "> 0");
    require(head_dim > 0, where, "shape.head_dim", head_dim, "> 0");
    require(q_heads > 0 && q_heads % kv_heads == 0, where, "shape.q_heads", q_heads,
            "a positive multiple of kv_heads (" + std::to_string(kv_heads) + ")");
  }

  // Head-sequence id of (request, layer, kv head): request-major, then layer, then head.
  [[nodiscard]] constexpr std::int64_t sequence(int request, int layer, int head) const {
    return (static_cast<std::int64_t>(request) * layers + layer) * kv_heads + head;
  }
  [[nodiscard]] constexpr std::int64_t sequences_per_request() const {
    return static_cast<std::int64_t>(layers) * kv_heads;
  }
};

}  // namespace kvsift
