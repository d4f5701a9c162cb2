// CUDA kernels for batch-1 decode (T = 1), the foundation of the CUDA backend. Decode is memory-bound: every weight
// byte is read once per token, so each kernel is judged by the bytes it moves over the measured copy bandwidth
// (bench/cuda/bench_kernels, docs/CUDA_NOTES.md).
//
// Conventions (docs/ARCHITECTURE.md): a linear layer computes y[T, N] = x[T, K] · Wᵀ with W row-major [N, K].
// All pointers are device pointers unless a parameter says `host`. Every function checks its arguments on the host
// (tessera::Error with one sentence), launches on `stream` and checks the launch; none synchronizes. Values a CUDA
// graph must not bake in (the token position, token ids) are read from device memory.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstdint>
#include <vector>

#include "backends/cuda/memory.h"
#include "core/dtype.h"

namespace tessera {
class FormatSupport;
}

namespace tessera::cuda {

// ---------------------------------------------------------------------------------------------------------------------
// Launch mode

// Programmatic Dependent Launch for every kernel of this header and kernels_rows.h's rope/attention rows kernels: the
// next kernel launches while the previous one finishes, hiding most of the ~2 us launch gap between dependent kernels
// (kernels/common.cuh says how). Process-wide; read at each launch, so set it before capturing a CUDA graph. Default:
// on. Both are CudaOptions::pdl (cuda_options.h): set_pdl(on) changes that field of cuda_options().
void set_pdl(bool on);
bool pdl_enabled();

// ---------------------------------------------------------------------------------------------------------------------
// Weights

enum class GemvLayout : uint8_t {
  ROWS = 0,  // f32/f16/bf16: the file's row-major [N, K] values
  SPLIT_Q,   // quantized formats: quants and scales in two arrays (below), so quants load as aligned 16-byte vectors
};

// A weight matrix on the device in the layout the GEMV kernels read. GGUF's 18/20/34/144/210-byte blocks are not all
// 16-byte aligned, so upload splits them (split_layout.h says which bytes go where): quants [N, K] int8 (q8_0) or
// [N, K/2] nibble bytes (q4_0, q4_1; each 16-byte group keeps GGUF's order: low nibbles are elements 0..15 of the
// block, high nibbles 16..31) and scales [N, K/32] fp16 d (q8_0, q4_0) or [N, K/32] (fp16 d, fp16 m) pairs (q4_1);
// q4_K: quants [N, K/256, 128] (its qs) and scales [N, K/256, 16] (d, dmin, packed 6-bit scales and mins); q5_K: the
// same with quants [N, K/256, 160] (qh then qs); q6_K:
// quants [N, K/256, 192] (ql then qh) and scales [N, K/256, 16] (int8) followed by the tail [N, K/256] fp16 d. Same
// bytes as the file, no padding.
struct DeviceWeight {
  DType dtype = DType::F32;
  int64_t n = 0;  // output features (rows of W)
  int64_t k = 0;  // input features
  GemvLayout layout = GemvLayout::ROWS;
  DeviceBuffer quants;  // float formats: [n, k] values
  DeviceBuffer scales;  // quantized formats only
  // Bytes one GEMV must read: the roofline's numerator.
  uint64_t bytes() const { return quants.bytes() + scales.bytes(); }
};

// The CUDA weight-format table (quant/format_support.h): the formats the kernels read (f32, f16, bf16, q8_0, q4_0,
// q4_1, q4_K, q5_K, q6_K) and bf16, which every other format Tessera reads is converted to on the host before upload
// (the executors' weight store does it once per weight, with one notice per format; every model the CPU runs also runs
// here).
const FormatSupport& weight_formats();
// A format the kernels read as it is: weight_formats().is_native(dtype).
bool gemv_supports(DType dtype);
// A native quantized format (GemvLayout::SPLIT_Q, 8-bit activations): q8_0, q4_0, q4_1, q4_K, q5_K, q6_K.
bool gemv_quantized(DType dtype);
// The format a weight of `dtype` has on the device: dtype itself when native, else bf16. Error when Tessera cannot
// read dtype at all (the text lists what the GPU reads).
DType device_weight_dtype(DType dtype);
// Host W [n, k] (dtype, GGUF layout, no kernel for it) rewritten as device_weight_dtype(dtype) rows, ready for
// upload_weight. Error for a native dtype or rows that are not whole blocks.
std::vector<uint8_t> convert_for_device(DType dtype, const void* host, int64_t n, int64_t k);

// tq1_0 rows [n, k] rewritten as the tq2_0 rows of the same values (w = d (t - 1) is w = d (q - 1) with q = t and the
// same d: exact), the layout upload_weight gives a tq1_0 weight (its DeviceWeight says tq2_0: 66 bytes per 256
// values for 54). Error for rows that are not whole blocks.
std::vector<uint8_t> tq1_0_as_tq2_0(const void* host, int64_t n, int64_t k);

// Uploads host W [n, k] (dtype, row-major, GGUF block layout) and repacks it. Fails on an unsupported dtype, on
// k % 8 != 0 (float formats: rows must start 16-byte aligned) or k not a multiple of the block (quantized: 32, or 256
// for the K-quants), or on n, k outside int32.
DeviceWeight upload_weight(DType dtype, const void* host, int64_t n, int64_t k);

// ---------------------------------------------------------------------------------------------------------------------
// GEMV: y[N] = W[N, K] · x[K] (T = 1), f32 output.

// The activation as the GEMVs read it. Float weights read `f32`. Quantized weights read x quantized to 8 bits per
// block of 32 (integer dot products, as llama.cpp and the CPU backend do): q8 = round(x / d) with d = max|x| / 127 per
// block, and ds = (d, d * sum(q)) (the sum serves q4_0's -8 offset and q4_1's min). One quantized x serves every GEMV
// that shares the input (q, k, v; gate, up); rmsnorm and swiglu can write it directly.
struct GemvInput {
  const float* f32 = nullptr;     // [K]
  const int8_t* q8 = nullptr;     // [K]
  const float2* q8_ds = nullptr;  // [K/32]
  // Float weights only: RMSNorm fused into the GEMV. When set, y = W · (x / sqrt(mean(x^2) + norm_eps) ⊙ norm_w):
  // every block streams all of x anyway, so it sums x^2 on the way and scales its rows at the end (the rmsnorm
  // launch before the q|k|v and gate|up GEMVs disappears).
  const float* norm_w = nullptr;  // [K]
  float norm_eps = 0.0f;
  // Float weights only: the weight is a merged [gate; up] matrix (2F rows) and y [F] = silu(gate · x) * (up · x), the
  // SwiGLU after the gate|up GEMV folded into its epilogue (no accumulate; the launch shape must pair rows). (The
  // quantized form, which also wrote the down projection's q8 input, measured slower and left src/:
  // docs/CUDA_NOTES.md.)
  bool swiglu = false;
  // Quantized weights, the RMSNorm before them folded away (the decoder, q4_1 by default): q8 /
  // q8_ds hold x ⊙ norm_w quantized WITHOUT the 1/rms factor (the codes of a block of 32 do not depend on it; only the
  // block scale would carry it, and every dot product is linear in the scale), and rms_sumsq [K/32] the per-block sums
  // of x^2. The GEMV sums them in a fixed order and scales its outputs by 1 / sqrt(sum / K + rms_eps). Written by the
  // GEMV before (norm_out below).
  const float* rms_sumsq = nullptr;  // [K/32]
  float rms_eps = 0.0f;
  // Quantized weights, the output side of the same fold: the GEMV's (accumulated) outputs y [N] are the residual stream
  // that an RMSNorm with weight norm_out_w reads next; per block of 32 outputs it also writes the rms-free q8 codes
  // and scales of y ⊙ norm_out_w and the block's sum of y^2 (the next GEMV's q8 / q8_ds / rms_sumsq). The blocks of a
  // group of 32 rows run as one block of warps, each warp streaming the launch shape's rows of the group, and warp 0
  // quantizes the 32 values from shared memory: no fence, no atomic, no cluster (a thread-block cluster form measured
  // slower and left src/). N % 32 == 0; launch shapes: gemv_norm_out_supported.
  const float* norm_out_w = nullptr;  // [N]
  int8_t* norm_out_q8 = nullptr;      // [N]
  float2* norm_out_ds = nullptr;      // [N/32]
  float* norm_out_sumsq = nullptr;    // [N/32]
};

// A launch shape: threads per block, weight rows per block, loads in flight per row (unroll), and whether each step
// prefetches the next one's weights into L2. Exposed so the benchmark can time every variant; callers normally pass
// nullptr and get gemv_default_config.
struct GemvConfig {
  int threads = 0;
  int rows = 0;
  int unroll = 0;
  int prefetch = 0;
  // tq2_0 and iq4_nl only: the x-stationary kernel (threads / 32 warps share a row, each lane holding its part of the
  // activation for the whole launch; `rows` rows per block, one step), not one of gemv_configs().
  // gemv_default_config picks it where it measured faster. tq2_0 (kernels/gemv_tq2_kernel.cuh): one 64-element
  // half-unit per lane, k a multiple of 2048. iq4_nl (kernels/gemv_qxs_kernel.cuh): one 32-block per lane, compiled
  // for k = 4096 only (128 threads, 4 rows).
  bool stationary = false;
};
const std::vector<GemvConfig>& gemv_configs();
GemvConfig gemv_default_config(DType dtype, int64_t n, int64_t k);
// Whether tq2_0's x-stationary GEMV (GemvConfig::stationary) runs an n x k matrix: k / 2048 warps of one half-unit
// per lane (2 to 16 warps), without the norm_out epilogue.
bool gemv_tq2_stationary_fits(int64_t k);
// Whether iq4_nl's x-stationary GEMV (GemvConfig::stationary) runs an n x k matrix: its one compiled launch shape is
// four warps of one 32-block per lane (k = 4096), threads 128 and rows 4 (gemv_iq4nl_stationary_config); no
// norm_out or SwiGLU epilogue (rms_sumsq and accumulate work).
bool gemv_iq4nl_stationary_fits(int64_t k);
GemvConfig gemv_iq4nl_stationary_config();
// Whether launch shape c (one of gemv_configs()) has a GEMV kernel for weights of dtype: every shape for the float
// formats, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_K and q4_K; rows * unroll <= 4 for q3_K, q5_K and q6_K
// (their larger shapes spill registers). gemv fails for the others. A stationary c: tq2_0 and tq1_0 (the row length is
// gemv_tq2_stationary_fits's to check), iq4_nl at gemv_iq4nl_stationary_config() (k: gemv_iq4nl_stationary_fits).
bool gemv_config_supported(DType dtype, const GemvConfig& c);
// Whether quantized GEMVs of launch shape c have the norm_out epilogue (GemvInput::norm_out_*): warp groups of two or
// four rows per warp with at most two loads in flight, no prefetch.
bool gemv_norm_out_supported(const GemvConfig& c);
// The same for weights of dtype: the K-quants' warp groups exist only as blocks of <= 256 threads (four rows per warp).
bool gemv_norm_out_supported(const GemvConfig& c, DType dtype);
// The launch shape of a GEMV with the norm_out epilogue (its CudaOptions::gemv_shapes override where one is given).
GemvConfig gemv_norm_out_config(DType dtype, int64_t n, int64_t k);

// accumulate: y += W·x instead of y = W·x, which fuses the residual add after the attention-output and FFN-down
// projections into their GEMVs (one launch and one pass over the residual less, per projection).
void gemv(const DeviceWeight& w, const GemvInput& x, float* y /*[N]*/, cudaStream_t stream,
          const GemvConfig* config = nullptr, bool accumulate = false);

// x [K] f32 -> q8 [K] + ds [K/32] as GemvInput describes. K % 32 == 0. threshold >= 0: SPARSIFY's calibrated rule
// first (entries with |x| <= threshold become 0: the same bits as sparsify's zeroed row, then this quantization);
// zeros (with a threshold): the achieved-sparsity counters as sparsify keeps them (zeros[0] += entries zero after the
// rule, zeros[1] += K).
void quantize_q8(const float* x /*[K]*/, int8_t* q8 /*[K]*/, float2* ds /*[K/32]*/, int64_t k, cudaStream_t stream,
                 float threshold = -1.0f, unsigned long long* zeros = nullptr);

// ---------------------------------------------------------------------------------------------------------------------
// Normalization and elementwise ops

// y[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w. y may equal x. When q8 and ds are given (d % 32 == 0), y is
// also written quantized for the next quantized GEMV (saves one launch and one pass over y). When y16 is given, y is
// also written rounded (to nearest even) to y16_type, BF16 or F16: the input of kernels_rows.h's matmul_x16, so a
// prefill GEMM needs no conversion pass; y may then be nullptr (no f32 output).
void rmsnorm(const float* x /*[t, d]*/, const float* w /*[d]*/, float* y /*[t, d] or nullptr*/, int64_t t, int64_t d,
             float eps, cudaStream_t stream, int8_t* q8 = nullptr /*[t, d]*/, float2* ds = nullptr /*[t, d/32]*/,
             void* y16 = nullptr /*[t, d]*/, DType y16_type = DType::BF16);

// out = silu(gate) * up. out may equal gate or up. Optional quantized copy as in rmsnorm (n % 32 == 0).
void swiglu(const float* gate /*[n]*/, const float* up /*[n]*/, float* out /*[n]*/, int64_t n, cudaStream_t stream,
            int8_t* q8 = nullptr /*[n]*/, float2* ds = nullptr /*[n/32]*/);

// swiglu over t rows of n columns whose gate and up rows lie ld_in elements apart (ld_in = 2n: the two halves of one
// merged gate|up matmul output; ld_in = n: separate contiguous tensors). Writes out (f32) and/or out16 (rounded to
// nearest even to out16_type, BF16 or F16: matmul_x16's input); either may be nullptr, not both. Same values as
// swiglu.
void swiglu_rows(const float* gate /*[t, ld_in]*/, const float* up /*[t, ld_in]*/, int64_t ld_in,
                 float* out /*[t, n] or nullptr*/, void* out16 /*[t, n] or nullptr*/, DType out16_type, int64_t t,
                 int64_t n, cudaStream_t stream);

// y += x (residual connection).
void add(float* y /*[n]*/, const float* x /*[n]*/, int64_t n, cudaStream_t stream);

// out[i, :] = table[ids[i], :] as f32, for any GemvLayout table (tied embeddings share the output weight). An id
// outside [0, table.n) yields a row of NaNs (the device cannot throw; the runtime validates ids on the host first).
void embedding(const DeviceWeight& table /*[n_vocab, d]*/, const int32_t* ids /*[t]*/, float* out /*[t, d]*/, int64_t t,
               cudaStream_t stream);

// Index of the largest value (the first on ties, NaNs skipped; 0 when all are NaN), written to out[0]. One launch:
// blocks reduce their slice and the last block to finish reduces the blocks' results.
class ArgmaxWorkspace {
 public:
  explicit ArgmaxWorkspace(int64_t max_n);
  int64_t max_n() const { return max_n_; }
  int blocks() const { return blocks_; }
  unsigned long long* partials() const { return partials_.as<unsigned long long>(); }
  unsigned int* counter() const { return counter_.as<unsigned int>(); }

