// Decode attention (one query token) over an f16/bf16/f32 KV cache, split-K ("flash-decoding"). A single kv head's
// keys are far too few bytes to keep 132 SMs busy, so the positions are cut into chunks of >= 64; one block per
// (chunk, kv head) computes all the query heads that share that kv head (GQA: K and V are read once per group, not
// once per query head), and the last block to finish for a kv head rescales and sums the chunks:
// o = sum_j exp(m_j - M) o_j / sum_j exp(m_j - M) l_j.
//
// v1 (docs/CUDA_NOTES.md) staged scores in shared memory between three block-wide phases and combined in a second
// kernel whose threads walked the chunks one dependent load at a time: 23.6 us at 4k context, 4x the bytes' time.
// v2: every thread issues all its K and V loads of a tile at once (one memory round trip per tile), keeps an online
// softmax in registers (no block-wide phases), and the combine is fused behind an atomic ticket. Slower (34.9 us):
// a grid of 64-position chunks over the whole cache (three waves of blocks) and a combine that still walked the
// chunks serially. v3 (this): a one-wave grid (two blocks per SM), 8 positions per thread per tile, and a combine
// with 8 float4 loads in flight per thread.
// v4 (the default; TESSERA_CUDA_ATTN_V1=1 restores v3): at short context a kv head is one block and v3's 4 warps
// each ran ~1000 dependent instructions per 128-position tile with one warp per scheduler to hide them (~1.5 us a
// tile). v4 spreads a tile over 16 warps (2 positions per thread per tile instead of 8), skips the steps that start
// past the chunk's end, runs a group of 3 without an idle fourth head, uses ex2 on log2-scaled scores, sizes its
// grid for one wave of its own blocks, and asks the next 64 KB of K and V into L2 ahead of the tile loop.
// Batched decode (attn_decode_rows) is the same kernel with a row dimension folded into grid z: row r reads its own
// q row, position pos[r] and cache slot seq[r], and owns its own partials and tickets. With t rows the chunks per kv
// head shrink (about max_splits / t, at least 1) so the grid stays about one wave.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace detail {
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
// v4 runs a group of exactly 3 (SmolLM2) as G = 3: same tile count, no idle fourth head.
int head_tile(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }

// exp(a - b) that is 0 when a is -inf (an empty state), also when b is -inf too (instead of NaN).
__device__ __forceinline__ float exp_diff(float a, float b) { return a == -INFINITY ? 0.0f : expf(a - b); }

// v4 keeps scores in log2 units (q is scaled by log2(e)): one MUFU.EX2 instead of expf's ~8 instructions. Its ~2 ulp
// relative error and flushing weights below 2^-126 to zero move the output far less than the tests' 2e-5.
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

// Block shape per version. v3 (TESSERA_CUDA_ATTN_V1=1): 4 warps, 8 (or 4) positions per thread per tile: at short
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

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
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
};

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
template <typename T, int HD, int G, bool kRope, bool kV4>
__global__ void __launch_bounds__(attn_warps<HD, G, kV4>() * kWarp, 1) attn_split_kernel(const AttnParams<T> a) {
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
  __shared__ float s_w[G][kMaxSplits];
  __shared__ __align__(16) Slice8<T> s_new[2][kRope ? HD / 8 : 1];  // this token's k and v in the cache type
  __shared__ bool s_last;

  pdl_wait();
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
    if (blockIdx.x == 0)
      for (int i = threadIdx.x; i < nh * HD; i += kThreads)
        out[static_cast<size_t>(head0) * HD + i] = __int_as_float(0x7fc00000);
    return;
  }
  const int ctx = pos + 1;
  const int chunk = attn_chunk(ctx, gridDim.x, a.min_chunk);
  const int split = blockIdx.x;
  const int start = split * chunk;
  if (start >= ctx) return;
  const int len = min(chunk, ctx - start);
  const int n_splits = (ctx + chunk - 1) / chunk;
  // Positions of this chunk read from the cache: the fused path takes pos itself from shared memory.
  const int n_load = kRope ? min(len, pos - start) : len;
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  const int ld = lane % LPP, sub = lane / LPP;
  const size_t row0 = (static_cast<size_t>(slot) * n_kv + kvh) * a.n_ctx + start;
  const T* kbase = a.kc + row0 * HD + ld * 8;
  const T* vbase = a.vc + row0 * HD + ld * 8;

  Slice8<T> kr[kSteps], vr[kSteps];
  auto load_tile = [&](int t0) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int p = t0 + s * PG + warp * PPW + sub;
      const bool in = p < n_load;
      kr[s] = in ? load_slice(kbase + static_cast<size_t>(p) * HD) : zero_slice<T>();
      vr[s] = in ? load_slice(vbase + static_cast<size_t>(p) * HD) : zero_slice<T>();
    }
  };
  // The first tile's loads depend only on pos: in flight while q is loaded (and rotated).
  load_tile(0);
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
        const float theta = static_cast<float>(pos) * a.inv_freq[j];
        float sn, cs;
        sincosf(theta, &sn, &cs);  // the accurate version, as rope_store_kv
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
    if (t0 > 0) load_tile(t0);
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
      const float w = exp_rel<kV4>(v.x, mx);
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

