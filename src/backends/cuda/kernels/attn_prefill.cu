// Causal prefill attention over the f16/bf16 KV cache (an f32 cache takes the FFMA kernel attn_prefill_f32_kernel
// below), FlashAttention-2 style: a block owns BM query rows of one head, streams that head's keys and values through
// shared memory BN positions at a time (cp.async, two stages, so tile j+1 loads while tile j computes), and keeps an
// online softmax in registers; no [t, t] score matrix exists.
//
// Arithmetic: tensor cores via mma.sync m16n8k16 (16-bit operands of the cache's type, f32 accumulate). S = Q·Kᵀ
// stays in the accumulator registers; its exponentials are rounded to 16 bits and reused in place as the A operand of
// P·V (the m16n8 C layout of two adjacent key columns is exactly the m16k16 A layout), so P never touches memory.
// Each warp owns MT m16 row tiles: every K/V fragment read from shared memory feeds MT MMAs. With one row tile a
// warp does 16 FLOP per shared byte, which caps mma.sync on Hopper below the tensor cores' rate; two halve the
// shared traffic per FLOP (FA2's 128-row blocks with 4 warps do the same).
//
// Shared memory rows are HD 16-bit values; 16-byte chunk c of row r lives at chunk c ^ (r & 7), so the 8 row
// addresses of one ldmatrix (same logical chunk, 8 consecutive rows) fall in 8 different bank groups.
//
// Causality: the query tile [r0, r1) needs keys [0, p0 + r1); only tiles that reach past p0 + (the warp's first
// row) apply the mask, and a warp skips the tiles that lie wholly after its last row. Blocks run the longest
// query tiles first (blockIdx.y counts from the last tile), and the heads of one GQA group are adjacent in
// blockIdx.x, so they stream the same K/V through L2 at about the same time.
#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/attn_prefill_variants.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr float kLog2e = 1.4426950408889634f;

struct PrefillParams {
  const float* q;  // [t, ld_q]
  int64_t ld_q;
  const void* k;  // this slot's and... the cache base of slot `seq`: [n_kv, n_ctx, HD]
  const void* v;
  int64_t n_ctx;
  int group;  // query heads per kv head
  int p0;
  int t;
  float* out;    // [t, ld_out] f32, or nullptr when out16 is written instead
  void* out16;   // [t, ld_out] bf16 (out16_bf16) or f16: o's matmul_x16 input, rounded once at the store
  bool out16_bf16;
  int64_t ld_out;
  float scale_log2;  // scale * log2(e): the softmax runs in base 2 (ex2 is one MUFU instruction)
  int window;        // KvCacheView::window: > 0, row at position q attends to keys (q - window, q] only
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without registers; src_bytes 0 writes zeros (keys past the valid range must be finite:
// a masked P of 0 times a NaN V would still poison the row).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a · b for one m16n8k16 tile, f32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> two 16-bit values in one word (lo in the low half, as the MMA fragments expect).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return pack16x2(lo, hi, std::is_same_v<T, __nv_bfloat16>);
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Offset (in elements) of 16-byte chunk c of row r in a swizzled tile of rows of HD elements.
template <int HD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * HD + ((c ^ (r & 7)) << 3);
}

// MT: m16 row tiles per warp (block rows BM = 4 warps * 16 * MT); BN: keys per tile; QREGS: the Q fragments are
// loaded into registers once (when they fit in 32 registers) instead of re-read from shared memory per key tile.
// kWindow: the sliding window (p.window) masks keys too; its own instantiation, launched at the one-row-tile shape
// only: the window bounds cost registers that the two-row-tile shapes at HD 128 do not have (they spill).
template <typename T, int HD, int MT, int BN, bool kWindow>
__global__ void __launch_bounds__(kThreads) attn_prefill_kernel(const PrefillParams p) {
  constexpr int BM = kWarps * 16 * MT;
  constexpr int CH = HD / 8;   // 16-byte chunks per row
  constexpr int KS = HD / 16;  // k16 steps over the head dimension
  constexpr bool QREGS = MT * KS * 4 <= 32;
  static_assert(HD % 32 == 0 && BN % 16 == 0);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);  // [BM, HD]
  T* skv = sq + BM * HD;                   // [2 stages][K, V][BN, HD]

