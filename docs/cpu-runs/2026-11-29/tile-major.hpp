// An experiment, not shipped (docs/performance.md, 2026-11-29): the value pass of
// include/kvsift/cpu/decode_attention.hpp (namespace detail::avx512) replaced by the functions
// below, as measured in kernels.txt. It was written against an earlier form of the paired bf16
// loads (load_slots: both slots of a pair from one call), since folded into load_slot.

// out[g, c0 .. c0 + 16 CT) = inv[g] * sum_j w[g * ld + j] value(j)[c0 ..] for GC heads over all
// m > 0 rows (out in channel order; Paired rows accumulate in slot order, put back at the store):
// the accumulators stay in registers for the whole pass over the tile's channels. Rows in blocks
// of kRowBlock, each block's loop with no branch in it and the prefetches between blocks (the
// tile's lines of the next block into L1, of the block kFarRows after it into L2); otherwise GCC
// 12 stores every accumulator on every row (avx2::accumulate_block was measured both ways).
template <int GC, int CT, Element T, bool Paired, class ValueAt>
KVSIFT_TARGET_AVX512 void accumulate_tile(const float* w, std::size_t ld, const float* inv, int c0,
                                          int d, std::size_t m, ValueAt& value, float* out) {
  constexpr int S = slots_per_load<Paired>;
  static_assert(GC * CT <= 16 && CT % S == 0);
  constexpr std::size_t kRowBlock = 16;
  constexpr int kTileBytes = 16 * CT * static_cast<int>(sizeof(T));
  __m512 acc[GC][CT];
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    KVSIFT_UNROLL
    for (int t = 0; t < CT; ++t) acc[g][t] = _mm512_setzero_ps();
  }
  for (std::size_t j = 0; j < std::min(m, kRowBlock); ++j) prefetch_row(value(j) + c0, 16 * CT);
  for (std::size_t j0 = 0; j0 < m; j0 += kRowBlock) {
    const std::size_t j1 = std::min(m, j0 + kRowBlock);
    for (std::size_t j = j1; j < std::min(m, j1 + kRowBlock); ++j) prefetch_row(value(j) + c0, 16 * CT);
    for (std::size_t j = j1 + kFarRows; j < std::min(m, j1 + kFarRows + kRowBlock); ++j) {
      const char* b = reinterpret_cast<const char*>(value(j) + c0);
      prefetch_span_far(b, b + kTileBytes);
    }
    std::size_t j = j0;
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
    } while (++j < j1);
  }
  KVSIFT_UNROLL
  for (int g = 0; g < GC; ++g) {
    const __m512 s = _mm512_set1_ps(inv[g]);
    float* o = out + g * d + c0;
    if constexpr (Paired) {  // slots (even, odd) of each 32 channels back to channel order
      const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
      const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
      KVSIFT_UNROLL
      for (int t = 0; t < CT; t += 2) {
        const __m512 e = _mm512_mul_ps(acc[g][t], s), od = _mm512_mul_ps(acc[g][t + 1], s);
        _mm512_storeu_ps(o + 16 * t, _mm512_permutex2var_ps(e, lo, od));
        _mm512_storeu_ps(o + 16 * t + 16, _mm512_permutex2var_ps(e, hi, od));
      }
    } else {
      KVSIFT_UNROLL
      for (int t = 0; t < CT; ++t) _mm512_storeu_ps(o + 16 * t, _mm512_mul_ps(acc[g][t], s));
    }
  }
}

// out[g, :] = inv[g] * sum_j w[g * ld + j] value(j) for GC heads: channel tiles of as many
// 16-lane slots as fit 16 accumulators, one pass over the rows per tile (a tile's channels are
// its own cache lines of each row, so the rows' bytes are still read once).
template <int GC, Element T, bool Paired, class ValueAt>
KVSIFT_TARGET_AVX512 void accumulate_heads(const float* w, std::size_t ld, const float* inv, int d,
                                           std::size_t m, ValueAt& value, float* out) {
  constexpr int kTile = GC == 1 ? 8 : GC == 2 ? 8 : GC <= 4 ? 4 : 2;
  constexpr int S = slots_per_load<Paired>;
  int c0 = 0;
  for (; c0 + 16 * kTile <= d; c0 += 16 * kTile) {
    accumulate_tile<GC, kTile, T, Paired>(w, ld, inv, c0, d, m, value, out);
  }
  for (; c0 < d; c0 += 16 * S) accumulate_tile<GC, S, T, Paired>(w, ld, inv, c0, d, m, value, out);
}

