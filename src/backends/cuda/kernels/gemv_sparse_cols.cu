// The channel-major sparse GEMV for bf16/f16 (gemv_sparse.h: make_sparse_columns, gemv_sparse_x): no list, no
// SPARSIFY launch in front of it. Each block reads its slice of x itself, keeps the entries the threshold keeps
// (compacted into shared memory in ascending channel order), and walks them. Two forms over the same copy:
// - the stripe form (the default where it fits): a block owns a stripe of 32-256 output rows and walks every kept
//   channel of its slice of k; slices of one stripe are a thread-block cluster meeting in distributed shared memory;
// - the split form: 1,024-row stripes, per surviving channel a thread loads 16 contiguous bytes (8 rows) of that
//   channel's column, the block's 128 threads 2 KB of it in one run; slices (blockIdx.y) over k are summed by the
//   stripe's last block in slice order.
// Neither uses value atomics: repeatable bit for bit.
#include <algorithm>
#include <string>

#include "backends/cuda/kernels/gemv_sparse_kernel.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kColMaxSlice = 2048;  // channels per block at most (shared memory: 16 KB)

// The launch shape: THREADS threads, RPT rows per thread (RPT / 8 adjacent 16-byte loads per channel), UNROLL channels
// per pipeline group. Three others (256 x 8, 128 x 16, and 16 channels per group) were measured beside it on the H100
// (tessera_bench_sparse, twelfth to eighteenth sessions) and were never faster; they left src in the nineteenth.
struct ColShape {
  int threads, rpt, unroll;
  int stripe() const { return threads * rpt; }
};
constexpr ColShape kColShape{128, 8, 8};

// Block (stripe, s): rows [stripe * THREADS * RPT, +THREADS * RPT) over channels [k * s / splits, k * (s + 1) /
// splits). An entry is kept when !(|v| <= threshold) and v != 0 (threshold 0: x's nonzero entries, for an x SPARSIFY
// already zeroed). zeros (stripe 0's blocks only): += the slice's dropped entries and its length (the achieved-sparsity
// counters).
template <DType D, int THREADS, int RPT, int UNROLL>
__global__ void __launch_bounds__(THREADS)
    gemv_sparse_cols_kernel(const uint8_t* __restrict__ w /*[k, n_pad]*/, const float* __restrict__ x /*[k]*/,
                            float threshold, float* __restrict__ y /*[n]*/,
                            float* __restrict__ partial /*[splits, n_pad]*/, unsigned int* __restrict__ tickets,
                            unsigned long long* __restrict__ zeros, int n, int n_pad, int k, int splits,
                            bool accumulate) {
  using F = FloatFmt<D>;
  constexpr int kVec = RPT / 8;  // 16-byte loads per channel
  constexpr int kWarps = THREADS / kWarp;
  __shared__ int s_idx[kColMaxSlice];
  __shared__ float s_val[kColMaxSlice];
  __shared__ bool s_last;
  const int stripe = blockIdx.x, s = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & (kWarp - 1), warp = tid / kWarp;
  const int c0 = static_cast<int>(static_cast<long long>(k) * s / splits);
  const int c1 = static_cast<int>(static_cast<long long>(k) * (s + 1) / splits);
  pdl_wait();  // x is the previous kernel's output
  // Compaction: every x load of the slice first (all in flight), then one ballot per THREADS-channel round; the
  // rounds' per-warp counts meet in shared memory once, so positions follow channel order.
  constexpr int kRounds = kColMaxSlice / THREADS;
  __shared__ int s_cnt[kRounds][kWarps];
  float xv[kRounds];
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    const int c = c0 + i * THREADS + tid;
    xv[i] = c < c1 ? x[c] : 0.0f;
  }
  unsigned bal[kRounds];
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    const bool keep = sparse_keep(xv[i], threshold);  // 0 past the slice: never kept
    bal[i] = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) s_cnt[i][warp] = __popc(bal[i]);
  }
  __syncthreads();
  int m = 0;
  const unsigned below = (1u << lane) - 1u;
