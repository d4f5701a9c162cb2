// Quantized prefill by per-tile dequantization (issue 21: "CUDA prefill of quantized formats by per-tile
// dequantization or integer tensor cores"). src dequantizes each whole q4_K matrix to bf16 in a reused scratch and
// runs the bf16 cuBLASLt GEMM on it (gemm.cpp, kernels/gemm_convert.cu): the expansion writes and the GEMM reads
// N*K*2 bytes per call. Here y[T, N] = x[T, K] · W[N, K]ᵀ (x bf16 as src's producers write it, W q4_K as
// upload_weight lays it out, f32 accumulation, f32 y) is one kernel whose CTAs dequantize their own W tile on the way
// to the tensor cores, so the bf16 matrix never exists in memory. Per Llama-3-8B matrix (q|k|v 6144x4096, o 4096x4096,
// gate|up 28672x4096, down 4096x14336) at T = 128, 256, 512, 1024, 2048, the forms ("TxR": a CTA's tokens x W rows):
//   src          : matmul_x16 (launch_dequant_bf16 of the whole matrix into the workspace's scratch, then gemm_lt);
//   gemm         : gemm_lt alone on a bf16 copy expanded beforehand (the floor of src's form); expand: the expansion;
//   mma 128x64, 128x128 : mma.sync m16n8k16 (4 or 8 warps of 32 W rows x 64 tokens), x's fragments by ldmatrix;
//   wg 256x128   : wgmma m64n256k16, two warpgroups of 64 W rows, A (W) from registers, x and W's bytes by cp.async;
//   wgp 256x128  : warp-specialized: a producer warpgroup dequantizes into shared memory for two consumer warpgroups;
//   wgt 256x128  : wg with x's tile by TMA (cp.async.bulk.tensor, 128-byte swizzle, mbarrier per stage);
//   wgtsk TxR    : wgt with split-K where the grid is under one wave (below);
//   "ffma"       : the one-FFMA dequantization (below) instead of src's exact arithmetic.
// The common pipeline (one step = 64 values of K, a 32-byte group of a super-block's qs: sub-block 2i in the low
// nibbles, 2i + 1 in the high ones): x's tile [tokens][64] bf16 goes to a 128-byte-swizzled [tokens][128 B] stage (the
// layout wgmma's K-major descriptor reads; conflict-free for ldmatrix), each W row's 32 qs bytes and 16-byte head
// (fp16 d, dmin, 12 scale bytes: SPLIT_Q keeps both 16-byte aligned, so the 144-byte blocks never need an unaligned
// copy) to a [rows][48 B] stage, kStages = 4 deep. Each warp dequantizes its W rows straight into the A fragments of
// m16n8k16 (which are wgmma's register A per warp): lane (g, c) needs, per row, bytes 2c, 2c + 1, 2c + 8, 2c + 9 of
// each 16-byte half (two 32-bit shared loads and one byte permute per half); a byte permute puts a 4-bit code into
// 128.0f's mantissa (the float 128 + q, exactly), then d q - m (exact: each operation rounded as src's expansion
// rounds it, the same bf16 weights; ffma: fma(d, 128 + q, -(128 d + m)), one instruction, a weight one bf16 unit off
// src's where 128 d + m's rounding crosses a rounding boundary: 5 of 8,192 in the host emulation) and a bf16x2 pack.
// The wgmma forms issue step s's four wgmmas, wait for step s - 1's (wait_group 1), then refill its stage and
// dequantize step s + 1 into the other register set while step s runs. Grid (token tiles, W tiles): the CTAs of one
// W tile run side by side, so W's bytes come from DRAM once and x from L2. Split-K (wgtsk): S = 2 or 4 CTAs per tile
// over slices of K, the largest S whose CTAs still fit one wave of 132 SMs, partial sums to a workspace, then
// sum_parts adds them in a fixed order (deterministic; ~2-5 us).
//
// Checked before timing, each form on its own (a failing form is not timed): 256 sampled outputs against a double
// reference from the same bf16 x and W dequantized on the host by Format<Q4_K>::dequantize (gguf-py's arithmetic,
// bit-exact: tests/quant) and rounded to bf16 as src's expansion rounds it. The error is divided by the root sum of
// squares of the sample's products (the scale of the accumulation's error): src, gemm and the exact tile forms use
// the same bf16 weights, so only f32 summation order separates them (limit 1e-4; 1e-5 measured); the ffma forms' few
// weights one bf16 unit (2^-8 relative) off can each move a sum by 2^-8 of one product (limit 2e-3; <= 6e-4
// measured). Also printed: the error against the unrounded weights (~5e-3, bf16's own) and the relative L2 against
// src over all of y. y is poisoned with NaN before each form. A host emulation of the tiles' indexing (the
// shared-memory placement of x and of W's bytes, the fragment dequantization and the ldmatrix addressing, through the
// functions the kernels call) runs first (alone: argument "host", no GPU). Timing: exp_common::FlushedTimer (L2
// flushed before each call: a layer's weights come from DRAM in a real prefill), median of reps.
//
// Twenty-second session, H100 SXM (seven runs, every form passing; the sixth's one 8B layer's four q4_K matmuls, us,
// src / form; the seventh within 1%):
//   T                         128           256           512           1024          2048
//   src                       415.1         445.3         530.3         806.5         1372.3
//   gemm (bf16 W, the floor)  216.1 1.92x   244.1 1.82x   327.4 1.62x   593.2 1.36x   1156.6 1.19x
//   mma 128x64                577.1 0.72x   764.3 0.58x   1278.0 0.41x  2509.4 0.32x  4911.0 0.28x
//   wg 256x128 ffma           -             579.1 0.77x   731.8 0.72x   1041.2 0.77x  1973.8 0.70x
//   wgp 256x128 ffma          -             558.0 0.80x   700.4 0.76x   1002.4 0.80x  1892.0 0.73x
//   wgt 256x128 ffma          -             450.9 0.99x   569.2 0.93x   822.0 0.98x   1561.9 0.88x
//   wgtsk 128x128 ffma        220.9 1.88x   383.8 1.16x   664.7 0.80x   1257.5 0.64x  2478.5 0.55x
//   wgtsk 256x128 (exact)     -             284.8 1.56x   498.6 1.06x   869.1 0.93x   1646.5 0.83x
//   wgtsk 256x128 ffma        -             272.0 1.64x   471.4 1.12x   821.4 0.98x   1565.0 0.88x
// Per matrix at T = 512, src / wgtsk 256x128 ffma: q|k|v 1.05x, o 1.03x, gate|up 1.14x, down 1.18x; at T = 128
// (wgtsk 128x128 ffma) 1.40x, 1.41x, 2.04x, 2.10x: at small T the kernel reads 0.56 bytes a weight where the GEMM
// reads 2 (gate|up at T = 128 runs as fast as the bf16 GEMM alone: 104.1 against 101.3 us). What each step taught:
//   - mma.sync: ~180-195 TFLOP/s at best (not profiled; each W row is dequantized by two warps of the eight).
//   - wg: a step took the dequantization's time plus the wgmmas' (first run, T = 2048: ~2,340 cycles a step at n256
//     against 1,024 of tensor work, ~1,770 at n128 against 512), not the larger of the two. Not register A: W
//     dequantized into shared memory and read by descriptor (a "wgss" form, removed) was slower (411 TFLOP/s against
//     452 at T = 2048). The fence.proxy.async that cp.async's x (generic proxy) needs before wgmma (async proxy) reads
//     it, run every step while wgmmas are in flight, behaved as if it waited for them: with x by TMA (wgt, no fence in
//     the loop) the same kernel went from 0.70x to 0.88x at T = 2048.
//   - wgp: the producer's 4 warps dequantize 8,192 weights a step too slowly (~2,000 cycles a step, from its time).
//   - split-K: o and down at T = 512 have 64 CTAs of 256x128 for 132 SMs; two slices each took o from 62.7 to 45.0
//     and down from 199.5 to 118.6 us.
//   - what is left: wgt's step is bound by the dequantization on the consumers (~1,650 cycles a step at n256 against
//     1,024 of wgmma), so at T >= 1024, where src's expansion is small next to its GEMM, src wins (0.98x, 0.88x).
// Verdict: per-tile dequantization (wgtsk 256x128, or 128x128 where T = 128) beats src's expansion at T <= 512 and
// loses from T = 1024 on; a src path would take it for T <= 512 and keep the expansion above. The exact form keeps
// src's weights bit for bit at 1.06x (T = 512).
//
// In src since (GemmPath::TILE, src/backends/cuda/kernels/gemm_quant_tile.cu; --cuda quant_gemm): the exact wgtsk form,
// 256x128 above t = 128 and 128x128 up to it, its dequantization in gemm_quant_tile.h, the split-K sum a kernel of its
// own, PDL, rows past t or N masked. Here "src tile" runs src's launcher (the form "wgtsk 256x128" above, exact, before
// the move) and "src" is matmul_x16 with quant_gemm=expand (the expansion: matmul_x16's default takes the tile path at
// t <= 512 now).
//
// Build here (no GPU needed): target exp_quant_prefill_tile. Run on the GPU machine (~10 s):
//   build-gpu/bin/experiments/exp_quant_prefill_tile [reps, default 20] [T list, default 128,256,512,1024,2048]
//   build-gpu/bin/experiments/exp_quant_prefill_tile host     (the host emulation alone)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels/gemm_quant_tile.h"
#include "backends/cuda/kernels/mbarrier.cuh"
#include "backends/cuda/kernels/tensor_map.cuh"
#include "backends/cuda/kernels/wgmma.cuh"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "backends/cuda/split_layout.h"
#include "exp_common.cuh"
#include "quant/format_traits.h"
#include "quant/half.h"

