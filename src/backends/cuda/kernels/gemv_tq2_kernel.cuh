// The tq2_0 (ternary) GEMV, x-stationary: each lane holds the q8 activation of the half-units it covers in
// registers for the whole launch and streams weight rows past it, so x is read once per warp instead of once per unit
// and row group (the shared quantized kernel, gemv_quant_kernel.cuh, reloads a 128-element unit's 128 activation bytes
// for every 32 weight bytes: four times the weight bytes through L1, and ~200 registers at four rows).
//
// Layout (SPLIT_Q, split_layout.h): a row is K / 256 super-blocks of 64 code bytes, then every row's fp16 d. Byte i of
// a 32-byte unit (128 elements, activation blocks 4u .. 4u + 3) holds element 32 s + i of the unit in bits 2s. A
// half-unit (16 bytes, 64 elements) is the unit's bytes 16c .. 16c + 15: elements 32 s + 16c + j of blocks 4u + s, so
// its dot product is 16 dp4a of codes masked in place against four 16-byte runs of x, and
//   sum_e (q_e - 1) d_w x_e = d_w (sum_s d_x,s sum_j q q_x - [c == 0] sum_s d_x,s sum(q_x of block s)),
// the -1 offset taken once per block by the half-unit with c = 0 (GemvInput's ds.y is d_x * sum(q_x) over the block).
//
// Work split: a block of WARPS warps owns RB consecutive rows; warp w covers half-units [w Hw, (w + 1) Hw) of every
// row (Hw = K / 64 / WARPS, at most 32 P: lane l takes l, l + 32, ..., P positions), R rows per step, the next step's
// loads issued before this step's arithmetic. Each warp sums its R partial rows (warp_sum) into shared memory; the
// block's first RB threads add the warps' parts and store. Only the weights' 2 bits per element and one fp16 d per 256
// elements come from DRAM.
#pragma once

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/gemv_common.cuh"
#include "backends/cuda/kernels/quant_units.h"

namespace tessera::cuda::detail {

// A half-unit's activation: 4 blocks x 16 int8 (as words), the blocks' d_x, and the offset term (c == 0 only).
struct Tq2HalfX {
  int q[4][4];
  float d[4];
  float off;
};

__device__ __forceinline__ void tq2_load_x(const int8_t* __restrict__ xq, const float2* __restrict__ xds, int p,
                                           Tq2HalfX& x) {
  const int u = p >> 1, c = p & 1;
  float off = 0.0f;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int4 v = __ldg(reinterpret_cast<const int4*>(xq + (4 * u + s) * 32 + 16 * c));
    x.q[s][0] = v.x, x.q[s][1] = v.y, x.q[s][2] = v.z, x.q[s][3] = v.w;
    const float2 ds = __ldg(xds + 4 * u + s);
    x.d[s] = ds.x;
    off += ds.y;
  }
  x.off = c == 0 ? off : 0.0f;
}

// Four int8 products of an unsigned a and a signed b summed into c (dp4a.u32.s32).
__device__ __forceinline__ int tq2_dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// sum over the half-unit of (q - 1) x / d_w. MASKED: the codes masked where they lie (no shifts): bits 2s of each byte
// are q 4^s, which dp4a takes as an unsigned byte (q 4^s <= 128) against the signed activation; the block's sum is
// then 4^s times the true one, and d_x / 4^s (exact in float) undoes it: two integer instructions per word and block
// instead of three. Else each block's codes shifted down first.
template <bool MASKED>
__device__ __forceinline__ float tq2_half_dot(const uint4& w, const Tq2HalfX& x) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
  float acc = -x.off;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    int sum = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (MASKED)
        sum = tq2_dp4a_us(wv[j] & (0x03030303u << (2 * s)), x.q[s][j], sum);
      else
        sum = __dp4a(static_cast<int>((wv[j] >> (2 * s)) & 0x03030303u), x.q[s][j], sum);
    }
    const float dx = MASKED ? x.d[s] * (1.0f / static_cast<float>(1 << (2 * s))) : x.d[s];
    acc = fmaf(dx, static_cast<float>(sum), acc);
  }
  return acc;
}

// The warp's sums of R rows (R a power of two <= 32) in R - 1 + 5 - log2(R) shuffles: each halving step sends half of
// a lane's rows to its partner lane and keeps the other half (R - 1 shuffles over the first log2(R) steps, not R per
// step), then the lanes of a row finish alone. Returns row `row`'s sum, held by lanes row * 32 / R ..
// (row + 1) * 32 / R - 1: 9 shuffles for 8 rows where 8 warp_sums take 40.
template <int R>
__device__ __forceinline__ float tq2_rows_sum(const float (&a)[R], int lane, int& row) {
  static_assert(R >= 1 && R <= 32 && (R & (R - 1)) == 0, "a power of two");
  float v[R];
#pragma unroll
  for (int i = 0; i < R; ++i) v[i] = a[i];
  row = 0;
  int m = 16;
#pragma unroll
  for (int cnt = R; cnt > 1; cnt /= 2, m /= 2) {
    const bool upper = (lane & m) != 0;
    const int h = cnt / 2;
#pragma unroll
    for (int i = 0; i < h; ++i) {
      const float keep = upper ? v[h + i] : v[i];
      const float give = upper ? v[i] : v[h + i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, give, m);
    }
    if (upper) row += h;
  }
  for (; m >= 1; m /= 2) v[0] += __shfl_xor_sync(0xffffffffu, v[0], m);
  return v[0];
}