#pragma unroll
  for (int i = 0; i < kRounds; ++i) {
    int before = 0, all = 0;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) {
      before += wi < warp ? s_cnt[i][wi] : 0;
      all += s_cnt[i][wi];
    }
    if ((bal[i] >> lane) & 1u) {
      const int p = m + before + __popc(bal[i] & below);
      s_idx[p] = c0 + i * THREADS + tid;
      s_val[p] = xv[i];
    }
    m += all;
  }
  __syncthreads();
  if (zeros != nullptr && stripe == 0 && tid == 0) {
    atomicAdd(&zeros[0], static_cast<unsigned long long>(c1 - c0 - m));
    atomicAdd(&zeros[1], static_cast<unsigned long long>(c1 - c0));
  }
  const int r0 = stripe * THREADS * RPT + tid * RPT;
  const bool active = r0 < n_pad;
  float acc[RPT] = {};
  if (active) {
    // Software-pipelined as the dense GEMV (gemv_float_kernel.cuh): the next group's loads are issued before this
    // group's arithmetic, so every thread always has a group in flight. Slots past m load nothing and add 0 * 0.
    const uint8_t* wc = w + static_cast<size_t>(r0) * 2;
    const size_t col = static_cast<size_t>(n_pad) * 2;
    auto load = [&](int j0, uint4(&v)[UNROLL][kVec]) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int q = 0; q < kVec; ++q)
          v[u][q] =
              j0 + u < m ? ld_stream16(wc + static_cast<size_t>(s_idx[j0 + u]) * col + 16 * q) : make_uint4(0, 0, 0, 0);
    };
    uint4 cur[UNROLL][kVec];
    load(0, cur);
    for (int j = 0; j < m; j += UNROLL) {
      uint4 nxt[UNROLL][kVec];
      load(j + UNROLL, nxt);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const float xs = j + u < m ? s_val[j + u] : 0.0f;
#pragma unroll
        for (int q = 0; q < kVec; ++q) {
          float f[8];
          F::to_float(cur[u][q], f);
#pragma unroll
          for (int r = 0; r < 8; ++r) acc[8 * q + r] = fmaf(f[r], xs, acc[8 * q + r]);
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int q = 0; q < kVec; ++q) cur[u][q] = nxt[u][q];
    }
  }
  if (splits == 1) {
    if (active)
#pragma unroll
      for (int r = 0; r < RPT; ++r)
        if (r0 + r < n) y[r0 + r] = accumulate ? y[r0 + r] + acc[r] : acc[r];
    return;
  }
  if (active) {
    float4* p = reinterpret_cast<float4*>(partial + static_cast<size_t>(s) * n_pad + r0);
#pragma unroll
    for (int q = 0; q < RPT / 4; ++q)
      __stcg(p + q, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned int done = atomicAdd(&tickets[stripe], 1u);
    s_last = done == static_cast<unsigned int>(splits - 1);
    if (s_last) tickets[stripe] = 0;
  }
  __syncthreads();
  if (!s_last || !active) return;
  __threadfence();
  // The splits' partials in slice order, loaded 8 slices at a time: one by one, each load's L2 latency (~0.5 us)
  // was paid in sequence, microseconds of tail for the stripe's last block at 16-64 splits.
  float sum[RPT] = {};
  constexpr int kBatch = 8;
  for (int i0 = 0; i0 < splits; i0 += kBatch) {
    float4 a[kBatch][RPT / 4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const float4* p = reinterpret_cast<const float4*>(partial + static_cast<size_t>(i0 + u) * n_pad + r0);
#pragma unroll
      for (int q = 0; q < RPT / 4; ++q) a[u][q] = i0 + u < splits ? __ldcg(p + q) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (i0 + u >= splits) break;
#pragma unroll
      for (int q = 0; q < RPT / 4; ++q) {
        sum[4 * q] += a[u][q].x, sum[4 * q + 1] += a[u][q].y, sum[4 * q + 2] += a[u][q].z, sum[4 * q + 3] += a[u][q].w;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RPT; ++r)
    if (r0 + r < n) y[r0 + r] = accumulate ? y[r0 + r] + sum[r] : sum[r];
}

// dst[c][row] = src[row][c] for rows < n_pad (0 past n): 64 x 64 tiles through shared memory, as the tiled repack.
__global__ void sparse_cols_repack_kernel(const uint16_t* __restrict__ src /*[n, k]*/,
                                          uint16_t* __restrict__ dst /*[k, n_pad]*/, int n, int n_pad, int k) {
  constexpr int B = 64;
  __shared__ uint16_t t[B][B + 2];
  const int r0 = blockIdx.y * B, c0 = blockIdx.x * B;
  const int tx = threadIdx.x, ty = threadIdx.y;
  pdl_wait();
  for (int r = ty; r < B; r += 16) {
    const int row = r0 + r, c = c0 + tx;
    t[r][tx] = row < n && c < k ? src[static_cast<size_t>(row) * k + c] : uint16_t{0};
  }
  __syncthreads();
  const int row = r0 + tx;
  for (int cc = ty; cc < B; cc += 16) {
    const int c = c0 + cc;
    if (c < k && row < n_pad) dst[static_cast<size_t>(c) * n_pad + row] = t[tx][cc];
  }
}

// ---- The stripe form (twenty-fourth session; the default where it fits) ----
// Block (slice blockIdx.x, stripe blockIdx.y) owns the output rows [stripe * R, + R), R = G * 8, and walks every kept
// channel of its slice of k: G threads read the stripe's R * 2 bytes of a channel's column, kStripeThreads / G channels
// at a time. With one slice no block needs another's sums (no workspace, tickets or atomics); with more, the slices of
// a stripe are one thread-block cluster and their sums meet in rank 0's shared memory, which adds them in rank order.
// One wave of at most one block per SM (its shared-memory request keeps a second one off). In a graph of back-to-back
// calls on the H100 at 50% (bench/cuda/experiments/gemv_sparse_sweep.cu, twenty-fourth session) it took 12.7 / 10.4 /
// 43.9 / 23.8 / 25.6 us at q|k|v 4096->6144, o 4096x4096, gate|up 4096->28672, 4096->14336 and down 14336->4096,
// against 17.1 / 15.2 / 45.0 / 27.0 / 30.0 for the split form below and 16.9 / 11.3 / 74.7 / 38.2 / 39.1 dense.
constexpr int kStripeThreads = 512;
constexpr int kStripeRpt = 8;  // rows per thread: one 16-byte load of a channel (SWIGLU: one of gate and one of up)

// Dynamic shared memory: the slice's list (cap entries of NR floats, then cap 16-bit channels), reused for the warps'
// partial sums at the end; CL: rank 0's [slices][NR][R] slots for the cluster's sums at red_off (past both). SWIGLU: a
// block owns R gate rows and the same up rows, f rows further (two 16-byte loads a channel, half the channels a group),
// and writes y[f] = silu(gate . x') * (up . x'); no clusters, one row. NR rows (TEAL's batched decode, x [NR, k] and
// y [NR, n]): the list holds the channels any row keeps, each with every row's value (0 where that row dropped it),
// and each 16-byte load of the weight feeds NR rows' sums.
template <DType D, int G, bool CL, bool SWIGLU, int NR>
__global__ void __launch_bounds__(kStripeThreads, 1)
    gemv_sparse_stripe_kernel(const uint8_t* __restrict__ w /*[k, n_pad]*/, const float* __restrict__ x /*[NR, k]*/,
                              float threshold, float* __restrict__ y /*[NR, n]*/, unsigned long long* __restrict__ zeros,
                              int n, int n_pad, int k, int cap, int red_off, bool accumulate, int f) {
  using F = FloatFmt<D>;
  constexpr int T = kStripeThreads, RPT = kStripeRpt, R = G * RPT, S = T / G;
  constexpr int H = SWIGLU ? 2 : 1;  // row pieces a channel: gate and up
  constexpr int U = 8 / (H * NR);    // channels per pipeline group and slot (registers: loads in flight vs sums)
  constexpr int kWarps = T / kWarp;
  static_assert(kWarp % G == 0, "a channel's run is a power-of-two share of a warp");
  static_assert(!(SWIGLU && CL), "the SwiGLU form runs one slice");
  static_assert(!(SWIGLU && NR > 1), "the SwiGLU form runs one row");
  static_assert(NR == 1 || NR == 2, "one or two rows");
  extern __shared__ __align__(16) uint8_t smem[];
  float* s_val = reinterpret_cast<float*>(smem);                                            // [cap][NR]
  uint16_t* s_idx = reinterpret_cast<uint16_t*>(smem + 4 * NR * static_cast<size_t>(cap));  // [cap]
  __shared__ int s_scan[kWarp];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & (kWarp - 1), warp = tid / kWarp;
  const int slice = static_cast<int>(blockIdx.x), slices = static_cast<int>(gridDim.x);
  const int row0 = static_cast<int>(blockIdx.y) * R;
  const int nq = k / 4;
  const int q0 = static_cast<int>(static_cast<long long>(nq) * slice / slices);
  const int q1 = static_cast<int>(static_cast<long long>(nq) * (slice + 1) / slices);
  if constexpr (CL) cluster_arrive_relaxed();  // this block runs: the others may store into it after their wait
  pdl_wait();                                  // x is the previous kernel's output
  // ---- The list: thread t compacts float4s [qa, qb) of the slice (contiguous, in thread order), one block scan ----
  const int per = (q1 - q0 + T - 1) / T;
  const int qa = min(q0 + tid * per, q1), qb = min(qa + per, q1);
  // Row r's float4 q with the entries it drops zeroed; an entry joins the list where any row keeps it. (One row
  // through its own simpler loop measured the same: 12.78 / 10.20 / 43.37 / 25.30 us against 12.87 / 10.26 / 43.27 /
  // 25.27 at the 8B stacks, in a graph, H100, within the runs' 1-2% spread.)
  const auto row4 = [&](int r, int q, float(&e)[4]) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(x + static_cast<size_t>(r) * k) + q);
    e[0] = sparse_keep(v.x, threshold) ? v.x : 0.0f;
    e[1] = sparse_keep(v.y, threshold) ? v.y : 0.0f;
    e[2] = sparse_keep(v.z, threshold) ? v.z : 0.0f;
    e[3] = sparse_keep(v.w, threshold) ? v.w : 0.0f;
  };
  int cnt = 0;
#pragma unroll 4
  for (int q = qa; q < qb; ++q) {
    unsigned any = 0;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      float e[4];
      row4(r, q, e);
#pragma unroll
      for (int i = 0; i < 4; ++i) any |= static_cast<unsigned>(e[i] != 0.0f) << i;
    }
    cnt += __popc(any);
  }
  int m = 0;
  int pos = block_scan_excl(cnt, &m, s_scan);
  for (int q = qa; q < qb; ++q) {  // x again, from L1
    float e[NR][4];
#pragma unroll
    for (int r = 0; r < NR; ++r) row4(r, q, e[r]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      bool any = false;
#pragma unroll
      for (int r = 0; r < NR; ++r) any |= e[r][i] != 0.0f;
      if (any) {
#pragma unroll
        for (int r = 0; r < NR; ++r) s_val[pos * NR + r] = e[r][i];
        s_idx[pos] = static_cast<uint16_t>(4 * q + i);
        ++pos;
      }
    }
  }
  __syncthreads();
  if (zeros != nullptr && blockIdx.y == 0 && tid == 0) {  // one row only (the host refuses counters for more)
    atomicAdd(&zeros[0], static_cast<unsigned long long>(4 * (q1 - q0) - m));
    atomicAdd(&zeros[1], static_cast<unsigned long long>(4 * (q1 - q0)));
  }
  // ---- The walk: slot `slot` takes entries slot, slot + S, ...; its G threads read the channel's R * 2 bytes (and
  // SWIGLU the up rows' R * 2, f rows further) ----
  const int slot = tid / G, gi = tid - slot * G;
  const size_t chan = static_cast<size_t>(n_pad) * 2;
  const uint8_t* wb = w + static_cast<size_t>(row0 + gi * RPT) * 2;
  const size_t up = static_cast<size_t>(f) * 2;
  float acc[NR][H][RPT];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
      for (int i = 0; i < RPT; ++i) acc[r][h][i] = 0.0f;
  constexpr int kStep = U * S, kSpan = (U - 1) * S;  // a group at j is whole when j + kSpan < m
  // Whole groups load unconditionally, so the loads issue back to back; the last, partial group loads nothing past m.
  auto load = [&](int j0, bool whole, uint4(&v)[U][H], float(&xs)[U][NR]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * S;
      const bool ok = whole || j < m;
#pragma unroll
      for (int r = 0; r < NR; ++r) xs[u][r] = ok ? s_val[j * NR + r] : 0.0f;
      const uint8_t* p = ok ? wb + static_cast<size_t>(s_idx[j]) * chan : nullptr;
#pragma unroll
      for (int h = 0; h < H; ++h) v[u][h] = ok ? ld_stream16(p + h * up) : make_uint4(0, 0, 0, 0);
    }
  };
  auto fma_group = [&](const uint4(&v)[U][H], const float(&xs)[U][NR]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < H; ++h) {
        float f[8];
        F::to_float(v[u][h], f);
#pragma unroll
        for (int r = 0; r < NR; ++r)
#pragma unroll
          for (int i = 0; i < RPT; ++i) acc[r][h][i] = fmaf(f[i], xs[u][r], acc[r][h][i]);
      }
  };
  int j = slot;
  if (j + kSpan < m) {  // software-pipelined: the next whole group's loads issued before this group's FMAs
    uint4 cur[U][H];
    float xc[U][NR];
    load(j, true, cur, xc);
    for (; j + kStep + kSpan < m; j += kStep) {
      uint4 nxt[U][H];
      float xn[U][NR];
      load(j + kStep, true, nxt, xn);
      fma_group(cur, xc);
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int r = 0; r < NR; ++r) xc[u][r] = xn[u][r];
#pragma unroll
        for (int h = 0; h < H; ++h) cur[u][h] = nxt[u][h];
      }
    }
    fma_group(cur, xc);
    j += kStep;
  }
  if (j < m) {
    uint4 v[U][H];
    float xs[U][NR];
    load(j, false, v, xs);
    fma_group(v, xs);
  }
  // ---- The slots' sums in a fixed order: lanes l, l ^ G, ... of a warp hold the same rows; then the warps ----
