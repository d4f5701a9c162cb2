// Causal prefill attention on Hopper tensor cores (wgmma): an experiment for issue 7's last goal (prefill attention
// at 16k at least as fast as PyTorch's SDPA, which on the H100 is cuDNN's engine 2: 3.4-3.8 ms at 32/8 heads, hd 128,
// ~600-650 TFLOP/s counting the causal half). Our attn_prefill (mma.sync m16n8k16, FlashAttention-2 style) runs
// 6.7 ms there. Written in the seventh session; run and grown in the eighth (H100), every form passing its checks:
// 16k in 4.99 ms (first form), 4.64 (intra-warpgroup overlap), 5.3-8.7 (producer threads loading by cp.async), 3.6-3.9
// (one producer thread loading by TMA, ping-pong, bf16 output), against cuDNN's 3.4-3.8 (docs/PERFORMANCE.md). The
// last form went into the engine as src/backends/cuda/kernels/attn_prefill_tma.cu; this file keeps the steps. Ninth
// session: the persistent form (9) measured slower; the grid turned to (heads, q tiles) (10), the mask's code only in
// the last key tile (11) and descriptors built once per tile (12) took 16k to 5.50 M cycles against cuDNN's 5.85 M
// (Nsight Compute), and went into the engine's kernel too.
//
// This first form is FlashAttention-3's arithmetic without its scheduling: one CTA = 128 query rows of one head as two
// consumer warpgroups of 64 rows; K and V tiles of 128 positions double-buffered in shared memory by cp.async from all
// 256 threads (no TMA, no producer warp, no ping-pong between the warpgroups); S = Q K^T by wgmma m64n128k16 with both
// operands in 128-byte-swizzled shared memory (K-major); the online softmax in registers (base 2); P converted in
// registers to the A operand of O += P V (wgmma with A from registers, V as an MN-major B operand: the transpose bit).
// Causal: a CTA walks kv tiles 0 .. its own, the diagonal one masked; CTAs are issued longest first. GQA: kv head =
// head / (heads / kv heads). Layout as the engine's prefill: q [t, heads, 128], k and v [t, kv heads, 128] bf16,
// out [t, heads, 128] f32.
//
// Expected if the descriptors are right: 400-550 TFLOP/s (FlashAttention-3's ablation without warp specialization and
// ping-pong); beating cuDNN needs those next (a producer warp with TMA and mbarriers, two consumer warpgroups
// alternating softmax and GEMMs). The uncertain part is the V descriptor (MN-major, 128-byte swizzle: LBO = the
// 16 KB between the two 64-column halves, SBO = 1,024 B between groups of 8 rows); if the check fails on every row
// while S alone is right, that is the first suspect.
//
// Build here (no GPU needed):
//   mkdir -p build-persistent && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo \
//     -o build-persistent/attn_wgmma bench/cuda/experiments/attn_wgmma.cu
// Run on the GPU machine:   build-persistent/attn_wgmma [reps [t [form]]]   (first a unit check of the two wgmma forms
// alone; t and form (the index in the table's order) select one row, e.g. for Nsight Compute)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "exp_common.cuh"

namespace {

using exp_common::median;

constexpr int kHd = 128;
constexpr int kBM = 128;  // query rows per CTA (two warpgroups of 64)
constexpr int kBN = 128;  // key/value rows per tile
constexpr int kThreads = 256;
constexpr int kTileBytes = kBM * kHd * 2;        // a [128][128] bf16 tile: 32 KB
constexpr int kHalfBytes = kTileBytes / 2;       // its 64-column half: [128 rows][128 B]
constexpr size_t kSmem = 5 * kTileBytes + 1024;  // Q, K x 2, V x 2, alignment

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
// cp.async writes through the generic proxy, wgmma reads through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

// Shared-memory matrix descriptors, 128-byte swizzle. K-major (Q, K): LBO unused (1), SBO = 1,024 B between groups of
// 8 rows. MN-major (V as B of O += P V): LBO = 16 KB between the 64-column halves (N), SBO = 1,024 B between groups of
// 8 rows (K).
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(kHalfBytes >> 4) << 16) | (64ull << 32) |
         (1ull << 62);
}

__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

