// T-row matmul y[t, N] = x[t, K] · W[N, K]ᵀ for CUDA prefill and batched decode (kernels_rows.h).
//
// Paths (gemm_default_path, which gives the H100 figures behind each threshold; bench/cuda/bench_gemm.cpp):
//  - t == 1: kernels.h's GEMV.
//  - small t (float t <= 4, quantized t <= 16, or t <= 40 for large matrices): the multi-row GEMV
//    (kernels/gemm_rows.cu). Batched decode is bound by weight bytes, and this reads them once per 8 rows of x;
//    quantized weights dot their int8 quants with q8-quantized activations (dp4a), so 4-bit weights stay 4-bit on
//    the wire.
//  - large t, float weights: cuBLASLt. bf16/f16: x rounded to the weight's type in the workspace, tensor-core GEMM
//    with f32 accumulation and f32 D; f32 weights: plain f32 GEMM (CUBLAS_COMPUTE_32F, no TF32: f32 models are the
//    reference-precision ones).
//  - large t, quantized weights: the matrix is dequantized to bf16 in the workspace's scratch (one matrix at a time;
//    the model is never kept dequantized) and multiplied by the bf16 GEMM. The expansion costs one write and one
//    read of N*K*2 bytes per call, small next to 2*t*N*K flops once t is in the hundreds; below that the multi-row
//    GEMV's repeated passes over the 4/8-bit weights are cheaper.
//  - the formats with a tile kernel (q4_K, q5_K, q6_K, q2_K, q3_K, q5_0, q5_1, iq4_nl, iq4_xs) up to
//    quant_tile_auto_max_t rows (256-1,024 by format; CudaOptions::quant_gemm): no expansion; x in bf16 and one kernel
//    whose CTAs dequantize their W tiles into wgmma's register fragments (kernels/gemm_quant_tile.cu, sm_90), to the
//    same bf16 weights as the expansion. For q4_K: Where the expansion is a large part of the call it wins (H100, one
//    Llama-3-8B layer's four matrices: 1.88x at t = 128, 1.56x at 256, 1.06x at 512); from t = 1,024 on the GEMM
//    dominates and cuBLASLt's is faster than the tile kernel's dequantization-bound loop (0.93x).
//  - matmul_x16: the same cuBLASLt GEMMs fed a 16-bit x that its producer (rmsnorm, swiglu_rows) wrote directly. At
//    prefill sizes the conversion of x is a memory-bound pass of its own (Llama-3-8B, t = 2048: down's x is
//    [2048, 14336] f32, 117 MB read and 59 MB written per layer, ~60 us of ~350).
// The residual add fuses everywhere: accumulate makes the GEMV add into y and the GEMM run with C = D = y, beta = 1.
//
// Mapping to cuBLASLt (column-major): row-major y[t, N] is column-major D[N, t] (ld N); row-major W[N, K] is
// column-major [K, N] (ld K), so op(A) = Aᵀ gives the [N, K] factor; row-major x[t, K] is column-major [K, t] (ld K)
// with op(B) = B. D[N, t] = Aᵀ[N, K] · B[K, t]: m = N, n = t, k = K ("TN", the layout Hopper's kernels favour).
//
// CUDA graphs: the handle, workspace and scratch buffers are the workspace's; a shape's descriptors and algorithm are
// made once (host-only cuBLASLt calls, legal during capture) and cached, so matmul never allocates device memory,
// never synchronizes, and can be captured.
#include <cublasLt.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"

namespace tessera::cuda {
namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("cuBLASLt call '{}' failed: {} ({})", what, cublasLtGetStatusName(s), cublasLtGetStatusString(s));
}

bool is_quant(DType t) { return gemv_quantized(t); }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Whether CudaOptions::quant_gemm sends a quantized GEMM of t rows to the per-tile kernel (before checking that the
// kernel takes the weight, x and device: gemm_quant_tile_supported).
bool quant_gemm_tile(DType dtype, int64_t t) {
  if (!detail::gemm_quant_tile_format(dtype)) return false;
  switch (cuda_options().quant_gemm) {
    case QuantGemm::TILE:
      return true;
    case QuantGemm::EXPAND:
      return false;
    default:
      return t <= detail::quant_tile_auto_max_t(dtype);
  }
}

// The largest power of two <= 256 dividing both the address and the leading dimension in bytes: what cuBLASLt may
// assume about every column of the operand.
int alignment(const void* p, int64_t ld_bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(ld_bytes);
  int al = 256;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al /= 2;
  return al;
}

// One GEMM shape's descriptors and chosen algorithm.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

}  // namespace