#pragma unroll
  for (int off = G; off < kWarp; off <<= 1)
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int i = 0; i < RPT; ++i) acc[r][h][i] += __shfl_xor_sync(0xffffffffu, acc[r][h][i], off);
  __syncthreads();                               // every list read done: the shared memory holds the partials now
  float* part = reinterpret_cast<float*>(smem);  // [NR][H][kWarps][R]
  if (lane < G)
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int i = 0; i < RPT; ++i) part[((r * H + h) * kWarps + warp) * R + lane * RPT + i] = acc[r][h][i];
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem + red_off);  // CL: rank 0's slots [slices][NR][R]
  unsigned rank = 0;
  if constexpr (CL) {
    rank = cluster_rank();
    cluster_wait_acquire();  // every block of the cluster runs (their arrive at the start)
  }
  for (int e = tid; e < NR * R; e += T) {
    const int r = e / R, i = e - r * R;
    float sum[H];
#pragma unroll
    for (int h = 0; h < H; ++h) {
      sum[h] = 0.0f;
#pragma unroll
      for (int p = 0; p < kWarps; ++p) sum[h] += part[((r * H + h) * kWarps + p) * R + i];
    }
    const int row = row0 + i;
    float* yr = y + static_cast<size_t>(r) * n;
    if constexpr (CL) {
      store_cluster_f32(red + (rank * NR + r) * R + i, 0, sum[0]);
    } else if constexpr (SWIGLU) {
      if (row < f) y[row] = silu_mul(sum[0], sum[H - 1]);
    } else if (row < n) {
      yr[row] = accumulate ? yr[row] + sum[0] : sum[0];
    }
  }
  if constexpr (CL) {
    cluster_arrive_release();  // the remote stores before rank 0's reads
    cluster_wait_acquire();
    if (rank == 0)
      for (int e = tid; e < NR * R; e += T) {
        const int r = e / R, i = e - r * R;
        float sum = 0.0f;
        for (int c = 0; c < slices; ++c) sum += red[(c * NR + r) * R + i];
        const int row = row0 + i;
        float* yr = y + static_cast<size_t>(r) * n;
        if (row < n) yr[row] = accumulate ? yr[row] + sum : sum;
      }
  }
}

