// The sparse GEMV for q8_0, q4_0 and q4_1 weights (gemv_sparse.h's quantized layout): f32 x from the list (no 8-bit
// activations: the list already holds each surviving value, and a dequantized weight d * q is exact in f32, so the
// result is the dense reference's on the zeroed x up to summation order).
#include <algorithm>

#include "backends/cuda/kernels/gemv_sparse_kernel.cuh"
#include "core/error.h"

namespace tessera::cuda::detail {
namespace {

__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Word i of a register array of vectors (i a compile-time constant after unrolling, so no local memory).
template <int N>
__device__ __forceinline__ uint32_t word_of(const uint4 (&a)[N], int i) {
  const uint4& v = a[i / 4];
  return i % 4 == 0 ? v.x : i % 4 == 1 ? v.y : i % 4 == 2 ? v.z : v.w;
}

template <DType D>
struct SparseQ {
  static constexpr int kRun = D == DType::Q8_0 ? 64 : 32;       // bytes of one channel's 64 rows
  static constexpr int kHeader = D == DType::Q4_1 ? 256 : 128;  // the 64 rows' scales
  static constexpr int kChunk = kHeader + 32 * kRun;
  static constexpr int kScaleBytes = kHeader / 64;  // per row: fp16 d, or q4_1's (d, m)
};

// dst chunk (tile, b) from the SPLIT_Q arrays (kernels.h): quants [n, k] (q8_0) or [n, k/2] (q4: per block 16 bytes,
// element j in byte j's low nibble, j + 16 in byte j's high nibble), scales [n, k/32] x 2 or 4 bytes. One thread per
// output byte: a one-time copy at compile.
template <DType D>
__global__ void sparse_quant_repack_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                                           uint8_t* __restrict__ dst, int n, int k, size_t total) {
  using Q = SparseQ<D>;
  pdl_wait();
  const int nb = k / 32;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t chunk = i / Q::kChunk;
    const int off = static_cast<int>(i % Q::kChunk);
    const int b = static_cast<int>(chunk % nb);
    const int tile = static_cast<int>(chunk / nb);
    uint8_t v = 0;
    if (off < Q::kHeader) {
      const int row = tile * 64 + off / Q::kScaleBytes;
      if (row < n) v = scales[(static_cast<size_t>(row) * nb + b) * Q::kScaleBytes + off % Q::kScaleBytes];
    } else {
      const int o = off - Q::kHeader, cc = o / Q::kRun, j = o % Q::kRun;
      if constexpr (D == DType::Q8_0) {
        const int row = tile * 64 + j;
        if (row < n) v = quants[(static_cast<size_t>(row) * nb + b) * 32 + cc];
      } else {
        for (int h = 0; h < 2; ++h) {
          const int row = tile * 64 + 2 * j + h;
          if (row >= n) continue;
          const uint8_t byte = quants[(static_cast<size_t>(row) * nb + b) * 16 + (cc & 15)];
          const uint8_t nib = cc < 16 ? (byte & 15) : (byte >> 4);
          v |= static_cast<uint8_t>(nib << (4 * h));
        }
      }
    }
    dst[i] = v;
  }
}

// As gemv_sparse_kernel (gemv_sparse.cu), with 4 threads per channel of a 64-row tile, 16 rows each: per entry a
// thread loads its 16 rows' quants (q8_0 16 bytes, q4 8 bytes, streamed) and their scales from the block's header
// (32 or 64 bytes through L1: the block's other surviving channels read the same lines), then acc[r] += w[r] * x with
// w = d q (q8_0), d (q - 8) (q4_0) or d q + m (q4_1).
template <DType D, int THREADS, int UNROLL>
__global__ void __launch_bounds__(THREADS)
    gemv_sparse_quant_kernel(const uint8_t* __restrict__ w, const SparseEntry* __restrict__ list,
                             const int32_t* __restrict__ count, float* __restrict__ y, float* __restrict__ partial,
                             unsigned int* __restrict__ tickets, int n, int k, int splits, bool accumulate) {
  using Q = SparseQ<D>;
  constexpr int G = 4, RPT = 16;
  constexpr int kSlots = THREADS / G;
  constexpr int kStep = kSlots * UNROLL;
  constexpr int kQBytes = Q::kRun / G;  // this thread's quants of one channel: 16 (q8_0) or 8 (q4)
  const int tile = blockIdx.x, s = blockIdx.y;
  const int g = threadIdx.x % G, slot = threadIdx.x / G;
  const int nb = k / 32;
  const uint8_t* wt = w + static_cast<size_t>(tile) * nb * Q::kChunk;
  pdl_wait();
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
  float acc[RPT] = {};
  int j = lo + slot;
  int2 e[UNROLL];
  load_entries(j, e);
  while (j < hi) {
    uint4 q[UNROLL];
    uint4 sc[UNROLL][Q::kScaleBytes];  // 16 rows' scales: 2 (fp16 d) or 4 ((d, m)) vectors
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = e[u].x >= 0 ? e[u].x : 0;
      const uint8_t* chunk = wt + static_cast<size_t>(c >> 5) * Q::kChunk;
      const uint8_t* qp = chunk + Q::kHeader + (c & 31) * Q::kRun + g * kQBytes;
      if (e[u].x < 0) {
        q[u] = make_uint4(0, 0, 0, 0);
      } else if constexpr (kQBytes == 16) {
        q[u] = ld_stream16(qp);
      } else {
        const uint2 h = ld_stream8(qp);
        q[u] = make_uint4(h.x, h.y, 0, 0);
      }
      const uint4* sp = reinterpret_cast<const uint4*>(chunk + g * RPT * Q::kScaleBytes);
#pragma unroll
      for (int i = 0; i < Q::kScaleBytes; ++i) sc[u][i] = __ldg(sp + i);
    }
    int2 en[UNROLL];
    load_entries(j + kStep, en);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const float xv = e[u].x >= 0 ? __int_as_float(e[u].y) : 0.0f;
      const uint32_t qw[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
      for (int r = 0; r < RPT; ++r) {
        float qf;
        if constexpr (D == DType::Q8_0) {
          qf = static_cast<float>(static_cast<int8_t>((qw[r / 4] >> (8 * (r % 4))) & 0xff));
        } else {
          const int nib = static_cast<int>((qw[r / 8] >> (4 * (r % 8))) & 15);
          qf = static_cast<float>(D == DType::Q4_0 ? nib - 8 : nib);
        }
        float wv;
        if constexpr (D == DType::Q4_1) {
          const float2 dm = half2_to_float2(word_of(sc[u], r));
          wv = fmaf(dm.x, qf, dm.y);
        } else {
          const float2 dd = half2_to_float2(word_of(sc[u], r / 2));
          wv = (r % 2 == 0 ? dd.x : dd.y) * qf;
        }
        acc[r] = fmaf(wv, xv, acc[r]);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) e[u] = en[u];
    j += kStep;
  }
  sparse_epilogue<64, RPT, THREADS>(acc, y, partial, tickets, n, splits, accumulate);
}

