// Ternary prefill on the integer tensor cores (issue 24: "CUDA: 2-bit unpack to int8 with dp4a or integer tensor
// cores ... for decode GEMV and prefill GEMM"). src's prefill of a tq2_0 matrix expands it to bf16 in scratch and runs
// the bf16 cuBLASLt GEMM on x rounded to bf16 (kernels/gemm_convert.cu, gemm.cpp): on the H100 the 8B shape prefills at
// 0.69x its bf16 model (the fifteenth session: 29,515.7 against 42,852.8 tok/s at pp512), the expansion's write and
// read of N*K*2 bytes per call being most of the difference. BitLinear's semantics make another path exact: its
// activations are int8 per token (x = q * s_t, q in [-127, 127]) and its weights ternary times a scale shared by a row's
// blocks (d_n), so y[t, n] = s_t * d_n * sum_k q[t, k] * w[n, k] with an int32 sum, which int8 tensor cores compute
// exactly. This experiment times, per Llama-3-8B and BitNet-2B4T matrix at T = 512:
//   src    : src's matmul on the f32 x (x to bf16, tq2_0 to bf16, bf16 GEMM with f32 accumulation);
//   imma   : x to int8 per row (absmax / 127, as BitLinear's quantizer), tq2_0 to int8 codes - 1 in scratch, the int8
//            cuBLASLt GEMM (CUBLAS_COMPUTE_32I, "TN", int32 D), then y = D * s_t * d_n;
//   gemm8  : the int8 GEMM alone (the weights expanded once, as a load-time int8 copy would hold them: 1 byte a weight);
//   expand : the tq2_0 -> int8 expansion alone; bf16gemm: src's bf16 GEMM alone on a pre-expanded bf16 copy.
// Checked first: imma against a double reference from the same int8 x and ternary w on sampled outputs (relative
// error < 1e-5: the int32 sum is exact, the two scale products are f32), and src against the same reference (its
// bf16 rounding of x, ~1e-3). The x here is BitLinear's output (a row's values are q * s_t), as the act_quant_i8 node
// writes it, so both forms see what a BitNet model's matmul sees.
//
// Build here (no GPU needed): target exp_ternary_imma. Run on the GPU machine: build-gpu/bin/experiments/exp_ternary_imma
// [reps, default 30]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "exp_common.cuh"

using namespace tessera;
using namespace tessera::cuda;

namespace {

constexpr int64_t kT = 512;

// x [T, K] f32 -> q [T, K] int8 and s [T]: q = round(x / s), s = absmax / 127 (one block of 256 threads a row).
__global__ void quant_rows_i8(const float* x, int64_t k, int8_t* q, float* s) {
  __shared__ float red[8];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * k;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
  m = exp_common::warp_max(m);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = 0.0f;
  for (int i = 0; i < 8; ++i) m = fmaxf(m, red[i]);
  const float scale = m / 127.0f, inv = m > 0.0f ? 127.0f / m : 0.0f;
  if (threadIdx.x == 0) s[row] = scale;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x)
    q[row * k + i] = static_cast<int8_t>(fmaxf(-127.0f, fminf(127.0f, rintf(xr[i] * inv))));
}

// tq2_0 as upload_weight lays it out (quants: 64 bytes per 256-element block, in row order) -> int8 code - 1 [N, K].
// Byte m of a block's half h holds elements 128 h + m + 32 j in bits 2j .. 2j + 1.
__global__ void expand_tq2_i8(const uint8_t* quants, int64_t n_bytes, int8_t* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_bytes) return;
  const int64_t blk = i / 64;
  const int b = static_cast<int>(i % 64), h = b / 32, m = b % 32;
  const uint32_t v = quants[i];
  int8_t* o = out + blk * 256 + 128 * h + m;
#pragma unroll
  for (int j = 0; j < 4; ++j) o[32 * j] = static_cast<int8_t>(static_cast<int>((v >> (2 * j)) & 3u) - 1);
}

// y [T, N] = d [T, N] * s_t * d_n.
__global__ void scale_out(const int32_t* acc, const float* s, const float* dn, int64_t n, int64_t count, float* y) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  y[i] = static_cast<float>(acc[i]) * s[i / n] * dn[i % n];
}

struct Shape {
  const char* name;
  int64_t n, k;
};

struct Int8Gemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
};

Int8Gemm make_int8_gemm(cublasLtHandle_t lt, int64_t n, int64_t t, int64_t k, size_t ws_bytes) {
  Int8Gemm g;
  LT(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LT(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_8I, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  LT(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_8I, static_cast<uint64_t>(k), static_cast<uint64_t>(t), k));
  LT(cublasLtMatrixLayoutCreate(&g.c, CUDA_R_32I, static_cast<uint64_t>(n), static_cast<uint64_t>(t), n));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                          sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t res[4];
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, g.op, g.a, g.b, g.c, g.c, pref, 4, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
    g.algo = res[0].algo;
    g.ok = true;
  } else {
    std::printf("  int8 GEMM %lldx%lldx%lld: no cuBLASLt algorithm (%s, %d found)\n", static_cast<long long>(n),
                static_cast<long long>(t), static_cast<long long>(k), cublasLtGetStatusString(st), found);
  }
  return g;
}

