// Sparse ternary GEMV for TEAL (issue 23: "the ternary format when it exists") against Tessera's dense TQ2_0 kernel
// (matmul_ternary_x86.h) on the same zeroed input, decode (T = 1), one thread, AVX-512 (VNNI + VBMI + VBMI2).
// Run: build/bin/tessera_bench_kernels --benchmark_filter='ternary_sparse/'
//
// Under TEAL the CPU runs tq2_0 weights with the dense kernel on the zeroed input (docs/TEAL.md "q4_K and the ternary
// formats": converted to q4_1's sparse copy they read 20 bytes per 32 weights against 8 and lost). This is the list
// walk written for the 2-bit codes themselves, measured here (figures: docs/TEAL.md):
// - weights: repacked once from TQ2_0 (outside the timing) into tiles of 128 rows, channel-major: per tile and input
//   channel c a 32-byte piece holding the 128 rows' codes u = w / d + 1 four to a byte (byte b = 16 m + i, field f at
//   bits 2f: row 16 (4 m + f) + i); the rows' fp16 d per (tile, 256-channel block), 128 of them in row order.
//   Same bits per weight as TQ2_0 (2 + 16 / 256).
// - activations: Tessera's 8-bit blocks of 32 (quantize_act_avx2, as cpu::matmul does; a zeroed channel stays 0).
//   Per call the list is built from them (AVX-512 VBMI2 compress, no per-channel branch): per 32-block with a nonzero
//   code, its nonzero channels in groups of four (the last padded with x = 0), each group as four piece offsets and
//   the four int8 activations as one int32; per 256-block the dense kernel's xs, summed in its order.
// - kernel, per tile and group of four surviving channels of one 32-block: two 32-byte loads and two inserts make
//   [c0 | c1] and [c2 | c3], two vpermt2b transpose them into (c0, c1, c2, c3) dword lanes (4 rows of each channel per
//   dword: 2 x 64 rows), then per field f one vpandd (keeps u << 2f, at most 2 << 6 = 128: an unsigned byte) and one
//   vpdpbusd against the broadcast int32 of the 4 activations: 8 int32 accumulators of 16 rows. Per 32-block the sums
//   are converted and multiplied by xd / 4^f (exact: a power of two), per 256-block the rows' d applies to (part - xs)
//   as the dense kernel does, in the same order and with the same roundings, so the floats equal the dense kernel's
//   bit for bit (a skipped 32-block adds 0 there).
// Instruction count per group and tile (512 weights): 2 loads, 2 vinserti64x4, 2 vpermt2b, 1 vpbroadcastd, 8 vpandd,
// 8 vpdpbusd (23 vector instructions, 2.9 per 64 weights; the dense kernel spends about 3.5 per 64), plus 4 scalar
// offset loads; padding the last group of each block costs 1-3 channels of work.
// Variants: "sparse" as above; "sparse_pf" also prefetches the next tile's pieces of the same channels (the list is
// the same for every tile) and the first tile's after the list build; "sparse_line_pf" keeps two tiles' pieces of a
// channel in one 64-byte line (a zero channel skips a whole line; the second tile's pass finds the lines in L2).
// Zeros: a random round(s k) channels (fixed seed) for s = 25, 40, 50, 65, 80%, and s = 0 as a control (the walk over
// every channel: what the layout alone does against the dense kernel). Both timings include the activation
// quantization; the walk's includes the list build. "cold" cycles 128 MiB of copies of each form, "warm" reuses one.
// Before timing: the integer block sums (the kernel with a store of each (row, block) sum) bit-exactly against a
// scalar sum_e u_e q_e, the floats against a double-precision reference from the same codes and int8 x (max |diff| /
// max |ref| <= 1e-6: float sums of k / 32 products) and against src's dense kernel on the same zeroed x (expected 0).
// Outcome (2026-11-27, docs/TEAL.md "q4_K and the ternary formats"): warm it wins by compute (1.2-1.6x at 50%), cold
// skipping pays only from about 65% (lines read at random come slower than the walk's full stream), and at 25-50% the
// cold gains on the 8B shapes are the 0% control's (the layout streams faster than the dense kernel), so not in src/.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/matmul_internal.h"
#include "bench_util.h"
#include "core/error.h"
#include "core/large_alloc.h"
#include "quant/format_traits.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::bench {
namespace {

constexpr int kTile = 128;                            // rows per tile: 8 int32 accumulators of 16 rows
constexpr int kPiece = kTile / 4;                     // bytes of codes per channel and tile
constexpr uint64_t kColdBytes = uint64_t{128} << 20;  // as bench_matmul.cpp: 4x the 32 MiB L3

// Tile row of byte b, field f.
constexpr int tile_row(int b, int f) { return 16 * (4 * (b / 16) + f) + b % 16; }

// The channel-major copy: codes, then [tiles][k / 256][128] fp16 d (rows past n: code 0, d = 0). stride 32: codes
// [tiles][k][32]; stride 64 ("line" layout): [tiles / 2][k][2][32], the pieces of tiles 2 p and 2 p + 1 of one channel
// in one 64-byte line, so a zero channel skips a whole line (the kernel still walks 128 rows a pass, and the second
// pass finds the lines in L2).
struct SparseTq {
  int64_t n = 0, k = 0, tiles = 0;
  int stride = kPiece;  // bytes from one channel's piece to the next channel's
  uint64_t code_bytes = 0, bytes = 0;
  int64_t pieces_per_line() const { return stride / kPiece; }
  // Tile t's piece of channel 0.
  const uint8_t* tile_base(int64_t t) const {
    return codes() + (t / pieces_per_line()) * k * stride + (t % pieces_per_line()) * kPiece;
  }
  std::shared_ptr<void> mem;
  const uint8_t* codes() const { return static_cast<const uint8_t*>(mem.get()); }
  const uint16_t* d() const { return reinterpret_cast<const uint16_t*>(codes() + code_bytes); }
};

SparseTq sparse_pack(const std::vector<uint8_t>& tq2, int64_t n, int64_t k, int stride) {
  SparseTq w;
  w.n = n;
  w.k = k;
  w.stride = stride;
  w.tiles = (n + kTile - 1) / kTile;
  const int64_t kb = k / 256, ppl = w.pieces_per_line();
  w.tiles = (w.tiles + ppl - 1) / ppl * ppl;
  w.code_bytes = static_cast<uint64_t>(w.tiles * k * kPiece);
  w.bytes = w.code_bytes + static_cast<uint64_t>(w.tiles * kb * kTile) * 2;
  w.mem = allocate_large(w.bytes);
  std::memset(w.mem.get(), 0, w.bytes);
  auto* codes = static_cast<uint8_t*>(w.mem.get());
  auto* d = reinterpret_cast<uint16_t*>(codes + w.code_bytes);
  int byte_of[kTile], field_of[kTile];
  for (int b = 0; b < kPiece; ++b)
    for (int f = 0; f < 4; ++f) {
      byte_of[tile_row(b, f)] = b;
      field_of[tile_row(b, f)] = f;
    }
  const auto* blocks = reinterpret_cast<const BlockTQ2_0*>(tq2.data());
  for (int64_t row = 0; row < n; ++row) {
    const int64_t t = row / kTile;
    const int r = static_cast<int>(row % kTile);
    for (int64_t e = 0; e < k; ++e) {
      const int u = format_detail::k_quant_2bit(blocks[row * kb + e / 256].qs, static_cast<int>(e % 256));
      codes[(t / ppl) * k * stride + e * stride + (t % ppl) * kPiece + byte_of[r]] |=
          static_cast<uint8_t>(u << (2 * field_of[r]));
    }
    for (int64_t b = 0; b < kb; ++b) d[(t * kb + b) * kTile + r] = blocks[row * kb + b].d;
  }
  return w;
}

SparseTq sparse_copy(const SparseTq& w) {
  SparseTq c = w;
  c.mem = allocate_large(w.bytes);
  std::memcpy(c.mem.get(), w.mem.get(), w.bytes);
  return c;
}

// One call's list of surviving channels, built from the quantized x. Buffers sized once for the worst case.
struct SparseList {
  int64_t n_blocks = 0, n_quads = 0;
  std::vector<int32_t> sb_begin;    // [k / 256 + 1]: first nonzero block of each 256-block
  std::vector<int32_t> quad_begin;  // [nonzero blocks + 1]
  std::vector<uint32_t> off;        // [quads][4] byte offsets of the channels' pieces in a tile (+ 16 slack)
  std::vector<int8_t> xq4;          // [quads][4] their activations (+ 32 slack)
  std::vector<float> xdf;           // [nonzero blocks][4]: xd / 4^f
  std::vector<float> xs;            // [k / 256]: the dense kernel's xs
  std::vector<int32_t> blk;         // [nonzero blocks]: the 32-block (for the integer check)
  explicit SparseList(int64_t k)
      : sb_begin(static_cast<size_t>(k / 256 + 1)),
        quad_begin(static_cast<size_t>(k / 32 + 1)),
        off(static_cast<size_t>(k + 16), 0),
        xq4(static_cast<size_t>(k + 64), 0),
        xdf(static_cast<size_t>(k / 8)),
        xs(static_cast<size_t>(k / 256)),
        blk(static_cast<size_t>(k / 32)) {}
};

#define TESSERA_SPARSE_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vbmi2,avx512vnni,avx2,fma,f16c,popcnt")))

// xd sums and the per-block scalars follow the dense kernel (tq_gemv32): xs += s per 32-block, in order, from 0.
// stride: the weight's (the offsets are c * stride).
TESSERA_SPARSE_TARGET void build_list(const cpu::detail::BlockQ8A* xq, int64_t k, int stride, SparseList& l) {
  const int64_t kb = k / 256;
  int64_t nb = 0, nq = 0;
  const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(stride));
  for (int64_t sb = 0; sb < kb; ++sb) {
    l.sb_begin[static_cast<size_t>(sb)] = static_cast<int32_t>(nb);
    float xs = 0.0f;
    for (int64_t j = 8 * sb; j < 8 * sb + 8; ++j) {
      const cpu::detail::BlockQ8A& b = xq[j];
      xs += b.s;
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
      const __mmask32 m = _mm256_test_epi8_mask(q, q);
      if (m == 0) continue;
      const int cnt = __builtin_popcount(m), lo = __builtin_popcount(m & 0xFFFF);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(l.xq4.data() + 4 * nq), _mm256_maskz_compress_epi8(m, q));
      const __m512i o0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(32 * j * stride)), step);
      const __m512i o1 = _mm512_add_epi32(o0, _mm512_set1_epi32(16 * stride));
      uint32_t* o = l.off.data() + 4 * nq;
      _mm512_storeu_si512(o, _mm512_maskz_compress_epi32(static_cast<__mmask16>(m), o0));
      _mm512_storeu_si512(o + lo, _mm512_maskz_compress_epi32(static_cast<__mmask16>(m >> 16), o1));
      // Padding slots past cnt keep an offset of an earlier call or 0 (all in range); their x bytes are 0.
      const float xd = b.d;
      float* f = l.xdf.data() + 4 * nb;
      f[0] = xd;
      f[1] = xd * 0.25f;
      f[2] = xd * 0.0625f;
      f[3] = xd * 0.015625f;
      l.blk[static_cast<size_t>(nb)] = static_cast<int32_t>(j);
      l.quad_begin[static_cast<size_t>(nb)] = static_cast<int32_t>(nq);
      nq += (cnt + 3) / 4;
      ++nb;
    }
    l.xs[static_cast<size_t>(sb)] = xs;
  }
  l.sb_begin[static_cast<size_t>(kb)] = static_cast<int32_t>(nb);
  l.quad_begin[static_cast<size_t>(nb)] = static_cast<int32_t>(nq);
  l.n_blocks = nb;
  l.n_quads = nq;
}

