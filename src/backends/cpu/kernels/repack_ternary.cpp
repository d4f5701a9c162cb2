// The ternary formats' interleaved layout (matmul_ternary.h): every file block decoded to one 2-bit code per element
// (Format<D>'s own decoding, so the repack reads exactly what dequantize reads) and placed in its group's x8 block.
#include <cstring>

#include "backends/cpu/kernels/matmul_ternary.h"
#include "core/error.h"
#include "quant/format_traits.h"

namespace tessera::cpu::detail {
namespace {

// Code u (0..3) of element e of a file block.
int code(const BlockTQ2_0& b, int e) { return format_detail::k_quant_2bit(b.qs, e); }
int code(const BlockTQ1_0& b, int e) { return format_detail::tq1_trit(b.qs, b.qh, e); }

template <DType D>
void repack(const void* rows, int64_t n, int64_t k, void* dst) {
  using F = Format<D>;
  const int64_t kb = k / kQKK;
  const int64_t groups = (n + kGroup - 1) / kGroup;
  const auto* src = static_cast<const uint8_t*>(rows);
  auto* out = static_cast<BlockTQx8*>(dst);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < kb; ++b) {
      BlockTQx8& o = out[g * kb + b];
      std::memset(&o, 0, sizeof(o));  // rows past n: d = 0, so they add nothing
      for (int r = 0; r < kGroup && g * kGroup + r < n; ++r) {
        typename F::Block s;  // a copy: file blocks of 54 or 66 bytes are not aligned for the struct
        std::memcpy(&s, src + ((g * kGroup + r) * kb + b) * F::kBlockBytes, sizeof(s));
        o.d[r] = s.d;
        // Element e: sub-block j = e / 32, register i = (e % 32) / 4, byte 4 r + e % 4 (matmul_ternary.h).
        for (int e = 0; e < kQKK; ++e) {
          const int j = e / 32, i = (e % 32) / 4, p = 4 * r + e % 4;
          o.qs[j][32 * (i / 4) + p] |= static_cast<uint8_t>(code(s, e) << (2 * (i % 4)));
        }
      }
    }
  }
}

}  // namespace

bool is_ternary(DType dtype) { return dtype == DType::TQ1_0 || dtype == DType::TQ2_0; }

uint64_t ternary_repack_bytes(DType dtype, int64_t n, int64_t k) {
  TESSERA_CHECK(is_ternary(dtype), "matmul: dtype {} is not a ternary format", dtype_name(dtype));
  return static_cast<uint64_t>((n + kGroup - 1) / kGroup) * static_cast<uint64_t>(k / kQKK) * sizeof(BlockTQx8);
}

void ternary_repack(DType dtype, const void* rows, int64_t n, int64_t k, void* dst) {
  switch (dtype) {
    case DType::TQ1_0:
      return repack<DType::TQ1_0>(rows, n, k, dst);
    case DType::TQ2_0:
      return repack<DType::TQ2_0>(rows, n, k, dst);
    default:
      fail("matmul: dtype {} is not a ternary format", dtype_name(dtype));
  }
}

}  // namespace tessera::cpu::detail
