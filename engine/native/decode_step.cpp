// One decode step of a Llama-family model in bfloat16, every layer in one native call, on AVX512-BF16
// or (DecodeModelAvx2) on AVX2 + FMA.
//
// Invariants (engine/native/decode.py states them for Python):
//  * each output row depends on its own input row and KV alone: the products run row by row in a
//    fixed order, whatever the batch, the thread count or the thread split (parallel work is split
//    by output column or by head, never inside a sum);
//  * each step rounds to bfloat16 where the Python layer loop (engine/fused.py) does: the normed
//    input, the projections, each RoPE product and sum, the residual adds, SiLU and its product;
//    the logits are the lm_head's float32 sums (as the prefill's tiled lm_head gives them);
//  * a layer without a bias passes an empty tensor for it;
//  * attention reads keys and values in the KV buffer's layout [layers, 1, kv_heads, capacity, dim].
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "bf16.h"
#include "decode_avx2.h"
#include "int8_matrix.h"
#include "team.h"
#include "tiles.h"

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

// y [m, n] (float32 sums) = x [m, k] @ w^T for w packed in tiles, split by column tile across threads
void gemv(Team& team, const bf16* x, const bf16* w, float* y, int64_t m, int64_t k, int64_t n) {
  team.parallel(n / TILE_COLS, [&](int64_t a, int64_t b) {
    tile_sums(x, w, y, m, k, n, a, b);
  });
}

// out = bf16(bf16(sums) (+ bias, rounded)) for n values; n a multiple of 16
AVX512 void round_sums(const float* sums, const bf16* bias, bf16* out, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512 v = round_bf16_ps(_mm512_loadu_ps(sums + j));
    if (bias != nullptr) v = _mm512_add_ps(v, load_bf16(bias + j));
    _mm256_storeu_si256((__m256i*)(out + j), pack_bf16(v));
  }
}

// x += bf16(bf16(sums) (+ bias, rounded)) for n values; n a multiple of 16
AVX512 void add_sums(const float* sums, const bf16* bias, bf16* x, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512 v = round_bf16_ps(_mm512_loadu_ps(sums + j));
    if (bias != nullptr) v = round_bf16_ps(_mm512_add_ps(v, load_bf16(bias + j)));
    _mm256_storeu_si256((__m256i*)(x + j), pack_bf16(_mm512_add_ps(load_bf16(x + j), v)));
  }
}

// one head's RoPE in place: x * cos + rotate_half(x) * sin, each product rounded, the sum rounded
AVX512 void rope_head(bf16* v, const bf16* cs, const bf16* sn, int64_t d) {
  const int64_t half = d / 2;
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (int64_t j = 0; j < half; j += 16) {
    __m512 lo = load_bf16(v + j), hi = load_bf16(v + half + j);
    __m512 lo_out = _mm512_add_ps(round_bf16_ps(_mm512_mul_ps(lo, load_bf16(cs + j))),
                                  round_bf16_ps(_mm512_mul_ps(_mm512_xor_ps(hi, sign), load_bf16(sn + j))));
    __m512 hi_out = _mm512_add_ps(round_bf16_ps(_mm512_mul_ps(hi, load_bf16(cs + half + j))),
                                  round_bf16_ps(_mm512_mul_ps(lo, load_bf16(sn + half + j))));
    _mm256_storeu_si256((__m256i*)(v + j), pack_bf16(lo_out));
    _mm256_storeu_si256((__m256i*)(v + half + j), pack_bf16(hi_out));
  }
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

// out[h][16 c .. 16 (c + CB)) = bf16(sum_t p[h][t] v[t] * inv[h]) for NH heads, each lane summed over t in order
template <int NH, int CB>
AVX512 void weigh_values(const float* scores, const bf16* values, int64_t len, int64_t d, int64_t c, const float* inv,
                         bf16* out) {
  __m512 acc[NH][CB];
  for (int hd = 0; hd < NH; ++hd)
    for (int u = 0; u < CB; ++u) acc[hd][u] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    const bf16* vt = values + t * d + 16 * c;
    for (int u = 0; u < CB; ++u) {
      __m512 v = load_bf16(vt + 16 * u);
      for (int hd = 0; hd < NH; ++hd) acc[hd][u] = _mm512_fmadd_ps(_mm512_set1_ps(scores[hd * len + t]), v, acc[hd][u]);
    }
  }
  for (int hd = 0; hd < NH; ++hd)
    for (int u = 0; u < CB; ++u)
      _mm256_storeu_si256((__m256i*)(out + hd * d + 16 * (c + u)),
                          pack_bf16(_mm512_mul_ps(acc[hd][u], _mm512_set1_ps(inv[hd]))));
}