// vpermt2b indices: [c0 | c1] (table 1) and [c2 | c3] (table 2) to dwords (c0, c1, c2, c3)[b], b = 16 m + lane.
TESSERA_SPARSE_TARGET inline __m512i transpose_index(int m) {
  alignas(64) uint8_t idx[64];
  for (int i = 0; i < 16; ++i) {
    const int b = 16 * m + i;
    idx[4 * i + 0] = static_cast<uint8_t>(b);
    idx[4 * i + 1] = static_cast<uint8_t>(32 + b);
    idx[4 * i + 2] = static_cast<uint8_t>(64 + b);
    idx[4 * i + 3] = static_cast<uint8_t>(96 + b);
  }
  return _mm512_load_si512(idx);
}

// One tile (rows 128 t ..): y[128] (the tile's rows in order). kInts: also store each (row, 32-block) integer sum
// sum_e u_e q_e to ints[row][k / 32] (the checked path). kPrefetch: prefetch the next tile's pieces of the same
// channels (the list is the same for every tile) while walking this one; in the line layout the first of a line's
// two tiles prefetches the next pair's lines and the second none.
template <bool kInts, bool kPrefetch>
TESSERA_SPARSE_TARGET void sparse_tile(const SparseTq& w, const SparseList& l, float* y, int64_t t, int32_t* ints) {
  const int64_t k = w.k, kb = k / 256, ppl = w.pieces_per_line();
  const uint8_t* base = w.tile_base(t);
  const uint16_t* dt = w.d();
  const bool prefetch = kPrefetch && t % ppl == 0 && t + ppl < w.tiles;
  const uint8_t* next = prefetch ? w.tile_base(t + ppl) : base;
  const __m512i idx0 = transpose_index(0), idx1 = transpose_index(1);
  const __m512i mask[4] = {_mm512_set1_epi8(0x03), _mm512_set1_epi8(0x0C), _mm512_set1_epi8(0x30),
                           _mm512_set1_epi8(static_cast<char>(0xC0))};
  for (int a = 0; a < 8; ++a) _mm512_storeu_ps(y + 16 * a, _mm512_setzero_ps());
  for (int64_t sb = 0; sb < kb; ++sb) {
    const int32_t b0 = l.sb_begin[static_cast<size_t>(sb)], b1 = l.sb_begin[static_cast<size_t>(sb + 1)];
    if (b0 == b1) continue;  // every activation of the 256-block is 0: the dense kernel adds d * (0 - 0)
    __m512 part[8];
    for (int a = 0; a < 8; ++a) part[a] = _mm512_setzero_ps();
    for (int32_t bi = b0; bi < b1; ++bi) {
      __m512i acc[8];
      for (int a = 0; a < 8; ++a) acc[a] = _mm512_setzero_si512();
      const int32_t q1 = l.quad_begin[static_cast<size_t>(bi + 1)];
      for (int32_t g = l.quad_begin[static_cast<size_t>(bi)]; g < q1; ++g) {
        const uint32_t* o = l.off.data() + 4 * g;
        if (kPrefetch && prefetch)
          for (int c = 0; c < 4; ++c) _mm_prefetch(reinterpret_cast<const char*>(next + o[c]), _MM_HINT_T0);
        const __m512i a01 = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + o[0]))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + o[1])), 1);
        const __m512i a23 = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + o[2]))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + o[3])), 1);
        const __m512i t0 = _mm512_permutex2var_epi8(a01, idx0, a23);
        const __m512i t1 = _mm512_permutex2var_epi8(a01, idx1, a23);
        int32_t xv32;
        std::memcpy(&xv32, l.xq4.data() + 4 * g, 4);
        const __m512i xv = _mm512_set1_epi32(xv32);
        // vpdpbusd in inline asm: GCC 12 otherwise copies each accumulator through a second register and spills xv.
        for (int f = 0; f < 4; ++f) {
          const __m512i u0 = _mm512_and_si512(t0, mask[f]), u1 = _mm512_and_si512(t1, mask[f]);
          __asm__("vpdpbusd %[x], %[u], %[s]" : [s] "+v"(acc[f]) : [u] "v"(u0), [x] "v"(xv));
          __asm__("vpdpbusd %[x], %[u], %[s]" : [s] "+v"(acc[4 + f]) : [u] "v"(u1), [x] "v"(xv));
        }
      }
      const float* xdf = l.xdf.data() + 4 * bi;
      for (int a = 0; a < 8; ++a)
        part[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[a]), _mm512_set1_ps(xdf[a % 4]), part[a]);
      if constexpr (kInts) {
        const int64_t blk = l.blk[static_cast<size_t>(bi)];
        for (int a = 0; a < 8; ++a) {
          alignas(64) int32_t s[16];
          _mm512_store_si512(s, acc[a]);
          for (int i = 0; i < 16; ++i) {
            const int64_t row = t * kTile + 16 * a + i;
            if (row < w.n) ints[row * (k / 32) + blk] = s[i] >> (2 * (a % 4));  // exact: s = 4^f sum
          }
        }
      }
    }
    const __m512 xs = _mm512_set1_ps(l.xs[static_cast<size_t>(sb)]);
    const uint16_t* d = dt + (t * kb + sb) * kTile;
    for (int a = 0; a < 8; ++a) {
      const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + 16 * a)));
      _mm512_storeu_ps(y + 16 * a, _mm512_fmadd_ps(dv, _mm512_sub_ps(part[a], xs), _mm512_loadu_ps(y + 16 * a)));
    }
  }
}

