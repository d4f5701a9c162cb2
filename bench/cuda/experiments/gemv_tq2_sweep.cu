// tq2_0 (ternary) GEMV experiment (issue 24: >= 5.5x our bf16 GEMV at Llama-3-8B's 4096->14336 and 14336->4096,
// >= 70% of the byte floor). Times, in one run and the same way (a CUDA graph of back-to-back PDL launches over
// rotating weight copies >= 4x L2, median of the replays; the copy bandwidth measured first):
//   - src's bf16 GEMV at its default launch shape (the goal's peer);
//   - src's tq2_0 GEMV (the shared quantized kernel, gemv_quant_kernel.cuh) at its default shape and every other
//     shape it compiles;
//   - the x-stationary kernel (src/backends/cuda/kernels/gemv_tq2_kernel.cuh) at every (warps, positions per lane,
//     rows per step, rows per block) that fits the shape.
// Every variant is checked against a double reference on random codes first (poisoned output, every row).
//
// Build here (no GPU needed): target exp_gemv_tq2_sweep. Run on the GPU machine:
//   build/bin/experiments/exp_gemv_tq2_sweep [reps]        (writes $OUT/tq2_sweep.tsv when OUT is set)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_tq2_kernel.cuh"
#include "exp_common.cuh"

namespace tessera::cuda::detail {
// The streamed kernel's norm_out epilogue (gemv_quant_kernel.cuh's NormOut, same meaning).
struct Tq2NormOut {
  const float* w;  // [n] or nullptr
  int8_t* q8;
  float2* ds;
  float* sumsq;
};
// ---- The streamed form (measured slower than the x-stationary kernel at every shape: docs/PERFORMANCE.md, fifteenth
// session): persistent blocks fed by bulk copies ----
// A tq2_0 matrix is small for its row count (Llama-3-8B's 14336x4096 is 15 MB: 5 us at the copy rate), so the GEMV is
// won or lost on its first and last microsecond: every SM must have enough bytes in flight from the start and finish
// with the others. Here one block per SM owns a balanced run of consecutive rows, and its first thread streams them
// into a ring of NS shared-memory stages with 1-D bulk copies (cp.async.bulk, completing on an mbarrier per stage):
// the bytes in flight are bounded by shared memory, not by registers, and no block waits for a slot to launch. The
// warps are x-stationary as above: WPR warps per row (each Hw <= 32 half-units), NW / WPR rows at a time; per row each
// warp's sum goes to shared memory, and the block adds the WPR parts of its rows at the end. The block's d scales
// (2 bytes per 256 elements) are read into shared memory first with plain loads.
struct Tq2Stream {
  int rows_per_block;  // rows of one block (the last blocks may hold fewer; with norm_out a multiple of 32)
  int stage_rows;      // rows per stage (a multiple of rows_at_once)
  int wpr;             // warps per row: (k / 64) % wpr == 0, k / 64 / wpr <= 32
};

__device__ __forceinline__ uint32_t tq2_smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void tq2_mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nTQ2_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra TQ2_WAIT_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Rows [r, r + rows) of the quants into stage memory dst, completing on bar.
__device__ __forceinline__ void tq2_stage_copy(uint32_t dst, const uint8_t* src, uint32_t bytes, uint32_t bar) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stage's last generic reads before this write
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Dynamic shared memory of the streamed kernel: NS stages, the block's d scales, its rows' parts (and 8-byte
// mbarriers in front).
inline size_t tq2_stream_smem(int ns, const Tq2Stream& s, int64_t k) {
  const size_t stage = static_cast<size_t>(s.stage_rows) * static_cast<size_t>(k / 4);
  const size_t d = (static_cast<size_t>(s.rows_per_block) * static_cast<size_t>(k / 128) + 15) / 16 * 16;
  return 64 + static_cast<size_t>(ns) * stage + d + static_cast<size_t>(s.rows_per_block) * s.wpr * 4;
}

template <int NW, int NS, bool NORM_OUT = false>
__global__ void __launch_bounds__(NW * 32, 1)
    gemv_tq2_stream_kernel(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ dscale,
                           const int8_t* __restrict__ xq, const float2* __restrict__ xds, float* __restrict__ y, int n,
                           int k, bool accumulate, RmsIn rin, Tq2NormOut no, Tq2Stream st) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);  // NS <= 8
  const size_t row_q = static_cast<size_t>(k) / 4, row_d = static_cast<size_t>(k) / 128;
  const int r0 = static_cast<int>(blockIdx.x) * st.rows_per_block;
  const int rows = max(0, min(st.rows_per_block, n - r0));
  const size_t stage_bytes = static_cast<size_t>(st.stage_rows) * row_q;
  uint8_t* stages = smem + 64;
  uint16_t* dsm = reinterpret_cast<uint16_t*>(stages + NS * stage_bytes);
  float* part = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(dsm) +
                                         (static_cast<size_t>(st.rows_per_block) * row_d + 15) / 16 * 16);
  const int n_stages = (rows + st.stage_rows - 1) / st.stage_rows;
  const uint8_t* qblock = quants + static_cast<size_t>(r0) * row_q;
  if (threadIdx.x == 0) {
    for (int s = 0; s < NS; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(tq2_smem_u32(&bars[s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    // Weights never depend on an earlier kernel: the first stages stream before pdl_wait.
    for (int i = 0; i < NS && i < n_stages; ++i) {
      const int sr = min(st.stage_rows, rows - i * st.stage_rows);
      tq2_stage_copy(tq2_smem_u32(stages + i * stage_bytes), qblock + static_cast<size_t>(i) * stage_bytes,
                     static_cast<uint32_t>(sr * row_q), tq2_smem_u32(&bars[i]));
    }
  }
  {  // the block's d scales (fp16 bits), plain loads
    const uint16_t* dsrc = reinterpret_cast<const uint16_t*>(dscale + static_cast<size_t>(r0) * row_d);
    const int nd = rows * static_cast<int>(row_d / 2);
    for (int i = static_cast<int>(threadIdx.x); i < nd; i += NW * 32) dsm[i] = unit::ld_u16(dsrc + i);
  }
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int hw = k / 64 / st.wpr;
  const int at_once = NW / st.wpr;  // rows in flight across the block's warps
  const int slot = warp / st.wpr, wr = warp % st.wpr;
  const bool active = slot < at_once && lane < hw;
  const int pos = wr * hw + (lane < hw ? lane : 0);
  pdl_wait();
  Tq2HalfX x{};
  if (active) tq2_load_x(xq, xds, pos, x);
  float out_scale = 1.0f;
  if (rin.sumsq != nullptr) {
    float ss = 0.0f;
    for (int i = lane; i < k / 32; i += 32) ss += rin.sumsq[i];
    out_scale = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(k) + rin.eps);
  }
  __syncthreads();  // barriers initialized, d scales in shared memory
  for (int i = 0; i < n_stages; ++i) {
    const int s = i % NS;
    const int sr = min(st.stage_rows, rows - i * st.stage_rows);
    tq2_mbar_wait(tq2_smem_u32(&bars[s]), static_cast<uint32_t>((i / NS) & 1));
    if (slot < at_once) {
      const uint8_t* sb = stages + s * stage_bytes;
      for (int j = slot; j < sr; j += at_once) {
        const int lr = i * st.stage_rows + j;  // the block's row
        float v = 0.0f;
        if (active) {
          const uint4 w = *reinterpret_cast<const uint4*>(sb + static_cast<size_t>(j) * row_q +
                                                          static_cast<size_t>(pos) * 16);
          const float d = __half2float(__ushort_as_half(dsm[static_cast<size_t>(lr) * (row_d / 2) + (pos >> 2)]));
          v = d * tq2_half_dot<false>(w, x);
        }
        v = warp_sum(v);
        if (lane == 0) part[lr * st.wpr + wr] = v;
      }
    }
    __syncthreads();  // stage s read by every warp
    if (threadIdx.x == 0 && i + NS < n_stages) {
      const int ni = i + NS;
      const int nr = min(st.stage_rows, rows - ni * st.stage_rows);
      tq2_stage_copy(tq2_smem_u32(stages + s * stage_bytes), qblock + static_cast<size_t>(ni) * stage_bytes,
                     static_cast<uint32_t>(nr * row_q), tq2_smem_u32(&bars[s]));
    }
  }
  if constexpr (NORM_OUT) {  // rows_per_block a multiple of 32 and n % 32 == 0: warp g quantizes group g
    for (int g = warp; g * 32 < rows; g += NW) {
      const int lr = g * 32 + lane, row = r0 + lr;
      float v = 0.0f;
      for (int q = 0; q < st.wpr; ++q) v += part[lr * st.wpr + q];
      v = accumulate ? y[row] + v * out_scale : v * out_scale;
      y[row] = v;
      const int gi = row / 32;
      no.q8[row] = quantize_lane_q8(v * __ldg(no.w + row), no.ds + gi);
      const float ss = warp_sum(v * v);
      if (lane == 0) no.sumsq[gi] = ss;
    }
  } else {
    for (int lr = static_cast<int>(threadIdx.x); lr < rows; lr += NW * 32) {
      float v = 0.0f;
      for (int q = 0; q < st.wpr; ++q) v += part[lr * st.wpr + q];
      const int row = r0 + lr;
      y[row] = accumulate ? y[row] + v * out_scale : v * out_scale;
    }
  }
}

// The streamed kernel's plan for an n x k matrix on `sms` multiprocessors: warps per row, rows per block (balanced,
// a multiple of 32 with norm_out), stage rows for about `stage_target` bytes per stage. wpr = 0 when k has no even
// split of at most 32 half-units per warp within nw warps (the caller then takes the other kernel).
inline Tq2Stream tq2_stream_plan(int64_t n, int64_t k, int sms, int nw, int stage_target, bool norm_out) {
  Tq2Stream s{0, 0, 0};
  if (k % 256 != 0) return s;
  const int64_t h = k / 64;
  for (int w = static_cast<int>((h + 31) / 32); w <= nw; ++w)
    if (h % w == 0) {
      s.wpr = w;
      break;
    }
  if (s.wpr == 0) return s;
  const int at_once = nw / s.wpr;
  const int64_t gran = norm_out ? 32 : 1;
  const int64_t units = (n + gran - 1) / gran;
  s.rows_per_block = static_cast<int>((units + sms - 1) / sms * gran);
  const int64_t row_q = k / 4;
  int sr = static_cast<int>(std::max<int64_t>(1, stage_target / row_q));
  sr = std::max(at_once, sr / at_once * at_once);
  s.stage_rows = std::min(sr, (s.rows_per_block + at_once - 1) / at_once * at_once);
  return s;
}

}  // namespace tessera::cuda::detail

namespace tq2sweep {
using namespace tessera;
using namespace tessera::cuda;
using namespace tessera::cuda::detail;

using KernelFn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, const float2*, float*, int, int, bool, RmsIn);
struct Variant {
  int warps, r, rb, p, minb;
  bool l2;
  int mode;
  KernelFn f;
};
template <int W, int R, int RB, int P, int MINB = 1, bool L2 = false, int MODE = 0>
constexpr Variant v() {
  static_assert(!L2, "the 256-byte L2 sector variant measured no different and left the kernel");
  return {W, R, RB, P, MINB, L2, MODE, gemv_tq2_kernel<W, R, RB, P, MINB, MODE>};
}
#define RBS(W, R, P) v<W, R, 8, P>(), v<W, R, 16, P>(), v<W, R, 32, P>()
#define RBS4(W, R, P) v<W, R, 4, P>(), RBS(W, R, P)
#define P1(W) RBS4(W, 1, 1), RBS4(W, 2, 1), RBS4(W, 4, 1), RBS(W, 8, 1)
#define P2(W) RBS4(W, 1, 2), RBS4(W, 2, 2), RBS4(W, 4, 2)
#define P4(W) RBS4(W, 1, 4), RBS4(W, 2, 4)
// One step per block (RB == R) with the registers capped so that the grid is one wave at the 8B shapes (MINB), and
// the same with 256-byte L2 sectors (the rows' runs are 1-3.5 KB).
#define ONE_WAVE(L2)                                                                                                  \
  v<2, 4, 4, 1, 1, L2>(), v<2, 8, 8, 1, 14, L2>(), v<2, 16, 16, 1, 7, L2>(), v<2, 32, 32, 1, 4, L2>(),               \
      v<7, 4, 4, 1, 1, L2>(), v<7, 8, 8, 1, 4, L2>(), v<7, 16, 16, 1, 2, L2>(), v<4, 8, 8, 2, 3, L2>(), v<4, 16, 16, 2, 2, L2>(),            \
      v<1, 8, 8, 2, 8, L2>(), v<1, 16, 16, 2, 4, L2>(), v<2, 8, 8, 2, 6, L2>(), v<4, 8, 8, 1, 6, L2>(),                \
      v<4, 16, 16, 1, 3, L2>()
// The arithmetic: masked codes with dp4a.u32.s32 (mode 1) and none at all (mode 2, the memory-only bound; its sums
// are wrong by design and it is not checked).
#define MODES(M)                                                                                              \
  v<2, 2, 2, 1, 1, false, M>(), v<2, 4, 4, 1, 1, false, M>(), v<2, 8, 8, 1, 1, false, M>(),                   \
      v<7, 2, 2, 1, 1, false, M>(), v<7, 4, 4, 1, 1, false, M>(), v<7, 8, 8, 1, 1, false, M>(),               \
      v<4, 4, 4, 1, 1, false, M>(), v<4, 4, 4, 2, 1, false, M>(), v<1, 4, 4, 2, 1, false, M>(),               \
      v<2, 16, 16, 1, 7, false, M>(), v<4, 16, 16, 1, 3, false, M>()
const Variant kVariants[] = {P1(2), P1(4), P1(7), P2(1), P2(2), P4(1), ONE_WAVE(false), MODES(1), MODES(2)};

// The streamed kernel: warps per block, stages; the stage size and blocks per SM are run-time.
using StreamFn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, const float2*, float*, int, int, bool, RmsIn,
                          Tq2NormOut, Tq2Stream);
