// One decode step of a Llama-family model in float32 on AVX2 + FMA, every layer in one native call.
//
// Invariants (engine/native/decode.py states them for Python):
//  * each output row depends on its own input row and KV alone: the products are tiles_f32.h's (one
//    chain per output in one lane, the prefill Linears' bits), attention runs row by row in a fixed
//    order, whatever the batch, the thread count or the thread split (parallel work is split by
//    output tile or by head, never inside a sum);
//  * float32 throughout, as the Python layer loop computes in float32; its sums run in another
//    order, so results are close to the loop's, not equal;
//  * a layer without a bias passes an empty tensor for it;
//  * attention reads keys and values in the KV buffer's layout [layers, 1, kv_heads, capacity, dim].
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "f32.h"
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

// y [m, n] = x [m, k] @ w^T over w packed in column tiles [n / 16, k, 16] (tiles_f32.h: the prefill
// Linears' products, so a decode row's sums equal a prefill row's), split by tile across threads
void gemv(Team& team, const float* x, const torch::Tensor& w, float* y, int64_t m, bool wide) {
  const int64_t k = w.size(1), n = w.size(0) * F32_COLS;
  const float* ws = w.data_ptr<float>();
  team.parallel(w.size(0), [&](int64_t a, int64_t b) { f32_tile_products(x, ws, y, m, k, n, a, b, wide); });
}

// weight * (x * rsqrt(mean(x^2) + eps)) for one row of h (a multiple of 8)
AVX2 void rms_norm(const float* x, const float* weight, float* out, int64_t h, float eps) {
  __m256 ss = _mm256_setzero_ps();
  for (int64_t j = 0; j < h; j += 8) {
    __m256 v = _mm256_loadu_ps(x + j);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  __m256 inv = _mm256_set1_ps(1.f / std::sqrt(hsum(ss) / float(h) + eps));
  for (int64_t j = 0; j < h; j += 8)
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_loadu_ps(weight + j), _mm256_mul_ps(_mm256_loadu_ps(x + j), inv)));
}

// out = silu(g) * u for the gate g = sums[:n] and value u = sums[n:2n]
AVX2 void silu_mul(const float* sums, float* out, int64_t n) {
  for (int64_t j = 0; j < n; j += 8) {
    __m256 g = _mm256_loadu_ps(sums + j);
    __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(88.f)));
    __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(silu, _mm256_loadu_ps(sums + n + j)));
  }
}

// one query head over keys [0, len): out = softmax(q . k * scale) @ v; d a multiple of 8, <= 256
AVX2 void attend_head(const float* q, const float* keys, const float* values, int64_t len, int64_t d, float scale,
                      float* scores, float* out) {
  float best = -INFINITY;
  for (int64_t t = 0; t < len; ++t) {
    const float* kt = keys + t * d;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < d; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_loadu_ps(kt + j), acc);
    scores[t] = hsum(acc) * scale;
    best = std::max(best, scores[t]);
  }
  __m256 vbest = _mm256_set1_ps(best), vsum = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), vbest));
    _mm256_storeu_ps(scores + t, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float total = hsum(vsum);
  for (; t < len; ++t) {
    scores[t] = std::exp(scores[t] - best);
    total += scores[t];
  }
  const int64_t chunks = d / 8;
  __m256 acc[32];
  for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm256_setzero_ps();
  for (t = 0; t < len; ++t) {
    __m256 p = _mm256_set1_ps(scores[t]);
    const float* vt = values + t * d;
    for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vt + 8 * c), acc[c]);
  }
  __m256 inv = _mm256_set1_ps(1.f / total);
  for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(acc[c], inv));
}

struct Layer {
  torch::Tensor in_norm, post_norm, wqkv, bqkv, wo, bo, wgu, wdown;
};

const float* ptr(const torch::Tensor& t) { return t.data_ptr<float>(); }

bool packed(const torch::Tensor& w) { return w.dim() == 3 && w.size(2) == F32_COLS && w.is_contiguous(); }