 private:
  int64_t max_n_ = 0;
  int blocks_ = 0;
  DeviceBuffer partials_;  // [blocks] packed (value, index) keys
  DeviceBuffer counter_;   // blocks finished; zero between launches (the last block resets it)
};
// Chained greedy decoding (CudaDecoder::generate_greedy): besides out[0], the last block writes the token into the
// next step's input (*token), appends it to ring[*pos] (host-mapped memory the host reads after the step's event;
// skipped when *pos is outside [0, ring_size)) and advances *pos by one, so that the next step needs nothing from the
// host; with `embed` it also writes the token's row of that table into embed_out (f32 [embed->k], as embedding()
// would: the next step's embedding launch folded in). All null: plain argmax.
struct ArgmaxChain {
  int32_t* token = nullptr;
  int32_t* pos = nullptr;
  int32_t* ring = nullptr;
  int32_t ring_size = 0;
  const DeviceWeight* embed = nullptr;
  float* embed_out = nullptr;
};
void argmax(const float* x /*[n]*/, int64_t n, int32_t* out /*[1]*/, ArgmaxWorkspace& ws, cudaStream_t stream,
            const ArgmaxChain& chain = {});

// ---------------------------------------------------------------------------------------------------------------------
// Attention (one query token)

// KV cache of one layer: element (kv head h, position p, i) of K at k[(h * n_ctx + p) * hd + i], V likewise
// (head-major [n_kv, n_ctx, hd]: one block streams one head's positions contiguously). F16 or BF16 (the default is
// F16), or F32: opt-in (--kv-type f32) so that f32 models keep f32 precision, at twice the bytes per position.
struct KvCacheView {
  DType dtype = DType::F16;
  void* k = nullptr;  // [n_kv, n_ctx, hd]
  void* v = nullptr;  // [n_kv, n_ctx, hd]
  int64_t n_ctx = 0;  // positions the cache holds
  int64_t n_kv = 0;
  int64_t hd = 0;
  // Sequences (batched decode): slot s's cache starts at element s * n_kv * n_ctx * hd of k and v, i.e. the caches
  // are [n_seq, n_kv, n_ctx, hd]. The single-token kernels above use slot 0.
  int64_t n_seq = 1;
  // Sliding-window attention (graph ATTENTION's params.window; Gemma 3's local layers, Mistral): > 0, the query at
  // position p attends to positions (p - window, p] only; 0, to every position up to p. Read by the decode and
  // prefill attention kernels (attn_decode*, attn_prefill); the TMA and cuDNN prefill paths take window 0 only.
  int64_t window = 0;
  int64_t seq_stride() const { return n_kv * n_ctx * hd; }
};

// Rotary embedding of this token's q and k at position pos[0], fused with storing k and v into the cache at that
// position (rounded to the cache dtype). theta_i = pos * inv_freq[i], i < rope_dim / 2; the first rope_dim elements of
// every head rotate, the rest pass through. neox == false: pairs (x[2i], x[2i+1]); true: (x[i], x[i + rope_dim/2]).
// q is rotated in place. A pos outside [0, n_ctx) stores nothing and sets q to NaN.
void rope_store_kv(float* q /*[n_head, hd]*/, const float* k /*[n_kv, hd]*/, const float* v /*[n_kv, hd]*/,
                   const KvCacheView& cache, const int32_t* pos /*[1]*/, int64_t n_head, int64_t rope_dim,
                   const float* inv_freq /*[rope_dim/2]*/, bool neox, cudaStream_t stream);

// Split-K decode attention (flash-decoding): the positions [0, pos] are cut into chunks; one block per (chunk, kv head)
// computes all of that head's query heads (GQA: query head h reads kv head h / (n_head / n_kv)) with an online
// softmax, and the last block to finish for a kv head combines the chunks' partial results (no second launch).
// Sized once for the cache's n_ctx so a CUDA graph can replay it at any position: blocks past the current position
// return at once.
class AttnWorkspace {
 public:
  // For n_head query heads over `cache`: max_splits() chunks per kv head, enough for one wave of two blocks per SM
  // (at most 256, and at most ceil(n_ctx / 64)). At run time [0, pos] is cut into at most max_splits() chunks of a
  // multiple of 64 positions (64 while the context is short), each looped over in tiles.
  AttnWorkspace(int64_t n_head, const KvCacheView& cache);
  int max_splits() const { return max_splits_; }
  int64_t n_head() const { return n_head_; }
  int64_t hd() const { return hd_; }
  float* partial_out() const { return out_.as<float>(); }
  float2* partial_ml() const { return ml_.as<float2>(); }
  unsigned int* counters() const { return counters_.as<unsigned int>(); }

