// SPDX-License-Identifier: Apache-2.0
#pragma once

// Decode attention of one GQA group on the CPU: the G query heads of a KV head against m kept
// rows, each K and V row read once for the whole group. Four paths behind one call:
//
// - portable: plain C++ over core/dot.hpp's 8-lane order (any compiler, any CPU; the path nvcc's
//   host pass and non-x86 builds take);
// - avx512: AVX-512F/BW + F16C intrinsics in functions compiled for that ISA
//   (`__attribute__((target))`), chosen at run time when the CPU has them, so a binary built for
//   generic x86-64 still uses 16-lane FMAs, one-instruction f16 -> f32 conversion, bf16 as even/odd
//   channel pairs when head_dim % 32 == 0 (load_slot) and a vectorised exp. Needs a head_dim
//   multiple of 16; other shapes take the next path down.
// - amx: the avx512 path with the key pass of bf16 rows (head_dim % 32 == 0) on the AMX tile unit
//   (amx_logits: 16 rows a tile product, the query in three bf16 parts); everything else as
//   avx512.
// - avx2: the same kernels on 8 lanes (AVX2 + FMA + F16C: every x86-64 server CPU since 2013),
//   blocked for 16 vector registers (tiles of at most 4 query heads, logits two heads x four rows
//   at a time, or four heads x two rows over 16-bit rows). Needs head_dim % 8 == 0.
//
// All compute softmax(q . k / sqrt(d)) v with the row maximum subtracted (the vector paths a
// running maximum over 2048-row chunks, rescaling what they accumulated as it grows); they differ
// in the order of float sums and in exp (a polynomial on the vector paths): each is within 2e-5
// of a float64 reference (tests/test_decode_attention.cpp).
// The best path the CPU has is chosen; it can be pinned lower with `cpu::scoped_simd` /
// `cpu::force_simd` (tests, benchmarks) or KVSIFT_SIMD=portable|avx2|avx512 in the environment,
// read once.

#include <kvsift/core/element.hpp>
#include <kvsift/cpu/math.hpp>
#include <kvsift/cpu/simd.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace kvsift::cpu {

namespace detail {

// The portable path: logits [G, m] (K rows read once for the group), softmax_fast per query head,
// then V rows read once, accumulated into out [G, d].
template <Element T, class KeyAt, class ValueAt>
void attend_group_portable(const float* qg, int G, int d, std::size_t m, KeyAt&& key,
                           ValueAt&& value, float* out, float scale, std::vector<float>& logits,
                           float* lse = nullptr) {
  thread_local std::vector<float> row;
  logits.resize(static_cast<std::size_t>(G) * m);
  row.resize(static_cast<std::size_t>(d));
  const auto as_float = [&](const T* x) -> const float* {  // converted once for the group
    if constexpr (std::is_same_v<T, float>) {
      return x;
    } else {
      for (int c = 0; c < d; ++c) row[c] = to_float(x[c]);
      return row.data();
    }
  };
  for (std::size_t j = 0; j < m; ++j) {
    const float* k = as_float(key(j));
    for (int g = 0; g < G; ++g) logits[g * m + j] = kvsift::dot(qg + g * d, k, d) * scale;
  }
  for (int g = 0; g < G; ++g) {
    if (lse != nullptr) {  // before the softmax overwrites the logits
      const float* x = logits.data() + g * m;
      const float top = *std::max_element(x, x + m);
      double sum = 0.0;
      for (std::size_t j = 0; j < m; ++j) sum += std::exp(static_cast<double>(x[j]) - top);
      lse[g] = top + static_cast<float>(std::log(sum));
    }
    softmax_fast(std::span<float>(logits.data() + g * m, m));
    for (int c = 0; c < d; ++c) out[g * d + c] = 0.0f;
  }
  for (std::size_t j = 0; j < m; ++j) {
    const float* v = as_float(value(j));
    for (int g = 0; g < G; ++g) {
      const float w = logits[g * m + j];
      float* o = out + g * d;
      for (int c = 0; c < d; ++c) o[c] += w * v[c];
    }
  }
}

#if KVSIFT_HAVE_X86_SIMD_PATH
// What both vector paths share (no ISA beyond x86-64's SSE: inlined into either).
// Rows are prefetched twice: into L1 kPrefetchRows ahead, and into L2 kFarRows ahead (the value
// pass: kRowBlock and kRowBlock + kFarRows rows ahead, prefetch_tile_ahead), so more
// lines are in flight than L1's miss buffers allow and the memory stays busy while the FMAs run
// (a bf16 full-KV step at 32K 4.4-4.5 -> 4.1 ms on a 2-core AMD EPYC VM, interleaved runs,
// docs/performance.md "Latest tables (2026-11-27 evening)").
constexpr int kPrefetchRows = 16;
constexpr int kFarRows = 64;

// Every 64-byte line of a row into L1 (_MM_HINT_T0), for the rows kPrefetchRows ahead (the logits
// passes) and the value passes' first block, a row at a time.
// The prefetch helpers are forced inline: GCC 12's IPA pure-const analysis takes a function whose
// body only prefetches for one without effects and deletes its calls (it did so to a first
// version of prefetch_rows_far), so the prefetches must sit in the kernel's own body.
template <Element T>
[[gnu::always_inline]] inline void prefetch_row(const T* p, int d) {
  const char* b = reinterpret_cast<const char*>(p);
  const int bytes = d * static_cast<int>(sizeof(T));
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(b + o, _MM_HINT_T0);
}

// Every 64-byte line of [b, e) into L2 (_MM_HINT_T2), four lines per loop step. Written over
// pointers: GCC 12 deletes the same loop over a size_t offset with four prefetches in its body.
[[gnu::always_inline]] inline void prefetch_span_far(const char* b, const char* e) {
  for (; b + 192 < e; b += 256) {
    _mm_prefetch(b, _MM_HINT_T2);
    _mm_prefetch(b + 64, _MM_HINT_T2);
    _mm_prefetch(b + 128, _MM_HINT_T2);
    _mm_prefetch(b + 192, _MM_HINT_T2);
  }
  for (; b < e; b += 64) _mm_prefetch(b, _MM_HINT_T2);
}

// Every line of rows [j0, j1) (row(j): row j's d elements) into L2, for the rows kFarRows ahead
// of the logits passes (the value passes prefetch per tile, prefetch_tile_ahead). Rows whose
// first and last lie one span apart (a page's rows in order: the common case) are one loop over
// the span's lines, otherwise a loop per row: the same lines either way (a prefetch never
// faults), in fewer instructions than a loop per row. Measured against the loop per row, both
// passes (docs/performance.md, "2026-11-28, fourth session"): one core, 32K rows in pages of 16
// scattered through the pool (largely from L3 on that VM), bf16 761-820 -> 599-693 us, f32
// 1371-1700 -> 1240-1389 us; f32 rows in L2 44-47 -> 50-52 G multiply-adds/s. (The near
// prefetches stay a row at a time: the span loop for them too measured slower there.) From DRAM,
// dropping the near or the far prefetches costs 1.1-1.4x, both 1.5-2.5x
// (docs/cpu-runs/2026-11-29b).
template <Element T, class RowAt>
[[gnu::always_inline]] inline void prefetch_rows_far(RowAt& row, std::size_t j0, std::size_t j1, int d) {
  if (j0 >= j1) return;
  const std::size_t rb = static_cast<std::size_t>(d) * sizeof(T);
  const char* first = reinterpret_cast<const char*>(row(j0));
  if (reinterpret_cast<const char*>(row(j1 - 1)) == first + (j1 - 1 - j0) * rb) {
    prefetch_span_far(first, first + (j1 - j0) * rb);
    return;
  }
  for (std::size_t j = j0; j < j1; ++j) {
    const char* b = reinterpret_cast<const char*>(row(j));
    prefetch_span_far(b, b + rb);
  }
}

// The logits passes' prefetches for the `rows` rows from j: those kPrefetchRows ahead into L1 a
// row at a time, those kFarRows ahead into L2 (prefetch_rows_far), none past row m - 1.
template <Element T, class RowAt>
[[gnu::always_inline]] inline void prefetch_logits_ahead(RowAt& row, std::size_t j,
                                                         std::size_t rows, std::size_t m, int d) {
  for (std::size_t p = j + kPrefetchRows; p < std::min(m, j + kPrefetchRows + rows); ++p) {
    prefetch_row(row(p), d);
  }
  prefetch_rows_far<T>(row, j + kFarRows, std::min(m, j + kFarRows + rows), d);
}

// The value passes' prefetches, spread over their rows: with row j of a block of kRowBlock rows,
// a channel tile's lines (Channels elements from c0) of row j + kRowBlock into L1 and of row
// j + kRowBlock + kFarRows into L2, rows past the last clamped to it (m - 1, m > 0: no branch in
// the row loop). So every row from kRowBlock on has each line prefetched into L1 once (the first
// block's: prefetch_row, by the caller), and every row from kRowBlock + kFarRows on into L2 too,
// by the tile that reads it (of tiles narrower than a line, the one whose offset in the row starts
// a line: the callers' Prefetch). Against the block at a time it replaces (a block's 2 x 64
// prefetches in one burst before the block), one core, one GQA group (4 heads, head_dim 128), 1M
// contiguous rows from DRAM: the AVX-512 bf16 value pass 19.7-20.5 -> 31.6-32.1 GB/s, the AVX2 f32
// one 14-15 -> 36; in cache unchanged or faster (docs/performance.md, "2026-12-01").
constexpr std::size_t kRowBlock = 16;

// Both vector paths take the rows in chunks of kChunk (online softmax, as FlashDecoding splits a
// sequence): a chunk's logits (G x kChunk floats, 32 KB for a group of 4) stay in L1/L2 between
// its logits, exp and accumulate passes however long the sequence, and each chunk rescales what
// the earlier ones accumulated by exp(old max - new max). The scratch is bounded: the AVX-512
// path held the whole sequence's logits before (G x m floats, 2 MB a thread at 128K, 16 MB at
// 1M). Speed from DRAM was unchanged within the noise on AVX-512; the AVX2 path, whose prefetches
// stopped at each chunk's end before, read 32K rows 2-12% faster on 3 of 4 decode rows
// (docs/performance.md, "2026-12-05, eleventh session").
constexpr std::size_t kChunk = 2048;

// The online softmax's state for a group's G heads across the chunks (attend_group on both vector
// paths): per head the running maximum and sum, and the factor the output of the earlier chunks
// is rescaled by when a chunk raises the maximum. Per-thread scratch.
class online_softmax {
 public:
  explicit online_softmax(int G) : G_(G) {
    thread_local std::vector<float> state;
    state.resize(3 * static_cast<std::size_t>(G));
    run_max_ = state.data();
    run_sum_ = run_max_ + G;
    factor_ = run_sum_ + G;
  }
  // One chunk's logits lg [G, n] to exp(logit - running maximum), in place, through the path's
  // row_max(x, n) and exp_row(x, n, top). True when a head's maximum grew: the output so far
  // must then be scaled by factors() (1 for the heads whose maximum stayed).
  template <class RowMax, class ExpRow>
  bool chunk(float* lg, std::size_t n, bool first, RowMax&& row_max, ExpRow&& exp_row) {
    bool grew = false;
    for (int g = 0; g < G_; ++g) {
      float* x = lg + static_cast<std::size_t>(g) * n;
      const float top = row_max(x, n);
      if (first) {
        run_max_[g] = top;
        run_sum_[g] = exp_row(x, n, top);
        continue;
      }
      const float next = std::max(run_max_[g], top);
      factor_[g] = next > run_max_[g] ? exp_nonpositive(run_max_[g] - next) : 1.0f;
      grew = grew || next > run_max_[g];
      run_sum_[g] = run_sum_[g] * factor_[g] + exp_row(x, n, next);
      run_max_[g] = next;
    }
    return grew;
  }
  // Head g's log-sum-exp of every logit so far (its running maximum plus the log of its sum):
  // what a partial attention hands to a merge (attention/merge.hpp). Before normalisers().
  [[nodiscard]] float lse(int g) const { return run_max_[g] + std::log(run_sum_[g]); }
  // Every head's lse into out[0, G).
  void lse_into(float* out) const {
    if (out == nullptr) return;
    for (int g = 0; g < G_; ++g) out[g] = lse(g);
  }
  // The final scaling, 1 / sum per head.
  const float* normalisers() {
    for (int g = 0; g < G_; ++g) factor_[g] = 1.0f / run_sum_[g];
    return factor_;
  }
  [[nodiscard]] const float* factors() const { return factor_; }

