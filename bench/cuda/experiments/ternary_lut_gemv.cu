// Lookup-table ternary decode GEMV (T-MAC / bitnet.cpp TL style) on CUDA, against src's tq2_0 GEMV and src's bf16
// GEMV (issue 24: "2-bit unpack to int8 with dp4a or integer tensor cores, and lookup tables, for decode GEMV and
// prefill GEMM"). src has the dp4a forms (kernels/gemv_tq2_kernel.cuh, the x-stationary kernel decode uses at
// k % 2048 == 0, and the shared quantized kernel elsewhere); this measures the table form. Not yet run.
//
// What is computed: BitLinear's decode matmul, y[n] = d_n * s * sum_k w[n, k] * q[k], with ternary w, one f32 scale
// d_n per row, int8 activations q and one f32 scale s per token. src's kernel gets the same values in its own inputs
// (tq2_0 blocks whose every d is d_n; q8 blocks of 32 whose every d is s, ds.y = s * sum(q)), so both compute the same
// function of the same numbers; a double reference from the same int8 q and ternary w checks both (and the bf16 peer).
// The "blk" variants instead take tq2_0's general scales exactly as src does (an fp16 d per 256 weights of a row, an
// f32 d per 32 activations): what the table form costs if decode kept src's per-32 activation blocks.
//
// The table form. Weights are repacked at load time (setup; only the kernel is timed) into one index byte per group
// of G consecutive weights of a row: e = sum_i (w_i + 1) 3^i, 81 values for G = 4 (2 bits a weight, tq2_0's bytes) or
// 243 for G = 5 (1.6 bits a weight: 20% fewer bytes than tq2_0). For each group of G activations the table holds all
// 3^G partial sums sum_i (d_i - 1) q_i (exact integers, |.| <= 640: int32 or int16 entries). The inner loop is a byte
// extract, an address and a shared-memory load per G weights, and integer adds: no multiply by a weight (int32, in
// the sm_90a SASS: PRMT, IMAD, LDS and half an IADD3 per lookup, against dp4a's two instructions per 16 weights).
//   Conflict-free layout: a warp's 32 lanes read 32 different groups' tables at once (lane l takes the V consecutive
// index bytes l V .. l V + V - 1 of each row's chunk, a coalesced V-byte load), and lane l's tables all lie in shared
// memory bank l: entry e of the lane's v-th table is the word (v E + e) 32 + l (int32), or half (e & 1) of the word
// (v ceil(E/2) + e / 2) 32 + l (int16: two entries a bank word; the split address costs four more integer
// instructions per lookup in the SASS). Any indices in a warp then read 32 distinct banks in one wavefront. One
// table per block, shared by its warps (per-warp tables would multiply the shared memory, the binding limit, by NW).
//   Blocks: a table of 32 V groups (32 V G columns) is built from q by one block, then that block streams its rows'
// bytes of that column chunk (rows_per_block rows, R rows per warp and step, the next step's loads issued before this
// step's lookups); each table costs 3^G entries per group, paid per block, so a block covers many rows (the table
// build against the lookups is 3^G / rows_per_block). Grid: (column chunks, row tiles); each block writes its rows'
// partial sums (exact integers in f32: |.| < 2^24) to [chunks, n], and the last block of a row tile to finish (a
// per-tile counter, reset by that block) adds them in chunk order and writes y: one launch, deterministic.
//   Not here: a per-thread register table for G = 2 (9 entries): registers cannot be indexed at run time (local
// memory) and a 9-way select costs more than the dp4a it replaces; PRMT's 8-byte register lookup cannot hold the
// int8 sums +-q0 +-q1 (up to 254). The sign-symmetric half tables (T-MAC): half the table, one more select per
// lookup. A prefill (T > 1) form: T tables per chunk, T times the shared memory, where src has the tensor cores.
//
// Variants lutG_{i32|i16}_vV_wNW_rR[_blk] (template: G, table entries, V index bytes per lane and row, NW warps, R rows
// per step, tq2_0's scales), each at every rows_per_block of {64, 128, 256, 512, 1024} that is a multiple of NW R;
// every one is checked against the reference on every row (poisoned output) before it is timed, and a failing one
// prints FAIL and is not timed.
//
// Timing, per shape, for src's bf16 GEMV (default launch shape), src's tq2_0 GEMV (default launch shape, what decode
// runs) and each variant: "graph" = the tq2 sweep's method (a CUDA graph of back-to-back PDL launches over rotating
// weight copies >= 4x L2, median per launch over the replays), and "flushed" = the sparse benchmarks' (a memset of
// twice the L2 before each call, one call between events, median; the best rows_per_block only). GB/s and % of the
// measured copy bandwidth count the weight bytes (indices or codes, and scales). "vs src" = src tq2_0 us / this us,
// "vs bf16" = src bf16 us / this us (> 1: faster); a variant's row is its best rows_per_block (every one in the TSV).
// Expected run time: well under a minute at the default reps (the host-side setup of the 8B shapes dominates).
//
// Build here (no GPU needed): target exp_ternary_lut_gemv. exp_ternary_lut_gemv --host-check runs every variant's
// repacking, table layout, build and lookups on the host (the same functions as the kernel: lut_build, lut_lane_sum)
// against the reference, without a GPU; a GPU run does it first too. Run on the GPU machine:
//   build-gpu/bin/experiments/exp_ternary_lut_gemv [reps, default 15]   (writes $OUT/ternary_lut.tsv when OUT is set)
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
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_tq2_kernel.cuh"
#include "exp_common.cuh"

