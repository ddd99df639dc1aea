// A prefill's Linears in bfloat16 over weights packed in column tiles (tiles.h; AVX512-BF16, or AVX2 +
// FMA on CPUs without it): y = bf16(x @ w^T),
// then + bias, rounded, as torch's bfloat16 Linear followed by the bias add; or the float32 sums
// themselves (the lm_head's logits: rounding them to bfloat16 would only blur near-ties).
//
// Invariants: a row's result depends on that row alone (tiles.h), so a prompt prefilled whole or
// split anywhere gives every row the same bits, with no padding of rows to a fixed tile; threads
// split the output columns, never a sum, so the thread count never changes a bit.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <vector>

#include "bf16.h"
#include "tiles.h"

namespace {

using namespace prefixrag;

constexpr int64_t GRAIN_MACS = 1 << 18;  // a thread's least work: a smaller product wakes no other thread

const bf16* in(const torch::Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr()); }

// y[rows, cols) = bf16(bf16(silu(bf16(gate))) * bf16(up)) from the gate's and the up projection's float32
// sums [rows, cols]: the rounded Linear outputs, then prefill_rows.cpp's SiLU * value, to the bit
AVX512 void glu_block(const float* gate, const float* up, bf16* y, int64_t rows, int64_t cols, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; j += 16) {
      const __m512 g = round_bf16_ps(_mm512_loadu_ps(gate + r * cols + j));
      const __m512 u = round_bf16_ps(_mm512_loadu_ps(up + r * cols + j));
      _mm256_storeu_si256((__m256i*)(y + r * ldy + j), pack_bf16(_mm512_mul_ps(round_bf16_ps(silu_ps(g)), u)));
    }
}

// the same on AVX2
AVX2 void round_block_avx2(const float* sums, const bf16* bias, bf16* y, int64_t rows, int64_t cols, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; j += 16) {
      __m256 lo = round_bf16_8(_mm256_loadu_ps(sums + r * cols + j));
      __m256 hi = round_bf16_8(_mm256_loadu_ps(sums + r * cols + j + 8));
      if (bias != nullptr) {
        lo = _mm256_add_ps(lo, load_bf16_8(bias + j));
        hi = _mm256_add_ps(hi, load_bf16_8(bias + j + 8));
      }
      store_bf16_16(y + r * ldy + j, lo, hi);
    }
}

// AVX2: the rows widened to float32 once, then the sums and their rounding per block of tiles
torch::Tensor linear_tiles_avx2(const bf16* xs, const bf16* ws, const bf16* bs, torch::Tensor y, int64_t m, int64_t k,
                                int64_t tiles, bool sums_out) {
  const int64_t n = tiles * TILE_COLS;
  std::vector<float> xf(m * k);
  widen_rows(xs, xf.data(), m * k);
  const int64_t grain = std::max<int64_t>(1, GRAIN_MACS / (m * k * TILE_COLS));
  if (sums_out) {
    float* ys = y.data_ptr<float>();
    at::parallel_for(0, tiles, grain, [&](int64_t a, int64_t b) { tile_sums_avx2(xf.data(), ws, ys, m, k, n, a, b); });
    return y;
  }
  bf16* ys = reinterpret_cast<bf16*>(y.data_ptr());
  at::parallel_for(0, tiles, grain, [&](int64_t a, int64_t b) {
    const int64_t block = m <= MAX_ROWS_AVX2 ? b - a : BLOCK_TILES;
    std::vector<float> sums(MAX_ROWS_AVX2 * block * TILE_COLS);
    for (int64_t t = a; t < b; t += block) {
      const int64_t span = std::min(b, t + block) - t, cols = span * TILE_COLS;
      for (int64_t i = 0; i < m; i += MAX_ROWS_AVX2) {
        const int64_t rows = std::min(MAX_ROWS_AVX2, m - i);
        TILE_ROWS_AVX2[rows](xf.data() + i * k, ws + t * k * TILE_COLS, sums.data(), k, cols, 0, span);
        round_block_avx2(sums.data(), bs == nullptr ? nullptr : bs + t * TILE_COLS, ys + i * n + t * TILE_COLS, rows,
                         cols, n);
      }
    }
  });
  return y;
}

void check_operands(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.is_contiguous(), "x must be contiguous [rows, k] bf16");
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 4 && w.is_contiguous() && w.size(2) == TILE_COLS &&
                  w.size(3) == 2 && w.size(1) * 2 == x.size(1),
              "the weight must be bf16 packed in column tiles [n / 16, k / 2, 16, 2] for x's k");
}