// y: [tiles * 128] (rows past n are written, 0). xq: scratch [k / 32].
template <bool kInts, bool kPrefetch>
void sparse_gemv(const SparseTq& w, const float* x, cpu::detail::BlockQ8A* xq, SparseList& l, float* y,
                 int32_t* ints = nullptr) {
  cpu::detail::quantize_act_avx2(x, xq, w.k);
  build_list(xq, w.k, w.stride, l);
  if constexpr (kPrefetch) {
    // The first tile's pieces, which no earlier tile prefetches (a small matrix has only 2-6 tiles).
    const uint8_t* base = w.tile_base(0);
    for (int64_t i = 0; i < 4 * l.n_quads; ++i)
      _mm_prefetch(reinterpret_cast<const char*>(base + l.off[static_cast<size_t>(i)]), _MM_HINT_T0);
  }
  for (int64_t t = 0; t < w.tiles; ++t) sparse_tile<kInts, kPrefetch>(w, l, y + t * kTile, t, ints);
}

// TEAL's zeros: a random set of round(s k) channels set to 0 (fixed seed).
std::vector<float> zeroed_input(const std::vector<float>& x, int pct) {
  std::vector<float> z = x;
  std::vector<int64_t> ch(z.size());
  std::iota(ch.begin(), ch.end(), 0);
  std::mt19937 rng(1234 + static_cast<uint32_t>(pct));
  std::shuffle(ch.begin(), ch.end(), rng);
  const size_t zeros = static_cast<size_t>(std::llround(static_cast<double>(pct) / 100.0 * z.size()));
  for (size_t i = 0; i < zeros; ++i) z[static_cast<size_t>(ch[i])] = 0.0f;
  return z;
}