// y[row] (+)= out_scale * W[row] . x for rows [blockIdx.x * RB, + RB). Requires K % 256 == 0, (K / 64) % WARPS == 0
// and 32 (P - 1) < K / 64 / WARPS <= 32 P (tq2_config_fits). (No norm_out epilogue: the residual GEMVs that write the
// next norm's input take the shared kernel's warp groups.)
// MODE: 0 tq2_half_dot<false>, 1 tq2_half_dot<true>, 2 no arithmetic (the words XORed: a memory-only bound, wrong sums).
// MINB: blocks per SM the registers must allow (__launch_bounds__; the sweep's one-wave grids, which lost).
template <int WARPS, int R, int RB, int P, int MINB = 1, int MODE = 0>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    gemv_tq2_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ dscale,
                    const int8_t* __restrict__ xq, const float2* __restrict__ xds, float* __restrict__ y, int n, int k,
                    bool accumulate, RmsIn rin) {
  static_assert(RB % R == 0, "a block's rows are whole steps");
  constexpr int G = RB / R;  // steps per block
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int hw = k / 64 / WARPS;  // half-units per warp
  const size_t row_q = static_cast<size_t>(k) / 4, row_d = static_cast<size_t>(k) / 128;  // bytes per row
  const int row0 = static_cast<int>(blockIdx.x) * RB;
  int pos[P];
  bool ok[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int l = lane + 32 * j;
    ok[j] = l < hw;
    pos[j] = warp * hw + (ok[j] ? l : 0);
  }
  auto load = [&](int g, uint4(&wv)[R][P], uint32_t(&dv)[R][P]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const size_t row = static_cast<size_t>(min(row0 + g * R + r, n - 1));
      const uint8_t* q = quants + row * row_q;
      const uint8_t* d = dscale + row * row_d;
#pragma unroll
      for (int j = 0; j < P; ++j)
        if (ok[j]) {
          wv[r][j] = unit::ld16(q + static_cast<size_t>(pos[j]) * 16);
          dv[r][j] = unit::ld_u16(d + static_cast<size_t>(pos[j] >> 2) * 2);
        }
    }
  };
  uint4 wa[R][P] = {};
  uint32_t da[R][P] = {};
  load(0, wa, da);
  pdl_wait();
  Tq2HalfX x[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    if (ok[j]) {
      tq2_load_x(xq, xds, pos[j], x[j]);
    } else {
      x[j] = Tq2HalfX{};
    }
  }
  const float out_scale = rms_out_scale(rin, lane, k);  // every warp: the storing threads may sit in any
  __shared__ float part[WARPS][RB];
#pragma unroll 1
  for (int g = 0; g < G; ++g) {
    if (row0 + g * R >= n) break;
    uint4 wb[R][P] = {};
    uint32_t db[R][P] = {};
    if (g + 1 < G && row0 + (g + 1) * R < n) load(g + 1, wb, db);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      acc[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < P; ++j)
        if (ok[j]) {
          if constexpr (MODE == 2) {
            acc[r] += __int_as_float((wa[r][j].x ^ wa[r][j].y ^ wa[r][j].z ^ wa[r][j].w ^ da[r][j]) & 0x3FFFFFFFu);
          } else {
            const float dot = tq2_half_dot<MODE == 1>(wa[r][j], x[j]);
            acc[r] = fmaf(__half2float(__ushort_as_half(static_cast<unsigned short>(da[r][j]))), dot, acc[r]);
          }
        }
    }
    int row_of_lane;
    const float sum = tq2_rows_sum<R>(acc, lane, row_of_lane);
    if (lane % (32 / R) == 0) part[warp][g * R + row_of_lane] = sum;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < P; ++j) wa[r][j] = wb[r][j], da[r][j] = db[r][j];
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < RB) {
    const int t = static_cast<int>(threadIdx.x);
    const int row = row0 + t;
    float v = 0.0f;
    if (row < n) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) v += part[w][t];
      v = accumulate ? y[row] + v * out_scale : v * out_scale;
      y[row] = v;
    }
  }
}

// Whether the launch shape (WARPS, P) covers rows of k columns: whole super-blocks, the half-units split evenly over
// the warps, and each warp's share needing exactly P positions per lane.
inline bool tq2_config_fits(int warps, int p, int64_t k) {
  if (k % 256 != 0) return false;
  const int64_t h = k / 64;
  if (h % warps != 0) return false;
  const int64_t hw = h / warps;
  return hw > 32 * (p - 1) && hw <= 32 * p;
}

}  // namespace tessera::cuda::detail