using namespace tessera;
using namespace tessera::cuda;

namespace {

// ---- Index math and dequantization shared by the kernels and the host emulation ----
// The stage layout (kStepK, kXRow, kRawRow, kStages), raw_src, a lane's bytes and scales (row_lane) and the exact
// dequantization are src's (gemm_quant_tile.h, where the exact form moved); below is only what the experiment adds:
// x_off (src loads x by TMA, whose swizzle the copy engine does), the one-FFMA dequantization and the ldmatrix
// addressing.
using detail::fence_proxy_async;  // before wgmma (async proxy) reads what cp.async (generic proxy) wrote
using detail::smem_u32;
using detail::q4k_tile::kRawRow;
using detail::q4k_tile::kStages;
using detail::q4k_tile::kStepK;
using detail::q4k_tile::kXRow;
using detail::q4k_tile::pack_bf16;
using detail::q4k_tile::raw_src;
using detail::q4k_tile::row_lane;
using detail::q4k_tile::RowLane;
using detail::unit::byte_perm;

// Byte offset of 16-byte chunk ch (0..7) of row r of a [rows][128 B] tile with the 128-byte swizzle.
TESSERA_TILE_HD uint32_t x_off(int r, int ch) { return static_cast<uint32_t>(r * kXRow + ((ch ^ (r & 7)) << 4)); }

TESSERA_TILE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// src's codes4 (the same codes, bytes and pairs) with one FFMA a value: fma(d, 128 + q, negc), negc = -(128 d + m),
// whose rounding can move the f32 value by a few ulps (src's form: q = (128 + q) - 128, then d q - m, each rounded).
TESSERA_TILE_HD void codes4_ffma(uint32_t x, float d, float negc, uint32_t& lo, uint32_t& hi) {
  using format_detail::bits_to_float;
  const float f[4] = {bits_to_float(byte_perm(x, 0x43u, 0x4055u)), bits_to_float(byte_perm(x, 0x43u, 0x4155u)),
                      bits_to_float(byte_perm(x, 0x43u, 0x4255u)), bits_to_float(byte_perm(x, 0x43u, 0x4355u))};
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = fma_rn(d, f[i], negc);
  lo = pack_bf16(v[0], v[1]);
  hi = pack_bf16(v[2], v[3]);
}

// src's row_frags (the same fragment layout, the same bytes and scales: src's row_lane) with codes4_ffma.
TESSERA_TILE_HD void row_frags_ffma(const uint32_t* q32, const uint32_t (&h)[4], int c, int sub,
                                    uint32_t (&out)[4][2]) {
  const RowLane r = row_lane(q32, h, c, sub);
  const float cl = -fma_rn(128.0f, r.dl, r.ml), ch = -fma_rn(128.0f, r.dh, r.mh);
  codes4_ffma(r.p0 & 0x0F0F0F0Fu, r.dl, cl, out[0][0], out[0][1]);
  codes4_ffma(r.p1 & 0x0F0F0F0Fu, r.dl, cl, out[1][0], out[1][1]);
  codes4_ffma((r.p0 >> 4) & 0x0F0F0F0Fu, r.dh, ch, out[2][0], out[2][1]);
  codes4_ffma((r.p1 >> 4) & 0x0F0F0F0Fu, r.dh, ch, out[3][0], out[3][1]);
}

// One W row's part of the A fragments of a step (gemm_quant_tile.h's row_frags has the layout): kExact, src's
// row_frags (the expansion's value bit for bit); else row_frags_ffma.
template <bool kExact>
TESSERA_TILE_HD void form_row_frags(const uint32_t* q32, const uint32_t (&h)[4], int c, int sub,
                                    uint32_t (&out)[4][2]) {
  if constexpr (kExact)
    detail::q4k_tile::row_frags(q32, h, c, sub, out);
  else
    row_frags_ffma(q32, h, c, sub, out);
}

// ldmatrix.x4 of a [16 tokens][16 k] block of x: lane l addresses row l % 8 of matrix l / 8, the matrices being
// (tokens 0..7, k chunk 0), (0..7, chunk 1), (8..15, chunk 0), (8..15, chunk 1): the b0, b1 registers of two n8 tiles.
TESSERA_TILE_HD int lm_token(int lane) { return ((lane >> 4) << 3) + (lane & 7); }
TESSERA_TILE_HD int lm_chunk(int lane) { return (lane >> 3) & 1; }

// ---- Device helpers ----
// The cp.async, wgmma and TMA wrappers are src's (kernels/wgmma.cuh); below are the experiment's own: ldmatrix and
// mma.sync (the mma form), a warpgroup barrier (wgp) and wgmma with both operands in shared memory (wgp).
using detail::cp_async16;
using detail::cp_commit;
using detail::cp_wait;
using detail::desc_kmajor;
using detail::fence_regs;
using detail::tma_load_2d;
using detail::wgmma_commit;
using detail::wgmma_fence;
using detail::wgmma_rs_n128;
using detail::wgmma_rs_n256;
using detail::wgmma_wait;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// A barrier of one warpgroup's 128 threads (ids 1, 2; 0 is __syncthreads').
__device__ __forceinline__ void wg_barrier(int id) { asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory"); }

// D[64 x 256] += A (shared, K-major, 128-byte swizzle) · B (the same), f32 accumulation.
__device__ __forceinline__ void wgmma_ss_n256(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " TESSERA_WGMMA_ACC128 ", %128, %129, p, 1, 1, 0, 0;\n}\n"
      : TESSERA_WGMMA_D128
      : "l"(da), "l"(db), "r"(1));
}

