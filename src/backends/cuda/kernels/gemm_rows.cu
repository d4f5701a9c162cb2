// Multi-row GEMV for small t (batched decode): y[t, N] = x[t, K] · Wᵀ with every weight byte read once per pass of up
// to kGemmRowsChunk rows of x. Each warp owns kRows weight rows, its lanes stride along K with 16-byte weight loads (as
// the t = 1 GEMV, gemv.cu), and each loaded weight vector is multiplied with all TT activation rows before the next
// load, so the arithmetic per weight byte grows with t while the bytes stay the same. Partial sums live in registers
// (kRows * TT floats per lane) and are reduced with warp shuffles only: no shared memory, no block barrier.
// Quantized weights dot their int8 quants with the q8-quantized activations (dp4a, as the t = 1 GEMV); for them this
// beats expanding the matrix for cuBLASLt up to t ~ 16-40. Float weights only win at t <= 4: from t = 8 the per-lane
// f32 x loads and FMAs bound it (figures in gemm.cpp's gemm_default_path).
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels/quant_units.h"

namespace tessera::cuda::detail {
namespace {

constexpr int kThreads = 128;  // four independent warps per block
constexpr int kWarps = kThreads / kWarp;
constexpr int kRows = 4;  // weight rows per warp: each activation vector loaded serves four rows

// Reduces acc over the warp and stores y[tt * n + row0 + r] (rows past n dropped).
template <int ROWS, int TT>
__device__ __forceinline__ void warp_store(float (&acc)[ROWS][TT], float* __restrict__ y, int row0, int n,
                                           bool accumulate) {
  const int lane = threadIdx.x & (kWarp - 1);
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int tt = 0; tt < TT; ++tt) {
      const float v = warp_sum(acc[r][tt]);
      // Spread the stores over lanes instead of serializing them on lane 0.
      if (lane == (r * TT + tt) % kWarp && row0 + r < n) {
        float* out = y + static_cast<size_t>(tt) * n + row0 + r;
        *out = accumulate ? *out + v : v;
      }
    }
}

// ---- Float weights ----

// acc[r][tt] += w vector (r) · x[tt] at element offset e0.
template <DType D, int TT>
__device__ __forceinline__ void float_step(const uint4 (&wv)[kRows], const float* __restrict__ x, int k, int e0,
                                           float (&acc)[kRows][TT]) {
  using F = FloatFmt<D>;
  constexpr int E = F::kElems;
  float wf[kRows][E];
#pragma unroll
  for (int r = 0; r < kRows; ++r) F::to_float(wv[r], wf[r]);
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    float xf[E];
    const float4* xp = reinterpret_cast<const float4*>(x + static_cast<size_t>(tt) * k + e0);
#pragma unroll
    for (int j = 0; j < E / 4; ++j) {
      const float4 v = __ldg(xp + j);
      xf[4 * j] = v.x, xf[4 * j + 1] = v.y, xf[4 * j + 2] = v.z, xf[4 * j + 3] = v.w;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[r][tt] = fmaf(wf[r][e], xf[e], acc[r][tt]);
  }
}

template <DType D, int TT>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_rows_float_kernel(const uint8_t* __restrict__ w /*[n, k]*/, const float* __restrict__ x /*[TT, k]*/,
                           float* __restrict__ y /*[TT, n]*/, int n, int k, bool accumulate) {
  constexpr int E = FloatFmt<D>::kElems;
  constexpr int kBytes = 16 / E;
  const int lane = threadIdx.x & (kWarp - 1);
  const int row0 = (blockIdx.x * kWarps + static_cast<int>(threadIdx.x / kWarp)) * kRows;
  if (row0 >= n) return;  // whole warp
  const uint8_t* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wr[r] = w + static_cast<size_t>(min(row0 + r, n - 1)) * k * kBytes;
  const int nv = k / E;  // 16-byte vectors per row
  float acc[kRows][TT] = {};
  int v = lane;
  // Two vectors per row in flight before the first use (unconditional loads: see gemv_float.cu), then the tail.
  for (; v + kWarp < nv; v += 2 * kWarp) {
    uint4 w0[kRows], w1[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      w0[r] = ld_stream16(wr[r] + static_cast<size_t>(v) * 16);
      w1[r] = ld_stream16(wr[r] + static_cast<size_t>(v + kWarp) * 16);
    }
    float_step<D, TT>(w0, x, k, v * E, acc);
    float_step<D, TT>(w1, x, k, (v + kWarp) * E, acc);
  }
  if (v < nv) {
    uint4 w0[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) w0[r] = ld_stream16(wr[r] + static_cast<size_t>(v) * 16);
    float_step<D, TT>(w0, x, k, v * E, acc);
  }
  warp_store<kRows, TT>(acc, y, row0, n, accumulate);
}

// ---- Quantized weights (SPLIT_Q layout, kernels.h) ----

template <DType D>
struct QuantBlock;
template <>
struct QuantBlock<DType::Q8_0> {
  static constexpr int kQuantBytes = 32, kScaleBytes = 2;
};
template <>
struct QuantBlock<DType::Q4_0> {
  static constexpr int kQuantBytes = 16, kScaleBytes = 2;
};
template <>
struct QuantBlock<DType::Q4_1> {
  static constexpr int kQuantBytes = 16, kScaleBytes = 4;
};
template <>
struct QuantBlock<DType::IQ4_NL> {
  static constexpr int kQuantBytes = 16, kScaleBytes = 2;
};

// One 32-block of a weight row against one 32-block of a q8 row: q8 words xq, (d, d * sum q) xds.
template <DType D>
__device__ __forceinline__ float quant_dot(const uint4 (&wq)[2], uint32_t scale, const int (&xq)[8], float2 xds) {
  int s = 0;
  if constexpr (D == DType::Q8_0) {
    const uint32_t w[8] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w, wq[1].x, wq[1].y, wq[1].z, wq[1].w};
#pragma unroll
    for (int i = 0; i < 8; ++i) s = __dp4a(static_cast<int>(w[i]), xq[i], s);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(scale))) * xds.x * static_cast<float>(s);
  } else if constexpr (D == DType::IQ4_NL) {
    // q4_0's nibbles as codes into the int8 table (quant_units.h's iq4nl_words).
    const uint32_t w[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int lo, hi;
      iq4nl_words(w[i], lo, hi);
      s = __dp4a(lo, xq[i], s);
      s = __dp4a(hi, xq[i + 4], s);
    }
    return __half2float(__ushort_as_half(static_cast<unsigned short>(scale))) * xds.x * static_cast<float>(s);
  } else {
    // Byte j holds element j (low nibble) and j + 16 (high nibble).
    const uint32_t w[4] = {wq[0].x, wq[0].y, wq[0].z, wq[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s = __dp4a(static_cast<int>(w[i] & 0x0F0F0F0Fu), xq[i], s);
      s = __dp4a(static_cast<int>((w[i] >> 4) & 0x0F0F0F0Fu), xq[i + 4], s);
    }
    if constexpr (D == DType::Q4_0) {
      // sum d_w (q_w - 8) d_x q_x = d_w (d_x sum(q_w q_x) - 8 d_x sum(q_x))
      const float dw = __half2float(__ushort_as_half(static_cast<unsigned short>(scale)));
      return dw * (xds.x * static_cast<float>(s) - 8.0f * xds.y);
    } else {
      const float2 dm = half2_to_float2(scale);
      return dm.x * xds.x * static_cast<float>(s) + dm.y * xds.y;
    }
  }
}

