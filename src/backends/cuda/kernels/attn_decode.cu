// Decode attention (one query token) over an f16/bf16 KV cache, split-K ("flash-decoding"). A single kv head's keys
// are far too few bytes to keep 132 SMs busy, so the positions are cut into chunks of >= 64; one block per
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
// Batched decode (attn_decode_rows) is the same kernel with a row dimension folded into grid z: row r reads its own
// q row, position pos[r] and cache slot seq[r], and owns its own partials and tickets. With t rows the chunks per kv
// head shrink (about max_splits / t, at least 1) so the grid stays about one wave.
#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / kWarp;
constexpr int kMinChunk = 64;
constexpr int kMaxSplits = 256;  // also the combine's shared-memory weight buffer
constexpr int64_t kMaxCtx = int64_t{1} << 24;

// The chunk length for a context of ctx positions, the same in every block: a multiple of 64 such that at most
// max_splits chunks cover ctx.
__device__ __forceinline__ int attn_chunk(int ctx, int max_splits) {
  const int c = (ctx + max_splits - 1) / max_splits;
  return max(kMinChunk, (c + kMinChunk - 1) / kMinChunk * kMinChunk);
}

template <typename T>
__device__ __forceinline__ void to_float8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
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

// Query heads per block for a GQA group: the smallest of 1, 2, 4, 8 that holds it (groups over 8 take several).
int head_tile(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }

// exp(a - b) that is 0 when a is -inf (an empty state), also when b is -inf too (instead of NaN).
__device__ __forceinline__ float exp_diff(float a, float b) { return a == -INFINITY ? 0.0f : expf(a - b); }

