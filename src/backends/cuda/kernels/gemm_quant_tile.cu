// Quantized prefill GEMM by per-tile dequantization (GemmPath::TILE, gemm_paths.h): y[t, N] (+)= x[t, K] · W[N, K]ᵀ
// with x bf16 (as rmsnorm / swiglu_rows write it), W in upload_weight's SPLIT_Q layout (any format with a TileFormat:
// gemm_quant_tile.h), f32 accumulation, y f32 or bf16. The expansion path (launch_dequant_bf16 into the workspace's
// scratch, then cuBLASLt) writes and reads N*K*2 bytes per call; here each CTA dequantizes its own W tile on the way to
// the tensor cores, so the bf16 matrix never exists in memory, and W is read at its own size (q4_K: 0.56 bytes a
// weight). Grown for q4_K in bench/cuda/experiments/quant_prefill_tile.cu ("wgtsk", whose header has the steps and the
// H100 figures); docs/CUDA_NOTES.md has the summary.
//
// CTA: TOK tokens (128 or 256) x 128 W rows, 256 threads as two warpgroups of 64 rows; D [64 rows][TOK] per warpgroup
// in registers (TOK / 2 floats a thread). One pipeline step = 64 values of K, kStages = 4 steps in flight:
//  - x's tile [TOK][64] bf16 by TMA (one thread; the copy engine writes the 128-byte swizzle wgmma's K-major
//    descriptor reads; an mbarrier per stage). Rows past t come in as zeros and are not stored. (x by every thread's
//    cp.async needed a fence.proxy.async each step, which measured as if it waited for the wgmmas in flight.)
//  - each W row's bytes of the step by cp.async into [128 rows][kRawRow] (TileFormat<D>::piece; q4_K: its 32 qs bytes
//    and 16-byte head, 48 B); rows past N re-read row N - 1 and are not stored.
//  - each warp dequantizes its 16 rows straight into wgmma's register A fragments (TileFormat<D>::row_frags: the
//    expansion's arithmetic, so the same bf16 weights bit for bit; only the f32 summation order differs from the
//    expansion + cuBLASLt path).
//  - per step: issue step s's four m64nTOKk16 wgmmas, wait for step s - 1's (wait_group 1), refill step s - 1's stage,
//    and dequantize step s + 1 into the other register set while step s runs.
// Grid (token tiles, W tiles, S): the CTAs of one W tile run side by side, so W's bytes come from DRAM once and x from
// L2. Split-K where the grid is under one wave: S = 2 or 4 CTAs per tile over consecutive slices of K, each writing
// its partial sums to the workspace ([S][t][N] f32), then gemm_tile_sum_kernel adds them in a fixed order
// (deterministic: the same bits on every run).
//
// PDL (common.cuh): W is a weight no kernel writes, so each CTA's first kStages - 1 steps of W bytes are requested
// before pdl_wait(); x (the previous kernel's output) and every global write come after it. The sum kernel waits first.
//
// wgmma and this TMA form exist on sm_90a only: the compute_90 PTX (for other GPUs) gets empty kernels, which
// gemm_quant_tile_supported never lets run.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels/gemm_quant_tile.h"
#include "backends/cuda/kernels/gemm_tile_formats.h"
#include "backends/cuda/kernels/mbarrier.cuh"
#include "backends/cuda/kernels/tensor_map.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace tessera::cuda::detail {
// Named, not anonymous: the compute_90 pass references none of these helpers, which -Werror would otherwise reject.
namespace quant_tile {

// The CTA's shared memory: kStages x stages [TOK][128 B] (1,024-byte aligned: swizzle atoms), then kStages raw W
// stages [kRows][kRawRow].
template <int TOK>
constexpr uint32_t kXBytes = static_cast<uint32_t>(TOK) * kXRow;
template <DType D>
constexpr uint32_t kRawBytes = kRows* TileFormat<D>::kRawRow;
template <DType D, int TOK>
constexpr size_t kSmem = static_cast<size_t>(kStages) * (kXBytes<TOK> + kRawBytes<D>)+1024;  // + alignment slack

// The arguments every step needs.
struct Ctx {
  const uint8_t* quants;  // the SPLIT_Q arrays (split_layout.h)
  const uint8_t* scales;
  const CUtensorMap* xmap;
  uint32_t base, bars;  // shared addresses of the stages and of the kStages mbarriers
  const unsigned char* sm;
  int64_t k;
  int n, t0, n0, s0, steps;
};

__device__ __forceinline__ void cp_async_piece(uint32_t dst, const uint8_t* src, int bytes) {
  if (bytes == 16)
    cp_async16(dst, src);
  else if (bytes == 8)
    cp_async8(dst, src);
  else
    cp_async4(dst, src);
}

// Step s's W bytes (s: the step of the whole K) into raw stage `slot`, spread over the CTA's threads (one cp.async
// group per step, committed by the caller). W rows past N re-read row N - 1 (in bounds; not stored).
// Copy i of the step's kRows * kPieces: with three pieces a row (q4_K, iq4_nl, iq4_xs), row-major (i = 3 r + p: a
// row's neighbouring 16-byte pieces in neighbouring lanes, one 32-byte sector a pair); with more, piece-major
// (i = kRows p + r: every lane of a warp copies the same piece of 32 rows, so piece()'s branches and the copy's size
// are warp-uniform). Row-major, q6_K (8 pieces) and q3_K (7) measured 0.89x and 0.94x the expansion at t = 64 on the
// H100 (their warps ran every piece's branch each step); piece-major 1.28x and 1.52x (docs/CUDA_NOTES.md).
template <DType D, int TOK>
__device__ __forceinline__ void load_w_stage(const Ctx& cx, int slot, int s) {
  using F = TileFormat<D>;
  constexpr bool kRowMajor = F::kPieces <= 3;
  const uint32_t raw = cx.base + kStages * kXBytes<TOK> + slot * kRawBytes<D>;
#pragma unroll
  for (int it = 0; it < (kRows * F::kPieces + kThreads - 1) / kThreads; ++it) {
    const int i = static_cast<int>(threadIdx.x) + it * kThreads;
    if (i < kRows * F::kPieces) {
      const int r = kRowMajor ? i / F::kPieces : i % kRows, p = kRowMajor ? i - F::kPieces * r : i / kRows;
      const int64_t row = min(cx.n0 + r, cx.n - 1);
      const Piece pc = F::piece(row, cx.n, cx.k, s, p);
      cp_async_piece(raw + static_cast<uint32_t>(r * F::kRawRow + pc.dst), (pc.scales ? cx.scales : cx.quants) + pc.src,
                     pc.bytes);
    }
  }
}

// Step s's x tile into stage `slot` by TMA (thread 0 only).
template <int TOK>
__device__ __forceinline__ void load_x_stage(const Ctx& cx, int slot, int s) {
  mbar_expect_tx(cx.bars + 8 * slot, kXBytes<TOK>);  // the whole box, rows past t (zero-filled) included
  tma_load_2d(cx.base + slot * kXBytes<TOK>, cx.xmap, s * kStepK, cx.t0, cx.bars + 8 * slot);
}

// The A fragments of this warp's m16 tile (stage rows r0 .. r0 + 15) for step s's four k16 slices.
template <DType D>
__device__ __forceinline__ void tile_frags(const Ctx& cx, const unsigned char* raw, int r0, int g, int c, int s,
                                           uint32_t (&a)[4][4]) {
  uint32_t f[2][4][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + g + 8 * h;
    frags<D>(reinterpret_cast<const uint32_t*>(raw + r * TileFormat<D>::kRawRow), c, s, min(cx.n0 + r, cx.n - 1), cx.k,
             f[h]);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a[j][0] = f[0][j][0];
    a[j][1] = f[1][j][0];
    a[j][2] = f[0][j][1];
    a[j][3] = f[1][j][1];
  }
}

// Step s of the CTA's slice (0 .. steps - 1): issue its wgmmas from `cur`, then, once step s - 1's are done, refill
// that stage with step s + kStages - 1 and dequantize step s + 1 into `nxt`.
template <DType D, int TOK>
__device__ __forceinline__ void step(const Ctx& cx, float (&d)[TOK / 2], const uint32_t (&cur)[4][4],
                                     uint32_t (&nxt)[4][4], int s, int r0, int g, int c) {
  const int slot = s % kStages;
  const uint32_t xs = cx.base + slot * kXBytes<TOK>;
  mbar_wait(cx.bars + 8 * slot, static_cast<uint32_t>((s / kStages) & 1));  // x(s) has landed
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (TOK == 128)
      wgmma_rs_n128(d, cur[j], desc_kmajor(xs + 32 * j));
    else
      wgmma_rs_n256(d, cur[j], desc_kmajor(xs + 32 * j));
  }
  wgmma_commit();
  wgmma_wait<1>();         // step s - 1's wgmmas are done: `nxt` and stage (s - 1) % kStages are free
  cp_wait<kStages - 3>();  // this thread's W bytes of step s + 1 have landed
  __syncthreads();         // everyone's have, and both warpgroups are past step s - 1
  const int sn = s + kStages - 1;
  if (sn < cx.steps) {
    load_w_stage<D, TOK>(cx, sn % kStages, cx.s0 + sn);
    if (threadIdx.x == 0) load_x_stage<TOK>(cx, sn % kStages, cx.s0 + sn);
  }
  cp_commit();  // empty groups at the end keep the wait count's arithmetic
  if (s + 1 < cx.steps)
    tile_frags<D>(cx, cx.sm + kStages * kXBytes<TOK> + ((s + 1) % kStages) * kRawBytes<D>, r0, g, c, cx.s0 + s + 1,
                  nxt);
}

