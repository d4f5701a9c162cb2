// Causal prefill attention on Hopper's asynchronous units (attn_prefill_tma, kernels_rows.h): FlashAttention-3's
// structure, grown in bench/cuda/experiments/attn_wgmma.cu (eighth session; the steps and what each gained are in
// docs/PERFORMANCE.md). Head dimension 64 or 128 (a template parameter: the tiles' 64-column blocks, the S GEMM's k
// steps and the PV GEMM's N follow it). One CTA = 128 query rows of one head, 384 threads:
//  - warpgroup 2 is the producer: one thread loads Q (once) and each K and V tile of 128 positions by TMA
//    (cp.async.bulk.tensor, the copy engine writing the 128-byte swizzle wgmma reads) into three-stage rings guarded by
//    mbarriers (full_k / full_v: one arrival plus the bytes; empty: the 256 consumer threads); it gives its registers
//    to the consumers (setmaxnreg 40 / 232);
//  - warpgroups 0 and 1 are consumers of 64 rows each: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued together (wgmma,
//    S from shared memory, P from registers, V as an MN-major operand), the online softmax of S_j (base 2, the scale in
//    the exponent's FFMA) running while the tensor cores do the PV; the two warpgroups take turns issuing their GEMMs
//    (named barriers 1 and 2), so one's softmax runs under the other's GEMMs.
// Chunked prefill: the chunk's rows are positions p0 .. p0 + t - 1; a tile of keys is masked where it reaches past the
// q tile's first position. Rows past t read zeros (TMA's out-of-bounds fill) and are not stored; keys past the
// chunk are masked for every stored row (the cache is zeroed at allocation, so V there is finite and P = 0 clears it).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/mbarrier.cuh"
#include "backends/cuda/kernels/tensor_map.cuh"
#include "backends/cuda/kernels/wgmma.cuh"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace detail {
// Named, not anonymous: the compute_90 pass references none of these helpers, which -Werror would otherwise reject.
namespace attn_tma {

// Head dimension HD = 64 or 128: a tile of 128 rows is HD / 64 column blocks of [128 rows][64 columns] (128 bytes a
// row, the 128-byte swizzle's width), kHalfBytes apart.
constexpr int kBM = 128, kBN = 128, kStages = 3, kThreads = 384;
constexpr int kHalfBytes = kBM * 64 * 2;  // a 64-column block: [128 rows][128 B], 16 KB
template <int HD>
constexpr int kTileBytes = kBM* HD * 2;  // [128][HD] 16-bit
template <int HD>
constexpr size_t kSmem = (1 + 2 * kStages) * kTileBytes<HD> + 1024;

struct TmaMaps {
  CUtensorMap q, k, v;
};

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// wgmma.cuh's fence_regs (accumulators) and one for the P fragments: both keep the compiler from moving registers an
// in-flight wgmma reads or writes (placed only outside the issue-wait windows: inside one, ptxas serializes every wgmma
// of the kernel).
using detail::fence_regs;
__device__ __forceinline__ void fence_regs(uint32_t (&r)[8][4]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c) asm volatile("" : "+r"(r[i][c])::"memory");
}
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }
// A box of 64 columns x (1 x 128 or 128 x 1) of a 3-D tensor map at coordinates (c0, c1, c2), completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// Shared-memory matrix descriptors, 128-byte swizzle. K-major (Q, K): wgmma.cuh's desc_kmajor (SBO = 1,024 B between
// groups of 8 rows). MN-major (V as the B of O += P V): LBO = the 16 KB between the 64-column halves, SBO = 1,024 B
// between groups of 8 rows.
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(kHalfBytes >> 4) << 16) | (64ull << 32) |
         (1ull << 62);
}