// One shape's data, kept across its benchmarks (registered grouped by shape) with the cold copies made on demand.
struct Case {
  int64_t n = 0, k = 0;
  Tq2Case c;
  std::vector<cpu::PackedWeight> dense;                  // [copies]
  std::vector<SparseTq> sparse[2];                       // [layout: stride 32, 64][copies]
  std::map<int, std::map<std::string, double>> checked;  // per sparsity: the checks' counters (they passed)
};

Case& get_case(int64_t n, int64_t k, size_t copies) {
  static Case cs;
  if (cs.n != n || cs.k != k) {
    cs = Case{};
    cs.n = n;
    cs.k = k;
    cs.c = make_tq2_case(n, k);
  }
  while (cs.dense.size() < copies) cs.dense.push_back(cpu::prepare_weight(DType::TQ2_0, cs.c.tq2.data(), n, k));
  for (int lay = 0; lay < 2; ++lay) {
    std::vector<SparseTq>& v = cs.sparse[lay];
    if (v.empty()) v.push_back(sparse_pack(cs.c.tq2, n, k, kPiece << lay));
    while (v.size() < copies) v.push_back(sparse_copy(v.front()));
  }
  return cs;
}

// The checks before timing, of both layouts; an empty string when they pass, else why not. Counters: int_mismatch
// (integer block sums against the scalar reference), ref_rel_diff (max |y - ref| / max |ref|, ref in double from the
// same codes and int8 x), dense_max_abs_diff (against src's dense kernel on the same zeroed x, every timed variant),
// q_zero_frac (channels whose 8-bit activation is 0). Tolerance against the double reference: 1e-6 of its max, from
// float's 2^-24 over the kernel's sums (8 fmadds of a 256-block, then k / 256 fmadds; measured 1-2e-7).
std::string check(Case& cs, const std::vector<float>& xz, std::map<std::string, double>& counters) {
  const int64_t n = cs.n, k = cs.k, kb = k / 256;
  std::vector<cpu::detail::BlockQ8A> xq(static_cast<size_t>(k / 32));
  cpu::detail::quantize_act_avx2(xz.data(), xq.data(), k);
  const auto* blocks = reinterpret_cast<const BlockTQ2_0*>(cs.c.tq2.data());
  std::vector<int32_t> ref_ints(static_cast<size_t>(n * (k / 32)));
  std::vector<double> ref(static_cast<size_t>(n));
  double rmax = 0;
  for (int64_t row = 0; row < n; ++row) {
    double yr = 0;
    for (int64_t sb = 0; sb < kb; ++sb) {
      double part = 0, xs = 0;
      for (int64_t j = 8 * sb; j < 8 * sb + 8; ++j) {
        const cpu::detail::BlockQ8A& xb = xq[static_cast<size_t>(j)];
        int32_t s = 0;
        for (int64_t e = 32 * j; e < 32 * j + 32; ++e)
          s += format_detail::k_quant_2bit(blocks[row * kb + sb].qs, static_cast<int>(e % 256)) * xb.qs[e % 32];
        ref_ints[static_cast<size_t>(row * (k / 32) + j)] = s;
        part += static_cast<double>(xb.d) * s;
        xs += xb.s;
      }
      yr += static_cast<double>(fp16_to_f32(blocks[row * kb + sb].d)) * (part - xs);
    }
    ref[static_cast<size_t>(row)] = yr;
    rmax = std::max(rmax, std::fabs(yr));
  }
  std::vector<float> yd(static_cast<size_t>(n));
  cpu::matmul(pool(1), cs.dense.front(), xz.data(), yd.data(), 1);
  int64_t bad = 0, nonzero = 0;
  for (int64_t e = 0; e < k; ++e) nonzero += xq[static_cast<size_t>(e / 32)].qs[e % 32] != 0;
  double emax = 0, dmax = 0;
  for (int lay = 0; lay < 2; ++lay) {
    const SparseTq& w = cs.sparse[lay].front();
    SparseList l(k);
    std::vector<float> y(static_cast<size_t>(w.tiles * kTile));
    std::vector<int32_t> ints(static_cast<size_t>(n * (k / 32)), 0);
    sparse_gemv<true, false>(w, xz.data(), xq.data(), l, y.data(), ints.data());
    for (size_t i = 0; i < ints.size(); ++i) bad += ints[i] != ref_ints[i];
    for (int64_t row = 0; row < n; ++row)
      emax = std::max(emax, std::fabs(ref[static_cast<size_t>(row)] - y[static_cast<size_t>(row)]));
    for (int pf = 0; pf < 2; ++pf) {
      std::fill(y.begin(), y.end(), NAN);
      if (pf)
        sparse_gemv<false, true>(w, xz.data(), xq.data(), l, y.data());
      else
        sparse_gemv<false, false>(w, xz.data(), xq.data(), l, y.data());
      for (int64_t row = 0; row < n; ++row) {
        const double diff = std::fabs(static_cast<double>(yd[static_cast<size_t>(row)]) - y[static_cast<size_t>(row)]);
        dmax = std::isnan(diff) ? INFINITY : std::max(dmax, diff);
      }
    }
  }
  counters["int_mismatch"] = static_cast<double>(bad);
  counters["ref_rel_diff"] = emax / rmax;
  counters["dense_max_abs_diff"] = dmax;
  counters["q_zero_frac"] = 1.0 - static_cast<double>(nonzero) / static_cast<double>(k);
  if (bad != 0) return "integer block sums differ from the scalar reference";
  if (!(emax <= 1e-6 * rmax)) return "floats differ from the double reference by more than 1e-6 of its max";
  if (!(dmax <= 1e-6 * rmax)) return "floats differ from the dense kernel's";
  return "";
}

