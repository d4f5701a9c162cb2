// TEAL's sparse decode on CUDA: the SPARSIFY kernel that builds the surviving-channel list, the channel-blocked
// weight copy and the sparse GEMV that walks the list (gemv_sparse.h says why the layout).
#include <algorithm>
#include <cmath>

#include "backends/cuda/kernels/gemv_sparse_kernel.cuh"
#include "core/error.h"

namespace tessera::cuda {
namespace detail {
namespace {

// ---- SPARSIFY ----

constexpr int kSpThreads = 1024;      // one block per row: 32 warps, so the warp totals fit one warp's scan
constexpr int kSpMaxQ8Blocks = 1024;  // q8 list values: rows of at most 32768 entries

// Block-wide exclusive prefix sum of v (every thread of the 1024 calls it); *total gets the sum of all v.
__device__ __forceinline__ int block_scan_excl(int v, int* total, int* smem /*[32]*/) {
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  int inc = v;
#pragma unroll
  for (int off = 1; off < kWarp; off <<= 1) {
    const int o = __shfl_up_sync(0xffffffffu, inc, off);
    if (lane >= off) inc += o;
  }
  if (lane == kWarp - 1) smem[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int s = smem[lane];
#pragma unroll
    for (int off = 1; off < kWarp; off <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, s, off);
      if (lane >= off) s += o;
    }
    smem[lane] = s;
  }
  __syncthreads();
  const int base = warp > 0 ? smem[warp - 1] : 0;
  *total = smem[kWarp - 1];
  __syncthreads();  // smem is reused by the next call
  return base + inc - v;
}

__device__ __forceinline__ uint32_t mag_key(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// One row per block. Top-k (threshold < 0, drop = floor(sparsity * k) > 0): the drop-th smallest magnitude `cut` by
// a radix select over |x|'s bits (non-negative floats order as their bit patterns: 11, 11 and 9 bits, one histogram
// pass each over the row, which stays in L1/L2), leaving `rank` = how many entries equal to cut go too. Then one
// chunk of consecutive entries per thread, so that index order is thread order: a scan numbers the ties (the first
// `rank` of them are zeroed, as the CPU does) and a second the survivors (their list positions).
__global__ void __launch_bounds__(kSpThreads)
    sparsify_kernel(const float* x /*[t, k]*/, float* y /*[t, k] or null*/, int k, int drop, float threshold,
                    SparseEntry* list /*[t, k] or null*/, int32_t* count /*[t] or null*/,
                    unsigned long long* zeros /*[2] or null*/, bool q8_list) {
  __shared__ int hist[2048];
  __shared__ float s_d[kSpMaxQ8Blocks];
  __shared__ int scan[kWarp];
  __shared__ uint32_t s_prefix;
  __shared__ int s_rank;
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  pdl_wait();
  x += static_cast<size_t>(row) * k;
  if (y) y += static_cast<size_t>(row) * k;
  if (list) list += static_cast<size_t>(row) * k;
  const bool topk = threshold < 0.0f;
  uint32_t cut = 0;
  int ties_drop = 0;
  if (topk && drop > 0) {
    uint32_t prefix = 0, mask = 0;
    int rank = drop;  // 1-based rank of the key sought among the keys matching prefix
#pragma unroll 1
    for (int pass = 0; pass < 3; ++pass) {
      const int shift = pass == 0 ? 20 : pass == 1 ? 9 : 0;
      const int nb = pass == 2 ? 512 : 2048;
      for (int i = tid; i < 2048; i += kSpThreads) hist[i] = 0;
      __syncthreads();
      // Warp-aggregated: activations crowd a few buckets (one exponent holds half the row), so lanes with the same
      // bucket add once, by their first lane. Unrolled so that several loads are in flight per thread.
#pragma unroll 4
      for (int c = tid; c < k; c += kSpThreads) {
        const uint32_t u = mag_key(x[c]);
        const bool in = (u & mask) == prefix;
        const unsigned bucket = in ? (u >> shift) & static_cast<unsigned>(nb - 1) : 0xffffffffu;
        const unsigned peers = __match_any_sync(__activemask(), bucket);
        if (in && (threadIdx.x & (kWarp - 1)) == __ffs(peers) - 1) atomicAdd(&hist[bucket], __popc(peers));
      }
      __syncthreads();
      const int a = 2 * tid < nb ? hist[2 * tid] : 0;
      const int b = 2 * tid + 1 < nb ? hist[2 * tid + 1] : 0;
      int total = 0;
      const int ex = block_scan_excl(a + b, &total, scan);
      if (ex < rank && rank <= ex + a) {
        s_prefix = prefix | (static_cast<uint32_t>(2 * tid) << shift);
        s_rank = rank - ex;
      } else if (ex + a < rank && rank <= ex + a + b) {
        s_prefix = prefix | (static_cast<uint32_t>(2 * tid + 1) << shift);
        s_rank = rank - ex - a;
      }
      __syncthreads();
      prefix = s_prefix;
      rank = s_rank;
      mask |= static_cast<uint32_t>(nb - 1) << shift;
      __syncthreads();
    }
    cut = prefix;  // drop = (entries below cut) + rank
    ties_drop = rank;
  }
  const int per = (k + kSpThreads - 1) / kSpThreads;
  const int lo = min(tid * per, k), hi = min(lo + per, k);
  const bool select = topk && drop > 0;
  int my_ties = 0;
  if (select)
    for (int c = lo; c < hi; ++c) my_ties += mag_key(x[c]) == cut;
  int total = 0;
  const int tie0 = block_scan_excl(my_ties, &total, scan);
  auto keep = [&](float v, int& tie) {
    if (!topk) return !(fabsf(v) <= threshold);
    if (!select) return true;
    const uint32_t u = mag_key(v);
    if (u != cut) return u > cut;
    return tie++ >= ties_drop;
  };
  int kept = 0;
  int tie = tie0;
  for (int c = lo; c < hi; ++c) {
    const float v = x[c];
    kept += keep(v, tie) && v != 0.0f;
  }
  int kept_total = 0;
  int pos = block_scan_excl(kept, &kept_total, scan);
  tie = tie0;
  for (int c = lo; c < hi; ++c) {
    const float v = x[c];
    const bool kv = keep(v, tie);
    if (y) y[c] = kv ? v : 0.0f;
    if (list && !q8_list && kv && v != 0.0f) list[pos++] = make_int2(c, __float_as_int(v));
  }
  if (list && q8_list) {
    // The list's values as the 8-bit activations the quantized kernels read (the CPU's sparse and dense kernels
    // quantize the zeroed x per block of 32: d = amax / 127, q = round(v * 127 / amax)), so the quantized sparse GEMV
    // sums the CPU's products: d * q per surviving entry. y (written above, visible to the block after the barrier) is
    // the zeroed row; a kept entry is exactly a nonzero y.
    __syncthreads();
    const int lane = tid & (kWarp - 1);
    for (int b = tid / kWarp; b * kWarp < k; b += kSpThreads / kWarp) {
      const int c = b * kWarp + lane;
      const float amax = warp_max(fabsf(c < k ? y[c] : 0.0f));
      if (lane == 0) s_d[b] = amax;
    }
    __syncthreads();
    for (int c = lo; c < hi; ++c) {
      const float v = y[c];
      if (v == 0.0f) continue;
      // The CPU's quantize_act (backends/cpu/kernels/matmul_scalar.cpp): id = 127 / amax, round half to even.
      const float amax = s_d[c / kWarp];
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      list[pos++] = make_int2(c, __float_as_int(amax / 127.0f * rintf(v * id)));
    }
  }
  if (tid == 0) {
    if (count) count[row] = kept_total;
    if (zeros) {
      atomicAdd(&zeros[0], static_cast<unsigned long long>(k - kept_total));
      atomicAdd(&zeros[1], static_cast<unsigned long long>(k));
    }
  }
}

// ---- The channel-blocked copy ----

// dst[row / tile][c][row % tile] = src[row][c], 0 past n: a block moves 64 rows x 64 channels through shared memory
// (padded against bank conflicts), 64 x 16 threads; both the reads (along k) and the writes (along the tile's rows)
// are 128-byte runs.
__global__ void sparse_repack_kernel(const uint16_t* __restrict__ src /*[n, k]*/,
                                     uint16_t* __restrict__ dst /*[tiles, k, tile]*/, int n, int k, int tile) {
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
    if (c < k) dst[(static_cast<size_t>(row / tile) * k + c) * tile + row % tile] = t[tx][cc];
  }
}

// ---- The sparse GEMV ----

// Block (tile, s): the tile's TILE rows over slice s of the list, [cnt * s / splits, cnt * (s + 1) / splits). TILE / 8
// threads cover one channel's 2 * TILE bytes (16 bytes, 8 rows each), so a block of THREADS walks THREADS / (TILE / 8)
// channels at once and each thread has UNROLL 16-byte weight loads in flight, the list entries of the next step loaded
// before this step's arithmetic (an entry's load must finish before its weights' address is known). The threads' sums
// meet in shared memory in a fixed order; with splits > 1 each block stores its 64 partial sums and the tile's last
// block (a ticket per tile) adds the splits' partials in slice order.
template <DType D, int TILE, int THREADS, int UNROLL>
__global__ void __launch_bounds__(THREADS)
    gemv_sparse_kernel(const uint8_t* __restrict__ w /*[tiles, k, TILE]*/, const SparseEntry* __restrict__ list,
                       const int32_t* __restrict__ count /*[1]*/, float* __restrict__ y /*[n]*/,
                       float* __restrict__ partial /*[splits, tiles * TILE]*/, unsigned int* __restrict__ tickets,
                       int n, int k, int splits, bool accumulate) {
  using F = FloatFmt<D>;
  constexpr int G = TILE / 8;  // threads per channel
  static_assert(G <= kWarp && TILE <= THREADS, "a channel's run fits one warp, and a thread sums each row at the end");
  constexpr int kSlots = THREADS / G;
  constexpr int kStep = kSlots * UNROLL;
  constexpr int kRunBytes = TILE * 2;
  const int tile = blockIdx.x, s = blockIdx.y;
  const int g = threadIdx.x % G, slot = threadIdx.x / G;
  const uint8_t* wt = w + static_cast<size_t>(tile) * k * kRunBytes + g * 16;
  pdl_wait();  // the list is the previous kernel's output
  const int cnt = *count;
  const int lo = static_cast<int>(static_cast<long long>(cnt) * s / splits);
  const int hi = static_cast<int>(static_cast<long long>(cnt) * (s + 1) / splits);
  auto load_entries = [&](int j0, int2(&e)[UNROLL]) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int j = j0 + u * kSlots;
      e[u] = j < hi ? __ldg(list + j) : make_int2(-1, 0);
    }
  };
  float acc[8] = {};
  int j = lo + slot;
  int2 e[UNROLL];
  load_entries(j, e);
  while (j < hi) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      v[u] = e[u].x >= 0 ? ld_stream16(wt + static_cast<size_t>(e[u].x) * kRunBytes) : make_uint4(0, 0, 0, 0);
    int2 en[UNROLL];
    load_entries(j + kStep, en);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      float f[8];
      F::to_float(v[u], f);
      const float xv = e[u].x >= 0 ? __int_as_float(e[u].y) : 0.0f;
#pragma unroll
      for (int r = 0; r < 8; ++r) acc[r] = fmaf(f[r], xv, acc[r]);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) e[u] = en[u];
    j += kStep;
  }
  sparse_epilogue<TILE, 8, THREADS>(acc, y, partial, tickets, n, splits, accumulate);
}

