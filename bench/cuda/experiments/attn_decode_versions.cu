// Decode attention, versions 3 to 6 side by side (src/backends/cuda/kernels/attn_decode.cu's header tells their
// history). Versions that measured slower and that only an environment switch selected left src/ for this file:
//   v3      4-warp blocks, 8 positions per thread per tile, expf scores (was TESSERA_CUDA_ATTN_V1=1); its kernel moved
//           here (attn_split_old_kernel with kV4 = false);
//   v4      v4's block shape without loads before pdl_wait() (was TESSERA_CUDA_ATTN_V4=1): src's kernel with
//           AttnParams::early = false and no short-context path;
//   v5      src's kernel with the early loads and no short-context path (CudaOptions::attn_short = 0 in src);
//   v5 c2/c4/c8  v5 with the chunks of a short context combined inside a thread-block cluster of 2, 4 or 8 blocks
//           through distributed shared memory (was TESSERA_CUDA_ATTN_CLUSTER=N; measured 4% slower end to end on
//           SmolLM2); the cluster combine moved here (attn_split_old_kernel with kV4 = true, cluster > 1). Only for
//           shapes of at most 4 (kv head, head tile) blocks, as in src before; elsewhere the row is v5's;
//   v6      src's launcher itself (attn_decode / attn_decode_rope: the short-context path and the compact kernel), the
//           default: the baseline every row is compared with.
// (v5 without its early loads is v4's row: the early loads are what v5 added to v4's kernel.)
// Every version's output is checked on random data against a double-precision reference (plain: every head; fused:
// q and k rotated, k and v stored at pos, which the check reads back from the cache), then timed as bench/cuda does:
// a CUDA graph of back-to-back PDL launches over rotating caches (>= 4x L2 where the cache is small), median of the
// replays. Exit status 1 when any check fails.
//
// Build: cmake -DTESSERA_EXPERIMENTS=ON (the default where nvcc is found), target exp_attn_decode_versions (it links
// tessera_backend_cuda for src's launcher and includes src's kernel headers).
// Run on the GPU machine:   build/bin/exp_attn_decode_versions [reps] [only-shape-substring]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/attn_decode_kernel.cuh"
#include "backends/cuda/kernels/attn_decode_short.cuh"
#include "backends/cuda/kernels/common.cuh"
#include "exp_common.cuh"
#include "quant/half.h"

namespace tessera::cuda::detail::moved {

// ---- Moved from src/backends/cuda/kernels/attn_decode_kernel.cuh (commit f98a979), unchanged but for the kernel's
// name and its parameter struct (AttnParams plus the cluster size, which src's kernel no longer has). ----

template <typename T>
struct OldParams : AttnParams<T> {
  int cluster = 1;  // blocks per thread-block cluster along x (1: no cluster)
};

// Block shape per version. v3: 4 warps, 8 (or 4) positions per thread per tile: at short
// context a kv head is one block of 4 warps whose every thread runs ~1000 dependent instructions per tile, one warp
// per scheduler to hide their latency. v4: as many warps as the warp-merge buffer acc[W][G][HD] allows in 32 KB of
// shared memory (16 for hd 64/128 up to 4 heads), 2 positions per thread per tile where 512 threads leave 128
// registers each, 4 otherwise: a tile's work is spread over 4x the warps, 4 per scheduler.
template <int HD, int G, bool kV4>
constexpr int attn_warps() {
  if constexpr (!kV4) return 4;
  constexpr int cap = 32768 / (G * HD * 4);
  constexpr int w = G >= 8 ? 8 : 16;  // 8 heads' q and accumulators alone take 128 registers per thread
  return cap >= w ? w : cap >= 8 ? 8 : 4;
}
// An f32 cache (v4 only) takes half the steps: its slices are twice the registers, the same bytes per tile.
template <typename T, int HD, int G, bool kV4>
constexpr int attn_steps() {
  constexpr int div = static_cast<int>(sizeof(T)) / 2;
  if constexpr (kV4) return (attn_warps<HD, G, kV4>() >= 16 ? 2 : 4) / div;
  return (G <= 4 && HD <= 128) ? 8 : 4;
}

// Positions per block per tile (kSteps positions per thread): the unit of one memory round trip.
// Lanes: HD/8 lanes (a sub-group) hold one position's 8-element slices (16-byte loads), so a warp covers 32/(HD/8)
// positions per step.
template <typename T, int HD, int G, bool kV4>
constexpr int tile_positions() {
  return attn_warps<HD, G, kV4>() * (kWarp / (HD / 8)) * attn_steps<T, HD, G, kV4>();
}

// The smallest chunk: two tiles, a multiple of 64. Below that a split's combine (partial store, fence, ticket,
// reload: ~3 dependent L2 round trips) costs more than the one extra tile a single block walks (a load round trip
// plus its arithmetic, in v4 too: its tiles' arithmetic is cheaper, their loads are not), so contexts up to this
// length take one block per kv head and write the output directly (no partials, no ticket).
template <typename T, int HD, int G, bool kV4>
constexpr int default_min_chunk() {
  return (2 * tile_positions<T, HD, G, kV4>() + kMinChunk - 1) / kMinChunk * kMinChunk;
}

constexpr int kMaxCluster = 8;  // the portable cluster size: 8 SMs of one GPC

// Thread-block cluster helpers (sm_90): a barrier over every non-exited thread of the cluster (arrive releases this
// thread's earlier writes, wait acquires everyone's), and loads from another block's shared memory.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
__device__ __forceinline__ uint32_t cluster_addr(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(r)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))), "r"(rank));
  return r;
}
__device__ __forceinline__ float4 ld_cluster4(const float* p, int rank) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(cluster_addr(p, rank)));
  return v;
}
__device__ __forceinline__ float2 ld_cluster2(const float2* p, int rank) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(cluster_addr(p, rank)));
  return v;
}

