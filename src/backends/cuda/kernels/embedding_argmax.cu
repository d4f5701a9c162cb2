// Embedding lookup (first op of a decode step) and argmax over the vocabulary (greedy sampling, last op). Both read
// little (one table row; one logits vector) but sit on the critical path of every token, so each is one launch.
#include <algorithm>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/quant_units.h"
#include "quant/format_traits.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kEmbThreads = 256;
constexpr int kArgmaxThreads = 512;

// Element i of row `row` of a table of n_rows rows in its GemvLayout.
template <DType D>
__device__ __forceinline__ float table_value(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                                             int n_rows, size_t row, int k, int i) {
  if constexpr (D == DType::F32) {
    return reinterpret_cast<const float*>(quants)[row * k + i];
  } else if constexpr (D == DType::F16) {
    return __half2float(reinterpret_cast<const __half*>(quants)[row * k + i]);
  } else if constexpr (D == DType::BF16) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(quants)[row * k + i]);
  } else if constexpr (D == DType::Q4_K || D == DType::Q5_K || D == DType::Q6_K || D == DType::IQ4_XS ||
                       D == DType::Q5_0 || D == DType::Q5_1 || D == DType::Q2_K || D == DType::Q3_K ||
                       D == DType::TQ2_0) {
    return split_value<D>(quants, scales, n_rows, row, k, i);  // quant_units.h, checked on the host
  } else {
    const size_t b = row * (k / kQ) + i / kQ;  // block index over the whole table
    const int j = i % kQ;
    if constexpr (D == DType::Q8_0) {
      const float d = __half2float(reinterpret_cast<const __half*>(scales)[b]);
      return d * static_cast<float>(reinterpret_cast<const int8_t*>(quants)[row * k + i]);
    } else {
      const uint8_t byte = quants[b * (kQ / 2) + (j % (kQ / 2))];
      const int q = j < kQ / 2 ? (byte & 0x0F) : (byte >> 4);
      if constexpr (D == DType::IQ4_NL) {  // value * d, as Format<IQ4_NL>::dequantize
        const float d = __half2float(reinterpret_cast<const __half*>(scales)[b]);
        return static_cast<float>(format_detail::iq4nl_value(q)) * d;
      } else if constexpr (D == DType::Q4_0) {
        const float d = __half2float(reinterpret_cast<const __half*>(scales)[b]);
        return d * static_cast<float>(q - 8);
      } else {
        const float2 dm = __half22float2(reinterpret_cast<const __half2*>(scales)[b]);
        return dm.x * static_cast<float>(q) + dm.y;
      }
    }
  }
}

template <DType D>
__global__ void __launch_bounds__(kEmbThreads)
    embedding_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales, int n_vocab, int k,
                     const int32_t* __restrict__ ids /*[t]*/, float* __restrict__ out /*[t, k]*/) {
  pdl_wait();
  const int token = blockIdx.y;
  const int i = blockIdx.x * kEmbThreads + threadIdx.x;
  if (i >= k) return;
  const int32_t id = ids[token];
  float* o = out + static_cast<size_t>(token) * k;
  if (id < 0 || id >= n_vocab) {
    o[i] = __int_as_float(0x7fc00000);  // NaN: a bad id must not read outside the table, and must show
    return;
  }
  o[i] = table_value<D>(quants, scales, n_vocab, static_cast<size_t>(id), k, i);
}

// A (value, index) key whose unsigned order is "larger value, then smaller index": the float's bits made monotonic
// in the high word, the complemented index in the low word. -0 is folded into +0 so they tie like == does. 0 means
// "no value" (every real value's key is larger).
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
  uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

__device__ __forceinline__ unsigned long long block_max_key(unsigned long long key) {
  __shared__ unsigned long long part[kArgmaxThreads / kWarp];
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, key, off);
    key = o > key ? o : key;
  }
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  if (lane == 0) part[warp] = key;
  __syncthreads();
  if (warp == 0) {
    key = lane < kArgmaxThreads / kWarp ? part[lane] : 0ull;
#pragma unroll
    for (int off = kWarp / 2; off > 0; off >>= 1) {
      const unsigned long long o = __shfl_xor_sync(0xffffffffu, key, off);
      key = o > key ? o : key;
    }
  }
  return key;  // valid in thread 0
}

// The chained argmax's embedding table (ArgmaxChain::embed) as the kernel reads it.
struct ChainEmbed {
  const uint8_t* quants = nullptr;
  const uint8_t* scales = nullptr;
  int n = 0, k = 0;
  float* out = nullptr;
};

