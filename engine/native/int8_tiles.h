// int8 Linear weights packed in tiles of 16 output columns for AVX512-VNNI, and the product that
// reads them (a prefill's Linears, linear_int8.cpp, and the decode step): engine/quant/linear.py's
// int8_linear, to the bit.
//
// Invariants: each row's activations are quantized as int8_linear quantizes them (a scale per row,
// a coarse digit and its residual at twice the resolution); every integer sum is exact in int32 (so
// its order, the blocking and the thread split change nothing); the digits combine in float64 and
// scale back in float32 in int8_linear's order of operations. A row's outputs therefore equal
// int8_linear's for that row, whatever its batch mates.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bf16.h"

#define AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vnni")))

namespace prefixrag {

// A weight [n, k] int8 packed as [n / 16, k / 4, 16, 4]: one vpdpbusd adds 4 inputs of one row into 16
// columns' int32 sums, each staying in its lane. The instruction multiplies unsigned by signed bytes,
// so an activation digit a in [-127, 127] enters as a + 128 and offset[c] = 128 * sum_k w[c, k] is
// subtracted after: exact, since |sum| < 255 * 127 * k < 2**31 for k < 66,000.
struct Int8Tiles {
  const int8_t* q;          // the weight's digits, packed
  const int8_t* residual;   // its residual digits (at 1 / 254 of a step), packed; nullptr: none
  const int32_t* offset;    // 128 * column sums of q
  const int32_t* residual_offset;
  const float* scales;      // float32 per output column
  int64_t n, k;
};

constexpr int64_t INT8_TILE = 16;
constexpr int64_t INT8_BLOCK = 8;  // column tiles whose weights stay in cache while every row passes them

// Rows quantized: unsigned digits (value + 128) of the coarse step and of its residual, [m, k] each,
// and each row's step back to float, peak / levels.
struct QuantizedRows {
  std::vector<uint8_t> hi, lo;
  std::vector<float> step;
};

// 16 inputs as float32 (bfloat16 widened exactly)
AVX512_VNNI inline __m512 load16(const bf16* p) { return load_bf16(p); }
AVX512_VNNI inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

// 16 digits as unsigned bytes: value + 128
AVX512_VNNI inline __m128i unsigned_digits(__m512 rounded) {
  return _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(rounded), _mm512_set1_epi32(128)));
}

// int8_linear's activation rounding for rows [r0, r1) of x [m, k] (k a multiple of 16; T bf16 or
// float): steps = x / peak * levels, hi = round(steps), lo = round((steps - hi) * 2 levels), each in
// float32, rounding half to even as torch.round does
template <class T>
AVX512_VNNI void quantize_block(const T* x, int64_t k, float levels, QuantizedRows& out, int64_t r0, int64_t r1) {
  const float tiny = 1.17549435e-38f;  // torch.finfo(float32).tiny: an all-zero row stays zero
  constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 vlevels = _mm512_set1_ps(levels), twice = _mm512_set1_ps(2.f * levels);
  for (int64_t i = r0; i < r1; ++i) {
    const T* row = x + i * k;
    __m512 vpeak = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j += 16) vpeak = _mm512_max_ps(vpeak, _mm512_abs_ps(load16(row + j)));
    const float peak = std::max(_mm512_reduce_max_ps(vpeak), tiny);
    const __m512 vp = _mm512_set1_ps(peak);
    for (int64_t j = 0; j < k; j += 16) {
      const __m512 steps = _mm512_mul_ps(_mm512_div_ps(load16(row + j), vp), vlevels);
      const __m512 hi = _mm512_roundscale_ps(steps, nearest);
      const __m512 lo = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(steps, hi), twice), nearest);
      _mm_storeu_si128((__m128i*)(out.hi.data() + i * k + j), unsigned_digits(hi));
      _mm_storeu_si128((__m128i*)(out.lo.data() + i * k + j), unsigned_digits(lo));
    }
    out.step[i] = peak / levels;
  }
}

// int32 sums of NB column tiles [t, t + NB) for ROWS rows' two digit rows (and the residual weight
// against the coarse digit), offsets not yet subtracted: s[(i * 3 + digit) * NB + c]
template <int ROWS, int NB, bool RES>
AVX512_VNNI void int8_tile_sums(const QuantizedRows& xq, int64_t row, const Int8Tiles& w, int64_t t, __m512i* s) {
  const int64_t quads = w.k / 4, tile = w.k * INT8_TILE;
  const uint32_t* h4[ROWS];
  const uint32_t* l4[ROWS];
  for (int i = 0; i < ROWS; ++i) {
    h4[i] = reinterpret_cast<const uint32_t*>(xq.hi.data() + (row + i) * w.k);
    l4[i] = reinterpret_cast<const uint32_t*>(xq.lo.data() + (row + i) * w.k);
  }
  for (int u = 0; u < ROWS * 3 * NB; ++u) s[u] = _mm512_setzero_si512();
  const int8_t* q = w.q + t * tile;
  const int8_t* r = RES ? w.residual + t * tile : nullptr;
  for (int64_t p = 0; p < quads; ++p) {
    __m512i wq[NB], wr[NB];
    for (int c = 0; c < NB; ++c) {
      _mm_prefetch((const char*)(q + c * tile + (p + 16) * 64), _MM_HINT_T0);
      wq[c] = _mm512_loadu_si512(q + c * tile + p * 64);
      if constexpr (RES) {
        _mm_prefetch((const char*)(r + c * tile + (p + 16) * 64), _MM_HINT_T0);
        wr[c] = _mm512_loadu_si512(r + c * tile + p * 64);
      }
    }
    for (int i = 0; i < ROWS; ++i) {
      const __m512i xh = _mm512_set1_epi32(int(h4[i][p])), xl = _mm512_set1_epi32(int(l4[i][p]));
      for (int c = 0; c < NB; ++c) {
        s[(i * 3) * NB + c] = _mm512_dpbusd_epi32(s[(i * 3) * NB + c], xh, wq[c]);
        s[(i * 3 + 1) * NB + c] = _mm512_dpbusd_epi32(s[(i * 3 + 1) * NB + c], xl, wq[c]);
        if constexpr (RES) s[(i * 3 + 2) * NB + c] = _mm512_dpbusd_epi32(s[(i * 3 + 2) * NB + c], xh, wr[c]);
      }
    }
  }
}