 private:
  int G_;
  float* run_max_;
  float* run_sum_;
  float* factor_;
};

template <int Channels, Element T, class ValueAt>
[[gnu::always_inline]] inline void prefetch_tile_ahead(ValueAt& value, std::size_t j,
                                                       std::size_t m, int c0) {
  constexpr int lines = (Channels * static_cast<int>(sizeof(T)) + 63) / 64;
  const std::size_t jn = j + kRowBlock < m ? j + kRowBlock : m - 1;
  const std::size_t jf = j + kRowBlock + kFarRows < m ? j + kRowBlock + kFarRows : m - 1;
  const char* to_l1 = reinterpret_cast<const char*>(value(jn) + c0);
  const char* to_l2 = reinterpret_cast<const char*>(value(jf) + c0);
  KVSIFT_UNROLL
  for (int l = 0; l < lines; ++l) {
    _mm_prefetch(to_l1 + 64 * l, _MM_HINT_T0);
    _mm_prefetch(to_l2 + 64 * l, _MM_HINT_T2);
  }
}

// f.template operator()<Prefetch>(): Prefetch for the tile of `channels` elements at c0 unless it
// is narrower than a line and does not start one (the line's first tile prefetches it).
template <Element T, class F>
void with_tile_prefetch(int c0, int channels, F&& f) {
  const auto bytes = [](int c) { return static_cast<std::size_t>(c) * sizeof(T); };
  if (bytes(channels) >= 64 || bytes(c0) % 64 == 0) return f.template operator()<true>();
  f.template operator()<false>();
}

namespace avx512 {

// 16 elements as floats: bf16 is the upper half of a binary32 (a shift), f16 converts exactly.
template <Element T>
KVSIFT_TARGET_AVX512 inline __m512 load16(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// A row as 16-lane slots of floats. Paired (bf16 with head_dim % 32 == 0): one 64-byte load holds
// 32 channels, channel 2i in dword i's low half and 2i + 1 in its high half, so slot 2k is chunk
// k's even channels (a shift left by 16) and slot 2k + 1 its odd ones (an AND): one ALU operation
// per 16 channels and one load per 32 in the value pass (the logits load it per slot) instead of a
// widening load (vpmovzxwd) and a shift per 16. The query and the output are kept in the same slot
// order (to_paired_order), so the dot products sum the same products in another order. Otherwise
// slot s is channels [16s, 16s + 16). Measured on one core, one GQA group
// (docs/cpu-runs/2026-11-29/kernels.txt): bf16 32K rows in scattered pages (16.8 MB: from L3 on
// that VM) median 652 -> 627 us; in L2 unchanged; from DRAM (docs/cpu-runs/2026-11-29b) 512K rows
// in scattered pages 20.3 -> 18.9 ms, 1M contiguous rows 31.6 -> 33.0 ms (the latter within the
// noise).
template <bool Paired>
constexpr int slots_per_load = Paired ? 2 : 1;

// f.template operator()<Paired>(), Paired for bf16 rows with head_dim % 32 == 0.
template <Element T, class F>
void with_pairing(int d, F&& f) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (d % 32 == 0) return f.template operator()<true>();
  }
  f.template operator()<false>();
}

// Slot `s` (< slots_per_load) of the slots loaded at p.
template <Element T, bool Paired>
KVSIFT_TARGET_AVX512 inline __m512 load_slot(const T* p, int s) {
  if constexpr (Paired) {
    static_assert(std::is_same_v<T, bfloat16>);
    const __m512i x = _mm512_loadu_si512(p);
    return _mm512_castsi512_ps(
        s == 0 ? _mm512_slli_epi32(x, 16)
               : _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  } else {
    return load16(p);
  }
}

// y = x in the slot order of Paired rows, for each 32-channel chunk of a [rows, d] float array:
// channels (0, 1, ..., 31) to (0, 2, ..., 30, 1, 3, ..., 31).
KVSIFT_TARGET_AVX512 inline void to_paired_order(const float* x, float* y, int rows, int d) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int c = 0; c < rows * d; c += 32) {
    const __m512 a = _mm512_loadu_ps(x + c), b = _mm512_loadu_ps(x + c + 16);
    _mm512_storeu_ps(y + c, _mm512_permutex2var_ps(a, even, b));
    _mm512_storeu_ps(y + c + 16, _mm512_permutex2var_ps(a, odd, b));
  }
}