// Grid (splits, n_kv, tiles * t) with tiles = ceil(group / G); each block handles up to G query heads of one kv head
// of one row over one chunk.
// Each sub-group keeps its own online-softmax state (m, l and its lanes' slices of o); sub-groups and warps merge at
// the end.
// kRope (attn_decode_rope): q arrives unrotated; every block rotates its own heads into shared memory (a few hundred
// sincosf, no extra launch), and the block whose chunk ends at pos also rotates this token's k, rounds k and v to the
// cache type (exactly what rope_store_kv stores), uses them for position pos from shared memory (nobody reads the
// cache at pos in this launch) and, for head tile 0, writes them into the cache.
// kV4: the block shape above, scores in log2 units, and a warp skips the steps of a tile that start past the chunk's
// end (v3 computes all of them: at 64 positions half its work is on masked positions).
// v5 = kV4 with a.early / a.cluster > 1 (src/backends/cuda/kernels/attn_decode.cu's header says why and what each
// saves).
template <typename T, int HD, int G, bool kRope, bool kV4>
__global__ void __launch_bounds__(attn_warps<HD, G, kV4>() * kWarp, 1) attn_split_old_kernel(const OldParams<T> a) {
  constexpr int kWarps = attn_warps<HD, G, kV4>();
  constexpr int kThreads = kWarps * kWarp;
  constexpr int LPP = HD / 8;       // lanes per position
  constexpr int PPW = kWarp / LPP;  // positions per warp step
  constexpr int PG = kWarps * PPW;  // positions per block step
  constexpr int kSteps = attn_steps<T, HD, G, kV4>();
  constexpr int kTile = PG * kSteps;
  static_assert(kSteps >= 1 && kTile == tile_positions<T, HD, G, kV4>());
  // The rotated q heads are dead once in registers, before the accumulators are merged: they share storage.
  __shared__ __align__(16) union {
    float acc[kWarps][G][HD];
    float q[G][HD];
  } s_u;
  __shared__ float s_m[kWarps][G], s_l[kWarps][G];
  __shared__ __align__(16) union {
    float w[G][kMaxSplits];  // the ticket combine's chunk weights
    float fin[G][HD];        // v5 cluster combine: this block's merged, unnormalized o (HD <= kMaxSplits)
  } s_x;
  __shared__ float2 s_fml[G];                  // v5 cluster combine: this block's (max, sum) per head
  __shared__ float2 s_cs[kRope ? HD / 2 : 1];  // v5 early: (cos, sin) of pos * inv_freq[j]
  __shared__ __align__(16) Slice8<T> s_new[2][kRope ? HD / 8 : 1];  // this token's k and v in the cache type
  __shared__ bool s_last;

  // v5 early: nothing below up to pdl_wait() reads what the previous kernel writes (q, k, v, and the cache at pos):
  // pos and seq are copied from the host before the graph runs, inv_freq is a constant, and the cache positions
  // below pos were stored by earlier tokens' launches, which completed before the previous kernel could start.
  // Batched rows may share a cache slot (several tokens of one sequence; seq == null puts every row in slot 0): the
  // previous kernel (rope + store for every row) then writes positions below this row's pos, so such a row's block
  // loads nothing before the wait. (2026-11-22: CudaRows.GraphReplayReadsPositionsOnTheDevice, whose rows 1 and 2
  // share a slot, failed for row 1 with PDL on only; with this check it has passed on the H100 in every run since.)
  const bool early = kV4 && a.early &&
                     !(gridDim.z > static_cast<unsigned>(a.tiles) &&
                       slot_written_below(a.pos, a.seq, blockIdx.z / a.tiles, gridDim.z / a.tiles));
  if (!early) pdl_wait();
  const int kvh = blockIdx.y;
  const int row = blockIdx.z / a.tiles, tile = blockIdx.z % a.tiles;
  const int n_kv = gridDim.y, group = a.group, n_head = n_kv * group, max_splits = a.max_splits;
  const int head0 = kvh * group + tile * G;
  const int nh = min(G, group - tile * G);
  const float* q = a.q + row * a.ld_q;
  float* out = a.out + static_cast<size_t>(row) * n_head * HD;
  float* part_out = a.part_out + static_cast<size_t>(row) * n_head * max_splits * HD;
  float2* part_ml = a.part_ml + static_cast<size_t>(row) * n_head * max_splits;
  const int pos = a.pos[row];
  const int slot = a.seq ? a.seq[row] : 0;
  if (pos < 0 || pos >= a.n_ctx || slot < 0 || slot >= a.n_seq) {
    if (early) pdl_wait();
    if (blockIdx.x == 0)
      for (int i = threadIdx.x; i < nh * HD; i += kThreads)
        out[static_cast<size_t>(head0) * HD + i] = __int_as_float(0x7fc00000);
    return;
  }
  const int ctx = pos + 1;
  if constexpr (kV4) {
    if (ctx <= a.short_limit) {  // v6: block x of this head tile computes query head head0 + x alone
      const int h = blockIdx.x;
      if (h >= nh) {
        if (early) pdl_wait();
        return;
      }
      attn_short<T, HD, kRope, kWarps, G>(a, n_kv, row, kvh, head0 + h, pos, slot, early, tile == 0 && h == 0,
                                          &s_u.acc[0][0][0], &s_m[0][0], &s_l[0][0], s_cs);
      return;
    }
  }
  const int csize = kV4 ? a.cluster : 1;
  int chunk = attn_chunk(ctx, a.splits, a.min_chunk);
  if (csize > 1 && ctx > a.min_chunk) {
    // v5: a context longer than the single-block limit (two tiles) and at most csize smallest chunks is spread over
    // the first cluster's blocks (at least one block step each). Measured: the cluster combine costs ~1.3-1.5 us, more
    // than one tile, so shorter contexts stay in one block.
    const int c1 = max(PG, ((ctx + csize - 1) / csize + 7) / 8 * 8);
    if (c1 <= a.min_chunk) chunk = c1;
  }
  const int split = blockIdx.x;
  const int start = split * chunk;
  if (start >= ctx) {
    if (early) pdl_wait();
    return;
  }
  const int len = min(chunk, ctx - start);
  const int n_splits = (ctx + chunk - 1) / chunk;
  // Every live block of a cluster-combined context is in the first cluster (split = cluster rank).
  const bool clustered = csize > 1 && n_splits > 1 && n_splits <= csize;
  // Positions of this chunk read from the cache: the fused path takes pos itself from shared memory. Before
  // pdl_wait() (early) only those below pos.
  const int n_pre = min(len, pos - start);
  const int n_load = kRope ? n_pre : len;
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  const int ld = lane % LPP, sub = lane / LPP;
  const size_t row0 = (static_cast<size_t>(slot) * n_kv + kvh) * a.n_ctx + start;
  const T* kbase = a.kc + row0 * HD + ld * 8;
  const T* vbase = a.vc + row0 * HD + ld * 8;

  Slice8<T> kr[kSteps], vr[kSteps];
  auto load_tile = [&](int t0, int limit) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int p = t0 + s * PG + warp * PPW + sub;
      const bool in = p < limit;
      kr[s] = in ? load_slice(kbase + static_cast<size_t>(p) * HD) : zero_slice<T>();
      vr[s] = in ? load_slice(vbase + static_cast<size_t>(p) * HD) : zero_slice<T>();
    }
  };
  // The first tile's loads depend only on pos: in flight while q is loaded (and rotated).
  load_tile(0, early ? n_pre : n_load);
  // v4: the next kWindow positions' K and V lines are asked into L2 now and kept kWindow ahead of the tile loop, so
  // a later tile's loads wait for an L2 hit, not a DRAM round trip. At most 64 KB of K (and of V) per block ahead:
  // with one wave of blocks over a long cache that is ~16 MB of L2, not the whole cache (evicted before use).
  constexpr int kRowBytes = HD * static_cast<int>(sizeof(T));
  constexpr int kWindow = kTile > 65536 / kRowBytes ? kTile : 65536 / kRowBytes;
  [[maybe_unused]] const char* kbytes = reinterpret_cast<const char*>(a.kc + row0 * HD);
  [[maybe_unused]] const char* vbytes = reinterpret_cast<const char*>(a.vc + row0 * HD);
  [[maybe_unused]] auto prefetch = [&](int p0, int p1) {  // positions [p0, min(p1, n_load)), 128-byte lines
    const int64_t end = int64_t{min(p1, n_load)} * kRowBytes;
    for (int64_t off = int64_t{p0} * kRowBytes + threadIdx.x * 128; off < end; off += kThreads * 128) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(kbytes + off));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(vbytes + off));
    }
  };
  if constexpr (kV4) prefetch(kTile, kWindow);
  if (early) {
    if constexpr (kRope) {
      for (int j = threadIdx.x; j < a.rope_dim / 2; j += kThreads) {
        float sn, cs;
        sincosf(static_cast<float>(pos) * a.inv_freq[j], &sn, &cs);  // as below
        s_cs[j] = make_float2(cs, sn);
      }
      __syncthreads();
    }
    pdl_wait();
    if constexpr (!kRope) {
      // The unfused path's position pos was stored by the previous kernel (rope_store_kv): its lanes load it now.
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const int p = s * PG + warp * PPW + sub;
        if (p == pos - start) {
          kr[s] = load_slice(kbase + static_cast<size_t>(p) * HD);
          vr[s] = load_slice(vbase + static_cast<size_t>(p) * HD);
        }
      }
    }
  }

  const float qscale = kV4 ? a.scale * 1.44269504088896341f : a.scale;  // v4: log2(e), scores in log2 units
  float qv[G][8];
  if constexpr (kRope) {
    const bool owner = start + len == ctx;  // this chunk ends at pos
    const int half = HD / 2, half_rd = a.rope_dim / 2;
    const int slots = nh + (owner ? 2 : 0);  // q heads, then (owner only) k and v of this kv head
    T* s_nt = reinterpret_cast<T*>(&s_new[0][0]);
    for (int i = threadIdx.x; i < slots * half; i += kThreads) {
      // Pair j of slot hs holds elements (ea, eb), mapped as in rope_store_kv_kernel.
      const int hs = i / half, j = i % half;
      const bool is_q = hs < nh, is_v = hs == nh + 1;
      const bool rotate = !is_v && j < half_rd;
      const int ea = rotate ? (a.neox ? j : 2 * j) : (a.neox && !is_v ? a.rope_dim + 2 * (j - half_rd) : 2 * j);
      const int eb = rotate && a.neox ? j + half_rd : ea + 1;
      const float* src = is_q ? q + static_cast<size_t>(head0 + hs) * HD
                              : (is_v ? a.v_new : a.k_new) + row * a.ld_kv + static_cast<size_t>(kvh) * HD;
      float xa = src[ea], xb = src[eb];
      if (rotate) {
        float sn, cs;
        if (early) {
          const float2 t = s_cs[j];
          cs = t.x, sn = t.y;
        } else {
          sincosf(static_cast<float>(pos) * a.inv_freq[j], &sn, &cs);  // the accurate version, as rope_store_kv
        }
        const float ra = xa * cs - xb * sn, rb = xa * sn + xb * cs;
        xa = ra, xb = rb;
      }
      if (is_q) {
        s_u.q[hs][ea] = xa, s_u.q[hs][eb] = xb;
      } else {
        T* dst = s_nt + (is_v ? HD : 0);
        dst[ea] = from_float<T>(xa), dst[eb] = from_float<T>(xb);
      }
    }
    __syncthreads();
    if (owner && tile == 0 && threadIdx.x < 2 * LPP) {
      const int which = threadIdx.x / LPP, piece = threadIdx.x % LPP;
      const size_t at = ((static_cast<size_t>(slot) * n_kv + kvh) * a.n_ctx + pos) * HD + piece * 8;
      *reinterpret_cast<Slice8<T>*>((which ? a.vc : a.kc) + at) = s_new[which][piece];
    }
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
      for (int j = 0; j < 8; ++j) qv[h][j] = h < nh ? s_u.q[h][ld * 8 + j] * qscale : 0.0f;
    }
    __syncthreads();  // s_u.q is read by every warp before any warp reuses the storage for s_u.acc
  } else {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      if (h < nh) {
        const float4* qp = reinterpret_cast<const float4*>(q + static_cast<size_t>(head0 + h) * HD + ld * 8);
        const float4 x = qp[0], y = qp[1];
        const float sc = qscale;
        qv[h][0] = x.x * sc, qv[h][1] = x.y * sc, qv[h][2] = x.z * sc, qv[h][3] = x.w * sc;
        qv[h][4] = y.x * sc, qv[h][5] = y.y * sc, qv[h][6] = y.z * sc, qv[h][7] = y.w * sc;
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) qv[h][j] = 0.0f;
      }
    }
  }
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[h][j] = 0.0f;
  }

  // The tile loop is warp-uniform (t0 is the same in every lane), so the shuffles always have all 32 lanes; so are
  // v4's step skips (a warp's step starts at the same position in every lane). No barrier inside: a warp whose
  // positions all lie past the chunk's end leaves early.
  for (int t0 = 0; t0 < len; t0 += kTile) {
    if (kV4 && t0 + warp * PPW >= len) break;  // this warp's first step of this tile (and all later ones) is past len
    if (t0 > 0) load_tile(t0, n_load);
    if constexpr (kV4) {
      if (t0 + kWindow < n_load) prefetch(t0 + kWindow, t0 + kWindow + kTile);
    }
    bool valid[kSteps], live[kSteps];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int p = t0 + s * PG + warp * PPW + sub;
      valid[s] = p < len;
      live[s] = !kV4 || t0 + s * PG + warp * PPW < len;  // warp-uniform: some lane's position is in the chunk
      if constexpr (kRope) {
        if (start + p == pos) kr[s] = s_new[0][ld], vr[s] = s_new[1][ld];
      }
    }
    float sc[kSteps][G];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (!live[s]) {
#pragma unroll
        for (int h = 0; h < G; ++h) sc[s][h] = -INFINITY;
        continue;
      }
      float kf[8];
      to_float8<T>(kr[s], kf);