uint16_t to_half_bits(float f) {
  const __half h = __float2half_rn(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  const Shape shapes[] = {{"8B q|k|v", 6144, 4096},       {"8B o", 4096, 4096},          {"8B gate|up", 28672, 4096},
                          {"8B down", 4096, 14336},       {"2B4T q|k|v", 3840, 2560},    {"2B4T o", 2560, 2560},
                          {"2B4T gate|up", 13824, 2560}, {"2B4T down", 2560, 6912}};
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cublasLtHandle_t lt;
  LT(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t{32} << 20;
  DeviceBuffer lt_ws(ws_bytes);
  GemmWorkspace gws(kT, 14336, 28672 * 4096);
  std::mt19937 rng(7);
  double sum_src[2] = {0, 0}, sum_imma[2] = {0, 0}, sum_gemm8[2] = {0, 0};
  std::printf("T = %lld, median of %d runs (us); imma = quant x + expand w + int8 GEMM + scale\n",
              static_cast<long long>(kT), reps);
  std::printf("%-14s %9s %9s %9s %9s %9s %9s  %s\n", "matrix", "src", "imma", "gemm8", "expand", "bf16gemm", "src/imma",
              "check");
  for (const Shape& sh : shapes) {
    const int64_t n = sh.n, k = sh.k, nb = k / 256;
    // Host tq2_0: codes 0..2 (a third each, as BitNet's weights roughly are), one d per row.
    std::vector<uint8_t> blocks(static_cast<size_t>(n * nb) * 66);
    std::vector<int8_t> wq(static_cast<size_t>(n * k));
    std::vector<float> dn(static_cast<size_t>(n));
    std::uniform_int_distribution<int> code(0, 2);
    std::uniform_real_distribution<float> dd(0.01f, 0.05f);
    for (int64_t r = 0; r < n; ++r) {
      const uint16_t d16 = to_half_bits(dd(rng));
      dn[static_cast<size_t>(r)] = __half2float(*reinterpret_cast<const __half*>(&d16));
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* blk = blocks.data() + static_cast<size_t>(r * nb + b) * 66;
        std::memset(blk, 0, 64);
        for (int e = 0; e < 256; ++e) {
          const int c = code(rng);
          blk[32 * (e / 128) + (e % 32)] |= static_cast<uint8_t>(c << (2 * ((e % 128) / 32)));
          wq[static_cast<size_t>(r * k + b * 256 + e)] = static_cast<int8_t>(c - 1);
        }
        std::memcpy(blk + 64, &d16, 2);
      }
    }
    const DeviceWeight w = upload_weight(DType::TQ2_0, blocks.data(), n, k);
    // x: BitLinear's output, q * s_t with q in [-127, 127] and the row's absmax element at +-127.
    std::vector<int8_t> xq(static_cast<size_t>(kT * k));
    std::vector<float> x(static_cast<size_t>(kT * k)), sx(static_cast<size_t>(kT));
    std::normal_distribution<float> nd(0.0f, 30.0f);
    for (int64_t t = 0; t < kT; ++t) {
      sx[static_cast<size_t>(t)] = 0.002f * (1.0f + static_cast<float>(t % 7));
      for (int64_t i = 0; i < k; ++i) {
        const float v = i == t % k ? 127.0f : std::clamp(std::round(nd(rng)), -127.0f, 127.0f);
        xq[static_cast<size_t>(t * k + i)] = static_cast<int8_t>(v);
        x[static_cast<size_t>(t * k + i)] = v * sx[static_cast<size_t>(t)];
      }
    }
    DeviceBuffer dx(x.size() * 4), dq(x.size()), ds(static_cast<size_t>(kT) * 4), dw8(static_cast<size_t>(n * k)),
        dd_n(static_cast<size_t>(n) * 4), dacc(static_cast<size_t>(kT * n) * 4), y_src(static_cast<size_t>(kT * n) * 4),
        y_imma(static_cast<size_t>(kT * n) * 4), dw16(static_cast<size_t>(n * k) * 2), dx16(x.size() * 2);
    dx.upload(x.data(), dx.bytes());
    dd_n.upload(dn.data(), dd_n.bytes());
    const Int8Gemm g = make_int8_gemm(lt, n, kT, k, ws_bytes);
    if (!g.ok) continue;
    const int32_t one = 1, zero = 0;
    const int64_t n_bytes = static_cast<int64_t>(w.quants.bytes());
    const auto expand = [&] {
      expand_tq2_i8<<<static_cast<unsigned>((n_bytes + 255) / 256), 256, 0, st>>>(w.quants.as<uint8_t>(), n_bytes,
                                                                                dw8.as<int8_t>());
    };
    const auto gemm8 = [&] {
      LT(cublasLtMatmul(lt, g.op, &one, dw8.get(), g.a, dq.get(), g.b, &zero, dacc.get(), g.c, dacc.get(), g.c,
                        &g.algo, lt_ws.get(), ws_bytes, st));
    };
    const auto imma = [&] {
      quant_rows_i8<<<static_cast<unsigned>(kT), 256, 0, st>>>(dx.as<float>(), k, dq.as<int8_t>(), ds.as<float>());
      expand();
      gemm8();
      scale_out<<<static_cast<unsigned>((kT * n + 255) / 256), 256, 0, st>>>(dacc.as<int32_t>(), ds.as<float>(),
                                                                          dd_n.as<float>(), n, kT * n,
                                                                          y_imma.as<float>());
    };
    const auto src = [&] { matmul(w, dx.as<float>(), y_src.as<float>(), kT, gws, st); };
    // src's bf16 GEMM alone, on a bf16 copy of W and x (the expansion and x's conversion done once, untimed).
    std::vector<__nv_bfloat16> w16(static_cast<size_t>(n * k)), x16(x.size());
    for (size_t i = 0; i < w16.size(); ++i) w16[i] = __float2bfloat16(static_cast<float>(wq[i]) * dn[i / k]);
    for (size_t i = 0; i < x16.size(); ++i) x16[i] = __float2bfloat16(x[i]);
    dw16.upload(w16.data(), dw16.bytes());
    dx16.upload(x16.data(), dx16.bytes());
    const DeviceWeight wb = upload_weight(DType::BF16, w16.data(), n, k);
    const auto bf16gemm = [&] { matmul_x16(wb, dx16.get(), y_src.as<float>(), kT, gws, st); };

    // Checks on 256 sampled outputs against a double reference.
    imma();
    CK(cudaStreamSynchronize(st));
    std::vector<float> yi(static_cast<size_t>(kT * n)), ys(yi.size());
    y_imma.download(yi.data(), y_imma.bytes());
    src();
    CK(cudaStreamSynchronize(st));
    y_src.download(ys.data(), y_src.bytes());
    double err_i = 0, err_s = 0, scale = 0;
    std::uniform_int_distribution<int64_t> pick(0, kT * n - 1);
    for (int s = 0; s < 256; ++s) {
      const int64_t i = pick(rng), t = i / n, r = i % n;
      int64_t acc = 0;
      for (int64_t c = 0; c < k; ++c)
        acc += static_cast<int64_t>(xq[static_cast<size_t>(t * k + c)]) * wq[static_cast<size_t>(r * k + c)];
      const double ref = static_cast<double>(acc) * sx[static_cast<size_t>(t)] * dn[static_cast<size_t>(r)];
      scale = std::max(scale, std::fabs(ref));
      err_i = std::max(err_i, std::fabs(yi[static_cast<size_t>(i)] - ref));
      err_s = std::max(err_s, std::fabs(ys[static_cast<size_t>(i)] - ref));
    }
    err_i /= scale;
    err_s /= scale;
    const bool ok = err_i < 1e-5;

    using exp_common::time_us;
    const float t_src = time_us(src, reps, st), t_imma = time_us(imma, reps, st);
    const float t_g8 = time_us(gemm8, reps, st), t_exp = time_us(expand, reps, st);
    const float t_b16 = time_us(bf16gemm, reps, st);
    std::printf("%-14s %9.1f %9.1f %9.1f %9.1f %9.1f %8.2fx  imma %.1e src %.1e %s\n", sh.name, t_src, t_imma, t_g8,
                t_exp, t_b16, t_src / t_imma, err_i, err_s, ok ? "ok" : "FAIL");
    const int m = sh.name[0] == '8' ? 0 : 1;
    sum_src[m] += t_src;
    sum_imma[m] += t_imma;
    sum_gemm8[m] += t_g8;
    cublasLtMatrixLayoutDestroy(g.a);
    cublasLtMatrixLayoutDestroy(g.b);
    cublasLtMatrixLayoutDestroy(g.c);
    cublasLtMatmulDescDestroy(g.op);
  }
  const char* names[2] = {"Llama-3-8B", "BitNet-2B4T"};
  for (int m = 0; m < 2; ++m)
    std::printf("%s, one layer's matmuls: src %.1f us, imma %.1f us (%.2fx), int8 GEMMs alone %.1f us (%.2fx)\n",
                names[m], sum_src[m], sum_imma[m], sum_src[m] / sum_imma[m], sum_gemm8[m], sum_src[m] / sum_gemm8[m]);
  cublasLtDestroy(lt);
  return 0;
}
