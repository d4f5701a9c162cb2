// The decode attention kernel (v5: v4's block shape with loads before pdl_wait(); v6's short-context path lives in
// attn_decode_short.cuh) and its device helpers; included by attn_decode.cu (the launchers, workspaces and the history
// of the versions are there) and by bench/cuda/experiments/attn_decode_versions.cu, which keeps the versions that left
// src/ (v3, and v5's thread-block-cluster combine) and times them against this kernel.
#pragma once

#include <type_traits>

#include "backends/cuda/kernels/common.cuh"

namespace tessera::cuda::detail {
namespace {

constexpr int kMinChunk = 64;
constexpr int kMaxSplits = 256;  // also the combine's shared-memory weight buffer
constexpr int64_t kMaxCtx = int64_t{1} << 24;

// The chunk length for a context of ctx positions, the same in every block: a multiple of 64, at least min_chunk
// (itself a multiple of 64), such that at most splits chunks cover ctx.
__device__ __forceinline__ int attn_chunk(int ctx, int splits, int min_chunk) {
  const int c = (ctx + splits - 1) / splits;
  return max(min_chunk, (c + kMinChunk - 1) / kMinChunk * kMinChunk);
}

// One lane's 8 consecutive cache elements: one 16-byte load for f16/bf16, two for f32 (the opt-in f32 cache, which
// keeps f32 models at f32 precision).
template <typename T>
struct Slice8 {
  static constexpr int kParts = static_cast<int>(sizeof(T)) / 2;
  uint4 p[kParts];
};

template <typename T>
__device__ __forceinline__ Slice8<T> load_slice(const T* src) {
  Slice8<T> s;
#pragma unroll
  for (int i = 0; i < Slice8<T>::kParts; ++i) s.p[i] = ld_stream16(src + i * (8 / Slice8<T>::kParts));
  return s;
}

template <typename T>
__device__ __forceinline__ Slice8<T> zero_slice() {
  Slice8<T> s;
#pragma unroll
  for (int i = 0; i < Slice8<T>::kParts; ++i) s.p[i] = make_uint4(0, 0, 0, 0);
  return s;
}

template <typename T>
__device__ __forceinline__ void to_float8(const Slice8<T>& v, float (&f)[8]) {
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      f[4 * i] = __uint_as_float(v.p[i].x), f[4 * i + 1] = __uint_as_float(v.p[i].y);
      f[4 * i + 2] = __uint_as_float(v.p[i].z), f[4 * i + 3] = __uint_as_float(v.p[i].w);
    }
  } else {
    const uint32_t w[4] = {v.p[0].x, v.p[0].y, v.p[0].z, v.p[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (std::is_same_v<T, __half>) {
        const float2 p2 = half2_to_float2(w[i]);
        f[2 * i] = p2.x, f[2 * i + 1] = p2.y;
      } else {
        f[2 * i] = bf16_lo(w[i]), f[2 * i + 1] = bf16_hi(w[i]);
      }
    }
  }
}

// Query heads per block for a GQA group: the smallest of 1, 2, 4, 8 that holds it (groups over 8 take several).
// A group of exactly 3 (SmolLM2) runs as G = 3: same tile count, no idle fourth head.
int head_tile(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }

// exp(a - b) that is 0 when a is -inf (an empty state), also when b is -inf too (instead of NaN).
__device__ __forceinline__ float exp_diff(float a, float b) { return a == -INFINITY ? 0.0f : expf(a - b); }

// Scores are kept in log2 units (q is scaled by log2(e)): one MUFU.EX2 instead of expf's ~8 instructions (since v4;
// v3 used exp_diff). Its ~2 ulp relative error and flushing weights below 2^-126 to zero move the output far less
// than the tests' 2e-5.
template <bool kLog2>
__device__ __forceinline__ float exp_rel(float a, float b) {
  if constexpr (kLog2) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a - b));
    return a == -INFINITY ? 0.0f : r;
  } else {
    return exp_diff(a, b);
  }
}

// Block shape (since v4; v3's 4 warps of 8 positions per thread per tile are in the experiment): as many warps as
// the warp-merge buffer acc[W][G][HD] allows in 32 KB of shared memory (16 for hd 64/128 up to 4 heads), 2 positions
// per thread per tile where 512 threads leave 128 registers each, 4 otherwise: a tile's work is spread over 16 warps,
// 4 per scheduler (v3's 4 warps each ran ~1000 dependent instructions per tile, one warp per scheduler).
template <int HD, int G>
constexpr int attn_warps() {
  constexpr int cap = 32768 / (G * HD * 4);
  constexpr int w = G >= 8 ? 8 : 16;  // 8 heads' q and accumulators alone take 128 registers per thread
  return cap >= w ? w : cap >= 8 ? 8 : 4;
}
// An f32 cache takes half the steps: its slices are twice the registers, the same bytes per tile.
template <typename T, int HD, int G>
constexpr int attn_steps() {
  constexpr int div = static_cast<int>(sizeof(T)) / 2;
  return (attn_warps<HD, G>() >= 16 ? 2 : 4) / div;
}

