// Internals of the T-row matmul (gemm.cpp): the paths it can take and the kernels behind them. Exposed (detail) so the
// tests can force every path at every t and the benchmark can time each against the others; callers use matmul.
// Plain C++ (no fmt, no CUDA language features): included by gemm.cpp, the gemm_*.cu kernels, tests and bench.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstdint>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda::detail {

enum class GemmPath : uint8_t {
  AUTO = 0,  // gemm_default_path
  ROWS,      // multi-row GEMV: the weights are read once per chunk of up to kGemmRowsChunk rows of x
  CUBLAS,    // cuBLASLt (float weights as they are; quantized weights dequantized to bf16 in the workspace first)
};

// Rows of x one multi-row GEMV pass multiplies (more would spill the per-thread accumulators); larger t repeats passes.
constexpr int kGemmRowsChunk = 8;

const char* gemm_path_name(GemmPath path);

// The path matmul takes for this weight and t (see gemm.cpp for the measurements behind it).
GemmPath gemm_default_path(DType dtype, int64_t t, int64_t n, int64_t k);

// matmul with a chosen path (AUTO: the default). Same checks and contract as matmul.
void matmul_path(const DeviceWeight& w, const float* x /*[t, K]*/, float* y /*[t, N]*/, int64_t t, GemmWorkspace& ws,
                 cudaStream_t stream, bool accumulate, GemmPath path);

// The cuBLASLt GEMM alone: y[t, N] (+)= x[t, K] · W[N, K]ᵀ with W and x both of wtype (f32, f16 or bf16); y f32, or
// with y16 in wtype's 16-bit type (f32 accumulation, rounded once at the store; accumulate reads C = D in 16 bits).
void gemm_lt(GemmWorkspace& ws, DType wtype, const void* w, const void* x, void* y, int64_t t, int64_t n, int64_t k,
             cudaStream_t stream, bool accumulate, bool y16 = false);

// ---- Kernels (gemm_rows.cu, gemm_convert.cu); arguments checked by the caller ----

// y[t, N] (+)= x[t, K] · Wᵀ for float weights, f32 x read directly (16-byte aligned), t in 1..kGemmRowsChunk.
void launch_gemm_rows_float(const DeviceWeight& w, const float* x, float* y, int t, cudaStream_t stream,
                            bool accumulate);
// Same for quantized weights against the q8 activations of t rows (quantize_q8 over t * K values).
void launch_gemm_rows_quant(const DeviceWeight& w, const int8_t* q8 /*[t, K]*/, const float2* ds /*[t, K/32]*/,
                            float* y, int t, cudaStream_t stream, bool accumulate);
// A SPLIT_Q weight -> bf16 [N, K] row-major (out holds N * K bf16, 16-byte aligned).
void launch_dequant_bf16(const DeviceWeight& w, void* out, cudaStream_t stream);
// f32 [count] -> bf16 (to_bf16) or f16, round to nearest even; count % 4 == 0, both 16-byte aligned.
void launch_f32_to_16bit(const float* x, void* out, int64_t count, bool to_bf16, cudaStream_t stream);

}  // namespace tessera::cuda::detail
