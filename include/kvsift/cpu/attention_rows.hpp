// SPDX-License-Identifier: Apache-2.0
#pragma once

// Attention probabilities of one query over one head-sequence of a store, recomputed from the
// stored keys (no engine kernel exposes them). Causal by original position.

#include <kvsift/cpu/exact_softmax.hpp>
#include <kvsift/cpu/group_dots.hpp>
#include <kvsift/cpu/math.hpp>

#include <cmath>
#include <cstdint>
#include <span>

namespace kvsift::cpu {

// Number of leading slots of `seq` whose original position is <= pos (positions ascend).
template <class Store>
int visible_slots(const Store& store, std::int64_t seq, std::int32_t pos) {
  int lo = 0;
  int hi = store.length(seq);
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (store.position(seq, mid) <= pos) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// probs[0, v) = softmax(q . k / sqrt(d)) over the first v slots, v = visible_slots(pos);
// returns v. `probs` must hold store.length(seq) floats.
template <class Store>
int attention_row(const Store& store, std::int64_t seq, const float* q, std::int32_t pos,
                  std::span<float> probs) {
  const int d = store.shape().head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int v = visible_slots(store, seq, pos);
  for (int j = 0; j < v; ++j) {
    probs[j] = dot(q, store.key(seq, j), d) * scale;
  }
  softmax(probs.first(static_cast<std::size_t>(v)));
  return v;
}

// probs[i] over an explicit ascending slot list (e.g. a decode plan).
template <class Store>
void attention_row_over(const Store& store, std::int64_t seq, const float* q,
                        std::span<const std::int32_t> slots, std::span<float> probs) {
  const int d = store.shape().head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::size_t i = 0; i < slots.size(); ++i) {
    probs[i] = dot(q, store.key(seq, slots[i]), d) * scale;
  }
  softmax(probs.first(slots.size()));
}

// The rows of G query heads (q [G, d]) over m keys, key(i) a pointer to key row i's d elements:
// probs[g * m + i] = softmax over i of scale * q_g . key(i), in attention_row_over's arithmetic
// bit for bit (cpu::group_dots), each key row read once for the group. `probs` holds G * m floats.
template <Element T, class KeyAt>
void attention_rows_at(KeyAt&& key, std::size_t m, int d, const float* q, int G,
                       std::span<float> probs) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  group_dots_rows<T>(q, G, d, m, key, probs.data(), m);
  for (float& x : probs.first(static_cast<std::size_t>(G) * m)) x *= scale;
  softmax_rows(probs.data(), G, m, m);
}

// The rows of G query heads (q [G, d]) over the same slot list: probs[g * m + i] equals
// attention_row_over's probs[i] for head g, bit for bit, with each key row read once for the
// group instead of once per head. `probs` holds G * slots.size() floats.
template <class Store>
void attention_rows_over(const Store& store, std::int64_t seq, const float* q, int G,
                         std::span<const std::int32_t> slots, std::span<float> probs) {
  attention_rows_at<typename Store::element_type>(
      [&](std::size_t i) { return store.key(seq, slots[i]); }, slots.size(),
      store.shape().head_dim, q, G, probs);
}

}  // namespace kvsift::cpu