  const int tid = threadIdx.x, lane = tid & (kWarp - 1), warp = tid / kWarp;
  const int head = blockIdx.x;
  const int r0 = (gridDim.y - 1 - blockIdx.y) * BM;
  const int r1 = min(r0 + BM, p.t);
  const int kvh = head / p.group;
  const T* kg = static_cast<const T*>(p.k) + static_cast<size_t>(kvh) * p.n_ctx * HD;
  const T* vg = static_cast<const T*>(p.v) + static_cast<size_t>(kvh) * p.n_ctx * HD;
  const int kv_len = p.p0 + r1;
  const int n_tiles = (kv_len + BN - 1) / BN;

  // A thread copies the same chunk column of rows ld_row, ld_row + 128 / CH, ...: at HD 64 and 128 the row step is a
  // multiple of 8, so the swizzled offset is one base plus constants; at HD 256 (4 rows per step) it alternates
  // between two bases.
  constexpr int kRowStep = kThreads / CH;
  static_assert(kThreads % CH == 0 && (kRowStep % 8 == 0 || kRowStep == 4));
  const int ld_row = tid / CH, ld_c = tid % CH;
  const uint32_t s_kv = smem_addr(skv);
  const uint32_t ld_dst0 = s_kv + 2 * swz<HD>(ld_row, ld_c);
  const uint32_t ld_dst1 = s_kv + 2 * (swz<HD>(ld_row + 4, ld_c) - 4 * HD);  // odd steps when the step is 4 rows
  auto load_tile = [&](int j, int stage) {
#pragma unroll
    for (int i = 0; i < BN * CH / kThreads; ++i) {
      const uint32_t dst = ((kRowStep % 8 == 0 || i % 2 == 0) ? ld_dst0 : ld_dst1) + stage * (4 * BN * HD);  // bytes
      const int row = ld_row + i * kRowStep;
      const int key = j * BN + row;
      const int bytes = key < kv_len ? 16 : 0;
      const size_t off = static_cast<size_t>(min(key, kv_len - 1)) * HD + ld_c * 8;
      cp_async16(dst + 2 * (i * kRowStep * HD), kg + off, bytes);
      cp_async16(dst + 2 * (BN * HD + i * kRowStep * HD), vg + off, bytes);
    }
    cp_async_commit();
  };

  load_tile(0, 0);

  // Q: f32 -> 16-bit (unscaled: the scale is applied to S in f32) into shared memory; rows past t are zeros.
  for (int idx = tid; idx < BM * CH; idx += kThreads) {
    const int row = idx / CH, c = idx % CH;
    uint4 w = make_uint4(0, 0, 0, 0);
    if (r0 + row < p.t) {
      const float4* src =
          reinterpret_cast<const float4*>(p.q + static_cast<size_t>(r0 + row) * p.ld_q + head * HD + c * 8);
      const float4 a = __ldg(src), b = __ldg(src + 1);
      w = make_uint4(pack2<T>(a.x, a.y), pack2<T>(a.z, a.w), pack2<T>(b.x, b.y), pack2<T>(b.z, b.w));
    }
    *reinterpret_cast<uint4*>(sq + swz<HD>(row, c)) = w;
  }
  __syncthreads();

  const int g = lane >> 2, c4 = lane & 3;   // fragment row group and column pair
  const int lq = lane >> 3, lr = lane & 7;  // ldmatrix: which 8x8 matrix this lane addresses, and which row of it
  const int wrow = warp * 16 * MT;          // the warp's first row within the block
  const int w_first = p.p0 + r0 + wrow;     // its first and last query positions
  const int w_last = w_first + 16 * MT - 1;
  const bool warp_active = r0 + wrow < p.t;