template <typename T>
struct Wgmma;
#define TESSERA_WGMMA_ACC                                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define TESSERA_WGMMA_D(d)                                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define TESSERA_WGMMA_ACC32                                                                                         \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define TESSERA_WGMMA_D32(d)                                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define TESSERA_WGMMA_TYPE(TYPE, NAME, PACK)                                                                     \
  template <>                                                                                                    \
  struct Wgmma<TYPE> {                                                                                           \
    static constexpr CUtensorMapDataType kMapType = NAME;                                                        \
    /* D (64 x 128, f32) = A (64 x 16, shared) B (16 x 128, shared)^T, scale_d 0: D = AB. */                     \
    __device__ __forceinline__ static void ss(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {           \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." PACK \
                   "." PACK " " TESSERA_WGMMA_ACC ", %64, %65, p, 1, 1, 0, 0;\n}\n"                              \
                   : TESSERA_WGMMA_D(d)                                                                          \
                   : "l"(da), "l"(db), "r"(scale_d));                                                            \
    }                                                                                                            \
    /* D += A (64 x 16, registers) B (16 x 128, shared, MN-major: the transpose bit). */                         \
    __device__ __forceinline__ static void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {             \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." PACK \
                   "." PACK " " TESSERA_WGMMA_ACC ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                \
                   : TESSERA_WGMMA_D(d)                                                                          \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                               \
    }                                                                                                            \
    /* The same with N = 64 (head dimension 64): D 64 x 64. */                                                   \
    __device__ __forceinline__ static void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {             \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." PACK  \
                   "." PACK " " TESSERA_WGMMA_ACC32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"              \
                   : TESSERA_WGMMA_D32(d)                                                                        \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                               \
    }                                                                                                            \
  };
TESSERA_WGMMA_TYPE(__nv_bfloat16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, "bf16")
TESSERA_WGMMA_TYPE(__half, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, "f16")
#undef TESSERA_WGMMA_TYPE
#undef TESSERA_WGMMA_D
#undef TESSERA_WGMMA_ACC
#undef TESSERA_WGMMA_D32
#undef TESSERA_WGMMA_ACC32