// The fused path's extra inputs: this token's k and v rows and the rotation (k == nullptr: unfused).
struct RopeIn {
  const float* k = nullptr;
  const float* v = nullptr;
  size_t ld_kv = 0;
  const float* inv_freq = nullptr;
  int rope_dim = 0;
  bool neox = false;
};

// One launch's arguments, shared by attn_decode (t = 1) and attn_decode_rows, fused or not.
struct AttnArgs {
  const float* q;
  size_t ld_q;
  const int32_t* pos;
  const int32_t* seq;
  int t;
  float* out;
  int64_t n_head;
  float scale;
  int splits;
  float* part_out;
  float2* part_ml;
  unsigned int* counters;
  cudaStream_t stream;
  RopeIn rope;
};

// TESSERA_CUDA_ATTN_CHUNK=N (a multiple of 64) overrides the smallest chunk, for measuring the single-block/split
// trade-off; read at launch, so at capture for graphs.
int min_chunk_override() {
  const char* e = std::getenv("TESSERA_CUDA_ATTN_CHUNK");
  if (e == nullptr) return 0;
  const int v = std::atoi(e);
  return v >= kMinChunk && v % kMinChunk == 0 && v <= (1 << 24) ? v : 0;
}

// TESSERA_CUDA_ATTN_V1=1 launches v3 (the kernel before v4), for measuring both in one run; read at launch.
bool attn_v3_forced() {
  const char* e = std::getenv("TESSERA_CUDA_ATTN_V1");
  return e != nullptr && std::string(e) == "1";
}

// Blocks of a kernel resident per SM (its registers and shared memory decide), asked once per kernel.
template <typename K>
int resident_blocks(K* kernel, int threads) {
  int n = 0;
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
  return std::max(1, n);
}

template <typename T, int HD, int G, bool kV4>
void launch_split(const KvCacheView& c, const AttnArgs& a, int group) {
  constexpr int threads = attn_warps<HD, G, kV4>() * kWarp;
  auto* kernel = a.rope.k != nullptr ? attn_split_kernel<T, HD, G, true, kV4> : attn_split_kernel<T, HD, G, false, kV4>;
  const int tiles = (group + G - 1) / G;
  int splits = a.splits;  // sized for v3's one wave of two 4-warp blocks per SM
  if constexpr (kV4) {
    // One wave of v4's blocks (one 16-warp block per SM for hd 64/128): longer chunks, fewer combines.
    static const int per_sm = std::max(resident_blocks(attn_split_kernel<T, HD, G, false, kV4>, threads),
                                       resident_blocks(attn_split_kernel<T, HD, G, true, kV4>, threads));
    const int64_t blocks = c.n_kv * tiles * a.t;
    splits = std::max(1, std::min(splits, ceil_div(int64_t{per_sm} * sm_count(), blocks)));
  }
  const dim3 grid(splits, static_cast<unsigned>(c.n_kv), static_cast<unsigned>(tiles * a.t));
  const int forced = min_chunk_override();
  const int min_chunk = forced ? forced : default_min_chunk<T, HD, G, kV4>();
  AttnParams<T> p{};
  p.q = a.q, p.ld_q = a.ld_q, p.kc = static_cast<T*>(c.k), p.vc = static_cast<T*>(c.v), p.pos = a.pos, p.seq = a.seq;
  p.n_ctx = static_cast<int>(c.n_ctx), p.n_seq = static_cast<int>(c.n_seq), p.group = group, p.tiles = tiles;
  p.max_splits = a.splits, p.min_chunk = min_chunk, p.scale = a.scale;
  p.part_out = a.part_out, p.part_ml = a.part_ml, p.counters = a.counters, p.out = a.out;
  p.k_new = a.rope.k, p.v_new = a.rope.v, p.ld_kv = a.rope.ld_kv, p.inv_freq = a.rope.inv_freq;
  p.rope_dim = a.rope.rope_dim, p.neox = a.rope.neox;
  launch(a.rope.k != nullptr ? "attn_split_kernel<rope>" : "attn_split_kernel", kernel, grid, dim3(threads), 0,
         a.stream, p);
}

