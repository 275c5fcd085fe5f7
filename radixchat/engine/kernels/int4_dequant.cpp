// int4 weights (the layout of torch's CPU int4 matmul) back to a bfloat16 matrix, for prefill chunks.
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
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

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

at::Tensor int4_dequant(const at::Tensor& packed, const at::Tensor& sz, at::Tensor out) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "int4_dequant: packed must be uint8");
  TORCH_CHECK(sz.scalar_type() == at::kBFloat16 && sz.is_contiguous() && sz.dim() == 3, "int4_dequant: bad sz");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.dim() == 2, "int4_dequant: bad out");
  const int64_t K = out.size(0), N = out.size(1);  // out is the transposed weight, [K, N]
  TORCH_CHECK(N % BLOCK_N == 0 && K % GROUP == 0, "int4_dequant: N must be a multiple of 64, K of 32");
  TORCH_CHECK(packed.numel() == N * K / 2 && sz.size(0) == K / GROUP && sz.size(1) == N, "int4_dequant: shapes");
  const uint8_t* p = packed.data_ptr<uint8_t>();
  const at::BFloat16* s = sz.data_ptr<at::BFloat16>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t groups = K / GROUP, blocks = N / BLOCK_N;
  at::parallel_for(0, blocks * groups, 1, [&](int64_t begin, int64_t end) {
    float scale[BLOCK_N], offset[BLOCK_N];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / groups, g = item % groups;
      for (int64_t c = 0; c < BLOCK_N; ++c) {
        const int64_t n = b * BLOCK_N + c;
        scale[c] = static_cast<float>(s[(g * N + n) * 2]);
        offset[c] = static_cast<float>(s[(g * N + n) * 2 + 1]) - 8.0f * scale[c];
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

}  // namespace
}  // namespace radixchat

TORCH_LIBRARY_FRAGMENT(radixchat, m) {
  m.def("int4_dequant(Tensor packed, Tensor sz, Tensor(a!) out) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(radixchat, CPU, m) {
  m.impl("int4_dequant", &radixchat::int4_dequant);
}
