// Products with quantized weights, for radixchat/engine/weights.py.
//
// int4_gemv: a few rows times 4-bit codes in the layout of torch's CPU int4 matmul (packed models, and the int4
// format), for decode steps. Each thread streams whole 64-row blocks of codes once, multiplies the codes (0..15)
// with the activations rounded to bfloat16, sums a group of 32 inputs in float32, and only then applies the
// group's scale and offset: offset * sum(x) for the group, so the inner loop is one multiply-add per code and row.
// A row's sums run in the same order however many rows come with it (its result does not depend on its batch).
//
// int4_dot8: the same codes times activations rounded to 8 bits, in integer dot products (AVX-512 VNNI), for
// packed models' chat turns and prefill chunks (below).
//
// int8_gemv: a few rows times 8-bit codes (GGUF's Q8_0), for LM heads (below).
//
// int8_dot8: 8-bit codes with a scale and a minimum per group times activations rounded to 8 bits, in integer dot
// products, for the int8 format's layers (below).
//
// int4_dequant: the weights back to a bfloat16 matrix, for prefill chunks.
//
// A packed model (radixchat/engine/packed.py) keeps its linear layers only as 4-bit codes: the int4 matmul
// streams them in a decode step, but for a prefill chunk of hundreds of rows a bfloat16 GEMM is faster
// (docs/benchmarks.md section 12).
// This unpacks one layer into a reused bfloat16 buffer, transposed ([K, N]: each code byte gives 64 consecutive
// outputs, so every loop is a straight vector loop), at close to memory speed; a chunk pays one pass over the
// codes instead of the int4 kernel's per-row work.
//
// Layout (torch._convert_weight_to_int4pack_for_cpu, checked against torch at load by
// radixchat/engine/weights.py): rows in blocks of 64; block b is [K][32] bytes, byte j of column k holding
// row b*64+j in its low nibble and row b*64+32+j in its high one. Scales and offsets are [K/32][N][2]
// bfloat16, and a weight is (code - 8) * scale + offset.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace radixchat {
namespace {

constexpr int64_t BLOCK_N = 64;
constexpr int64_t GROUP = 32;

// float to bfloat16, rounded to nearest even (finite values), in integer operations the compiler vectorizes.
inline uint16_t bf16(float w) {
  uint32_t bits;
  std::memcpy(&bits, &w, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// A layer's group scales, [K/32][N][P] bfloat16: P = 2, a (scale, offset) pair per group and output, as torch's int4
// matmul takes them; or P = 1, the scale alone, where every offset is 0 (a symmetric file format's groups, GGUF's
// Q4_0: a tenth fewer bytes for a decode step to read).
struct Scales {
  const at::BFloat16* p;
  int64_t N, P;
  const at::BFloat16* at(int64_t g, int64_t n) const { return p + (g * N + n) * P; }
  float scale(int64_t g, int64_t n) const { return static_cast<float>(*at(g, n)); }
  float offset(int64_t g, int64_t n) const { return P == 2 ? static_cast<float>(at(g, n)[1]) : 0.0f; }
};

Scales scales_of(const at::Tensor& sz) {
  TORCH_CHECK(sz.size(2) == 1 || sz.size(2) == 2, "int4 scales must be [K/32, N, 2] or [K/32, N, 1]");
  return Scales{sz.data_ptr<at::BFloat16>(), sz.size(1), sz.size(2)};
}

at::Tensor int4_dequant(const at::Tensor& packed, const at::Tensor& sz, at::Tensor out) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "int4_dequant: packed must be uint8");
  TORCH_CHECK(sz.scalar_type() == at::kBFloat16 && sz.is_contiguous() && sz.dim() == 3, "int4_dequant: bad sz");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.dim() == 2, "int4_dequant: bad out");
  const int64_t K = out.size(0), N = out.size(1);  // out is the transposed weight, [K, N]
  TORCH_CHECK(N % BLOCK_N == 0 && K % GROUP == 0, "int4_dequant: N must be a multiple of 64, K of 32");
  TORCH_CHECK(packed.numel() == N * K / 2 && sz.size(0) == K / GROUP && sz.size(1) == N, "int4_dequant: shapes");
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const Scales s = scales_of(sz);
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t groups = K / GROUP, blocks = N / BLOCK_N;
  at::parallel_for(0, blocks * groups, 1, [&](int64_t begin, int64_t end) {
    float scale[BLOCK_N], offset[BLOCK_N];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / groups, g = item % groups;
      for (int64_t c = 0; c < BLOCK_N; ++c) {
        const int64_t n = b * BLOCK_N + c;
        scale[c] = s.scale(g, n);
        offset[c] = s.offset(g, n) - 8.0f * scale[c];
      }
      for (int64_t kk = 0; kk < GROUP; ++kk) {
        const int64_t k = g * GROUP + kk;
        const uint8_t* src = p + (b * K + k) * 32;  // 32 bytes: rows c (low nibble) and c + 32 (high)
        uint16_t* dst = o + k * N + b * BLOCK_N;  // 64 consecutive rows of column k
        for (int64_t c = 0; c < 32; ++c) dst[c] = bf16(static_cast<float>(src[c] & 15) * scale[c] + offset[c]);
        for (int64_t c = 0; c < 32; ++c) {
          dst[32 + c] = bf16(static_cast<float>(src[c] >> 4) * scale[32 + c] + offset[32 + c]);
        }
      }
    }
  });
  return out;
}

