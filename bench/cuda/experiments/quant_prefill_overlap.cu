// Quantized prefill with the dequantization overlapped (issue 21: "per-tile dequantization ... for prefill"; issue 24's
// ternary prefill). src's prefill of a quantized matrix dequantizes all of it to bf16 in scratch, then runs one bf16
// cuBLASLt GEMM (gemm.cpp): the expansion (a memory-bound pass writing N*K*2 bytes) and the GEMM (compute-bound at
// T = 512) run one after the other. Here the matrix is cut into S slices of rows: slice i is dequantized on a second
// stream into one of two buffers while the GEMM of slice i - 1 runs, each GEMM writing its rows of y (ld N). Forms,
// per Llama-3-8B matrix in q4_K and tq2_0 at T = 512 (x already bf16, as src's producers write it):
//   src     : matmul_x16 (the whole matrix dequantized, then one GEMM);
//   seqS    : S slices, dequantize then GEMM, one stream (what slicing alone costs);
//   ovlS    : S slices, the dequantization on a second stream one slice ahead (S = 2, 4, 8);
//   gemm    : the bf16 GEMM alone on a pre-dequantized matrix (the floor for any form that expands).
// Checked: every form against src (relative L2 < 1e-5: the same bf16 products; cuBLASLt may pick another algorithm
// per slice shape).
//
// STATUS (twenty-first session, its only run, H100): the check FAILED: every comparison against src gave a relative
// L2 of 0.84-0.86 (q4_K) and 1.2 (tq2_0), and the check does not say which form differs (it keeps the worst). The
// timings are therefore not a result yet, though they time the same work whatever the values: src 541.8 us for one
// 8B q4_K layer, every sliced or overlapped form slower (ovl2 +8% to +34% per matrix, ovl8 up to 2.8x), the GEMMs
// alone 344.9. Next: check each form on its own (gemm_only against src first) and find the layout error.
//
// Build here (no GPU needed): target exp_quant_prefill_overlap. Run on the GPU machine:
// build-gpu/bin/experiments/exp_quant_prefill_overlap [reps, default 30]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "exp_common.cuh"

using namespace tessera;
using namespace tessera::cuda;
using exp_common::time_us;