// [sum(a), sum(b), sum(c), sum(d)]. (The maskz forms with a full mask are the plain
// instructions; GCC 12's unmasked wrappers pass an undefined vector that -Wmaybe-uninitialized
// reports at every use.)
KVSIFT_TARGET_AVX512 inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  constexpr __mmask16 all = 0xffff;
  const __m512 ab = _mm512_add_ps(_mm512_maskz_unpacklo_ps(all, a, b), _mm512_maskz_unpackhi_ps(all, a, b));
  const __m512 cd = _mm512_add_ps(_mm512_maskz_unpacklo_ps(all, c, d), _mm512_maskz_unpackhi_ps(all, c, d));
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
  const __m256 lo = _mm512_castps512_ps256(s);
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(s), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  return _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
}

// exp_nonpositive (cpu/math.hpp) on 16 lanes.
KVSIFT_TARGET_AVX512 inline __m512 exp_nonpositive16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                                   _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// logits[g * ld + j + r] = scale * q_g . k[r] for four rows k[0..3] and GC <= 4 query heads (q in
// the rows' slot order, load_slot): 4 x GC independent accumulator chains (a row's 16-lane slots
// are a chain of d / 16 dependent FMAs; one row at a time leaves the FMA units waiting on that
// latency), and the four rows of a head reduce together into four consecutive logits.
template <int GC, Element T, bool Paired>
KVSIFT_TARGET_AVX512 inline void logits_quad(const float* q, int d, const T* const* k, float scale,
                                             float* logits, std::size_t ld, std::size_t j) {
  static_assert(GC >= 1 && GC <= 4);
  constexpr int S = slots_per_load<Paired>;
  __m512 acc[GC][4];
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int r = 0; r < 4; ++r) acc[g][r] = _mm512_setzero_ps();
  }
  // Paired: each slot loads its 64 bytes again (from L1); holding both slots of the four rows
  // spilled registers.
  for (int b = 0; b < d / 16; b += S) {
    KVSIFT_UNROLL
    for (int s = 0; s < S; ++s) {
      __m512 kv[4];
      KVSIFT_UNROLL
      for (int r = 0; r < 4; ++r) kv[r] = load_slot<T, Paired>(k[r] + 16 * b, s);
      KVSIFT_UNROLL
      for (int g = 0; g < GC; ++g) {
        const __m512 qv = _mm512_loadu_ps(q + g * d + 16 * (b + s));
        KVSIFT_UNROLL
        for (int r = 0; r < 4; ++r) acc[g][r] = _mm512_fmadd_ps(qv, kv[r], acc[g][r]);
      }
    }
  }
  const __m128 sc = _mm_set1_ps(scale);
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    _mm_storeu_ps(logits + g * ld + j,
                  _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sc));
  }
}

// logits[g * ld + j] = scale * q_g . key(j) for j in [0, m) and the GC <= 8 query heads q [GC, d]
// (in the rows' slot order): rows in fours (each row converted once per four heads), the last
// m % 4 one by one. key(j) exists for j < ahead (>= m): the prefetches run on past row m - 1 into
// the rows of the chunk after this one (attend_group).
template <int GC, Element T, bool Paired, class KeyAt>
KVSIFT_TARGET_AVX512 void logits_block(const float* q, int d, std::size_t m, std::size_t ahead,
                                       KeyAt& key, float scale, float* logits, std::size_t ld) {
  static_assert(GC >= 1 && GC <= 8);
  constexpr int S = slots_per_load<Paired>;
  std::size_t j = 0;
  for (; j + 4 <= m; j += 4) {
    prefetch_logits_ahead<T>(key, j, 4, ahead, d);
    const T* k[4] = {key(j), key(j + 1), key(j + 2), key(j + 3)};
    logits_quad<(GC < 4 ? GC : 4), T, Paired>(q, d, k, scale, logits, ld, j);
    if constexpr (GC > 4) {
      logits_quad<GC - 4, T, Paired>(q + 4 * d, d, k, scale, logits + 4 * ld, ld, j);
    }
  }
  for (; j < m; ++j) {
    const T* k = key(j);
    __m512 acc[8];
    KVSIFT_UNROLL
    for (int g = 0; g < 8; ++g) acc[g] = _mm512_setzero_ps();
    for (int b = 0; b < d / 16; b += S) {
      KVSIFT_UNROLL
      for (int s = 0; s < S; ++s) {
        const __m512 kv = load_slot<T, Paired>(k + 16 * b, s);
        KVSIFT_UNROLL
        for (int g = 0; g < GC; ++g) {
          acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * d + 16 * (b + s)), kv, acc[g]);
        }
      }
    }
    alignas(16) float s[8];
    const __m128 sc = _mm_set1_ps(scale);
    _mm_store_ps(s, _mm_mul_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), sc));
    if constexpr (GC > 4) _mm_store_ps(s + 4, _mm_mul_ps(hsum4(acc[4], acc[5], acc[6], acc[7]), sc));
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) logits[g * ld + j] = s[g];
  }
}

// max x[j] over one row of m > 0 floats.
KVSIFT_TARGET_AVX512 inline float row_max(const float* x, std::size_t m) {
  std::size_t j = 0;
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (; j + 16 <= m; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(x + j));
  float top = _mm512_reduce_max_ps(mx);
  for (; j < m; ++j) top = std::max(top, x[j]);
  return top;
}