  // ldmatrix byte offsets. Every fragment row this lane addresses is lr modulo 8, so the swizzle XORs the chunk with
  // lr; the chunk's bits above those the XOR touches add. Precomputing the few per-lane XOR patterns keeps the
  // compiler from hoisting one address register per (tile, step) pair out of the key loop (it did: 238-254
  // registers and spills).
  //   K (row nt*8 + lr, chunk 4 ks2 + lq):           k_off[ks2 & 1] + nt * 16 HD + (ks2 >> 1) * 128
  //   Q (row wrow + mt*16 + (lq&1)*8 + lr, chunk 2 ks + (lq>>1)): q_off[ks & 3] + mt * 32 HD + (ks >> 2) * 128
  //   V (row kk*16 + (lq&1)*8 + lr, chunk 2 nt2 + (lq>>1)):       v_off[nt2 & 3] + kk * 32 HD + (nt2 >> 2) * 128
  const int kx = lq ^ lr, hx = (lq >> 1) ^ lr;
  const uint32_t k_off0 = 2 * (lr * HD + kx * 8), k_off1 = 2 * (lr * HD + (kx ^ 4) * 8);
  const uint32_t q_row = smem_addr(sq) + 2 * (wrow + (lq & 1) * 8 + lr) * HD;
  const uint32_t v_row = 2 * (BN * HD + ((lq & 1) * 8 + lr) * HD);
  uint32_t q_off[4], v_off[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    q_off[u] = q_row + 16 * ((2 * u) ^ hx);
    v_off[u] = v_row + 16 * ((2 * u) ^ hx);
  }
  auto q_addr = [&](int mt, int ks) {
    const int u = ks & 3;  // a select chain, not a run-time index into a register array (that would go to local memory)
    const uint32_t b = u == 0 ? q_off[0] : u == 1 ? q_off[1] : u == 2 ? q_off[2] : q_off[3];
    return b + mt * 32 * HD + (ks >> 2) * 128;
  };

  uint32_t qreg[QREGS ? MT : 1][QREGS ? KS : 1][4];
  if constexpr (QREGS) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) ldmatrix_x4(qreg[mt][ks], q_addr(mt, ks));
  }

  float o[MT][HD / 8][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }

  for (int j = 0; j < n_tiles; ++j) {
    if (j + 1 < n_tiles) {
      load_tile(j + 1, (j + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    // A tile wholly below every row's sliding window (its last key <= w_first - window) holds no key of this warp.
    if (warp_active && j * BN <= w_last && (!kWindow || (j + 1) * BN - 1 > w_first - p.window)) {
      const uint32_t s_stage = s_kv + (j & 1) * (4 * BN * HD);

      // S = Q · Kᵀ  [16 MT, BN] per warp.
      float s[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
          // With Q in shared memory the k loop stays rolled: unrolled, the compiler hoists every Q fragment load ahead
          // (64 more live registers at MT 2, HD 128) and spills.
#pragma unroll(QREGS ? KS / 2 : 1)
      for (int ks2 = 0; ks2 < KS / 2; ++ks2) {
        uint32_t qa[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if constexpr (QREGS) {
#pragma unroll
              for (int i = 0; i < 4; ++i) qa[mt][e][i] = qreg[mt][2 * ks2 + e][i];
            } else {
              ldmatrix_x4(qa[mt][e], q_addr(mt, 2 * ks2 + e));
            }
          }
        const uint32_t k_addr = s_stage + ((ks2 & 1) ? k_off1 : k_off0) + (ks2 >> 1) * 128;
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
          uint32_t b[4];  // [k-step 2 ks2: lo, hi][k-step 2 ks2 + 1: lo, hi]
          ldmatrix_x4(b, k_addr + nt * 16 * HD);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(s[mt][nt], qa[mt][0], b[0], b[1]);
            mma_16816<T>(s[mt][nt], qa[mt][1], b[2], b[3]);
          }
        }
      }

      // Online softmax in base 2. A thread holds rows g and g + 8 of each row tile; the 4 threads of a quad share
      // a row, so row reductions are two shuffles.
      const bool masked = (j + 1) * BN - 1 > w_first || (kWindow && j * BN <= w_last - p.window);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int qpos = w_first + mt * 16 + g + 8 * hf;
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float x = s[mt][nt][2 * hf + e] * p.scale_log2;
              const int key = j * BN + nt * 8 + 2 * c4 + e;
              if (masked && (key > qpos || (kWindow && key <= qpos - p.window))) x = -INFINITY;
              s[mt][nt][2 * hf + e] = x;
              mx = fmaxf(mx, x);
            }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mt][hf], mx);
          const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing yet: no inf - inf
          const float alpha = ex2(m[mt][hf] - m_use);
          m[mt][hf] = m_new;
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pe = ex2(s[mt][nt][2 * hf + e] - m_use);
              s[mt][nt][2 * hf + e] = pe;
              sum += pe;
            }
          l[mt][hf] = l[mt][hf] * alpha + sum;  // this thread's columns only; the quad sums at the end
