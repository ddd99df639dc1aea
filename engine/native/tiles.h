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

}  // namespace prefixrag