__device__ __forceinline__ uint32_t pack2(float lo, float hi, __nv_bfloat16*) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, __half*) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Grid (n_head, ceil(t / 128)); out [t, ld_out] in T. The hardware dispatches x fastest, so every head's longest q
// tile goes first and the shortest fill the tail (with the q tiles fastest, the last heads' long tiles started late).
template <typename T, int HD>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_tma_kernel(const __grid_constant__ TmaMaps maps, T* __restrict__ out, int64_t ld_out, int t, int p0,
                            int n_head, int n_kv, int seq, float scale_log2) {
  // wgmma, setmaxnreg and this TMA form exist on sm_90a only; the build's compute_90 PTX (for other GPUs) gets an
  // empty kernel, which attn_prefill_tma_supported never lets run (it wants an sm_90 device, which runs the sm_90a
  // code).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  __shared__ alignas(8) uint64_t bars[3 * kStages];
  const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;  // swizzle atoms are 1,024-byte aligned
  const uint32_t sq = base;
  constexpr int kTile = kTileBytes<HD>, kBlocks = HD / 64;  // bytes per tile, 64-column blocks per row
  const auto sk = [&](int j) { return base + (1 + j % kStages) * kTile; };
  const auto sv = [&](int j) { return base + (1 + kStages + j % kStages) * kTile; };
  const auto full_k = [&](int j) { return smem_u32(&bars[j % kStages]); };
  const auto empty = [&](int j) { return smem_u32(&bars[kStages + j % kStages]); };
  const auto full_v = [&](int j) { return smem_u32(&bars[2 * kStages + j % kStages]); };
  const int n_qt = (t + kBM - 1) / kBM;
  const int qt = n_qt - 1 - static_cast<int>(blockIdx.y);
  const int h = blockIdx.x, hk = h / (n_head / n_kv);
  // Key tiles 0 .. jl: through the last position a stored row of this tile attends to.
  const int rows_end = (qt + 1) * kBM < t ? (qt + 1) * kBM : t;
  const int jl = (p0 + rows_end - 1) / kBN;
  // Key tiles from jm on reach past the q tile's first position and need the causal mask; the step below is compiled
  // twice, with the mask's code and without it (in every step it costs 64 selects and 32 compares per tile).
  const int jm = (p0 + qt * kBM + 1) / kBN;
  const int warp_all = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&bars[s]), 1);
      mbar_init(smem_u32(&bars[kStages + s]), 256);
      mbar_init(smem_u32(&bars[2 * kStages + s]), 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  pdl_wait();  // q and the cache rows come from the rope launch before
  __syncthreads();

  if (warp_all >= 8) {  // the producer warpgroup: its first thread loads, the rest leave
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    if (threadIdx.x != 256) return;
    const int kv_row = seq * n_kv + hk;
    for (int j = 0; j <= jl; ++j) {
      if (j >= kStages) mbar_wait(empty(j), ((j / kStages) - 1) & 1);  // the PV that read tile j - 3 is done
      mbar_expect_tx(full_k(j), (j == 0 ? 2 : 1) * kTile);
      if (j == 0)
        for (int c = 0; c < kBlocks; ++c) tma_load(sq + c * kHalfBytes, &maps.q, c * 64, h, qt * kBM, full_k(0));
      for (int c = 0; c < kBlocks; ++c) tma_load(sk(j) + c * kHalfBytes, &maps.k, c * 64, j * kBN, kv_row, full_k(j));
      mbar_expect_tx(full_v(j), kTile);
      for (int c = 0; c < kBlocks; ++c) tma_load(sv(j) + c * kHalfBytes, &maps.v, c * 64, j * kBN, kv_row, full_v(j));
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
  const int wg = warp_all / 4, warp = warp_all % 4;
  float o[HD / 2];  // O: 64 rows x HD per warpgroup
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  uint32_t a[8][4];
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const int row0 = qt * kBM + wg * 64 + warp * 16 + lane / 4;  // this thread's rows (chunk-local): row0, row0 + 8
  // Descriptors: built once per tile (Q's once) and each k step's offset added (the address field is the low 14 bits
  // of address >> 4, and no offset inside a tile carries out of it).
  const uint64_t dq = desc_kmajor(sq + wg * 64 * 128);
  const auto issue_s = [&](float(&s)[64], int j) {
    const uint64_t dk = desc_kmajor(sk(j));
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {  // steps of 16 along hd: 4 per 64-column block, 32 bytes apart in the atom
      const uint32_t off = ((kk / 4) * kHalfBytes + (kk % 4) * 32) >> 4;
      Wgmma<T>::ss(s, dq + off, dk + off, kk > 0);
    }
    wgmma_commit();
  };
  const auto issue_pv = [&](int j) {
    const uint64_t dv = desc_mnmajor(sv(j));
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) Wgmma<T>::rs(o, a[kk], dv + kk * (2048 >> 4));
    wgmma_commit();
  };
  // The online softmax of S_j in place (s becomes P_j, unnormalized); corr: the factor O must be scaled by. s[i] is
  // row row0 + 8 * ((i / 2) % 2), key j * 128 + 8 * (i / 4) + 2 * (lane % 4) + i % 2.
  // masked: std::true_type where the tile reaches past the q tile's first position (j >= jm).
  // At head dimension 128 the row maxima and sums reduce into 4 independent partials per row (then a small tree): one
  // running value per row is a chain of 32 dependent instructions; 4 chains took 2.9% fewer cycles at 16k. At 64 the
  // same change measured 7.7% MORE cycles (ninth session, docs/PERFORMANCE.md): there one chain per row stays.
  const auto softmax = [&](float(&s)[64], int j, float(&corr)[2], auto masked) {
    constexpr int kChains = HD == 128 ? 4 : 1;  // s[i] is in row (i / 2) % 2, partial (i / 4) % kChains
    if constexpr (decltype(masked)::value) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int col = j * kBN + 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
        if (col > p0 + row0 + 8 * ((i / 2) % 2)) s[i] = -INFINITY;
      }
    }
    float part[2][kChains];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      float& p = part[(i / 2) % 2][(i / 4) % kChains];
      p = i < 4 * kChains && i % 2 == 0 ? s[i] : fmaxf(p, s[i]);  // the first element of each partial starts it
    }
    float neg_m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = part[r][0];
      if constexpr (kChains == 4) mx = fmaxf(fmaxf(part[r][0], part[r][1]), fmaxf(part[r][2], part[r][3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[r], mx * scale_log2);  // the scale is positive: max commutes with it
      corr[r] = ex2(m_run[r] - m_new);
      m_run[r] = m_new;
      neg_m[r] = -m_new;
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      float& p = part[(i / 2) % 2][(i / 4) % kChains];
      s[i] = ex2(fmaf(s[i], scale_log2, neg_m[(i / 2) % 2]));
      p = i < 4 * kChains && i % 2 == 0 ? s[i] : p + s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = part[r][0];
      if constexpr (kChains == 4) sum = (part[r][0] + part[r][1]) + (part[r][2] + part[r][3]);
      l_run[r] = fmaf(l_run[r], corr[r], sum);
    }
  };
  const auto pack = [&](const float(&s)[64]) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)  // A operand of k step kk = accumulators 8 kk .. 8 kk + 7
