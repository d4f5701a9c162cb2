// Elementwise ops over 16-bit prefill activations.
// swiglu_rows16: SwiGLU over the 16-bit output of prefill's merged gate|up matmul (matmul_x16_out16): at Llama-3-8B's
// t = 2048 the f32 [t, 2 * 14336] gate|up output is 235 MB written by the GEMM and read back here per layer; in 16
// bits both moves halve. The values are widened to f32, silu(g) * u is formed in f32 as swiglu_rows does, and rounded
// once at the 16-bit store (or stored in f32 when down's matmul takes an f32 x).
// convert_16bit: f16 <-> bf16 (cuDNN attention writes the cache's type; the o-projection may take the other).
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kThreads = 256;

// Eight columns per thread: one 16-byte load of gate, one of up, one 16-byte (16-bit out) or two (f32 out) stores.
__global__ void __launch_bounds__(kThreads)
    swiglu16_vec_kernel(const uint4* gate, const uint4* up, int64_t ld8, bool in_bf16, uint4* out16, bool out_bf16,
                        float4* out, int64_t n8, int64_t count) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= count) return;
  const int64_t r = i / n8, c = i - r * n8;
  const uint4 g4 = gate[r * ld8 + c], u4 = up[r * ld8 + c];
  const uint32_t gw[4] = {g4.x, g4.y, g4.z, g4.w}, uw[4] = {u4.x, u4.y, u4.z, u4.w};
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint16_t g = static_cast<uint16_t>(gw[j / 2] >> (16 * (j % 2)));
    const uint16_t u = static_cast<uint16_t>(uw[j / 2] >> (16 * (j % 2)));
    v[j] = silu_mul(from16(g, in_bf16), from16(u, in_bf16));
  }
  if (out16) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      w[j] = pack16x2(v[2 * j], v[2 * j + 1], out_bf16);
    out16[i] = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    out[2 * i] = make_float4(v[0], v[1], v[2], v[3]);
    out[2 * i + 1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

__global__ void __launch_bounds__(kThreads)
    swiglu16_kernel(const uint16_t* gate, const uint16_t* up, int64_t ld_in, bool in_bf16, uint16_t* out16,
                    bool out_bf16, float* out, int64_t n, int64_t count) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= count) return;
  const int64_t r = i / n, c = i - r * n;
  const float v = silu_mul(from16(gate[r * ld_in + c], in_bf16), from16(up[r * ld_in + c], in_bf16));
  if (out16)
    out16[i] = to16(v, out_bf16);
  else
    out[i] = v;
}

// Eight values per thread: widened to f32, rounded once to the other type.
__global__ void __launch_bounds__(kThreads)
    convert16_kernel(const uint4* in, bool in_bf16, uint4* out, bool out_bf16, int64_t n8) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  if (i >= n8) return;
  const uint4 a = in[i];
  const uint32_t w[4] = {a.x, a.y, a.z, a.w};
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    o[j] = pack16x2(from16(static_cast<uint16_t>(w[j]), in_bf16), from16(static_cast<uint16_t>(w[j] >> 16), in_bf16),
                    out_bf16);
  out[i] = make_uint4(o[0], o[1], o[2], o[3]);
}

}  // namespace
}  // namespace detail

void convert_16bit(const void* in, DType in_type, void* out, DType out_type, int64_t n, cudaStream_t stream) {
  const std::string o = "convert_16bit";
  TESSERA_CUDA_REQUIRE((in_type == DType::BF16 || in_type == DType::F16) &&
                           (out_type == DType::BF16 || out_type == DType::F16),
                       o + ": both types must be bf16 or f16");
  TESSERA_CUDA_REQUIRE(in && out && n > 0 && n % 8 == 0 && detail::aligned16(in) && detail::aligned16(out),
                       o + ": needs non-null 16-byte aligned buffers and a positive count that is a multiple of 8");
  detail::launch("convert16_kernel", detail::convert16_kernel,
                 dim3(static_cast<unsigned>((n / 8 + detail::kThreads - 1) / detail::kThreads)), dim3(detail::kThreads),
                 0, stream, static_cast<const uint4*>(in), in_type == DType::BF16, static_cast<uint4*>(out),
                 out_type == DType::BF16, n / 8);
}

void swiglu_rows16(const void* gate, const void* up, DType in_type, int64_t ld_in, float* out, void* out16,
                   DType out16_type, int64_t t, int64_t n, cudaStream_t stream) {
  const std::string o = "swiglu_rows16";
  TESSERA_CUDA_REQUIRE(n > 0 && t > 0 && t * n <= (int64_t{1} << 34), o + ": " + detail::num(t) + " rows of " +
                                                                           detail::num(n) +
                                                                           " values are outside the supported sizes");
  TESSERA_CUDA_REQUIRE(gate && up && ((out == nullptr) != (out16 == nullptr)),
                       o + ": gate, up and exactly one of out and out16 must be given");
  TESSERA_CUDA_REQUIRE(in_type == DType::BF16 || in_type == DType::F16, o + ": the input must be bf16 or f16");
  TESSERA_CUDA_REQUIRE(out16 == nullptr || out16_type == DType::BF16 || out16_type == DType::F16,
                       o + ": the 16-bit output must be bf16 or f16");
  TESSERA_CUDA_REQUIRE(ld_in >= n, o + ": the input row stride " + detail::num(ld_in) + " is smaller than the row width " +
                                       detail::num(n));
  const bool in_bf16 = in_type == DType::BF16, out_bf16 = out16_type == DType::BF16;
  const int64_t count = t * n;
  if (n % 8 == 0 && ld_in % 8 == 0 && detail::aligned16(gate) && detail::aligned16(up) && detail::aligned16(out) &&
      detail::aligned16(out16)) {
    detail::launch("swiglu16_vec_kernel", detail::swiglu16_vec_kernel,
                   dim3(static_cast<unsigned>((count / 8 + detail::kThreads - 1) / detail::kThreads)),
                   dim3(detail::kThreads), 0, stream, static_cast<const uint4*>(gate), static_cast<const uint4*>(up),
                   ld_in / 8, in_bf16, static_cast<uint4*>(out16), out_bf16, reinterpret_cast<float4*>(out), n / 8,
                   count / 8);
  } else {
    detail::launch("swiglu16_kernel", detail::swiglu16_kernel,
                   dim3(static_cast<unsigned>((count + detail::kThreads - 1) / detail::kThreads)),
                   dim3(detail::kThreads), 0, stream, static_cast<const uint16_t*>(gate),
                   static_cast<const uint16_t*>(up), ld_in, in_bf16, static_cast<uint16_t*>(out16), out_bf16, out, n,
                   count);
  }
}

}  // namespace tessera::cuda
