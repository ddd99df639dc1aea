// A prefill's int8 Linears (engine/native/int8.py): engine/quant/linear.py's int8_linear in column
// tiles (VNNI at 127 levels, AVX2 at 63), each row's float32 outputs that function's bits at any row count.
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
  const int64_t m = x.size(0), k = x.size(1), n = int8_columns(parts);
  const Int8Matrix w = int8_matrix(parts, n, k);  // checks the CPU has its levels' kernel
  QuantizedRows rows;
  size_rows(rows, m, k);
  at::parallel_for(0, m, std::max<int64_t>(1, (1 << 16) / k), [&](int64_t a, int64_t b) {
    if (x.scalar_type() == torch::kBFloat16) quantize_for(w, reinterpret_cast<const bf16*>(x.data_ptr()), k, rows, a, b);
    else quantize_for(w, x.data_ptr<float>(), k, rows, a, b);
  });
  auto y = torch::empty({m, n}, torch::kFloat32);
  float* ys = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, GRAIN_MACS / std::max<int64_t>(1, m * k * INT8_TILE));
  at::parallel_for(0, n / INT8_TILE, grain, [&](int64_t a, int64_t b) {
    int8_products(w, rows, ys, m, a, b);
  });
  return y;
}

}  // namespace

void bind_linear_int8(pybind11::module_& mod) {
  mod.def("int8_linear_sums", &int8_linear_sums, "int8_linear's float32 outputs in column tiles");
}
