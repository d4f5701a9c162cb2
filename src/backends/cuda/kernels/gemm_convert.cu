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
constexpr int kTraitsThreads = 64;  // dequant_bf16_traits_kernel: 1 KB of local floats per thread

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
  } else {
    const uint4 q = __ldcs(reinterpret_cast<const uint4*>(quants) + i);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    float d, m = 0.0f;
    if constexpr (D == DType::Q4_0) {
      d = __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(scales)[i]));
    } else {
      const float2 dm = half2_to_float2(reinterpret_cast<const uint32_t*>(scales)[i]);
      d = dm.x, m = dm.y;
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t byte = (w[j / 4] >> (8 * (j % 4))) & 0xFFu;
      const int lo = static_cast<int>(byte & 15u), hi = static_cast<int>(byte >> 4);
      if constexpr (D == DType::Q4_0) {
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

// Any format with traits and a split layout: one GGML block per thread, rebuilt from the SPLIT_Q arrays (join_block)
// and expanded by the format's own Format<D>::dequantize (quant/format_traits.h: the CPU's values up to nvcc's FMA
// contraction), then rounded once to bf16 and stored as 16-byte vectors. The block's floats live in local memory (a
// super-block is 256 of them): L1-resident per thread, and the kernel stays bound by its bf16 stores.
template <DType D>
__global__ void __launch_bounds__(kTraitsThreads)
    dequant_bf16_traits_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                               uint4* __restrict__ out /*[n, k] bf16*/, int64_t blocks) {
  using F = Format<D>;
  const int64_t i = blockIdx.x * static_cast<int64_t>(kTraitsThreads) + threadIdx.x;
  if (i >= blocks) return;
  typename F::Block blk;
  join_block<D>(SplitPtrs<D>{quants, scales, static_cast<size_t>(blocks)}, static_cast<size_t>(i), blk);
  float v[F::kBlockSize];
  F::dequantize(blk, v);
  uint4* o = out + i * (F::kBlockSize / 8);
#pragma unroll 4
  for (int j = 0; j < F::kBlockSize / 8; ++j)
    o[j] = make_uint4(pack16x2(v[8 * j], v[8 * j + 1], true), pack16x2(v[8 * j + 2], v[8 * j + 3], true),
                      pack16x2(v[8 * j + 4], v[8 * j + 5], true), pack16x2(v[8 * j + 6], v[8 * j + 7], true));
}

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

template <DType D>
void launch_dequant_traits(const DeviceWeight& w, uint4* out, cudaStream_t stream) {
  const int64_t blocks = w.n * (w.k / Format<D>::kBlockSize);
  dequant_bf16_traits_kernel<D>
      <<<static_cast<unsigned>((blocks + kTraitsThreads - 1) / kTraitsThreads), kTraitsThreads, 0, stream>>>(
          w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), out, blocks);
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
    case DType::Q4_K:
      launch_dequant_traits<DType::Q4_K>(w, o, stream);
      break;
    case DType::Q5_K:
      launch_dequant_traits<DType::Q5_K>(w, o, stream);
      break;
    case DType::Q6_K:
      launch_dequant_traits<DType::Q6_K>(w, o, stream);
      break;
    default:
      fail_message("matmul: cannot dequantize this dtype to bf16");
  }
  TESSERA_CUDA_CHECK_LAUNCH("dequant_bf16_kernel");
}

}  // namespace tessera::cuda::detail