// Grid (ceil(t / TOK), ceil(N / 128), S). S == 1: y [t, N] (f32, or bf16 with kY16) written, or added to when
// accumulate. S > 1: CTA z takes steps [z K / (64 S), (z + 1) K / (64 S)) and writes its partial sums to parts
// [S][t][N] (f32), for gemm_tile_sum_kernel.
template <DType D, int TOK, bool kY16>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_tile_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                     const __grid_constant__ CUtensorMap xmap /*x [t, K] bf16*/, void* __restrict__ y,
                     float* __restrict__ parts, int t, int n, int k, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int ND = TOK / 2;
  static_assert(TOK == 128 || TOK == 256, "wgmma n128 or n256; a TMA box is at most 256 rows");
  static_assert(kXBytes<TOK> % 1024 == 0, "swizzle atoms are 1,024-byte aligned");
  extern __shared__ unsigned char smem_dyn[];
  __shared__ alignas(8) uint64_t bar_mem[kStages];
  unsigned char* sm = smem_dyn + ((1024u - (smem_u32(smem_dyn) & 1023u)) & 1023u);
  const int steps = k / kStepK / static_cast<int>(gridDim.z);
  const Ctx cx{quants,
               scales,
               &xmap,
               smem_u32(sm),
               smem_u32(bar_mem),
               sm,
               k,
               n,
               static_cast<int>(blockIdx.x) * TOK,
               static_cast<int>(blockIdx.y) * kRows,
               static_cast<int>(blockIdx.z) * steps,
               steps};
  const int lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2, c = lane & 3;
  const int r0 = (static_cast<int>(threadIdx.x) >> 5) * 16;  // warp w: stage rows 16 w .. 16 w + 15
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) mbar_init(cx.bars + 8 * i, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_w_stage<D, TOK>(cx, s, cx.s0 + s);
    cp_commit();
  }
  pdl_wait();  // x is the previous kernel's output; y and parts may still be read by it
  if (threadIdx.x == 0)
    for (int s = 0; s < kStages - 1 && s < steps; ++s) load_x_stage<TOK>(cx, s, cx.s0 + s);

  float d[ND];
