// A prefill's float32 Linears over weights packed in tiles of 16 output columns, [n / 16, k, 16]
// (engine/native/linear.py packs them): y = x @ w^T (+ bias), on AVX2 + FMA or AVX-512.
//
// Invariants: the products are tiles_f32.h's (a row's result depends on that row alone, the same bits
// at either width), then + bias; threads split the output columns, never a sum, so the thread count
// never changes a bit.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>

#include "tiles_f32.h"

namespace {

using namespace prefixrag;

constexpr int64_t COLS = F32_COLS;
constexpr int64_t GRAIN_MACS = 1 << 18;  // a thread's least work: a smaller product wakes no other thread

torch::Tensor linear_tiles_f32(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, bool wide) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(), "x must be contiguous [rows, k] float32");
  TORCH_CHECK(w.scalar_type() == torch::kFloat32 && w.dim() == 3 && w.is_contiguous() && w.size(2) == COLS &&
                  w.size(1) == x.size(1),
              "the weight must be float32 packed in column tiles [n / 16, k, 16] for x's k");
  const int64_t m = x.size(0), k = x.size(1), tiles = w.size(0), n = tiles * COLS;
  TORCH_CHECK(bias.numel() == 0 || (bias.scalar_type() == torch::kFloat32 && bias.numel() == n && bias.is_contiguous()),
              "the bias must be contiguous [n] float32 (or empty)");
  TORCH_CHECK(!wide || __builtin_cpu_supports("avx512f"), "wide=True needs AVX-512");
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "the float32 Linear needs AVX2 and FMA");
  auto y = torch::empty({m, n}, torch::kFloat32);
  if (m == 0) return y;
  const float *xs = x.data_ptr<float>(), *ws = w.data_ptr<float>();
  const float* bs = bias.numel() > 0 ? bias.data_ptr<float>() : nullptr;
  float* ys = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, GRAIN_MACS / (m * k * COLS));
  at::parallel_for(0, tiles, grain, [&](int64_t a, int64_t b) {
    f32_tile_products(xs, ws, ys, m, k, n, a, b, wide);
    if (bs != nullptr)  // after the sums, one rounding, as a separate add
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = a * COLS; j < b * COLS; ++j) ys[i * n + j] += bs[j];
  });
  return y;
}

}  // namespace

void bind_linear_tiles_f32(pybind11::module_& mod) {
  mod.def("linear_tiles_f32", &linear_tiles_f32, pybind11::call_guard<pybind11::gil_scoped_release>());
}
