// TEAL's sparse bf16 GEMV (issue 23: <= 22 us at 50% activation sparsity at Llama-3-8B's 4096->14336 and
// 14336->4096, batch 1, L2 flushed before each call, median of 200; <= 62% of our dense time at 40%). src's
// channel-major form (gemv_sparse_cols.cu) streams ~1.8 TB/s on the bytes it reads (33.1 / 36.8 us at 50%); the
// issue's 22 us needs ~2.7 TB/s. Written without a GPU for the next device session. In one run, for random bf16
// weights at both shapes, sparsity 40% and 50% (random x, the smallest magnitudes dropped: random positions), and two
// modes, "zero" (the kernel reads x with the dropped share zeroed and threshold 0: --sparsity after SPARSIFY) and
// "thr" (the untouched x and the calibrated threshold t, |x| <= t -> 0; the kernel builds its own list: --teal), it
// times with bench_sparse.cpp's method (a memset of 2x L2 before each call, each call between its own pair of events,
// median of the reps):
//   - src's dense bf16 GEMV (gemv(), default launch shape) on the zeroed x;
//   - src's sparse GEMVs: gemv_sparse_x (channel-major, default splits and shape; both modes) and gemv_sparse (the
//     64-row-tile list walk; its list built by sparsify before timing, not timed);
//   - the sweep's kernel (sx_kernel below) at a set of layouts and launch shapes per shape:
//       (a) "own": a block owns a stripe of R output rows and walks the whole surviving-channel list, so no block
//           needs another's partial sums (no workspace, no ticket, no atomics); stripes sized so one wave covers N
//           (R = 112 at N = 14336: 128 blocks; R = 32 at N = 4096: 128 blocks; the halves for two blocks per SM);
//           layout "tiled" ([N / tile][K][tile]: one block's reads stay inside its own contiguous region) or "cm"
//           (src's channel-major [K][N]: the blocks of one channel read adjacent pieces of one column); "pre<KB>": the
//           block first asks L2 for the first KB of its region (one bulk prefetch, before x is read: DRAM would idle
//           while the list is built; half of those bytes are wasted at 50%); "nf": no forced one-block-per-SM;
//       (a2) the same with K split in two and f32 red.global.add into y (two blocks per SM, half a list each);
//       (b) src's split form (1024- or 2048-row stripes of the channel-major copy, K in many slices) with f32
//           red.global.add in place of the last-block reduction and more bytes in flight per thread;
//       (c) "cl": the split form without atomics: the K slices of a stripe are one thread-block cluster (2-8 blocks)
//           and their sums meet in rank 0's shared memory (distributed shared memory), rank 0 stores y in rank
//           order; used for one wave of 128 blocks with 2-8x longer runs per channel (448-1792 bytes at N = 14336,
//           128-512 at N = 4096), or two blocks per SM on the tiled copy.
//     Names: "<form> <layout> R<rows per block> t<threads>u<16-byte loads per group>[v2: two per channel]<p: the
//     next group's loads issued before this group's FMAs | b: one group at a time>[-cl] s<slices of K>".
//     Every block builds its list in shared memory from x first (one contiguous run of x per thread, one block-wide
//     scan: ascending channel order, so the store forms' sums have a fixed order), then U 16-byte loads (or 2U with
//     VEC 2) per thread in flight per group, optionally software-pipelined (the next group's loads issued before this
//     group's FMAs), weights through ld_stream16 (no L1 allocation). The atomic forms (own2, split) need y zeroed:
//     their time includes a cudaMemsetAsync of y, and the kernel alone (what a residual-accumulating GEMV, the down
//     projection, would pay) is in the TSV (alone_us) and in [brackets] in the summary. A form whose blocks fit one
//     wave asks for more than half an SM's shared memory, so each block gets an SM to itself.
// Every variant is first checked against a double reference over the kept channels (|y - ref| <= 5e-5 sum|w x| +
// 1e-6 per row: f32 accumulation of bf16 products; one missing channel is ~4e-4 of that sum); a failing one prints
// FAIL and is not timed.
//
// Graph timing (twenty-fourth session; `copies` > 0): each op also runs as one CUDA graph of `copies` back-to-back
// calls, call i on its own copy of the weights (each larger than the L2), as a decode step runs its GEMVs; reported per
// call in {braces}, with its ratio to the dense GEMV timed the same way. The flushed method charges every call a cold
// start (a contiguous read of the 58.7 MB a 50% walk reads takes 27.5 us flushed, 21.3 in a graph:
// exp_gather_ceiling), so the graph timing is the one that predicts decode.
// Shapes (argv[3], indices into all_shapes; default "01"): 0 4096->14336, 1 14336->4096, 2 q|k|v 4096->6144, 3 o
// 4096x4096, 4 gate|up 4096->28672. The "own" and "cl" forms became src's stripe form (gemv_sparse_cols.cu).
//
// Build here (no GPU needed): target exp_gemv_sparse_sweep. Run on the GPU machine (~30 s for two shapes; writes
// $OUT/sparse_sweep.tsv when OUT is set):
//   build-gpu/bin/experiments/exp_gemv_sparse_sweep [reps, default 200] [copies, default 0] [shapes, default 01]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_common.cuh"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "backends/cuda/kernels/gemv_sparse_kernel.cuh"
#include "backends/cuda/memory.h"
#include "exp_common.cuh"
#include "quant/half.h"