namespace ternary_lut {

using namespace tessera;
using namespace tessera::cuda;

constexpr int pow3(int g) { return g == 0 ? 1 : 3 * pow3(g - 1); }

// A variant's compile-time shape.
template <int G_, bool I16_, int V_, int NW_, int R_, bool BLK_>
struct Cfg {
  static constexpr int G = G_;            // weights per group (one index byte)
  static constexpr int E = pow3(G_);      // table entries per group
  static constexpr int E2 = (E + 1) / 2;  // bank words per group with int16 entries
  static constexpr bool I16 = I16_;       // int16 entries (else int32)
  static constexpr int V = V_;            // index bytes per lane and row in a chunk (one load)
  static constexpr int W = V_ / 4;        // their 32-bit words
  static constexpr int NW = NW_;          // warps per block
  static constexpr int R = R_;            // rows per warp step
  static constexpr bool BLK = BLK_;       // tq2_0's scales (fp16 d per 256 weights, f32 d per 32 activations)
  static constexpr int GC = 32 * V_;      // groups per column chunk (a warp's load of one row)
  static constexpr int SLOT_BYTES = 128 * (I16_ ? E2 : E);  // the 32 lanes' v-th tables
  static constexpr int TABLE_BYTES = V_ * SLOT_BYTES;       // a block's shared memory
  static constexpr int Z = (E - 1) / 2;                     // the index of G zero weights (its entry is 0)
  static_assert(G == 4 || G == 5, "one index byte per group");
  static_assert(V == 4 || V == 8 || V == 16, "one 4-, 8- or 16-byte load per lane and row");
  static_assert(R >= 1 && R <= 32 && (R & (R - 1)) == 0, "tq2_rows_sum's rows");
  static_assert(!BLK || (G == 4 && V % 8 == 0), "a lane's bytes of a row cover whole 32-blocks of activations");
};

// ---- Table layout, build and lookups: the same code runs in the kernel and in the host emulation (--host-check) ----

// Byte offset of entry e of the lane's v-th table from the lane's base (table + 4 * lane).
template <class C>
__host__ __device__ __forceinline__ uint32_t lut_offset(int v, uint32_t e) {
  if constexpr (C::I16)
    return static_cast<uint32_t>(v * C::SLOT_BYTES) + ((e >> 1) << 7) + ((e & 1u) << 1);
  else
    return static_cast<uint32_t>(v * C::SLOT_BYTES) + (e << 7);
}

template <class C>
__host__ __device__ __forceinline__ int lut_get(const uint8_t* tb, int v, uint32_t e) {
  if constexpr (C::I16)
    return *reinterpret_cast<const int16_t*>(tb + lut_offset<C>(v, e));
  else
    return *reinterpret_cast<const int32_t*>(tb + lut_offset<C>(v, e));
}

// Writes the 3^(G-2) entries of the lane's v-th table whose top two digits are (oc % 3, oc / 3), from the group's G
// activations x: per entry the low digits' sum (constant digits after unrolling: adds and subtracts only, no array
// that could land in local memory), plus the top digits' part, and one store.
template <class C>
__host__ __device__ __forceinline__ void lut_build(uint8_t* tb, int v, int oc, const int (&x)[C::G]) {
  constexpr int GA = C::G - 2, EA = pow3(GA);
  const int hi = (oc % 3 - 1) * x[GA] + (oc / 3 - 1) * x[GA + 1];
#pragma unroll
  for (int e = 0; e < EA; ++e) {
    int val = hi;
#pragma unroll
    for (int i = 0, p = 1; i < GA; ++i, p *= 3) {
      const int d = e / p % 3;
      if (d == 0) val -= x[i];
      if (d == 2) val += x[i];
    }
    const uint32_t idx = static_cast<uint32_t>(oc * EA + e);
    if constexpr (C::I16)
      *reinterpret_cast<int16_t*>(tb + lut_offset<C>(v, idx)) = static_cast<int16_t>(val);
    else
      *reinterpret_cast<int32_t*>(tb + lut_offset<C>(v, idx)) = val;
  }
}

// Byte b of w, zero-extended: one PRMT on the device.
__host__ __device__ __forceinline__ uint32_t lut_byte(uint32_t w, int b) {
#ifdef __CUDA_ARCH__
  return __byte_perm(w, 0u, 0x4440u | static_cast<uint32_t>(b));
#else
  return (w >> (8 * b)) & 0xffu;
#endif
}

// sum over a lane's V groups of one row: sum_v table_v[byte v of w].
template <class C>
__host__ __device__ __forceinline__ int lut_lane_sum(const uint32_t (&w)[C::W], const uint8_t* tb) {
  int acc = 0;
#pragma unroll
  for (int j = 0; j < C::W; ++j)
#pragma unroll
    for (int b = 0; b < 4; ++b) acc += lut_get<C>(tb, 4 * j + b, lut_byte(w[j], b));
  return acc;
}

// The blk form: sum over the lane's 32-blocks of d_x,block * (that block's 8 lookups), f32.
template <class C>
__host__ __device__ __forceinline__ float lut_lane_sum_blk(const uint32_t (&w)[C::W], const uint8_t* tb,
                                                           const float (&dx)[C::V / 8]) {
  float acc = 0.0f;
#pragma unroll
  for (int bb = 0; bb < C::V / 8; ++bb) {
    int s = 0;
#pragma unroll
    for (int j = 2 * bb; j < 2 * bb + 2; ++j)
#pragma unroll
      for (int b = 0; b < 4; ++b) s += lut_get<C>(tb, 4 * j + b, lut_byte(w[j], b));
    acc = fmaf(dx[bb], static_cast<float>(s), acc);
  }
  return acc;
}

// ---- The kernel ----

struct LutArgs {
  const uint8_t* idx;  // [n, row_bytes] index bytes (row_bytes = ceil(ceil(k / G) / 16) * 16; the tail holds Z)
  const float* dn;     // [n] row scales (BitLinear forms)
  const uint16_t* dw;  // [n, k / 256] fp16 bits (blk forms)
  const int8_t* xq;    // [k]
  const float2* xds;   // [k / 32] (d, d * sum q) (blk forms)
  const float* xs;     // [1] the token's scale s (BitLinear forms)
  float* y;            // [n]
  float* part;         // [chunks, n] partial sums (chunks > 1)
  unsigned* count;     // [row tiles] chunks finished; zero between launches
  int n, k, row_bytes, chunks, rows_per_block;
};

template <int V>
__device__ __forceinline__ void lut_load(const uint8_t* p, uint32_t (&w)[V / 4]) {
  if constexpr (V == 16) {
    const int4 v = exp_common::ld16(p);
    w[0] = static_cast<uint32_t>(v.x), w[1] = static_cast<uint32_t>(v.y), w[2] = static_cast<uint32_t>(v.z),
    w[3] = static_cast<uint32_t>(v.w);
  } else if constexpr (V == 8) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
  }
}

