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

constexpr int kSpThreads = 1024;  // one block per row: 32 warps, so the warp totals fit one warp's scan

__device__ __forceinline__ uint32_t mag_key(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Rows of at most this many entries are staged in shared memory (dynamic, 4 bytes an entry) and read from there by
// every pass; longer rows are read from global memory (L1 and L2) by the same code.
constexpr int kSpStageMax = 40960;

// The sum of v over the warps before this one (v: one value per warp, in shared memory) and, in *total, over all.
__device__ __forceinline__ int warps_before(const int* v /*[32]*/, int warp, int lane, int* total = nullptr) {
  const int mine = v[lane];
  if (total != nullptr) *total = __reduce_add_sync(0xffffffffu, mine);
  return __reduce_add_sync(0xffffffffu, lane < warp ? mine : 0);
}

// dst[0, n) = src[0, n) by the block, four loads in flight per thread before their stores (a load-store loop waits
// for each load in turn).
template <typename T>
__device__ __forceinline__ void copy_in_flight(const T* src, T* dst, int n) {
  constexpr int kIn = 4;
  for (int base = threadIdx.x; base < n; base += kIn * kSpThreads) {
    T v[kIn];
#pragma unroll
    for (int j = 0; j < kIn; ++j)
      if (base + j * kSpThreads < n) v[j] = src[base + j * kSpThreads];
#pragma unroll
    for (int j = 0; j < kIn; ++j)
      if (base + j * kSpThreads < n) dst[base + j * kSpThreads] = v[j];
  }
}

// One row per block. Top-k (threshold < 0, drop = floor(sparsity * k) > 0): the drop-th smallest magnitude `cut` by
// a radix select over |x|'s bits (non-negative floats order as their bit patterns: 7, 8, 8 and 8 bits, one histogram
// pass each), leaving `rank` = how many entries equal to cut go too. Then the row is cut into chunks of 32 entries,
// each warp a run of consecutive chunks, a lane an entry: ballots number the ties in index order (the first `rank`
// are zeroed, as the CPU does) and the survivors (their list positions), each warp's counts offset by the warps
// before it. Every pass reads the row from shared memory (kStaged) and writes coalesced.
template <bool kStaged>
__global__ void __launch_bounds__(kSpThreads)
    sparsify_kernel(const float* x /*[t, k]*/, float* y /*[t, k] or null*/, int k, int drop, float threshold,
                    SparseEntry* list /*[t, k] or null*/, int32_t* count /*[t] or null*/,
                    unsigned long long* zeros /*[2] or null*/, bool q8_list) {
  extern __shared__ float s_row[];  // [k] when kStaged
  __shared__ int whist[kSpThreads / kWarp][256];  // each warp's histogram of the radix pass
  __shared__ int scan[kWarp];
  __shared__ int s_ties[kWarp], s_kept[kWarp];
  __shared__ uint32_t s_prefix;
  __shared__ int s_rank;
  const int row = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & (kWarp - 1), warp = tid / kWarp;
  pdl_wait();
  x += static_cast<size_t>(row) * k;
  if (y) y += static_cast<size_t>(row) * k;
  if (list) list += static_cast<size_t>(row) * k;
  const float* src = x;
  if constexpr (kStaged) {
    if ((k & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0)
      copy_in_flight(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(s_row), k / 4);
    else
      copy_in_flight(x, s_row, k);
    __syncthreads();
    src = s_row;
  }
  const bool topk = threshold < 0.0f;
  const bool select = topk && drop > 0;
  // Each warp's run of 32-entry chunks (a chunk is one of the quantized kernels' blocks of 32).
  const int chunks = (k + kWarp - 1) / kWarp;
  const int per = (chunks + kSpThreads / kWarp - 1) / (kSpThreads / kWarp);
  const int ch0 = min(warp * per, chunks), ch1 = min(ch0 + per, chunks);
  uint32_t cut = 0;
  int ties_drop = 0;
  if (select) {
    // Four passes over the 31 bits of |x| (7, 8, 8, 8 bits). Each warp counts its own entries into its own histogram,
    // so warps never contend (warp aggregation, by __match_any_sync or by ballots of the most crowded buckets,
    // measured slower on the H100 than plain atomics that serialize the lanes sharing a bucket); then
    // four threads a bucket add up the 32 histograms and a scan over the buckets finds the one holding the rank sought.
    uint32_t prefix = 0, mask = 0;
    int rank = drop;  // 1-based rank of the key sought among the keys matching prefix
    const int bin = tid / 4, quarter = tid % 4;
#pragma unroll 1
    for (int pass = 0; pass < 4; ++pass) {
      const int shift = 24 - 8 * pass;
      const int nb = pass == 0 ? 128 : 256;
      int* mine = whist[warp];
#pragma unroll
      for (int i = lane; i < 256; i += kWarp) mine[i] = 0;
      __syncwarp();
#pragma unroll 4
      for (int ch = ch0; ch < ch1; ++ch) {
        const int c = ch * kWarp + lane;
        const uint32_t u = c < k ? mag_key(src[c]) : 0u;
        if (c < k && (u & mask) == prefix) atomicAdd(&mine[(u >> shift) & static_cast<unsigned>(nb - 1)], 1);
      }
      __syncthreads();
      int v = 0;
      if (bin < nb) {
#pragma unroll
        for (int w = 0; w < kSpThreads / kWarp / 4; ++w) v += whist[quarter * (kSpThreads / kWarp / 4) + w][bin];
      }
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (quarter != 0) v = 0;
      int total = 0;
      const int ex = block_scan_excl(v, &total, scan);
      if (quarter == 0 && bin < nb && ex < rank && rank <= ex + v) {
        s_prefix = prefix | (static_cast<uint32_t>(bin) << shift);
        s_rank = rank - ex;
      }
      __syncthreads();
      prefix = s_prefix;
      rank = s_rank;
      mask |= static_cast<uint32_t>(nb - 1) << shift;
    }
    cut = prefix;  // drop = (entries below cut) + rank
    ties_drop = rank;
  }
  const unsigned below = (1u << lane) - 1u;
  // Ties (entries whose magnitude equals cut) in index order: the warps' counts, then each warp's first tie's rank.
  int tie0 = 0;
  if (select) {
    int ties = 0;
#pragma unroll 1
    for (int ch = ch0; ch < ch1; ++ch) {
      const int c = ch * kWarp + lane;
      ties += __popc(__ballot_sync(0xffffffffu, c < k && mag_key(src[c]) == cut));
    }
    if (lane == 0) s_ties[warp] = ties;
    __syncthreads();
    tie0 = warps_before(s_ties, warp, lane);
  }
  // Entry c of this lane survives (and is listed when nonzero); tie: the warp's running count of ties before chunk.
  const auto survives = [&](int c, float v, int& tie) {
    bool kv;
    if (!topk) {
      kv = !(fabsf(v) <= threshold);
    } else if (!select) {
      kv = true;
    } else {
      const uint32_t u = mag_key(v);
      const unsigned tb = __ballot_sync(0xffffffffu, c < k && u == cut);
      kv = u != cut ? u > cut : tie + __popc(tb & below) >= ties_drop;
      tie += __popc(tb);
    }
    return c < k && kv;
  };
  int kept = 0;
  {
    int tie = tie0;
#pragma unroll 1
    for (int ch = ch0; ch < ch1; ++ch) {
      const int c = ch * kWarp + lane;
      const float v = c < k ? src[c] : 0.0f;
      kept += __popc(__ballot_sync(0xffffffffu, survives(c, v, tie) && v != 0.0f));
    }
  }
  if (lane == 0) s_kept[warp] = kept;
  __syncthreads();
  int kept_total = 0;
  int pos = warps_before(s_kept, warp, lane, &kept_total);
  int tie = tie0;
#pragma unroll 1
  for (int ch = ch0; ch < ch1; ++ch) {
    const int c = ch * kWarp + lane;
    const float v = c < k ? src[c] : 0.0f;
    const bool kv = survives(c, v, tie);
    const float out = kv ? v : 0.0f;
    if (y && c < k) y[c] = out;
    const bool listed = kv && v != 0.0f;
    const unsigned lb = __ballot_sync(0xffffffffu, listed);
    float val = v;
    if (q8_list) {
      // The list's values as the 8-bit activations the quantized kernels read (the CPU's sparse and dense kernels
      // quantize the zeroed x per block of 32, here this chunk: d = amax / 127, q = round(v * 127 / amax), as
      // quantize_act in backends/cpu/kernels/matmul_scalar.cpp), so the quantized sparse GEMV sums the CPU's
      // products: d * q per surviving entry.
      const float amax = warp_max(fabsf(out));
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      val = amax / 127.0f * rintf(v * id);
    }
    if (list && listed) list[pos + __popc(lb & below)] = make_int2(c, __float_as_int(val));
    pos += __popc(lb);
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
  if (q8_list && (list == nullptr || y == nullptr || k % 32 != 0))
    fail("sparsify: 8-bit list values need the list, the zeroed row and whole 32-blocks");
  // The same rounding as the CPU (floor of the product in double).
  const auto drop =
      threshold < 0 ? static_cast<int>(std::floor(static_cast<double>(sparsity) * static_cast<double>(k))) : 0;
  if (k <= detail::kSpStageMax) {
    static const bool sized = [] {
      TESSERA_CUDA_CHECK(cudaFuncSetAttribute(detail::sparsify_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              detail::kSpStageMax * static_cast<int>(sizeof(float))));
      return true;
    }();
    (void)sized;
    detail::launch("sparsify_kernel", detail::sparsify_kernel<true>, dim3(static_cast<unsigned>(t)),
                   dim3(detail::kSpThreads), static_cast<size_t>(k) * sizeof(float), stream, x, y, static_cast<int>(k),
                   drop, threshold, list, count, zeros, q8_list);
  } else {
    detail::launch("sparsify_kernel", detail::sparsify_kernel<false>, dim3(static_cast<unsigned>(t)),
                   dim3(detail::kSpThreads), 0, stream, x, y, static_cast<int>(k), drop, threshold, list, count, zeros,
                   q8_list);
  }
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