// A [128 rows][128 cols] bf16 tile from global (row stride ld elements) into shared memory as two 64-column halves,
// each [128 rows][128 B] with the 16-byte chunks of row r at chunk ^ (r % 8) (the 128-byte swizzle wgmma reads).
__device__ __forceinline__ void load_tile(uint32_t dst, const __nv_bfloat16* src, size_t ld) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = threadIdx.x + i * kThreads;  // 2,048 chunks of 16 bytes
    const int r = c / 16, ch = c % 16, half = ch / 8, k = ch % 8;
    cp_async16(dst + half * kHalfBytes + r * 128 + ((k ^ (r & 7)) << 4), src + r * ld + ch * 8);
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__global__ void __launch_bounds__(kThreads, 1)
    attn_wgmma_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                      const __nv_bfloat16* __restrict__ v, float* __restrict__ out, int t_len, int heads, int kv_heads,
                      float scale_log2) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;  // swizzle atoms are 1,024-byte aligned
  const uint32_t sq = base, sk[2] = {base + kTileBytes, base + 2 * kTileBytes},
                 sv[2] = {base + 3 * kTileBytes, base + 4 * kTileBytes};
  const int n_qt = t_len / kBM;
  const int qt = n_qt - 1 - static_cast<int>(blockIdx.x);  // the longest rows first
  const int h = blockIdx.y, hk = h / (heads / kv_heads);
  const size_t ldq = static_cast<size_t>(heads) * kHd, ldkv = static_cast<size_t>(kv_heads) * kHd;
  const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;

  load_tile(sq, q + static_cast<size_t>(qt) * kBM * ldq + h * kHd, ldq);
  load_tile(sk[0], k + hk * kHd, ldkv);
  load_tile(sv[0], v + hk * kHd, ldkv);
  cp_commit();

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const int row0 = qt * kBM + wg * 64 + warp * 16 + lane / 4;  // this thread's rows: row0 and row0 + 8

  for (int j = 0; j <= qt; ++j) {
    const int buf = j & 1;
    cp_wait_all();
    fence_proxy_async();
    __syncthreads();  // tile j is in place, and every warpgroup is done with tile j - 1's buffers
    if (j < qt) {
      const size_t r = static_cast<size_t>(j + 1) * kBN;
      load_tile(sk[buf ^ 1], k + r * ldkv + hk * kHd, ldkv);
      load_tile(sv[buf ^ 1], v + r * ldkv + hk * kHd, ldkv);
      cp_commit();
    }
    // S = Q K^T: 8 steps of 16 along the head dimension (4 per 64-column half, 32 bytes apart inside the atom).
    float s[64];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
      wgmma_ss(s, desc_kmajor(sq + off + wg * 64 * 128), desc_kmajor(sk[buf] + off), kk > 0);
    }
    wgmma_commit();
    wgmma_wait0();
    // Mask (the diagonal tile), then the online softmax in base 2. s[i]: row row0 + 8 * ((i / 2) % 2), column
    // j * 128 + 8 * (i / 4) + 2 * (lane % 4) + i % 2.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int r = (i / 2) % 2;
      float x = s[i] * scale_log2;
      if (j == qt) {
        const int col = j * kBN + 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
        if (col > row0 + 8 * r) x = -INFINITY;
      }
      s[i] = x;
      mx[r] = fmaxf(mx[r], x);
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      corr[r] = exp2f(m_run[r] - m_new);
      m_run[r] = m_new;
      l_run[r] *= corr[r];
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int r = (i / 2) % 2;
      s[i] = exp2f(s[i] - m_run[r]);
      l_run[r] += s[i];
      o[i] *= corr[r];
    }
    // P as the A operand (registers): k step kk = columns 16 kk .. 16 kk + 15 = accumulators 8 kk .. 8 kk + 7.
    uint32_t a[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    // O += P V: 8 steps of 16 positions; V's rows 16 kk .. 16 kk + 15 are two groups of 8 rows (2 x 1,024 B).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_rs(o, a[kk], desc_mnmajor(sv[buf] + kk * 2048), 1);
    wgmma_commit();
    wgmma_wait0();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int r = (i / 2) % 2;
    const int row = row0 + 8 * r, col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    out[(static_cast<size_t>(row) * heads + h) * kHd + col] = o[i] / l_run[r];
  }
}

// The second form (eighth session): FlashAttention-3's intra-warpgroup overlap. Iteration j issues S_j = Q K_j and
// O += P_{j-1} V_{j-1} back to back, waits for S_j only, runs the softmax of S_j while the tensor cores do P_{j-1} V_{j-1},
// then waits for O and rescales it. K and V live in three-stage rings so that the loads run two iterations ahead: the
// group issued at iteration j holds K_{j+2} and V_{j+1}, exactly what iteration j + 2 reads (V_{j-1} is still read by
// the PV of iteration j, K_{j-1} is free). 224 KB of shared memory (Q + 3 K + 3 V). The softmax scales inside one FFMA
// before ex2.approx (the max taken on the raw scores: the scale is positive).
constexpr int kStages = 3;
constexpr size_t kSmemPipe = (1 + 2 * kStages) * kTileBytes + 1024;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Keeps the compiler from moving registers a wgmma still reads or writes (CUTLASS's warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) asm volatile("" : "+r"(r[i][c])::"memory");
}
__device__ __forceinline__ void cp_wait_1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

__global__ void __launch_bounds__(kThreads, 1)
    attn_pipe_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                     const __nv_bfloat16* __restrict__ v, float* __restrict__ out, int t_len, int heads, int kv_heads,
                     float scale_log2) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sq = base;
  const auto sk = [&](int j) { return base + (1 + j % kStages) * kTileBytes; };
  const auto sv = [&](int j) { return base + (1 + kStages + j % kStages) * kTileBytes; };
  const int n_qt = t_len / kBM;
  const int qt = n_qt - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, hk = h / (heads / kv_heads);
  const size_t ldq = static_cast<size_t>(heads) * kHd, ldkv = static_cast<size_t>(kv_heads) * kHd;
  const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const __nv_bfloat16* kb = k + hk * kHd;
  const __nv_bfloat16* vb = v + hk * kHd;

  load_tile(sq, q + static_cast<size_t>(qt) * kBM * ldq + h * kHd, ldq);
  load_tile(sk(0), kb, ldkv);
  cp_commit();
  if (qt >= 1) load_tile(sk(1), kb + static_cast<size_t>(kBN) * ldkv, ldkv);
  load_tile(sv(0), vb, ldkv);
  cp_commit();

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  uint32_t a[8][4];
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const int row0 = qt * kBM + wg * 64 + warp * 16 + lane / 4;

  // Iteration j's loads: wait for its group (K_j, V_{j-1}; the next group may still be in flight), make them visible to
  // every thread's wgmma, and issue the group iteration j + 2 reads. Every iteration commits a group (maybe empty),
  // so the wait counts stay uniform.
  const auto next_loads = [&](int j) {
    cp_wait_1();
    fence_proxy_async();
    __syncthreads();  // ... and both warpgroups are done with iteration j - 1's buffers
    if (j + 2 <= qt) load_tile(sk(j + 2), kb + static_cast<size_t>(j + 2) * kBN * ldkv, ldkv);
    if (j + 1 <= qt) load_tile(sv(j + 1), vb + static_cast<size_t>(j + 1) * kBN * ldkv, ldkv);
    cp_commit();
  };
  const auto issue_s = [&](float (&s)[64], int j) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
      wgmma_ss(s, desc_kmajor(sq + off + wg * 64 * 128), desc_kmajor(sk(j) + off), kk > 0);
    }
    wgmma_commit();
  };
  // The online softmax of S_j in place (s becomes P_j, unnormalized); returns the factor O must be scaled by.
  const auto softmax = [&](float (&s)[64], int j, float (&corr)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int r = (i / 2) % 2;
      if (j == qt) {
        const int col = j * kBN + 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
        if (col > row0 + 8 * r) s[i] = -INFINITY;
      }
      mx[r] = fmaxf(mx[r], s[i]);
    }
    float neg_m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r] * scale_log2);
      corr[r] = ex2(m_run[r] - m_new);
      m_run[r] = m_new;
      neg_m[r] = -m_new;
      l_run[r] *= corr[r];
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int r = (i / 2) % 2;
      s[i] = ex2(fmaf(s[i], scale_log2, neg_m[r]));
      l_run[r] += s[i];
    }
  };
  const auto pack = [&](const float (&s)[64]) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  {  // iteration 0: S_0 alone (O is zero)
    next_loads(0);
    float s[64], corr[2];
    wgmma_fence();
    issue_s(s, 0);
    wgmma_wait0();
    fence_regs(s);
    softmax(s, 0, corr);
    pack(s);
  }
  for (int j = 1; j <= qt; ++j) {
    next_loads(j);
    float s[64], corr[2];
    fence_regs(o);
    fence_regs(a);
    wgmma_fence();
    issue_s(s, j);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_rs(o, a[kk], desc_mnmajor(sv(j - 1) + kk * 2048), 1);
    wgmma_commit();
    wgmma_wait1();  // S_j is ready; P_{j-1} V_{j-1} may still run
    fence_regs(s);
    softmax(s, j, corr);
    wgmma_wait0();
    fence_regs(o);
    fence_regs(a);
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] *= corr[(i / 2) % 2];
    pack(s);
  }
  cp_wait_all();  // V_qt
  fence_proxy_async();
  __syncthreads();
  wgmma_fence();
  fence_regs(o);
  fence_regs(a);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) wgmma_rs(o, a[kk], desc_mnmajor(sv(qt) + kk * 2048), 1);
  wgmma_commit();
  wgmma_wait0();
  fence_regs(o);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int r = (i / 2) % 2;
    const int row = row0 + 8 * r, col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    out[(static_cast<size_t>(row) * heads + h) * kHd + col] = o[i] / l_run[r];
  }
}

