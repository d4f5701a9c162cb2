// The channel-major sparse GEMV for bf16/f16 (gemv_sparse.h: make_sparse_columns, gemv_sparse_x): no list, no
// SPARSIFY launch in front of it. Each block reads its slice of x itself, keeps the entries the threshold keeps
// (ballots compact them into shared memory in ascending channel order), and walks them: per surviving channel a thread
// loads 16 contiguous bytes (8 rows) of that channel's column, and the block's 128 threads read 2 KB of it in one run.
// Slices (blockIdx.y) over k are summed by the stripe's last block in slice order: no value atomics.
#include <algorithm>

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
    const bool keep = !(fabsf(xv[i]) <= threshold) && xv[i] != 0.0f;  // 0 past the slice: never kept
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

}  // namespace
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
                   SparseGemvWorkspace& ws, cudaStream_t stream, unsigned long long* zeros, int splits) {
  if (!w.columns) fail("gemv_sparse_x: the weight is not the channel-major copy (make_sparse_columns)");
  if (w.tile > ws.max_rows())
    fail("gemv_sparse: workspace sized for {} rows, the weight has {}", ws.max_rows(), w.tile);
  if (!(threshold >= 0.0f)) fail("gemv_sparse_x: threshold {} is negative", threshold);
  if (splits == 0) splits = gemv_sparse_x_default_splits(w);
  const int64_t min_splits = (w.k + detail::kColMaxSlice - 1) / detail::kColMaxSlice;
  if (splits < min_splits || splits > SparseGemvWorkspace::kMaxSplits)
    fail("gemv_sparse_x: splits {} outside [{}, {}]", splits, min_splits, SparseGemvWorkspace::kMaxSplits);
  if (w.dtype == DType::BF16)
    detail::launch_cols<DType::BF16>(w, x, threshold, y, accumulate, ws, stream, zeros, splits);
  else
    detail::launch_cols<DType::F16>(w, x, threshold, y, accumulate, ws, stream, zeros, splits);
}

}  // namespace tessera::cuda
