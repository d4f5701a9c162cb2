// CUDA kernels for T > 1 rows: prefill chunks (T consecutive positions of one sequence) and batched decode (row r is
// the next token of sequence slot seq[r] at position pos[r]). Same conventions as kernels.h: y[T, N] = x[T, K] · Wᵀ,
// device pointers, host-side argument checks with one-sentence tessera::Error, launches on `stream`, no sync.
// Row-wise ops (rmsnorm, swiglu, add, embedding, quantize_q8 over t*k values) are kernels.h's, which take t already.
//
// Owners: matmul/GemmWorkspace -> gemm.cpp + kernels/gemm_*.cu; rope_store_kv_rows and attn_decode_rows ->
// kernels/rope_kv.cu and kernels/attn_decode.cu; attn_prefill -> kernels/attn_prefill.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backends/cuda/kernels.h"

namespace tessera::cuda {

// ---------------------------------------------------------------------------------------------------------------------
// Matmul for T rows

// Everything matmul needs besides its operands, allocated once per executor so that a CUDA graph can capture
// matmul calls (no allocation, no handle creation inside): the cuBLASLt handle and workspace, the activation
// converted to the weight's 16-bit type [max_t, max_k], and for quantized weights a dequantization scratch of
// max_quant_nk elements (0: none needed) used by the paths that dequantize a whole matrix before a cuBLASLt GEMM.
class GemmWorkspace {
 public:
  GemmWorkspace(int64_t max_t, int64_t max_k, int64_t max_quant_nk);
  ~GemmWorkspace();
  GemmWorkspace(const GemmWorkspace&) = delete;
  GemmWorkspace& operator=(const GemmWorkspace&) = delete;
  int64_t max_t() const;
  int64_t max_k() const;
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// y[t, N] = x[t, K] · W[N, K]ᵀ (accumulate: y += ...), f32 in and out, for every DeviceWeight format. t == 1 is
// kernels.h's gemv; small t reads the weights once for all rows (batched decode is memory-bound); large t goes through
// cuBLASLt (bf16/f16 inputs, f32 accumulate; f32 weights in full f32). Quantized weights are never kept dequantized:
// see gemm.cpp for which path serves which t and why. Error when t > ws.max_t() or K > ws.max_k().
void matmul(const DeviceWeight& w, const float* x /*[t, K]*/, float* y /*[t, N]*/, int64_t t, GemmWorkspace& ws,
            cudaStream_t stream, bool accumulate = false);

// matmul with the activation already in 16 bits, so the op producing x (rmsnorm, swiglu_rows) writes it once in the
// GEMM's input type instead of matmul converting an f32 copy on every call: x16 [t, K] is in matmul_x16_type(w.dtype)
// (bf16 for bf16 and quantized weights, f16 for f16). Always the cuBLASLt path (quantized weights dequantized to bf16
// in the workspace's scratch first), at any t, except q4_K where CudaOptions::quant_gemm takes its per-tile GEMM
// (gemm.cpp; the same bf16 weights, no expansion); below matmul_x16_min_t the multi-row GEMV of matmul is faster.
// Error for f32 weights (they take f32 x), when t > ws.max_t(), or for a matrix the expansion needs and the scratch
// cannot hold.
void matmul_x16(const DeviceWeight& w, const void* x16 /*[t, K] bf16 or f16*/, float* y /*[t, N]*/, int64_t t,
                GemmWorkspace& ws, cudaStream_t stream, bool accumulate = false);
// matmul_x16 writing y in the same 16-bit type as x (f32 accumulation, one rounding at the store): the merged gate|up
// of prefill, whose [t, 2F] output is only read by swiglu_rows16 (half the bytes of f32 written and read back:
// Llama-3-8B at t = 2048, 235 MB -> 117 MB each way per layer). accumulate: y16 += x·Wᵀ (C = D in 16 bits, beta 1;
// the sum rounded once), as the LoRA adapters' B product adds into that output. Same errors as matmul_x16.
void matmul_x16_out16(const DeviceWeight& w, const void* x16 /*[t, K]*/, void* y16 /*[t, N]*/, int64_t t,
                      GemmWorkspace& ws, cudaStream_t stream, bool accumulate = false);
// x16 · Wᵀ for a narrow W (LoRA's A_stack: N = R, a few dozen rows, against K in the thousands) as `splits` partial
// products over consecutive K slices, one strided-batched cuBLASLt GEMM: parts[s] [t, N] f32 = x16[:, Ks·s, Ks) ·
// W[:, Ks·s, Ks)ᵀ with Ks = K / splits, so the product's few output tiles become splits times as many blocks; the
// caller sums the parts (lora_sum_parts). Returns the parts written: `splits`, or 1 where cuBLASLt takes no algorithm
// for the batch (then parts[0] is the whole product). W bf16 or f16, x16 in W's type. Error for another W type, for
// splits outside 1..kMaxSplitK or not dividing K into multiples of 8, or t > ws.max_t().
constexpr int kMaxSplitK = 16;
int matmul_x16_split_k(const DeviceWeight& w, const void* x16 /*[t, K]*/, float* parts /*[splits, t, N]*/, int64_t t,
                       int splits, GemmWorkspace& ws, cudaStream_t stream);
// The slices matmul_x16_split_k should use for [t, K] · [n, K]ᵀ on the H100 (gemm.cpp says why); 1: none.
int matmul_split_k_default(int64_t t, int64_t n, int64_t k);
// swiglu_rows over a 16-bit [gate | up] (matmul_x16_out16's output): out[r, i] = silu(gate[r, i]) * up[r, i] in f32,
// written to exactly one of out (f32) or out16 (rounded to out16_type). gate and up rows [t, ld_in] of in_type (bf16
// or f16); the merged gate|up passes up = gate + F with ld_in = 2F.
void swiglu_rows16(const void* gate, const void* up, DType in_type, int64_t ld_in, float* out /*[t, n] or nullptr*/,
                   void* out16 /*[t, n] or nullptr*/, DType out16_type, int64_t t, int64_t n, cudaStream_t stream);
// out[i] = in[i] between f16 and bf16 (widened to f32, rounded to nearest even). n a multiple of 8, both buffers
// 16-byte aligned.
void convert_16bit(const void* in, DType in_type, void* out, DType out_type, int64_t n, cudaStream_t stream);
// BF16 or F16: the activation type matmul_x16 takes for weights of `wtype`; F32 when it takes none (f32 weights).
DType matmul_x16_type(DType wtype);
// The smallest t from which matmul itself takes the cuBLASLt path for weights of `wtype` at every N and K: from there
// on matmul_x16 does the same work minus the conversion of x.
int64_t matmul_x16_min_t(DType wtype);

// ---------------------------------------------------------------------------------------------------------------------
// Rotary embedding + cache store for T rows

// Row r of q [t, ld_q] holds n_head heads (q[r * ld_q + h * hd + i]); k and v rows [t, ld_kv] hold n_kv heads (ld_q,
// ld_kv >= the heads' width, so the q|k|v columns of one merged matmul output can be passed with ld = its width).
// Row r rotates q and k at position pos[r] (theta_i = pos * inv_freq[i], as rope_store_kv) and stores k and v into
// the cache of slot seq[r] (seq == nullptr: slot 0) at pos[r]. q is rotated in place. A row whose pos is outside
// [0, n_ctx) or whose slot is outside [0, n_seq) stores nothing and sets its q to NaN.
// q16 (a 16-bit cache only): the rotated q goes there instead, [t, n_head * hd] in the cache's type (what cuDNN's
// attention reads), and q is left as it was.
void rope_store_kv_rows(float* q, int64_t ld_q, const float* k, const float* v, int64_t ld_kv, const KvCacheView& cache,
                        const int32_t* pos /*[t]*/, const int32_t* seq /*[t] or nullptr*/, int64_t t, int64_t n_head,
                        int64_t rope_dim, const float* inv_freq /*[rope_dim/2]*/, bool neox, cudaStream_t stream,
                        void* q16 = nullptr);

// ---------------------------------------------------------------------------------------------------------------------
// Attention for T rows

// Batched decode: row r attends with q row r (n_head heads, stride ld_q) over positions [0, pos[r]] of slot seq[r]
// (nullptr: slot 0) and writes out [t, n_head * hd]. Split-K as attn_decode; `ws` sized for max_t rows. Graph-safe:
// pos and seq are read on the device. Invalid pos/slot: NaNs for that row.
class AttnRowsWorkspace {
 public:
  AttnRowsWorkspace(int64_t max_t, int64_t n_head, const KvCacheView& cache);
  ~AttnRowsWorkspace();
  AttnRowsWorkspace(const AttnRowsWorkspace&) = delete;
  AttnRowsWorkspace& operator=(const AttnRowsWorkspace&) = delete;
  int64_t max_t() const;
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};
void attn_decode_rows(const float* q, int64_t ld_q, const KvCacheView& cache, const int32_t* pos /*[t]*/,
                      const int32_t* seq /*[t] or nullptr*/, int64_t t, float* out /*[t, n_head * hd]*/, int64_t n_head,
                      float scale, AttnRowsWorkspace& ws, cudaStream_t stream);

// rope_store_kv_rows + attn_decode_rows in one launch, as attn_decode_rope: q [t, ld_q] and k, v [t, ld_kv] arrive
// unrotated; q is only read. Rows must use distinct slots (batched decode: one row per sequence), since a row's new
// k and v reach the cache only during the launch, not before other rows read it.
void attn_decode_rope_rows(const float* q, int64_t ld_q, const float* k, const float* v, int64_t ld_kv,
                           const KvCacheView& cache, const int32_t* pos /*[t]*/, const int32_t* seq /*[t] or nullptr*/,
                           int64_t t, int64_t rope_dim, const float* inv_freq /*[rope_dim/2]*/, bool neox,
                           float* out /*[t, n_head * hd]*/, int64_t n_head, float scale, AttnRowsWorkspace& ws,
                           cudaStream_t stream);

// Causal prefill attention, FlashAttention style (tiles of queries and keys in shared memory, online softmax, tensor
// cores, no T×T matrix in memory), GQA. The t query rows are positions p0 .. p0 + t - 1 of slot `seq` whose keys and
// values (rotated, rounded to the cache dtype) are already in the cache for positions [0, p0 + t): row i attends to
// [0, p0 + i]. This also serves chunked prefill (p0 > 0: earlier chunks are in the cache). q [t, ld_q] f32 (rotated),
// out [t, n_head * hd] f32. hd in {64, 128}. Error when p0 + t > n_ctx or seq outside [0, n_seq). An F32 cache takes
// an FFMA path instead (tiles of K and V in shared memory, online softmax, f32 throughout): the MMAs need 16 bits.
// out16 (with out == nullptr): the output written instead in out16_type (bf16 or f16), rounded once at the store,
// for an o-projection that takes a 16-bit x (matmul_x16): no f32 [t, n_head * hd] written and converted back.
void attn_prefill(const float* q, int64_t ld_q, const KvCacheView& cache, int64_t seq, int64_t p0, int64_t t,
                  float* out, int64_t n_head, float scale, cudaStream_t stream, void* out16 = nullptr,
                  DType out16_type = DType::BF16);

// The same causal prefill attention as attn_prefill_cudnn (attn_cudnn.h: q [t, ld_q] and out [t, n_head * hd] in the
// cache's 16-bit type, rotated q; keys and values already in the cache for [0, p0 + t)), by our own Hopper kernel
// (kernels/attn_prefill_tma.cu: TMA loads by a producer warpgroup, wgmma, FlashAttention-3's overlap and ping-pong).
// Needs attn_prefill_tma_supported: hd 128, an F16 or BF16 cache, n_head a multiple of n_kv, an sm_90 device; else
// `why` says which. Error for rows outside the cache, a bad slot or misaligned pointers.
bool attn_prefill_tma_supported(const KvCacheView& cache, int64_t n_head, std::string* why = nullptr);
void attn_prefill_tma(const void* q, int64_t ld_q, const KvCacheView& cache, int64_t seq, int64_t p0, int64_t t,
                      void* out, int64_t n_head, float scale, cudaStream_t stream);

// out[r] = index of the largest value of row r of x (the first on ties, NaNs skipped; 0 when all are NaN): the same
// answer as argmax (kernels.h) per row, one launch for t rows (batched greedy decoding).
void argmax_rows(const float* x /*[t, n]*/, int64_t t, int64_t n, int32_t* out /*[t]*/, cudaStream_t stream);

// Perplexity's reduction of t rows of logits x [t, n] against targets [t] (ids in 0..n-1, or -1 for a row not scored,
// which gets (0, 0)): out[r] = (log-sum-exp of row r, x[r, targets[r]]) in double, so only 16 bytes per row leave the
// device. One block per row; each thread keeps
// an online (max, sum of exp) pair in float over its strided share, the pairs are merged in double.
void row_scores(const float* x /*[t, n]*/, const int32_t* targets /*[t]*/, int64_t t, int64_t n, double2* out /*[t]*/,
                cudaStream_t stream);

}  // namespace tessera::cuda
