// Weight formats as traits (docs/ARCHITECTURE.md, "Weight formats"): one specialization of Format<D> per format whose
// values Tessera knows, holding the packed block struct, the block size and bytes, dequantization of one block, and
// the reference dot product of one block with 8-bit activations. The facts are constexpr and the functions are
// `__host__ __device__` when nvcc compiles this header (TESSERA_HD), so a CUDA kernel can instantiate a format's
// dequantizer as it is written here. quant.h builds its run-time table (format_info, dequantize_row, quantize_row,
// dot_q8_ref) from these specializations, and each backend builds its support table and error text from that
// (FormatSupport below): a format is one specialization plus a row in quant.cpp's table, never an edit of every op.
//
// Rounding: on the host these functions are compiled in quant.cpp with -ffp-contract=off and are bit-exact with
// gguf-py's dequantization (tests/quant). nvcc contracts a * b + c into one FMA by default, so a device instance of
// q4_1's or q4_K's dequantizer may differ from the host's in the last bit of an element.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/half.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define TESSERA_HD __host__ __device__ __forceinline__
#else
#define TESSERA_HD inline
#endif

namespace tessera {

// Activations quantized to 8 bits, one block per 32 elements: x ~= d * qs, with d = max|x| / 127 and qs rounded to
// nearest (even); s = d * sum(qs) serves the formats with an offset (q4_0's -8, q4_1's and q4_K's minimum). The same
// numbers as the CPU kernels' BlockQ8A and the CUDA kernels' (q8, ds = (d, s)) pair. A weight block of kBlockSize
// elements is dotted with kBlockSize / 32 of these.
struct BlockQ8Act {
  float d;
  float s;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8Act) == 8 + kQK, "wrong BlockQ8Act size/padding");