// x[j] = exp(x[j] - top) over one row (top >= max x); returns the sum (the normaliser, applied
// at the end).
KVSIFT_TARGET_AVX512 inline float exp_row(float* x, std::size_t m, float top) {
  const __m512 t = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  std::size_t j = 0;
  for (; j + 16 <= m; j += 16) {
    const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + j), t));
    _mm512_storeu_ps(x + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (j < m) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (m - j)) - 1u);
    const __m512 e =
        exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + j), t));
    _mm512_mask_storeu_ps(x + j, tail, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
  }
  return _mm512_reduce_add_ps(sum);
}

// out[g, c0 .. c0 + 16 CT) += sum_{j in [j0, j1)} w[g * ld + j] value(j)[c0 ..] for GC heads
// and j0 < j1 <= m (out in the rows' slot order, load_slot), the accumulators in registers across
// the rows: a row loop that runs at least once, with no branch in it (its prefetches clamp
// instead), over accumulators that start from `out` (the caller zeroes it); otherwise GCC 12
// stores every accumulator on every row (avx2::accumulate_block, the same kernel, was measured
// both ways).
template <int GC, int CT, Element T, bool Paired, bool Prefetch, class ValueAt>
KVSIFT_TARGET_AVX512 void accumulate_block(const float* w, std::size_t ld, int c0, int d,
                                           std::size_t j0, std::size_t j1, std::size_t m,
                                           ValueAt& value, float* out) {
  constexpr int S = slots_per_load<Paired>;
  static_assert(GC * CT <= 16 && CT % S == 0);
  __m512 acc[GC][CT];
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) acc[g][t] = _mm512_loadu_ps(out + g * d + c0 + 16 * t);
  }
  std::size_t j = j0;
  do {
    const T* v = value(j) + c0;
    if constexpr (Prefetch) prefetch_tile_ahead<16 * CT, T>(value, j, m, c0);
    __m512 vv[CT];
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) vv[t] = load_slot<T, Paired>(v + 16 * (t / S * S), t % S);
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) {
      const __m512 wg = _mm512_set1_ps(w[g * ld + j]);
      KVSIFT_UNROLL
      for (int t = 0; t < CT; ++t) acc[g][t] = _mm512_fmadd_ps(wg, vv[t], acc[g][t]);
    }
  } while (++j < j1);
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) _mm512_storeu_ps(out + g * d + c0 + 16 * t, acc[g][t]);
  }
}

// out[g, :] += sum_{j < m} w[g * ld + j] value(j) for GC heads and m > 0 rows (value(j) exists for
// j < ahead, ahead >= m: the prefetches run on into the rows after these). Channel tiles of kTile
// 16-lane slots (GC x kTile <= 16 accumulators); rows in blocks of kRowBlock, every tile of a
// block before the next block, so a V row comes from memory once (the later tiles find it in L1);
// the tiles' row loops prefetch the blocks ahead (prefetch_tile_ahead), the caller the first one.
template <int GC, Element T, bool Paired, class ValueAt>
KVSIFT_TARGET_AVX512 void accumulate_rows(const float* w, std::size_t ld, int d, std::size_t m,
                                          std::size_t ahead, ValueAt& value, float* out) {
  constexpr int kTile = GC == 1 ? 8 : GC == 2 ? 8 : GC <= 4 ? 4 : 2;
  constexpr int S = slots_per_load<Paired>;
  for (std::size_t j0 = 0; j0 < m; j0 += kRowBlock) {
    const std::size_t j1 = std::min(m, j0 + kRowBlock);
    int c0 = 0;
    for (; c0 + 16 * kTile <= d; c0 += 16 * kTile) {
      with_tile_prefetch<T>(c0, 16 * kTile, [&]<bool P>() {
        accumulate_block<GC, kTile, T, Paired, P>(w, ld, c0, d, j0, j1, ahead, value, out);
      });
    }
    for (; c0 < d; c0 += 16 * S) {
      with_tile_prefetch<T>(c0, 16 * S, [&]<bool P>() {
        accumulate_block<GC, S, T, Paired, P>(w, ld, c0, d, j0, j1, ahead, value, out);
      });
    }
  }
}

// out[g, :] *= s[g] for GC heads; Paired rows' slots (even, odd) of each 32 channels put back in
// channel order.
template <Element T, bool Paired>
KVSIFT_TARGET_AVX512 void finish_heads(const float* s, int G, int d, float* out) {
  for (int g = 0; g < G; ++g) {
    const __m512 sg = _mm512_set1_ps(s[g]);
    float* o = out + g * d;
    if constexpr (Paired) {
      const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
      const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
      for (int c = 0; c < d; c += 32) {
        const __m512 e = _mm512_mul_ps(_mm512_loadu_ps(o + c), sg);
        const __m512 od = _mm512_mul_ps(_mm512_loadu_ps(o + c + 16), sg);
        _mm512_storeu_ps(o + c, _mm512_permutex2var_ps(e, lo, od));
        _mm512_storeu_ps(o + c + 16, _mm512_permutex2var_ps(e, hi, od));
      }
    } else {
      for (int c = 0; c < d; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), sg));
    }
  }
}

// out[g, :] = inv[g] * sum_j w[g * ld + j] value(j) for GC heads and m > 0 rows (Paired rows
// accumulate in slot order, put back in channel order by the final scaling).
template <int GC, Element T, bool Paired, class ValueAt>
KVSIFT_TARGET_AVX512 void accumulate_heads(const float* w, std::size_t ld, const float* inv, int d,
                                           std::size_t m, ValueAt& value, float* out) {
  for (int c = 0; c < GC * d; c += 16) _mm512_storeu_ps(out + c, _mm512_setzero_ps());  // no memset call
  for (std::size_t j = 0; j < std::min(m, kRowBlock); ++j) prefetch_row(value(j), d);
  accumulate_rows<GC, T, Paired>(w, ld, d, m, m, value, out);
  finish_heads<T, Paired>(inv, GC, d, out);
}

// The key pass of bf16 rows on the AMX tile unit (the amx path): 16 key rows at a time are one
// tile product (TDPBF16PS), the rows the A tile as they lie in memory (16 rows x 32 channels, the
// row stride apart), the query heads the B tile. The query is float, so each head is split in
// three bf16 parts, hi + mid + lo (each the remainder of the ones before, rounded: the 24
// significant bits a float holds), each a column of its own: a bf16 key times a bf16 part is
// exact in float, and the tile unit adds the products in float (denormals flushed). A head's logit
// is (lo + mid) + hi of its three columns: within ~1e-7 of the AVX-512 kernel's. What it saves is
// instructions, not arithmetic: the FMA kernel's ~75 per 256-byte row leave the out-of-order
// window too few loads to keep DRAM busy (a key pass with no arithmetic at all read bf16 rows ~9%
// faster, docs/performance.md, "2026-12-05, twelfth session"); here a tile load takes 16 lines.

// LDTILECFG's 64 bytes (palette 1): per tile its rows and bytes per row.
struct amx_tile_config {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(amx_tile_config) == 64);

constexpr int kAmxHeads = 4;                // query heads per B tile (3 parts each: 12 columns)
constexpr std::size_t kAmxTileWords = 512;  // one B tile: 16 rows of 64 bytes, as uint16

