// The CUDA backend's switches, parsed once into one struct (no environment variables: docs/ENVIRONMENT.md lists the
// few a user sets, and what became of the rest).
//
// How launch code reads it: a process-wide `cuda_options()`, set by `set_cuda_options()` before the first launch (by
// each CUDA session from its backend options, again at each call after another set others; tests and benchmarks
// between launches). Not a
// parameter of every launch function, because (1) the kernel entry points of kernels.h and kernels_rows.h are called
// from ~40 places in the executors, and the decode attention / GEMV choices below are made deep inside those launchers
// (a CUDA graph captures whatever they choose); (2) Tessera drives one device per process, and PDL was already
// process-wide (set_pdl); (3) every field is read at launch, so at CUDA graph capture, exactly as the environment was.
// set_cuda_options must not run while another thread launches kernels (it replaces the struct in place).
//
// Fields are of three kinds:
//   - [engine]  a choice of the executors (backend_cuda.cpp, executor_rows.cpp, executor_shared.cpp), each default
//     what was measured fastest (docs/PERFORMANCE.md). Until they are wired to this struct those files read the
//     environment variables docs/ENVIRONMENT.md pairs with each field; the kernels never read these fields.
//   - [kernel]  read by the kernel launchers themselves (kernels/*.cu, attn_cudnn.cpp).
//   - [study]   measurement knobs: they exist so that one run can time the engine's choices against each other inside
//     the decode graph (scripts/gpu_check.sh --only shapesweep, attnplans, earlyl2). Every default is the engine's own
//     choice; a study sets them through parse_cuda_option ("key=value", the strings below).
// Paths that measured slower and that only a switch selected left src/ for bench/cuda/experiments/ (attention v3, v4
// and v5's clusters: attn_decode_versions.cu; the float GEMV's launch shapes before its sweep: gemv_float_sweep.cu).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cuda/kernels.h"

namespace tessera::cuda {

// A GEMV launch shape for the matrices of one shape (any weight format), in place of gemv_default_config's.
struct GemvShapeOverride {
  int64_t n = 0, k = 0;
  GemvConfig config;
};

// Before its PDL wait each of a decode GEMV's first `blocks` blocks asks L2 for up to `bytes` of its weights (0: two
// 128-byte lines per thread), through cp.async.bulk.prefetch with `bulk` (gemv_common.cuh, EarlyL2, says why; larger
// amounts measured slower).
struct EarlyL2Options {
  unsigned blocks = 256;
  unsigned bytes = 0;
  bool bulk = false;
};

// Which quantized formats fold the RMSNorm after a residual GEMV into that GEMV (GemvInput::norm_out_*).
enum class QuantNorm : uint8_t {
  AUTO = 0,   // the default: where it measured faster (q4_0/1, q5_0, q4/5/6_K, iq4_xs; tq2_0 off x-stationary)
  Q4_1_ONLY,  // q4_1 only (the default until the seventeenth session; kept for A/B runs)
  ALL,        // every quantized format
  NONE,
};

// Which quantized formats take TEAL's sparse list walk at decode (kernels/gemv_sparse.h); the others run their dense
// GEMV on the zeroed input (SPARSIFY still zeroes it, the GEMV quantizes it as the CPU does).
enum class TealWalk : uint8_t {
  Q8_0 = 0,  // q8_0 only, at every shape (q4_0/q4_1/q4_K's walks lose everywhere)
  ALL,       // every format with a walk (q8_0, q4_0, q4_1, q4_K through its q4_1 copy)
  NONE,
  AUTO,      // the default: q8_0's walk only where its weight has at least twice as many rows as columns (the
             // gate|up stack: the one shape where it measured faster than the dense GEMV, 0.68x; 1.04-1.37x elsewhere).
             // 8B q8_0 on the H100: --teal 50% 278.8 tok/s (q8_0: 252.3, none: 272.1), top-k 211.9 (193.8, 208.1).
             // CudaTeal.Q8WalkFormsMatchCpu checks its mixed layers against the CPU (passed on the H100, twentieth
             // session).
};

// Which path a quantized matmul of many rows takes where it would otherwise expand the matrix to bf16 for cuBLASLt
// (gemm.cpp: matmul past the multi-row GEMV's rows, matmul_x16 and matmul_x16_out16 at every row count).
enum class QuantGemm : uint8_t {
  AUTO = 0,  // the default: the per-tile GEMM (kernels/gemm_quant_tile.cu) up to the rows where it measured faster
             // (quant_tile_auto_max_t, gemm_paths.h: 256, 512 or 1,024 by format), the expansion above and for the
             // formats without a tile kernel
  TILE,      // the per-tile GEMM at every row count (the expansion for the formats without one)
  EXPAND,    // the expansion everywhere (the only path before the tile GEMM)
};

struct CudaOptions {
  // ---- [kernel] launches ----
  // Programmatic dependent launch between kernels (kernels/common.cuh). Off: every kernel waits for the previous
  // grid's end before it launches (~2 us more per launch).
  bool pdl = true;
  // cuDNN's fused SDPA for prefill attention where libcudnn loads (attn_cudnn.h); off: attn_prefill instead.
  bool cudnn = true;
  // Quantized prefill GEMMs: the per-tile kernel or the bf16 expansion + cuBLASLt (QuantGemm above).
  QuantGemm quant_gemm = QuantGemm::AUTO;