// NH query heads of one KV group over keys [0, len): out[h] (bf16) = softmax(q[h] . k * scale) @ v,
// d a multiple of 32, q and out heads d apart, scores [NH][len]. A head's arithmetic is the same for
// any NH (the heads share only the loads of keys and values), so grouping never changes a bit.
template <int NH>
AVX512 void attend_heads(const bf16* q, const bf16* keys, const bf16* values, int64_t len, int64_t d, float scale,
                         float* scores, bf16* out) {
  float best[NH];
  for (int hd = 0; hd < NH; ++hd) best[hd] = -INFINITY;
  int64_t t = 0;
  for (; t + 4 <= len; t += 4) {  // four keys at a time: one shuffle tree sums their lanes
    __m512 acc[NH][4];
    for (int hd = 0; hd < NH; ++hd)
      for (int u = 0; u < 4; ++u) acc[hd][u] = _mm512_setzero_ps();
    for (int64_t j = 0; j < d; j += 32)
      for (int u = 0; u < 4; ++u) {
        __m512bh kv = (__m512bh)_mm512_loadu_si512(keys + (t + u) * d + j);
        for (int hd = 0; hd < NH; ++hd)
          acc[hd][u] = _mm512_dpbf16_ps(acc[hd][u], (__m512bh)_mm512_loadu_si512(q + hd * d + j), kv);
      }
    for (int hd = 0; hd < NH; ++hd) {
      __m128 s4 = _mm_mul_ps(sum4(acc[hd]), _mm_set1_ps(scale));
      _mm_storeu_ps(scores + hd * len + t, s4);
      __m128 m2 = _mm_max_ps(s4, _mm_movehl_ps(s4, s4));
      best[hd] = std::max(best[hd], _mm_cvtss_f32(_mm_max_ps(m2, _mm_shuffle_ps(m2, m2, 1))));
    }
  }
  for (; t < len; ++t)
    for (int hd = 0; hd < NH; ++hd) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t j = 0; j < d; j += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + hd * d + j),
                               (__m512bh)_mm512_loadu_si512(keys + t * d + j));
      scores[hd * len + t] = _mm512_reduce_add_ps(acc) * scale;
      best[hd] = std::max(best[hd], scores[hd * len + t]);
    }
  float inv[NH];
  for (int hd = 0; hd < NH; ++hd) {
    float* row = scores + hd * len;
    __m512 vbest = _mm512_set1_ps(best[hd]), vsum = _mm512_setzero_ps();
    t = 0;
    for (; t + 16 <= len; t += 16) {
      __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(row + t), vbest));
      _mm512_storeu_ps(row + t, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    float total = _mm512_reduce_add_ps(vsum);
    for (; t < len; ++t) {
      row[t] = std::exp(row[t] - best[hd]);
      total += row[t];
    }
    inv[hd] = 1.f / total;
  }
  // values, four 16-lane chunks of the head dim at a time (then two): NH * 4 independent sums
  int64_t c = 0;
  for (; c + 4 <= d / 16; c += 4) weigh_values<NH, 4>(scores, values, len, d, c, inv, out);
  for (; c < d / 16; c += 2) weigh_values<NH, 2>(scores, values, len, d, c, inv, out);
}

using AttendFn = void (*)(const bf16*, const bf16*, const bf16*, int64_t, int64_t, float, float*, bf16*);
constexpr int64_t MAX_GROUP = 4;  // query heads sharing one pass over their group's keys
const AttendFn ATTEND[MAX_GROUP + 1] = {nullptr, attend_heads<1>, attend_heads<2>, attend_heads<3>, attend_heads<4>};