// x [M, K]; returns [M, N] float32. Rows are taken in tiles of up to ROWS; a tile's codes are unpacked once per
// input and multiplied into each of its rows. A row's arithmetic is the same in every tile (batch invariance).
constexpr int64_t ROWS = 4;

// f(std::integral_constant<int64_t, R>{}, r0) for each tile of R <= ROWS rows starting at row r0.
template <typename F>
void each_tile(int64_t M, F&& f) {
  for (int64_t r0 = 0; r0 < M; r0 += ROWS) {
    switch (std::min(ROWS, M - r0)) {
      case 1: f(std::integral_constant<int64_t, 1>{}, r0); break;
      case 2: f(std::integral_constant<int64_t, 2>{}, r0); break;
      case 3: f(std::integral_constant<int64_t, 3>{}, r0); break;
      default: f(std::integral_constant<int64_t, 4>{}, r0); break;
    }
  }
}

// The rows of a product with 4-bit codes as float32 [M, K], once its arguments are checked.
at::Tensor int4_rows(const char* op, const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& sz) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), op, ": packed must be uint8");
  TORCH_CHECK(sz.scalar_type() == at::kBFloat16 && sz.is_contiguous() && sz.dim() == 3, op, ": bad sz");
  TORCH_CHECK(x_in.dim() == 2, op, ": x must be [M, K]");
  at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t K = x.size(1), N = sz.size(1);
  TORCH_CHECK(N % BLOCK_N == 0 && K % GROUP == 0, op, ": N must be a multiple of 64, K of 32");
  TORCH_CHECK(packed.numel() == N * K / 2 && sz.size(0) == K / GROUP, op, ": shapes");
  return x;
}

// f(its codes, its first row) for each block of 64 rows of the codes, the blocks shared among the threads.
template <typename F>
void each_block(const at::Tensor& packed, int64_t N, int64_t K, F&& f) {
  const uint8_t* p = packed.data_ptr<uint8_t>();
  at::parallel_for(0, N / BLOCK_N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) f(p + b * K * 32, b * BLOCK_N);
  });
}

// How far ahead of its stream of codes each decode product prefetches them into L2 (bytes; 0: only int4_gemv's
// own 512 bytes into L1, below). Which distance pays is the machine's and the kernel's (docs/benchmarks.md section
// 12): engine/prefetch.py measures each, and sets it with set_prefetch.
enum Streamer { INT4_GEMV, INT4_DOT8, INT8_DOT8, INT8_GEMV, STREAMERS };
constexpr const char* STREAMER_NAMES[STREAMERS] = {"int4_gemv", "int4_dot8", "int8_dot8", "int8_gemv"};
std::atomic<int64_t> prefetch_ahead[STREAMERS] = {};

inline int64_t code_prefetch(Streamer kernel) { return prefetch_ahead[kernel].load(std::memory_order_relaxed); }

#if defined(__AVX512F__)
// Software prefetches for the products that stream the codes from memory (decode steps): the (strided: [K/32][N][P])
// scales and offsets of the block's group PREFETCH_GROUPS ahead, which the hardware prefetchers do not follow, and
// for int4_gemv the codes PREFETCH_CODES bytes ahead too (int4_dot8 lost more than it gained from that).
constexpr int64_t PREFETCH_CODES = 512, PREFETCH_GROUPS = 2;

// The LINES cache lines from p + ahead, into L2 (at ahead 0, the lines about to be loaded: nothing to fetch).
template <int LINES>
inline void prefetch_codes(const void* p, int64_t ahead) {
  for (int l = 0; l < LINES; ++l) _mm_prefetch(static_cast<const char*>(p) + ahead + 64 * l, _MM_HINT_T1);
}

inline void prefetch_scales(const Scales& s, int64_t n0, int64_t g, int64_t groups) {
  if (g + PREFETCH_GROUPS >= groups) return;
  const char* p = reinterpret_cast<const char*>(s.at(g + PREFETCH_GROUPS, n0));
  for (int j = 0; j < 2 * s.P; ++j) _mm_prefetch(p + 64 * j, _MM_HINT_T0);
}

