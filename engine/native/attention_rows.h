// A prefill's causal attention in bfloat16, the part its kernels share: every query row over the keys
// up to its own position, the blocks' products by a Step (prefill_attention.cpp: AVX512-BF16 register
// tiles; prefill_attention_amx.cpp: AMX tiles).
//
// Invariants (engine/native/attention.py states them for Python):
//  * a row's result depends on its query, its position and the keys/values at positions <= it alone:
//    the keys are walked in blocks of KEYS at fixed absolute positions, in ascending order, with one
//    online-softmax update per block; a block the row sees whole adds its values with bf16-rounded
//    weights, the block holding the row's position in float32 over the keys up to it only (keys
//    past the row are masked out of the scores and never multiplied into its sums). A Step's product
//    for a row depends on that row's inputs alone. So a prompt computed whole or in any split, with
//    any batch mates or thread count, gives every row the same bits (for one Step);
//  * keys past the last row's position are never read (the buffer may hold anything there);
//  * scores and sums are float32; the output is rounded to bfloat16 once.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "attention_call.h"
#include "bf16.h"
#include "claimed_items.h"

#include <cmath>
#include <limits>
#include <memory>

namespace prefixrag {

constexpr int64_t KEYS = 64;  // keys per block: four score vectors, one online-softmax update
static_assert(KEYS == 64, "a whole block's softmax sums four score vectors");

// A 16 x 16 block of 32-bit words transposed in registers: r[i] holds row i, then column i.
AVX512 inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: rows i, i + 1 interleaved
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // per lane: four rows' words 0, 1, 2, 3 of that lane
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // column 4 * lane + c: lane `lane` of rows 0-3, 4-7, 8-11, 12-15
    const __m512i a = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), b = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    const __m512i e = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88), f = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_i32x4(a, e, 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(a, e, 0xDD);
    t[4 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(b, f, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// One kv head's keys and values as 32-bit words of bf16 pairs, block by block, zero past `keys`:
//  kt[block][dim pair][key]: a block's scores summed pair of dimensions by pair;
//  vt[block][key pair][dim]: a block's value sums taken pair of keys by pair.
// Pure data movement, 16 x 16 words (transposed in registers) or 32 dims (interleaved) at a time:
// every call moves all the keys its rows see, however few the rows.
AVX512 inline void transpose_kv(const bf16* k, const bf16* v, int64_t d, int64_t keys, uint32_t* kt, uint32_t* vt,
                         int64_t b0, int64_t b1) {  // blocks [b0, b1)
  const int64_t pairs = d / 2;
  alignas(64) uint16_t lo_idx[32], hi_idx[32];  // interleave two rows' 16-bit elements 0-15, then 16-31
  for (int j = 0; j < 32; ++j) {
    lo_idx[j] = uint16_t(j % 2 == 0 ? j / 2 : 32 + j / 2);
    hi_idx[j] = uint16_t(lo_idx[j] + 16);
  }
  const __m512i lo_perm = _mm512_load_si512(lo_idx), hi_perm = _mm512_load_si512(hi_idx);
  const uint32_t* k32 = reinterpret_cast<const uint32_t*>(k);
  for (int64_t b = b0; b < b1; ++b) {
    uint32_t* kd = kt + b * pairs * KEYS;
    uint32_t* vd = vt + b * (KEYS / 2) * d;
    for (int64_t j0 = 0; j0 < KEYS; j0 += 16) {
      const int64_t first = b * KEYS + j0, valid = std::max<int64_t>(0, std::min<int64_t>(16, keys - first));
      for (int64_t p0 = 0; p0 < pairs; p0 += 16) {  // 16 keys x 16 pairs, keys past `keys` zero
        __m512i r[16];
        for (int64_t i = 0; i < 16; ++i)
          r[i] = i < valid ? _mm512_loadu_si512(k32 + (first + i) * pairs + p0) : _mm512_setzero_si512();
        transpose16(r);
        for (int64_t p = 0; p < 16; ++p) _mm512_storeu_si512(kd + (p0 + p) * KEYS + j0, r[p]);
      }
    }
    for (int64_t m = 0; m < KEYS / 2; ++m) {
      const int64_t key = b * KEYS + 2 * m;
      const bf16* lo_row = key < keys ? v + key * d : nullptr;
      const bf16* hi_row = key + 1 < keys ? v + (key + 1) * d : nullptr;
      for (int64_t c = 0; c < d; c += 32) {
        const __m512i lo = lo_row ? _mm512_loadu_si512(lo_row + c) : _mm512_setzero_si512();
        const __m512i hi = hi_row ? _mm512_loadu_si512(hi_row + c) : _mm512_setzero_si512();
        _mm512_storeu_si512(vd + m * d + c, _mm512_permutex2var_epi16(lo, lo_perm, hi));
        _mm512_storeu_si512(vd + m * d + c + 16, _mm512_permutex2var_epi16(lo, hi_perm, hi));
      }
    }
  }
}

// rows whose values a block's partial pass adds together: their sums and one value row fit the 32
// vector registers (6 x 4 + 4 at head dim 64, 2 x 8 + 8 at 128)
template <int D>
constexpr int PARTIAL_GROUP = D == 64 ? 6 : 2;

// o[r + i] += the sum over keys j < count[i], in order, of s[r + i][j] * values[j] (float32), for G rows
// (counts ascending): each value row loaded and widened once for the rows that see it, each row's sums
// as it alone would
template <int D, int G>
AVX512 void partial_values(float (*s)[KEYS], float (*o)[D], int r, const int* count, const bf16* values) {
  constexpr int VEC = D / 16;
  __m512 acc[G][VEC];
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < VEC; ++c) acc[i][c] = _mm512_load_ps(o[r + i] + 16 * c);
  for (int j = 0; j < count[G - 1]; ++j) {
    __m512 vv[VEC];
    for (int c = 0; c < VEC; ++c) vv[c] = load_bf16(values + j * D + 16 * c);
    for (int i = 0; i < G; ++i) {
      if (j >= count[i]) continue;  // past row i's own position
      const __m512 w = _mm512_set1_ps(s[r + i][j]);
      for (int c = 0; c < VEC; ++c) acc[i][c] = _mm512_fmadd_ps(w, vv[c], acc[i][c]);
    }
  }
  for (int i = 0; i < G; ++i)
    for (int c = 0; c < VEC; ++c) _mm512_store_ps(o[r + i] + 16 * c, acc[i][c]);
}

template <int D>
using PartialValues = void (*)(float (*)[KEYS], float (*)[D], int, const int*, const bf16*);

template <int D>
AVX512 PartialValues<D> partial_group(int rows) {
  if constexpr (D == 64) {
    constexpr PartialValues<D> by_rows[] = {partial_values<D, 1>, partial_values<D, 2>, partial_values<D, 3>,
                                            partial_values<D, 4>, partial_values<D, 5>, partial_values<D, 6>};
    return by_rows[rows - 1];
  } else {
    return rows == 1 ? partial_values<D, 1> : partial_values<D, 2>;
  }
}

// One item: n <= Step::ROWS rows, row r at position pos[r] (ascending in r) with query qrow[r], all of
// one kv group (kt, vt its transposed blocks, v its plain values), writing orow[r]. Step takes the
// block's scores and its whole rows' value sums (AVX512-BF16 register tiles or AMX tiles); the softmax
// and the partial block's rows are this function's, in float32 per row, whatever the step.
template <int D, class Step>
AVX512 void attend_rows_item(int n, const bf16* const* qrow, const int64_t* pos, const uint32_t* kt,
                             const uint32_t* vt, const bf16* v, float scale, bf16* const* orow) {
  constexpr int PAIRS = D / 2, VEC = D / 16, HALF = KEYS / 2, NV = KEYS / 16, MAX_ROWS = Step::ROWS;
  static_assert(MAX_ROWS <= 16, "the row maxima are 16 lanes");
  const float neg_inf = -std::numeric_limits<float>::infinity();
  alignas(64) float s[MAX_ROWS][KEYS];      // the block's raw scores, then (partial rows) float32 weights
  alignas(64) uint32_t pw[MAX_ROWS][HALF] = {};  // whole-block weights as bf16 pairs
  alignas(64) float o[MAX_ROWS][D];         // value sums
  alignas(64) float lsum[MAX_ROWS][16];     // softmax denominators, in 16 lanes
  alignas(64) float m[16], top[16], shrink[MAX_ROWS];
  const Step step(qrow, n, D);
  for (int r = 0; r < 16; ++r) m[r] = r < n ? neg_inf : 0.f;  // lanes past n: finite, unused
  for (int r = 0; r < n; ++r) {
    for (int c = 0; c < D; ++c) o[r][c] = 0.f;
    for (int c = 0; c < 16; ++c) lsum[r][c] = 0.f;
  }
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 sc = _mm512_set1_ps(scale);
  const int64_t last_block = pos[n - 1] / KEYS;
  for (int64_t b = 0; b <= last_block; ++b) {
    // rows ascend by position: those that see any of this block are a suffix [first, n), and those
    // that see all of it a suffix [whole, n) of that
    int first = 0, whole = 0;
    while (first < n && pos[first] < b * KEYS) ++first;
    whole = first;
    while (whole < n && pos[whole] < b * KEYS + KEYS - 1) ++whole;
    const uint32_t* kb = kt + b * PAIRS * KEYS;
    step.template scores<D>(kb, s, first);
    // whole rows: the new maximum, then every such row's rescale in one vector exp
    for (int r = 0; r < 16; ++r) top[r] = m[r];
    for (int r = whole; r < n; ++r) {
      const __m512 mx = _mm512_max_ps(_mm512_max_ps(_mm512_load_ps(s[r]), _mm512_load_ps(s[r] + 16)),
                                      _mm512_max_ps(_mm512_load_ps(s[r] + 32), _mm512_load_ps(s[r] + 48)));
      top[r] = std::max(m[r], scale * _mm512_reduce_max_ps(mx));  // scale > 0
    }
    alignas(64) float f[16];
    // e^(-inf) on a row's first block: exp_ps clamps it to e^-87, a factor on sums that are still 0
    _mm512_store_ps(f, exp_ps(_mm512_sub_ps(_mm512_load_ps(m), _mm512_load_ps(top))));
    for (int r = whole; r < n; ++r) {
      const __m512 t = _mm512_set1_ps(top[r]);
      __m512 e[NV];
      for (int h = 0; h < NV; ++h) e[h] = exp_le0_ps(_mm512_fmsub_ps(_mm512_load_ps(s[r] + 16 * h), sc, t));
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3]));
      _mm512_store_ps(lsum[r], _mm512_fmadd_ps(_mm512_load_ps(lsum[r]), _mm512_set1_ps(f[r]), sum));
      m[r] = top[r];
      shrink[r] = f[r];
      for (int h = 0; h < NV; h += 2) _mm512_store_si512(pw[r] + 8 * h, (__m512i)_mm512_cvtne2ps_pbh(e[h + 1], e[h]));
    }
    // the rows whose position is in this block: the keys past it masked out, float32 weights
    for (int r = first; r < whole; ++r) {
      const int count = int(pos[r] - b * KEYS + 1);
      const __m512i seen_n = _mm512_set1_epi32(count);
      __mmask16 seen[NV];
      __m512 x[NV];
      __m512 mx = _mm512_set1_ps(neg_inf);
      for (int h = 0; h < NV; ++h) {
        seen[h] = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * h)), seen_n);
        x[h] = _mm512_mask_mov_ps(_mm512_set1_ps(neg_inf), seen[h], _mm512_mul_ps(_mm512_load_ps(s[r] + 16 * h), sc));
        mx = _mm512_max_ps(mx, x[h]);
      }
      const float row_top = std::max(m[r], _mm512_reduce_max_ps(mx));
      const __m512 t = _mm512_set1_ps(row_top);
      __m512 sum = _mm512_setzero_ps();
      for (int h = 0; h < NV; ++h) {
        const __m512 e = _mm512_maskz_mov_ps(seen[h], exp_ps(_mm512_sub_ps(x[h], t)));
        sum = _mm512_add_ps(sum, e);
        _mm512_store_ps(s[r] + 16 * h, e);
      }
      __m512 acc[VEC];
      for (int c = 0; c < VEC; ++c) acc[c] = _mm512_load_ps(o[r] + 16 * c);
      __m512 l = _mm512_load_ps(lsum[r]);
      if (row_top != m[r]) {  // a new maximum: rescale what is summed so far (exp(-inf) = 0 at first)
        const __m512 rf = _mm512_set1_ps(std::exp(m[r] - row_top));
        l = _mm512_mul_ps(l, rf);
        for (int c = 0; c < VEC; ++c) acc[c] = _mm512_mul_ps(acc[c], rf);
        m[r] = row_top;
      }
      _mm512_store_ps(lsum[r], _mm512_add_ps(l, sum));
      for (int c = 0; c < VEC; ++c) _mm512_store_ps(o[r] + 16 * c, acc[c]);
    }
    // then their values, each over its own keys, PARTIAL_GROUP rows sharing each value row's load
    for (int r = first; r < whole; r += PARTIAL_GROUP<D>) {
      const int rows = std::min(PARTIAL_GROUP<D>, whole - r);
      int count[PARTIAL_GROUP<D>];
      for (int i = 0; i < rows; ++i) count[i] = int(pos[r + i] - b * KEYS + 1);
      partial_group<D>(rows)(s, o, r, count, v + b * KEYS * D);
    }
    step.template values<D>(vt + b * HALF * D, pw, shrink, o, whole);
  }
  for (int r = 0; r < n; ++r) {
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(_mm512_load_ps(lsum[r])));
    for (int c = 0; c < VEC; ++c)
      _mm256_storeu_si256((__m256i*)(orow[r] + 16 * c), pack_bf16(_mm512_mul_ps(_mm512_load_ps(o[r] + 16 * c), inv)));
  }
}