// The kernels a decode step runs over: AVX512-BF16 (above) or AVX2 + FMA (decode_avx2.h); both
// round where the Python layer loop rounds.
struct Avx512Kernels {
  static constexpr int64_t MAX_GROUP = ::MAX_GROUP;
  static void rms_norm(const bf16* x, const bf16* w, bf16* out, int64_t h, float eps) { prefixrag::rms_norm(x, w, out, h, eps); }
  static void gemv(Team& team, const bf16* x, const bf16* w, float* y, int64_t m, int64_t k, int64_t n) {
    ::gemv(team, x, w, y, m, k, n);
  }
  static void round_sums(const float* sums, const bf16* bias, bf16* out, int64_t n) { ::round_sums(sums, bias, out, n); }
  static void add_sums(const float* sums, const bf16* bias, bf16* x, int64_t n) { ::add_sums(sums, bias, x, n); }
  static void rope_head(bf16* v, const bf16* cs, const bf16* sn, int64_t d) { ::rope_head(v, cs, sn, d); }
  static void silu_mul(const float* sums, bf16* out, int64_t n) { ::silu_mul(sums, out, n); }
  static AttendFn attend(int64_t heads) { return ATTEND[heads]; }
};

struct Avx2Kernels {
  static constexpr int64_t MAX_GROUP = avx2::MAX_GROUP;
  static void rms_norm(const bf16* x, const bf16* w, bf16* out, int64_t h, float eps) { avx2::rms_norm(x, w, out, h, eps); }
  static void gemv(Team& team, const bf16* x, const bf16* w, float* y, int64_t m, int64_t k, int64_t n) {
    avx2::gemv(team, x, w, y, m, k, n);
  }
  static void round_sums(const float* sums, const bf16* bias, bf16* out, int64_t n) { avx2::round_sums(sums, bias, out, n); }
  static void add_sums(const float* sums, const bf16* bias, bf16* x, int64_t n) { avx2::add_sums(sums, bias, x, n); }
  static void rope_head(bf16* v, const bf16* cs, const bf16* sn, int64_t d) { avx2::rope_head(v, cs, sn, d); }
  static void silu_mul(const float* sums, bf16* out, int64_t n) { avx2::silu_mul(sums, out, n); }
  static AttendFn attend(int64_t heads) { return avx2::ATTEND[heads]; }
};

const bf16* ptr(const torch::Tensor& t) { return reinterpret_cast<const bf16*>(t.data_ptr()); }

// a weight packed in column tiles [n / 16, k / 2, 16, 2]: its n and k
int64_t columns(const torch::Tensor& w) { return w.size(0) * TILE_COLS; }
int64_t inputs(const torch::Tensor& w) { return w.size(1) * 2; }

void check_tiles(const torch::Tensor& w, int64_t n, int64_t k) {
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16 && w.dim() == 4 && w.is_contiguous() && w.size(2) == TILE_COLS &&
                  w.size(3) == 2 && columns(w) == n && inputs(w) == k,
              "a weight must be bf16 packed in column tiles [", n, " / 16, ", k, " / 2, 16, 2]");
}

// The Linears' weights a decode step multiplies by: a matrix is the list of tensors Python passes
// for it (engine/native/decode.py), checked once against the shape the model expects.
struct Bf16Matrices {  // bfloat16 column tiles, the prefill's packed copy
  using Matrix = torch::Tensor;
  static Matrix make(const std::vector<torch::Tensor>& parts, int64_t n, int64_t k) {
    TORCH_CHECK(parts.size() == 1, "a bfloat16 matrix is one tensor of column tiles");
    check_tiles(parts[0], n, k);
    return parts[0];
  }
  static int64_t columns_of(const std::vector<torch::Tensor>& parts) { return columns(parts.at(0)); }
  template <class K>
  static void gemv(Team& team, const bf16* x, const Matrix& w, float* y, int64_t m) {
    K::gemv(team, x, ptr(w), y, m, inputs(w), columns(w));
  }
};