template <DType D, int TT>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_rows_quant_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                           const int8_t* __restrict__ xq /*[TT, k]*/, const float2* __restrict__ xds /*[TT, k/32]*/,
                           float* __restrict__ y /*[TT, n]*/, int n, int k, bool accumulate) {
  constexpr int QB = QuantBlock<D>::kQuantBytes, SB = QuantBlock<D>::kScaleBytes;
  const int lane = threadIdx.x & (kWarp - 1);
  const int row0 = (blockIdx.x * kWarps + static_cast<int>(threadIdx.x / kWarp)) * kRows;
  if (row0 >= n) return;  // whole warp
  const int nb = k / kQ;
  const uint8_t* qr[kRows];
  const uint8_t* sr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const size_t row = static_cast<size_t>(min(row0 + r, n - 1));
    qr[r] = quants + row * nb * QB;
    sr[r] = scales + row * nb * SB;
  }
  float acc[kRows][TT] = {};
  for (int b = lane; b < nb; b += kWarp) {
    uint4 wv[kRows][2];
    uint32_t sc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      wv[r][0] = ld_stream16(qr[r] + static_cast<size_t>(b) * QB);
      wv[r][1] = QB == 32 ? ld_stream16(qr[r] + static_cast<size_t>(b) * QB + 16) : make_uint4(0, 0, 0, 0);
      if constexpr (SB == 2)
        sc[r] = __ldg(reinterpret_cast<const unsigned short*>(sr[r]) + b);
      else
        sc[r] = __ldg(reinterpret_cast<const uint32_t*>(sr[r]) + b);
    }
