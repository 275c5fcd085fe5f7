// One pure-decode forward of a known architecture in native code, for radixchat/engine/lean.py.
//
// A decode step of a small model on a CPU spends as long in its glue as in its weights: ~80 small ops a layer
// (norms, RoPE, residual adds, views, the K/V write) called from Python, each a few microseconds of interpreter
// and dispatcher. This runs the lean forward's layer loop here, for every stream of the step at once, and gives
// the same bits as the lean forward (and so as the transformers model):
// - the products, the attention and the reductions are the very ops the lean forward calls (the native products
//   and paged_decode or paged_extend through the dispatcher, at::mean and the activations through ATen);
// - the elementwise arithmetic around them (RoPE's two products and sum, the norms' scaling, residual adds, the
//   gate times up, the K/V rounding to the pool's dtype) is one IEEE operation per element as in torch's
//   kernels, written here without fused multiply-adds (fp-contract off), so each result rounds as torch's does.
// tests/engine/test_lean.py checks the logits bit for bit against the lean forward.
//
// Weights come as one flat list, LAYER_TENSORS per layer then the final norm and the head (see lean.py, where
// the list is built); an absent tensor (a norm the architecture lacks, a bias) is an empty one.
#pragma GCC optimize("fp-contract=off")

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace radixchat {
namespace {

constexpr int64_t LAYER_TENSORS = 27;  // 6 norms, then 7 products of 3 (codes or weight, scales, bias)
constexpr int64_t PRODUCTS = 7;        // q, k, v, o, gate, up, down

enum Kind : int64_t { INT4_GEMV = 0, INT4_DOT8 = 1, INT8_GEMV = 2, INT8_DOT8 = 3, F16 = 4, BF16 = 5, F32 = 6, F32X8 = 7 };
enum Act : int64_t { SILU = 0, GELU_TANH = 1 };
enum QKNorm : int64_t { NO_QK_NORM = 0, QK_NORM = 1 };

using Product = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);

c10::TypedOperatorHandle<Product> product_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Product>();
}

using Decode = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, double, int64_t);
using Extend = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, const at::Tensor&, double, int64_t);

struct Ops {
  c10::TypedOperatorHandle<Product> kernels[4];
  c10::TypedOperatorHandle<Decode> decode;
  c10::TypedOperatorHandle<Extend> extend;
};

const Ops& ops() {
  auto& d = c10::Dispatcher::singleton();
  static const Ops o{{product_op("radixchat::int4_gemv"), product_op("radixchat::int4_dot8"),
                      product_op("radixchat::int8_gemv"), product_op("radixchat::int8_dot8")},
                     d.findSchemaOrThrow("radixchat::paged_decode", "").typed<Decode>(),
                     d.findSchemaOrThrow("radixchat::paged_extend", "").typed<Extend>()};
  return o;
}

bool present(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

// x [B, K] (float32, contiguous) times one product's weights, as weights.py's kernel of that kind computes it:
// [B, N] float32.
at::Tensor product(const at::Tensor& x, int64_t kind, const at::Tensor& a, const at::Tensor& b,
                   const at::Tensor& bias) {
  at::Tensor y;
  const c10::optional<at::Tensor> with_bias = present(bias) ? c10::optional<at::Tensor>(bias) : c10::nullopt;
  if (kind <= INT8_DOT8) {
    y = ops().kernels[kind].call(x, a, b);
  } else if (kind == F32X8) {
    // weights._dense_mm_rows8: at least 8 rows (zeros after), so the BLAS sums in one order
    const int64_t B = x.size(0);
    const at::Tensor rows = B < 8 ? at::cat({x, x.new_zeros({8 - B, x.size(1)})}) : x;
    return at::linear(rows, a, with_bias).slice(0, 0, B);
  } else if (kind == F32) {
    // weights._dense_mm: F.linear with the bias, on the [1, B, K] rows the lean forward hands it
    return at::linear(x.unsqueeze(0), a, with_bias)[0];
  } else {
    const auto half = kind == F16 ? at::kHalf : at::kBFloat16;  // weights._half
    y = at::linear(x.unsqueeze(0).to(half), a)[0].to(at::kFloat);
  }
  return present(bias) ? y + bias : y;
}

// The lean forward's RMS norm of each row of `x` [R, D] (in place into `out`): x * rsqrt(mean(x^2) + eps), times
// `w` (the norm's effective weight: a Gemma norm's 1 + w). The mean is ATen's, as the lean forward's is.
void rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& out) {
  const int64_t R = x.size(0), D = x.size(1);
  at::Tensor sq = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* sp = sq.data_ptr<float>();
  for (int64_t i = 0; i < R * D; ++i) sp[i] = xp[i] * xp[i];
  const at::Tensor mean = at::mean(sq, {-1}, true);
  const float* mp = mean.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  for (int64_t r = 0; r < R; ++r) {
    const float inv = 1.0f / std::sqrt(mp[r] + feps);
    for (int64_t d = 0; d < D; ++d) op[r * D + d] = wp[d] * (xp[r * D + d] * inv);
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor out = at::empty_like(x);
  rms_norm(x, w, eps, out);
  return out;
}

// HF's apply_rotary_pos_emb in place on x [B, H, D]: x * cos + rotate_half(x) * sin, with cos and sin [B, D].
void rope(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  std::vector<float> row(D);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      float* v = xp + (b * H + h) * D;
      const float* c = cp + b * D;
      const float* s = sp + b * D;
      for (int64_t d = 0; d < D; ++d) row[d] = v[d];
      for (int64_t d = 0; d < half; ++d) v[d] = row[d] * c[d] + (-row[d + half]) * s[d];
      for (int64_t d = half; d < D; ++d) v[d] = row[d] * c[d] + row[d - half] * s[d];
    }
  }
}