int stripes_of(const SparseWeight& w) { return ceil_div(w.tile, kColShape.stripe()); }

template <DType D>
void launch_cols(const SparseWeight& w, const float* x, float threshold, float* y, bool accumulate,
                 SparseGemvWorkspace& ws, cudaStream_t stream, unsigned long long* zeros, int splits) {
  constexpr ColShape S = kColShape;
  const dim3 grid(static_cast<unsigned>(stripes_of(w)), static_cast<unsigned>(splits));
  launch("gemv_sparse_cols_kernel", gemv_sparse_cols_kernel<D, S.threads, S.rpt, S.unroll>, grid, dim3(S.threads), 0,
         stream, w.data.as<uint8_t>(), x, threshold, y, ws.partials(), ws.tickets(), zeros, static_cast<int>(w.n),
         w.tile, static_cast<int>(w.k), splits, accumulate);
}

// A stripe-form launch's list capacity, the offset of rank 0's cluster slots and the shared memory it asks for.
struct StripeLaunch {
  int cap = 0, red_off = 0;
  size_t smem = 0;
};

// The largest dynamic shared memory a block may ask for, less room for the kernels' static shared memory.
int smem_optin() { return device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>() - 1024; }
bool device_has_clusters() { return device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9; }
int smem_per_sm() { return device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(); }

