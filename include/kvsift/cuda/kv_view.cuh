// SPDX-License-Identifier: Apache-2.0
#pragma once

// Device-side views of an engine's KV memory, as the CUDA kernels read it. PODs passed to
// kernels by value. Every layout keeps the head_dim channels of one (token, head) contiguous;
// the views differ in how (request, head, token) maps to that row.
//
//   dense_kv   NHD [requests][capacity][heads][d] or HND [requests][heads][capacity][d]
//              (any strides: request, token and head strides are explicit)
//   paged_kv   FlashInfer CSR page table: pages [num_pages][page_size][heads][d] (paged_nhd)
//              or [num_pages][heads][page_size][d] (paged_hnd); request r owns the physical
//              pages indices[indptr[r] .. indptr[r+1]), its last one holding last_page_len[r].
//
// A head-sequence (segment) is s = r * num_kv_heads + h, the order every CSR index set uses.

#include <kvsift/core/config.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/cuda/error.cuh>

#include <concepts>
#include <cstdint>

namespace kvsift::cuda {

enum class kv_layout : std::int32_t { nhd, hnd };

template <Element T>
struct dense_kv {
  using element_type = T;
  const T* k = nullptr;               // keys, addressed by the strides below (elements)
  const T* v = nullptr;               // values, same strides as k
  const std::int32_t* seq_lens = nullptr;  // [num_requests] valid tokens per request
  std::int64_t request_stride = 0;    // between token 0 of requests r and r + 1
  std::int64_t token_stride = 0;      // between tokens t and t + 1 of one head
  std::int64_t head_stride = 0;       // between heads h and h + 1 of one token
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;

  // Row of `head_dim` channels of key (which = 0) or value (which = 1).
  KVSIFT_HOST_DEVICE const T* row(int which, std::int32_t r, std::int32_t h,
                                  std::int32_t t) const {
    return (which == 0 ? k : v) + r * request_stride + t * token_stride + h * head_stride;
  }
  KVSIFT_HOST_DEVICE std::int32_t seq_len(std::int32_t r) const { return seq_lens[r]; }
};

// NHD dense view of [requests][capacity][heads][d] buffers.
template <Element T>
[[nodiscard]] dense_kv<T> make_dense_nhd(const T* k, const T* v, const std::int32_t* seq_lens,
                                         std::int32_t capacity, std::int32_t heads,
                                         std::int32_t d) {
  return {k, v, seq_lens, std::int64_t{capacity} * heads * d, std::int64_t{heads} * d, d, heads,
          d};
}

// HND dense view of [requests][heads][capacity][d] buffers.
template <Element T>
[[nodiscard]] dense_kv<T> make_dense_hnd(const T* k, const T* v, const std::int32_t* seq_lens,
                                         std::int32_t capacity, std::int32_t heads,
                                         std::int32_t d) {
  return {k, v, seq_lens, std::int64_t{capacity} * heads * d, d, std::int64_t{capacity} * d,
          heads, d};
}

template <Element T>
struct paged_kv {
  using element_type = T;
  const T* k_pages = nullptr;              // [num_pages] pages of keys, layout below
  const T* v_pages = nullptr;              // [num_pages] pages of values, layout below
  const std::int32_t* indptr = nullptr;    // [num_requests + 1] CSR offsets into indices
  const std::int32_t* indices = nullptr;   // [indptr[num_requests]] physical page ids
  const std::int32_t* last_page_len = nullptr;  // [num_requests] tokens in the last page, >= 1
  std::int32_t page_size = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  kv_layout layout = kv_layout::nhd;       // paged_nhd or paged_hnd

  KVSIFT_HOST_DEVICE const T* row(int which, std::int32_t r, std::int32_t h,
                                  std::int32_t t) const {
    const std::int64_t page = indices[indptr[r] + t / page_size];
    const std::int64_t off = t % page_size;
    const std::int64_t e =
        layout == kv_layout::nhd
            ? ((page * page_size + off) * num_kv_heads + h) * head_dim
            : ((page * num_kv_heads + h) * page_size + off) * head_dim;
    return (which == 0 ? k_pages : v_pages) + e;
  }
  KVSIFT_HOST_DEVICE std::int32_t seq_len(std::int32_t r) const {
    const std::int32_t pages = indptr[r + 1] - indptr[r];
    return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[r];
  }
};

// A KV view the kernels accept: dense_kv<T> or paged_kv<T>.
template <class V>
concept KvView = requires(const V& view) {
  typename V::element_type;
  { view.row(0, 0, 0, 0) } -> std::same_as<const typename V::element_type*>;
  { view.seq_len(0) } -> std::same_as<std::int32_t>;
  { view.num_kv_heads } -> std::convertible_to<std::int32_t>;
  { view.head_dim } -> std::convertible_to<std::int32_t>;
};

// Token-level index set per segment (CSR): segment s reads tokens indices[offsets[s] ..
// offsets[s+1]), ascending, each < seq_len of its request.
struct token_set {
  const std::int32_t* offsets = nullptr;  // [num_segments + 1] CSR offsets
  const std::int32_t* indices = nullptr;  // [offsets[num_segments]] token indices
};

// Page-level set per segment (CSR): segment s reads the logical pages indices[offsets[s] ..
// offsets[s+1]) of its request, ascending; logical page p covers tokens
// [p * page_size, min((p + 1) * page_size, seq_len)). Quest and FreeKV plans.
struct page_set {
  const std::int32_t* offsets = nullptr;  // [num_segments + 1] CSR offsets
  const std::int32_t* indices = nullptr;  // [offsets[num_segments]] logical page numbers
  std::int32_t page_size = 0;             // tokens per logical page
};

}  // namespace kvsift::cuda
