#include "backends/cuda/ceilings.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"

namespace tessera::cuda {
namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t i, uint64_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x);
}
__device__ __forceinline__ float uniform(uint64_t i, uint64_t seed, float lo, float hi) {
  return lo + (hi - lo) * (static_cast<float>(hash32(i, seed) >> 8) * (1.0f / 16777216.0f));
}

// kind 0: bytes, 1: f32, 2: f16, 3: bf16; count in elements.
__global__ void fill_kernel(void* p, size_t count, int kind, float lo, float hi, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    switch (kind) {
      case 0: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(hash32(i, seed)); break;
      case 1: static_cast<float*>(p)[i] = uniform(i, seed, lo, hi); break;
      case 2: static_cast<__half*>(p)[i] = __float2half(uniform(i, seed, lo, hi)); break;
      default: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(uniform(i, seed, lo, hi)); break;
    }
  }
}

void fill(void* p, size_t count, int kind, float lo, float hi, uint64_t seed, cudaStream_t s) {
  fill_kernel<<<1024, 256, 0, s>>>(p, count, kind, lo, hi, seed);
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

// Sums 16-byte words so the loads cannot be dropped; one word per block to sink.
__global__ void read_kernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;  // practically never: keeps the loads alive without a write stream
}

// A weight of random content in the GEMV layout (upload_weight's layout, filled in place on the device).
DeviceWeight random_weight(DType dt, int64_t n, int64_t k, uint64_t seed, cudaStream_t s) {
  DeviceWeight w;
  w.dtype = dt;
  w.n = n;
  w.k = k;
  const size_t nk = static_cast<size_t>(n * k);
  switch (dt) {
    case DType::F32:
      w.quants = DeviceBuffer(nk * 4);
      fill(w.quants.get(), nk, 1, -1, 1, seed, s);
      break;
    case DType::F16:
    case DType::BF16:
      w.quants = DeviceBuffer(nk * 2);
      fill(w.quants.get(), nk, dt == DType::F16 ? 2 : 3, -1, 1, seed, s);
      break;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1: {
      w.layout = GemvLayout::SPLIT_Q;
      w.quants = DeviceBuffer(dt == DType::Q8_0 ? nk : nk / 2);
      fill(w.quants.get(), w.quants.bytes(), 0, 0, 0, seed, s);
      const size_t nscale = nk / 32 * (dt == DType::Q4_1 ? 2 : 1);
      w.scales = DeviceBuffer(nscale * 2);
      fill(w.scales.get(), nscale, 2, 0.001f, 0.01f, seed + 1, s);
      break;
    }
    default:
      fail("cuda ceilings: no GEMV for {}", dtype_name(dt));
  }
  return w;
}

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    TESSERA_CUDA_CHECK(cudaEventCreate(&a));
    TESSERA_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Events() {
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
  }
};

// Runs fn once to warm up, then `repeats` times with events around `inner` calls each; returns seconds per call.
template <typename F>
std::vector<double> time_calls(cudaStream_t s, int repeats, int inner, F&& fn) {
  Events ev;
  fn(0);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> out;
  for (int r = 0; r < repeats; ++r) {
    TESSERA_CUDA_CHECK(cudaEventRecord(ev.a, s));
    for (int i = 0; i < inner; ++i) fn(i);
    TESSERA_CUDA_CHECK(cudaEventRecord(ev.b, s));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(ev.b));
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a, ev.b));
    out.push_back(static_cast<double>(ms) * 1e-3 / inner);
  }
  return out;
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s); }
};

}  // namespace

