// SPDX-License-Identifier: Apache-2.0
// Everything observable about a store's contents, for "unchanged after an error" checks: each
// head-sequence's length, then per slot its position and key and value rows, then every (request,
// layer)'s next position. Doubles, so int32 positions near INT32_MAX compare exactly.
#pragma once

#include <kvsift/core/element.hpp>

#include <cstdint>
#include <vector>

namespace kvsift_test {

template <class Store>
std::vector<double> contents(const Store& s) {
  std::vector<double> out;
  const auto& sh = s.shape();
  for (std::int64_t seq = 0; seq < s.requests() * sh.sequences_per_request(); ++seq) {
    out.push_back(s.length(seq));
    for (int i = 0; i < s.length(seq); ++i) {
      out.push_back(s.position(seq, i));
      for (int c = 0; c < sh.head_dim; ++c) out.push_back(kvsift::to_float(s.key(seq, i)[c]));
      for (int c = 0; c < sh.head_dim; ++c) out.push_back(kvsift::to_float(s.value(seq, i)[c]));
    }
  }
  for (int r = 0; r < s.requests(); ++r)
    for (int l = 0; l < sh.layers; ++l) out.push_back(s.next_position(r, l));
  return out;
}

}  // namespace kvsift_test