// The B tiles of GC <= kAmxHeads query heads q [GC, d] (d % 32 == 0): per 32-channel chunk kc, 16
// rows (channel pairs) of 64 bytes, column s GC + g holding part s of q_g's two channels:
// tiles[kc * 512 + r * 32 + (s GC + g) * 2 + i] = part_s(q_g[32 kc + 2 r + i]).
inline void amx_query_tiles(const float* q, int GC, int d, std::uint16_t* tiles) {
  std::fill(tiles, tiles + static_cast<std::size_t>(d / 32) * kAmxTileWords, std::uint16_t{0});
  for (int c = 0; c < d; ++c) {
    const std::size_t at = static_cast<std::size_t>(c / 32) * kAmxTileWords + (c % 32) / 2 * 32 + c % 2;
    for (int g = 0; g < GC; ++g) {
      float x = q[static_cast<std::size_t>(g) * d + c];
      for (int s = 0; s < 3; ++s) {
        const std::uint16_t b = kvsift::detail::float_to_bfloat16_bits(x);
        tiles[at + static_cast<std::size_t>(s * GC + g) * 2] = b;
        x -= to_float(bfloat16::from_bits(b));  // exact: x minus its nearest bf16
      }
    }
  }
}

// logits[g * ld + j .. + 16) = scale * ((lo + mid) + hi) from a stored C tile c [16 rows][16
// floats] whose row t holds hi, mid, lo of GC heads (columns s GC + g). Four heads: sums in
// 128-bit lanes four rows at a time, then two permutes per pair of heads; fewer: gathers.
template <int GC>
KVSIFT_TARGET_AVX512 inline void amx_store_logits(const float* c, float scale, float* logits,
                                                  std::size_t ld, std::size_t j) {
  const __m512 sc = _mm512_set1_ps(scale);
  if constexpr (GC == 4) {
    __m512 sums[4];  // sums[b]: rows 4b .. 4b + 3, each its four heads' logits
    KVSIFT_UNROLL
    for (int b = 0; b < 4; ++b) {
      const __m512 r0 = _mm512_load_ps(c + 64 * b), r1 = _mm512_load_ps(c + 64 * b + 16);
      const __m512 r2 = _mm512_load_ps(c + 64 * b + 32), r3 = _mm512_load_ps(c + 64 * b + 48);
      const __m512 t01 = _mm512_shuffle_f32x4(r0, r1, 0x44), t23 = _mm512_shuffle_f32x4(r2, r3, 0x44);
      const __m512 u01 = _mm512_shuffle_f32x4(r0, r1, 0xEE), u23 = _mm512_shuffle_f32x4(r2, r3, 0xEE);
      const __m512 hi = _mm512_shuffle_f32x4(t01, t23, 0x88);
      const __m512 mid = _mm512_shuffle_f32x4(t01, t23, 0xDD);
      const __m512 lo = _mm512_shuffle_f32x4(u01, u23, 0x88);
      sums[b] = _mm512_add_ps(_mm512_add_ps(lo, mid), hi);
    }
    // heads (0, 1) of rows 0..7 from sums[0], sums[1]: lane i < 8 head 0 of row i, else head 1
    const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i pick23 = _mm512_add_epi32(pick, _mm512_set1_epi32(2));
    const __m512 a01 = _mm512_permutex2var_ps(sums[0], pick, sums[1]);
    const __m512 a23 = _mm512_permutex2var_ps(sums[2], pick, sums[3]);
    const __m512 b01 = _mm512_permutex2var_ps(sums[0], pick23, sums[1]);
    const __m512 b23 = _mm512_permutex2var_ps(sums[2], pick23, sums[3]);
    _mm512_storeu_ps(logits + j, _mm512_mul_ps(_mm512_shuffle_f32x4(a01, a23, 0x44), sc));
    _mm512_storeu_ps(logits + ld + j, _mm512_mul_ps(_mm512_shuffle_f32x4(a01, a23, 0xEE), sc));
    _mm512_storeu_ps(logits + 2 * ld + j, _mm512_mul_ps(_mm512_shuffle_f32x4(b01, b23, 0x44), sc));
    _mm512_storeu_ps(logits + 3 * ld + j, _mm512_mul_ps(_mm512_shuffle_f32x4(b01, b23, 0xEE), sc));
  } else {
    const __m512i rows = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192,
                                           208, 224, 240);
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) {
      const __m512 hi = _mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32(g)), c, 4);
      const __m512 mid = _mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32(GC + g)), c, 4);
      const __m512 lo = _mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32(2 * GC + g)), c, 4);
      _mm512_storeu_ps(logits + g * ld + j, _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(lo, mid), hi), sc));
    }
  }
}

// logits[g * ld + j] = scale * q_g . key(j) for the rows j < n / 16 * 16 (returned) and GC <=
// kAmxHeads heads given as their B tiles (amx_query_tiles). key(j) exists for j < ahead (>= n):
// the near prefetches (into L1, kPrefetchRows ahead) run on into the next chunk; the far ones
// (into L2) measured no faster here. A block's rows that do not lie the row stride apart (a
// page's end, rows out of slot order) are copied together first.
template <int GC, class KeyAt>
KVSIFT_TARGET_AMX std::size_t amx_logits(const std::uint16_t* qt, int d, std::size_t n,
                                         std::size_t ahead, KeyAt& key, float scale,
                                         float* logits, std::size_t ld) {
  static_assert(GC >= 1 && GC <= kAmxHeads);
  const std::size_t n16 = n / 16 * 16;
  if (n16 == 0) return 0;
  amx_tile_config cfg;
  cfg.rows[0] = 16;  // C: 16 rows x 3 GC floats
  cfg.colsb[0] = static_cast<std::uint16_t>(12 * GC);
  cfg.rows[1] = 16;  // A: 16 key rows x 32 channels
  cfg.colsb[1] = 64;
  cfg.rows[2] = 16;  // B: 16 channel pairs x 3 GC columns of two
  cfg.colsb[2] = static_cast<std::uint16_t>(12 * GC);
  _tile_loadconfig(&cfg);
  alignas(64) float c[16 * 16] = {};  // rows of 3 GC floats stored; the rest of each row read, unused
  thread_local std::vector<bfloat16> stage;
  const std::size_t rb = static_cast<std::size_t>(d) * sizeof(bfloat16);
  for (std::size_t j = 0; j < n16; j += 16) {
    for (std::size_t p = j + kPrefetchRows; p < std::min(ahead, j + kPrefetchRows + 16); ++p) {
      prefetch_row(key(p), d);
    }
    const char* base = reinterpret_cast<const char*>(key(j));
    bool strided = true;
    for (int i = 1; i < 16; ++i) strided &= reinterpret_cast<const char*>(key(j + i)) == base + i * rb;
    if (!strided) {
      stage.resize(16 * static_cast<std::size_t>(d));
      for (int i = 0; i < 16; ++i) std::memcpy(stage.data() + i * d, key(j + i), rb);
      base = reinterpret_cast<const char*>(stage.data());
    }
    _tile_zero(0);
    for (int kc = 0; kc < d / 32; ++kc) {
      _tile_loadd(1, base + 64 * kc, static_cast<long>(rb));
      _tile_loadd(2, qt + kc * kAmxTileWords, 64);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, c, 64);
    amx_store_logits<GC>(c, scale, logits, ld, j);
  }
  _tile_release();
  return n16;
}

