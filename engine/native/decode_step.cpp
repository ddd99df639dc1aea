// One decode step of a Llama-family model in bfloat16, every layer in one native call.
//
// Invariants (engine/native/decode.py states them for Python):
//  * each output row depends on its own input row and KV alone: the products run row by row in a
//    fixed order, whatever the batch, the thread count or the thread split (parallel work is split
//    by output column or by head, never inside a sum);
//  * each step rounds to bfloat16 where the Python layer loop (engine/fused.py) does: the normed
//    input, the projections, each RoPE product and sum, the residual adds, SiLU and its product;
//  * a layer without a bias passes an empty tensor for it;
//  * attention reads keys and values in the KV buffer's layout [layers, 1, kv_heads, capacity, dim].
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "bf16.h"
#include "team.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <sched.h>

namespace {

using namespace prefixrag;

// y[i, n] = x[i, :] . w[n, :] for ROWS rows of x, output columns [n0, n1); w [N, K] row-major.
template <int ROWS>
AVX512 void gemv_rows(const bf16* x, const bf16* w, float* y, int64_t k, int64_t ldy, int64_t n0, int64_t n1) {
  constexpr int NB = ROWS > 4 ? 2 : 4;  // weight rows in flight: independent sums hide the dot product's latency
  constexpr int AHEAD = 4 * NB;  // rows prefetched ahead: the loads of a few blocks overlap the sums
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    __m512 acc[NB][ROWS];
    for (int r = 0; r < NB; ++r)
      for (int i = 0; i < ROWS; ++i) acc[r][i] = _mm512_setzero_ps();
    const bf16* wr = w + n * k;
    for (int64_t j = 0; j < k; j += 32) {
      for (int r = 0; r < NB; ++r) _mm_prefetch((const char*)(wr + (AHEAD + r) * k + j), _MM_HINT_T1);
      for (int r = 0; r < NB; ++r) {
        __m512bh wv = (__m512bh)_mm512_loadu_si512(wr + r * k + j);
        for (int i = 0; i < ROWS; ++i)
          acc[r][i] = _mm512_dpbf16_ps(acc[r][i], (__m512bh)_mm512_loadu_si512(x + i * k + j), wv);
      }
    }
    for (int r = 0; r < NB; ++r)
      for (int i = 0; i < ROWS; ++i) y[i * ldy + n + r] = _mm512_reduce_add_ps(acc[r][i]);
  }
  for (; n < n1; ++n) {
    __m512 acc[ROWS];
    for (int i = 0; i < ROWS; ++i) acc[i] = _mm512_setzero_ps();
    const bf16* wr = w + n * k;
    for (int64_t j = 0; j < k; j += 32) {
      __m512bh wv = (__m512bh)_mm512_loadu_si512(wr + j);
      for (int i = 0; i < ROWS; ++i)
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(x + i * k + j), wv);
    }
    for (int i = 0; i < ROWS; ++i) y[i * ldy + n] = _mm512_reduce_add_ps(acc[i]);
  }
}


using GemvFn = void (*)(const bf16*, const bf16*, float*, int64_t, int64_t, int64_t, int64_t);
constexpr int64_t MAX_ROWS = 8;  // rows per pass over the weights (NB * ROWS sums fill the 32 registers)
const GemvFn GEMV[MAX_ROWS + 1] = {nullptr,         gemv_rows<1>, gemv_rows<2>, gemv_rows<3>, gemv_rows<4>,
                                   gemv_rows<5>, gemv_rows<6>, gemv_rows<7>, gemv_rows<8>};

// y [m, n] (float32 sums) = x [m, k] @ w[n, k]^T, split by output column across threads
void gemv(Team& team, const bf16* x, const bf16* w, float* y, int64_t m, int64_t k, int64_t n) {
  team.parallel((n + 15) / 16, [&](int64_t a, int64_t b) {
    int64_t lo = a * 16, hi = std::min(n, b * 16);
    for (int64_t i = 0; i < m; i += MAX_ROWS) {
      int rows = int(std::min<int64_t>(MAX_ROWS, m - i));
      GEMV[rows](x + i * k, w, y + i * n, k, n, lo, hi);
    }
  });
}

