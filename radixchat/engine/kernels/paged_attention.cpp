// Decode attention over the KV pool where it lies: each sequence's keys are read through its row of slot
// indices, never gathered into a copy.
//
// One query per sequence (a decode step). The pool is [slots, kv_heads, head_dim] in float32, bfloat16 or
// float16; the query and the output are float32, and so is every sum. The keys of a sequence are cut into
// chunks of CHUNK positions aligned to absolute positions, and each (sequence, kv head, chunk) is one work
// item (split-K, as flash-decoding does, so one long sequence uses every thread); the chunks of a head are
// then combined in position order. Nothing in a row's arithmetic depends on the other rows of the batch,
// on how many threads run, or on which thread takes an item: a row's output is a function of its query and
// its keys alone (batch invariance).
//
// Built once per machine with -march=native by radixchat/engine/kernels/__init__.py; GCC vector extensions
// keep it one source for AVX-512, AVX2 and NEON.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace radixchat {
namespace {

constexpr int64_t CHUNK = 256;  // keys per work item
constexpr int64_t PARALLEL_MIN_KEYS = 4096;  // below this many (key, kv head) pairs, one thread

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
typedef _Float16 vhf __attribute__((vector_size(32)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));

inline vf splat(float x) { return vf{} + x; }

inline vf load16(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vf load16(const at::BFloat16* p) {
  vh h;
  std::memcpy(&h, p, sizeof h);
  vu u = __builtin_convertvector(h, vu) << 16;
  vf f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline vf load16(const at::Half* p) {
#if defined(__AVX512F__)
  __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  vf f;
  std::memcpy(&f, &x, sizeof f);
  return f;
#elif defined(__F16C__)
  __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  vf f;
  std::memcpy(&f, &a, 32);
  std::memcpy(reinterpret_cast<char*>(&f) + 32, &b, 32);
  return f;
#else
  vhf h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vf);
#endif
}

// A fixed summation tree (the same order on every ISA and every call).
inline float hsum(vf v) {
  vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < 16; ++i) m = std::max(m, v[i]);
  return m;
}

// exp(x) for x <= 0 (scores minus their maximum): Cephes' polynomial on x - n*ln2, scaled by 2^n.
inline vf vexp(vf x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  vf t = x * splat(1.44269504088896341f) - splat(0.5f);
  vi n = __builtin_convertvector(t, vi);  // truncation toward zero of t - 0.5 rounds t <= 0 to nearest
  vf nf = __builtin_convertvector(n, vf);
  vf r = x - nf * splat(0.693359375f) + nf * splat(2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  vf y = p * r * r + r + splat(1.0f);
  vu e = (vu)((n + 127) << 23);
  vf scale;
  std::memcpy(&scale, &e, sizeof scale);
  return y * scale;
}

struct Shape {
  int64_t n, hq, hkv, group;  // group: query heads per kv head
  int64_t nv;  // head_dim / 16
  int64_t slot_elems;  // elements of one slot (kv_heads * head_dim)
  int64_t slots_stride;  // elements between two sequences' slot rows
  float scale;
  int64_t window;  // 0: every key
};

constexpr int64_t PREFETCH = 8;  // keys ahead: slots need not be contiguous

inline void prefetch(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char*>(p) + b, 0, 0);
}

// One work item: every head of sequence n over keys [j0, j1). Writes, per query head, the chunk's max
// score, its sum of exp, and its exp-weighted sum of values (head_dim floats). ``scores`` is scratch of
// hq * CHUNK floats.
template <typename T, int NV>
void chunk(const Shape& s, const float* q, const T* kp, const T* vp, const int64_t* srow, int64_t j0, int64_t j1,
           float* part, float* scores) {
  constexpr int64_t D = NV * 16;
  const int64_t R = s.group, H = s.hq, len = j1 - j0;
  const int64_t row_bytes = s.slot_elems * static_cast<int64_t>(sizeof(T));
  for (int64_t j = 0; j < len; ++j) {
    if (j + PREFETCH < len) prefetch(kp + srow[j0 + j + PREFETCH] * s.slot_elems, row_bytes);
    const T* krow = kp + srow[j0 + j] * s.slot_elems;
    for (int64_t g = 0; g < s.hkv; ++g) {
      vf kv[NV];
      for (int i = 0; i < NV; ++i) kv[i] = load16(krow + g * D + i * 16);
      for (int64_t r = 0; r < R; ++r) {
        const float* qr = q + (g * R + r) * D;
        vf acc = load16(qr) * kv[0];
        for (int i = 1; i < NV; ++i) acc += load16(qr + i * 16) * kv[i];
        scores[(g * R + r) * CHUNK + j] = hsum(acc) * s.scale;
      }
    }
  }
  const int64_t padded = (len + 15) / 16 * 16;
  for (int64_t h = 0; h < H; ++h) {
    float* sr = scores + h * CHUNK;
    for (int64_t j = len; j < padded; ++j) sr[j] = -INFINITY;
    vf mv = splat(-INFINITY);
    for (int64_t j = 0; j < padded; j += 16) {
      vf x = load16(sr + j);
      mv = x > mv ? x : mv;
    }
    const float m = hmax(mv);
    vf lv = splat(0.0f);
    for (int64_t j = 0; j < padded; j += 16) {
      vf p = vexp(load16(sr + j) - splat(m));
      if (j + 16 > len) {  // the padding lanes add nothing
        for (int64_t i = len - j; i < 16; ++i) p[i] = 0.0f;
      }
      std::memcpy(sr + j, &p, sizeof p);
      lv += p;
    }
    float* out = part + h * (D + 2);
    out[0] = m;
    out[1] = hsum(lv);
  }
  vf* acc = reinterpret_cast<vf*>(scores + H * CHUNK);  // [H][NV]
  for (int64_t i = 0; i < H * NV; ++i) acc[i] = splat(0.0f);
  for (int64_t j = 0; j < len; ++j) {
    if (j + PREFETCH < len) prefetch(vp + srow[j0 + j + PREFETCH] * s.slot_elems, row_bytes);
    const T* vrow = vp + srow[j0 + j] * s.slot_elems;
    for (int64_t g = 0; g < s.hkv; ++g) {
      vf vv[NV];
      for (int i = 0; i < NV; ++i) vv[i] = load16(vrow + g * D + i * 16);
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = g * R + r;
        const vf p = splat(scores[h * CHUNK + j]);
        for (int i = 0; i < NV; ++i) acc[h * NV + i] += p * vv[i];
      }
    }
  }
  for (int64_t h = 0; h < H; ++h) std::memcpy(part + h * (D + 2) + 2, acc + h * NV, sizeof(vf) * NV);
}

