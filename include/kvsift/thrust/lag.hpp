// SPDX-License-Identifier: Apache-2.0
#pragma once

// LagKV scoring (METHODS.md "LagKV") with Thrust. Attention-free: per head-sequence, the
// uncompressed tokens [base, n) are cut into full partitions of `lag` tokens, P of them;
// partitions 0..P-2 are scored, the last one and the remainder form the raw tail.
// For partition p, separately for keys and values: per channel mn / mx over the reference
// partition (p + 1, or p itself for the `local` variant); x' = (x - mn) / (mx - mn), 0 where
// mx == mn; s = unbiased std of x' over the d channels; softmax over the partition's tokens.
// Token score = s_K + value_weight * s_V. Variant `knorm`: -||k||_2 of the raw key (no softmax).
// Tokens outside the scored partitions get `unscored` (+inf). Matches score::lag_relative
// operation for operation (double normalisation and std, float softmax); the caller computes
// base = min(max(frozen, sink), n) per segment.
//
// Stages (Thrust for_each over counting iterators):
//   1. partition offsets: CSR of the P_s full partitions                    scan
//   2. per (partition, channel) min / max of keys and values                one thread each
//   3. per token s_K and s_V                                                one thread per token
//   4. softmax over each scored partition (keys and values)                 one thread per partition
//   5. combine s_K + value_weight * s_V                                     one thread per token
// Workspace from lag_workspace_bytes(N, S, d, lag). Cost O(N d).

#include <kvsift/core/dot.hpp>
#include <kvsift/score/lag.hpp>
#include <kvsift/thrust/math.hpp>
#include <kvsift/thrust/round.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace kvsift::thrust {

enum class lag_variant {
  lag,    // reference = the next partition (the paper's method)
  local,  // reference = the partition itself
  knorm   // -||k||_2, values unused
};

struct lag_params {
  int lag = 128;
  double value_weight = 1.0;
  lag_variant variant = lag_variant::lag;
  // Written for tokens outside the scored partitions (frozen prefix, tail): +inf, as
  // score::lag_relative, so a selector keeps them.
  float unscored = std::numeric_limits<float>::infinity();
};

namespace detail {

struct lag_layout {
  std::int32_t* part_offsets = nullptr;  // [S + 1] CSR of full partitions
  float* kmn = nullptr;                  // [max_parts, d] per partition and channel
  float* kmx = nullptr;
  float* vmn = nullptr;
  float* vmx = nullptr;
  float* sv = nullptr;                   // [N] value std per token
  std::size_t bytes = 0;
};

inline lag_layout make_lag_layout(std::byte* ws, std::int64_t num_items, int num_segments, int dim,
                                  int lag) {
  carver c{ws};
  lag_layout l;
  const std::size_t parts = static_cast<std::size_t>(num_items / lag) * dim;
  l.part_offsets = c.take<std::int32_t>(static_cast<std::size_t>(num_segments) + 1);
  l.kmn = c.take<float>(parts);
  l.kmx = c.take<float>(parts);
  l.vmn = c.take<float>(parts);
  l.vmx = c.take<float>(parts);
  l.sv = c.take<float>(static_cast<std::size_t>(num_items));
  l.bytes = c.bytes;
  return l;
}

struct partition_count_fn {
  const std::int32_t* offsets;
  const std::int32_t* base;
  int lag;
  KVSIFT_HOST_DEVICE std::int32_t operator()(int s) const {
    const int rest = offsets[s + 1] - offsets[s] - base[s];
    return rest > 0 ? rest / lag : 0;
  }
};

template <class T>
struct lag_minmax_fn {
  segmented_rows<T> keys;
  segmented_rows<T> values;
  const std::int32_t* base;
  const std::int32_t* part_offsets;
  int lag;
  float *kmn, *kmx, *vmn, *vmx;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const std::int64_t part = e / keys.dim;
    const int c = static_cast<int>(e % keys.dim);
    if (part >= part_offsets[keys.num_segments]) {
      return;
    }
    const int s = segment_of(part_offsets, keys.num_segments, part);
    const int first = base[s] + static_cast<int>(part - part_offsets[s]) * lag;
    float a = -neg_inf(), b = neg_inf(), u = -neg_inf(), v = neg_inf();
    for (int j = first; j < first + lag; ++j) {
      const float x = to_float(keys.row(s, j)[c]);
      const float y = to_float(values.row(s, j)[c]);
      a = x < a ? x : a;
      b = b < x ? x : b;
      u = y < u ? y : u;
      v = v < y ? y : v;
    }
    kmn[e] = a;
    kmx[e] = b;
    vmn[e] = u;
    vmx[e] = v;
  }
};