// Step s's tiles into one stage: x [TOK tokens][64] from row t0 (swizzled, at xs) and W rows n0 .. n0 + ROWS - 1
// ([ROWS][48 B] at raw), all by cp.async 16-byte copies spread over the CTA's threads.
template <int ROWS, int TOK, int kThreads>
__device__ __forceinline__ void load_step(uint32_t xs, uint32_t raw, const __nv_bfloat16* __restrict__ x,
                                          const uint8_t* __restrict__ quants, const uint8_t* __restrict__ heads, int k,
                                          int64_t nb, int t0, int n0, int s) {
  static_assert((TOK * 8) % kThreads == 0, "x chunks spread evenly");
#pragma unroll
  for (int it = 0; it < TOK * 8 / kThreads; ++it) {
    const int i = static_cast<int>(threadIdx.x) + it * kThreads, r = i >> 3, ch = i & 7;
    cp_async16(xs + x_off(r, ch), x + static_cast<int64_t>(t0 + r) * k + s * kStepK + ch * 8);
  }
#pragma unroll
  for (int it = 0; it < (ROWS * 3 + kThreads - 1) / kThreads; ++it) {
    const int i = static_cast<int>(threadIdx.x) + it * kThreads;
    if (i < ROWS * 3) {
      const int r = i / 3, p = i - 3 * r;
      cp_async16(raw + static_cast<uint32_t>(r * kRawRow + p * 16),
                 (p < 2 ? quants : heads) + raw_src(n0 + r, nb, s, p));
    }
  }
}

// Row `row`'s fragments from the stage's raw bytes (generic pointer to shared memory).
template <bool kExact>
__device__ __forceinline__ void smem_row_frags(const unsigned char* raw, int row, int c, int sub,
                                               uint32_t (&out)[4][2]) {
  const unsigned char* p = raw + row * kRawRow;
  const uint4 hv = *reinterpret_cast<const uint4*>(p + 32);
  const uint32_t h[4] = {hv.x, hv.y, hv.z, hv.w};
  form_row_frags<kExact>(reinterpret_cast<const uint32_t*>(p), h, c, sub, out);
}

// The A fragments of an m16 tile (rows r0 .. r0 + 15 of the stage) for the step's four k16 slices.
template <bool kExact>
__device__ __forceinline__ void tile_frags(const unsigned char* raw, int r0, int g, int c, int sub,
                                           uint32_t (&a)[4][4]) {
  uint32_t f0[4][2], f1[4][2];
  smem_row_frags<kExact>(raw, r0 + g, c, sub, f0);
  smem_row_frags<kExact>(raw, r0 + g + 8, c, sub, f1);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a[j][0] = f0[j][0];
    a[j][1] = f1[j][0];
    a[j][2] = f0[j][1];
    a[j][3] = f1[j][1];
  }
}

// ---- The mma.sync form ----
// CTA: TOK tokens x ROWS W rows; WR x WT warps, each kWRows = ROWS / WR rows x kWTok = TOK / WT tokens (MT m16 row
// tiles x NT n8 token tiles). A warp dequantizes its own rows (WT warps share each row: WT-fold dequantization, the
// price of a square warp tile, whose ldmatrix traffic the shared-memory bandwidth can carry).
template <int ROWS, int TOK, int WR, int WT, bool kExact>
__global__ void __launch_bounds__(32 * WR * WT)
    q4k_tile_mma(const uint8_t* __restrict__ quants /*[N * K / 256, 128]*/,
                 const uint8_t* __restrict__ heads /*[N * K / 256, 16]*/,
                 const __nv_bfloat16* __restrict__ x /*[T, K]*/, float* __restrict__ y /*[T, N]*/, int n, int k) {
  constexpr int kThreads = WR * WT * 32, kWRows = ROWS / WR, kWTok = TOK / WT, MT = kWRows / 16, NT = kWTok / 8;
  static_assert(kWRows % 16 == 0 && kWTok % 16 == 0, "whole m16 tiles and pairs of n8 tiles per warp");
  constexpr uint32_t kXBytes = TOK * kXRow, kRawBytes = ROWS * kRawRow;
  extern __shared__ unsigned char smem_dyn[];
  unsigned char* sm = smem_dyn + ((1024u - (smem_u32(smem_dyn) & 1023u)) & 1023u);
  const uint32_t base = smem_u32(sm);
  const int t0 = static_cast<int>(blockIdx.x) * TOK, n0 = static_cast<int>(blockIdx.y) * ROWS;
  const int64_t nb = k / 256;
  const int steps = k / kStepK;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, c = lane & 3;
  const int wrow = (warp / WT) * kWRows, wtok = (warp % WT) * kWTok;
  const int lt = lm_token(lane), lc = lm_chunk(lane);

  float acc[MT][NT][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps)
      load_step<ROWS, TOK, kThreads>(base + s * kXBytes, base + kStages * kXBytes + s * kRawBytes, x, quants, heads, k,
                                     nb, t0, n0, s);
    cp_commit();
  }
  for (int s = 0; s < steps; ++s) {
    cp_wait<kStages - 2>();  // this thread's copies of step s have landed
    __syncthreads();         // everyone's have, and every warp is done with step s - 1's stage, refilled next
    const int sn = s + kStages - 1;
    if (sn < steps) {
      const int slot = sn % kStages;
      load_step<ROWS, TOK, kThreads>(base + slot * kXBytes, base + kStages * kXBytes + slot * kRawBytes, x, quants,
                                     heads, k, nb, t0, n0, sn);
    }
    cp_commit();  // empty groups at the end keep the wait count's arithmetic
    const int slot = s % kStages;
    const uint32_t xs = base + slot * kXBytes;
    const unsigned char* raw = sm + kStages * kXBytes + slot * kRawBytes;
    uint32_t a[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) tile_frags<kExact>(raw, wrow + mt * 16, g, c, s & 3, a[mt]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t b[NT][2];
#pragma unroll
      for (int p = 0; p < NT / 2; ++p) {
        uint32_t r[4];
        ldmatrix_x4(r, xs + x_off(wtok + 16 * p + lt, 2 * j + lc));
        b[2 * p][0] = r[0];
        b[2 * p][1] = r[1];
        b[2 * p + 1][0] = r[2];
        b[2 * p + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], a[mt][j], b[nt][0], b[nt][1]);
    }
  }
  cp_wait<0>();
  // D[row][token]: c0, c1 at (g, 2c), (g, 2c + 1), c2, c3 at row g + 8. y[token][row]: the 8 lanes of one c write 8
  // consecutive floats (32 bytes).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int row = n0 + wrow + mt * 16 + g, tok = t0 + wtok + nt * 8 + 2 * c;
      float* y0 = y + static_cast<int64_t>(tok) * n + row;
      y0[0] = acc[mt][nt][0];
      y0[n] = acc[mt][nt][1];
      y0[8] = acc[mt][nt][2];
      y0[n + 8] = acc[mt][nt][3];
    }
}

// ---- The wgmma form ----
// CTA: TOK tokens (128 or 256) x 128 W rows as two warpgroups of 64 rows; D [64 rows][TOK] per warpgroup in registers
// (TOK / 2 floats a thread), A (the dequantized W) from registers, B (x) from the swizzled stage. Per step: issue
// the four wgmmas of step s (register set `cur`), wait for step s - 1's (wait_group 1), then refill step s - 1's stage
// and dequantize step s + 1 into `nxt` (the set step s - 1 read) while step s runs.
constexpr int kWgRows = 128;