#pragma unroll
      for (int h = 0; h < G; ++h) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot = fmaf(qv[h][j], kf[j], dot);
#pragma unroll
        for (int off = LPP / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        sc[s][h] = valid[s] ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float mt = m[h];
#pragma unroll
      for (int s = 0; s < kSteps; ++s) mt = fmaxf(mt, sc[s][h]);
      const float corr = exp_rel<kV4>(m[h], mt);
      l[h] *= corr;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[h][j] *= corr;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        if (!live[s]) continue;
        float vf[8];
        to_float8<T>(vr[s], vf);
        const float e = exp_rel<kV4>(sc[s][h], mt);
        l[h] += e;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[h][j] = fmaf(e, vf[j], acc[h][j]);
      }
      m[h] = mt;
    }
  }

  // Merge the sub-groups of each warp (lanes LPP apart hold the same dimensions of different positions).
#pragma unroll
  for (int off = LPP; off < kWarp; off <<= 1) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[h], off);
      const float lo = __shfl_xor_sync(0xffffffffu, l[h], off);
      const float mn = fmaxf(m[h], mo);
      const float c1 = exp_rel<kV4>(m[h], mn), c2 = exp_rel<kV4>(mo, mn);
      l[h] = l[h] * c1 + lo * c2;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[h][j], off);
        acc[h][j] = acc[h][j] * c1 + ao * c2;
      }
      m[h] = mn;
    }
  }
  // Merge the warps through shared memory and store this chunk's partial result (or, when the chunk is the whole
  // context, the normalized output itself: no partials, no ticket, no second pass). A warp that computed nothing
  // holds m = -inf, l = 0, acc = 0: weight 0 below; warp 0 always holds position start.
  if (sub == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float4* dst = reinterpret_cast<float4*>(&s_u.acc[warp][h][ld * 8]);
      dst[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
      dst[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
      if (ld == 0) s_m[warp][h] = m[h], s_l[warp][h] = l[h];
    }
  }
  __syncthreads();
  const bool single = n_splits == 1;
  for (int i = threadIdx.x; i < nh * HD; i += kThreads) {
    const int h = i / HD, d = i % HD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][h]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float c = exp_rel<kV4>(s_m[w][h], mx);
      o = fmaf(s_u.acc[w][h][d], c, o);
      sum = fmaf(s_l[w][h], c, sum);
    }
    if (single) {
      out[static_cast<size_t>(head0 + h) * HD + d] = o / sum;
      continue;
    }
    if (clustered) {
      s_x.fin[h][d] = o;
      if (d == 0) s_fml[h] = make_float2(mx, sum);
      continue;
    }
    part_out[(static_cast<size_t>(head0 + h) * max_splits + split) * HD + d] = o;
    if (d == 0) part_ml[static_cast<size_t>(head0 + h) * max_splits + split] = make_float2(mx, sum);
  }
  if (single) return;
  if (clustered) {
    // Rank 0 (split 0) reads every block's merged chunk through distributed shared memory and writes the output;
    // the others keep their shared memory alive until it has (the second barrier phase).
    cluster_arrive();
    cluster_wait();
    if (split == 0) {
      constexpr int kVec = HD / 4;
      for (int i = threadIdx.x; i < nh * kVec; i += kThreads) {
        const int h = i / kVec, d4 = i % kVec;
        float2 ml[kMaxCluster];
        float4 po[kMaxCluster];
#pragma unroll
        for (int r = 0; r < kMaxCluster; ++r) {
          ml[r] = r < n_splits ? ld_cluster2(&s_fml[h], r) : make_float2(-INFINITY, 0.0f);
          po[r] = r < n_splits ? ld_cluster4(&s_x.fin[h][4 * d4], r) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float mx = -INFINITY;
#pragma unroll
        for (int r = 0; r < kMaxCluster; ++r) mx = fmaxf(mx, ml[r].x);
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < kMaxCluster; ++r) {
          const float w = exp_rel<kV4>(ml[r].x, mx);
          sum = fmaf(ml[r].y, w, sum);
          o.x = fmaf(po[r].x, w, o.x), o.y = fmaf(po[r].y, w, o.y), o.z = fmaf(po[r].z, w, o.z);
          o.w = fmaf(po[r].w, w, o.w);
        }
        const float inv = 1.0f / sum;
        reinterpret_cast<float4*>(out + static_cast<size_t>(head0 + h) * HD)[d4] =
            make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
      }
    }
    cluster_arrive();
    if (split != 0) cluster_wait();
    return;
  }

  // The last chunk to finish for this (kv head, head tile) combines all chunks.
  __threadfence();  // publish this block's partials before taking a ticket
  __syncthreads();
  unsigned int* counter = a.counters + (static_cast<size_t>(row) * n_kv + kvh) * a.tiles + tile;
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == static_cast<unsigned>(n_splits - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Weights exp(m_j - M) per head and chunk (n_splits <= kMaxSplits), and the normalizer.
  for (int h = warp; h < nh; h += kWarps) {
    const float2* ml = part_ml + static_cast<size_t>(head0 + h) * max_splits;
    float mx = -INFINITY;
    for (int j = lane; j < n_splits; j += kWarp) mx = fmaxf(mx, __ldcg(&ml[j].x));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n_splits; j += kWarp) {
      const float2 v = __ldcg(&ml[j]);
      const float w = exp_rel<kV4>(v.x, mx);
      s_x.w[h][j] = w;
      sum = fmaf(v.y, w, sum);
    }
    sum = warp_sum(sum);
    if (lane == 0) s_m[0][h] = 1.0f / sum;
  }
  __syncthreads();
  // Each thread owns 4 dimensions of one head and keeps 8 chunks' loads in flight per step (v2 walked the chunks one
  // dependent load at a time per output: dozens of L2 round trips at the tail of the kernel).
  constexpr int kVec = HD / 4;
  for (int i = threadIdx.x; i < nh * kVec; i += kThreads) {
    const int h = i / kVec, d4 = i % kVec;
    const float4* po =
        reinterpret_cast<const float4*>(part_out + static_cast<size_t>(head0 + h) * max_splits * HD) + d4;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int j = 0;
    for (; j + 7 < n_splits; j += 8) {
      float4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = __ldcg(po + static_cast<size_t>(j + u) * kVec);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float w = s_x.w[h][j + u];
        o.x = fmaf(v[u].x, w, o.x), o.y = fmaf(v[u].y, w, o.y), o.z = fmaf(v[u].z, w, o.z), o.w = fmaf(v[u].w, w, o.w);
      }
    }
    for (; j < n_splits; ++j) {
      const float4 v = __ldcg(po + static_cast<size_t>(j) * kVec);
      const float w = s_x.w[h][j];
      o.x = fmaf(v.x, w, o.x), o.y = fmaf(v.y, w, o.y), o.z = fmaf(v.z, w, o.z), o.w = fmaf(v.w, w, o.w);
    }
    const float inv = s_m[0][h];
    reinterpret_cast<float4*>(out + static_cast<size_t>(head0 + h) * HD)[d4] =
        make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (CUDA graph replays skip any memset)
}