// grid (chunks, ceil(n / rows_per_block)), NW * 32 threads, C::TABLE_BYTES of dynamic shared memory.
// rows_per_block % (NW * R) == 0.
template <class C>
__global__ void __launch_bounds__(C::NW * 32) gemv_ternary_lut(const LutArgs a) {
  extern __shared__ __align__(16) uint8_t table[];  // [V][E or E2][32 lanes] words
  __shared__ int last_block;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int chunk = static_cast<int>(blockIdx.x);
  const int r0 = static_cast<int>(blockIdx.y) * a.rows_per_block, r1 = min(r0 + a.rows_per_block, a.n);
  const int off = chunk * C::GC + lane * C::V;  // the lane's first index byte in each row
  const bool has = off < a.row_bytes;           // else past the row (the last chunk): zero weights, nothing loaded
  constexpr uint32_t kZ4 = static_cast<uint32_t>(C::Z) * 0x01010101u;
  auto load = [&](int base, uint32_t(&w)[C::R][C::W], float(&d)[C::R]) {
#pragma unroll
    for (int i = 0; i < C::R; ++i) {
      const size_t row = static_cast<size_t>(min(base + i, r1 - 1));
      if (has) {
        lut_load<C::V>(a.idx + row * static_cast<size_t>(a.row_bytes) + off, w[i]);
        if constexpr (C::BLK)
          d[i] = __half2float(__ushort_as_half(a.dw[row * static_cast<size_t>(a.k / 256) + off / 64]));
      } else {
#pragma unroll
        for (int j = 0; j < C::W; ++j) w[i][j] = kZ4;
        d[i] = 0.0f;
      }
    }
  };
  int base = r0 + warp * C::R;
  uint32_t wa[C::R][C::W] = {};
  float da[C::R] = {};
  if (base < r1) load(base, wa, da);  // weights depend on no earlier kernel: before the wait
  tessera::cuda::detail::pdl_wait();

  // The chunk's tables: work items (table v, top digits oc), round robin over the warps.
  for (int item = warp; item < C::V * 9; item += C::NW) {
    const int v = item / 9, oc = item % 9;
    const int col0 = (chunk * C::GC + lane * C::V + v) * C::G;
    int x[C::G];
#pragma unroll
    for (int i = 0; i < C::G; ++i) x[i] = col0 + i < a.k ? static_cast<int>(a.xq[col0 + i]) : 0;
    lut_build<C>(table + 4 * lane, v, oc, x);
  }
  float dx[C::BLK ? C::V / 8 : 1] = {};
  if constexpr (C::BLK)
#pragma unroll
    for (int bb = 0; bb < C::V / 8; ++bb) dx[bb] = has ? a.xds[off / 8 + bb].x : 0.0f;
  const float s = C::BLK ? 1.0f : a.xs[0];
  __syncthreads();

  const uint8_t* tb = table + 4 * lane;
#pragma unroll 1
  for (; base < r1; base += C::NW * C::R) {
    uint32_t wb[C::R][C::W] = {};
    float db[C::R] = {};
    if (base + C::NW * C::R < r1) load(base + C::NW * C::R, wb, db);
    float acc[C::R];
#pragma unroll
    for (int i = 0; i < C::R; ++i) {
      if constexpr (C::BLK)
        acc[i] = da[i] * lut_lane_sum_blk<C>(wa[i], tb, dx);
      else
        acc[i] = static_cast<float>(lut_lane_sum<C>(wa[i], tb));  // exact: |.| <= 32 V G 128 < 2^24
    }
    int rl;
    const float sum = tessera::cuda::detail::tq2_rows_sum<C::R>(acc, lane, rl);
    const int row = base + rl;
    if (lane % (32 / C::R) == 0 && row < r1) {
      if (a.chunks == 1)
        a.y[row] = C::BLK ? sum : sum * (a.dn[row] * s);
      else
        a.part[static_cast<size_t>(chunk) * a.n + row] = sum;
    }
#pragma unroll
    for (int i = 0; i < C::R; ++i) {
      da[i] = db[i];
#pragma unroll
      for (int j = 0; j < C::W; ++j) wa[i][j] = wb[i][j];
    }
  }
  if (a.chunks == 1) return;
  // The last block of the row tile adds the chunks' partial sums in chunk order (exact for the BitLinear forms: the
  // integers stay below 2^24 in f32).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(&a.count[blockIdx.y], 1u) == static_cast<unsigned>(a.chunks - 1);
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  for (int row = r0 + static_cast<int>(threadIdx.x); row < r1; row += C::NW * 32) {
    float v = 0.0f;
    for (int c = 0; c < a.chunks; ++c) v += __ldcg(a.part + static_cast<size_t>(c) * a.n + row);
    a.y[row] = C::BLK ? v : v * (a.dn[row] * s);
  }
  if (threadIdx.x == 0) a.count[blockIdx.y] = 0;
}