template <typename T, int NV>
void run(const Shape& s, const float* q, const T* kp, const T* vp, const int64_t* slots, const int64_t* lens,
         float* out) {
  constexpr int64_t D = NV * 16;
  const int64_t H = s.hq, part_len = H * (D + 2);
  // Items in order: sequence, then chunk.
  std::vector<int64_t> first(s.n + 1, 0), lo(s.n), c0(s.n);
  int64_t keys = 0;
  for (int64_t n = 0; n < s.n; ++n) {
    const int64_t L = lens[n];
    lo[n] = s.window > 0 ? std::max<int64_t>(0, L - s.window) : 0;
    c0[n] = lo[n] / CHUNK;
    first[n + 1] = first[n] + (L + CHUNK - 1) / CHUNK - c0[n];
    keys += L - lo[n];
  }
  const int64_t items = first[s.n];
  std::vector<float> partial(items * part_len);
  const int threads = keys * s.hkv >= PARALLEL_MIN_KEYS ? at::get_num_threads() : 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<vf> scratch(H * CHUNK / 16 + H * NV);  // scores, then value sums (64-byte aligned)
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t n = std::upper_bound(first.begin(), first.end(), it) - first.begin() - 1;
      const int64_t c = c0[n] + it - first[n];
      const int64_t j0 = std::max(c * CHUNK, lo[n]), j1 = std::min((c + 1) * CHUNK, lens[n]);
      chunk<T, NV>(s, q + n * H * D, kp, vp, slots + n * s.slots_stride, j0, j1, partial.data() + it * part_len,
                   reinterpret_cast<float*>(scratch.data()));
    }