// The third form: a producer warp. 288 threads: warps 0-7 are the two consumer warpgroups of the second form, warp 8
// loads. Stage j % 3 holds K_j and V_j (Q rides with K_0); full_k[s] and full_v[s] (NP arrivals each, made by the
// hardware as each loading thread's copies land: cp.async.mbarrier.arrive.noinc; the consumers fence for the async
// proxy after waiting) and empty[s] (256 arrivals: the consumers, after the PV that read V_j) replace the CTA
// barrier, so the warpgroups drift apart freely. (A first version had each loading thread wait for its copies and
// arrive itself, K and V behind one barrier: 5.9 ms at 16k with 128 loading threads, 12.6 with 32.) With PINGPONG, the
// two consumer warpgroups take turns issuing their GEMMs (named barriers 1 and 2): one's softmax runs under the other's
// GEMMs. 384 threads: the producer is a whole warpgroup (setmaxnreg works per warpgroup) that gives its registers to
// the consumers (setmaxnreg: 24 for it, 240 for them; at launch 168 each); its warps 9-11 leave at once. (At 288
// threads ptxas capped the kernel at 168 registers anyway and spilled.)
constexpr int kThreadsWs = 384;

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// cp.async.mbarrier.arrive.noinc: an arrival on `bar` once every earlier cp.async of this thread has completed (the
// barrier's count includes it: NP per phase).
__device__ __forceinline__ void cp_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void named_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// A [128][128] tile by the producer's NP threads: 2,048 chunks of 16 bytes.
template <int NP>
__device__ __forceinline__ void load_tile_warp(uint32_t dst, const __nv_bfloat16* src, size_t ld, int lane) {
#pragma unroll 4
  for (int i = 0; i < 2048 / NP; ++i) {
    const int c = lane + i * NP;
    const int r = c / 16, ch = c % 16, half = ch / 8, k = ch % 8;
    cp_async16(dst + half * kHalfBytes + r * 128 + ((k ^ (r & 7)) << 4), src + r * ld + ch * 8);
  }
}

// With TMA (the fourth form), one producer thread loads each half-tile by one cp.async.bulk.tensor (the 128-byte
// swizzle done by the copy engine), full_k/full_v count one arrival plus the bytes (expect_tx), and no proxy fence is
// needed (TMA writes through the async proxy, which wgmma reads).
struct TmaMaps {
  CUtensorMap q, k, v;
};

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// A [128 rows][64 columns] box of a [t][heads][128] bf16 tensor (columns c0.., head h, rows r0..) into `dst`, 128-byte
// swizzled, completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int h, int r0, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(h), "r"(r0), "r"(bar)
      : "memory");
}

// SPLIT_MASK: the causal mask's code only in the last key tile's step (the loop split in two at compile time); without
// it the mask's test j == qt stays in every step, which ptxas turns into 64 selects and 32 compares per tile.
// LEAN_DESC: each shared-memory descriptor built once per tile (Q's once per CTA) and the k steps' offsets added to it
// (the address field is the low 14 bits of (address >> 4): offsets inside a tile cannot carry out of it), instead of
// masking and shifting every step's address.
template <bool PINGPONG, int NP, bool TMA = false, bool OUT16 = false, bool LAZY = false, bool HEADS_FAST = false,
          bool SPLIT_MASK = false, bool LEAN_DESC = false>
