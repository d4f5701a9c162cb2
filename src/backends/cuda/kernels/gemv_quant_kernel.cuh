// The quantized GEMV kernel and its launchers (dp4a against the q8 activation, SPLIT_Q layout), a template over the
// format: gemv_quant.cu instantiates it for the 32-block formats, gemv_kquant.cu for the K-quants (separate files so
// that the two compile in parallel). Why the kernel looks the way it does: see gemv.cu.
#pragma once

#include "backends/cuda/kernels/gemv_common.cuh"
#include "backends/cuda/kernels/quant_units.h"

namespace tessera::cuda::detail {
namespace {

// One 32-block's contribution: w quants (QB bytes as uint4s), its scale bits, the activation's 32 int8 (8 words)
// and (d, d * sum q).
template <DType D>
__device__ __forceinline__ float block_dot(const uint4 (&wq)[QuantFmt<D>::kQuantBytes / 16], uint32_t scale,
                                           const int (&xq)[8], float2 xds) {
  int sumi = 0;
  if constexpr (D == DType::Q8_0) {
    const int w[8] = {int(wq[0].x), int(wq[0].y), int(wq[0].z), int(wq[0].w),
                      int(wq[1].x), int(wq[1].y), int(wq[1].z), int(wq[1].w)};
#pragma unroll
    for (int i = 0; i < 8; ++i) sumi = __dp4a(w[i], xq[i], sumi);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(scale))) * xds.x * static_cast<float>(sumi);
  } else if constexpr (D == DType::IQ4_NL) {
    // q4_0's nibbles, each a code into the int8 table (quant_units.h): sum d_w v_w d_x q_x = d_w d_x sum(v_w q_x).
    const uint32_t w[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int lo, hi;
      iq4nl_words(w[i], lo, hi);
      sumi = __dp4a(lo, xq[i], sumi);
      sumi = __dp4a(hi, xq[i + 4], sumi);
    }
    return __half2float(__ushort_as_half(static_cast<unsigned short>(scale))) * xds.x * static_cast<float>(sumi);
  } else {
    // Byte j of the 16 holds element j (low nibble) and j + 16 (high nibble); word i covers elements 4i..4i+3.
    const uint32_t w[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sumi = __dp4a(static_cast<int>(w[i] & 0x0F0F0F0Fu), xq[i], sumi);
      sumi = __dp4a(static_cast<int>((w[i] >> 4) & 0x0F0F0F0Fu), xq[i + 4], sumi);
    }
    if constexpr (D == DType::Q4_0) {
      // sum d_w (q_w - 8) d_x q_x = d_w (d_x sum(q_w q_x) - 8 d_x sum(q_x))
      const float dw = __half2float(__ushort_as_half(static_cast<unsigned short>(scale)));
      return dw * (xds.x * static_cast<float>(sumi) - 8.0f * xds.y);
    } else {
      // sum (d_w q_w + m_w) d_x q_x = d_w d_x sum(q_w q_x) + m_w d_x sum(q_x)
      const float2 dm = half2_to_float2(scale);
      return dm.x * xds.x * static_cast<float>(sumi) + dm.y * xds.y;
    }
  }
}

template <int QB, int SB>
__device__ __forceinline__ void load_block(const uint8_t* qrow, const uint8_t* srow, int b, uint4 (&wv)[QB / 16],
                                           uint32_t& sc) {
#pragma unroll
  for (int v = 0; v < QB / 16; ++v) wv[v] = ld_stream16(qrow + static_cast<size_t>(b) * QB + 16 * v);
  if constexpr (SB == 2)
    sc = ld_stream2(srow + static_cast<size_t>(b) * SB);
  else
    sc = ld_stream4(srow + static_cast<size_t>(b) * SB);
}