template <typename T>
void write_slots(const at::Tensor& src, at::Tensor& pool, const int64_t* slots, int64_t B) {
  const int64_t row = src.size(1) * src.size(2);
  const float* s = src.data_ptr<float>();
  T* p = pool.data_ptr<T>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < row; ++i) p[slots[b] * row + i] = static_cast<T>(s[b * row + i]);
}

// The new tokens' K or V [B, Hkv, D] into the pool at their slots, rounded to its dtype (index_copy_ of .to()).
void write_pool(const at::Tensor& src, at::Tensor& pool, const at::Tensor& slots) {
  TORCH_CHECK(pool.is_contiguous() && pool.size(1) * pool.size(2) == src.size(1) * src.size(2), "decode_step: pool");
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t B = src.size(0);
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK(sp[b] >= 0 && sp[b] < pool.size(0), "decode_step: slot out of range");
  switch (pool.scalar_type()) {
    case at::kFloat: write_slots<float>(src, pool, sp, B); break;
    case at::kHalf: write_slots<at::Half>(src, pool, sp, B); break;
    case at::kBFloat16: write_slots<at::BFloat16>(src, pool, sp, B); break;
    default: TORCH_CHECK(false, "decode_step: the pool must be float32, bfloat16 or float16");
  }
}

void add_into(at::Tensor& acc, const at::Tensor& x) {
  float* a = acc.data_ptr<float>();
  const float* b = x.data_ptr<float>();
  for (int64_t i = 0, n = acc.numel(); i < n; ++i) a[i] = a[i] + b[i];
}

at::Tensor contiguous_f32(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, "decode_step: activations must be float32");
  return t.contiguous();
}