template <int TOK, bool kExact>
__device__ __forceinline__ void wg_step(float (&d)[TOK / 2], const uint32_t (&cur)[4][4], uint32_t (&nxt)[4][4], int s,
                                        int steps, uint32_t base, const unsigned char* sm,
                                        const __nv_bfloat16* __restrict__ x, const uint8_t* __restrict__ quants,
                                        const uint8_t* __restrict__ heads, int k, int64_t nb, int t0, int n0, int r0,
                                        int g, int c) {
  constexpr uint32_t kXBytes = TOK * kXRow, kRawBytes = kWgRows * kRawRow;
  const uint32_t xs = base + (s % kStages) * kXBytes;
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (TOK == 128)
      wgmma_rs_n128(d, cur[j], desc_kmajor(xs + 32 * j));
    else
      wgmma_rs_n256(d, cur[j], desc_kmajor(xs + 32 * j));
  }
  wgmma_commit();
  wgmma_wait<1>();         // step s - 1's wgmmas are done: `nxt` and stage (s - 1) % kStages are free
  cp_wait<kStages - 3>();  // this thread's copies of step s + 1 have landed
  fence_proxy_async();
  __syncthreads();  // everyone's have, and both warpgroups are past step s - 1
  const int sn = s + kStages - 1;
  if (sn < steps) {
    const int slot = sn % kStages;
    load_step<kWgRows, TOK, 256>(base + slot * kXBytes, base + kStages * kXBytes + slot * kRawBytes, x, quants, heads,
                                 k, nb, t0, n0, sn);
  }
  cp_commit();
  if (s + 1 < steps)
    tile_frags<kExact>(sm + kStages * kXBytes + ((s + 1) % kStages) * kRawBytes, r0, g, c, (s + 1) & 3, nxt);
}

template <int TOK, bool kExact>
__global__ void __launch_bounds__(256, 1)
    q4k_tile_wgmma(const uint8_t* __restrict__ quants /*[N * K / 256, 128]*/,
                   const uint8_t* __restrict__ heads /*[N * K / 256, 16]*/,
                   const __nv_bfloat16* __restrict__ x /*[T, K]*/, float* __restrict__ y /*[T, N]*/, int n, int k) {
  constexpr int ND = TOK / 2;
  static_assert(TOK == 128 || TOK == 256, "wgmma n128 or n256");
  constexpr uint32_t kXBytes = TOK * kXRow, kRawBytes = kWgRows * kRawRow;
  static_assert(kXBytes % 1024 == 0, "swizzle atoms are 1,024-byte aligned");
  extern __shared__ unsigned char smem_dyn[];
  unsigned char* sm = smem_dyn + ((1024u - (smem_u32(smem_dyn) & 1023u)) & 1023u);
  const uint32_t base = smem_u32(sm);
  const int t0 = static_cast<int>(blockIdx.x) * TOK, n0 = static_cast<int>(blockIdx.y) * kWgRows;
  const int64_t nb = k / 256;
  const int steps = k / kStepK;
  const int lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2, c = lane & 3;
  const int r0 = (static_cast<int>(threadIdx.x) >> 5) * 16;  // warp w: rows 16 w .. 16 w + 15 (warpgroup w / 4)

  float d[ND];
#pragma unroll
  for (int i = 0; i < ND; ++i) d[i] = 0.0f;
  uint32_t a0[4][4], a1[4][4];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps)
      load_step<kWgRows, TOK, 256>(base + s * kXBytes, base + kStages * kXBytes + s * kRawBytes, x, quants, heads, k,
                                   nb, t0, n0, s);
    cp_commit();
  }
  cp_wait<kStages - 2>();
  fence_proxy_async();
  __syncthreads();
  tile_frags<kExact>(sm + kStages * kXBytes, r0, g, c, 0, a0);
  fence_regs(d);
  for (int s = 0; s < steps; s += 2) {  // two steps per trip: the register sets swap roles at compile time
    wg_step<TOK, kExact>(d, a0, a1, s, steps, base, sm, x, quants, heads, k, nb, t0, n0, r0, g, c);
    if (s + 1 < steps)
      wg_step<TOK, kExact>(d, a1, a0, s + 1, steps, base, sm, x, quants, heads, k, nb, t0, n0, r0, g, c);
  }
  wgmma_wait<0>();
  fence_regs(d);
  cp_wait<0>();
  // d[i]: row r0 + g + 8 ((i / 2) % 2), token 8 (i / 4) + 2c + i % 2 (attn_wgmma.cu's accumulator layout).
#pragma unroll
  for (int i = 0; i < ND; ++i) {
    const int row = n0 + r0 + g + 8 * ((i >> 1) & 1), tok = t0 + 8 * (i >> 2) + 2 * c + (i & 1);
    y[static_cast<int64_t>(tok) * n + row] = d[i];
  }
}

// ---- The wgmma form with x by TMA ("wgt") ----
// q4k_tile_wgmma with x's tile loaded by one thread's cp.async.bulk.tensor (the 128-byte swizzle done by the copy
// engine, completion on an mbarrier per stage) instead of every thread's cp.async, W's raw bytes still by cp.async
// (read by the threads' own loads: no proxy crossing). The loop then has no fence.proxy.async: cp.async's writes
// (generic proxy) feeding wgmma (async proxy) need one each step, and q4k_tile_wgmma measured as if that fence waited
// for the wgmmas in flight (a step took the dequantization's time plus the wgmmas', not the larger of the two).

// Step s's loads into stage `slot`: x by TMA (thread 0), W's rows by cp.async (every thread), one cp.async group.
template <int TOK>
__device__ __forceinline__ void wgt_load(int slot, int s, uint32_t base, uint32_t bars, const CUtensorMap* xmap,
                                         const uint8_t* __restrict__ quants, const uint8_t* __restrict__ heads,
                                         int64_t nb, int t0, int n0) {  // s: the step of the whole K
  constexpr uint32_t kXBytes = TOK * kXRow, kRawBytes = kWgRows * kRawRow;
  if (threadIdx.x == 0) {
    detail::mbar_expect_tx(bars + 8 * slot, kXBytes);
    tma_load_2d(base + slot * kXBytes, xmap, s * kStepK, t0, bars + 8 * slot);
  }
  const uint32_t raw = base + kStages * kXBytes + slot * kRawBytes;
#pragma unroll
  for (int it = 0; it < (kWgRows * 3 + 255) / 256; ++it) {
    const int i = static_cast<int>(threadIdx.x) + it * 256;
    if (i < kWgRows * 3) {
      const int r = i / 3, p = i - 3 * r;
      cp_async16(raw + static_cast<uint32_t>(r * kRawRow + p * 16),
                 (p < 2 ? quants : heads) + raw_src(n0 + r, nb, s, p));
    }
  }
}

// s: the CTA's step (0 .. steps - 1), s0 + s the step of the whole K (split-K: the CTA's slice starts at step s0).
template <int TOK, bool kExact>
__device__ __forceinline__ void wgt_step(float (&d)[TOK / 2], const uint32_t (&cur)[4][4], uint32_t (&nxt)[4][4], int s,
                                         int s0, int steps, uint32_t base, uint32_t bars, const unsigned char* sm,
                                         const CUtensorMap* xmap, const uint8_t* __restrict__ quants,
                                         const uint8_t* __restrict__ heads, int64_t nb, int t0, int n0, int r0, int g,
                                         int c) {
  constexpr uint32_t kXBytes = TOK * kXRow, kRawBytes = kWgRows * kRawRow;
  const int slot = s % kStages;
  const uint32_t xs = base + slot * kXBytes;
  detail::mbar_wait(bars + 8 * slot, static_cast<uint32_t>((s / kStages) & 1));  // x(s) has landed
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (TOK == 128)
      wgmma_rs_n128(d, cur[j], desc_kmajor(xs + 32 * j));
    else
      wgmma_rs_n256(d, cur[j], desc_kmajor(xs + 32 * j));
  }
  wgmma_commit();
  wgmma_wait<1>();         // step s - 1's wgmmas are done: `nxt` and stage (s - 1) % kStages are free
  cp_wait<kStages - 3>();  // this thread's W bytes of step s + 1 have landed
  __syncthreads();         // everyone's have, and both warpgroups are past step s - 1
  const int sn = s + kStages - 1;
  if (sn < steps) wgt_load<TOK>(sn % kStages, s0 + sn, base, bars, xmap, quants, heads, nb, t0, n0);
  cp_commit();
  if (s + 1 < steps)
    tile_frags<kExact>(sm + kStages * kXBytes + ((s + 1) % kStages) * kRawBytes, r0, g, c, (s0 + s + 1) & 3, nxt);
}

