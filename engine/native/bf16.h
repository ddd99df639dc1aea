// bfloat16 helpers shared by the native kernels (decode_step.cpp, prefill_rows.cpp, linear_tiles.cpp),
// in AVX512-BF16 and AVX2 + FMA forms.
//
// Invariants: every rounding is round-to-nearest-even, as torch's casts; a row's result depends on
// that row alone (no sum runs across rows).
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "f32.h"

namespace prefixrag {

using bf16 = uint16_t;
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

inline float to_float(bf16 v) {
  uint32_t b = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline bf16 to_bf16(float f) {  // round to nearest even, as torch's cast (NaN stays NaN)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffff) > 0x7f800000) return bf16((b >> 16) | 0x40);
  b += 0x7fff + ((b >> 16) & 1);
  return bf16(b >> 16);
}

inline float round_bf16(float f) { return to_float(to_bf16(f)); }

AVX512 inline __m512 load_bf16(const bf16* p) {  // 16 bf16 -> 16 float
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}

AVX512 inline __m256i pack_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }  // round to nearest even

AVX512 inline __m512 round_bf16_ps(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(pack_bf16(v)), 16));
}

// AVX2 + FMA forms, for CPUs without AVX512-BF16: 8 lanes, the same roundings
AVX2 inline __m256 load_bf16_8(const bf16* p) {  // 8 bf16 -> 8 float
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// the float32 bits rounded to nearest even in their top 16 (NaN stays NaN), as to_bf16
AVX2 inline __m256i bf16_bits_8(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
  const __m256i quiet = _mm256_or_si256(b, _mm256_set1_epi32(0x400000));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(nan));
}

AVX2 inline __m256 round_bf16_8(__m256 v) {
  return _mm256_castsi256_ps(_mm256_and_si256(bf16_bits_8(v), _mm256_set1_epi32(int(0xffff0000u))));
}

AVX2 inline void store_bf16_8(bf16* p, __m256 v) {  // 8 float -> 8 bf16, rounded
  const __m256i half = _mm256_srli_epi32(bf16_bits_8(v), 16);
  _mm_storeu_si128((__m128i*)p, _mm_packus_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1)));
}

AVX2 inline void store_bf16_16(bf16* p, __m256 lo, __m256 hi) {  // 16 float -> 16 bf16, rounded
  const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(bf16_bits_8(lo), 16), _mm256_srli_epi32(bf16_bits_8(hi), 16));
  _mm256_storeu_si256((__m256i*)p, _mm256_permute4x64_epi64(packed, 0xD8));
}

// e^x for x in [-87, 88] (clamped below), float32, ~1 ulp
// y[rows, cols) = bf16(bf16(sums) (+ bias, rounded)), sums [rows, cols] float32, cols a multiple of 16;
// with a residual (row stride ldy), bf16(residual + that): torch's bias add, then its residual add
AVX512 inline void round_block(const float* sums, const bf16* bias, const bf16* residual, bf16* y, int64_t rows, int64_t cols,
                        int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; j += 16) {
      __m512 v = round_bf16_ps(_mm512_loadu_ps(sums + r * cols + j));
      if (bias != nullptr) v = _mm512_add_ps(v, load_bf16(bias + j));
      if (residual != nullptr) v = _mm512_add_ps(load_bf16(residual + r * ldy + j), round_bf16_ps(v));
      _mm256_storeu_si256((__m256i*)(y + r * ldy + j), pack_bf16(v));
    }
}

AVX512 inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// e^x for finite x at most a rounding above 0 (softmax scores minus their maximum, every one visible,
// so no -inf and no clamp): 2^n e^r, r in [-ln2/2, ln2/2] by a degree-6 Taylor polynomial (~1 ulp)
AVX512 inline __m512 exp_le0_ps(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945f), x);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// SiLU in float32, g / (1 + e^-g): within an ulp or so of torch's (whose exp is Sleef's)
AVX512 inline __m512 silu_ps(__m512 g) {
  __m512 e = exp_ps(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(88.f)));
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

// Python's `weight * (x * rsqrt(mean(x^2) + eps)).to(bf16)` for one row of h (a multiple of 16):
// the squares summed in 16 lanes, then across them; two roundings, as the Python expression's
AVX512 inline void rms_norm(const bf16* x, const bf16* weight, bf16* out, int64_t h, float eps) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t j = 0; j < h; j += 16) {
    __m512 v = load_bf16(x + j);
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  __m512 inv = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(ss) / float(h) + eps));
  for (int64_t j = 0; j < h; j += 16) {
    __m512 y = round_bf16_ps(_mm512_mul_ps(load_bf16(x + j), inv));
    _mm256_storeu_si256((__m256i*)(out + j), pack_bf16(_mm512_mul_ps(load_bf16(weight + j), y)));
  }
}

}  // namespace prefixrag