// Group g's scales and offsets (0 for P = 1) of the 64 outputs from n0.
inline void load_scales(const Scales& s, int64_t n0, int64_t g, __m512 (&scale)[4], __m512 (&offset)[4]) {
  if (s.P == 2) {  // one 32-bit (scale, offset) pair per output
    const int32_t* sg = reinterpret_cast<const int32_t*>(s.at(g, n0));
    for (int j = 0; j < 4; ++j) {
      const __m512i pairs = _mm512_loadu_si512(sg + 16 * j);
      scale[j] = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
      offset[j] = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(-65536)));
    }
    return;
  }
  const __m256i* sg = reinterpret_cast<const __m256i*>(s.at(g, n0));
  for (int j = 0; j < 4; ++j) {
    scale[j] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(sg + j)), 16));
    offset[j] = _mm512_setzero_ps();
  }
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
// AVX-512 BF16: one vdpbf16ps multiplies two inputs' codes (k, k + 1) of 16 outputs with the two activations
// rounded to bfloat16. A code q becomes the bfloat16 128 + q by putting the byte 0x43 above it (0x43qq): one byte
// permute (vpermt2b) per 16 outputs pairs the codes of inputs k and k + 1 and puts 0x43 between them, in the
// outputs' own order. The group's sums hold 128 * sum(x) too; it comes off with the offset: out += acc * scale +
// sum(x) * (offset - 136 * scale), 136 = 128 + the kernel's 8. The activations are bfloat16 as in torch's int4
// matmul.
template <int64_t R>
void gemv_block(const uint8_t* codes, const Scales& s, const uint16_t* xb, const float* xsum, float* y,
                int64_t K, int64_t n0, int64_t ldy) {
  // byte 4i: code of output i (input k), 4i + 2: of input k + 1 (32 bytes on); 4i + 1, 4i + 3: 0x43 (table 2)
  alignas(64) uint8_t pick[2][64];
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 16; ++i) {
      pick[h][4 * i] = static_cast<uint8_t>(16 * h + i);
      pick[h][4 * i + 2] = static_cast<uint8_t>(32 + 16 * h + i);
      pick[h][4 * i + 1] = pick[h][4 * i + 3] = 64;
    }
  const __m512i PICK0 = _mm512_load_si512(pick[0]), PICK1 = _mm512_load_si512(pick[1]);
  const __m512i HI_BYTE = _mm512_set1_epi8(0x43), NIBBLE = _mm512_set1_epi8(15);
  const int64_t groups = K / GROUP;
  const int64_t ahead = code_prefetch(INT4_GEMV);
  __m512 out[R][4];
  for (int64_t r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) out[r][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[R][4];
    for (int64_t r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    prefetch_scales(s, n0, g, groups);
    const uint8_t* src = codes + g * GROUP * 32;
    for (int64_t kk = 0; kk < GROUP; kk += 2, src += 64) {
      if (ahead == 0)
        _mm_prefetch(reinterpret_cast<const char*>(src) + PREFETCH_CODES, _MM_HINT_T0);
      else
        prefetch_codes<1>(src, ahead);
      const __m512i v = _mm512_loadu_si512(src);  // inputs k (bytes 0..31) and k + 1 (32..63)
      const __m512i lo = _mm512_and_si512(v, NIBBLE), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), NIBBLE);
      const __m512i w[4] = {
          _mm512_permutex2var_epi8(lo, PICK0, HI_BYTE),  // outputs 0..15
          _mm512_permutex2var_epi8(lo, PICK1, HI_BYTE),  // 16..31
          _mm512_permutex2var_epi8(hi, PICK0, HI_BYTE),  // 32..47
          _mm512_permutex2var_epi8(hi, PICK1, HI_BYTE),  // 48..63
      };
      const int64_t k = g * GROUP + kk;
      for (int64_t r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, xb + r * K + k, sizeof pair);
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)w[j], xv);
      }
    }
    __m512 scale[4], offset[4];
    load_scales(s, n0, g, scale, offset);
    for (int j = 0; j < 4; ++j) {
      const __m512 off = _mm512_fnmadd_ps(_mm512_set1_ps(136.0f), scale[j], offset[j]);
      for (int64_t r = 0; r < R; ++r) {
        const __m512 xs = _mm512_set1_ps(xsum[r * groups + g]);
        out[r][j] = _mm512_fmadd_ps(acc[r][j], scale[j], _mm512_fmadd_ps(xs, off, out[r][j]));
      }
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + r * ldy + n0 + 16 * j, out[r][j]);
}
#else
// Portable: the same sums in float32 (the compiler vectorizes the loops over the 64 outputs).
template <int64_t R>
void gemv_block(const uint8_t* codes, const Scales& s, const uint16_t* xb, const float* xsum, float* y,
                int64_t K, int64_t n0, int64_t ldy) {
  float out[R][BLOCK_N] = {};
  const int64_t groups = K / GROUP;
  for (int64_t g = 0; g < groups; ++g) {
    float acc[R][BLOCK_N] = {};
    for (int64_t kk = 0; kk < GROUP; ++kk) {
      const int64_t k = g * GROUP + kk;
      const uint8_t* src = codes + k * 32;
      float w[BLOCK_N];
      for (int64_t c = 0; c < 32; ++c) {
        w[c] = static_cast<float>(src[c] & 15);
        w[32 + c] = static_cast<float>(src[c] >> 4);
      }
      for (int64_t r = 0; r < R; ++r) {
        uint32_t bits = static_cast<uint32_t>(xb[r * K + k]) << 16;
        float xv;
        std::memcpy(&xv, &bits, sizeof xv);
        for (int64_t c = 0; c < BLOCK_N; ++c) acc[r][c] += w[c] * xv;
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const float xs = xsum[r * groups + g];
      for (int64_t c = 0; c < BLOCK_N; ++c) {
        const float scale = s.scale(g, n0 + c);
        out[r][c] += acc[r][c] * scale + (s.offset(g, n0 + c) - 8.0f * scale) * xs;
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) std::memcpy(y + r * ldy + n0, out[r], sizeof out[r]);
}
#endif

at::Tensor int4_gemv(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& sz) {
  const at::Tensor x = int4_rows("int4_gemv", x_in, packed, sz);
  const int64_t M = x.size(0), K = x.size(1), N = sz.size(1), groups = K / GROUP;
  // the activations rounded to bfloat16, and each row's sum of them over each group of inputs
  std::vector<uint16_t> xb(M * K);
  std::vector<float> xsum(M * groups);
  const float* xp = x.data_ptr<float>();
  for (int64_t i = 0; i < M * groups; ++i) {
    float total = 0.0f;
    for (int64_t c = 0; c < GROUP; ++c) {
      const uint16_t h = bf16(xp[i * GROUP + c]);
      xb[i * GROUP + c] = h;
      uint32_t bits = static_cast<uint32_t>(h) << 16;
      float v;
      std::memcpy(&v, &bits, sizeof v);
      total += v;
    }
    xsum[i] = total;
  }
  at::Tensor y = x.new_empty({M, N});
  const Scales s = scales_of(sz);
  float* yp = y.data_ptr<float>();
  each_block(packed, N, K, [&](const uint8_t* codes, int64_t n0) {
    each_tile(M, [&](auto rows, int64_t r0) {
      gemv_block<decltype(rows)::value>(codes, s, xb.data() + r0 * K, xsum.data() + r0 * groups, yp + r0 * N, K, n0,
                                        N);
    });
  });
  return y;
}

// int4_dot8: the same codes times activations rounded to 8 bits: per row and half group (16 inputs), a scale d =
// max|x| / 127 and integer codes round(x / d) (llama.cpp rounds per 32 inputs; per 16 keeps more of a model's
// top-1 tokens, at a small cost in speed: bench/quality.py, docs/benchmarks.md section 12). Integer dot
// products: one AVX-512 VNNI vpdpbusd multiplies four inputs' codes (0..15, unsigned) of 16 outputs with four
// activation codes (signed) and adds them into exact 32-bit sums; each half group's sum is scaled by its d, and the
// group's by its scale: out += scale * (d0 * sum0 + d1 * sum1) + offset' * sum(x rounded), offset' = offset - 8 *
// scale. Twice the products per instruction of int4_gemv's vdpbf16ps, and one byte permute per 16 outputs and four
// inputs instead of two: chat turns of tens of rows and prefill chunks (compute-bound there) go faster. Rows are
// independent (batch-invariant), as in int4_gemv.
constexpr int64_t HALF = GROUP / 2;

#if defined(__AVX512VNNI__)
// The two 8-bit products' shared steps. acc[r][j] += 16 outputs' codes of four inputs (w[j], unsigned) times row r's
// activation codes of those inputs (from k on), in one vpdpbusd per output vector.
template <int64_t R>
inline void dot4(__m512i (&acc)[R][4], const __m512i (&w)[4], const int8_t* xq, int64_t K, int64_t k) {
  for (int64_t r = 0; r < R; ++r) {
    int32_t quad;
    std::memcpy(&quad, xq + r * K + k, sizeof quad);
    const __m512i xv = _mm512_set1_epi32(quad);
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], w[j], xv);
  }
}

// R rows times a block of 64 outputs, into y: codes4(k, w) gives the codes of inputs k..k+3 as dot4 takes them,
// scales(g, scale, minimum) group g's 64 scales and minimums (a weight is code * scale + minimum). Per group, each
// half's integer sums times the row's activation scale for it (the first half's kept in part, in L1: the registers
// hold the next half's sums), times the group's scale, plus its minimum times the sum of the row's rounded
// activations. The running sums live in y (L1-resident).
template <int64_t R, typename Codes, typename Scales>
void dot8_tile(Codes codes4, Scales scales, const int8_t* xq, const float* xd, const float* xsum,
               float* y, int64_t K, int64_t ldy) {
  const int64_t groups = K / GROUP;
  alignas(64) float part[R][BLOCK_N];
  for (int64_t r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + r * ldy + 16 * j, _mm512_setzero_ps());
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t half = 0; half < 2; ++half) {
      __m512i acc[R][4];
      for (int64_t r = 0; r < R; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_si512();
      const int64_t k0 = g * GROUP + half * HALF;
#pragma GCC unroll 4
      for (int64_t kk = 0; kk < HALF; kk += 4) {
        __m512i w[4];
        codes4(k0 + kk, w);
        dot4<R>(acc, w, xq, K, k0 + kk);
      }
      const float* d = xd + 2 * g + half;  // row r's: d[r * 2 * groups]
      if (half == 0) {
        for (int64_t r = 0; r < R; ++r) {
          const __m512 dr = _mm512_set1_ps(d[r * 2 * groups]);
          for (int j = 0; j < 4; ++j)
            _mm512_store_ps(part[r] + 16 * j, _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][j]), dr));
        }
        continue;
      }
      __m512 scale[4], minimum[4];
      scales(g, scale, minimum);
      for (int j = 0; j < 4; ++j)
        for (int64_t r = 0; r < R; ++r) {
          const __m512 gsum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][j]), _mm512_set1_ps(d[r * 2 * groups]),
                                              _mm512_load_ps(part[r] + 16 * j));
          float* out = y + r * ldy + 16 * j;
          const __m512 sum =
              _mm512_fmadd_ps(_mm512_set1_ps(xsum[r * groups + g]), minimum[j], _mm512_loadu_ps(out));
          _mm512_storeu_ps(out, _mm512_fmadd_ps(gsum, scale[j], sum));
        }
    }
  }
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
// Four inputs' codes of a block's 64 outputs, as vpdpbusd takes them: w[j] holds outputs 16j..16j+15, bytes 4i..4i+3
// output i's codes of inputs k..k+3, i.e. byte i of each 32-byte input row (v0: k, k + 1; v1: k + 2, k + 3). Low
// nibbles are outputs 0..31, high ones 32..63.
struct Nibbles {
  __m512i pick0, pick1, nibble = _mm512_set1_epi8(15);
  Nibbles() {
    alignas(64) uint8_t pick[2][64];
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 4; ++j) pick[h][4 * i + j] = static_cast<uint8_t>(32 * j + 16 * h + i);
    pick0 = _mm512_load_si512(pick[0]);
    pick1 = _mm512_load_si512(pick[1]);
  }
  // src: the codes of input k
  void codes4(const uint8_t* src, __m512i (&w)[4]) const {
    const __m512i v0 = _mm512_loadu_si512(src), v1 = _mm512_loadu_si512(src + 64);
    const __m512i p0 = _mm512_permutex2var_epi8(v0, pick0, v1), p1 = _mm512_permutex2var_epi8(v0, pick1, v1);
    w[0] = _mm512_and_si512(p0, nibble);                         // outputs 0..15
    w[1] = _mm512_and_si512(p1, nibble);                         // 16..31
    w[2] = _mm512_and_si512(_mm512_srli_epi16(p0, 4), nibble);  // 32..47
    w[3] = _mm512_and_si512(_mm512_srli_epi16(p1, 4), nibble);  // 48..63
  }
};

