// Operand conversions in front of the cuBLASLt GEMM (gemm.cpp): the f32 activation rounded to the weight's 16-bit
// type, and a quantized weight expanded to bf16 in the workspace's scratch, one matrix at a time (never the model).
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/split_layout.h"
#include "quant/format_traits.h"

namespace tessera::cuda::detail {
namespace {

constexpr int kThreads = 256;

// Eight values per thread: two 16-byte loads, one 16-byte store.
__global__ void __launch_bounds__(kThreads)
    f32_to_16bit_vec_kernel(const float4* __restrict__ x, uint4* __restrict__ out, int64_t n8, bool to_bf16) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= n8) return;
  const float4 a = __ldcs(x + 2 * i), b = __ldcs(x + 2 * i + 1);
  out[i] = make_uint4(pack16x2(a.x, a.y, to_bf16), pack16x2(a.z, a.w, to_bf16), pack16x2(b.x, b.y, to_bf16),
                      pack16x2(b.z, b.w, to_bf16));
}

__global__ void __launch_bounds__(kThreads)
    f32_to_16bit_kernel(const float* __restrict__ x, uint16_t* __restrict__ out, int64_t n, bool to_bf16) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= n) return;
  out[i] = to16(x[i], to_bf16);
}

// One 32-block per thread: its quants and scale in, 32 bf16 (64 bytes) out. The value is formed in f32 exactly as the
// CPU dequantizer does (d * q, d * (q - 8), d * q + m), then rounded once to bf16.
template <DType D>
__global__ void __launch_bounds__(kThreads)
    dequant_bf16_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                        uint4* __restrict__ out /*[n, k] bf16*/, int64_t blocks) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= blocks) return;
  float v[kQ];
  if constexpr (D == DType::Q8_0) {
    const float d = __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(scales)[i]));
    const uint4 q0 = __ldcs(reinterpret_cast<const uint4*>(quants) + 2 * i);
    const uint4 q1 = __ldcs(reinterpret_cast<const uint4*>(quants) + 2 * i + 1);
    const uint32_t w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
    for (int j = 0; j < kQ; ++j)
      v[j] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>((w[j / 4] >> (8 * (j % 4))) & 0xFFu)));
  } else if constexpr (D == DType::Q5_0 || D == DType::Q5_1) {
    // q4_0's / q4_1's nibbles with the fifth bit of element j in bit j of the block's qh, which follows every block's
    // scales (split_layout.h; q5_0's only 2-byte aligned: two 16-bit loads).
    constexpr int kSB = D == DType::Q5_0 ? 2 : 4;
    const uint4 q = __ldcs(reinterpret_cast<const uint4*>(quants) + i);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    const unsigned short* qh16 = reinterpret_cast<const unsigned short*>(scales + blocks * kSB) + 2 * i;
    const uint32_t qh = static_cast<uint32_t>(__ldg(qh16)) | (static_cast<uint32_t>(__ldg(qh16 + 1)) << 16);
    float d, m = 0.0f;
    if constexpr (D == DType::Q5_0) {
      d = __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(scales)[i]));
    } else {
      const float2 dm = half2_to_float2(reinterpret_cast<const uint32_t*>(scales)[i]);
      d = dm.x, m = dm.y;
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t byte = (w[j / 4] >> (8 * (j % 4))) & 0xFFu;
      const int lo = static_cast<int>((byte & 15u) | (((qh >> j) & 1u) << 4));
      const int hi = static_cast<int>((byte >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      if constexpr (D == DType::Q5_0) {  // (q - 16) * d, as Format<Q5_0>::dequantize
        v[j] = __fmul_rn(static_cast<float>(lo - 16), d);
        v[j + 16] = __fmul_rn(static_cast<float>(hi - 16), d);
      } else {  // q * d + m, as Format<Q5_1>::dequantize
        v[j] = __fadd_rn(__fmul_rn(static_cast<float>(lo), d), m);
        v[j + 16] = __fadd_rn(__fmul_rn(static_cast<float>(hi), d), m);
      }
    }
  } else {
    const uint4 q = __ldcs(reinterpret_cast<const uint4*>(quants) + i);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    float d, m = 0.0f;
    if constexpr (D == DType::Q4_0 || D == DType::IQ4_NL) {
      d = __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(scales)[i]));
    } else {
      const float2 dm = half2_to_float2(reinterpret_cast<const uint32_t*>(scales)[i]);
      d = dm.x, m = dm.y;
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t byte = (w[j / 4] >> (8 * (j % 4))) & 0xFFu;
      const int lo = static_cast<int>(byte & 15u), hi = static_cast<int>(byte >> 4);
      if constexpr (D == DType::IQ4_NL) {  // value * d, as Format<IQ4_NL>::dequantize
        v[j] = __fmul_rn(static_cast<float>(format_detail::iq4nl_value(lo)), d);
        v[j + 16] = __fmul_rn(static_cast<float>(format_detail::iq4nl_value(hi)), d);
      } else if constexpr (D == DType::Q4_0) {
        v[j] = __fmul_rn(d, static_cast<float>(lo - 8));
        v[j + 16] = __fmul_rn(d, static_cast<float>(hi - 8));
      } else {
        v[j] = __fadd_rn(__fmul_rn(d, static_cast<float>(lo)), m);
        v[j + 16] = __fadd_rn(__fmul_rn(d, static_cast<float>(hi)), m);
      }
    }
  }