template <typename T, int HD, bool kV4>
void launch_version(const KvCacheView& c, const AttnArgs& a) {
  const int group = static_cast<int>(a.n_head / c.n_kv);
  // The smallest head tile that holds the group (groups over 8 take several tiles): fewer idle registers.
  if constexpr (kV4) {
    if (group == 3) return launch_split<T, HD, 3, kV4>(c, a, group);
  }
  if (head_tile(group) == 1)
    launch_split<T, HD, 1, kV4>(c, a, group);
  else if (head_tile(group) == 2)
    launch_split<T, HD, 2, kV4>(c, a, group);
  else if (head_tile(group) == 4)
    launch_split<T, HD, 4, kV4>(c, a, group);
  else
    launch_split<T, HD, 8, kV4>(c, a, group);
}

// An f32 cache runs v4 only (v3 is kept for measuring the 16-bit caches; fewer instantiations to compile).
template <typename T, int HD>
void launch_hd(const KvCacheView& c, const AttnArgs& a) {
  if constexpr (!std::is_same_v<T, float>) {
    if (attn_v3_forced()) return launch_version<T, HD, false>(c, a);
  }
  launch_version<T, HD, true>(c, a);
}

template <typename T>
void launch_typed(const KvCacheView& c, const AttnArgs& a) {
  if (c.hd == 64) launch_hd<T, 64>(c, a);
  if (c.hd == 128) launch_hd<T, 128>(c, a);
  if (c.hd == 256) launch_hd<T, 256>(c, a);
}

void launch_attn(const KvCacheView& c, const AttnArgs& a) {
  if (c.dtype == DType::F16)
    launch_typed<__half>(c, a);
  else if (c.dtype == DType::F32)
    launch_typed<float>(c, a);
  else
    launch_typed<__nv_bfloat16>(c, a);
}

// The fused path's checks on this token's k/v rows and the rotation (as rope_store_kv's).
void require_rope(const char* op, const KvCacheView& c, const RopeIn& r) {
  const std::string o(op);
  TESSERA_CUDA_REQUIRE(r.k && r.v, o + ": the k or v pointer is null");
  TESSERA_CUDA_REQUIRE(r.rope_dim >= 0 && r.rope_dim % 2 == 0 && r.rope_dim <= c.hd,
                       o + ": rope_dim " + num(r.rope_dim) + " must be even and at most the head size");
  TESSERA_CUDA_REQUIRE(r.rope_dim == 0 || r.inv_freq != nullptr, o + ": inv_freq is null");
  TESSERA_CUDA_REQUIRE(r.ld_kv >= static_cast<size_t>(c.n_kv * c.hd),
                       o + ": the k/v row stride " + num(static_cast<int64_t>(r.ld_kv)) +
                           " is smaller than the kv heads' width");
}

int head_tiles(int64_t n_head, const KvCacheView& c) {
  const int group = static_cast<int>(n_head / c.n_kv);
  return (group + head_tile(group) - 1) / head_tile(group);
}

// Chunks per kv head for t rows: one wave of two blocks per SM over all rows (v2 sized the grid by chunks of 64 at
// the full cache: 1024 blocks for an 8k cache, three waves of mostly idle blocks), never more chunks of 64 than the
// cache holds, at most 256.
int attn_splits(int64_t n_head, const KvCacheView& c, int64_t t) {
  const int64_t blocks = c.n_kv * head_tiles(n_head, c) * t;
  const int fill = ceil_div(2 * sm_count(), blocks);
  return std::max(1, std::min({kMaxSplits, fill, ceil_div(c.n_ctx, kMinChunk)}));
}
int attn_max_splits(int64_t n_head, const KvCacheView& c) { return attn_splits(n_head, c, 1); }

void require_cache(const char* op, const KvCacheView& c, int64_t n_head) {
  const std::string o(op);
  TESSERA_CUDA_REQUIRE(c.k && c.v, o + ": the KV cache pointers are null");
  TESSERA_CUDA_REQUIRE(c.dtype == DType::F16 || c.dtype == DType::BF16 || c.dtype == DType::F32,
                       o + ": the KV cache must be f16, bf16 or f32");
  TESSERA_CUDA_REQUIRE(c.hd == 64 || c.hd == 128 || c.hd == 256,
                       o + ": head size " + num(c.hd) + " is not supported (64, 128 or 256)");
  TESSERA_CUDA_REQUIRE(c.n_ctx > 0 && c.n_ctx <= kMaxCtx, o + ": context size " + num(c.n_ctx) + " is outside 1..2^24");
  TESSERA_CUDA_REQUIRE(n_head > 0 && c.n_kv > 0 && n_head % c.n_kv == 0 && c.n_kv < 65536,
                       o + ": " + num(n_head) + " query heads do not group over " + num(c.n_kv) + " kv heads");
}

}  // namespace
}  // namespace detail

