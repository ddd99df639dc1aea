// A reused chunk's keys moved to a new position in place: RoPE by the position delta, R(d) R(p) k =
// R(p + d) k, over every layer and kv head of a run of the KV store, in one call. The torch form
// (engine/chunks/stitch.py's rotate_keys) is seven operations over the run, each a pass and, in a
// server, a trip through the GIL and the thread pool's wake-up; a stitched prompt moves every chunk.
//
// Invariants: each key gives rotate_keys' bits: k widened to float32, x * cos and rotated * sin each
// rounded to float32, their sum rounded to float32 (no fused multiply-add), then stored in the
// store's dtype (bfloat16: rounded to nearest even, as torch's copy). A key's result depends on that
// key alone, so the thread split never changes it.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "bf16.h"

namespace {

using namespace prefixrag;

constexpr int64_t GRAIN_KEYS = 1 << 10;  // a call over fewer keys runs on the calling thread: no wake-up

// 8 lanes of a key's first half (x1) and second half (x2) -> their rotated values, float32
struct Rotated {
  __m256 lo, hi;
};

__attribute__((optimize("fp-contract=off"))) AVX2 inline Rotated rotate8(__m256 x1, __m256 x2, const float* cs,
                                                                          const float* sn, int64_t j, int64_t half) {
  const __m256 neg2 = _mm256_sub_ps(_mm256_setzero_ps(), x2);
  const __m256 lo = _mm256_add_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(cs + j)), _mm256_mul_ps(neg2, _mm256_loadu_ps(sn + j)));
  const __m256 hi = _mm256_add_ps(_mm256_mul_ps(x2, _mm256_loadu_ps(cs + half + j)),
                                  _mm256_mul_ps(x1, _mm256_loadu_ps(sn + half + j)));
  return {lo, hi};
}

AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
AVX2 inline __m256 load8(const bf16* p) { return load_bf16_8(p); }
AVX2 inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
AVX2 inline void store8(bf16* p, __m256 v) { store_bf16_8(p, v); }

template <typename T>  // float (a float32 store) or bf16
AVX2 void rotate_key(T* k, const float* cs, const float* sn, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < half; j += 8) {
    const Rotated r = rotate8(load8(k + j), load8(k + half + j), cs, sn, j, half);
    store8(k + j, r.lo);
    store8(k + half + j, r.hi);
  }
}

// keys [L, H, N, D] (any strides but a contiguous last dimension), rotated in place; cos/sin [D] float32
void rotate_keys_(torch::Tensor& keys, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(keys.dim() == 4 && keys.stride(3) == 1, "keys must be [layers, kv_heads, tokens, head_dim] with contiguous rows");
  const bool half_precision = keys.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(half_precision || keys.scalar_type() == torch::kFloat32, "keys must be bfloat16 or float32");
  const int64_t layers = keys.size(0), heads = keys.size(1), n = keys.size(2), d = keys.size(3);
  TORCH_CHECK(d % 16 == 0, "head_dim must be a multiple of 16, got ", d);
  for (const auto* t : {&cos, &sin})
    TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->dim() == 1 && t->numel() == d && t->is_contiguous(),
                "cos/sin must be contiguous [head_dim] float32");
  const float *cs = cos.data_ptr<float>(), *sn = sin.data_ptr<float>();
  const int64_t s0 = keys.stride(0), s1 = keys.stride(1), s2 = keys.stride(2);
  char* base = static_cast<char*>(keys.data_ptr());
  const int64_t item = keys.element_size();
  const int64_t grain = std::max<int64_t>(1, GRAIN_KEYS / std::max<int64_t>(n, 1));
  at::parallel_for(0, layers * heads, grain, [&](int64_t a, int64_t b) {
    for (int64_t lh = a; lh < b; ++lh) {
      char* head = base + ((lh / heads) * s0 + (lh % heads) * s1) * item;
      for (int64_t t = 0; t < n; ++t) {
        char* key = head + t * s2 * item;
        if (half_precision)
          rotate_key(reinterpret_cast<bf16*>(key), cs, sn, d);
        else
          rotate_key(reinterpret_cast<float*>(key), cs, sn, d);
      }
    }
  });
}

}  // namespace

void bind_key_rotation(pybind11::module_& mod) {
  mod.def("rotate_keys_", &rotate_keys_, pybind11::call_guard<pybind11::gil_scoped_release>());
}
