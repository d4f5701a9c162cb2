// LoRA prefill on CUDA (issue 25: a 512-token chunk with rank-16 adapters on all seven projections >= 0.9x the base;
// 0.826x in the seventeenth session). What is left per adapted node, by docs/LORA.md: the B GEMM's pass over the
// node's output y (C read, D written) and its launch. This experiment times one adapted node of each Llama-3-8B kind
// alone, at T = 512, in the forms that matter for the decision whether to build a K-extended base GEMM in src/:
//   base  : the base GEMM alone (the target);
//   now1  : the base GEMM, then A's split-K GEMM and its sum (u = x·A_stackᵀ), then the B GEMM y += u·B_bdᵀ
//           (src with --cuda lora_side=0);
//   side  : the same with A on a second stream beside the base GEMM, joined before B (src's default);
//   kext  : A first (split-K and sum), then one GEMM over K + R: [x | u]·[W | B_bd]ᵀ, which gives y + Δ with no pass
//           of its own (u here goes to a buffer of its own and [x | u] is prepared untimed; in src u would be written
//           into the last R columns of x's 16-bit copy, whose row stride would be K + R: the same bytes);
//   kgemm : the K + R GEMM alone (kext less A's product);
//   kpad  : kext with K + R padded to whole 128-value tiles by zero columns (the eighteenth session's kgemm cost more
//           than its FLOPs: down at K = 14352 +12.5 us), and its GEMM alone; and A's product alone, as src runs it
//           (split-K GEMM and sum) and as one cuBLASLt GEMM, for the projection of a faster A.
// The nodes: q|k|v (N 6144, K 4096, R 48: three members of rank 16, f32 y), o (4096, 4096, 16, accumulating into the
// f32 residual), gate|up (28672, 4096, 32, 16-bit y as matmul_x16_out16 writes it), down (4096, 14336, 16, residual).
// B_bd is dense random here (the real one is block-diagonal with zeros): the GEMMs' cost is the same.
// Each form is checked first: side must equal now1 (relative L2 < 1e-6: the same kernels), and kext must agree with
// it (relative L2 <= 1e-2: u is rounded to bf16 in both, kext's sum order differs) while the adapter's terms move y
// by at least 10x that; base against a double reference on sampled outputs.
// The nineteenth session adds (the kpad projection was 0.902x with A as one cuBLASLt GEMM, and q|k|v's GEMM at
// K = 4224 cost 55.6 us against 39.7 at 4096):
//   afast : A's product by a kernel of its own (a_wmma_kernel: bf16 tensor cores, K split into slices of 256-448
//           over 8 blocks of 64 rows; the slices' partial sums then added in a fixed order by a second launch, which
//           writes u rounded to bf16 straight into the padded x's R columns), alone and before the kpad GEMM (kfast);
//   pads  : the K + R GEMM alone at K + 64, K + 128 and K + 256 (zero columns), to find a K whose cuBLASLt choice
//           keeps the base GEMM's speed.
// Per node it prints µs (median of graph replays) and the overhead over base; the projection at the end sums the four
// nodes over 32 layers against the chunk's base time (12.05 ms at 42.5k tok/s, the seventeenth session).
//
// Build here (no GPU needed): target exp_lora_prefill_forms. Run on the GPU machine (~1 minute, mostly the host's
// random weights): build-gpu/bin/experiments/exp_lora_prefill_forms [reps, default 50]
#include <cuda_bf16.h>
#include <mma.h>
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
#include "backends/cuda/kernels_lora.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/memory.h"
#include "exp_common.cuh"
#include "quant/half.h"

using namespace tessera;
using namespace tessera::cuda;
using exp_common::graph_us;

