// A prefill's causal attention in float32 arithmetic (AVX2 + FMA): every query row over the keys up to
// its own position, skipping the keys it cannot see. Queries, keys and values are float32, or
// bfloat16 (on CPUs without AVX512-BF16: widened to float32 exactly as they are read, the output
// rounded to bfloat16 once).
//
// Invariants (engine/native/attention.py states them for Python):
//  * a row's result depends on its query, its position and the keys/values at positions <= it alone:
//    the keys are walked in blocks of KEYS at fixed absolute positions, in ascending order, with one
//    online-softmax update per block; a score is one chain of fused multiply-adds over the head's
//    dimensions in order, and a row's values are added key by key in ascending order, its own keys
//    only (in the block holding its position, keys past it are masked out of the scores and never
//    multiplied in). So a prompt computed whole or in any split, with any thread count, gives every
//    row the same bits;
//  * keys past the last row's position are never read (the buffer may hold anything there).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "attention_call.h"
#include "bf16.h"
#include "claimed_items.h"
#include "f32.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace prefixrag;

constexpr int64_t KEYS = 64;       // keys per block: eight score vectors, one online-softmax update
constexpr int NV = KEYS / 8;       // score vectors per block

// One kv head's keys of blocks [b0, b1) transposed to kt[block][dim][key], zero past `keys`: a block's
// scores are then eight vectors of eight keys, each summed over the dimensions with one broadcast query
// element per step. Pure data movement.
inline float widen(float x) { return x; }
inline float widen(bf16 x) { return to_float(x); }

template <typename T>
void transpose_keys(const T* k, int64_t d, int64_t keys, float* kt, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    float* dst = kt + b * d * KEYS;
    for (int64_t j = 0; j < KEYS; ++j) {
      const int64_t key = b * KEYS + j;
      if (key < keys)
        for (int64_t c = 0; c < d; ++c) dst[c * KEYS + j] = widen(k[key * d + c]);
      else
        for (int64_t c = 0; c < d; ++c) dst[c * KEYS + j] = 0.f;
    }
  }
}

AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
AVX2 inline __m256 load8(const bf16* p) { return load_bf16_8(p); }
AVX2 inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
AVX2 inline void store8(bf16* p, __m256 x) { store_bf16_8(p, x); }