namespace {

constexpr int64_t kT = 512;
constexpr size_t kWsBytes = size_t{32} << 20;

// One bf16 GEMM D[rows, T] (ld ldc) = A[K, rows]ᵀ · B[K, T], f32 D: a slice of W's rows against all of x.
struct Gemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

Gemm make_gemm(cublasLtHandle_t lt, int64_t rows, int64_t t, int64_t k, int64_t ldc) {
  Gemm g;
  LT(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LT(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(rows), k));
  LT(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(t), k));
  LT(cublasLtMatrixLayoutCreate(&g.c, CUDA_R_32F, static_cast<uint64_t>(rows), static_cast<uint64_t>(t), ldc));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWsBytes;
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t res[1];
  int found = 0;
  LT(cublasLtMatmulAlgoGetHeuristic(lt, g.op, g.a, g.b, g.c, g.c, pref, 1, res, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found < 1) {
    std::fprintf(stderr, "no cuBLASLt algorithm for %lld rows\n", static_cast<long long>(rows));
    std::exit(1);
  }
  g.algo = res[0].algo;
  return g;
}

// Rows [r0, r0 + rows) of a SPLIT_Q weight whose rows are contiguous in both arrays (q4_K, tq2_0), as a view.
DeviceWeight slice_of(const DeviceWeight& w, int64_t r0, int64_t rows) {
  const size_t qrow = w.quants.bytes() / static_cast<size_t>(w.n), srow = w.scales.bytes() / static_cast<size_t>(w.n);
  DeviceWeight s;
  s.dtype = w.dtype;
  s.n = rows;
  s.k = w.k;
  s.layout = w.layout;
  s.quants = DeviceBuffer::view(w.quants.as<uint8_t>() + r0 * qrow, qrow * rows);
  s.scales = DeviceBuffer::view(w.scales.as<uint8_t>() + r0 * srow, srow * rows);
  return s;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"q|k|v", 6144, 4096}, {"o", 4096, 4096}, {"gate|up", 28672, 4096}, {"down", 4096, 14336}};
  const DType types[] = {DType::Q4_K, DType::TQ2_0};
  cudaStream_t st, s2;
  CK(cudaStreamCreate(&st));
  CK(cudaStreamCreate(&s2));
  cublasLtHandle_t lt;
  LT(cublasLtCreate(&lt));
  DeviceBuffer lt_ws(kWsBytes);
  GemmWorkspace gws(kT, 14336, 28672 * 4096);
  std::mt19937 rng(11);
  std::printf("T = %lld, x bf16, median of %d runs (us)\n", static_cast<long long>(kT), reps);
  std::printf("%-8s %-8s %8s %8s %8s %8s %8s %8s %8s  %s\n", "type", "matrix", "src", "seq4", "ovl2", "ovl4", "ovl8",
              "gemm", "best", "check (rel L2 vs src)");
  double tot_src[2] = {0, 0}, tot_best[2] = {0, 0}, tot_gemm[2] = {0, 0};
  for (int ti = 0; ti < 2; ++ti) {
    const DType dt = types[ti];
    for (const Shape& sh : shapes) {
      const int64_t n = sh.n, k = sh.k;
      // Random blocks in the file layout: q4_K {d, dmin (f16), scales[12], qs[128]} (any bytes are a valid block;
      // d and dmin set to small f16 values), tq2_0 {qs[64] of codes 0..2, d (f16)}. Speed does not depend on values.
      const int64_t nb = k / 256, bb = dt == DType::Q4_K ? 144 : 66;
      std::vector<uint8_t> q(static_cast<size_t>(n * nb * bb));
      std::uniform_int_distribution<int> byte(0, 255), code(0, 2);
      const uint16_t d16 = 0x2000, dmin16 = 0x1C00;  // 2^-7 and 2^-8 as f16
      for (int64_t b = 0; b < n * nb; ++b) {
        uint8_t* blk = q.data() + b * bb;
        if (dt == DType::Q4_K) {
          std::memcpy(blk, &d16, 2);
          std::memcpy(blk + 2, &dmin16, 2);
          for (int i = 4; i < 144; ++i) blk[i] = static_cast<uint8_t>(byte(rng));
        } else {
          for (int i = 0; i < 64; ++i)
            blk[i] = static_cast<uint8_t>(code(rng) | code(rng) << 2 | code(rng) << 4 | code(rng) << 6);
          std::memcpy(blk + 64, &d16, 2);
        }
      }
      const DeviceWeight w = upload_weight(dt, q.data(), n, k);
      std::vector<__nv_bfloat16> hx(static_cast<size_t>(kT * k));
      std::normal_distribution<float> xd(0.0f, 1.0f);
      for (auto& v : hx) v = __float2bfloat16(xd(rng));
      DeviceBuffer x16(hx.size() * 2), y(static_cast<size_t>(kT * n) * 4), y2(static_cast<size_t>(kT * n) * 4),
          full(static_cast<size_t>(n * k) * 2);
      x16.upload(hx.data(), x16.bytes());
      detail::launch_dequant_bf16(w, full.get(), st);
      const float one = 1.0f, zero = 0.0f;
      const Gemm whole = make_gemm(lt, n, kT, k, n);
      const auto gemm_only = [&] {
        LT(cublasLtMatmul(lt, whole.op, &one, full.get(), whole.a, x16.get(), whole.b, &zero, y2.get(), whole.c,
                          y2.get(), whole.c, &whole.algo, lt_ws.get(), kWsBytes, st));
      };
      const auto src = [&] { matmul_x16(w, x16.get(), y.as<float>(), kT, gws, st); };
      // Slices: S of n / S rows (n is a multiple of 8 * S for every shape here).
      struct Sliced {
        int s = 0;
        int64_t rows = 0;
        Gemm g;
        std::vector<DeviceWeight> w;
        DeviceBuffer buf[2];
        std::vector<cudaEvent_t> deq_done, gemm_done;
      };
      std::vector<Sliced> sl;
      for (int s : {2, 4, 8}) {
        Sliced z;
        z.s = s;
        z.rows = n / s;
        z.g = make_gemm(lt, z.rows, kT, k, n);
        for (int i = 0; i < s; ++i) z.w.push_back(slice_of(w, i * z.rows, z.rows));
        for (auto& b : z.buf) b = DeviceBuffer(static_cast<size_t>(z.rows * k) * 2);
        z.deq_done.resize(static_cast<size_t>(s));
        z.gemm_done.resize(static_cast<size_t>(s));
        for (auto& e : z.deq_done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        for (auto& e : z.gemm_done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        sl.push_back(std::move(z));
      }
      cudaEvent_t fork, join;
      CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
      CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
      const auto gemm_slice = [&](Sliced& z, int i, cudaStream_t s) {
        LT(cublasLtMatmul(lt, z.g.op, &one, z.buf[i % 2].get(), z.g.a, x16.get(), z.g.b, &zero,
                          y2.as<float>() + i * z.rows, z.g.c, y2.as<float>() + i * z.rows, z.g.c, &z.g.algo,
                          lt_ws.get(), kWsBytes, s));
      };
      const auto seq = [&](Sliced& z) {
        for (int i = 0; i < z.s; ++i) {
          detail::launch_dequant_bf16(z.w[static_cast<size_t>(i)], z.buf[i % 2].get(), st);
          gemm_slice(z, i, st);
        }
      };
      // Dequantization on s2 one slice ahead; the GEMMs on st; buffer i % 2 is free once GEMM i - 2 is done.
      const auto ovl = [&](Sliced& z) {
        CK(cudaEventRecord(fork, st));
        CK(cudaStreamWaitEvent(s2, fork));
        for (int i = 0; i < z.s; ++i) {
          if (i >= 2) CK(cudaStreamWaitEvent(s2, z.gemm_done[static_cast<size_t>(i - 2)]));
          detail::launch_dequant_bf16(z.w[static_cast<size_t>(i)], z.buf[i % 2].get(), s2);
          CK(cudaEventRecord(z.deq_done[static_cast<size_t>(i)], s2));
        }
        for (int i = 0; i < z.s; ++i) {
          CK(cudaStreamWaitEvent(st, z.deq_done[static_cast<size_t>(i)]));
          gemm_slice(z, i, st);
          CK(cudaEventRecord(z.gemm_done[static_cast<size_t>(i)], st));
        }
        CK(cudaEventRecord(join, s2));
        CK(cudaStreamWaitEvent(st, join));
      };
      // Checks.
      std::vector<float> ref(static_cast<size_t>(kT * n)), got(ref.size());
      src();
      CK(cudaStreamSynchronize(st));
      y.download(ref.data(), y.bytes());
      double worst = 0;
      const auto check = [&] {
        CK(cudaStreamSynchronize(st));
        y2.download(got.data(), y2.bytes());
        worst = std::max(worst, rel_l2(got, ref));
      };
      seq(sl[1]);
      check();
      for (Sliced& z : sl) {
        ovl(z);
        check();
      }
      gemm_only();
      check();
      const float t_src = time_us(src, reps, st), t_seq = time_us([&] { seq(sl[1]); }, reps, st);
      float t_ovl[3];
      for (int i = 0; i < 3; ++i) t_ovl[i] = time_us([&] { ovl(sl[static_cast<size_t>(i)]); }, reps, st);
      const float t_gemm = time_us(gemm_only, reps, st);
      const float best = std::min({t_src, t_ovl[0], t_ovl[1], t_ovl[2]});
      std::printf("%-8s %-8s %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %7.2fx  %.1e %s\n", dt == DType::Q4_K ? "q4_K" : "tq2_0", sh.name, t_src,
                  t_seq, t_ovl[0], t_ovl[1], t_ovl[2], t_gemm, t_src / best, worst, worst < 1e-5 ? "ok" : "FAIL");
      tot_src[ti] += t_src;
      tot_best[ti] += best;
      tot_gemm[ti] += t_gemm;
      for (Sliced& z : sl) {
        for (auto e : z.deq_done) cudaEventDestroy(e);
        for (auto e : z.gemm_done) cudaEventDestroy(e);
      }
      cudaEventDestroy(fork);
      cudaEventDestroy(join);
    }
  }
  for (int ti = 0; ti < 2; ++ti)
    std::printf("%s, one 8B layer: src %.1f us, best overlapped form per matrix %.1f (%.2fx), GEMMs alone %.1f\n",
                types[ti] == DType::Q4_K ? "q4_K" : "tq2_0", tot_src[ti], tot_best[ti], tot_src[ti] / tot_best[ti], tot_gemm[ti]);
  cublasLtDestroy(lt);
  return 0;
}