#pragma unroll
  for (int i = 0; i < ND; ++i) d[i] = 0.0f;
  uint32_t a0[4][4], a1[4][4];
  cp_wait<kStages - 2>();  // this thread's W bytes of step 0
  __syncthreads();
  tile_frags<D>(cx, sm + kStages * kXBytes<TOK>, r0, g, c, cx.s0, a0);
  fence_regs(d);
  for (int s = 0; s < steps; s += 2) {  // two steps per trip: the register sets swap roles at compile time
    step<D, TOK>(cx, d, a0, a1, s, r0, g, c);
    if (s + 1 < steps) step<D, TOK>(cx, d, a1, a0, s + 1, r0, g, c);
  }
  wgmma_wait<0>();
  fence_regs(d);
  cp_wait<0>();
  // d[i]: W row n0 + r0 + g + 8 ((i / 2) % 2), token t0 + 8 (i / 4) + 2c + i % 2 (wgmma's accumulator layout).
  float* part = gridDim.z > 1 ? parts + static_cast<int64_t>(blockIdx.z) * t * n : nullptr;
#pragma unroll
  for (int i = 0; i < ND; ++i) {
    const int row = cx.n0 + r0 + g + 8 * ((i >> 1) & 1), tok = cx.t0 + 8 * (i >> 2) + 2 * c + (i & 1);
    if (row >= n || tok >= t) continue;
    const int64_t at = static_cast<int64_t>(tok) * n + row;
    if (part != nullptr) {
      part[at] = d[i];
    } else if constexpr (kY16) {
      __nv_bfloat16* yh = static_cast<__nv_bfloat16*>(y) + at;
      *yh = __float2bfloat16_rn(accumulate ? __bfloat162float(*yh) + d[i] : d[i]);
    } else {
      float* yf = static_cast<float*>(y) + at;
      *yf = accumulate ? *yf + d[i] : d[i];
    }
  }