// NH query heads of one KV group at one row (position pos) over the group's keys; D = head dim, T the
// queries', values' and output's element type; the heads' queries and outputs D apart. The heads
// share the loads of keys and values; each head's arithmetic is the same for any NH (lane by lane
// the same operations in the same order), so grouping never changes a bit.
template <int D, typename T, int NH>
AVX2 void attend_heads(const T* query, int64_t pos, const float* kt, const T* v, float scale, T* out) {
  constexpr int VEC = D / 8, PART = 4;  // PART: key vectors (or value vectors) per pass, NH * PART sums in registers
  const float neg_inf = -std::numeric_limits<float>::infinity();
  alignas(32) float q[NH][D], o[NH][D], s[NH][KEYS], e[NH][KEYS];
  float m[NH], l[NH];
  for (int hd = 0; hd < NH; ++hd) {
    for (int c = 0; c < D; c += 8) {
      _mm256_store_ps(q[hd] + c, load8(query + hd * D + c));
      _mm256_store_ps(o[hd] + c, _mm256_setzero_ps());
    }
    m[hd] = neg_inf;
    l[hd] = 0.f;
  }
  const __m256 sc = _mm256_set1_ps(scale);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t last = pos / KEYS;
  for (int64_t b = 0; b <= last; ++b) {
    const float* kb = kt + b * D * KEYS;
    for (int part = 0; part < NV; part += PART) {  // scores: one chain per key over the dims in order
      __m256 acc[NH][PART];
      for (int hd = 0; hd < NH; ++hd)
        for (int u = 0; u < PART; ++u) acc[hd][u] = _mm256_setzero_ps();
      for (int d = 0; d < D; ++d) {
        __m256 qd[NH];
        for (int hd = 0; hd < NH; ++hd) qd[hd] = _mm256_broadcast_ss(q[hd] + d);
        for (int u = 0; u < PART; ++u) {
          const __m256 k = _mm256_loadu_ps(kb + d * KEYS + 8 * (part + u));
          for (int hd = 0; hd < NH; ++hd) acc[hd][u] = _mm256_fmadd_ps(qd[hd], k, acc[hd][u]);
        }
      }
      for (int hd = 0; hd < NH; ++hd)
        for (int u = 0; u < PART; ++u) _mm256_store_ps(s[hd] + 8 * (part + u), acc[hd][u]);
    }
    // keys of this block the row sees: all of them but in the block holding its position
    const int count = int(std::min<int64_t>(KEYS, pos - b * KEYS + 1));
    const __m256i seen_n = _mm256_set1_epi32(count);
    for (int hd = 0; hd < NH; ++hd) {
      __m256 sv[NV];
      __m256 mx = _mm256_set1_ps(neg_inf);
      for (int h = 0; h < NV; ++h) {
        const __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(seen_n, _mm256_add_epi32(lane, _mm256_set1_epi32(8 * h))));
        sv[h] = _mm256_blendv_ps(_mm256_set1_ps(neg_inf), _mm256_mul_ps(_mm256_load_ps(s[hd] + 8 * h), sc), seen);
        mx = _mm256_max_ps(mx, sv[h]);
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float top = std::max(m[hd], _mm_cvtss_f32(m4));
      const __m256 t = _mm256_set1_ps(top);
      __m256 sum = _mm256_setzero_ps();
      for (int h = 0; h < NV; ++h) {  // exp8 clamps -inf to e^-87: the masked lanes are zeroed after it
        const __m256 seen = _mm256_castsi256_ps(_mm256_cmpgt_epi32(seen_n, _mm256_add_epi32(lane, _mm256_set1_epi32(8 * h))));
        const __m256 x = _mm256_and_ps(exp8(_mm256_sub_ps(sv[h], t)), seen);
        sum = _mm256_add_ps(sum, x);
        _mm256_store_ps(e[hd] + 8 * h, x);
      }
      if (top != m[hd]) {  // a new maximum: rescale what is summed so far (exp(-inf) = 0 at first)
        const float shrink = std::exp(m[hd] - top);
        l[hd] *= shrink;
        const __m256 f = _mm256_set1_ps(shrink);
        for (int c = 0; c < D; c += 8) _mm256_store_ps(o[hd] + c, _mm256_mul_ps(_mm256_load_ps(o[hd] + c), f));
        m[hd] = top;
      }
      l[hd] += hsum(sum);
    }
    const T* vb = v + b * KEYS * D;
    for (int part = 0; part < VEC; part += PART) {  // values: the row's own keys, ascending, per lane
      __m256 acc[NH][PART];
      for (int hd = 0; hd < NH; ++hd)
        for (int u = 0; u < PART; ++u) acc[hd][u] = _mm256_load_ps(o[hd] + 8 * (part + u));
      for (int j = 0; j < count; ++j) {
        __m256 w[NH];
        for (int hd = 0; hd < NH; ++hd) w[hd] = _mm256_set1_ps(e[hd][j]);
        for (int u = 0; u < PART; ++u) {
          const __m256 x = load8(vb + j * D + 8 * (part + u));
          for (int hd = 0; hd < NH; ++hd) acc[hd][u] = _mm256_fmadd_ps(w[hd], x, acc[hd][u]);
        }
      }
      for (int hd = 0; hd < NH; ++hd)
        for (int u = 0; u < PART; ++u) _mm256_store_ps(o[hd] + 8 * (part + u), acc[hd][u]);
    }
  }
  for (int hd = 0; hd < NH; ++hd) {
    const __m256 inv = _mm256_set1_ps(1.f / l[hd]);
    for (int c = 0; c < D; c += 8) store8(out + hd * D + c, _mm256_mul_ps(_mm256_load_ps(o[hd] + c), inv));
  }
}