#pragma unroll
    for (int tt = 0; tt < TT; ++tt) {
      const int4* xp = reinterpret_cast<const int4*>(xq + static_cast<size_t>(tt) * k) + 2 * b;
      const int4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
      const int xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const float2 ds = __ldg(xds + static_cast<size_t>(tt) * nb + b);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r][tt] += quant_dot<D>(wv[r], sc[r], xv, ds);
    }
  }
  warp_store<kRows, TT>(acc, y, row0, n, accumulate);
}

// The unit formats (the K-quants and iq4_xs: 64-element units; q5_0, q5_1: 32-blocks with a tail): the same
// warp-per-four-rows loop over the formats' units (quant_units.h, the t = 1 GEMV's arithmetic), each unit's activation
// loaded once per row of x and dotted with the four weight rows.
template <DType D, int TT>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_rows_unit_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                          const int8_t* __restrict__ xq /*[TT, k]*/, const float2* __restrict__ xds /*[TT, k/32]*/,
                          float* __restrict__ y /*[TT, n]*/, int n, int k, bool accumulate) {
  using Q = QuantFmt<D>;
  const int lane = threadIdx.x & (kWarp - 1);
  const int row0 = (blockIdx.x * kWarps + static_cast<int>(threadIdx.x / kWarp)) * kRows;
  if (row0 >= n) return;  // whole warp
  const int nu = k / Q::kUnit;
  const uint8_t* qr[kRows];
  const uint8_t* sr[kRows];
  const uint8_t* tr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const size_t row = static_cast<size_t>(min(row0 + r, n - 1));
    qr[r] = quants + row * nu * Q::kQuantBytes;
    sr[r] = scales + row * nu * Q::kScaleBytes;
    tr[r] = tail_row<D>(scales, n, nu, row);
  }
  float acc[kRows][TT] = {};
  for (int b = lane; b < nu; b += kWarp) {
    uint4 wv[kRows][Q::kVecs];
    typename Q::Scale sc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) Q::load(qr[r], sr[r], tr[r], b, wv[r], sc[r]);
    if constexpr (D == DType::TQ2_0) {
      // One activation block of the 128-element unit at a time, not unrolled over the four (nvcc hoisted every
      // block's loads of every row of x and spilled at TT >= 3 otherwise); the code shift is a register.
      float dw[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) dw[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(sc[r])));
#pragma unroll 1
      for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int tt = 0; tt < TT; ++tt) {
          const int4* xp = reinterpret_cast<const int4*>(xq + static_cast<size_t>(tt) * k) + 8 * b + 2 * s;
          const int4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
          const int xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
          const float2 ds = __ldg(xds + static_cast<size_t>(tt) * (k / kQ) + 4 * b + s);
#pragma unroll
          for (int r = 0; r < kRows; ++r)
            acc[r][tt] += dw[r] * (ds.x * static_cast<float>(Q::block_sum(wv[r], s, xv)) - ds.y);
        }
      }
    } else {
#pragma unroll
      for (int tt = 0; tt < TT; ++tt) {
        const typename Q::Act x =
            Q::Act::load(xq + static_cast<size_t>(tt) * k, xds + static_cast<size_t>(tt) * (k / kQ), b);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][tt] += Q::dot(wv[r], sc[r], x);
      }
    }
  }
  warp_store<kRows, TT>(acc, y, row0, n, accumulate);
}

int grid_for(int64_t n) { return ceil_div(n, static_cast<int64_t>(kWarps) * kRows); }

template <DType D, int TT>
void launch_float(const DeviceWeight& w, const float* x, float* y, cudaStream_t stream, bool accumulate) {
  gemm_rows_float_kernel<D, TT><<<grid_for(w.n), kThreads, 0, stream>>>(
      w.quants.as<uint8_t>(), x, y, static_cast<int>(w.n), static_cast<int>(w.k), accumulate);
  TESSERA_CUDA_CHECK_LAUNCH("gemm_rows_float_kernel");
}