#pragma unroll
  for (int o = 0; o < 4; ++o)
    out[4 * i + o] = make_uint4(pack16x2(v[8 * o], v[8 * o + 1], true), pack16x2(v[8 * o + 2], v[8 * o + 3], true),
                                pack16x2(v[8 * o + 4], v[8 * o + 5], true), pack16x2(v[8 * o + 6], v[8 * o + 7], true));
}

// The K-quants: one warp per 256-element super-block, lane t forming elements 8t .. 8t + 7 from one or two 8-byte
// loads of its quants plus the super-block's scales (broadcast loads, the same address across the warp), and storing
// them as one 16-byte bf16 vector: the warp writes the super-block's 512 bytes in one coalesced run and nothing lives
// in local memory. (The first form, one GGML block per thread through Format<D>::dequantize, kept the super-block's 256
// floats in per-thread local memory and measured ~480 GB/s on the H100 against q4_1's 1,657: docs/PERFORMANCE.md.)
// Each value is formed as Format<D>::dequantize forms it on the host (quant/format_traits.h), with every product and
// difference rounded on its own (__fmul_rn, __fsub_rn: no FMA contraction), so the f32 value is the host's bit for bit
// before its one rounding to bf16.
constexpr int kLanes = 32;  // lanes per super-block: 8 elements each

// Byte i (0..11) of a K-quant head's 12 packed scale bytes, held in the head's words y, z, w.
__device__ __forceinline__ int head_byte(const uint4& h, int i) {
  const uint32_t w = i < 4 ? h.y : i < 8 ? h.z : h.w;
  return static_cast<int>((w >> (8 * (i & 3))) & 0xFFu);
}

// format_detail::q4_k_scale_min on the head's registers.
__device__ __forceinline__ void head_scale_min(const uint4& h, int j, int& sc, int& m) {
  if (j < 4) {
    sc = head_byte(h, j) & 63;
    m = head_byte(h, j + 4) & 63;
  } else {
    sc = (head_byte(h, j + 4) & 0xF) | ((head_byte(h, j - 4) >> 6) << 4);
    m = (head_byte(h, j + 4) >> 4) | ((head_byte(h, j) >> 6) << 4);
  }
}

// Byte i (0..7) of an 8-byte load.
__device__ __forceinline__ uint32_t byte_of(const uint2& b, int i) {
  return ((i < 4 ? b.x : b.y) >> (8 * (i & 3))) & 0xFFu;
}