template <typename T>
using HeadsFn = void (*)(const T*, int64_t, const float*, const T*, float, T*);
constexpr int64_t MAX_GROUP = 3;  // heads sharing one pass over their group's keys: NH * PART sums in 16 registers

template <int D, typename T>
HeadsFn<T> heads_kernel(int64_t n) {
  const HeadsFn<T> table[MAX_GROUP + 1] = {nullptr, attend_heads<D, T, 1>, attend_heads<D, T, 2>, attend_heads<D, T, 3>};
  return table[n];
}

template <typename T>
void attend_all(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const int64_t* pos,
                double scale, torch::Tensor& out);

// q [T, H, D], k/v [KVH, capacity, D] (one layer), positions [T] ascending -> [T, H * D]; float32 or bf16
torch::Tensor attend_rows_f32(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& positions, double scale) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16, "q must be float32 or bf16");
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "float32 attention needs AVX2 and FMA");
  const int64_t keys = checked_attention_call(q, k, v, positions);
  auto out = torch::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  if (keys == 0) return out;
  const int64_t* pos = positions.data_ptr<int64_t>();
  if (dtype == torch::kFloat32) attend_all<float>(q, k, v, pos, scale, out);
  else attend_all<bf16>(q, k, v, pos, scale, out);
  return out;
}

template <typename T>
const T* elements(const torch::Tensor& t) { return reinterpret_cast<const T*>(t.data_ptr()); }

template <typename T>
void attend_all(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const int64_t* pos,
                double scale, torch::Tensor& out) {
  const int64_t t = q.size(0), heads = q.size(1), d = q.size(2), kv_heads = k.size(0), group = heads / kv_heads;
  const int64_t keys = pos[t - 1] + 1;
  const int64_t blocks = (keys + KEYS - 1) / KEYS, block_floats = KEYS * d;
  std::vector<float> kt(size_t(kv_heads * blocks * block_floats));
  const T* ks = elements<T>(k);
  const T* vs = elements<T>(v);
  at::parallel_for(0, kv_heads * blocks, 1, [&](int64_t a, int64_t e) {
    while (a < e) {
      const int64_t g = a / blocks, b0 = a % blocks, b1 = std::min(blocks, b0 + (e - a));
      transpose_keys(ks + g * k.stride(0), d, keys, kt.data() + g * blocks * block_floats, b0, b1);
      a += b1 - b0;
    }
  });
  const T* qs = elements<T>(q);
  T* os = reinterpret_cast<T*>(out.data_ptr());
  // a KV group's heads in batches that share its keys' loads, where the rows give each thread several
  // items; else one head per item (the bits are the same either way)
  const int64_t batch = t * kv_heads >= 4 * at::get_num_threads() ? std::min(group, MAX_GROUP) : 1;
  const int64_t batches = (group + batch - 1) / batch, per_row = kv_heads * batches;
  // items claimed costliest first (a row sees more keys the later it stands), so that the last items
  // to finish are short ones
  claim_items(
      t * per_row, [] {},
      [&](int64_t item) {
        const int64_t i = t - 1 - item / per_row, g = item % per_row / batches, first = item % batches * batch;
        const int64_t h = g * group + first, n = std::min(batch, group - first);
        const auto kernel = d == 64 ? heads_kernel<64, T>(n) : heads_kernel<128, T>(n);
        kernel(qs + (i * heads + h) * d, pos[i], kt.data() + g * blocks * block_floats, vs + g * v.stride(0),
               float(scale), os + i * heads * d + h * d);
      },
      [] {});
}

}  // namespace

void bind_prefill_attention_f32(pybind11::module_& mod) {
  mod.def("attend_rows_f32", &attend_rows_f32, pybind11::call_guard<pybind11::gil_scoped_release>());
}
