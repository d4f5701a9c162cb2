// Interleaving of quantized weight rows into groups of 8 (WeightLayout::ROWS_X8; layout in matmul_internal.h).
#include <cstring>

#include "backends/cpu/kernels/matmul_internal.h"
#include "backends/cpu/kernels/matmul_kquant.h"
#include "backends/cpu/kernels/matmul_q5iq4.h"
#include "backends/cpu/kernels/matmul_ternary.h"
#include "core/error.h"
#include "quant/blocks.h"

namespace tessera::cpu::detail {
namespace {

// Copies row r's quant bytes (nbytes, a multiple of 4) into lane r of the interleaved qs.
void interleave(uint8_t* dst_qs, int r, const uint8_t* src_qs, int nbytes) {
  for (int c = 0; c < nbytes / 4; ++c) std::memcpy(dst_qs + 32 * c + 4 * r, src_qs + 4 * c, 4);
}

template <typename Src, typename Dst>
void repack(const void* rows, int64_t n, int64_t k, void* dst) {
  const int64_t kb = k / kBlock;
  const int64_t groups = (n + kGroup - 1) / kGroup;
  const auto* src = static_cast<const Src*>(rows);
  auto* out = static_cast<Dst*>(dst);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < kb; ++b) {
      Dst& o = out[g * kb + b];
      std::memset(&o, 0, sizeof(o));  // rows past n: scale 0 (and min 0), so they add nothing
      for (int r = 0; r < kGroup; ++r) {
        const int64_t row = g * kGroup + r;
        if (row >= n) break;
        const Src& s = src[row * kb + b];
        o.d[r] = s.d;
        if constexpr (requires { s.m; }) o.m[r] = s.m;
        interleave(reinterpret_cast<uint8_t*>(o.qs), r, reinterpret_cast<const uint8_t*>(s.qs), sizeof(s.qs));
      }
    }
  }
}

}  // namespace

uint64_t repack_x8_bytes(DType dtype, int64_t n, int64_t k) {
  if (is_q5iq4(dtype)) return repack_q5iq4_bytes(dtype, n, k);
  if (is_ternary(dtype)) return ternary_repack_bytes(dtype, n, k);
  const auto blocks = static_cast<uint64_t>((n + kGroup - 1) / kGroup) * static_cast<uint64_t>(k / kBlock);
  switch (dtype) {
    case DType::Q4_0:
      return blocks * sizeof(BlockQ4_0x8);
    case DType::Q4_1:
      return blocks * sizeof(BlockQ4_1x8);
    case DType::Q8_0:
      return blocks * sizeof(BlockQ8_0x8);
    default:
      if (is_kquant(dtype)) return kquant_repack_bytes(dtype, n, k);  // repack_kquant.cpp
      fail("matmul: dtype {} has no interleaved layout", dtype_name(dtype));
  }
}

void repack_x8(DType dtype, const void* rows, int64_t n, int64_t k, void* dst) {
  if (is_q5iq4(dtype)) return repack_q5iq4(dtype, rows, n, k, dst);
  if (is_ternary(dtype)) return ternary_repack(dtype, rows, n, k, dst);
  switch (dtype) {
    case DType::Q4_0:
      return repack<BlockQ4_0, BlockQ4_0x8>(rows, n, k, dst);
    case DType::Q4_1:
      return repack<BlockQ4_1, BlockQ4_1x8>(rows, n, k, dst);
    case DType::Q8_0: {
      repack<BlockQ8_0, BlockQ8_0x8>(rows, n, k, dst);
      auto* blk = static_cast<BlockQ8_0x8*>(dst);  // the bias of matmul_internal.h (rows past n too: their scale is 0)
      const uint64_t blocks = repack_x8_bytes(dtype, n, k) / sizeof(BlockQ8_0x8);
      for (uint64_t i = 0; i < blocks; ++i)
        for (uint8_t& q : blk[i].qs) q ^= 0x80;
      return;
    }
    default:
      if (is_kquant(dtype)) return kquant_repack(dtype, rows, n, k, dst);
      fail("matmul: dtype {} has no interleaved layout", dtype_name(dtype));
  }
}

}  // namespace tessera::cpu::detail