// Lane t's 8 values of super-block sb (of n_sb in the matrix) in the SPLIT_Q layout (split_layout.h):
//  - q4_K: quants [sb, 128] (sub-blocks 2i and 2i + 1 share 32 bytes: low and high nibbles), heads [sb, 16];
//  - q5_K: quants [sb, 160] (qh [32] then qs [128]), heads [sb, 16];
//  - q6_K: quants [sb, 192] (ql [128] then qh [64], GGML's order), int8 scales [sb, 16], then fp16 d [sb];
//  - q2_K: quants [sb, 64] (qs), scale|min bytes [sb, 16], then fp16 (d, dmin) [sb];
//  - q3_K: quants [sb, 96] (hmask [32] then qs [64]), packed scales [sb, 12], then fp16 d [sb].
template <DType D>
__device__ __forceinline__ void ksb_lane(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                                         int64_t n_sb, int64_t sb, int t, float (&v)[8]) {
  if constexpr (D == DType::Q4_K || D == DType::Q5_K) {
    constexpr int kBytes = D == DType::Q4_K ? 128 : 160;
    constexpr int kQs = D == DType::Q4_K ? 0 : 32;  // where qs starts in the super-block's quants
    const int j = t >> 2, l0 = 8 * (t & 3);         // sub-block j, elements l0 .. l0 + 7 of its 32
    const uint8_t* q = quants + sb * kBytes;
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(scales) + sb);
    const uint2 qs = __ldcs(reinterpret_cast<const uint2*>(q + kQs + 32 * (j >> 1) + l0));
    uint2 qh = make_uint2(0, 0);
    if constexpr (D == DType::Q5_K) qh = __ldcs(reinterpret_cast<const uint2*>(q + l0));
    int sc, m;
    head_scale_min(h, j, sc, m);
    const float2 dm = half2_to_float2(h.x);  // (d, dmin)
    const float d1 = __fmul_rn(dm.x, static_cast<float>(sc)), m1 = __fmul_rn(dm.y, static_cast<float>(m));
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int code = static_cast<int>((byte_of(qs, i) >> shift) & 0xFu);
      if constexpr (D == DType::Q5_K) code |= static_cast<int>((byte_of(qh, i) >> j) & 1u) << 4;
      v[i] = __fsub_rn(__fmul_rn(d1, static_cast<float>(code)), m1);
    }
  } else if constexpr (D == DType::TQ2_0) {
    // Elements 8t .. 8t + 7: half h = t / 16, codes at shift 2 ((t / 4) % 4) of bytes 32h + 8 (t % 4) .. + 7.
    const int h = t >> 4, s = (t >> 2) & 3, l0 = 8 * (t & 3);
    const uint2 qs = __ldcs(reinterpret_cast<const uint2*>(quants + sb * 64 + 32 * h + l0));
    const float d = __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(scales) + sb)));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int code = static_cast<int>((byte_of(qs, i) >> (2 * s)) & 3u);
      v[i] = __fmul_rn(static_cast<float>(code - 1), d);  // Format<TQ2_0>::dequantize: (q - 1) * d
    }
  } else if constexpr (D == DType::IQ4_XS) {
    // Sub-block j = t / 4 takes qs [16j, 16j + 16): elements 0-15 in the low nibbles, 16-31 in the high ones.
    const int j = t >> 2, l0 = 8 * (t & 3);
    const uint2 qs = __ldcs(reinterpret_cast<const uint2*>(quants + sb * 128 + 16 * j + (l0 & 15)));
    const uint2 h = __ldg(reinterpret_cast<const uint2*>(scales) + sb);  // d | scales_h << 16, scales_l[0..3]
    const int sc = static_cast<int>(((h.y >> (4 * j)) & 0xFu) | (((h.x >> (16 + 2 * j)) & 3u) << 4)) - 32;
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x & 0xFFFFu)));
    const float dl = __fmul_rn(d, static_cast<float>(sc));
    const int shift = l0 >= 16 ? 4 : 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int code = static_cast<int>((byte_of(qs, i) >> shift) & 0xFu);
      v[i] = __fmul_rn(dl, static_cast<float>(format_detail::iq4nl_value(code)));
    }
  } else if constexpr (D == DType::Q2_K) {
    // Lane t: elements 128 half + 32 group + l0 .. + 7, 2 bits each at bits 2 group of qs [32 half + l0, + 8);
    // sub-block t / 2's scale|min byte; (d, dmin) after every super-block's scales.
    const int half = t >> 4, group = (t >> 2) & 3, l0 = 8 * (t & 3);
    const uint2 qs = __ldcs(reinterpret_cast<const uint2*>(quants + sb * 64 + 32 * half + l0));
    const int sm = __ldg(scales + sb * 16 + (t >> 1));
    const float2 dm = half2_to_float2(__ldg(reinterpret_cast<const uint32_t*>(scales + n_sb * 16) + sb));
    const float dl = __fmul_rn(dm.x, static_cast<float>(sm & 0xF)), ml = __fmul_rn(dm.y, static_cast<float>(sm >> 4));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int code = static_cast<int>((byte_of(qs, i) >> (2 * group)) & 3u);
      v[i] = __fsub_rn(__fmul_rn(dl, static_cast<float>(code)), ml);
    }
  } else if constexpr (D == DType::Q3_K) {
    // Lane t: as q2_K's lane for the low bits (qs at byte 32 of the super-block's 96), the high bit of element e in
    // bit e / 32 = 4 half + group of hmask [l0, + 8); the 12 packed scales (format_detail::q3_k_scale), and d after
    // every super-block's scales.
    const int half = t >> 4, group = (t >> 2) & 3, l0 = 8 * (t & 3);
    const uint8_t* q = quants + sb * 96;
    const uint2 qs = __ldcs(reinterpret_cast<const uint2*>(q + 32 + 32 * half + l0));
    const uint2 hm = __ldcs(reinterpret_cast<const uint2*>(q + l0));
    const uint8_t* s = scales + sb * 12;
    const int j = t >> 1;  // sub-block (8t) / 16
    const int low = j < 8 ? (__ldg(s + j) & 0xF) : (__ldg(s + j - 8) >> 4);
    const int high = (__ldg(s + 8 + j % 4) >> (2 * (j / 4))) & 3;
    const float d =
        __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(scales + n_sb * 12) + sb)));
    const float dl = __fmul_rn(d, static_cast<float>((low | (high << 4)) - 32));
    const int hbit = 4 * half + group;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int code =
          static_cast<int>((byte_of(qs, i) >> (2 * group)) & 3u) - (((byte_of(hm, i) >> hbit) & 1u) ? 0 : 4);
      v[i] = __fmul_rn(dl, static_cast<float>(code));
    }
  } else {
    static_assert(D == DType::Q6_K, "ksb_lane: q2_K, q3_K, q4_K, q5_K, q6_K iq4_xs or tq2_0");
    const int half = t >> 4, group = (t >> 2) & 3, l0 = 8 * (t & 3);  // elements 128 half + 32 group + l0 ..
    const uint8_t* q = quants + sb * 192;
    const uint2 ql = __ldcs(reinterpret_cast<const uint2*>(q + 64 * half + 32 * (group & 1) + l0));
    const uint2 qh = __ldcs(reinterpret_cast<const uint2*>(q + 128 + 32 * half + l0));
    const int sc = static_cast<int8_t>(__ldg(scales + sb * 16 + (t >> 1)));  // sub-block (8t) / 16
    const float d =
        __half2float(__ushort_as_half(__ldg(reinterpret_cast<const unsigned short*>(scales + n_sb * 16) + sb)));
    const float ds = __fmul_rn(d, static_cast<float>(sc));
    const int lo_shift = group < 2 ? 0 : 4, hi_shift = 2 * group;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int code =
          static_cast<int>(((byte_of(ql, i) >> lo_shift) & 0xFu) | (((byte_of(qh, i) >> hi_shift) & 3u) << 4));
      v[i] = __fmul_rn(ds, static_cast<float>(code - 32));
    }
  }
}