// h: the embedded tokens [B, H]; rope: cos then sin [B, D] per rope table, layer_rope[l] the table of layer l;
// w: the weights (above); kinds: each product's kernel (PRODUCTS per layer, then the head's); k, v: the pool's
// per-layer tensors; out_slots [B], slots [B, L], lens [B]: attention's metadata (attention.AttentionBatch);
// q_starts and q_lens empty: attention is paged_decode's, else paged_extend's with each stream a one-token extend
// (deterministic inference: a decoded token attends as a prefilled one does), lens then its key counts.
// cfg: heads, kv heads, head_dim, act, qk_norm, then each layer's sliding window (0: none); fcfg: eps, the
// attention's scaling, the final logit softcap (0: none). Returns the logits [B, vocab] float32.
at::Tensor decode_step(const at::Tensor& h_in, at::TensorList rope_tables, at::IntArrayRef layer_rope, at::TensorList w,
                       at::IntArrayRef kinds, at::TensorList k_pool, at::TensorList v_pool, const at::Tensor& out_slots,
                       const at::Tensor& slots, const at::Tensor& lens, const at::Tensor& q_starts,
                       const at::Tensor& q_lens, at::IntArrayRef cfg, at::ArrayRef<double> fcfg) {
  const int64_t L = static_cast<int64_t>(layer_rope.size());
  TORCH_CHECK(cfg.size() == static_cast<size_t>(5 + L) && fcfg.size() == 3, "decode_step: config");
  TORCH_CHECK(static_cast<int64_t>(w.size()) == L * LAYER_TENSORS + 4, "decode_step: weights");
  TORCH_CHECK(static_cast<int64_t>(kinds.size()) == L * PRODUCTS + 1, "decode_step: kinds");
  TORCH_CHECK(static_cast<int64_t>(k_pool.size()) == L && static_cast<int64_t>(v_pool.size()) == L, "decode_step: pool");
  TORCH_CHECK(h_in.dim() == 2 && out_slots.scalar_type() == at::kLong && out_slots.is_contiguous() &&
                  out_slots.size(0) == h_in.size(0),
              "decode_step: one slot per token");
  const int64_t heads = cfg[0], kv_heads = cfg[1], D = cfg[2], act = cfg[3], qk_norm = cfg[4];
  const double eps = fcfg[0], scaling = fcfg[1], softcap = fcfg[2];
  const int64_t B = h_in.size(0);
  const bool extend = present(q_starts);
  TORCH_CHECK(!extend || (q_starts.numel() == B && q_lens.numel() == B), "decode_step: one extend per stream");
  at::Tensor h = contiguous_f32(h_in).clone();
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* t = w.data() + l * LAYER_TENSORS;
    const int64_t* kind = kinds.data() + l * PRODUCTS;
    auto mm = [&](int64_t p, const at::Tensor& x) { return product(x, kind[p], t[6 + 3 * p], t[7 + 3 * p], t[8 + 3 * p]); };
    const at::Tensor& cos = rope_tables[2 * layer_rope[l]];
    const at::Tensor& sin = rope_tables[2 * layer_rope[l] + 1];
    const bool sandwich = present(t[2]);
    // attention
    const at::Tensor x = rms_norm(h, t[0], eps);
    at::Tensor q = contiguous_f32(mm(0, x)).view({B, heads, D});
    at::Tensor k = contiguous_f32(mm(1, x)).view({B, kv_heads, D});
    at::Tensor v = contiguous_f32(mm(2, x)).view({B, kv_heads, D});
    if (qk_norm == QK_NORM) {
      at::Tensor q2 = q.view({B * heads, D}), k2 = k.view({B * kv_heads, D});
      rms_norm(q2.clone(), t[4], eps, q2);
      rms_norm(k2.clone(), t[5], eps, k2);
    }
    rope(q, cos, sin);
    rope(k, cos, sin);
    at::Tensor kp = k_pool[l], vp = v_pool[l];
    write_pool(k, kp, out_slots);
    write_pool(v, vp, out_slots);
    const at::Tensor attn = extend ? ops().extend.call(q, kp, vp, slots, q_starts, q_lens, lens, scaling, cfg[5 + l])
                                   : ops().decode.call(q, kp, vp, slots, lens, scaling, cfg[5 + l]);
    at::Tensor o = contiguous_f32(mm(3, attn.view({B, heads * D})));
    if (sandwich) o = rms_norm(o, t[1], eps);
    add_into(h, o);
    // MLP
    const at::Tensor y = rms_norm(h, sandwich ? t[2] : t[1], eps);
    at::Tensor gate = contiguous_f32(mm(4, y));
    const at::Tensor up = contiguous_f32(mm(5, y));
    gate = act == GELU_TANH ? at::gelu(gate, "tanh") : at::silu(gate);
    {
      float* g = gate.data_ptr<float>();
      const float* u = up.data_ptr<float>();
      for (int64_t i = 0, n = gate.numel(); i < n; ++i) g[i] = g[i] * u[i];
    }
    at::Tensor down = contiguous_f32(mm(6, gate));
    if (sandwich) down = rms_norm(down, t[3], eps);
    add_into(h, down);
  }
  const at::Tensor* tail = w.data() + L * LAYER_TENSORS;
  at::Tensor logits = product(rms_norm(h, tail[0], eps), kinds[L * PRODUCTS], tail[1], tail[2], tail[3]);
  if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
  return logits;
}

}  // namespace
}  // namespace radixchat

TORCH_LIBRARY_FRAGMENT(radixchat, m) {
  m.def(
      "decode_step(Tensor h, Tensor[] rope, int[] layer_rope, Tensor[] weights, int[] kinds, Tensor[] k, Tensor[] v, "
      "Tensor out_slots, Tensor slots, Tensor lens, Tensor q_starts, Tensor q_lens, int[] cfg, float[] fcfg) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixchat, CPU, m) { m.impl("decode_step", &radixchat::decode_step); }
