// The bfloat16 decode step's kernels on AVX2 + FMA, for CPUs without AVX512-BF16 (decode_step.cpp
// runs its layers over these or over the AVX512-BF16 ones).
//
// Invariants: each rounds to bfloat16 where the AVX512-BF16 kernel does (so where the Python layer
// loop does); dot products widen bfloat16 to float32 (exact) and add in fused multiply-adds, 8 lanes
// at a time, so their sums run in another order than the AVX512-BF16 kernels' (close, not equal); a
// row's result depends on its own inputs alone.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "bf16.h"
#include "f32.h"
#include "team.h"
#include "tiles.h"

namespace prefixrag::avx2 {

// weight * (x * rsqrt(mean(x^2) + eps)).to(bf16) for one row of h (a multiple of 16): two roundings
AVX2 inline void rms_norm(const bf16* x, const bf16* weight, bf16* out, int64_t h, float eps) {
  __m256 ss = _mm256_setzero_ps();
  for (int64_t j = 0; j < h; j += 8) {
    const __m256 v = load_bf16_8(x + j);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  const __m256 inv = _mm256_set1_ps(1.f / std::sqrt(hsum(ss) / float(h) + eps));
  for (int64_t j = 0; j < h; j += 8) {
    const __m256 y = round_bf16_8(_mm256_mul_ps(load_bf16_8(x + j), inv));
    store_bf16_8(out + j, _mm256_mul_ps(load_bf16_8(weight + j), y));
  }
}

// y [m, n] (float32 sums) = x [m, k] @ w^T for w packed in tiles, split by column tile across threads
inline void gemv(Team& team, const bf16* x, const bf16* w, float* y, int64_t m, int64_t k, int64_t n) {
  std::vector<float> wide(m * k);
  widen_rows(x, wide.data(), m * k);
  team.parallel(n / TILE_COLS, [&](int64_t a, int64_t b) { tile_sums_avx2(wide.data(), w, y, m, k, n, a, b); });
}

// out = bf16(bf16(sums) (+ bias, rounded)) for n values; n a multiple of 8
AVX2 inline void round_sums(const float* sums, const bf16* bias, bf16* out, int64_t n) {
  for (int64_t j = 0; j < n; j += 8) {
    __m256 v = round_bf16_8(_mm256_loadu_ps(sums + j));
    if (bias != nullptr) v = _mm256_add_ps(v, load_bf16_8(bias + j));
    store_bf16_8(out + j, v);
  }
}

// x += bf16(bf16(sums) (+ bias, rounded)) for n values; n a multiple of 8
AVX2 inline void add_sums(const float* sums, const bf16* bias, bf16* x, int64_t n) {
  for (int64_t j = 0; j < n; j += 8) {
    __m256 v = round_bf16_8(_mm256_loadu_ps(sums + j));
    if (bias != nullptr) v = round_bf16_8(_mm256_add_ps(v, load_bf16_8(bias + j)));
    store_bf16_8(x + j, _mm256_add_ps(load_bf16_8(x + j), v));
  }
}

// one head's RoPE in place: x * cos + rotate_half(x) * sin, each product rounded, the sum rounded
AVX2 inline void rope_head(bf16* v, const bf16* cs, const bf16* sn, int64_t d) {
  const int64_t half = d / 2;
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t j = 0; j < half; j += 8) {
    const __m256 lo = load_bf16_8(v + j), hi = load_bf16_8(v + half + j);
    const __m256 lo_out = _mm256_add_ps(round_bf16_8(_mm256_mul_ps(lo, load_bf16_8(cs + j))),
                                        round_bf16_8(_mm256_mul_ps(_mm256_xor_ps(hi, sign), load_bf16_8(sn + j))));
    const __m256 hi_out = _mm256_add_ps(round_bf16_8(_mm256_mul_ps(hi, load_bf16_8(cs + half + j))),
                                        round_bf16_8(_mm256_mul_ps(lo, load_bf16_8(sn + half + j))));
    store_bf16_8(v + j, lo_out);
    store_bf16_8(v + half + j, hi_out);
  }
}

// out = bf16(bf16(silu(g)) * u) for the gate g = bf16(sums[:n]) and value u = bf16(sums[n:2n])
AVX2 inline void silu_mul(const float* sums, bf16* out, int64_t n) {
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 g = round_bf16_8(_mm256_loadu_ps(sums + j));
    const __m256 u = round_bf16_8(_mm256_loadu_ps(sums + n + j));
    const __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(88.f)));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
    store_bf16_8(out + j, _mm256_mul_ps(round_bf16_8(silu), u));
  }
}

