// A prefill's causal attention in bfloat16: every query row over the keys up to its own position,
// with AVX512-BF16 dot products, skipping the keys it cannot see.
//
// Invariants (engine/native/attention.py states them for Python):
//  * a row's result depends on its query, its position and the keys/values at positions <= it alone:
//    the keys are walked in blocks of KEYS at fixed absolute positions, in ascending order, with one
//    online-softmax update per block; keys past the row's position are masked out of the scores and
//    left out of the value sums (never multiplied by zero). So a prompt computed whole or in any
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

constexpr int64_t KEYS = 16;  // keys per block: one score vector
constexpr int ROWS = 4;       // query rows per pass over a head's keys (their accumulators stay in registers)

// Keys of one kv head as pairs of dimensions: kt[block][pair][key] (32-bit words, a bf16 pair each),
// zero past `keys`; what a block's 16 scores are summed from, pair by pair.
void transpose_keys(const uint32_t* k, int64_t row_words, int64_t keys, int64_t pairs, uint32_t* kt) {
  const int64_t blocks = (keys + KEYS - 1) / KEYS;
  for (int64_t b = 0; b < blocks; ++b) {
    uint32_t* dst = kt + b * pairs * KEYS;
    for (int64_t j = 0; j < KEYS; ++j) {
      const int64_t key = b * KEYS + j;
      if (key < keys) {
        const uint32_t* src = k + key * row_words;
        for (int64_t p = 0; p < pairs; ++p) dst[p * KEYS + j] = src[p];
      } else {
        for (int64_t p = 0; p < pairs; ++p) dst[p * KEYS + j] = 0;
      }
    }
  }
}

// Up to ROWS query rows of one head (positions pos[0..n), ascending) over their keys; D = head dim.
template <int D>
AVX512 void attend_tile(const bf16* const* qrow, const int64_t* pos, int n, const uint32_t* kt, const bf16* v,
                        int64_t v_stride, float scale, bf16* const* orow) {
  constexpr int PAIRS = D / 2, VEC = D / 16;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  __m512 o[ROWS][VEC];
  float m[ROWS], l[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    for (int c = 0; c < VEC; ++c) o[r][c] = _mm512_setzero_ps();
    m[r] = neg_inf;
    l[r] = 0.f;
  }
  const uint32_t* q32[ROWS];
  for (int r = 0; r < ROWS; ++r) q32[r] = reinterpret_cast<const uint32_t*>(qrow[r < n ? r : 0]);
  alignas(64) float p[ROWS][KEYS];
  const int64_t last_block = pos[n - 1] / KEYS;
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t b = 0; b <= last_block; ++b) {
    const uint32_t* kb = kt + b * PAIRS * KEYS;
    __m512 s[ROWS];
    for (int r = 0; r < ROWS; ++r) s[r] = _mm512_setzero_ps();
    for (int d = 0; d < PAIRS; ++d) {
      __m512bh kv = (__m512bh)_mm512_loadu_si512(kb + d * KEYS);
      for (int r = 0; r < ROWS; ++r)
        s[r] = _mm512_dpbf16_ps(s[r], kv, (__m512bh)_mm512_set1_epi32(int(q32[r][d])));
    }
    int count[ROWS];
    for (int r = 0; r < ROWS; ++r) {
      const int64_t visible = r < n ? pos[r] - b * KEYS + 1 : 0;  // keys of this block the row sees
      count[r] = int(visible < 0 ? 0 : (visible > KEYS ? KEYS : visible));
      if (count[r] == 0) continue;
      __mmask16 seen = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(count[r]));
      __m512 sc = _mm512_mask_mov_ps(_mm512_set1_ps(neg_inf), seen, _mm512_mul_ps(s[r], _mm512_set1_ps(scale)));
      const float top = std::max(m[r], _mm512_reduce_max_ps(sc));
      const float shrink = std::exp(m[r] - top);  // exp(-inf) = 0 on the first block
      __m512 e = _mm512_maskz_mov_ps(seen, exp_ps(_mm512_sub_ps(sc, _mm512_set1_ps(top))));
      _mm512_store_ps(p[r], e);
      l[r] = l[r] * shrink + _mm512_reduce_add_ps(e);
      m[r] = top;
      const __m512 f = _mm512_set1_ps(shrink);
      for (int c = 0; c < VEC; ++c) o[r][c] = _mm512_mul_ps(o[r][c], f);
    }
    int most = 0;
    for (int r = 0; r < ROWS; ++r) most = std::max(most, count[r]);
    for (int j = 0; j < most; ++j) {
      const bf16* vr = v + (b * KEYS + j) * v_stride;
      __m512 vv[VEC];
      for (int c = 0; c < VEC; ++c) vv[c] = load_bf16(vr + 16 * c);
      for (int r = 0; r < ROWS; ++r) {
        if (j >= count[r]) continue;
        const __m512 w = _mm512_set1_ps(p[r][j]);
        for (int c = 0; c < VEC; ++c) o[r][c] = _mm512_fmadd_ps(w, vv[c], o[r][c]);
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    const __m512 inv = _mm512_set1_ps(1.f / l[r]);
    for (int c = 0; c < VEC; ++c)
      _mm256_storeu_si256((__m256i*)(orow[r] + 16 * c), pack_bf16(_mm512_mul_ps(o[r][c], inv)));
  }
}

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
  const int64_t pairs = d / 2, blocks = (keys + KEYS - 1) / KEYS;
  std::vector<uint32_t> kt(size_t(kv_heads * blocks * pairs * KEYS));
  const auto* k32 = reinterpret_cast<const uint32_t*>(k.data_ptr());
  at::parallel_for(0, kv_heads, 1, [&](int64_t a, int64_t b) {
    for (int64_t g = a; g < b; ++g)
      transpose_keys(k32 + g * (k.stride(0) / 2), d / 2, keys, pairs, kt.data() + g * blocks * pairs * KEYS);
  });
  const int64_t tiles = (t + ROWS - 1) / ROWS;
  const bf16* qs = reinterpret_cast<const bf16*>(q.data_ptr());
  const bf16* vs = reinterpret_cast<const bf16*>(v.data_ptr());
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
      const uint32_t* ktg = kt.data() + g * blocks * pairs * KEYS;
      const bf16* vg = vs + g * v.stride(0);
      if (d == 64)
        attend_tile<64>(qrow, pos + i0, n, ktg, vg, d, float(scale), orow);
      else
        attend_tile<128>(qrow, pos + i0, n, ktg, vg, d, float(scale), orow);
    }
  });
  return out;
}

}  // namespace

void bind_prefill_attention(pybind11::module_& mod) {
  mod.def("attend_rows", &attend_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
}