namespace format_detail {

TESSERA_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Exact (every half is a float); the host path is quant/half.h's, checked against numpy for all 65536 halves.
TESSERA_HD float half_value(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return fp16_to_f32(h);
#endif
}

TESSERA_HD float bf16_value(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// 6-bit scale and min of sub-block j from the 12 packed bytes of a q4_K block.
TESSERA_HD void q4_k_scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// q6_K's 6-bit code (0..63) of element e (0..255) of block b: 4 low bits in ql, 2 high bits in qh (GGML's layout).
TESSERA_HD int q6_k_code(const BlockQ6_K& b, int e) {
  const int half = e / 128, r = e % 128, group = r / 32, l = r % 32;
  const uint8_t ql = b.ql[64 * half + l + (group & 1) * 32];
  const uint8_t qh = b.qh[32 * half + l];
  const int low = group < 2 ? (ql & 0xF) : (ql >> 4);
  return low | (((qh >> (2 * group)) & 3) << 4);
}

// 6-bit scale j (0..15) of a q3_K block, before its offset of 32: 4 low bits in bytes 0..7 (low nibbles for j < 8,
// high nibbles for j >= 8), 2 high bits in bytes 8..11 (byte 8 + j % 4, bits 2 * (j / 4)) (GGML's layout).
TESSERA_HD int q3_k_scale(int j, const uint8_t* s) {
  const int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return low | (high << 4);
}

// The 2-bit field of element e (0..255) in q2_K's and q3_K's qs: per half of 128, byte l (0..31) holds elements
// l, l + 32, l + 64, l + 96 in bits 0-1, 2-3, 4-5, 6-7.
TESSERA_HD int k_quant_2bit(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

// Sum of activation codes qs[l0 .. l0 + 15]: the 16-element sub-blocks of q2_K, q3_K and q6_K carry an offset or a
// minimum per sub-block, so their dot products need the activations' sum per half block.
TESSERA_HD int32_t act_half_sum(const BlockQ8Act& x, int l0) {
  int32_t s = 0;
  for (int l = l0; l < l0 + 16; ++l) s += x.qs[l];
  return s;
}

// iq4_nl's 16 values (GGML's kvalues_iq4nl), packed 8 per 64-bit word so that device code needs no table in memory.
TESSERA_HD int iq4nl_value(int code) {
  constexpr uint64_t kLo = 0xf6eaddcfbfad9881ull;  // -127, -104, -83, -65, -49, -35, -22, -10
  constexpr uint64_t kHi = 0x7159453526190d01ull;  //    1,   13,  25,  38,  53,  69,  89, 113
  return static_cast<int8_t>(static_cast<uint8_t>((code < 8 ? kLo : kHi) >> (8 * (code & 7))));
}

// q5_0 / q5_1's 5-bit code of element j: nibble as q4_0's, bit 4 from bit j of qh (little-endian).
TESSERA_HD int q5_code(const uint8_t* qs, const uint8_t* qh, int j) {
  const int low = j < kQK / 2 ? (qs[j] & 0x0F) : (qs[j - kQK / 2] >> 4);
  return low | (((qh[j / 8] >> (j % 8)) & 1) << 4);
}

// iq4_xs's 6-bit scale of sub-block j, minus its offset 32: -32..31.
TESSERA_HD int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
  const int low = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
  const int high = (b.scales_h >> (2 * j)) & 3;
  return (low | (high << 4)) - 32;
}

// tq1_0's trit (0..2) of element e (0..255): the trit order of BlockTQ1_0. Multiplying a byte by 3^n (mod 256) moves
// trit n to the top, and (q * 3) >> 8 reads the top trit of a byte that holds ceil(256 * v / 243).
TESSERA_HD int tq1_trit(const uint8_t* qs, const uint8_t* qh, int e) {
  constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  uint8_t byte;
  int n;
  if (e < 160) {
    byte = qs[e % 32];
    n = e / 32;
  } else if (e < 240) {
    byte = qs[32 + (e - 160) % 16];
    n = (e - 160) / 16;
  } else {
    byte = qh[(e - 240) % 4];
    n = (e - 240) / 4;
  }
  const auto q = static_cast<uint8_t>(byte * kPow3[n]);
  return (static_cast<uint16_t>(q) * 3) >> 8;
}

}  // namespace format_detail

// Format<D>: kType, kName (as dtype_name prints it), Block, kBlockSize (elements), kBlockBytes, kQuantized, and
//   dequantize(const Block&, float* y /*[kBlockSize]*/)
//   dot_q8(const Block&, const BlockQ8Act* x /*[kBlockSize / 32]*/) -> float   (quantized formats only)
// A DType without a specialization is a format Tessera cannot read (dtype.h still knows its layout).
template <DType D>
struct Format;

template <>
struct Format<DType::F32> {
  static constexpr DType kType = DType::F32;
  static constexpr const char* kName = "f32";
  using Block = float;
  static constexpr int kBlockSize = 1;
  static constexpr int kBlockBytes = 4;
  static constexpr bool kQuantized = false;
  TESSERA_HD static void dequantize(const Block& b, float* y) { y[0] = b; }
};

template <>
struct Format<DType::F16> {
  static constexpr DType kType = DType::F16;
  static constexpr const char* kName = "f16";
  using Block = uint16_t;
  static constexpr int kBlockSize = 1;
  static constexpr int kBlockBytes = 2;
  static constexpr bool kQuantized = false;
  TESSERA_HD static void dequantize(const Block& b, float* y) { y[0] = format_detail::half_value(b); }
};

template <>
struct Format<DType::BF16> {
  static constexpr DType kType = DType::BF16;
  static constexpr const char* kName = "bf16";
  using Block = uint16_t;
  static constexpr int kBlockSize = 1;
  static constexpr int kBlockBytes = 2;
  static constexpr bool kQuantized = false;
  TESSERA_HD static void dequantize(const Block& b, float* y) { y[0] = format_detail::bf16_value(b); }
};

// q4_0: w = d * (q - 8), q in 0..15. Low nibbles hold elements 0..15, high nibbles 16..31.
template <>
struct Format<DType::Q4_0> {
  static constexpr DType kType = DType::Q4_0;
  static constexpr const char* kName = "q4_0";
  using Block = BlockQ4_0;
  static constexpr int kBlockSize = kQK;
  static constexpr int kBlockBytes = 18;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
  // sum (q - 8) x = dw dx sum(q qx) - 8 dw s.
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    int32_t sum = 0;
    for (int j = 0; j < kQK / 2; ++j) sum += (b.qs[j] & 0x0F) * x->qs[j] + (b.qs[j] >> 4) * x->qs[j + kQK / 2];
    const float d = format_detail::half_value(b.d);
    return d * (x->d * static_cast<float>(sum) - 8.0f * x->s);
  }
};