// acc[r] += unit b of row r · unit b of x: a 32-block for q8_0, q4_0 and q4_1; a K-quant unit (quant_units.h) with
// its activation loaded once for every row.
template <DType D, int ROWS>
__device__ __forceinline__ void quant_step(const uint4 (&wv)[ROWS][QuantFmt<D>::kVecs],
                                           const typename QuantFmt<D>::Scale (&sc)[ROWS], const int8_t* __restrict__ xq,
                                           const float2* __restrict__ xds, int b, float (&acc)[ROWS]) {
  if constexpr (is_unit_format<D>()) {
    const typename QuantFmt<D>::Act x = QuantFmt<D>::Act::load(xq, xds, b);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] += QuantFmt<D>::dot(wv[r], sc[r], x);
  } else {
    const int4 x0 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * b);
    const int4 x1 = __ldg(reinterpret_cast<const int4*>(xq) + 2 * b + 1);
    const int xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const float2 ds = __ldg(xds + b);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] += block_dot<D>(wv[r], sc[r], xv, ds);
  }
}

// One kernel, software-pipelined (bench/cuda/experiments/gemv_quant_sweep.cu measured each step of this against the
// previous kernel):
//  - the first step's weight loads are issued before pdl_wait(): weights never depend on an earlier kernel, so with
//    PDL their latency overlaps the previous kernel's tail (6144x4096 q4_0: 6.27 -> 5.2 us);
//  - step s+1's loads are issued before step s's arithmetic, so each thread always has a step in flight;
//  - loads are guarded per slot, so a row's tail is an ordinary step (no one-load tail loop behind the last full step).
// CAP: at most 64 registers (1024 threads per SM). The pipeline holds two steps in registers (~70), which cost the
// one-wave grid at K = 14336 (4096x14336 q4_0, 128/4/1: 1024 blocks, 7 per SM uncapped = 924 resident: 13.0 us;
// capped, 8 per SM: 11.1 us). launch_shape picks it only when the grid does not fit in one uncapped wave, and only
// for shapes whose pipeline fits 64 registers without spilling.
// RMS (RmsIn, gemv_common.cuh): x was quantized without its 1/rms factor; the GEMV scales its outputs by it.
// NORM_OUT (GemvInput::norm_out_*): the outputs also quantized for the next RMSNorm's readers, rms-free, with the
// per-32 sums of squares, as warp groups: the block owns one group of 32 output rows and is one warp per ROWS rows of
// it (kQ / ROWS warps); each warp streams its rows as a block of 32 threads would (same slots, same order: the sums
// are those of a 32-thread launch), and warp 0 quantizes the group's 32 values times the norm weight from shared
// memory (quantize_lane_q8, as quantize_q8): no cluster, no ticket. THREADS is the block's size. (The cluster form of
// this epilogue and the quantized SwiGLU epilogue measured slower on the H100 and left src/: docs/CUDA_NOTES.md.)
struct NormOut {
  const float* w;  // [n]
  int8_t* q8;      // [n]
  float2* ds;      // [n/32]
  float* sumsq;    // [n/32]
};

