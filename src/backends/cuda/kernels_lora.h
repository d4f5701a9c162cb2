// Unmerged LoRA adapters on the CUDA backend (docs/LORA.md, "CUDA"). A matmul node with adapters (graph::Fusion::lora,
// possibly a q|k|v or gate|up stack whose members carry their own) runs as: the base matmul over the stacked weights
// (y [t, N_total]); one GEMV or GEMM u [t, R] = x·A_stackᵀ for every adapter of the node (A_stack: the adapters' A
// rows one after another, grouped by member); then one launch of this file's kernels, which adds each member's
// u_m·B_mᵀ to its rows of y (into the residual where y accumulates into one) or, for a gate|up stack whose SwiGLU is
// the node's epilogue, forms silu(gate + Δ) · (up + Δ) from the [gate; up] output. So an adapted node costs two
// launches more than its base, however many members and adapters it has. These kernels run on CUDA cores: at decode
// and in small batches (below kLoraGemmMinT rows) the work is a few MFLOP and the launch is what costs. In larger
// prefill chunks the rows executor runs the B side as one tensor-core GEMM instead (DeviceLora::b_bd,
// executor_rows.cpp).
//
// Plain C++ header (no CUDA types) for the executors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace tessera::cuda {

constexpr int kLoraMaxMembers = 4;  // members of one stack (q|k|v: 3)
// R of one node: u's rows of a 16-token tile sit in shared memory (16 x (512 + 8) floats: 33 KB of the 48 KB a launch
// gets without opting in). Rank 64 on each of q, k and v with two adapters is 384.
constexpr int64_t kLoraMaxRank = 512;

// From this many rows the rows executor adds the B terms by one cuBLASLt GEMM per node (y += u·B_bdᵀ, C = D) rather
// than lora_b_add / lora_b_swiglu_rows. The kernels do 2·t·N·r FLOPs on CUDA cores (r: each row's member's rank;
// ~9 TFLOP/s measured on the H100 for Llama-3-8B's gate|up at t = 512, rank 16: 0.47 GFLOP in ~51 us) and read B
// once per 16-token tile; the GEMM costs about a launch (~3-5 us) plus one pass over y (read C, write D). Up to 16 rows
// the kernel is one tile and a few MFLOP (gate|up at rank 16: 2·16·28672·16 = 15 MFLOP, ~2 us): no slower than the
// GEMM and no pass over y added; at 32 rows (~4 us) they are about even, beyond that the tensor cores win.
constexpr int64_t kLoraGemmMinT = 32;

// Where each member's adapters act. A member with adapters has its B's side by side as one row-major f16 matrix
// [rows, r_pad] (r_pad: the ranks summed, rounded up to 8; zero columns) at element b0 of the B buffer, and its
// adapters' A products are u's columns [u0, u0 + r). rows 0: no adapter on that member.
struct LoraBLayout {
  int n_members = 0;
  int64_t row0[kLoraMaxMembers] = {};
  int64_t rows[kLoraMaxMembers] = {};
  int r[kLoraMaxMembers] = {};
  int r_pad[kLoraMaxMembers] = {};
  int u0[kLoraMaxMembers] = {};
  int64_t b0[kLoraMaxMembers] = {};
  int r_total = 0;  // u's width (row stride)
};

// y[i, row0_m + j] += Σ_c u[i, u0_m + c] · B_m[j, c] for every member m with adapters and j < rows_m, i < t. y's rows
// are ld_y floats apart; n: y's columns (N_total). b: the f16 B buffer (16-byte aligned). With `base` (rows ld_base
// apart, not y) every column of y becomes (accumulate ? y : 0) + base + the adapters' term: the decoder's GEMV over
// [W; A_stack] writes base and u into one buffer, and this launch forms the output (or adds it to the residual).
void lora_b_add(const void* b, const LoraBLayout& l, const float* u /*[t, r_total]*/, float* y, int64_t ld_y, int64_t n,
                int64_t t, cudaStream_t stream, const float* base = nullptr, int64_t ld_base = 0,
                bool accumulate = true);
// The SwiGLU epilogue of a [gate; up] stack (gate rows [0, f), up rows [f, 2f)): out[i, j] = silu(gu[i, j] + Δ(i, j)) ·
// (gu[i, f + j] + Δ(i, f + j)), Δ(i, row) the adapters' term of lora_b_add. gu [t, 2f] f32, out [t, f] f32.
void lora_b_swiglu(const void* b, const LoraBLayout& l, const float* u /*[t, r_total]*/, const float* gu, float* out,
                   int64_t f, int64_t t, cudaStream_t stream);
// The same over prefill's gate|up output as swiglu_rows and swiglu_rows16 read it (the SWIGLU node after a gate|up
// stack with adapters: the Δ terms join there, so the stack's output is not read and written once more): gate [t, f]
// at `gate`, up at gate + up_off elements, rows ld_in elements apart, in f32 (in_type F32) or 16 bits (BF16, F16:
// matmul_x16_out16's output); Δ of gate column j is row j of the stack, of up column j row up_off + j. Written to
// exactly one of out (f32 [t, f]) or out16 ([t, f] in out16_type, bf16 or f16).
void lora_b_swiglu_rows(const void* b, const LoraBLayout& l, const float* u /*[t, r_total]*/, const void* gate,
                        DType in_type, int64_t ld_in, int64_t up_off, float* out, void* out16, DType out16_type,
                        int64_t f, int64_t t, cudaStream_t stream);

// u16 [count] = Σ_s parts[s] [count] (f32 parts of matmul_x16_split_k: u = x·A_stackᵀ over slices of K), rounded to
// type (BF16 or F16: the B GEMM's input). count a multiple of 4, parts 16-byte aligned.
void lora_sum_parts(const float* parts /*[splits, count]*/, int splits, int64_t count, void* u16, DType type,
                    cudaStream_t stream);

}  // namespace tessera::cuda