// A group's 64 scales and offsets less 8 scales (a weight is code * scale + offset').
inline void group_scales(const Scales& s, int64_t n0, int64_t g, __m512 (&scale)[4], __m512 (&offset)[4]) {
  load_scales(s, n0, g, scale, offset);
  for (int j = 0; j < 4; ++j) offset[j] = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), scale[j], offset[j]);
}

template <int64_t R>
void dot8_block(const uint8_t* codes, const Scales& s, const int8_t* xq, const float* xd, const float* xsum,
                float* y, int64_t K, int64_t n0, int64_t ldy) {
  const Nibbles nib;
  const int64_t groups = K / GROUP;
  // the functors by value: copies the compiler keeps in registers (through a reference, every store to y may
  // change them)
  const int64_t ahead = code_prefetch(INT4_DOT8);
  dot8_tile<R>(
      [=](int64_t k, __m512i(&w)[4]) {
        prefetch_codes<2>(codes + k * 32, ahead);
        nib.codes4(codes + k * 32, w);
      },
      [=](int64_t g, __m512(&scale)[4], __m512(&offset)[4]) {
        prefetch_scales(s, n0, g, groups);
        group_scales(s, n0, g, scale, offset);
      },
      xq, xd, xsum, y + n0, K, ldy);
}
#else
// Portable: the same integer sums and the same scaling, in plain loops over the 64 outputs.
template <int64_t R>
void dot8_block(const uint8_t* codes, const Scales& s, const int8_t* xq, const float* xd, const float* xsum,
                float* y, int64_t K, int64_t n0, int64_t ldy) {
  float out[R][BLOCK_N] = {};
  const int64_t groups = K / GROUP;
  for (int64_t g = 0; g < groups; ++g) {
    float gsum[R][BLOCK_N] = {};
    for (int64_t half = 0; half < 2; ++half) {
      int32_t acc[R][BLOCK_N] = {};
      for (int64_t k = g * GROUP + half * HALF; k < g * GROUP + (half + 1) * HALF; ++k) {
        const uint8_t* src = codes + k * 32;
        int32_t w[BLOCK_N];
        for (int64_t c = 0; c < 32; ++c) {
          w[c] = src[c] & 15;
          w[32 + c] = src[c] >> 4;
        }
        for (int64_t r = 0; r < R; ++r) {
          const int32_t xv = xq[r * K + k];
          for (int64_t c = 0; c < BLOCK_N; ++c) acc[r][c] += w[c] * xv;
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const float d = xd[r * 2 * groups + 2 * g + half];
        for (int64_t c = 0; c < BLOCK_N; ++c) gsum[r][c] += static_cast<float>(acc[r][c]) * d;
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      const float xs = xsum[r * groups + g];
      for (int64_t c = 0; c < BLOCK_N; ++c) {
        const float scale = s.scale(g, n0 + c);
        const float offset = s.offset(g, n0 + c) - 8.0f * scale;
        out[r][c] += gsum[r][c] * scale + xs * offset;
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) std::memcpy(y + r * ldy + n0, out[r], sizeof out[r]);
}
#endif

// Each row's activations rounded per 16 inputs: codes round(x / d), d = max|x| / 127; and per group of 32, the sum of
// the rounded activations (d times the codes' sum, over both halves).
struct Rounded {
  std::vector<int8_t> q;
  std::vector<float> d, sum;
};

Rounded round8(const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1);
  Rounded out{std::vector<int8_t>(M * K), std::vector<float>(M * K / HALF), std::vector<float>(M * K / GROUP, 0.0f)};
  const float* xp = x.data_ptr<float>();
  // rows side by side on the threads (a prefill chunk's hundreds of rows); a row's arithmetic is the same
  at::parallel_for(0, M, 16, [&](int64_t row0, int64_t row1) {
    for (int64_t i = row0 * K / HALF; i < row1 * K / HALF; ++i) {
      const float* xi = xp + i * HALF;
#if defined(__AVX512F__)
      // one vector of 16 inputs; the conversion rounds to nearest even, as nearbyint below
      const __m512 v = _mm512_loadu_ps(xi);
      const float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(inv)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q.data() + i * HALF), _mm512_cvtepi32_epi8(q));
      const int32_t total = _mm512_reduce_add_epi32(q);
#else
      float amax = 0.0f;
      for (int64_t c = 0; c < HALF; ++c) amax = std::max(amax, std::abs(xi[c]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t total = 0;
      for (int64_t c = 0; c < HALF; ++c) {
        const int32_t q = static_cast<int32_t>(std::nearbyint(xi[c] * inv));
        out.q[i * HALF + c] = static_cast<int8_t>(q);
        total += q;
      }
#endif
      out.d[i] = amax / 127.0f;
      out.sum[i / 2] += out.d[i] * static_cast<float>(total);
    }
  });
  return out;
}

// int8_dot8: the int8 format's layers, 8-bit codes (0..255) with a float32 scale and minimum per group of 32 inputs
// (w = code * scale + minimum: a 4-bit grid whose codes span 0..15, GGUF's Q4_1, is every 17th code), times the
// activations rounded as int4_dot8's, in the same integer dot products and with the same scaling. Codes are
// [N/64][K/4][64][4]: four inputs of one output side by side, so one 64-byte load is the four inputs of 16 outputs
// that one vpdpbusd takes, with no permute. Scales are [N/64][K/32][2][64], a group's 64 scales then its 64
// minimums. Rows are independent (batch-invariant).
#if defined(__AVX512VNNI__)
template <int64_t R>
void u8_block(const uint8_t* codes, const float* sc, const int8_t* xq, const float* xd, const float* xsum, float* y,
              int64_t K, int64_t ldy) {
  const int64_t ahead = code_prefetch(INT8_DOT8);
  dot8_tile<R>(
      [=](int64_t k, __m512i(&w)[4]) {
        prefetch_codes<4>(codes + k * BLOCK_N, ahead);
        for (int j = 0; j < 4; ++j) w[j] = _mm512_loadu_si512(codes + k * BLOCK_N + 64 * j);
      },
      [=](int64_t g, __m512(&scale)[4], __m512(&minimum)[4]) {
        for (int j = 0; j < 4; ++j) {
          scale[j] = _mm512_loadu_ps(sc + g * 2 * BLOCK_N + 16 * j);
          minimum[j] = _mm512_loadu_ps(sc + g * 2 * BLOCK_N + BLOCK_N + 16 * j);
        }
      },
      xq, xd, xsum, y, K, ldy);
}
#else
// Portable: the same integer sums and the same scaling, in plain loops over the 64 outputs.
template <int64_t R>
void u8_block(const uint8_t* codes, const float* sc, const int8_t* xq, const float* xd, const float* xsum, float* y,
              int64_t K, int64_t ldy) {
  float out[R][BLOCK_N] = {};
  const int64_t groups = K / GROUP;
  for (int64_t g = 0; g < groups; ++g) {
    float gsum[R][BLOCK_N] = {};
    for (int64_t half = 0; half < 2; ++half) {
      int32_t acc[R][BLOCK_N] = {};
      for (int64_t k = g * GROUP + half * HALF; k < g * GROUP + (half + 1) * HALF; ++k) {
        const uint8_t* src = codes + (k / 4) * 4 * BLOCK_N + k % 4;
        for (int64_t r = 0; r < R; ++r) {
          const int32_t xv = xq[r * K + k];
          for (int64_t c = 0; c < BLOCK_N; ++c) acc[r][c] += static_cast<int32_t>(src[4 * c]) * xv;
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const float d = xd[r * 2 * groups + 2 * g + half];
        for (int64_t c = 0; c < BLOCK_N; ++c) gsum[r][c] += static_cast<float>(acc[r][c]) * d;
      }
    }
    const float* sg = sc + g * 2 * BLOCK_N;
    for (int64_t r = 0; r < R; ++r) {
      const float xs = xsum[r * groups + g];
      for (int64_t c = 0; c < BLOCK_N; ++c) out[r][c] += gsum[r][c] * sg[c] + xs * sg[BLOCK_N + c];
    }
  }
  for (int64_t r = 0; r < R; ++r) std::memcpy(y + r * ldy, out[r], sizeof out[r]);
}
#endif

// From this many rows on, int4_dot8 first unpacks each block's codes into int8_dot8's layout (and its scales to
// float32: the same values), then multiplies every tile of rows there with no permutes: the same sums in the same
// order, so a row's result is the same either way.
constexpr int64_t UNPACK_ROWS = 64;

#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
// One block of 64 rows of int4 codes as u8_block's codes [K/4][64][4] and scales [K/32][2][64].
void unpack_block(const uint8_t* codes, const Scales& s, int64_t K, int64_t n0, uint8_t* q,
                  float* sc) {
  const Nibbles nib;
  for (int64_t k = 0; k < K; k += 4) {
    __m512i w[4];
    nib.codes4(codes + k * 32, w);
    for (int j = 0; j < 4; ++j) _mm512_storeu_si512(q + k * BLOCK_N + 64 * j, w[j]);
  }
  for (int64_t g = 0; g < K / GROUP; ++g) {
    __m512 scale[4], offset[4];
    group_scales(s, n0, g, scale, offset);
    for (int j = 0; j < 4; ++j) {
      _mm512_storeu_ps(sc + g * 2 * BLOCK_N + 16 * j, scale[j]);
      _mm512_storeu_ps(sc + g * 2 * BLOCK_N + BLOCK_N + 16 * j, offset[j]);
    }
  }
}
#endif

at::Tensor int4_dot8(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& sz) {
  const at::Tensor x = int4_rows("int4_dot8", x_in, packed, sz);
  const int64_t M = x.size(0), K = x.size(1), N = sz.size(1), groups = K / GROUP;
  const Rounded xr = round8(x);
  at::Tensor y = x.new_empty({M, N});
  const Scales s = scales_of(sz);
  float* yp = y.data_ptr<float>();
#if defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
  if (M >= UNPACK_ROWS) {
    at::parallel_for(0, N / BLOCK_N, 1, [&](int64_t begin, int64_t end) {
      std::vector<uint8_t> q(K * BLOCK_N);
      std::vector<float> sc(groups * 2 * BLOCK_N);
      for (int64_t b = begin; b < end; ++b) {
        unpack_block(packed.data_ptr<uint8_t>() + b * K * 32, s, K, b * BLOCK_N, q.data(), sc.data());
        each_tile(M, [&](auto rows, int64_t r0) {
          u8_block<decltype(rows)::value>(q.data(), sc.data(), xr.q.data() + r0 * K, xr.d.data() + r0 * K / HALF,
                                          xr.sum.data() + r0 * groups, yp + r0 * N + b * BLOCK_N, K, N);
        });
      }
    });
    return y;
  }
#endif
  each_block(packed, N, K, [&](const uint8_t* codes, int64_t n0) {
    each_tile(M, [&](auto rows, int64_t r0) {
      dot8_block<decltype(rows)::value>(codes, s, xr.q.data() + r0 * K, xr.d.data() + r0 * K / HALF,
                                        xr.sum.data() + r0 * groups, yp + r0 * N, K, n0, N);
    });
  });
  return y;
}

at::Tensor int8_dot8(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& scales) {
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() == 4, "int8_dot8: codes");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.dim() == 4, "int8_dot8: scales");
  TORCH_CHECK(x_in.dim() == 2, "int8_dot8: x must be [M, K]");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), blocks = codes.size(0), N = blocks * BLOCK_N, groups = K / GROUP;
  TORCH_CHECK(K % GROUP == 0 && codes.size(1) == K / 4 && codes.size(2) == BLOCK_N && codes.size(3) == 4,
              "int8_dot8: shapes");
  TORCH_CHECK(scales.size(0) == blocks && scales.size(1) == groups && scales.size(2) == 2 && scales.size(3) == BLOCK_N,
              "int8_dot8: scales");
  const Rounded xr = round8(x);
  at::Tensor y = x.new_empty({M, N});
  const uint8_t* q = codes.data_ptr<uint8_t>();
  const float* sc = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      each_tile(M, [&](auto rows, int64_t r0) {
        u8_block<decltype(rows)::value>(q + b * K * BLOCK_N, sc + b * groups * 2 * BLOCK_N, xr.q.data() + r0 * K,
                                        xr.d.data() + r0 * K / HALF, xr.sum.data() + r0 * groups,
                                        yp + r0 * N + b * BLOCK_N, K, N);
      });
    }
  });
  return y;
}