template <DType D>
__global__ void __launch_bounds__(kThreads)
    dequant_bf16_ksb_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                            uint4* __restrict__ out /*[n, k] bf16*/, int64_t n_sb) {
  const int64_t sb = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) / kLanes;
  if (sb >= n_sb) return;
  const int t = static_cast<int>(threadIdx.x) % kLanes;
  float v[8];
  ksb_lane<D>(quants, scales, n_sb, sb, t, v);
  out[sb * kLanes + t] = make_uint4(pack16x2(v[0], v[1], true), pack16x2(v[2], v[3], true), pack16x2(v[4], v[5], true),
                                    pack16x2(v[6], v[7], true));
}

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

template <DType D>
void launch_dequant_ksb(const DeviceWeight& w, uint4* out, cudaStream_t stream) {
  const int64_t n_sb = w.n * (w.k / kQKK);
  dequant_bf16_ksb_kernel<D>
      <<<blocks_for(n_sb * kLanes), kThreads, 0, stream>>>(w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), out, n_sb);
}

}  // namespace

void launch_f32_to_16bit(const float* x, void* out, int64_t count, bool to_bf16, cudaStream_t stream) {
  if (count <= 0) return;
  if (count % 8 == 0 && aligned16(x) && aligned16(out)) {
    f32_to_16bit_vec_kernel<<<blocks_for(count / 8), kThreads, 0, stream>>>(
        reinterpret_cast<const float4*>(x), static_cast<uint4*>(out), count / 8, to_bf16);
  } else {
    f32_to_16bit_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, static_cast<uint16_t*>(out), count, to_bf16);
  }
  TESSERA_CUDA_CHECK_LAUNCH("f32_to_16bit_kernel");
}