namespace tessera::cuda::detail {

struct SxArgs {
  int n;        // output rows
  int k;        // input channels (a multiple of 4, at most 65536: list indices are 16-bit)
  int g;        // threads per channel run: the block's rows R = g * 8 * VEC
  int splits;   // slices of k (blockIdx.y); > 1 only with `atomic` or the cluster form
  int tile;     // the layout's tile rows (a multiple of R): data[t][c][r] = W[t * tile + r][c]
  int cap;      // list capacity in entries (a multiple of 4): the longest slice
  int red_off;  // CL: byte offset of rank 0's [splits][R] float slots for the cluster's sums in dynamic shared memory
  int pre;      // bytes of the block's region asked of L2 before x is read (R == tile, one slice: the region is
                // contiguous); at 50% half of them are wasted, but DRAM would idle while the list is built
  bool atomic;  // y[row] += the block's sums with red.global.add (y zeroed or holding the residual), else stored
  bool accumulate;  // stored form: y += instead of y =
};

__device__ __forceinline__ void sx_prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// Block (stripe blockIdx.x, slice blockIdx.y): rows [stripe * R, + R) over the kept channels of the slice. Dynamic
// shared memory: the list (cap floats, then cap 16-bit channels), reused for the slots' partial sums at the end.
// CL: the blockIdx.y slices are one thread-block cluster (splits blocks, cluster dims (1, splits, 1)); each block puts
// its R sums into rank 0's shared memory (distributed shared memory) and rank 0 adds them in rank order and stores y:
// the split form without atomics, workspace or a memset of y.
template <int T, int U, int VEC, bool PIPE, bool CL>
__global__ void __launch_bounds__(T, 1)
    sx_kernel(const uint8_t* __restrict__ w /*[N / tile][K][tile] bf16*/, const float* __restrict__ x /*[K]*/,
              float threshold, float* __restrict__ y /*[N]*/, SxArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  float* s_val = reinterpret_cast<float*>(smem);
  uint16_t* s_idx = reinterpret_cast<uint16_t*>(smem + 4 * static_cast<size_t>(a.cap));
  __shared__ int s_scan[32];
  constexpr int RPT = 8 * VEC;  // rows per thread
  constexpr int kWarps = T / 32;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int R = a.g * RPT;
  const int row0 = static_cast<int>(blockIdx.x) * R;
  const int s = static_cast<int>(blockIdx.y);
  const int nq = a.k / 4;
  const int q0 = static_cast<int>(static_cast<long long>(nq) * s / a.splits);
  const int q1 = static_cast<int>(static_cast<long long>(nq) * (s + 1) / a.splits);
  if constexpr (CL) cluster_arrive_relaxed();  // this block runs: the others may store into it after their wait
  if (a.pre > 0 && tid == 0)                   // weights never depend on an earlier kernel
    bulk_prefetch_l2(w + static_cast<size_t>(blockIdx.x) * static_cast<size_t>(a.k) * a.tile * 2,
                     static_cast<size_t>(a.pre));
  pdl_wait();  // x is the previous kernel's output
  // ---- The list: thread t compacts float4s [qa, qb) of the slice (contiguous, in thread order), one block scan ----
  const int per = (q1 - q0 + T - 1) / T;
  const int qa = min(q0 + tid * per, q1), qb = min(qa + per, q1);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  // Every line of the thread's run requested at once (after the flush they come from DRAM: one round trip, not one
  // per unrolled batch of the loop below).
  if (qa < qb)
    for (uintptr_t l = reinterpret_cast<uintptr_t>(x4 + qa) & ~uintptr_t{127}; l < reinterpret_cast<uintptr_t>(x4 + qb);
         l += 128)
      sx_prefetch_l1(reinterpret_cast<const void*>(l));
  int cnt = 0;
#pragma unroll 4
  for (int q = qa; q < qb; ++q) {
    const float4 v = __ldg(x4 + q);
    cnt += sparse_keep(v.x, threshold) + sparse_keep(v.y, threshold) + sparse_keep(v.z, threshold) +
           sparse_keep(v.w, threshold);
  }
  int m = 0;
  int pos = block_scan_excl(cnt, &m, s_scan);
  for (int q = qa; q < qb; ++q) {  // x again, from L1
    const float4 v = __ldg(x4 + q);
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (sparse_keep(e[i], threshold)) {
        s_val[pos] = e[i];
        s_idx[pos] = static_cast<uint16_t>(4 * q + i);
        ++pos;
      }
  }
  __syncthreads();
  // ---- The walk: slot `slot` takes entries slot, slot + S, ...; its G threads read the channel's R * 2 bytes ----
  const int S = T / a.g;
  const int slot = tid / a.g, gi = tid - slot * a.g;
  const int tile = row0 / a.tile, r_in = row0 - tile * a.tile;
  const size_t chan = static_cast<size_t>(a.tile) * 2;
  const uint8_t* wb =
      w + static_cast<size_t>(tile) * static_cast<size_t>(a.k) * chan + static_cast<size_t>(r_in + gi * RPT) * 2;
  float acc[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) acc[r] = 0.0f;
  const int step = U * S;
  // A whole group (every entry j0 + u * S < m): unconditional loads, so they issue back to back (as conditional loads,
  // ptxas kept one in flight: 34 registers for 16 "in flight").
  auto load_full = [&](int j0, uint4(&v)[U][VEC], float(&xs)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * S;
      const int c = s_idx[j];
      xs[u] = s_val[j];
#pragma unroll
      for (int q = 0; q < VEC; ++q) v[u][q] = ld_stream16(wb + static_cast<size_t>(c) * chan + 16 * q);
    }
  };
  // The last, partial group: entries past m load nothing and add 0.
  auto load_tail = [&](int j0, uint4(&v)[U][VEC], float(&xs)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * S;
      const bool ok = j < m;
      const int c = ok ? s_idx[j] : 0;
      xs[u] = ok ? s_val[j] : 0.0f;
#pragma unroll
      for (int q = 0; q < VEC; ++q)
        v[u][q] = ok ? ld_stream16(wb + static_cast<size_t>(c) * chan + 16 * q) : make_uint4(0, 0, 0, 0);
    }
  };
  auto fma_group = [&](const uint4(&v)[U][VEC], const float(&xs)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int q = 0; q < VEC; ++q) {
        float f[8];
        FloatFmt<DType::BF16>::to_float(v[u][q], f);
#pragma unroll
        for (int r = 0; r < 8; ++r) acc[8 * q + r] = fmaf(f[r], xs[u], acc[8 * q + r]);
      }
  };
  const int span = (U - 1) * S;  // a group at j is whole when j + span < m
  int j = slot < S ? slot : m;   // threads past S * G only join the reduction
  if constexpr (PIPE) {
    // The next whole group's loads issued before this group's FMAs (as gemv_float_kernel.cuh).
    if (j + span < m) {
      uint4 cur[U][VEC];
      float xc[U];
      load_full(j, cur, xc);
      for (; j + step + span < m; j += step) {
        uint4 nxt[U][VEC];
        float xn[U];
        load_full(j + step, nxt, xn);
        fma_group(cur, xc);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          xc[u] = xn[u];
#pragma unroll
          for (int q = 0; q < VEC; ++q) cur[u][q] = nxt[u][q];
        }
      }
      fma_group(cur, xc);
      j += step;
    }
  } else {
    for (; j + span < m; j += step) {
      uint4 v[U][VEC];
      float xs[U];
      load_full(j, v, xs);
      fma_group(v, xs);
    }
  }
  if (j < m) {
    uint4 v[U][VEC];
    float xs[U];
    load_tail(j, v, xs);
    fma_group(v, xs);
  }
  // ---- The slots' sums in a fixed order ----
  __syncthreads();  // every list read done: the shared memory holds the partials now
  float* part = reinterpret_cast<float*>(smem);
  int nparts;
  if (32 % a.g == 0) {  // lanes l, l ^ g, l ^ 2g, ... of a warp hold the same rows: shuffles first (S * g == T here)
    for (int off = a.g; off < 32; off <<= 1)
#pragma unroll
      for (int r = 0; r < RPT; ++r) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    if (lane < a.g)
#pragma unroll
      for (int r = 0; r < RPT; ++r) part[warp * R + lane * RPT + r] = acc[r];
    nparts = kWarps;
  } else {
    if (slot < S)
#pragma unroll
      for (int r = 0; r < RPT; ++r) part[slot * R + gi * RPT + r] = acc[r];
    nparts = S;
  }
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem + a.red_off);  // CL: rank 0's slots
  unsigned rank = 0;
  if constexpr (CL) {
    rank = cluster_rank();
    cluster_wait_acquire();  // every block of the cluster runs (their arrive at the start)
  }
  for (int r = tid; r < R; r += T) {
    float sum = 0.0f;
    for (int p0 = 0; p0 < nparts; p0 += 8) {  // 8 shared loads in flight, added in part order
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = p0 + u < nparts ? part[(p0 + u) * R + r] : 0.0f;
#pragma unroll
      for (int u = 0; u < 8; ++u) sum += v[u];
    }
    const int row = row0 + r;
    if constexpr (CL) {
      store_cluster_f32(red + rank * R + r, 0, sum);
    } else if (row < a.n) {
      if (a.atomic)
        atomicAdd(y + row, sum);  // result unused: red.global.add.f32
      else
        y[row] = a.accumulate ? y[row] + sum : sum;
    }
  }
  if constexpr (CL) {
    cluster_arrive_release();  // the remote stores before rank 0's reads
    cluster_wait_acquire();
    if (rank == 0)
      for (int r = tid; r < R; r += T) {
        float sum = 0.0f;
        for (int i = 0; i < a.splits; ++i) sum += red[i * R + r];
        const int row = row0 + r;
        if (row < a.n) y[row] = a.accumulate ? y[row] + sum : sum;
      }
  }
}