#pragma unroll
      for (int c = 0; c < 4; ++c) a[kk][c] = pack2(s[8 * kk + 2 * c], s[8 * kk + 2 * c + 1], static_cast<T*>(nullptr));
  };
  // Turns: warpgroup w issues its GEMMs after bar.sync on barrier 1 + w, then lets the other go (bar.arrive on
  // 2 - w); warpgroup 1 lets warpgroup 0 go first, and its last turn needs no answer (arrivals stay paired).
  if (wg == 1) named_arrive(1);
  {
    mbar_wait(full_k(0), 0);
    float s[64], corr[2];
    named_sync(1 + wg);
    wgmma_fence();
    issue_s(s, 0);
    named_arrive(2 - wg);
    wgmma_wait<0>();
    fence_regs(s);
    if (jm == 0)
      softmax(s, 0, corr, std::true_type{});
    else
      softmax(s, 0, corr, std::false_type{});
    pack(s);
  }
  const auto step = [&](int j, auto masked) {
    mbar_wait(full_k(j), (j / kStages) & 1);
    mbar_wait(full_v(j - 1), ((j - 1) / kStages) & 1);
    float s[64], corr[2];
    fence_regs(o);
    fence_regs(a);
    named_sync(1 + wg);
    wgmma_fence();
    issue_s(s, j);
    issue_pv(j - 1);
    named_arrive(2 - wg);
    wgmma_wait<1>();  // S_j is ready; P_{j-1} V_{j-1} may still run
    fence_regs(s);
    softmax(s, j, corr, masked);
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(a);
    mbar_arrive(empty(j - 1));  // K_{j-1} and V_{j-1} read: the producer may refill the stage
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] *= corr[(i / 2) % 2];
    pack(s);
  };
  for (int j = 1; j <= jl; ++j) {
    if (j < jm)
      step(j, std::false_type{});
    else
      step(j, std::true_type{});
  }
  mbar_wait(full_v(jl), (jl / kStages) & 1);
  named_sync(1 + wg);
  wgmma_fence();
  issue_pv(jl);
  if (wg == 0) named_arrive(2);
  wgmma_wait<0>();
  fence_regs(o);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
#pragma unroll
  for (int i = 0; i < HD / 2; i += 2) {
    const int r = (i / 2) % 2;
    const int row = row0 + 8 * r, col = 8 * (i / 4) + 2 * (lane % 4);
    if (row < t) {
      const float inv = 1.0f / l_run[r];
      *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(row) * ld_out + h * HD + col) =
          pack2(o[i] * inv, o[i + 1] * inv, static_cast<T*>(nullptr));
    }
  }
#else
  (void)maps, (void)out, (void)ld_out, (void)t, (void)p0, (void)n_head, (void)n_kv, (void)seq, (void)scale_log2;
#endif
}

}  // namespace attn_tma