CudaCeilings measure_cuda_ceilings(uint64_t buffer_bytes, int repeats, const std::vector<DType>& dtypes_in,
                                   bool bandwidth, bool gemm) {
  std::string why;
  const std::vector<DeviceInfo> devs = list_devices(&why);
  TESSERA_CHECK(!devs.empty(), "device 'cuda' is not available: {}", why.empty() ? "no CUDA device" : why);
  set_device(0);
  CudaCeilings c;
  c.gpu_name = devs[0].name;
  Stream st;
  const cudaStream_t s = st.s;
  const std::vector<DType> dtypes =
      dtypes_in.empty() ? std::vector<DType>{DType::BF16, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1} : dtypes_in;

  if (bandwidth) {
    const uint64_t bytes = std::max<uint64_t>(buffer_bytes / 256 * 256, 1 << 20);
    DeviceBuffer src(bytes), dst(bytes), sink(4096 * sizeof(uint32_t));
    fill(src.get(), bytes, 0, 0, 0, 7, s);
    fill(dst.get(), bytes, 0, 0, 0, 8, s);
    const std::vector<double> tr = time_calls(s, repeats, 3, [&](int) {
      read_kernel<<<4096, 256, 0, s>>>(src.as<uint4>(), bytes / 16, sink.as<uint32_t>());
      TESSERA_CUDA_CHECK(cudaGetLastError());
    });
    CudaCeilings::Bandwidth r{"read", bytes, {}};
    for (double t : tr) r.gbps.push_back(static_cast<double>(bytes) / t * 1e-9);
    c.bandwidth.push_back(r);
    const std::vector<double> tc = time_calls(s, repeats, 3, [&](int) {
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, s));
    });
    CudaCeilings::Bandwidth cp{"copy", 2 * bytes, {}};
    for (double t : tc) cp.gbps.push_back(2.0 * static_cast<double>(bytes) / t * 1e-9);
    c.bandwidth.push_back(cp);

    // Each format's GEMV at Llama-3-8B's FFN-up shape, over 3 weights in turn so none sits in L2 when read.
    for (DType dt : dtypes) {
      if (!gemv_supports(dt)) continue;
      const int64_t n = 14336, k = 4096;
      std::vector<DeviceWeight> ws;
      for (int i = 0; i < 3; ++i) ws.push_back(random_weight(dt, n, k, 100 + i, s));
      DeviceBuffer x(k * 4), q8(k), ds(k / 32 * 8), y(n * 4);
      fill(x.get(), k, 1, -1, 1, 3, s);
      quantize_q8(x.as<float>(), q8.as<int8_t>(), ds.as<float2>(), k, s);
      GemvInput in;
      if (ws[0].layout == GemvLayout::SPLIT_Q) {
        in.q8 = q8.as<int8_t>();
        in.q8_ds = ds.as<float2>();
      } else {
        in.f32 = x.as<float>();
      }
      const std::vector<double> tg =
          time_calls(s, repeats, 30, [&](int i) { gemv(ws[static_cast<size_t>(i % 3)], in, y.as<float>(), s); });
      CudaCeilings::Bandwidth g{std::string("gemv ") + std::string(dtype_name(dt)) + " 14336x4096", ws[0].bytes(), {}};
      for (double t : tg) g.gbps.push_back(static_cast<double>(ws[0].bytes()) / t * 1e-9);
      c.bandwidth.push_back(g);
    }
  }

  if (gemm) {
    // The arithmetic ceiling: bf16 8192^3 through the engine's matmul (cuBLASLt for float weights at large t).
    const auto measure = [&](DType dt, int64_t m, int64_t n, int64_t k, const char* kernel) {
      DeviceWeight w = random_weight(dt, n, k, 11, s);
      DeviceBuffer x(static_cast<size_t>(m * k) * 4), y(static_cast<size_t>(m * n) * 4);
      fill(x.get(), static_cast<size_t>(m * k), 1, -1, 1, 12, s);
      GemmWorkspace ws(m, k, dt == DType::Q8_0 || dt == DType::Q4_0 || dt == DType::Q4_1 ? n * k : 0);
      const std::vector<double> t =
          time_calls(s, repeats, 3, [&](int) { matmul(w, x.as<float>(), y.as<float>(), m, ws, s); });
      CudaCeilings::Gemm g{std::string(dtype_name(dt)), kernel, m, n, k, {}};
      for (double v : t) g.tflops.push_back(2.0 * static_cast<double>(m) * static_cast<double>(n) *
                                            static_cast<double>(k) / v * 1e-12);
      c.gemm.push_back(g);
    };
    measure(DType::BF16, 8192, 8192, 8192, "cublaslt");
    for (DType dt : dtypes)
      if (gemv_supports(dt)) measure(dt, 2048, 14336, 4096, "tessera");
  }
  return c;
}

}  // namespace tessera::cuda
