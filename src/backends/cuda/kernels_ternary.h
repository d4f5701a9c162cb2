// CUDA kernels for the ternary models' graph ops (graph.h): ACT_QUANT_I8 (BitLinear's int8 activation fake-quant),
// RELU2_GLU (BitNet's squared-ReLU gating) and MLGRU (the MatMul-free LM's recurrence). Same conventions as
// kernels_family.h: device pointers, host-side argument checks with one-sentence tessera::Error, launches on `stream`
// with PDL, no sync; input rows ld_x elements apart, contiguous outputs. The arithmetic follows the CPU kernels
// (backends/cpu/ops/act_quant_i8.cpp, relu2_glu.cpp, mlgru.cpp) operation for operation.
//
// Written and compiled without a GPU to run them: the op table's CUDA rows (tests/ops/op_cuda.cpp) check them on
// the GPU machine. The executors call them (backend_cuda.cpp's decoder, executor_rows.cpp).
//
// Owner: kernels/ternary_ops.cu.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstdint>

namespace tessera::cuda {

// y[r, :] = clamp(rint(x[r, :] * s), -128, 127) / s with s = 127 / max(max|x[r, :]|, 1e-5): one block per row.
// With q8 and ds (n % 32 == 0), y is also written quantized per 32 exactly as quantize_q8 quantizes it (the q8 input
// of the quantized matmuls reading y: one launch instead of two).
void act_quant_i8_rows(const float* x /*[t, ld_x]*/, int64_t ld_x, float* y /*[t, n]*/, int64_t t, int64_t n,
                       cudaStream_t stream, int8_t* q8 = nullptr /*[t, n]*/, float2* ds = nullptr /*[t, n / 32]*/);

// out[r, c] = max(gate[r, c], 0)^2 * up[r, c].
void relu2_glu_rows(const float* gate /*[t, ld_in]*/, const float* up /*[t, ld_in]*/, int64_t ld_in,
                    float* out /*[t, n]*/, int64_t t, int64_t n, cudaStream_t stream);

// The MLGRU over t steps of d channels at position n_past: f = lb + (1 - lb) sigmoid(f_raw), h = f h + (1 - f)
// silu(c_raw); state [d + 1] holds h and the tokens it has absorbed (read as zeros at n_past = 0; updated in place).
// A state that holds another position than n_past cannot raise an error on the device: the kernel writes NaN to
// every output instead, so the logits show it. One thread per channel.
void mlgru(const float* f_raw /*[t, d]*/, const float* c_raw /*[t, d]*/, const float* lb /*[d]*/,
           float* state /*[d + 1]*/, float* y /*[t, d]*/, int64_t t, int64_t d, int64_t n_past, cudaStream_t stream);

// One MLGRU step per row for rows of distinct slots whose positions live on the device (the decoder's captured step,
// batched decode): row r steps the state of slot seqs[r] (seqs null: slot 0), [d + 1] floats at states + slot (d + 1),
// at position pos[r], as mlgru does with t = 1 (NaN outputs for a state at another position). The rows' slots must
// differ. One thread per channel and row.
void mlgru_rows(const float* f_raw /*[t, d]*/, const float* c_raw /*[t, d]*/, const float* lb /*[d]*/,
                float* states /*[slots, d + 1]*/, const int32_t* seqs /*[t] or null*/, const int32_t* pos /*[t]*/,
                float* y /*[t, d]*/, int64_t t, int64_t d, cudaStream_t stream);

}  // namespace tessera::cuda