struct Int8Matrices {  // int8 digits in VNNI column tiles (int8_tiles.h), int8_linear's arithmetic
  using Matrix = Int8Matrix;
  static Matrix make(const std::vector<torch::Tensor>& parts, int64_t n, int64_t k) { return int8_matrix(parts, n, k); }
  static int64_t columns_of(const std::vector<torch::Tensor>& parts) { return int8_columns(parts); }
  template <class K>
  static void gemv(Team& team, const bf16* x, const Matrix& w, float* y, int64_t m) {
    int8_gemv(team, x, w, y, m);
  }
};

// A model's decode step over kernels K and matrices M: weights held once, in the form the prefill
// reads them (bfloat16) or beside it (int8). ``step_and_hidden`` also returns the last layer's hidden
// states (int8's logits are rescored from them in float, engine.quant.linear.rescore_top).
template <class K, class M>
class DecodeModel {
  using Matrix = typename M::Matrix;
  using Parts = std::vector<torch::Tensor>;
  struct Layer {
    torch::Tensor in_norm, post_norm, bqkv, bo;
    Matrix wqkv, wo, wgu, wdown;
  };

 public:
  // layers: per layer [in_norm], [post_norm], wqkv, [bqkv], wo, [bo], wgu, wdown, each a list of tensors
  DecodeModel(std::vector<std::vector<Parts>> layers, torch::Tensor final_norm, Parts lm_head, int64_t heads,
              int64_t kv_heads, int64_t head_dim, double eps, double scale)
      : final_norm_(final_norm), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(float(eps)),
        scale_(float(scale)) {
    TORCH_CHECK(!layers.empty(), "a model has layers");
    hidden_ = final_norm.numel();
    TORCH_CHECK(layers[0].size() == 8 && layers[0][7].size() >= 1, "a layer is 8 entries");
    const int64_t qkv_n = (heads_ + 2 * kv_heads_) * head_dim_;
    inter_ = M::columns_of(layers[0][6]) / 2;
    TORCH_CHECK(head_dim_ % 32 == 0 && hidden_ % 32 == 0 && inter_ % 32 == 0 && head_dim_ <= 256 &&
                    heads_ % kv_heads_ == 0,
                "native decode needs the head dim, hidden and intermediate sizes in multiples of 32");
    for (auto& l : layers) {
      TORCH_CHECK(l.size() == 8, "a layer is 8 entries (norms, wqkv, bqkv, wo, bo, wgu, wdown)");
      for (int i : {0, 1, 3, 5}) TORCH_CHECK(l[i].size() == 1, "a norm or bias entry is one tensor");
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

  // x [m, hidden] bf16 embeddings of the new tokens, cos/sin [m, head_dim] bf16 at each row's
  // position, k/v stores per row, pasts: each row's position. Returns float32 logits [m, vocab] and
  // the hidden states [m, hidden] bf16 before the final norm.
  std::vector<torch::Tensor> step_and_hidden(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, std::vector<torch::Tensor> k_stores,
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
      for (int64_t i = 0; i < m; ++i) K::rms_norm(xs + i * h, ptr(L.in_norm), normed.data() + i * h, h, eps_);
      M::template gemv<K>(team, normed.data(), L.wqkv, sums.data(), m);
      const bf16* bqkv = L.bqkv.numel() > 0 ? ptr(L.bqkv) : nullptr;
      for (int64_t i = 0; i < m; ++i) K::round_sums(sums.data() + i * qkv_n, bqkv, qkv.data() + i * qkv_n, qkv_n);
      rope(qkv.data(), cs, sn, m, qkv_n);
      write_kv(qkv.data(), k_stores, v_stores, pasts, li, qkv_n);
      attention(team, qkv.data(), k_stores, v_stores, pasts, li, qkv_n, longest, attn.data());
      project_add(team, attn.data(), L.wo, L.bo, xs, sums.data(), m, h);
      for (int64_t i = 0; i < m; ++i) K::rms_norm(xs + i * h, ptr(L.post_norm), normed.data() + i * h, h, eps_);
      M::template gemv<K>(team, normed.data(), L.wgu, sums.data(), m);
      for (int64_t i = 0; i < m; ++i) K::silu_mul(sums.data() + i * 2 * inter_, act.data() + i * inter_, inter_);
      project_add(team, act.data(), L.wdown, no_bias_, xs, sums.data(), m, h);
    }
    for (int64_t i = 0; i < m; ++i) K::rms_norm(xs + i * h, ptr(final_norm_), normed.data() + i * h, h, eps_);
    auto logits = torch::empty({m, vocab_}, torch::kFloat32);
    // the float32 sums, as the prefill's tiled lm_head gives them (engine.native.linear)
    M::template gemv<K>(team, normed.data(), lm_head_[0], logits.data_ptr<float>(), m);
    return {logits, x};
  }

 private:
  // q and k heads rotate in place: x * cos + rotate_half(x) * sin, each product and the sum rounded
  void rope(bf16* qkv, const bf16* cs, const bf16* sn, int64_t m, int64_t qkv_n) const {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t hh = 0; hh < heads_ + kv_heads_; ++hh)
        K::rope_head(qkv + i * qkv_n + hh * head_dim_, cs + i * head_dim_, sn + i * head_dim_, head_dim_);
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

  // per row, each KV group's query heads in batches that share the loads of the group's keys, when the
  // rows give every thread several batches; else one head per task (the bits are the same either way)
  void attention(Team& team, const bf16* qkv, std::vector<torch::Tensor>& ks, std::vector<torch::Tensor>& vs,
                 const std::vector<int64_t>& pasts, size_t layer, int64_t qkv_n, int64_t longest, bf16* out) const {
    const int64_t d = head_dim_, m = int64_t(pasts.size()), group = heads_ / kv_heads_;
    const int64_t batch = m * kv_heads_ >= 4 * team.threads() ? std::min(group, K::MAX_GROUP) : 1;
    const int64_t batches = (group + batch - 1) / batch;  // per KV group
    team.parallel(m * kv_heads_ * batches, [&](int64_t a, int64_t b) {
      std::vector<float> scores(batch * longest);
      for (int64_t task = a; task < b; ++task) {
        int64_t i = task / (kv_heads_ * batches), g = task / batches % kv_heads_, first = (task % batches) * batch;
        int64_t hh = g * group + first, n = std::min(batch, group - first);
        K::attend(n)(qkv + i * qkv_n + hh * d, slot(ks[i], layer, g, 0), slot(vs[i], layer, g, 0), pasts[i] + 1, d, scale_,
                  scores.data(), out + (i * heads_ + hh) * d);
      }
    });
  }

  // x += bf16(in @ w^T (+ bias)), each step rounded as the Python path rounds it
  static void project_add(Team& team, const bf16* in, const Matrix& w, const torch::Tensor& bias, bf16* x, float* sums,
                          int64_t m, int64_t h) {
    M::template gemv<K>(team, in, w, sums, m);
    const bf16* b = bias.numel() > 0 ? ptr(bias) : nullptr;
    for (int64_t i = 0; i < m; ++i) K::add_sums(sums + i * h, b, x + i * h, h);
  }

  std::vector<Layer> layers_;
  std::vector<Matrix> lm_head_;  // one: a Matrix has no empty state
  std::unique_ptr<Team> team_;
  std::mutex step_mutex_;
  torch::Tensor final_norm_, no_bias_ = torch::empty({0}, torch::kBFloat16);
  int64_t heads_, kv_heads_, head_dim_, hidden_ = 0, inter_ = 0, vocab_ = 0;
  float eps_, scale_;
};

}  // namespace

template <class K, class M>
void bind_model(pybind11::module_& mod, const char* name) {
  using Parts = std::vector<torch::Tensor>;
  pybind11::class_<DecodeModel<K, M>>(mod, name)
      .def(pybind11::init<std::vector<std::vector<Parts>>, torch::Tensor, Parts, int64_t, int64_t, int64_t, double,
                          double>())
      .def("step", &DecodeModel<K, M>::step, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("step_and_hidden", &DecodeModel<K, M>::step_and_hidden, pybind11::call_guard<pybind11::gil_scoped_release>());
}

void bind_decode_step(pybind11::module_& mod) {
  bind_model<Avx512Kernels, Bf16Matrices>(mod, "DecodeModel");
  bind_model<Avx2Kernels, Bf16Matrices>(mod, "DecodeModelAvx2");
  bind_model<Avx512Kernels, Int8Matrices>(mod, "DecodeModelInt8");
}