// krow[j] / vrow[j]: row j's addresses, looked up once by the caller (the kernels and their
// prefetches ask for each row several times). bf16 rows with head_dim % 32 == 0 are Paired
// (load_slot): the query is put in slot order once here. Rows in chunks of kChunk (online
// softmax); each pass's prefetches run on into the next chunk's rows (the `ahead` bounds), so the
// K and V streams stay ahead across the chunks' turns.
template <Element T>
void attend_group(const float* qg, int G, int d, std::size_t m, const T* const* krow,
                  const T* const* vrow, float* out, float scale, std::vector<float>& logits,
                  bool amx = false, float* lse = nullptr) {
  const std::size_t chunk = std::min(m, kChunk);
  logits.resize(static_cast<std::size_t>(G) * chunk);
  float* lg = logits.data();
  online_softmax softmax(G);
  const auto max_of = [](const float* x, std::size_t n) { return row_max(x, n); };
  const auto exp_of = [](float* x, std::size_t n, float top) { return exp_row(x, n, top); };
  with_pairing<T>(d, [&]<bool Paired>() {
    const float* q = qg;
    if constexpr (Paired) {
      thread_local std::vector<float> qs;
      qs.resize(static_cast<std::size_t>(G) * d);
      to_paired_order(qg, qs.data(), G, d);
      q = qs.data();
    }
    std::fill(out, out + static_cast<std::size_t>(G) * d, 0.0f);
    // the amx path's key pass: bf16 rows, head_dim % 32 == 0 (Paired), B tiles of the query built
    // once (amx_query_tiles)
    thread_local std::vector<std::uint16_t> qt;
    const bool tiles = Paired && amx;
    if (tiles) {
      const std::size_t per = static_cast<std::size_t>(d / 32) * kAmxTileWords;
      qt.resize(static_cast<std::size_t>((G + kAmxHeads - 1) / kAmxHeads) * per);
      for (int g0 = 0; g0 < G; g0 += kAmxHeads) {
        amx_query_tiles(qg + g0 * d, std::min(kAmxHeads, G - g0), d, qt.data() + g0 / kAmxHeads * per);
      }
    }
    for (std::size_t c0 = 0; c0 < m; c0 += chunk) {
      const std::size_t n = std::min(chunk, m - c0);
      const std::size_t ahead = m - c0;
      const T* const* kc = krow + c0;
      const T* const* vc = vrow + c0;
      auto key = [kc](std::size_t j) { return kc[j]; };
      auto value = [vc](std::size_t j) { return vc[j]; };
      if constexpr (Paired) {
        for (int g0 = 0; g0 < G && tiles; g0 += kAmxHeads) {  // 16 rows at a time, the rest below
          with_heads<kAmxHeads>(std::min(kAmxHeads, G - g0), [&]<int GC>() {
            const std::size_t per = static_cast<std::size_t>(d / 32) * kAmxTileWords;
            const std::size_t done = amx_logits<GC>(qt.data() + g0 / kAmxHeads * per, d, n, ahead,
                                                    key, scale, lg + g0 * n, n);
            auto rest = [kc, done](std::size_t j) { return kc[done + j]; };
            if (done < n) {
              logits_block<GC, T, Paired>(q + g0 * d, d, n - done, ahead - done, rest, scale,
                                          lg + g0 * n + done, n);
            }
          });
        }
      }
      for (int g0 = 0; g0 < G && !tiles; g0 += 8) {
        with_heads<8>(std::min(8, G - g0), [&]<int GC>() {
          logits_block<GC, T, Paired>(q + g0 * d, d, n, ahead, key, scale, lg + g0 * n, n);
        });
      }
      if (softmax.chunk(lg, n, c0 == 0, max_of, exp_of)) {
        finish_heads<T, false>(softmax.factors(), G, d, out);  // a scaling, slots left in place
      }
      if (c0 == 0) {
        for (std::size_t j = 0; j < std::min(n, kRowBlock); ++j) prefetch_row(value(j), d);
      }
      for (int g0 = 0; g0 < G; g0 += 8) {
        with_heads<8>(std::min(8, G - g0), [&]<int GC>() {
          accumulate_rows<GC, T, Paired>(lg + g0 * n, n, d, n, ahead, value, out + g0 * d);
        });
      }
    }
    softmax.lse_into(lse);
    finish_heads<T, Paired>(softmax.normalisers(), G, d, out);
  });
}

}  // namespace avx512

namespace avx2 {

// 8 elements as floats: bf16 is the upper half of a binary32 (a shift), f16 converts exactly.
template <Element T>
KVSIFT_TARGET_AVX2_NOFMA inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

// [sum(a), sum(b), sum(c), sum(d)]: three horizontal adds leave [a0-3 b0-3 c0-3 d0-3 | a4-7 ...].
KVSIFT_TARGET_AVX2 inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

KVSIFT_TARGET_AVX2 inline float hmax8(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

KVSIFT_TARGET_AVX2 inline float hsum8(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// exp_nonpositive (cpu/math.hpp) on 8 lanes.
KVSIFT_TARGET_AVX2 inline __m256 exp_nonpositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f),
                                   _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// logits[g * ld + j + r] = scale * q_g . k[r] for four rows k[0..3] and GC <= 2 query heads:
// 4 x GC accumulator chains, the four rows of a head reduced together (13 of the 16 registers).
template <int GC, Element T>
KVSIFT_TARGET_AVX2 inline void logits_quad(const float* q, int d, const T* const* k, float scale,
                                           float* logits, std::size_t ld, std::size_t j) {
  static_assert(GC >= 1 && GC <= 2);
  __m256 acc[GC][4];
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int r = 0; r < 4; ++r) acc[g][r] = _mm256_setzero_ps();
  }
  for (int b = 0; b < d / 8; ++b) {
    __m256 kv[4];
    KVSIFT_UNROLL
    for (int r = 0; r < 4; ++r) kv[r] = load8(k[r] + 8 * b);
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) {
      const __m256 qv = _mm256_loadu_ps(q + g * d + 8 * b);
      KVSIFT_UNROLL
      for (int r = 0; r < 4; ++r) acc[g][r] = _mm256_fmadd_ps(qv, kv[r], acc[g][r]);
    }
  }
  const __m128 sc = _mm_set1_ps(scale);
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    _mm_storeu_ps(logits + g * ld + j,
                  _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sc));
  }
}