#pragma unroll
          for (int nt = 0; nt < HD / 8; ++nt) o[mt][nt][2 * hf] *= alpha, o[mt][nt][2 * hf + 1] *= alpha;
        }

        // O += P · V  [16 MT, HD] per warp; V fragments via ldmatrix.trans (V is [key, HD] in shared memory).
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int nt2 = 0; nt2 < HD / 16; ++nt2) {
          uint32_t b[4];  // [HD tile 2 nt2: lo, hi][HD tile 2 nt2 + 1: lo, hi]
          ldmatrix_x4_trans(b, s_stage + v_off[nt2 & 3] + kk * 32 * HD + (nt2 >> 2) * 128);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(o[mt][2 * nt2], pa[mt], b[0], b[1]);
            mma_16816<T>(o[mt][2 * nt2 + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // the next iteration's load overwrites this stage
  }

  if (!warp_active) return;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[mt][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = 1.0f / sum;
      const int row = r0 + wrow + mt * 16 + g + 8 * hf;
      if (row >= p.t) continue;
      const size_t at = static_cast<size_t>(row) * p.ld_out + head * HD + 2 * c4;
      if (p.out16 != nullptr) {
        uint32_t* dst = reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.out16) + at);
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt)
          dst[nt * 4] = pack16x2(o[mt][nt][2 * hf] * inv, o[mt][nt][2 * hf + 1] * inv, p.out16_bf16);
      } else {
        float* dst = p.out + at;
#pragma unroll
        for (int nt = 0; nt < HD / 8; ++nt)
          *reinterpret_cast<float2*>(dst + nt * 8) =
              make_float2(o[mt][nt][2 * hf] * inv, o[mt][nt][2 * hf + 1] * inv);
      }
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// f32 cache (opt-in, for f32 models whose point is precision): the MMAs above need 16-bit operands, so this path runs
// on FFMA in f32 throughout. A block owns kF32Rows query rows of one head; 4 lanes share a row, lane quarter c
// holding float4 chunks c, c + 4, ... of the head (the 4 lanes of a row read 64 consecutive bytes of a shared K or V
// row and the warp's 8 rows read the same ones: broadcast, no bank conflicts). A tile's scores stay in registers;
// the online softmax runs in base 2 as above but with exp2f (the accurate one). KEYS keys per tile: 32, or 16 at head
// size 256, where q and the accumulator take 128 registers and a 32-key tile's scores would spill (and 32 keys of
// K and V in f32 would be 64 KB of static shared memory).
constexpr int kF32Rows = kThreads / 4;

