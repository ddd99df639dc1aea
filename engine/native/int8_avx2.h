// int8 Linears on AVX2 without VNNI: int8_tiles.h's packed tiles multiplied by vpmaddubsw, for
// matrices at fbgemm's 63 activation levels (engine/quant/linear.py), int8_linear's bits.
//
// Invariants: as int8_tiles.h's. vpmaddubsw adds two unsigned-by-signed byte products into a
// saturating int16; an activation digit a in [-63, 63] enters as a + 64 in [1, 127], so a pair is at
// most 2 * 127 * 127 = 32,258 and never saturates. vpmaddwd by ones widens the pairs into int32 sums,
// exact, and 64 * sum_k w[c, k] (half the packed 128 * offset) is subtracted after.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "f32.h"
#include "int8_tiles.h"

namespace prefixrag {

constexpr float AVX2_INT8_LEVELS = 63.f;  // fbgemm's activation levels: the digits the pairs can hold

AVX2 inline __m256 load8(const bf16* p) { return load_bf16_8(p); }
AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// 8 rounded digits as unsigned bytes, value + 64, in order
AVX2 inline int64_t shifted_digits8(__m256 rounded) {
  const __m256i v = _mm256_add_epi32(_mm256_cvtps_epi32(rounded), _mm256_set1_epi32(64));
  const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return _mm_cvtsi128_si64(_mm_packus_epi16(words, words));
}

// int8_linear's activation rounding for rows [r0, r1) of x [m, k] (k a multiple of 8), as
// int8_tiles.h's quantize_block: steps = x / peak * levels, hi = round(steps),
// lo = round((steps - hi) * 2 levels), each in float32, rounding half to even
template <class T>
AVX2 void quantize_block_avx2(const T* x, int64_t k, float levels, QuantizedRows& out, int64_t r0, int64_t r1) {
  const float tiny = 1.17549435e-38f;  // torch.finfo(float32).tiny: an all-zero row stays zero
  constexpr int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 vlevels = _mm256_set1_ps(levels), twice = _mm256_set1_ps(2.f * levels);
  for (int64_t i = r0; i < r1; ++i) {
    const T* row = x + i * k;
    __m256 vpeak = _mm256_setzero_ps();
    for (int64_t j = 0; j < k; j += 8) vpeak = _mm256_max_ps(vpeak, _mm256_and_ps(load8(row + j), magnitude));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vpeak), _mm256_extractf128_ps(vpeak, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float peak = std::max(_mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4))), tiny);
    const __m256 vp = _mm256_set1_ps(peak);
    for (int64_t j = 0; j < k; j += 8) {
      const __m256 steps = _mm256_mul_ps(_mm256_div_ps(load8(row + j), vp), vlevels);
      const __m256 hi = _mm256_round_ps(steps, nearest);
      const __m256 lo = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(steps, hi), twice), nearest);
      const int64_t h8 = shifted_digits8(hi), l8 = shifted_digits8(lo);
      std::memcpy(out.hi.data() + i * k + j, &h8, 8);
      std::memcpy(out.lo.data() + i * k + j, &l8, 8);
    }
    out.step[i] = peak / levels;
  }
}

// acc += the int32 sums of 4 inputs' products in 8 columns
AVX2 inline __m256i add_quad(__m256i acc, __m256i digits, __m256i w) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(digits, w), _mm256_set1_epi16(1)));
}

// int32 sums of column tile t for ROWS rows' two digit rows (and the residual weight against the
// coarse digit), offsets not yet subtracted: s[(i * 3 + digit) * 2 + half], 8 columns a half
template <int ROWS, bool RES>
AVX2 void int8_tile_sums_avx2(const QuantizedRows& xq, int64_t row, const Int8Tiles& w, int64_t t, __m256i* s) {
  const int64_t quads = w.k / 4, tile = w.k * INT8_TILE;
  const uint32_t* h4[ROWS];
  const uint32_t* l4[ROWS];
  for (int i = 0; i < ROWS; ++i) {
    h4[i] = reinterpret_cast<const uint32_t*>(xq.hi.data() + (row + i) * w.k);
    l4[i] = reinterpret_cast<const uint32_t*>(xq.lo.data() + (row + i) * w.k);
  }
  for (int u = 0; u < ROWS * 6; ++u) s[u] = _mm256_setzero_si256();
  const int8_t* q = w.q + t * tile;
  const int8_t* r = RES ? w.residual + t * tile : nullptr;
  for (int64_t p = 0; p < quads; ++p) {
    const __m256i q0 = _mm256_loadu_si256((const __m256i*)(q + p * 64));
    const __m256i q1 = _mm256_loadu_si256((const __m256i*)(q + p * 64 + 32));
    for (int i = 0; i < ROWS; ++i) {
      const __m256i xh = _mm256_set1_epi32(int(h4[i][p])), xl = _mm256_set1_epi32(int(l4[i][p]));
      s[i * 6 + 0] = add_quad(s[i * 6 + 0], xh, q0);
      s[i * 6 + 1] = add_quad(s[i * 6 + 1], xh, q1);
      s[i * 6 + 2] = add_quad(s[i * 6 + 2], xl, q0);
      s[i * 6 + 3] = add_quad(s[i * 6 + 3], xl, q1);
      if constexpr (RES) {
        s[i * 6 + 4] = add_quad(s[i * 6 + 4], xh, _mm256_loadu_si256((const __m256i*)(r + p * 64)));
        s[i * 6 + 5] = add_quad(s[i * 6 + 5], xh, _mm256_loadu_si256((const __m256i*)(r + p * 64 + 32)));
      }
    }
  }
}