template <DType D, int THREADS, int ROWS, int UNROLL, int PF, bool CAP, bool NORM_OUT = false>
__global__ void __launch_bounds__(THREADS, CAP ? 1024 / THREADS : 1)
    gemv_quant_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                      const int8_t* __restrict__ xq /*[k]*/, const float2* __restrict__ xds /*[k/32]*/,
                      float* __restrict__ y /*[n]*/, int n, int k, bool accumulate, RmsIn rin, NormOut no,
                      EarlyL2 early) {
  using Q = QuantFmt<D>;
  constexpr int QB = Q::kQuantBytes;
  constexpr int SB = Q::kScaleBytes;
  constexpr int V = Q::kVecs;    // 16-byte vectors per unit (QB / 16, or more for q5_K)
  constexpr bool WG = NORM_OUT;  // warp groups
  static_assert(!WG || (kQ % ROWS == 0 && THREADS == kWarp * (kQ / ROWS)), "warp groups: blocks of 32 outputs");
  constexpr int LT = WG ? kWarp : THREADS;  // threads sharing a row (a warp with WG, else the block)
  constexpr int kStep = LT * UNROLL;        // 32-blocks per row per step
  const int tid = WG ? static_cast<int>(threadIdx.x) % kWarp : static_cast<int>(threadIdx.x);
  const int nb = k / Q::kUnit;  // units per row (32-blocks for q8_0, q4_0, q4_1)
  const int row0 =
      WG ? static_cast<int>(blockIdx.x) * kQ + static_cast<int>(threadIdx.x) / kWarp * ROWS : blockIdx.x * ROWS;
  const uint8_t* qr[ROWS];
  const uint8_t* sr[ROWS];
  const uint8_t* tr[ROWS];  // the tail rows of a format with one (q6_K's d), else null
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const size_t row = static_cast<size_t>(min(row0 + r, n - 1));
    qr[r] = quants + row * nb * QB;
    sr[r] = scales + row * nb * SB;
    tr[r] = tail_row<D>(scales, n, nb, row);
  }
  if constexpr (WG) {  // the whole block's 32 rows (n % 32 == 0)
    const size_t g = static_cast<size_t>(blockIdx.x) * kQ;
    prefetch_block_l2<THREADS>(quants + g * nb * QB, static_cast<size_t>(kQ) * nb * QB, early);
    prefetch_block_l2<THREADS>(scales + g * nb * SB, static_cast<size_t>(kQ) * nb * SB, early);
  } else {
    const int rows_here = min(ROWS, n - row0);
    prefetch_block_l2<THREADS>(qr[0], static_cast<size_t>(rows_here) * nb * QB, early);
    prefetch_block_l2<THREADS>(sr[0], static_cast<size_t>(rows_here) * nb * SB, early);
  }
  // Slot u of the step at b0 covers block b0 + u * LT of each row; slots past the row's end load nothing.
  using Scale = typename Q::Scale;
  auto load_step = [&](int b0, uint4(&wv)[UNROLL][ROWS][V], Scale(&sc)[UNROLL][ROWS]) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (b0 + u * LT < nb) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if constexpr (is_unit_format<D>())
            Q::load(qr[r], sr[r], tr[r], b0 + u * LT, wv[u][r], sc[u][r]);
          else
            load_block<QB, SB>(qr[r], sr[r], b0 + u * LT, wv[u][r], sc[u][r]);
        }
      }
  };
  float norm_w = 0.0f;  // NORM_OUT, warp 0 of the group's block: lane i's weight
  if constexpr (NORM_OUT) {
    if (threadIdx.x < kWarp) norm_w = __ldg(no.w + blockIdx.x * kQ + threadIdx.x);
  }
  float acc[ROWS] = {};
  int b = tid;
  uint4 wv[UNROLL][ROWS][V] = {};
  Scale sc[UNROLL][ROWS] = {};
  load_step(b, wv, sc);
  pdl_wait();
  // RMS: warp 0 sums the k/32 partial sums (lane-strided, then the warp tree: a fixed order) while the weights stream;
  // only warp 0 stores (block_sum_store), so only it needs the scale (with WG every warp stores).
  const float out_scale = tid < kWarp ? rms_out_scale(rin, tid, k) : 1.0f;
  while (b < nb) {
    if constexpr (PF > 0) {
      const int ahead = b + (PF + 1) * kStep;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
          if (ahead + u * LT < nb) prefetch_l2(qr[r] + static_cast<size_t>(ahead + u * LT) * QB);
    }
    uint4 wn[UNROLL][ROWS][V] = {};
    Scale sn[UNROLL][ROWS] = {};
    if (b + kStep < nb) load_step(b + kStep, wn, sn);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (b + u * LT < nb) quant_step<D, ROWS>(wv[u], sc[u], xq, xds, b + u * LT, acc);
    b += kStep;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        sc[u][r] = sn[u][r];
#pragma unroll
        for (int v = 0; v < V; ++v) wv[u][r][v] = wn[u][r][v];
      }
  }
  if constexpr (WG) {
    block_sum_store<LT, ROWS>(acc, y, row0, n, accumulate, out_scale);  // each warp's lane 0 keeps its stored values
    __shared__ float group[kQ];
    if (tid == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) group[threadIdx.x / kWarp * ROWS + r] = acc[r];
    }
    __syncthreads();
    if (threadIdx.x < kWarp) {
      const float v = group[threadIdx.x];
      const int g = static_cast<int>(blockIdx.x);
      no.q8[g * kQ + threadIdx.x] = quantize_lane_q8(v * norm_w, no.ds + g);
      const float ss = warp_sum(v * v);
      if (threadIdx.x == 0) no.sumsq[g] = ss;
    }
  } else {
    block_sum_store<THREADS, ROWS>(acc, y, row0, n, accumulate, out_scale);
  }
}