// q4_1: w = d * q + m, q in 0..15; same nibble order as q4_0.
template <>
struct Format<DType::Q4_1> {
  static constexpr DType kType = DType::Q4_1;
  static constexpr const char* kName = "q4_1";
  using Block = BlockQ4_1;
  static constexpr int kBlockSize = kQK;
  static constexpr int kBlockBytes = 20;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    const float m = format_detail::half_value(b.m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    int32_t sum = 0;
    for (int j = 0; j < kQK / 2; ++j) sum += (b.qs[j] & 0x0F) * x->qs[j] + (b.qs[j] >> 4) * x->qs[j + kQK / 2];
    return format_detail::half_value(b.d) * x->d * static_cast<float>(sum) + format_detail::half_value(b.m) * x->s;
  }
};

// q5_0: w = d * (q - 16), q in 0..31 (format_detail::q5_code).
template <>
struct Format<DType::Q5_0> {
  static constexpr DType kType = DType::Q5_0;
  static constexpr const char* kName = "q5_0";
  using Block = BlockQ5_0;
  static constexpr int kBlockSize = kQK;
  static constexpr int kBlockBytes = 22;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(format_detail::q5_code(b.qs, b.qh, j) - 16) * d;
  }
  // sum (q - 16) x = dw dx sum(q qx) - 16 dw s.
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    int32_t sum = 0;
    for (int j = 0; j < kQK; ++j) sum += format_detail::q5_code(b.qs, b.qh, j) * x->qs[j];
    const float d = format_detail::half_value(b.d);
    return d * (x->d * static_cast<float>(sum) - 16.0f * x->s);
  }
};

// q5_1: w = d * q + m, q in 0..31 (format_detail::q5_code).
template <>
struct Format<DType::Q5_1> {
  static constexpr DType kType = DType::Q5_1;
  static constexpr const char* kName = "q5_1";
  using Block = BlockQ5_1;
  static constexpr int kBlockSize = kQK;
  static constexpr int kBlockBytes = 24;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    const float m = format_detail::half_value(b.m);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(format_detail::q5_code(b.qs, b.qh, j)) * d + m;
  }
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    int32_t sum = 0;
    for (int j = 0; j < kQK; ++j) sum += format_detail::q5_code(b.qs, b.qh, j) * x->qs[j];
    return format_detail::half_value(b.d) * x->d * static_cast<float>(sum) + format_detail::half_value(b.m) * x->s;
  }
};

// q8_0: w = d * q, q in -127..127.
template <>
struct Format<DType::Q8_0> {
  static constexpr DType kType = DType::Q8_0;
  static constexpr const char* kName = "q8_0";
  using Block = BlockQ8_0;
  static constexpr int kBlockSize = kQK;
  static constexpr int kBlockBytes = 34;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    int32_t sum = 0;
    for (int j = 0; j < kQK; ++j) sum += b.qs[j] * x->qs[j];
    return format_detail::half_value(b.d) * x->d * static_cast<float>(sum);
  }
};

// q2_K: 16 sub-blocks of 16 consecutive elements, w = d * sc * q - dmin * m with q in 0..3 (format_detail::
// k_quant_2bit) and 4-bit sc (low nibble of scales[j]) and m (high nibble).
template <>
struct Format<DType::Q2_K> {
  static constexpr DType kType = DType::Q2_K;
  static constexpr const char* kName = "q2_k";
  using Block = BlockQ2_K;
  static constexpr int kBlockSize = kQKK;
  static constexpr int kBlockBytes = 84;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    const float dmin = format_detail::half_value(b.dmin);
    for (int e = 0; e < kQKK; ++e) {
      const float dl = d * static_cast<float>(b.scales[e / 16] & 0xF);
      const float ml = dmin * static_cast<float>(b.scales[e / 16] >> 4);
      y[e] = dl * static_cast<float>(format_detail::k_quant_2bit(b.qs, e)) - ml;
    }
  }
  // Activation block j covers sub-blocks 2j and 2j + 1; their minimums take the activations' sum per half.
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    const float d = format_detail::half_value(b.d);
    const float dmin = format_detail::half_value(b.dmin);
    float acc = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      int32_t sum[2] = {0, 0};
      for (int l = 0; l < 32; ++l) sum[l / 16] += format_detail::k_quant_2bit(b.qs, 32 * j + l) * x[j].qs[l];
      const uint8_t s0 = b.scales[2 * j], s1 = b.scales[2 * j + 1];
      const int32_t scaled = (s0 & 0xF) * sum[0] + (s1 & 0xF) * sum[1];
      const int32_t mins =
          (s0 >> 4) * format_detail::act_half_sum(x[j], 0) + (s1 >> 4) * format_detail::act_half_sum(x[j], 16);
      acc += x[j].d * (d * static_cast<float>(scaled) - dmin * static_cast<float>(mins));
    }
    return acc;
  }
};

