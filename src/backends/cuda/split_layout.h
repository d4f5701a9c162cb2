// The SPLIT_Q device layout of each native quantized format (kernels.h, GemvLayout::SPLIT_Q): which bytes of a GGML
// block go to the quants array, which to the scales array, and which to the tail after all scales. GGML's blocks are
// 18-210 bytes, so most are not 16-byte aligned in a row; split this way, every block's quants and scales start on a
// 16-byte boundary (or on their own size's boundary) and the kernels read them as aligned vectors. The split moves
// bytes only: a weight takes the same bytes on the device as in the file, and `join` rebuilds the GGML block, so a
// kernel can run the format's own Format<D>::dequantize (quant/format_traits.h) on it (the dequantize-to-bf16 and
// embedding kernels do: one template serves every format).
//
// Per format, three byte ranges of Format<D>::Block: quants [kQuantOff, + kQuantBytes), scales [kScaleOff,
// + kScaleBytes), tail [kTailOff, + kTailBytes) (kTailBytes 0: none). An [n, k] weight of nb = n * k / kBlockSize
// blocks is uploaded as quants [nb, kQuantBytes] and scales [nb, kScaleBytes] followed by the tail [nb, kTailBytes]
// in the same buffer (row i of the tail at scales + nb * kScaleBytes + i * kTailBytes): rows stay contiguous within
// each array, so a kernel finds row r's blocks by r * (blocks per row).
//
// Plain C++ with TESSERA_HD functions: weights.cpp splits on the host, kernels join on the device, and the tests
// check the round trip on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "quant/format_traits.h"