template <int HD, int KEYS>
__global__ void __launch_bounds__(kThreads) attn_prefill_f32_kernel(const PrefillParams p) {
  constexpr int C4 = HD / 4;   // float4 chunks per row
  constexpr int NV = HD / 16;  // chunks per lane
  constexpr int kF32Keys = KEYS;
  __shared__ float4 s_k[kF32Keys][C4];
  __shared__ float4 s_v[kF32Keys][C4];
  const int head = blockIdx.x, kvh = head / p.group;
  const int r0 = static_cast<int>(gridDim.y - 1 - blockIdx.y) * kF32Rows;  // the longest rows first
  const int row = r0 + static_cast<int>(threadIdx.x) / 4, quarter = static_cast<int>(threadIdx.x) % 4;
  const int qrow = min(row, p.t - 1);  // rows past t compute a copy of the last row and store nothing
  const int last_key = p.p0 + qrow;    // this row attends to keys [0, last_key]
  const int kend = p.p0 + min(r0 + kF32Rows, p.t);
  const float4* kc = static_cast<const float4*>(p.k) + static_cast<size_t>(kvh) * p.n_ctx * C4;
  const float4* vc = static_cast<const float4*>(p.v) + static_cast<size_t>(kvh) * p.n_ctx * C4;

  float4 q[NV], acc[NV];
  const float4* qp = reinterpret_cast<const float4*>(p.q + static_cast<size_t>(qrow) * p.ld_q + head * HD);
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const float4 x = qp[quarter + 4 * i];
    const float s = p.scale_log2;
    q[i] = make_float4(x.x * s, x.y * s, x.z * s, x.w * s);
    acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float m = -INFINITY, l = 0.0f;
  for (int k0 = 0; k0 < kend; k0 += kF32Keys) {
    __syncthreads();  // the previous tile is consumed
    for (int i = threadIdx.x; i < kF32Keys * C4; i += kThreads) {
      const int j = i / C4, c = i % C4;
      const int key = k0 + j;
      // Keys past kend are zeros, not whatever the cache holds: a masked weight of 0 times a NaN would poison a row.
      const bool in = key < kend;
      s_k[j][c] = in ? kc[static_cast<size_t>(key) * C4 + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      s_v[j][c] = in ? vc[static_cast<size_t>(key) * C4 + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __syncthreads();
    float s[kF32Keys];
    float mt = m;
#pragma unroll
    for (int j = 0; j < kF32Keys; ++j) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const float4 kk = s_k[j][quarter + 4 * i];
        dot = fmaf(q[i].x, kk.x, dot), dot = fmaf(q[i].y, kk.y, dot);
        dot = fmaf(q[i].z, kk.z, dot), dot = fmaf(q[i].w, kk.w, dot);
      }
      dot += __shfl_xor_sync(0xffffffffu, dot, 1);
      dot += __shfl_xor_sync(0xffffffffu, dot, 2);
      s[j] = k0 + j <= last_key && (p.window <= 0 || k0 + j > last_key - p.window) ? dot : -INFINITY;
      mt = fmaxf(mt, s[j]);
    }
    // Without a window key 0 is in every row's range, so mt is finite from the first tile on; with one, tiles below
    // the row's window leave mt at -inf (then every weight is 0, not exp2(-inf - -inf) = NaN).
    const float corr = m == -INFINITY ? 0.0f : exp2f(m - mt);
    l *= corr;
#pragma unroll
    for (int i = 0; i < NV; ++i) acc[i].x *= corr, acc[i].y *= corr, acc[i].z *= corr, acc[i].w *= corr;
#pragma unroll
    for (int j = 0; j < kF32Keys; ++j) {
      const float e = mt == -INFINITY ? 0.0f : exp2f(s[j] - mt);  // 0 for masked keys
      l += e;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const float4 vv = s_v[j][quarter + 4 * i];
        acc[i].x = fmaf(e, vv.x, acc[i].x), acc[i].y = fmaf(e, vv.y, acc[i].y);
        acc[i].z = fmaf(e, vv.z, acc[i].z), acc[i].w = fmaf(e, vv.w, acc[i].w);
      }
    }
    m = mt;
  }
  if (row >= p.t) return;
  const float inv = 1.0f / l;
  const size_t at = static_cast<size_t>(row) * p.ld_out + head * HD;
  if (p.out16 != nullptr) {
    uint2* dst = reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out16) + at);
#pragma unroll
    for (int i = 0; i < NV; ++i)
      dst[quarter + 4 * i] = make_uint2(pack16x2(acc[i].x * inv, acc[i].y * inv, p.out16_bf16),
                                        pack16x2(acc[i].z * inv, acc[i].w * inv, p.out16_bf16));
    return;
  }
  float4* dst = reinterpret_cast<float4*>(p.out + at);
#pragma unroll
  for (int i = 0; i < NV; ++i)
    dst[quarter + 4 * i] = make_float4(acc[i].x * inv, acc[i].y * inv, acc[i].z * inv, acc[i].w * inv);
}

template <int HD>
void launch_prefill_f32(const PrefillParams& p, int n_head, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>((p.t + kF32Rows - 1) / kF32Rows));
  attn_prefill_f32_kernel<HD, HD == 256 ? 16 : 32><<<grid, kThreads, 0, stream>>>(p);
  TESSERA_CUDA_CHECK_LAUNCH("attn_prefill_f32_kernel");
}

struct Shape {
  int mt, bn;
};
// Per head size (ptxas, sm_90a): at HD 128, two row tiles with 64-key tiles need 255 registers and spill, so the
// two-row-tile shapes there use 32 or 48 keys per tile.
constexpr int kNumShapes = 3;
constexpr Shape kShapes64[kNumShapes] = {{1, 64}, {2, 64}, {2, 32}};
constexpr Shape kShapes128[kNumShapes] = {{1, 64}, {2, 32}, {2, 48}};
// At HD 256 the output alone is 128 registers per thread at one row tile: one row tile, 32 or 16 keys per tile.
constexpr Shape kShapes256[kNumShapes] = {{1, 32}, {1, 16}, {1, 32}};
constexpr Shape shape_of(int hd, int variant) {
  return hd == 64 ? kShapes64[variant] : hd == 128 ? kShapes128[variant] : kShapes256[variant];
}