// Shared memory for k split in `slices` at `rows` rows a block and nr input rows (SWIGLU: rows gate rows and as many
// up rows); smem 0 where it does not fit.
StripeLaunch stripe_launch(int64_t k, int64_t n_pad, int rows, int slices, bool swiglu, int nr) {
  StripeLaunch l;
  const int64_t nq = k / 4;
  l.cap = static_cast<int>(4 * ((nq + slices - 1) / slices));
  const int64_t list = (static_cast<int64_t>(l.cap) * (4 * nr + 2) + 15) / 16 * 16;
  const int64_t part = int64_t{kStripeThreads / kWarp} * rows * 4 * (swiglu ? 2 : 1) * nr;
  l.red_off = static_cast<int>(std::max(list, part));
  int64_t smem = l.red_off + (slices > 1 ? int64_t{slices} * nr * rows * 4 : 0);
  // One wave of at most one block per SM: ask for more than half an SM's shared memory, so no second block fits.
  const int64_t blocks = (swiglu ? n_pad / 2 / rows : n_pad / rows) * slices;
  if (blocks <= sm_count()) smem = std::max<int64_t>(smem, smem_per_sm() / 2 + 1024);
  if (smem > smem_optin()) return {};
  l.smem = static_cast<size_t>(smem);
  return l;
}

