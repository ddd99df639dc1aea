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

// out[16][64] (rows out_ld bytes apart) = A . B from zero over `steps` depths of 32 bfloat16 inputs,
// in order: step i's A tile (16 rows, a_ld bytes apart) at a + 64 i bytes, its B tiles (16 pair rows,
// b_ld bytes apart) at b + b_step i bytes, the four 16-column tiles 64 bytes apart. C tiles 0-3, A tile
// 4, B tiles 5-7.
AMX void four_tile_sums(const void* a, int64_t a_ld, const void* b, int64_t b_ld, int64_t b_step, int steps,
                        float* out, int64_t out_ld) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int i = 0; i < steps; ++i) {
    const char* bi = static_cast<const char*>(b) + i * b_step;
    _tile_loadd(4, static_cast<const char*>(a) + 64 * i, a_ld);
    _tile_loadd(5, bi, b_ld);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, bi + 64, b_ld);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, bi + 128, b_ld);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, bi + 192, b_ld);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, out, out_ld);
  _tile_stored(1, out + 16, out_ld);
  _tile_stored(2, out + 32, out_ld);
  _tile_stored(3, out + 48, out_ld);
}

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

  // s[r] = raw scores of every row against block kb ([pair][64 keys]), over the head's dimensions
  template <int D>
  AMX void scores(const uint32_t* kb, float (*s)[KEYS], int /*first*/) const {
    four_tile_sums(&q[0][0], MAX_D * sizeof(bf16), kb, KEYS * 4, AMX_ROWS * KEYS * 4, D / AMX_DEPTH, s[0], KEYS * 4);
  }

  // o[r] = o[r] * shrink[r] + pw[r] . block vb's values ([key pair][D]), rows [whole, n): the sums over
  // the block's 64 keys, 64 dimensions at a time
  template <int D>
  AMX void values(const uint32_t* vb, const uint32_t (*pw)[KEYS / 2], const float* shrink, float (*o)[D],
                  int whole) const {
    alignas(64) float sums[ROWS][64];
    for (int c0 = 0; c0 < D; c0 += 64) {
      four_tile_sums(&pw[0][0], KEYS / 2 * 4, vb + c0, D * 4, AMX_ROWS * D * 4, KEYS / AMX_DEPTH, sums[0], 64 * 4);
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