// out[h][8 c .. 8 (c + CB)) = bf16(sum_t p[h][t] v[t] * inv[h]) for NH heads, each lane summed over t in order
template <int NH, int CB>
AVX2 void weigh_values(const float* scores, const bf16* values, int64_t len, int64_t d, int64_t c, const float* inv,
                       bf16* out) {
  __m256 acc[NH][CB];
  for (int hd = 0; hd < NH; ++hd)
    for (int u = 0; u < CB; ++u) acc[hd][u] = _mm256_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    const bf16* vt = values + t * d + 8 * c;
    for (int u = 0; u < CB; ++u) {
      const __m256 v = load_bf16_8(vt + 8 * u);
      for (int hd = 0; hd < NH; ++hd) acc[hd][u] = _mm256_fmadd_ps(_mm256_set1_ps(scores[hd * len + t]), v, acc[hd][u]);
    }
  }
  for (int hd = 0; hd < NH; ++hd)
    for (int u = 0; u < CB; ++u) store_bf16_8(out + hd * d + 8 * (c + u), _mm256_mul_ps(acc[hd][u], _mm256_set1_ps(inv[hd])));
}

// NH query heads of one KV group over keys [0, len): out[h] (bf16) = softmax(q[h] . k * scale) @ v,
// d a multiple of 32 and at most 256, q and out heads d apart, scores [NH][len]. A head's arithmetic
// is the same for any NH (the heads share only the loads of keys and values).
template <int NH>
AVX2 void attend_heads(const bf16* q, const bf16* keys, const bf16* values, int64_t len, int64_t d, float scale,
                       float* scores, bf16* out) {
  float qf[NH * 256];
  for (int hd = 0; hd < NH; ++hd) widen_rows(q + hd * d, qf + hd * d, d);
  float best[NH];
  for (int hd = 0; hd < NH; ++hd) best[hd] = -INFINITY;
  int64_t t = 0;
  for (; t + 4 <= len; t += 4) {  // four keys at a time: four independent sums per head
    __m256 acc[NH][4];
    for (int hd = 0; hd < NH; ++hd)
      for (int u = 0; u < 4; ++u) acc[hd][u] = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 8)
      for (int u = 0; u < 4; ++u) {
        const __m256 kv = load_bf16_8(keys + (t + u) * d + j);
        for (int hd = 0; hd < NH; ++hd) acc[hd][u] = _mm256_fmadd_ps(_mm256_loadu_ps(qf + hd * d + j), kv, acc[hd][u]);
      }
    for (int hd = 0; hd < NH; ++hd)
      for (int u = 0; u < 4; ++u) {
        const float s = hsum(acc[hd][u]) * scale;
        scores[hd * len + t + u] = s;
        best[hd] = std::max(best[hd], s);
      }
  }
  for (; t < len; ++t)
    for (int hd = 0; hd < NH; ++hd) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t j = 0; j < d; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qf + hd * d + j), load_bf16_8(keys + t * d + j), acc);
      scores[hd * len + t] = hsum(acc) * scale;
      best[hd] = std::max(best[hd], scores[hd * len + t]);
    }
  float inv[NH];
  for (int hd = 0; hd < NH; ++hd) {
    float* row = scores + hd * len;
    const __m256 vbest = _mm256_set1_ps(best[hd]);
    __m256 vsum = _mm256_setzero_ps();
    t = 0;
    for (; t + 8 <= len; t += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + t), vbest));
      _mm256_storeu_ps(row + t, e);
      vsum = _mm256_add_ps(vsum, e);
    }
    float total = hsum(vsum);
    for (; t < len; ++t) {
      row[t] = std::exp(row[t] - best[hd]);
      total += row[t];
    }
    inv[hd] = 1.f / total;
  }
  // values, four 8-lane chunks of the head dim at a time: NH * 4 independent sums
  for (int64_t c = 0; c < d / 8; c += 4) weigh_values<NH, 4>(scores, values, len, d, c, inv, out);
}

using AttendFn = void (*)(const bf16*, const bf16*, const bf16*, int64_t, int64_t, float, float*, bf16*);
constexpr int64_t MAX_GROUP = 3;  // query heads sharing one pass over their group's keys: NH * 4 sums in 16 registers
inline const AttendFn ATTEND[MAX_GROUP + 1] = {nullptr, attend_heads<1>, attend_heads<2>, attend_heads<3>};

}  // namespace prefixrag::avx2
