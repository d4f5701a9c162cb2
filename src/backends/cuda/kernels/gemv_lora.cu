// The decoder's adapted float node in one launch (kernels_lora.h, gemv_lora): the GEMV over aug = [W; A_stack] whose
// blocks 0 .. n_ab - 1 compute u = A_stack · x (the adapters' rows, appended after W's) and whose other blocks compute
// W's rows and add each row's adapter term Σ_c u[u0 + c] · B[row, c] before they store it (or form
// silu(gate + Δ) · (up + Δ) for a gate|up stack with the SwiGLU epilogue). It replaces the GEMV over aug followed by
// lora_b_add / lora_b_swiglu: one launch per adapted node instead of two (the decode step's 128 extra launches at
// Llama-3-8B with adapters on all seven projections).
//
// The W blocks wait for u at their epilogue: thread 0 spins on a counter the u blocks raise (release / acquire at GPU
// scope). This relies on blocks being dispatched in blockIdx order, as CUTLASS's serial split-K semaphore does: the
// u blocks are the grid's first n_ab blocks (at most a few; R <= kLoraMaxRank rows in ROWS-row blocks), so they are
// resident before any W block can wait, and they wait on nothing. By the time a W block has streamed its rows, u has
// long been written; the spin costs one L2 round trip. The last block to finish resets the counters for the next
// launch (every block has passed its wait by then), so a captured graph replays with no memset.
#include <cuda_fp16.h>

#include "backends/cuda/kernels/gemv_float_kernel.cuh"
#include "backends/cuda/kernels_lora.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kLoraRows = 4;  // rows per block: the 16-bit float GEMVs' default shapes (gemv_default_config)

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The adapters' term of stack row `row` (its member's B row against u's columns of that member), summed by the warp
// (lanes over the rank; every lane gets it). 0 for a member without adapters.
__device__ __forceinline__ float lora_delta(const __half* __restrict__ b, const LoraBLayout& l, const float* u,
                                            int64_t row, int lane) {
  float s = 0.0f;
  for (int m = 0; m < l.n_members; ++m) {
    if (l.rows[m] == 0 || row < l.row0[m] || row >= l.row0[m] + l.rows[m]) continue;
    const __half* br = b + l.b0[m] + (row - l.row0[m]) * l.r_pad[m];
    for (int c = lane; c < l.r[m]; c += kWarp) s += __half2float(br[c]) * __ldcg(u + l.u0[m] + c);
  }
  return warp_sum(s);
}

template <DType D, int THREADS, bool NORM, bool SWIGLU>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS)
    gemv_lora_kernel(const uint8_t* __restrict__ w /*aug [n_w + r_total, k]*/, const float* __restrict__ x /*[k]*/,
                     float* __restrict__ y /*[n_w], SWIGLU: [n_w / 2]*/, float* u /*[r_total]*/, int n_w, int r_total,
                     int k, bool accumulate, const float* __restrict__ norm_w, float norm_eps,
                     const __half* __restrict__ b, LoraBLayout l, unsigned* sync /*[2]: u blocks done, blocks done*/,
                     EarlyL2 early) {
  constexpr int ROWS = kLoraRows;
  constexpr int kWarps = THREADS / kWarp;
  constexpr int kElemBytes = 16 / FloatFmt<D>::kElems;
  const int n_ab = (r_total + ROWS - 1) / ROWS;
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  float acc[ROWS] = {};
  float ss = 0.0f;
  if (static_cast<int>(blockIdx.x) < n_ab) {
    const uint8_t* a = w + static_cast<size_t>(n_w) * k * kElemBytes;
    const int row0 =
        gemv_float_acc<D, THREADS, ROWS, 1, 0, NORM, false>(a, x, r_total, k, norm_w, blockIdx.x, early, acc, ss);
    float scale = 1.0f;
    if constexpr (NORM) scale = gemv_norm_scale<THREADS>(ss, k, norm_eps);
    block_sum_store<THREADS, ROWS>(acc, u, row0, r_total, false, scale);  // thread 0 stores
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(sync, 1u);
    }
  } else {
    const int n_out = SWIGLU ? n_w / 2 : n_w;
    const int row0 = gemv_float_acc<D, THREADS, ROWS, 1, 0, NORM, SWIGLU>(w, x, n_out, k, norm_w,
                                                                         static_cast<int>(blockIdx.x) - n_ab, early,
                                                                         acc, ss);
    float scale = 1.0f;
    if constexpr (NORM) scale = gemv_norm_scale<THREADS>(ss, k, norm_eps);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = warp_sum(acc[r]);
    __shared__ float part[ROWS][kWarps];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) part[r][warp] = acc[r];
    }
    __syncthreads();
    if (warp == 0) {
      if (lane == 0)
        while (load_acquire(sync) < static_cast<unsigned>(n_ab)) __nanosleep(64);
      __syncwarp();
      float v[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) v[r] = warp_sum(lane < kWarps ? part[r][lane] : 0.0f) * scale;
      if constexpr (SWIGLU) {
        constexpr int H = ROWS / 2;
#pragma unroll
        for (int j = 0; j < H; ++j) {
          if (row0 + j >= n_out) break;
          const float dg = lora_delta(b, l, u, row0 + j, lane);
          const float du = lora_delta(b, l, u, n_out + row0 + j, lane);
          if (lane == 0) y[row0 + j] = silu_mul(v[j] + dg, v[H + j] + du);
        }
      } else {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (row0 + r >= n_out) break;
          const float d = lora_delta(b, l, u, row0 + r, lane);
          if (lane == 0) y[row0 + r] = accumulate ? y[row0 + r] + (v[r] + d) : v[r] + d;
        }
      }
    }
  }
  if (threadIdx.x == 0 && atomicAdd(sync + 1, 1u) == gridDim.x - 1) {
    sync[0] = 0;
    sync[1] = 0;
  }
}