// Positions per block per tile (kSteps positions per thread): the unit of one memory round trip.
// Lanes: HD/8 lanes (a sub-group) hold one position's 8-element slices (16-byte loads), so a warp covers 32/(HD/8)
// positions per step.
template <typename T, int HD, int G>
constexpr int tile_positions() {
  return attn_warps<HD, G>() * (kWarp / (HD / 8)) * attn_steps<T, HD, G>();
}

// The smallest chunk: two tiles, a multiple of 64. Below that a split's combine (partial store, fence, ticket,
// reload: ~3 dependent L2 round trips) costs more than the one extra tile a single block walks (a load round trip
// plus its arithmetic, in v4 too: its tiles' arithmetic is cheaper, their loads are not), so contexts up to this
// length take one block per kv head and write the output directly (no partials, no ticket).
template <typename T, int HD, int G>
constexpr int default_min_chunk() {
  return (2 * tile_positions<T, HD, G>() + kMinChunk - 1) / kMinChunk * kMinChunk;
}

// Kernel arguments (one struct: the fused path adds six).
template <typename T>
struct AttnParams {
  const float* q;  // [t, ld_q]
  size_t ld_q;
  T* kc;  // [n_seq, n_kv, n_ctx, HD]; written only by the fused path, at pos
  T* vc;
  const int32_t* pos;  // [t]
  const int32_t* seq;  // [t] or null
  // max_splits: the partials' stride (the workspace's chunks per head); the grid's x (<= max_splits) bounds the
  // chunks actually used.
  int n_ctx, n_seq, group, tiles, max_splits, min_chunk;
  int window;  // KvCacheView::window: > 0, keys below pos - window + 1 are masked (0: none)
  float scale;
  float* part_out;         // [t, n_head, max_splits, HD]
  float2* part_ml;         // [t, n_head, max_splits]
  unsigned int* counters;  // [t, n_kv, tiles]
  float* out;              // [t, n_head, HD]
  // Fused rotation: this token's unrotated q (above), k and v rows [t, ld_kv], and the RoPE parameters.
  const float* k_new;
  const float* v_new;
  size_t ld_kv;
  const float* inv_freq;  // [rope_dim / 2]
  int rope_dim;
  bool neox;
  // v5 early: pos, seq, the cache positions below pos and the rotation angles are read before pdl_wait(). src/'s
  // launchers always pass true; false (v4, or v5 without the early loads) is for attn_decode_versions.cu's timings.
  bool early;
  // splits: the chunks a context is cut into (the grid's x may be larger, its extra blocks exit). short_limit
  // (v6, t = 1): contexts of at most this many positions take attn_short, one block per query head (0: never).
  int splits;
  int short_limit;
  // Optional (t = 1, attn_short only): the output also quantized for a quantized o-projection, q8 [n_head * HD] and
  // ds [n_head * HD / 32] as quantize_q8 writes them (null: not written).
  int8_t* out_q8;
  float2* out_ds;
};

// v6's short-context path (attn_decode_short.cuh, included by attn_decode.cu after this file).
template <typename T, int HD, bool kRope, int kWarps, int G, int kMaxWin = 1, bool kWindow = true>
__device__ __forceinline__ void attn_short(const AttnParams<T>& a, int n_kv, int row, int kvh, int head, int pos,
                                           int slot, bool early, bool store, float* s_acc, float* s_m, float* s_l,
                                           float2* s_cs);

// Whether another of the t rows stores into row's cache slot below row's position (slots and positions are copied
// from the host before the launch, so this may run before pdl_wait()).
__device__ __forceinline__ bool slot_written_below(const int32_t* pos, const int32_t* seq, int row, int t) {
  const int p = pos[row], s = seq ? seq[row] : 0;
  for (int j = 0; j < t; ++j)
    if (j != row && (seq ? seq[j] : 0) == s && pos[j] < p) return true;
  return false;
}