#else
  (void)quants, (void)scales, (void)xmap, (void)y, (void)parts, (void)t, (void)n, (void)k, (void)accumulate;
#endif
}

// y[i] (+)= parts[0][i] + parts[1][i] + ... (the S parts of count floats, added in this order), four values a thread
// where `vec` (count % 4 == 0, y aligned for the vector store), else one.
template <bool kY16>
__global__ void __launch_bounds__(256) gemm_tile_sum_kernel(const float* __restrict__ parts, void* __restrict__ y,
                                                            int64_t count, int splits, bool accumulate, bool vec) {
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (vec) {
    if (4 * i >= count) return;
    float4 a = reinterpret_cast<const float4*>(parts)[i];
    for (int z = 1; z < splits; ++z) {
      const float4 b = reinterpret_cast<const float4*>(parts + z * count)[i];
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
    }
    if constexpr (kY16) {
      uint2* yp = static_cast<uint2*>(y) + i;
      if (accumulate) {
        const uint2 o = *yp;
        a.x += bf16_lo(o.x), a.y += bf16_hi(o.x), a.z += bf16_lo(o.y), a.w += bf16_hi(o.y);
      }
      *yp = make_uint2(pack16x2(a.x, a.y, true), pack16x2(a.z, a.w, true));
    } else {
      float4* yp = static_cast<float4*>(y) + i;
      if (accumulate) {
        const float4 o = *yp;
        a.x = o.x + a.x, a.y = o.y + a.y, a.z = o.z + a.z, a.w = o.w + a.w;
      }
      *yp = a;
    }
    return;
  }
  if (i >= count) return;
  float a = parts[i];
  for (int z = 1; z < splits; ++z) a += parts[z * count + i];
  if constexpr (kY16) {
    uint16_t* yp = static_cast<uint16_t*>(y) + i;
    *yp = to16(accumulate ? from16(*yp, true) + a : a, true);
  } else {
    float* yp = static_cast<float*>(y) + i;
    *yp = accumulate ? *yp + a : a;
  }
}

}  // namespace quant_tile

namespace {
using namespace quant_tile;

int tile_tokens(int64_t t) { return t <= kQuantTileSmallT ? 128 : 256; }

// Calls f(std::integral_constant<DType, D>{}) for a format with a tile kernel and returns true; false for the others.
template <typename Fn>
bool with_tile_format(DType d, Fn&& f) {
  bool tiled = false;
  with_split_layout(d, [&](auto tag) {
    if constexpr (HasTileFormat<decltype(tag)::value>::value) {
      f(tag);
      tiled = true;
    }
  });
  return tiled;
}

template <DType D, int TOK, bool kY16>
void allow_smem() {
  TESSERA_CUDA_CHECK(cudaFuncSetAttribute(gemm_tile_kernel<D, TOK, kY16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kSmem<D, TOK>)));
}

// Whether this process's device runs the kernels (sm_90, the driver's tensor-map encoder), with their shared-memory
// limits raised: once, on the first call (a throw, from cudaFuncSetAttribute, leaves it to the next call).
bool device_ready() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess || major != 9 ||
        minor != 0 || tensor_map_encoder() == nullptr) {
      (void)cudaGetLastError();
      return false;
    }
    for (const DType d : kSplitFormats)
      with_tile_format(d, [](auto tag) {
        constexpr DType D = decltype(tag)::value;
        allow_smem<D, 128, false>();
        allow_smem<D, 128, true>();
        allow_smem<D, 256, false>();
        allow_smem<D, 256, true>();
      });
    return true;
  }();
  return ok;
}

// x [t, K] bf16 as a TMA tensor map: boxes of 64 columns (128 bytes, the swizzle's span) x tok rows, 128-byte
// swizzle, zeros past row t.
CUtensorMap x_map(const void* x, int64_t t, int64_t k, int tok) {
  CUtensorMap m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(t)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kStepK), static_cast<cuuint32_t>(tok)}, es[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(x), dims, strides,
                                          box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TESSERA_CUDA_REQUIRE(r == CUDA_SUCCESS, "gemm_quant_tile: the driver refused x's tensor map");
  return m;
}

