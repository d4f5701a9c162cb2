// Decode attention v6's short-context path (attn_decode.cu's header has the history; included by attn_decode.cu
// after attn_decode_kernel.cuh, whose attn_split_kernel calls attn_short when the context is at most a.short_limit).
//
// Why: at the contexts small models decode at (SmolLM2: 9 q heads over 3 kv heads, hd 64, a few hundred positions)
// v5 is one 16-warp block per kv head computing all three of its query heads, walking 128-position tiles (one memory
// round trip each), and beyond two tiles it splits the context and combines through global partials and a ticket
// (~3 dependent L2 round trips): 3.7 us at 128 positions, 7.6 us at 512, for ~0.1-0.3 MB of K and V.
// v6 below: one block per QUERY head (9 blocks instead of 3: a third of the arithmetic per thread; the 3 readers of a
// kv head share its lines in L2), every position of the context in registers (kShortSteps 16-byte slices of K and of
// V per lane, all loaded before pdl_wait()), q and this token's k rotated in registers (no shared-memory round trip,
// one barrier for the angle table before the wait), one pass of scores, one softmax, one merge: no tile loop, no
// partials, no ticket. The grid's other blocks exit at once.
#pragma once

#include "backends/cuda/kernels/attn_decode_kernel.cuh"

namespace tessera::cuda::detail {
namespace {

// 16-byte slices of K and of V per lane: 64 registers for f16/bf16 (the same bytes for f32, whose slices are twice
// the registers), so a 16-warp block covers 512 positions at hd 64 and 256 at hd 128.
template <typename T>
constexpr int short_steps() {
  return 8 / (static_cast<int>(sizeof(T)) / 2);
}
template <typename T, int HD, int kWarps>
constexpr int short_positions() {
  return short_steps<T>() * kWarps * (kWarp / (HD / 8));
}

// 8 cache-type elements (one lane's slice) from 8 floats, rounded as rope_store_kv rounds them.
template <typename T>
__device__ __forceinline__ Slice8<T> to_slice(const float (&f)[8]) {
  Slice8<T> s;
  if constexpr (std::is_same_v<T, float>) {
    s.p[0] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    s.p[1] = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]), __float_as_uint(f[7]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const T lo = from_float<T>(f[2 * i]), hi = from_float<T>(f[2 * i + 1]);
      uint16_t l16, h16;
      memcpy(&l16, &lo, 2), memcpy(&h16, &hi, 2);
      w[i] = static_cast<uint32_t>(l16) | (static_cast<uint32_t>(h16) << 16);
    }
    s.p[0] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  return s;
}

// Elements [e0, e0 + 8) of one head (a lane's slice, own[8]) rotated by RoPE with the (cos, sin) table cs (rope_dim / 2
// entries), in the pairing of rope_store_kv: normal pairs (2j, 2j + 1) lie inside the slice; neox pairs (j, j + half)
// with half = rope_dim / 2 a multiple of 8 (the launcher's condition) lie in the lane half / 8 away in the same
// position's sub-group, at the same index: one shuffle each, no second load. Elements from rope_dim on are not rotated.
// The whole warp takes part. The two products are written as rope_store_kv and v5 write them (first of a pair:
// a c - b s, second: a s + b c).
__device__ __forceinline__ void rope_slice8(const float (&own)[8], int e0, int rope_dim, bool neox, const float2* cs,
                                            float (&y)[8]) {
  const int half = rope_dim / 2;
  float other[8];
  if (neox) {
    const int lane = threadIdx.x & (kWarp - 1);
    const int src = e0 >= rope_dim ? lane : e0 < half ? lane + half / 8 : lane - half / 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) other[i] = __shfl_sync(0xffffffffu, own[i], src);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) other[i] = own[i ^ 1];
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int e = e0 + i;
    if (e >= rope_dim) {
      y[i] = own[i];
      continue;
    }
    const bool first = neox ? e < half : (e & 1) == 0;
    const float2 t = cs[neox ? (first ? e : e - half) : (e >> 1)];
    if (first) {
      const float xa = own[i], xb = other[i];
      y[i] = xa * t.x - xb * t.y;
    } else {
      const float xa = other[i], xb = own[i];
      y[i] = xa * t.y + xb * t.x;
    }
  }
}

