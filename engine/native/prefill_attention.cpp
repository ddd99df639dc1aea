// A prefill's causal attention in bfloat16: every query row over the keys up to its own position,
// with AVX512-BF16 dot products, skipping the keys it cannot see.
//
// Invariants (engine/native/attention.py states them for Python):
//  * a row's result depends on its query, its position and the keys/values at positions <= it alone:
//    the keys are walked in blocks of KEYS at fixed absolute positions, in ascending order, with one
//    online-softmax update per block; a block the row sees whole adds its values with bf16-rounded
//    weights, the block holding the row's position in float32 over the keys up to it only (keys
//    past the row are masked out of the scores and never multiplied into its sums). So a prompt computed whole or in any
//    split, with any batch mates or thread count, gives every row the same bits;
//  * keys past the last row's position are never read (the buffer may hold anything there);
//  * scores and sums are float32; the output is rounded to bfloat16 once.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "bf16.h"

#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace prefixrag;

constexpr int64_t KEYS = 64;  // keys per block: four score vectors, one online-softmax update
static_assert(KEYS == 64, "a whole block's softmax sums four score vectors");
constexpr int ROWS = 4;       // query rows per pass over a head's keys: 16 independent score sums

// One kv head's keys and values as 32-bit words of bf16 pairs, block by block, zero past `keys`:
//  kt[block][dim pair][key]: a block's scores summed pair of dimensions by pair (AVX512-BF16);
//  vt[block][key pair][dim]: a block's value sums taken pair of keys by pair.
// Pure data movement, 16 keys (gathered) or 32 dims (interleaved) per instruction: every call moves
// all the keys its rows see, however few the rows.
AVX512 void transpose_kv(const bf16* k, const bf16* v, int64_t d, int64_t keys, uint32_t* kt, uint32_t* vt,
                         int64_t b0, int64_t b1) {  // blocks [b0, b1)
  const int64_t pairs = d / 2;
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(int(pairs)));
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
      const __mmask16 mask = valid == 16 ? __mmask16(0xFFFF) : __mmask16((1u << valid) - 1);
      const uint32_t* src = k32 + (valid > 0 ? first * pairs : 0);
      for (int64_t p = 0; p < pairs; ++p)
        _mm512_storeu_si512(kd + p * KEYS + j0,
                            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, rows, src + p, 4));
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