// 8 columns: float(double(hi) + double(lo) * digit [+ double(res) / 254]) * scale * step, in
// int8_linear's order, each operation rounded on its own (no fused multiply-add)
__attribute__((optimize("fp-contract=off"))) AVX512_VNNI inline __m256 combine8(__m256i hi, __m256i lo, __m256i res,
                                                                                bool has_res, __m256 scales,
                                                                                __m512d digit, __m256 step) {
  __m512d total = _mm512_add_pd(_mm512_cvtepi32_pd(hi), _mm512_mul_pd(_mm512_cvtepi32_pd(lo), digit));
  if (has_res) total = _mm512_add_pd(total, _mm512_mul_pd(_mm512_cvtepi32_pd(res), _mm512_set1_pd(1.0 / 254.0)));
  return _mm256_mul_ps(_mm256_mul_ps(_mm512_cvtpd_ps(total), scales), step);
}

// y[16 t .. 16 t + 16) of one row from its tile sums, offsets subtracted
template <bool RES>
AVX512_VNNI void combine_tile(__m512i hi, __m512i lo, __m512i res, const Int8Tiles& w, int64_t t, float step,
                              __m512d digit, float* y) {
  const int64_t col = t * INT8_TILE;
  const __m512i off = _mm512_loadu_si512(w.offset + col);
  hi = _mm512_sub_epi32(hi, off);
  lo = _mm512_sub_epi32(lo, off);
  if constexpr (RES) res = _mm512_sub_epi32(res, _mm512_loadu_si512(w.residual_offset + col));
  const __m256 vstep = _mm256_set1_ps(step);
  _mm256_storeu_ps(y + col, combine8(_mm512_castsi512_si256(hi), _mm512_castsi512_si256(lo),
                                     _mm512_castsi512_si256(res), RES, _mm256_loadu_ps(w.scales + col), digit, vstep));
  _mm256_storeu_ps(y + col + 8, combine8(_mm512_extracti64x4_epi64(hi, 1), _mm512_extracti64x4_epi64(lo, 1),
                                         _mm512_extracti64x4_epi64(res, 1), RES, _mm256_loadu_ps(w.scales + col + 8),
                                         digit, vstep));
}

template <int ROWS, bool RES>
AVX512_VNNI void int8_pass(const QuantizedRows& xq, const Int8Tiles& w, float* y, int64_t row, double digit_,
                           int64_t b, int64_t end) {
  const __m512d digit = _mm512_set1_pd(digit_);
  constexpr int NB = ROWS == 1 ? 4 : 2;  // ROWS * 3 * NB sums and NB (or 2 NB) weights in registers
  for (int64_t t = b; t < end;) {
    __m512i s[ROWS * 3 * 4];
    int nb;
    if (end - t >= NB) {
      int8_tile_sums<ROWS, NB, RES>(xq, row, w, t, s);
      nb = NB;
    } else {
      int8_tile_sums<ROWS, 1, RES>(xq, row, w, t, s);
      nb = 1;
    }
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < nb; ++c)
        combine_tile<RES>(s[(i * 3) * nb + c], s[(i * 3 + 1) * nb + c], s[(i * 3 + 2) * nb + c], w, t + c,
                          xq.step[row + i], digit, y + (row + i) * w.n);
    t += nb;
  }
}

template <bool RES>
void int8_rows(const QuantizedRows& xq, const Int8Tiles& w, float* y, int64_t m, double digit, int64_t t0,
               int64_t t1) {
  for (int64_t b = t0; b < t1; b += INT8_BLOCK) {
    const int64_t end = std::min(t1, b + INT8_BLOCK);
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) int8_pass<2, RES>(xq, w, y, i, digit, b, end);
    if (i < m) int8_pass<1, RES>(xq, w, y, i, digit, b, end);
  }
}

// y [m, n] (float32, before int8_linear's cast to the compute dtype) = int8_linear(x [m, k], w) over
// column tiles [t0, t1)
inline void int8_linear_tiles(const QuantizedRows& xq, const Int8Tiles& w, float* y, int64_t m, float levels,
                              int64_t t0, int64_t t1) {
  const double digit = 1.0 / (2.0 * double(levels));
  if (w.residual != nullptr) int8_rows<true>(xq, w, y, m, digit, t0, t1);
  else int8_rows<false>(xq, w, y, m, digit, t0, t1);
}

}  // namespace prefixrag