struct GemmWorkspace::Impl {
  int64_t max_t = 0, max_k = 0, max_quant_nk = 0;
  cublasLtHandle_t lt = nullptr;
  DeviceBuffer lt_ws;  // cuBLASLt's workspace
  DeviceBuffer x16;    // [max_t, max_k] x in bf16 or f16
  DeviceBuffer q8;     // [max_t, max_k] x quantized (multi-row GEMV of quantized weights)
  DeviceBuffer ds;     // [max_t, max_k / 32]
  DeviceBuffer deq;    // [max_quant_nk] bf16: one dequantized matrix
  // (weight type, N, t, K, alignments of A, B, C/D, D type, K slices)
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int, int, int, int, int>;
  std::map<Key, Plan> plans;
  std::set<Key> refused;  // shapes cuBLASLt had no algorithm for, asked with must = false

  ~Impl() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.op);
    }
    if (lt) cublasLtDestroy(lt);
  }

  // splits > 1: a strided batch of `splits` GEMMs over consecutive K slices of k / splits (A and B offset by the
  // slice, both with leading dimension k), D batch s at s * n * t (matmul_x16_split_k).
  // must = false: nullptr rather than an error where cuBLASLt has no algorithm (remembered).
  const Plan* plan(DType wtype, int64_t n, int64_t t, int64_t k, int align_a, int align_b, int align_c,
                   cudaDataType_t d_type, int splits = 1, bool must = true);
};

const Plan* GemmWorkspace::Impl::plan(DType wtype, int64_t n, int64_t t, int64_t k, int align_a, int align_b,
                                      int align_c, cudaDataType_t d_type, int splits, bool must) {
  const Key key{static_cast<int>(wtype), n, t, k, align_a, align_b, align_c, static_cast<int>(d_type), splits};
  if (auto it = plans.find(key); it != plans.end()) return &it->second;
  if (refused.contains(key)) return nullptr;
  const cudaDataType_t ab = wtype == DType::F32 ? CUDA_R_32F : wtype == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  Plan p;
  check_lt(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)), "TRANSA");
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)), "TRANSB");
  const int64_t ks = k / splits;  // K of one GEMM of the batch
  check_lt(cublasLtMatrixLayoutCreate(&p.a, ab, static_cast<uint64_t>(ks), static_cast<uint64_t>(n), k), "layout A");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, ab, static_cast<uint64_t>(ks), static_cast<uint64_t>(t), k), "layout B");
  check_lt(cublasLtMatrixLayoutCreate(&p.c, d_type, static_cast<uint64_t>(n), static_cast<uint64_t>(t), n), "layout C");
  if (splits > 1) {
    const int32_t count = splits;
    const int64_t off_ab = ks, off_c = n * t;
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c})
      check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
               "batch count");
    check_lt(
        cublasLtMatrixLayoutSetAttribute(p.a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off_ab, sizeof(off_ab)),
        "batch offset A");
    check_lt(
        cublasLtMatrixLayoutSetAttribute(p.b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off_ab, sizeof(off_ab)),
        "batch offset B");
    check_lt(cublasLtMatrixLayoutSetAttribute(p.c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off_c, sizeof(off_c)),
             "batch offset C");
  }
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws_bytes = kLtWorkspaceBytes;
  const uint32_t al_a = static_cast<uint32_t>(align_a), al_b = static_cast<uint32_t>(align_b),
                 al_c = static_cast<uint32_t>(align_c);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
    if (!must) {
      refused.insert(key);
      return nullptr;
    }
    fail("cuBLASLt has no algorithm for a {} matmul of [{}, {}] x [{}, {}]^T ({})", dtype_name(wtype), t, k, n, k,
         cublasLtGetStatusName(s));
  }
  p.algo = result.algo;
  return &plans.emplace(key, p).first->second;
}

