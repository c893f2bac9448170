// SPDX-License-Identifier: Apache-2.0
#pragma once

// Strided views over an engine's KV memory, without copying. A view is a POD: pointer,
// extents, strides, and for paged layouts a CSR page table (FlashInfer's form). The layout is
// a policy type, the memory space a tag; channels are always contiguous (stride 1).

#include <kvsift/core/config.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/core/memory_space.hpp>

#include <cstdint>
#include <type_traits>

namespace kvsift {

struct nhd {};        // [tokens, heads, d]
struct hnd {};        // [heads, tokens, d]
struct paged_nhd {};  // [pages, page_size, heads, d]
struct paged_hnd {};  // [pages, heads, page_size, d]

// Dense view of one request's tokens x heads x channels.
template <class T, class Layout = nhd, MemorySpace Space = host_space>
  requires Element<std::remove_const_t<T>> &&
           (std::is_same_v<Layout, nhd> || std::is_same_v<Layout, hnd>)
struct kv_view {
  using element_type = T;
  using layout = Layout;
  using memory_space = Space;

  T* data = nullptr;               // base of the [tokens, heads, d] (nhd) or [heads, tokens, d] (hnd) array
  int tokens = 0;
  int heads = 0;
  int dim = 0;
  std::int64_t token_stride = 0;   // elements between consecutive tokens of one head
  std::int64_t head_stride = 0;    // elements between consecutive heads of one token

  // A contiguous array in this layout.
  static constexpr kv_view contiguous(T* data, int tokens, int heads, int dim) {
    if constexpr (std::is_same_v<Layout, nhd>) {
      return {data, tokens, heads, dim, static_cast<std::int64_t>(heads) * dim, dim};
    } else {
      return {data, tokens, heads, dim, dim, static_cast<std::int64_t>(tokens) * dim};
    }
  }

  KVSIFT_HOST_DEVICE T* row(int token, int head) const {
    return data + token * token_stride + head * head_stride;
  }

  // Read-only view of the same memory.
  constexpr operator kv_view<const T, Layout, Space>() const
    requires(!std::is_const_v<T>)
  {
    return {data, tokens, heads, dim, token_stride, head_stride};
  }

  // Tokens [first, first + count) of this view.
  [[nodiscard]] constexpr kv_view slice(int first, int count) const {
    return {data + first * token_stride, count, heads, dim, token_stride, head_stride};
  }

  void validate(std::string_view where, std::string_view arg, int expect_heads,
                int expect_dim) const {
    // rows of d channels must not overlap each other
    const bool rows_disjoint = (heads <= 1 || head_stride >= dim) &&
                               (tokens <= 1 || token_stride >= dim) &&
                               (heads <= 1 || tokens <= 1 || head_stride != token_stride);
    if (tokens >= 0 && heads == expect_heads && dim == expect_dim &&
        (tokens == 0 || data != nullptr) && token_stride >= 0 && head_stride >= 0 &&
        rows_disjoint) [[likely]] {
      return;  // the common case builds no message (decode validates a view per token)
    }
    require(tokens >= 0, where, std::string(arg) + ".tokens", tokens, ">= 0");
    require(heads == expect_heads, where, std::string(arg) + ".heads", heads,
            std::to_string(expect_heads));
    require(dim == expect_dim, where, std::string(arg) + ".dim", dim, std::to_string(expect_dim));
    require(tokens == 0 || data != nullptr, where, std::string(arg) + ".data", "null",
            "a pointer to the view's memory");
    require(token_stride >= 0 && head_stride >= 0, where, std::string(arg) + ".strides",
            std::to_string(token_stride) + "," + std::to_string(head_stride), "non-negative strides");
    require(rows_disjoint, where, std::string(arg) + ".strides",
            std::to_string(token_stride) + "," + std::to_string(head_stride),
            "strides that keep every (token, head) row of dim " + std::to_string(dim) + " disjoint");
  }
};

// The keys and values of one append: each [tokens, heads, dim] (validate above), the same tokens
// (the checks every store's append starts with, host and device stores alike).
template <class T, class Layout, MemorySpace Space>
void validate_kv_pair(std::string_view where, const kv_view<T, Layout, Space>& k,
                      const kv_view<T, Layout, Space>& v, int heads, int dim) {
  k.validate(where, "k", heads, dim);
  v.validate(where, "v", heads, dim);
  require(v.tokens == k.tokens, where, "v.tokens", v.tokens,
          [&] { return "k.tokens (" + std::to_string(k.tokens) + ")"; });
}

// Paged view of one layer for a batch of requests: pages of `page_size` tokens, addressed by a
// FlashInfer-style CSR page table. Token t of request r lives in page
// indices[indptr[r] + t / page_size] at slot t % page_size.
template <class T, class Layout = paged_nhd, MemorySpace Space = host_space>
  requires Element<std::remove_const_t<T>> &&
           (std::is_same_v<Layout, paged_nhd> || std::is_same_v<Layout, paged_hnd>)
struct paged_kv_view {
  using element_type = T;
  using layout = Layout;
  using memory_space = Space;