// Capped only where 64 registers hold the pipeline without spills (ptxas, -Xptxas --warn-on-spills): 4-bit formats
// at 4 vectors per step (the defaults that need it). q8_0 at 2 rows and q4_1 at 2 vectors per step spilled. The unit
// formats of 16 quant bytes per unit (q5_0, q5_1, q2_K) carry more scale registers and were never measured capped.
template <DType D>
constexpr bool quant_cappable(const Shape& s) {
  return !is_unit_format<D>() && QuantFmt<D>::kQuantBytes == 16 && s.rows * s.unroll == 4;
}

// The plain kernel, or its register-capped copy where the grid does not fit one uncapped wave; with the norm_out
// epilogue, warp groups (one block of kQ / rows warps per 32 rows, uncapped).
template <DType D, int I>
void launch_shape_compiled(const LaunchArgs& a) {
  constexpr Shape s = kShapes[I];
  const int n = static_cast<int>(a.w->n), k = static_cast<int>(a.w->k);
  const RmsIn rin{a.x->rms_sumsq, a.x->rms_eps};
  const NormOut no{a.x->norm_out_w, a.x->norm_out_q8, a.x->norm_out_ds, a.x->norm_out_sumsq};
  if (a.x->norm_out_w != nullptr) {
    if constexpr (has_norm_out_groups(s) && norm_out_group_threads(s) <= max_group_threads(D)) {
      constexpr int kThreads = kWarp * (kQ / s.rows);
      launch("gemv_quant_kernel<norm_out>", gemv_quant_kernel<D, kThreads, s.rows, s.unroll, s.prefetch, false, true>,
             dim3(ceil_div(n, kQ)), dim3(kThreads), 0, a.stream, a.w->quants.as<uint8_t>(), a.w->scales.as<uint8_t>(),
             a.x->q8, a.x->q8_ds, a.y, n, k, a.accumulate, rin, no, early_l2());
    } else {
      fail_message("gemv: this launch shape has no norm_out epilogue");
    }
    return;
  }
  const auto plain = gemv_quant_kernel<D, s.threads, s.rows, s.unroll, s.prefetch, false>;
  auto kernel = plain;
  const dim3 grid(ceil_div(n, s.rows));
  if constexpr (quant_cappable<D>(s)) {
    static const int plain_per_sm = blocks_per_sm(plain, s.threads);
    if (static_cast<int64_t>(grid.x) > static_cast<int64_t>(plain_per_sm) * sm_count())
      kernel = gemv_quant_kernel<D, s.threads, s.rows, s.unroll, s.prefetch, true>;
  }
  launch("gemv_quant_kernel", kernel, grid, dim3(s.threads), 0, a.stream, a.w->quants.as<uint8_t>(),
         a.w->scales.as<uint8_t>(), a.x->q8, a.x->q8_ds, a.y, n, k, a.accumulate, rin, no, early_l2());
}

template <DType D, int I>
void launch_shape(const LaunchArgs& a) {
  constexpr Shape s = kShapes[I];
  if constexpr (!shape_compiled(D, s)) {
    fail_message("gemv: this launch shape has no kernel for this weight format (gemv_config_supported)");
  } else {
    launch_shape_compiled<D, I>(a);
  }
}

template <DType D, size_t... I>
void launch_indexed(int index, const LaunchArgs& a, std::index_sequence<I...>) {
  ((index == static_cast<int>(I) ? launch_shape<D, static_cast<int>(I)>(a) : void()), ...);
}

}  // namespace
}  // namespace tessera::cuda::detail
