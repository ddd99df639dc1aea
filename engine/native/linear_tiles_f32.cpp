// A prefill's float32 Linears over weights packed in tiles of 16 output columns, [n / 16, k, 16]
// (engine/native/linear.py packs them): y = x @ w^T (+ bias), on AVX2 + FMA or AVX-512.
//
// Invariants: output element (i, c) is one chain of fused multiply-adds over k in order, from zero,
// in one register lane, then + bias; so a row's result depends on that row alone (a prompt split
// anywhere gives every row the same bits, with no padding of rows to a tile), the AVX2 and AVX-512
// kernels give the same bits (a lane's arithmetic is the same at either width), and threads split
// the output columns, never a sum, so the thread count never changes a bit.
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>

#define F32_AVX2 __attribute__((target("avx2,fma")))
#define F32_AVX512 __attribute__((target("avx512f")))

namespace {

constexpr int64_t COLS = 16;                 // output columns per packed tile
constexpr int64_t GRAIN_MACS = 1 << 18;      // a thread's least work: a smaller product wakes no other thread
constexpr int64_t BLOCK_BYTES = 384 << 10;   // weights a block of tiles holds: stays in L2 while every row passes

// y[i, 16 t .. 16 t + 16) for ROWS rows of x [ROWS, k] and tiles [t0, t1), NB tiles at a time (AVX-512)
template <int ROWS, int NB>
F32_AVX512 void rows512(const float* x, const float* wp, float* y, int64_t k, int64_t ldy, int64_t t0, int64_t t1) {
  const int64_t tile = k * COLS;
  int64_t t = t0;
  for (; t + NB <= t1; t += NB) {
    __m512 acc[ROWS][NB];
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < NB; ++c) acc[i][c] = _mm512_setzero_ps();
    const float* w = wp + t * tile;
    for (int64_t p = 0; p < k; ++p) {
      __m512 wv[NB];
      for (int c = 0; c < NB; ++c) {
        _mm_prefetch((const char*)(w + c * tile + (p + 8) * COLS), _MM_HINT_T0);
        wv[c] = _mm512_loadu_ps(w + c * tile + p * COLS);
      }
      for (int i = 0; i < ROWS; ++i) {
        const __m512 xv = _mm512_set1_ps(x[i * k + p]);
        for (int c = 0; c < NB; ++c) acc[i][c] = _mm512_fmadd_ps(xv, wv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < NB; ++c) _mm512_storeu_ps(y + i * ldy + (t + c) * COLS, acc[i][c]);
  }
  if constexpr (NB > 1)
    if (t < t1) rows512<ROWS, 1>(x, wp, y, k, ldy, t, t1);
}

// the same for AVX2: a tile's 16 lanes in two registers
template <int ROWS, int NB>
F32_AVX2 void rows256(const float* x, const float* wp, float* y, int64_t k, int64_t ldy, int64_t t0, int64_t t1) {
  const int64_t tile = k * COLS;
  int64_t t = t0;
  for (; t + NB <= t1; t += NB) {
    __m256 acc[ROWS][2 * NB];
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 2 * NB; ++c) acc[i][c] = _mm256_setzero_ps();
    const float* w = wp + t * tile;
    for (int64_t p = 0; p < k; ++p) {
      __m256 wv[2 * NB];
      for (int c = 0; c < NB; ++c) {
        _mm_prefetch((const char*)(w + c * tile + (p + 8) * COLS), _MM_HINT_T0);
        wv[2 * c] = _mm256_loadu_ps(w + c * tile + p * COLS);
        wv[2 * c + 1] = _mm256_loadu_ps(w + c * tile + p * COLS + 8);
      }
      for (int i = 0; i < ROWS; ++i) {
        const __m256 xv = _mm256_broadcast_ss(x + i * k + p);
        for (int c = 0; c < 2 * NB; ++c) acc[i][c] = _mm256_fmadd_ps(xv, wv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 2 * NB; ++c) _mm256_storeu_ps(y + i * ldy + (t + c / 2) * COLS + 8 * (c % 2), acc[i][c]);
  }
  if constexpr (NB > 1)
    if (t < t1) rows256<ROWS, 1>(x, wp, y, k, ldy, t, t1);
}

using RowsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
// rows per pass over the weights: ROWS * NB sums + NB weights fill the registers (32 wide, 16 narrow)
constexpr int64_t MAX_ROWS_512 = 8, MAX_ROWS_256 = 6;
const RowsFn ROWS_512[MAX_ROWS_512 + 1] = {
    nullptr,         rows512<1, 8>, rows512<2, 8>, rows512<3, 6>, rows512<4, 6>,
    rows512<5, 4>,   rows512<6, 4>, rows512<7, 3>, rows512<8, 3>};
const RowsFn ROWS_256[MAX_ROWS_256 + 1] = {
    nullptr, rows256<1, 6>, rows256<2, 3>, rows256<3, 2>, rows256<4, 1>, rows256<5, 1>, rows256<6, 1>};

// y [m, n] (row stride n) = x [m, k] @ w^T over tiles [t0, t1), blocked so a block's weights stay in cache
void tile_products(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t n, int64_t t0, int64_t t1,
                   bool wide) {
  const RowsFn* fns = wide ? ROWS_512 : ROWS_256;
  const int64_t most = wide ? MAX_ROWS_512 : MAX_ROWS_256;
  const int64_t block = m <= most ? t1 - t0 : std::max<int64_t>(1, BLOCK_BYTES / (k * COLS * 4));
  for (int64_t t = t0; t < t1; t += block) {
    const int64_t end = std::min(t1, t + block);
    for (int64_t i = 0; i < m; i += most) fns[std::min(most, m - i)](x + i * k, w, y + i * n, k, n, t, end);
  }
}

torch::Tensor linear_tiles_f32(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias, bool wide) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(), "x must be contiguous [rows, k] float32");
  TORCH_CHECK(w.scalar_type() == torch::kFloat32 && w.dim() == 3 && w.is_contiguous() && w.size(2) == COLS &&
                  w.size(1) == x.size(1),
              "the weight must be float32 packed in column tiles [n / 16, k, 16] for x's k");
  const int64_t m = x.size(0), k = x.size(1), tiles = w.size(0), n = tiles * COLS;
  TORCH_CHECK(bias.numel() == 0 || (bias.scalar_type() == torch::kFloat32 && bias.numel() == n && bias.is_contiguous()),
              "the bias must be contiguous [n] float32 (or empty)");
  TORCH_CHECK(!wide || __builtin_cpu_supports("avx512f"), "wide=True needs AVX-512");
  TORCH_CHECK(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), "the float32 Linear needs AVX2 and FMA");
  auto y = torch::empty({m, n}, torch::kFloat32);
  if (m == 0) return y;
  const float *xs = x.data_ptr<float>(), *ws = w.data_ptr<float>();
  const float* bs = bias.numel() > 0 ? bias.data_ptr<float>() : nullptr;
  float* ys = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, GRAIN_MACS / (m * k * COLS));
  at::parallel_for(0, tiles, grain, [&](int64_t a, int64_t b) {
    tile_products(xs, ws, ys, m, k, n, a, b, wide);
    if (bs != nullptr)  // after the sums, one rounding, as a separate add
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = a * COLS; j < b * COLS; ++j) ys[i * n + j] += bs[j];
  });
  return y;
}

}  // namespace

void bind_linear_tiles_f32(pybind11::module_& mod) {
  mod.def("linear_tiles_f32", &linear_tiles_f32, pybind11::call_guard<pybind11::gil_scoped_release>());
}