GemmWorkspace::GemmWorkspace(int64_t max_t, int64_t max_k, int64_t max_quant_nk) : impl_(std::make_unique<Impl>()) {
  TESSERA_CHECK(max_t > 0 && max_k > 0 && max_quant_nk >= 0,
                "cannot size a GEMM workspace for max_t = {}, max_k = {}, max_quant_nk = {}: sizes must be positive",
                max_t, max_k, max_quant_nk);
  Impl& m = *impl_;
  m.max_t = max_t;
  m.max_k = max_k;
  m.max_quant_nk = max_quant_nk;
  check_lt(cublasLtCreate(&m.lt), "cublasLtCreate");
  m.lt_ws = DeviceBuffer(kLtWorkspaceBytes);
  const int64_t elems = max_t * max_k;
  m.x16 = DeviceBuffer(static_cast<size_t>(elems) * 2);
  m.q8 = DeviceBuffer(static_cast<size_t>(elems));
  m.ds = DeviceBuffer(static_cast<size_t>(max_t * ((max_k + 31) / 32)) * sizeof(float2));
  m.deq = DeviceBuffer(static_cast<size_t>(max_quant_nk) * 2);
  detail::gemm_quant_tile_prepare();  // outside any graph capture (the matmuls may be captured)
}
GemmWorkspace::~GemmWorkspace() = default;
int64_t GemmWorkspace::max_t() const { return impl_->max_t; }
int64_t GemmWorkspace::max_k() const { return impl_->max_k; }

namespace {

// The TILE path. Split-K's partial sums ([S, t, N] f32) go to the dequantization scratch, which this path leaves
// unused; launch_gemm_quant_tile splits only where they fit (a scratch of this matrix's N K bf16: S t <= K / 2).
void tile_gemm(const DeviceWeight& w, const void* x16, void* y, bool y16, int64_t t, GemmWorkspace::Impl& m,
               cudaStream_t stream, bool accumulate) {
  detail::launch_gemm_quant_tile(w, x16, y, y16, t, accumulate, m.deq.as<float>(), m.max_quant_nk / 2, stream);
}

}  // namespace

namespace detail {

int64_t quant_tile_auto_max_t(DType dtype) {
  switch (dtype) {
    case DType::Q4_K:
    case DType::Q5_0:
      return 512;
    case DType::Q5_1:
    case DType::IQ4_NL:
      return 1024;
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::IQ4_XS:
      return 256;
    default:
      return 0;
  }
}

const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::ROWS:
      return "rows";
    case GemmPath::CUBLAS:
      return "cublaslt";
    case GemmPath::TILE:
      return "quant_tile";
    default:
      return "auto";
  }
}

GemmPath matmul_x16_path(const DeviceWeight& w, const void* x16, int64_t t) {
  return quant_gemm_tile(w.dtype, t) && gemm_quant_tile_supported(w, x16) ? GemmPath::TILE : GemmPath::CUBLAS;
}

GemmPath gemm_default_path(DType dtype, int64_t t, int64_t n, int64_t k) {
  // Measured on H100 SXM (bench_gemm, Llama-3-8B shapes qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down
  // 4096x14336; microseconds, multi-row GEMV / cuBLASLt path, both including x's conversion):
  //  - bf16 weights: the multi-row GEMV wins at t = 2 and 4 (qkv 19.4 / 23.1, gate_up 79.1 / 84.0, at 2.6-3.0 TB/s
  //    of weight reads) but loses from t = 8 on (qkv 34.6 / 23.1), where its per-lane f32 x loads and FMAs, not the
  //    weight bytes, bound it, while cuBLASLt stays flat at the weights' read time up to t ~ 64 (qkv 22.8-24.1 us for
  //    t = 8..128). So: GEMV for t <= 4 (f32 and f16 rows share the kernel and the rule).
  //  - q8_0/q4_0 weights: the dequantize-then-bf16-GEMM path costs a near-constant expansion of the matrix (qkv ~59,
  //    gate_up ~274, down ~142 us q8_0 at t <= 128), the multi-row GEMV grows with t (about 8 rows per pass over
  //    the 1.1/0.56 bytes per weight): q8_0 at t = 16 qkv 35.8 / 58.7, at t = 32 qkv 70.1 / 59.2 but gate_up
  //    228 / 274 and down 106 / 142, at t = 64 the GEMM wins everywhere (gate_up 458 / 272). Interpolating, the
  //    large matrices (>= 48M weights) cross over near t = 40, the small ones near t = 24.
  // At t = 2048 the bf16 GEMM runs at 654-743 TFLOP/s (85-97% of the 765 TFLOP/s 8192^3 peak), the quantized path at
  // 506-582 (66-76%: the expansion and x's conversion are not hidden).
  //  - past the multi-row GEMV's rows, the per-tile GEMM where quant_gemm_tile says (header comment).
  if (is_quant(dtype)) {
    const bool large = n * k >= (int64_t{48} << 20);
    if (t <= 16 || (large && t <= 40)) return GemmPath::ROWS;
    return quant_gemm_tile(dtype, t) ? GemmPath::TILE : GemmPath::CUBLAS;
  }
  return t <= 4 ? GemmPath::ROWS : GemmPath::CUBLAS;
}

