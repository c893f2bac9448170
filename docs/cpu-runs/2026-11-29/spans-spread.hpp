// An experiment, not shipped (docs/performance.md, 2026-11-29): the value pass of
// include/kvsift/cpu/decode_attention.hpp (namespace detail::avx512) replaced by the functions
// below, as measured in kernels.txt. It was written against an earlier form of the paired bf16
// loads (load_slots: both slots of a pair from one call), since folded into load_slot.

// out[g, c0 .. c0 + 16 CT) += sum_{j in [j0, j1)} w[g * ld + j] value(j)[c0 ..] for GC heads and
// j0 < j1 (out in the rows' slot order), the accumulators in registers for the whole range.
// Rows in blocks of kRowBlock, each block's loop with no branch in it and the prefetches between
// blocks: the tile's lines of the next block into L1 and, when `far`, whole rows kFarRows ahead
// into L2 (the span's first tile brings the rows the later tiles read); otherwise GCC 12 stores
// every accumulator on every row (avx2::accumulate_block was measured both ways).
template <int GC, int CT, Element T, bool Paired, class ValueAt>
KVSIFT_TARGET_AVX512 void accumulate_tile(const float* w, std::size_t ld, int c0, int d,
                                          std::size_t j0, std::size_t j1, std::size_t& pf,
                                          std::size_t pf_end, std::size_t pf_step, ValueAt& value,
                                          float* out) {
  constexpr int S = slots_per_load<Paired>;
  static_assert(GC * CT <= 16 && CT % S == 0);
  constexpr std::size_t kRowBlock = 16;
  __m512 acc[GC][CT];
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) acc[g][t] = _mm512_loadu_ps(out + g * d + c0 + 16 * t);
  }
  for (std::size_t j = j0; j < std::min(j1, j0 + kRowBlock); ++j) prefetch_row(value(j) + c0, 16 * CT);
  for (std::size_t b0 = j0; b0 < j1; b0 += kRowBlock) {
    const std::size_t b1 = std::min(j1, b0 + kRowBlock);
    for (std::size_t j = b1; j < std::min(j1, b1 + kRowBlock); ++j) prefetch_row(value(j) + c0, 16 * CT);
    const std::size_t pf1 = std::min(pf_end, pf + pf_step);
    prefetch_rows_far<T>(value, pf, pf1, d);
    pf = pf1;
    std::size_t j = b0;
    do {
      const T* v = value(j) + c0;
      __m512 vv[CT];
      KVSIFT_UNROLL
      for (int t = 0; t < CT; t += S) load_slots<T, Paired>(v + 16 * t, vv + t);
      KVSIFT_UNROLL
      for (int g = 0; g < GC; ++g) {
        const __m512 wg = _mm512_set1_ps(w[g * ld + j]);
        KVSIFT_UNROLL
        for (int t = 0; t < CT; ++t) acc[g][t] = _mm512_fmadd_ps(wg, vv[t], acc[g][t]);
      }
    } while (++j < b1);
  }
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) _mm512_storeu_ps(out + g * d + c0 + 16 * t, acc[g][t]);
  }
}

// out[g, :] = inv[g] * sum_j w[g * ld + j] value(j) for GC heads. Channel tiles of as many
// 16-lane slots as fit 16 accumulators; rows in spans of kSpanRows, every tile of a span before
// the next span: the first tile's pass brings the span's rows into L2 (its prefetches), the later
// tiles read them there, so a V row comes from memory once. Paired rows accumulate in slot order,
// put back in channel order by the final scaling.
template <int GC, Element T, bool Paired, class ValueAt>
KVSIFT_TARGET_AVX512 void accumulate_heads(const float* w, std::size_t ld, const float* inv, int d,
                                           std::size_t m, ValueAt& value, float* out) {
  constexpr int kTile = GC == 1 ? 8 : GC == 2 ? 8 : GC <= 4 ? 4 : 2;
  constexpr int S = slots_per_load<Paired>;
  constexpr std::size_t kSpanRows = 256;
  for (int c = 0; c < GC * d; c += 16) _mm512_storeu_ps(out + c, _mm512_setzero_ps());  // no memset call
  std::size_t pf = 0;
  prefetch_rows_far<T>(value, 0, std::min(m, kSpanRows), d);
  const int passes = d / (16 * kTile) + (d % (16 * kTile)) / (16 * S);
  for (std::size_t j0 = 0; j0 < m; j0 += kSpanRows) {
    const std::size_t j1 = std::min(m, j0 + kSpanRows);
    // the next span's rows into L2, spread over this span's blocks of every pass
    pf = j1;
    const std::size_t pf_end = std::min(m, j1 + kSpanRows);
    const std::size_t blocks = passes * ((j1 - j0 + 15) / 16);
    const std::size_t pf_step = (pf_end - j1 + blocks - 1) / blocks;
    int c0 = 0;
    for (; c0 + 16 * kTile <= d; c0 += 16 * kTile) {
      accumulate_tile<GC, kTile, T, Paired>(w, ld, c0, d, j0, j1, pf, pf_end, pf_step, value, out);
    }
    for (; c0 < d; c0 += 16 * S) {
      accumulate_tile<GC, S, T, Paired>(w, ld, c0, d, j0, j1, pf, pf_end, pf_step, value, out);
    }
  }
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    const __m512 s = _mm512_set1_ps(inv[g]);
    float* o = out + g * d;
    if constexpr (Paired) {  // slots (even, odd) of each 32 channels back to channel order
      const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
      const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
      for (int c = 0; c < d; c += 32) {
        const __m512 e = _mm512_mul_ps(_mm512_loadu_ps(o + c), s);
        const __m512 od = _mm512_mul_ps(_mm512_loadu_ps(o + c + 16), s);
        _mm512_storeu_ps(o + c, _mm512_permutex2var_ps(e, lo, od));
        _mm512_storeu_ps(o + c + 16, _mm512_permutex2var_ps(e, hi, od));
      }
    } else {
      for (int c = 0; c < d; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), s));
    }
  }
}