template <DType D>
SparseWeight make_q(const DeviceWeight& w, cudaStream_t stream) {
  using Q = SparseQ<D>;
  SparseWeight s;
  s.dtype = D;
  s.n = w.n;
  s.k = w.k;
  s.tile = kSparseTile;
  const size_t total = static_cast<size_t>(s.tiles()) * static_cast<size_t>(w.k / 32) * Q::kChunk;
  s.data = DeviceBuffer(total);
  const int blocks = static_cast<int>(std::min<size_t>((total + 255) / 256, size_t{65536}));
  launch("sparse_quant_repack_kernel", sparse_quant_repack_kernel<D>, dim3(blocks), dim3(256), 0, stream,
         w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), s.data.as<uint8_t>(), static_cast<int>(w.n),
         static_cast<int>(w.k), total);
  return s;
}

template <DType D>
void launch_q(const SparseWeight& w, const SparseEntry* list, const int32_t* count, float* y, bool accumulate,
              SparseGemvWorkspace& ws, cudaStream_t stream, int splits) {
  const dim3 grid(static_cast<unsigned>(w.tiles()), static_cast<unsigned>(splits));
  launch("gemv_sparse_quant_kernel", gemv_sparse_quant_kernel<D, kGemvThreads, kGemvUnroll>, grid, dim3(kGemvThreads),
         0, stream, w.data.as<uint8_t>(), list, count, y, ws.partials(), ws.tickets(), static_cast<int>(w.n),
         static_cast<int>(w.k), splits, accumulate);
}

}  // namespace

SparseWeight make_sparse_quant(const DeviceWeight& w, cudaStream_t stream) {
  if (w.layout != GemvLayout::SPLIT_Q || w.k % 32 != 0)
    fail("gemv_sparse: {} weights must be in the SPLIT_Q layout with whole blocks", dtype_name(w.dtype));
  if (w.n <= 0 || w.k <= 0 || w.n > INT32_MAX || w.k > INT32_MAX)
    fail("gemv_sparse: weight shape {}x{} out of range", w.n, w.k);
  switch (w.dtype) {
    case DType::Q8_0:
      return make_q<DType::Q8_0>(w, stream);
    case DType::Q4_0:
      return make_q<DType::Q4_0>(w, stream);
    case DType::Q4_1:
      return make_q<DType::Q4_1>(w, stream);
    default:
      fail("gemv_sparse: no sparse GEMV for {} weights", dtype_name(w.dtype));
  }
}

void launch_sparse_quant(const SparseWeight& w, const SparseEntry* list, const int32_t* count, float* y,
                         bool accumulate, SparseGemvWorkspace& ws, cudaStream_t stream, int splits) {
  switch (w.dtype) {
    case DType::Q8_0:
      return launch_q<DType::Q8_0>(w, list, count, y, accumulate, ws, stream, splits);
    case DType::Q4_0:
      return launch_q<DType::Q4_0>(w, list, count, y, accumulate, ws, stream, splits);
    case DType::Q4_1:
      return launch_q<DType::Q4_1>(w, list, count, y, accumulate, ws, stream, splits);
    default:
      fail("gemv_sparse: no sparse GEMV for {} weights", dtype_name(w.dtype));
  }
}

}  // namespace tessera::cuda::detail
