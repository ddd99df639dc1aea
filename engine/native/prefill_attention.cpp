// A prefill's causal attention in bfloat16 with AVX512-BF16 dot products (attention_rows.h holds
// the walk over the keys and its invariants; this file the blocks' products in register tiles).
#include "attention_rows.h"

namespace {

using namespace prefixrag;

// Query rows of one kv group, each (position, head) row with its own online-softmax state, over
// their keys block by block. Per block: every row's scores against the block's keys (a register
// tile of up to QK_ROWS rows x the block's 64 keys, written to scratch), each row's softmax update
// alone, then the value sums of the rows that see the whole block (a register tile of up to
// pv_rows<D> rows x D dims, their sums kept in scratch between blocks). A row's arithmetic (its dot
// products in dimension order, its softmax, its value sums in key order) is the same whatever rows
// share its tile, so the tiles buy speed (one load of a key or value vector feeds several rows) and
// never change a bit.
constexpr int QK_ROWS = 6;   // 6 rows x 4 score vectors + 4 key vectors + a broadcast: 29 registers
constexpr int MAX_ROWS = 12;  // rows of an item: sharing a block's keys in L1

template <int D>
constexpr int pv_rows() { return D == 64 ? 6 : 3; }  // rows x D / 16 sums + their weights: <= 31 registers

// scores s[r][0..64) = q_r . k_j (raw, unscaled) for R rows over block kb ([pair][64 keys])
template <int D, int R>
AVX512 void block_scores(const uint32_t* const* q32, const uint32_t* kb, float* s) {
  constexpr int PAIRS = D / 2, NV = KEYS / 16;
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < NV; ++h) acc[r][h] = _mm512_setzero_ps();
  for (int d = 0; d < PAIRS; ++d) {
    __m512bh kk[NV];
    for (int h = 0; h < NV; ++h) kk[h] = (__m512bh)_mm512_loadu_si512(kb + d * KEYS + 16 * h);
    for (int r = 0; r < R; ++r) {
      const __m512bh qq = (__m512bh)_mm512_set1_epi32(int(q32[r][d]));
      for (int h = 0; h < NV; ++h) acc[r][h] = _mm512_dpbf16_ps(acc[r][h], kk[h], qq);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < NV; ++h) _mm512_store_ps(s + r * KEYS + 16 * h, acc[r][h]);
}

// o[r] = o[r] * shrink[r] + sum over the block's key pairs of w[r][pair] . v[pair] (bf16 weights), R rows
template <int D, int R>
AVX512 void block_values(const uint32_t* vb, const uint32_t* const* w, const float* shrink, float* const* o) {
  constexpr int VEC = D / 16, HALF = KEYS / 2;
  __m512 acc[R][VEC];
  for (int r = 0; r < R; ++r) {
    const __m512 f = _mm512_set1_ps(shrink[r]);
    for (int c = 0; c < VEC; ++c) acc[r][c] = _mm512_mul_ps(_mm512_load_ps(o[r] + 16 * c), f);
  }
  for (int j = 0; j < HALF; ++j) {
    __m512bh ww[R];
    for (int r = 0; r < R; ++r) ww[r] = (__m512bh)_mm512_set1_epi32(int(w[r][j]));
    for (int c = 0; c < VEC; ++c) {
      const __m512bh vv = (__m512bh)_mm512_loadu_si512(vb + j * D + 16 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], vv, ww[r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < VEC; ++c) _mm512_store_ps(o[r] + 16 * c, acc[r][c]);
}

template <int D>
using ScoresFn = void (*)(const uint32_t* const*, const uint32_t*, float*);
template <int D>
using ValuesFn = void (*)(const uint32_t*, const uint32_t* const*, const float*, float* const*);

template <int D>
struct Kernels {
  static constexpr ScoresFn<D> scores[QK_ROWS + 1] = {nullptr,          block_scores<D, 1>, block_scores<D, 2>,
                                                      block_scores<D, 3>, block_scores<D, 4>, block_scores<D, 5>,
                                                      block_scores<D, 6>};
  static constexpr ValuesFn<D> values[7] = {nullptr,          block_values<D, 1>, block_values<D, 2>,
                                            block_values<D, 3>, block_values<D, 4>, block_values<D, 5>,
                                            block_values<D, 6>};
};

// The blocks' products in register tiles of QK_ROWS (scores) and pv_rows<D> (value sums) rows.
struct WideStep {
  static constexpr int ROWS = MAX_ROWS;
  static constexpr int64_t SPREAD = 8;  // a few rows' items: one head each, for the threads' balance
  const uint32_t* q32[MAX_ROWS];
  int n;

  WideStep(const bf16* const* qrow, int rows, int /*d*/) : n(rows) {
    for (int r = 0; r < n; ++r) q32[r] = reinterpret_cast<const uint32_t*>(qrow[r]);
  }
  static void enter() {}
  static void leave() {}

  // s[r] = raw scores of rows [first, n) against block kb
  template <int D>
  AVX512 void scores(const uint32_t* kb, float (*s)[KEYS], int first) const {
    for (int r = first; r < n; r += QK_ROWS) {
      const int rows = std::min(QK_ROWS, n - r);
      Kernels<D>::scores[rows](q32 + r, kb, s[r]);
    }
  }

  // o[r] = o[r] * shrink[r] + pw[r] . block vb's values, rows [whole, n)
  template <int D>
  AVX512 void values(const uint32_t* vb, const uint32_t (*pw)[KEYS / 2], const float* shrink, float (*o)[D],
                     int whole) const {
    constexpr int PV = pv_rows<D>();
    for (int r = whole; r < n; r += PV) {
      const int rows = std::min(PV, n - r);
      const uint32_t* w[PV];
      float* acc[PV];
      for (int i = 0; i < rows; ++i) {
        w[i] = pw[r + i];
        acc[i] = o[r + i];
      }
      Kernels<D>::values[rows](vb, w, shrink + r, acc);
    }
  }
};

}  // namespace

void bind_prefill_attention(pybind11::module_& mod) {
  mod.def("attend_rows", &attend_rows<WideStep>, pybind11::call_guard<pybind11::gil_scoped_release>());
}
