// float32 helpers shared by the AVX2 kernels (decode_step_f32.cpp, prefill_attention_f32.cpp,
// prefill_rows_f32.cpp).
//
// Invariant: each is a fixed sequence of operations, so equal inputs give equal bits wherever called.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#define AVX2 __attribute__((target("avx2,fma")))

namespace prefixrag {

AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x for x in [-87, 88] (clamped below), float32, ~1 ulp
AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

// weight * (x * rsqrt(mean(x^2) + eps)) for one row of h (a multiple of 8)
AVX2 inline void rms_norm(const float* x, const float* weight, float* out, int64_t h, float eps) {
  __m256 ss = _mm256_setzero_ps();
  for (int64_t j = 0; j < h; j += 8) {
    __m256 v = _mm256_loadu_ps(x + j);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  __m256 inv = _mm256_set1_ps(1.f / std::sqrt(hsum(ss) / float(h) + eps));
  for (int64_t j = 0; j < h; j += 8)
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(weight + j), _mm256_mul_ps(_mm256_loadu_ps(x + j), inv)));
}

// out = silu(g) * u for the gate g = sums[:n] and value u = sums[n:2n]
AVX2 inline void silu_mul(const float* sums, float* out, int64_t n) {
  for (int64_t j = 0; j < n; j += 8) {
    __m256 g = _mm256_loadu_ps(sums + j);
    __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(88.f)));
    __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(silu, _mm256_loadu_ps(sums + n + j)));
  }
}

}  // namespace prefixrag