// 4 columns: float(double(hi) + double(lo) * digit [+ double(res) / 254]) * scale * step, in
// int8_linear's order, each operation rounded on its own (no fused multiply-add)
__attribute__((optimize("fp-contract=off"))) AVX2 inline __m128 combine4(__m128i hi, __m128i lo, __m128i res,
                                                                         bool has_res, __m128 scales, __m256d digit,
                                                                         __m128 step) {
  __m256d total = _mm256_add_pd(_mm256_cvtepi32_pd(hi), _mm256_mul_pd(_mm256_cvtepi32_pd(lo), digit));
  if (has_res) total = _mm256_add_pd(total, _mm256_mul_pd(_mm256_cvtepi32_pd(res), _mm256_set1_pd(1.0 / 254.0)));
  return _mm_mul_ps(_mm_mul_ps(_mm256_cvtpd_ps(total), scales), step);
}

// y[8 c .. 8 c + 8) of one row from one half tile's sums, offsets subtracted
template <bool RES>
AVX2 void combine_half(__m256i hi, __m256i lo, __m256i res, const Int8Tiles& w, int64_t col, __m128 step,
                       __m256d digit, float* y) {
  const __m256i off = _mm256_srai_epi32(_mm256_loadu_si256((const __m256i*)(w.offset + col)), 1);
  hi = _mm256_sub_epi32(hi, off);
  lo = _mm256_sub_epi32(lo, off);
  if constexpr (RES)
    res = _mm256_sub_epi32(res, _mm256_srai_epi32(_mm256_loadu_si256((const __m256i*)(w.residual_offset + col)), 1));
  for (int h = 0; h < 2; ++h) {
    const __m128i hi4 = h ? _mm256_extracti128_si256(hi, 1) : _mm256_castsi256_si128(hi);
    const __m128i lo4 = h ? _mm256_extracti128_si256(lo, 1) : _mm256_castsi256_si128(lo);
    const __m128i res4 = h ? _mm256_extracti128_si256(res, 1) : _mm256_castsi256_si128(res);
    _mm_storeu_ps(y + col + 4 * h, combine4(hi4, lo4, res4, RES, _mm_loadu_ps(w.scales + col + 4 * h), digit, step));
  }
}

template <int ROWS, bool RES>
AVX2 void int8_pass_avx2(const QuantizedRows& xq, const Int8Tiles& w, float* y, int64_t row, double digit_, int64_t b,
                         int64_t end) {
  const __m256d digit = _mm256_set1_pd(digit_);
  for (int64_t t = b; t < end; ++t) {
    __m256i s[ROWS * 6];
    int8_tile_sums_avx2<ROWS, RES>(xq, row, w, t, s);
    for (int i = 0; i < ROWS; ++i) {
      const __m128 step = _mm_set1_ps(xq.step[row + i]);
      for (int h = 0; h < 2; ++h)
        combine_half<RES>(s[i * 6 + h], s[i * 6 + 2 + h], s[i * 6 + 4 + h], w, t * INT8_TILE + 8 * h, step, digit,
                          y + (row + i) * w.n);
    }
  }
}

// rows two at a time without a residual digit (their 8 sums and 2 weights fit the 16 registers),
// one at a time with it
template <bool RES>
void int8_rows_avx2(const QuantizedRows& xq, const Int8Tiles& w, float* y, int64_t m, double digit, int64_t t0,
                    int64_t t1) {
  constexpr int ROWS = RES ? 1 : 2;
  for (int64_t b = t0; b < t1; b += INT8_BLOCK) {
    const int64_t end = std::min(t1, b + INT8_BLOCK);
    int64_t i = 0;
    for (; i + ROWS <= m; i += ROWS) int8_pass_avx2<ROWS, RES>(xq, w, y, i, digit, b, end);
    if (i < m) int8_pass_avx2<1, RES>(xq, w, y, i, digit, b, end);
  }
}

// y [m, n] (float32) = int8_linear(x [m, k], w) over column tiles [t0, t1), w at 63 levels
inline void int8_linear_tiles_avx2(const QuantizedRows& xq, const Int8Tiles& w, float* y, int64_t m, int64_t t0,
                                   int64_t t1) {
  const double digit = 1.0 / (2.0 * double(AVX2_INT8_LEVELS));
  if (w.residual != nullptr) int8_rows_avx2<true>(xq, w, y, m, digit, t0, t1);
  else int8_rows_avx2<false>(xq, w, y, m, digit, t0, t1);
}

}  // namespace prefixrag