template <DType D, int G, bool CL, bool SWIGLU, int NR>
void launch_stripes_as(const SparseWeight& w, const float* x, float threshold, float* y, bool accumulate,
                       cudaStream_t stream, unsigned long long* zeros, int slices, const StripeLaunch& l, int f) {
  static const bool opted_in = [] {  // over 48 KB of dynamic shared memory: an opt-in per kernel, once per process
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(gemv_sparse_stripe_kernel<D, G, CL, SWIGLU, NR>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
    return true;
  }();
  (void)opted_in;
  constexpr int R = G * kStripeRpt;
  const int stripes = SWIGLU ? f / R : w.tile / R;
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(stripes));
  launch_cluster("gemv_sparse_stripe_kernel", gemv_sparse_stripe_kernel<D, G, CL, SWIGLU, NR>, grid,
                 dim3(kStripeThreads), l.smem, stream, CL ? static_cast<unsigned>(slices) : 1u, w.data.as<uint8_t>(),
                 x, threshold, y, zeros, static_cast<int>(w.n), w.tile, static_cast<int>(w.k), l.cap, l.red_off,
                 accumulate, f);
}

template <DType D, int G, int NR>
void launch_stripes_g(const SparseWeight& w, const float* x, float threshold, float* y, bool accumulate,
                      cudaStream_t stream, unsigned long long* zeros, int slices, const StripeLaunch& l, int f) {
  if constexpr (NR == 1)
    if (f > 0) return launch_stripes_as<D, G, false, true, 1>(w, x, threshold, y, false, stream, zeros, 1, l, f);
  if (slices > 1)
    return launch_stripes_as<D, G, true, false, NR>(w, x, threshold, y, accumulate, stream, zeros, slices, l, f);
  launch_stripes_as<D, G, false, false, NR>(w, x, threshold, y, accumulate, stream, zeros, 1, l, f);
}

template <DType D, int NR>
void launch_stripes(const SparseWeight& w, const float* x, float threshold, float* y, bool accumulate,
                    cudaStream_t stream, unsigned long long* zeros, int rows, int slices, const StripeLaunch& l,
                    int f) {
  switch (rows) {
    case 32:
      return launch_stripes_g<D, 4, NR>(w, x, threshold, y, accumulate, stream, zeros, slices, l, f);
    case 64:
      return launch_stripes_g<D, 8, NR>(w, x, threshold, y, accumulate, stream, zeros, slices, l, f);
    case 128:
      return launch_stripes_g<D, 16, NR>(w, x, threshold, y, accumulate, stream, zeros, slices, l, f);
    default:
      return launch_stripes_g<D, 32, NR>(w, x, threshold, y, accumulate, stream, zeros, slices, l, f);
  }
}

// Why the stripe form cannot run (rows, slices) on w and nr rows of x, or "" where it can. swiglu: w is [gate; up].
std::string stripe_refusal(const SparseWeight& w, const float* x, int rows, int slices, bool swiglu, int nr) {
  if (rows != 32 && rows != 64 && rows != 128 && rows != 256) return "rows " + num(rows) + " not 32, 64, 128 or 256";
  if (slices < 1 || slices > 8) return "slices " + num(slices) + " outside [1, 8]";
  if (nr != 1 && nr != 2) return "input rows " + num(nr) + " not 1 or 2";
  if (swiglu) {
    if (w.n % 2 != 0 || (w.n / 2) % rows != 0) return "rows " + num(rows) + " do not divide the gate rows";
    if (slices != 1) return "the SwiGLU form runs one slice";
    if (nr != 1) return "the SwiGLU form runs one input row";
  } else if (w.tile % rows != 0) {
    return "rows " + num(rows) + " do not divide the padded " + num(w.tile);
  }
  if (slices > 1 && !device_has_clusters()) return "slices above 1 need thread-block clusters (sm_90)";
  if (w.k % 4 != 0 || w.k > 65536) return "k " + num(w.k) + " is not a multiple of 4 up to 65536";
  if (x != nullptr && !aligned16(x)) return "x is not 16-byte aligned";
  if (stripe_launch(w.k, w.tile, rows, slices, swiglu, nr).smem == 0)
    return "the slice's list does not fit shared memory";
  return "";
}

}  // namespace

