// SPDX-License-Identifier: Apache-2.0
#pragma once

// Segmented numeric kernels of the Thrust backend: softmax, pooling along tokens and GQA
// reduction over CSR segments. Mirrors cpu/math.hpp and computes bit-for-bit what it computes
// under g++ (same operation order: float dot/exp, double softmax sum, double pooling sum), so
// top-k on the results picks the same indices as the CPU backend.
//   segmented_softmax  one thread per segment (row max, double sum, scale), in place
//   segmented_pool1d   one thread per output token: avg counts zero padding, max ignores it
//   gqa_reduce_rows    one thread per output token: mean / max / sum of G rows, in group order

#include <kvsift/cpu/math.hpp>
#include <kvsift/thrust/common.hpp>

#include <cmath>
#include <cstdint>

namespace kvsift::thrust {

namespace detail {

// cpu::softmax over x[0, n): row max subtracted, sum in double, scaled by float(1 / sum). With
// `lse`, also the row's log-sum-exp (max + log(sum); -inf for an empty row): a partial
// attention's, for attention/merge.hpp.
KVSIFT_HOST_DEVICE inline void softmax_row(float* x, int n, float* lse = nullptr) {
  if (n <= 0) {
    if (lse != nullptr) *lse = neg_inf();
    return;
  }
  float mx = x[0];
  for (int j = 1; j < n; ++j) {
    mx = x[j] > mx ? x[j] : mx;
  }
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    x[j] = exact_expf(x[j] - mx);
    sum += x[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = 0; j < n; ++j) {
    x[j] *= inv;
  }
  if (lse != nullptr) *lse = mx + static_cast<float>(::log(sum));
}

// cpu::pool1d at output j of a row of n values (stride `stride` between tokens).
KVSIFT_HOST_DEVICE inline float pool_at(const float* in, int n, int j, int kernel, pooling mode) {
  if (kernel <= 1) {
    return in[j];
  }
  const int half = kernel / 2;
  const int lo = j - half < 0 ? 0 : j - half;
  const int hi = j + half > n - 1 ? n - 1 : j + half;
  if (mode == pooling::avg) {
    double sum = 0.0;
    for (int i = lo; i <= hi; ++i) {
      sum += in[i];
    }
    return static_cast<float>(sum / kernel);
  }
  float m = neg_inf();
  for (int i = lo; i <= hi; ++i) {
    m = in[i] > m ? in[i] : m;
  }
  return m;
}

// cpu::reduce_group at column j of G rows spaced `row_stride` apart.
KVSIFT_HOST_DEVICE inline float reduce_at(const float* rows, std::int64_t row_stride, int group,
                                          int j, gqa_reduce mode) {
  float acc = rows[j];
  for (int g = 1; g < group; ++g) {
    const float v = rows[g * row_stride + j];
    acc = mode == gqa_reduce::max ? (v > acc ? v : acc) : acc + v;
  }
  return mode == gqa_reduce::mean ? acc / static_cast<float>(group) : acc;
}

struct softmax_segment_fn {
  float* values;
  const std::int32_t* offsets;
  KVSIFT_HOST_DEVICE void operator()(int s) const {
    softmax_row(values + offsets[s], offsets[s + 1] - offsets[s]);
  }
};

struct pool_fn {
  const float* in;
  float* out;
  const std::int32_t* offsets;
  int num_segments;
  int kernel;
  pooling mode;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(offsets, num_segments, e);
    const int b = offsets[s];
    out[e] = pool_at(in + b, offsets[s + 1] - b, static_cast<int>(e - b), kernel, mode);
  }
};

struct gqa_fn {
  const float* rows;  // [offsets[S] * G]: segment s's G rows of n_s at rows + offsets[s] * G
  float* out;
  const std::int32_t* offsets;
  int num_segments;
  int group;
  gqa_reduce mode;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(offsets, num_segments, e);
    const int b = offsets[s];
    const int n = offsets[s + 1] - b;
    out[e] = reduce_at(rows + static_cast<std::int64_t>(b) * group, n, group,
                       static_cast<int>(e - b), mode);
  }
};

}  // namespace detail

// In-place softmax of every segment values[offsets[s], offsets[s + 1]) (row max subtracted);
// empty segments are left alone. No workspace.
template <class Policy>
void segmented_softmax(const Policy& exec, float* values, const std::int32_t* offsets,
                       int num_segments) {
  require(num_segments >= 0, "thrust::segmented_softmax", "num_segments", num_segments, ">= 0");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<int>(0), num_segments,
                       detail::softmax_segment_fn{values, offsets});
}

// out[e] = pooling of in over the segment of e, tokens [j - K/2, j + K/2] clipped to the segment
// (avg divides by K, i.e. counts the zero padding; max ignores padding). `in` and `out` share the
// CSR offsets and must not overlap. kernel must be positive and odd.
template <class Policy>
void segmented_pool1d(const Policy& exec, const float* in, float* out, const std::int32_t* offsets,
                      int num_segments, std::int64_t num_items, int kernel, pooling mode) {
  constexpr std::string_view where = "thrust::segmented_pool1d";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(kernel > 0 && kernel % 2 == 1, where, "kernel", kernel, "a positive odd number");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_items,
                       detail::pool_fn{in, out, offsets, num_segments, kernel, mode});
}

// GQA reduction: segment s of `rows` holds G consecutive rows of n_s scores, starting at
// rows + offsets[s] * G (i.e. [segments][G][n_s] packed); out (CSR `offsets`) receives the
// mean / max / sum over g, in group order as cpu::reduce_group.
template <class Policy>
void gqa_reduce_rows(const Policy& exec, const float* rows, float* out, const std::int32_t* offsets,
                     int num_segments, std::int64_t num_items, int group, gqa_reduce mode) {
  constexpr std::string_view where = "thrust::gqa_reduce_rows";
  require(num_segments >= 0, where, "num_segments", num_segments, ">= 0");
  require(group > 0, where, "group", group, "> 0");
  ::thrust::for_each_n(exec, ::thrust::counting_iterator<std::int64_t>(0), num_items,
                       detail::gqa_fn{rows, out, offsets, num_segments, group, mode});
}

}  // namespace kvsift::thrust