// Query head `head` (of n_kv * a.group) of row `row` over the whole context (ctx = pos + 1 <= short_positions())
// in one block of kWarps warps. Lanes: as attn_split_kernel (HD / 8 lanes per position, 16-byte slices); position p
// lives in step p / PG of warp (p % PG) / PPW. store: this block writes this token's k and v into the cache (one
// block per kv head). Shared memory (the caller's): s_acc [kWarps][G][HD] (only [w][0] used), s_m / s_l [kWarps][G],
// s_cs [rope_dim / 2]. Ordering contract as v5 (early): before pdl_wait() only pos, the cache below pos and inv_freq
// are read.
//
// kMaxWin > 1 (the compact kernel): a context longer than one register window (S * PG positions) is walked in up to
// kMaxWin windows with an online softmax across them; the first window is loaded before pdl_wait() as above, the later
// windows' cache lines (below pos) are asked into L2 before the wait and loaded into the same registers when the
// previous window is done (one L2 round trip each, instead of v5's chunks, partials and ticket). The caller keeps
// ctx <= kMaxWin * S * PG.
// kWindow: the sliding window (a.window) masks keys too (the split kernel's call; the compact kernel has no registers
// to spare for it at HD 256, and its launcher sends windowed attention to the split kernel).
template <typename T, int HD, bool kRope, int kWarps, int G, int kMaxWin, bool kWindow>
__device__ __forceinline__ void attn_short(const AttnParams<T>& a, int n_kv, int row, int kvh, int head, int pos,
                                           int slot, bool early, bool store, float* s_acc, float* s_m, float* s_l,
                                           float2* s_cs) {
  constexpr int kThreads = kWarps * kWarp;
  constexpr int LPP = HD / 8, PPW = kWarp / LPP, PG = kWarps * PPW;
  constexpr int S = short_steps<T>();
  constexpr int W = S * PG;  // positions per register window
  const int n_head = n_kv * a.group;
  const int ctx = pos + 1;
  const int n_win = kMaxWin == 1 ? 1 : min(kMaxWin, (ctx + W - 1) / W);
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  const int ld = lane % LPP, sub = lane / LPP;
  const int p0 = warp * PPW + sub;  // this lane's position in step 0; step s adds s * PG
  const size_t row0 = (static_cast<size_t>(slot) * n_kv + kvh) * a.n_ctx;
  const T* kbase = a.kc + row0 * HD + ld * 8;
  const T* vbase = a.vc + row0 * HD + ld * 8;

  // Every position but pos now (before the wait when early): pos is stored by this launch (fused) or by the previous
  // kernel (unfused: loaded after the wait below, or here when the wait is already behind us).
  const int n_pre = kRope || early ? pos : ctx;
  Slice8<T> kr[S], vr[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    const int p = p0 + s * PG;
    const bool in = p < n_pre;
    kr[s] = in ? load_slice(kbase + static_cast<size_t>(p) * HD) : zero_slice<T>();
    vr[s] = in ? load_slice(vbase + static_cast<size_t>(p) * HD) : zero_slice<T>();
  }
  if constexpr (kMaxWin > 1) {
    // The later windows' lines into L2 (one prefetch per 128-byte line: the lanes whose slice starts a line).
    constexpr int kLineLanes = 128 / (8 * static_cast<int>(sizeof(T)));
    if (ld % kLineLanes == 0)
      for (int w = 1; w < n_win; ++w)
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const int p = w * W + p0 + s * PG;
          if (p < n_pre) {
            prefetch_l2(kbase + static_cast<size_t>(p) * HD);
            prefetch_l2(vbase + static_cast<size_t>(p) * HD);
          }
        }
  }
  if constexpr (kRope) {
    for (int j = threadIdx.x; j < a.rope_dim / 2; j += kThreads) {
      float sn, cs;
      sincosf(static_cast<float>(pos) * a.inv_freq[j], &sn, &cs);  // the accurate version, as rope_store_kv
      s_cs[j] = make_float2(cs, sn);
    }
    __syncthreads();
  }
  if (early) pdl_wait();
  if constexpr (!kRope) {
    if (early) {
#pragma unroll
      for (int s = 0; s < S; ++s)
        if (p0 + s * PG == pos) {
          kr[s] = load_slice(kbase + static_cast<size_t>(pos) * HD);
          vr[s] = load_slice(vbase + static_cast<size_t>(pos) * HD);
        }
    }
  }

  // This token's q head (own 16-byte aligned slice: the launchers check q's alignment and stride) and, fused, in the
  // warp holding position pos, this token's k and v (scalar loads: their rows need not be aligned). All loads are
  // issued before the first use.
  const int e0 = ld * 8;
  float qo[8], ko[8], vo[8];
  {
    const float4* qp = reinterpret_cast<const float4*>(a.q + row * a.ld_q + static_cast<size_t>(head) * HD + e0);
    const float4 x = qp[0], y = qp[1];
    qo[0] = x.x, qo[1] = x.y, qo[2] = x.z, qo[3] = x.w, qo[4] = y.x, qo[5] = y.y, qo[6] = y.z, qo[7] = y.w;
  }
  const bool pos_warp = kRope && warp == (pos % PG) / PPW;  // warp-uniform
  if (pos_warp) {
    const size_t at = row * a.ld_kv + static_cast<size_t>(kvh) * HD + e0;
#pragma unroll
    for (int i = 0; i < 8; ++i) ko[i] = a.k_new[at + i], vo[i] = a.v_new[at + i];
  }
  const float qscale = a.scale * 1.44269504088896341f;  // scores in log2 units, as v4
  float qv[8];
  if constexpr (kRope) {
    rope_slice8(qo, e0, a.rope_dim, a.neox, s_cs, qv);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) qv[j] = qo[j];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) qv[j] *= qscale;
  // This token's k and v, rounded to the cache type as rope_store_kv stores them (lanes of position pos only).
  Slice8<T> ks = zero_slice<T>(), vs = zero_slice<T>();
  if (pos_warp) {
    // This block stores them when `store`.
    float kf[8];
    rope_slice8(ko, e0, a.rope_dim, a.neox, s_cs, kf);
    ks = to_slice<T>(kf), vs = to_slice<T>(vo);
    if (p0 == pos % PG) {
#pragma unroll
      for (int s = 0; s < S; ++s)
        if (p0 + s * PG == pos) kr[s] = ks, vr[s] = vs;
      if (store) {
        const size_t dst = (row0 + pos) * HD + e0;
        *reinterpret_cast<Slice8<T>*>(a.kc + dst) = ks;
        *reinterpret_cast<Slice8<T>*>(a.vc + dst) = vs;
      }
    }
  }

  // Scores of this lane's positions (every lane of a position's sub-group ends with the full dot product). A step is
  // live when some lane of the warp has a position in the context (warp-uniform, so the shuffles see all 32 lanes).
  // Window by window (one unless kMaxWin > 1), with a running maximum m, sum l and accumulator acc per lane.
  float m = -INFINITY, l = 0.0f, acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