// logits[g * ld + j + r] = scale * q_g . k[r] for two rows k[0..1] and four query heads: 8
// accumulator chains, each row loaded (a 16-bit row widened) once for the four heads. Each logit
// is the same sum in the same order as logits_quad's (a chain per head and row over the 8-lane
// blocks, then hsum4), so the two give equal bits.
template <Element T>
KVSIFT_TARGET_AVX2 inline void logits_pair4(const float* q, int d, const T* const* k, float scale,
                                            float* logits, std::size_t ld, std::size_t j) {
  __m256 acc[4][2];
  KVSIFT_UNROLL
  for (int g = 0; g < 4; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
  for (int b = 0; b < d / 8; ++b) {
    const __m256 k0 = load8(k[0] + 8 * b);
    const __m256 k1 = load8(k[1] + 8 * b);
    KVSIFT_UNROLL
    for (int g = 0; g < 4; ++g) {
      const __m256 qv = _mm256_loadu_ps(q + g * d + 8 * b);
      acc[g][0] = _mm256_fmadd_ps(qv, k0, acc[g][0]);
      acc[g][1] = _mm256_fmadd_ps(qv, k1, acc[g][1]);
    }
  }
  const __m128 sc = _mm_set1_ps(scale);
  KVSIFT_UNROLL
  for (int g = 0; g < 4; g += 2) {  // [g r0, g r1, g+1 r0, g+1 r1]
    const __m128 s = _mm_mul_ps(hsum4(acc[g][0], acc[g][1], acc[g + 1][0], acc[g + 1][1]), sc);
    _mm_storel_pi(reinterpret_cast<__m64*>(logits + g * ld + j), s);
    _mm_storeh_pi(reinterpret_cast<__m64*>(logits + (g + 1) * ld + j), s);
  }
}

// logits[g * ld + j] = scale * q_g . key(j) for GC <= 4 query heads. Four heads over 16-bit rows:
// rows in pairs, each row widened once for the four heads (logits_pair4). Otherwise rows in fours,
// two heads at a time (the second pair finds the four rows in L1, a 16-bit row widened again).
// The last rows one by one.
//
// Measured on one core of a Zen 2 VM, 4 heads, head_dim 128 (docs/cpu-runs/2026-12-03b): bf16
// logits pass 11.3-11.5 -> 12.2-12.6 GB/s in cache, 8.3-8.5 -> 10.4-10.5 from DRAM (rows read a
// block at a time across four rows' lines follow that core's hardware prefetcher worse than two
// rows': quad.cpp). f32 rows stay in fours: in pairs their logits read 15-20% slower in cache
// and 20-30% faster from DRAM.
// key(j) exists for j < ahead (>= m): the prefetches run on into the next chunk's rows.
template <int GC, Element T, class KeyAt>
KVSIFT_TARGET_AVX2 void logits_block(const float* q, int d, std::size_t m, std::size_t ahead,
                                     KeyAt& key, float scale, float* logits, std::size_t ld) {
  static_assert(GC >= 1 && GC <= 4);
  std::size_t j = 0;
  if constexpr (GC == 4 && !std::is_same_v<T, float>) {
    for (; j + 2 <= m; j += 2) {
      prefetch_logits_ahead<T>(key, j, 2, ahead, d);
      const T* k[2] = {key(j), key(j + 1)};
      logits_pair4<T>(q, d, k, scale, logits, ld, j);
    }
  }
  for (; j + 4 <= m; j += 4) {
    prefetch_logits_ahead<T>(key, j, 4, ahead, d);
    const T* k[4] = {key(j), key(j + 1), key(j + 2), key(j + 3)};
    logits_quad<(GC < 2 ? GC : 2), T>(q, d, k, scale, logits, ld, j);
    if constexpr (GC > 2) logits_quad<GC - 2, T>(q + 2 * d, d, k, scale, logits + 2 * ld, ld, j);
  }
  for (; j < m; ++j) {
    const T* k = key(j);
    __m256 acc[4];
    KVSIFT_UNROLL
    for (int g = 0; g < 4; ++g) acc[g] = _mm256_setzero_ps();
    for (int b = 0; b < d / 8; ++b) {
      const __m256 kv = load8(k + 8 * b);
      KVSIFT_UNROLL
      for (int g = 0; g < GC; ++g) {
        acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + 8 * b), kv, acc[g]);
      }
    }
    alignas(16) float s[4];
    _mm_store_ps(s, _mm_mul_ps(hsum4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(scale)));
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) logits[g * ld + j] = s[g];
  }
}

KVSIFT_TARGET_AVX2 inline float row_max(const float* x, std::size_t m) {
  std::size_t j = 0;
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (; j + 8 <= m; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + j));
  float top = hmax8(mx);
  for (; j < m; ++j) top = std::max(top, x[j]);
  return top;
}

// x[j] = exp(x[j] - top) over one row (top >= every x[j]); returns the sum.
KVSIFT_TARGET_AVX2 inline float exp_row(float* x, std::size_t m, float top) {
  const __m256 t = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  std::size_t j = 0;
  for (; j + 8 <= m; j += 8) {
    const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(x + j), t));
    _mm256_storeu_ps(x + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  float tail = 0.0f;
  for (; j < m; ++j) tail += (x[j] = exp_nonpositive(x[j] - top));
  return hsum8(sum) + tail;
}

// out[g, c0 .. c0 + 8 CT) += sum_{j in [j0, j1)} w[g * ld + j] value(j)[c0 ..] for GC heads and
// j0 < j1 <= m, GC x CT accumulators and GC broadcast weights in registers across the rows.
// Written so that GCC 12 keeps the accumulators in registers (checked in the object code): a row
// loop that runs at least once, with no branch in it (its prefetches clamp instead), over
// accumulators that start from `out` (the caller zeroes it); otherwise it stores every
// accumulator on every row.
template <int GC, int CT, Element T, bool Prefetch, class ValueAt>
KVSIFT_TARGET_AVX2 void accumulate_block(const float* w, std::size_t ld, int c0, int d,
                                         std::size_t j0, std::size_t j1, std::size_t m,
                                         ValueAt& value, float* out) {
  static_assert(GC * CT + GC + 1 <= 16);
  __m256 acc[GC][CT];
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) {
      acc[g][t] = _mm256_loadu_ps(out + g * d + c0 + 8 * t);
    }
  }
  std::size_t j = j0;
  do {  // j0 < j1: with a loop that may run zero times GCC 12 keeps acc in memory
    const T* v = value(j) + c0;
    if constexpr (Prefetch) prefetch_tile_ahead<8 * CT, T>(value, j, m, c0);
    __m256 wg[GC];
    KVSIFT_UNROLL
    for (int g = 0; g < GC; ++g) wg[g] = _mm256_broadcast_ss(w + g * ld + j);
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) {
      const __m256 vv = load8(v + 8 * t);
      KVSIFT_UNROLL
      for (int g = 0; g < GC; ++g) acc[g][t] = _mm256_fmadd_ps(wg[g], vv, acc[g][t]);
    }
  } while (++j < j1);
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) _mm256_storeu_ps(out + g * d + c0 + 8 * t, acc[g][t]);
  }
}

// out[g, :] += sum_j w[g * ld + j] value(j) for GC <= 4 heads and m > 0 rows: channel tiles of
// as many 8-lane blocks as the registers hold, rows in blocks of kRowBlock with every tile of a
// block before the next block, so a V row comes from memory once (the later tiles find it in
// L1); the first block is prefetched here, the later ones by the tiles' row loops
// (prefetch_tile_ahead), on into the next chunk's rows (vrow[j] exists for j < ahead, >= m).
template <int GC, Element T>
KVSIFT_TARGET_AVX2 void accumulate_heads(const float* w, std::size_t ld, int d, std::size_t m,
                                         std::size_t ahead, const T* const* vrow, float* out) {
  constexpr int kTile = GC == 1 ? 8 : GC == 2 ? 4 : 2;
  auto value = [vrow](std::size_t j) { return vrow[j]; };
  for (std::size_t j = 0; j < std::min(m, kRowBlock); ++j) prefetch_row(value(j), d);
  for (std::size_t j0 = 0; j0 < m; j0 += kRowBlock) {
    const std::size_t j1 = std::min(m, j0 + kRowBlock);
    int c0 = 0;
    for (; c0 + 8 * kTile <= d; c0 += 8 * kTile) {
      with_tile_prefetch<T>(c0, 8 * kTile, [&]<bool P>() {
        accumulate_block<GC, kTile, T, P>(w, ld, c0, d, j0, j1, ahead, value, out);
      });
    }
    for (; c0 < d; c0 += 8) {
      with_tile_prefetch<T>(c0, 8, [&]<bool P>() {
        accumulate_block<GC, 1, T, P>(w, ld, c0, d, j0, j1, ahead, value, out);
      });
    }
  }
}

