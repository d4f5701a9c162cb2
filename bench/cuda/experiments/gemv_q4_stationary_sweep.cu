// The x-stationary GEMV for the 32-block formats (iq4_nl, q4_0, q4_1, q8_0; issue 21: iq4_nl decode 1.49x llama.cpp
// against the goal's 1.5x, q4_K at 68% of its byte floor). tq2_0's x-stationary kernel (kernels/gemv_tq2_kernel.cuh)
// beat the shared quantized kernel by 13% at 14336x4096 because that kernel reloads each unit's activation for every
// few rows; for a 32-block format the activation is 32 bytes per 16-18 weight bytes, so the same form may win there
// too. Written without a GPU (fifteenth session) for the next device session: it times, in one run and the same way
// as exp_gemv_tq2_sweep (graph replays over rotating copies >= 4x L2, median, the copy bandwidth first),
//   - src's GEMV for the format at its default launch shape and every other shape it compiles;
//   - the x-stationary form at (warps, blocks per lane, rows per block) that fit the shape: lane l of warp w holds
//     activation block w * bw + l (and + 32 with two per lane) for the launch, R rows per block in one step, the rows'
//     sums by tq2_rows_sum's halving shuffles, src's block_dot for the arithmetic;
// every variant first checked against a double reference on random weights (quantize_row of random floats).
// First run (H100, 2026-11-26, us, src's default against the best x-stationary variant): iq4_nl 4096x4096 5.00 / 5.12,
// 6144x4096 6.52 / 6.85, 14336x4096 14.26 / 13.83 (w4/r4/p1), 28672x4096 26.25 / 24.38 (w4/r4/p1), 4096x14336
// 13.35 / 15.02; q4_0, q4_1 and q8_0 lost at every shape. The kernel then moved to src
// (kernels/gemv_qxs_kernel.cuh, included here) and became iq4_nl's default at K = 4096, N >= 14336: at those shapes
// "src def" is src's x-stationary launch (an "xs" config in the tsv) and the shared kernel's shapes follow it.
//
// The K-quant unit form (gemv_unit_stationary below, twentieth session; q4_k, q6_k): first run (H100, 2026-11-27,
// us, src's default against the best unit variant): q4_K 4096x4096 5.03 / 4.17 (w2 r808), 6144x4096 6.27 / 6.82,
// 14336x4096 13.20 / 12.80, 28672x4096 23.62 / 23.35, 4096x14336 13.83 / 12.81 (w7 r202), 128256x4096 95.5 / 94.7;
// q6_K within 2% either way. Its wins are at o and down, the two GEMVs that carry the next RMSNorm's 8-bit input
// in a 32-row epilogue (quant_norm, +6.1% for q4_K): in blocks of 32 rows (RG row groups) it measured 4.99 (o) and
// 14.28 (down), no better than src's, and a per-group ticket was not tried. Not moved to src.
// Build here: target exp_gemv_q4_stationary_sweep. Run on the GPU machine:
//   build/bin/experiments/exp_gemv_q4_stationary_sweep [reps] [formats, e.g. iq4_nl,q4_1]
// (writes $OUT/q4_stationary.tsv when OUT is set).
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
#include <thread>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_qxs_kernel.cuh"
#include "exp_common.cuh"

namespace tessera {
// quant/quant.h's (C++20, which this CUDA file is not compiled as): whole rows of n elements in a format.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
void quantize_row(DType t, const float* src, void* dst, int64_t n);
}  // namespace tessera

