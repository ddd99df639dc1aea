// One draw from softmax(logits / temperature) over a vocabulary row, on the calling thread: a pass for
// the maximum, one for the total mass, one that walks the cumulative mass up to u * total.
// torch's operations over a 49k-entry row would run on its thread pool, which in a server sleeps
// between operations and takes a wake-up per operation (several times the draw itself).
//
// Invariants: the mass of token i is e^((x_i - max) / temperature) in float32 (0 below e^-87, so a
// -inf logit never wins), summed in float64 in the same eight-lane blocks by both passes, so the walk
// always ends inside the row; temperature 0 is the first maximum (argmax).
#include <torch/extension.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "f32.h"

namespace {

using namespace prefixrag;

// masses of x[j .. j + 8): e^((x - top) * inv), 0 where that is below e^-87
AVX2 inline __m256 masses(const float* x, __m256 top, __m256 inv) {
  const __m256 z = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x), top), inv);
  const __m256 keep = _mm256_cmp_ps(z, _mm256_set1_ps(-87.f), _CMP_GE_OQ);
  return _mm256_and_ps(exp8(z), keep);
}

AVX2 inline double block_sum(__m256 e) {  // eight masses in float64, in lane order pairs
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(e)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1));
  const __m256d s = _mm256_add_pd(lo, hi);
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

AVX2 int64_t draw(const float* x, int64_t n, double temperature, double u) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j)
    if (x[j] > x[best]) best = j;  // the first maximum; NaN never wins
  if (temperature == 0.0) return best;
  const float inv_f = float(std::min(1.0 / temperature, double(FLT_MAX)));
  const __m256 top = _mm256_set1_ps(x[best]), inv = _mm256_set1_ps(inv_f);
  const int64_t whole = n / 8 * 8;
  auto mass = [&](int64_t j) {  // the tail one by one, as the blocks compute each lane
    const float z = (x[j] - x[best]) * inv_f;
    return z >= -87.f ? double(std::exp(z)) : 0.0;
  };
  double total = 0.0;
  for (int64_t j = 0; j < whole; j += 8) total += block_sum(masses(x + j, top, inv));
  for (int64_t j = whole; j < n; ++j) total += mass(j);
  const double target = u * total;
  double seen = 0.0;
  for (int64_t j = 0; j < whole; j += 8) {
    const __m256 e = masses(x + j, top, inv);
    const double block = block_sum(e);
    if (seen + block > target) {  // inside this block: lane by lane
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, e);
      for (int k = 0; k < 8; ++k) {
        seen += lanes[k];
        if (seen > target && lanes[k] > 0.f) return j + k;
      }
      // float64 rounding left the target past the lanes: the block's last token with mass
      for (int k = 7; k >= 0; --k)
        if (lanes[k] > 0.f) return j + k;
    }
    seen += block;
  }
  for (int64_t j = whole; j < n; ++j) {
    const double m = mass(j);
    seen += m;
    if (seen > target && m > 0.0) return j;
  }
  return best;  // rounding at the very end of the row: the most likely token
}

int64_t sample_row(const torch::Tensor& logits, double temperature, double u) {
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.dim() == 1 && logits.is_contiguous() &&
                  logits.numel() > 0,
              "logits must be a contiguous, non-empty [vocab] float32 row");
  TORCH_CHECK(temperature >= 0.0 && std::isfinite(temperature), "temperature must be finite and >= 0");
  TORCH_CHECK(u >= 0.0 && u < 1.0, "u must be a uniform draw in [0, 1)");
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "sampling needs AVX2 and FMA");
  return draw(logits.data_ptr<float>(), logits.numel(), temperature, u);
}

}  // namespace

void bind_sample(pybind11::module_& mod) {
  // a draw takes microseconds: it keeps the interpreter lock (releasing it would hand the engine's
  // thread to the event loop's queue for it)
  mod.def("sample_row", &sample_row);
}