// Unbiased std over d channels of the min-max normalised row, in double as score::lag_relative;
// d == 1 scores 0.
template <class T>
KVSIFT_HOST_DEVICE inline float normalised_std(const T* x, const float* mn, const float* mx,
                                               int d) {
  double mean = 0.0;
  for (int c = 0; c < d; ++c) {
    const double range = static_cast<double>(mx[c]) - mn[c];
    mean += mx[c] == mn[c] ? 0.0 : (static_cast<double>(to_float(x[c])) - mn[c]) / range;
  }
  if (d < 2) {
    return 0.0f;
  }
  mean /= d;
  double ss = 0.0;
  for (int c = 0; c < d; ++c) {
    const double range = static_cast<double>(mx[c]) - mn[c];
    const double y =
        mx[c] == mn[c] ? 0.0 : (static_cast<double>(to_float(x[c])) - mn[c]) / range;
    ss += mul_rn(y - mean, y - mean);
  }
  return static_cast<float>(std::sqrt(ss / (d - 1)));
}

template <class T>
struct lag_token_fn {
  segmented_rows<T> keys;
  segmented_rows<T> values;
  const std::int32_t* base;
  const std::int32_t* part_offsets;
  lag_params p;
  const float *kmn, *kmx, *vmn, *vmx;
  float* sk;  // [N] = out
  float* sv;  // [N]
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(keys.offsets, keys.num_segments, e);
    const int j = static_cast<int>(e - keys.offsets[s]);
    const int d = keys.dim;
    const int parts = part_offsets[s + 1] - part_offsets[s];
    const int rel = j - base[s];
    if (rel < 0 || parts < 2 || rel >= (parts - 1) * p.lag) {
      sk[e] = p.unscored;
      sv[e] = p.unscored;
      return;
    }
    const int part = rel / p.lag;
    const std::int64_t ref =
        (static_cast<std::int64_t>(part_offsets[s]) + part + (p.variant == lag_variant::local ? 0 : 1)) * d;
    sk[e] = normalised_std(keys.row(s, j), kmn + ref, kmx + ref, d);
    sv[e] = normalised_std(values.row(s, j), vmn + ref, vmx + ref, d);
  }
};

template <class T>
struct knorm_fn {
  segmented_rows<T> keys;
  const std::int32_t* base;
  int lag;
  float unscored;
  float* out;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(keys.offsets, keys.num_segments, e);
    const int j = static_cast<int>(e - keys.offsets[s]);
    const int rest = keys.length(s) - base[s];
    const int parts = rest > 0 ? rest / lag : 0;
    if (j < base[s] || parts < 2 || j - base[s] >= (parts - 1) * lag) {
      out[e] = unscored;
      return;
    }
    const T* k = keys.row(s, j);
    double acc = 0.0;  // score::lag_relative's knorm: in double
    for (int c = 0; c < keys.dim; ++c) {
      const double kc = to_float(k[c]);
      acc += mul_rn(kc, kc);
    }
    out[e] = static_cast<float>(-std::sqrt(acc));
  }
};

struct lag_softmax_fn {
  const std::int32_t* offsets;
  const std::int32_t* base;
  const std::int32_t* part_offsets;
  int num_segments;
  int lag;
  float* sk;
  float* sv;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t part) const {
    if (part >= part_offsets[num_segments]) {
      return;
    }
    const int s = segment_of(part_offsets, num_segments, part);
    const int local = static_cast<int>(part - part_offsets[s]);
    if (local == part_offsets[s + 1] - part_offsets[s] - 1) {
      return;  // the last full partition belongs to the raw tail
    }
    const std::int64_t first = offsets[s] + base[s] + static_cast<std::int64_t>(local) * lag;
    softmax_row(sk + first, lag);
    softmax_row(sv + first, lag);
  }
};

struct lag_combine_fn {
  const std::int32_t* offsets;
  const std::int32_t* base;
  const std::int32_t* part_offsets;
  int num_segments;
  lag_params p;
  float* sk;
  const float* sv;
  KVSIFT_HOST_DEVICE void operator()(std::int64_t e) const {
    const int s = segment_of(offsets, num_segments, e);
    const int rel = static_cast<int>(e - offsets[s]) - base[s];
    const int parts = part_offsets[s + 1] - part_offsets[s];
    if (rel >= 0 && parts >= 2 && rel < (parts - 1) * p.lag) {
      sk[e] += mul_rn(static_cast<float>(p.value_weight), sv[e]);
    }
  }
};

}  // namespace detail

