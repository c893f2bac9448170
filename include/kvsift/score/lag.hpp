// SPDX-License-Identifier: Apache-2.0
#pragma once

// Lag-relative scoring — LagKV (Liang et al., 2025, "LagKV: Lag-Relative Information of the KV
// Cache Tells Which Tokens Are Important"). Attention-free: a token's importance is how much its
// key and value stand out once normalised by the statistics of the *next* chunk of the cache
// (the "lag" partition), so no query and no attention probability is ever needed.

#include <kvsift/core/error.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/parallel.hpp>
#include <kvsift/score/context.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace kvsift::score {

// Which statistics normalise a partition (METHODS.md, LagKV "Variants").
enum class lag_variant {
  lag,    // min/max per channel over the next partition p + 1 (the paper's method)
  local,  // min/max per channel over partition p itself
  knorm   // no normalisation: token score -||k||_2 over the raw key (values unused)
};

inline lag_variant parse_lag_variant(std::string_view s) {
  if (s == "lag") return lag_variant::lag;
  if (s == "local") return lag_variant::local;
  if (s == "knorm") return lag_variant::knorm;
  throw make_error("parse_lag_variant", "variant", s, "\"lag\", \"local\" or \"knorm\"");
}

inline std::string_view to_string(lag_variant v) {
  switch (v) {
    case lag_variant::lag:
      return "lag";
    case lag_variant::local:
      return "local";
    case lag_variant::knorm:
      return "knorm";
  }
  return "?";
}

namespace detail {

// Unbiased std over d channels of x' = (x - mn) / (mx - mn), x' = 0 where mx == mn (the NaN
// guard). d == 1 has no unbiased std; it scores 0 rather than NaN.
template <class T>
inline float lag_token_std(const T* x, const float* mn, const float* mx, int d, double* xn) {
  double mean = 0.0;
  for (int c = 0; c < d; ++c) {
    const double range = static_cast<double>(mx[c]) - mn[c];
    xn[c] = mx[c] == mn[c] ? 0.0 : (static_cast<double>(to_float(x[c])) - mn[c]) / range;
    mean += xn[c];
  }
  if (d < 2) return 0.0f;
  mean /= d;
  double ss = 0.0;
  for (int c = 0; c < d; ++c) ss += (xn[c] - mean) * (xn[c] - mean);
  return static_cast<float>(std::sqrt(ss / (d - 1)));
}

// lag_token_std of `count` <= kLagBlock consecutive slots from `first`, bit for bit: the same
// operations in the same order per token (each token's sums run over c = 0..d-1), but the tokens'
// chains interleaved (x' stored [d, kLagBlock]), so the adds of different tokens are independent
// and vectorise, where one token's sums are a chain of d dependent adds. range[c] =
// double(mx[c]) - mn[c]; flat[c] = 1 where mx[c] == mn[c]. xt holds d * kLagBlock doubles.
inline constexpr int kLagBlock = 8;

template <class Row>
void lag_block_std(Row& row, int first, int count, const float* mn, const double* range,
                   const double* flat, int d, double* xt, float* out) {
  constexpr int B = kLagBlock;
  for (int t = 0; t < B; ++t) {
    if (t < count) {
      const auto* x = row(first + t);
      for (int c = 0; c < d; ++c) {
        xt[c * B + t] =
            flat[c] != 0.0 ? 0.0 : (static_cast<double>(to_float(x[c])) - mn[c]) / range[c];
      }
    } else {
      for (int c = 0; c < d; ++c) xt[c * B + t] = 0.0;  // an unused lane
    }
  }
  if (d < 2) {
    for (int t = 0; t < count; ++t) out[t] = 0.0f;
    return;
  }
  double mean[B] = {};
  for (int c = 0; c < d; ++c) {
    for (int t = 0; t < B; ++t) mean[t] += xt[c * B + t];
  }
  for (int t = 0; t < B; ++t) mean[t] /= d;
  double ss[B] = {};
  for (int c = 0; c < d; ++c) {
    for (int t = 0; t < B; ++t) {
      const double e = xt[c * B + t] - mean[t];
      ss[t] += e * e;
    }
  }
  for (int t = 0; t < count; ++t) out[t] = static_cast<float>(std::sqrt(ss[t] / (d - 1)));
}

// One side (K or V) of partition `p` of a head-sequence: row(j) points at slot j's d channels.
// Writes the softmaxed scores of the partition's L tokens to out[0, L).
template <class Row>
void lag_side(Row&& row, int first, int lag, bool local, int d, float* out, std::vector<float>& mn,
              std::vector<float>& mx, std::vector<double>& xn) {
  const int ref = local ? first : first + lag;  // the partition whose statistics normalise
  mn.assign(static_cast<std::size_t>(d), std::numeric_limits<float>::infinity());
  mx.assign(static_cast<std::size_t>(d), -std::numeric_limits<float>::infinity());
  for (int j = ref; j < ref + lag; ++j) {
    const auto* x = row(j);
    for (int c = 0; c < d; ++c) {
      const float v = to_float(x[c]);
      mn[c] = std::min(mn[c], v);
      mx[c] = std::max(mx[c], v);
    }
  }
  xn.resize(static_cast<std::size_t>(d) * (kLagBlock + 2));
  double* range = xn.data() + static_cast<std::size_t>(d) * kLagBlock;
  double* flat = range + d;  // 1 where mx == mn (x' = 0)
  for (int c = 0; c < d; ++c) {
    range[c] = static_cast<double>(mx[c]) - mn[c];
    flat[c] = mx[c] == mn[c] ? 1.0 : 0.0;
  }
  for (int j = 0; j < lag; j += kLagBlock) {
    lag_block_std(row, first + j, std::min(kLagBlock, lag - j), mn.data(), range, flat, d,
                  xn.data(), out + j);
  }
  cpu::softmax(std::span<float>(out, static_cast<std::size_t>(lag)));
}

}  // namespace detail