 private:
  int64_t n_head_ = 0;
  int64_t hd_ = 0;
  int max_splits_ = 0;
  DeviceBuffer out_;       // [n_head, max_splits, hd] unnormalized sum of exp(s - m) * v
  DeviceBuffer ml_;        // [n_head, max_splits] (max score m, sum of exp(s - m))
  DeviceBuffer counters_;  // [n_head] chunks finished per (kv head, head tile); zero between launches
};

// out[h, :] = softmax(scale * q[h, :] · K[0..pos, kvh, :]ᵀ) · V[0..pos, kvh, :]. hd in {64, 128, 256}. A pos outside
// [0, n_ctx) yields NaNs. Ordering contract (programmatic dependent launch): this and attn_decode_rope read pos and
// the cache below pos before waiting on the previous kernel in the stream (attn_decode.cu, v5 early loads), so that
// kernel must write neither pos nor the cache below pos (the decoders copy pos from the host before the step, or the
// previous step's chained argmax wrote it). out_q8/out_ds (optional, both or neither): the output also quantized as
// quantize_q8 writes it, for a quantized o-projection; in the kernel where the context is short (attn_short), by a
// quantize_q8 launch after it otherwise.
void attn_decode(const float* q /*[n_head, hd]*/, const KvCacheView& cache, const int32_t* pos /*[1]*/,
                 float* out /*[n_head, hd]*/, int64_t n_head, float scale, AttnWorkspace& ws, cudaStream_t stream,
                 int8_t* out_q8 = nullptr /*[n_head * hd]*/, float2* out_ds = nullptr /*[n_head * hd / 32]*/);

// rope_store_kv + attn_decode in one launch (one fewer per layer): q and k arrive unrotated; every block rotates its
// own query heads, and the block whose chunk ends at pos rotates this token's k, takes k and v (rounded to the cache
// dtype, as rope_store_kv stores them) from shared memory for position pos and stores them into the cache. Same
// results as the two launches, except that q is only read (not rotated in place).
void attn_decode_rope(const float* q /*[n_head, hd]*/, const float* k /*[n_kv, hd]*/, const float* v /*[n_kv, hd]*/,
                      const KvCacheView& cache, const int32_t* pos /*[1]*/, int64_t rope_dim,
                      const float* inv_freq /*[rope_dim/2]*/, bool neox, float* out /*[n_head, hd]*/, int64_t n_head,
                      float scale, AttnWorkspace& ws, cudaStream_t stream, int8_t* out_q8 = nullptr,
                      float2* out_ds = nullptr);

}  // namespace tessera::cuda
