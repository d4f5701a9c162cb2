// GEMV for batch-1 decode: y[N] = W[N, K] · x[K], every weight byte read exactly once.
//
// Decode is bound by weight bytes over memory bandwidth, so the kernels are built around the loads:
//  - each thread issues 16-byte weight loads (ld.global.nc.L1::no_allocate: streamed, never evicting x from L1),
//    coalesced along K across the block (consecutive threads read consecutive 16-byte vectors of a row);
//  - a block owns ROWS rows, and each thread issues ROWS * UNROLL loads before the first use, so enough bytes are in
//    flight (Little's law: ~3 TB/s * ~0.7 us latency ≈ 2 MB across the chip, ~16 KB per SM). ptxas may still
//    interleave loads with FMAs to save registers (seen in the SASS); occupancy then carries the bytes in flight;
//  - ROWS > 1 reuses each x vector (read from L1) for several rows, which keeps L1 traffic under the weight traffic;
//  - partial sums are reduced with warp shuffles, then across warps in shared memory.
// Quantized weights multiply 8-bit quants by the q8-quantized activation with dp4a (4 int8 products per
// instruction), so dequantization costs a few integer instructions per 32 weights instead of 32 float conversions.
// This file: launch-shape choice and host dispatch; the kernels are in gemv_float.cu and gemv_quant.cu.
#include <cstdint>

#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels/gemv_common.cuh"

namespace tessera::cuda {

void set_pdl(bool on) {
  CudaOptions o = cuda_options();
  o.pdl = on;
  set_cuda_options(o);
}

bool pdl_enabled() { return cuda_options().pdl; }

namespace detail {

EarlyL2 early_l2() {
  const EarlyL2Options& o = cuda_options().early_l2;
  EarlyL2 e;
  e.blocks = o.blocks, e.bytes = o.bytes, e.bulk = o.bulk ? 1 : 0;
  return e;
}

int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }

namespace {

int shape_index(const GemvConfig& c) {
  for (int i = 0; i < kNumShapes; ++i)
    if (kShapes[i].threads == c.threads && kShapes[i].rows == c.rows && kShapes[i].unroll == c.unroll &&
        kShapes[i].prefetch == c.prefetch)
      return i;
  return -1;
}

}  // namespace
}  // namespace detail

const std::vector<GemvConfig>& gemv_configs() {
  static const std::vector<GemvConfig> configs = [] {
    std::vector<GemvConfig> v;
    for (const auto& s : detail::kShapes) v.push_back({s.threads, s.rows, s.unroll, s.prefetch});
    return v;
  }();
  return configs;
}

bool gemv_norm_out_supported(const GemvConfig& c) {
  return !c.stationary && detail::has_norm_out_groups(detail::Shape{c.threads, c.rows, c.unroll, c.prefetch});
}

bool gemv_config_supported(DType dtype, const GemvConfig& c) {
  if (c.stationary) {  // and k: gemv_tq2_stationary_fits, gemv_iq4nl_stationary_fits
    const GemvConfig xs = gemv_iq4nl_stationary_config();
    return dtype == DType::TQ2_0 || dtype == DType::TQ1_0 ||
           (dtype == DType::IQ4_NL && c.threads == xs.threads && c.rows == xs.rows && c.unroll == xs.unroll &&
            c.prefetch == xs.prefetch);
  }
  const detail::Shape s{c.threads, c.rows, c.unroll, c.prefetch};
  return detail::shape_index(c) >= 0 && (!gemv_quantized(dtype) || detail::shape_compiled(dtype, s));
}

bool gemv_norm_out_supported(const GemvConfig& c, DType dtype) {
  const detail::Shape s{c.threads, c.rows, c.unroll, c.prefetch};
  return gemv_norm_out_supported(c) && gemv_config_supported(dtype, c) &&
         detail::norm_out_group_threads(s) <= detail::max_group_threads(dtype);
}