// Split-K (gridDim.z = S > 1): CTA z takes steps [z K / (64 S), (z + 1) K / (64 S)) and writes its partial sums to
// y + z T N (a workspace [S][T][N]), which sum_parts adds in a fixed order (deterministic).
template <int TOK, bool kExact>
__global__ void __launch_bounds__(256, 1)
    q4k_tile_wgt(const uint8_t* __restrict__ quants /*[N * K / 256, 128]*/,
                 const uint8_t* __restrict__ heads /*[N * K / 256, 16]*/, const __grid_constant__ CUtensorMap xmap,
                 float* __restrict__ y /*[S][T, N]*/, int n, int k) {
  constexpr int ND = TOK / 2;
  static_assert(TOK == 128 || TOK == 256, "wgmma n128 or n256; a TMA box is at most 256 rows");
  constexpr uint32_t kXBytes = TOK * kXRow;
  static_assert(kXBytes % 1024 == 0, "swizzle atoms are 1,024-byte aligned");
  extern __shared__ unsigned char smem_dyn[];
  __shared__ alignas(8) uint64_t bar_mem[kStages];
  unsigned char* sm = smem_dyn + ((1024u - (smem_u32(smem_dyn) & 1023u)) & 1023u);
  const uint32_t base = smem_u32(sm), bars = smem_u32(bar_mem);
  const int t0 = static_cast<int>(blockIdx.x) * TOK, n0 = static_cast<int>(blockIdx.y) * kWgRows;
  const int64_t nb = k / 256;
  const int steps = k / kStepK / static_cast<int>(gridDim.z), s0 = static_cast<int>(blockIdx.z) * steps;
  y += static_cast<int64_t>(blockIdx.z) * gridDim.x * TOK * n;
  const int lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2, c = lane & 3;
  const int r0 = (static_cast<int>(threadIdx.x) >> 5) * 16;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) detail::mbar_init(bars + 8 * i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  float d[ND];
#pragma unroll
  for (int i = 0; i < ND; ++i) d[i] = 0.0f;
  uint32_t a0[4][4], a1[4][4];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) wgt_load<TOK>(s, s0 + s, base, bars, &xmap, quants, heads, nb, t0, n0);
    cp_commit();
  }
  cp_wait<kStages - 2>();
  __syncthreads();
  tile_frags<kExact>(sm + kStages * kXBytes, r0, g, c, s0 & 3, a0);
  fence_regs(d);
  for (int s = 0; s < steps; s += 2) {
    wgt_step<TOK, kExact>(d, a0, a1, s, s0, steps, base, bars, sm, &xmap, quants, heads, nb, t0, n0, r0, g, c);
    if (s + 1 < steps)
      wgt_step<TOK, kExact>(d, a1, a0, s + 1, s0, steps, base, bars, sm, &xmap, quants, heads, nb, t0, n0, r0, g, c);
  }
  wgmma_wait<0>();
  fence_regs(d);
  cp_wait<0>();
#pragma unroll
  for (int i = 0; i < ND; ++i) {
    const int row = n0 + r0 + g + 8 * ((i >> 1) & 1), tok = t0 + 8 * (i >> 2) + 2 * c + (i & 1);
    y[static_cast<int64_t>(tok) * n + row] = d[i];
  }
}

// y[i] = parts[0][i] + parts[1][i] + ... (S parts of count floats, in this order), four floats a thread.
__global__ void sum_parts(const float4* __restrict__ parts, float4* __restrict__ y, int64_t count4, int splits) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count4) return;
  float4 a = parts[i];
  for (int z = 1; z < splits; ++z) {
    const float4 b = parts[z * count4 + i];
    a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
  }
  y[i] = a;
}

// ---- Warp-specialized: a producer warpgroup dequantizes, two consumer warpgroups multiply ("wgp") ----
// 384 threads. Warpgroup 0 (the producer) loads W's raw bytes by cp.async (its own ring, kStages deep), x by TMA, and
// dequantizes W's step into a bf16 tile [128 rows][64] in shared memory (x's swizzled layout: a lane's 4-byte pair at
// chunk (2j + half) ^ (row % 8), byte 4c, so the 32 lanes of one store hit 32 banks), fenced (fence.proxy.async) and
// released on an mbarrier; warpgroups 1 and 2 (the consumers, 64 rows each) wait for x and W, issue their four
// wgmma (both operands by descriptor) and release the stage once step s - 1's wgmmas are done. The consumers then
// never run the dequantization, and the producer, which has no wgmma in flight, runs every proxy fence.
// Barriers per stage: full_x (TMA bytes), full_w (the producer's 128 threads), empty (the consumers' 256 threads).
template <int TOK, bool kExact>
__global__ void __launch_bounds__(384, 1)
    q4k_tile_wgp(const uint8_t* __restrict__ quants /*[N * K / 256, 128]*/,
                 const uint8_t* __restrict__ heads /*[N * K / 256, 16]*/, const __grid_constant__ CUtensorMap xmap,
                 float* __restrict__ y /*[T, N]*/, int n, int k) {
  constexpr int ND = TOK / 2;
  static_assert(TOK == 256, "wgmma n256 (n128 measured slower still: 0.78x src at T = 128)");
  constexpr uint32_t kXBytes = TOK * kXRow, kABytes = kWgRows * kXRow, kRawBytes = kWgRows * kRawRow;
  constexpr uint32_t kAOff = kStages * kXBytes, kRawOff = kAOff + kStages * kABytes;
  static_assert(kXBytes % 1024 == 0 && kABytes % 1024 == 0, "swizzle atoms are 1,024-byte aligned");
  extern __shared__ unsigned char smem_dyn[];
  __shared__ alignas(8) uint64_t bar_mem[3 * kStages];  // full_x, full_w, empty
  unsigned char* sm = smem_dyn + ((1024u - (smem_u32(smem_dyn) & 1023u)) & 1023u);
  const uint32_t base = smem_u32(sm), bars = smem_u32(bar_mem);
  const auto full_x = [&](int i) { return bars + 8 * i; };
  const auto full_w = [&](int i) { return bars + 8 * (kStages + i); };
  const auto empty = [&](int i) { return bars + 8 * (2 * kStages + i); };
  const int t0 = static_cast<int>(blockIdx.x) * TOK, n0 = static_cast<int>(blockIdx.y) * kWgRows;
  const int64_t nb = k / 256;
  const int steps = k / kStepK;
  const int wg = static_cast<int>(threadIdx.x) >> 7, tid = static_cast<int>(threadIdx.x) & 127;
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      detail::mbar_init(full_x(i), 1);
      detail::mbar_init(full_w(i), 128);
      detail::mbar_init(empty(i), 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // Producer. Raw ring: step s's W bytes in raw slot s % kStages, issued kStages - 1 steps ahead.
    const auto load_raw = [&](int s) {
      const uint32_t raw = base + kRawOff + (s % kStages) * kRawBytes;
#pragma unroll
      for (int it = 0; it < kWgRows * 3 / 128; ++it) {
        const int i = tid + it * 128, r = i / 3, p = i - 3 * r;
        cp_async16(raw + static_cast<uint32_t>(r * kRawRow + p * 16),
                   (p < 2 ? quants : heads) + raw_src(n0 + r, nb, s, p));
      }
    };
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) load_raw(s);
      cp_commit();
    }
    for (int s = 0; s < steps; ++s) {
      const int slot = s % kStages;
      cp_wait<kStages - 2>();  // this thread's raw bytes of step s have landed
      wg_barrier(1);           // all 128 threads' have, and all are done reading step s - 1's raw slot
      if (s + kStages - 1 < steps) load_raw(s + kStages - 1);
      cp_commit();
      if (s >= kStages)  // the consumers are done with step s - kStages, which used this stage
        detail::mbar_wait(empty(slot), static_cast<uint32_t>(((s / kStages) + 1) & 1));
      if (tid == 0) {
        detail::mbar_expect_tx(full_x(slot), kXBytes);
        tma_load_2d(base + slot * kXBytes, &xmap, s * kStepK, t0, full_x(slot));
      }
      // Rows 32 p + 8 warp + g, p = 0..3: the lanes of one store write 8 rows x 4 words, 32 distinct banks.
      const unsigned char* raw = sm + kRawOff + slot * kRawBytes;
      unsigned char* a_tile = sm + kAOff + slot * kABytes;
#pragma unroll
      for (int pass = 0; pass < 4; ++pass) {
        const int row = 32 * pass + 8 * warp + g;
        uint32_t f[4][2];
        smem_row_frags<kExact>(raw, row, c, s & 3, f);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            *reinterpret_cast<uint32_t*>(a_tile + x_off(row, 2 * j + half) + 4 * c) = f[j][half];
      }
      fence_proxy_async();  // these generic-proxy stores, read next by wgmma (async proxy)
      detail::mbar_arrive(full_w(slot));
    }
    cp_wait<0>();
    return;
  }
  // Consumers: warpgroup wg (1, 2) multiplies W rows 64 (wg - 1) .. + 63.
  float d[ND];