namespace q4xs {
using namespace tessera;
using namespace tessera::cuda;
using namespace tessera::cuda::detail;

using Fn = void (*)(const uint8_t*, const uint8_t*, const int8_t*, const float2*, float*, int, int, bool, RmsIn);
struct Variant {
  DType d;
  int warps, r, p;
  Fn f;
};
template <DType D, int W, int R, int P>
constexpr Variant v() {
  return {D, W, R, P, gemv_q_stationary<D, W, R, P>};
}
// The x-stationary form for the 64-element unit formats (q4_K, q5_K, q6_K; quant_units.h), written in the twentieth
// session (issue 21: q4_K decode at 73% of its byte floor): lane l of warp w holds unit w * bu + l (and + 32 with
// P = 2) of x for the launch (Act::load once), and the block streams RB rows past it, R rows a step, the next step's
// loads issued before this step's arithmetic (as gemv_tq2_kernel). The shared kernel loads each unit's 64 activation
// bytes again for every ROWS rows of 32-48 weight bytes.
// RG row groups per block: warps [g WK, (g + 1) WK) take rows [g RB / RG, (g + 1) RB / RG) of the block's RB, so a
// block of 32 rows (the norm_out epilogue's group) can still hold enough warps and loads in flight.
template <DType D, int WK, int RG, int R, int RB, int P>
__global__ void __launch_bounds__(WK * RG * 32)
    gemv_unit_stationary(const uint8_t* __restrict__ quants, const uint8_t* __restrict__ scales,
                         const int8_t* __restrict__ xq, const float2* __restrict__ xds, float* __restrict__ y, int n,
                         int k, bool accumulate, RmsIn rin) {
  using Q = QuantFmt<D>;
  using Scale = typename Q::Scale;
  constexpr int V = Q::kVecs, QB = Q::kQuantBytes, SB = Q::kScaleBytes, RPG = RB / RG, G = RPG / R;
  static_assert(RB % RG == 0 && RPG % R == 0, "whole steps");
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int kw = warp % WK, rg = warp / WK;
  const int nb = k / Q::kUnit, bu = nb / WK;
  const int row0 = static_cast<int>(blockIdx.x) * RB + rg * RPG;
  int pos[P];
  bool ok[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int l = lane + 32 * j;
    ok[j] = l < bu;
    pos[j] = kw * bu + (ok[j] ? l : 0);
  }
  auto load = [&](int g, uint4(&wv)[R][P][V], Scale(&sc)[R][P]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const size_t row = static_cast<size_t>(min(row0 + g * R + r, n - 1));
      const uint8_t* qr = quants + row * nb * QB;
      const uint8_t* sr = scales + row * nb * SB;
      const uint8_t* tr = tail_row<D>(scales, n, nb, row);
#pragma unroll
      for (int j = 0; j < P; ++j)
        if (ok[j]) Q::load(qr, sr, tr, pos[j], wv[r][j], sc[r][j]);
    }
  };
  uint4 wa[R][P][V] = {};
  Scale sa[R][P] = {};
  load(0, wa, sa);
  pdl_wait();
  typename Q::Act x[P];
#pragma unroll
  for (int j = 0; j < P; ++j) x[j] = Q::Act::load(xq, xds, pos[j]);
  const float out_scale = rms_out_scale(rin, lane, k);
  __shared__ float part[WK][RB];
#pragma unroll 1
  for (int g = 0; g < G; ++g) {
    if (row0 + g * R >= n) break;
    uint4 wb[R][P][V] = {};
    Scale sb[R][P] = {};
    if (g + 1 < G && row0 + (g + 1) * R < n) load(g + 1, wb, sb);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      acc[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < P; ++j)
        if (ok[j]) acc[r] += Q::dot(wa[r][j], sa[r][j], x[j]);
    }
    int row_of_lane;
    const float sum = tq2_rows_sum<R>(acc, lane, row_of_lane);
    if (lane % (32 / R) == 0) part[kw][rg * RPG + g * R + row_of_lane] = sum;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < P; ++j) {
        sa[r][j] = sb[r][j];
#pragma unroll
        for (int v = 0; v < V; ++v) wa[r][j][v] = wb[r][j][v];
      }
  }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  const int brow = static_cast<int>(blockIdx.x) * RB + t;
  if (t < RB && brow < n) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < WK; ++w) v += part[w][t];
    y[brow] = accumulate ? y[brow] + v * out_scale : v * out_scale;
  }
}
// Variant fields for the unit kernels: warps = WK * RG (the block), r = RG * 10000 + R * 100 + RB, p = P.
template <DType D, int WK, int R, int RB, int P, int RG = 1>
constexpr Variant u() {
  return {D, WK * RG, RG * 10000 + R * 100 + RB, P, gemv_unit_stationary<D, WK, RG, R, RB, P>};
}
// K = 4096 (64 units): 2 warps of one unit per lane or 1 of two; K = 14336 (224 units): 7 warps of one or 4 of two.
// The RB = 32 rows (RG groups) are the norm_out epilogue's candidates.
#define UFMT(D)                                                                                                   \
  u<D, 2, 4, 4, 1>(), u<D, 2, 8, 8, 1>(), u<D, 2, 4, 8, 1>(), u<D, 2, 4, 16, 1>(), u<D, 2, 2, 8, 1>(),          \
      u<D, 1, 4, 4, 2>(), u<D, 1, 2, 4, 2>(), u<D, 4, 4, 4, 1>(), u<D, 4, 4, 8, 1>(), u<D, 7, 4, 4, 1>(),       \
      u<D, 7, 8, 8, 1>(), u<D, 7, 4, 8, 1>(), u<D, 7, 2, 2, 1>(), u<D, 7, 2, 4, 1>(), u<D, 4, 4, 4, 2>(),       \
      u<D, 4, 2, 4, 2>(), u<D, 2, 4, 32, 1, 4>(), u<D, 2, 8, 32, 1, 4>(), u<D, 2, 4, 32, 1, 8>(),               \
      u<D, 2, 2, 32, 1, 8>(), u<D, 2, 4, 32, 1, 2>(), u<D, 7, 4, 32, 1, 2>(), u<D, 7, 2, 32, 1, 2>(),           \
      u<D, 7, 4, 32, 1, 4>(), u<D, 7, 2, 32, 1, 4>(), u<D, 7, 8, 32, 1>(), u<D, 7, 4, 32, 1>()