// Grid (splits, n_kv, tiles * t) with tiles = ceil(group / G); each block handles up to G query heads of one kv head
// of one row over one chunk.
// Each sub-group keeps its own online-softmax state (m, l and its lanes' slices of o); sub-groups and warps merge at
// the end.
// kRope (attn_decode_rope): q arrives unrotated; every block rotates its own heads into shared memory (a few hundred
// sincosf, no extra launch), and the block whose chunk ends at pos also rotates this token's k, rounds k and v to the
// cache type (exactly what rope_store_kv stores), uses them for position pos from shared memory (nobody reads the
// cache at pos in this launch) and, for head tile 0, writes them into the cache.
// Since v4: the block shape above, scores in log2 units, and a warp skips the steps of a tile that start past the
// chunk's end (v3 computed all of them: at 64 positions half its work was on masked positions). v5: a.early
// (attn_decode.cu's header says why and what it saves).
template <typename T, int HD, int G, bool kRope>
__global__ void __launch_bounds__(attn_warps<HD, G>() * kWarp, 1) attn_split_kernel(const AttnParams<T> a) {
  constexpr int kWarps = attn_warps<HD, G>();
  constexpr int kThreads = kWarps * kWarp;
  constexpr int LPP = HD / 8;       // lanes per position
  constexpr int PPW = kWarp / LPP;  // positions per warp step
  constexpr int PG = kWarps * PPW;  // positions per block step
  constexpr int kSteps = attn_steps<T, HD, G>();
  constexpr int kTile = PG * kSteps;
  static_assert(kSteps >= 1 && kTile == tile_positions<T, HD, G>());
  // The rotated q heads are dead once in registers, before the accumulators are merged: they share storage.
  __shared__ __align__(16) union {
    float acc[kWarps][G][HD];
    float q[G][HD];
  } s_u;
  __shared__ float s_m[kWarps][G], s_l[kWarps][G];
  __shared__ __align__(16) float s_w[G][kMaxSplits];  // the ticket combine's chunk weights
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
  const bool early = a.early && !(gridDim.z > static_cast<unsigned>(a.tiles) &&
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
  const int chunk = attn_chunk(ctx, a.splits, a.min_chunk);
  const int split = blockIdx.x;
  const int start = split * chunk;
  if (start >= ctx) {
    if (early) pdl_wait();
    return;
  }
  const int len = min(chunk, ctx - start);
  const int n_splits = (ctx + chunk - 1) / chunk;
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
  // The next kWindow positions' K and V lines are asked into L2 now and kept kWindow ahead of the tile loop, so
  // a later tile's loads wait for an L2 hit, not a DRAM round trip. At most 64 KB of K (and of V) per block ahead:
  // with one wave of blocks over a long cache that is ~16 MB of L2, not the whole cache (evicted before use).
  constexpr int kRowBytes = HD * static_cast<int>(sizeof(T));
  constexpr int kWindow = kTile > 65536 / kRowBytes ? kTile : 65536 / kRowBytes;
  const char* kbytes = reinterpret_cast<const char*>(a.kc + row0 * HD);
  const char* vbytes = reinterpret_cast<const char*>(a.vc + row0 * HD);
  auto prefetch = [&](int p0, int p1) {  // positions [p0, min(p1, n_load)), 128-byte lines
    const int64_t end = int64_t{min(p1, n_load)} * kRowBytes;
    for (int64_t off = int64_t{p0} * kRowBytes + threadIdx.x * 128; off < end; off += kThreads * 128) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(kbytes + off));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(vbytes + off));
    }
  };
  prefetch(kTile, kWindow);
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

  const float qscale = a.scale * 1.44269504088896341f;  // log2(e): scores in log2 units
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
  // the step skips (a warp's step starts at the same position in every lane). No barrier inside: a warp whose
  // positions all lie past the chunk's end leaves early.
  for (int t0 = 0; t0 < len; t0 += kTile) {
    if (t0 + warp * PPW >= len) break;  // this warp's first step of this tile (and all later ones) is past len
    if (t0 > 0) load_tile(t0, n_load);
    if (t0 + kWindow < n_load) prefetch(t0 + kWindow, t0 + kWindow + kTile);
    bool valid[kSteps], live[kSteps];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int p = t0 + s * PG + warp * PPW + sub;
      valid[s] = p < len && (a.window <= 0 || start + p > pos - a.window);  // the sliding window masks older keys
      live[s] = t0 + s * PG + warp * PPW < len;  // warp-uniform: some lane's position is in the chunk
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
      const float corr = exp_rel<true>(m[h], mt);
      l[h] *= corr;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[h][j] *= corr;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        if (!live[s]) continue;
        float vf[8];
        to_float8<T>(vr[s], vf);
        const float e = exp_rel<true>(sc[s][h], mt);
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
      const float c1 = exp_rel<true>(m[h], mn), c2 = exp_rel<true>(mo, mn);
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
      const float c = exp_rel<true>(s_m[w][h], mx);
      o = fmaf(s_u.acc[w][h][d], c, o);
      sum = fmaf(s_l[w][h], c, sum);
    }
    if (single) {
      out[static_cast<size_t>(head0 + h) * HD + d] = o / sum;
      continue;
    }
    part_out[(static_cast<size_t>(head0 + h) * max_splits + split) * HD + d] = o;
    if (d == 0) part_ml[static_cast<size_t>(head0 + h) * max_splits + split] = make_float2(mx, sum);
  }
  if (single) return;
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
      const float w = exp_rel<true>(v.x, mx);
      s_w[h][j] = w;
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
        const float w = s_w[h][j + u];
        o.x = fmaf(v[u].x, w, o.x), o.y = fmaf(v[u].y, w, o.y), o.z = fmaf(v[u].z, w, o.z), o.w = fmaf(v[u].w, w, o.w);
      }
    }
    for (; j < n_splits; ++j) {
      const float4 v = __ldcg(po + static_cast<size_t>(j) * kVec);
      const float w = s_w[h][j];
      o.x = fmaf(v.x, w, o.x), o.y = fmaf(v.y, w, o.y), o.z = fmaf(v.z, w, o.z), o.w = fmaf(v.w, w, o.w);
    }
    const float inv = s_m[0][h];
    reinterpret_cast<float4*>(out + static_cast<size_t>(head0 + h) * HD)[d4] =
        make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (CUDA graph replays skip any memset)
}

}  // namespace
}  // namespace tessera::cuda::detail