#pragma unroll 1
  for (int w = 0; w < n_win; ++w) {
    const int base = w * W;
    if (w > 0) {
      // After the wait: every position below pos is in the cache; pos is this token's (fused: ks/vs, unfused: stored
      // by the previous kernel, so loaded like the others).
      const int n_lim = kRope ? pos : ctx;
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const int p = base + p0 + s * PG;
        kr[s] = p < n_lim ? load_slice(kbase + static_cast<size_t>(p) * HD) : zero_slice<T>();
        vr[s] = p < n_lim ? load_slice(vbase + static_cast<size_t>(p) * HD) : zero_slice<T>();
        if (kRope && p == pos) kr[s] = ks, vr[s] = vs;  // only lanes of pos_warp reach p == pos
      }
    }
    float sc[S];
    float mw = -INFINITY;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      sc[s] = -INFINITY;
      if (base + s * PG + warp * PPW >= ctx) continue;
      float kf[8];
      to_float8<T>(kr[s], kf);
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) dot = fmaf(qv[j], kf[j], dot);
#pragma unroll
      for (int off = LPP / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      // Keys past pos, and with a sliding window those at or below pos - window, keep -inf (weight 0).
      if (base + p0 + s * PG < ctx && (!kWindow || a.window <= 0 || base + p0 + s * PG > pos - a.window)) sc[s] = dot;
      mw = fmaxf(mw, sc[s]);
    }
    if (w > 0) {  // rescale what the earlier windows summed to the new maximum
      const float mn = fmaxf(m, mw);
      const float c = exp_rel<true>(m, mn);
      l *= c;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] *= c;
      m = mn;
    } else {
      m = mw;
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (base + s * PG + warp * PPW >= ctx) continue;
      const float e = exp_rel<true>(sc[s], m);  // 0 for positions past the context (and when m is -inf)
      float vf[8];
      to_float8<T>(vr[s], vf);
      l += e;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = fmaf(e, vf[j], acc[j]);
    }
  }
  // Merge the sub-groups of each warp, then the warps through shared memory (as attn_split_kernel).