// ---- Variants ----

// Host emulation of a variant over one packed matrix: y [n] (the kernel's arithmetic per lane and chunk).
struct Packed;
using KernelFn = void (*)(LutArgs);
using EmulateFn = void (*)(const Packed&, const std::vector<int8_t>& q, float s, const std::vector<float2>& ds,
                           std::vector<float>& y);
struct Variant {
  int g;
  bool i16;
  int v, nw, r;
  bool blk;
  int table_bytes, gc;
  KernelFn f;
  EmulateFn emulate;
  std::string name() const {
    char b[64];
    std::snprintf(b, sizeof b, "lut%d_%s_v%d_w%d_r%d%s", g, i16 ? "i16" : "i32", v, nw, r, blk ? "_blk" : "");
    return b;
  }
};

// Weights repacked for a group size: index bytes per row, row scales (f32) and tq2_0's fp16 d per 256 (blk).
struct Packed {
  int g = 0, n = 0, k = 0, groups = 0, row_bytes = 0;
  std::vector<uint8_t> idx;  // [n, row_bytes]
  std::vector<float> dn;     // [n]
  std::vector<uint16_t> dw;  // [n, k / 256] (k % 256 == 0 only)
};

Packed pack(int g, const std::vector<int8_t>& w, const std::vector<uint16_t>& dn16, int n, int k) {
  Packed p;
  p.g = g, p.n = n, p.k = k;
  p.groups = (k + g - 1) / g;
  p.row_bytes = (p.groups + 15) / 16 * 16;
  const int z = (pow3(g) - 1) / 2;
  p.idx.assign(static_cast<size_t>(n) * static_cast<size_t>(p.row_bytes), static_cast<uint8_t>(z));
  p.dn.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int8_t* wr = w.data() + static_cast<size_t>(r) * static_cast<size_t>(k);
    for (int j = 0; j < p.groups; ++j) {
      int e = 0;
      for (int i = g - 1; i >= 0; --i) e = 3 * e + (j * g + i < k ? wr[j * g + i] + 1 : 1);
      p.idx[static_cast<size_t>(r) * static_cast<size_t>(p.row_bytes) + static_cast<size_t>(j)] =
          static_cast<uint8_t>(e);
    }
    __half h;
    std::memcpy(&h, &dn16[static_cast<size_t>(r)], 2);
    p.dn[static_cast<size_t>(r)] = __half2float(h);
  }
  if (k % 256 == 0) {
    p.dw.resize(static_cast<size_t>(n) * static_cast<size_t>(k / 256));
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < k / 256; ++b)
        p.dw[static_cast<size_t>(r) * static_cast<size_t>(k / 256) + static_cast<size_t>(b)] =
            dn16[static_cast<size_t>(r)];
  }
  return p;
}

// The kernel's arithmetic on the host, lane by lane: the same table layout, build, byte extraction and lookups
// (lut_build, lut_lane_sum), the same chunking and zero fill past the row; rows summed over lanes (exact integers for
// the BitLinear forms), chunk partials added in chunk order.
template <class C>
void emulate(const Packed& p, const std::vector<int8_t>& q, float s, const std::vector<float2>& ds,
             std::vector<float>& y) {
  const int chunks = (p.groups + C::GC - 1) / C::GC;
  std::vector<uint8_t> table(static_cast<size_t>(C::TABLE_BYTES));
  std::vector<float> part(static_cast<size_t>(chunks) * static_cast<size_t>(p.n));
  for (int chunk = 0; chunk < chunks; ++chunk) {
    std::fill(table.begin(), table.end(), uint8_t{0xAB});  // entries the build misses show as garbage
    for (int lane = 0; lane < 32; ++lane)
      for (int item = 0; item < C::V * 9; ++item) {
        const int v = item / 9, oc = item % 9;
        const int col0 = (chunk * C::GC + lane * C::V + v) * C::G;
        int x[C::G];
        for (int i = 0; i < C::G; ++i) x[i] = col0 + i < p.k ? q[static_cast<size_t>(col0 + i)] : 0;
        lut_build<C>(table.data() + 4 * lane, v, oc, x);
      }
    for (int row = 0; row < p.n; ++row) {
      float sum = 0.0f;
      for (int lane = 0; lane < 32; ++lane) {
        const int off = chunk * C::GC + lane * C::V;
        uint32_t w[C::W];
        if (off < p.row_bytes)
          std::memcpy(w, p.idx.data() + static_cast<size_t>(row) * static_cast<size_t>(p.row_bytes) + off, C::V);
        else
          for (auto& x : w) x = static_cast<uint32_t>(C::Z) * 0x01010101u;
        const uint8_t* tb = table.data() + 4 * lane;
        if constexpr (C::BLK) {
          if (off >= p.row_bytes) continue;
          float dx[C::V / 8];
          for (int bb = 0; bb < C::V / 8; ++bb) dx[bb] = ds[static_cast<size_t>(off / 8 + bb)].x;
          __half h;
          std::memcpy(&h, &p.dw[static_cast<size_t>(row) * static_cast<size_t>(p.k / 256) + off / 64], 2);
          sum += __half2float(h) * lut_lane_sum_blk<C>(w, tb, dx);
        } else {
          sum += static_cast<float>(lut_lane_sum<C>(w, tb));
        }
      }
      part[static_cast<size_t>(chunk) * static_cast<size_t>(p.n) + static_cast<size_t>(row)] = sum;
    }
  }
  y.assign(static_cast<size_t>(p.n), 0.0f);
  for (int row = 0; row < p.n; ++row) {
    float v = 0.0f;
    for (int c = 0; c < chunks; ++c)
      v += part[static_cast<size_t>(c) * static_cast<size_t>(p.n) + static_cast<size_t>(row)];
    y[static_cast<size_t>(row)] = C::BLK ? v : v * (p.dn[static_cast<size_t>(row)] * s);
  }
}

