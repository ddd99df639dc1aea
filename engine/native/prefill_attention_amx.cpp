// A prefill's causal attention in bfloat16 with the blocks' products in AMX tiles (attention_rows.h
// holds the walk over the keys, the softmax and its invariants).
//
// Invariants: an item's up to 16 rows are one tile's rows. A block's scores are tdpbf16ps's sums over
// the head's dimensions in order, 32 at a time, from zero; its whole rows' value sums the same over
// the block's 64 keys, added to the row's running sums as o * shrink + sum. AMX computes each output
// element from its own row and column alone, so a row's bits never depend on the rows beside it
// (rows past n and rows that do not see the block are computed and ignored). The bits differ from
// the AVX512-BF16 kernel's: a runner uses one kernel for every call.
#include "amx.h"
#include "attention_rows.h"

namespace {

using namespace prefixrag;

struct AmxStep {
  static constexpr int ROWS = AMX_ROWS;
  // an item costs the same for 1 row as for 16: always a group's heads together, fewer items
  static constexpr int64_t SPREAD = 0;
  static constexpr int MAX_D = 128;
  alignas(64) bf16 q[ROWS][MAX_D] = {};  // the item's queries as one A operand, rows past n zero
  int n;

  AmxStep(const bf16* const* qrow, int rows, int d) : n(rows) {
    for (int r = 0; r < n; ++r) std::copy(qrow[r], qrow[r] + d, q[r]);
  }
  AMX static void enter() { load_tile_config(); }
  AMX static void leave() { _tile_release(); }

  // s[r] = raw scores of every row against block kb ([pair][64 keys]): C tiles 0-3 (16 keys each),
  // A tile 4 (32 of the queries' dimensions), B tiles 5-7
  template <int D>
  AMX void scores(const uint32_t* kb, float (*s)[KEYS], int /*first*/) const {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int d = 0; d < D; d += AMX_DEPTH) {
      const uint32_t* b = kb + d / 2 * KEYS;  // pairs d / 2 .. d / 2 + 16
      _tile_loadd(4, &q[0][d], MAX_D * sizeof(bf16));
      _tile_loadd(5, b, KEYS * 4);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, b + 16, KEYS * 4);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, b + 32, KEYS * 4);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, b + 48, KEYS * 4);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, s[0], KEYS * 4);
    _tile_stored(1, s[0] + 16, KEYS * 4);
    _tile_stored(2, s[0] + 32, KEYS * 4);
    _tile_stored(3, s[0] + 48, KEYS * 4);
  }

  // o[r] = o[r] * shrink[r] + pw[r] . block vb's values ([key pair][D]), rows [whole, n): the sums of
  // 64 dimensions at a time in C tiles 0-3, A tile 4 (32 keys' weights), B tiles 5-7
  template <int D>
  AMX void values(const uint32_t* vb, const uint32_t (*pw)[KEYS / 2], const float* shrink, float (*o)[D],
                  int whole) const {
    alignas(64) float sums[ROWS][64];
    for (int c0 = 0; c0 < D; c0 += 64) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int j = 0; j < KEYS; j += AMX_DEPTH) {
        const uint32_t* b = vb + j / 2 * D + c0;  // key pairs j / 2 .. j / 2 + 16, dims c0 ..
        _tile_loadd(4, &pw[0][j / 2], KEYS / 2 * 4);
        _tile_loadd(5, b, D * 4);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, b + 16, D * 4);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, b + 32, D * 4);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, b + 48, D * 4);
        _tile_dpbf16ps(3, 4, 5);
      }
      _tile_stored(0, sums[0], 64 * 4);
      _tile_stored(1, sums[0] + 16, 64 * 4);
      _tile_stored(2, sums[0] + 32, 64 * 4);
      _tile_stored(3, sums[0] + 48, 64 * 4);
      for (int r = whole; r < n; ++r) {
        const __m512 f = _mm512_set1_ps(shrink[r]);
        for (int c = 0; c < 64; c += 16)
          _mm512_store_ps(o[r] + c0 + c, _mm512_fmadd_ps(_mm512_load_ps(o[r] + c0 + c), f, _mm512_load_ps(sums[r] + c)));
      }
    }
  }
};

torch::Tensor attend_rows_amx(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& positions, double scale) {
  TORCH_CHECK(amx_ready(), "the AMX attention needs AMX-BF16 and AVX512-BF16, and the kernel's leave to use AMX tiles");
  return attend_rows<AmxStep>(q, k, v, positions, scale);
}

}  // namespace

void bind_prefill_attention_amx(pybind11::module_& mod) {
  mod.def("attend_rows_amx", &attend_rows_amx, pybind11::call_guard<pybind11::gil_scoped_release>());
}