// q3_K: 16 sub-blocks of 16 consecutive elements, w = d * (sc - 32) * q with 6-bit sc (format_detail::q3_k_scale) and
// q = (2 low bits) - 4 * !(high bit) in -4..3: the low bits as q2_K's, the high bit of element e in bit e / 32 of
// hmask[e % 32].
template <>
struct Format<DType::Q3_K> {
  static constexpr DType kType = DType::Q3_K;
  static constexpr const char* kName = "q3_k";
  using Block = BlockQ3_K;
  static constexpr int kBlockSize = kQKK;
  static constexpr int kBlockBytes = 110;
  static constexpr bool kQuantized = true;
  TESSERA_HD static int code(const Block& b, int e) {
    const int high = (b.hmask[e % 32] >> (e / 32)) & 1;
    return format_detail::k_quant_2bit(b.qs, e) - (high ? 0 : 4);
  }
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    for (int e = 0; e < kQKK; ++e) {
      const float dl = d * static_cast<float>(format_detail::q3_k_scale(e / 16, b.scales) - 32);
      y[e] = dl * static_cast<float>(code(b, e));
    }
  }
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    const float d = format_detail::half_value(b.d);
    float acc = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      int32_t sum[2] = {0, 0};
      for (int l = 0; l < 32; ++l) sum[l / 16] += code(b, 32 * j + l) * x[j].qs[l];
      const int32_t scaled = (format_detail::q3_k_scale(2 * j, b.scales) - 32) * sum[0] +
                             (format_detail::q3_k_scale(2 * j + 1, b.scales) - 32) * sum[1];
      acc += d * x[j].d * static_cast<float>(scaled);
    }
    return acc;
  }
};

// q4_K: 8 sub-blocks of 32, each w = d * sc * q - dmin * m with 6-bit sc and m; sub-block 2i takes the low nibbles of
// qs[32i .. 32i + 31], sub-block 2i + 1 their high nibbles.
template <>
struct Format<DType::Q4_K> {
  static constexpr DType kType = DType::Q4_K;
  static constexpr const char* kName = "q4_k";
  using Block = BlockQ4_K;
  static constexpr int kBlockSize = kQKK;
  static constexpr int kBlockBytes = 144;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    const float dmin = format_detail::half_value(b.dmin);
    const uint8_t* q = b.qs;
    for (int j = 0, is = 0; j < kQKK; j += 64, is += 2, q += 32) {
      int sc, m;
      format_detail::q4_k_scale_min(is, b.scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      format_detail::q4_k_scale_min(is + 1, b.scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
  // Sub-block j lines up with activation block j: sum = d sc dx sum(q qx) - dmin m s.
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    const float d = format_detail::half_value(b.d);
    const float dmin = format_detail::half_value(b.dmin);
    float acc = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      const uint8_t* q = b.qs + 32 * (j / 2);
      const int shift = 4 * (j & 1);
      int32_t sum = 0;
      for (int l = 0; l < 32; ++l) sum += ((q[l] >> shift) & 0xF) * x[j].qs[l];
      int sc, m;
      format_detail::q4_k_scale_min(j, b.scales, &sc, &m);
      acc += d * static_cast<float>(sc) * x[j].d * static_cast<float>(sum) - dmin * static_cast<float>(m) * x[j].s;
    }
    return acc;
  }
};

// q5_K: q4_K's sub-blocks, scales and nibbles, plus a fifth bit: bit j of qh[l] is bit 4 of element l of sub-block j.
// w = d * sc * q - dmin * m, q in 0..31.
template <>
struct Format<DType::Q5_K> {
  static constexpr DType kType = DType::Q5_K;
  static constexpr const char* kName = "q5_k";
  using Block = BlockQ5_K;
  static constexpr int kBlockSize = kQKK;
  static constexpr int kBlockBytes = 176;
  static constexpr bool kQuantized = true;
  TESSERA_HD static int code(const Block& b, int j, int l) {
    return ((b.qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 0xF) | (((b.qh[l] >> j) & 1) << 4);
  }
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    const float dmin = format_detail::half_value(b.dmin);
    for (int j = 0; j < kQKK / kQK; ++j) {
      int sc, m;
      format_detail::q4_k_scale_min(j, b.scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(code(b, j, l)) - m1;
    }
  }
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    const float d = format_detail::half_value(b.d);
    const float dmin = format_detail::half_value(b.dmin);
    float acc = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      int32_t sum = 0;
      for (int l = 0; l < 32; ++l) sum += code(b, j, l) * x[j].qs[l];
      int sc, m;
      format_detail::q4_k_scale_min(j, b.scales, &sc, &m);
      acc += d * static_cast<float>(sc) * x[j].d * static_cast<float>(sum) - dmin * static_cast<float>(m) * x[j].s;
    }
    return acc;
  }
};