// int8_gemv: a few rows times 8-bit codes with a float16 scale per group of 32 inputs (GGUF's Q8_0), for LM heads.
// Codes are [N/64][K][64] (64 outputs side by side per input), scales [N/64][K/32][64]. Float32 products and sums
// (a head made from a Q8_0 tensor holds that tensor's exact values), a group's scale applied once per 32 inputs,
// the same arithmetic for a row in every tile: 64 outputs' independent sums (16 outputs would be one chain of
// dependent multiply-adds), in AVX-512 registers where the CPU has it (plain loops elsewhere).
constexpr int64_t Q8_ROWS = 64;

#if defined(__AVX512F__)
// 64 outputs' codes of input k as float32, four vectors of 16.
inline void int8_codes(const int8_t* codes, __m512 (&w)[4]) {
  for (int j = 0; j < 4; ++j)
    w[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * j))));
}

// The group's sums stay in registers (R x 4 vectors), and so do the running outputs of one or two rows (more spill:
// theirs wait in y, L1-resident): out = acc * scale + out once per group, acc = w * x + acc per input, in input order.
template <int64_t R>
void int8_tile(const int8_t* q, const at::Half* sc, const float* x, float* y, int64_t K, int64_t ldy) {
  constexpr bool held = R <= 2;
  const int64_t ahead = code_prefetch(INT8_GEMV);
  __m512 out[held ? R : 1][4];
  for (int64_t r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) {
      if constexpr (held)
        out[r][j] = _mm512_setzero_ps();
      else
        _mm512_storeu_ps(y + r * ldy + 16 * j, _mm512_setzero_ps());
    }
  for (int64_t g = 0; g < K / GROUP; ++g) {
    __m512 acc[R][4];
    for (int64_t r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int64_t k = g * GROUP; k < (g + 1) * GROUP; ++k) {
      __m512 w[4];
      prefetch_codes<1>(q + k * Q8_ROWS, ahead);
      int8_codes(q + k * Q8_ROWS, w);
      for (int64_t r = 0; r < R; ++r) {
        const __m512 xv = _mm512_set1_ps(x[r * K + k]);
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(w[j], xv, acc[r][j]);
      }
    }
    for (int j = 0; j < 4; ++j) {
      const __m512 scale =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + g * Q8_ROWS + 16 * j)));
      for (int64_t r = 0; r < R; ++r) {
        if constexpr (held) {
          out[r][j] = _mm512_fmadd_ps(acc[r][j], scale, out[r][j]);
        } else {
          float* o = y + r * ldy + 16 * j;
          _mm512_storeu_ps(o, _mm512_fmadd_ps(acc[r][j], scale, _mm512_loadu_ps(o)));
        }
      }
    }
  }
  if constexpr (held)
    for (int64_t r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + r * ldy + 16 * j, out[r][j]);
}
#else
template <int64_t R>
void int8_tile(const int8_t* q, const at::Half* sc, const float* x, float* y, int64_t K, int64_t ldy) {
  float out[R][Q8_ROWS] = {};
  for (int64_t g = 0; g < K / GROUP; ++g) {
    float acc[R][Q8_ROWS] = {};
    for (int64_t k = g * GROUP; k < (g + 1) * GROUP; ++k) {
      const int8_t* codes = q + k * Q8_ROWS;
      float w[Q8_ROWS];
      for (int64_t c = 0; c < Q8_ROWS; ++c) w[c] = static_cast<float>(codes[c]);
      for (int64_t r = 0; r < R; ++r) {
        const float xv = x[r * K + k];
        for (int64_t c = 0; c < Q8_ROWS; ++c) acc[r][c] += w[c] * xv;
      }
    }
    float scale[Q8_ROWS];
    for (int64_t c = 0; c < Q8_ROWS; ++c) scale[c] = static_cast<float>(sc[g * Q8_ROWS + c]);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < Q8_ROWS; ++c) out[r][c] += acc[r][c] * scale[c];
  }
  for (int64_t r = 0; r < R; ++r) std::memcpy(y + r * ldy, out[r], sizeof out[r]);
}