__global__ void __launch_bounds__(kThreadsWs, 1)
    attn_ws_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                   const __nv_bfloat16* __restrict__ v, float* __restrict__ out, int t_len, int heads, int kv_heads,
                   float scale_log2, const __grid_constant__ TmaMaps maps) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ alignas(8) uint64_t bars[3 * kStages];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sq = base;
  const auto sk = [&](int j) { return base + (1 + j % kStages) * kTileBytes; };
  const auto sv = [&](int j) { return base + (1 + kStages + j % kStages) * kTileBytes; };
  const auto full_k = [&](int j) { return smem_u32(&bars[j % kStages]); };
  const auto empty = [&](int j) { return smem_u32(&bars[kStages + j % kStages]); };
  const auto full_v = [&](int j) { return smem_u32(&bars[2 * kStages + j % kStages]); };
  const int n_qt = t_len / kBM;
  // HEADS_FAST: grid (heads, q tiles), so the hardware dispatches every head's longest q tile first (longest
  // processing time first over the whole grid) instead of one head's tiles, longest to shortest, then the next head's.
  const int qt = n_qt - 1 - static_cast<int>(HEADS_FAST ? blockIdx.y : blockIdx.x);
  const int h = HEADS_FAST ? blockIdx.x : blockIdx.y, hk = h / (heads / kv_heads);
  const size_t ldq = static_cast<size_t>(heads) * kHd, ldkv = static_cast<size_t>(kv_heads) * kHd;
  const int warp_all = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&bars[s]), TMA ? 1 : NP);
      mbar_init(smem_u32(&bars[kStages + s]), 256);
      mbar_init(smem_u32(&bars[2 * kStages + s]), TMA ? 1 : NP);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp_all >= 8) {  // the producer warpgroup; its first NP threads load
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    const int pt = threadIdx.x - 256;
    if (pt >= (TMA ? 1 : NP)) return;
    if constexpr (TMA) {
      for (int j = 0; j <= qt; ++j) {
        if (j >= kStages) mbar_wait(empty(j), ((j / kStages) - 1) & 1);
        const int r0 = j * kBN;
        mbar_expect_tx(full_k(j), (j == 0 ? 2 : 1) * kTileBytes);
        if (j == 0) {
          tma_load(sq, &maps.q, 0, h, qt * kBM, full_k(0));
          tma_load(sq + kHalfBytes, &maps.q, 64, h, qt * kBM, full_k(0));
        }
        tma_load(sk(j), &maps.k, 0, hk, r0, full_k(j));
        tma_load(sk(j) + kHalfBytes, &maps.k, 64, hk, r0, full_k(j));
        mbar_expect_tx(full_v(j), kTileBytes);
        tma_load(sv(j), &maps.v, 0, hk, r0, full_v(j));
        tma_load(sv(j) + kHalfBytes, &maps.v, 64, hk, r0, full_v(j));
      }
      return;
    }
    const __nv_bfloat16* kb = k + hk * kHd;
    const __nv_bfloat16* vb = v + hk * kHd;
    for (int j = 0; j <= qt; ++j) {
      if (j >= kStages) mbar_wait(empty(j), ((j / kStages) - 1) & 1);  // the PV that read tile j - 3 is done
      if (j == 0) load_tile_warp<NP>(sq, q + static_cast<size_t>(qt) * kBM * ldq + h * kHd, ldq, pt);
      load_tile_warp<NP>(sk(j), kb + static_cast<size_t>(j) * kBN * ldkv, ldkv, pt);
      cp_arrive(full_k(j));  // the hardware arrives once this lane's copies so far have landed
      load_tile_warp<NP>(sv(j), vb + static_cast<size_t>(j) * kBN * ldkv, ldkv, pt);
      cp_arrive(full_v(j));
    }
    cp_wait_all();  // leave no copy in flight behind an exiting thread
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
  const int wg = warp_all / 4, warp = warp_all % 4;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  uint32_t a[8][4];
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const int row0 = qt * kBM + wg * 64 + warp * 16 + lane / 4;
  const uint64_t dq0 = desc_kmajor(sq + wg * 64 * 128);
  const auto issue_s = [&](float(&s)[64], int j) {
    const uint64_t dk0 = desc_kmajor(sk(j));
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
      if constexpr (LEAN_DESC)
        wgmma_ss(s, dq0 + (off >> 4), dk0 + (off >> 4), kk > 0);
      else
        wgmma_ss(s, desc_kmajor(sq + off + wg * 64 * 128), desc_kmajor(sk(j) + off), kk > 0);
    }
    wgmma_commit();
  };
  const auto softmax = [&](float(&s)[64], int j, float(&corr)[2], auto masked) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int r = (i / 2) % 2;
      if (decltype(masked)::value && j == qt) {
        const int col = j * kBN + 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
        if (col > row0 + 8 * r) s[i] = -INFINITY;
      }
      mx[r] = fmaxf(mx[r], s[i]);
    }
    float neg_m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r] * scale_log2);
      corr[r] = ex2(m_run[r] - m_new);
      m_run[r] = m_new;
      neg_m[r] = -m_new;
      l_run[r] *= corr[r];
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int r = (i / 2) % 2;
      s[i] = ex2(fmaf(s[i], scale_log2, neg_m[r]));
      l_run[r] += s[i];
    }
  };
  const auto pack = [&](const float(&s)[64]) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  // Ping-pong: warpgroup w issues its GEMMs after bar.sync on barrier 1 + w, then lets the other go (bar.arrive on
  // 2 - w); warpgroup 1 lets warpgroup 0 go first.
  if (PINGPONG && wg == 1) named_arrive(1, 256);
  {
    mbar_wait(full_k(0), 0);
    if constexpr (!TMA)
      fence_proxy_async();  // other threads' cp.async writes (generic proxy), read next by wgmma (async proxy)
    float s[64], corr[2];
    if (PINGPONG) named_sync(1 + wg, 256);
    wgmma_fence();
    issue_s(s, 0);
    if (PINGPONG) named_arrive(2 - wg, 256);
    wgmma_wait0();
    fence_regs(s);
    softmax(s, 0, corr, std::true_type{});
    pack(s);
  }
  const auto step = [&](int j, auto masked) {
    mbar_wait(full_k(j), (j / kStages) & 1);
    mbar_wait(full_v(j - 1), ((j - 1) / kStages) & 1);
    if constexpr (!TMA) fence_proxy_async();
    float s[64], corr[2];
    fence_regs(o);
    fence_regs(a);
    if (PINGPONG) named_sync(1 + wg, 256);
    wgmma_fence();
    issue_s(s, j);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wgmma_rs(o, a[kk], LEAN_DESC ? desc_mnmajor(sv(j - 1)) + kk * 128 : desc_mnmajor(sv(j - 1) + kk * 2048), 1);
    wgmma_commit();
    if (PINGPONG) named_arrive(2 - wg, 256);
    wgmma_wait1();
    fence_regs(s);
    softmax(s, j, corr, masked);
    wgmma_wait0();
    fence_regs(o);
    fence_regs(a);
    mbar_arrive(empty(j - 1));  // V_{j-1} (and K_{j-1}) read: the producer may refill the stage
    // LAZY: once the running maxima settle, most tiles leave them unchanged (corr == 1): skip the 64 multiplies when
    // no row of the warp moved (exact: a multiply by 1).
    if (!LAZY || __any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= corr[(i / 2) % 2];
    }
    pack(s);
  };
  if constexpr (SPLIT_MASK) {
    for (int j = 1; j < qt; ++j) step(j, std::false_type{});
    if (qt >= 1) step(qt, std::true_type{});
  } else {
    for (int j = 1; j <= qt; ++j) step(j, std::true_type{});
  }
  mbar_wait(full_v(qt), (qt / kStages) & 1);
  if constexpr (!TMA) fence_proxy_async();
  if (PINGPONG) named_sync(1 + wg, 256);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    wgmma_rs(o, a[kk], LEAN_DESC ? desc_mnmajor(sv(qt)) + kk * 128 : desc_mnmajor(sv(qt) + kk * 2048), 1);
  wgmma_commit();
  if (PINGPONG && wg == 0) named_arrive(2, 256);  // warpgroup 1's last turn needs no answer: arrivals stay paired
  wgmma_wait0();
  fence_regs(o);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int r = (i / 2) % 2;
    const int row = row0 + 8 * r, col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    if constexpr (OUT16) {  // bf16 output as the engine's (and cuDNN's): pairs of columns as one 4-byte store
      if (i % 2 == 0)
        *reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<__nv_bfloat16*>(out) +
                                           (static_cast<size_t>(row) * heads + h) * kHd + col) =
            __floats2bfloat162_rn(o[i] / l_run[r], o[i + 1] / l_run[r]);
    } else {
      out[(static_cast<size_t>(row) * heads + h) * kHd + col] = o[i] / l_run[r];
    }
  }
}