// q6_K: 16 sub-blocks of 16 consecutive elements, w = d * sc * (q - 32) with an int8 sc per sub-block and 6-bit q
// (format_detail::q6_k_code).
template <>
struct Format<DType::Q6_K> {
  static constexpr DType kType = DType::Q6_K;
  static constexpr const char* kName = "q6_k";
  using Block = BlockQ6_K;
  static constexpr int kBlockSize = kQKK;
  static constexpr int kBlockBytes = 210;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = (d * static_cast<float>(sc[is + 0])) * static_cast<float>(q1);
        y[l + 32] = (d * static_cast<float>(sc[is + 2])) * static_cast<float>(q2);
        y[l + 64] = (d * static_cast<float>(sc[is + 4])) * static_cast<float>(q3);
        y[l + 96] = (d * static_cast<float>(sc[is + 6])) * static_cast<float>(q4);
      }
    }
  }
  // Activation block j covers sub-blocks 2j and 2j + 1.
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    const float d = format_detail::half_value(b.d);
    float acc = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      int32_t sum[2] = {0, 0};
      for (int l = 0; l < 32; ++l) sum[l / 16] += (format_detail::q6_k_code(b, 32 * j + l) - 32) * x[j].qs[l];
      const int32_t scaled = b.scales[2 * j] * sum[0] + b.scales[2 * j + 1] * sum[1];
      acc += d * x[j].d * static_cast<float>(scaled);
    }
    return acc;
  }
};

// iq4_nl: w = d * kvalues_iq4nl[q] (format_detail::iq4nl_value), nibbles as q4_0's.
template <>
struct Format<DType::IQ4_NL> {
  static constexpr DType kType = DType::IQ4_NL;
  static constexpr const char* kName = "iq4_nl";
  using Block = BlockIQ4_NL;
  static constexpr int kBlockSize = kQK;
  static constexpr int kBlockBytes = 18;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(format_detail::iq4nl_value(b.qs[j] & 0x0F)) * d;
      y[j + kQK / 2] = static_cast<float>(format_detail::iq4nl_value(b.qs[j] >> 4)) * d;
    }
  }
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    int32_t sum = 0;
    for (int j = 0; j < kQK / 2; ++j)
      sum += format_detail::iq4nl_value(b.qs[j] & 0x0F) * x->qs[j] +
             format_detail::iq4nl_value(b.qs[j] >> 4) * x->qs[j + kQK / 2];
    return format_detail::half_value(b.d) * x->d * static_cast<float>(sum);
  }
};

// iq4_xs: 8 sub-blocks of 32, w = d * (sc - 32) * kvalues_iq4nl[q] (format_detail::iq4_xs_scale); sub-block j takes
// qs[16j .. 16j + 15], low nibbles first.
template <>
struct Format<DType::IQ4_XS> {
  static constexpr DType kType = DType::IQ4_XS;
  static constexpr const char* kName = "iq4_xs";
  using Block = BlockIQ4_XS;
  static constexpr int kBlockSize = kQKK;
  static constexpr int kBlockBytes = 136;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    for (int j = 0; j < kQKK / kQK; ++j, y += kQK) {
      const float dl = d * static_cast<float>(format_detail::iq4_xs_scale(b, j));  // exact: 11 x 6 bits
      const uint8_t* q = b.qs + 16 * j;
      for (int l = 0; l < 16; ++l) {
        y[l] = dl * static_cast<float>(format_detail::iq4nl_value(q[l] & 0x0F));
        y[l + 16] = dl * static_cast<float>(format_detail::iq4nl_value(q[l] >> 4));
      }
    }
  }
  // Sub-block j lines up with activation block j.
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    const float d = format_detail::half_value(b.d);
    float acc = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      const uint8_t* q = b.qs + 16 * j;
      int32_t sum = 0;
      for (int l = 0; l < 16; ++l)
        sum += format_detail::iq4nl_value(q[l] & 0x0F) * x[j].qs[l] +
               format_detail::iq4nl_value(q[l] >> 4) * x[j].qs[l + 16];
      acc += d * static_cast<float>(format_detail::iq4_xs_scale(b, j)) * x[j].d * static_cast<float>(sum);
    }
    return acc;
  }
};

