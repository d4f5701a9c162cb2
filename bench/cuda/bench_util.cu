#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "bench_util.h"

namespace tessera::cuda::bench {
namespace {

__device__ __forceinline__ uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(int kind, void* p, size_t count, float lo, float hi, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = splitmix(seed ^ (i * 0x2545F4914F6CDD1Dull));
    const float u = lo + (hi - lo) * static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    switch (kind) {
      case 0:
        static_cast<float*>(p)[i] = u;
        break;
      case 1:
        static_cast<__half*>(p)[i] = __float2half_rn(u);
        break;
      case 2:
        static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(u);
        break;
      default:
        static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(r);
        break;
    }
  }
}

__global__ void read_kernel(const uint4* __restrict__ p, size_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  // Four independent loads in flight per thread.
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
                d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    const uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  __shared__ uint32_t s;
  if (threadIdx.x == 0) s = 0;
  __syncthreads();
  atomicXor(&s, acc);
  __syncthreads();
  if (threadIdx.x == 0) sink[blockIdx.x] = s;
}

}  // namespace

void fill_random(FillKind kind, void* p, size_t count, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  fill_kernel<<<1024, 256, 0, stream>>>(static_cast<int>(kind), p, count, lo, hi, seed);
  TESSERA_CUDA_CHECK_LAUNCH("fill_kernel");
}

int read_all(const void* p, size_t bytes, uint32_t* sink, int blocks, cudaStream_t stream) {
  read_kernel<<<blocks, 512, 0, stream>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  TESSERA_CUDA_CHECK_LAUNCH("read_kernel");
  return blocks;
}

GraphTiming time_graph_replays(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, int batch, int reps, int warmups,
                               const std::function<void(int)>& launch) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < batch; ++i) launch(i);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int w = 0; w < warmups; ++w) TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<double> per;
  for (int r = 0; r < reps; ++r) {
    TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    per.push_back(ms * 1e3 / batch);
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  std::sort(per.begin(), per.end());
  return {per[per.size() / 2], per.front(), per.back()};
}

}  // namespace tessera::cuda::bench
