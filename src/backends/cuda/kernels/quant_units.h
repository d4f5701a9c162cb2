// The quantized formats as the dp4a GEMVs read them (gemv_quant_kernel.cuh for T = 1, gemm_rows.cu for small T): a
// thread's share of one weight row per step is one unit of kUnit elements, loaded from the SPLIT_Q layout
// (split_layout.h) as kQuantBytes / 16 aligned 16-byte vectors plus the unit's scales, and dotted with the q8
// activation (d and d * sum(q) per 32, GemvInput) by integer dot products.
//  - q8_0, q4_0, q4_1: a unit is one 32-block (the kernels' own code reads these; only the sizes live here).
//  - q4_K: a unit is 64 elements, the 32 bytes of nibbles shared by sub-blocks 2i (low nibbles) and 2i + 1 (high)
//    of a super-block, with the super-block's 16-byte head (d, dmin, packed 6-bit scales and mins) loaded whole: the
//    four units of a super-block sit in neighbouring lanes, so the head is one broadcast load, no extra DRAM bytes.
//  - q6_K: a unit is 64 elements, elements 16c .. 16c + 15 of each 32-group g of half h of a super-block (u = 2h + c):
//    ql bytes [64h + 16c, + 16) (groups 0 and 2), [64h + 32 + 16c, + 16) (groups 1 and 3) and qh [32h + 16c, + 16)
//    (two high bits per group). Those three vectors of four neighbouring lanes cover the super-block's 192 quant
//    bytes exactly once, in GGML's order, so no repacking at upload; each 16-element run is one sub-block, scale
//    sc[8h + 2g + c], read from the 8 scale bytes of half h.
//  - q5_0, q5_1: a unit is one 32-block (q4_0's nibbles, the fifth bits from the block's qh in the tail).
//  - q2_K, q3_K: q6_K's 64-element unit (16 elements of each 32-group of half h): q2_K's qs [32h + 16c, + 16) (2 bits
//    per group), q3_K's the same plus hmask [16c, + 16) (bit 4h + g of group g).
// Each K-quant format: load(...) its unit's registers, Act::load(...) the unit's activation (once per step, shared by
// every row), dot(...) one row's contribution. The same arithmetic as Format<D>::dot_q8 (quant/format_traits.h), with
// the float products in another order.
//
// The unit functions are TESSERA_UNIT (host and device under nvcc, plain inline under the host compiler) over the few
// intrinsics below, each with a host twin, so tests/backends/cuda/test_quant_units.cpp runs this very code on the
// host against the traits without a GPU.
#pragma once

#include <vector_types.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "quant/format_traits.h"

#if defined(__CUDACC__)
#define TESSERA_UNIT __host__ __device__ __forceinline__
#define TESSERA_UNROLL _Pragma("unroll")
#else
#define TESSERA_UNIT inline
#define TESSERA_UNROLL
#endif

namespace tessera::cuda::detail {

namespace unit {
// Streamed weight loads (ld.global.nc.L1::no_allocate, as common.cuh's ld_stream16: read once, never evicting x).
TESSERA_UNIT uint4 ld16(const void* p) {
  uint4 v;
#if defined(__CUDA_ARCH__)
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
#else
  std::memcpy(&v, p, 16);
#endif
  return v;
}
// A unit's second 16 bytes follow its first (q4_K, iq4_xs, q5_K's qs): with a unit per lane, each of the two
// 16-byte loads of a warp spans the same 32-byte sectors (lane i reads half of sector i), so with no_allocate the
// second load fetches every sector from L2 again (twice the L2 traffic of the DRAM bytes). Allocating in L1 (marked
// evict-first, so x keeps its place) lets the second load hit the first's sectors. H100, tessera_bench_kquant at
// unchanged launch shapes (2026-11-26, two machines): q4_K, q5_K and iq4_xs 2-11% faster at most 8B / 1B shapes
// (iq4_xs 4096x4096 5.25 -> 4.68 us), while the unchanged iq4_nl and q6_K moved 0-4% the other way (the machines);
// one shape lost (q4_K 4096x14336 at 64/8/1, 13.8 -> 14.8 us; its default moved to 32/4/2).
TESSERA_UNIT uint4 ld16_pair(const void* p) {
  uint4 v;
#if defined(__CUDA_ARCH__)
  asm("ld.global.nc.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
#else
  std::memcpy(&v, p, 16);
#endif
  return v;
}
TESSERA_UNIT uint2 ld8(const void* p) {
  uint2 v;
#if defined(__CUDA_ARCH__)
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
#else
  std::memcpy(&v, p, 8);
#endif
  return v;
}
TESSERA_UNIT uint32_t ld_u16(const void* p) {
#if defined(__CUDA_ARCH__)
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}
TESSERA_UNIT uint32_t ld4(const void* p) {
#if defined(__CUDA_ARCH__)
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
// Activation loads through the read-only cache (__ldg: x is re-read by every block).
TESSERA_UNIT int4 ldg(const int4* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}
TESSERA_UNIT float2 ldg(const float2* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}
TESSERA_UNIT float ldg(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}
// Four int8 products summed into c (dp4a).
TESSERA_UNIT int dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i)
    c += static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i)) *
         static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
  return c;
#endif
}
// Bytes of {y, x} picked by the four 3-bit selectors in s's low 16 bits (prmt, __byte_perm; selector bit 3 is kept
// clear by the callers).
TESSERA_UNIT uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
  return r;
#endif
}
// Products and differences rounded on their own (no FMA contraction on the device), as quant.cpp's -ffp-contract=off
// host code forms a format's values: split_value is then bit-exact with Format<D>::dequantize on both sides.
TESSERA_UNIT float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TESSERA_UNIT float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TESSERA_UNIT float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
// An fp16 pair (low half first) as two floats.
TESSERA_UNIT float2 half2(uint32_t w) {
  float2 f;
  f.x = format_detail::half_value(static_cast<uint16_t>(w & 0xFFFFu));
  f.y = format_detail::half_value(static_cast<uint16_t>(w >> 16));
  return f;
}
}  // namespace unit

