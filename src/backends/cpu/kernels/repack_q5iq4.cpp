// Interleaving of q5_0, q5_1, iq4_nl and iq4_xs rows into groups of 8 (layouts in matmul_q5iq4.h).
#include <cstring>

#include "backends/cpu/kernels/matmul_q5iq4.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/format_traits.h"

namespace tessera::cpu::detail {
namespace {

// Copies row r's quant bytes (nbytes, a multiple of 4) into lane r of the interleaved qs.
void interleave(uint8_t* dst_qs, int r, const uint8_t* src_qs, int nbytes) {
  for (int c = 0; c < nbytes / 4; ++c) std::memcpy(dst_qs + 32 * c + 4 * r, src_qs + 4 * c, 4);
}

// GGML's qh (bit e = element e) -> bit j of byte b = element 4j + b.
uint32_t spread_qh(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  uint32_t out = 0;
  for (int e = 0; e < kBlock; ++e) out |= ((bits >> e) & 1u) << (8 * (e % 4) + e / 4);
  return out;
}

// q5_0, q5_1 and iq4_nl: one 32-element block per interleaved block.
template <typename Src, typename Dst>
void repack_blocks(const void* rows, int64_t n, int64_t k, void* dst) {
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
        if constexpr (requires { s.qh; }) {
          const uint32_t qh = spread_qh(s.qh);
          std::memcpy(o.qh + 4 * r, &qh, 4);
        }
        interleave(o.qs, r, s.qs, sizeof(s.qs));
      }
    }
  }
}

void repack_iq4_xs(const void* rows, int64_t n, int64_t k, void* dst) {
  const int64_t kb = k / kQKK;
  const int64_t groups = (n + kGroup - 1) / kGroup;
  const auto* src = static_cast<const BlockIQ4_XS*>(rows);
  auto* out = static_cast<BlockIQ4_XSx8*>(dst);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < kb; ++b) {
      BlockIQ4_XSx8& o = out[g * kb + b];
      std::memset(&o, 0, sizeof(o));
      for (int r = 0; r < kGroup; ++r) {
        const int64_t row = g * kGroup + r;
        if (row >= n) break;
        const BlockIQ4_XS& s = src[row * kb + b];
        o.d[r] = s.d;
        for (int j = 0; j < kSubBlocks; ++j) {
          o.sc[j][r] = static_cast<int8_t>(format_detail::iq4_xs_scale(s, j));
          interleave(o.qs[j], r, s.qs + 16 * j, 16);
        }
      }
    }
  }
}

}  // namespace

bool is_q5iq4(DType dtype) {
  return dtype == DType::Q5_0 || dtype == DType::Q5_1 || dtype == DType::IQ4_NL || dtype == DType::IQ4_XS;
}

uint64_t repack_q5iq4_bytes(DType dtype, int64_t n, int64_t k) {
  const auto groups = static_cast<uint64_t>((n + kGroup - 1) / kGroup);
  const auto blocks = groups * static_cast<uint64_t>(k / kBlock);
  switch (dtype) {
    case DType::Q5_0:
      return blocks * sizeof(BlockQ5_0x8);
    case DType::Q5_1:
      return blocks * sizeof(BlockQ5_1x8);
    case DType::IQ4_NL:
      return blocks * sizeof(BlockIQ4_NLx8);
    case DType::IQ4_XS:
      return groups * static_cast<uint64_t>(k / kQKK) * sizeof(BlockIQ4_XSx8);
    default:
      fail("matmul: dtype {} has no interleaved layout", dtype_name(dtype));
  }
}

void repack_q5iq4(DType dtype, const void* rows, int64_t n, int64_t k, void* dst) {
  switch (dtype) {
    case DType::Q5_0:
      return repack_blocks<BlockQ5_0, BlockQ5_0x8>(rows, n, k, dst);
    case DType::Q5_1:
      return repack_blocks<BlockQ5_1, BlockQ5_1x8>(rows, n, k, dst);
    case DType::IQ4_NL:
      return repack_blocks<BlockIQ4_NL, BlockIQ4_NLx8>(rows, n, k, dst);
    case DType::IQ4_XS:
      return repack_iq4_xs(rows, n, k, dst);
    default:
      fail("matmul: dtype {} has no interleaved layout", dtype_name(dtype));
  }
}

}  // namespace tessera::cpu::detail