// out = bf16(bf16(silu(g)) * u) for the gate g = bf16(sums[:n]) and value u = bf16(sums[n:2n])
AVX512 void silu_mul(const float* sums, bf16* out, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512 g = round_bf16_ps(_mm512_loadu_ps(sums + j));
    __m512 u = round_bf16_ps(_mm512_loadu_ps(sums + n + j));
    _mm256_storeu_si256((__m256i*)(out + j), pack_bf16(_mm512_mul_ps(round_bf16_ps(silu_ps(g)), u)));
  }
}

// the lane sums of four vectors, [sum a0, sum a1, sum a2, sum a3]
AVX512 inline __m128 sum4(const __m512* a) {
  __m512 r01 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
  __m512 r23 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
  __m512 r = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(r01), _mm512_castps_pd(r23))),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(r01), _mm512_castps_pd(r23))));
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(r), _mm512_extractf32x8_ps(r, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// one query head over keys [0, len): out (bf16) = softmax(q . k * scale) @ v; d a multiple of 32
AVX512 void attend_head(const bf16* q, const bf16* keys, const bf16* values, int64_t len, int64_t d,
                        float scale, float* scores, bf16* out) {
  float best = -INFINITY;
  int64_t t = 0;
  for (; t + 4 <= len; t += 4) {  // four keys at a time: one shuffle tree sums their lanes
    __m512 acc[4];
    for (int u = 0; u < 4; ++u) {
      const bf16* kt = keys + (t + u) * d;
      acc[u] = _mm512_setzero_ps();
      for (int64_t j = 0; j < d; j += 32)
        acc[u] = _mm512_dpbf16_ps(acc[u], (__m512bh)_mm512_loadu_si512(q + j), (__m512bh)_mm512_loadu_si512(kt + j));
    }
    __m128 s4 = _mm_mul_ps(sum4(acc), _mm_set1_ps(scale));
    _mm_storeu_ps(scores + t, s4);
    best = std::max(best, _mm_cvtss_f32(_mm_max_ps(_mm_max_ps(s4, _mm_movehl_ps(s4, s4)),
                                                   _mm_shuffle_ps(_mm_max_ps(s4, _mm_movehl_ps(s4, s4)),
                                                                  _mm_max_ps(s4, _mm_movehl_ps(s4, s4)), 1))));
  }
  for (; t < len; ++t) {
    const bf16* kt = keys + t * d;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < d; j += 32)
      acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + j), (__m512bh)_mm512_loadu_si512(kt + j));
    scores[t] = _mm512_reduce_add_ps(acc) * scale;
    best = std::max(best, scores[t]);
  }
  __m512 vbest = _mm512_set1_ps(best), vsum = _mm512_setzero_ps();
  t = 0;
  for (; t + 16 <= len; t += 16) {
    __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores + t), vbest));
    _mm512_storeu_ps(scores + t, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  float total = _mm512_reduce_add_ps(vsum);
  for (; t < len; ++t) {
    scores[t] = std::exp(scores[t] - best);
    total += scores[t];
  }
  const int64_t chunks = d / 16;  // float32 accumulators of 16 lanes
  __m512 acc[16];
  for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
  for (t = 0; t < len; ++t) {
    __m512 p = _mm512_set1_ps(scores[t]);
    const bf16* vt = values + t * d;
    for (int64_t c = 0; c < chunks; ++c) {
      __m256i raw = _mm256_loadu_si256((const __m256i*)(vt + 16 * c));
      __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      acc[c] = _mm512_fmadd_ps(p, v, acc[c]);
    }
  }
  float buf[16];
  float inv = 1.f / total;
  for (int64_t c = 0; c < chunks; ++c) {
    _mm512_storeu_ps(buf, acc[c]);
    for (int l = 0; l < 16; ++l) out[16 * c + l] = to_bf16(buf[l] * inv);
  }
}

struct Layer {
  torch::Tensor in_norm, post_norm, wqkv, bqkv, wo, bo, wgu, wdown;
};

const bf16* ptr(const torch::Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr()); }