template <typename T, int HD, int MT, int BN, bool kWindow = false>
void launch_prefill(const PrefillParams& p, int n_head, cudaStream_t stream) {
  constexpr int BM = kWarps * 16 * MT;
  constexpr int smem = (BM + 4 * BN) * HD * static_cast<int>(sizeof(T));
  // Over 48 KB of dynamic shared memory needs an opt-in per kernel; once per process (one device per process).
  static const bool opted_in = [] {
    TESSERA_CUDA_CHECK(
        cudaFuncSetAttribute(attn_prefill_kernel<T, HD, MT, BN, kWindow>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem));
    return true;
  }();
  (void)opted_in;
  const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>((p.t + BM - 1) / BM));
  attn_prefill_kernel<T, HD, MT, BN, kWindow><<<grid, kThreads, smem, stream>>>(p);
  TESSERA_CUDA_CHECK_LAUNCH("attn_prefill_kernel");
}

template <typename T, int HD>
void launch_shape(int variant, const PrefillParams& p, int n_head, cudaStream_t stream) {
  // A sliding window: the windowed kernel at shape 0 whatever the variant (see attn_prefill_kernel).
  if (p.window > 0) return launch_prefill<T, HD, shape_of(HD, 0).mt, shape_of(HD, 0).bn, true>(p, n_head, stream);
  switch (variant) {
    case 0:
      return launch_prefill<T, HD, shape_of(HD, 0).mt, shape_of(HD, 0).bn>(p, n_head, stream);
    case 1:
      return launch_prefill<T, HD, shape_of(HD, 1).mt, shape_of(HD, 1).bn>(p, n_head, stream);
    default:
      return launch_prefill<T, HD, shape_of(HD, 2).mt, shape_of(HD, 2).bn>(p, n_head, stream);
  }
}

}  // namespace

int attn_prefill_variant_count() { return kNumShapes; }

std::string attn_prefill_variant_name(int variant, int64_t hd) {
  const Shape s = shape_of(hd == 64 || hd == 128 ? static_cast<int>(hd) : 256, std::clamp(variant, 0, kNumShapes - 1));
  const bool qregs = s.mt * (hd / 16) * 4 <= 32;
  return "m" + num(kWarps * 16 * s.mt) + " n" + num(s.bn) + (qregs ? " q:regs" : " q:smem");
}

int attn_prefill_default_variant(int64_t hd, int64_t n_head, int64_t t) {
  // 128-row blocks do the most work per shared-memory byte, but a grid of fewer than two of them per SM leaves SMs
  // idle behind the long diagonal tiles (SmolLM2's 9 heads at 2k: 144 blocks, 106 TFLOP/s vs 115 with 64-row ones).
  const bool big_grid = n_head * ((t + 127) / 128) >= 2 * sm_count();
  if (!big_grid || hd == 256) return 0;
  return hd == 64 ? 1 : 2;
}

