// SPDX-License-Identifier: Apache-2.0
// Compile check of the CUDA backend: explicit instantiation of every algorithm for every element
// type (float, half, bfloat16), KV view (dense, paged) and index-set kind (token, page); head_dim
// 64 and 128 are both inside each attention instantiation. The tests and benchmarks link these
// objects instead of recompiling the kernels.

#define KVSIFT_INSTANTIATE_EXTERN
#include "instantiations.cuh"

#include <type_traits>

namespace kc = kvsift::cuda;

#define KVSIFT_CHECK_TYPE(T)                                                                    \
  template class kc::device_buffer<T>;                                                          \
  template class kc::pinned_buffer<T>;                                                          \
  template void kc::copy_async<T>(kc::par, T*, const T*, std::size_t);                          \
  static_assert(kc::KvView<kc::dense_kv<T>> && kc::KvView<kc::paged_kv<T>>);                    \
  static_assert(std::is_trivially_copyable_v<kc::dense_kv<T>> &&                                \
                std::is_trivially_copyable_v<kc::paged_kv<T>>, "views are PODs");

KVSIFT_CHECK_TYPE(float)
KVSIFT_CHECK_TYPE(kvsift::half)
KVSIFT_CHECK_TYPE(kvsift::bfloat16)

static_assert(!kc::KvView<int>, "a non-view type must not model KvView");
static_assert(std::is_trivially_copyable_v<kc::segmented_topk_plan>, "plans are PODs");
static_assert(std::is_trivially_copyable_v<kc::par>, "the policy is a POD");
static_assert(std::is_base_of_v<std::runtime_error, kvsift::cuda_error>);