struct StreamVariant {
  int nw, ns;
  StreamFn f;
};
template <int NW, int NS>
constexpr StreamVariant sv() {
  return {NW, NS, gemv_tq2_stream_kernel<NW, NS, false>};
}
const StreamVariant kStream[] = {sv<8, 2>(), sv<8, 3>(), sv<8, 4>(), sv<8, 6>(), sv<16, 2>(), sv<16, 3>(),
                                 sv<16, 4>(), sv<16, 6>(), sv<32, 3>(), sv<32, 4>()};
const int kStageTargets[] = {8192, 16384, 32768};

struct Problem {
  int n, k, copies;
  std::vector<DeviceWeight> w;
  int8_t* xq;
  float2* xds;
  float* xf;
  float* y;
  std::vector<double> ref, mag;
  uint64_t bytes;
};

void launch_new(const Problem& p, const Variant& e, int copy, cudaStream_t st) {
  const DeviceWeight& w = p.w[static_cast<size_t>(copy)];
  exp_common::launch_pdl(e.f, dim3((p.n + e.rb - 1) / e.rb), dim3(32 * e.warps), 0, st, w.quants.as<uint8_t>(),
                         w.scales.as<uint8_t>(), p.xq, p.xds, p.y, p.n, p.k, false, RmsIn{nullptr, 0.0f});
}