// The persistent form (written at the end of the eighth session, run in the ninth: correct, and slower than form 7 at
// 8k and 16k, 1.67 M / 6.19 M cycles against 1.62 M / 5.87 M, its cross-tile waits adding 12% instructions): the TMA + ping-pong + bf16-output form with one CTA per SM walking tiles k = blockIdx.x, + gridDim.x, ...
// in decreasing length (all heads of the last q tile first), as cuDNN's kernel runs (132 CTAs). What it saves: each
// tile's launch, barrier setup and setmaxnreg, and the wait for Q (the producer loads the next tile's Q and first K/V
// while the consumers finish the current one). The K/V rings and their phases run on across tiles (a global
// iteration count); Q gets its own empty barrier (the consumers' last S of a tile releases it); the consumers also
// release the last tile's stage; the ping-pong alternation runs on across tiles, warpgroup 1 skipping only its very
// last arrival.
__global__ void __launch_bounds__(kThreadsWs, 1)
    attn_persistent_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                           const __nv_bfloat16* __restrict__ v, float* __restrict__ out, int t_len, int heads,
                           int kv_heads, float scale_log2, const __grid_constant__ TmaMaps maps) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ alignas(8) uint64_t bars[3 * kStages + 1];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sq = base;
  const auto sk = [&](int it) { return base + (1 + it % kStages) * kTileBytes; };
  const auto sv = [&](int it) { return base + (1 + kStages + it % kStages) * kTileBytes; };
  const auto full_k = [&](int it) { return smem_u32(&bars[it % kStages]); };
  const auto empty = [&](int it) { return smem_u32(&bars[kStages + it % kStages]); };
  const auto full_v = [&](int it) { return smem_u32(&bars[2 * kStages + it % kStages]); };
  const uint32_t q_empty = smem_u32(&bars[3 * kStages]);
  const int n_qt = t_len / kBM;
  const int n_tiles = n_qt * heads;
  const auto tile_qt = [&](int kt) { return n_qt - 1 - kt / heads; };
  const auto tile_h = [&](int kt) { return kt % heads; };
  const int warp_all = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&bars[s]), 1);
      mbar_init(smem_u32(&bars[kStages + s]), 256);
      mbar_init(smem_u32(&bars[2 * kStages + s]), 1);
    }
    mbar_init(q_empty, 256);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp_all >= 8) {  // the producer warpgroup: thread 256 loads
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    if (threadIdx.x != 256) return;
    int it = 0, n = 0;  // global K/V iteration, tiles done by this CTA
    for (int kt = blockIdx.x; kt < n_tiles; kt += gridDim.x, ++n) {
      const int qt = tile_qt(kt), h = tile_h(kt), hk = h / (heads / kv_heads);
      for (int j = 0; j <= qt; ++j, ++it) {
        if (it >= kStages) mbar_wait(empty(it), ((it / kStages) - 1) & 1);
        const int r0 = j * kBN;
        if (j == 0) {
          if (n > 0) mbar_wait(q_empty, (n - 1) & 1);  // the previous tile's last S GEMM is done with Q
          mbar_expect_tx(full_k(it), 2 * kTileBytes);
          tma_load(sq, &maps.q, 0, h, qt * kBM, full_k(it));
          tma_load(sq + kHalfBytes, &maps.q, 64, h, qt * kBM, full_k(it));
        } else {
          mbar_expect_tx(full_k(it), kTileBytes);
        }
        tma_load(sk(it), &maps.k, 0, hk, r0, full_k(it));
        tma_load(sk(it) + kHalfBytes, &maps.k, 64, hk, r0, full_k(it));
        mbar_expect_tx(full_v(it), kTileBytes);
        tma_load(sv(it), &maps.v, 0, hk, r0, full_v(it));
        tma_load(sv(it) + kHalfBytes, &maps.v, 64, hk, r0, full_v(it));
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
  const int wg = warp_all / 4, warp = warp_all % 4;
  uint32_t a[8][4];
  if (wg == 1) named_arrive(1, 256);
  int it = 0;
  for (int kt = blockIdx.x; kt < n_tiles; kt += gridDim.x) {
    const int qt = tile_qt(kt), h = tile_h(kt);
    const bool last_tile = kt + static_cast<int>(gridDim.x) >= n_tiles;
    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    const int row0 = qt * kBM + wg * 64 + warp * 16 + lane / 4;
    const auto issue_s = [&](float (&s)[64], int g) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint32_t off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
        wgmma_ss(s, desc_kmajor(sq + off + wg * 64 * 128), desc_kmajor(sk(g) + off), kk > 0);
      }
      wgmma_commit();
    };
    const auto softmax = [&](float (&s)[64], int j, float (&corr)[2]) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int r = (i / 2) % 2;
        if (j == qt) {
          const int col = j * kBN + 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
          if (col > row0 + 8 * r) s[i] = -INFINITY;
        }
        mx[r] = fmaxf(mx[r], s[i]);
      }
      float neg_m[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m_run[r], mx[r] * scale_log2);
        corr[r] = ex2(m_run[r] - m_new);
        m_run[r] = m_new;
        neg_m[r] = -m_new;
        l_run[r] *= corr[r];
      }
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int r = (i / 2) % 2;
        s[i] = ex2(fmaf(s[i], scale_log2, neg_m[r]));
        l_run[r] += s[i];
      }
    };
    const auto pack = [&](const float (&s)[64]) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };
    const int it0 = it;
    {
      mbar_wait(full_k(it0), (it0 / kStages) & 1);
      float s[64], corr[2];
      fence_regs(o);
      named_sync(1 + wg, 256);
      wgmma_fence();
      issue_s(s, it0);
      named_arrive(2 - wg, 256);
      wgmma_wait0();
      fence_regs(s);
      if (qt == 0) mbar_arrive(q_empty);  // a one-tile row block: its only S was the last to read Q
      softmax(s, 0, corr);
      pack(s);
    }
    for (int j = 1; j <= qt; ++j) {
      const int g = it0 + j;
      mbar_wait(full_k(g), (g / kStages) & 1);
      mbar_wait(full_v(g - 1), ((g - 1) / kStages) & 1);
      float s[64], corr[2];
      fence_regs(o);
      fence_regs(a);
      named_sync(1 + wg, 256);
      wgmma_fence();
      issue_s(s, g);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) wgmma_rs(o, a[kk], desc_mnmajor(sv(g - 1) + kk * 2048), 1);
      wgmma_commit();
      named_arrive(2 - wg, 256);
      wgmma_wait1();
      fence_regs(s);
      if (j == qt) mbar_arrive(q_empty);  // the tile's last S GEMM has read Q
      softmax(s, j, corr);
      wgmma_wait0();
      fence_regs(o);
      fence_regs(a);
      mbar_arrive(empty(g - 1));
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= corr[(i / 2) % 2];
      pack(s);
    }
    const int gl = it0 + qt;
    mbar_wait(full_v(gl), (gl / kStages) & 1);
    named_sync(1 + wg, 256);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_rs(o, a[kk], desc_mnmajor(sv(gl) + kk * 2048), 1);
    wgmma_commit();
    if (wg == 0 || !last_tile) named_arrive(2 - wg, 256);  // warpgroup 1's very last turn needs no answer
    wgmma_wait0();
    fence_regs(o);
    mbar_arrive(empty(gl));  // the producer runs on into the next tile: release this stage too
    it = gl + 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    __nv_bfloat16* o16 = reinterpret_cast<__nv_bfloat16*>(out);
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const int r = (i / 2) % 2;
      const int row = row0 + 8 * r, col = 8 * (i / 4) + 2 * (lane % 4);
      *reinterpret_cast<__nv_bfloat162*>(o16 + (static_cast<size_t>(row) * heads + h) * kHd + col) =
          __floats2bfloat162_rn(o[i] / l_run[r], o[i + 1] / l_run[r]);
    }
  }
}