void gemm_lt(GemmWorkspace& ws, DType wtype, const void* w, const void* x, void* y, int64_t t, int64_t n, int64_t k,
             cudaStream_t stream, bool accumulate, bool y16) {
  GemmWorkspace::Impl& m = ws.impl();
  const int64_t eb = wtype == DType::F32 ? 4 : 2;
  const cudaDataType_t d_type = !y16 ? CUDA_R_32F : wtype == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  const Plan& p =
      *m.plan(wtype, n, t, k, alignment(w, k * eb), alignment(x, k * eb), alignment(y, n * (y16 ? 2 : 4)), d_type);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_lt(cublasLtMatmul(m.lt, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, m.lt_ws.get(),
                          kLtWorkspaceBytes, stream),
           "cublasLtMatmul");
}

void matmul_path(const DeviceWeight& w, const float* x, float* y, int64_t t, GemmWorkspace& ws, cudaStream_t stream,
                 bool accumulate, GemmPath path) {
  GemmWorkspace::Impl& m = ws.impl();
  TESSERA_CHECK(gemv_supports(w.dtype), "matmul: weight dtype {} is not supported on CUDA", dtype_name(w.dtype));
  TESSERA_CHECK(w.n > 0 && w.k > 0 && !w.quants.empty(), "matmul: the weight is empty (was it uploaded?)");
  TESSERA_CHECK(x != nullptr && y != nullptr, "matmul: the input or output pointer is null");
  TESSERA_CHECK(t >= 1 && t <= m.max_t, "matmul: t = {} rows is outside the workspace's 1..{}", t, m.max_t);
  TESSERA_CHECK(w.k <= m.max_k, "matmul: the weight's K = {} exceeds the workspace's max_k = {}", w.k, m.max_k);
  const bool quant = is_quant(w.dtype);
  if (path == GemmPath::AUTO) {
    if (t == 1) {
      GemvInput in;
      if (quant) {
        quantize_q8(x, m.q8.as<int8_t>(), m.ds.as<float2>(), w.k, stream);
        in.q8 = m.q8.as<int8_t>();
        in.q8_ds = m.ds.as<float2>();
      } else {
        in.f32 = x;
      }
      if (quant || aligned16(x)) {
        gemv(w, in, y, stream, nullptr, accumulate);
        return;
      }
    }
    path = gemm_default_path(w.dtype, t, w.n, w.k);
    // Graceful degradations rather than failures inside an executor's graph: an unaligned float x cannot feed the
    // 16-byte loads of the multi-row GEMV, the tile GEMM needs an sm_90 device, and a quantized matrix larger than the
    // scratch cannot be expanded.
    if (path == GemmPath::ROWS && !quant && !aligned16(x)) path = GemmPath::CUBLAS;
    if (path == GemmPath::TILE && !gemm_quant_tile_supported(w, nullptr)) path = GemmPath::CUBLAS;
    if (path == GemmPath::CUBLAS && quant && w.n * w.k > m.max_quant_nk) path = GemmPath::ROWS;
  }
  if (path == GemmPath::TILE) {
    std::string why;
    TESSERA_CHECK(gemm_quant_tile_supported(w, nullptr, &why),
                  "matmul: the {} weight [{}, {}] cannot take the tile path: {}", dtype_name(w.dtype), w.n, w.k, why);
    launch_f32_to_16bit(x, m.x16.get(), t * w.k, true, stream);
    tile_gemm(w, m.x16.get(), y, false, t, m, stream, accumulate);
    return;
  }
  if (path == GemmPath::ROWS) {
    if (quant) {
      quantize_q8(x, m.q8.as<int8_t>(), m.ds.as<float2>(), t * w.k, stream);
      launch_gemm_rows_quant(w, m.q8.as<int8_t>(), m.ds.as<float2>(), y, static_cast<int>(t), stream, accumulate);
    } else {
      TESSERA_CHECK(aligned16(x), "matmul: the multi-row GEMV needs a 16-byte aligned x");
      launch_gemm_rows_float(w, x, y, static_cast<int>(t), stream, accumulate);
    }
    return;
  }
  if (quant) {
    TESSERA_CHECK(w.n * w.k <= m.max_quant_nk,
                  "matmul: the {} weight [{}, {}] needs {} elements of dequantization scratch, the workspace has {}",
                  dtype_name(w.dtype), w.n, w.k, w.n * w.k, m.max_quant_nk);
    launch_dequant_bf16(w, m.deq.get(), stream);
    launch_f32_to_16bit(x, m.x16.get(), t * w.k, true, stream);
    gemm_lt(ws, DType::BF16, m.deq.get(), m.x16.get(), y, t, w.n, w.k, stream, accumulate);
  } else if (w.dtype == DType::F32) {
    gemm_lt(ws, DType::F32, w.quants.get(), x, y, t, w.n, w.k, stream, accumulate);
  } else {
    launch_f32_to_16bit(x, m.x16.get(), t * w.k, w.dtype == DType::BF16, stream);
    gemm_lt(ws, w.dtype, w.quants.get(), m.x16.get(), y, t, w.n, w.k, stream, accumulate);
  }
}

}  // namespace detail