void launch_stream(const Problem& p, const StreamVariant& e, const Tq2Stream& plan, size_t smem, int copy,
                   cudaStream_t st) {
  const DeviceWeight& w = p.w[static_cast<size_t>(copy)];
  exp_common::launch_pdl(e.f, dim3((p.n + plan.rows_per_block - 1) / plan.rows_per_block), dim3(32 * e.nw), smem, st,
                         w.quants.as<uint8_t>(), w.scales.as<uint8_t>(), p.xq, p.xds, p.y, p.n, p.k, false,
                         RmsIn{nullptr, 0.0f}, Tq2NormOut{}, plan);
}

int check(const Problem& p, cudaStream_t st) {
  std::vector<float> y(static_cast<size_t>(p.n));
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(y.data(), p.y, sizeof(float) * static_cast<size_t>(p.n), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < p.n; ++i)
    if (!(std::fabs(y[static_cast<size_t>(i)] - p.ref[static_cast<size_t>(i)]) <=
          1e-4 * p.mag[static_cast<size_t>(i)] + 1e-6))
      ++bad;
  return bad;
}

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const double copy_gbps = exp_common::copy_gbps(st, e0, e1);
  std::printf("copy %.0f GB/s\n", copy_gbps);
  const char* out = std::getenv("OUT");
  std::FILE* all = std::fopen((std::string(out ? out : "/tmp") + "/tq2_sweep.tsv").c_str(), "w");

  const int shapes[][2] = {{14336, 4096}, {4096, 14336}, {4096, 4096}, {6144, 4096}, {28672, 4096},
                           {6912, 2560},  {2560, 6912},  {3840, 2560}, {2560, 2560}};
  std::mt19937 rng(12345);
  int failures = 0;
  std::vector<std::string> summary;
  for (const auto& sh : shapes) {
    Problem p;
    p.n = sh[0], p.k = sh[1];
    const int nb = p.k / 32, nsb = p.k / 256;
    // The file's blocks: 64 code bytes (codes 0..2), fp16 d.
    std::vector<uint8_t> host(static_cast<size_t>(p.n) * nsb * 66);
    std::uniform_int_distribution<int> code(0, 2);
    std::uniform_real_distribution<float> dd(0.001f, 0.02f);
    for (size_t b = 0; b < host.size(); b += 66) {
      for (int i = 0; i < 64; ++i) {
        uint8_t byte = 0;
        for (int j = 0; j < 4; ++j) byte |= static_cast<uint8_t>(code(rng) << (2 * j));
        host[b + static_cast<size_t>(i)] = byte;
      }
      const __half h = __float2half(dd(rng));
      std::memcpy(&host[b + 64], &h, 2);
    }
    std::vector<int8_t> hx(static_cast<size_t>(p.k));
    std::vector<float2> hds(static_cast<size_t>(nb));
    std::vector<float> hf(static_cast<size_t>(p.k));
    std::uniform_int_distribution<int> qd(-127, 127);
    std::uniform_real_distribution<float> xd(0.001f, 0.02f), fd(-1.0f, 1.0f);
    for (int b = 0; b < nb; ++b) {
      int sum = 0;
      for (int j = 0; j < 32; ++j) sum += (hx[static_cast<size_t>(b * 32 + j)] = static_cast<int8_t>(qd(rng)));
      const float d = xd(rng);
      hds[static_cast<size_t>(b)] = make_float2(d, d * static_cast<float>(sum));
    }
    for (auto& f : hf) f = fd(rng);
    p.ref.assign(static_cast<size_t>(p.n), 0.0), p.mag.assign(static_cast<size_t>(p.n), 0.0);
    for (int i = 0; i < p.n; ++i) {
      double acc = 0, mag = 0;
      for (int sb = 0; sb < nsb; ++sb) {
        const uint8_t* blk = &host[(static_cast<size_t>(i) * nsb + sb) * 66];
        __half h;
        std::memcpy(&h, blk + 64, 2);
        const double d = __half2float(h);
        for (int e = 0; e < 256; ++e) {
          const int q = (blk[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
          const int xi = sb * 256 + e;
          const double t = d * (q - 1) * hds[static_cast<size_t>(xi / 32)].x * hx[static_cast<size_t>(xi)];
          acc += t, mag += std::fabs(t);
        }
      }
      p.ref[static_cast<size_t>(i)] = acc, p.mag[static_cast<size_t>(i)] = mag;
    }
    p.bytes = static_cast<uint64_t>(p.n) * nsb * 66;
    p.copies = static_cast<int>(std::clamp<uint64_t>((4 * static_cast<uint64_t>(prop.l2CacheSize) + p.bytes - 1) / p.bytes,
                                                     1, 64));
    for (int c = 0; c < p.copies; ++c) p.w.push_back(upload_weight(DType::TQ2_0, host.data(), p.n, p.k));
    CK(cudaMalloc(&p.xq, static_cast<size_t>(p.k)));
    CK(cudaMalloc(&p.xds, sizeof(float2) * static_cast<size_t>(nb)));
    CK(cudaMalloc(&p.xf, sizeof(float) * static_cast<size_t>(p.k)));
    CK(cudaMalloc(&p.y, sizeof(float) * static_cast<size_t>(p.n)));
    CK(cudaMemcpy(p.xq, hx.data(), static_cast<size_t>(p.k), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.xds, hds.data(), sizeof(float2) * static_cast<size_t>(nb), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.xf, hf.data(), sizeof(float) * static_cast<size_t>(p.k), cudaMemcpyHostToDevice));
    GemvInput in;
    in.f32 = p.xf, in.q8 = p.xq, in.q8_ds = p.xds;
    auto pct = [&](double bytes, float us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbps; };

    // bf16 (the goal's peer), its own rotation.
    float bf_us;
    {
      const uint64_t bbytes = static_cast<uint64_t>(p.n) * static_cast<uint64_t>(p.k) * 2;
      const int bc = static_cast<int>(
          std::clamp<uint64_t>((4 * static_cast<uint64_t>(prop.l2CacheSize) + bbytes - 1) / bbytes, 1, 64));
      std::vector<DeviceWeight> bw(static_cast<size_t>(bc));
      std::vector<uint16_t> hb(static_cast<size_t>(p.n) * static_cast<size_t>(p.k));
      for (auto& b : hb) b = static_cast<uint16_t>(0x3c00u + (rng() & 0x3ffu));  // bf16 bits of ~1.0-1.9 (values irrelevant)
      for (auto& w : bw) {
        w.dtype = DType::BF16, w.n = p.n, w.k = p.k, w.layout = GemvLayout::ROWS;
        w.quants = DeviceBuffer(bbytes);
        w.quants.upload(hb.data(), bbytes);
      }
      const GemvConfig c = gemv_default_config(DType::BF16, p.n, p.k);
      bf_us = exp_common::graph_us(st, e0, e1, std::max(bc, 10), reps,
                         [&](int i) { gemv(bw[static_cast<size_t>(i % bc)], in, p.y, st, &c); });
    }
    const int batch = std::max(p.copies, 10);
    // src's tq2_0 kernel: default first, then every other shape it compiles.
    const GemvConfig def = gemv_default_config(DType::TQ2_0, p.n, p.k);
    float src_def_us = 0, src_best_us = 1e30f;
    GemvConfig src_best{};
    std::vector<GemvConfig> cs{def};
    for (const auto& c : gemv_configs())
      if (gemv_config_supported(DType::TQ2_0, c) &&
          (c.threads != def.threads || c.rows != def.rows || c.unroll != def.unroll || c.prefetch != def.prefetch))
        cs.push_back(c);
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const GemvConfig c = cs[ci];
      CK(cudaMemsetAsync(p.y, 0xFF, sizeof(float) * static_cast<size_t>(p.n), st));
      gemv(p.w[0], in, p.y, st, &c);
      const int bad = check(p, st);
      if (bad) ++failures, std::printf("FAIL src %dx%d %d/%d/%d: %d rows\n", p.n, p.k, c.threads, c.rows, c.unroll, bad);
      const float t = exp_common::graph_us(st, e0, e1, batch, reps,
                                 [&](int i) { gemv(p.w[static_cast<size_t>(i % p.copies)], in, p.y, st, &c); });
      if (all)
        std::fprintf(all, "%dx%d\tsrc\t%d/%d/%d%s\t%.3f\t%.1f\t%.2f\t%d\n", p.n, p.k, c.threads, c.rows, c.unroll,
                     c.prefetch ? "+pf" : "", t, pct(p.bytes, t), bf_us / t, bad);
      if (ci == 0) src_def_us = t;
      if (t < src_best_us) src_best_us = t, src_best = c;
    }
    // The x-stationary kernel.
    float new_best_us = 1e30f;
    Variant new_best{};
    for (const Variant& e : kVariants) {
      if (!tq2_config_fits(e.warps, e.p, p.k)) continue;
      CK(cudaMemsetAsync(p.y, 0xFF, sizeof(float) * static_cast<size_t>(p.n), st));
      launch_new(p, e, 0, st);
      CK(cudaGetLastError());
      const int bad = e.mode == 2 ? 0 : check(p, st);
      if (bad) ++failures, std::printf("FAIL new %dx%d w%d r%d rb%d p%d: %d rows\n", p.n, p.k, e.warps, e.r, e.rb, e.p, bad);
      const float t = exp_common::graph_us(st, e0, e1, batch, reps, [&](int i) { launch_new(p, e, i % p.copies, st); });
      if (all)
        std::fprintf(all, "%dx%d\tnew\tw%d/r%d/rb%d/p%d/m%d%s/c%d\t%.3f\t%.1f\t%.2f\t%d\n", p.n, p.k, e.warps, e.r,
                     e.rb, e.p, e.minb, e.l2 ? "/l2" : "", e.mode, t,
                     pct(p.bytes, t), bf_us / t, bad);
      if (e.mode != 2 && t < new_best_us) new_best_us = t, new_best = e;
    }
    // The streamed kernel.
    float stream_best_us = 1e30f;
    char stream_best[96] = "none";
    for (const StreamVariant& e : kStream)
      for (int target : kStageTargets)
        for (int bps = 1; bps <= 2; ++bps) {
          const Tq2Stream plan = tq2_stream_plan(p.n, p.k, bps * prop.multiProcessorCount, e.nw, target, false);
          if (plan.wpr == 0) continue;
          const size_t smem = tq2_stream_smem(e.ns, plan, p.k);
          if (smem > static_cast<size_t>(prop.sharedMemPerBlockOptin) / static_cast<size_t>(bps) - 1024) continue;
          CK(cudaFuncSetAttribute(e.f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
          CK(cudaMemsetAsync(p.y, 0xFF, sizeof(float) * static_cast<size_t>(p.n), st));
          launch_stream(p, e, plan, smem, 0, st);
          CK(cudaGetLastError());
          const int bad = check(p, st);
          if (bad)
            ++failures, std::printf("FAIL stream %dx%d nw%d ns%d stage%d bps%d: %d rows\n", p.n, p.k, e.nw, e.ns,
                                    plan.stage_rows, bps, bad);
          const float t =
              exp_common::graph_us(st, e0, e1, batch, reps, [&](int i) { launch_stream(p, e, plan, smem, i % p.copies, st); });
          char name[96];
          std::snprintf(name, sizeof name, "nw%d/ns%d/sr%d/bps%d", e.nw, e.ns, plan.stage_rows, bps);
          if (all)
            std::fprintf(all, "%dx%d\tstream\t%s\t%.3f\t%.1f\t%.2f\t%d\n", p.n, p.k, name, t, pct(p.bytes, t),
                         bf_us / t, bad);
          if (t < stream_best_us) stream_best_us = t, std::snprintf(stream_best, sizeof stream_best, "%s", name);
        }
    char line[768];
    std::snprintf(line, sizeof line,
                  "%5dx%-5d bf16 %6.2fus | src def %d/%d/%d %6.2fus %5.1f%% %4.2fx | src best %d/%d/%d %6.2fus %4.2fx | "
                  "new best w%d/r%d/rb%d/p%d/m%d%s/c%d %6.2fus %5.1f%% %4.2fx | stream best %s %6.2fus %5.1f%% %4.2fx",
                  p.n, p.k, bf_us, def.threads, def.rows, def.unroll, src_def_us, pct(p.bytes, src_def_us),
                  bf_us / src_def_us, src_best.threads, src_best.rows, src_best.unroll, src_best_us,
                  bf_us / src_best_us, new_best.warps, new_best.r, new_best.rb, new_best.p, new_best.minb, new_best.l2 ? "/l2" : "", new_best.mode, new_best_us,
                  pct(p.bytes, new_best_us), bf_us / new_best_us, stream_best, stream_best_us,
                  pct(p.bytes, stream_best_us), bf_us / stream_best_us);
    summary.push_back(line);
    std::printf("%s\n", line);
    std::fflush(stdout);
    p.w.clear();
    CK(cudaFree(p.xq));
    CK(cudaFree(p.xds));
    CK(cudaFree(p.xf));
    CK(cudaFree(p.y));
  }
  return exp_common::finish_sweep(all, copy_gbps, "", failures, summary);
}

}  // namespace tq2sweep

int main(int argc, char** argv) { return tq2sweep::run(argc, argv); }