  T* data = nullptr;                      // [pages, page_size, heads, d] or [pages, heads, page_size, d]
  int pages = 0;
  int page_size = 0;
  int heads = 0;
  int dim = 0;
  int requests = 0;
  const std::int32_t* indptr = nullptr;         // [requests + 1] CSR offsets into indices
  const std::int32_t* indices = nullptr;        // [indptr[requests]] page ids
  const std::int32_t* last_page_len = nullptr;  // [requests] tokens in each request's last page

  [[nodiscard]] KVSIFT_HOST_DEVICE int length(int request) const {
    const int np = indptr[request + 1] - indptr[request];
    return np == 0 ? 0 : (np - 1) * page_size + last_page_len[request];
  }

  KVSIFT_HOST_DEVICE T* row(int request, int token, int head) const {
    const std::int64_t page = indices[indptr[request] + token / page_size];
    const int slot = token % page_size;
    if constexpr (std::is_same_v<Layout, paged_nhd>) {
      return data + ((page * page_size + slot) * heads + head) * dim;
    } else {
      return data + ((page * heads + head) * page_size + slot) * dim;
    }
  }

  void validate(std::string_view where, std::string_view arg, int expect_heads,
                int expect_dim) const {
    const std::string a(arg);
    require(page_size > 0, where, a + ".page_size", page_size, "> 0");
    require(heads == expect_heads, where, a + ".heads", heads, std::to_string(expect_heads));
    require(dim == expect_dim, where, a + ".dim", dim, std::to_string(expect_dim));
    require(requests >= 0, where, a + ".requests", requests, ">= 0");
    require(indptr != nullptr && (requests == 0 || (indices != nullptr && last_page_len != nullptr)),
            where, a + ".page_table", "null", "indptr, indices and last_page_len pointers");
    for (int r = 0; r < requests; ++r) {
      const int np = indptr[r + 1] - indptr[r];
      require(np >= 0, where, a + ".indptr[" + std::to_string(r + 1) + "]", indptr[r + 1],
              ">= indptr[" + std::to_string(r) + "] (" + std::to_string(indptr[r]) + ")");
      require(np == 0 || (last_page_len[r] >= 1 && last_page_len[r] <= page_size), where,
              a + ".last_page_len[" + std::to_string(r) + "]", last_page_len[r],
              "in [1, page_size=" + std::to_string(page_size) + "]");
      for (int i = indptr[r]; i < indptr[r + 1]; ++i) {
        require(indices[i] >= 0 && indices[i] < pages, where,
                a + ".indices[" + std::to_string(i) + "]", indices[i],
                "a page id in [0, " + std::to_string(pages) + ")");
      }
    }
  }
};

}  // namespace kvsift