DType matmul_x16_type(DType wtype) {
  if (wtype == DType::F16) return DType::F16;
  if (wtype == DType::BF16 || is_quant(wtype)) return DType::BF16;
  return DType::F32;
}

int64_t matmul_x16_min_t(DType wtype) {
  // One past gemm_default_path's largest ROWS t (over every N and K) for this weight type.
  return is_quant(wtype) ? 41 : 5;
}

namespace {

void matmul_x16_impl(const DeviceWeight& w, const void* x16, void* y, bool y16, int64_t t, GemmWorkspace& ws,
                     cudaStream_t stream, bool accumulate) {
  const char* op = y16 ? "matmul_x16_out16" : "matmul_x16";
  GemmWorkspace::Impl& m = ws.impl();
  TESSERA_CHECK(gemv_supports(w.dtype), "{}: weight dtype {} is not supported on CUDA", op, dtype_name(w.dtype));
  TESSERA_CHECK(matmul_x16_type(w.dtype) != DType::F32,
                "{}: {} weights take an f32 activation (call matmul), not a 16-bit one", op, dtype_name(w.dtype));
  TESSERA_CHECK(w.n > 0 && w.k > 0 && !w.quants.empty(), "{}: the weight is empty (was it uploaded?)", op);
  TESSERA_CHECK(x16 != nullptr && y != nullptr, "{}: the input or output pointer is null", op);
  TESSERA_CHECK(t >= 1 && t <= m.max_t, "{}: t = {} rows is outside the workspace's 1..{}", op, t, m.max_t);
  if (is_quant(w.dtype)) {
    if (detail::matmul_x16_path(w, x16, t) == detail::GemmPath::TILE) {
      tile_gemm(w, x16, y, y16, t, m, stream, accumulate);
      return;
    }
    TESSERA_CHECK(w.n * w.k <= m.max_quant_nk,
                  "{}: the {} weight [{}, {}] needs {} elements of dequantization scratch, the workspace has {}", op,
                  dtype_name(w.dtype), w.n, w.k, w.n * w.k, m.max_quant_nk);
    detail::launch_dequant_bf16(w, m.deq.get(), stream);
    detail::gemm_lt(ws, DType::BF16, m.deq.get(), x16, y, t, w.n, w.k, stream, accumulate, y16);
  } else {
    detail::gemm_lt(ws, w.dtype, w.quants.get(), x16, y, t, w.n, w.k, stream, accumulate, y16);
  }
}

}  // namespace