// dst[t][c][r] = src[t * tile + r][c] (0 past n): made once at load in real use, so a plain gather (uncoalesced reads)
// is fine here.
__global__ void sx_repack(const uint16_t* __restrict__ src /*[n, k]*/, uint16_t* __restrict__ dst, int n, int k,
                          int tile, long long total) {
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(e % tile);
    const long long rest = e / tile;
    const int c = static_cast<int>(rest % k);
    const int t = static_cast<int>(rest / k);
    const long long row = static_cast<long long>(t) * tile + r;
    dst[e] = row < n ? src[row * k + c] : uint16_t{0};
  }
}

}  // namespace tessera::cuda::detail

namespace sxs {
using namespace tessera;
using namespace tessera::cuda;
using namespace tessera::cuda::detail;

using Kern = void (*)(const uint8_t*, const float*, float, float*, SxArgs);
struct Kind {
  const char* name;
  int threads, unroll, vec;
  bool pipe;
  bool cluster;  // the slices are one cluster (sums through distributed shared memory)
  Kern f;
};
template <int T, int U, int VEC, bool P, bool CL = false>
Kind kind(const char* name) {
  return {name, T, U, VEC, P, CL, sx_kernel<T, U, VEC, P, CL>};
}
// t<threads>u<loads in flight per group>[v2: two adjacent 16-byte loads per channel]p(ipelined)|b(atch).
const Kind kKinds[] = {kind<256, 8, 1, true>("t256u8p"),          kind<512, 8, 1, true>("t512u8p"),
                       kind<1024, 4, 1, true>("t1024u4p"),        kind<512, 16, 1, false>("t512u16b"),
                       kind<256, 16, 1, true>("t256u16p"),        kind<1024, 8, 1, false>("t1024u8b"),
                       kind<128, 8, 1, true>("t128u8p"),          kind<128, 8, 2, true>("t128u8v2p"),
                       kind<512, 8, 1, true, true>("t512u8p-cl"), kind<256, 8, 1, true, true>("t256u8p-cl")};
int kind_of(const char* name) {
  for (int i = 0; i < static_cast<int>(sizeof(kKinds) / sizeof(kKinds[0])); ++i)
    if (std::strcmp(kKinds[i].name, name) == 0) return i;
  std::fprintf(stderr, "no kind %s\n", name);
  std::exit(2);
}

struct Variant {
  const char* form;  // own (one slice), own2 and split (atomic slices), cl (a cluster's slices)
  bool tiled;        // the tiled copy, else the channel-major one
  int rows;          // R: output rows per block
  int splits;        // slices of k
  const char* kind;
  // One wave without the shared-memory request that keeps a second block off each SM (name suffix "nf"): whether the
  // carveout switch that request costs, or the scheduler's own placement, matters.
  bool no_force = false;
  int pre_kb = 0;  // SxArgs::pre in KB (name suffix "pre<KB>")
};

// Per shape, one wave each (132 SMs): 4096->14336 (N = 14336, tiled copy of 112-row tiles): own R112 128 blocks (one
// per SM), R56 256, cm R128 112; own2 256 (two per SM: kinds of <= 107 registers at 256 threads); split 140-518 (2-4
// per SM); cl 128 (R224-896 over 2-8 slices) or 256. (Registers: t128u8v2p 213, the t256/t512 kinds ~107, t1024 64.)
// 14336->4096 (N = 4096, 32-row tiles): own R32 128, R16 256; own2 256; split 128-256; cl 128 or 256.
const Variant kVarA[] = {{"own", true, 112, 1, "t256u8p"},
                         {"own", true, 112, 1, "t512u8p"},
                         {"own", true, 112, 1, "t1024u4p"},
                         {"own", true, 112, 1, "t512u16b"},
                         {"own", true, 112, 1, "t256u16p"},
                         {"own", true, 112, 1, "t1024u8b"},
                         {"own", true, 56, 1, "t256u8p"},
                         {"own", true, 56, 1, "t128u8p"},
                         {"own", false, 112, 1, "t512u8p"},
                         {"own", false, 112, 1, "t256u16p"},
                         {"own", false, 128, 1, "t512u8p"},
                         {"own2", true, 112, 2, "t256u8p"},
                         {"own2", true, 112, 2, "t128u8p"},
                         {"split", false, 1024, 19, "t128u8p"},
                         {"split", false, 1024, 10, "t256u8p"},
                         {"split", false, 2048, 37, "t128u8v2p"},
                         {"split", false, 1024, 37, "t128u8p"},
                         // (c) clusters: one wave of 128 blocks with 2-8x longer runs per channel (or 2 blocks per SM)
                         {"cl", false, 224, 2, "t512u8p-cl"},
                         {"cl", false, 448, 4, "t512u8p-cl"},
                         {"cl", false, 896, 8, "t512u8p-cl"},
                         {"cl", true, 112, 2, "t256u8p-cl"},
                         {"own", true, 112, 1, "t512u8p", true},
                         {"own", true, 112, 1, "t512u8p", false, 32},
                         {"own", true, 112, 1, "t512u8p", false, 64}};
const Variant kVarB[] = {{"own", true, 32, 1, "t256u8p"},           {"own", true, 32, 1, "t512u8p"},
                         {"own", true, 32, 1, "t1024u4p"},          {"own", true, 32, 1, "t512u16b"},
                         {"own", true, 32, 1, "t256u16p"},          {"own", true, 32, 1, "t1024u8b"},
                         {"own", true, 16, 1, "t256u8p"},           {"own", true, 16, 1, "t128u8p"},
                         {"own", false, 32, 1, "t512u8p"},          {"own", false, 32, 1, "t256u16p"},
                         {"own2", true, 32, 2, "t256u8p"},          {"own2", true, 32, 2, "t128u8p"},
                         {"split", false, 1024, 64, "t128u8p"},     {"split", false, 1024, 33, "t256u8p"},
                         {"split", false, 2048, 64, "t128u8v2p"},   {"split", false, 1024, 32, "t128u8p"},
                         {"cl", false, 64, 2, "t512u8p-cl"},        {"cl", false, 128, 4, "t512u8p-cl"},
                         {"cl", false, 256, 8, "t512u8p-cl"},       {"cl", true, 32, 2, "t256u8p-cl"},
                         {"own", true, 32, 1, "t512u8p", true},     {"own", true, 32, 1, "t512u8p", false, 16},
                         {"own", true, 32, 1, "t512u8p", false, 32}};

// The decoder's other stacks (twenty-fourth session): q|k|v 4096->6144, o 4096->4096, gate|up 4096->28672 (N = 6144,
// 4096, 28672; the tiled copy unused: 64-row tiles).
const Variant kVarQkv[] = {
    {"own", false, 48, 1, "t512u8p"},      {"own", false, 64, 1, "t512u8p"},     {"own", false, 48, 1, "t256u8p"},
    {"cl", false, 64, 2, "t512u8p-cl"},    {"cl", false, 96, 2, "t512u8p-cl"},   {"cl", false, 128, 4, "t512u8p-cl"},
    {"cl", false, 192, 4, "t512u8p-cl"},   {"cl", false, 384, 8, "t512u8p-cl"},  {"cl", false, 64, 4, "t256u8p-cl"},
    {"split", false, 1024, 22, "t128u8p"}, {"split", false, 1024, 22, "t256u8p"}};
const Variant kVarO[] = {
    {"own", false, 32, 1, "t512u8p"},    {"own", false, 32, 1, "t256u8p"},      {"cl", false, 64, 2, "t512u8p-cl"},
    {"cl", false, 128, 4, "t512u8p-cl"}, {"cl", false, 256, 8, "t512u8p-cl"},   {"cl", false, 32, 2, "t256u8p-cl"},
    {"cl", false, 64, 4, "t256u8p-cl"},  {"split", false, 1024, 33, "t256u8p"}, {"split", false, 1024, 33, "t128u8p"}};
const Variant kVarGu[] = {{"own", false, 256, 1, "t512u8p"},       {"own", false, 224, 1, "t512u8p"},
                          {"own", false, 128, 1, "t512u8p", true}, {"own", false, 256, 1, "t1024u4p"},
                          {"cl", false, 448, 2, "t512u8p-cl"},     {"cl", false, 512, 2, "t512u8p-cl"},
                          {"cl", false, 896, 4, "t512u8p-cl"},     {"cl", false, 256, 2, "t512u8p-cl"},
                          {"split", false, 1024, 5, "t256u8p"},    {"split", false, 1024, 10, "t128u8p"}};

// bench_sparse.cpp's method: median µs of op over reps calls, L2 flushed (a memset of 2x L2) before each, each call
// between its own pair of events.
using exp_common::FlushedTimer;
using exp_common::uniform;

struct Row {
  std::string shape, mode, name;
  int sp;
  double us, alone_us, gbps, ratio;
  double graph_us = 0;  // per call in a graph of `copies` calls on distinct weight copies (0: not measured)
};

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 200;
  // copies > 0: each op is also timed as a graph of `copies` back-to-back calls, call i on its own copy of the
  // weights (each larger than the L2), as a decode step runs its GEMVs; 0: the flushed timing only.
  const int copies = argc > 2 ? std::max(0, std::atoi(argv[2])) : 0;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy = exp_common::copy_gbps(st, e0, e1);
  std::printf("device %s (%d SMs, L2 %d MB), copy %.0f GB/s, %d calls per point, L2 flushed before each\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, copy, reps);
  // The opt-in limit counts the kernel's static shared memory too: what is left of it may be asked for dynamically.
  for (const Kind& kd : kKinds) {
    cudaFuncAttributes fa{};
    CK(cudaFuncGetAttributes(&fa, kd.f));
    CK(cudaFuncSetAttribute(kd.f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(prop.sharedMemPerBlockOptin - fa.sharedSizeBytes)));
  }
  FlushedTimer timer(st, reps, static_cast<size_t>(prop.l2CacheSize));
  const char* out = std::getenv("OUT");
  std::FILE* tsv = out ? std::fopen((std::string(out) + "/sparse_sweep.tsv").c_str(), "w") : nullptr;
  if (tsv)
    std::fprintf(tsv,
                 "shape\tsparsity\tmode\tvariant\tlayout\trows\tthreads\tunroll\tvec\tpipe\tsplits\tblocks\tus\talone_"
                 "us\tgbps\tratio_dense\tbad_rows\tmax_rel\n");
  struct Shape {
    int n, k, tile;
    const char* what;
    const Variant* vars;
    size_t nvars;
  };
  const Shape all_shapes[] = {{14336, 4096, 112, "4096->14336", kVarA, sizeof(kVarA) / sizeof(kVarA[0])},
                              {4096, 14336, 32, "14336->4096", kVarB, sizeof(kVarB) / sizeof(kVarB[0])},
                              {6144, 4096, 64, "4096->6144", kVarQkv, sizeof(kVarQkv) / sizeof(kVarQkv[0])},
                              {4096, 4096, 64, "4096->4096", kVarO, sizeof(kVarO) / sizeof(kVarO[0])},
                              {28672, 4096, 64, "4096->28672", kVarGu, sizeof(kVarGu) / sizeof(kVarGu[0])}};
  // argv[3]: which shapes (a string of indices into all_shapes, e.g. "234"; default "01", the first two).
  const std::string which = argc > 3 ? argv[3] : "01";
  std::vector<Shape> shapes;
  for (char c : which)
    if (c >= '0' && c < '0' + static_cast<int>(sizeof(all_shapes) / sizeof(all_shapes[0])))
      shapes.push_back(all_shapes[c - '0']);
  const float sparsities[] = {0.40f, 0.50f};
  int failures = 0;
  std::vector<Row> rows;
  uint64_t seed = 20261126;
  for (const Shape& sh : shapes) {
    const int n = sh.n, k = sh.k;
    // Random bf16 weights in [-0.05, 0.05) and x in [-1, 1).
    std::vector<uint16_t> hw(static_cast<size_t>(n) * k);
    for (auto& v : hw) v = f32_to_bf16(uniform(seed, -0.05f, 0.05f));
    std::vector<float> hx(static_cast<size_t>(k));
    for (auto& v : hx) v = uniform(seed, -1.0f, 1.0f);
    DeviceWeight w;
    w.dtype = DType::BF16;
    w.n = n;
    w.k = k;
    w.layout = GemvLayout::ROWS;
    w.quants = DeviceBuffer(hw.size() * 2);
    w.quants.upload(hw.data(), hw.size() * 2);
    // The sweep's copies: tiled (tile sh.tile) and channel-major (one tile of all n rows).
    auto repack = [&](int tile) {
      const long long total = static_cast<long long>((n + tile - 1) / tile) * tile * k;
      DeviceBuffer d(static_cast<size_t>(total) * 2);
      sx_repack<<<4096, 256, 0, st>>>(w.quants.as<uint16_t>(), d.as<uint16_t>(), n, k, tile, total);
      CK(cudaGetLastError());
      return d;
    };
    DeviceBuffer tiled = repack(sh.tile), cm = repack(n);
    const SparseWeight cols = make_sparse_columns(w, st);
    // The graph timing's copies (index 0: the originals above).
    std::vector<DeviceWeight> wcs;
    std::vector<SparseWeight> colcs;
    std::vector<DeviceBuffer> tiledcs, cmcs;
    for (int i = 1; i < copies; ++i) {
      DeviceWeight wi;
      wi.dtype = DType::BF16, wi.n = n, wi.k = k, wi.layout = GemvLayout::ROWS;
      wi.quants = DeviceBuffer(hw.size() * 2);
      wi.quants.upload(hw.data(), hw.size() * 2);
      colcs.push_back(make_sparse_columns(wi, st));
      tiledcs.push_back(repack(sh.tile));
      cmcs.push_back(repack(n));
      wcs.push_back(std::move(wi));
    }
    auto w_at = [&](int i) -> const DeviceWeight& { return i == 0 ? w : wcs[static_cast<size_t>(i - 1)]; };
    auto cols_at = [&](int i) -> const SparseWeight& { return i == 0 ? cols : colcs[static_cast<size_t>(i - 1)]; };
    auto tiled_at = [&](int i) -> const DeviceBuffer& { return i == 0 ? tiled : tiledcs[static_cast<size_t>(i - 1)]; };
    auto cm_at = [&](int i) -> const DeviceBuffer& { return i == 0 ? cm : cmcs[static_cast<size_t>(i - 1)]; };
    const SparseWeight sw64 = make_sparse_weight(w, st);
    SparseGemvWorkspace ws(n);
    DeviceBuffer x(sizeof(float) * k), xz(sizeof(float) * k), y(sizeof(float) * n);
    DeviceBuffer list(sizeof(SparseEntry) * k), count(sizeof(int32_t));
    x.upload(hx.data(), sizeof(float) * k);
    CK(cudaStreamSynchronize(st));
    std::vector<float> mags(hx.size());
    for (size_t i = 0; i < hx.size(); ++i) mags[i] = std::fabs(hx[i]);
    std::sort(mags.begin(), mags.end());
    for (float sp : sparsities) {
      const int spi = static_cast<int>(std::lround(sp * 100));
      const auto drop = static_cast<size_t>(std::floor(static_cast<double>(sp) * k));
      const float thr = drop > 0 ? mags[drop - 1] : 0.0f;  // |x| <= thr dropped: exactly `drop` entries (no ties)
      std::vector<float> hxz(hx);
      std::vector<int> kept;
      for (int c = 0; c < k; ++c) {
        if (std::fabs(hx[static_cast<size_t>(c)]) <= thr)
          hxz[static_cast<size_t>(c)] = 0.0f;
        else
          kept.push_back(c);
      }
      const int m = static_cast<int>(kept.size());
      xz.upload(hxz.data(), sizeof(float) * k);
      std::vector<double> ref(static_cast<size_t>(n)), mag(static_cast<size_t>(n));
      double maxref = 0;
      for (int r = 0; r < n; ++r) {
        const uint16_t* wr = hw.data() + static_cast<size_t>(r) * k;
        double a = 0, b = 0;
        for (int c : kept) {
          const double t = static_cast<double>(bf16_to_f32(wr[c])) * hx[static_cast<size_t>(c)];
          a += t, b += std::fabs(t);
        }
        ref[static_cast<size_t>(r)] = a, mag[static_cast<size_t>(r)] = b;
        maxref = std::max(maxref, std::fabs(a));
      }
      const double sparse_bytes = static_cast<double>(m) * n * 2.0 + 4.0 * k + 4.0 * n;
      const double dense_bytes = static_cast<double>(n) * k * 2.0 + 4.0 * k + 4.0 * n;
      // Poisons y (NaN bits, or zero for the atomic forms), runs `op` once, counts the rows off the reference.
      auto check = [&](const std::function<void(int)>& op, bool zero, double* max_rel) {
        CK(cudaMemsetAsync(y.get(), zero ? 0 : 0xFF, sizeof(float) * n, st));
        op(copies > 1 ? copies - 1 : 0);  // the last copy: checks that the copies hold the same weights
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(st));
        std::vector<float> h(static_cast<size_t>(n));
        y.download(h.data(), sizeof(float) * n);
        int bad = 0;
        double md = 0;
        for (int r = 0; r < n; ++r) {
          const double d = std::fabs(h[static_cast<size_t>(r)] - ref[static_cast<size_t>(r)]);
          if (!(d <= 5e-5 * mag[static_cast<size_t>(r)] + 1e-6)) ++bad;
          md = std::isnan(d) ? INFINITY : std::max(md, d);
        }
        *max_rel = maxref > 0 ? md / maxref : md;
        return bad;
      };
      // Dense (src, default shape) on the zeroed x, and the sparse-list form's list (sparsify on the raw x, untimed).
      GemvInput in;
      in.f32 = xz.as<float>();
      double dense_us = 0;
      {
        double mr = 0;
        const int bad = check([&](int i) { gemv(w_at(i), in, y.as<float>(), st); }, false, &mr);
        // Dense sums every channel of the zeroed x: the same products as the reference plus exact zeros.
        if (bad) ++failures, std::printf("FAIL dense %s %d%%: %d rows (max rel %.1e)\n", sh.what, spi, bad, mr);
        dense_us = timer.us([&] { gemv(w, in, y.as<float>(), st); });
        rows.push_back({sh.what, "-", "src dense", spi, dense_us, 0, dense_bytes / (dense_us * 1e3), 1.0});
        if (copies > 0)
          rows.back().graph_us = exp_common::graph_us(st, e0, e1, copies, std::max(5, reps / 10),
                                                      [&](int i) { gemv(w_at(i), in, y.as<float>(), st); });
        if (tsv)
          std::fprintf(tsv, "%s\t%d\t-\tsrc_dense\trows\t-\t-\t-\t-\t-\t-\t-\t%.3f\t\t%.1f\t1.000\t%d\t%.2e\n", sh.what,
                       spi, dense_us, dense_bytes / (dense_us * 1e3), bad, mr);
      }
      sparsify(x.as<float>(), nullptr, 1, k, 0.0f, thr, list.as<SparseEntry>(), count.as<int32_t>(), nullptr, st);
      for (const char* mode : {"zero", "thr"}) {
        const bool thr_mode = std::strcmp(mode, "thr") == 0;
        const float* xin = thr_mode ? x.as<float>() : xz.as<float>();
        const float t = thr_mode ? thr : 0.0f;
        auto record = [&](const std::string& name, const char* layout, int R, const Kind* kd, int splits, int blocks,
                          const std::function<void(int)>& op, const std::function<void(int)>& alone, bool zero) {
          double mr = 0;
          const int bad = check(op, zero, &mr);
          if (bad) {
            ++failures;
            std::printf("FAIL %s %s %d%% %s: %d rows off (max rel %.1e), not timed\n", name.c_str(), sh.what, spi, mode,
                        bad, mr);
            if (tsv)
              std::fprintf(tsv, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\t\t\t\t%d\t%.2e\n", sh.what, spi,
                           mode, name.c_str(), layout, R, kd ? kd->threads : 0, kd ? kd->unroll : 0, kd ? kd->vec : 0,
                           kd ? kd->pipe : 0, splits, blocks, bad, mr);
            return;
          }
          const double us = timer.us([&] { op(0); });
          const double al = alone ? timer.us([&] { alone(0); }) : 0.0;
          const double gb = sparse_bytes / (us * 1e3);
          rows.push_back({sh.what, mode, name, spi, us, al, gb, us / dense_us});
          if (copies > 0) rows.back().graph_us = exp_common::graph_us(st, e0, e1, copies, std::max(5, reps / 10), op);
          if (tsv)
            std::fprintf(tsv, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.3f\t%.3f\t%.1f\t%.3f\t%d\t%.2e\n",
                         sh.what, spi, mode, name.c_str(), layout, R, kd ? kd->threads : 0, kd ? kd->unroll : 0,
                         kd ? kd->vec : 0, kd ? kd->pipe : 0, splits, blocks, us, al, gb, us / dense_us, bad, mr);
        };
        record(
            "src cols", "cm", 0, nullptr, gemv_sparse_x_default_splits(cols), 0,
            [&](int i) { gemv_sparse_x(cols_at(i), xin, t, y.as<float>(), false, ws, st); }, nullptr, false);
        if (thr_mode)  // the list walk reads sparsify's list (built above from the raw x and thr)
          record(
              "src list", "tile64", 64, nullptr, gemv_sparse_default_splits(sw64), 0,
              [&](int) {
                gemv_sparse(sw64, list.as<SparseEntry>(), count.as<int32_t>(), y.as<float>(), false, ws, st);
              },
              nullptr, false);
        for (size_t vi = 0; vi < sh.nvars; ++vi) {
          const Variant& v = sh.vars[vi];
          const Kind& kd = kKinds[kind_of(v.kind)];
          const int rpt = 8 * kd.vec;
          const int tile = v.tiled ? sh.tile : n;
          const int g = v.rows / rpt;
          if (v.rows % rpt != 0 || g > kd.threads || tile % v.rows != 0 || n % v.rows != 0 || k % 4 != 0 || k > 65536 ||
              (v.splits > 1) != (std::strcmp(v.form, "own") != 0)) {
            std::printf("skip %s (shape does not fit)\n", v.kind);
            continue;
          }
          SxArgs a{};
          a.n = n, a.k = k, a.g = g, a.splits = v.splits, a.tile = tile;
          a.cap = 4 * ((k / 4 + v.splits - 1) / v.splits);
          a.atomic = v.splits > 1 && !kd.cluster, a.accumulate = false;
          a.pre = v.pre_kb * 1024;
          if (a.pre > 0 && (v.rows != tile || v.splits != 1)) {
            std::printf("skip %s pre (the block's region is not contiguous)\n", v.kind);
            continue;
          }
          const dim3 grid(static_cast<unsigned>(n / v.rows), static_cast<unsigned>(v.splits));
          const int blocks = static_cast<int>(grid.x * grid.y);
          a.red_off = static_cast<int>(std::max<size_t>((static_cast<size_t>(a.cap) * 6 + 15) / 16 * 16,
                                                        static_cast<size_t>(kd.threads) * rpt * 4));
          size_t smem = static_cast<size_t>(a.red_off) + (kd.cluster ? static_cast<size_t>(v.splits) * v.rows * 4 : 0);
          // One wave of at most one block per SM: shared memory enough that no second block fits beside it.
          if (blocks <= prop.multiProcessorCount && !v.no_force)
            smem = std::max(smem, static_cast<size_t>(prop.sharedMemPerMultiprocessor) / 2 + 1024);
          cudaFuncAttributes fa{};
          CK(cudaFuncGetAttributes(&fa, kd.f));
          smem = std::min(smem, static_cast<size_t>(prop.sharedMemPerBlockOptin) - fa.sharedSizeBytes);
          auto wp_at = [&, tiled_v = v.tiled](int i) {
            return tiled_v ? tiled_at(i).as<uint8_t>() : cm_at(i).as<uint8_t>();
          };
          // PDL as src's launches, and the slices as one cluster for the cluster kinds.
          cudaLaunchConfig_t cfg{};
          cfg.gridDim = grid;
          cfg.blockDim = dim3(static_cast<unsigned>(kd.threads));
          cfg.dynamicSmemBytes = smem;
          cfg.stream = st;
          cudaLaunchAttribute at[2];
          at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          at[0].val.programmaticStreamSerializationAllowed = 1;
          at[1].id = cudaLaunchAttributeClusterDimension;
          at[1].val.clusterDim.x = 1;
          at[1].val.clusterDim.y = static_cast<unsigned>(v.splits);
          at[1].val.clusterDim.z = 1;
          cfg.attrs = at;
          cfg.numAttrs = kd.cluster ? 2 : 1;
          char name[96];
          std::snprintf(name, sizeof name, "%s %s R%d %s s%d%s", v.form, v.tiled ? "tiled" : "cm", v.rows, kd.name,
                        v.splits, v.no_force ? " nf" : "");
          if (v.pre_kb > 0)
            std::snprintf(name + std::strlen(name), sizeof name - std::strlen(name), " pre%d", v.pre_kb);
          if (kd.cluster) {  // a cluster shape the GPU cannot place is skipped, not fatal
            int clusters = 0;
            const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kd.f, &cfg);
            if (e != cudaSuccess || clusters == 0) {
              std::printf("skip %s: no cluster placement (%s, %d clusters)\n", name, cudaGetErrorString(e), clusters);
              (void)cudaGetLastError();
              continue;
            }
            // Clusters resident at once ("mc"): fewer than grid.x means a second wave.
            std::snprintf(name + std::strlen(name), sizeof name - std::strlen(name), " mc%d", clusters);
          }
          auto kernel = [&, a, cfg, at, wp_at](int i) {
            cudaLaunchConfig_t c = cfg;
            c.attrs = const_cast<cudaLaunchAttribute*>(at);  // the copy's own attributes
            CK(cudaLaunchKernelEx(&c, kd.f, wp_at(i), xin, t, y.as<float>(), a));
          };
          if (a.atomic)
            record(
                name, v.tiled ? "tiled" : "cm", v.rows, &kd, v.splits, blocks,
                [&, kernel](int i) {
                  CK(cudaMemsetAsync(y.get(), 0, sizeof(float) * n, st));
                  kernel(i);
                },
                kernel, true);
          else
            record(name, v.tiled ? "tiled" : "cm", v.rows, &kd, v.splits, blocks, kernel, nullptr, false);
        }
      }
      std::fflush(stdout);
    }
  }
  if (tsv) std::fclose(tsv);
  // Summary: per (shape, sparsity, mode) dense, src's forms, the sweep's fastest six and the fastest of each form.
  std::printf("\n== summary: us median (GB/s on the bytes read; / dense); atomic forms incl. a memset of y, [alone]\n");
  for (const Shape& sh : shapes)
    for (float sp : sparsities) {
      const int spi = static_cast<int>(std::lround(sp * 100));
      double dense = 0, dense_g = 0;
      for (const Row& r : rows)
        if (r.shape == sh.what && r.sp == spi && r.mode == "-") dense = r.us, dense_g = r.graph_us;
      for (const char* mode : {"zero", "thr"}) {
        std::vector<Row> mine, src;
        for (const Row& r : rows)
          if (r.shape == sh.what && r.sp == spi && r.mode == mode)
            (r.name.rfind("src", 0) == 0 ? src : mine).push_back(r);
        std::sort(mine.begin(), mine.end(), [](const Row& p, const Row& q) { return p.us < q.us; });
        std::printf("%s %d%% %s: dense %.2f", sh.what, spi, mode, dense);
        if (dense_g > 0) std::printf(" {graph %.2f}", dense_g);
        for (const Row& r : src) {
          std::printf(" | %s %.2f (%.0f; %.3f)", r.name.c_str(), r.us, r.gbps, r.ratio);
          if (r.graph_us > 0) std::printf(" {graph %.2f; %.3f}", r.graph_us, r.graph_us / dense_g);
        }
        std::printf("\n");
        // The fastest six, then the fastest of each form not among them.
        std::vector<std::string> shown;
        for (size_t i = 0; i < mine.size(); ++i) {
          const Row& r = mine[i];
          const std::string form = r.name.substr(0, r.name.find(' '));
          const bool first_of_form = std::find(shown.begin(), shown.end(), form) == shown.end();
          if (i >= 6 && !first_of_form) continue;
          shown.push_back(form);
          std::printf("  %-34s %7.2f (%5.0f; %.3f)", r.name.c_str(), r.us, r.gbps, r.ratio);
          if (r.alone_us > 0) std::printf(" [%.2f]", r.alone_us);
          if (r.graph_us > 0) std::printf(" {graph %.2f; %.3f}", r.graph_us, r.graph_us / dense_g);
          std::printf("\n");
        }
        if (dense_g > 0 && !mine.empty()) {  // the fastest six in the graph timing
          std::vector<Row> g = mine;
          std::sort(g.begin(), g.end(), [](const Row& p, const Row& q) { return p.graph_us < q.graph_us; });
          std::printf("  graph, fastest:");
          for (size_t i = 0; i < g.size() && i < 6; ++i)
            std::printf(" %s %.2f (%.0f GB/s; %.3f);", g[i].name.c_str(), g[i].graph_us,
                        (g[i].gbps * g[i].us) / g[i].graph_us, g[i].graph_us / dense_g);
          std::printf("\n");
        }
        if (!mine.empty())
          std::printf("  bar: %s\n", spi == 50
                                         ? (mine[0].us <= 22.0 ? "<= 22 us PASS" : "<= 22 us FAIL")
                                         : (mine[0].ratio <= 0.62 ? "<= 0.62 x dense PASS" : "<= 0.62 x dense FAIL"));
      }
    }
  std::printf("failures=%d\n", failures);
  return failures ? 1 : 0;
}

}  // namespace sxs

int main(int argc, char** argv) {
  try {
    return sxs::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exp_gemv_sparse_sweep: %s\n", e.what());
    return 1;
  }
}