#pragma unroll
  for (int i = 0; i < ND; ++i) d[i] = 0.0f;
  fence_regs(d);
  const uint32_t a_rows = (wg - 1) * 64 * kXRow;
  for (int s = 0; s < steps; ++s) {
    const int slot = s % kStages;
    const uint32_t parity = static_cast<uint32_t>((s / kStages) & 1);
    detail::mbar_wait(full_x(slot), parity);
    detail::mbar_wait(full_w(slot), parity);
    const uint32_t xs = base + slot * kXBytes, as = base + kAOff + slot * kABytes + a_rows;
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) wgmma_ss_n256(d, desc_kmajor(as + 32 * j), desc_kmajor(xs + 32 * j));
    wgmma_commit();
    wgmma_wait<1>();                                            // step s - 1's wgmmas are done
    if (s >= 1) detail::mbar_arrive(empty((s - 1) % kStages));  // its stage may be refilled
  }
  wgmma_wait<0>();
  fence_regs(d);
  const int r0 = (wg - 1) * 64 + warp * 16;
#pragma unroll
  for (int i = 0; i < ND; ++i) {
    const int row = n0 + r0 + g + 8 * ((i >> 1) & 1), tok = t0 + 8 * (i >> 2) + 2 * c + (i & 1);
    y[static_cast<int64_t>(tok) * n + row] = d[i];
  }
}

// ---- Host side ----

using Launch = void (*)(const DeviceWeight&, const __nv_bfloat16*, float*, int, cudaStream_t);

template <int ROWS, int TOK>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(kStages) * (TOK * kXRow + ROWS * kRawRow) + 1024;
}

template <int ROWS, int TOK, int WR, int WT, bool kExact>
void launch_mma(const DeviceWeight& w, const __nv_bfloat16* x, float* y, int t, cudaStream_t st) {
  constexpr size_t smem = smem_bytes<ROWS, TOK>();
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(q4k_tile_mma<ROWS, TOK, WR, WT, kExact>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem)));
    attr = true;
  }
  const dim3 grid(static_cast<unsigned>(t / TOK), static_cast<unsigned>(w.n / ROWS));
  q4k_tile_mma<ROWS, TOK, WR, WT, kExact><<<grid, WR * WT * 32, smem, st>>>(
      w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), x, y, static_cast<int>(w.n), static_cast<int>(w.k));
  CK(cudaGetLastError());
}

template <int TOK, bool kExact>
void launch_wgmma(const DeviceWeight& w, const __nv_bfloat16* x, float* y, int t, cudaStream_t st) {
  constexpr size_t smem = smem_bytes<kWgRows, TOK>();
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(q4k_tile_wgmma<TOK, kExact>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem)));
    attr = true;
  }
  const dim3 grid(static_cast<unsigned>(t / TOK), static_cast<unsigned>(w.n / kWgRows));
  q4k_tile_wgmma<TOK, kExact><<<grid, 256, smem, st>>>(w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), x, y,
                                                       static_cast<int>(w.n), static_cast<int>(w.k));
  CK(cudaGetLastError());
}

// x [rows, k] bf16 as a TMA tensor map: boxes of 64 columns (128 bytes, the swizzle's span) x TOK rows, swizzled.
CUtensorMap x_map(const __nv_bfloat16* x, int64_t rows, int64_t k, int tok) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = detail::tensor_map_encoder();
  if (encode == nullptr) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled is not available\n");
    std::exit(1);
  }
  CUtensorMap m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {kStepK, static_cast<cuuint32_t>(tok)}, es[2] = {1, 1};
  const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(x), dims, strides, box,
                            es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
    std::exit(1);
  }
  return m;
}

// The split-K forms' partial sums (allocated by main; S T N floats at most kPartsFloats).
float* g_parts = nullptr;
constexpr int64_t kPartsFloats = int64_t{4} * 512 * 6144;

template <int TOK, bool kExact, bool kSplit>
void launch_wgt(const DeviceWeight& w, const __nv_bfloat16* x, float* y, int t, cudaStream_t st) {
  constexpr size_t smem = smem_bytes<kWgRows, TOK>();
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(q4k_tile_wgt<TOK, kExact>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem)));
    attr = true;
  }
  const CUtensorMap xm = x_map(x, t, w.k, TOK);
  const int64_t ctas = t / TOK * (w.n / kWgRows), steps = w.k / kStepK;
  // kSplit: the largest S of 2, 4 whose CTAs still fit one wave of the H100's 132 SMs, if its slices are whole
  // steps and the partial sums fit the workspace; else one CTA per tile over the whole K.
  int splits = 1;
  if (kSplit)
    for (int sp : {2, 4})
      if (ctas * sp <= 132 && steps % sp == 0 && sp * t * w.n <= kPartsFloats) splits = sp;
  const dim3 grid(static_cast<unsigned>(t / TOK), static_cast<unsigned>(w.n / kWgRows), static_cast<unsigned>(splits));
  q4k_tile_wgt<TOK, kExact><<<grid, 256, smem, st>>>(w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), xm,
                                                     splits > 1 ? g_parts : y, static_cast<int>(w.n),
                                                     static_cast<int>(w.k));
  CK(cudaGetLastError());
  if (splits > 1) {
    const int64_t count4 = t * w.n / 4;
    sum_parts<<<static_cast<unsigned>((count4 + 255) / 256), 256, 0, st>>>(
        reinterpret_cast<const float4*>(g_parts), reinterpret_cast<float4*>(y), count4, splits);
    CK(cudaGetLastError());
  }
}

template <int TOK, bool kExact>
void launch_wgp(const DeviceWeight& w, const __nv_bfloat16* x, float* y, int t, cudaStream_t st) {
  constexpr size_t smem = static_cast<size_t>(kStages) * (TOK * kXRow + kWgRows * kXRow + kWgRows * kRawRow) + 1024;
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(q4k_tile_wgp<TOK, kExact>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(smem)));
    attr = true;
  }
  const CUtensorMap xm = x_map(x, t, w.k, TOK);
  const dim3 grid(static_cast<unsigned>(t / TOK), static_cast<unsigned>(w.n / kWgRows));
  q4k_tile_wgp<TOK, kExact><<<grid, 384, smem, st>>>(w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), xm, y,
                                                     static_cast<int>(w.n), static_cast<int>(w.k));
  CK(cudaGetLastError());
}

// src's TILE path (launch_gemm_quant_tile: 128-token tiles up to t = 128, else 256), its split-K partial sums
// in g_parts.
void launch_src_tile(const DeviceWeight& w, const __nv_bfloat16* x, float* y, int t, cudaStream_t st) {
  detail::launch_gemm_quant_tile(w, x, y, false, t, false, g_parts, kPartsFloats, st);
}

