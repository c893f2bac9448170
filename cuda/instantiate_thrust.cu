// SPDX-License-Identifier: Apache-2.0
// The Thrust algorithms of include/kvsift/thrust/ compiled by nvcc on the CUDA system, for every
// element type: the same headers the g++ parity tests run under the CPP and OMP systems.

#include <kvsift/core/element.hpp>
#include <kvsift/thrust/all.hpp>

#include <thrust/execution_policy.h>

namespace {

template <class T>
void instantiate_all() {
  const auto exec = ::thrust::cuda::par;
  const kvsift::thrust::segmented_rows<T> rows{};
  const std::int32_t* offsets = nullptr;
  std::int32_t* out_i = nullptr;
  float* out_f = nullptr;
  kvsift::thrust::gather_rows(exec, rows, offsets, offsets, 0, static_cast<T*>(nullptr), 0, out_i);
  kvsift::thrust::compact_rows(exec, static_cast<T*>(nullptr), out_i, 0, 0, 0, offsets, offsets, 0,
                               nullptr, 0);
  kvsift::thrust::lag_scores(exec, rows, rows, offsets, 0, kvsift::thrust::lag_params{}, out_f,
                             nullptr, 0);
  kvsift::thrust::page_digest(exec, rows, offsets, 0, 16, out_f, out_f);
  kvsift::thrust::window_attention_scores(exec, rows, kvsift::thrust::window_queries{}, 0,
                                          kvsift::thrust::window_score_params{}, out_f, nullptr, 0);
  kvsift::thrust::cumulative_attention_scores(exec, rows, kvsift::thrust::window_queries{}, 0,
                                              kvsift::gqa_reduce::mean, out_f, nullptr, 0);
  kvsift::thrust::attention_over(exec, rows, rows, kvsift::thrust::window_queries{},
                                 kvsift::thrust::attention_plan{}, 0, 0, out_f, out_f, nullptr, 0);
  // The decode steps' algorithms (the device states of include/kvsift/device/).
  T* data = nullptr;
  kvsift::thrust::append_rows(exec, data, out_i, 0, 1, 1, offsets, static_cast<const T*>(nullptr),
                              offsets);
  kvsift::thrust::pack_rows(exec, rows, 0, data, out_i);
  kvsift::thrust::gather_positions(exec, rows, offsets, offsets, 0, out_i);
  kvsift::thrust::page_digest_tail(exec, rows, 16, 1, out_f, out_f, 0);
  kvsift::thrust::page_digest_append(exec, static_cast<const T*>(nullptr), 0, 1, 0, 16, 0, out_f,
                                     out_f);
  kvsift::thrust::query_attention_scores(exec, rows, kvsift::thrust::window_queries{}, 0, 7,
                                         kvsift::pooling::avg, kvsift::gqa_reduce::mean, out_f,
                                         nullptr, 0);
}

}  // namespace

// Referenced so the instantiations are not discarded; never called without a device.
void kvsift_instantiate_thrust_algorithms() {
  instantiate_all<float>();
  instantiate_all<kvsift::half>();
  instantiate_all<kvsift::bfloat16>();
  const auto exec = ::thrust::cuda::par;
  float* f = nullptr;
  const std::int32_t* o = nullptr;
  std::int32_t* oi = nullptr;
  kvsift::thrust::segmented_softmax(exec, f, o, 0);
  kvsift::thrust::segmented_pool1d(exec, f, f, o, 0, 0, 7, kvsift::pooling::avg);
  kvsift::thrust::gqa_reduce_rows(exec, f, f, o, 0, 0, 1, kvsift::gqa_reduce::mean);
  kvsift::thrust::page_offsets(exec, o, 0, 16, oi);
  kvsift::thrust::page_scores(exec, f, 1, 1, 64, f, f, o, 0, 0, kvsift::gqa_reduce::max, f);
  kvsift::thrust::kept_offsets(exec, o, o, 0, oi);
  kvsift::thrust::segmented_topk(exec, f, o, 0, 0, o, 0, oi, nullptr, 0);
  kvsift::thrust::recency_scores(exec, o, o, 0, 0, f);
  kvsift::thrust::query_cosine_decisions(exec, f, f, 0, 1, 1, 0.8, f, oi);
  kvsift::thrust::cumulative_attention_observe(exec, f, o, 0, 0, 1, kvsift::gqa_reduce::mean, o, f,
                                               0);
  kvsift::thrust::segmented_evict_one(exec, f, o, 0, o, 0, oi, oi);
  kvsift::thrust::expand_page_slots(exec, o, o, 0, 16, o, 0, oi);
  kvsift::thrust::static_dynamic_split(exec, f, o, 0, 0, o, 0, oi, o, 0, oi, nullptr, 0);
  kvsift::thrust::static_dynamic_refresh(exec, f, o, 0, 0, o, o, o, 0, o, 0, oi, nullptr, 0);
  kvsift::thrust::merge_sets(exec, o, o, 0, o, o, 0, 0, o, oi);
  kvsift::thrust::leader_gather(exec, o, o, o, 0, o, 0, oi);
  double* dbl = nullptr;
  kvsift::thrust::drift_medians(exec, o, o, o, o, 0, 1, 0.5, dbl, oi, nullptr, 0);
  kvsift::thrust::freekv_group_scores_strided(exec, f, 1, 1, 64, f, f, 0, o, 0, 0, 16, 0, 0,
                                              kvsift::score::freekv_merge{}, f, nullptr, 0);
  kvsift::thrust::pages_to_positions(exec, o, o, 0, 16, o, 0, oi);
  kvsift::thrust::choose_sets(exec, o, 0, 0, o, o, o, oi);
}