template <DType D, int TILE>
void launch_sparse(const SparseWeight& w, const SparseEntry* list, const int32_t* count, float* y, bool accumulate,
                   SparseGemvWorkspace& ws, cudaStream_t stream, int splits) {
  const dim3 grid(static_cast<unsigned>(w.tiles()), static_cast<unsigned>(splits));
  launch("gemv_sparse_kernel", gemv_sparse_kernel<D, TILE, kGemvThreads, kGemvUnroll>, grid, dim3(kGemvThreads), 0,
         stream, w.data.as<uint8_t>(), list, count, y, ws.partials(), ws.tickets(), static_cast<int>(w.n),
         static_cast<int>(w.k), splits, accumulate);
}

template <DType D>
void launch_sparse_tile(const SparseWeight& w, const SparseEntry* list, const int32_t* count, float* y, bool accumulate,
                        SparseGemvWorkspace& ws, cudaStream_t stream, int splits) {
  switch (w.tile) {
    case 64:
      launch_sparse<D, 64>(w, list, count, y, accumulate, ws, stream, splits);
      break;
    case 128:
      launch_sparse<D, 128>(w, list, count, y, accumulate, ws, stream, splits);
      break;
    case 256:
      launch_sparse<D, 256>(w, list, count, y, accumulate, ws, stream, splits);
      break;
    default:
      fail("gemv_sparse: no kernel for {}-row tiles", w.tile);
  }
}

}  // namespace
}  // namespace detail

