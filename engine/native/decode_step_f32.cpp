// One decode step of a Llama-family model in float32 on AVX2 + FMA, every layer in one native call,
// over float32 weights or int8 ones (int8_matrix.h: int8_linear's bits for each row's Linears).
//
// Invariants (engine/native/decode.py states them for Python):
//  * each output row depends on its own input row and KV alone: the products are tiles_f32.h's (one
//    chain per output in one lane, the prefill Linears' bits) or int8_matrix.h's, attention runs row by
//    row over fixed spans of keys combined in a fixed order, whatever the batch, the thread count or
//    the thread split (parallel work is split by output tile or by head and span, never inside a sum);
//  * float32 throughout, as the Python layer loop computes in float32; its sums run in another
//    order, so results are close to the loop's, not equal;
//  * a layer without a bias passes an empty tensor for it;
//  * attention reads keys and values in the KV buffer's layout [layers, 1, kv_heads, capacity, dim].
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "f32.h"
#include "int8_matrix.h"
#include "team.h"
#include "tiles_f32.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

namespace {

using namespace prefixrag;

using Parts = std::vector<torch::Tensor>;

bool packed(const torch::Tensor& w) { return w.dim() == 3 && w.size(2) == F32_COLS && w.is_contiguous(); }

// The Linears' weights a step multiplies by: a matrix is the list of tensors Python passes for it
// (engine/native/decode.py), checked once against the shape the model expects.
struct F32Matrices {  // float32 column tiles [n / 16, k, 16], the prefill's packed copy
  using Matrix = torch::Tensor;
  static Matrix make(const Parts& parts, int64_t n, int64_t k) {
    TORCH_CHECK(parts.size() == 1 && parts[0].scalar_type() == torch::kFloat32 && packed(parts[0]) &&
                    parts[0].size(0) * F32_COLS == n && parts[0].size(1) == k,
                "the float32 step reads its matmuls as float32 packed in column tiles [", n, " / 16, ", k, ", 16]");
    return parts[0];
  }
  static int64_t columns_of(const Parts& parts) { return parts.at(0).size(0) * F32_COLS; }
  // y [m, n] = x [m, k] @ w^T (tiles_f32.h: the prefill Linears' products, so a decode row's sums
  // equal a prefill row's), split by tile across threads
  static void gemv(Team& team, const float* x, const Matrix& w, float* y, int64_t m, bool wide) {
    const int64_t k = w.size(1), n = w.size(0) * F32_COLS;
    const float* ws = w.data_ptr<float>();
    team.parallel(w.size(0), [&](int64_t a, int64_t b) { f32_tile_products(x, ws, y, m, k, n, a, b, wide); });
  }
};

struct Int8Matrices {  // int8 digits in column tiles (int8_matrix.h), int8_linear's arithmetic
  using Matrix = Int8Matrix;
  static Matrix make(const Parts& parts, int64_t n, int64_t k) { return int8_matrix(parts, n, k); }
  static int64_t columns_of(const Parts& parts) { return int8_columns(parts); }
  static void gemv(Team& team, const float* x, const Matrix& w, float* y, int64_t m, bool) {
    int8_gemv(team, x, w, y, m);
  }
};

// Attention splits each head's keys in spans of a fixed length, whatever the thread count: a span's
// part is its own maximum score, its sum of exp(score - maximum) and its unnormalised value sum, and
// the parts combine in span order, so each output has one set of bits.
constexpr int64_t SPAN = 256;

struct SpanPart {
  float best, total;
};

// 8 sums of 8 lanes each, in one vector
AVX2 inline __m256 hsum8(const __m256* a) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

constexpr int64_t SPAN_HEADS = 4;  // a KV group's query heads attended together, at most
constexpr int64_t VALUE_BLOCK = 16;  // keys whose value rows stay in L1 while each head adds them

// scores[h * SPAN + t] = q_h . keys[t] * scale for heads h < nh (q_h = q + h * d), t in [0, len):
// 8 keys at a time (8 independent sums in flight), each block read from memory once for the heads;
// CHUNKS = d / 8 where the head dim is known at compile time, 0 where it is not
template <int64_t CHUNKS>
AVX2 void span_scores(const float* q, int64_t nh, const float* keys, int64_t len, int64_t d, float scale,
                      float* scores) {
  const int64_t chunks = CHUNKS ? CHUNKS : d / 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) {
    const float* k = keys + t * d;
    for (int64_t h = 0; h < nh; ++h) {
      const float* qh = q + h * d;
      __m256 acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) {
        const __m256 qc = _mm256_loadu_ps(qh + 8 * c);
        for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + r * d + 8 * c), acc[r]);
      }
      _mm256_storeu_ps(scores + h * SPAN + t, _mm256_mul_ps(hsum8(acc), vscale));
    }
  }
  for (; t < len; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + 8 * c), _mm256_loadu_ps(keys + t * d + 8 * c), acc);
      scores[h * SPAN + t] = hsum(acc) * scale;
    }
}