namespace {

constexpr int64_t kT = 512;

// Fills `out` with bf16 uniform(-a, a) from one LCG stream (fast enough for 117 M values).
void fill(std::vector<uint16_t>& out, size_t n, float a, uint64_t seed) {
  out.resize(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float r = static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
    out[i] = f32_to_bf16((2.0f * r - 1.0f) * a);
  }
}

enum class Out { F32, RESIDUAL, BF16 };
struct Node {
  const char* name;
  int64_t n, k, r;
  Out out;
};

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// u_parts[split][t][r] = sum over the split's K slice of x[t][k] * A[r][k]: one warp per 16 rows of t and every r
// (R / 16 accumulators), 4 warps a block (64 rows); grid (T / 64, splits). x [T][ldx] bf16 (its first K columns), A
// [R][K] bf16. R a multiple of 16 (at most 64), the slice a multiple of 16.
__global__ void __launch_bounds__(128) a_wmma_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx,
                                                     const __nv_bfloat16* __restrict__ a, int k, int r, int slice,
                                                     float* __restrict__ parts, int t_rows) {
  using namespace nvcuda;
  const int warp = threadIdx.x / 32;
  const int t0 = blockIdx.x * 64 + warp * 16;
  const int k0 = blockIdx.y * slice, k1 = min(k, k0 + slice);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
  const int nf = r / 16;
  for (int f = 0; f < 4; ++f) wmma::fill_fragment(acc[f], 0.0f);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  for (int kk = k0; kk < k1; kk += 16) {
    wmma::load_matrix_sync(fa, x + static_cast<int64_t>(t0) * ldx + kk, static_cast<unsigned>(ldx));
    for (int f = 0; f < nf; ++f) {
      wmma::load_matrix_sync(fb, a + static_cast<int64_t>(f * 16) * k + kk, static_cast<unsigned>(k));
      wmma::mma_sync(acc[f], fa, fb, acc[f]);
    }
  }
  float* out = parts + (static_cast<int64_t>(blockIdx.y) * t_rows + t0) * r;
  for (int f = 0; f < nf; ++f) wmma::store_matrix_sync(out + f * 16, acc[f], static_cast<unsigned>(r), wmma::mem_row_major);
}

// The same product with the block's whole x slice [64][slice] and A slice [R][slice] first copied to shared memory
// by cp.async (every 16-byte piece in flight at once: one memory round trip per block), then the tensor-core steps
// from shared memory. Rows padded by 8 values (16 bytes) against bank conflicts. Dynamic shared memory:
// (64 + R) * (slice + 8) * 2 bytes.
__global__ void __launch_bounds__(128) a_smem_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx,
                                                     const __nv_bfloat16* __restrict__ a, int k, int r, int slice,
                                                     float* __restrict__ parts, int t_rows) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char sm[];
  const int ld = slice + 8;
  auto* xs = reinterpret_cast<__nv_bfloat16*>(sm);
  __nv_bfloat16* as = xs + 64 * ld;
  const int tb = blockIdx.x * 64, k0 = blockIdx.y * slice;
  const int pieces = slice / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < (64 + r) * pieces; i += 128) {
    const int row = i / pieces, c = (i % pieces) * 8;
    const __nv_bfloat16* src = row < 64 ? x + static_cast<int64_t>(tb + row) * ldx + k0 + c
                                        : a + static_cast<int64_t>(row - 64) * k + k0 + c;
    __nv_bfloat16* dst = (row < 64 ? xs + row * ld : as + (row - 64) * ld) + c;
    const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  const int warp = threadIdx.x / 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
  const int nf = r / 16;
  for (int f = 0; f < 4; ++f) wmma::fill_fragment(acc[f], 0.0f);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  for (int kk = 0; kk < slice; kk += 16) {
    wmma::load_matrix_sync(fa, xs + warp * 16 * ld + kk, static_cast<unsigned>(ld));
    for (int f = 0; f < nf; ++f) {
      wmma::load_matrix_sync(fb, as + f * 16 * ld + kk, static_cast<unsigned>(ld));
      wmma::mma_sync(acc[f], fa, fb, acc[f]);
    }
  }
  float* out = parts + (static_cast<int64_t>(blockIdx.y) * t_rows + tb + warp * 16) * r;
  for (int f = 0; f < nf; ++f) wmma::store_matrix_sync(out + f * 16, acc[f], static_cast<unsigned>(r), wmma::mem_row_major);
}