// kUnit: elements per unit; kQuantBytes: quant bytes per unit on average (a row's quants are units * kQuantBytes
// bytes); kScaleBytes: the same for scales; kVecs: the 16-byte vectors a unit loads (q5_K's four units each load the
// super-block's 32 qh bytes too: kVecs * 16 > kQuantBytes); Scale: a unit's scale registers.
template <DType D>
struct QuantFmt;
template <>
struct QuantFmt<DType::Q8_0> {
  static constexpr int kUnit = 32, kQuantBytes = 32, kScaleBytes = 2, kVecs = 2;
  using Scale = uint32_t;
};
template <>
struct QuantFmt<DType::Q4_0> {
  static constexpr int kUnit = 32, kQuantBytes = 16, kScaleBytes = 2, kVecs = 1;
  using Scale = uint32_t;
};
template <>
struct QuantFmt<DType::Q4_1> {
  static constexpr int kUnit = 32, kQuantBytes = 16, kScaleBytes = 4, kVecs = 1;
  using Scale = uint32_t;
};

// iq4_nl: q4_0's block and unit (the kernels' 32-block code reads it) with each nibble a code into GGML's 16 int8
// values (format_detail::iq4nl_value): iq4nl_words maps a word of four quant bytes to the values of its low nibbles
// (elements 4i .. 4i + 3 of the block) and of its high nibbles (16 + 4i ..) in four byte permutes per half word, with
// the table in registers (no memory lookup).
template <>
struct QuantFmt<DType::IQ4_NL> {
  static constexpr int kUnit = 32, kQuantBytes = 16, kScaleBytes = 2, kVecs = 1;
  using Scale = uint32_t;
};
// The four table values of the four codes in n's low 16 bits, in their order.
TESSERA_UNIT uint32_t iq4nl_lookup4(uint32_t n) {
  // format_detail::iq4nl_value's table as four words: codes 0-3, 4-7, 8-11, 12-15.
  constexpr uint32_t k0 = 0xbfad9881u, k1 = 0xf6eaddcfu, k2 = 0x26190d01u, k3 = 0x71594535u;
  const uint32_t sel = n & 0x7777u;                    // the code's low 3 bits: byte within each half of the table
  const uint32_t lo = unit::byte_perm(k0, k1, sel);    // as if every code were < 8
  const uint32_t hi = unit::byte_perm(k2, k3, sel);    // as if every code were >= 8
  return unit::byte_perm(lo, hi, 0x3210u | ((n & 0x8888u) >> 1));  // bit 3 picks hi's byte
}
// A word of four quant bytes -> (values of the low nibbles, values of the high nibbles), each as four int8.
TESSERA_UNIT void iq4nl_words(uint32_t w, int& lo, int& hi) {
  // Nibbles of w from bit 0: low 0, high 0, low 1, high 1, ...: a holds bytes 0-1's, b bytes 2-3's, in that order.
  const uint32_t a = iq4nl_lookup4(w & 0xFFFFu), b = iq4nl_lookup4(w >> 16);
  lo = static_cast<int>(unit::byte_perm(a, b, 0x6420u));
  hi = static_cast<int>(unit::byte_perm(a, b, 0x7531u));
}

// The q8 activation of a 32-element unit: activation block b (q5_0, q5_1).
struct ActBlock {
  int x[8];  // the block's 32 int8 as words
  float2 ds;
  TESSERA_UNIT static ActBlock load(const int8_t* __restrict__ xq, const float2* __restrict__ xds, int b) {
    ActBlock a;
    const int4* p = reinterpret_cast<const int4*>(xq) + 2 * b;
    const int4 x0 = unit::ldg(p), x1 = unit::ldg(p + 1);
    a.x[0] = x0.x, a.x[1] = x0.y, a.x[2] = x0.z, a.x[3] = x0.w;
    a.x[4] = x1.x, a.x[5] = x1.y, a.x[6] = x1.z, a.x[7] = x1.w;
    a.ds = unit::ldg(xds + b);
    return a;
  }
};

// Bits s .. s + 3 of qh (the fifth bits of four neighbouring elements) as bit 4 of four bytes: the multiply places
// copies of the 4 bits 7 apart (no two overlap, so no carries), which puts bit i at bit 8i; the mask keeps those.
TESSERA_UNIT uint32_t q5_high4(uint32_t qh, int s) { return ((((qh >> s) & 0xFu) * 0x00204081u) & 0x01010101u) << 4; }

// q5_0 / q5_1: q4_0's / q4_1's 32-block with the fifth bit of element j in bit j of qh (format_detail::q5_code).
// Row pointers: quants [units, 16], scales [units, 2 or 4], tail qh [units, 4] (q5_0's is only 2-byte aligned).
template <DType D>
struct Q5Unit {
  static constexpr bool kOffset = D == DType::Q5_0;  // w = d (q - 16); else w = d q + m
  static constexpr int kUnit = 32, kQuantBytes = 16, kScaleBytes = kOffset ? 2 : 4, kVecs = 1;
  using Scale = uint2;  // x: fp16 d (q5_1: d | m << 16), y: qh
  using Act = ActBlock;
  TESSERA_UNIT static void load(const uint8_t* qrow, const uint8_t* srow, const uint8_t* trow, int b, uint4 (&wv)[1],
                                Scale& sc) {
    wv[0] = unit::ld16(qrow + static_cast<size_t>(b) * 16);
    const uint8_t* qh = trow + static_cast<size_t>(b) * 4;
    if constexpr (kOffset) {
      sc.x = unit::ld_u16(srow + static_cast<size_t>(b) * 2);
      sc.y = unit::ld_u16(qh) | (unit::ld_u16(qh + 2) << 16);
    } else {
      sc.x = unit::ld4(srow + static_cast<size_t>(b) * 4);
      sc.y = unit::ld4(qh);
    }
  }
  TESSERA_UNIT static float dot(const uint4 (&wq)[1], const Scale& sc, const ActBlock& x) {
    // Word i of the 16 bytes: elements 4i .. 4i + 3 in the low nibbles, 16 + 4i .. in the high ones.
    const uint32_t w[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
    int s = 0;
    TESSERA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (w[i] & 0x0F0F0F0Fu) | q5_high4(sc.y, 4 * i);
      const uint32_t hi = ((w[i] >> 4) & 0x0F0F0F0Fu) | q5_high4(sc.y, 16 + 4 * i);
      s = unit::dp4a(static_cast<int>(lo), x.x[i], s);
      s = unit::dp4a(static_cast<int>(hi), x.x[i + 4], s);
    }
    if constexpr (kOffset) {
      // sum d_w (q_w - 16) d_x q_x = d_w (d_x sum(q_w q_x) - 16 d_x sum(q_x)), as Format<Q5_0>::dot_q8
      const float d = format_detail::half_value(static_cast<uint16_t>(sc.x & 0xFFFFu));
      return d * (x.ds.x * static_cast<float>(s) - 16.0f * x.ds.y);
    } else {
      const float2 dm = unit::half2(sc.x);
      return dm.x * x.ds.x * static_cast<float>(s) + dm.y * x.ds.y;
    }
  }
};
template <>
struct QuantFmt<DType::Q5_0> : Q5Unit<DType::Q5_0> {};
template <>
struct QuantFmt<DType::Q5_1> : Q5Unit<DType::Q5_1> {};