// ---- Host side of the moved versions (from src's launch_split before the move). ----

template <typename K>
int resident_blocks(K* kernel, int threads) {
  int n = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
  return std::max(1, n);
}

template <typename K>
int active_clusters(K* kernel, int threads, int csize) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(csize * 64);
  cfg.blockDim = dim3(threads);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = csize, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr, cfg.numAttrs = 1;
  int n = 0;
  CK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  return n;
}

// One decode row's launch inputs (t = 1, slot 0).
struct Args {
  const float* q;
  const int32_t* pos;
  float* out;
  int64_t n_head;
  float scale;
  AttnWorkspace* ws;
  cudaStream_t stream;
  const float* k_new = nullptr;  // fused: this token's k and v rows [n_kv * hd], inv_freq [hd / 2], rope_dim = hd
  const float* v_new = nullptr;
  const float* inv_freq = nullptr;
};

template <typename T, typename P>
void fill_params(P& p, const KvCacheView& c, const Args& a, int group, int tiles, int splits, int min_chunk) {
  p.q = a.q, p.ld_q = static_cast<size_t>(a.n_head * c.hd), p.kc = static_cast<T*>(c.k), p.vc = static_cast<T*>(c.v);
  p.pos = a.pos, p.seq = nullptr, p.n_ctx = static_cast<int>(c.n_ctx), p.n_seq = 1, p.group = group, p.tiles = tiles;
  p.max_splits = a.ws->max_splits(), p.min_chunk = min_chunk, p.scale = a.scale;
  p.part_out = a.ws->partial_out(), p.part_ml = a.ws->partial_ml(), p.counters = a.ws->counters(), p.out = a.out;
  p.k_new = a.k_new, p.v_new = a.v_new, p.ld_kv = static_cast<size_t>(c.n_kv * c.hd), p.inv_freq = a.inv_freq;
  p.rope_dim = a.k_new ? static_cast<int>(c.hd) : 0, p.neox = false;
  p.splits = splits, p.short_limit = 0, p.out_q8 = nullptr, p.out_ds = nullptr;
}