// n <= R query rows of one head (positions pos[0..n), ascending) over their keys; D = head dim. A row's
// arithmetic is the same for any R and batch mates (R = n: a tile of fewer rows computes no spare scores).
// A block the row sees whole adds its values with bf16 weights (AVX512-BF16, as torch's kernel
// rounds them); the block holding the row's position adds them in float32, its own keys only.
template <int D, int R>
AVX512 void attend_tile(const bf16* const* qrow, const int64_t* pos, int n, const uint32_t* kt,
                        const uint32_t* vt, const bf16* v, float scale, bf16* const* orow) {
  constexpr int PAIRS = D / 2, VEC = D / 16, HALF = KEYS / 2, NV = KEYS / 16;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  __m512 o[R][VEC];
  float m[R], l[R];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < VEC; ++c) o[r][c] = _mm512_setzero_ps();
    m[r] = neg_inf;
    l[r] = 0.f;
  }
  const uint32_t* q32[R];
  for (int r = 0; r < R; ++r) q32[r] = reinterpret_cast<const uint32_t*>(qrow[r < n ? r : 0]);
  alignas(64) float p[R][KEYS];
  alignas(64) uint32_t pw[R][HALF];  // the weights as bf16 pairs
  const int64_t last_block = pos[n - 1] / KEYS;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t b = 0; b <= last_block; ++b) {
    const uint32_t* kb = kt + b * PAIRS * KEYS;
    __m512 s[R][NV];
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < NV; ++h) s[r][h] = _mm512_setzero_ps();
    for (int d = 0; d < PAIRS; ++d) {
      __m512bh kk[NV];
      for (int h = 0; h < NV; ++h) kk[h] = (__m512bh)_mm512_loadu_si512(kb + d * KEYS + 16 * h);
      for (int r = 0; r < R; ++r) {
        __m512bh qq = (__m512bh)_mm512_set1_epi32(int(q32[r][d]));
        for (int h = 0; h < NV; ++h) s[r][h] = _mm512_dpbf16_ps(s[r][h], kk[h], qq);
      }
    }
    int count[R];
    for (int r = 0; r < R; ++r) {
      const int64_t visible = r < n ? pos[r] - b * KEYS + 1 : 0;  // keys of this block the row sees
      count[r] = int(visible < 0 ? 0 : (visible > KEYS ? KEYS : visible));
    }
    // A row that sees the whole block (most blocks): no masks, and every such row's rescale in one
    // vector exp. Which path a row takes depends on its own position alone, never on its tile mates.
    alignas(64) float top[16] = {}, old[16] = {}, shrink[16];
    for (int r = 0; r < R; ++r) {
      if (count[r] != KEYS) continue;
      // scale > 0: the largest scaled score is the largest score, scaled
      const __m512 mx = _mm512_max_ps(_mm512_max_ps(s[r][0], s[r][1]), _mm512_max_ps(s[r][2], s[r][3]));
      top[r] = std::max(m[r], scale * _mm512_reduce_max_ps(mx));
      old[r] = m[r];
    }
    // e^(-inf) on a row's first block: exp_ps clamps it to e^-87, a factor on sums that are still 0
    _mm512_store_ps(shrink, exp_ps(_mm512_sub_ps(_mm512_load_ps(old), _mm512_load_ps(top))));
    for (int r = 0; r < R; ++r) {
      if (count[r] == KEYS) {
        const __m512 t = _mm512_set1_ps(top[r]);
        __m512 e[NV];
        for (int h = 0; h < NV; ++h) e[h] = exp_le0_ps(_mm512_fmsub_ps(s[r][h], sc, t));
        const __m512 f = _mm512_set1_ps(shrink[r]);
        for (int c = 0; c < VEC; ++c) o[r][c] = _mm512_mul_ps(o[r][c], f);
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3]));
        l[r] = l[r] * shrink[r] + _mm512_reduce_add_ps(sum);
        m[r] = top[r];
        for (int h = 0; h < NV; h += 2)
          _mm512_store_si512(pw[r] + 8 * h, (__m512i)_mm512_cvtne2ps_pbh(e[h + 1], e[h]));
        continue;
      }
      if (count[r] == 0) continue;
      // the block holding the row's position: the keys past it masked out
      const __m512i seen_n = _mm512_set1_epi32(count[r]);
      __mmask16 seen[NV];
      __m512 x[NV];
      __m512 mx = _mm512_set1_ps(neg_inf);
      for (int h = 0; h < NV; ++h) {
        seen[h] = _mm512_cmplt_epi32_mask(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * h)), seen_n);
        x[h] = _mm512_mask_mov_ps(_mm512_set1_ps(neg_inf), seen[h], _mm512_mul_ps(s[r][h], sc));
        mx = _mm512_max_ps(mx, x[h]);
      }
      const float row_top = std::max(m[r], _mm512_reduce_max_ps(mx));
      const __m512 t = _mm512_set1_ps(row_top);
      __m512 sum = _mm512_setzero_ps();
      for (int h = 0; h < NV; ++h) {
        const __m512 e = _mm512_maskz_mov_ps(seen[h], exp_ps(_mm512_sub_ps(x[h], t)));
        sum = _mm512_add_ps(sum, e);
        _mm512_store_ps(p[r] + 16 * h, e);
      }
      if (row_top != m[r]) {  // a new maximum: rescale what is summed so far (exp(-inf) = 0 at first)
        const float row_shrink = std::exp(m[r] - row_top);
        l[r] *= row_shrink;
        const __m512 f = _mm512_set1_ps(row_shrink);
        for (int c = 0; c < VEC; ++c) o[r][c] = _mm512_mul_ps(o[r][c], f);
        m[r] = row_top;
      }
      l[r] += _mm512_reduce_add_ps(sum);
    }
    const uint32_t* vb = vt + b * HALF * D;
    for (int j = 0; j < HALF; ++j) {  // whole blocks: a pair of keys per step
      __m512bh vv[VEC];
      for (int c = 0; c < VEC; ++c) vv[c] = (__m512bh)_mm512_loadu_si512(vb + j * D + 16 * c);
      for (int r = 0; r < R; ++r) {
        if (count[r] != KEYS) continue;
        const __m512bh w = (__m512bh)_mm512_set1_epi32(int(pw[r][j]));
        for (int c = 0; c < VEC; ++c) o[r][c] = _mm512_dpbf16_ps(o[r][c], vv[c], w);
      }
    }
    for (int r = 0; r < R; ++r) {  // the block holding the row's position: its own keys only
      if (count[r] == 0 || count[r] == KEYS) continue;
      for (int j = 0; j < count[r]; ++j) {
        const bf16* vr = v + (b * KEYS + j) * D;
        const __m512 w = _mm512_set1_ps(p[r][j]);
        for (int c = 0; c < VEC; ++c) o[r][c] = _mm512_fmadd_ps(w, load_bf16(vr + 16 * c), o[r][c]);
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    const __m512 inv = _mm512_set1_ps(1.f / l[r]);
    for (int c = 0; c < VEC; ++c)
      _mm256_storeu_si256((__m256i*)(orow[r] + 16 * c), pack_bf16(_mm512_mul_ps(o[r][c], inv)));
  }
}

