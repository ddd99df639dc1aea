// An int8 matrix as Python passes it (engine/native/int8.py), checked once: the decode step's and the
// prefill's int8 Linears read it.
#pragma once
#include <torch/extension.h>

#include <vector>

#include "int8_tiles.h"

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
  Int8Matrix m{parts,
               Int8Tiles{parts[0].data_ptr<int8_t>(), nullptr, parts[1].data_ptr<int32_t>(), nullptr,
                         parts[2].data_ptr<float>(), n, k},
               parts[3].item<float>()};
  if (parts.size() == 6) {
    packed(parts[4]);
    per_column(parts[5], torch::kInt);
    m.tiles.residual = parts[4].data_ptr<int8_t>();
    m.tiles.residual_offset = parts[5].data_ptr<int32_t>();
  }
  return m;
}

}  // namespace prefixrag