// The default shape: about one wave of one block per SM. k split in two (a cluster) where the list is over twice the
// rows; the fewest rows a block (32-256) that keep stripes x slices within the SMs; more slices (up to 8, at least
// 512 channels each) while under half the SMs would run. SWIGLU: the gate rows' stripes, one slice. nr rows of x: the
// same shape, more slices while their list does not fit.
std::pair<int, int> stripe_shape(const SparseWeight& w, const float* x, bool swiglu, int nr) {
  const int sms = sm_count();
  const bool cl = device_has_clusters() && !swiglu;
  const int64_t rows_total = swiglu ? w.n / 2 : w.tile;
  int slices = cl && w.k > 2 * w.n ? 2 : 1;
  int rows = 0;
  for (const int r : {32, 64, 128, 256})
    if (rows_total % r == 0) {
      rows = r;
      if (ceil_div(rows_total, r) * slices <= sms) break;
    }
  if (rows == 0) return {0, 0};
  const int stripes = ceil_div(rows_total, rows);
  while (cl && slices < 8 && stripes * slices * 2 <= sms && w.k / (slices * 2) >= 512) slices *= 2;
  while (cl && slices < 8 && stripe_launch(w.k, w.tile, rows, slices, false, nr).smem == 0) slices *= 2;  // long list
  if (!stripe_refusal(w, x, rows, slices, swiglu, nr).empty()) return {0, 0};
  return {rows, slices};
}

void stripes(const SparseWeight& w, const float* x, float threshold, float* y, bool accumulate, cudaStream_t stream,
             unsigned long long* zeros, int rows, int slices, const SparseXFusion& fusion, int nr) {
  if (const std::string why = stripe_refusal(w, x, rows, slices, fusion.swiglu, nr); !why.empty())
    fail("gemv_sparse_x: the stripe form cannot run: {}", why);
  if (fusion.swiglu && accumulate) fail("gemv_sparse_x: the SwiGLU form does not accumulate");
  if (nr > 1 && zeros != nullptr) fail("gemv_sparse_x: no sparsity counters for several rows (their SPARSIFY counts)");
  const StripeLaunch l = stripe_launch(w.k, w.tile, rows, slices, fusion.swiglu, nr);
  const int f = fusion.swiglu ? static_cast<int>(w.n / 2) : 0;  // the gate rows
  const bool bf16 = w.dtype == DType::BF16;
  if (nr == 2)
    return bf16 ? launch_stripes<DType::BF16, 2>(w, x, threshold, y, accumulate, stream, zeros, rows, slices, l, f)
                : launch_stripes<DType::F16, 2>(w, x, threshold, y, accumulate, stream, zeros, rows, slices, l, f);
  if (bf16)
    launch_stripes<DType::BF16, 1>(w, x, threshold, y, accumulate, stream, zeros, rows, slices, l, f);
  else
    launch_stripes<DType::F16, 1>(w, x, threshold, y, accumulate, stream, zeros, rows, slices, l, f);
}

}  // namespace detail

SparseWeight make_sparse_columns(const DeviceWeight& w, cudaStream_t stream) {
  if ((w.dtype != DType::BF16 && w.dtype != DType::F16) || w.layout != GemvLayout::ROWS)
    fail("gemv_sparse: no channel-major copy for {} weights", dtype_name(w.dtype));
  if (w.n <= 0 || w.k <= 0 || w.n > INT32_MAX / 2 || w.k > INT32_MAX)
    fail("gemv_sparse: weight shape {}x{} out of range", w.n, w.k);
  SparseWeight s;
  s.dtype = w.dtype;
  s.n = w.n;
  s.k = w.k;
  s.tile = static_cast<int>((w.n + 63) / 64 * 64);  // one tile: the whole padded column
  s.columns = true;
  s.data = DeviceBuffer(static_cast<size_t>(s.tile) * static_cast<size_t>(w.k) * 2);
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(w.k, 64)), static_cast<unsigned>(s.tile / 64));
  detail::launch("sparse_cols_repack_kernel", detail::sparse_cols_repack_kernel, grid, dim3(64, 16), 0, stream,
                 w.quants.as<uint16_t>(), s.data.as<uint16_t>(), static_cast<int>(w.n), s.tile, static_cast<int>(w.k));
  return s;
}