using TileFn = void (*)(const bf16* const*, const int64_t*, int, const uint32_t*, const uint32_t*, const bf16*, float,
                       bf16* const*);
static_assert(ROWS == 4, "TILES lists a kernel per row count up to ROWS");
const TileFn TILES[2][ROWS] = {{attend_tile<64, 1>, attend_tile<64, 2>, attend_tile<64, 3>, attend_tile<64, 4>},
                               {attend_tile<128, 1>, attend_tile<128, 2>, attend_tile<128, 3>, attend_tile<128, 4>}};

// q [T, H, D], k/v [KVH, capacity, D] (one layer), positions [T] ascending -> [T, H * D]
torch::Tensor attend_rows(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& positions, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && q.dim() == 3 && q.is_contiguous(), "q must be contiguous [T, H, D] bf16");
  const int64_t t = q.size(0), heads = q.size(1), d = q.size(2);
  TORCH_CHECK(d == 64 || d == 128, "head_dim must be 64 or 128, got ", d);
  for (const auto* kv : {&k, &v})
    TORCH_CHECK(kv->scalar_type() == torch::kBFloat16 && kv->dim() == 3 && kv->size(2) == d && kv->stride(2) == 1 &&
                    kv->stride(1) == d,
                "k/v must be [KVH, capacity, D] bf16 with contiguous rows");
  const int64_t kv_heads = k.size(0), group = heads / kv_heads;
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0 && v.size(0) == kv_heads, "heads must be a multiple of kv_heads");
  TORCH_CHECK(positions.scalar_type() == torch::kLong && positions.dim() == 1 && positions.numel() == t &&
                  positions.is_contiguous(),
              "positions must be contiguous [T] int64");
  auto out = torch::empty({t, heads * d}, q.options());
  if (t == 0) return out;
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(pos[i] >= 0 && (i == 0 || pos[i] > pos[i - 1]), "positions must be ascending and >= 0");
  const int64_t keys = pos[t - 1] + 1;
  TORCH_CHECK(keys <= k.size(1) && keys <= v.size(1), "positions reach past the KV buffer's capacity");
  const int64_t blocks = (keys + KEYS - 1) / KEYS, block_words = KEYS * d / 2;
  std::vector<uint32_t> kt(size_t(kv_heads * blocks * block_words)), vt(kt.size());
  const bf16* ks = reinterpret_cast<const bf16*>(k.data_ptr());
  const bf16* vs = reinterpret_cast<const bf16*>(v.data_ptr());
  // (kv head, block) items: a few heads over two threads would leave one idle for a third of it
  at::parallel_for(0, kv_heads * blocks, 1, [&](int64_t a, int64_t e) {
    while (a < e) {
      const int64_t g = a / blocks, b0 = a % blocks, b1 = std::min(blocks, b0 + (e - a));
      const int64_t at = g * blocks * block_words;
      transpose_kv(ks + g * k.stride(0), vs + g * v.stride(0), d, keys, kt.data() + at, vt.data() + at, b0, b1);
      a += b1 - b0;
    }
  });
  const int64_t tiles = (t + ROWS - 1) / ROWS;
  const bf16* qs = reinterpret_cast<const bf16*>(q.data_ptr());
  bf16* os = reinterpret_cast<bf16*>(out.data_ptr());
  // items in zigzag tile order (first, last, second, ...): contiguous thread ranges get equal work
  at::parallel_for(0, tiles * heads, 1, [&](int64_t a, int64_t b) {
    for (int64_t item = a; item < b; ++item) {
      const int64_t z = item / heads, h = item % heads;
      const int64_t tile = z % 2 == 0 ? z / 2 : tiles - 1 - z / 2;
      const int64_t i0 = tile * ROWS;
      const int n = int(std::min<int64_t>(ROWS, t - i0));
      const int64_t g = h / group;
      const bf16* qrow[ROWS];
      bf16* orow[ROWS];
      for (int r = 0; r < ROWS; ++r) {
        const int64_t i = i0 + std::min(r, n - 1);
        qrow[r] = qs + (i * heads + h) * d;
        orow[r] = os + i * heads * d + h * d;
      }
      const int64_t at = g * blocks * block_words;
      const bf16* vg = vs + g * v.stride(0);
      TILES[d == 64 ? 0 : 1][n - 1](qrow, pos + i0, n, kt.data() + at, vt.data() + at, vg, float(scale), orow);
    }
  });
  return out;
}

}  // namespace

void bind_prefill_attention(pybind11::module_& mod) {
  mod.def("attend_rows", &attend_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
}