namespace {

// CudaOptions::gemv_shapes (a study knob): launch shapes for the matrices of those shapes (any weight format), in place
// of the defaults below, so a benchmark can sweep shapes inside the decode graph. set_cuda_options has checked that
// each is one of gemv_configs().
const GemvConfig* shape_override(int64_t n, int64_t k) {
  for (const GemvShapeOverride& o : cuda_options().gemv_shapes)
    if (o.n == n && o.k == k) return &o.config;
  return nullptr;
}

}  // namespace

namespace detail {
namespace {

// One row of a format's launch-shape table: the shape for matrices of at most k_max columns and n_max rows (the first
// row that holds the matrix wins; the last row of a table holds every matrix).
struct ShapeRule {
  int64_t k_max, n_max;
  GemvConfig config;
};
constexpr int64_t kAny = INT64_MAX;

// The best launch shape of tessera_bench_kquant --all-configs per format and Llama-3-8B / 3.2-1B shape (H100,
// 2026-11-26, 26 shapes; 16 for q5_K and q6_K, whose units spill at more than four rows x slots). A 64-element unit
// per thread and step leaves short rows (K = 2048-4096: 32-64 units) few steps per thread, so one-warp blocks of 2-8
// rows won there (% of the byte floor, the previous default's in parentheses): q4_K 4096x4096 60.9 (57.6),
// 6144x4096 72.3 (65.2), 28672x4096 94.9 (89.3), 4096x14336 80.8 (72.0), 3072x2048 46.5 (30.3), 16384x2048 71.6
// (52.0); iq4_xs 28672x4096 77.3 (61.1), 16384x2048 57.6 (32.0); iq4_nl 4096x14336 85.0 (70.8), 6144x4096 73.5
// (57.8). A second run (same day, with the unit's halves loaded through L1 and three more one-warp shapes) moved
// q4_K 4096x4096 and 4096x14336 to 32/4/2 (62.8% against 32/8/1's 60.2%; 77.2% against 64/8/1's 74.6%), q6_K and
// iq4_nl 2048x2048 to 32/2/2 and 32/4/2 (+2-3 points). Shapes between the measured ones take the nearest measured
// class. End to end (tessera bench --arch llama3-8b --random-weights -n 128, H100): q4_K tg128 447.8 -> 486.6 tok/s,
// iq4_nl 436.4 -> 471.2.
constexpr ShapeRule kQ4KRules[] = {
    {2048, kAny, {32, 4, 1, 0}}, {4096, 4096, {32, 4, 2, 0}}, {4096, 8192, {32, 4, 1, 0}},
    {4096, kAny, {32, 2, 2, 0}}, {8192, kAny, {64, 2, 1, 0}}, {kAny, kAny, {32, 4, 2, 0}},
};
constexpr ShapeRule kQ5KRules[] = {
    {2048, kAny, {32, 4, 1, 0}},
    {4096, 4096, {32, 4, 1, 0}},
    {8192, kAny, {64, 2, 1, 0}},
    {kAny, kAny, {32, 4, 1, 0}},
};
constexpr ShapeRule kQ6KRules[] = {
    {2048, 2048, {32, 2, 2, 0}}, {2048, kAny, {32, 4, 1, 0}}, {4096, 14336, {64, 2, 1, 0}},
    {4096, kAny, {32, 2, 2, 0}}, {kAny, kAny, {64, 2, 1, 0}},
};
constexpr ShapeRule kIQ4XSRules[] = {
    {2048, 8192, {32, 4, 1, 0}}, {2048, kAny, {32, 8, 1, 0}}, {4096, kAny, {32, 4, 1, 0}},
    {8192, kAny, {64, 4, 1, 0}}, {kAny, kAny, {32, 4, 1, 0}},
};
// iq4_nl: q4_0's bytes per 32-block; rows of at most 1,024 columns (SmolLM2) keep q4_0's pick (not swept).
constexpr ShapeRule kIQ4NLRules[] = {
    {1024, kAny, {0, 0, 0, 0}},  {2048, 2048, {32, 4, 2, 0}}, {2048, 4096, {32, 4, 1, 0}},  {2048, kAny, {32, 8, 1, 0}},
    {4096, 4096, {64, 8, 1, 0}}, {4096, 8192, {32, 4, 1, 0}}, {8192, kAny, {128, 4, 1, 0}}, {kAny, kAny, {64, 8, 1, 0}},
};

// q2_K and q3_K (not swept): q5_K's picks, a 64-element unit per thread and step with at most four rows x slots.
constexpr ShapeRule kQ2Q3KRules[] = {
    {2048, kAny, {32, 4, 1, 0}},
    {4096, 4096, {32, 4, 1, 0}},
    {8192, kAny, {64, 2, 1, 0}},
    {kAny, kAny, {32, 4, 1, 0}},
};

// tq2_0: a 128-element unit is 32 bytes, one step of 32 or 64 threads covers a 4096- or 8192-wide row, and eight rows
// per block was the best of the 29 shapes at every Llama-3-8B and BitNet-2B4T matrix (exp_gemv_tq2_sweep, H100,
// 2026-11-26, us, against the previous q4_K-derived picks): 14336x4096 7.90 (9.47), 4096x14336 8.15 at 64 threads
// (12.66), 4096x4096 2.58 (3.37), 6144x4096 3.36 (5.14), 28672x4096 13.42 (16.71), 6912x2560 2.97 (4.43), 2560x6912
// 3.19 at 64 threads (4.28).
constexpr ShapeRule kTQ2Rules[] = {
    {4096, kAny, {32, 8, 1, 0}},
    {kAny, kAny, {64, 8, 1, 0}},
};

template <size_t N>
const GemvConfig* pick(const ShapeRule (&rules)[N], int64_t n, int64_t k) {
  for (const ShapeRule& r : rules)
    if (k <= r.k_max && n <= r.n_max) return r.config.threads != 0 ? &r.config : nullptr;
  return nullptr;
}

// The swept launch shape of a format with a table above, or null (the format's rule in gemv_default_config).
const GemvConfig* swept_unit_config(DType dtype, int64_t n, int64_t k) {
  switch (dtype) {
    case DType::Q4_K:
      return pick(kQ4KRules, n, k);
    case DType::Q5_K:
      return pick(kQ5KRules, n, k);
    case DType::Q6_K:
      return pick(kQ6KRules, n, k);
    case DType::IQ4_XS:
      return pick(kIQ4XSRules, n, k);
    case DType::IQ4_NL:
      return pick(kIQ4NLRules, n, k);
    case DType::Q2_K:
    case DType::Q3_K:
      return pick(kQ2Q3KRules, n, k);
    case DType::TQ2_0:
      return pick(kTQ2Rules, n, k);
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace detail

bool gemv_tq2_stationary_fits(int64_t k) { return k % 2048 == 0 && k / 2048 >= 2 && k / 2048 <= 16; }

bool gemv_iq4nl_stationary_fits(int64_t k) { return k == int64_t{32} * 32 * detail::kIq4nlXsWarps; }

GemvConfig gemv_iq4nl_stationary_config() {
  GemvConfig c{32 * detail::kIq4nlXsWarps, detail::kIq4nlXsRows, 1, 0};
  c.stationary = true;
  return c;
}

GemvConfig gemv_default_config(DType dtype, int64_t n, int64_t k) {
  if (const GemvConfig* o = shape_override(n, k)) return *o;
  if (dtype == DType::TQ1_0) dtype = DType::TQ2_0;  // uploaded as tq2_0 (weights.cpp)
  // tq2_0's x-stationary kernel where it beat every shape of the shared kernel (exp_gemv_tq2_sweep, H100, 2026-11-26,
  // us): 14336x4096 6.90 (7.92 at 32/8/1), 28672x4096 11.68 (12.70), 4096x14336 7.62 (8.11 at 64/8/1); it lost at
  // 4096x4096 and 6144x4096 (2.82 / 3.53 against 2.66 / 3.37: a grid of a few hundred blocks, one step each).
  if (dtype == DType::TQ2_0 && gemv_tq2_stationary_fits(k) && (k > 4096 || n >= 8192)) {
    GemvConfig c{static_cast<int>(k / 2048) * 32, 4, 1, 0};
    c.stationary = true;
    return c;
  }
  // iq4_nl's x-stationary kernel where it beat src's shared kernel at its default launch shape
  // (exp_gemv_q4_stationary_sweep, H100, 2026-11-26, medians with L2 defeated, us; xs at its best warps/rows/blocks
  // per lane): 14336x4096 13.83 at w4/r4/p1 (14.26), 28672x4096 24.38 at w4/r4/p1 (26.25). It lost at 4096x4096
  // (5.12 at w4/r2/p1 against 5.00), 6144x4096 (6.85 against 6.52) and 4096x14336 (15.02 at w14/r2/p1 against 13.35).
  // The output projection (128256x4096, when iq4_nl) takes it by the same rule (not measured).
  if (dtype == DType::IQ4_NL && gemv_iq4nl_stationary_fits(k) && n >= 14336) return gemv_iq4nl_stationary_config();
  // Picked from the H100 sweeps of every shape in the table (docs/CUDA_NOTES.md, runs 1-3): at the issue's large
  // shapes each choice is within ~3% of the sweep's best (q8_0/q4 at 4096x14336 within ~5%).
  if (const GemvConfig* c = detail::swept_unit_config(dtype, n, k)) return *c;
  // q5_0 and q5_1 (not swept): q4_1's picks (a 32-block per unit, 16 quant bytes plus 6 or 8 of scale and qh).
  const bool quant = dtype == DType::Q8_0 || dtype == DType::Q4_0 || dtype == DType::Q4_1 || dtype == DType::IQ4_NL ||
                     dtype == DType::Q5_0 || dtype == DType::Q5_1;
  if (quant) {
    // From the H100 sweep of the pipelined quant kernel (bench/cuda/experiments/gemv_quant_sweep.cu, 2026-11-22;
    // docs/CUDA_NOTES.md):
    // each pick is within ~2% of the best of 16 shapes x 5 kernel variants at Llama-3-8B's shapes.
    const bool q8 = dtype == DType::Q8_0;
    const int64_t blocks = k / detail::kQ;  // 32-blocks per row
    if (blocks >= 256) {                    // ffn_down (K = 14336): 4-bit formats take the capped kernel, one wave
      // q8_0: 128/4/1 inside the decode graph beat the isolated sweep's 256/2/2 (8B q8_0 decode 306.7 -> 311.4 tok/s,
      // H100, TESSERA_CUDA_GEMV_SHAPES sweep of 2026-11-22; 256/4/1 305.9, 128/2/2 302.6).
      if (q8) return {128, 4, 1, 0};
      return dtype == DType::Q4_0 || dtype == DType::IQ4_NL ? GemvConfig{128, 4, 1, 0} : GemvConfig{256, 4, 1, 0};
    }
    if (n >= 8192) return {128, 4, 1, 0};  // many rows (gate|up, lm_head): several waves
    if (n >= 4096) return {64, 4, 1, 0};   // q|k|v, o: one wave of 64-thread blocks
    // Llama-3.2-1B's q|k|v and o (2048 wide, 64 blocks per row): q8_0 at 64/4/1 reached 79.7% / 65.9% of the byte
    // floor against 64/2/1's 60.2% / 46.5% (tessera_bench_kquant --all-configs, H100, 2026-11-26); narrower rows
    // (SmolLM2) keep the in-graph pick.
    if (q8) return blocks >= 64 ? GemvConfig{64, 4, 1, 0} : GemvConfig{64, 2, 1, 0};
    return GemvConfig{128, 4, 1, 0};
  }
  const int64_t vectors = k * (dtype == DType::F32 ? 4 : 2) / 16;  // 16-byte loads per row
  if (dtype != DType::F32) {
    // The pipelined kernel (gemv_float_kernel.cuh) from its H100 sweep (bench/cuda/experiments/gemv_float_sweep.cu,
    // 2026-11-22, bf16): four rows, one vector per row per step (the pipeline keeps the next step in flight) was the
    // best or within ~3% of it at every SmolLM2, Llama-3.2-1B and Llama-3-8B shape; 256 threads for rows of >= 512
    // vectors (K >= 4096), 128 below. The previous default (256/2/2) lost 2-9% with the pipeline.
    // (The previous shapes, and the capped copy only where it makes one wave, are gemv_float_sweep.cu's "prev".)
    // Inside the decode graph (TESSERA_CUDA_GEMV_SHAPES sweep, H100, 2026-11-22) a few rows of
    // long K also take 256 threads: SmolLM2's ffn_down (576 x 1536, 192 vectors) 2,482-2,484 -> 2,501-2,502 tok/s
    // end to end; its other shapes (960 x 576, 576 x 576, 3072 x 576, 49152 x 576) lost 1-10% with any other shape.
    if (vectors >= 512 || (vectors >= 192 && n <= 1024)) return GemvConfig{256, 4, 1, 0};
    return GemvConfig{128, 4, 1, 0};
  }
  if (vectors >= 384) return {256, 2, 2, 0};
  if (vectors >= 128) return {128, 2, 2, 0};
  return {128, 4, 2, 0};  // short rows: latency-bound; four rows per block keep the block count low
}

GemvConfig gemv_norm_out_config(DType dtype, int64_t n, int64_t k) {
  if (const GemvConfig* o = shape_override(n, k)) return *o;
  if (dtype == DType::TQ1_0) dtype = DType::TQ2_0;  // uploaded as tq2_0 (weights.cpp)
  // K-quants: 256-thread groups (four rows per warp, one unit in flight per row); the 512-thread form below spills.
  if (dtype == DType::Q4_K || dtype == DType::Q5_K || dtype == DType::Q6_K || dtype == DType::IQ4_XS ||
      dtype == DType::Q2_K || dtype == DType::Q3_K ||
      dtype == DType::TQ2_0)
    return {64, 4, 1, 0};
  // Warp groups of two rows, two loads in flight per row (16 warps per 32 rows): inside the 8B q4_1 decode graph
  // (H100, TESSERA_CUDA_GEMV_SHAPES sweep of 2026-11-22, o and down alike) 498.6 tok/s against 497.6 at one load,
  // 490.0 at four rows and two loads, 463.2 at the plain default's four rows and one load.
  return {128, 2, 2, 0};
}

void gemv(const DeviceWeight& w, const GemvInput& x, float* y, cudaStream_t stream, const GemvConfig* config,
          bool accumulate) {
  using detail::num;
  TESSERA_CUDA_REQUIRE(gemv_supports(w.dtype),
                       "gemv: weight dtype " + std::string(dtype_name(w.dtype)) + " is not supported on CUDA");
  TESSERA_CUDA_REQUIRE(w.n > 0 && w.k > 0 && !w.quants.empty(), "gemv: the weight is empty (was it uploaded?)");
  TESSERA_CUDA_REQUIRE(y != nullptr, "gemv: output pointer is null");
  const GemvConfig c = config ? *config : gemv_default_config(w.dtype, w.n, w.k);
  if (c.stationary) {
    TESSERA_CUDA_REQUIRE(w.dtype == DType::TQ2_0 || w.dtype == DType::IQ4_NL,
                         "gemv: the x-stationary launch shape has kernels for tq2_0 and iq4_nl weights only, not " +
                             std::string(dtype_name(w.dtype)));
    if (w.dtype == DType::TQ2_0)
      TESSERA_CUDA_REQUIRE(gemv_tq2_stationary_fits(w.k) && c.threads == static_cast<int>(w.k / 2048) * 32 &&
                               (c.rows == 4 || c.rows == 8),
                           "gemv: the x-stationary launch shape is for tq2_0 rows of a multiple of 2048 columns (up to "
                           "32768), k / 2048 warps, 4 or 8 rows per block");
    else
      TESSERA_CUDA_REQUIRE(gemv_iq4nl_stationary_fits(w.k) && gemv_config_supported(w.dtype, c),
                           "gemv: the x-stationary iq4_nl kernel is compiled for rows of 4096 columns only, at 128 "
                           "threads and 4 rows per block (gemv_iq4nl_stationary_config)");
    TESSERA_CUDA_REQUIRE(x.norm_w == nullptr && x.norm_out_w == nullptr && !x.swiglu,
                         "gemv: the x-stationary kernels have no RMSNorm, norm_out or SwiGLU epilogue");
    TESSERA_CUDA_REQUIRE(x.q8 != nullptr && x.q8_ds != nullptr && detail::aligned16(x.q8) && detail::aligned16(x.q8_ds),
                         "gemv: quantized weights need the q8 activation (16-byte aligned; see quantize_q8)");
    const detail::LaunchArgs a{&w, &x, y, stream, accumulate};
    if (w.dtype == DType::TQ2_0)
      detail::launch_gemv_tq2_stationary(c, a);
    else
      detail::launch_gemv_q_stationary(c, a);
    return;
  }
  const int index = detail::shape_index(c);
  TESSERA_CUDA_REQUIRE(index >= 0, "gemv: launch config (threads " + num(c.threads) + ", rows " + num(c.rows) +
                                       ", unroll " + num(c.unroll) + ", prefetch " + num(c.prefetch) +
                                       ") is not one of gemv_configs()");
  const detail::LaunchArgs a{&w, &x, y, stream, accumulate};
  switch (w.dtype) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      TESSERA_CUDA_REQUIRE(x.f32 != nullptr && detail::aligned16(x.f32),
                           "gemv: float weights need a 16-byte aligned f32 activation");
      TESSERA_CUDA_REQUIRE(x.norm_w == nullptr || detail::aligned16(x.norm_w),
                           "gemv: the fused RMSNorm weight must be 16-byte aligned");
      TESSERA_CUDA_REQUIRE(x.rms_sumsq == nullptr && x.norm_out_w == nullptr,
                           "gemv: rms_sumsq and norm_out are for quantized weights (float weights fold the RMSNorm "
                           "through norm_w)");
      TESSERA_CUDA_REQUIRE(
          !x.swiglu || (w.n % 2 == 0 && !accumulate && c.rows % 2 == 0 && c.prefetch == 0 && c.threads >= 128),
          "gemv: the SwiGLU epilogue needs an even number of weight rows ([gate; up]), no accumulate, and a launch "
          "shape of >= 128 threads with an even number of rows and no prefetch");
      detail::launch_gemv_float(index, a);
      break;
    default:
      TESSERA_CUDA_REQUIRE(x.norm_w == nullptr,
                           "gemv: the fused RMSNorm needs float weights (quantized weights read "
                           "x already normalized and quantized: rmsnorm with a q8 output)");
      TESSERA_CUDA_REQUIRE(gemv_config_supported(w.dtype, c),
                           "gemv: launch config (threads " + num(c.threads) + ", rows " + num(c.rows) + ", unroll " +
                               num(c.unroll) + ") has no kernel for " + std::string(dtype_name(w.dtype)) +
                               " weights (gemv_config_supported)");
      TESSERA_CUDA_REQUIRE(!x.swiglu,
                           "gemv: the SwiGLU epilogue needs float weights (quantized weights: a swiglu launch after "
                           "the gate|up GEMV)");
      TESSERA_CUDA_REQUIRE(
          x.q8 != nullptr && x.q8_ds != nullptr && detail::aligned16(x.q8) && detail::aligned16(x.q8_ds),
          "gemv: quantized weights need the q8 activation (16-byte aligned; see quantize_q8)");
      TESSERA_CUDA_REQUIRE(
          x.norm_out_w == nullptr ||
              (gemv_norm_out_supported(c, w.dtype) && w.n % 32 == 0 && !x.swiglu && x.norm_out_q8 != nullptr &&
               x.norm_out_ds != nullptr && x.norm_out_sumsq != nullptr),
          "gemv: the norm_out epilogue needs N % 32 == 0, no SwiGLU, its q8, ds and sumsq outputs, and a launch shape "
          "of gemv_norm_out_supported (threads " +
              num(c.threads) + ", rows " + num(c.rows) + ", unroll " + num(c.unroll) + ", prefetch " + num(c.prefetch) +
              " is not)");
      detail::launch_gemv_quant(index, a);
      break;
  }
}

}  // namespace tessera::cuda