void attn_prefill_variant(int variant, const float* q, int64_t ld_q, const KvCacheView& c, int64_t seq, int64_t p0,
                          int64_t t, float* out, int64_t n_head, float scale, cudaStream_t stream, void* out16,
                          DType out16_type) {
  const std::string o = "attn_prefill";
  TESSERA_CUDA_REQUIRE(variant >= 0 && variant < kNumShapes, o + ": launch shape " + num(variant) + " does not exist");
  TESSERA_CUDA_REQUIRE(q && c.k && c.v, o + ": a pointer argument (q or the KV cache) is null");
  TESSERA_CUDA_REQUIRE((out == nullptr) != (out16 == nullptr), o + ": exactly one of out and out16 must be given");
  TESSERA_CUDA_REQUIRE(out16 == nullptr || out16_type == DType::BF16 || out16_type == DType::F16,
                       o + ": the 16-bit output must be bf16 or f16");
  TESSERA_CUDA_REQUIRE(c.dtype == DType::F16 || c.dtype == DType::BF16 || c.dtype == DType::F32,
                       o + ": the KV cache must be f16, bf16 or f32");
  TESSERA_CUDA_REQUIRE(c.hd == 64 || c.hd == 128 || c.hd == 256,
                       o + ": head size " + num(c.hd) + " is not 64, 128 or 256");
  TESSERA_CUDA_REQUIRE(c.n_kv > 0 && n_head > 0 && n_head % c.n_kv == 0 && n_head < 65536,
                       o + ": " + num(n_head) + " query heads do not divide into " + num(c.n_kv) + " kv heads");
  TESSERA_CUDA_REQUIRE(c.n_seq > 0 && seq >= 0 && seq < c.n_seq,
                       o + ": sequence slot " + num(seq) + " is outside the cache's " + num(c.n_seq) + " slots");
  TESSERA_CUDA_REQUIRE(c.n_ctx > 0 && c.n_ctx < (int64_t{1} << 30),
                       o + ": context size " + num(c.n_ctx) + " is outside 1..2^30");
  TESSERA_CUDA_REQUIRE(
      p0 >= 0 && t >= 0 && p0 + t <= c.n_ctx,
      o + ": positions " + num(p0) + " + " + num(t) + " rows exceed the cache's " + num(c.n_ctx) + " positions");
  TESSERA_CUDA_REQUIRE(t <= 65535 * 64, o + ": " + num(t) + " rows are more than one launch's grid holds (4194240)");
  TESSERA_CUDA_REQUIRE(c.dtype != DType::F32 || t <= 65535 * kF32Rows,
                       o + ": " + num(t) + " rows are more than one launch's grid holds with an f32 cache (2097120)");
  TESSERA_CUDA_REQUIRE(ld_q >= n_head * c.hd && ld_q % 4 == 0 && aligned16(q),
                       o + ": q must be 16-byte aligned with a row stride that is a multiple of 4 and >= n_head * hd");
  TESSERA_CUDA_REQUIRE(aligned16(out) && aligned16(out16) && aligned16(c.k) && aligned16(c.v),
                       o + ": out and the KV cache must be 16-byte aligned");
  if (t == 0) return;
  PrefillParams p{};
  p.q = q;
  p.ld_q = ld_q;
  const size_t elem = c.dtype == DType::F32 ? 4 : 2;
  const size_t slot = static_cast<size_t>(seq) * static_cast<size_t>(c.seq_stride()) * elem;  // bytes
  p.k = static_cast<const unsigned char*>(c.k) + slot;
  p.v = static_cast<const unsigned char*>(c.v) + slot;
  p.n_ctx = c.n_ctx;
  p.group = static_cast<int>(n_head / c.n_kv);
  p.p0 = static_cast<int>(p0);
  p.t = static_cast<int>(t);
  p.out = out;
  p.out16 = out16;
  p.out16_bf16 = out16_type == DType::BF16;
  p.ld_out = n_head * c.hd;
  p.window = static_cast<int>(std::min<int64_t>(c.window, INT32_MAX));
  p.scale_log2 = scale * kLog2e;
  const int nh = static_cast<int>(n_head);
  if (c.dtype == DType::F32) {  // one launch shape: `variant` selects among the 16-bit kernel's shapes only
    if (c.hd == 64) return launch_prefill_f32<64>(p, nh, stream);
    if (c.hd == 128) return launch_prefill_f32<128>(p, nh, stream);
    return launch_prefill_f32<256>(p, nh, stream);
  }
  if (c.dtype == DType::F16) {
    if (c.hd == 64) return launch_shape<__half, 64>(variant, p, nh, stream);
    if (c.hd == 128) return launch_shape<__half, 128>(variant, p, nh, stream);
    return launch_shape<__half, 256>(variant, p, nh, stream);
  }
  if (c.hd == 64) return launch_shape<__nv_bfloat16, 64>(variant, p, nh, stream);
  if (c.hd == 128) return launch_shape<__nv_bfloat16, 128>(variant, p, nh, stream);
  return launch_shape<__nv_bfloat16, 256>(variant, p, nh, stream);
}

}  // namespace detail

void attn_prefill(const float* q, int64_t ld_q, const KvCacheView& cache, int64_t seq, int64_t p0, int64_t t,
                  float* out, int64_t n_head, float scale, cudaStream_t stream, void* out16, DType out16_type) {
  detail::attn_prefill_variant(detail::attn_prefill_default_variant(cache.hd, n_head, t), q, ld_q, cache, seq, p0, t,
                               out, n_head, scale, stream, out16, out16_type);
}

}  // namespace tessera::cuda