// q [T, H, D], k/v [KVH, capacity, D] (one layer), positions [T] ascending -> [T, H * D], the blocks'
// products by Step (its ROWS rows an item at most; enter/leave around a thread's items)
template <class Step>
torch::Tensor attend_rows(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& positions, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16, "q must be bf16");
  const int64_t keys = checked_attention_call(q, k, v, positions);
  const int64_t t = q.size(0), heads = q.size(1), d = q.size(2), kv_heads = k.size(0), group = heads / kv_heads;
  auto out = torch::empty({t, heads * d}, q.options());
  if (t == 0) return out;
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t blocks = (keys + KEYS - 1) / KEYS, block_words = KEYS * d / 2;
  // scratch every word of which transpose_kv writes: not zeroed first
  const size_t words = size_t(kv_heads * blocks * block_words);
  const std::unique_ptr<uint32_t[]> kt_words(new uint32_t[words]), vt_words(new uint32_t[words]);
  uint32_t* const kt = kt_words.get();
  uint32_t* const vt = vt_words.get();
  const bf16* ks = reinterpret_cast<const bf16*>(k.data_ptr());
  const bf16* vs = reinterpret_cast<const bf16*>(v.data_ptr());
  // (kv head, block) items: a few heads over two threads would leave one idle for a third of it
  at::parallel_for(0, kv_heads * blocks, 1, [&](int64_t a, int64_t e) {
    while (a < e) {
      const int64_t g = a / blocks, b0 = a % blocks, b1 = std::min(blocks, b0 + (e - a));
      const int64_t at = g * blocks * block_words;
      transpose_kv(ks + g * k.stride(0), vs + g * v.stride(0), d, keys, kt + at, vt + at, b0, b1);
      a += b1 - b0;
    }
  });
  // An item: a tile of consecutive query rows x a set of one group's heads (its whole group, unless
  // fewer than Step::SPREAD tiles per thread would leave threads idle: then one head), at most
  // MAX_ROWS rows.
  const int64_t threads = at::get_num_threads();
  constexpr int64_t MAX_ROWS = Step::ROWS;
  const int64_t span = std::min<int64_t>(group, MAX_ROWS);
  const int64_t group_heads = (t + MAX_ROWS - 1) / MAX_ROWS * kv_heads >= Step::SPREAD * threads ? span : 1;
  const int64_t per_tile = std::max<int64_t>(1, MAX_ROWS / group_heads);
  const int64_t sets_per_group = (group + group_heads - 1) / group_heads;  // sets never straddle a group
  const int64_t tiles = (t + per_tile - 1) / per_tile, head_sets = kv_heads * sets_per_group;
  const bf16* qs = reinterpret_cast<const bf16*>(q.data_ptr());
  bf16* os = reinterpret_cast<bf16*>(out.data_ptr());
  // items claimed costliest first (a tile's rows see more keys the later they stand), so that the
  // last items to finish are short ones
  claim_items(
      tiles * head_sets, [] { Step::enter(); },
      [&](int64_t item) {
        const int64_t tile = tiles - 1 - item / head_sets, hs = item % head_sets;
        const int64_t i0 = tile * per_tile, rows_t = std::min(per_tile, t - i0);
        const int64_t g = hs / sets_per_group, h0 = g * group + (hs % sets_per_group) * group_heads;
        const int64_t hn = std::min(group_heads, g * group + group - h0);
        const bf16* qrow[MAX_ROWS];
        bf16* orow[MAX_ROWS];
        int64_t rpos[MAX_ROWS];
        int n = 0;
        for (int64_t i = i0; i < i0 + rows_t; ++i)
          for (int64_t h = h0; h < h0 + hn; ++h, ++n) {
            qrow[n] = qs + (i * heads + h) * d;
            orow[n] = os + i * heads * d + h * d;
            rpos[n] = pos[i];
          }
        const int64_t at = g * blocks * block_words;
        const auto item_fn = d == 64 ? attend_rows_item<64, Step> : attend_rows_item<128, Step>;
        item_fn(n, qrow, rpos, kt + at, vt + at, vs + g * v.stride(0), float(scale), orow);
      },
      [] { Step::leave(); });
  return out;
}

}  // namespace prefixrag