bool gemv_sparse_supports(DType dtype) {
  return dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::Q8_0 || dtype == DType::Q4_0 ||
         dtype == DType::Q4_1;
}

int sparse_quant_run(DType dtype) { return dtype == DType::Q8_0 ? 64 : 32; }
int sparse_quant_header(DType dtype) { return dtype == DType::Q4_1 ? 256 : 128; }

uint64_t SparseWeight::bytes_per_channel() const {
  const uint64_t per_tile =
      gemv_quantized(dtype) ? static_cast<uint64_t>(sparse_quant_run(dtype)) : static_cast<uint64_t>(tile) * 2;
  return static_cast<uint64_t>(tiles()) * per_tile;
}

bool sparse_tile_supported(int tile) { return tile == 64 || tile == 128 || tile == 256; }

SparseWeight make_sparse_weight(const DeviceWeight& w, cudaStream_t stream, int tile) {
  if (!sparse_tile_supported(tile)) fail("gemv_sparse: tiles of {} rows are not supported (64, 128, 256)", tile);
  if (gemv_sparse_supports(w.dtype) && gemv_quantized(w.dtype)) {
    if (tile != kSparseTile) fail("gemv_sparse: quantized weights take {}-row tiles only", kSparseTile);
    return detail::make_sparse_quant(w, stream);
  }
  if (!gemv_sparse_supports(w.dtype) || w.layout != GemvLayout::ROWS)
    fail("gemv_sparse: no sparse GEMV for {} weights", dtype_name(w.dtype));
  if (w.n <= 0 || w.k <= 0 || w.n > INT32_MAX || w.k > INT32_MAX)
    fail("gemv_sparse: weight shape {}x{} out of range", w.n, w.k);
  SparseWeight s;
  s.dtype = w.dtype;
  s.n = w.n;
  s.k = w.k;
  s.tile = tile;
  s.data = DeviceBuffer(static_cast<size_t>(s.tiles()) * static_cast<size_t>(tile) * static_cast<size_t>(w.k) * 2);
  // 64-row blocks over the padded rows (tile is a multiple of 64), so the padding is written too.
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(w.k, 64)), static_cast<unsigned>(s.tiles() * tile / 64));
  detail::launch("sparse_repack_kernel", detail::sparse_repack_kernel, grid, dim3(64, 16), 0, stream,
                 w.quants.as<uint16_t>(), s.data.as<uint16_t>(), static_cast<int>(w.n), static_cast<int>(w.k), tile);
  return s;
}