template <int G, bool I16, int V, int NW, int R, bool BLK = false>
Variant mk() {
  using C = Cfg<G, I16, V, NW, R, BLK>;
  return {G, I16, V, NW, R, BLK, C::TABLE_BYTES, C::GC, gemv_ternary_lut<C>, emulate<C>};
}

// Shared memory per block (KB): G4 i32 V4 41.5, V8 83, V16 166; G4 i16 V8 42, V16 84; G5 i32 V4 124; G5 i16 V4 62,
// V8 125. The bytes in flight per SM are (blocks per SM) * NW * R * 32 V: 16 warps or 16 rows a step where the table
// leaves one block per SM.
std::vector<Variant> variants() {
  return {// G = 4, int32 entries
          mk<4, false, 4, 8, 8>(), mk<4, false, 8, 8, 4>(), mk<4, false, 8, 8, 8>(), mk<4, false, 16, 8, 8>(),
          mk<4, false, 16, 16, 8>(),
          // G = 4, int16 entries
          mk<4, true, 8, 8, 8>(), mk<4, true, 16, 8, 8>(),
          // G = 5 (1.6 bits a weight), int32 entries
          mk<5, false, 4, 8, 8>(), mk<5, false, 4, 16, 8>(), mk<5, false, 4, 16, 16>(),
          // G = 5, int16 entries
          mk<5, true, 4, 8, 8>(), mk<5, true, 8, 8, 4>(), mk<5, true, 8, 8, 8>(), mk<5, true, 8, 16, 8>(),
          // tq2_0's scales (fp16 d per 256 weights, f32 d per 32 activations)
          mk<4, false, 8, 8, 8, true>(), mk<4, false, 16, 16, 8, true>(), mk<4, true, 16, 8, 8, true>()};
}
const int kRowsPerBlock[] = {64, 128, 256, 512, 1024};

// ---- Problem data and reference ----

uint16_t half_bits(float f) {
  const __half h = __float2half_rn(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

struct Host {
  int n = 0, k = 0;
  std::vector<int8_t> w;         // [n, k] in {-1, 0, 1}
  std::vector<uint16_t> dn16;    // [n] fp16 row scales
  std::vector<int8_t> q;         // [k]
  float s = 0.0f;                // the token's scale
  std::vector<float2> ds;        // [k / 32] (s, s * sum q): src's q8 blocks of the same values
  std::vector<double> ref, mag;  // [n] y and sum |terms|
};

Host make_host(int n, int k, uint32_t seed) {
  Host h;
  h.n = n, h.k = k;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, 2);
  std::uniform_real_distribution<float> dd(0.01f, 0.05f);
  std::normal_distribution<float> nd(0.0f, 30.0f);
  h.w.resize(static_cast<size_t>(n) * static_cast<size_t>(k));
  for (auto& v : h.w) v = static_cast<int8_t>(code(rng) - 1);
  h.dn16.resize(static_cast<size_t>(n));
  for (auto& d : h.dn16) d = half_bits(dd(rng));
  h.q.resize(static_cast<size_t>(k));
  for (auto& v : h.q) v = static_cast<int8_t>(std::clamp(std::round(nd(rng)), -127.0f, 127.0f));
  h.q[static_cast<size_t>(k / 3)] = 127;  // BitLinear: the absmax element maps to 127
  h.s = 0.0213f;
  h.ds.resize(static_cast<size_t>((k + 31) / 32));
  for (size_t b = 0; b < h.ds.size(); ++b) {
    int sum = 0;
    for (size_t i = 32 * b; i < std::min(32 * b + 32, static_cast<size_t>(k)); ++i) sum += h.q[i];
    h.ds[b] = make_float2(h.s, h.s * static_cast<float>(sum));
  }
  h.ref.resize(static_cast<size_t>(n)), h.mag.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int8_t* wr = h.w.data() + static_cast<size_t>(r) * static_cast<size_t>(k);
    int64_t acc = 0, mag = 0;
    for (int i = 0; i < k; ++i) {
      const int t = wr[i] * h.q[static_cast<size_t>(i)];
      acc += t, mag += std::abs(t);
    }
    __half d;
    std::memcpy(&d, &h.dn16[static_cast<size_t>(r)], 2);
    const double sc = static_cast<double>(__half2float(d)) * static_cast<double>(h.s);
    h.ref[static_cast<size_t>(r)] = sc * static_cast<double>(acc);
    h.mag[static_cast<size_t>(r)] = sc * static_cast<double>(mag);
  }
  return h;
}

// Rows outside |y - ref| <= tol * sum|terms| (NaN counts as outside), and the largest |y - ref| / sum|terms|.
int count_bad(const Host& h, const std::vector<float>& y, double tol, double* max_err) {
  int bad = 0;
  double worst = 0.0;
  for (int r = 0; r < h.n; ++r) {
    const double e = std::fabs(static_cast<double>(y[static_cast<size_t>(r)]) - h.ref[static_cast<size_t>(r)]) /
                     std::max(h.mag[static_cast<size_t>(r)], 1e-30);
    if (!(e <= tol)) ++bad;
    if (!(e <= worst)) worst = e;
  }
  if (max_err) *max_err = worst;
  return bad;
}