namespace {
using namespace attn_tma;

// A 3-D map of 16-bit elements, innermost first: dims {hd, d1, d2}, byte strides of dims 1 and 2, boxes of 64 x b1 x
// b2, 128-byte swizzle, zeros outside.
CUtensorMap make_map(CUtensorMapDataType type, const void* p, uint64_t hd, uint64_t d1, uint64_t d2, uint64_t s1,
                     uint64_t s2, uint32_t b1, uint32_t b2) {
  CUtensorMap m{};
  const cuuint64_t dims[3] = {hd, d1, d2};
  const cuuint64_t strides[2] = {s1, s2};
  const cuuint32_t box[3] = {64, b1, b2}, es[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(&m, type, 3, const_cast<void*>(p), dims, strides, box, es,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TESSERA_CUDA_REQUIRE(r == CUDA_SUCCESS, "attn_prefill_tma: the driver refused a tensor map");
  return m;
}

template <typename T, int HD>
void run(const void* q, int64_t ld_q, const KvCacheView& c, int64_t seq, int64_t p0, int64_t t, void* out,
         int64_t n_head, float scale, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [] {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_tma_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kSmem<HD>)));
  });
  constexpr CUtensorMapDataType type = Wgmma<T>::kMapType;
  const uint64_t row_bytes = HD * 2;
  // q [t][n_head][HD] (row stride ld_q); k, v [n_seq * n_kv][n_ctx][HD].
  const TmaMaps maps{make_map(type, q, HD, static_cast<uint64_t>(n_head), static_cast<uint64_t>(t), row_bytes,
                              static_cast<uint64_t>(ld_q) * 2, 1, kBM),
                     make_map(type, c.k, HD, static_cast<uint64_t>(c.n_ctx), static_cast<uint64_t>(c.n_seq * c.n_kv),
                              row_bytes, static_cast<uint64_t>(c.n_ctx) * row_bytes, kBN, 1),
                     make_map(type, c.v, HD, static_cast<uint64_t>(c.n_ctx), static_cast<uint64_t>(c.n_seq * c.n_kv),
                              row_bytes, static_cast<uint64_t>(c.n_ctx) * row_bytes, kBN, 1)};
  const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>((t + kBM - 1) / kBM));
  launch("attn_prefill_tma_kernel", attn_prefill_tma_kernel<T, HD>, grid, dim3(kThreads), kSmem<HD>, stream, maps,
         static_cast<T*>(out), n_head * HD, static_cast<int>(t), static_cast<int>(p0), static_cast<int>(n_head),
         static_cast<int>(c.n_kv), static_cast<int>(seq), scale * 1.4426950408889634f);
}

}  // namespace
}  // namespace detail

bool attn_prefill_tma_supported(const KvCacheView& cache, int64_t n_head, std::string* why) {
  const auto no = [&](const char* r) {
    if (why != nullptr) *why = r;
    return false;
  };
  if (cache.hd != 64 && cache.hd != 128) return no("head dimension is not 64 or 128");
  if (cache.window > 0) return no("the attention has a sliding window (attn_prefill reads it)");
  if (cache.dtype != DType::F16 && cache.dtype != DType::BF16) return no("the cache is not 16-bit");
  if (n_head % cache.n_kv != 0) return no("query heads are not a multiple of the kv heads");
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return no("no CUDA device");
  if (major != 9 || minor != 0) return no("not an sm_90 device (wgmma, TMA)");
  if (detail::tensor_map_encoder() == nullptr) return no("the driver has no cuTensorMapEncodeTiled");
  return true;
}

void attn_prefill_tma(const void* q, int64_t ld_q, const KvCacheView& cache, int64_t seq, int64_t p0, int64_t t,
                      void* out, int64_t n_head, float scale, cudaStream_t stream) {
  std::string why;
  TESSERA_CUDA_REQUIRE(attn_prefill_tma_supported(cache, n_head, &why), "attn_prefill_tma: " + why);
  TESSERA_CUDA_REQUIRE(t >= 1 && p0 >= 0 && p0 + t <= cache.n_ctx, "attn_prefill_tma: rows outside the cache");
  TESSERA_CUDA_REQUIRE(t <= 65535 * int64_t{detail::attn_tma::kBM}, "attn_prefill_tma: more than 65,535 q tiles");
  TESSERA_CUDA_REQUIRE(seq >= 0 && seq < cache.n_seq, "attn_prefill_tma: sequence slot out of range");
  TESSERA_CUDA_REQUIRE(ld_q % 8 == 0 && ld_q >= n_head * cache.hd, "attn_prefill_tma: q's row stride");
  TESSERA_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
                       "attn_prefill_tma: q and out must be 16-byte aligned");
  const bool bf16 = cache.dtype == DType::BF16;
  if (cache.hd == 128)
    (bf16 ? detail::run<__nv_bfloat16, 128> : detail::run<__half, 128>)(q, ld_q, cache, seq, p0, t, out, n_head, scale,
                                                                        stream);
  else
    (bf16 ? detail::run<__nv_bfloat16, 64> : detail::run<__half, 64>)(q, ld_q, cache, seq, p0, t, out, n_head, scale,
                                                                      stream);
}

}  // namespace tessera::cuda
