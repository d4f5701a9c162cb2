// Internals of the T-row matmul (gemm.cpp): the paths it can take and the kernels behind them. Exposed (detail) so the
// tests can force every path at every t and the benchmark can time each against the others; callers use matmul.
// Plain C++ (no fmt, no CUDA language features): included by gemm.cpp, the gemm_*.cu kernels, tests and bench.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstdint>
#include <string>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda::detail {

enum class GemmPath : uint8_t {
  AUTO = 0,  // gemm_default_path
  ROWS,      // multi-row GEMV: the weights are read once per chunk of up to kGemmRowsChunk rows of x
  CUBLAS,    // cuBLASLt (float weights as they are; quantized weights dequantized to bf16 in the workspace first)
  TILE,      // quantized: per-tile dequantization into wgmma fragments (gemm_quant_tile.cu; sm_90), x in bf16
};

// Rows of x one multi-row GEMV pass multiplies (more would spill the per-thread accumulators); larger t repeats passes.
constexpr int kGemmRowsChunk = 8;

const char* gemm_path_name(GemmPath path);

// The path matmul takes for this weight and t (see gemm.cpp for the measurements behind it). TILE where
// cuda_options().quant_gemm allows it (auto: a format with a tile kernel up to quant_tile_auto_max_t rows); matmul then
// falls back to CUBLAS where gemm_quant_tile_supported says no.
GemmPath gemm_default_path(DType dtype, int64_t t, int64_t n, int64_t k);
// The path matmul_x16 and matmul_x16_out16 take for a quantized weight: TILE where quant_gemm_tile allows it and the
// kernel takes this weight, x16 and device (gemm_quant_tile_supported), else CUBLAS (the expansion).
GemmPath matmul_x16_path(const DeviceWeight& w, const void* x16, int64_t t);

// The TILE path's rows under quant_gemm=auto, per format: the most rows at which the per-tile GEMM measured at least
// as fast as the expansion + cuBLASLt over one Llama-3-8B layer's four matrices (tessera_bench_gemm --tile, H100,
// t = 64, 128, 256, 512, 1024, 2048; docs/CUDA_NOTES.md): q4_K and q5_0 512 (1.007x, 1.276x there), q5_1 and iq4_nl
// 1,024 (1.046x, 1.164x), the others 256 (1.24-1.59x; 0.73-0.94x at 512). From there on the GEMM dominates and
// cuBLASLt's is faster than the tile kernel's dequantization-bound loop. 0 for a format without a tile kernel.
int64_t quant_tile_auto_max_t(DType dtype);
// Up to kQuantTileSmallT rows the tile GEMM's CTAs take 128 tokens (q4_K: 1.88x the expansion at t = 128), else 256.
constexpr int64_t kQuantTileSmallT = 128;

// matmul with a chosen path (AUTO: the default). Same checks and contract as matmul.
void matmul_path(const DeviceWeight& w, const float* x /*[t, K]*/, float* y /*[t, N]*/, int64_t t, GemmWorkspace& ws,
                 cudaStream_t stream, bool accumulate, GemmPath path);

// The cuBLASLt GEMM alone: y[t, N] (+)= x[t, K] · W[N, K]ᵀ with W and x both of wtype (f32, f16 or bf16); y f32, or
// with y16 in wtype's 16-bit type (f32 accumulation, rounded once at the store; accumulate reads C = D in 16 bits).
void gemm_lt(GemmWorkspace& ws, DType wtype, const void* w, const void* x, void* y, int64_t t, int64_t n, int64_t k,
             cudaStream_t stream, bool accumulate, bool y16 = false);

// ---- Kernels (gemm_rows.cu, gemm_convert.cu, gemm_quant_tile.cu); arguments checked by the caller ----

// y[t, N] (+)= x[t, K] · Wᵀ for float weights, f32 x read directly (16-byte aligned), t in 1..kGemmRowsChunk.
void launch_gemm_rows_float(const DeviceWeight& w, const float* x, float* y, int t, cudaStream_t stream,
                            bool accumulate);
// Same for quantized weights against the q8 activations of t rows (quantize_q8 over t * K values).
void launch_gemm_rows_quant(const DeviceWeight& w, const int8_t* q8 /*[t, K]*/, const float2* ds /*[t, K/32]*/,
                            float* y, int t, cudaStream_t stream, bool accumulate);
// The per-tile GEMM (gemm_quant_tile.cu): y[t, N] (+)= x16[t, K] · W[N, K]ᵀ, x16 bf16, y f32 or (y16) bf16 rounded
// once at the store; the same bf16 weights as launch_dequant_bf16 writes, f32 accumulation. Where its grid is under one
// wave of the device's SMs, K is split over 2 or 4 CTAs per tile whose partial sums go to parts (parts_floats f32 of
// scratch; nullptr: no split) and are added by a second kernel in a fixed order: the same bits on every run.
// Error unless gemm_quant_tile_supported(w, x16).
void launch_gemm_quant_tile(const DeviceWeight& w, const void* x16 /*[t, K]*/, void* y /*[t, N]*/, bool y16, int64_t t,
                            bool accumulate, float* parts /*[S, t, N]*/, int64_t parts_floats, cudaStream_t stream);
// Whether the format has a tile kernel (q4_K, q5_K, q6_K, q2_K, q3_K, q5_0, q5_1, iq4_nl, iq4_xs: gemm_tile_formats.h).
bool gemm_quant_tile_format(DType dtype);
// Whether launch_gemm_quant_tile takes this weight and x (x16 nullptr: the weight and device only): a format with a
// tile kernel in the SPLIT_Q layout with K a multiple of 64 and of its block, x16 16-byte aligned (TMA), an sm_90
// device with the driver's tensor-map encoder. why (if given) says what is missing.
bool gemm_quant_tile_supported(const DeviceWeight& w, const void* x16, std::string* why = nullptr);
// Looks up the device and raises the tile kernels' shared-memory limits, once per process: GemmWorkspace's constructor
// calls it, so that a graph capture never runs the first call (launch_gemm_quant_tile and gemm_quant_tile_supported
// would).
void gemm_quant_tile_prepare();
// The K slices launch_gemm_quant_tile uses for [t, K] · [n, K]ᵀ with parts_floats of scratch: 2 or 4 where the grid
// fits that many times in one wave of the device's SMs (and the partial sums fit), else 1.
int gemm_quant_tile_splits(int64_t t, int64_t n, int64_t k, int64_t parts_floats);

// A SPLIT_Q weight -> bf16 [N, K] row-major (out holds N * K bf16, 16-byte aligned).
void launch_dequant_bf16(const DeviceWeight& w, void* out, cudaStream_t stream);
// f32 [count] -> bf16 (to_bf16) or f16, round to nearest even; count % 4 == 0, both 16-byte aligned.
void launch_f32_to_16bit(const float* x, void* out, int64_t count, bool to_bf16, cudaStream_t stream);

}  // namespace tessera::cuda::detail