// Lag-relative scorer — LagKV (Liang et al., 2025).
//
// Per head-sequence with `base` = max(frozen prefix, sink) (slots before it are final, never
// rescored), `[base, n)` is cut into P = floor((n - base) / lag) full partitions of `lag` tokens.
// Partitions 0..P-2 are scored; partition P-1 and the remainder are the raw tail. For partition p,
// separately for K and V: per channel min/max over partition p + 1 (variant `lag`) or p itself
// (`local`); x' = (x - mn) / (mx - mn), 0 where mx == mn; token value = unbiased std of x' over the
// d channels; softmax over the partition's tokens. Score = s_K + value_weight * s_V. Variant
// `knorm` scores -||k||_2 instead (no softmax). Slots outside the scored partitions (the frozen
// prefix and the tail) score +infinity: they are kept as they are.
//
// Parameters (paper defaults): sink 16, lag 128, value_weight 1, variant lag. Needs no queries.
// Cost: O(n_unfrozen * d) per head-sequence, two reads of each scored token and of its reference
// partition; memory bound. Parallel over head-sequences.
struct lag_relative {
  using kvsift_role = scorer_tag;
  using granularity = token_level;
  static constexpr bool needs_queries = false;
  struct params {
    int sink = 16;              // S: slots [0, S) are never compressed
    int lag = 128;              // L: partition length
    double value_weight = 1.0;  // weight of the value side
    lag_variant variant = lag_variant::lag;
  };
  params p{};

  [[nodiscard]] int query_window() const { return 0; }

  void validate(std::string_view where) const {
    require(p.sink > 0, where, "sink", p.sink, "> 0");
    require(p.lag > 0, where, "lag", p.lag, "> 0");
    require(std::isfinite(p.value_weight), where, "value_weight", p.value_weight,
            "a finite number");
  }

  // First unfrozen slot of a head-sequence.
  [[nodiscard]] int base_of(int frozen) const { return std::max(frozen, p.sink); }
  // Full partitions of [base, n); partitions 0..P-2 are scored when P >= 2.
  [[nodiscard]] int partitions(int n, int base) const { return n > base ? (n - base) / p.lag : 0; }

  template <class Store>
  void score(const score_input<Store>& in, score_sets& out) const {
    score(in, out, nullptr, nullptr);
  }

  // As score(), also writing the two softmaxed sides (lag/local only; 0 outside the scored
  // partitions) when `score_k` / `score_v` are given: out = score_k + value_weight * score_v.
  template <class Store>
  void score(const score_input<Store>& in, score_sets& out, score_sets* score_k,
             score_sets* score_v) const {
    layout_scores(in, out, [&](int s) { return in.store->length(in.sequence(s)); });
    if (score_k != nullptr) layout_scores(in, *score_k, [&](int s) { return out.size(s); });
    if (score_v != nullptr) layout_scores(in, *score_v, [&](int s) { return out.size(s); });
    const int d = in.store->shape().head_dim;
    const int L = p.lag;
    cpu::parallel_for(in.segments(), [&](std::int64_t s64) {
      const int s = static_cast<int>(s64);
      const auto seq = in.sequence(s);
      const auto* store = in.store;
      auto seg = out[s];
      const int n = static_cast<int>(seg.size());
      const int base = std::min(base_of(in.frozen_of(s)), n);
      const int P = partitions(n, base);
      const int scored = P >= 2 ? (P - 1) * L : 0;
      std::fill(seg.begin(), seg.end(), std::numeric_limits<float>::infinity());
      if (scored == 0) return;
      float* sc = seg.data() + base;
      if (p.variant == lag_variant::knorm) {
        for (int j = 0; j < scored; ++j) {
          const auto* k = store->key(seq, base + j);
          double acc = 0.0;
          for (int c = 0; c < d; ++c) acc += static_cast<double>(to_float(k[c])) * to_float(k[c]);
          sc[j] = static_cast<float>(-std::sqrt(acc));
        }
        return;
      }
      const bool local = p.variant == lag_variant::local;
      std::vector<float> mn, mx, sv(static_cast<std::size_t>(L));
      std::vector<double> xn;
      const auto key_row = [&](int j) { return store->key(seq, j); };
      const auto value_row = [&](int j) { return store->value(seq, j); };
      const float w = static_cast<float>(p.value_weight);
      for (int part = 0; part + 1 < P; ++part) {
        const int first = base + part * L;
        float* dst = sc + part * L;
        detail::lag_side(key_row, first, L, local, d, dst, mn, mx, xn);
        detail::lag_side(value_row, first, L, local, d, sv.data(), mn, mx, xn);
        if (score_k != nullptr) std::copy(dst, dst + L, (*score_k)[s].data() + first);
        if (score_v != nullptr) std::copy(sv.begin(), sv.end(), (*score_v)[s].data() + first);
        for (int j = 0; j < L; ++j) dst[j] += w * sv[j];
      }
    });
  }
};
static_assert(Scorer<lag_relative>);

}  // namespace kvsift::score
