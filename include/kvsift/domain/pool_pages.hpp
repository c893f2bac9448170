// SPDX-License-Identifier: Apache-2.0
#pragma once

// kvsift::domain::pool_pages — FreeKV's candidate domain: every page of a tiered store's host
// pool, resident or not, on the page layout one token ahead of the pool (the layout the next
// step reads). It is the host pool seen as a store (length = tokens in the pool), so a page
// scorer's digests cover every token, plus the positions of a set of its pages.
// Cost: O(1) per accessor; page_positions O(tokens of the pages).

#include <kvsift/core/shape.hpp>
#include <kvsift/store/tiered.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace kvsift::domain {

template <Element T>
struct pool_pages {
  using element_type = T;
  const store::tiered<T>* st = nullptr;

  [[nodiscard]] const model_shape& shape() const { return st->shape(); }
  [[nodiscard]] int length(std::int64_t seq) const {
    const auto [r, l] = st->request_layer(seq);
    return st->host_length(r, l);
  }
  [[nodiscard]] std::int32_t position(std::int64_t seq, int i) const {
    const auto [r, l] = st->request_layer(seq);
    return st->host_position(r, l, i);
  }
  [[nodiscard]] const T* key(std::int64_t seq, int i) const { return st->host_key(seq, i); }

  // The layout the next step's selection is made on: the pool's tokens plus the next one.
  [[nodiscard]] int tokens_ahead(int request, int layer) const {
    return st->host_length(request, layer) + 1;
  }
  // Positions of the tokens of `pages` (pages of `page_size` tokens from index 0) in the pool of
  // (request, layer), ascending when the pages are; pages past the pool give what exists.
  [[nodiscard]] std::vector<std::int32_t> page_positions(int request, int layer, int page_size,
                                                         std::span<const std::int32_t> pages) const {
    const int n = st->host_length(request, layer);
    std::vector<std::int32_t> out;
    for (const auto pg : pages) {
      for (int i = pg * page_size; i < std::min(n, (pg + 1) * page_size); ++i) {
        out.push_back(st->host_position(request, layer, i));
      }
    }
    return out;
  }
};

}  // namespace kvsift::domain