const Variant kUnitVariants[] = {UFMT(DType::Q4_K), UFMT(DType::Q6_K)};

// K = 4096 (128 blocks): 4 warps of one block per lane or 2 of two; K = 14336 (448 blocks): 14 or 7.
#define FMT(D)                                                                                          \
  v<D, 4, 2, 1>(), v<D, 4, 4, 1>(), v<D, 4, 8, 1>(), v<D, 2, 2, 2>(), v<D, 2, 4, 2>(), v<D, 2, 8, 2>(), \
      v<D, 14, 2, 1>(), v<D, 14, 4, 1>(), v<D, 14, 8, 1>(), v<D, 7, 2, 2>(), v<D, 7, 4, 2>(), v<D, 7, 8, 2>()
const Variant kVariants[] = {FMT(DType::IQ4_NL), FMT(DType::Q4_0), FMT(DType::Q4_1), FMT(DType::Q8_0)};

// fn(i0, i1) over [0, n) in contiguous chunks, one per hardware thread.
template <typename Fn2>
void parallel_rows(int n, const Fn2& fn) {
  const int nt = std::max(1, std::min(n, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::thread> ts;
  for (int t = 0; t < nt; ++t)
    ts.emplace_back([&, t] { fn(static_cast<int>(int64_t{n} * t / nt), static_cast<int>(int64_t{n} * (t + 1) / nt)); });
  for (auto& th : ts) th.join();
}

// The unit kernels' units are 64 elements: qxs_config_fits over k / 2 counts them as its 32-blocks.
bool fits(const Variant& e, int k, bool unit) {
  return unit ? k % 64 == 0 && qxs_config_fits(e.warps, e.p, k / 2) : qxs_config_fits(e.warps, e.p, k);
}

int run(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  const std::string want = argc > 2 ? argv[2] : "iq4_nl,q4_0,q4_1,q8_0";
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbps = exp_common::copy_gbps(st, e0, e1);
  std::printf("device %s, copy %.0f GB/s\n", prop.name, copy_gbps);
  const char* out = std::getenv("OUT");
  std::FILE* all = std::fopen((std::string(out ? out : "/tmp") + "/q4_stationary.tsv").c_str(), "w");
  // Llama-3-8B's q|k|v, o, gate or up, gate|up, down, and the output projection (128256 x 4096, when iq4_nl).
  const int shapes[][2] = {{4096, 4096}, {6144, 4096}, {14336, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
  const DType fmts[] = {DType::IQ4_NL, DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q6_K};
  std::mt19937 rng(4242);
  int failures = 0;
  std::vector<std::string> summary;
  for (DType d : fmts) {
    const std::string fname(dtype_name(d));
    if (("," + want + ",").find("," + fname + ",") == std::string::npos) continue;
    const bool unit_fmt = d == DType::Q4_K || d == DType::Q6_K;
    for (const auto& sh : shapes) {
      const int n = sh[0], k = sh[1], nb = k / 32;
      // Random weights: quantize_row of uniform floats; the reference dequantizes the same blocks.
      std::vector<float> wf(static_cast<size_t>(n) * k);
      std::uniform_real_distribution<float> ud(-0.05f, 0.05f);
      for (auto& f : wf) f = ud(rng);
      const size_t row_bytes = *dtype_row_bytes(d, static_cast<uint64_t>(k));
      std::vector<uint8_t> host(row_bytes * static_cast<size_t>(n));
      // Rows in parallel (the output projection's 525M weights take minutes of iq4_nl's scale search on one core).
      parallel_rows(n, [&](int i0, int i1) {
        const size_t e0 = static_cast<size_t>(i0) * k, rows = static_cast<size_t>(i1 - i0);
        quantize_row(d, wf.data() + e0, host.data() + static_cast<size_t>(i0) * row_bytes,
                     static_cast<int64_t>(rows * k));
        dequantize_row(d, host.data() + static_cast<size_t>(i0) * row_bytes, wf.data() + e0,
                       static_cast<int64_t>(rows * k));
      });
      std::vector<int8_t> hx(static_cast<size_t>(k));
      std::vector<float2> hds(static_cast<size_t>(nb));
      std::uniform_int_distribution<int> qd(-127, 127);
      std::uniform_real_distribution<float> xd(0.001f, 0.02f);
      for (int b = 0; b < nb; ++b) {
        int s = 0;
        for (int j = 0; j < 32; ++j) s += (hx[static_cast<size_t>(b * 32 + j)] = static_cast<int8_t>(qd(rng)));
        const float dx = xd(rng);
        hds[static_cast<size_t>(b)] = make_float2(dx, dx * static_cast<float>(s));
      }
      std::vector<double> ref(static_cast<size_t>(n)), mag(static_cast<size_t>(n));
      parallel_rows(n, [&](int i0, int i1) {
        for (int i = i0; i < i1; ++i) {
          double a = 0, m = 0;
          for (int e = 0; e < k; ++e) {
            const double t = double(wf[static_cast<size_t>(i) * k + e]) * hds[static_cast<size_t>(e / 32)].x *
                             hx[static_cast<size_t>(e)];
            a += t, m += std::fabs(t);
          }
          ref[static_cast<size_t>(i)] = a, mag[static_cast<size_t>(i)] = m;
        }
      });
      const uint64_t bytes = row_bytes * static_cast<uint64_t>(n);
      const int copies = static_cast<int>(
          std::clamp<uint64_t>((4 * static_cast<uint64_t>(prop.l2CacheSize) + bytes - 1) / bytes, 1, 64));
      std::vector<DeviceWeight> w;
      for (int c = 0; c < copies; ++c) w.push_back(upload_weight(d, host.data(), n, k));
      DeviceBuffer xq(static_cast<size_t>(k)), xds(sizeof(float2) * static_cast<size_t>(nb)),
          y(sizeof(float) * static_cast<size_t>(n));
      xq.upload(hx.data(), static_cast<size_t>(k));
      xds.upload(hds.data(), sizeof(float2) * static_cast<size_t>(nb));
      GemvInput in;
      in.q8 = xq.as<int8_t>(), in.q8_ds = xds.as<float2>();
      const int batch = std::max(copies, 10);
      auto check = [&]() {
        std::vector<float> h(static_cast<size_t>(n));
        CK(cudaStreamSynchronize(st));
        y.download(h.data(), sizeof(float) * static_cast<size_t>(n));
        int bad = 0;
        for (int i = 0; i < n; ++i)
          if (!(std::fabs(h[static_cast<size_t>(i)] - ref[static_cast<size_t>(i)]) <=
                2e-5 * mag[static_cast<size_t>(i)] + 1e-6))
            ++bad;
        return bad;
      };
      auto pct = [&](float us) { return 100.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e9 / copy_gbps; };
      const GemvConfig def = gemv_default_config(d, n, k);
      float src_def = 0, src_best = 1e30f;
      std::vector<GemvConfig> cs{def};
      for (const auto& c : gemv_configs())
        if (gemv_config_supported(d, c) && (c.stationary != def.stationary || c.threads != def.threads ||
                                            c.rows != def.rows || c.unroll != def.unroll || c.prefetch != def.prefetch))
          cs.push_back(c);
      for (size_t ci = 0; ci < cs.size(); ++ci) {
        const GemvConfig c = cs[ci];
        CK(cudaMemsetAsync(y.get(), 0xFF, sizeof(float) * static_cast<size_t>(n), st));
        gemv(w[0], in, y.as<float>(), st, &c);
        const int bad = check();
        if (bad)
          ++failures, std::printf("FAIL src %s %dx%d %s%d/%d/%d: %d rows\n", fname.c_str(), n, k,
                                  c.stationary ? "xs" : "", c.threads, c.rows, c.unroll, bad);
        const float t = exp_common::graph_us(st, e0, e1, batch, reps, [&](int i) {
          gemv(w[static_cast<size_t>(i % copies)], in, y.as<float>(), st, &c);
        });
        if (all)
          std::fprintf(all, "%s\t%dx%d\tsrc\t%s%d/%d/%d%s\t%.3f\t%.1f\t%d\n", fname.c_str(), n, k,
                       c.stationary ? "xs" : "", c.threads, c.rows, c.unroll, c.prefetch ? "+pf" : "", t, pct(t), bad);
        if (ci == 0) src_def = t;
        src_best = std::min(src_best, t);
      }
      float xs_best = 1e30f;
      char xs_name[64] = "none";
      std::vector<Variant> vs(std::begin(kVariants), std::end(kVariants));
      vs.insert(vs.end(), std::begin(kUnitVariants), std::end(kUnitVariants));
      for (const Variant& e : vs) {
        if (e.d != d) continue;
        const int rb = unit_fmt ? e.r % 100 : e.r;  // rows per block (unit variants: r = RG * 10000 + R * 100 + RB)
        const int wk = unit_fmt ? e.warps / (e.r / 10000) : e.warps;
        if (!fits(Variant{e.d, wk, e.r, e.p, e.f}, k, unit_fmt)) continue;
        auto launch = [&](int copy) {
          const DeviceWeight& ww = w[static_cast<size_t>(copy)];
          exp_common::launch_pdl(e.f, dim3((n + rb - 1) / rb), dim3(32 * e.warps), 0, st, ww.quants.as<uint8_t>(),
                                 ww.scales.as<uint8_t>(), in.q8, in.q8_ds, y.as<float>(), n, k, false,
                                 RmsIn{nullptr, 0.0f});
        };
        CK(cudaMemsetAsync(y.get(), 0xFF, sizeof(float) * static_cast<size_t>(n), st));
        launch(0);
        CK(cudaGetLastError());
        const int bad = check();
        if (bad)
          ++failures,
              std::printf("FAIL xs %s %dx%d w%d r%d p%d: %d rows\n", fname.c_str(), n, k, e.warps, e.r, e.p, bad);
        const float t = exp_common::graph_us(st, e0, e1, batch, reps, [&](int i) { launch(i % copies); });
        if (all)
          std::fprintf(all, "%s\t%dx%d\txs\tw%d/r%d/p%d\t%.3f\t%.1f\t%d\n", fname.c_str(), n, k, e.warps, e.r, e.p, t,
                       pct(t), bad);
        if (t < xs_best) xs_best = t, std::snprintf(xs_name, sizeof xs_name, "w%d/r%d/p%d", e.warps, e.r, e.p);
      }
      char line[256];
      std::snprintf(
          line, sizeof line, "%-6s %5dx%-5d src def %6.2fus %5.1f%% | src best %6.2fus %5.1f%% | xs %s %6.2fus %5.1f%%",
          fname.c_str(), n, k, src_def, pct(src_def), src_best, pct(src_best), xs_name, xs_best, pct(xs_best));
      summary.push_back(line);
      std::printf("%s\n", line);
      std::fflush(stdout);
    }
  }
  return exp_common::finish_sweep(all, copy_gbps, "", failures, summary);
}

}  // namespace q4xs

int main(int argc, char** argv) { return q4xs::run(argc, argv); }