// p[t] = exp(p[t] - max) in place for t in [0, len): the span's part
AVX2 SpanPart span_weights(float* p, int64_t len) {
  float best = -INFINITY;
  for (int64_t t = 0; t < len; ++t) best = std::max(best, p[t]);
  const __m256 vbest = _mm256_set1_ps(best);
  __m256 vsum = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), vbest));
    _mm256_storeu_ps(p + t, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float total = hsum(vsum);
  for (; t < len; ++t) {
    p[t] = std::exp(p[t] - best);
    total += p[t];
  }
  return {best, total};
}

// out[h * stride ...] = sum_t p[h * SPAN + t] * values[t] for heads h < nh, in t order; a block of
// value rows is read from memory once for the heads
template <int64_t CHUNKS>
AVX2 void span_values(const float* p, int64_t nh, const float* values, int64_t len, int64_t d, float* out,
                      int64_t stride) {
  const int64_t chunks = CHUNKS ? CHUNKS : d / 8;
  __m256 acc[32];
  for (int64_t t0 = 0; t0 < len; t0 += VALUE_BLOCK) {
    const int64_t t1 = std::min(len, t0 + VALUE_BLOCK);
    for (int64_t h = 0; h < nh; ++h) {
      float* oh = out + h * stride;
      for (int64_t c = 0; c < chunks; ++c) acc[c] = t0 ? _mm256_loadu_ps(oh + 8 * c) : _mm256_setzero_ps();
      for (int64_t t = t0; t < t1; ++t) {
        const __m256 w = _mm256_set1_ps(p[h * SPAN + t]);
        const float* vt = values + t * d;
        for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vt + 8 * c), acc[c]);
      }
      for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(oh + 8 * c, acc[c]);
    }
  }
}

// nh <= SPAN_HEADS query heads of one KV group over one span of keys [0, len <= SPAN): head h's part
// at parts[h * stride] and its values weighed by exp(score - part.best), not yet divided, at
// sums[h * stride * d]; d a multiple of 8, <= 256
template <int64_t CHUNKS>
AVX2 void attend_span(const float* q, int64_t nh, const float* keys, const float* values, int64_t len, int64_t d,
                      float scale, SpanPart* parts, float* sums, int64_t stride) {
  float scores[SPAN_HEADS * SPAN];
  span_scores<CHUNKS>(q, nh, keys, len, d, scale, scores);
  for (int64_t h = 0; h < nh; ++h) parts[h * stride] = span_weights(scores + h * SPAN, len);
  span_values<CHUNKS>(scores, nh, values, len, d, sums, stride * d);
}

// attend_span with the head dim's loops unrolled for the common head dims
inline void attend_span_any(const float* q, int64_t nh, const float* keys, const float* values, int64_t len, int64_t d,
                            float scale, SpanPart* parts, float* sums, int64_t stride) {
  if (d == 64) attend_span<8>(q, nh, keys, values, len, d, scale, parts, sums, stride);
  else if (d == 128) attend_span<16>(q, nh, keys, values, len, d, scale, parts, sums, stride);
  else attend_span<0>(q, nh, keys, values, len, d, scale, parts, sums, stride);
}

// out = the spans' value sums combined in span order, each weighed by exp(its maximum - the maximum)
AVX2 void combine_spans(const SpanPart* parts, const float* sums, int64_t spans, int64_t d, float* out) {
  float best = -INFINITY;
  for (int64_t s = 0; s < spans; ++s) best = std::max(best, parts[s].best);
  const int64_t chunks = d / 8;
  __m256 acc[32];
  for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm256_setzero_ps();
  float total = 0.f;
  for (int64_t s = 0; s < spans; ++s) {
    const float w = std::exp(parts[s].best - best);
    total += parts[s].total * w;
    const __m256 vw = _mm256_set1_ps(w);
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm256_fmadd_ps(vw, _mm256_loadu_ps(sums + s * d + 8 * c), acc[c]);
  }
  const __m256 inv = _mm256_set1_ps(1.f / total);
  for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(acc[c], inv));
}