int gemv_sparse_x_default_splits(const SparseWeight& w) {
  // About two blocks of 128 threads per SM (one of 256), slices of at least 64 channels (the partial sums' traffic,
  // 8 bytes per row and slice, stays a few percent of the weights read), at most kColMaxSlice channels (shared memory).
  const int64_t stripes = detail::stripes_of(w);
  const int64_t want = int64_t{256} * detail::sm_count() / detail::kColShape.threads;
  const int64_t by_blocks = (want + stripes - 1) / stripes;
  const int64_t hi = std::max<int64_t>(1, std::min<int64_t>(w.k / 64, SparseGemvWorkspace::kMaxSplits));
  const int64_t lo = (w.k + detail::kColMaxSlice - 1) / detail::kColMaxSlice;
  return static_cast<int>(std::max(lo, std::min(by_blocks, hi)));
}

void gemv_sparse_x(const SparseWeight& w, const float* x, float threshold, float* y, bool accumulate,
                   SparseGemvWorkspace& ws, cudaStream_t stream, unsigned long long* zeros, int splits,
                   const SparseXFusion& fusion) {
  if (!w.columns) fail("gemv_sparse_x: the weight is not the channel-major copy (make_sparse_columns)");
  if (w.tile > ws.max_rows())
    fail("gemv_sparse: workspace sized for {} rows, the weight has {}", ws.max_rows(), w.tile);
  if (!(threshold >= 0.0f)) fail("gemv_sparse_x: threshold {} is negative", threshold);
  const bool fused = fusion.swiglu;
  if (splits == 0 || fused) {
    if (const auto [rows, slices] = detail::stripe_shape(w, x, fusion.swiglu, 1); rows > 0)
      return detail::stripes(w, x, threshold, y, accumulate, stream, zeros, rows, slices, fusion, 1);
    if (fused) fail("gemv_sparse_x: a fused SwiGLU needs the stripe form, which cannot run this weight");
    splits = gemv_sparse_x_default_splits(w);
  }
  const int64_t min_splits = (w.k + detail::kColMaxSlice - 1) / detail::kColMaxSlice;
  if (splits < min_splits || splits > SparseGemvWorkspace::kMaxSplits)
    fail("gemv_sparse_x: splits {} outside [{}, {}]", splits, min_splits, SparseGemvWorkspace::kMaxSplits);
  if (w.dtype == DType::BF16)
    detail::launch_cols<DType::BF16>(w, x, threshold, y, accumulate, ws, stream, zeros, splits);
  else
    detail::launch_cols<DType::F16>(w, x, threshold, y, accumulate, ws, stream, zeros, splits);
}

std::pair<int, int> gemv_sparse_x_stripe_shape(const SparseWeight& w, const float* x, bool swiglu, int n_rows) {
  if (!w.columns) fail("gemv_sparse_x: the weight is not the channel-major copy (make_sparse_columns)");
  return detail::stripe_shape(w, x, swiglu, n_rows);
}

void gemv_sparse_x_stripes(const SparseWeight& w, const float* x, float threshold, float* y, bool accumulate,
                           cudaStream_t stream, unsigned long long* zeros, int rows, int slices,
                           const SparseXFusion& fusion, int n_rows) {
  if (!w.columns) fail("gemv_sparse_x: the weight is not the channel-major copy (make_sparse_columns)");
  if (!(threshold >= 0.0f)) fail("gemv_sparse_x: threshold {} is negative", threshold);
  detail::stripes(w, x, threshold, y, accumulate, stream, zeros, rows, slices, fusion, n_rows);
}

bool gemv_sparse_x_rows_runs(const SparseWeight& w, const float* x, int n_rows) {
  return w.columns && (n_rows == 1 || n_rows == 2) && detail::stripe_shape(w, x, false, n_rows).first > 0;
}

void gemv_sparse_x_rows(const SparseWeight& w, const float* x, int n_rows, float threshold, float* y, bool accumulate,
                        cudaStream_t stream) {
  if (!w.columns) fail("gemv_sparse_x: the weight is not the channel-major copy (make_sparse_columns)");
  if (!(threshold >= 0.0f)) fail("gemv_sparse_x: threshold {} is negative", threshold);
  if (n_rows != 1 && n_rows != 2) fail("gemv_sparse_x_rows: {} rows (one or two)", n_rows);
  const auto [rows, slices] = detail::stripe_shape(w, x, false, n_rows);
  if (rows == 0)
    fail("gemv_sparse_x_rows: the stripe form cannot run {}x{} at {} rows: {}", w.n, w.k, n_rows,
         detail::stripe_refusal(w, x, 32, 1, false, n_rows));
  detail::stripes(w, x, threshold, y, accumulate, stream, nullptr, rows, slices, {}, n_rows);
}

}  // namespace tessera::cuda