// The q8 activation of a 64-element unit that covers activation blocks 2b and 2b + 1 whole (q4_K).
struct ActPair {
  int lo[8], hi[8];  // the two blocks' 32 int8 each, as words
  float2 ds_lo, ds_hi;
  int sub;  // the unit's index in its super-block (0..3)
  TESSERA_UNIT static ActPair load(const int8_t* __restrict__ xq, const float2* __restrict__ xds, int b) {
    ActPair a;
    const int4* p = reinterpret_cast<const int4*>(xq) + 4 * b;
    const int4 x0 = unit::ldg(p), x1 = unit::ldg(p + 1), x2 = unit::ldg(p + 2), x3 = unit::ldg(p + 3);
    a.lo[0] = x0.x, a.lo[1] = x0.y, a.lo[2] = x0.z, a.lo[3] = x0.w;
    a.lo[4] = x1.x, a.lo[5] = x1.y, a.lo[6] = x1.z, a.lo[7] = x1.w;
    a.hi[0] = x2.x, a.hi[1] = x2.y, a.hi[2] = x2.z, a.hi[3] = x2.w;
    a.hi[4] = x3.x, a.hi[5] = x3.y, a.hi[6] = x3.z, a.hi[7] = x3.w;
    a.ds_lo = unit::ldg(xds + 2 * b);
    a.ds_hi = unit::ldg(xds + 2 * b + 1);
    a.sub = b & 3;
    return a;
  }
};

template <>
struct QuantFmt<DType::Q4_K> {
  static constexpr int kUnit = 64, kQuantBytes = 32, kScaleBytes = 4, kVecs = 2;
  using Scale = uint4;  // the super-block's head: (d, dmin) as fp16 pair, then scales bytes 0-3, 4-7, 8-11
  using Act = ActPair;
  // Row pointers: quants [units, 32], heads [units / 4, 16].
  TESSERA_UNIT static void load(const uint8_t* qrow, const uint8_t* srow, const uint8_t* /*trow*/, int b,
                                uint4 (&wv)[2], Scale& sc) {
    wv[0] = unit::ld16_pair(qrow + static_cast<size_t>(b) * 32);
    wv[1] = unit::ld16_pair(qrow + static_cast<size_t>(b) * 32 + 16);
    sc = unit::ld16(srow + static_cast<size_t>(b >> 2) * 16);
  }
  TESSERA_UNIT static float dot(const uint4 (&wq)[2], const Scale& h, const ActPair& x) {
    const uint32_t w[8] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w, wq[1].x, wq[1].y, wq[1].z, wq[1].w};
    int slo = 0, shi = 0;
    TESSERA_UNROLL
    for (int i = 0; i < 8; ++i) {
      slo = unit::dp4a(static_cast<int>(w[i] & 0x0F0F0F0Fu), x.lo[i], slo);
      shi = unit::dp4a(static_cast<int>((w[i] >> 4) & 0x0F0F0F0Fu), x.hi[i], shi);
    }
    return finish(h, x, slo, shi);
  }
  // The unit's two sub-block sums scaled: d sc dx sum - dmin m s for sub-blocks 2 sub and 2 sub + 1 (q5_K too).
  TESSERA_UNIT static float finish(const Scale& h, const ActPair& x, int slo, int shi) {
    // 6-bit scale and min of sub-blocks j = 2 sub and 2 sub + 1 (format_detail::q4_k_scale_min): bytes j and j + 1 of
    // the 12 for sub < 2; for sub >= 2 the low 4 bits come from bytes j + 4, j + 5 and the top 2 bits from bytes
    // j - 4, j - 3 (scales) and j, j + 1 (mins). With t = 8 * 2 * (sub & 1) every needed byte pair is bits t .. t + 15
    // of one head word.
    const int t = 16 * (x.sub & 1);
    const uint32_t y = h.y >> t, z = h.z >> t, wd = h.w >> t;
    int sc0, sc1, m0, m1;
    if (x.sub < 2) {
      sc0 = y & 63, sc1 = (y >> 8) & 63, m0 = z & 63, m1 = (z >> 8) & 63;
    } else {
      sc0 = (wd & 0xF) | (((y >> 6) & 3) << 4);
      sc1 = ((wd >> 8) & 0xF) | (((y >> 14) & 3) << 4);
      m0 = ((wd >> 4) & 0xF) | (((z >> 6) & 3) << 4);
      m1 = ((wd >> 12) & 0xF) | (((z >> 14) & 3) << 4);
    }
    const float2 dm = unit::half2(h.x);  // (d, dmin)
    const float s = static_cast<float>(sc0) * x.ds_lo.x * static_cast<float>(slo) +
                    static_cast<float>(sc1) * x.ds_hi.x * static_cast<float>(shi);
    const float m = static_cast<float>(m0) * x.ds_lo.y + static_cast<float>(m1) * x.ds_hi.y;
    return dm.x * s - dm.y * m;
  }
};

