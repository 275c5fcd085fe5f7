// Decode attention over the KV pool where it lies: each sequence's keys are read through its row of slot
// indices, never gathered into a copy.
//
// One query per sequence (a decode step). The pool is [slots, kv_heads, head_dim] in float32, bfloat16 or
// float16; the query and the output are float32, and so is every sum. The keys of a sequence are cut into
// chunks of CHUNK positions aligned to absolute positions, and each chunk of a sequence (split-K, as
// flash-decoding does, so one long sequence uses every thread), or a band of its kv heads when there are few
// chunks for the threads, is one work item; the chunks of a head are then combined in position order. Nothing
// in a row's arithmetic depends on the other rows of the batch, on how many threads run, or on which thread
// takes an item: a row's output is a function of its query and its keys alone (batch invariance).
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
#include <array>
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
constexpr int64_t PARALLEL_MIN_KEYS = 512;  // below this many (key, kv head) pairs, one thread

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
#if defined(__AVX512F__)  // one widening load (generic code splits it in halves where GCC prefers 256 bits)
  __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  vf f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#else
  vh h;
  std::memcpy(&h, p, sizeof h);
  vu u = __builtin_convertvector(h, vu) << 16;
  vf f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
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

constexpr int64_t PREFETCH = 32;  // keys ahead: slots need not be contiguous
constexpr int64_t BLOCK = 16;  // keys whose scores one vector holds

// Into L2 (prefetcht1). Into L1 without a cache level (prefetchnta), a block's rows evicted each other before
// their use once they outgrew L1 (32 kv heads: half the speed).
inline void prefetch(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char*>(p) + b, 0, 2);
}

