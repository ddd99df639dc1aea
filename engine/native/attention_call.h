// What every prefill-attention kernel checks of its call (attention_rows.h, prefill_attention_f32.cpp):
// q [T, H, D] contiguous, k/v [KVH, capacity, D] of q's dtype with contiguous rows, D 64 or 128, H a
// multiple of KVH, positions [T] int64 ascending within the KV buffer's capacity.
#pragma once

#include <torch/extension.h>

namespace prefixrag {

// The keys the call's rows see (the last position + 1; 0 without rows). q's dtype is the caller's to check.
inline int64_t checked_attention_call(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& positions) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be contiguous [T, H, D]");
  const int64_t t = q.size(0), heads = q.size(1), d = q.size(2);
  TORCH_CHECK(d == 64 || d == 128, "head_dim must be 64 or 128, got ", d);
  for (const auto* kv : {&k, &v})
    TORCH_CHECK(kv->scalar_type() == q.scalar_type() && kv->dim() == 3 && kv->size(2) == d && kv->stride(2) == 1 &&
                    kv->stride(1) == d,
                "k/v must be [KVH, capacity, D] of q's dtype with contiguous rows");
  const int64_t kv_heads = k.size(0);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0 && v.size(0) == kv_heads, "heads must be a multiple of kv_heads");
  TORCH_CHECK(positions.scalar_type() == torch::kLong && positions.dim() == 1 && positions.numel() == t &&
                  positions.is_contiguous(),
              "positions must be contiguous [T] int64");
  if (t == 0) return 0;
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i)
    TORCH_CHECK(pos[i] >= 0 && (i == 0 || pos[i] > pos[i - 1]), "positions must be ascending and >= 0");
  const int64_t keys = pos[t - 1] + 1;
  TORCH_CHECK(keys <= k.size(1) && keys <= v.size(1), "positions reach past the KV buffer's capacity");
  return keys;
}

}  // namespace prefixrag