  // ---- [study] decode attention (kernels/attn_decode.cu) ----
  // Contexts of at most this many positions take the short-context register path (attn_decode_short.cuh); -1: up to
  // the kernel's register capacity (the default), 0: never (the split kernel at every context).
  int attn_short = -1;
  // The compact 8-warp kernel walks at most this many register windows; -1: every window it has (4, the default),
  // 0: never (small caches take attn_split_kernel's short path).
  int attn_compact = -1;
  // The split kernel's smallest chunk (a multiple of 64); 0: per shape (two tiles, the default).
  int attn_chunk = 0;

  // ---- [study] decode GEMVs (kernels/gemv.cu) ----
  // Launch shapes for matrices of given shapes; empty: gemv_default_config's.
  std::vector<GemvShapeOverride> gemv_shapes;
  EarlyL2Options early_l2;

  // ---- [engine] decoder (backend_cuda.cpp, executor_shared.cpp) ----
  bool graph = true;        // a captured CUDA graph per decode step (off: plain launches)
  bool fuse = true;         // merged GEMVs (q|k|v, gate|up) and residual adds folded into GEMVs
  bool fuse_attn = true;    // RoPE + cache store inside the attention launch
  bool fold_norm = true;    // RMSNorm folded into the float-weight GEMVs after it
  bool fold_swiglu = true;  // SwiGLU folded into the float gate|up GEMV (dense, or TEAL's stripe-form sparse walk)
  bool attn_q8 = true;      // attention writes the quantized o-projection's 8-bit input itself
  QuantNorm quant_norm = QuantNorm::AUTO;
  TealWalk teal_walk = TealWalk::AUTO;
  bool chain = true;        // greedy decoding chains steps on the device
  int chain_steps = 8;      // steps per chained graph launch (1-16)
  bool chain_embed = true;  // the next token's embedding folded into the argmax
  bool sample = true;       // sampled generation draws on the device
  // [study] graph op names (rmsnorm, swiglu, attention, matmul, ...) left out of the decode step: the outputs are
  // wrong; a timing study of what each op class costs inside the replayed graph.
  std::vector<std::string> drop_ops;

  // ---- [engine] prefill and batched decode (executor_rows.cpp) ----
  bool attn_tma = true;       // prefill attention through attn_prefill_tma where it applies (else cuDNN)
  bool x16 = true;            // matmul inputs written in 16 bits by their producers
  bool out16 = true;          // 16-bit gate|up and prefill-attention outputs
  bool merge_gate_up = true;  // gate and up as one matmul
  bool lora_side = true;      // LoRA's A products on a second stream beside the base GEMM (tensor-core path)
  // TEAL's two-row decode: a bf16/f16 matmul walks the union of the rows' kept channels once (gemv_sparse_x_rows)
  // instead of running dense on the zeroed rows. Three or more rows run dense (the union keeps 87.5-100% of the
  // channels). 8B bf16 on the H100, --parallel 2, --teal 50%: 387.4 tok/s against 320.3 dense on the zeroed rows.
  bool teal_union = true;
};

// The options every launch reads (CudaOptions{} until set_cuda_options is called).
const CudaOptions& cuda_options();
// Checks o (tessera::Error naming the first bad field: a GEMV shape that gemv_configs() lacks, a chunk that is not
// a multiple of 64, chain_steps outside 1-16, ...) and makes it the process's options.
void set_cuda_options(const CudaOptions& o);
// How many times set_cuda_options has replaced the options: a CUDA session re-applies its own at each entry when
// another session (or a test) has set them since, so sessions alive together with different options each compile and
// launch with theirs.
uint64_t cuda_options_generation();

// Sets one field from "key=value" (the key is the field's name; bools take 0/1, on/off, true/false; gemv_shapes takes
// "NxK=threads/rows/unroll/prefetch[,...]", early_l2 "blocks/bytes[/bulk]", quant_norm "auto|q4_1|all|none", quant_gemm
// "auto|tile|expand", drop_ops "op[,op...]"). tessera::Error with one sentence on an unknown key or a value that does
// not parse. For a repeated command-line flag (--cuda KEY=VALUE) and the benchmarks.
void parse_cuda_option(CudaOptions& o, std::string_view key_value);
// Every key parse_cuda_option takes, in the struct's order.
const std::vector<std::string>& cuda_option_keys();
// "key=value ..." for every key, each value as parse_cuda_option reads it back (benchmarks print it beside results).
std::string format_cuda_options(const CudaOptions& o);

// Sets cuda_options() for one scope and restores the previous options at its end (tests, benchmarks).
class CudaOptionsScope {
 public:
  explicit CudaOptionsScope(const CudaOptions& o) : saved_(cuda_options()) { set_cuda_options(o); }
  ~CudaOptionsScope() { set_cuda_options(saved_); }
  CudaOptionsScope(const CudaOptionsScope&) = delete;
  CudaOptionsScope& operator=(const CudaOptionsScope&) = delete;

 private:
  CudaOptions saved_;
};

}  // namespace tessera::cuda