// v3: the 4-warp kernel over src's AttnWorkspace chunk count (sized for two of its blocks per SM), G = head_tile.
template <typename T, int HD, int G, bool kRope>
void launch_v3(const KvCacheView& c, const Args& a) {
  const int group = static_cast<int>(a.n_head / c.n_kv), tiles = (group + G - 1) / G;
  constexpr int threads = attn_warps<HD, G, false>() * kWarp;
  OldParams<T> p{};
  fill_params<T>(p, c, a, group, tiles, a.ws->max_splits(), default_min_chunk<T, HD, G, false>());
  p.early = false, p.cluster = 1;
  launch("attn_split_old_kernel<v3>", attn_split_old_kernel<T, HD, G, kRope, false>,
         dim3(a.ws->max_splits(), static_cast<unsigned>(c.n_kv), static_cast<unsigned>(tiles)), dim3(threads), 0,
         a.stream, p);
}

// v4 / v5: src's kernel (early off / on) with one wave of its blocks and no short-context path.
template <typename T, int HD, int G, bool kRope>
void launch_v45(const KvCacheView& c, const Args& a, bool early) {
  const int group = static_cast<int>(a.n_head / c.n_kv), tiles = (group + G - 1) / G;
  constexpr int threads = tessera::cuda::detail::attn_warps<HD, G>() * kWarp;
  static const int per_sm = std::max(resident_blocks(attn_split_kernel<T, HD, G, false>, threads),
                                     resident_blocks(attn_split_kernel<T, HD, G, true>, threads));
  const int64_t blocks = c.n_kv * tiles;
  const int splits = std::max(1, std::min(a.ws->max_splits(), ceil_div(int64_t{per_sm} * sm_count(), blocks)));
  AttnParams<T> p{};
  fill_params<T>(p, c, a, group, tiles, splits, tessera::cuda::detail::default_min_chunk<T, HD, G>());
  p.early = early;
  launch(early ? "attn_split_kernel<v5>" : "attn_split_kernel<v4>", attn_split_kernel<T, HD, G, kRope>,
         dim3(splits, static_cast<unsigned>(c.n_kv), static_cast<unsigned>(tiles)), dim3(threads), 0, a.stream, p);
}