// Tolerances relative to sum|terms| of a row: the BitLinear forms' integer sums are exact and two f32 products scale
// them (<= 2^-23 relative): 1e-6. The blk forms and src add f32 block terms (the tq2 sweep's limit): 1e-4. The bf16
// peer rounds d_n to bf16 (2^-9): 1e-2.
constexpr double kTolExact = 1e-6, kTolBlocks = 1e-4, kTolBf16 = 1e-2;
double tol_of(const Variant& v) { return v.blk ? kTolBlocks : kTolExact; }

// ---- --host-check: every variant's table layout, build and lookups emulated on the host against the reference ----

int host_check() {
  // k = 2603: a partial last group for G = 4 and G = 5 (3 columns each), rows padded to 16 bytes (651 -> 656 and
  // 521 -> 528 index bytes), 2-6 chunks, and lanes past the row in the last chunk; k = 2304 for the blk forms (whole
  // 256-blocks): 2-3 chunks, the last one part past the row.
  const Host a = make_host(70, 2603, 11), b = make_host(70, 2304, 12);
  const Packed pa4 = pack(4, a.w, a.dn16, a.n, a.k), pa5 = pack(5, a.w, a.dn16, a.n, a.k);
  const Packed pb4 = pack(4, b.w, b.dn16, b.n, b.k);
  int failures = 0;
  for (const Variant& v : variants()) {
    const Host& h = v.blk ? b : a;
    const Packed& p = v.blk ? pb4 : (v.g == 4 ? pa4 : pa5);
    std::vector<float> y;
    v.emulate(p, h.q, h.s, h.ds, y);
    double err = 0;
    const int bad = count_bad(h, y, tol_of(v), &err);
    std::printf("%-24s %4dx%-5d chunks %2d  table %6d B  max err %.2e  %s\n", v.name().c_str(), h.n, h.k,
                (p.groups + v.gc - 1) / v.gc, v.table_bytes, err, bad ? "FAIL" : "ok");
    if (bad) ++failures;
  }
  std::printf("host check: %d failures\n", failures);
  return failures ? 1 : 0;
}

// ---- The GPU run ----

struct DevPacked {
  std::vector<DeviceBuffer> idx;  // rotating copies
  DeviceBuffer dn, dw;
  int row_bytes = 0, groups = 0;
  uint64_t bytes = 0;  // one copy's weight bytes (indices and row scales)
};

int copies_for(uint64_t bytes, const cudaDeviceProp& prop) {
  return static_cast<int>(
      std::clamp<uint64_t>((4 * static_cast<uint64_t>(prop.l2CacheSize) + bytes - 1) / bytes, 1, 64));
}

DevPacked upload_packed(const Packed& p, const cudaDeviceProp& prop) {
  DevPacked d;
  d.row_bytes = p.row_bytes, d.groups = p.groups;
  d.bytes = p.idx.size() + 4 * p.dn.size();
  const int copies = copies_for(d.bytes, prop);
  for (int c = 0; c < copies; ++c) {
    d.idx.emplace_back(p.idx.size());
    d.idx.back().upload(p.idx.data(), p.idx.size());
  }
  d.dn = DeviceBuffer(4 * p.dn.size());
  d.dn.upload(p.dn.data(), d.dn.bytes());
  if (!p.dw.empty()) {
    d.dw = DeviceBuffer(2 * p.dw.size());
    d.dw.upload(p.dw.data(), d.dw.bytes());
  }
  return d;
}

std::vector<float> download_y(const float* y, int n, cudaStream_t st) {
  std::vector<float> v(static_cast<size_t>(n));
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(v.data(), y, sizeof(float) * static_cast<size_t>(n), cudaMemcpyDeviceToHost));
  return v;
}

struct Row {
  std::string kernel, config;
  double mb = 0, graph_us = 0, flushed_us = 0, err = 0;
  bool failed = false;
};

void print_row(const Row& r, double copy_gbps, double src_us, double bf_us) {
  if (r.failed) {
    std::printf("  %-24s %-22s FAIL (not timed; max err %.2e)\n", r.kernel.c_str(), r.config.c_str(), r.err);
    return;
  }
  const double gbps = r.mb * 1e6 / (r.graph_us * 1e-6) / 1e9;
  std::printf("  %-24s %-22s %8.2f %9.2f %8.0f %6.1f%% %10.2f %7.2fx %7.2fx %9.1e\n", r.kernel.c_str(),
              r.config.c_str(), r.mb, r.graph_us, gbps, 100.0 * gbps / copy_gbps, r.flushed_us, src_us / r.graph_us,
              bf_us / r.graph_us, r.err);
}