// tq1_0: w = d * (t - 1), t in 0..2 (format_detail::tq1_trit). The dot product adds and subtracts activations.
template <>
struct Format<DType::TQ1_0> {
  static constexpr DType kType = DType::TQ1_0;
  static constexpr const char* kName = "tq1_0";
  using Block = BlockTQ1_0;
  static constexpr int kBlockSize = kQKK;
  static constexpr int kBlockBytes = 54;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    for (int e = 0; e < kQKK; ++e) y[e] = static_cast<float>(format_detail::tq1_trit(b.qs, b.qh, e) - 1) * d;
  }
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    float acc = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      int32_t sum = 0;
      for (int l = 0; l < kQK; ++l) {
        const int t = format_detail::tq1_trit(b.qs, b.qh, kQK * j + l);
        sum += t == 2 ? x[j].qs[l] : t == 0 ? -x[j].qs[l] : 0;
      }
      acc += x[j].d * static_cast<float>(sum);
    }
    return format_detail::half_value(b.d) * acc;
  }
};

// tq2_0: w = d * (q - 1) with 2-bit q laid out as q2_K's (format_detail::k_quant_2bit).
template <>
struct Format<DType::TQ2_0> {
  static constexpr DType kType = DType::TQ2_0;
  static constexpr const char* kName = "tq2_0";
  using Block = BlockTQ2_0;
  static constexpr int kBlockSize = kQKK;
  static constexpr int kBlockBytes = 66;
  static constexpr bool kQuantized = true;
  TESSERA_HD static void dequantize(const Block& b, float* y) {
    const float d = format_detail::half_value(b.d);
    for (int e = 0; e < kQKK; ++e) y[e] = static_cast<float>(format_detail::k_quant_2bit(b.qs, e) - 1) * d;
  }
  TESSERA_HD static float dot_q8(const Block& b, const BlockQ8Act* x) {
    float acc = 0.0f;
    for (int j = 0; j < kQKK / kQK; ++j) {
      int32_t sum = 0;
      for (int l = 0; l < kQK; ++l) sum += (format_detail::k_quant_2bit(b.qs, kQK * j + l) - 1) * x[j].qs[l];
      acc += x[j].d * static_cast<float>(sum);
    }
    return format_detail::half_value(b.d) * acc;
  }
};

// Facts every format must satisfy: the block struct is exactly the file's bytes, and quantized blocks are whole
// activation blocks (dot_q8's contract).
template <DType D>
constexpr bool format_is_consistent() {
  using F = Format<D>;
  static_assert(sizeof(typename F::Block) == F::kBlockBytes, "block struct size differs from the format's bytes");
  static_assert(!F::kQuantized || F::kBlockSize % kQK == 0, "quantized blocks must be whole 32-element groups");
  return true;
}
static_assert(format_is_consistent<DType::F32>() && format_is_consistent<DType::F16>() &&
              format_is_consistent<DType::BF16>() && format_is_consistent<DType::Q4_0>() &&
              format_is_consistent<DType::Q4_1>() && format_is_consistent<DType::Q8_0>() &&
              format_is_consistent<DType::Q4_K>() && format_is_consistent<DType::Q6_K>() &&
              format_is_consistent<DType::Q2_K>() && format_is_consistent<DType::Q3_K>() &&
              format_is_consistent<DType::Q5_K>());
static_assert(format_is_consistent<DType::Q5_0>() && format_is_consistent<DType::Q5_1>() &&
              format_is_consistent<DType::IQ4_NL>() && format_is_consistent<DType::IQ4_XS>() &&
              format_is_consistent<DType::TQ1_0>() && format_is_consistent<DType::TQ2_0>());

}  // namespace tessera