// D: the chained embedding table's dtype (unused without one).
template <DType D>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ x, int n, unsigned long long* partials, unsigned int* counter,
                  int32_t* out, const ArgmaxChain chain, const ChainEmbed emb) {
  pdl_wait();
  unsigned long long best = 0;
  for (int i = blockIdx.x * kArgmaxThreads + threadIdx.x; i < n; i += gridDim.x * kArgmaxThreads) {
    const float v = x[i];
    if (!isnan(v)) {
      const unsigned long long key = argmax_key(v, i);
      best = key > best ? key : best;
    }
  }
  best = block_max_key(best);
  __shared__ bool is_last;
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = best;
    __threadfence();  // publish this block's key before the counter says it is there
    is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  best = 0;
  for (int j = threadIdx.x; j < static_cast<int>(gridDim.x); j += kArgmaxThreads) {
    const unsigned long long key = __ldcg(partials + j);  // L2, never a stale L1 line
    best = key > best ? key : best;
  }
  best = block_max_key(best);
  __shared__ int32_t s_id;
  if (threadIdx.x == 0) {
    const int32_t id = best == 0 ? 0 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(best & 0xFFFFFFFFu));
    s_id = id;
    out[0] = id;
    *counter = 0;  // ready for the next launch (a CUDA graph replays this kernel without a memset)
    if (chain.token != nullptr) {  // the next step's input, with nothing from the host
      const int32_t p = *chain.pos;
      if (p >= 0 && p < chain.ring_size) chain.ring[p] = id;
      *chain.token = id;
      *chain.pos = p + 1;
      __threadfence_system();  // the ring entry reaches host memory before the kernel is seen complete
    }
  }
  if (emb.out != nullptr) {  // the next step's embedding row (a NaN row for an id outside the table, as embedding())
    __syncthreads();
    const int32_t id = s_id;
    for (int i = threadIdx.x; i < emb.k; i += kArgmaxThreads)
      emb.out[i] = id >= 0 && id < emb.n
                       ? table_value<D>(emb.quants, emb.scales, emb.n, static_cast<size_t>(id), emb.k, i)
                       : __int_as_float(0x7fc00000);
  }
}

// One block per row of x [t, n]: the row's largest value's index (argmax_kernel's keys: first on ties, NaNs skipped,
// 0 when all are NaN). Batched greedy decoding: B small reductions in one launch, no workspace.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(const float* __restrict__ x, int n, int32_t* __restrict__ out) {
  pdl_wait();
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  unsigned long long best = 0;
  for (int i = threadIdx.x; i < n; i += kArgmaxThreads) {
    const float v = xr[i];
    if (!isnan(v)) {
      const unsigned long long key = argmax_key(v, i);
      best = key > best ? key : best;
    }
  }
  best = block_max_key(best);
  if (threadIdx.x == 0)
    out[blockIdx.x] = best == 0 ? 0 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(best & 0xFFFFFFFFu));
}

// pick(std::integral_constant<DType, D>) for a table's dtype D (one of gemv_supports'; the callers check): the kernel
// instantiation for that table format.
template <typename Pick>
auto by_table_dtype(DType d, Pick pick) {
  switch (d) {
    case DType::F16:
      return pick(std::integral_constant<DType, DType::F16>{});
    case DType::BF16:
      return pick(std::integral_constant<DType, DType::BF16>{});
    case DType::Q8_0:
      return pick(std::integral_constant<DType, DType::Q8_0>{});
    case DType::Q4_0:
      return pick(std::integral_constant<DType, DType::Q4_0>{});
    case DType::Q4_1:
      return pick(std::integral_constant<DType, DType::Q4_1>{});
    case DType::IQ4_NL:
      return pick(std::integral_constant<DType, DType::IQ4_NL>{});
    case DType::Q4_K:
      return pick(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q5_K:
      return pick(std::integral_constant<DType, DType::Q5_K>{});
    case DType::Q6_K:
      return pick(std::integral_constant<DType, DType::Q6_K>{});
    case DType::IQ4_XS:
      return pick(std::integral_constant<DType, DType::IQ4_XS>{});
    case DType::Q5_0:
      return pick(std::integral_constant<DType, DType::Q5_0>{});
    case DType::Q5_1:
      return pick(std::integral_constant<DType, DType::Q5_1>{});
    case DType::Q2_K:
      return pick(std::integral_constant<DType, DType::Q2_K>{});
    case DType::Q3_K:
      return pick(std::integral_constant<DType, DType::Q3_K>{});
    case DType::TQ2_0:
      return pick(std::integral_constant<DType, DType::TQ2_0>{});
    default:
      return pick(std::integral_constant<DType, DType::F32>{});
  }
}

}  // namespace
}  // namespace detail

