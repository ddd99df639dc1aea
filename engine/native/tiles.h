// Linear weights packed in tiles of 16 output columns and the product that reads them, shared by the
// decode step (decode_step.cpp) and the prefill's Linears (linear_tiles.cpp).
//
// Invariant: output element (i, n) is one float32 sum over k in order, in one register lane, whatever
// the rows beside row i, the column range a thread takes or the blocking; so a row's result depends
// on that row alone and a prompt split anywhere gives every row the same bits.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "bf16.h"

namespace prefixrag {

// A weight [n, k] packed as [n / 16, k / 2, 16, 2] (engine/native/linear.py packs it): a tile's pair p
// of column c sits at tile + 32 p + 2 c, so one dot-product instruction adds the pairs of one input
// row into 16 columns' sums, which stay in their lanes (no reduction across lanes).
constexpr int64_t TILE_COLS = 16;

// y[i, 16 t .. 16 t + 16) (float32) for ROWS rows of x [ROWS, k] and column tiles [t0, t1), NB tiles at a time
template <int ROWS, int NB>
AVX512 void tile_rows(const bf16* x, const bf16* wp, float* y, int64_t k, int64_t ldy, int64_t t0, int64_t t1) {
  // pairs prefetched ahead: more rows spend longer on each pair, so they reach further
  constexpr int64_t AHEAD = ROWS <= 2 ? 16 : ROWS <= 5 ? 32 : 64;
  const int64_t pairs = k / 2, tile = k * TILE_COLS;
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x);
  int64_t t = t0;
  for (; t + NB <= t1; t += NB) {
    __m512 acc[ROWS][NB];
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < NB; ++c) acc[i][c] = _mm512_setzero_ps();
    const bf16* w = wp + t * tile;
    for (int64_t p = 0; p < pairs; ++p) {
      __m512bh wv[NB];
      for (int c = 0; c < NB; ++c) {
        _mm_prefetch((const char*)(w + c * tile + (p + AHEAD) * 32), _MM_HINT_T0);
        wv[c] = (__m512bh)_mm512_loadu_si512(w + c * tile + p * 32);
      }
      for (int i = 0; i < ROWS; ++i) {
        __m512bh xv = (__m512bh)_mm512_set1_epi32(int(xp[i * pairs + p]));
        for (int c = 0; c < NB; ++c) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], xv, wv[c]);
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < NB; ++c) _mm512_storeu_ps(y + i * ldy + (t + c) * TILE_COLS, acc[i][c]);
  }
  if constexpr (NB > 1)
    if (t < t1) tile_rows<ROWS, 1>(x, wp, y, k, ldy, t, t1);
}

// The same sums on AVX2 + FMA, for CPUs without AVX512-BF16: each weight pair widened to float32
// (exact) and added as two fused multiply-adds, the odd input first, as the instruction's definition
// orders them; ``xf`` is the input rows widened to float32. (The instruction flushes denormals,
// these kernels do not: the two kernels' bits are not promised to agree, each is row-exact.)
template <int ROWS, int NB>
AVX2 void tile_rows_avx2(const float* xf, const bf16* wp, float* y, int64_t k, int64_t ldy, int64_t t0,
                              int64_t t1) {
  const int64_t pairs = k / 2, tile = k * TILE_COLS;
  const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
  int64_t t = t0;
  for (; t + NB <= t1; t += NB) {
    __m256 acc[ROWS][2 * NB];  // a tile's 16 columns in two registers
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 2 * NB; ++c) acc[i][c] = _mm256_setzero_ps();
    const bf16* w = wp + t * tile;
    for (int64_t p = 0; p < pairs; ++p) {
      for (int c = 0; c < NB; ++c) {
        const bf16* wc = w + c * tile + p * 32;
        _mm_prefetch((const char*)(wc + 16 * 32), _MM_HINT_T0);
        const __m256i lo = _mm256_loadu_si256((const __m256i*)wc), hi = _mm256_loadu_si256((const __m256i*)(wc + 16));
        const __m256 odd_lo = _mm256_castsi256_ps(_mm256_and_si256(lo, high));
        const __m256 odd_hi = _mm256_castsi256_ps(_mm256_and_si256(hi, high));
        const __m256 even_lo = _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16));
        const __m256 even_hi = _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16));
        for (int i = 0; i < ROWS; ++i) {
          const __m256 xo = _mm256_broadcast_ss(xf + i * k + 2 * p + 1), xe = _mm256_broadcast_ss(xf + i * k + 2 * p);
          acc[i][2 * c] = _mm256_fmadd_ps(xe, even_lo, _mm256_fmadd_ps(xo, odd_lo, acc[i][2 * c]));
          acc[i][2 * c + 1] = _mm256_fmadd_ps(xe, even_hi, _mm256_fmadd_ps(xo, odd_hi, acc[i][2 * c + 1]));
        }
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 2 * NB; ++c)
        _mm256_storeu_ps(y + i * ldy + (t + c / 2) * TILE_COLS + 8 * (c % 2), acc[i][c]);
  }
  if constexpr (NB > 1)
    if (t < t1) tile_rows_avx2<ROWS, 1>(xf, wp, y, k, ldy, t, t1);
}