template <DType D, int THREADS>
void launch_lora(const DeviceWeight& aug, int64_t n_w, const GemvInput& x, const void* b, const LoraBLayout& l,
                 float* u, unsigned* sync, float* y, cudaStream_t stream, bool accumulate) {
  const int n_ab = static_cast<int>(ceil_div(l.r_total, kLoraRows));
  const int64_t n_out = x.swiglu ? n_w / 2 : n_w;
  const int64_t per_block = x.swiglu ? kLoraRows / 2 : kLoraRows;
  const dim3 grid(static_cast<unsigned>(n_ab + ceil_div(n_out, per_block)));
  const bool norm = x.norm_w != nullptr;
  const auto go = [&](auto kernel) {
    launch("gemv_lora_kernel", kernel, grid, dim3(THREADS), 0, stream, aug.quants.as<uint8_t>(), x.f32, y, u,
           static_cast<int>(n_w), l.r_total, static_cast<int>(aug.k), accumulate, norm ? x.norm_w : nullptr,
           norm ? x.norm_eps : 0.0f, static_cast<const __half*>(b), l, sync, early_l2());
  };
  if (x.swiglu)
    norm ? go(gemv_lora_kernel<D, THREADS, true, true>) : go(gemv_lora_kernel<D, THREADS, false, true>);
  else
    norm ? go(gemv_lora_kernel<D, THREADS, true, false>) : go(gemv_lora_kernel<D, THREADS, false, false>);
}

template <DType D>
void launch_lora_threads(int threads, const DeviceWeight& aug, int64_t n_w, const GemvInput& x, const void* b,
                         const LoraBLayout& l, float* u, unsigned* sync, float* y, cudaStream_t stream,
                         bool accumulate) {
  if (threads == 256)
    launch_lora<D, 256>(aug, n_w, x, b, l, u, sync, y, stream, accumulate);
  else
    launch_lora<D, 128>(aug, n_w, x, b, l, u, sync, y, stream, accumulate);
}

}  // namespace
}  // namespace detail

bool gemv_lora_supported(const DeviceWeight& aug, const GemvConfig& c) {
  return (aug.dtype == DType::BF16 || aug.dtype == DType::F16) && !c.stationary && c.rows == detail::kLoraRows &&
         c.unroll == 1 && c.prefetch == 0 && (c.threads == 128 || c.threads == 256);
}

void gemv_lora(const DeviceWeight& aug, int64_t n_w, const GemvInput& x, const void* b, const LoraBLayout& l, float* u,
               unsigned* sync, float* y, cudaStream_t stream, const GemvConfig& c, bool accumulate) {
  TESSERA_CUDA_REQUIRE(gemv_lora_supported(aug, c),
                       "gemv_lora: the fused adapter GEMV takes bf16 or f16 weights at 128 or 256 threads, 4 rows, "
                       "one load in flight and no prefetch");
  TESSERA_CUDA_REQUIRE(n_w >= 1 && n_w + l.r_total == aug.n && aug.k % 8 == 0 && (!x.swiglu || n_w % 2 == 0),
                       "gemv_lora: aug must hold the base's rows (an even count with SwiGLU) and then r_total A rows");
  TESSERA_CUDA_REQUIRE(x.f32 != nullptr && detail::aligned16(x.f32) && x.q8 == nullptr && x.rms_sumsq == nullptr &&
                           x.norm_out_w == nullptr && (x.norm_w == nullptr || detail::aligned16(x.norm_w)),
                       "gemv_lora: float weights need a 16-byte aligned f32 input (and norm weight), no q8 forms");
  TESSERA_CUDA_REQUIRE(!x.swiglu || !accumulate, "gemv_lora: the SwiGLU epilogue does not accumulate");
  TESSERA_CUDA_REQUIRE(b != nullptr && reinterpret_cast<uintptr_t>(b) % 16 == 0 && u != nullptr && sync != nullptr &&
                           y != nullptr && l.n_members >= 1 && l.n_members <= kLoraMaxMembers && l.r_total >= 1 &&
                           l.r_total <= kLoraMaxRank,
                       "gemv_lora: null buffers, or an adapter layout with no member or too large a rank");
  for (int m = 0; m < l.n_members; ++m)
    TESSERA_CUDA_REQUIRE(l.rows[m] == 0 || (l.row0[m] >= 0 && l.row0[m] + l.rows[m] <= n_w &&
                                            l.u0[m] + l.r[m] <= l.r_total && l.r[m] <= l.r_pad[m]),
                         "gemv_lora: a member's rows or adapter columns fall outside the weight or u");
  if (aug.dtype == DType::BF16)
    detail::launch_lora_threads<DType::BF16>(c.threads, aug, n_w, x, b, l, u, sync, y, stream, accumulate);
  else
    detail::launch_lora_threads<DType::F16>(c.threads, aug, n_w, x, b, l, u, sync, y, stream, accumulate);
}

}  // namespace tessera::cuda