void argmax_rows(const float* x, int64_t t, int64_t n, int32_t* out, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(x && out, "argmax_rows: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(t > 0 && t <= 65535 && n > 0 && n < (int64_t{1} << 31),
                       "argmax_rows: " + detail::num(t) + " rows of " + detail::num(n) +
                           " are outside 1..65535 rows of 1..2^31-1");
  detail::launch("argmax_rows_kernel", detail::argmax_rows_kernel, dim3(static_cast<unsigned>(t)),
                 dim3(detail::kArgmaxThreads), 0, stream, x, static_cast<int>(n), out);
}

void embedding(const DeviceWeight& table, const int32_t* ids, float* out, int64_t t, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(gemv_supports(table.dtype) && !table.quants.empty(),
                       "embedding: the table is empty or its dtype is not supported on CUDA");
  TESSERA_CUDA_REQUIRE(ids && out, "embedding: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(t > 0 && t <= 65535, "embedding: token count " + detail::num(t) + " is outside 1..65535");
  const dim3 grid(detail::ceil_div(table.k, detail::kEmbThreads), static_cast<unsigned>(t));
  const int n = static_cast<int>(table.n), k = static_cast<int>(table.k);
  const auto* q = table.quants.as<uint8_t>();
  const auto* s = table.scales.as<uint8_t>();
  auto* kernel = detail::by_table_dtype(table.dtype, [](auto d) { return detail::embedding_kernel<d.value>; });
  detail::launch("embedding_kernel", kernel, grid, dim3(detail::kEmbThreads), 0, stream, q, s, n, k, ids, out);
}

ArgmaxWorkspace::ArgmaxWorkspace(int64_t max_n) : max_n_(max_n) {
  TESSERA_CUDA_REQUIRE(max_n > 0 && max_n < (int64_t{1} << 31),
                       "argmax: size " + detail::num(max_n) + " is outside 1..2^31-1");
  // Two blocks per SM are enough to stream a logits vector; more would only lengthen the final reduction.
  blocks_ = std::max(1, std::min(detail::ceil_div(max_n, detail::kArgmaxThreads * 4), 2 * detail::sm_count()));
  partials_ = DeviceBuffer(sizeof(unsigned long long) * blocks_);
  counter_ = DeviceBuffer(sizeof(unsigned int));
  counter_.fill_bytes(0);
}

void argmax(const float* x, int64_t n, int32_t* out, ArgmaxWorkspace& ws, cudaStream_t stream,
            const ArgmaxChain& chain) {
  TESSERA_CUDA_REQUIRE(x && out, "argmax: a pointer argument is null");
  TESSERA_CUDA_REQUIRE(chain.token == nullptr || (chain.pos && chain.ring && chain.ring_size > 0),
                       "argmax: a chained argmax needs its position and ring");
  TESSERA_CUDA_REQUIRE(n > 0 && n <= ws.max_n(), "argmax: size " + detail::num(n) + " is outside 1.." +
                                                     detail::num(ws.max_n()) + " (the workspace's size)");
  const int blocks = std::min(ws.blocks(), detail::ceil_div(n, detail::kArgmaxThreads * 4));
  detail::ChainEmbed emb;
  auto* kernel = detail::argmax_kernel<DType::F32>;
  if (chain.embed != nullptr) {
    const DeviceWeight& t = *chain.embed;
    TESSERA_CUDA_REQUIRE(chain.token && chain.embed_out && gemv_supports(t.dtype) && !t.quants.empty(),
                         "argmax: a chained embedding needs the chain, its output and a supported table");
    emb = {t.quants.as<uint8_t>(), t.scales.as<uint8_t>(), static_cast<int>(t.n), static_cast<int>(t.k),
           chain.embed_out};
    kernel = detail::by_table_dtype(t.dtype, [](auto d) { return detail::argmax_kernel<d.value>; });
  }
  detail::launch("argmax_kernel", kernel, dim3(blocks), dim3(detail::kArgmaxThreads), 0, stream, x,
                 static_cast<int>(n), ws.partials(), ws.counter(), out, chain, emb);
}

}  // namespace tessera::cuda