// wide: the AVX512-BF16 kernel; else the AVX2 + FMA one. A residual [m, n] bf16 (or undefined) is added
// to the result (wide only), as torch's bfloat16 add after the Linear.
torch::Tensor linear_tiles(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, bool sums_out,
                           bool wide, const torch::Tensor& residual) {
  check_operands(x, w);
  const int64_t m = x.size(0), k = x.size(1), tiles = w.size(0), n = tiles * TILE_COLS;
  TORCH_CHECK(bias.numel() == 0 || (bias.scalar_type() == torch::kBFloat16 && bias.numel() == n && bias.is_contiguous()),
              "the bias must be contiguous [n] bf16 (or empty)");
  TORCH_CHECK(!sums_out || bias.numel() == 0, "float32 sums take no bias");
  const bool add = residual.defined();
  TORCH_CHECK(!add || (residual.scalar_type() == torch::kBFloat16 && residual.dim() == 2 && residual.size(0) == m &&
                       residual.size(1) == n && residual.is_contiguous()),
              "the residual must be contiguous [rows, n] bf16");
  TORCH_CHECK(!add || (wide && !sums_out), "a residual is added to the wide kernel's rounded outputs only");
  TORCH_CHECK(!wide || __builtin_cpu_supports("avx512bf16"), "wide=True needs AVX512-BF16");
  TORCH_CHECK(wide || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")),
              "the bfloat16 Linear needs AVX512-BF16, or AVX2 and FMA");
  auto y = torch::empty({m, n}, sums_out ? torch::kFloat32 : torch::kBFloat16);
  if (m == 0) return y;
  const bf16 *xs = in(x), *ws = in(w), *bs = bias.numel() > 0 ? in(bias) : nullptr;
  const bf16* res = add ? in(residual) : nullptr;
  if (!wide) return linear_tiles_avx2(xs, ws, bs, y, m, k, tiles, sums_out);
  const int64_t grain = std::max<int64_t>(1, GRAIN_MACS / (m * k * TILE_COLS));
  if (sums_out) {  // straight into the output, row stride n
    float* ys = y.data_ptr<float>();
    at::parallel_for(0, tiles, grain, [&](int64_t a, int64_t b) { tile_sums(xs, ws, ys, m, k, n, a, b); });
    return y;
  }
  bf16* ys = reinterpret_cast<bf16*>(y.data_ptr());
  at::parallel_for(0, tiles, grain, [&](int64_t a, int64_t b) {
    const int64_t block = m <= MAX_ROWS ? b - a : BLOCK_TILES;  // one pass over the rows: no blocking
    std::vector<float> sums(MAX_ROWS * block * TILE_COLS);
    for (int64_t t = a; t < b; t += block) {
      const int64_t span = std::min(b, t + block) - t, cols = span * TILE_COLS;
      for (int64_t i = 0; i < m; i += MAX_ROWS) {
        const int64_t rows = std::min(MAX_ROWS, m - i);
        TILE_ROWS[rows](xs + i * k, ws + t * k * TILE_COLS, sums.data(), k, cols, 0, span);
        round_block(sums.data(), bs == nullptr ? nullptr : bs + t * TILE_COLS, add ? res + i * n + t * TILE_COLS : nullptr,
                    ys + i * n + t * TILE_COLS, rows, cols, n);
      }
    }
  });
  return y;
}

// The gate/up Linear of a SiLU-gated MLP and SiLU(gate) * up in one pass (wide only): w packs the
// gate's n / 16 column tiles, then the up projection's; y [m, n] bf16. The same bits as linear_tiles
// followed by prefill_rows.cpp's silu_mul, without writing the [m, 2n] projections out and reading
// them back.
torch::Tensor linear_tiles_glu(const torch::Tensor& x, const torch::Tensor& w) {
  check_operands(x, w);
  TORCH_CHECK(__builtin_cpu_supports("avx512bf16"), "the fused gate/up Linear needs AVX512-BF16");
  TORCH_CHECK(w.size(0) % 2 == 0, "the gate/up weight must hold as many up as gate column tiles");
  const int64_t m = x.size(0), k = x.size(1), half = w.size(0) / 2, n = half * TILE_COLS;
  auto y = torch::empty({m, n}, torch::kBFloat16);
  if (m == 0) return y;
  const bf16 *xs = in(x), *ws = in(w);
  bf16* ys = reinterpret_cast<bf16*>(y.data_ptr());
  const int64_t grain = std::max<int64_t>(1, GRAIN_MACS / (2 * m * k * TILE_COLS));
  at::parallel_for(0, half, grain, [&](int64_t a, int64_t b) {
    const int64_t block = m <= MAX_ROWS ? b - a : BLOCK_TILES / 2;  // gate and up tiles together: one block
    std::vector<float> gate(MAX_ROWS * block * TILE_COLS), up(gate.size());
    for (int64_t t = a; t < b; t += block) {
      const int64_t span = std::min(b, t + block) - t, cols = span * TILE_COLS;
      for (int64_t i = 0; i < m; i += MAX_ROWS) {
        const int64_t rows = std::min(MAX_ROWS, m - i);
        TILE_ROWS[rows](xs + i * k, ws + t * k * TILE_COLS, gate.data(), k, cols, 0, span);
        TILE_ROWS[rows](xs + i * k, ws + (half + t) * k * TILE_COLS, up.data(), k, cols, 0, span);
        glu_block(gate.data(), up.data(), ys + i * n + t * TILE_COLS, rows, cols, n);
      }
    }
  });
  return y;
}

}  // namespace

void bind_linear_tiles(pybind11::module_& mod) {
  mod.def(
      "linear_tiles",
      [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, bool sums_out, bool wide) {
        return linear_tiles(x, w, bias, sums_out, wide, torch::Tensor());
      },
      pybind11::call_guard<pybind11::gil_scoped_release>());
  // residual + the rounded Linear (wide only)
  mod.def(
      "linear_tiles_add",
      [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, const torch::Tensor& residual) {
        return linear_tiles(x, w, bias, false, true, residual);
      },
      pybind11::call_guard<pybind11::gil_scoped_release>());
  mod.def("linear_tiles_glu", &linear_tiles_glu, pybind11::call_guard<pybind11::gil_scoped_release>());
}