namespace tessera::cuda {

template <DType D>
struct SplitLayout;

// q8_0/q4_0/q4_1: the block's head (fp16 d, and q4_1's fp16 m) is the scale, the rest the quants.
template <>
struct SplitLayout<DType::Q8_0> {
  static constexpr int kQuantOff = 2, kQuantBytes = 32, kScaleOff = 0, kScaleBytes = 2, kTailOff = 0, kTailBytes = 0;
};
template <>
struct SplitLayout<DType::Q4_0> {
  static constexpr int kQuantOff = 2, kQuantBytes = 16, kScaleOff = 0, kScaleBytes = 2, kTailOff = 0, kTailBytes = 0;
};
template <>
struct SplitLayout<DType::Q4_1> {
  static constexpr int kQuantOff = 4, kQuantBytes = 16, kScaleOff = 0, kScaleBytes = 4, kTailOff = 0, kTailBytes = 0;
};
// iq4_nl: q4_0's block with a non-linear 4-bit code (fp16 d, 16 bytes of nibbles): q4_0's split.
template <>
struct SplitLayout<DType::IQ4_NL> {
  static constexpr int kQuantOff = 2, kQuantBytes = 16, kScaleOff = 0, kScaleBytes = 2, kTailOff = 0, kTailBytes = 0;
};
// iq4_xs: the 8-byte head (fp16 d, scales_h, scales_l[4]) per super-block, and the 128 bytes of nibbles.
template <>
struct SplitLayout<DType::IQ4_XS> {
  static constexpr int kQuantOff = 8, kQuantBytes = 128, kScaleOff = 0, kScaleBytes = 8, kTailOff = 0, kTailBytes = 0;
};
// q4_K: the 16-byte head (fp16 d, fp16 dmin, 12 bytes of packed 6-bit scales and mins) as one aligned vector per
// super-block, and the 128 bytes of nibbles.
template <>
struct SplitLayout<DType::Q4_K> {
  static constexpr int kQuantOff = 16, kQuantBytes = 128, kScaleOff = 0, kScaleBytes = 16, kTailOff = 0, kTailBytes = 0;
};
// q5_K: q4_K's head, then qh (32) and qs (128) as 160 bytes of quants (contiguous in the block too).
template <>
struct SplitLayout<DType::Q5_K> {
  static constexpr int kQuantOff = 16, kQuantBytes = 160, kScaleOff = 0, kScaleBytes = 16, kTailOff = 0, kTailBytes = 0;
};
// q6_K: ql (128) and qh (64) as 192 bytes of quants, the 16 int8 sub-block scales, and fp16 d in the tail (210 bytes
// have no 16-byte split without a third array; the tail is that array, in the scales buffer).
template <>
struct SplitLayout<DType::Q6_K> {
  static constexpr int kQuantOff = 0, kQuantBytes = 192, kScaleOff = 192, kScaleBytes = 16, kTailOff = 208,
                       kTailBytes = 2;
};

// q5_0 / q5_1: the head (fp16 d; q5_1's fp16 d, m) is the scale, the 16 nibble bytes the quants, and the 4 bytes of
// fifth bits (qh) the tail, so the quants stay 16-byte vectors. The tail starts at scales + nb * kScaleBytes: 4-byte
// aligned for q5_1, only 2-byte aligned for q5_0 (odd nb), which the kernels read as two 16-bit halves.
template <>
struct SplitLayout<DType::Q5_0> {
  static constexpr int kQuantOff = 6, kQuantBytes = 16, kScaleOff = 0, kScaleBytes = 2, kTailOff = 2, kTailBytes = 4;
};
template <>
struct SplitLayout<DType::Q5_1> {
  static constexpr int kQuantOff = 8, kQuantBytes = 16, kScaleOff = 0, kScaleBytes = 4, kTailOff = 4, kTailBytes = 4;
};
// q2_K: qs (64) as the quants, the 16 packed 4-bit scale|min bytes as the scales, fp16 d and dmin in the tail.
template <>
struct SplitLayout<DType::Q2_K> {
  static constexpr int kQuantOff = 16, kQuantBytes = 64, kScaleOff = 0, kScaleBytes = 16, kTailOff = 80, kTailBytes = 4;
};
// q3_K: hmask (32) and qs (64) as 96 bytes of quants (contiguous in the block too), the 12 packed 6-bit scales as the
// scales (4-byte aligned: read as three words), fp16 d in the tail.
template <>
struct SplitLayout<DType::Q3_K> {
  static constexpr int kQuantOff = 0, kQuantBytes = 96, kScaleOff = 96, kScaleBytes = 12, kTailOff = 108,
                       kTailBytes = 2;
};
// tq2_0: the 64 bytes of 2-bit codes, then fp16 d (tq1_0 is uploaded as tq2_0: weights.cpp).
template <>
struct SplitLayout<DType::TQ2_0> {
  static constexpr int kQuantOff = 0, kQuantBytes = 64, kScaleOff = 64, kScaleBytes = 2, kTailOff = 0, kTailBytes = 0;
};

// Whether the format has a SPLIT_Q layout (a specialization above).
template <DType D, typename = void>
struct HasSplitLayout {
  static constexpr bool value = false;
};
template <DType D>
struct HasSplitLayout<D, decltype(void(SplitLayout<D>::kQuantBytes))> {
  static constexpr bool value = true;
};

// Every format with a SPLIT_Q layout (tq1_0 has none: upload_weight turns it into tq2_0).
constexpr DType kSplitFormats[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::IQ4_NL, DType::IQ4_XS,
                                   DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0,   DType::Q5_1,
                                   DType::Q2_K, DType::Q3_K, DType::TQ2_0};

// Calls f(std::integral_constant<DType, D>{}) when d is one of kSplitFormats and returns true; false for the others.
// The run-time type to compile-time layout step of the code that works on any split format (upload_weight, the tile
// GEMM's dispatch, the GEMM benchmark's random weights).
template <typename Fn>
bool with_split_layout(DType d, Fn&& f) {
  switch (d) {
#define TESSERA_SPLIT_CASE(X)                     \
  case DType::X:                                  \
    f(std::integral_constant<DType, DType::X>{}); \
    return true;
    TESSERA_SPLIT_CASE(Q8_0)
    TESSERA_SPLIT_CASE(Q4_0)
    TESSERA_SPLIT_CASE(Q4_1)
    TESSERA_SPLIT_CASE(IQ4_NL)
    TESSERA_SPLIT_CASE(IQ4_XS)
    TESSERA_SPLIT_CASE(Q4_K)
    TESSERA_SPLIT_CASE(Q5_K)
    TESSERA_SPLIT_CASE(Q6_K)
    TESSERA_SPLIT_CASE(Q5_0)
    TESSERA_SPLIT_CASE(Q5_1)
    TESSERA_SPLIT_CASE(Q2_K)
    TESSERA_SPLIT_CASE(Q3_K)
    TESSERA_SPLIT_CASE(TQ2_0)
#undef TESSERA_SPLIT_CASE
    default:
      return false;
  }
}

template <DType D>
constexpr bool split_layout_is_consistent() {
  using L = SplitLayout<D>;
  static_assert(L::kQuantBytes + L::kScaleBytes + L::kTailBytes == Format<D>::kBlockBytes,
                "the split must cover the block's bytes exactly once");
  return true;
}
static_assert(split_layout_is_consistent<DType::Q8_0>() && split_layout_is_consistent<DType::Q4_0>() &&
              split_layout_is_consistent<DType::Q4_1>() && split_layout_is_consistent<DType::Q4_K>() &&
              split_layout_is_consistent<DType::Q5_K>() && split_layout_is_consistent<DType::Q6_K>() &&
              split_layout_is_consistent<DType::IQ4_NL>() && split_layout_is_consistent<DType::IQ4_XS>());
static_assert(split_layout_is_consistent<DType::Q5_0>() && split_layout_is_consistent<DType::Q5_1>() &&
              split_layout_is_consistent<DType::Q2_K>() && split_layout_is_consistent<DType::Q3_K>());
static_assert(split_layout_is_consistent<DType::TQ2_0>());

namespace split_detail {
// Byte copy that nvcc unrolls (N is a constant); memcpy of a runtime-aligned device pointer may not be.
template <int N>
TESSERA_HD void copy(uint8_t* dst, const uint8_t* src) {
#if defined(__CUDA_ARCH__)
#pragma unroll
  for (int i = 0; i < N; ++i) dst[i] = src[i];
#else
  std::memcpy(dst, src, N);
#endif
}
}  // namespace split_detail

// Block b (0-based over the whole weight) of a weight of nb blocks: its parts' addresses in the two buffers.
template <DType D>
struct SplitPtrs {
  using L = SplitLayout<D>;
  const uint8_t* quants;  // [nb, kQuantBytes]
  const uint8_t* scales;  // [nb, kScaleBytes] then the tail [nb, kTailBytes]
  size_t nb;
  TESSERA_HD const uint8_t* quant(size_t b) const { return quants + b * L::kQuantBytes; }
  TESSERA_HD const uint8_t* scale(size_t b) const { return scales + b * L::kScaleBytes; }
  TESSERA_HD const uint8_t* tail(size_t b) const { return scales + nb * L::kScaleBytes + b * L::kTailBytes; }
};

// One GGML block -> its parts (host upload).
template <DType D>
inline void split_block(const typename Format<D>::Block& blk, uint8_t* quant, uint8_t* scale, uint8_t* tail) {
  using L = SplitLayout<D>;
  const auto* p = reinterpret_cast<const uint8_t*>(&blk);
  std::memcpy(quant, p + L::kQuantOff, L::kQuantBytes);
  std::memcpy(scale, p + L::kScaleOff, L::kScaleBytes);
  if constexpr (L::kTailBytes > 0) std::memcpy(tail, p + L::kTailOff, L::kTailBytes);
}

// Block b of a split weight -> the GGML block (device kernels that run Format<D>::dequantize; tests on the host).
template <DType D>
TESSERA_HD void join_block(const SplitPtrs<D>& w, size_t b, typename Format<D>::Block& blk) {
  using L = SplitLayout<D>;
  auto* p = reinterpret_cast<uint8_t*>(&blk);
  split_detail::copy<L::kQuantBytes>(p + L::kQuantOff, w.quant(b));
  split_detail::copy<L::kScaleBytes>(p + L::kScaleOff, w.scale(b));
  if constexpr (L::kTailBytes > 0) split_detail::copy<L::kTailBytes>(p + L::kTailOff, w.tail(b));
}

}  // namespace tessera::cuda
