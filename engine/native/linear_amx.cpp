// A bfloat16 Linear in AMX tiles over the column-tile packing (tiles.h), whose [k / 2, 16, 2] block of
// 16 output columns is AMX's B operand as it lies in memory: y = bf16(x @ w^T), then + bias and a
// residual as torch's adds (round_block).
//
// Invariants: every output is tdpbf16ps's sum over k in order, 32 inputs at a time, from zero: at any
// row count, the bits oneDNN's AMX bfloat16 Linear gives a row in a 16-row call
// (tests/engine/native/test_linear_amx.py; oneDNN blocks some larger calls' sums otherwise), so a
// runner may send any call here, or a call of a calibrated row tile to oneDNN, without changing a bit. A row's result depends
// on that row alone (a short last block of rows is padded with zeros), and threads split the output
// columns, never a sum.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cstring>
#include <vector>

#include "amx.h"
#include "bf16.h"
#include "tiles.h"

namespace {

using namespace prefixrag;

constexpr int64_t ROWS = AMX_ROWS;
constexpr int64_t DEPTH = AMX_DEPTH;
constexpr int64_t GROUP = 4;           // column tiles whose sums build at once (C tiles 0-3)
constexpr int64_t GRAIN_MACS = 1 << 20;  // a thread's least work: a smaller product wakes no other thread

// sums[16, 16 * tiles] (row stride 64 * GROUP bytes) of 16 rows xs (row stride k) over `tiles` (1 or
// GROUP) consecutive column tiles at ws: C tiles 0-3, A tile 4, B tiles 5-7
AMX void group_sums(const bf16* xs, const bf16* ws, float* sums, int64_t k, int64_t tiles) {
  const int64_t stride = k * 2, block = k * TILE_COLS;  // bytes per row of x; elements per column tile
  const int64_t ld = GROUP * TILE_COLS * sizeof(float);
  _tile_zero(0);
  if (tiles == GROUP) {
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t d = 0; d < k; d += DEPTH) {
    const bf16* b = ws + d * TILE_COLS;  // the rows d / 2 .. d / 2 + 16 of each column tile's block
    _tile_loadd(4, xs + d, stride);
    _tile_loadd(5, b, 64);
    _tile_dpbf16ps(0, 4, 5);
    if (tiles == GROUP) {
      _tile_loadd(6, b + block, 64);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, b + 2 * block, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, b + 3 * block, 64);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, sums, ld);
  if (tiles == GROUP) {
    _tile_stored(1, sums + TILE_COLS, ld);
    _tile_stored(2, sums + 2 * TILE_COLS, ld);
    _tile_stored(3, sums + 3 * TILE_COLS, ld);
  }
}

// column tiles [a, b) of y for every row: groups of GROUP tiles, the rows 16 at a time
AMX void tile_columns(const bf16* xs, const bf16* ws, const bf16* bs, const bf16* res, bf16* ys, int64_t m, int64_t k,
                      int64_t n, int64_t a, int64_t b) {
  load_tile_config();
  std::vector<float> sums(ROWS * GROUP * TILE_COLS);
  // a short last block of rows, zero-filled to a whole A tile once for every group
  const int64_t whole = m / ROWS * ROWS;
  std::vector<bf16> padded(whole < m ? ROWS * k : 0, bf16{});
  if (whole < m) std::memcpy(padded.data(), xs + whole * k, (m - whole) * k * sizeof(bf16));
  for (int64_t t = a; t < b;) {
    const int64_t tiles = b - t >= GROUP ? GROUP : 1, cols = tiles * TILE_COLS;
    for (int64_t i = 0; i < m; i += ROWS) {
      const int64_t rows = std::min(ROWS, m - i);
      const bf16* rows_x = rows < ROWS ? padded.data() : xs + i * k;
      group_sums(rows_x, ws + t * k * TILE_COLS, sums.data(), k, tiles);
      // the sums' row stride is GROUP tiles; round_block reads rows of `cols`: compact a single tile's
      if (tiles < GROUP)
        for (int64_t r = 1; r < rows; ++r) std::memmove(&sums[r * cols], &sums[r * GROUP * TILE_COLS], cols * 4);
      round_block(sums.data(), bs == nullptr ? nullptr : bs + t * TILE_COLS,
                  res == nullptr ? nullptr : res + i * n + t * TILE_COLS, ys + i * n + t * TILE_COLS, rows, cols, n);
    }
    t += tiles;
  }
  _tile_release();
}

// x [m, k] bf16, w [n / 16, k / 2, 16, 2] bf16 (k a multiple of 32), bias [n] bf16 or empty, residual
// [m, n] bf16 or undefined -> [m, n] bf16
torch::Tensor linear_amx(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                         const torch::Tensor& residual) {
  TORCH_CHECK(amx_ready(), "the AMX Linear needs AMX-BF16 and AVX512-BF16, and the kernel's leave to use AMX tiles");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(), "x must be contiguous [rows, k] bf16");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 4 && w.is_contiguous() && w.size(2) == TILE_COLS &&
                  w.size(3) == 2 && w.size(1) * 2 == x.size(1),
              "the weight must be bf16 packed in column tiles [n / 16, k / 2, 16, 2] for x's k");
  const int64_t m = x.size(0), k = x.size(1), tiles = w.size(0), n = tiles * TILE_COLS;
  TORCH_CHECK(k % DEPTH == 0, "the AMX Linear needs k a multiple of 32, got ", k);
  TORCH_CHECK(bias.numel() == 0 || (bias.scalar_type() == torch::kBFloat16 && bias.numel() == n && bias.is_contiguous()),
              "the bias must be contiguous [n] bf16 (or empty)");
  const bool add = residual.defined();
  TORCH_CHECK(!add || (residual.scalar_type() == torch::kBFloat16 && residual.dim() == 2 && residual.size(0) == m &&
                       residual.size(1) == n && residual.is_contiguous()),
              "the residual must be contiguous [rows, n] bf16");
  auto y = torch::empty({m, n}, torch::kBFloat16);
  if (m == 0) return y;
  const auto* xs = reinterpret_cast<const bf16*>(x.data_ptr());
  const auto* ws = reinterpret_cast<const bf16*>(w.data_ptr());
  const bf16* bs = bias.numel() > 0 ? reinterpret_cast<const bf16*>(bias.data_ptr()) : nullptr;
  const bf16* res = add ? reinterpret_cast<const bf16*>(residual.data_ptr()) : nullptr;
  auto* ys = reinterpret_cast<bf16*>(y.data_ptr());
  // whole groups to each thread, so only the last range ends in single tiles
  const int64_t groups = (tiles + GROUP - 1) / GROUP;
  const int64_t grain = std::max<int64_t>(1, GRAIN_MACS / (std::max<int64_t>(m, ROWS) * k * GROUP * TILE_COLS));
  at::parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    tile_columns(xs, ws, bs, res, ys, m, k, n, g0 * GROUP, std::min(tiles, g1 * GROUP));
  });
  return y;
}

}  // namespace

void bind_linear_amx(pybind11::module_& mod) {
  mod.def("amx_ready", &amx_ready);
  mod.def(
      "linear_amx",
      [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, const torch::Tensor& residual) {
        return linear_amx(x, w, bias, residual);
      },
      pybind11::call_guard<pybind11::gil_scoped_release>());
  mod.def(
      "linear_amx_plain",
      [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias) {
        return linear_amx(x, w, bias, torch::Tensor());
      },
      pybind11::call_guard<pybind11::gil_scoped_release>());
}