#pragma omp for schedule(static)
    for (int64_t x = 0; x < s.n * H; ++x) {
      const int64_t n = x / H, h = x % H;
      const int64_t chunks = first[n + 1] - first[n];
      auto at = [&](int64_t c) { return partial.data() + (first[n] + c) * part_len + h * (D + 2); };
      float m = -INFINITY;
      for (int64_t c = 0; c < chunks; ++c) m = std::max(m, at(c)[0]);
      float l = 0.0f;
      vf o[NV];
      for (int i = 0; i < NV; ++i) o[i] = splat(0.0f);
      for (int64_t c = 0; c < chunks; ++c) {
        const float* p = at(c);
        const float w = std::exp(p[0] - m);
        l += w * p[1];
        for (int i = 0; i < NV; ++i) o[i] += splat(w) * load16(p + 2 + i * 16);
      }
      float* dst = out + (n * H + h) * D;
      const vf inv = splat(1.0f / l);
      for (int i = 0; i < NV; ++i) {
        vf y = o[i] * inv;
        std::memcpy(dst + i * 16, &y, sizeof y);
      }
    }
  }
}

template <typename T>
void dispatch_dim(const Shape& s, const float* q, const T* kp, const T* vp, const int64_t* slots,
                  const int64_t* lens, float* out) {
  switch (s.nv) {
    case 1: return run<T, 1>(s, q, kp, vp, slots, lens, out);
    case 2: return run<T, 2>(s, q, kp, vp, slots, lens, out);
    case 4: return run<T, 4>(s, q, kp, vp, slots, lens, out);
    case 8: return run<T, 8>(s, q, kp, vp, slots, lens, out);
    case 16: return run<T, 16>(s, q, kp, vp, slots, lens, out);
    default: TORCH_CHECK(false, "paged decode attention: head_dim must be 16, 32, 64, 128 or 256");
  }
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots,
                        const at::Tensor& lens, double scale, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat, "q must be [N, Hq, D] float32");
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type(),
              "k and v must be one [slots, Hkv, D] pool");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous(), "the pool must be contiguous");
  TORCH_CHECK(slots.dim() == 2 && slots.scalar_type() == at::kLong && slots.stride(1) == 1, "slots: [N, L] int64");
  TORCH_CHECK(lens.dim() == 1 && lens.scalar_type() == at::kLong, "lens: [N] int64");
  const at::Tensor qc = q.contiguous(), lc = lens.contiguous();
  Shape s;
  s.n = q.size(0);
  s.hq = q.size(1);
  s.hkv = k.size(1);
  const int64_t D = q.size(2);
  TORCH_CHECK(k.size(2) == D && s.hq % s.hkv == 0, "unsupported head layout");
  TORCH_CHECK(slots.size(0) == s.n && lens.size(0) == s.n, "one slot row and one length per query");
  s.group = s.hq / s.hkv;
  s.nv = D / 16;
  TORCH_CHECK(D % 16 == 0, "head_dim must be a multiple of 16");
  s.slot_elems = s.hkv * D;
  s.slots_stride = slots.stride(0);
  s.scale = static_cast<float>(scale);
  s.window = window;
  const int64_t* lp = lc.data_ptr<int64_t>();
  for (int64_t n = 0; n < s.n; ++n) TORCH_CHECK(lp[n] >= 1 && lp[n] <= slots.size(1), "length out of range");
  at::Tensor out = at::empty({s.n, s.hq, D}, q.options());
  const int64_t* sp = slots.data_ptr<int64_t>();
  switch (k.scalar_type()) {
    case at::kFloat:
      dispatch_dim(s, qc.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), sp, lp, out.data_ptr<float>());
      break;
    case at::kBFloat16:
      dispatch_dim(s, qc.data_ptr<float>(), k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(), sp, lp,
                   out.data_ptr<float>());
      break;
    case at::kHalf:
      dispatch_dim(s, qc.data_ptr<float>(), k.data_ptr<at::Half>(), v.data_ptr<at::Half>(), sp, lp,
                   out.data_ptr<float>());
      break;
    default:
      TORCH_CHECK(false, "the pool must be float32, bfloat16 or float16");
  }
  return out;
}

}  // namespace
}  // namespace radixchat

TORCH_LIBRARY(radixchat, m) {
  m.def("paged_decode(Tensor q, Tensor k, Tensor v, Tensor slots, Tensor lens, float scale, int window) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixchat, CPU, m) { m.impl("paged_decode", &radixchat::paged_decode); }