// Unit check of the two wgmma forms alone, one warpgroup (the first thing to run if the attention check fails):
// s_out [64][128] = Q[0:64] K^T for one 128 x 128 K tile (K-major descriptors), o_out [64][128] = P V with P [64][128]
// read from global into the A-operand registers and V a 128 x 128 tile (the MN-major descriptor).
__global__ void __launch_bounds__(128)
    unit_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                const __nv_bfloat16* __restrict__ p, const __nv_bfloat16* __restrict__ v, float* __restrict__ s_out,
                float* __restrict__ o_out) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sq = base, sk = base + kTileBytes, sv = base + 2 * kTileBytes;
  // load_tile is written for 256 threads: two passes of this warpgroup's 128 (threadIdx.x and threadIdx.x + 128).
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < 8; ++i) {
      const int c = threadIdx.x + pass * 128 + i * kThreads;
      const int r = c / 16, ch = c % 16, half = ch / 8, kq = ch % 8;
      const uint32_t off = half * kHalfBytes + r * 128 + ((kq ^ (r & 7)) << 4);
      cp_async16(sq + off, q + r * kHd + ch * 8);
      cp_async16(sk + off, k + r * kHd + ch * 8);
      cp_async16(sv + off, v + r * kHd + ch * 8);
    }
  cp_commit();
  cp_wait_all();
  fence_proxy_async();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = warp * 16 + lane / 4;
  float acc[64];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
    wgmma_ss(acc, desc_kmajor(sq + off), desc_kmajor(sk + off), kk > 0);
  }
  wgmma_commit();
  wgmma_wait0();
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int row = row0 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    s_out[row * 128 + col] = acc[i];
  }
  uint32_t a[8][4];
  auto pv = [&](int row, int col) { return __bfloat162float(p[row * 128 + col]); };
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const int c = 16 * kk + 2 * (lane % 4);
    a[kk][0] = pack_bf16(pv(row0, c), pv(row0, c + 1));
    a[kk][1] = pack_bf16(pv(row0 + 8, c), pv(row0 + 8, c + 1));
    a[kk][2] = pack_bf16(pv(row0, c + 8), pv(row0, c + 9));
    a[kk][3] = pack_bf16(pv(row0 + 8, c + 8), pv(row0 + 8, c + 9));
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) wgmma_rs(acc, a[kk], desc_mnmajor(sv + kk * 2048), 1);
  wgmma_commit();
  wgmma_wait0();
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int row = row0 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    o_out[row * 128 + col] = acc[i];
  }
}

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
    p[i] = __float2bfloat16(static_cast<float>(x % 2001u) / 1000.0f - 1.0f);
  }
}