void matmul_x16(const DeviceWeight& w, const void* x16, float* y, int64_t t, GemmWorkspace& ws, cudaStream_t stream,
                bool accumulate) {
  matmul_x16_impl(w, x16, y, false, t, ws, stream, accumulate);
}

void matmul_x16_out16(const DeviceWeight& w, const void* x16, void* y16, int64_t t, GemmWorkspace& ws,
                      cudaStream_t stream, bool accumulate) {
  matmul_x16_impl(w, x16, y16, true, t, ws, stream, accumulate);
}

int matmul_split_k_default(int64_t t, int64_t n, int64_t k) {
  // cuBLASLt's tiles are at least ~64 x 128 of D [N, t] (N = n, the narrow side), so a product with a handful of
  // output tiles runs on a handful of the H100's 132 SMs, each looping over the whole K: x16 [512, 4096] · A_stack
  // [32, 4096]ᵀ (134 MFLOP, 4 tiles) added ~9 us to Llama-3-8B's gate|up node, down's K = 14336 more. Splitting K
  // until the tiles times the slices fill about 128 SMs, with slices of at least 128 (whole 16-byte rows of 8
  // values), brings that to ~1 us plus the sum (lora_sum_parts).
  if (n > 128) return 1;
  const int64_t tiles = (t + 127) / 128 * ((n + 63) / 64);
  int s = 1;
  while (s < kMaxSplitK && tiles * s * 2 <= 128 && k % (s * 2 * 8) == 0 && k / (s * 2) >= 128) s *= 2;
  return s;
}

int matmul_x16_split_k(const DeviceWeight& w, const void* x16, float* parts, int64_t t, int splits, GemmWorkspace& ws,
                       cudaStream_t stream) {
  GemmWorkspace::Impl& m = ws.impl();
  TESSERA_CHECK(w.dtype == DType::BF16 || w.dtype == DType::F16,
                "matmul_x16_split_k: the weight must be bf16 or f16, not {}", dtype_name(w.dtype));
  TESSERA_CHECK(w.n > 0 && w.k > 0 && !w.quants.empty(), "matmul_x16_split_k: the weight is empty");
  TESSERA_CHECK(x16 != nullptr && parts != nullptr, "matmul_x16_split_k: the input or output pointer is null");
  TESSERA_CHECK(t >= 1 && t <= m.max_t, "matmul_x16_split_k: t = {} rows is outside the workspace's 1..{}", t, m.max_t);
  TESSERA_CHECK(splits >= 1 && splits <= kMaxSplitK && w.k % (splits * 8) == 0,
                "matmul_x16_split_k: K = {} cannot be cut into {} slices of whole 16-byte rows", w.k, splits);
  const int64_t k_bytes = w.k * 2, ks_bytes = w.k / splits * 2;
  // A batch whose A and B slices interleave within their rows: should cuBLASLt take no algorithm for it, one GEMM
  // over the whole K (one part) rather than an error in the middle of a run.
  const Plan* p = m.plan(w.dtype, w.n, t, w.k, alignment(w.quants.get(), k_bytes | ks_bytes),
                         alignment(x16, k_bytes | ks_bytes), alignment(parts, w.n * 4), CUDA_R_32F, splits, false);
  if (p == nullptr) {
    splits = 1;
    p = m.plan(w.dtype, w.n, t, w.k, alignment(w.quants.get(), k_bytes), alignment(x16, k_bytes),
               alignment(parts, w.n * 4), CUDA_R_32F);
  }
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(cublasLtMatmul(m.lt, p->op, &alpha, w.quants.get(), p->a, x16, p->b, &beta, parts, p->c, parts, p->c,
                          &p->algo, m.lt_ws.get(), kLtWorkspaceBytes, stream),
           "cublasLtMatmul");
  return splits;
}

void matmul(const DeviceWeight& w, const float* x, float* y, int64_t t, GemmWorkspace& ws, cudaStream_t stream,
            bool accumulate) {
  detail::matmul_path(w, x, y, t, ws, stream, accumulate, detail::GemmPath::AUTO);
}

}  // namespace tessera::cuda