const float* ptr(const torch::Tensor& t) { return t.data_ptr<float>(); }

// A model's decode step over matrices M: weights held once, in the form the prefill reads them.
// ``step_and_hidden`` also returns the last layer's hidden states (int8's logits are rescored from
// them in float, engine.quant.linear.rescore_top).
template <class M>
class DecodeModelF32 {
  using Matrix = typename M::Matrix;
  struct Layer {
    torch::Tensor in_norm, post_norm, bqkv, bo;
    Matrix wqkv, wo, wgu, wdown;
  };

 public:
  // layers: per layer [in_norm], [post_norm], wqkv, [bqkv], wo, [bo], wgu, wdown, each a list of tensors
  DecodeModelF32(std::vector<std::vector<Parts>> layers, torch::Tensor final_norm, Parts lm_head, int64_t heads,
                 int64_t kv_heads, int64_t head_dim, double eps, double scale, bool wide)
      : final_norm_(final_norm), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(float(eps)),
        scale_(float(scale)), wide_(wide) {
    TORCH_CHECK(!wide || __builtin_cpu_supports("avx512f"), "wide=True needs AVX-512");
    TORCH_CHECK(!layers.empty() && layers[0].size() == 8, "a model has layers of 8 entries");
    TORCH_CHECK(final_norm.scalar_type() == torch::kFloat32, "the float32 step needs float32 norms");
    hidden_ = final_norm.numel();
    inter_ = M::columns_of(layers[0][6]) / 2;
    const int64_t qkv_n = (heads_ + 2 * kv_heads_) * head_dim_;
    TORCH_CHECK(head_dim_ % 8 == 0 && hidden_ % 8 == 0 && inter_ % 8 == 0 && head_dim_ <= 256 &&
                    heads_ % kv_heads_ == 0,
                "native decode needs the head dim, hidden and intermediate sizes in multiples of 8");
    for (auto& l : layers) {
      TORCH_CHECK(l.size() == 8, "a layer is 8 entries (norms, wqkv, bqkv, wo, bo, wgu, wdown)");
      for (int i : {0, 1, 3, 5})
        TORCH_CHECK(l[i].size() == 1 && l[i][0].scalar_type() == torch::kFloat32,
                    "a norm or bias entry is one float32 tensor");
      layers_.push_back(Layer{l[0][0], l[1][0], l[3][0], l[5][0], M::make(l[2], qkv_n, hidden_),
                              M::make(l[4], hidden_, heads_ * head_dim_), M::make(l[6], 2 * inter_, hidden_),
                              M::make(l[7], hidden_, inter_)});
    }
    vocab_ = M::columns_of(lm_head);
    lm_head_.push_back(M::make(lm_head, vocab_, hidden_));
  }

  torch::Tensor step(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> k_stores,
                     std::vector<torch::Tensor> v_stores, std::vector<int64_t> pasts) {
    return step_and_hidden(x, cos, sin, k_stores, v_stores, pasts)[0];
  }