#pragma unroll
  for (int off = LPP; off < kWarp; off <<= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, off);
    const float lo = __shfl_xor_sync(0xffffffffu, l, off);
    const float mn = fmaxf(m, mo);
    const float c1 = exp_rel<true>(m, mn), c2 = exp_rel<true>(mo, mn);
    l = l * c1 + lo * c2;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float ao = __shfl_xor_sync(0xffffffffu, acc[j], off);
      acc[j] = acc[j] * c1 + ao * c2;
    }
    m = mn;
  }
  if (sub == 0) {
    float4* dst = reinterpret_cast<float4*>(s_acc + warp * G * HD + ld * 8);
    dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    if (ld == 0) s_m[warp * G] = m, s_l[warp * G] = l;
  }
  __syncthreads();
  // A warp without positions holds m = -inf, l = 0, acc = 0 (weight 0); warp 0 always holds position 0.
  const size_t out0 = (static_cast<size_t>(row) * n_head + head) * HD;
  float* out = a.out + out0;
  // d runs over whole warps (HD and kThreads are multiples of 32), so with out_q8 each warp quantizes one block of 32
  // as quantize_q8 does (the same warp reduction on the same f32 values: bit-identical).
  for (int d = threadIdx.x; d < HD; d += kThreads) {
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w * G]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float c = exp_rel<true>(s_m[w * G], mx);
      o = fmaf(s_acc[w * G * HD + d], c, o);
      sum = fmaf(s_l[w * G], c, sum);
    }
    out[d] = o / sum;
    if (a.out_q8 != nullptr) a.out_q8[out0 + d] = quantize_lane_q8(o / sum, a.out_ds + (out0 + d) / kQ);
  }
}

// v6 compact: attn_short alone in 8-warp blocks (at most 128 registers per thread: launch bounds of two blocks per SM),
// for one decode row over a cache of at most kCompactWindows register windows, so that no such context needs v5. Why a second
// kernel: attn_split_kernel's 16-warp blocks take every register of an SM (512 threads x 128), so none of them can
// start while the previous kernel (the q|k|v GEMV) still has a block on that SM, and its loads before pdl_wait() only
// begin once the GEMV has drained; half the registers fit beside the GEMV's blocks. Grid: one block per query head.
constexpr int kCompactWarps = 8;
constexpr int kCompactThreads = kCompactWarps * kWarp;
// Register windows the compact kernel walks at most (kMaxWin of attn_short): 1,024 positions at hd 64, 512 at hd 128
// for a 16-bit cache (CudaOptions::attn_compact = N: caches of at most N windows).
constexpr int kCompactWindows = 4;
template <typename T, int HD>
constexpr int compact_window() {
  return short_positions<T, HD, kCompactWarps>();
}

template <typename T, int HD, bool kRope>
__global__ void __launch_bounds__(kCompactThreads, 2) attn_compact_kernel(const AttnParams<T> a) {
  __shared__ __align__(16) float s_acc[kCompactWarps][HD];
  __shared__ float s_m[kCompactWarps], s_l[kCompactWarps];
  __shared__ float2 s_cs[kRope ? HD / 2 : 1];
  if (!a.early) pdl_wait();
  const int head = blockIdx.x, n_kv = gridDim.x / a.group, kvh = head / a.group;
  const int pos = a.pos[0];
  const int slot = a.seq ? a.seq[0] : 0;
  if (pos < 0 || pos >= a.n_ctx || slot < 0 || slot >= a.n_seq) {
    if (a.early) pdl_wait();
    for (int i = threadIdx.x; i < HD; i += kCompactThreads)
      a.out[static_cast<size_t>(head) * HD + i] = __int_as_float(0x7fc00000);
    return;
  }
  attn_short<T, HD, kRope, kCompactWarps, 1, kCompactWindows, false>(a, n_kv, 0, kvh, head, pos, slot, a.early,
                                                                     head % a.group == 0, &s_acc[0][0], s_m, s_l,
                                                                     s_cs);
}

}  // namespace
}  // namespace tessera::cuda::detail
