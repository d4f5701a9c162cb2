// The K-quants' interleaved layouts (matmul_kquant.h): each file super-block decoded to one code per element and one
// byte per scale, then placed in its group's x8 block.
#include <cstring>

#include "backends/cpu/kernels/matmul_kquant.h"
#include "core/error.h"
#include "quant/format_traits.h"

namespace tessera::cpu::detail {
namespace {

// Places code bits of element e (0..255) of row r into the x8 fields (matmul_kquant.h): sub-block j = e / 32, register
// i = (e % 32) / 4, byte p = 4 r + e % 4.
struct Place {
  int j, i, p;
  Place(int e, int r) : j(e / 32), i((e % 32) / 4), p(4 * r + e % 4) {}
  void nibble(uint8_t (*qs)[128], int v) const {
    qs[j][32 * (i % 4) + p] |= static_cast<uint8_t>((v & 0xF) << (i < 4 ? 0 : 4));
  }
  void two_bits(uint8_t (*qs)[64], int v) const {
    qs[j][32 * (i / 4) + p] |= static_cast<uint8_t>((v & 3) << (2 * (i % 4)));
  }
  void bit(uint8_t (*qh)[32], int v) const { qh[j][p] |= static_cast<uint8_t>((v & 1) << i); }
};

template <DType D>
void put(typename Format<D>::Block const& s, int r, void* out);

template <>
void put<DType::Q4_K>(const BlockQ4_K& s, int r, void* out) {
  auto& o = *static_cast<BlockQ4_Kx8*>(out);
  o.d[r] = s.d;
  o.dmin[r] = s.dmin;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    format_detail::q4_k_scale_min(j, s.scales, &sc, &m);
    o.sc[j][r] = static_cast<uint8_t>(sc);
    o.m[j][r] = static_cast<uint8_t>(m);
    for (int l = 0; l < 32; ++l) Place(32 * j + l, r).nibble(o.qs, s.qs[32 * (j / 2) + l] >> (4 * (j & 1)));
  }
}

template <>
void put<DType::Q5_K>(const BlockQ5_K& s, int r, void* out) {
  auto& o = *static_cast<BlockQ5_Kx8*>(out);
  o.d[r] = s.d;
  o.dmin[r] = s.dmin;
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    format_detail::q4_k_scale_min(j, s.scales, &sc, &m);
    o.sc[j][r] = static_cast<uint8_t>(sc);
    o.m[j][r] = static_cast<uint8_t>(m);
    for (int l = 0; l < 32; ++l) {
      const int u = Format<DType::Q5_K>::code(s, j, l);
      const Place at(32 * j + l, r);
      at.nibble(o.qs, u);
      at.bit(o.qh, u >> 4);
    }
  }
}

template <>
void put<DType::Q6_K>(const BlockQ6_K& s, int r, void* out) {
  auto& o = *static_cast<BlockQ6_Kx8*>(out);
  o.d[r] = s.d;
  for (int j = 0; j < 16; ++j) o.sc[j][r] = s.scales[j];
  for (int e = 0; e < kQKK; ++e) {
    const int u = format_detail::q6_k_code(s, e);  // q + 32
    const Place at(e, r);
    at.nibble(o.ql, u);
    at.two_bits(o.qh, u >> 4);
  }
}

template <>
void put<DType::Q2_K>(const BlockQ2_K& s, int r, void* out) {
  auto& o = *static_cast<BlockQ2_Kx8*>(out);
  o.d[r] = s.d;
  o.dmin[r] = s.dmin;
  for (int j = 0; j < 16; ++j) o.scm[j][r] = s.scales[j];
  for (int e = 0; e < kQKK; ++e) Place(e, r).two_bits(o.qs, format_detail::k_quant_2bit(s.qs, e));
}

template <>
void put<DType::Q3_K>(const BlockQ3_K& s, int r, void* out) {
  auto& o = *static_cast<BlockQ3_Kx8*>(out);
  o.d[r] = s.d;
  for (int j = 0; j < 16; ++j) o.sc[j][r] = static_cast<int8_t>(format_detail::q3_k_scale(j, s.scales) - 32);
  for (int e = 0; e < kQKK; ++e) {
    const int u = Format<DType::Q3_K>::code(s, e) + 4;
    const Place at(e, r);
    at.two_bits(o.qs, u);
    at.bit(o.qh, u >> 2);
  }
}

template <DType D, typename Dst>
void repack(const void* rows, int64_t n, int64_t k, void* dst) {
  using F = Format<D>;
  const int64_t kb = k / kQKK;
  const int64_t groups = (n + kGroup - 1) / kGroup;
  const auto* src = static_cast<const uint8_t*>(rows);
  auto* out = static_cast<Dst*>(dst);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < kb; ++b) {
      Dst& o = out[g * kb + b];
      std::memset(&o, 0, sizeof(o));  // rows past n: scales 0, so they add nothing
      for (int r = 0; r < kGroup && g * kGroup + r < n; ++r) {
        typename F::Block s;  // a copy: file blocks of 84, 110 or 210 bytes are not aligned for the struct
        std::memcpy(&s, src + ((g * kGroup + r) * kb + b) * F::kBlockBytes, sizeof(s));
        put<D>(s, r, &o);
      }
    }
  }
}

uint64_t x8_block_bytes(DType dtype) {
  switch (dtype) {
    case DType::Q2_K:
      return sizeof(BlockQ2_Kx8);
    case DType::Q3_K:
      return sizeof(BlockQ3_Kx8);
    case DType::Q4_K:
      return sizeof(BlockQ4_Kx8);
    case DType::Q5_K:
      return sizeof(BlockQ5_Kx8);
    case DType::Q6_K:
      return sizeof(BlockQ6_Kx8);
    default:
      return 0;
  }
}

}  // namespace

bool is_kquant(DType dtype) { return x8_block_bytes(dtype) != 0; }

uint64_t kquant_repack_bytes(DType dtype, int64_t n, int64_t k) {
  TESSERA_CHECK(is_kquant(dtype), "matmul: dtype {} is not a K-quant", dtype_name(dtype));
  return static_cast<uint64_t>((n + kGroup - 1) / kGroup) * static_cast<uint64_t>(k / kQKK) * x8_block_bytes(dtype);
}

void kquant_repack(DType dtype, const void* rows, int64_t n, int64_t k, void* dst) {
  switch (dtype) {
    case DType::Q2_K:
      return repack<DType::Q2_K, BlockQ2_Kx8>(rows, n, k, dst);
    case DType::Q3_K:
      return repack<DType::Q3_K, BlockQ3_Kx8>(rows, n, k, dst);
    case DType::Q4_K:
      return repack<DType::Q4_K, BlockQ4_Kx8>(rows, n, k, dst);
    case DType::Q5_K:
      return repack<DType::Q5_K, BlockQ5_Kx8>(rows, n, k, dst);
    case DType::Q6_K:
      return repack<DType::Q6_K, BlockQ6_Kx8>(rows, n, k, dst);
    default:
      fail("matmul: dtype {} is not a K-quant", dtype_name(dtype));
  }
}

}  // namespace tessera::cpu::detail