  // x [m, hidden] float32 embeddings of the new tokens, cos/sin [m, head_dim] float32 at each row's
  // position, k/v stores per row, pasts: each row's position. Returns float32 logits [m, vocab] and
  // the hidden states [m, hidden] before the final norm.
  std::vector<torch::Tensor> step_and_hidden(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                                             std::vector<torch::Tensor> k_stores, std::vector<torch::Tensor> v_stores,
                                             std::vector<int64_t> pasts) {
    const int64_t m = x.size(0), h = hidden_, d = head_dim_;
    const int64_t qkv_n = (heads_ + 2 * kv_heads_) * d;
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.size(1) == h,
                "x must be [rows, hidden] float32");
    TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == m && cos.size(1) == d && cos.is_contiguous() &&
                    sin.is_contiguous() && cos.scalar_type() == torch::kFloat32,
                "cos/sin must be contiguous [rows, head_dim] float32");
    TORCH_CHECK(int64_t(k_stores.size()) == m && int64_t(v_stores.size()) == m && int64_t(pasts.size()) == m,
                "one K store, V store and position per row");
    for (int64_t i = 0; i < m; ++i)
      for (auto* store : {&k_stores[i], &v_stores[i]})
        TORCH_CHECK(store->scalar_type() == torch::kFloat32 && store->dim() == 5 &&
                        store->size(0) == int64_t(layers_.size()) && store->size(2) == kv_heads_ &&
                        store->size(3) > pasts[i] && pasts[i] >= 0 && store->size(4) == d && store->stride(4) == 1,
                    "a KV store must be [layers, 1, kv_heads, capacity > position, head_dim] float32");
    x = x.contiguous().clone();
    std::vector<float> normed(m * std::max(h, inter_)), act(m * inter_), attn(m * heads_ * d);
    std::vector<float> sums(m * std::max<int64_t>(2 * inter_, std::max(qkv_n, h)));
    std::vector<float> qkv(m * qkv_n);
    int64_t longest = 0;
    for (auto p : pasts) longest = std::max(longest, p + 1);
    float* xs = x.data_ptr<float>();
    std::lock_guard<std::mutex> one_step(step_mutex_);  // a model's team runs one step at a time
    const int threads = std::max(1, at::get_num_threads());
    if (!team_ || team_->threads() != threads) team_ = std::make_unique<Team>(threads);
    Team& team = *team_;
    Session session(team);  // workers spin for this step's work, and sleep again when it ends
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& L = layers_[li];
      for (int64_t i = 0; i < m; ++i) rms_norm(xs + i * h, ptr(L.in_norm), normed.data() + i * h, h, eps_);
      M::gemv(team, normed.data(), L.wqkv, qkv.data(), m, wide_);
      if (L.bqkv.numel() > 0)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < qkv_n; ++j) qkv[i * qkv_n + j] += ptr(L.bqkv)[j];
      rope(qkv.data(), ptr(cos), ptr(sin), m, qkv_n);
      write_kv(qkv.data(), k_stores, v_stores, pasts, li, qkv_n);
      attention(team, qkv.data(), k_stores, v_stores, pasts, li, qkv_n, longest, attn.data());
      project_add(team, attn.data(), L.wo, L.bo, xs, sums.data(), m, h, wide_);
      for (int64_t i = 0; i < m; ++i) rms_norm(xs + i * h, ptr(L.post_norm), normed.data() + i * h, h, eps_);
      M::gemv(team, normed.data(), L.wgu, sums.data(), m, wide_);
      for (int64_t i = 0; i < m; ++i) silu_mul(sums.data() + i * 2 * inter_, act.data() + i * inter_, inter_);
      project_add(team, act.data(), L.wdown, no_bias_, xs, sums.data(), m, h, wide_);
    }
    for (int64_t i = 0; i < m; ++i) rms_norm(xs + i * h, ptr(final_norm_), normed.data() + i * h, h, eps_);
    auto logits = torch::empty({m, vocab_}, torch::kFloat32);
    M::gemv(team, normed.data(), lm_head_[0], logits.data_ptr<float>(), m, wide_);
    return {logits, x};
  }

 private:
  // q and k heads rotate in place: x * cos + rotate_half(x) * sin
  void rope(float* qkv, const float* cs, const float* sn, int64_t m, int64_t qkv_n) const {
    const int64_t d = head_dim_, half = d / 2;
    float tmp[256];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t hh = 0; hh < heads_ + kv_heads_; ++hh) {
        float* v = qkv + i * qkv_n + hh * d;
        for (int64_t j = 0; j < d; ++j) {
          float rot = j < half ? -v[j + half] : v[j - half];
          tmp[j] = v[j] * cs[i * d + j] + rot * sn[i * d + j];
        }
        std::memcpy(v, tmp, d * sizeof(float));
      }
  }

  void write_kv(const float* qkv, std::vector<torch::Tensor>& ks, std::vector<torch::Tensor>& vs,
                const std::vector<int64_t>& pasts, size_t layer, int64_t qkv_n) const {
    const int64_t d = head_dim_;
    for (size_t i = 0; i < pasts.size(); ++i)
      for (int64_t g = 0; g < kv_heads_; ++g) {
        std::memcpy(slot(ks[i], layer, g, pasts[i]), qkv + i * qkv_n + (heads_ + g) * d, d * sizeof(float));
        std::memcpy(slot(vs[i], layer, g, pasts[i]), qkv + i * qkv_n + (heads_ + kv_heads_ + g) * d, d * sizeof(float));
      }
  }

  static float* slot(torch::Tensor& store, size_t layer, int64_t group, int64_t pos) {
    // store [layers, 1, kv_heads, capacity, dim], the last dim contiguous
    auto s = store.strides();
    return store.data_ptr<float>() + layer * s[0] + group * s[2] + pos * s[3];
  }

  // tasks by row, KV group, span and run of up to SPAN_HEADS of the group's heads: a span's keys and
  // values are read from memory once for the heads
  void attention(Team& team, const float* qkv, std::vector<torch::Tensor>& ks, std::vector<torch::Tensor>& vs,
                 const std::vector<int64_t>& pasts, size_t layer, int64_t qkv_n, int64_t longest, float* out) const {
    const int64_t d = head_dim_, m = int64_t(pasts.size()), group = heads_ / kv_heads_;
    const int64_t runs = (group + SPAN_HEADS - 1) / SPAN_HEADS, spans = (longest + SPAN - 1) / SPAN;
    const int64_t per_row = kv_heads_ * spans * runs;
    std::vector<SpanPart> parts(m * heads_ * spans);
    std::vector<float> sums(m * heads_ * spans * d);
    team.parallel(m * per_row, [&](int64_t a, int64_t b) {
      for (int64_t task = a; task < b; ++task) {
        const int64_t i = task / per_row, g = task % per_row / (spans * runs), s = task % (spans * runs) / runs;
        const int64_t h0 = g * group + task % runs * SPAN_HEADS, nh = std::min(SPAN_HEADS, (g + 1) * group - h0);
        const int64_t start = s * SPAN, len = std::min(SPAN, pasts[i] + 1 - start);
        const int64_t slot_at = (i * heads_ + h0) * spans + s;
        if (len <= 0) continue;  // a shorter row's spans past its keys
        attend_span_any(qkv + i * qkv_n + h0 * d, nh, slot(ks[i], layer, g, start), slot(vs[i], layer, g, start), len,
                        d, scale_, parts.data() + slot_at, sums.data() + slot_at * d, spans);
      }
    });
    for (int64_t i = 0; i < m; ++i) {
      const int64_t row_spans = (pasts[i] + SPAN) / SPAN;  // spans holding keys [0, pasts[i]]
      for (int64_t hh = 0; hh < heads_; ++hh) {
        const int64_t first = (i * heads_ + hh) * spans;
        combine_spans(parts.data() + first, sums.data() + first * d, row_spans, d, out + (i * heads_ + hh) * d);
      }
    }
  }

  // x += in @ w^T (+ bias)
  static void project_add(Team& team, const float* in, const Matrix& w, const torch::Tensor& bias, float* x,
                          float* sums, int64_t m, int64_t h, bool wide) {
    M::gemv(team, in, w, sums, m, wide);
    const float* b = bias.numel() > 0 ? ptr(bias) : nullptr;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < h; ++j) x[i * h + j] += b ? sums[i * h + j] + b[j] : sums[i * h + j];
  }

  std::vector<Layer> layers_;
  std::unique_ptr<Team> team_;
  std::mutex step_mutex_;
  std::vector<Matrix> lm_head_;  // one: a Matrix has no empty state
  torch::Tensor final_norm_, no_bias_ = torch::empty({0}, torch::kFloat32);
  int64_t heads_, kv_heads_, head_dim_, hidden_ = 0, inter_ = 0, vocab_ = 0;
  float eps_, scale_;
  bool wide_;
};

}  // namespace

template <class M>
void bind_model_f32(pybind11::module_& mod, const char* name) {
  pybind11::class_<DecodeModelF32<M>>(mod, name)
      .def(pybind11::init<std::vector<std::vector<Parts>>, torch::Tensor, Parts, int64_t, int64_t, int64_t, double,
                          double, bool>())
      .def("step", &DecodeModelF32<M>::step, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("step_and_hidden", &DecodeModelF32<M>::step_and_hidden, pybind11::call_guard<pybind11::gil_scoped_release>());
}

void bind_decode_step_f32(pybind11::module_& mod) {
  bind_model_f32<F32Matrices>(mod, "DecodeModelF32");
  bind_model_f32<Int8Matrices>(mod, "DecodeModelF32Int8");
}