int run(int reps) {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB, shared memory per block (opt-in) %zu B\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, prop.sharedMemPerBlockOptin);
  const double copy_gbps = exp_common::copy_gbps(st, e0, e1);
  std::printf("copy %.0f GB/s; reps %d\n", copy_gbps, reps);
  std::printf(
      "MB: weight bytes a call reads (indices or codes, and scales); graph us: back-to-back PDL launches over "
      "rotating copies; GB/s, %%copy, vs src (src tq2_0 us / us) and vs bf16 (src bf16 us / us) from graph us; "
      "flushed us: L2 flushed before each call; max err: max |y - ref| / sum |terms| of a row\n");
  const char* out = std::getenv("OUT");
  std::FILE* tsv = std::fopen((std::string(out ? out : "/tmp") + "/ternary_lut.tsv").c_str(), "w");
  if (tsv) std::fprintf(tsv, "shape\tkernel\tconfig\tmb\tgraph_us\tflushed_us\tmax_err\tbad\n");
  const std::vector<Variant> vs = variants();
  for (const Variant& v : vs)
    if (static_cast<size_t>(v.table_bytes) <= prop.sharedMemPerBlockOptin)
      CK(cudaFuncSetAttribute(v.f, cudaFuncAttributeMaxDynamicSharedMemorySize, v.table_bytes));
  exp_common::FlushedTimer flushed(st, reps, static_cast<size_t>(prop.l2CacheSize));

  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {{"8B gate|up-style 4096->14336", 14336, 4096},
                          {"8B down 14336->4096", 4096, 14336},
                          {"8B o 4096->4096", 4096, 4096},
                          {"2B4T gate|up 2560->6912", 6912, 2560},
                          {"2B4T down 6912->2560", 2560, 6912},
                          {"2B4T o 2560->2560", 2560, 2560}};
  int failures = 0;
  std::vector<std::string> summary;
  uint32_t seed = 100;
  for (const Shape& sh : shapes) {
    const int n = sh.n, k = sh.k;
    const Host h = make_host(n, k, seed++);
    // src's tq2_0: the GGUF blocks (64 code bytes, fp16 d) of the same w and d_n.
    const int nsb = k / 256;
    std::vector<uint8_t> blocks(static_cast<size_t>(n) * static_cast<size_t>(nsb) * 66, 0);
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < nsb; ++b) {
        uint8_t* blk =
            blocks.data() + (static_cast<size_t>(r) * static_cast<size_t>(nsb) + static_cast<size_t>(b)) * 66;
        for (int e = 0; e < 256; ++e) {
          const int c = h.w[static_cast<size_t>(r) * static_cast<size_t>(k) + static_cast<size_t>(b * 256 + e)] + 1;
          blk[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(c << (2 * ((e % 128) / 32)));
        }
        std::memcpy(blk + 64, &h.dn16[static_cast<size_t>(r)], 2);
      }
    std::vector<DeviceWeight> tq;
    tq.push_back(upload_weight(DType::TQ2_0, blocks.data(), n, k));
    const uint64_t tq_bytes = tq[0].bytes();
    for (int c = 1; c < copies_for(tq_bytes, prop); ++c) tq.push_back(upload_weight(DType::TQ2_0, blocks.data(), n, k));
    // The bf16 peer: w * d_n rounded to bf16.
    const uint64_t bf_bytes = static_cast<uint64_t>(n) * static_cast<uint64_t>(k) * 2;
    std::vector<DeviceWeight> bw(static_cast<size_t>(copies_for(bf_bytes, prop)));
    {
      std::vector<__nv_bfloat16> hb(static_cast<size_t>(n) * static_cast<size_t>(k));
      for (int r = 0; r < n; ++r) {
        __half d;
        std::memcpy(&d, &h.dn16[static_cast<size_t>(r)], 2);
        const float dn = __half2float(d);
        for (int i = 0; i < k; ++i) {
          const size_t j = static_cast<size_t>(r) * static_cast<size_t>(k) + static_cast<size_t>(i);
          hb[j] = __float2bfloat16(dn * static_cast<float>(h.w[j]));
        }
      }
      for (auto& w : bw) {
        w.dtype = DType::BF16, w.n = n, w.k = k, w.layout = GemvLayout::ROWS;
        w.quants = DeviceBuffer(bf_bytes);
        w.quants.upload(hb.data(), bf_bytes);
      }
    }
    const Packed p4 = pack(4, h.w, h.dn16, n, k), p5 = pack(5, h.w, h.dn16, n, k);
    const DevPacked d4 = upload_packed(p4, prop), d5 = upload_packed(p5, prop);
    // The activation: q8 and src's blocks, the f32 x = q s for the bf16 peer, and s.
    std::vector<float> xf(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i) xf[static_cast<size_t>(i)] = static_cast<float>(h.q[static_cast<size_t>(i)]) * h.s;
    DeviceBuffer xq(static_cast<size_t>(k)), xds(sizeof(float2) * h.ds.size()), xfd(4 * static_cast<size_t>(k)), xs(4),
        y(4 * static_cast<size_t>(n));
    xq.upload(h.q.data(), xq.bytes());
    xds.upload(h.ds.data(), xds.bytes());
    xfd.upload(xf.data(), xfd.bytes());
    xs.upload(&h.s, 4);
    const int max_chunks = (p4.groups + 127) / 128 + 1, max_tiles = (n + 63) / 64;
    DeviceBuffer part(4 * static_cast<size_t>(max_chunks) * static_cast<size_t>(n)),
        count(4 * static_cast<size_t>(max_tiles));
    GemvInput in;
    in.f32 = xfd.as<float>(), in.q8 = xq.as<int8_t>(), in.q8_ds = xds.as<float2>();
    float* yp = y.as<float>();

    std::printf("\n== %s: n %d, k %d ==\n", sh.name, n, k);
    std::printf("  %-24s %-22s %8s %9s %8s %7s %10s %8s %8s %9s\n", "kernel", "config", "MB", "graph us", "GB/s",
                "%copy", "flushed us", "vs src", "vs bf16", "max err");
    auto record = [&](const Row& r, int bad) {
      if (tsv)
        std::fprintf(tsv, "%dx%d\t%s\t%s\t%.3f\t%.3f\t%.3f\t%.2e\t%d\n", n, k, r.kernel.c_str(), r.config.c_str(), r.mb,
                     r.graph_us, r.flushed_us, r.err, bad);
    };
    // src's bf16 GEMV and src's tq2_0 GEMV, default launch shapes.
    Row bf{"src bf16", "", static_cast<double>(bf_bytes) / 1e6},
        src{"src tq2_0", "", static_cast<double>(tq_bytes) / 1e6};
    // One of src's GEMVs at its default launch shape: checked, then timed over the rotating copies `ws`.
    auto time_src = [&](Row& row, const std::vector<DeviceWeight>& ws, DType dtype, double tol) {
      const GemvConfig c = gemv_default_config(dtype, n, k);
      char cfg[64];
      std::snprintf(cfg, sizeof cfg, "%d/%d/%d%s", c.threads, c.rows, c.unroll, c.stationary ? " stationary" : "");
      row.config = cfg;
      CK(cudaMemsetAsync(yp, 0xFF, y.bytes(), st));  // on st: fill_bytes is on the legacy stream
      gemv(ws[0], in, yp, st, &c);
      const int bad = count_bad(h, download_y(yp, n, st), tol, &row.err);
      if (bad) {
        row.failed = true, ++failures;
      } else {
        row.graph_us = exp_common::graph_us(st, e0, e1, std::max(static_cast<int>(ws.size()), 10), reps, [&](int i) {
          gemv(ws[static_cast<size_t>(i) % ws.size()], in, yp, st, &c);
        });
        row.flushed_us = flushed.us([&] { gemv(ws[0], in, yp, st, &c); });
      }
      record(row, bad);
    };
    time_src(bf, bw, DType::BF16, kTolBf16);
    time_src(src, tq, DType::TQ2_0, kTolBlocks);
    const double src_us = src.failed ? 0.0 : src.graph_us, bf_us = bf.failed ? 0.0 : bf.graph_us;
    print_row(bf, copy_gbps, src_us, bf_us);
    print_row(src, copy_gbps, src_us, bf_us);

    double best_us = 1e30;
    std::string best_name;
    for (const Variant& v : vs) {
      if (static_cast<size_t>(v.table_bytes) > prop.sharedMemPerBlockOptin) continue;
      if (v.blk && k % 256 != 0) continue;
      const DevPacked& d = v.g == 4 ? d4 : d5;
      const int chunks = (d.groups + v.gc - 1) / v.gc;
      const double mb =
          static_cast<double>(v.blk ? d.bytes - 4 * static_cast<uint64_t>(n) + d.dw.bytes() : d.bytes) / 1e6;
      Row best{v.name(), "", mb};
      best.graph_us = 1e30;
      int best_rb = 0;
      bool any = false;
      // Variant v over weight copy `copy` with rb rows a block: the timed launches and the flushed one alike.
      const auto launch_rb = [&](int copy, int rb) {
        const int tiles = (n + rb - 1) / rb;
        LutArgs la{d.idx[static_cast<size_t>(copy) % d.idx.size()].as<uint8_t>(),
                   d.dn.as<float>(),
                   d.dw.as<uint16_t>(),
                   xq.as<int8_t>(),
                   xds.as<float2>(),
                   xs.as<float>(),
                   yp,
                   part.as<float>(),
                   count.as<unsigned>(),
                   n,
                   k,
                   d.row_bytes,
                   chunks,
                   rb};
        exp_common::launch_pdl(v.f, dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(tiles)),
                               dim3(32 * static_cast<unsigned>(v.nw)), static_cast<size_t>(v.table_bytes), st, la);
      };
      for (int rb : kRowsPerBlock) {
        if (rb % (v.nw * v.r) != 0 || (rb > n && rb != kRowsPerBlock[0])) continue;
        const int tiles = (n + rb - 1) / rb;
        auto launch = [&](int copy) { launch_rb(copy, rb); };
        char cfg[64];
        std::snprintf(cfg, sizeof cfg, "rb%d grid %dx%d", rb, chunks, tiles);
        CK(cudaMemsetAsync(count.get(), 0, count.bytes(), st));
        CK(cudaMemsetAsync(yp, 0xFF, y.bytes(), st));  // on st: fill_bytes is on the legacy stream
        launch(0);
        CK(cudaGetLastError());
        Row r{v.name(), cfg, mb};
        const int bad = count_bad(h, download_y(yp, n, st), tol_of(v), &r.err);
        if (bad) {
          ++failures, r.failed = true;
          std::printf("  FAIL %s %s: %d of %d rows (max err %.2e)\n", r.kernel.c_str(), cfg, bad, n, r.err);
          record(r, bad);
          continue;
        }
        r.graph_us = exp_common::graph_us(st, e0, e1, std::max(static_cast<int>(d.idx.size()), 10), reps, launch);
        record(r, 0);
        any = true;
        if (r.graph_us < best.graph_us) best = r, best_rb = rb;
      }
      if (!any) continue;
      best.flushed_us = flushed.us([&] { launch_rb(0, best_rb); });  // the best rows_per_block, launched the same way
      print_row(best, copy_gbps, src_us, bf_us);
      if (best.graph_us < best_us) best_us = best.graph_us, best_name = best.kernel + " " + best.config;
    }
    char line[512];
    std::snprintf(line, sizeof line,
                  "%5dx%-5d bf16 %7.2f us | src tq2_0 %6.2f us | best lut %s %6.2f us: %.2fx src, %.2fx bf16", n, k,
                  bf_us, src_us, best_name.c_str(), best_us, src_us / best_us, bf_us / best_us);
    summary.push_back(line);
    std::fflush(stdout);
  }
  return exp_common::finish_sweep(tsv, copy_gbps, "vs = src us / lut us, graph timing", failures, summary);
}

}  // namespace ternary_lut

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--host-check") == 0) return ternary_lut::host_check();
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 15;
  const int rc = ternary_lut::host_check();  // cheap (milliseconds); a layout bug shows before any GPU time
  if (rc != 0) return rc;
  return ternary_lut::run(reps);
}
