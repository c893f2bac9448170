// SPDX-License-Identifier: Apache-2.0
#pragma once

// The explicit instantiations of the CUDA backend, in one list. instantiate.cu defines them
// (KVSIFT_INSTANTIATE_EXTERN empty); the test and benchmark TUs include this header to declare
// them `extern`, so each kernel is compiled by nvcc once per architecture, not once per TU.

#include <kvsift/cuda/all.cuh>

#include <kvsift/core/element.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

#ifndef KVSIFT_INSTANTIATE_EXTERN
#define KVSIFT_INSTANTIATE_EXTERN extern
#endif

#define KVSIFT_INSTANTIATE_VIEW(T, KV)                                                          \
  KVSIFT_INSTANTIATE_EXTERN template void kvsift::cuda::gather<KV<T>>(                          \
      kvsift::cuda::par, const KV<T>&, kvsift::cuda::token_set, std::int32_t, std::int32_t, T*, \
      T*);                                                                                      \
  KVSIFT_INSTANTIATE_EXTERN template void kvsift::cuda::expand_pages<KV<T>>(                    \
      kvsift::cuda::par, const KV<T>&, kvsift::cuda::page_set, std::int32_t,                   \
      const std::int32_t*, std::int32_t*);                                                      \
  KVSIFT_INSTANTIATE_EXTERN template void                                                       \
  kvsift::cuda::sparse_decode_attention<KV<T>, kvsift::cuda::token_set>(                        \
      kvsift::cuda::par, const T*, const KV<T>&, const kvsift::cuda::token_set&,                \
      kvsift::cuda::sparse_attention_shape, T*, float*);                                        \
  KVSIFT_INSTANTIATE_EXTERN template void                                                       \
  kvsift::cuda::sparse_decode_attention<KV<T>, kvsift::cuda::page_set>(                         \
      kvsift::cuda::par, const T*, const KV<T>&, const kvsift::cuda::page_set&,                 \
      kvsift::cuda::sparse_attention_shape, T*, float*);                                        \
  KVSIFT_INSTANTIATE_EXTERN template void                                                       \
  kvsift::cuda::sparse_decode_attention<KV<T>, kvsift::cuda::token_set>(                        \
      kvsift::cuda::par, const kvsift::cuda::sparse_attention_plan&, void*, std::size_t,        \
      const T*, const KV<T>&, const kvsift::cuda::token_set&,                                   \
      kvsift::cuda::sparse_attention_shape, T*, float*);                                        \
  KVSIFT_INSTANTIATE_EXTERN template void                                                       \
  kvsift::cuda::sparse_decode_attention<KV<T>, kvsift::cuda::page_set>(                         \
      kvsift::cuda::par, const kvsift::cuda::sparse_attention_plan&, void*, std::size_t,        \
      const T*, const KV<T>&, const kvsift::cuda::page_set&,                                    \
      kvsift::cuda::sparse_attention_shape, T*, float*);

#define KVSIFT_INSTANTIATE_TYPE(T)                                                              \
  KVSIFT_INSTANTIATE_VIEW(T, kvsift::cuda::dense_kv)                                            \
  KVSIFT_INSTANTIATE_VIEW(T, kvsift::cuda::paged_kv)                                            \
  KVSIFT_INSTANTIATE_EXTERN template kvsift::cuda::segmented_topk_plan                        \
  kvsift::cuda::make_segmented_topk_plan<T>(std::int64_t, std::int64_t, std::int64_t,           \
                                              std::int64_t);                                    \
  KVSIFT_INSTANTIATE_EXTERN template void kvsift::cuda::segmented_topk<T>(                      \
      kvsift::cuda::par, const kvsift::cuda::segmented_topk_plan&, void*, std::size_t, const T*, \
      const std::int32_t*, const std::int32_t*, std::int32_t*);                                 \
  KVSIFT_INSTANTIATE_EXTERN template class kvsift::cuda::streamed_recall<T>;                    \
  KVSIFT_INSTANTIATE_EXTERN template void kvsift::cuda::recall_gather<T>(                       \
      kvsift::cuda::par, kvsift::cuda::recall_shape, const T*, std::int32_t,                    \
      const kvsift::cuda::recall_item*, std::int32_t, T*, T*);                                  \
  KVSIFT_INSTANTIATE_EXTERN template void kvsift::cuda::hnd_pages_to_nhd<T>(                    \
      kvsift::cuda::par, kvsift::cuda::recall_shape, const T*, std::span<const std::int32_t>,   \
      T*, T*);

KVSIFT_INSTANTIATE_TYPE(float)
KVSIFT_INSTANTIATE_TYPE(kvsift::half)
KVSIFT_INSTANTIATE_TYPE(kvsift::bfloat16)

#undef KVSIFT_INSTANTIATE_TYPE
#undef KVSIFT_INSTANTIATE_VIEW