AttnWorkspace::AttnWorkspace(int64_t n_head, const KvCacheView& cache) : n_head_(n_head), hd_(cache.hd) {
  detail::require_cache("attention workspace", cache, n_head);
  max_splits_ = detail::attn_max_splits(n_head, cache);
  out_ = DeviceBuffer(sizeof(float) * static_cast<size_t>(n_head) * max_splits_ * hd_);
  ml_ = DeviceBuffer(sizeof(float2) * static_cast<size_t>(n_head) * max_splits_);
  counters_ = DeviceBuffer(sizeof(unsigned int) * static_cast<size_t>(n_head));  // >= n_kv * head tiles
  counters_.fill_bytes(0);
}

namespace {

void decode_one(const char* op, const float* q, const KvCacheView& cache, const int32_t* pos, float* out,
                int64_t n_head, float scale, AttnWorkspace& ws, cudaStream_t stream, const detail::RopeIn& rope) {
  const std::string o(op);
  detail::require_cache(op, cache, n_head);
  TESSERA_CUDA_REQUIRE(q && pos && out, o + ": a pointer argument is null");
  TESSERA_CUDA_REQUIRE(detail::aligned16(q) && detail::aligned16(out), o + ": q and out must be 16-byte aligned");
  TESSERA_CUDA_REQUIRE(
      ws.n_head() == n_head && ws.hd() == cache.hd && ws.max_splits() == detail::attn_max_splits(n_head, cache),
      o + ": the workspace was made for another head count, head size or context size");
  if (rope.k != nullptr || rope.v != nullptr) detail::require_rope(op, cache, rope);
  detail::AttnArgs a{q,
                     static_cast<size_t>(n_head * cache.hd),
                     pos,
                     nullptr,
                     1,
                     out,
                     n_head,
                     scale,
                     ws.max_splits(),
                     ws.partial_out(),
                     ws.partial_ml(),
                     ws.counters(),
                     stream};
  a.rope = rope;
  detail::launch_attn(cache, a);
}

}  // namespace

void attn_decode(const float* q, const KvCacheView& cache, const int32_t* pos, float* out, int64_t n_head, float scale,
                 AttnWorkspace& ws, cudaStream_t stream) {
  decode_one("attn_decode", q, cache, pos, out, n_head, scale, ws, stream, detail::RopeIn{});
}

void attn_decode_rope(const float* q, const float* k, const float* v, const KvCacheView& cache, const int32_t* pos,
                      int64_t rope_dim, const float* inv_freq, bool neox, float* out, int64_t n_head, float scale,
                      AttnWorkspace& ws, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(k && v, "attn_decode_rope: the k or v pointer is null");
  const detail::RopeIn rope{k, v, static_cast<size_t>(cache.n_kv * cache.hd), inv_freq, static_cast<int>(rope_dim),
                            neox};
  TESSERA_CUDA_REQUIRE(rope_dim >= 0 && rope_dim <= cache.hd,
                       "attn_decode_rope: rope_dim " + detail::num(rope_dim) + " is outside 0..head size");
  decode_one("attn_decode_rope", q, cache, pos, out, n_head, scale, ws, stream, rope);
}

// ---------------------------------------------------------------------------------------------------------------------
// Batched decode

struct AttnRowsWorkspace::Impl {
  int64_t max_t = 0, n_head = 0, n_kv = 0, hd = 0, n_ctx = 0;
  int64_t capacity = 0;   // max over t <= max_t of t * attn_splits(t): chunk partials per head
  DeviceBuffer out;       // [capacity, n_head, hd] unnormalized partial outputs
  DeviceBuffer ml;        // [capacity, n_head] (max score, sum of exp)
  DeviceBuffer counters;  // [max_t, n_kv, head tiles] chunks finished; zero between launches
};

