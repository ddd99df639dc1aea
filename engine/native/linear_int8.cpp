// A prefill's int8 Linears (engine/native/int8.py): engine/quant/linear.py's int8_linear in VNNI
// column tiles, each row's float32 outputs that function's bits at any row count.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <vector>

#include "int8_matrix.h"

namespace {

using namespace prefixrag;

constexpr int64_t GRAIN_MACS = 1 << 18;  // a thread's least work: a smaller product wakes no other thread

// x [m, k] bf16 or float32 -> float32 [m, n], before int8_linear's cast to x's dtype
torch::Tensor int8_linear_sums(const torch::Tensor& x, const std::vector<torch::Tensor>& parts) {
  TORCH_CHECK((x.scalar_type() == torch::kBFloat16 || x.scalar_type() == torch::kFloat) && x.dim() == 2 &&
                  x.is_contiguous(),
              "x must be contiguous [rows, k] bf16 or float32");
  TORCH_CHECK(__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16"),
              "the native int8 Linear needs AVX512-VNNI and AVX512-BF16");
  const int64_t m = x.size(0), k = x.size(1), n = int8_columns(parts);
  const Int8Matrix w = int8_matrix(parts, n, k);
  QuantizedRows rows;
  rows.hi.resize(m * k);
  rows.lo.resize(m * k);
  rows.step.resize(m);
  at::parallel_for(0, m, std::max<int64_t>(1, (1 << 16) / k), [&](int64_t a, int64_t b) {
    if (x.scalar_type() == torch::kBFloat16) quantize_block(reinterpret_cast<const bf16*>(x.data_ptr()), k, w.levels, rows, a, b);
    else quantize_block(x.data_ptr<float>(), k, w.levels, rows, a, b);
  });
  auto y = torch::empty({m, n}, torch::kFloat32);
  float* ys = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, GRAIN_MACS / std::max<int64_t>(1, m * k * INT8_TILE));
  at::parallel_for(0, n / INT8_TILE, grain, [&](int64_t a, int64_t b) {
    int8_linear_tiles(rows, w.tiles, ys, m, w.levels, a, b);
  });
  return y;
}

}  // namespace

void bind_linear_int8(pybind11::module_& mod) {
  mod.def("int8_linear_sums", &int8_linear_sums, "int8_linear's float32 outputs in VNNI column tiles");
}
