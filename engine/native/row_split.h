// What a prefill's row passes share (prefill_rows.cpp in bfloat16, prefill_rows_f32.cpp in float32):
// the check of a [rows, width] operand and the split of its rows across torch's threads.
//
// Invariant: work splits only in whole rows, so the thread count never changes a row's result.
#pragma once
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <functional>

namespace prefixrag {

constexpr int64_t ROW_GRAIN_ELEMENTS = 1 << 16;  // a smaller call runs on the calling thread: no wake-up

inline void check_rows(const torch::Tensor& x, c10::ScalarType type, int64_t multiple, const char* what) {
  TORCH_CHECK(x.scalar_type() == type && x.dim() == 2 && x.is_contiguous() && x.size(1) % multiple == 0, what,
              " must be contiguous [rows, a multiple of ", multiple, "] ", c10::toString(type));
}

inline void parallel_rows(int64_t rows, int64_t width, const std::function<void(int64_t, int64_t)>& fn) {
  at::parallel_for(0, rows, std::max<int64_t>(1, ROW_GRAIN_ELEMENTS / std::max<int64_t>(width, 1)), fn);
}

}  // namespace prefixrag
