// An int8 matrix as Python passes it (engine/native/int8.py), checked once, and the kernel its
// activation levels call for: the decode steps' and the prefill's int8 Linears read it.
#pragma once
#include <torch/extension.h>

#include <vector>

#include "int8_avx2.h"
#include "int8_tiles.h"
#include "team.h"

namespace prefixrag {

struct Int8Matrix {
  std::vector<torch::Tensor> held;  // keeps the tensors the pointers read alive
  Int8Tiles tiles;
  float levels;
};

inline int64_t int8_columns(const std::vector<torch::Tensor>& parts) { return parts.at(0).size(0) * INT8_TILE; }

// parts: packed digits int8 [n / 16, k / 4, 16, 4], offsets int32 [n], scales float32 [n], the
// activations' levels float32 [1], and optionally the residual digits and their offsets
inline Int8Matrix int8_matrix(const std::vector<torch::Tensor>& parts, int64_t n, int64_t k) {
  TORCH_CHECK(parts.size() == 4 || parts.size() == 6, "an int8 matrix is 4 tensors, or 6 with a residual digit");
  TORCH_CHECK(k % 16 == 0, "the native int8 Linear needs inputs in multiples of 16, got ", k);
  auto packed = [&](const torch::Tensor& q) {
    TORCH_CHECK(q.scalar_type() == torch::kChar && q.dim() == 4 && q.is_contiguous() && q.size(0) * INT8_TILE == n &&
                    q.size(1) * 4 == k && q.size(2) == INT8_TILE && q.size(3) == 4,
                "int8 digits must be packed [", n, " / 16, ", k, " / 4, 16, 4]");
  };
  auto per_column = [&](const torch::Tensor& t, c10::ScalarType type) {
    TORCH_CHECK(t.scalar_type() == type && t.dim() == 1 && t.size(0) == n && t.is_contiguous(),
                "int8 offsets and scales must be contiguous [", n, "]");
  };
  packed(parts[0]);
  per_column(parts[1], torch::kInt);
  per_column(parts[2], torch::kFloat);
  TORCH_CHECK(parts[3].scalar_type() == torch::kFloat && parts[3].numel() == 1, "levels: one float32");
  const float levels = parts[3].item<float>();
  if (levels == AVX2_INT8_LEVELS) {
    TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "the native int8 Linear at ",
                levels, " levels needs AVX2 and FMA");
  } else {
    TORCH_CHECK(levels == 127.f && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16"),
                "the native int8 Linear takes 63 activation levels (AVX2) or 127 (AVX512-VNNI and AVX512-BF16 on this "
                "CPU), got ", levels);
  }
  Int8Matrix m{parts,
               Int8Tiles{parts[0].data_ptr<int8_t>(), nullptr, parts[1].data_ptr<int32_t>(), nullptr,
                         parts[2].data_ptr<float>(), n, k},
               levels};
  if (parts.size() == 6) {
    packed(parts[4]);
    per_column(parts[5], torch::kInt);
    m.tiles.residual = parts[4].data_ptr<int8_t>();
    m.tiles.residual_offset = parts[5].data_ptr<int32_t>();
  }
  return m;
}

// Rows [r0, r1) of x [m, k] (bf16 or float32) quantized as w's kernel reads them (rows sized for m)
template <class T>
void quantize_for(const Int8Matrix& w, const T* x, int64_t k, QuantizedRows& rows, int64_t r0, int64_t r1) {
  if (w.levels == AVX2_INT8_LEVELS) quantize_block_avx2(x, k, w.levels, rows, r0, r1);
  else quantize_block(x, k, w.levels, rows, r0, r1);
}

inline void size_rows(QuantizedRows& rows, int64_t m, int64_t k) {
  rows.hi.resize(m * k);
  rows.lo.resize(m * k);
  rows.step.resize(m);
}

// y [m, n] float32 = int8_linear's outputs over column tiles [t0, t1)
inline void int8_products(const Int8Matrix& w, const QuantizedRows& rows, float* y, int64_t m, int64_t t0, int64_t t1) {
  if (w.levels == AVX2_INT8_LEVELS) int8_linear_tiles_avx2(rows, w.tiles, y, m, t0, t1);
  else int8_linear_tiles(rows, w.tiles, y, m, w.levels, t0, t1);
}

// the decode steps' product: m rows quantized, then split by column tile across the step's team
template <class T>
void int8_gemv(Team& team, const T* x, const Int8Matrix& w, float* y, int64_t m) {
  thread_local QuantizedRows reused;
  QuantizedRows& rows = reused;  // the caller's: a worker naming `reused` would get its own
  size_rows(rows, m, w.tiles.k);
  quantize_for(w, x, w.tiles.k, rows, 0, m);
  team.parallel(w.tiles.n / INT8_TILE, [&](int64_t a, int64_t b) { int8_products(w, rows, y, m, a, b); });
}

}  // namespace prefixrag