// q5_K: q4_K's unit with a fifth bit per element from the super-block's 32 qh bytes (bit j of qh[l] for element l of
// sub-block j), which all four units of a super-block load (broadcast within the warp, no extra DRAM bytes).
template <>
struct QuantFmt<DType::Q5_K> {
  static constexpr int kUnit = 64, kQuantBytes = 40, kScaleBytes = 4, kVecs = 4;
  using Scale = uint4;
  using Act = ActPair;
  // Row pointers: quants [units / 4, 160] (qh then qs), heads [units / 4, 16]. wv: the unit's qs (2), then qh (2).
  TESSERA_UNIT static void load(const uint8_t* qrow, const uint8_t* srow, const uint8_t* /*trow*/, int b,
                                uint4 (&wv)[4], Scale& sc) {
    const uint8_t* q = qrow + static_cast<size_t>(b >> 2) * 160;
    wv[0] = unit::ld16_pair(q + 32 + 32 * (b & 3));
    wv[1] = unit::ld16_pair(q + 48 + 32 * (b & 3));
    wv[2] = unit::ld16(q);
    wv[3] = unit::ld16(q + 16);
    sc = unit::ld16(srow + static_cast<size_t>(b >> 2) * 16);
  }
  TESSERA_UNIT static float dot(const uint4 (&wq)[4], const Scale& h, const ActPair& x) {
    const uint32_t w[8] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w, wq[1].x, wq[1].y, wq[1].z, wq[1].w};
    const uint32_t hb[8] = {wq[2].x, wq[2].y, wq[2].z, wq[2].w, wq[3].x, wq[3].y, wq[3].z, wq[3].w};
    const int jlo = 2 * x.sub;  // the low sub-block's bit in each qh byte; the high one's is the next
    int slo = 0, shi = 0;
    TESSERA_UNROLL
    for (int i = 0; i < 8; ++i) {
      const uint32_t lo = (w[i] & 0x0F0F0F0Fu) | (((hb[i] >> jlo) & 0x01010101u) << 4);
      const uint32_t hi = ((w[i] >> 4) & 0x0F0F0F0Fu) | (((hb[i] >> (jlo + 1)) & 0x01010101u) << 4);
      slo = unit::dp4a(static_cast<int>(lo), x.lo[i], slo);
      shi = unit::dp4a(static_cast<int>(hi), x.hi[i], shi);
    }
    return QuantFmt<DType::Q4_K>::finish(h, x, slo, shi);
  }
};