// out[g, :] *= s[g] for GC heads.
KVSIFT_TARGET_AVX2 inline void scale_rows(float* out, int G, int d, const float* s) {
  for (int g = 0; g < G; ++g) {
    const __m256 sg = _mm256_set1_ps(s[g]);
    for (int c = 0; c < d; c += 8) {
      _mm256_storeu_ps(out + g * d + c, _mm256_mul_ps(_mm256_loadu_ps(out + g * d + c), sg));
    }
  }
}

template <Element T>
void attend_group(const float* qg, int G, int d, std::size_t m, const T* const* krow,
                  const T* const* vrow, float* out, float scale, std::vector<float>& logits,
                  float* lse = nullptr) {
  const std::size_t chunk = std::min(m, kChunk);
  logits.resize(static_cast<std::size_t>(G) * chunk);
  float* lg = logits.data();
  online_softmax softmax(G);
  const auto max_of = [](const float* x, std::size_t n) { return row_max(x, n); };
  const auto exp_of = [](float* x, std::size_t n, float top) { return exp_row(x, n, top); };
  std::fill(out, out + static_cast<std::size_t>(G) * d, 0.0f);
  for (std::size_t c0 = 0; c0 < m; c0 += chunk) {
    const std::size_t n = std::min(chunk, m - c0);
    const T* const* kc = krow + c0;
    auto key = [kc](std::size_t j) { return kc[j]; };
    for (int g0 = 0; g0 < G; g0 += 4) {
      with_heads<4>(std::min(4, G - g0), [&]<int GC>() {
        logits_block<GC, T>(qg + g0 * d, d, n, m - c0, key, scale, lg + g0 * n, n);
      });
    }
    if (softmax.chunk(lg, n, c0 == 0, max_of, exp_of)) scale_rows(out, G, d, softmax.factors());
    for (int g0 = 0; g0 < G; g0 += 4) {
      with_heads<4>(std::min(4, G - g0), [&]<int GC>() {
        accumulate_heads<GC, T>(lg + g0 * n, n, d, n, m - c0, vrow + c0, out + g0 * d);
      });
    }
  }
  softmax.lse_into(lse);
  scale_rows(out, G, d, softmax.normalisers());
}

}  // namespace avx2
#endif

}  // namespace detail

// out [G, d] = sum_j w[g * m + j] vrow[j][0, d) over j in [0, m) for G query heads: the values
// half of attend_group, for weights computed elsewhere (attention::attend_plan_batch's weighted
// form: the exact probabilities H2O's scorer reads, cpu/attention_rows.hpp). vrow[j] is row j's
// address (a store's row_addresses). Each V row is read once for the group, by the same
// accumulate kernels as attend_group's (AVX-512 with head_dim % 16 == 0, AVX2 with head_dim % 8
// == 0, portable otherwise). m == 0 gives zeros.
template <Element T>
void weighted_values_at(const float* w, int G, int d, std::size_t m, const T* const* vrow,
                        float* out) {
#if KVSIFT_HAVE_X86_SIMD_PATH
  const simd level = active_simd();
  if (m > 0 && d % 16 == 0 && level >= simd::avx512) {  // its kernel zeroes each head's output
    auto value = [vrow](std::size_t j) { return vrow[j]; };
    const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};  // the weights are normalised: scale by 1
    detail::avx512::with_pairing<T>(d, [&]<bool Paired>() {
      for (int g0 = 0; g0 < G; g0 += 8) {
        detail::with_heads<8>(std::min(8, G - g0), [&]<int GC>() {
          detail::avx512::accumulate_heads<GC, T, Paired>(w + g0 * m, m, ones, d, m, value,
                                                          out + g0 * d);
        });
      }
    });
    return;
  }
#endif
  std::fill(out, out + static_cast<std::size_t>(G) * d, 0.0f);
  if (m == 0) return;
#if KVSIFT_HAVE_X86_SIMD_PATH
  if (d % 8 == 0 && level >= simd::avx2) {
    for (int g0 = 0; g0 < G; g0 += 4) {
      detail::with_heads<4>(std::min(4, G - g0), [&]<int GC>() {
        detail::avx2::accumulate_heads<GC, T>(w + g0 * m, m, d, m, m, vrow, out + g0 * d);
      });
    }
    return;
  }
#endif
  for (std::size_t j = 0; j < m; ++j) {
    const T* v = vrow[j];
    for (int g = 0; g < G; ++g) {
      const float wj = w[g * m + j];
      float* o = out + static_cast<std::size_t>(g) * d;
      for (int c = 0; c < d; ++c) o[c] += wj * to_float(v[c]);
    }
  }
}

// weighted_values_at with value(j) returning row j's address: the addresses looked up once.
template <Element T, class ValueAt>
void weighted_values(const float* w, int G, int d, std::size_t m, ValueAt&& value_at, float* out) {
  thread_local std::vector<const T*> rows;
  rows.resize(m);
  for (std::size_t j = 0; j < m; ++j) rows[j] = value_at(j);
  weighted_values_at<T>(w, G, d, m, rows.data(), out);
}

// out [G, d] = softmax(scale * qg . krow[j]) . vrow[j] over j in [0, m) for the G query heads qg
// [G, d] of one KV head; krow[j] / vrow[j] point to row j's d elements of type T (a store's
// row_addresses: no per-row lookup here). m == 0 gives zeros. `logits` is scratch (up to G * m
// floats). With `lse` ([G]), also each head's log-sum-exp of its scaled logits (-inf for m == 0):
// the output is then a partial attention over these rows, which attention/merge.hpp combines
// exactly with another over disjoint rows (the host tier's part and the device's, say).
template <Element T>
void attend_group_at(const float* qg, int G, int d, std::size_t m, const T* const* krow,
                     const T* const* vrow, float* out, float scale, std::vector<float>& logits,
                     float* lse = nullptr) {
  if (m == 0) {
    std::fill(out, out + static_cast<std::size_t>(G) * d, 0.0f);
    if (lse != nullptr) std::fill(lse, lse + G, -std::numeric_limits<float>::infinity());
    return;
  }
#if KVSIFT_HAVE_X86_SIMD_PATH
  const simd level = active_simd();
  if (d % 16 == 0 && level >= simd::avx512) {
    const bool amx = std::is_same_v<T, bfloat16> && level == simd::amx && amx_ready();
    detail::avx512::attend_group<T>(qg, G, d, m, krow, vrow, out, scale, logits, amx, lse);
    return;
  }
  if (d % 8 == 0 && level >= simd::avx2) {
    detail::avx2::attend_group<T>(qg, G, d, m, krow, vrow, out, scale, logits, lse);
    return;
  }
#endif
  detail::attend_group_portable<T>(qg, G, d, m, [krow](std::size_t j) { return krow[j]; },
                                   [vrow](std::size_t j) { return vrow[j]; }, out, scale, logits,
                                   lse);
}

// attend_group_at with key(j) / value(j) returning row j's addresses: looked up once here.
template <Element T, class KeyAt, class ValueAt>
void attend_group(const float* qg, int G, int d, std::size_t m, KeyAt&& key, ValueAt&& value,
                  float* out, float scale, std::vector<float>& logits) {
  thread_local std::vector<const T*> rows;
  rows.resize(2 * m);
  for (std::size_t j = 0; j < m; ++j) {
    rows[j] = key(j);
    rows[m + j] = value(j);
  }
  attend_group_at<T>(qg, G, d, m, rows.data(), rows.data() + m, out, scale, logits);
}

}  // namespace kvsift::cpu