// v5 with clusters of up to `cap` blocks (src's launch_split before the move, its cluster branch): returns false
// (nothing launched) where clusters do not apply (more than 4 blocks per chunk, or none fit).
template <typename T, int HD, int G, bool kRope>
bool launch_v5_clusters(const KvCacheView& c, const Args& a, int cap) {
  const int group = static_cast<int>(a.n_head / c.n_kv), tiles = (group + G - 1) / G;
  constexpr int threads = attn_warps<HD, G, true>() * kWarp;
  auto* kernel = attn_split_old_kernel<T, HD, G, kRope, true>;
  static const int per_sm = std::max(resident_blocks(attn_split_old_kernel<T, HD, G, false, true>, threads),
                                     resident_blocks(attn_split_old_kernel<T, HD, G, true, true>, threads));
  const int64_t blocks = c.n_kv * tiles;
  int splits = std::max(1, std::min(a.ws->max_splits(), ceil_div(int64_t{per_sm} * sm_count(), blocks)));
  if (blocks > 4) return false;
  int csize = cap;
  while (csize > splits) csize /= 2;
  if (csize <= 1) return false;
  // Asked once per size (as src did): not during graph capture.
  static int fits_by_size[4] = {-1, -1, -1, -1};
  int& fits = fits_by_size[csize == 2 ? 1 : csize == 4 ? 2 : 3];
  if (fits < 0) fits = active_clusters(kernel, threads, csize);
  if (fits < 1) return false;
  splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(splits / csize, fits / blocks))) * csize;
  OldParams<T> p{};
  fill_params<T>(p, c, a, group, tiles, splits, default_min_chunk<T, HD, G, true>());
  p.early = true, p.cluster = csize;
  launch_cluster("attn_split_old_kernel<v5 clusters>", kernel,
                 dim3(splits, static_cast<unsigned>(c.n_kv), static_cast<unsigned>(tiles)), dim3(threads), 0, a.stream,
                 static_cast<unsigned>(csize), p);
  return true;
}

}  // namespace tessera::cuda::detail::moved