// Bytes of workspace lag_scores needs (N total tokens, S segments, d channels).
inline std::size_t lag_workspace_bytes(std::int64_t num_items, int num_segments, int dim, int lag) {
  return detail::make_lag_layout(nullptr, num_items, num_segments, dim, lag).bytes;
}

// out[keys.offsets[s] + j] = LagKV score of token j of segment s (see the file comment).
//   keys, values  same offsets and addressing; N = num_items = keys.offsets[S] (host copy)
//   base          [S] first uncompressed token of each segment: min(max(frozen, sink), n_s)
//   workspace     >= lag_workspace_bytes(N, S, d, params.lag) (unused by knorm: may be 0)
template <class Policy, Element T>
void lag_scores(const Policy& exec, const segmented_rows<T>& keys, const segmented_rows<T>& values,
                const std::int32_t* base, std::int64_t num_items, lag_params params, float* out,
                void* workspace, std::size_t workspace_bytes) {
  constexpr std::string_view where = "thrust::lag_scores";
  keys.validate(where, "keys");
  require(params.lag > 0, where, "params.lag", params.lag, "> 0");
  const int S = keys.num_segments;
  const ::thrust::counting_iterator<std::int64_t> zero(0);
  if (params.variant == lag_variant::knorm) {
    require(base != nullptr, where, "base", "null", "[num_segments] first uncompressed token");
    ::thrust::for_each_n(exec, zero, num_items,
                         detail::knorm_fn<T>{keys, base, params.lag, params.unscored, out});
    return;
  }
  values.validate(where, "values");
  require(values.num_segments == S && values.dim == keys.dim, where, "values.num_segments",
          values.num_segments, "the keys' segments and dim");
  require(base != nullptr, where, "base", "null", "[num_segments] first uncompressed token");
  const auto l = detail::make_lag_layout(static_cast<std::byte*>(workspace), num_items, S,
                                         keys.dim, params.lag);
  detail::check_workspace(where, workspace, workspace_bytes, l.bytes);
  ::thrust::fill_n(exec, l.part_offsets, 1, 0);
  auto counts = ::thrust::make_transform_iterator(
      ::thrust::counting_iterator<int>(0),
      detail::partition_count_fn{keys.offsets, base, params.lag});
  ::thrust::inclusive_scan(exec, counts, counts + S, l.part_offsets + 1);
  // The number of partitions is data-dependent; the upper bound N / lag sizes every pass, and
  // threads past the real count do nothing.
  const std::int64_t parts = num_items / params.lag;
  ::thrust::for_each_n(exec, zero, parts * keys.dim,
                       detail::lag_minmax_fn<T>{keys, values, base, l.part_offsets, params.lag,
                                                l.kmn, l.kmx, l.vmn, l.vmx});
  ::thrust::for_each_n(exec, zero, num_items,
                       detail::lag_token_fn<T>{keys, values, base, l.part_offsets, params, l.kmn,
                                               l.kmx, l.vmn, l.vmx, out, l.sv});
  ::thrust::for_each_n(exec, zero, parts,
                       detail::lag_softmax_fn{keys.offsets, base, l.part_offsets, S, params.lag,
                                              out, l.sv});
  ::thrust::for_each_n(exec, zero, num_items,
                       detail::lag_combine_fn{keys.offsets, base, l.part_offsets, S, params, out,
                                              l.sv});
}

// The Thrust variant of score::lag_relative's.
constexpr lag_variant variant_of(score::lag_variant v) {
  switch (v) {
    case score::lag_variant::local: return lag_variant::local;
    case score::lag_variant::knorm: return lag_variant::knorm;
    case score::lag_variant::lag: break;
  }
  return lag_variant::lag;
}

// score::lag_relative's round over one (request, layer) of a device store (device/evict.hpp):
// the partitions after each head's frozen prefix (in.base).
inline std::size_t score_round_workspace_bytes(const score::lag_relative& sc, const round_shape& r) {
  return lag_workspace_bytes(r.num_items, r.segments, r.dim, sc.p.lag);
}
template <class Policy, Element T>
void score_round(const Policy& exec, const score::lag_relative& sc, const round_input<T>& in,
                 float* out, void* workspace, std::size_t workspace_bytes) {
  lag_scores(exec, in.keys, in.values, in.base, in.num_items,
             lag_params{.lag = sc.p.lag, .value_weight = sc.p.value_weight,
                        .variant = variant_of(sc.p.variant)},
             out, workspace, workspace_bytes);
}

}  // namespace kvsift::thrust
