// SPDX-License-Identifier: Apache-2.0
#pragma once

// Optional RoPE re-rotation (DESIGN §7.5). kvsift keeps every token's original position, so
// engines that attend with original positions need nothing. Engines that want a compacted cache
// to look contiguous (token i at position i) re-rotate the stored keys: a key rotated for
// position p becomes the key rotated for position p' by one more rotation of angle
// (p' - p) * inv_freq per channel pair. Computed in double; the value is stored back in the
// store's element type.

#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>

#include <cmath>
#include <cstdint>

namespace kvsift {

// How a model lays out its rotary pairs.
enum class rope_layout {
  rotate_half,  // Hugging Face Llama: pairs (c, c + rotary_dim / 2)
  interleaved   // GPT-J / Meta reference: pairs (2c, 2c + 1)
};

struct rope_params {
  double theta = 10000.0;
  int rotary_dim = 0;  // channels rotated (the first rotary_dim); 0 = all of head_dim
  rope_layout layout = rope_layout::rotate_half;
};

// Re-rotates one key row of `head_dim` channels from `from_position` to `to_position`, in place.
template <Element T>
void rerotate_key(T* key, int head_dim, std::int32_t from_position, std::int32_t to_position,
                  const rope_params& p) {
  const int rd = p.rotary_dim == 0 ? head_dim : p.rotary_dim;
  require(rd > 0 && rd % 2 == 0 && rd <= head_dim, "rerotate_key", "rotary_dim", rd,
          "an even number in [2, head_dim=" + std::to_string(head_dim) + "]");
  require(p.theta > 0.0, "rerotate_key", "theta", p.theta, "> 0");
  const double delta = static_cast<double>(to_position) - static_cast<double>(from_position);
  if (delta == 0.0) return;
  const int half = rd / 2;
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(p.theta, -2.0 * i / rd);
    const double angle = delta * inv_freq;
    const double c = std::cos(angle);
    const double s = std::sin(angle);
    const int a = p.layout == rope_layout::rotate_half ? i : 2 * i;
    const int b = p.layout == rope_layout::rotate_half ? i + half : 2 * i + 1;
    const double x = to_float(key[a]);
    const double y = to_float(key[b]);
    key[a] = from_float<T>(static_cast<float>(x * c - y * s));
    key[b] = from_float<T>(static_cast<float>(x * s + y * c));
  }
}

// Re-rotates every resident key of (request, layer) so that slot j sits at position first + j:
// the compacted cache then reads as a contiguous one. The store's original positions are not
// changed (they remain the tokens' identities); returns the position the next token should take.
template <class Store>
std::int32_t rerotate_contiguous(Store& store, int request, int layer, const rope_params& p,
                                 std::int32_t first = 0) {
  const auto& sh = store.shape();
  int longest = 0;
  for (int h = 0; h < sh.kv_heads; ++h) {
    const auto seq = sh.sequence(request, layer, h);
    const int n = store.length(seq);
    longest = n > longest ? n : longest;
    for (int j = 0; j < n; ++j) {
      rerotate_key(store.mutable_key(seq, j), sh.head_dim, store.position(seq, j), first + j, p);
    }
  }
  return first + longest;
}

}  // namespace kvsift