namespace {

using namespace tessera;
using namespace tessera::cuda;
using T = __nv_bfloat16;

enum Version { V3, V4, V5, V5_C2, V5_C4, V5_C8, V6, kVersions };
const char* kNames[kVersions] = {"v3", "v4", "v5", "v5 c2", "v5 c4", "v5 c8", "v6 (src)"};

// Launches version v for head size HD; G4: src's head tile for the group (3 for SmolLM2's group of 3), G3: v3's.
template <int HD, int G4, int G3>
bool launch_version(Version v, bool rope, const KvCacheView& c, const tessera::cuda::detail::moved::Args& a) {
  namespace m = tessera::cuda::detail::moved;
  switch (v) {
    case V3:
      rope ? m::launch_v3<T, HD, G3, true>(c, a) : m::launch_v3<T, HD, G3, false>(c, a);
      return true;
    case V4:
    case V5:
      rope ? m::launch_v45<T, HD, G4, true>(c, a, v == V5) : m::launch_v45<T, HD, G4, false>(c, a, v == V5);
      return true;
    case V5_C2:
    case V5_C4:
    case V5_C8: {
      const int cap = v == V5_C2 ? 2 : v == V5_C4 ? 4 : 8;
      return rope ? m::launch_v5_clusters<T, HD, G4, true>(c, a, cap)
                  : m::launch_v5_clusters<T, HD, G4, false>(c, a, cap);
    }
    case V6:
      if (rope)
        attn_decode_rope(a.q, a.k_new, a.v_new, c, a.pos, HD, a.inv_freq, false, a.out, a.n_head, a.scale, *a.ws,
                         a.stream);
      else
        attn_decode(a.q, c, a.pos, a.out, a.n_head, a.scale, *a.ws, a.stream);
      return true;
    default:
      return false;
  }
}

struct Shape {
  const char* name;
  int64_t n_head, n_kv, hd, n_ctx;
  std::vector<int> ctxs;
};

// out[h] over positions 0..pos of kv head h / group, in double, from the cache as stored (bf16) and q as given.
std::vector<double> reference(const std::vector<float>& q, const std::vector<uint16_t>& kc,
                              const std::vector<uint16_t>& vc, const Shape& s, int pos, double scale) {
  const int64_t group = s.n_head / s.n_kv;
  std::vector<double> out(s.n_head * s.hd, 0.0), w(pos + 1);
  for (int64_t h = 0; h < s.n_head; ++h) {
    const int64_t kvh = h / group;
    double mx = -INFINITY;
    for (int p = 0; p <= pos; ++p) {
      double d = 0;
      for (int64_t j = 0; j < s.hd; ++j) d += double(q[h * s.hd + j]) * bf16_to_f32(kc[(kvh * s.n_ctx + p) * s.hd + j]);
      w[p] = d * scale;
      mx = std::max(mx, w[p]);
    }
    double sum = 0;
    for (int p = 0; p <= pos; ++p) sum += (w[p] = std::exp(w[p] - mx));
    for (int p = 0; p <= pos; ++p)
      for (int64_t j = 0; j < s.hd; ++j)
        out[h * s.hd + j] += w[p] / sum * bf16_to_f32(vc[(kvh * s.n_ctx + p) * s.hd + j]);
  }
  return out;
}

// The rotation src's fused kernels apply (interleaved pairs, rope_dim = hd), in double.
void rotate(float* x, int64_t hd, int pos, const std::vector<float>& inv_freq) {
  for (int64_t j = 0; j < hd / 2; ++j) {
    const double a = double(pos) * inv_freq[j], cs = std::cos(a), sn = std::sin(a);
    const double xa = x[2 * j], xb = x[2 * j + 1];
    x[2 * j] = static_cast<float>(xa * cs - xb * sn), x[2 * j + 1] = static_cast<float>(xa * sn + xb * cs);
  }
}

template <int HD, int G4, int G3>
int run_shape(const Shape& s, int reps, int64_t l2_bytes, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1) {
  std::mt19937 rng(1234u + static_cast<unsigned>(s.n_head * 131 + s.hd));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t elems = size_t(s.n_kv) * s.n_ctx * s.hd, bytes = elems * 2;
  const int copies = static_cast<int>(std::clamp<int64_t>((4 * l2_bytes) / int64_t(2 * bytes) + 1, 1, 64));
  std::vector<uint16_t> kc(elems), vc(elems);
  for (auto& x : kc) x = f32_to_bf16(2.0f * u(rng));
  for (auto& x : vc) x = f32_to_bf16(2.0f * u(rng));
  std::vector<float> q(s.n_head * s.hd), kn(s.n_kv * s.hd), vn(s.n_kv * s.hd), inv(s.hd / 2);
  for (auto& x : q) x = u(rng);
  for (auto& x : kn) x = u(rng);
  for (auto& x : vn) x = u(rng);
  for (int64_t j = 0; j < s.hd / 2; ++j) inv[j] = static_cast<float>(std::pow(10000.0, -2.0 * j / s.hd));
  std::vector<void*> dk(copies), dv(copies);
  for (int i = 0; i < copies; ++i) {
    CK(cudaMalloc(&dk[i], bytes));
    CK(cudaMalloc(&dv[i], bytes));
    CK(cudaMemcpy(dk[i], kc.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv[i], vc.data(), bytes, cudaMemcpyHostToDevice));
  }
  float *dq, *dout, *dkn, *dvn, *dinv;
  int32_t* dpos;
  CK(cudaMalloc(&dq, 4 * q.size()));
  CK(cudaMalloc(&dout, 4 * q.size()));
  CK(cudaMalloc(&dkn, 4 * kn.size()));
  CK(cudaMalloc(&dvn, 4 * vn.size()));
  CK(cudaMalloc(&dinv, 4 * inv.size()));
  CK(cudaMalloc(&dpos, 4));
  CK(cudaMemcpy(dq, q.data(), 4 * q.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dkn, kn.data(), 4 * kn.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dvn, vn.data(), 4 * vn.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dinv, inv.data(), 4 * inv.size(), cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize());
  auto view = [&](int i) {
    KvCacheView c;
    c.dtype = DType::BF16, c.k = dk[i % copies], c.v = dv[i % copies], c.n_ctx = s.n_ctx, c.n_kv = s.n_kv, c.hd = s.hd;
    return c;
  };
  AttnWorkspace ws(s.n_head, view(0));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  int failures = 0;
  std::printf("\n%-14s %5s %6s", s.name, "ctx", "path");
  for (int v = 0; v < kVersions; ++v) std::printf(" %9s", kNames[v]);
  std::printf("   (us per launch; '-': does not apply)\n");
  for (int ctx : s.ctxs) {
    const int pos = ctx - 1;
    CK(cudaMemcpy(dpos, &pos, 4, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());  // st is non-blocking: no implicit order with the legacy stream's copies
    for (const bool rope : {false, true}) {
      tessera::cuda::detail::moved::Args a{dq, dpos, dout, s.n_head, scale, &ws, st};
      if (rope) a.k_new = dkn, a.v_new = dvn, a.inv_freq = dinv;
      // The reference: unfused, the cache as uploaded; fused, q rotated and the cache at pos as the kernel stored it
      // (read back below; checked against the rotation in double to one bf16 rounding).
      std::vector<float> qr = q;
      if (rope)
        for (int64_t h = 0; h < s.n_head; ++h) rotate(&qr[h * s.hd], s.hd, pos, inv);
      float us[kVersions];
      for (int v = 0; v < kVersions; ++v) {
        us[v] = -1;
        // The cache as uploaded (a fused launch stored k and v at its pos in copy 0), the output poisoned.
        CK(cudaMemcpy(dk[0], kc.data(), bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv[0], vc.data(), bytes, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize());
        CK(cudaMemsetAsync(dout, 0xFF, 4 * q.size(), st));
        if (!launch_version<HD, G4, G3>(static_cast<Version>(v), rope, view(0), a)) continue;
        CK(cudaStreamSynchronize(st));
        std::vector<float> out(q.size());
        CK(cudaMemcpy(out.data(), dout, 4 * out.size(), cudaMemcpyDeviceToHost));
        std::vector<uint16_t> k2 = kc, v2 = vc;
        bool stored_ok = true;
        if (rope) {
          for (int64_t kvh = 0; kvh < s.n_kv; ++kvh) {
            const size_t at = (size_t(kvh) * s.n_ctx + pos) * s.hd;
            CK(cudaMemcpy(&k2[at], static_cast<uint16_t*>(dk[0]) + at, 2 * s.hd, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&v2[at], static_cast<uint16_t*>(dv[0]) + at, 2 * s.hd, cudaMemcpyDeviceToHost));
            std::vector<float> kr(kn.begin() + kvh * s.hd, kn.begin() + (kvh + 1) * s.hd);
            rotate(kr.data(), s.hd, pos, inv);
            for (int64_t j = 0; j < s.hd; ++j) {
              const float kk = bf16_to_f32(k2[at + j]), want = kr[j];
              stored_ok = stored_ok && std::fabs(kk - want) <= std::ldexp(std::fabs(want), -7) + 1e-6f &&
                          v2[at + j] == f32_to_bf16(vn[kvh * s.hd + j]);
            }
          }
        }
        const std::vector<double> ref = reference(rope ? qr : q, k2, v2, s, pos, scale);
        // Tolerance: f32 accumulation over <= 8k positions and ex2.approx (v3: expf) against double; the tests'
        // 2e-5 relative to the output's scale (values in [-2, 2]) holds with margin.
        int bad = 0;
        for (size_t i = 0; i < out.size(); ++i)
          if (!(std::fabs(out[i] - ref[i]) <= 2e-5 * 2.0 + 1e-5 * std::fabs(ref[i]))) ++bad;
        if (bad || !stored_ok) {
          ++failures;
          std::printf("FAIL %s ctx %d %s %s: %d bad outputs%s\n", s.name, ctx, rope ? "fused" : "plain", kNames[v], bad,
                      stored_ok ? "" : ", k/v at pos stored wrong");
        }
        // Timing: a graph of n launches over the rotating caches, median of the replays.
        const int n = std::max(copies, 16);
        us[v] = exp_common::graph_us(
            st, e0, e1, n, reps, [&](int i) { launch_version<HD, G4, G3>(static_cast<Version>(v), rope, view(i), a); });
      }
      std::printf("%-14s %5d %6s", s.name, ctx, rope ? "fused" : "plain");
      for (int v = 0; v < kVersions; ++v) {
        if (us[v] < 0)
          std::printf(" %9s", "-");
        else
          std::printf(" %9.2f", us[v]);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  for (int i = 0; i < copies; ++i) {
    CK(cudaFree(dk[i]));
    CK(cudaFree(dv[i]));
  }
  for (void* p : {static_cast<void*>(dq), static_cast<void*>(dout), static_cast<void*>(dkn), static_cast<void*>(dvn),
                  static_cast<void*>(dinv), static_cast<void*>(dpos)})
    CK(cudaFree(p));
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 20;
  const char* only = argc > 2 ? argv[2] : nullptr;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB; bf16 cache, t = 1\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const Shape l8b{"llama3-8b", 32, 8, 128, 8192, {256, 1024, 4096, 8192}};
  const Shape l1b{"llama3.2-1b", 32, 8, 64, 8192, {128, 256, 1024, 2048}};
  const Shape smol{"smollm2-135m", 9, 3, 64, 4096, {128, 384, 512, 1024, 2048, 4096}};
  int failures = 0;
  try {
    if (!only || std::strstr(l8b.name, only)) failures += run_shape<128, 4, 4>(l8b, reps, prop.l2CacheSize, st, e0, e1);
    if (!only || std::strstr(l1b.name, only)) failures += run_shape<64, 4, 4>(l1b, reps, prop.l2CacheSize, st, e0, e1);
    if (!only || std::strstr(smol.name, only))
      failures += run_shape<64, 3, 4>(smol, reps, prop.l2CacheSize, st, e0, e1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exp_attn_decode_versions: %s\n", e.what());
    return 1;
  }
  std::printf("\nfailures: %d\n", failures);
  return failures ? 1 : 0;
}
