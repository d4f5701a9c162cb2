// CPU kernels of the CPU backend: the ops a llama-family forward pass needs, each with a scalar `_ref` twin that the
// tests compare against and that is the fallback on CPUs without AVX2.
//
// Conventions (docs/ARCHITECTURE.md): a linear layer computes y[T, N] = x[T, K] · Wᵀ with W stored row-major [N, K]
// exactly as GGUF stores it. Activations are float32, row-major, contiguous. Kernels that take a ThreadPool split
// their work over it; the others are cheap enough (or called on small enough data) to run on the calling thread.
// Ops whose fast version takes a pool have a `_ref` twin without one (the reference is single-threaded).
// Arguments are validated (tessera::fail with one sentence) before any work is dispatched.
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "quant/format_support.h"

namespace tessera::cpu {

// ---------------------------------------------------------------------------------------------------------------------
// Linear layers

// How a prepared weight stores its values.
enum class WeightLayout : uint8_t {
  ROWS = 0,     // the file's own row-major [N, K] bytes, read in place (no copy)
  ROWS_X8 = 1,  // quantized: rows grouped by 8, their blocks interleaved 4 bytes at a time (kernels/matmul_internal.h);
                // a repacked copy, made when the active ISA is AVX2 or better
};

// A weight matrix ready for matmul. Cheap to copy (the repacked bytes are shared).
struct PackedWeight {
  DType dtype = DType::F32;
  int64_t n = 0;  // output features (rows of W)
  int64_t k = 0;  // input features (columns of W)
  // [N, K] in `dtype`, row-major, as the file stores it. Always set (the scalar path and embedding read it), so the
  // caller must keep the memory it passed to prepare_weight alive (e.g. the mapped model file).
  const void* rows = nullptr;
  WeightLayout layout = WeightLayout::ROWS;
  const void* packed = nullptr;         // the layout's bytes when layout != ROWS
  std::shared_ptr<const void> storage;  // owns `packed`
  uint64_t packed_bytes = 0;            // size of `packed` (0 for ROWS)
};

// The CPU's weight-format table (quant/format_support.h): the formats matmul's kernels read (f32, f16, bf16, q8_0,
// q4_0, q4_1) and the one every other readable format is converted to at load (f16, by WeightCache).
const FormatSupport& matmul_formats();
// matmul_formats().is_native(dtype).
bool matmul_supports(DType dtype);

// Prepares W [n, k] (dtype, row-major, as in the file) for the active ISA: keeps the pointer for layouts the kernels
// read in place, or builds a repacked copy where that measured faster. Quantized dtypes need k % 32 == 0.
// Fails on an unsupported dtype or bad shape.
PackedWeight prepare_weight(DType dtype, const void* data, int64_t n, int64_t k);

// y[t, n] = x[t, k] · Wᵀ. Quantized weights quantize x to 8 bits per block of 32 (q8_0-like, plus block sums for
// q4_1's min term) and use integer dot products, like llama.cpp; see matmul.cpp for the measured accuracy effect.
// x and y must not overlap.
void matmul(ThreadPool& pool, const PackedWeight& w, const float* x /*[t, k]*/, float* y /*[t, n]*/, int64_t t);

// Work a caller adds to a matmul's own pool job (the LoRA step, kernels/lora.h), so it costs no dispatch of its own:
// `before(ctx, i, xq)` for i in [0, n_before) are the job's first tasks (claimed before any of the matmul's, in
// order; xq: x as the quantized formats' kernels read it, detail::BlockQ8A [t, k/32], or nullptr where the weight's
// kernel reads x as it is), and `after(ctx, r0, r1)` runs right after each of the matmul's tasks has written output
// rows [r0, r1) (y's columns [r0, r1) of every token). Tasks run concurrently: ordering them is the caller's
// (kernels/lora.cpp).
struct MatmulHooks {
  int64_t n_before = 0;
  void (*before)(void* ctx, int64_t i, const void* xq) = nullptr;
  void (*after)(void* ctx, int64_t r0, int64_t r1) = nullptr;
  void* ctx = nullptr;
};
void matmul(ThreadPool& pool, const PackedWeight& w, const float* x /*[t, k]*/, float* y /*[t, n]*/, int64_t t,
            const MatmulHooks& hooks);

// Scalar reference: each row of W dequantized with quant/quant.h (any format it reads, native or not), dot products
// accumulated in double, x kept float (no activation quantization).
void matmul_ref(DType dtype, const void* w /*[n, k]*/, const float* x /*[t, k]*/, float* y /*[t, n]*/, int64_t t,
                int64_t n, int64_t k);

// ---------------------------------------------------------------------------------------------------------------------
// Normalization, position encoding, elementwise

// y[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w. y may equal x (in place).
void rmsnorm(const float* x /*[t, d]*/, const float* w /*[d]*/, float* y /*[t, d]*/, int64_t t, int64_t d, float eps);
void rmsnorm_ref(const float* x /*[t, d]*/, const float* w /*[d]*/, float* y /*[t, d]*/, int64_t t, int64_t d,
                 float eps);

// Rotary position embedding, in place, on the first rope_dim elements of every head (the rest pass through).
// theta_i = pos[token] * inv_freq[i] for i in [0, rope_dim/2); the caller folds llama3/linear scaling into inv_freq.
// neox == false ("normal", GGUF llama): rotates pairs (x[2i], x[2i+1]) (GGUF permutes llama's q/k rows for this).
// neox == true: rotates (x[i], x[i + rope_dim/2]). rope_dim must be even and <= head_dim.
void rope(float* x /*[t, n_heads, head_dim]*/, int64_t t, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
          const int32_t* pos /*[t]*/, const float* inv_freq /*[rope_dim/2]*/, bool neox);
void rope_ref(float* x /*[t, n_heads, head_dim]*/, int64_t t, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
              const int32_t* pos /*[t]*/, const float* inv_freq /*[rope_dim/2]*/, bool neox);

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up. out may equal gate or up.
void swiglu(const float* gate /*[n]*/, const float* up /*[n]*/, float* out /*[n]*/, int64_t n);
void swiglu_ref(const float* gate /*[n]*/, const float* up /*[n]*/, float* out /*[n]*/, int64_t n);

// y += x (residual connection).
void add(float* y /*[n]*/, const float* x /*[n]*/, int64_t n);
void add_ref(float* y /*[n]*/, const float* x /*[n]*/, int64_t n);

// out[i, :] = table[ids[i], :] as float. Any dtype quant/quant.h can dequantize; d must be a whole number of blocks.
// Fails when an id is outside [0, n_vocab) (a bad token id must not read outside the table).
void embedding(DType dtype, const void* table /*[n_vocab, d]*/, int64_t n_vocab, const int32_t* ids /*[t]*/,
               float* out /*[t, d]*/, int64_t t, int64_t d);
void embedding_ref(DType dtype, const void* table /*[n_vocab, d]*/, int64_t n_vocab, const int32_t* ids /*[t]*/,
                   float* out /*[t, d]*/, int64_t t, int64_t d);

// Index of the largest value (the first one on ties; NaNs are skipped). n must be > 0.
int32_t argmax(const float* x /*[n]*/, int64_t n);
int32_t argmax_ref(const float* x /*[n]*/, int64_t n);

// ---------------------------------------------------------------------------------------------------------------------
// Attention over a KV cache

// One cache tensor (K or V): element (pos, head, i) lives at data[pos * pos_stride + head * head_stride + i] in
// `dtype` (F32 or F16). Recommended layout: head-major [n_head_kv, n_ctx, hd] (kv_head_major below): the keys one
// (token, head) task reads are then one contiguous stream, which the hardware prefetcher follows best.
struct KvView {
  DType dtype = DType::F16;
  void* data = nullptr;
  int64_t pos_stride = 0;   // elements from position p to p+1 within one head
  int64_t head_stride = 0;  // elements from kv head h to h+1
  int64_t n_ctx = 0;        // positions the cache holds (bounds check)
};

// [n_head_kv, n_ctx, hd]
KvView kv_head_major(DType dtype, void* data, int64_t n_ctx, int64_t n_head_kv, int64_t hd);
// [n_ctx, n_head_kv, hd]
KvView kv_pos_major(DType dtype, void* data, int64_t n_ctx, int64_t n_head_kv, int64_t hd);

// Writes src rows for positions [pos0, pos0 + t) into the cache (rounding to f16 when the cache is f16).
void kv_store(const KvView& dst, const float* src /*[t, n_head_kv, hd]*/, int64_t t, int64_t n_head_kv, int64_t hd,
              int64_t pos0);
void kv_store_ref(const KvView& dst, const float* src /*[t, n_head_kv, hd]*/, int64_t t, int64_t n_head_kv, int64_t hd,
                  int64_t pos0);

// Causal multi-head attention with grouped-query heads (n_head % n_head_kv == 0; query head h reads kv head
// h / (n_head / n_head_kv)). The cache holds positions [0, pos0 + t) (this chunk's K and V already stored); token i
// attends to positions [0, pos0 + i]: out[i, h, :] = softmax(scale * q[i, h, :] · K[0..pos0+i, kvh, :]ᵀ) · V[..].
// Blocked online softmax (flash-attention style): never forms a t x t matrix; threads split over (token, head).
// window > 0 (sliding-window attention): token i attends to positions (pos0 + i - window, pos0 + i] only.
void attention(ThreadPool& pool, const float* q /*[t, n_head, hd]*/, const KvView& k, const KvView& v,
               float* out /*[t, n_head, hd]*/, int64_t t, int64_t n_head, int64_t n_head_kv, int64_t hd, int64_t pos0,
               float scale, int64_t window = 0);
// Naive reference: full score row, max-subtracted softmax in double.
void attention_ref(const float* q /*[t, n_head, hd]*/, const KvView& k, const KvView& v, float* out /*[t, n_head, hd]*/,
                   int64_t t, int64_t n_head, int64_t n_head_kv, int64_t hd, int64_t pos0, float scale,
                   int64_t window = 0);

}  // namespace tessera::cpu