AttnRowsWorkspace::AttnRowsWorkspace(int64_t max_t, int64_t n_head, const KvCacheView& cache)
    : impl_(std::make_unique<Impl>()) {
  detail::require_cache("attention rows workspace", cache, n_head);
  TESSERA_CUDA_REQUIRE(max_t > 0 && max_t * detail::head_tiles(n_head, cache) <= 65535,
                       "attention rows workspace: row count " + detail::num(max_t) + " is outside 1..65535 / tiles");
  Impl& w = *impl_;
  w.max_t = max_t, w.n_head = n_head, w.n_kv = cache.n_kv, w.hd = cache.hd, w.n_ctx = cache.n_ctx;
  for (int64_t t = 1; t <= max_t; ++t) w.capacity = std::max(w.capacity, t * detail::attn_splits(n_head, cache, t));
  w.out = DeviceBuffer(sizeof(float) * static_cast<size_t>(w.capacity * n_head * cache.hd));
  w.ml = DeviceBuffer(sizeof(float2) * static_cast<size_t>(w.capacity * n_head));
  w.counters = DeviceBuffer(sizeof(unsigned int) * static_cast<size_t>(max_t * n_head));  // >= n_kv * head tiles
  w.counters.fill_bytes(0);
}
AttnRowsWorkspace::~AttnRowsWorkspace() = default;
int64_t AttnRowsWorkspace::max_t() const { return impl_->max_t; }

namespace {

void decode_rows(const char* op, const float* q, int64_t ld_q, const KvCacheView& cache, const int32_t* pos,
                 const int32_t* seq, int64_t t, float* out, int64_t n_head, float scale, AttnRowsWorkspace& ws,
                 cudaStream_t stream, const detail::RopeIn& rope) {
  using detail::num;
  const std::string o(op);
  detail::require_cache(op, cache, n_head);
  const AttnRowsWorkspace::Impl& w = ws.impl();
  TESSERA_CUDA_REQUIRE(q && pos && out, o + ": a pointer argument is null");
  TESSERA_CUDA_REQUIRE(t > 0 && t <= w.max_t,
                       o + ": row count " + num(t) + " is outside 1.." + num(w.max_t) + " (the workspace's size)");
  TESSERA_CUDA_REQUIRE(w.n_head == n_head && w.n_kv == cache.n_kv && w.hd == cache.hd && w.n_ctx == cache.n_ctx,
                       o + ": the workspace was made for another head count, head size or context size");
  TESSERA_CUDA_REQUIRE(cache.n_seq > 0 && cache.n_seq < (int64_t{1} << 31), o + ": n_seq is invalid");
  TESSERA_CUDA_REQUIRE(ld_q >= n_head * cache.hd && ld_q % 4 == 0 && detail::aligned16(q) && detail::aligned16(out),
                       o + ": q and out must be 16-byte aligned and ld_q " + num(ld_q) +
                           " a multiple of 4 of at least the heads' width");
  if (rope.k != nullptr || rope.v != nullptr) detail::require_rope(op, cache, rope);
  const int splits = detail::attn_splits(n_head, cache, t);
  detail::AttnArgs a{q,
                     static_cast<size_t>(ld_q),
                     pos,
                     seq,
                     static_cast<int>(t),
                     out,
                     n_head,
                     scale,
                     splits,
                     w.out.as<float>(),
                     w.ml.as<float2>(),
                     w.counters.as<unsigned int>(),
                     stream};
  a.rope = rope;
  detail::launch_attn(cache, a);
}

}  // namespace

void attn_decode_rows(const float* q, int64_t ld_q, const KvCacheView& cache, const int32_t* pos, const int32_t* seq,
                      int64_t t, float* out, int64_t n_head, float scale, AttnRowsWorkspace& ws, cudaStream_t stream) {
  decode_rows("attn_decode_rows", q, ld_q, cache, pos, seq, t, out, n_head, scale, ws, stream, detail::RopeIn{});
}

void attn_decode_rope_rows(const float* q, int64_t ld_q, const float* k, const float* v, int64_t ld_kv,
                           const KvCacheView& cache, const int32_t* pos, const int32_t* seq, int64_t t,
                           int64_t rope_dim, const float* inv_freq, bool neox, float* out, int64_t n_head, float scale,
                           AttnRowsWorkspace& ws, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(k && v, "attn_decode_rope_rows: the k or v pointer is null");
  TESSERA_CUDA_REQUIRE(ld_kv >= 0 && rope_dim >= 0 && rope_dim <= cache.hd,
                       "attn_decode_rope_rows: ld_kv " + detail::num(ld_kv) + " or rope_dim " +
                           detail::num(rope_dim) + " is out of range");
  const detail::RopeIn rope{k, v, static_cast<size_t>(ld_kv), inv_freq, static_cast<int>(rope_dim), neox};
  decode_rows("attn_decode_rope_rows", q, ld_q, cache, pos, seq, t, out, n_head, scale, ws, stream, rope);
}

}  // namespace tessera::cuda
