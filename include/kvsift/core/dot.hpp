// SPDX-License-Identifier: Apache-2.0
#pragma once

// Channel reductions shared by the CPU and Thrust backends, in one fixed summation order: eight
// independent partial sums (lanes c % 8), combined pairwise, then the tail. The order is part of
// the result, so both backends produce the same bits; eight lanes let the compiler keep the
// products in vector registers instead of one serial chain of dependent adds.

#include <kvsift/core/config.hpp>
#include <kvsift/core/element.hpp>

namespace kvsift {

namespace detail {
KVSIFT_HOST_DEVICE inline float combine8(const float* a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}
}  // namespace detail

// sum_c q[c] * k[c] over d channels.
template <class T>
KVSIFT_HOST_DEVICE inline float dot(const float* q, const T* k, int d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int c = 0;
  for (; c + 8 <= d; c += 8) {
    for (int i = 0; i < 8; ++i) acc[i] += q[c + i] * to_float(k[c + i]);
  }
  float tail = 0.0f;
  for (; c < d; ++c) tail += q[c] * to_float(k[c]);
  return detail::combine8(acc) + tail;
}

// sum_c x[c]^2 over d channels.
template <class T>
KVSIFT_HOST_DEVICE inline float squared_norm(const T* x, int d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int c = 0;
  for (; c + 8 <= d; c += 8) {
    for (int i = 0; i < 8; ++i) {
      const float v = to_float(x[c + i]);
      acc[i] += v * v;
    }
  }
  float tail = 0.0f;
  for (; c < d; ++c) {
    const float v = to_float(x[c]);
    tail += v * v;
  }
  return detail::combine8(acc) + tail;
}

// Quest's bound sum_c max(q_c * kmax_c, q_c * kmin_c).
KVSIFT_HOST_DEVICE inline float page_bound(const float* q, const float* kmin, const float* kmax,
                                           int d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int c = 0;
  for (; c + 8 <= d; c += 8) {
    for (int i = 0; i < 8; ++i) {
      const float a = q[c + i] * kmax[c + i];
      const float b = q[c + i] * kmin[c + i];
      acc[i] += a < b ? b : a;
    }
  }
  float tail = 0.0f;
  for (; c < d; ++c) {
    const float a = q[c] * kmax[c];
    const float b = q[c] * kmin[c];
    tail += a < b ? b : a;
  }
  return detail::combine8(acc) + tail;
}

}  // namespace kvsift