// A model's decode step: weights held once, plain row-major bfloat16.
class DecodeModel {
 public:
  DecodeModel(std::vector<std::vector<torch::Tensor>> layers, torch::Tensor final_norm, torch::Tensor lm_head,
              int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, double scale)
      : final_norm_(final_norm), lm_head_(lm_head), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim),
        eps_(float(eps)), scale_(float(scale)) {
    for (auto& l : layers) {
      TORCH_CHECK(l.size() == 8, "a layer is 8 tensors (norms, wqkv, bqkv, wo, bo, wgu, wdown)");
      layers_.push_back(Layer{l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7]});
    }
    hidden_ = lm_head.size(1);
    inter_ = layers_[0].wdown.size(1);
    TORCH_CHECK(head_dim_ % 32 == 0 && hidden_ % 32 == 0 && inter_ % 32 == 0 && head_dim_ <= 256 &&
                    heads_ % kv_heads_ == 0,
                "native decode needs the head dim, hidden and intermediate sizes in multiples of 32");
  }

  // x [m, hidden] bf16 embeddings of the new tokens, cos/sin [m, head_dim] bf16 at each row's
  // position, k/v stores per row, pasts: each row's position. Returns float32 logits [m, vocab].
  torch::Tensor step(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> k_stores,
                     std::vector<torch::Tensor> v_stores, std::vector<int64_t> pasts) {
    const int64_t m = x.size(0), h = hidden_, d = head_dim_;
    const int64_t qkv_n = (heads_ + 2 * kv_heads_) * d;
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2 && x.size(1) == h, "x must be [rows, hidden] bf16");
    TORCH_CHECK(cos.sizes() == sin.sizes() && cos.size(0) == m && cos.size(1) == d && cos.is_contiguous() &&
                    sin.is_contiguous() && cos.scalar_type() == torch::kBFloat16,
                "cos/sin must be contiguous [rows, head_dim] bf16");
    TORCH_CHECK(int64_t(k_stores.size()) == m && int64_t(v_stores.size()) == m && int64_t(pasts.size()) == m,
                "one K store, V store and position per row");
    for (int64_t i = 0; i < m; ++i)
      for (auto* store : {&k_stores[i], &v_stores[i]})
        TORCH_CHECK(store->scalar_type() == torch::kBFloat16 && store->dim() == 5 &&
                        store->size(0) == int64_t(layers_.size()) && store->size(2) == kv_heads_ &&
                        store->size(3) > pasts[i] && pasts[i] >= 0 && store->size(4) == d && store->stride(4) == 1,
                    "a KV store must be [layers, 1, kv_heads, capacity > position, head_dim] bf16");
    x = x.contiguous().clone();
    std::vector<bf16> normed(m * std::max(h, inter_)), act(m * inter_), attn(m * heads_ * d);
    std::vector<float> sums(m * std::max<int64_t>(2 * inter_, qkv_n));
    std::vector<bf16> qkv(m * qkv_n);
    int64_t longest = 0;
    for (auto p : pasts) longest = std::max(longest, p + 1);
    bf16* xs = reinterpret_cast<bf16*>(x.data_ptr());
    const bf16* cs = ptr(cos);
    const bf16* sn = ptr(sin);
    std::lock_guard<std::mutex> one_step(step_mutex_);  // a model's team runs one step at a time
    const int threads = std::max(1, at::get_num_threads());
    if (!team_ || team_->threads() != threads) team_ = std::make_unique<Team>(threads);
    Team& team = *team_;
    Session session(team);  // workers spin for this step's work, and sleep again when it ends
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& L = layers_[li];
      for (int64_t i = 0; i < m; ++i) rms_norm(xs + i * h, ptr(L.in_norm), normed.data() + i * h, h, eps_);
      gemv(team, normed.data(), ptr(L.wqkv), sums.data(), m, h, qkv_n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < qkv_n; ++j) {
          float v = round_bf16(sums[i * qkv_n + j]);
          if (L.bqkv.numel() > 0) v = round_bf16(v + to_float(ptr(L.bqkv)[j]));
          qkv[i * qkv_n + j] = to_bf16(v);
        }
      rope(qkv.data(), cs, sn, m, qkv_n);
      write_kv(qkv.data(), k_stores, v_stores, pasts, li, qkv_n);
      attention(team, qkv.data(), k_stores, v_stores, pasts, li, qkv_n, longest, attn.data());
      project_add(team, attn.data(), L.wo, L.bo, xs, sums.data(), m, heads_ * d, h);
      for (int64_t i = 0; i < m; ++i) rms_norm(xs + i * h, ptr(L.post_norm), normed.data() + i * h, h, eps_);
      gemv(team, normed.data(), ptr(L.wgu), sums.data(), m, h, 2 * inter_);
      for (int64_t i = 0; i < m; ++i) silu_mul(sums.data() + i * 2 * inter_, act.data() + i * inter_, inter_);
      project_add(team, act.data(), L.wdown, no_bias_, xs, sums.data(), m, inter_, h);
    }
    for (int64_t i = 0; i < m; ++i) rms_norm(xs + i * h, ptr(final_norm_), normed.data() + i * h, h, eps_);
    const int64_t vocab = lm_head_.size(0);
    auto logits = torch::empty({m, vocab}, torch::kFloat32);
    float* out = logits.data_ptr<float>();
    gemv(team, normed.data(), ptr(lm_head_), out, m, h, vocab);
    // the Python path's logits are the bf16 product cast to float32
    for (int64_t j = 0; j < m * vocab; ++j) out[j] = round_bf16(out[j]);
    return logits;
  }

 private:
  // q and k heads rotate in place: x * cos + rotate_half(x) * sin, each product and the sum rounded
  void rope(bf16* qkv, const bf16* cs, const bf16* sn, int64_t m, int64_t qkv_n) const {
    const int64_t d = head_dim_, half = d / 2;
    float tmp[256];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t hh = 0; hh < heads_ + kv_heads_; ++hh) {
        bf16* v = qkv + i * qkv_n + hh * d;
        for (int64_t j = 0; j < d; ++j) {
          float rot = j < half ? -to_float(v[j + half]) : to_float(v[j - half]);
          float a = round_bf16(to_float(v[j]) * to_float(cs[i * d + j]));
          float b = round_bf16(rot * to_float(sn[i * d + j]));
          tmp[j] = a + b;
        }
        for (int64_t j = 0; j < d; ++j) v[j] = to_bf16(tmp[j]);
      }
  }

  void write_kv(const bf16* qkv, std::vector<torch::Tensor>& ks, std::vector<torch::Tensor>& vs,
                const std::vector<int64_t>& pasts, size_t layer, int64_t qkv_n) const {
    const int64_t d = head_dim_;
    for (size_t i = 0; i < pasts.size(); ++i)
      for (int64_t g = 0; g < kv_heads_; ++g) {
        bf16* kd = slot(ks[i], layer, g, pasts[i]);
        bf16* vd = slot(vs[i], layer, g, pasts[i]);
        std::memcpy(kd, qkv + i * qkv_n + (heads_ + g) * d, d * sizeof(bf16));
        std::memcpy(vd, qkv + i * qkv_n + (heads_ + kv_heads_ + g) * d, d * sizeof(bf16));
      }
  }

  static bf16* slot(torch::Tensor& store, size_t layer, int64_t group, int64_t pos) {
    // store [layers, 1, kv_heads, capacity, dim], the last dim contiguous
    auto s = store.strides();
    return reinterpret_cast<bf16*>(store.data_ptr()) + layer * s[0] + group * s[2] + pos * s[3];
  }

  void attention(Team& team, const bf16* qkv, std::vector<torch::Tensor>& ks, std::vector<torch::Tensor>& vs,
                 const std::vector<int64_t>& pasts, size_t layer, int64_t qkv_n, int64_t longest, bf16* out) const {
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

  // x += bf16(in @ w^T (+ bias)), each step rounded as the Python path rounds it
  static void project_add(Team& team, const bf16* in, const torch::Tensor& w, const torch::Tensor& bias, bf16* x, float* sums,
                          int64_t m, int64_t k, int64_t h) {
    gemv(team, in, ptr(w), sums, m, k, h);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < h; ++j) {
        float v = round_bf16(sums[i * h + j]);
        if (bias.numel() > 0) v = round_bf16(v + to_float(ptr(bias)[j]));
        x[i * h + j] = to_bf16(to_float(x[i * h + j]) + v);
      }
  }

  std::vector<Layer> layers_;
  std::unique_ptr<Team> team_;
  std::mutex step_mutex_;
  torch::Tensor final_norm_, lm_head_, no_bias_ = torch::empty({0}, torch::kBFloat16);
  int64_t heads_, kv_heads_, head_dim_, hidden_ = 0, inter_ = 0;
  float eps_, scale_;
};

}  // namespace

void bind_decode_step(pybind11::module_& mod) {
  pybind11::class_<DecodeModel>(mod, "DecodeModel")
      .def(pybind11::init<std::vector<std::vector<torch::Tensor>>, torch::Tensor, torch::Tensor, int64_t, int64_t,
                          int64_t, double, double>())
      .def("step", &DecodeModel::step, pybind11::call_guard<pybind11::gil_scoped_release>());
}
