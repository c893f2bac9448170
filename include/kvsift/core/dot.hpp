// SPDX-License-Identifier: Apache-2.0
#pragma once

// Channel reductions shared by the CPU and Thrust backends, in one fixed summation order: eight
// independent partial sums (lanes c % 8), combined pairwise, then the tail. The order is part of
// the result, so both backends produce the same bits; eight lanes let the compiler keep the
// products in vector registers instead of one serial chain of dependent adds.
//
// Contraction is pinned on the device: nvcc contracts `acc += q * k` into one FMA by default
// (--fmad=true), which rounds once where the CPU rounds twice, so near-tied scores could order
// differently on a GPU and select other indices. Every product here goes through mul_rn, which on
// the device is __fmul_rn (never merged into an FMA). On the host it is a plain product: g++
// contracts it only where FMA instructions are enabled (-mfma, -march=native; its default is
// -ffp-contract=fast), which kvsift's own builds never enable for these functions (baseline
// x86-64); an engine that builds with FMA enabled keeps the CPU reference's bits with
// -ffp-contract=off (docs/gpu.md, "Exactness on the device").

#include <kvsift/core/config.hpp>
#include <kvsift/core/element.hpp>

namespace kvsift {

// a * b rounded on its own, never fused with a following add (see above). Used by every product
// a selection depends on, on both backends (dot products and norms here; FreeKV's group mean,
// LagKV's statistics, the query cosine's double sums).
KVSIFT_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVSIFT_HOST_DEVICE inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

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
    for (int i = 0; i < 8; ++i) acc[i] += mul_rn(q[c + i], to_float(k[c + i]));
  }
  float tail = 0.0f;
  for (; c < d; ++c) tail += mul_rn(q[c], to_float(k[c]));
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
      acc[i] += mul_rn(v, v);
    }
  }
  float tail = 0.0f;
  for (; c < d; ++c) {
    const float v = to_float(x[c]);
    tail += mul_rn(v, v);
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