// A model's decode step: weights held once, the matmuls' packed in column tiles as the prefill reads them.
class DecodeModelF32 {
 public:
  DecodeModelF32(std::vector<std::vector<torch::Tensor>> layers, torch::Tensor final_norm, torch::Tensor lm_head,
                 int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale, bool wide)
      : final_norm_(final_norm), lm_head_(lm_head), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        eps_(float(eps)), scale_(float(scale)), wide_(wide) {
    TORCH_CHECK(!wide || __builtin_cpu_supports("avx512f"), "wide=True needs AVX-512");
    for (auto& l : layers) {
      TORCH_CHECK(l.size() == 8, "a layer is 8 tensors (norms, wqkv, bqkv, wo, bo, wgu, wdown)");
      for (auto& t : l) TORCH_CHECK(t.scalar_type() == torch::kFloat32, "the float32 step needs float32 weights");
      layers_.push_back(Layer{l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7]});
      const Layer& L = layers_.back();
      TORCH_CHECK(packed(L.wqkv) && packed(L.wo) && packed(L.wgu) && packed(L.wdown),
                  "the float32 step reads its matmuls packed in column tiles [n / 16, k, 16]");
    }
    TORCH_CHECK(packed(lm_head), "the float32 step reads the lm_head packed in column tiles [n / 16, k, 16]");
    hidden_ = lm_head.size(1);  // [vocab / 16, hidden, 16]
    inter_ = layers_[0].wdown.size(1);  // [hidden / 16, inter, 16]
    const int64_t qkv_n = (heads_ + 2 * kv_heads_) * head_dim_;
    for (const Layer& L : layers_)
      TORCH_CHECK(L.wqkv.size(0) * F32_COLS == qkv_n && L.wqkv.size(1) == hidden_ && L.wo.size(0) * F32_COLS == hidden_ &&
                      L.wo.size(1) == heads_ * head_dim_ && L.wgu.size(0) * F32_COLS == 2 * inter_ &&
                      L.wgu.size(1) == hidden_ && L.wdown.size(0) * F32_COLS == hidden_ && L.wdown.size(1) == inter_,
                  "the layers' packed matmuls do not fit the model's geometry");
    TORCH_CHECK(head_dim_ % 8 == 0 && hidden_ % 8 == 0 && inter_ % 8 == 0 && head_dim_ <= 256 &&
                    heads_ % kv_heads_ == 0,
                "native decode needs the head dim, hidden and intermediate sizes in multiples of 8");
  }

  // x [m, hidden] float32 embeddings of the new tokens, cos/sin [m, head_dim] float32 at each row's
  // position, k/v stores per row, pasts: each row's position. Returns float32 logits [m, vocab].
  torch::Tensor step(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> k_stores,
                     std::vector<torch::Tensor> v_stores, std::vector<int64_t> pasts) {
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
      gemv(team, normed.data(), L.wqkv, qkv.data(), m, wide_);
      if (L.bqkv.numel() > 0)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < qkv_n; ++j) qkv[i * qkv_n + j] += ptr(L.bqkv)[j];
      rope(qkv.data(), ptr(cos), ptr(sin), m, qkv_n);
      write_kv(qkv.data(), k_stores, v_stores, pasts, li, qkv_n);
      attention(team, qkv.data(), k_stores, v_stores, pasts, li, qkv_n, longest, attn.data());
      project_add(team, attn.data(), L.wo, L.bo, xs, sums.data(), m, h, wide_);
      for (int64_t i = 0; i < m; ++i) rms_norm(xs + i * h, ptr(L.post_norm), normed.data() + i * h, h, eps_);
      gemv(team, normed.data(), L.wgu, sums.data(), m, wide_);
      for (int64_t i = 0; i < m; ++i) silu_mul(sums.data() + i * 2 * inter_, act.data() + i * inter_, inter_);
      project_add(team, act.data(), L.wdown, no_bias_, xs, sums.data(), m, h, wide_);
    }
    for (int64_t i = 0; i < m; ++i) rms_norm(xs + i * h, ptr(final_norm_), normed.data() + i * h, h, eps_);
    auto logits = torch::empty({m, lm_head_.size(0) * F32_COLS}, torch::kFloat32);
    gemv(team, normed.data(), lm_head_, logits.data_ptr<float>(), m, wide_);
    return logits;
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

  void attention(Team& team, const float* qkv, std::vector<torch::Tensor>& ks, std::vector<torch::Tensor>& vs,
                 const std::vector<int64_t>& pasts, size_t layer, int64_t qkv_n, int64_t longest, float* out) const {
    const int64_t d = head_dim_, m = int64_t(pasts.size()), group = heads_ / kv_heads_;
    team.parallel(m * heads_, [&](int64_t a, int64_t b) {
      std::vector<float> scores(longest);
      for (int64_t task = a; task < b; ++task) {
        int64_t i = task / heads_, hh = task % heads_, g = hh / group;
        attend_head(qkv + i * qkv_n + hh * d, slot(ks[i], layer, g, 0), slot(vs[i], layer, g, 0), pasts[i] + 1, d,
                    scale_, scores.data(), out + (i * heads_ + hh) * d);
      }
    });
  }

  // x += in @ w^T (+ bias)
  static void project_add(Team& team, const float* in, const torch::Tensor& w, const torch::Tensor& bias, float* x,
                          float* sums, int64_t m, int64_t h, bool wide) {
    gemv(team, in, w, sums, m, wide);
    const float* b = bias.numel() > 0 ? ptr(bias) : nullptr;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < h; ++j) x[i * h + j] += b ? sums[i * h + j] + b[j] : sums[i * h + j];
  }

  std::vector<Layer> layers_;
  std::unique_ptr<Team> team_;
  std::mutex step_mutex_;
  torch::Tensor final_norm_, lm_head_, no_bias_ = torch::empty({0}, torch::kFloat32);
  int64_t heads_, kv_heads_, head_dim_, hidden_ = 0, inter_ = 0;
  float eps_, scale_;
  bool wide_;
};

}  // namespace

void bind_decode_step_f32(pybind11::module_& mod) {
  pybind11::class_<DecodeModelF32>(mod, "DecodeModelF32")
      .def(pybind11::init<std::vector<std::vector<torch::Tensor>>, torch::Tensor, torch::Tensor, int64_t, int64_t,
                          int64_t, double, double, bool>())
      .def("step", &DecodeModelF32::step, pybind11::call_guard<pybind11::gil_scoped_release>());
}