// impl: 0 src's dense kernel (cpu::matmul, AVX-512 VNNI); 1, 2 the sparse walk on 32-byte pieces without and with the
// prefetch; 3, 4 the same on the line layout (3 is not registered: without the prefetch it lost to 4 everywhere).
void bm_sparse(benchmark::State& state, int64_t n, int64_t k, int pct, bool warm, int impl) {
  if (!cpu::isa_supported(cpu::Isa::AVX512_VNNI) || !__builtin_cpu_supports("avx512vbmi") ||
      !__builtin_cpu_supports("avx512vbmi2"))
    return state.SkipWithError("needs AVX-512 VNNI, VBMI and VBMI2");
  const cpu::Isa before = cpu::active_isa();
  cpu::set_active_isa(cpu::Isa::AVX512_VNNI);
  const uint64_t bytes = *dtype_row_bytes(DType::TQ2_0, static_cast<uint64_t>(k)) * static_cast<uint64_t>(n);
  const size_t copies = warm ? 1 : static_cast<size_t>(std::max<uint64_t>(1, (kColdBytes + bytes - 1) / bytes));
  Case& cs = get_case(n, k, copies);
  const std::vector<float> xz = zeroed_input(cs.c.x, pct);
  if (impl != 0 && !cs.checked.count(pct)) {
    std::map<std::string, double> counters;
    const std::string why = check(cs, xz, counters);
    if (!why.empty()) {
      cpu::set_active_isa(before);
      return state.SkipWithError(why.c_str());
    }
    cs.checked[pct] = counters;
  }
  if (impl != 0)
    for (const auto& [name, v] : cs.checked[pct]) state.counters[name] = v;
  std::vector<cpu::detail::BlockQ8A> xq(static_cast<size_t>(k / 32));
  SparseList l(k);
  const int lay = impl >= 3 ? 1 : 0;
  const bool pf = impl == 2 || impl == 4;
  std::vector<float> y(static_cast<size_t>(cs.sparse[lay].front().tiles * kTile));
  size_t i = 0;
  for (auto _ : state) {
    if (impl == 0)
      cpu::matmul(pool(1), cs.dense[i], xz.data(), y.data(), 1);
    else if (pf)
      sparse_gemv<false, true>(cs.sparse[lay][i], xz.data(), xq.data(), l, y.data());
    else
      sparse_gemv<false, false>(cs.sparse[lay][i], xz.data(), xq.data(), l, y.data());
    benchmark::DoNotOptimize(y.data());
    i = i + 1 == copies ? 0 : i + 1;
  }
  if (impl != 0) state.counters["groups_per_block"] = static_cast<double>(l.n_quads) / static_cast<double>(k / 32);
  // The dense form's bytes per call for every variant: a rate comparable across them, not the bytes the walk read.
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  cpu::set_active_isa(before);
}

int register_sparse() {
  const int64_t shapes[][2] = {{576, 1536},   {576, 768},    {192, 768},   {1536, 768}, {4096, 4096},
                               {14336, 4096}, {4096, 14336}, {6912, 2560}, {2560, 6912}};
  const char* names[] = {"dense", "sparse", "sparse_pf", "sparse_line", "sparse_line_pf"};
  for (const auto& s : shapes)
    for (int pct : {0, 25, 40, 50, 65, 80})  // 0: the walk over every channel, a control for the layout alone
      for (bool warm : {false, true})
        for (int impl : {0, 1, 2, 4}) {
          const std::string name =
              fmt::format("ternary_sparse/{}x{}/s{}/{}/{}", s[0], s[1], pct, warm ? "warm" : "cold", names[impl]);
          benchmark::RegisterBenchmark(name.c_str(),
                                       [=](benchmark::State& st) { bm_sparse(st, s[0], s[1], pct, warm, impl); })
              ->Unit(benchmark::kMicrosecond)
              ->MinTime(0.1);
        }
  return 0;
}

const int registered = register_sparse();

}  // namespace
}  // namespace tessera::bench