#endif

at::Tensor int8_gemv(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& scales) {
  TORCH_CHECK(codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.dim() == 3, "int8_gemv: codes");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.dim() == 3, "int8_gemv: scales");
  TORCH_CHECK(x_in.dim() == 2, "int8_gemv: x must be [M, K]");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1), blocks = codes.size(0), N = blocks * Q8_ROWS;
  TORCH_CHECK(K % GROUP == 0 && codes.size(1) == K && codes.size(2) == Q8_ROWS, "int8_gemv: shapes");
  TORCH_CHECK(scales.size(0) == blocks && scales.size(1) == K / GROUP && scales.size(2) == Q8_ROWS, "int8_gemv: scales");
  at::Tensor y = x.new_empty({M, N});
  const int8_t* q = codes.data_ptr<int8_t>();
  const at::Half* sc = scales.data_ptr<at::Half>();
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int8_t* qb = q + b * K * Q8_ROWS;
      const at::Half* sb = sc + b * (K / GROUP) * Q8_ROWS;
      each_tile(M, [&](auto rows, int64_t r0) {
        int8_tile<decltype(rows)::value>(qb, sb, xp + r0 * K, yp + r0 * N + b * Q8_ROWS, K, N);
      });
    }
  });
  return y;
}

// Sets how far ahead a decode product (by op name) prefetches its codes (bytes, 0: the default); returns the previous
// distance.
int64_t set_prefetch(c10::string_view kernel, int64_t bytes) {
  TORCH_CHECK(bytes >= 0 && bytes <= (1 << 20), "set_prefetch: 0 to 1 MiB");
  for (int i = 0; i < STREAMERS; ++i)
    if (kernel == STREAMER_NAMES[i]) return prefetch_ahead[i].exchange(bytes);
  TORCH_CHECK(false, "set_prefetch: no decode product named ", kernel);
}

}  // namespace
}  // namespace radixchat

TORCH_LIBRARY_FRAGMENT(radixchat, m) {
  m.def("int4_dequant(Tensor packed, Tensor sz, Tensor(a!) out) -> Tensor(a!)");
  m.def("int4_gemv(Tensor x, Tensor packed, Tensor sz) -> Tensor");
  m.def("int8_gemv(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("int4_dot8(Tensor x, Tensor packed, Tensor sz) -> Tensor");
  m.def("int8_dot8(Tensor x, Tensor codes, Tensor scales) -> Tensor");
  m.def("set_prefetch(str kernel, int bytes) -> int", &radixchat::set_prefetch);
}

TORCH_LIBRARY_IMPL(radixchat, CPU, m) {
  m.impl("int4_dequant", &radixchat::int4_dequant);
  m.impl("int4_gemv", &radixchat::int4_gemv);
  m.impl("int8_gemv", &radixchat::int8_gemv);
  m.impl("int4_dot8", &radixchat::int4_dot8);
  m.impl("int8_dot8", &radixchat::int8_dot8);
}