float bf(const __nv_bfloat16& v) { return __bfloat162float(v); }

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int only_t = argc > 2 ? std::atoi(argv[2]) : 0;    // 0: 2k, 8k and 16k
  const int only_var = argc > 3 ? std::atoi(argv[3]) : -1;  // -1: every form (index in the table's order)
  // "hm": K and V head-major, [kv heads][t][128] (the engine's cache layout), for the TMA forms only (the maps' strides
  // say it; the kernels' coordinates stay (column, head, row)).
  const bool head_major = argc > 4 && std::string(argv[4]) == "hm";
  const int heads = 32, kv_heads = 8;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  CK(cudaFuncSetAttribute(attn_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
  CK(cudaFuncSetAttribute(attn_pipe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<false, 1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<true, 1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<false, 1, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<true, 1, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<true, 1, true, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<true, 1, true, true, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<true, 1, true, true, false, true, true>,
                          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<true, 1, true, true, false, true, true, true>,
                          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<true, 128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  CK(cudaFuncSetAttribute(attn_ws_kernel<false, 128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(kSmemPipe)));
  const float scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(kHd));
  {  // the unit check: S = Q K^T and O = P V for one tile each
    const size_t n = 128 * 128;
    __nv_bfloat16 *q = nullptr, *k = nullptr, *p = nullptr, *v = nullptr;
    float *so = nullptr, *oo = nullptr;
    for (auto** b : {&q, &k, &p, &v}) CK(cudaMalloc(b, n * 2));
    CK(cudaMalloc(&so, 64 * 128 * 4));
    CK(cudaMalloc(&oo, 64 * 128 * 4));
    fill_bf16<<<64, 256>>>(q, n, 11u);
    fill_bf16<<<64, 256>>>(k, n, 12u);
    fill_bf16<<<64, 256>>>(p, n, 13u);
    fill_bf16<<<64, 256>>>(v, n, 14u);
    CK(cudaFuncSetAttribute(unit_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * kTileBytes + 1024));
    unit_kernel<<<1, 128, 3 * kTileBytes + 1024>>>(q, k, p, v, so, oo);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> hq(n), hk(n), hp(n), hv(n);
    std::vector<float> hs(64 * 128), ho(64 * 128);
    CK(cudaMemcpy(hq.data(), q, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hk.data(), k, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hp.data(), p, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hv.data(), v, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hs.data(), so, hs.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ho.data(), oo, ho.size() * 4, cudaMemcpyDeviceToHost));
    double es = 0, rs = 0, eo = 0, ro = 0;
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 128; ++c) {
        double ws = 0, wo = 0;
        for (int d = 0; d < 128; ++d) {
          ws += static_cast<double>(bf(hq[r * 128 + d])) * bf(hk[c * 128 + d]);
          wo += static_cast<double>(bf(hp[r * 128 + d])) * bf(hv[d * 128 + c]);
        }
        es += (hs[r * 128 + c] - ws) * (hs[r * 128 + c] - ws), rs += ws * ws;
        eo += (ho[r * 128 + c] - wo) * (ho[r * 128 + c] - wo), ro += wo * wo;
      }
    std::printf("unit: S = Q K^T relative L2 %.2e %s; O = P V relative L2 %.2e %s\n", std::sqrt(es / rs),
                std::sqrt(es / rs) < 1e-5 ? "ok" : "WRONG", std::sqrt(eo / ro),
                std::sqrt(eo / ro) < 1e-5 ? "ok" : "WRONG");
    for (auto* b : {q, k, p, v}) CK(cudaFree(b));
    CK(cudaFree(so));
    CK(cudaFree(oo));
  }
  using Kernel = void (*)(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, float*, int, int, int,
                         float);
  using KernelWs =
      void (*)(const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, float*, int, int, int, float, TmaMaps);
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  cudaDriverEntryPointQueryResult qres{};
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                      cudaEnableDefault, &qres));
  // [t][n_heads][128] bf16 as a 3-D tensor map (innermost first), boxes of 64 columns x 1 head x 128 rows, swizzled.
  const auto make_map = [&](const __nv_bfloat16* ptr, int n_heads, int t, bool hm = false) {
    CUtensorMap m{};
    const cuuint64_t dims[3] = {kHd, static_cast<cuuint64_t>(n_heads), static_cast<cuuint64_t>(t)};
    const cuuint64_t strides[2] = {hm ? static_cast<cuuint64_t>(t) * kHd * 2 : kHd * 2,
                                   hm ? kHd * 2 : static_cast<cuuint64_t>(n_heads) * kHd * 2};
    const cuuint32_t box[3] = {64, 1, 128}, es[3] = {1, 1, 1};
    const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(ptr), dims, strides,
                              box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      std::printf("cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
      std::exit(1);
    }
    return m;
  };
  struct Variant {
    const char* name;
    Kernel kernel;
    size_t smem;
    int threads;
    KernelWs ws = nullptr;  // the warp-specialized forms (with tensor maps)
    bool out16 = false;     // writes bf16
    bool persistent = false;  // grid: one CTA per SM (at most one per tile)
    bool heads_fast = false;  // grid (heads, q tiles)
  };
  const Variant variants[] = {
      {"first form (S, softmax, PV in turn; 2 stages)", attn_wgmma_kernel, kSmem, kThreads},
      {"intra-warpgroup overlap, 3 stages", attn_pipe_kernel, kSmemPipe, kThreads},
      {"overlap + producer warpgroup (128 loading threads, cp.async), mbarriers", nullptr, kSmemPipe, kThreadsWs,
       attn_ws_kernel<false, 128>},
      {"overlap + producer warpgroup (128, cp.async) + ping-pong", nullptr, kSmemPipe, kThreadsWs,
       attn_ws_kernel<true, 128>},
      {"overlap + producer thread (TMA), mbarriers", nullptr, kSmemPipe, kThreadsWs, attn_ws_kernel<false, 1, true>},
      {"overlap + producer thread (TMA) + ping-pong", nullptr, kSmemPipe, kThreadsWs, attn_ws_kernel<true, 1, true>},
      {"TMA, bf16 output", nullptr, kSmemPipe, kThreadsWs, attn_ws_kernel<false, 1, true, true>, true},
      {"TMA + ping-pong, bf16 output", nullptr, kSmemPipe, kThreadsWs, attn_ws_kernel<true, 1, true, true>, true},
      {"TMA + ping-pong, bf16 output, rescale only when a max moved", nullptr, kSmemPipe, kThreadsWs,
       attn_ws_kernel<true, 1, true, true, true>, true},
      {"persistent (one CTA per SM) TMA + ping-pong, bf16 output", nullptr, kSmemPipe, kThreadsWs,
       attn_persistent_kernel, true, true},
      {"TMA + ping-pong, bf16 output, grid heads-fast (all heads' longest q tiles dispatched first)", nullptr,
       kSmemPipe, kThreadsWs, attn_ws_kernel<true, 1, true, true, false, true>, true, false, true},
      {"TMA + ping-pong, bf16 output, heads-fast grid, mask code only in the last key tile", nullptr, kSmemPipe,
       kThreadsWs, attn_ws_kernel<true, 1, true, true, false, true, true>, true, false, true},
      {"TMA + ping-pong, bf16 output, heads-fast grid, mask only in the last key tile, descriptors per tile", nullptr,
       kSmemPipe, kThreadsWs, attn_ws_kernel<true, 1, true, true, false, true, true, true>, true, false, true}};
  std::printf("| kernel | t | ms (median of %d) | TFLOP/s (causal half) | check |\n|---|---|---|---|---|\n", reps);
  for (int t_len : {2048, 8192, 16384})
  for (const Variant& var : variants) {
    if ((only_t != 0 && t_len != only_t) || (only_var >= 0 && &var - variants != only_var)) continue;
    const size_t nq = static_cast<size_t>(t_len) * heads * kHd, nkv = static_cast<size_t>(t_len) * kv_heads * kHd;
    __nv_bfloat16 *q = nullptr, *k = nullptr, *v = nullptr;
    float* out = nullptr;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&k, nkv * 2));
    CK(cudaMalloc(&v, nkv * 2));
    CK(cudaMalloc(&out, nq * 4));
    fill_bf16<<<1024, 256>>>(q, nq, 1u + t_len);
    fill_bf16<<<1024, 256>>>(k, nkv, 2u + t_len);
    fill_bf16<<<1024, 256>>>(v, nkv, 3u + t_len);
    CK(cudaMemset(out, 0xFF, nq * 4));  // NaN: rows the kernel does not write show up
    const dim3 grid(t_len / kBM, heads);
    const TmaMaps maps{make_map(q, heads, t_len), make_map(k, kv_heads, t_len, head_major),
                       make_map(v, kv_heads, t_len, head_major)};
    const auto launch = [&] {
      if (var.persistent)
        var.ws<<<std::min(prop.multiProcessorCount, static_cast<int>(grid.x * grid.y)), var.threads, var.smem>>>(
            q, k, v, out, t_len, heads, kv_heads, scale_log2, maps);
      else if (var.heads_fast)
        var.ws<<<dim3(grid.y, grid.x), var.threads, var.smem>>>(q, k, v, out, t_len, heads, kv_heads, scale_log2, maps);
      else if (var.ws != nullptr)
        var.ws<<<grid, var.threads, var.smem>>>(q, k, v, out, t_len, heads, kv_heads, scale_log2, maps);
      else
        var.kernel<<<grid, var.threads, var.smem>>>(q, k, v, out, t_len, heads, kv_heads, scale_log2);
    };
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    // Check sampled rows of two heads against a double-precision reference.
    std::vector<__nv_bfloat16> hq(nq), hk(nkv), hv(nkv);
    std::vector<float> ho(nq);
    CK(cudaMemcpy(hq.data(), q, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hk.data(), k, nkv * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hv.data(), v, nkv * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ho.data(), out, nq * 4, cudaMemcpyDeviceToHost));
    if (var.out16) {  // the first nq bf16 of the buffer; the rest is the NaN poison
      std::vector<__nv_bfloat16> h16(nq);
      CK(cudaMemcpy(h16.data(), out, nq * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < nq; ++i) ho[i] = bf(h16[i]);
    }
    double err = 0, ref = 0;
    for (int h : {0, 5, heads - 1}) {
      const int hk_ = h / (heads / kv_heads);
      for (int row : {0, 1, 63, 64, 127, 128, 1000, t_len / 2 + 3, t_len - 1}) {
        std::vector<double> p(row + 1);
        double mx = -1e300;
        for (int c = 0; c <= row; ++c) {
          double s = 0;
          for (int d = 0; d < kHd; ++d)
            s += static_cast<double>(bf(hq[(static_cast<size_t>(row) * heads + h) * kHd + d])) *
                 bf(hk[(head_major ? static_cast<size_t>(hk_) * t_len + c : static_cast<size_t>(c) * kv_heads + hk_) *
                           kHd + d]);
          p[c] = s / std::sqrt(static_cast<double>(kHd));
          mx = std::max(mx, p[c]);
        }
        double den = 0;
        for (auto& x : p) x = std::exp(x - mx), den += x;
        for (int d = 0; d < kHd; ++d) {
          double want = 0;
          for (int c = 0; c <= row; ++c)
            want += p[c] * bf(hv[(head_major ? static_cast<size_t>(hk_) * t_len + c
                                             : static_cast<size_t>(c) * kv_heads + hk_) *
                                     kHd + d]);
          want /= den;
          const double got = ho[(static_cast<size_t>(row) * heads + h) * kHd + d];
          err += (got - want) * (got - want), ref += want * want;
        }
      }
    }
    const double rel = std::sqrt(err / ref);  // NaN if any sampled output was not written
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < reps + 2; ++i) {
      CK(cudaEventRecord(e0));
      launch();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (i >= 2) ms.push_back(t);
    }
    const float med = median(ms);
    const double flops = 4.0 * t_len * static_cast<double>(t_len) * kHd * heads / 2;
    std::printf("| %s | %d | %.3f | %.1f | relative L2 %.2e (P in bf16: ~3e-3 expected) %s |\n", var.name, t_len, med,
                flops / (med * 1e-3) / 1e12, rel, rel < 2e-2 ? "ok" : "WRONG");
    CK(cudaFree(q));
    CK(cudaFree(k));
    CK(cudaFree(v));
    CK(cudaFree(out));
  }
  return 0;
}
