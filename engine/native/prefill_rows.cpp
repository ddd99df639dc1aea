// A prefill's elementwise row operations in bfloat16, each one pass over its rows: RMSNorm, RoPE on
// the queries and keys, SiLU(gate) * value. The Python layer loop runs each as several torch
// operations (a pass and, in a server's passive OpenMP, a thread wake-up each).
//
// Invariants: a row's result depends on that row alone; each rounds where torch's operations do;
// RoPE gives their bits; SiLU's exp is not torch's (Sleef's) and RMSNorm sums the squares in another
// order than torch's mean (bf16.h), so those can differ from torch's by one bfloat16 step, rarely.
// Rows split across threads only in whole rows, so the thread count never changes a result.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "bf16.h"
#include "row_split.h"

namespace {

using namespace prefixrag;

const bf16* in(const torch::Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr()); }
bf16* out(torch::Tensor& t) { return reinterpret_cast<bf16*>(t.data_ptr()); }

torch::Tensor rms_norm_rows(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check_rows(x, torch::kBFloat16, 16, "x");
  const int64_t h = x.size(1);
  TORCH_CHECK(weight.scalar_type() == torch::kBFloat16 && weight.numel() == h && weight.is_contiguous(),
              "the norm weight must be contiguous [hidden] bf16");
  auto y = torch::empty_like(x);
  const bf16 *xs = in(x), *w = in(weight);
  bf16* ys = out(y);
  parallel_rows(x.size(0), h, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) rms_norm(xs + i * h, w, ys + i * h, h, float(eps));
  });
  return y;
}

// x * cos + rotate_half(x) * sin for the first `heads` heads of each row: each product and the sum
// rounded to bf16, as torch's three operations
AVX512 void rope_row(const bf16* x, const bf16* cs, const bf16* sn, bf16* y, int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t hh = 0; hh < heads; ++hh) {
    const bf16* v = x + hh * d;
    bf16* o = y + hh * d;
    for (int64_t j = 0; j < half; j += 16) {
      __m512 x1 = load_bf16(v + j), x2 = load_bf16(v + half + j);
      __m512 c1 = load_bf16(cs + j), c2 = load_bf16(cs + half + j);
      __m512 s1 = load_bf16(sn + j), s2 = load_bf16(sn + half + j);
      __m512 neg2 = _mm512_sub_ps(_mm512_setzero_ps(), x2);
      __m512 lo = _mm512_add_ps(round_bf16_ps(_mm512_mul_ps(x1, c1)), round_bf16_ps(_mm512_mul_ps(neg2, s1)));
      __m512 hi = _mm512_add_ps(round_bf16_ps(_mm512_mul_ps(x2, c2)), round_bf16_ps(_mm512_mul_ps(x1, s2)));
      _mm256_storeu_si256((__m256i*)(o + j), pack_bf16(lo));
      _mm256_storeu_si256((__m256i*)(o + half + j), pack_bf16(hi));
    }
  }
}

// qkv [rows, (heads + 2 kv_heads) * d] -> rotated q [rows, heads, d] and k [rows, kv_heads, d]
std::vector<torch::Tensor> rope_qk(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                                   int64_t heads, int64_t kv_heads) {
  check_rows(qkv, torch::kBFloat16, 1, "qkv");
  const int64_t m = qkv.size(0), d = cos.size(-1), n = qkv.size(1);
  TORCH_CHECK(d % 32 == 0 && n >= (heads + kv_heads) * d, "qkv must hold heads + kv_heads heads of a multiple of 32");
  TORCH_CHECK(cos.scalar_type() == torch::kBFloat16 && cos.sizes() == sin.sizes() && cos.numel() == m * d &&
                  cos.is_contiguous() && sin.is_contiguous(),
              "cos/sin must be contiguous [rows, head_dim] bf16");
  auto q = torch::empty({m, heads, d}, qkv.options());
  auto k = torch::empty({m, kv_heads, d}, qkv.options());
  const bf16 *xs = in(qkv), *cs = in(cos), *sn = in(sin);
  bf16 *qs = out(q), *ks = out(k);
  parallel_rows(m, n, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      rope_row(xs + i * n, cs + i * d, sn + i * d, qs + i * heads * d, heads, d);
      rope_row(xs + i * n + heads * d, cs + i * d, sn + i * d, ks + i * kv_heads * d, kv_heads, d);
    }
  });
  return {q, k};
}

// gu [rows, 2 n] (gate, then value) -> bf16(bf16(silu(gate)) * value) [rows, n]
AVX512 void silu_mul_row(const bf16* gu, bf16* y, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512 g = load_bf16(gu + j), u = load_bf16(gu + n + j);
    _mm256_storeu_si256((__m256i*)(y + j), pack_bf16(_mm512_mul_ps(round_bf16_ps(silu_ps(g)), u)));
  }
}

torch::Tensor silu_mul_rows(const torch::Tensor& gu) {
  check_rows(gu, torch::kBFloat16, 32, "gate/up");
  const int64_t m = gu.size(0), n = gu.size(1) / 2;
  auto y = torch::empty({m, n}, gu.options());
  const bf16* xs = in(gu);
  bf16* ys = out(y);
  parallel_rows(m, 2 * n, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) silu_mul_row(xs + i * 2 * n, ys + i * n, n);
  });
  return y;
}

}  // namespace

void bind_prefill_rows(pybind11::module_& mod) {
  mod.def("rms_norm", &rms_norm_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
  mod.def("rope_qk", &rope_qk, pybind11::call_guard<pybind11::gil_scoped_release>());
  mod.def("silu_mul", &silu_mul_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
}