struct TileForm {
  const char* name;
  int tok, rows;
  bool exact;
  Launch launch;
};
// Names: "mma|wg tokens x rows". Every N here is a multiple of 128 and every K of 256.
const TileForm kTileForms[] = {
    {"mma 128x64", 128, 64, true, launch_mma<64, 128, 2, 2, true>},
    {"mma 128x128 ffma", 128, 128, false, launch_mma<128, 128, 4, 2, false>},
    {"wg 256x128 ffma", 256, 128, false, launch_wgmma<256, false>},
    {"wgp 256x128 ffma", 256, 128, false, launch_wgp<256, false>},
    {"wgt 256x128 ffma", 256, 128, false, launch_wgt<256, false, false>},
    {"wgtsk 128x128 ffma", 128, 128, false, launch_wgt<128, false, true>},
    {"src tile", 128, 128, true, launch_src_tile},
    {"wgtsk 256x128 ffma", 256, 128, false, launch_wgt<256, false, true>},
};

// Random q4_K blocks (GGUF layout): random scale and qs bytes, d and dmin fp16 in [1e-3, 1e-2).
void random_q4k(std::vector<uint8_t>& q, int64_t blocks, uint64_t seed) {
  q.resize(static_cast<size_t>(blocks) * sizeof(BlockQ4_K));
  uint64_t s = seed;
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* blk = q.data() + b * static_cast<int64_t>(sizeof(BlockQ4_K));
    const uint16_t d = f32_to_fp16(exp_common::uniform(s, 1e-3f, 1e-2f));
    const uint16_t dmin = f32_to_fp16(exp_common::uniform(s, 1e-3f, 1e-2f));
    std::memcpy(blk, &d, 2);
    std::memcpy(blk + 2, &dmin, 2);
    for (int i = 4; i < 144; i += 8) {
      const uint64_t r = exp_common::splitmix(s);
      std::memcpy(blk + i, &r, std::min(8, 144 - i));
    }
  }
}

// Row r of a q4_K matrix [n, k] in GGUF layout, dequantized as gguf-py does (f32).
void dequant_row(const std::vector<uint8_t>& q, int64_t k, int64_t r, float* out) {
  const int64_t nb = k / 256;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ4_K blk;
    std::memcpy(&blk, q.data() + (r * nb + b) * static_cast<int64_t>(sizeof(blk)), sizeof(blk));
    Format<DType::Q4_K>::dequantize(blk, out + b * 256);
  }
}

// The host emulation of the tile kernels' indexing (no GPU): W's shared-memory rows placed by raw_src and dequantized
// by form_row_frags against Format<Q4_K>::dequantize rounded to bf16 (exact, src's row_frags: equal bits; ffma: within
// one bf16 unit), and x placed by x_off and read by the ldmatrix addresses against the m16n8k16 B layout. Returns the
// failures.
int host_emulation() {
  int fails = 0;
  constexpr int R = 16, K = 512, NB = K / 256;
  std::vector<uint8_t> blocks;
  random_q4k(blocks, R * NB, 3);
  std::vector<uint8_t> quants(R * NB * 128), heads(R * NB * 16);
  for (int b = 0; b < R * NB; ++b) {
    BlockQ4_K blk;
    std::memcpy(&blk, blocks.data() + b * sizeof(BlockQ4_K), sizeof(blk));
    split_block<DType::Q4_K>(blk, &quants[static_cast<size_t>(b) * 128], &heads[static_cast<size_t>(b) * 16], nullptr);
  }
  std::vector<float> w(static_cast<size_t>(R * K));
  for (int r = 0; r < R; ++r) dequant_row(blocks, K, r, &w[static_cast<size_t>(r * K)]);
  int ffma_diff = 0;
  uint32_t img[R * kRawRow / 4];  // one stage's raw rows, as the kernel's shared memory holds them
  for (int s = 0; s < K / kStepK; ++s) {
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < 3; ++p)
        std::memcpy(reinterpret_cast<uint8_t*>(img) + r * kRawRow + p * 16,
                    (p < 2 ? quants.data() : heads.data()) + raw_src(r, NB, s, p), 16);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) {
        const uint32_t* q32 = img + r * kRawRow / 4;
        const uint32_t h[4] = {q32[8], q32[9], q32[10], q32[11]};
        uint32_t fe[4][2], ff[4][2];
        form_row_frags<true>(q32, h, c, s % 4, fe);
        form_row_frags<false>(q32, h, c, s % 4, ff);
        for (int j = 0; j < 4; ++j)
          for (int half = 0; half < 2; ++half) {
            const int kk = s * kStepK + 16 * j + 2 * c + 8 * half;
            const float* v = &w[static_cast<size_t>(r * K + kk)];
            const uint32_t want = pack_bf16(v[0], v[1]);
            if (fe[j][half] != want) {
              if (fails < 5)
                std::printf("  host: exact fragment row %d k %d: %08x, want %08x\n", r, kk, fe[j][half], want);
              ++fails;
            }
            // ffma: one bf16 unit (2^-7 relative at most), or the ~1e-5 by which 128 d + m's rounding moves a value
            // near 0 (d <= 1e-2 and 6-bit scales: 128 d + m < 82, half its f32 ulp 4e-6, twice over).
            for (int e = 0; e < 2; ++e) {
              const uint16_t got = static_cast<uint16_t>(ff[j][half] >> (16 * e)),
                             ref = static_cast<uint16_t>(want >> (16 * e));
              const float gv = bf16_to_f32(got), rv = bf16_to_f32(ref);
              ffma_diff += got != ref;
              if (std::fabs(gv - rv) > 0x1p-7f * std::max(std::fabs(gv), std::fabs(rv)) + 2e-5f) {
                if (fails < 5) std::printf("  host: ffma fragment row %d k %d: %04x, want %04x\n", r, kk + e, got, ref);
                ++fails;
              }
            }
          }
      }
  }
  // x: one stage of 128 tokens, the ldmatrix reads of two warps' 64 tokens each.
  constexpr int TOK = 128;
  std::vector<uint16_t> xv(TOK * kStepK);
  uint64_t seed = 5;
  for (auto& v : xv) v = static_cast<uint16_t>(exp_common::splitmix(seed));
  std::vector<uint8_t> xi(TOK * kXRow, 0);
  std::vector<int> hit(TOK * kXRow / 16, 0);
  for (int i = 0; i < TOK * 8; ++i) {
    const int r = i >> 3, ch = i & 7;
    std::memcpy(&xi[x_off(r, ch)], &xv[static_cast<size_t>(r * kStepK + ch * 8)], 16);
    ++hit[x_off(r, ch) / 16];
  }
  for (int h : hit) fails += h != 1;  // x_off a bijection onto the stage's chunks
  for (int wtok = 0; wtok < TOK; wtok += 64)
    for (int p = 0; p < 4; ++p)
      for (int j = 0; j < 4; ++j)
        for (int lane = 0; lane < 32; ++lane)
          for (int m = 0; m < 4; ++m) {
            // Lane `lane` receives word lane % 4 of row lane / 4 of matrix m, whose row address lane 8 m + lane / 4
            // gave.
            const int src_lane = 8 * m + lane / 4;
            const uint32_t addr = x_off(wtok + 16 * p + lm_token(src_lane), 2 * j + lm_chunk(src_lane));
            uint32_t got;
            std::memcpy(&got, &xi[addr + 4 * (lane % 4)], 4);
            const int nt = 2 * p + (m >> 1), tok = wtok + 8 * nt + lane / 4, kk = 16 * j + 8 * (m & 1) + 2 * (lane % 4);
            const uint32_t want = xv[static_cast<size_t>(tok * kStepK + kk)] |
                                  static_cast<uint32_t>(xv[static_cast<size_t>(tok * kStepK + kk + 1)]) << 16;
            if (got != want) {
              if (fails < 5) std::printf("  host: ldmatrix tok %d k %d: %08x, want %08x\n", tok, kk, got, want);
              ++fails;
            }
          }
  std::printf("host emulation of the tile indexing: %s (%d failures; ffma values one bf16 unit off src's: %d of %d)\n",
              fails ? "FAIL" : "PASS", fails, ffma_diff, R * K);
  return fails;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = static_cast<double>(a[i]) - b[i];
    num += e * e;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Sample {
  int64_t t, n;
  double ref_bf16, ref_exact, rss;  // sum of x · bf16(W), of x · W, root sum of squares of the products
};

