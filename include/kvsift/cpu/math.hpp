// SPDX-License-Identifier: Apache-2.0
#pragma once

// Small numeric kernels shared by the CPU models: dot products over d channels, softmax,
// pooling along tokens, GQA reductions, and the real-to-integer rule of METHODS.md.

#include <kvsift/core/dot.hpp>
#include <kvsift/core/element.hpp>
#include <kvsift/core/error.hpp>
#include <kvsift/cpu/exact_softmax.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

namespace kvsift {

// Pooling along tokens (stride 1, odd kernel, padding kernel/2).
enum class pooling { avg, max };
// Reduction of the G per-query-head scores of a group to one score per KV head.
enum class gqa_reduce { mean, max, sum };

inline pooling parse_pooling(std::string_view s) {
  if (s == "avg") return pooling::avg;
  if (s == "max") return pooling::max;
  throw make_error("parse_pooling", "pooling", s, "\"avg\" or \"max\"");
}
inline gqa_reduce parse_gqa_reduce(std::string_view s) {
  if (s == "mean") return gqa_reduce::mean;
  if (s == "max") return gqa_reduce::max;
  if (s == "sum") return gqa_reduce::sum;
  throw make_error("parse_gqa_reduce", "gqa", s, "\"mean\", \"max\" or \"sum\"");
}

// METHODS.md: a count from a real formula is floor(x + 1e-9 * max(1, |x|)), in double.
inline std::int64_t count_floor(double x) {
  return static_cast<std::int64_t>(std::floor(x + 1e-9 * std::max(1.0, std::fabs(x))));
}

}  // namespace kvsift

namespace kvsift::cpu {

// q . k over d channels, in the fixed order of core/dot.hpp (shared with the Thrust backend).
template <Element T>
inline float dot(const float* q, const T* k, int d) {
  return kvsift::dot(q, k, d);
}

// In-place softmax with the row max subtracted, exp by exact_expf (core/exp.hpp) and a sequential
// double sum: the exact softmax every selection's scores go through (cpu/exact_softmax.hpp, where
// it runs on the CPU's vector path). An empty row is left alone.
inline void softmax(std::span<float> x) { softmax_rows(x.data(), 1, x.size(), x.size()); }

// exp(x) for x <= 0 (softmax after the max is subtracted), branch-free so loops over it
// vectorise: Cody-Waite range reduction and a degree-6 polynomial, relative error < 2e-7.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Softmax for the attention path: exp_nonpositive and an 8-lane float sum. Within 1e-6 relative
// of softmax(); used where the output feeds a weighted sum, not a top-k.
inline void softmax_fast(std::span<float> x) {
  if (x.empty()) {
    return;
  }
  const float mx = *std::max_element(x.begin(), x.end());
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const std::size_t n = x.size();
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int i = 0; i < 8; ++i) {
      x[j + i] = exp_nonpositive(x[j + i] - mx);
      lanes[i] += x[j + i];
    }
  }
  float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (; j < n; ++j) {
    x[j] = exp_nonpositive(x[j] - mx);
    sum += x[j];
  }
  const float inv = 1.0f / sum;
  for (float& v : x) {
    v *= inv;
  }
}

// out[j] = pool over in[j - K/2 .. j + K/2]; avg divides by K counting zero padding (PyTorch
// avg_pool1d default), max ignores padding. kernel 1 copies.
inline void pool1d(std::span<const float> in, std::span<float> out, int kernel, pooling mode) {
  const int n = static_cast<int>(in.size());
  const int half = kernel / 2;
  if (kernel <= 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return;
  }
  if (mode == pooling::avg) {
    // sliding window sum in double: exact enough and O(n)
    double sum = 0.0;
    for (int j = 0; j < std::min(half, n); ++j) {
      sum += in[j];
    }
    for (int j = 0; j < n; ++j) {
      const int add = j + half;
      const int drop = j - half - 1;
      if (add < n) sum += in[add];
      if (drop >= 0) sum -= in[drop];
      out[j] = static_cast<float>(sum / kernel);
    }
  } else {
    for (int j = 0; j < n; ++j) {
      float m = -std::numeric_limits<float>::infinity();
      for (int i = std::max(0, j - half); i <= std::min(n - 1, j + half); ++i) {
        m = std::max(m, in[i]);
      }
      out[j] = m;
    }
  }
}

// Reduces G rows of n scores (row-major [G, n]) to one row: out[j] = rows[0][j] (+ or max)
// rows[1][j] ... in row order, each column's fold in the same order as one accumulator would
// run it; row by row over the whole width, so each pass is one vector loop.
inline void reduce_group(std::span<const float> rows, int group, std::span<float> out,
                         gqa_reduce mode) {
  const std::size_t n = out.size();
  float* o = out.data();
  const float* r = rows.data();
  std::copy_n(r, n, o);
  for (int g = 1; g < group; ++g) {
    const float* v = r + static_cast<std::size_t>(g) * n;
    if (mode == gqa_reduce::max) {
      for (std::size_t j = 0; j < n; ++j) o[j] = std::max(o[j], v[j]);
    } else {
      for (std::size_t j = 0; j < n; ++j) o[j] += v[j];
    }
  }
  if (mode == gqa_reduce::mean) {
    const auto gf = static_cast<float>(group);
    for (std::size_t j = 0; j < n; ++j) o[j] /= gf;
  }
}

}  // namespace kvsift::cpu