// Sixteen vectors to one: lane j is the sum of x[j]'s lanes, in hsum's tree (lanes l and l+8, then l and l+4,
// then (0+2)+(1+3)), so a score is the same float as one hsum gives. Two shuffles and an add per pair of
// vectors, 15 pairs for 16 dot products, where each hsum is a chain of its own.
inline vf reduce16(const vf* x) {
  vf y[8], z[4], w[2];
  for (int i = 0; i < 8; ++i)
    y[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                   31);
  for (int i = 0; i < 4; ++i)
    z[i] = __builtin_shufflevector(y[2 * i], y[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(y[2 * i], y[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    w[i] = __builtin_shufflevector(z[2 * i], z[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(z[2 * i], z[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// Value sums of heads r .. r + HB over one block's keys: acc[h][i] += p[h][j] * v[j][i], key after key (the
// sum's order is the keys'), the HB * NV sums held in registers across the block.
template <int NV, int HB>
inline void pv_heads(const float* p, const vf* vb, int64_t nb, vf* acc) {
  vf a[HB][NV];
  for (int h = 0; h < HB; ++h)
    for (int i = 0; i < NV; ++i) a[h][i] = acc[h * NV + i];
  for (int64_t j = 0; j < nb; ++j)
    for (int h = 0; h < HB; ++h) {
      const vf w = splat(p[h * CHUNK + j]);
      for (int i = 0; i < NV; ++i) a[h][i] += w * vb[j * NV + i];
    }
  for (int h = 0; h < HB; ++h)
    for (int i = 0; i < NV; ++i) acc[h * NV + i] = a[h][i];
}

// Floats of scratch one work item of `heads` query heads needs: their scores, a block of keys in float32, their
// value sums.
template <int NV>
int64_t scratch_floats(int64_t heads) {
  return heads * CHUNK + BLOCK * NV * 16 + heads * NV * 16;
}

// One work item: the query heads of kv heads [g0, g1) of one sequence, over keys [j0, j1). Writes, per query
// head, the chunk's max score, its sum of exp and its exp-weighted sum of values (head_dim floats), at
// ``part`` + h * (D + 2) (h counted from g0's first head). A block of 16 keys at a time, kv head after kv head
// (so a block reads its rows' slices in address order): the keys are converted to float32 once, each query
// head's 16 dot products are summed into one vector of scores (reduce16), and its value sums stay in
// registers across the block (pv_heads).
template <typename T, int NV>
void chunk(const Shape& s, const float* q, const T* kp, const T* vp, const int64_t* srow, int64_t g0, int64_t g1,
           int64_t j0, int64_t j1, float* part, float* scratch) {
  constexpr int64_t D = NV * 16;
  constexpr int HB = NV >= 16 ? 1 : NV >= 8 ? 2 : 4;  // heads whose value sums fit in registers together
  const int64_t R = s.group, len = j1 - j0, heads = (g1 - g0) * R;
  const int64_t span_bytes = (g1 - g0) * D * static_cast<int64_t>(sizeof(T));
  float* scores = scratch;  // [heads][CHUNK]
  vf* kf = reinterpret_cast<vf*>(scratch + heads * CHUNK);  // [BLOCK][NV]: one kv head's keys, then values
  vf* acc = kf + BLOCK * NV;  // [heads][NV]
  for (int64_t jb = 0; jb < len; jb += BLOCK) {
    const int64_t nb = std::min(BLOCK, len - jb);
    for (int64_t j = 0; j < nb && jb + j + PREFETCH < len; ++j)
      prefetch(kp + srow[j0 + jb + j + PREFETCH] * s.slot_elems + g0 * D, span_bytes);
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t j = 0; j < nb; ++j) {
        const T* krow = kp + srow[j0 + jb + j] * s.slot_elems + g * D;
        for (int i = 0; i < NV; ++i) kf[j * NV + i] = load16(krow + i * 16);
      }
      for (int64_t j = nb; j < BLOCK; ++j)
        for (int i = 0; i < NV; ++i) kf[j * NV + i] = splat(0.0f);  // scores of no key, masked below
      for (int64_t r = 0; r < R; ++r) {
        const float* qr = q + (g * R + r) * D;
        vf dots[BLOCK];
        for (int64_t j = 0; j < BLOCK; ++j) {
          vf x = load16(qr) * kf[j * NV];
          for (int i = 1; i < NV; ++i) x += load16(qr + i * 16) * kf[j * NV + i];
          dots[j] = x;
        }
        const vf sc = reduce16(dots) * splat(s.scale);
        std::memcpy(scores + ((g - g0) * R + r) * CHUNK + jb, &sc, sizeof sc);
      }
    }
  }
  const int64_t padded = (len + 15) / 16 * 16;
  for (int64_t h = 0; h < heads; ++h) {
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
  for (int64_t i = 0; i < heads * NV; ++i) acc[i] = splat(0.0f);
  for (int64_t jb = 0; jb < len; jb += BLOCK) {
    const int64_t nb = std::min(BLOCK, len - jb);
    for (int64_t j = 0; j < nb && jb + j + PREFETCH < len; ++j)
      prefetch(vp + srow[j0 + jb + j + PREFETCH] * s.slot_elems + g0 * D, span_bytes);
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t j = 0; j < nb; ++j) {
        const T* vrow = vp + srow[j0 + jb + j] * s.slot_elems + g * D;
        for (int i = 0; i < NV; ++i) kf[j * NV + i] = load16(vrow + i * 16);
      }
      const int64_t h0 = (g - g0) * R;
      int64_t r = 0;
      for (; r + HB <= R; r += HB) pv_heads<NV, HB>(scores + (h0 + r) * CHUNK + jb, kf, nb, acc + (h0 + r) * NV);
      if constexpr (HB >= 4)
        for (; r + 2 <= R; r += 2) pv_heads<NV, 2>(scores + (h0 + r) * CHUNK + jb, kf, nb, acc + (h0 + r) * NV);
      for (; r < R; ++r) pv_heads<NV, 1>(scores + (h0 + r) * CHUNK + jb, kf, nb, acc + (h0 + r) * NV);
    }
  }
  for (int64_t h = 0; h < heads; ++h) std::memcpy(part + h * (D + 2) + 2, acc + h * NV, sizeof(vf) * NV);
}

template <typename T, int NV>
void run(const Shape& s, const float* q, const T* kp, const T* vp, const int64_t* slots, const int64_t* lens,
         float* out) {
  constexpr int64_t D = NV * 16;
  const int64_t H = s.hq, part_len = H * (D + 2);
  // Chunks in order: sequence, then chunk. A work item is one chunk's kv heads [g0, g1) of one band; when there
  // are few chunks for the threads, each chunk's kv heads are cut into bands, and items run sequence, band,
  // chunk, so that a thread's share of one sequence is whole bands over all its chunks (balanced however its
  // last chunk is cut). Bands change no arithmetic: every head's is its own.
  std::vector<int64_t> first(s.n + 1, 0), lo(s.n), c0(s.n);
  int64_t keys = 0;
  for (int64_t n = 0; n < s.n; ++n) {
    const int64_t L = lens[n];
    lo[n] = s.window > 0 ? std::max<int64_t>(0, L - s.window) : 0;
    c0[n] = lo[n] / CHUNK;
    first[n + 1] = first[n] + (L + CHUNK - 1) / CHUNK - c0[n];
    keys += L - lo[n];
  }
  const int threads = keys * s.hkv >= PARALLEL_MIN_KEYS ? at::get_num_threads() : 1;
  const int64_t bands = first[s.n] >= 4 * threads ? 1 : std::min<int64_t>(s.hkv, threads);
  const int64_t items = first[s.n] * bands;
  std::vector<float> partial(first[s.n] * part_len);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t widest = (s.hkv + bands - 1) / bands * s.group;
    std::vector<vf> scratch(scratch_floats<NV>(widest) / 16);  // 64-byte aligned
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t n = std::upper_bound(first.begin(), first.end(), it / bands) - first.begin() - 1;
      const int64_t chunks = first[n + 1] - first[n], local = it - first[n] * bands;
      const int64_t band = local / chunks, c = local % chunks, cabs = c0[n] + c;
      const int64_t g0 = s.hkv * band / bands, g1 = s.hkv * (band + 1) / bands;
      const int64_t j0 = std::max(cabs * CHUNK, lo[n]), j1 = std::min((cabs + 1) * CHUNK, lens[n]);
      chunk<T, NV>(s, q + n * H * D, kp, vp, slots + n * s.slots_stride, g0, g1, j0, j1,
                   partial.data() + (first[n] + c) * part_len + g0 * s.group * (D + 2),
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


// ---- extend: a prefill chunk's queries, many per sequence, with bfloat16 products ---------------------
//
// Each sequence's new queries over its keys (its cached prefix and the chunk itself), causal from the
// bottom right (query t of q_len sees keys [.., kv_len - q_len + t]), read in place from the pool. At long
// prompts these products are nearly all of a prefill's arithmetic, and float32 SDPA runs them at the CPU's
// float32 peak; here Q·K and P·V take bfloat16 operands with float32 sums (VDPBF16PS where the CPU has
// AVX512_BF16: twice the float32 rate), so this path is for a pool that is half precision anyway (the
// exact path keeps float32 SDPA). The keys are first laid out for the products once per call (pairs of
// bfloat16 along head_dim for Q·K, pairs along the keys for P·V); then each work item (a block of queries
// and one kv head) walks the key chunks in order, every row keeping a running (max, sum, weighted values).
// A row's arithmetic never depends on the other rows of its block or batch.

constexpr int64_t QBLOCK = 32;  // queries per work item (each with its kv head's query heads)
constexpr int64_t GROUP = 16;  // keys per vector lane group

inline uint32_t bf16_bits(float x) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u + 0x7FFF + ((u >> 16) & 1)) >> 16;
}

inline uint32_t pair(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }

// bf16_bits on every lane (the same rounding).
inline vu bf16v(vf x) {
  vu u;
  std::memcpy(&u, &x, 64);
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// The lanes of a and then b as bfloat16 pairs: (a0, a1), (a2, a3), ..., (b14, b15).
inline vu pairs(vf a, vf b) {
  const vu x = bf16v(a), y = bf16v(b);
  const vu even = __builtin_shufflevector(x, y, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const vu odd = __builtin_shufflevector(x, y, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return even | (odd << 16);
}

inline float to_float(float x) { return x; }
inline float to_float(at::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(at::Half x) { return static_cast<float>(x); }

// acc + a·b over the two bfloat16 halves of each 32-bit lane (the high half first, as VDPBF16PS does).
inline vf dot2(vf acc, vu a, vu b) {
#if defined(__AVX512BF16__)
  __m512 r = _mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
  return (vf)r;
#else
  const vu hi_mask = vu{} + 0xFFFF0000u;
  vf ahi, bhi, alo, blo;
  vu t = a & hi_mask;
  std::memcpy(&ahi, &t, 64);
  t = b & hi_mask;
  std::memcpy(&bhi, &t, 64);
  t = a << 16;
  std::memcpy(&alo, &t, 64);
  t = b << 16;
  std::memcpy(&blo, &t, 64);
  acc = acc + ahi * bhi;
  return acc + alo * blo;
#endif
}

inline vu splat_u(uint32_t x) { return vu{} + x; }

struct Extend {
  int64_t hq, hkv, group, d;
  int64_t slot_elems;
  float scale;
  int64_t window;
};

struct Seq {
  int64_t q0, q_len, kv_len;
  const int64_t* slots;
  uint32_t* kp;  // [groups][hkv][d/2][GROUP] pairs along head_dim
  uint32_t* vp;  // [key pairs][hkv][d] pairs along the keys
};

template <typename T>
void layout_chunk(const Extend& e, const T* kpool, const T* vpool, const Seq& s, int64_t c) {
  const int64_t d = e.d, half = d / 2;
  const int64_t j0 = c * CHUNK, j1 = std::min(j0 + CHUNK, s.kv_len);
  const int64_t g_end = (j1 - j0 + GROUP - 1) / GROUP;
  alignas(64) uint32_t row[256 / 2];
  for (int64_t gi = 0; gi < g_end; ++gi) {
    const int64_t group = j0 / GROUP + gi;
    for (int64_t lane = 0; lane < GROUP; ++lane) {
      const int64_t j = group * GROUP + lane;
      for (int64_t h = 0; h < e.hkv; ++h) {
        uint32_t* dst = s.kp + ((group * e.hkv + h) * half) * GROUP + lane;
        if (j >= j1) {
          for (int64_t dp = 0; dp < half; ++dp) dst[dp * GROUP] = 0;
          continue;
        }
        const T* k = kpool + s.slots[j] * e.slot_elems + h * d;
        for (int64_t x = 0; x < d; x += 32) {
          const vu pv = pairs(load16(k + x), load16(k + x + 16));
          std::memcpy(row + x / 2, &pv, 64);
        }
        for (int64_t dp = 0; dp < half; ++dp) dst[dp * GROUP] = row[dp];
      }
    }
  }
  const vf zero = splat(0.0f);
  for (int64_t j = j0; j < j1; j += 2) {
    for (int64_t h = 0; h < e.hkv; ++h) {
      uint32_t* dst = s.vp + ((j / 2) * e.hkv + h) * d;
      const T* v0 = vpool + s.slots[j] * e.slot_elems + h * d;
      const T* v1 = j + 1 < j1 ? vpool + s.slots[j + 1] * e.slot_elems + h * d : nullptr;
      for (int64_t x = 0; x < d; x += 16) {
        const vu lo = bf16v(load16(v0 + x));
        const vu hi = v1 != nullptr ? bf16v(load16(v1 + x)) : bf16v(zero);
        const vu pv = lo | (hi << 16);
        std::memcpy(dst + x, &pv, 64);
      }
    }
  }
}

// A chunk's (max m, sum l, weighted values acc) merged into a row's running ones: the one formula every path
// uses, in chunk order, so a row's result does not depend on whether its chunks ran one after the other or
// side by side.
template <int NV>
inline void merge_into(float& m_run, float& l_run, vf* run, float m, float l, const vf* acc, bool first) {
  if (first) {
    m_run = m;
    l_run = l;
    for (int i = 0; i < NV; ++i) run[i] = acc[i];
    return;
  }
  const float mn = std::max(m_run, m);
  const float wa = std::exp(m_run - mn), wb = std::exp(m - mn);
  l_run = l_run * wa + l * wb;
  for (int i = 0; i < NV; ++i) run[i] = run[i] * splat(wa) + acc[i] * splat(wb);
  m_run = mn;
}

// Rows (query heads of one query, all of one kv head: they see the same keys) over the keys [a, b) of chunk
// c: each row's chunk max, sum and weighted values, merged into its running (m, l, acc) in chunk order, or
// (``part``) kept as [m, l, acc...] per row for a later merge.
// Several rows share every load of a key or value; each row's sums run in the same order whatever rows it
// shares a pass with (over head_dim for a score, over the keys for a weighted value).
template <int NV, int RP>
void extend_rows_chunk(const Extend& e, const Seq& s, int64_t g, int64_t nrows, const uint32_t* const* qp,
                       int64_t c, int64_t a, int64_t b, float* scores, uint32_t* weights, float* m_run,
                       float* l_run, vf* const* acc_run, bool first, float* part = nullptr) {
  constexpr int64_t D = NV * 16, HALF = D / 2, SC = CHUNK;  // scores: one row of SC floats per row
  const int64_t j0 = c * CHUNK;
  const int64_t ga = (a - j0) / GROUP, gb = (b - j0 + GROUP - 1) / GROUP;
  for (int64_t gi = ga; gi < gb; gi += 2) {
    const bool two = gi + 1 < gb;
    const uint32_t* k0 = s.kp + (((j0 / GROUP + gi) * e.hkv + g) * HALF) * GROUP;
    const uint32_t* k1 = two ? k0 + e.hkv * HALF * GROUP : k0;
    vf acc[RP][2];
    for (int r = 0; r < RP; ++r) acc[r][0] = acc[r][1] = splat(0.0f);
    for (int64_t dp = 0; dp < HALF; ++dp) {
      vu kv0, kv1;
      std::memcpy(&kv0, k0 + dp * GROUP, 64);
      std::memcpy(&kv1, k1 + dp * GROUP, 64);
      for (int r = 0; r < RP; ++r) {
        if (r >= nrows) break;
        const vu qv = splat_u(qp[r][dp]);
        acc[r][0] = dot2(acc[r][0], qv, kv0);
        acc[r][1] = dot2(acc[r][1], qv, kv1);
      }
    }
    for (int r = 0; r < nrows; ++r)
      for (int x = 0; x < (two ? 2 : 1); ++x) {
        vf sc = acc[r][x] * splat(e.scale);
        const int64_t base = j0 + (gi + x) * GROUP;
        if (base < a || base + GROUP > b)
          for (int64_t lane = 0; lane < GROUP; ++lane)
            if (base + lane < a || base + lane >= b) sc[lane] = -INFINITY;
        std::memcpy(scores + r * SC + (gi + x) * GROUP, &sc, 64);
      }
  }
  float m[RP], l[RP];
  for (int r = 0; r < nrows; ++r) {
    float* sr = scores + r * SC;
    vf mv = splat(-INFINITY);
    for (int64_t gi = ga; gi < gb; ++gi) {
      const vf x = load16(sr + gi * GROUP);
      mv = x > mv ? x : mv;
    }
    m[r] = hmax(mv);
    vf lv = splat(0.0f);
    for (int64_t gi = ga; gi < gb; ++gi) {
      vf p = vexp(load16(sr + gi * GROUP) - splat(m[r]));
      const int64_t base = j0 + gi * GROUP;
      if (base < a || base + GROUP > b)
        for (int64_t lane = 0; lane < GROUP; ++lane)
          if (base + lane < a || base + lane >= b) p[lane] = 0.0f;
      std::memcpy(sr + gi * GROUP, &p, 64);
      lv += p;
    }
    l[r] = hsum(lv);
    uint32_t* wr = weights + r * (SC / 2);  // the weights as bfloat16 pairs of keys
    for (int64_t gi = ga - (ga & 1); gi < gb; gi += 2) {
      const vf p0 = gi >= ga ? load16(sr + gi * GROUP) : splat(0.0f);
      const vf p1 = gi + 1 < gb ? load16(sr + (gi + 1) * GROUP) : splat(0.0f);
      const vu pv = pairs(p0, p1);
      std::memcpy(wr + gi * GROUP / 2, &pv, 64);
    }
  }
  // P·V in slices of NS vectors of head_dim, so that RP rows' sums of a slice fit the registers and every
  // load of a value vector serves all the rows; a lane's sum runs over the keys in the same order in any slice.
  constexpr int NS = NV < 4 ? NV : 4;
  vf acc[RP][NV];
  const int64_t pa = (a - j0) / 2, pb = (b - j0 + 1) / 2;
  for (int s0 = 0; s0 < NV; s0 += NS) {
    vf part_acc[RP][NS];
    for (int r = 0; r < RP; ++r)
      for (int i = 0; i < NS; ++i) part_acc[r][i] = splat(0.0f);
    for (int64_t jp = pa; jp < pb; ++jp) {
      const uint32_t* vrow = s.vp + (((j0 / 2 + jp) * e.hkv + g) * D) + s0 * 16;
      vu vv[NS];
      for (int i = 0; i < NS; ++i) std::memcpy(&vv[i], vrow + i * 16, 64);
      for (int r = 0; r < RP; ++r) {
        if (r >= nrows) break;
        const vu pp = splat_u(weights[r * (SC / 2) + jp]);
        for (int i = 0; i < NS; ++i) part_acc[r][i] = dot2(part_acc[r][i], pp, vv[i]);
      }
    }
    for (int r = 0; r < RP; ++r)
      for (int i = 0; i < NS; ++i) acc[r][s0 + i] = part_acc[r][i];
  }
  for (int r = 0; r < nrows; ++r) {
    if (part != nullptr) {  // kept for a later merge, in chunk order (split-K)
      float* dst = part + r * (D + 2);
      dst[0] = m[r];
      dst[1] = l[r];
      std::memcpy(dst + 2, acc[r], sizeof(vf) * NV);
      continue;
    }
    merge_into<NV>(m_run[r], l_run[r], acc_run[r], m[r], l[r], acc[r], first);
  }
}

template <int NV, int RP>
void qpairs(const Extend& e, const float* q, const Seq& s, int64_t t, int64_t g, uint32_t* dst) {
  constexpr int64_t D = NV * 16, HALF = D / 2;
  for (int64_t r = 0; r < e.group; ++r) {
    const float* qr = q + ((s.q0 + t) * e.hq + g * e.group + r) * D;
    for (int64_t dp = 0; dp < HALF; ++dp) dst[r * HALF + dp] = pair(qr[2 * dp], qr[2 * dp + 1]);
  }
}

template <typename T, int NV>
void extend_run(const Extend& e, const float* q, const T* kpool, const T* vpool, std::vector<Seq>& seqs,
                float* out) {
  constexpr int64_t D = NV * 16, HALF = D / 2;
  constexpr int RP = 4;  // rows per pass (P·V in slices: their sums fit the registers)
  // (sequence, chunk) pairs to lay out; (sequence, query block, kv head) items to compute. A one-query
  // sequence (a decode step) runs split-K instead: (sequence, chunk, kv head) items side by side, each
  // keeping its chunk's (max, sum, values), merged after, in chunk order, by the same formula.
  std::vector<std::pair<int64_t, int64_t>> chunks, items;
  std::vector<std::array<int64_t, 3>> splits;  // (sequence, chunk, kv head)
  std::vector<int64_t> part_at(seqs.size(), -1), first_chunk(seqs.size(), 0);
  int64_t parts = 0;
  for (int64_t n = 0; n < static_cast<int64_t>(seqs.size()); ++n) {
    const Seq& s = seqs[n];
    const int64_t first_hi = s.kv_len - s.q_len + 1;
    const int64_t lo = e.window > 0 ? std::max<int64_t>(0, first_hi - e.window) : 0;
    const int64_t c0 = lo / CHUNK, c1 = (s.kv_len + CHUNK - 1) / CHUNK;
    for (int64_t c = c0; c < c1; ++c) chunks.push_back({n, c});
    if (s.q_len == 1 && c1 - c0 > 1) {
      part_at[n] = parts;
      first_chunk[n] = c0;
      parts += (c1 - c0) * e.hkv * e.group * (D + 2);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t g = 0; g < e.hkv; ++g) splits.push_back({n, c, g});
      continue;
    }
    for (int64_t b = 0; b * QBLOCK < s.q_len; ++b)
      for (int64_t g = 0; g < e.hkv; ++g) items.push_back({n, b * e.hkv + g});
  }
  std::vector<float> partials(parts);
  const int64_t n_items = static_cast<int64_t>(items.size()), n_work = n_items + static_cast<int64_t>(splits.size());
#pragma omp parallel num_threads(at::get_num_threads())
  {
    // scores and bfloat16 weights of RP rows, then every row's running weighted values
    std::vector<vf> scratch(RP * (CHUNK / 16 + CHUNK / 32) + QBLOCK * e.group * NV);
    float* scores = reinterpret_cast<float*>(scratch.data());
    uint32_t* weights = reinterpret_cast<uint32_t*>(scratch.data() + RP * CHUNK / 16);
    vf* accs = scratch.data() + RP * (CHUNK / 16 + CHUNK / 32);
    std::vector<float> ms(QBLOCK * e.group), ls(QBLOCK * e.group);
    std::vector<uint32_t> qps(QBLOCK * e.group * HALF);
#pragma omp for schedule(static)
    for (size_t i = 0; i < chunks.size(); ++i)
      layout_chunk<T>(e, kpool, vpool, seqs[chunks[i].first], chunks[i].second);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_work; ++i) {
      if (i >= n_items) {  // one chunk of a decode step, kept for the merge below
        const auto [n, c, g] = splits[i - n_items];
        const Seq& s = seqs[n];
        const int64_t lo = e.window > 0 ? std::max<int64_t>(0, s.kv_len - e.window) : 0;
        const int64_t a = std::max(lo, c * CHUNK), bb = std::min(s.kv_len, (c + 1) * CHUNK);
        qpairs<NV, RP>(e, q, s, 0, g, qps.data());
        float* part = partials.data() + part_at[n] + ((c - first_chunk[n]) * e.hkv + g) * e.group * (D + 2);
        for (int64_t r0 = 0; r0 < e.group; r0 += RP) {
          const int64_t nrows = std::min<int64_t>(RP, e.group - r0);
          const uint32_t* qrows[RP];
          for (int64_t r = 0; r < nrows; ++r) qrows[r] = qps.data() + (r0 + r) * HALF;
          extend_rows_chunk<NV, RP>(e, s, g, nrows, qrows, c, a, bb, scores, weights, nullptr, nullptr, nullptr,
                                    false, part + r0 * (D + 2));
        }
        continue;
      }
      const Seq& s = seqs[items[i].first];
      const int64_t b = items[i].second / e.hkv, g = items[i].second % e.hkv;
      const int64_t t0 = b * QBLOCK, t1 = std::min(t0 + QBLOCK, s.q_len);
      const int64_t rows = (t1 - t0) * e.group;
      for (int64_t t = t0; t < t1; ++t) qpairs<NV, RP>(e, q, s, t, g, qps.data() + (t - t0) * e.group * HALF);
      const int64_t hi_last = s.kv_len - s.q_len + t1;  // the block's last query sees keys < this
      const int64_t hi_first = s.kv_len - s.q_len + t0 + 1;
      const int64_t lo_first = e.window > 0 ? std::max<int64_t>(0, hi_first - e.window) : 0;
      for (int64_t c = lo_first / CHUNK; c * CHUNK < hi_last; ++c) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t hi = s.kv_len - s.q_len + t + 1;
          const int64_t lo = e.window > 0 ? std::max<int64_t>(0, hi - e.window) : 0;
          const int64_t a = std::max(lo, c * CHUNK), bb = std::min(hi, (c + 1) * CHUNK);
          if (a >= bb) continue;
          const bool first = a == lo;  // the query's first chunk
          for (int64_t r0 = 0; r0 < e.group; r0 += RP) {
            const int64_t nrows = std::min<int64_t>(RP, e.group - r0);
            const uint32_t* qrows[RP];
            vf* runs[RP];
            const int64_t row0 = (t - t0) * e.group + r0;
            for (int64_t r = 0; r < nrows; ++r) {
              qrows[r] = qps.data() + (row0 + r) * HALF;
              runs[r] = accs + (row0 + r) * NV;
            }
            extend_rows_chunk<NV, RP>(e, s, g, nrows, qrows, c, a, bb, scores, weights, ms.data() + row0,
                                      ls.data() + row0, runs, first);
          }
        }
      }
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t t = t0 + row / e.group, r = row % e.group;
        float* dst = out + ((s.q0 + t) * e.hq + g * e.group + r) * D;
        const vf inv = splat(1.0f / ls[row]);
        for (int i = 0; i < NV; ++i) {
          vf y = accs[row * NV + i] * inv;
          std::memcpy(dst + i * 16, &y, 64);
        }
      }
    }
#pragma omp for schedule(static)
    for (int64_t n = 0; n < static_cast<int64_t>(seqs.size()); ++n) {
      if (part_at[n] < 0) continue;
      const Seq& s = seqs[n];
      const int64_t chunks_n = (s.kv_len + CHUNK - 1) / CHUNK - first_chunk[n];
      for (int64_t g = 0; g < e.hkv; ++g)
        for (int64_t r = 0; r < e.group; ++r) {
          float m = 0.0f, l = 0.0f;
          vf run[NV];
          for (int64_t c = 0; c < chunks_n; ++c) {
            const float* p = partials.data() + part_at[n] + ((c * e.hkv + g) * e.group + r) * (D + 2);
            vf acc[NV];
            std::memcpy(acc, p + 2, sizeof(vf) * NV);
            merge_into<NV>(m, l, run, p[0], p[1], acc, c == 0);
          }
          float* dst = out + (s.q0 * e.hq + g * e.group + r) * D;
          const vf inv = splat(1.0f / l);
          for (int i = 0; i < NV; ++i) {
            vf y = run[i] * inv;
            std::memcpy(dst + i * 16, &y, 64);
          }
        }
    }
  }
}

at::Tensor paged_extend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots,
                        const at::Tensor& q_starts, const at::Tensor& q_lens, const at::Tensor& kv_lens,
                        double scale, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat, "q must be [T, Hq, D] float32");
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes() && k.scalar_type() == v.scalar_type(),
              "k and v must be one [slots, Hkv, D] pool");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous(), "the pool must be contiguous");
  TORCH_CHECK(slots.dim() == 2 && slots.scalar_type() == at::kLong && slots.stride(1) == 1, "slots: [N, L] int64");
  const at::Tensor qc = q.contiguous(), qs = q_starts.contiguous(), ql = q_lens.contiguous(),
                   kl = kv_lens.contiguous();
  Extend e;
  e.hq = q.size(1);
  e.hkv = k.size(1);
  e.d = q.size(2);
  TORCH_CHECK(k.size(2) == e.d && e.hq % e.hkv == 0, "unsupported head layout");
  e.group = e.hq / e.hkv;
  e.slot_elems = e.hkv * e.d;
  e.scale = static_cast<float>(scale);
  e.window = window;
  const int64_t n = slots.size(0);
  TORCH_CHECK(qs.numel() == n && ql.numel() == n && kl.numel() == n, "one start, length and key count per sequence");
  std::vector<Seq> seqs(n);
  std::vector<std::vector<uint32_t>> buffers(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    Seq& s = seqs[i];
    s.q0 = qs.data_ptr<int64_t>()[i];
    s.q_len = ql.data_ptr<int64_t>()[i];
    s.kv_len = kl.data_ptr<int64_t>()[i];
    TORCH_CHECK(s.q_len >= 1 && s.q_len <= s.kv_len && s.kv_len <= slots.size(1), "length out of range");
    TORCH_CHECK(s.q0 >= 0 && s.q0 + s.q_len <= q.size(0), "query range out of range");
    s.slots = slots.data_ptr<int64_t>() + i * slots.stride(0);
    const int64_t groups = (s.kv_len + CHUNK - 1) / CHUNK * (CHUNK / GROUP);
    buffers[2 * i].resize(groups * e.hkv * (e.d / 2) * GROUP);
    buffers[2 * i + 1].resize((groups * GROUP / 2) * e.hkv * e.d);
    s.kp = buffers[2 * i].data();
    s.vp = buffers[2 * i + 1].data();
  }
  at::Tensor out = at::empty({q.size(0), e.hq, e.d}, q.options());
  const float* qp = qc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  auto by_dim = [&](auto tag) {
    using T = decltype(tag);
    const T* kp = reinterpret_cast<const T*>(k.data_ptr());
    const T* vp = reinterpret_cast<const T*>(v.data_ptr());
    switch (e.d / 16) {
      case 1: return extend_run<T, 1>(e, qp, kp, vp, seqs, op);
      case 2: return extend_run<T, 2>(e, qp, kp, vp, seqs, op);
      case 4: return extend_run<T, 4>(e, qp, kp, vp, seqs, op);
      case 8: return extend_run<T, 8>(e, qp, kp, vp, seqs, op);
      case 16: return extend_run<T, 16>(e, qp, kp, vp, seqs, op);
      default: TORCH_CHECK(false, "paged extend attention: head_dim must be 16, 32, 64, 128 or 256");
    }
  };
  TORCH_CHECK(e.d % 16 == 0, "paged extend attention: head_dim must be 16, 32, 64, 128 or 256");
  switch (k.scalar_type()) {
    case at::kFloat: by_dim(float{}); break;
    case at::kBFloat16: by_dim(at::BFloat16{}); break;
    case at::kHalf: by_dim(at::Half{}); break;
    default: TORCH_CHECK(false, "the pool must be float32, bfloat16 or float16");
  }
  return out;
}

}  // namespace
}  // namespace radixchat

TORCH_LIBRARY(radixchat, m) {
  m.def("paged_decode(Tensor q, Tensor k, Tensor v, Tensor slots, Tensor lens, float scale, int window) -> Tensor");
  m.def(
      "paged_extend(Tensor q, Tensor k, Tensor v, Tensor slots, Tensor q_starts, Tensor q_lens, Tensor kv_lens, "
      "float scale, int window) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixchat, CPU, m) {
  m.impl("paged_decode", &radixchat::paged_decode);
  m.impl("paged_extend", &radixchat::paged_extend);
}