struct Total {
  std::string name;
  double us = 0;
  int shapes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "host") == 0) return host_emulation() ? 1 : 0;
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  std::vector<int> ts = {128, 256, 512, 1024, 2048};
  if (argc > 2) {
    ts.clear();
    for (const char* p = argv[2]; *p;) {
      ts.push_back(std::atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
  }
  int failures = host_emulation();
  constexpr int64_t kMaxT = 2048;
  for (int t : ts)
    if (t <= 0 || t > kMaxT || t % 128 != 0) {
      std::fprintf(stderr, "T = %d: must be a multiple of 128 in 128..%lld\n", t, static_cast<long long>(kMaxT));
      return 2;
    }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB; median of %d calls, L2 flushed before each\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, reps);
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"q|k|v", 6144, 4096}, {"o", 4096, 4096}, {"gate|up", 28672, 4096}, {"down", 4096, 14336}};
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  GemmWorkspace gws(kMaxT, 14336, 28672 * 4096);
  // "src": the expansion (matmul_x16 takes src's tile path at t <= 512 by default).
  CudaOptions expand = cuda_options();
  expand.quant_gemm = QuantGemm::EXPAND;
  const CudaOptionsScope expand_scope(expand);
  DeviceBuffer parts(static_cast<size_t>(kPartsFloats) * 4);
  g_parts = parts.as<float>();
  exp_common::FlushedTimer timer(st, reps, static_cast<size_t>(prop.l2CacheSize));
  const size_t n_forms = 3 + std::size(kTileForms);
  std::vector<std::vector<Total>> totals(ts.size(), std::vector<Total>(n_forms));
  uint64_t seed = 17;
  for (const Shape& sh : shapes) {
    const int64_t n = sh.n, k = sh.k;
    std::vector<uint8_t> q;
    random_q4k(q, n * k / 256, seed++);
    const DeviceWeight w = upload_weight(DType::Q4_K, q.data(), n, k);
    std::vector<uint16_t> hx(static_cast<size_t>(kMaxT * k));
    for (auto& v : hx) v = f32_to_bf16(exp_common::uniform(seed, -1.0f, 1.0f));
    DeviceBuffer x16(hx.size() * 2), full(static_cast<size_t>(n * k) * 2), y(static_cast<size_t>(kMaxT * n) * 4);
    x16.upload(hx.data(), x16.bytes());
    detail::launch_dequant_bf16(w, full.get(), st);
    CK(cudaStreamSynchronize(st));
    const __nv_bfloat16* xp = x16.as<__nv_bfloat16>();
    for (size_t ti = 0; ti < ts.size(); ++ti) {
      const int t = ts[ti];
      const double flop = 2.0 * t * static_cast<double>(n) * static_cast<double>(k);
      // 256 sampled outputs and their references.
      std::vector<Sample> samples(256);
      std::vector<float> row(static_cast<size_t>(k));
      for (Sample& smp : samples) {
        smp.t = static_cast<int64_t>(exp_common::splitmix(seed) % static_cast<uint64_t>(t));
        smp.n = static_cast<int64_t>(exp_common::splitmix(seed) % static_cast<uint64_t>(n));
        dequant_row(q, k, smp.n, row.data());
        double rb = 0, re = 0, ss = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double xv = bf16_to_f32(hx[static_cast<size_t>(smp.t * k + c)]);
          const double wv = row[static_cast<size_t>(c)];
          rb += xv * bf16_to_f32(f32_to_bf16(row[static_cast<size_t>(c)]));
          re += xv * wv;
          ss += xv * wv * xv * wv;
        }
        smp.ref_bf16 = rb, smp.ref_exact = re, smp.rss = std::sqrt(std::max(ss, 1e-30));
      }
      std::vector<float> y_src(static_cast<size_t>(t * n)), y_got(y_src.size());
      // Runs a form once on poisoned y, checks it, and times it if it passed. tol: see the header.
      const auto run_form = [&](size_t fi, const char* name, double tol, bool is_src, auto&& op) {
        totals[ti][fi].name = name;
        y.fill_bytes(0xFF);
        op();
        CK(cudaStreamSynchronize(st));
        y.download(y_got.data(), y_src.size() * 4);
        double err = 0, err_exact = 0;
        for (const Sample& smp : samples) {
          const double v = y_got[static_cast<size_t>(smp.t * n + smp.n)];
          const double e = std::fabs(v - smp.ref_bf16) / smp.rss, ee = std::fabs(v - smp.ref_exact) / smp.rss;
          err = std::isnan(e) ? INFINITY : std::max(err, e);
          err_exact = std::isnan(ee) ? INFINITY : std::max(err_exact, ee);
        }
        if (is_src) y_src = y_got;
        const double vs_src = rel_l2(y_got, y_src);
        const bool ok = err < tol && !std::isnan(vs_src);
        failures += ok ? 0 : 1;
        const double us = ok ? timer.us(op) : NAN;
        if (ok) {
          totals[ti][fi].us += us;
          ++totals[ti][fi].shapes;
        }
        std::printf(
            "T=%-5d %-8s %-17s %9.1f us %7.1f TFLOP/s  check %.1e (limit %.0e; unrounded W %.1e, vs src %.1e) %s\n", t,
            sh.name, name, us, flop / (us * 1e6), err, tol, err_exact, vs_src, ok ? "PASS" : "FAIL");
        return us;
      };
      const double t_src = run_form(0, "src", 1e-4, true, [&] { matmul_x16(w, xp, y.as<float>(), t, gws, st); });
      run_form(1, "gemm (bf16 W)", 1e-4, false,
               [&] { detail::gemm_lt(gws, DType::BF16, full.get(), xp, y.as<float>(), t, n, k, st, false); });
      {
        const double us = timer.us([&] { detail::launch_dequant_bf16(w, full.get(), st); });
        totals[ti][2].name = "expand alone";
        totals[ti][2].us += us;
        ++totals[ti][2].shapes;
        std::printf("T=%-5d %-8s %-17s %9.1f us (%.0f GB/s read + written)\n", t, sh.name, "expand alone", us,
                    (static_cast<double>(w.bytes()) + 2.0 * n * k) / (us * 1e3));
      }
      for (size_t f = 0; f < std::size(kTileForms); ++f) {
        const TileForm& tf = kTileForms[f];
        if (t % tf.tok != 0 || n % tf.rows != 0) continue;
        const double us =
            run_form(3 + f, tf.name, tf.exact ? 1e-4 : 2e-3, false, [&] { tf.launch(w, xp, y.as<float>(), t, st); });
        if (!std::isnan(us)) std::printf("%38s src / this = %.2fx\n", "", t_src / us);
      }
    }
  }
  std::printf("\n== one Llama-3-8B layer's four q4_K matmuls (forms that passed at all four shapes)\n");
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    const double flop = 2.0 * ts[ti] * (6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336);
    const double src_us = totals[ti][0].shapes == 4 ? totals[ti][0].us : NAN;
    for (const Total& tot : totals[ti])
      if (tot.shapes == 4)
        std::printf("T=%-5d %-17s %9.1f us %7.1f TFLOP/s  src / this = %.2fx\n", ts[ti], tot.name.c_str(), tot.us,
                    tot.name == "expand alone" ? NAN : flop / (tot.us * 1e6), src_us / tot.us);
  }
  std::printf("failures=%d\n", failures);
  CK(cudaStreamDestroy(st));
  return failures ? 1 : 0;
}
