// CUDA kernels for the graph ops of the families beyond Llama (graph.h): GEGLU (Gemma), HEAD_RMSNORM (Qwen3 and
// Gemma 3 q/k norms), BIAS_ADD (Qwen2 q/k/v biases), SOFTCAP (Gemma logit softcapping) and SCALE (Gemma's embedding
// scale). Same conventions as kernels.h: device pointers, host-side argument checks with one-sentence tessera::Error,
// launches on `stream` (with PDL like every kernel there), no sync. Each takes t rows whose input rows lie ld_x
// elements apart (ld_x >= the row width: a column slice of a stacked matmul output) and writes a contiguous output.
// The arithmetic follows the CPU kernels (backends/cpu/ops/*.cpp) so the op table's tolerances hold for both.
//
// Owner: kernels/family_ops.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::cuda {

// out[r, c] = gelu_tanh(gate[r, c]) * up[r, c] (tanh approximation, HF's gelu_pytorch_tanh): gate and up rows ld_in
// apart (ld_in = 2n: the two halves of one merged matmul output). out may not overlap gate or up unless ld_in == n.
void geglu_rows(const float* gate /*[t, ld_in]*/, const float* up /*[t, ld_in]*/, int64_t ld_in, float* out /*[t, n]*/,
                int64_t t, int64_t n, cudaStream_t stream);

// y[r, h*hd + i] = x[r, h*hd + i] / sqrt(mean_i(x[r, h*hd + i]^2) + eps) * w[i] for each of n_head heads of hd values;
// the sum of squares in double as the CPU reference. One warp per head.
void head_rmsnorm(const float* x /*[t, ld_x]*/, int64_t ld_x, const float* w /*[hd]*/, float* y /*[t, n_head * hd]*/,
                  int64_t t, int64_t n_head, int64_t hd, float eps, cudaStream_t stream);

// y[r, c] = x[r, c] + b[c].
void bias_add_rows(const float* x /*[t, ld_x]*/, int64_t ld_x, const float* b /*[n]*/, float* y /*[t, n]*/, int64_t t,
                   int64_t n, cudaStream_t stream);

// y[r, c] = cap * tanh(x[r, c] / cap). cap != 0.
void softcap_rows(const float* x /*[t, ld_x]*/, int64_t ld_x, float* y /*[t, n]*/, int64_t t, int64_t n, float cap,
                  cudaStream_t stream);

// y[r, c] = x[r, c] * s.
void scale_rows(const float* x /*[t, ld_x]*/, int64_t ld_x, float* y /*[t, n]*/, int64_t t, int64_t n, float s,
                cudaStream_t stream);

}  // namespace tessera::cuda
