// A float32 prefill's elementwise row operations on AVX2 + FMA, each one pass over its rows: RMSNorm,
// RoPE on the queries and keys, SiLU(gate) * value (prefill_rows.cpp holds bfloat16's). torch runs
// each as several operations: a pass over the rows and, in a server's passive OpenMP, a thread
// wake-up each, which on a stitched prefill's few rows costs more than the arithmetic.
//
// Invariants: a row's result depends on that row alone; RMSNorm and SiLU * value are f32.h's, the
// native decode step's arithmetic (sums in another order than torch's mean, another exp than torch's),
// so they can differ from torch's in the last bits; RoPE gives torch's bits (a product, a product, a
// sum, each rounded: compiled without FMA, so nothing fuses them). Rows split across threads only in
// whole rows, so the thread count never changes a result.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>

#include "f32.h"
#include "row_split.h"

namespace {

using namespace prefixrag;

torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_rows(x, torch::kFloat32, 8, "x");
  const int64_t h = x.size(1);
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32 && weight.numel() == h && weight.is_contiguous(),
              "the norm weight must be contiguous [hidden] float32");
  auto y = torch::empty_like(x);
  const float *xs = x.data_ptr<float>(), *w = weight.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  parallel_rows(x.size(0), h, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) rms_norm(xs + i * h, w, ys + i * h, h, float(eps));
  });
  return y;
}

// x * cos + rotate_half(x) * sin for `heads` heads of one row; no FMA in this function's target, so
// each product and the sum round on their own, as torch's operations
__attribute__((target("avx2"))) void rope_row(const float* x, const float* cs, const float* sn, float* y, int64_t heads,
                                              int64_t d) {
  const int64_t half = d / 2;
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t hh = 0; hh < heads; ++hh) {
    const float* v = x + hh * d;
    float* o = y + hh * d;
    for (int64_t j = 0; j < half; j += 8) {
      const __m256 x1 = _mm256_loadu_ps(v + j), x2 = _mm256_loadu_ps(v + half + j);
      const __m256 lo = _mm256_add_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(cs + j)),
                                      _mm256_mul_ps(_mm256_sub_ps(zero, x2), _mm256_loadu_ps(sn + j)));
      const __m256 hi = _mm256_add_ps(_mm256_mul_ps(x2, _mm256_loadu_ps(cs + half + j)),
                                      _mm256_mul_ps(x1, _mm256_loadu_ps(sn + half + j)));
      _mm256_storeu_ps(o + j, lo);
      _mm256_storeu_ps(o + half + j, hi);
    }
  }
}

// qkv [rows, (heads + 2 kv_heads) * d] -> rotated q [rows, heads, d] and k [rows, kv_heads, d]
std::vector<torch::Tensor> rope_qk_rows(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                                        int64_t heads, int64_t kv_heads) {
  check_rows(qkv, torch::kFloat32, 1, "qkv");
  const int64_t m = qkv.size(0), d = cos.size(-1), n = qkv.size(1);
  TORCH_CHECK(d % 16 == 0 && n >= (heads + kv_heads) * d, "qkv must hold heads + kv_heads heads of a multiple of 16");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && cos.sizes() == sin.sizes() && cos.numel() == m * d &&
                  cos.is_contiguous() && sin.is_contiguous(),
              "cos/sin must be contiguous [rows, head_dim] float32");
  auto q = torch::empty({m, heads, d}, qkv.options());
  auto k = torch::empty({m, kv_heads, d}, qkv.options());
  const float *xs = qkv.data_ptr<float>(), *cs = cos.data_ptr<float>(), *sn = sin.data_ptr<float>();
  float *qs = q.data_ptr<float>(), *ks = k.data_ptr<float>();
  parallel_rows(m, n, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      rope_row(xs + i * n, cs + i * d, sn + i * d, qs + i * heads * d, heads, d);
      rope_row(xs + i * n + heads * d, cs + i * d, sn + i * d, ks + i * kv_heads * d, kv_heads, d);
    }
  });
  return {q, k};
}

// gu [rows, 2 n] (gate, then value) -> silu(gate) * value [rows, n]
torch::Tensor silu_mul_rows(const torch::Tensor& gu) {
  check_rows(gu, torch::kFloat32, 16, "gate/up");
  const int64_t m = gu.size(0), n = gu.size(1) / 2;
  auto y = torch::empty({m, n}, gu.options());
  const float* xs = gu.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  parallel_rows(m, 2 * n, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) silu_mul(xs + i * 2 * n, ys + i * n, n);
  });
  return y;
}

}  // namespace

void bind_prefill_rows_f32(pybind11::module_& mod) {
  mod.def("rms_norm_f32", &rms_norm_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
  mod.def("rope_qk_f32", &rope_qk_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
  mod.def("silu_mul_f32", &silu_mul_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
}