void launch_dequant_bf16(const DeviceWeight& w, void* out, cudaStream_t stream) {
  const int64_t blocks = w.n * (w.k / kQ);
  const uint8_t* q = w.quants.as<uint8_t>();
  const uint8_t* s = w.scales.as<uint8_t>();
  uint4* o = static_cast<uint4*>(out);
  switch (w.dtype) {
    case DType::Q8_0:
      dequant_bf16_kernel<DType::Q8_0><<<blocks_for(blocks), kThreads, 0, stream>>>(q, s, o, blocks);
      break;
    case DType::Q4_0:
      dequant_bf16_kernel<DType::Q4_0><<<blocks_for(blocks), kThreads, 0, stream>>>(q, s, o, blocks);
      break;
    case DType::Q4_1:
      dequant_bf16_kernel<DType::Q4_1><<<blocks_for(blocks), kThreads, 0, stream>>>(q, s, o, blocks);
      break;
    case DType::IQ4_NL:
      dequant_bf16_kernel<DType::IQ4_NL><<<blocks_for(blocks), kThreads, 0, stream>>>(q, s, o, blocks);
      break;
    case DType::Q5_0:
      dequant_bf16_kernel<DType::Q5_0><<<blocks_for(blocks), kThreads, 0, stream>>>(q, s, o, blocks);
      break;
    case DType::Q5_1:
      dequant_bf16_kernel<DType::Q5_1><<<blocks_for(blocks), kThreads, 0, stream>>>(q, s, o, blocks);
      break;
    case DType::Q2_K:
      launch_dequant_ksb<DType::Q2_K>(w, o, stream);
      break;
    case DType::Q3_K:
      launch_dequant_ksb<DType::Q3_K>(w, o, stream);
      break;
    case DType::Q4_K:
      launch_dequant_ksb<DType::Q4_K>(w, o, stream);
      break;
    case DType::Q5_K:
      launch_dequant_ksb<DType::Q5_K>(w, o, stream);
      break;
    case DType::Q6_K:
      launch_dequant_ksb<DType::Q6_K>(w, o, stream);
      break;
    case DType::IQ4_XS:
      launch_dequant_ksb<DType::IQ4_XS>(w, o, stream);
      break;
    case DType::TQ2_0:
      launch_dequant_ksb<DType::TQ2_0>(w, o, stream);
      break;
    default:
      fail_message("matmul: cannot dequantize this dtype to bf16");
  }
  TESSERA_CUDA_CHECK_LAUNCH("dequant_bf16_kernel");
}

}  // namespace tessera::cuda::detail