template <DType D, int TT>
void launch_quant(const DeviceWeight& w, const int8_t* q8, const float2* ds, float* y, cudaStream_t stream,
                  bool accumulate) {
  if constexpr (is_unit_format<D>()) {
    gemm_rows_unit_kernel<D, TT><<<grid_for(w.n), kThreads, 0, stream>>>(w.quants.as<uint8_t>(), w.scales.as<uint8_t>(),
                                                                         q8, ds, y, static_cast<int>(w.n),
                                                                         static_cast<int>(w.k), accumulate);
    TESSERA_CUDA_CHECK_LAUNCH("gemm_rows_unit_kernel");
  } else {
    gemm_rows_quant_kernel<D, TT>
        <<<grid_for(w.n), kThreads, 0, stream>>>(w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), q8, ds, y,
                                                 static_cast<int>(w.n), static_cast<int>(w.k), accumulate);
    TESSERA_CUDA_CHECK_LAUNCH("gemm_rows_quant_kernel");
  }
}

// Calls f(std::integral_constant<int, tt>) for the runtime tt in 1..kGemmRowsChunk.
template <typename F, int... I>
void with_tt(int tt, F&& f, std::integer_sequence<int, I...>) {
  ((tt == I + 1 ? f(std::integral_constant<int, I + 1>{}) : void()), ...);
}

}  // namespace

void launch_gemm_rows_float(const DeviceWeight& w, const float* x, float* y, int t, cudaStream_t stream,
                            bool accumulate) {
  for (int c0 = 0; c0 < t; c0 += kGemmRowsChunk) {
    const int tt = t - c0 < kGemmRowsChunk ? t - c0 : kGemmRowsChunk;
    const float* xc = x + static_cast<size_t>(c0) * w.k;
    float* yc = y + static_cast<size_t>(c0) * w.n;
    with_tt(
        tt,
        [&](auto c) {
          constexpr int TT = decltype(c)::value;
          switch (w.dtype) {
            case DType::F32:
              launch_float<DType::F32, TT>(w, xc, yc, stream, accumulate);
              break;
            case DType::F16:
              launch_float<DType::F16, TT>(w, xc, yc, stream, accumulate);
              break;
            case DType::BF16:
              launch_float<DType::BF16, TT>(w, xc, yc, stream, accumulate);
              break;
            default:
              fail_message("matmul: no multi-row float kernel for this dtype");
          }
        },
        std::make_integer_sequence<int, kGemmRowsChunk>{});
  }
}

void launch_gemm_rows_quant(const DeviceWeight& w, const int8_t* q8, const float2* ds, float* y, int t,
                            cudaStream_t stream, bool accumulate) {
  for (int c0 = 0; c0 < t; c0 += kGemmRowsChunk) {
    const int tt = t - c0 < kGemmRowsChunk ? t - c0 : kGemmRowsChunk;
    const int8_t* qc = q8 + static_cast<size_t>(c0) * w.k;
    const float2* dc = ds + static_cast<size_t>(c0) * (w.k / kQ);
    float* yc = y + static_cast<size_t>(c0) * w.n;
    with_tt(
        tt,
        [&](auto c) {
          constexpr int TT = decltype(c)::value;
          switch (w.dtype) {
            case DType::Q8_0:
              launch_quant<DType::Q8_0, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q4_0:
              launch_quant<DType::Q4_0, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q4_1:
              launch_quant<DType::Q4_1, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::IQ4_NL:
              launch_quant<DType::IQ4_NL, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q4_K:
              launch_quant<DType::Q4_K, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q5_K:
              launch_quant<DType::Q5_K, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q6_K:
              launch_quant<DType::Q6_K, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::IQ4_XS:
              launch_quant<DType::IQ4_XS, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q5_0:
              launch_quant<DType::Q5_0, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q5_1:
              launch_quant<DType::Q5_1, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q2_K:
              launch_quant<DType::Q2_K, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::Q3_K:
              launch_quant<DType::Q3_K, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            case DType::TQ2_0:
              launch_quant<DType::TQ2_0, TT>(w, qc, dc, yc, stream, accumulate);
              break;
            default:
              fail_message("matmul: no multi-row quant kernel for this dtype");
          }
        },
        std::make_integer_sequence<int, kGemmRowsChunk>{});
  }
}

}  // namespace tessera::cuda::detail