template <DType D, int TOK, bool kY16>
void run(const DeviceWeight& w, const void* x16, void* y, int64_t t, bool accumulate, float* parts, int splits,
         cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((t + TOK - 1) / TOK), static_cast<unsigned>((w.n + kRows - 1) / kRows),
                  static_cast<unsigned>(splits));
  launch("gemm_tile_kernel", gemm_tile_kernel<D, TOK, kY16>, grid, dim3(kThreads), kSmem<D, TOK>, stream,
         w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), x_map(x16, t, w.k, TOK), y, parts, static_cast<int>(t),
         static_cast<int>(w.n), static_cast<int>(w.k), accumulate);
  if (splits > 1) {
    const int64_t count = t * w.n;
    const bool vec = count % 4 == 0 && aligned16(parts) && (reinterpret_cast<uintptr_t>(y) % (kY16 ? 8 : 16)) == 0;
    const int64_t threads = vec ? count / 4 : count;
    launch("gemm_tile_sum_kernel", gemm_tile_sum_kernel<kY16>, dim3(static_cast<unsigned>(ceil_div(threads, 256))),
           dim3(256), 0, stream, static_cast<const float*>(parts), y, count, splits, accumulate, vec);
  }
}

}  // namespace

bool gemm_quant_tile_format(DType dtype) {
  return with_tile_format(dtype, [](auto) {});
}

bool gemm_quant_tile_supported(const DeviceWeight& w, const void* x16, std::string* why) {
  const auto no = [&](const char* r) {
    if (why != nullptr) *why = r;
    return false;
  };
  if (!gemm_quant_tile_format(w.dtype)) return no("the weight's format has no tile kernel");
  if (w.layout != GemvLayout::SPLIT_Q) return no("the weight is not in the SPLIT_Q layout");
  int64_t block_size = 0, block_bytes = 0;
  with_tile_format(w.dtype, [&](auto tag) {
    block_size = Format<decltype(tag)::value>::kBlockSize;
    block_bytes = Format<decltype(tag)::value>::kBlockBytes;
  });
  const int64_t align = std::max<int64_t>(kStepK, block_size);
  if (w.n < 1 || w.k < align || w.k % align != 0 || w.n > (int64_t{1} << 30) || w.k > (int64_t{1} << 30))
    return no("the weight's shape (K must be a multiple of 64 and of the format's block)");
  if (w.quants.bytes() + w.scales.bytes() < static_cast<size_t>(w.n * w.k / block_size * block_bytes))
    return no("the weight's buffers are shorter than its shape");
  if (x16 != nullptr && !aligned16(x16)) return no("x is not 16-byte aligned (TMA)");
  if (!device_ready()) return no("not an sm_90 device with the driver's tensor-map encoder (wgmma, TMA)");
  return true;
}

void gemm_quant_tile_prepare() { (void)device_ready(); }

int gemm_quant_tile_splits(int64_t t, int64_t n, int64_t k, int64_t parts_floats) {
  const int64_t tok = tile_tokens(t);
  const int64_t ctas = (t + tok - 1) / tok * ((n + kRows - 1) / kRows), steps = k / kStepK;
  int splits = 1;
  for (const int s : {2, 4})
    if (ctas * s <= sm_count() && steps % s == 0 && s * t * n <= parts_floats) splits = s;
  return splits;
}

void launch_gemm_quant_tile(const DeviceWeight& w, const void* x16, void* y, bool y16, int64_t t, bool accumulate,
                            float* parts, int64_t parts_floats, cudaStream_t stream) {
  std::string why;
  TESSERA_CUDA_REQUIRE(gemm_quant_tile_supported(w, x16, &why), "gemm_quant_tile: " + why);
  TESSERA_CUDA_REQUIRE(x16 != nullptr && y != nullptr, "gemm_quant_tile: the input or output pointer is null");
  TESSERA_CUDA_REQUIRE(t >= 1 && t <= (int64_t{1} << 30) && t * w.n <= (int64_t{1} << 40),
                       "gemm_quant_tile: t is outside 1..2^30");
  const int splits = parts == nullptr ? 1 : gemm_quant_tile_splits(t, w.n, w.k, parts_floats);
  with_tile_format(w.dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    if (tile_tokens(t) == 128)
      (y16 ? run<D, 128, true> : run<D, 128, false>)(w, x16, y, t, accumulate, parts, splits, stream);
    else
      (y16 ? run<D, 256, true> : run<D, 256, false>)(w, x16, y, t, accumulate, parts, splits, stream);
  });
}

}  // namespace tessera::cuda::detail