// x [rows, k] bf16 widened to float32 (exact)
AVX2 inline void widen_rows(const bf16* x, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(out + j, _mm256_castsi256_ps(_mm256_slli_epi32(
                                  _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(x + j))), 16)));
  for (; j < n; ++j) out[j] = to_float(x[j]);
}

using TileRowsAvx2Fn = void (*)(const float*, const bf16*, float*, int64_t, int64_t, int64_t, int64_t);
constexpr int64_t MAX_ROWS_AVX2 = 5;  // ROWS * 2 NB sums, a tile's 4 widened weights and 2 inputs: 16 registers
inline const TileRowsAvx2Fn TILE_ROWS_AVX2[MAX_ROWS_AVX2 + 1] = {
    nullptr, tile_rows_avx2<1, 3>, tile_rows_avx2<2, 2>, tile_rows_avx2<3, 1>, tile_rows_avx2<4, 1>,
    tile_rows_avx2<5, 1>};

using TileRowsFn = void (*)(const bf16*, const bf16*, float*, int64_t, int64_t, int64_t, int64_t);
constexpr int64_t MAX_ROWS = 8;  // rows per pass over the weights: ROWS * NB sums + NB weights fill the registers
inline const TileRowsFn TILE_ROWS[MAX_ROWS + 1] = {
    nullptr,          tile_rows<1, 8>, tile_rows<2, 8>, tile_rows<3, 6>, tile_rows<4, 6>,
    tile_rows<5, 4>, tile_rows<6, 4>, tile_rows<7, 3>, tile_rows<8, 3>};
// column tiles whose weights stay in cache while every row passes them (a multiple of the 8-row NB)
constexpr int64_t BLOCK_TILES = 12;

// y [m, n] (float32 sums, row stride n) = x [m, k] @ w^T over column tiles [t0, t1)
inline void tile_sums(const bf16* x, const bf16* w, float* y, int64_t m, int64_t k, int64_t n, int64_t t0, int64_t t1) {
  const int64_t block = m <= MAX_ROWS ? t1 - t0 : BLOCK_TILES;  // one pass over the rows: no blocking
  for (int64_t t = t0; t < t1; t += block) {
    const int64_t end = std::min(t1, t + block);
    for (int64_t i = 0; i < m; i += MAX_ROWS)
      TILE_ROWS[std::min(MAX_ROWS, m - i)](x + i * k, w, y + i * n, k, n, t, end);
  }
}

// the same on AVX2 from the rows widened to float32, xf [m, k]
inline void tile_sums_avx2(const float* xf, const bf16* w, float* y, int64_t m, int64_t k, int64_t n, int64_t t0,
                           int64_t t1) {
  const int64_t block = m <= MAX_ROWS_AVX2 ? t1 - t0 : BLOCK_TILES;
  for (int64_t t = t0; t < t1; t += block) {
    const int64_t end = std::min(t1, t + block);
    for (int64_t i = 0; i < m; i += MAX_ROWS_AVX2)
      TILE_ROWS_AVX2[std::min(MAX_ROWS_AVX2, m - i)](xf + i * k, w, y + i * n, k, n, t, end);
  }
}

}  // namespace prefixrag