void sparsify(const float* x, float* y, int64_t t, int64_t k, float sparsity, float threshold, SparseEntry* list,
              int32_t* count, unsigned long long* zeros, cudaStream_t stream, bool q8_list) {
  if (t <= 0 || k <= 0 || k > INT32_MAX || t > INT32_MAX) fail("sparsify: shape {}x{} out of range", t, k);
  if (threshold < 0 && !(sparsity >= 0.0f && sparsity <= 1.0f))
    fail("sparsify: sparsity {} is outside [0, 1]", sparsity);
  if ((list == nullptr) != (count == nullptr)) fail("sparsify: list and count go together");
  if (q8_list && (list == nullptr || y == nullptr || k % 32 != 0 || k > 32 * detail::kSpMaxQ8Blocks))
    fail("sparsify: 8-bit list values need the list, the zeroed row and whole 32-blocks (at most 32768 entries)");
  // The same rounding as the CPU (floor of the product in double).
  const auto drop =
      threshold < 0 ? static_cast<int>(std::floor(static_cast<double>(sparsity) * static_cast<double>(k))) : 0;
  detail::launch("sparsify_kernel", detail::sparsify_kernel, dim3(static_cast<unsigned>(t)), dim3(detail::kSpThreads),
                 0, stream, x, y, static_cast<int>(k), drop, threshold, list, count, zeros, q8_list);
}