// u[t][r] = the splits' partial sums in split order, rounded to bf16 into dst[t * ldd + r] (the padded x's R columns).
__global__ void a_sum_kernel(const float* __restrict__ parts, int splits, int t_rows, int r, __nv_bfloat16* dst,
                             int64_t ldd) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= t_rows * r) return;
  // Eight loads in flight, then their sums in split order (a fixed order: the same bits every run).
  float v = 0.0f;
  const int64_t step = static_cast<int64_t>(t_rows) * r;
  int s = 0;
  for (; s + 8 <= splits; s += 8) {
    float p[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] = parts[(s + j) * step + i];
#pragma unroll
    for (int j = 0; j < 8; ++j) v += p[j];
  }
  for (; s < splits; ++s) v += parts[s * step + i];
  dst[static_cast<int64_t>(i / r) * ldd + i % r] = __float2bfloat16_rn(v);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  set_device(0);
  cudaStream_t st, side;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t e0, e1, fork, join;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  const Node nodes[] = {{"q|k|v", 6144, 4096, 48, Out::F32},
                        {"o", 4096, 4096, 16, Out::RESIDUAL},
                        {"gate|up", 28672, 4096, 32, Out::BF16},
                        {"down", 4096, 14336, 16, Out::RESIDUAL}};
  GemmWorkspace ws(kT, 14336 + 256, 0), ws_side(kT, 14336 + 256, 0);
  int failures = 0;
  double sum_base = 0, sum_now = 0, sum_side = 0, sum_kext = 0, sum_kpad = 0, sum_a = 0, sum_a1 = 0, sum_kfast = 0,
         sum_kbestpad = 0, sum_afast = 0, sum_ksmem = 0, sum_asmem = 0;
  std::printf("node | N x K, R | base us | now1 us (+) | side us (+) | kext us (+) | kgemm us | check\n");
  for (const Node& nd : nodes) {
    const int64_t n = nd.n, k = nd.k, r = nd.r, ke = k + r;
    const int64_t kp = (ke + 127) / 128 * 128;  // K + R padded with zero columns to whole 128-value tiles
    std::vector<uint16_t> hw, ha, hb, hx;
    fill(hw, static_cast<size_t>(n * k), 0.02f, 1 + n);
    fill(ha, static_cast<size_t>(r * k), 0.02f, 2 + n);
    fill(hb, static_cast<size_t>(n * r), 0.05f, 3 + n);
    fill(hx, static_cast<size_t>(kT * k), 1.0f, 4 + n);
    // [W | B_bd] [n, k + r]: each row's base weights, then its B_bd row.
    std::vector<uint16_t> hwe(static_cast<size_t>(n * ke));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&hwe[static_cast<size_t>(i * ke)], &hw[static_cast<size_t>(i * k)], static_cast<size_t>(k) * 2);
      std::memcpy(&hwe[static_cast<size_t>(i * ke + k)], &hb[static_cast<size_t>(i * r)], static_cast<size_t>(r) * 2);
    }
    const DeviceWeight w = upload_weight(DType::BF16, hw.data(), n, k);
    const DeviceWeight we = upload_weight(DType::BF16, hwe.data(), n, ke);
    DeviceWeight wpad;
    {
      std::vector<uint16_t> hwp(static_cast<size_t>(n * kp), 0);
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(&hwp[static_cast<size_t>(i * kp)], &hwe[static_cast<size_t>(i * ke)], static_cast<size_t>(ke) * 2);
      wpad = upload_weight(DType::BF16, hwp.data(), n, kp);
    }
    const DeviceWeight a = upload_weight(DType::BF16, ha.data(), r, k);
    const DeviceWeight b = upload_weight(DType::BF16, hb.data(), n, r);
    std::vector<uint16_t>().swap(hwe);
    DeviceBuffer x(static_cast<size_t>(kT * k) * 2), xe(static_cast<size_t>(kT * ke) * 2),
        xp(static_cast<size_t>(kT * kp) * 2);
    xp.fill_bytes(0);
    x.upload(hx.data(), x.bytes());
    const size_t y_elem = nd.out == Out::BF16 ? 2 : 4;
    DeviceBuffer y(static_cast<size_t>(kT * n) * y_elem), res0(static_cast<size_t>(kT * n) * y_elem);
    DeviceBuffer u(static_cast<size_t>(kT * r) * 2);
    const int splits = matmul_split_k_default(kT, r, k);
    DeviceBuffer parts(static_cast<size_t>(std::max(splits, 1) * kT * r) * sizeof(float));
    res0.fill_bytes(0);
    const bool acc = nd.out == Out::RESIDUAL;
    const auto gemm = [&](const DeviceWeight& wt, const void* in, bool accumulate, GemmWorkspace& g, cudaStream_t s) {
      if (nd.out == Out::BF16)
        matmul_x16_out16(wt, in, y.get(), kT, g, s, accumulate);
      else
        matmul_x16(wt, in, y.as<float>(), kT, g, s, accumulate);
    };
    const auto a_product = [&](GemmWorkspace& g, cudaStream_t s) {
      if (splits > 1) {
        const int written = matmul_x16_split_k(a, x.get(), parts.as<float>(), kT, splits, g, s);
        lora_sum_parts(parts.as<float>(), written, kT * r, u.get(), DType::BF16, s);
      } else {
        matmul_x16_out16(a, x.get(), u.get(), kT, g, s);
      }
    };
    // The residual nodes accumulate into y: each run starts from the same residual (zeros), copied in first by all
    // forms alike (a pass of its own, the same in every form, in every time below).
    const auto reset = [&](cudaStream_t s) {
      if (acc) CK(cudaMemcpyAsync(y.get(), res0.get(), y.bytes(), cudaMemcpyDeviceToDevice, s));
    };
    const auto run_base = [&](int) {
      reset(st);
      gemm(w, x.get(), acc, ws, st);
    };
    const auto run_now = [&](int) {
      reset(st);
      gemm(w, x.get(), acc, ws, st);
      a_product(ws, st);
      gemm(b, u.get(), true, ws, st);
    };
    const auto run_side = [&](int) {
      reset(st);
      CK(cudaEventRecord(fork, st));
      CK(cudaStreamWaitEvent(side, fork, 0));
      a_product(ws_side, side);
      CK(cudaEventRecord(join, side));
      gemm(w, x.get(), acc, ws, st);
      CK(cudaStreamWaitEvent(st, join, 0));
      gemm(b, u.get(), true, ws, st);
    };
    const auto run_kext = [&](int) {
      reset(st);
      a_product(ws, st);
      gemm(we, xe.get(), acc, ws, st);
    };
    const auto run_kgemm = [&](int) {
      reset(st);
      gemm(we, xe.get(), acc, ws, st);
    };
    // The same with K + R padded to whole 128-value tiles (zero columns in both operands).
    const auto run_kpad = [&](int) {
      reset(st);
      a_product(ws, st);
      gemm(wpad, xp.get(), acc, ws, st);
    };
    const auto run_kpgemm = [&](int) {
      reset(st);
      gemm(wpad, xp.get(), acc, ws, st);
    };
    // A's product alone: src's split-K GEMM and its sum, and one cuBLASLt GEMM without the split.
    const auto run_a = [&](int) { a_product(ws, st); };
    const auto run_a1 = [&](int) { matmul_x16_out16(a, x.get(), u.get(), kT, ws, st); };
    // [x | u] for kext: x's rows with u's appended (untimed; u from a run of A first).
    const auto prepare_xe = [&]() {
      a_product(ws, st);
      CK(cudaMemcpy2DAsync(xe.get(), static_cast<size_t>(ke) * 2, x.get(), static_cast<size_t>(k) * 2,
                           static_cast<size_t>(k) * 2, kT, cudaMemcpyDeviceToDevice, st));
      CK(cudaMemcpy2DAsync(static_cast<uint8_t*>(xe.get()) + k * 2, static_cast<size_t>(ke) * 2, u.get(),
                           static_cast<size_t>(r) * 2, static_cast<size_t>(r) * 2, kT, cudaMemcpyDeviceToDevice, st));
      CK(cudaMemcpy2DAsync(xp.get(), static_cast<size_t>(kp) * 2, xe.get(), static_cast<size_t>(ke) * 2,
                           static_cast<size_t>(ke) * 2, kT, cudaMemcpyDeviceToDevice, st));
    };
    const auto read_y = [&]() {
      CK(cudaStreamSynchronize(st));
      std::vector<float> out(static_cast<size_t>(kT * n));
      if (nd.out == Out::BF16) {
        std::vector<uint16_t> h(out.size());
        y.download(h.data(), y.bytes());
        for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
      } else {
        y.download(out.data(), y.bytes());
      }
      return out;
    };
    prepare_xe();
    run_base(0);
    const std::vector<float> y_base = read_y();
    run_now(0);
    const std::vector<float> y_now = read_y();
    run_side(0);
    CK(cudaStreamSynchronize(side));
    const std::vector<float> y_side = read_y();
    run_kext(0);
    const std::vector<float> y_kext = read_y();
    run_kpad(0);
    const std::vector<float> y_kpad = read_y();
    // base against a double reference on 64 sampled outputs (x and W as uploaded).
    double worst = 0;
    std::mt19937 rng(7);
    for (int sidx = 0; sidx < 64; ++sidx) {
      const int64_t t = static_cast<int64_t>(rng() % kT), c = static_cast<int64_t>(rng() % n);
      double ref = 0, mag = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double p = static_cast<double>(bf16_to_f32(hx[static_cast<size_t>(t * k + j)])) *
                         bf16_to_f32(hw[static_cast<size_t>(c * k + j)]);
        ref += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(y_base[static_cast<size_t>(t * n + c)] - ref) / std::max(mag, 1e-12));
    }
    const double d_side = rel_l2(y_side, y_now), d_kext = rel_l2(y_kext, y_now), moved = rel_l2(y_base, y_now);
    const double d_kpad = rel_l2(y_kpad, y_kext);  // the zero columns change the tiling and sum order only
    const bool ok = worst < 1e-2 && d_side < 1e-6 && d_kext < 1e-2 && moved > 10 * d_kext && d_kpad < 1e-2;
    failures += !ok;
    const float t_base = graph_us(st, e0, e1, 1, reps, run_base);
    const float t_now = graph_us(st, e0, e1, 1, reps, run_now);
    const float t_side = graph_us(st, e0, e1, 1, reps, run_side);
    const float t_kext = graph_us(st, e0, e1, 1, reps, run_kext);
    const float t_kgemm = graph_us(st, e0, e1, 1, reps, run_kgemm);
    const float t_kpad = graph_us(st, e0, e1, 1, reps, run_kpad);
    const float t_kpgemm = graph_us(st, e0, e1, 1, reps, run_kpgemm);
    const float t_a = graph_us(st, e0, e1, 1, reps, run_a);
    const float t_a1 = graph_us(st, e0, e1, 1, reps, run_a1);
    std::printf(
        "%s | %lld x %lld, %lld | %.1f | %.1f (+%.1f) | %.1f (+%.1f) | %.1f (+%.1f) | %.1f | %s (base %.1e, "
        "side %.1e, kext %.1e, terms %.1e)\n",
        nd.name, static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(r), t_base, t_now,
        t_now - t_base, t_side, t_side - t_base, t_kext, t_kext - t_base, t_kgemm, ok ? "ok" : "FAIL", worst, d_side,
        d_kext, moved);
    sum_base += t_base;
    sum_now += t_now;
    sum_side += t_side;
    sum_kext += t_kext;
    sum_kpad += t_kpad;
    sum_a += t_a;
    sum_a1 += t_a1;
    std::printf("  %s, K + R padded to %lld: kpad %.1f (+%.1f), its GEMM alone %.1f (kpad vs kext %.1e) | A alone: "
                "split-K + sum %.1f, one GEMM %.1f\n",
                nd.name, static_cast<long long>(kp), t_kpad, t_kpad - t_base, t_kpgemm, d_kpad, t_a, t_a1);

    // The fast A: a_wmma_kernel's slices and a_sum_kernel writing u into xp's pad columns, then the kpad GEMM.
    const int a_splits = static_cast<int>(std::min<int64_t>(32, k / 256));
    const int a_slice = static_cast<int>((k / a_splits + 15) / 16 * 16);
    DeviceBuffer a_parts(static_cast<size_t>(a_splits) * kT * r * sizeof(float));
    const auto* xb16 = static_cast<const __nv_bfloat16*>(x.get());
    auto* xpad_u = reinterpret_cast<__nv_bfloat16*>(static_cast<uint8_t*>(xp.get()) + k * 2);
    const auto* a16 = static_cast<const __nv_bfloat16*>(a.quants.get());
    const auto run_afast = [&](int) {
      a_wmma_kernel<<<dim3(static_cast<unsigned>(kT / 64), static_cast<unsigned>(a_splits)), 128, 0, st>>>(
          xb16, k, a16, static_cast<int>(k), static_cast<int>(r), a_slice, a_parts.as<float>(), static_cast<int>(kT));
      a_sum_kernel<<<static_cast<unsigned>((kT * r + 255) / 256), 256, 0, st>>>(
          a_parts.as<float>(), a_splits, static_cast<int>(kT), static_cast<int>(r), xpad_u, kp);
    };
    // The shared-memory form at 32 slices (its smem: (64 + R) * (slice + 8) * 2 bytes).
    const int s_splits = static_cast<int>(std::min<int64_t>(64, k / 128));
    const int s_slice = static_cast<int>((k / s_splits + 15) / 16 * 16);
    const size_t s_smem = static_cast<size_t>(64 + r) * (s_slice + 8) * 2;
    CK(cudaFuncSetAttribute(a_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    DeviceBuffer s_parts(static_cast<size_t>(s_splits) * kT * r * sizeof(float));
    const auto run_asmem = [&](int) {
      a_smem_kernel<<<dim3(static_cast<unsigned>(kT / 64), static_cast<unsigned>(s_splits)), 128, s_smem, st>>>(
          xb16, k, a16, static_cast<int>(k), static_cast<int>(r), s_slice, s_parts.as<float>(), static_cast<int>(kT));
      a_sum_kernel<<<static_cast<unsigned>((kT * r + 255) / 256), 256, 0, st>>>(
          s_parts.as<float>(), s_splits, static_cast<int>(kT), static_cast<int>(r), xpad_u, kp);
    };
    const auto run_ksmem = [&](int) {
      reset(st);
      run_asmem(0);
      gemm(wpad, xp.get(), acc, ws, st);
    };
    run_ksmem(0);
    CK(cudaGetLastError());
    const double d_ksmem = rel_l2(read_y(), y_kext);
    const bool ok_smem = d_ksmem < 1e-2 && moved > 10 * d_ksmem;
    failures += !ok_smem;
    const float t_asmem = graph_us(st, e0, e1, 1, reps, run_asmem);
    const float t_ksmem = graph_us(st, e0, e1, 1, reps, run_ksmem);
    const float t_asum = graph_us(st, e0, e1, 1, reps, [&](int) {
      a_sum_kernel<<<static_cast<unsigned>((kT * r + 255) / 256), 256, 0, st>>>(
          s_parts.as<float>(), s_splits, static_cast<int>(kT), static_cast<int>(r), xpad_u, kp);
    });
    std::printf("  %s: smem A alone %.1f (its sum launch alone %.1f; %d slices of %d; y vs kext %.1e %s), ksmem %.1f "
                "(+%.1f)\n",
                nd.name, t_asmem, t_asum, s_splits, s_slice, d_ksmem, ok_smem ? "ok" : "FAIL", t_ksmem,
                t_ksmem - t_base);
    sum_ksmem += t_ksmem;
    sum_asmem += t_asmem;
    const auto run_kfast = [&](int) {
      reset(st);
      run_afast(0);
      gemm(wpad, xp.get(), acc, ws, st);
    };
    run_kfast(0);
    CK(cudaGetLastError());
    const std::vector<float> y_kfast = read_y();
    const double d_kfast = rel_l2(y_kfast, y_kext);
    const bool ok_fast = d_kfast < 1e-2 && moved > 10 * d_kfast;
    failures += !ok_fast;
    const float t_afast = graph_us(st, e0, e1, 1, reps, run_afast);
    const float t_kfast = graph_us(st, e0, e1, 1, reps, run_kfast);
    // The K + R GEMM alone at other pads (zero columns past K + R).
    std::string pads;
    float best_pad_gemm = t_kpgemm;
    for (const int64_t extra : {int64_t{64}, int64_t{128}, int64_t{256}}) {
      const int64_t k2 = k + extra;
      if (k2 < ke) continue;
      DeviceWeight w2;
      w2.dtype = DType::BF16;
      w2.n = n;
      w2.k = k2;
      w2.layout = GemvLayout::ROWS;
      w2.quants = DeviceBuffer(static_cast<size_t>(n * k2) * 2);
      w2.quants.fill_bytes(0);
      CK(cudaMemcpy2D(w2.quants.get(), static_cast<size_t>(k2) * 2, wpad.quants.get(), static_cast<size_t>(kp) * 2,
                      static_cast<size_t>(ke) * 2, static_cast<size_t>(n), cudaMemcpyDeviceToDevice));
      DeviceBuffer x2(static_cast<size_t>(kT * k2) * 2);
      x2.fill_bytes(0);
      CK(cudaMemcpy2D(x2.get(), static_cast<size_t>(k2) * 2, xp.get(), static_cast<size_t>(kp) * 2,
                      static_cast<size_t>(ke) * 2, static_cast<size_t>(kT), cudaMemcpyDeviceToDevice));
      const float tg = graph_us(st, e0, e1, 1, reps, [&](int) {
        reset(st);
        gemm(w2, x2.get(), acc, ws, st);
      });
      best_pad_gemm = std::min(best_pad_gemm, tg);
      char b[64];
      std::snprintf(b, sizeof(b), " K=%lld %.1f", static_cast<long long>(k2), tg);
      pads += b;
    }
    std::printf("  %s: fast A alone %.1f (%d slices; y vs kext %.1e %s), kfast %.1f (+%.1f) | K + R GEMM alone at:%s\n",
                nd.name, t_afast, a_splits, d_kfast, ok_fast ? "ok" : "FAIL", t_kfast, t_kfast - t_base, pads.c_str());
    sum_kfast += t_kfast;
    sum_afast += t_afast;
    sum_kbestpad += best_pad_gemm;
  }
  // A chunk: 32 layers of the four nodes, plus what the rest of the layer and the output projection take (the
  // seventeenth session's base chunk: 512 / 42,500 tok/s = 12.05 ms).
  const double chunk_base_ms = 512.0 / 42500.0 * 1e3, layers = 32;
  const auto ratio = [&](double sum) { return chunk_base_ms / (chunk_base_ms + layers * (sum - sum_base) * 1e-3); };
  std::printf(
      "\n== projection for a 512-token chunk (base %.2f ms): now1 %.3fx, side %.3fx, kext %.3fx of the base "
      "(issue 25: >= 0.9x); failures=%d\n",
      chunk_base_ms, ratio(sum_now), ratio(sum_side), ratio(sum_kext), failures);
  // The padded form, with A as src runs it, with A as one GEMM, and with A free (the bound a faster A kernel has).
  std::printf("== padded K + R: kpad %.3fx, kpad with A as one GEMM %.3fx, kpad with A free %.3fx\n", ratio(sum_kpad),
              ratio(sum_kpad - sum_a + sum_a1), ratio(sum_kpad - sum_a));
  // The fast A in sequence (kfast), and the bound with the best pad's GEMM and the fast A alone added to it.
  std::printf("== fast A: kfast %.3fx; best pad's GEMM + fast A %.3fx\n", ratio(sum_kfast),
              ratio(sum_kbestpad + sum_afast));
  std::printf("== smem A: ksmem %.3fx; best pad's GEMM + smem A %.3fx\n", ratio(sum_ksmem),
              ratio(sum_kbestpad + sum_asmem));
  return failures ? 1 : 0;
}
