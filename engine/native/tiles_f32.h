// float32 Linear weights packed in tiles of 16 output columns, [n / 16, k, 16], and the product that
// reads them, shared by the prefill's Linears (linear_tiles_f32.cpp) and the decode step
// (decode_step_f32.cpp); engine/native/linear.py packs them.
//
// Invariant: output element (i, c) is one chain of fused multiply-adds over k in order, from zero, in
// one register lane; so a row's result depends on that row alone (whatever the rows beside it, the
// tiles a thread takes or the blocking), and the AVX2 and AVX-512 kernels give the same bits (a
// lane's arithmetic is the same at either width). A prefill's row and a decode step's row of the
// same input so get the same sums.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "f32.h"

#define F32_AVX512 __attribute__((target("avx512f")))

namespace prefixrag {

constexpr int64_t F32_COLS = 16;                 // output columns per packed tile
constexpr int64_t F32_BLOCK_BYTES = 384 << 10;   // weights a block of tiles holds: stays in L2 while every row passes

// y[i, 16 t .. 16 t + 16) for ROWS rows of x [ROWS, k] and tiles [t0, t1), NB tiles at a time (AVX-512)
template <int ROWS, int NB>
F32_AVX512 void f32_rows512(const float* x, const float* wp, float* y, int64_t k, int64_t ldy, int64_t t0,
                            int64_t t1) {
  const int64_t tile = k * F32_COLS;
  int64_t t = t0;
  for (; t + NB <= t1; t += NB) {
    __m512 acc[ROWS][NB];
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < NB; ++c) acc[i][c] = _mm512_setzero_ps();
    const float* w = wp + t * tile;
    for (int64_t p = 0; p < k; ++p) {
      __m512 wv[NB];
      for (int c = 0; c < NB; ++c) {
        _mm_prefetch((const char*)(w + c * tile + (p + 8) * F32_COLS), _MM_HINT_T0);
        wv[c] = _mm512_loadu_ps(w + c * tile + p * F32_COLS);
      }
      for (int i = 0; i < ROWS; ++i) {
        const __m512 xv = _mm512_set1_ps(x[i * k + p]);
        for (int c = 0; c < NB; ++c) acc[i][c] = _mm512_fmadd_ps(xv, wv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < NB; ++c) _mm512_storeu_ps(y + i * ldy + (t + c) * F32_COLS, acc[i][c]);
  }
  if constexpr (NB > 1)
    if (t < t1) f32_rows512<ROWS, 1>(x, wp, y, k, ldy, t, t1);
}

// the same for AVX2: a tile's 16 lanes in two registers
template <int ROWS, int NB>
AVX2 void f32_rows256(const float* x, const float* wp, float* y, int64_t k, int64_t ldy, int64_t t0,
                          int64_t t1) {
  const int64_t tile = k * F32_COLS;
  int64_t t = t0;
  for (; t + NB <= t1; t += NB) {
    __m256 acc[ROWS][2 * NB];
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 2 * NB; ++c) acc[i][c] = _mm256_setzero_ps();
    const float* w = wp + t * tile;
    for (int64_t p = 0; p < k; ++p) {
      __m256 wv[2 * NB];
      for (int c = 0; c < NB; ++c) {
        _mm_prefetch((const char*)(w + c * tile + (p + 8) * F32_COLS), _MM_HINT_T0);
        wv[2 * c] = _mm256_loadu_ps(w + c * tile + p * F32_COLS);
        wv[2 * c + 1] = _mm256_loadu_ps(w + c * tile + p * F32_COLS + 8);
      }
      for (int i = 0; i < ROWS; ++i) {
        const __m256 xv = _mm256_broadcast_ss(x + i * k + p);
        for (int c = 0; c < 2 * NB; ++c) acc[i][c] = _mm256_fmadd_ps(xv, wv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 2 * NB; ++c)
        _mm256_storeu_ps(y + i * ldy + (t + c / 2) * F32_COLS + 8 * (c % 2), acc[i][c]);
  }
  if constexpr (NB > 1)
    if (t < t1) f32_rows256<ROWS, 1>(x, wp, y, k, ldy, t, t1);
}

using F32RowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
// rows per pass over the weights: ROWS * NB sums + NB weights fill the registers (32 wide, 16 narrow)
constexpr int64_t F32_MAX_ROWS_512 = 8, F32_MAX_ROWS_256 = 6;
inline const F32RowsFn F32_ROWS_512[F32_MAX_ROWS_512 + 1] = {
    nullptr,             f32_rows512<1, 8>, f32_rows512<2, 8>, f32_rows512<3, 6>, f32_rows512<4, 6>,
    f32_rows512<5, 4>,   f32_rows512<6, 4>, f32_rows512<7, 3>, f32_rows512<8, 3>};
inline const F32RowsFn F32_ROWS_256[F32_MAX_ROWS_256 + 1] = {
    nullptr,           f32_rows256<1, 6>, f32_rows256<2, 3>, f32_rows256<3, 2>,
    f32_rows256<4, 1>, f32_rows256<5, 1>, f32_rows256<6, 1>};

// y [m, n] (row stride ldy) = x [m, k] @ w^T over tiles [t0, t1), blocked so a block's weights stay in cache
inline void f32_tile_products(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t ldy,
                              int64_t t0, int64_t t1, bool wide) {
  const F32RowsFn* fns = wide ? F32_ROWS_512 : F32_ROWS_256;
  const int64_t most = wide ? F32_MAX_ROWS_512 : F32_MAX_ROWS_256;
  const int64_t block = m <= most ? t1 - t0 : std::max<int64_t>(1, F32_BLOCK_BYTES / (k * F32_COLS * 4));
  for (int64_t t = t0; t < t1; t += block) {
    const int64_t end = std::min(t1, t + block);
    for (int64_t i = 0; i < m; i += most) fns[std::min(most, m - i)](x + i * k, w, y + i * ldy, k, ldy, t, end);
  }
}

}  // namespace prefixrag