unsigned long long* sparsity_counters() {
  // Never freed: process-wide like the CPU's counters, and a static DeviceBuffer would be freed after the runtime's
  // own teardown at exit.
  static unsigned long long* counters = [] {
    auto* b = new DeviceBuffer(2 * sizeof(unsigned long long));
    TESSERA_CUDA_CHECK(cudaMemset(b->get(), 0, b->bytes()));
    return b->as<unsigned long long>();
  }();
  return counters;
}

std::pair<uint64_t, uint64_t> read_sparsity_counters() {
  unsigned long long c[2] = {};
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  TESSERA_CUDA_CHECK(cudaMemcpy(c, sparsity_counters(), sizeof(c), cudaMemcpyDeviceToHost));
  return {c[0], c[1]};
}

void reset_sparsity_counters() {
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  TESSERA_CUDA_CHECK(cudaMemset(sparsity_counters(), 0, 2 * sizeof(unsigned long long)));
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
}

SparseGemvWorkspace::SparseGemvWorkspace(int64_t max_n)
    : max_tiles_((max_n + 255) / 256 * (256 / kSparseTile)),
      partials_(sizeof(float) * static_cast<size_t>(kMaxSplits) * static_cast<size_t>(max_tiles_) * kSparseTile),
      tickets_(sizeof(unsigned int) * static_cast<size_t>(max_tiles_)) {
  TESSERA_CUDA_CHECK(cudaMemset(tickets_.get(), 0, tickets_.bytes()));
}

int gemv_sparse_default_splits(const SparseWeight& w) {
  // About eight resident 256-thread blocks per SM; each slice keeps >= 128 channels of the dense row so the split's
  // partial sums stay a small share of the bytes. (A first guess: the benchmark's --splits-sweep measures the others.)
  const int64_t want = int64_t{8} * detail::sm_count();
  const int64_t by_blocks = (want + w.tiles() - 1) / w.tiles();
  const int64_t cap = std::max<int64_t>(1, w.k / 128);
  return static_cast<int>(std::clamp<int64_t>(by_blocks, 1, std::min<int64_t>(cap, SparseGemvWorkspace::kMaxSplits)));
}

void gemv_sparse(const SparseWeight& w, const SparseEntry* list, const int32_t* count, float* y, bool accumulate,
                 SparseGemvWorkspace& ws, cudaStream_t stream, int splits) {
  if (w.tiles() * w.tile > ws.max_rows())
    fail("gemv_sparse: workspace sized for {} rows, the weight has {}", ws.max_rows(), w.tiles() * w.tile);
  if (splits == 0) splits = gemv_sparse_default_splits(w);
  if (splits < 1 || splits > SparseGemvWorkspace::kMaxSplits)
    fail("gemv_sparse: splits {} outside [1, {}]", splits, SparseGemvWorkspace::kMaxSplits);
  switch (w.dtype) {
    case DType::BF16:
      detail::launch_sparse_tile<DType::BF16>(w, list, count, y, accumulate, ws, stream, splits);
      break;
    case DType::F16:
      detail::launch_sparse_tile<DType::F16>(w, list, count, y, accumulate, ws, stream, splits);
      break;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
      detail::launch_sparse_quant(w, list, count, y, accumulate, ws, stream, splits);
      break;
    default:
      fail("gemv_sparse: no sparse GEMV for {} weights", dtype_name(w.dtype));
  }
}

}  // namespace tessera::cuda