// iq4_xs: a unit is 64 elements, sub-blocks 2 sub and 2 sub + 1 of a super-block (32 bytes of qs: 16 per sub-block,
// element l < 16 in byte l's low nibble, l >= 16 in byte l - 16's high nibble), each nibble a code into iq4_nl's
// table (iq4nl_words); the super-block's 8-byte head (fp16 d, scales_h, scales_l[4]) is one broadcast load, and
// sub-block j's scale is (4 bits of scales_l[j / 2] | 2 bits of scales_h << 4) - 32.
template <>
struct QuantFmt<DType::IQ4_XS> {
  static constexpr int kUnit = 64, kQuantBytes = 32, kScaleBytes = 2, kVecs = 2;
  using Scale = uint2;  // the head: x = d | scales_h << 16, y = scales_l[0..3]
  using Act = ActPair;
  // Row pointers: quants [units, 32], heads [units / 4, 8].
  TESSERA_UNIT static void load(const uint8_t* qrow, const uint8_t* srow, const uint8_t* /*trow*/, int b,
                                uint4 (&wv)[2], Scale& sc) {
    wv[0] = unit::ld16_pair(qrow + static_cast<size_t>(b) * 32);
    wv[1] = unit::ld16_pair(qrow + static_cast<size_t>(b) * 32 + 16);
    sc = unit::ld8(srow + static_cast<size_t>(b >> 2) * 8);
  }
  // Sub-block j's scale minus 32 from the head.
  TESSERA_UNIT static int scale(const Scale& h, int j) {
    const int low = static_cast<int>((h.y >> (4 * j)) & 0xFu);  // scales_l[j / 2] >> 4 (j % 2)
    const int high = static_cast<int>((h.x >> (16 + 2 * j)) & 3u);
    return (low | (high << 4)) - 32;
  }
  TESSERA_UNIT static float dot(const uint4 (&wq)[2], const Scale& h, const ActPair& x) {
    const uint32_t a[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
    const uint32_t b[4] = {wq[1].x, wq[1].y, wq[1].z, wq[1].w};
    int slo = 0, shi = 0;
    TESSERA_UNROLL
    for (int i = 0; i < 4; ++i) {
      int lo, hi;
      iq4nl_words(a[i], lo, hi);
      slo = unit::dp4a(lo, x.lo[i], slo);
      slo = unit::dp4a(hi, x.lo[i + 4], slo);
      iq4nl_words(b[i], lo, hi);
      shi = unit::dp4a(lo, x.hi[i], shi);
      shi = unit::dp4a(hi, x.hi[i + 4], shi);
    }
    const float d = format_detail::half_value(static_cast<uint16_t>(h.x & 0xFFFFu));
    return d * static_cast<float>(scale(h, 2 * x.sub)) * x.ds_lo.x * static_cast<float>(slo) +
           d * static_cast<float>(scale(h, 2 * x.sub + 1)) * x.ds_hi.x * static_cast<float>(shi);
  }
};

// The q8 activation of a q6_K unit: 16 int8 of each of the four activation blocks 8 sb + 4h + g (g = 0..3), and
// their scales d.
struct ActQuarter {
  int x[4][4];
  float d[4];
  int c;  // which 16 of each block's 32 (the unit's scale byte offset)
  TESSERA_UNIT static ActQuarter load(const int8_t* __restrict__ xq, const float2* __restrict__ xds, int b) {
    ActQuarter a;
    const int sb = b >> 2, h = (b >> 1) & 1;
    a.c = b & 1;
    const int blk0 = 8 * sb + 4 * h;
    TESSERA_UNROLL
    for (int g = 0; g < 4; ++g) {
      const int4 v = unit::ldg(reinterpret_cast<const int4*>(xq) + 2 * (blk0 + g) + a.c);
      a.x[g][0] = v.x, a.x[g][1] = v.y, a.x[g][2] = v.z, a.x[g][3] = v.w;
      a.d[g] = unit::ldg(reinterpret_cast<const float*>(xds) + 2 * (blk0 + g));
    }
    return a;
  }
};

struct Q6Scale {
  uint2 sc;    // sub-block scales 8h .. 8h + 7 (int8)
  uint32_t d;  // fp16 bits
};

template <>
struct QuantFmt<DType::Q6_K> {
  static constexpr int kUnit = 64, kQuantBytes = 48, kScaleBytes = 4, kVecs = 3;
  using Scale = Q6Scale;
  using Act = ActQuarter;
  // Row pointers: quants [units / 4, 192] (ql then qh, GGML's order), scales [units / 4, 16], tail d [units / 4].
  TESSERA_UNIT static void load(const uint8_t* qrow, const uint8_t* srow, const uint8_t* trow, int b, uint4 (&wv)[3],
                                Scale& sc) {
    const int sb = b >> 2, h = (b >> 1) & 1, c = b & 1;
    const uint8_t* q = qrow + static_cast<size_t>(sb) * 192;
    wv[0] = unit::ld16(q + 64 * h + 16 * c);        // ql: groups 0 (low nibbles) and 2 (high)
    wv[1] = unit::ld16(q + 64 * h + 32 + 16 * c);   // ql: groups 1 and 3
    wv[2] = unit::ld16(q + 128 + 32 * h + 16 * c);  // qh: bits 2g, 2g + 1 of group g
    sc.sc = unit::ld8(srow + static_cast<size_t>(sb) * 16 + 8 * h);
    sc.d = unit::ld_u16(trow + static_cast<size_t>(sb) * 2);
  }
  // Four 6-bit codes per word minus 32, as signed bytes: OR-ing 0x80 into every byte first keeps the subtraction from
  // borrowing across bytes, and the XOR takes the 0x80 back out (q + 96 ^ 0x80 == q - 32 mod 256 for q in 0..63).
  TESSERA_UNIT static int centered(uint32_t q) {
    return static_cast<int>(((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
  }
  TESSERA_UNIT static float dot(const uint4 (&wq)[3], const Scale& s, const ActQuarter& x) {
    const uint32_t a[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
    const uint32_t bq[4] = {wq[1].x, wq[1].y, wq[1].z, wq[1].w};
    const uint32_t hq[4] = {wq[2].x, wq[2].y, wq[2].z, wq[2].w};
    int sum[4] = {0, 0, 0, 0};
    TESSERA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t q0 = (a[i] & 0x0F0F0F0Fu) | ((hq[i] << 4) & 0x30303030u);
      const uint32_t q1 = (bq[i] & 0x0F0F0F0Fu) | ((hq[i] << 2) & 0x30303030u);
      const uint32_t q2 = ((a[i] >> 4) & 0x0F0F0F0Fu) | (hq[i] & 0x30303030u);
      const uint32_t q3 = ((bq[i] >> 4) & 0x0F0F0F0Fu) | ((hq[i] >> 2) & 0x30303030u);
      sum[0] = unit::dp4a(centered(q0), x.x[0][i], sum[0]);
      sum[1] = unit::dp4a(centered(q1), x.x[1][i], sum[1]);
      sum[2] = unit::dp4a(centered(q2), x.x[2][i], sum[2]);
      sum[3] = unit::dp4a(centered(q3), x.x[3][i], sum[3]);
    }
    // Group g's scale is byte 2g + c of the half's 8: bytes c, 2 + c of sc.x (g = 0, 1) and of sc.y (g = 2, 3).
    const int sh = 8 * x.c;
    const int sc0 = static_cast<int8_t>((s.sc.x >> sh) & 0xFFu),
              sc1 = static_cast<int8_t>((s.sc.x >> (sh + 16)) & 0xFFu);
    const int sc2 = static_cast<int8_t>((s.sc.y >> sh) & 0xFFu),
              sc3 = static_cast<int8_t>((s.sc.y >> (sh + 16)) & 0xFFu);
    const float acc = x.d[0] * static_cast<float>(sc0 * sum[0]) + x.d[1] * static_cast<float>(sc1 * sum[1]) +
                      x.d[2] * static_cast<float>(sc2 * sum[2]) + x.d[3] * static_cast<float>(sc3 * sum[3]);
    return format_detail::half_value(static_cast<uint16_t>(s.d)) * acc;
  }
};

// q6_K's activation quarter with what q2_K's and q3_K's units also need: the unit's half h of its super-block (q3_K's
// hmask bit) and, with SUMS, each 16-run's sum of codes (q2_K's minimums: sum dmin m d_x q_x = dmin m d_x sum(q_x)).
template <bool SUMS>
struct ActQuarterK : ActQuarter {
  int h = 0;
  int sum[4] = {0, 0, 0, 0};
  TESSERA_UNIT static ActQuarterK load(const int8_t* __restrict__ xq, const float2* __restrict__ xds, int b) {
    ActQuarterK a;
    static_cast<ActQuarter&>(a) = ActQuarter::load(xq, xds, b);
    a.h = (b >> 1) & 1;
    if constexpr (SUMS) {
      TESSERA_UNROLL
      for (int g = 0; g < 4; ++g) {
        TESSERA_UNROLL
        for (int i = 0; i < 4; ++i) a.sum[g] = unit::dp4a(0x01010101, a.x[g][i], a.sum[g]);
      }
    }
    return a;
  }
};

// tq2_0 (ternary, quant/blocks.h): a unit is 128 elements, one half h of a super-block: its 32 quant bytes, byte m
// holding elements m, m + 32, m + 64, m + 96 of the half in bits 0-1, 2-3, 4-5, 6-7 (q2_K's layout, as the file has
// it). Word i of the 8 at shift 2s is then elements 32 s + 4i .. 4i + 3: word i of activation block 4 sub + s, so
// each code is masked out in place (no shuffle) and dotted with dp4a, and the code's offset of 1 comes from the
// activation's own d * sum(q): sum (q - 1) x = d_x sum(q q_x) - d_x sum(q_x). The weights enter only as 2-bit codes
// 0..2 (no multiplication by a weight value in the loop: the one scale multiplies the unit's sum). The super-block's
// fp16 d is shared by its two units (kScaleBytes 1: 2 bytes per 2 units).
struct ActQuad {
  int x[4][8];  // activation blocks 4b .. 4b + 3, 32 int8 each as words
  float2 ds[4];
  TESSERA_UNIT static ActQuad load(const int8_t* __restrict__ xq, const float2* __restrict__ xds, int b) {
    ActQuad a;
    const int4* p = reinterpret_cast<const int4*>(xq) + 8 * b;
    TESSERA_UNROLL
    for (int s = 0; s < 4; ++s) {
      const int4 v0 = unit::ldg(p + 2 * s), v1 = unit::ldg(p + 2 * s + 1);
      a.x[s][0] = v0.x, a.x[s][1] = v0.y, a.x[s][2] = v0.z, a.x[s][3] = v0.w;
      a.x[s][4] = v1.x, a.x[s][5] = v1.y, a.x[s][6] = v1.z, a.x[s][7] = v1.w;
      a.ds[s] = unit::ldg(xds + 4 * b + s);
    }
    return a;
  }
};

// Byte i (0..7) of an 8-byte load.
TESSERA_UNIT int byte8(const uint2& v, int i) {
  return static_cast<int>(((i < 4 ? v.x : v.y) >> (8 * (i & 3))) & 0xFFu);
}

struct Q2Scale {
  uint2 sc;     // sub-block scale|min bytes 8h .. 8h + 7 (low nibble scale, high nibble min)
  uint32_t dm;  // fp16 d | fp16 dmin << 16
};

// q2_K: w = d sc q - dmin m per 16-element sub-block, q in 0..3. Unit b = 4 sb + 2h + c: qs bytes [32h + 16c, + 16)
// (byte i holds elements 128h + 32g + 16c + i in bits 2g), sub-block scales 8h + 2g + c.
template <>
struct QuantFmt<DType::Q2_K> {
  static constexpr int kUnit = 64, kQuantBytes = 16, kScaleBytes = 4, kVecs = 1;
  using Scale = Q2Scale;
  using Act = ActQuarterK<true>;
  // Row pointers: quants [units / 4, 64], scales [units / 4, 16], tail (d, dmin) [units / 4, 4].
  TESSERA_UNIT static void load(const uint8_t* qrow, const uint8_t* srow, const uint8_t* trow, int b, uint4 (&wv)[1],
                                Scale& sc) {
    const int sb = b >> 2, h = (b >> 1) & 1, c = b & 1;
    wv[0] = unit::ld16(qrow + static_cast<size_t>(sb) * 64 + 32 * h + 16 * c);
    sc.sc = unit::ld8(srow + static_cast<size_t>(sb) * 16 + 8 * h);
    sc.dm = unit::ld4(trow + static_cast<size_t>(sb) * 4);
  }
  TESSERA_UNIT static float dot(const uint4 (&wq)[1], const Scale& s, const Act& x) {
    const uint32_t w[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
    int sum[4] = {0, 0, 0, 0};
    TESSERA_UNROLL
    for (int i = 0; i < 4; ++i) {
      TESSERA_UNROLL
      for (int g = 0; g < 4; ++g)
        sum[g] = unit::dp4a(static_cast<int>((w[i] >> (2 * g)) & 0x03030303u), x.x[g][i], sum[g]);
    }
    float acc_s = 0.0f, acc_m = 0.0f;
    TESSERA_UNROLL
    for (int g = 0; g < 4; ++g) {
      const int byte = byte8(s.sc, 2 * g + x.c);  // sub-block 8h + 2g + c
      acc_s += x.d[g] * static_cast<float>((byte & 0xF) * sum[g]);
      acc_m += x.d[g] * static_cast<float>((byte >> 4) * x.sum[g]);
    }
    const float2 dm = unit::half2(s.dm);
    return dm.x * acc_s - dm.y * acc_m;
  }
};

struct Q3Scale {
  uint32_t s[3];  // the 12 packed 6-bit scale bytes
  uint32_t d;     // fp16 bits
};

// q3_K: w = d (sc - 32) q per 16-element sub-block, q = (2 low bits | high bit << 2) - 4 in -4..3. q2_K's unit for
// the low bits (qs at quants byte 32 on), hmask bytes [16c, + 16) for the high bits (bit 4h + g of byte i is element
// 128h + 32g + 16c + i's): the two units of a c share that vector.
template <>
struct QuantFmt<DType::Q3_K> {
  static constexpr int kUnit = 64, kQuantBytes = 24, kScaleBytes = 3, kVecs = 2;
  using Scale = Q3Scale;
  using Act = ActQuarterK<false>;
  // Row pointers: quants [units / 4, 96] (hmask then qs), scales [units / 4, 12], tail d [units / 4, 2].
  TESSERA_UNIT static void load(const uint8_t* qrow, const uint8_t* srow, const uint8_t* trow, int b, uint4 (&wv)[2],
                                Scale& sc) {
    const int sb = b >> 2, h = (b >> 1) & 1, c = b & 1;
    const uint8_t* q = qrow + static_cast<size_t>(sb) * 96;
    wv[0] = unit::ld16(q + 32 + 32 * h + 16 * c);  // qs
    wv[1] = unit::ld16(q + 16 * c);                // hmask
    const uint8_t* sp = srow + static_cast<size_t>(sb) * 12;
    sc.s[0] = unit::ld4(sp);
    sc.s[1] = unit::ld4(sp + 4);
    sc.s[2] = unit::ld4(sp + 8);
    sc.d = unit::ld_u16(trow + static_cast<size_t>(sb) * 2);
  }
  // Scale j = 8h + 2g + c minus 32 (format_detail::q3_k_scale): low 4 bits in byte 2g + c's nibble h, high 2 bits in
  // byte 8 + (2g + c) % 4 at bit 2 (2h + g / 2).
  TESSERA_UNIT static int scale(const Scale& s, int h, int g, int c) {
    const int i = 2 * g + c;
    const int low = static_cast<int>(((i < 4 ? s.s[0] : s.s[1]) >> (8 * (i & 3) + 4 * h)) & 0xFu);
    const int high = static_cast<int>((s.s[2] >> (8 * (i & 3) + 2 * (2 * h + g / 2))) & 3u);
    return (low | (high << 4)) - 32;
  }
  TESSERA_UNIT static float dot(const uint4 (&wq)[2], const Scale& s, const Act& x) {
    const uint32_t a[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
    const uint32_t m[4] = {wq[1].x, wq[1].y, wq[1].z, wq[1].w};
    int sum[4] = {0, 0, 0, 0};
    TESSERA_UNROLL
    for (int i = 0; i < 4; ++i) {
      TESSERA_UNROLL
      for (int g = 0; g < 4; ++g) {
        const uint32_t q = ((a[i] >> (2 * g)) & 0x03030303u) | (((m[i] >> (4 * x.h + g)) & 0x01010101u) << 2);
        // q - 4 per byte without borrows across bytes (q6_K's centered, with 4 for 32).
        const int centered = static_cast<int>(((q | 0x80808080u) - 0x04040404u) ^ 0x80808080u);
        sum[g] = unit::dp4a(centered, x.x[g][i], sum[g]);
      }
    }
    float acc = 0.0f;
    TESSERA_UNROLL
    for (int g = 0; g < 4; ++g) acc += x.d[g] * static_cast<float>(scale(s, x.h, g, x.c) * sum[g]);
    return format_detail::half_value(static_cast<uint16_t>(s.d)) * acc;
  }
};

template <>
struct QuantFmt<DType::TQ2_0> {
  static constexpr int kUnit = 128, kQuantBytes = 32, kScaleBytes = 1, kVecs = 2;
  using Scale = uint32_t;  // the super-block's fp16 d
  using Act = ActQuad;
  // Row pointers: quants [units, 32] (a super-block's 64 bytes are its two units in order), d [units / 2, 2].
  TESSERA_UNIT static void load(const uint8_t* qrow, const uint8_t* srow, const uint8_t* /*trow*/, int b,
                                uint4 (&wv)[2], Scale& sc) {
    wv[0] = unit::ld16_pair(qrow + static_cast<size_t>(b) * 32);
    wv[1] = unit::ld16_pair(qrow + static_cast<size_t>(b) * 32 + 16);
    sc = unit::ld_u16(srow + static_cast<size_t>(b >> 1) * 2);
  }
  // sum q q_x over activation block s (0..3) of the unit: the codes at shift 2s of the unit's eight words.
  TESSERA_UNIT static int block_sum(const uint4 (&wq)[2], int s, const int (&x)[8]) {
    const uint32_t w[8] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w, wq[1].x, wq[1].y, wq[1].z, wq[1].w};
    int sum = 0;
    TESSERA_UNROLL
    for (int i = 0; i < 8; ++i) sum = unit::dp4a(static_cast<int>((w[i] >> (2 * s)) & 0x03030303u), x[i], sum);
    return sum;
  }
  TESSERA_UNIT static float dot(const uint4 (&wq)[2], const Scale& d, const ActQuad& x) {
    float acc = 0.0f;
    TESSERA_UNROLL
    for (int s = 0; s < 4; ++s) acc += x.ds[s].x * static_cast<float>(block_sum(wq, s, x.x[s])) - x.ds[s].y;
    return format_detail::half_value(static_cast<uint16_t>(d)) * acc;
  }
};

// Whether a format's GEMV unit is one of the units above (loaded and dotted through QuantFmt<D>: every format with an
// Act); q8_0, q4_0, q4_1 and iq4_nl are the kernels' own 32-block code.
template <DType D, typename = void>
struct HasUnitAct : std::false_type {};
template <DType D>
struct HasUnitAct<D, std::void_t<typename QuantFmt<D>::Act>> : std::true_type {};
template <DType D>
constexpr bool is_unit_format() {
  return HasUnitAct<D>::value;
}

// The tail row of a format with one (q6_K's d): the tail follows all n rows' scales in the scales buffer.
template <DType D>
TESSERA_UNIT const uint8_t* tail_row(const uint8_t* scales, int n, int units, size_t row) {
  const uint8_t* tails = scales + static_cast<size_t>(n) * units * QuantFmt<D>::kScaleBytes;
  if constexpr (D == DType::Q6_K || D == DType::Q3_K)  // fp16 d per super-block
    return tails + row * (units / 4) * 2;
  else if constexpr (D == DType::Q2_K)  // fp16 d, dmin per super-block
    return tails + row * (units / 4) * 4;
  else if constexpr (D == DType::Q5_0 || D == DType::Q5_1)  // qh per 32-block
    return tails + row * units * 4;
  else
    return nullptr;
}

// Element i of row `row` of a K-quant table of n_rows rows in its SPLIT_Q layout (the embedding lookup: one element
// per thread, no block rebuilt), formed as Format<D>::dequantize forms it.
//  - q4_K: the super-block's head (d, dmin, packed scales: format_detail::q4_k_scale_min) and its 128 nibble bytes,
//    w = d sc q - dmin m;
//  - q6_K: ql|qh (192 bytes; the code as format_detail::q6_k_code reads it), the int8 scale of the 16-element
//    sub-block and, after every block's scales, fp16 d: w = (d sc) (q - 32).
//  - q5_0 / q5_1: the 16 nibble bytes, fp16 d (q5_1: d, m) and, after every block's scales, qh:
//    w = (q - 16) d or q d + m;
//  - q2_K: qs (64), the scale|min byte of the sub-block, and (d, dmin) after every block's scales:
//    w = (d sc) q - dmin m;
//  - q3_K: hmask|qs (96), the 12 scale bytes, and d after every block's scales: w = (d (sc - 32)) q.
// These four round every product and difference on its own (unit::fmul ...), so they match on the device too.
template <DType D>
TESSERA_UNIT float split_value(const uint8_t* quants, const uint8_t* scales, int n_rows, size_t row, int k, int i) {
  // A K-quant element's super-block, its index in it, and the table's super-blocks (unused by q5_0 and q5_1).
  [[maybe_unused]] const size_t sb = row * static_cast<size_t>(k / kQKK) + static_cast<size_t>(i / kQKK);
  [[maybe_unused]] const int e = i % kQKK;
  [[maybe_unused]] const size_t nsb = static_cast<size_t>(n_rows) * static_cast<size_t>(k / kQKK);
  if constexpr (D == DType::Q5_0 || D == DType::Q5_1) {
    constexpr int kSB = QuantFmt<D>::kScaleBytes;
    const size_t b = row * static_cast<size_t>(k / kQK) + static_cast<size_t>(i / kQK);
    const size_t nb = static_cast<size_t>(n_rows) * static_cast<size_t>(k / kQK);
    const int code = format_detail::q5_code(quants + b * 16, scales + nb * kSB + b * 4, i % kQK);
    const uint8_t* h = scales + b * kSB;
    const float d = format_detail::half_value(static_cast<uint16_t>(h[0] | (h[1] << 8)));
    if constexpr (D == DType::Q5_0) {
      return unit::fmul(static_cast<float>(code - 16), d);
    } else {
      const float m = format_detail::half_value(static_cast<uint16_t>(h[2] | (h[3] << 8)));
      return unit::fadd(unit::fmul(static_cast<float>(code), d), m);
    }
  } else if constexpr (D == DType::Q2_K) {
    const int code = format_detail::k_quant_2bit(quants + sb * 64, e);
    const int sc = scales[sb * 16 + e / 16];
    const uint8_t* t = scales + nsb * 16 + sb * 4;
    const float d = format_detail::half_value(static_cast<uint16_t>(t[0] | (t[1] << 8)));
    const float dmin = format_detail::half_value(static_cast<uint16_t>(t[2] | (t[3] << 8)));
    const float dl = unit::fmul(d, static_cast<float>(sc & 0xF)), ml = unit::fmul(dmin, static_cast<float>(sc >> 4));
    return unit::fsub(unit::fmul(dl, static_cast<float>(code)), ml);
  } else if constexpr (D == DType::Q3_K) {
    const uint8_t* q = quants + sb * 96;  // hmask [32], qs [64]
    const int code = format_detail::k_quant_2bit(q + 32, e) - (((q[e % 32] >> (e / 32)) & 1) ? 0 : 4);
    const int sc = format_detail::q3_k_scale(e / 16, scales + sb * 12) - 32;
    const uint8_t* t = scales + nsb * 12 + sb * 2;
    const float d = format_detail::half_value(static_cast<uint16_t>(t[0] | (t[1] << 8)));
    return unit::fmul(unit::fmul(d, static_cast<float>(sc)), static_cast<float>(code));
  } else if constexpr (D == DType::TQ2_0) {  // qs [64] (the file's order), d [2] (split_layout.h)
    const uint8_t* dp = scales + sb * 2;
    const float d = format_detail::half_value(static_cast<uint16_t>(dp[0] | (dp[1] << 8)));
    return static_cast<float>(format_detail::k_quant_2bit(quants + sb * 64, e) - 1) * d;
  } else if constexpr (D == DType::IQ4_XS) {  // head [8] (d, scales_h, scales_l), qs [128] (split_layout.h)
    const int j = e / kQK, l = e % kQK;
    const uint8_t* head = scales + sb * 8;
    const uint8_t byte = quants[sb * 128 + 16 * j + l % 16];
    const int code = l < 16 ? (byte & 0xF) : (byte >> 4);
    const int low = (head[4 + j / 2] >> (4 * (j % 2))) & 0xF;
    const int high = ((head[2] | (head[3] << 8)) >> (2 * j)) & 3;
    const float d = format_detail::half_value(static_cast<uint16_t>(head[0] | (head[1] << 8)));
    const float dl = d * static_cast<float>((low | (high << 4)) - 32);
    return dl * static_cast<float>(format_detail::iq4nl_value(code));
  } else if constexpr (D == DType::Q5_K) {  // q4_K's value with the fifth bit: qh [32] then qs [128] (split_layout.h)
    const int j = e / kQK, l = e % kQK;
    const uint8_t* head = scales + sb * 16;
    const uint8_t* q = quants + sb * 160;
    const int code = ((q[32 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF) | (((q[l] >> j) & 1) << 4);
    int sc, m;
    format_detail::q4_k_scale_min(j, head + 4, &sc, &m);
    const float d = format_detail::half_value(static_cast<uint16_t>(head[0] | (head[1] << 8)));
    const float dmin = format_detail::half_value(static_cast<uint16_t>(head[2] | (head[3] << 8)));
    return d * static_cast<float>(sc) * static_cast<float>(code) - dmin * static_cast<float>(m);
  } else if constexpr (D == DType::Q4_K) {
    const int j = e / kQK, l = e % kQK;
    const uint8_t* head = scales + sb * 16;
    const uint8_t byte = quants[sb * 128 + 32 * (j / 2) + l];
    const int q = (j & 1) ? (byte >> 4) : (byte & 0xF);
    int sc, m;
    format_detail::q4_k_scale_min(j, head + 4, &sc, &m);
    const float d = format_detail::half_value(static_cast<uint16_t>(head[0] | (head[1] << 8)));
    const float dmin = format_detail::half_value(static_cast<uint16_t>(head[2] | (head[3] << 8)));
    return d * static_cast<float>(sc) * static_cast<float>(q) - dmin * static_cast<float>(m);
  } else {
    static_assert(D == DType::Q6_K, "split_value: a format of the list above");
    const uint8_t* q = quants + sb * 192;
    const int half = e / 128, r = e % 128, group = r / 32, l = r % 32;
    const uint8_t ql = q[64 * half + l + (group & 1) * 32];
    const uint8_t qh = q[128 + 32 * half + l];
    const int code = (group < 2 ? (ql & 0xF) : (ql >> 4)) | (((qh >> (2 * group)) & 3) << 4);
    const uint8_t* dp = scales + nsb * 16 + sb * 2;
    const float d = format_detail::half_value(static_cast<uint16_t>(dp[0] | (dp[1] << 8)));
    const int8_t sc = static_cast<int8_t>(scales[sb * 16 + e / 16]);
    return (d * static_cast<float>(sc)) * static_cast<float>(code - 32);
  }
}

}  // namespace tessera::cuda::detail