// Grid (splits, n_kv, tiles * t) with tiles = ceil(group / G); each block handles up to G query heads of one kv head
// of one row over one chunk.
// Lanes: HD/8 lanes (a sub-group) hold one position's 8-element slices (16-byte loads), so a warp covers 32/(HD/8)
// positions per step. Each sub-group keeps its own online-softmax state (m, l and its lanes' slices of o); sub-groups
// and warps merge at the end.
template <typename T, int HD, int G>
__global__ void __launch_bounds__(kAttnThreads, 1)
    attn_split_kernel(const float* __restrict__ q /*[t, ld_q]*/, size_t ld_q, const T* __restrict__ kc,
                      const T* __restrict__ vc /*[n_seq, n_kv, n_ctx, HD]*/,
                      const int32_t* __restrict__ pos_ptr /*[t]*/, const int32_t* __restrict__ seq_ptr /*[t] or null*/,
                      int n_ctx, int n_seq, int group, int tiles, float scale, int max_splits,
                      float* __restrict__ part_out /*[t, n_head, splits, HD]*/,
                      float2* __restrict__ part_ml /*[t, n_head, splits]*/,
                      unsigned int* __restrict__ counters /*[t, n_kv, tiles]*/,
                      float* __restrict__ out /*[t, n_head, HD]*/) {
  constexpr int LPP = HD / 8;           // lanes per position
  constexpr int PPW = kWarp / LPP;      // positions per warp step
  constexpr int PG = kAttnWarps * PPW;  // positions per block step
  // Positions per thread per tile: kSteps K and kSteps V 16-byte loads in flight; 4 where registers are short.
  constexpr int kSteps = (G <= 4 && HD <= 128) ? 8 : 4;
  constexpr int kTile = PG * kSteps;
  __shared__ __align__(16) float s_acc[kAttnWarps][G][HD];
  __shared__ float s_m[kAttnWarps][G], s_l[kAttnWarps][G];
  __shared__ float s_w[G][kMaxSplits];
  __shared__ bool s_last;

  pdl_wait();
  const int kvh = blockIdx.y;
  const int row = blockIdx.z / tiles, tile = blockIdx.z % tiles;
  const int n_kv = gridDim.y, n_head = n_kv * group;
  const int head0 = kvh * group + tile * G;
  const int nh = min(G, group - tile * G);
  q += row * ld_q;
  out += static_cast<size_t>(row) * n_head * HD;
  part_out += static_cast<size_t>(row) * n_head * max_splits * HD;
  part_ml += static_cast<size_t>(row) * n_head * max_splits;
  const int pos = pos_ptr[row];
  const int slot = seq_ptr ? seq_ptr[row] : 0;
  if (pos < 0 || pos >= n_ctx || slot < 0 || slot >= n_seq) {
    if (blockIdx.x == 0)
      for (int i = threadIdx.x; i < nh * HD; i += kAttnThreads)
        out[static_cast<size_t>(head0) * HD + i] = __int_as_float(0x7fc00000);
    return;
  }
  const int ctx = pos + 1;
  const int chunk = attn_chunk(ctx, max_splits);
  const int split = blockIdx.x;
  const int start = split * chunk;
  if (start >= ctx) return;
  const int len = min(chunk, ctx - start);
  const int n_splits = (ctx + chunk - 1) / chunk;
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  const int ld = lane % LPP, sub = lane / LPP;
  const size_t row0 = (static_cast<size_t>(slot) * n_kv + kvh) * n_ctx + start;
  const T* kbase = kc + row0 * HD + ld * 8;
  const T* vbase = vc + row0 * HD + ld * 8;

  float qv[G][8];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h < nh) {
      const float4* qp = reinterpret_cast<const float4*>(q + static_cast<size_t>(head0 + h) * HD + ld * 8);
      const float4 a = qp[0], b = qp[1];
      qv[h][0] = a.x * scale, qv[h][1] = a.y * scale, qv[h][2] = a.z * scale, qv[h][3] = a.w * scale;
      qv[h][4] = b.x * scale, qv[h][5] = b.y * scale, qv[h][6] = b.z * scale, qv[h][7] = b.w * scale;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) qv[h][j] = 0.0f;
    }
  }
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[h][j] = 0.0f;
  }

  // The tile loop is warp-uniform (t0 is the same in every lane), so the shuffles always have all 32 lanes.
  for (int t0 = 0; t0 < len; t0 += kTile) {
    uint4 kr[kSteps], vr[kSteps];
    bool valid[kSteps];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int p = t0 + s * PG + warp * PPW + sub;
      valid[s] = p < len;
      kr[s] = valid[s] ? ld_stream16(kbase + static_cast<size_t>(p) * HD) : make_uint4(0, 0, 0, 0);
      vr[s] = valid[s] ? ld_stream16(vbase + static_cast<size_t>(p) * HD) : make_uint4(0, 0, 0, 0);
    }
    float sc[kSteps][G];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
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
      const float corr = exp_diff(m[h], mt);
      l[h] *= corr;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[h][j] *= corr;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        float vf[8];
        to_float8<T>(vr[s], vf);
        const float e = exp_diff(sc[s][h], mt);
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
      const float c1 = exp_diff(m[h], mn), c2 = exp_diff(mo, mn);
      l[h] = l[h] * c1 + lo * c2;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[h][j], off);
        acc[h][j] = acc[h][j] * c1 + ao * c2;
      }
      m[h] = mn;
    }
  }
  // Merge the warps through shared memory and store this chunk's partial result.
  if (sub == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float4* dst = reinterpret_cast<float4*>(&s_acc[warp][h][ld * 8]);
      dst[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
      dst[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
      if (ld == 0) s_m[warp][h] = m[h], s_l[warp][h] = l[h];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh * HD; i += kAttnThreads) {
    const int h = i / HD, d = i % HD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, s_m[w][h]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) {
      const float c = exp_diff(s_m[w][h], mx);
      o = fmaf(s_acc[w][h][d], c, o);
      sum = fmaf(s_l[w][h], c, sum);
    }
    part_out[(static_cast<size_t>(head0 + h) * max_splits + split) * HD + d] = o;
    if (d == 0) part_ml[static_cast<size_t>(head0 + h) * max_splits + split] = make_float2(mx, sum);
  }

  // The last chunk to finish for this (kv head, head tile) combines all chunks.
  __threadfence();  // publish this block's partials before taking a ticket
  __syncthreads();
  unsigned int* counter = counters + (static_cast<size_t>(row) * n_kv + kvh) * tiles + tile;
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == static_cast<unsigned>(n_splits - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Weights exp(m_j - M) per head and chunk (n_splits <= kMaxSplits), and the normalizer.
  for (int h = warp; h < nh; h += kAttnWarps) {
    const float2* ml = part_ml + static_cast<size_t>(head0 + h) * max_splits;
    float mx = -INFINITY;
    for (int j = lane; j < n_splits; j += kWarp) mx = fmaxf(mx, __ldcg(&ml[j].x));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n_splits; j += kWarp) {
      const float2 v = __ldcg(&ml[j]);
      const float w = exp_diff(v.x, mx);
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
  for (int i = threadIdx.x; i < nh * kVec; i += kAttnThreads) {
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

// One launch's arguments, shared by attn_decode (t = 1) and attn_decode_rows.
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
};

template <typename T, int HD, int G>
void launch_split(const KvCacheView& c, const AttnArgs& a, int group) {
  const int tiles = (group + G - 1) / G;
  const dim3 grid(a.splits, static_cast<unsigned>(c.n_kv), static_cast<unsigned>(tiles * a.t));
  launch("attn_split_kernel", attn_split_kernel<T, HD, G>, grid, dim3(kAttnThreads), 0, a.stream, a.q, a.ld_q,
         static_cast<const T*>(c.k), static_cast<const T*>(c.v), a.pos, a.seq, static_cast<int>(c.n_ctx),
         static_cast<int>(c.n_seq), group, tiles, a.scale, a.splits, a.part_out, a.part_ml, a.counters, a.out);
}

template <typename T, int HD>
void launch_hd(const KvCacheView& c, const AttnArgs& a) {
  const int group = static_cast<int>(a.n_head / c.n_kv);
  // The smallest head tile that holds the group (groups over 8 take several tiles): fewer idle registers.
  if (head_tile(group) == 1)
    launch_split<T, HD, 1>(c, a, group);
  else if (head_tile(group) == 2)
    launch_split<T, HD, 2>(c, a, group);
  else if (head_tile(group) == 4)
    launch_split<T, HD, 4>(c, a, group);
  else
    launch_split<T, HD, 8>(c, a, group);
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
  else
    launch_typed<__nv_bfloat16>(c, a);
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
  TESSERA_CUDA_REQUIRE(c.dtype == DType::F16 || c.dtype == DType::BF16, o + ": the KV cache must be f16 or bf16");
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

void attn_decode(const float* q, const KvCacheView& cache, const int32_t* pos, float* out, int64_t n_head, float scale,
                 AttnWorkspace& ws, cudaStream_t stream) {
  detail::require_cache("attn_decode", cache, n_head);
  TESSERA_CUDA_REQUIRE(q && pos && out, "attn_decode: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(detail::aligned16(q) && detail::aligned16(out),
                       "attn_decode: q and out must be 16-byte aligned");
  TESSERA_CUDA_REQUIRE(
      ws.n_head() == n_head && ws.hd() == cache.hd && ws.max_splits() == detail::attn_max_splits(n_head, cache),
      "attn_decode: the workspace was made for another head count, head size or context size");
  const detail::AttnArgs a{q,
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
  detail::launch_attn(cache, a);
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

void attn_decode_rows(const float* q, int64_t ld_q, const KvCacheView& cache, const int32_t* pos, const int32_t* seq,
                      int64_t t, float* out, int64_t n_head, float scale, AttnRowsWorkspace& ws, cudaStream_t stream) {
  using detail::num;
  detail::require_cache("attn_decode_rows", cache, n_head);
  const AttnRowsWorkspace::Impl& w = ws.impl();
  TESSERA_CUDA_REQUIRE(q && pos && out, "attn_decode_rows: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(t > 0 && t <= w.max_t, "attn_decode_rows: row count " + num(t) + " is outside 1.." +
                                                  num(w.max_t) + " (the workspace's size)");
  TESSERA_CUDA_REQUIRE(w.n_head == n_head && w.n_kv == cache.n_kv && w.hd == cache.hd && w.n_ctx == cache.n_ctx,
                       "attn_decode_rows: the workspace was made for another head count, head size or context size");
  TESSERA_CUDA_REQUIRE(cache.n_seq > 0 && cache.n_seq < (int64_t{1} << 31), "attn_decode_rows: n_seq is invalid");
  TESSERA_CUDA_REQUIRE(ld_q >= n_head * cache.hd && ld_q % 4 == 0 && detail::aligned16(q) && detail::aligned16(out),
                       "attn_decode_rows: q and out must be 16-byte aligned and ld_q " + num(ld_q) +
                           " a multiple of 4 of at least the heads' width");
  const int splits = detail::attn_splits(n_head, cache, t);
  const detail::AttnArgs a{q,
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
  detail::launch_attn(cache, a);
}

}  // namespace tessera::cuda
