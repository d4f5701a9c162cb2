// The ternary matmul kernels for x86 on their ROWS_X8 layout (matmul_ternary.h), written once and compiled three
// times as the K-quants' are (matmul_kquant_x86.h supplies the vector helpers; TESSERA_KQ_WIDTH and TESSERA_QDOT_VNNI
// select): matmul_ternary_avx2.cpp (vpmaddubsw + vpmaddwd), matmul_ternary_avxvnni.cpp (256-bit vpdpbusd) and
// matmul_ternary_avx512.cpp (512-bit vpdpbusd, two 8-row groups per zmm). Include only from those files.
//
// Per (row group, block of 256, token): the 2-bit codes of each sub-block of 32 are unpacked once (shift and mask,
// 8 registers) and serve a tile of tokens; the integer dot with the broadcast activations lands in each row's own
// lane. Since a row has one scale d per 256 elements, the sub-block sums are scaled by the activations' xd only and
// d is applied once per block of 256, with the offset (codes are w / d + 1) folded in as d * sum(xs):
//   acc += d * (sum_j xd_j * dot_j - sum_j xs_j).
// The weights enter the integer dot as unsigned codes 0..2 against int8 activations (vpmaddubsw / vpdpbusd): the
// multiplier only ever sees 0, 1 or 2, and one instruction does the selection and the widening sum of four products.
// The alternatives the issue names (vpsignb by signed trits, then a widening sum against ones; T-MAC lookup tables)
// are not all implemented: the sign path (w = u - 1, vpsignb of the broadcast activations by w, vpmaddubsw with ones)
// was measured on AVX2 and lost, as its two extra instructions per register suggest: `tessera bench -m
// tiny-tq2_0.gguf -p 128 -n 32 -t 1 -r 3 --cpu-isa avx2` on a random TinyLlama-shaped 4-layer tq2_0 file, three
// alternating rounds on a busy machine, codes vs signs: pp128 164 / 143 / 150 vs 117 / 135 / 137 tok/s, tg32 86 / 84
// / 84 vs 64 / 73 / 78 tok/s (it also cannot read tq2_0's unused code 3). Lookup tables (T-MAC / bitnet.cpp TL: a
// 16-entry int16 table per pair of activations, looked up by vpshufb with 4-bit weight indices) were measured too and
// lost at every shape on AVX2 and AVX-512 (1.2-2.3x slower at one thread): a 2-bit code feeds vpdpbusd directly,
// while a lookup needs two vpshufb and two unpacks back to int16 per 2 weights and row. That kernel lives in
// bench/bench_ternary_lut.cpp and its figures in docs/PERFORMANCE.md "Ternary (CPU)".
//
// Decode GEMV against q4_1's kernel (tessera_bench_kernels, AVX-512 VNNI, one thread, median of 5, CPU time of a
// machine shared by six builds, load ~11 on 2 cores; "cold" cycles 128 MiB of weight copies, "warm" reuses one):
//   shape (n x k)   q4_1 cold / warm   tq2_0 cold / warm   ratio cold / warm
//   576 x 1536      48.5 / 10.3 us     29.1 / 7.96 us      1.67x / 1.29x
//   2048 x 2048     213 / 56.7 us      129 / 38.1 us       1.65x / 1.49x
//   8192 x 2048     846 / 373 us       512 / 175 us        1.65x / 2.13x
//   2048 x 8192     667 / 278 us       382 / 163 us        1.75x / 1.71x
// tq1_0 (the same kernel after its repack) is within noise of tq2_0. The weights are 2.4x fewer bytes than q4_1's, so
// cold shapes gain less than that; warm ones are bound by the unpack and the 8 dot instructions per 32 weights that
// both formats share. SmolLM2's 576 x 576 and 1536 x 576 have rows of 576, which no ternary file holds. Later figures
// (SmolLM2's shapes padded, the 8B shapes, decode passes of 32 rows): docs/PERFORMANCE.md "Ternary (CPU)".
#pragma once

#include "backends/cpu/kernels/matmul_kquant_x86.h"
#include "backends/cpu/kernels/matmul_ternary.h"

namespace tessera::cpu::detail {
namespace {

// The 8 code registers of sub-block j of groups b0 and b1 (codes 0..3 per byte).
template <size_t... I>
inline void tq_fields(vi a, vi* q, std::index_sequence<I...>) {
  ((q[I] = and_(shift16<-2 * static_cast<int>(I)>(a), set8(3))), ...);
}
inline void tq_unpack(const BlockTQx8& b0, const BlockTQx8& b1, int j, vi* q) {
  tq_fields(ld(b0.qs[j], b1.qs[j]), q, std::make_index_sequence<4>{});
  tq_fields(ld(b0.qs[j] + 32, b1.qs[j] + 32), q + 4, std::make_index_sequence<4>{});
}

// Per-lane dot of the 8 code registers (32 elements per row) with 32 activations.
inline vi tq_dot32(const vi* q, const int8_t* x) {
#if TESSERA_QDOT_VNNI || TESSERA_KQ_WIDTH == 512
  vi s0 = dpbusd(zero_i(), q[0], bcast4(x + 0));
  vi s1 = dpbusd(zero_i(), q[1], bcast4(x + 4));
  s0 = dpbusd(s0, q[2], bcast4(x + 8));
  s1 = dpbusd(s1, q[3], bcast4(x + 12));
  s0 = dpbusd(s0, q[4], bcast4(x + 16));
  s1 = dpbusd(s1, q[5], bcast4(x + 20));
  s0 = dpbusd(s0, q[6], bcast4(x + 24));
  s1 = dpbusd(s1, q[7], bcast4(x + 28));
  return add32(s0, s1);
#else
  // Codes are at most 3: eight vpmaddubsw lanes of two products each sum to at most 8 * 2 * 3 * 128 = 6144, so all
  // eight add in int16 before the one vpmaddwd that widens them.
  vi p = _mm256_maddubs_epi16(q[0], bcast4(x));
  for (int c = 1; c < 8; ++c) p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q[c], bcast4(x + 4 * c)));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

// Decode streams the weights once, and the hardware prefetcher alone leaves a core short of the read bandwidth (as for
// the K-quants, matmul_kquant_x86.h). A one-token pass reads `groups` consecutive row groups (one contiguous run of
// groups x k/256 blocks, in `groups` interleaved streams); each sub-block step prefetches an eighth of a step's bytes
// of that run kTqPrefetch bytes ahead of a cursor moving through it at the pass's rate, so the next pass's bytes are
// fetched too (short rows: a pass of SmolLM2's k = 1536 is 12.7 KB). Only rows of at most kTqPrefetchMaxBlocks blocks
// of 256 prefetch: on longer ones the hardware prefetcher follows the groups' streams itself, and this cursor, which
// runs through the groups one after another while the pass reads them side by side, cost time (one thread, cold
// weights, 2026-11-26, quiet: 4096x14336 692 us without, 870-912 with; 576x1536 18.8 us without, 9.8 with).
constexpr int64_t kTqPrefetch = 16384;  // 8192: mixed at SmolLM2's shapes (+-10%), 8% slower at 4096x4096
constexpr int64_t kTqPrefetchMaxBlocks = 16;
template <int Groups>
inline void tq_prefetch(const BlockTQx8* w, int64_t sb, int j) {
  constexpr int kStep = Groups * static_cast<int>(sizeof(BlockTQx8));
  const char* pf = reinterpret_cast<const char*>(w) + sb * kStep + kTqPrefetch;
  for (int l = (j * kStep / 8 + 63) / 64 * 64; l < (j + 1) * kStep / 8; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
}

// Groups w0 and w1 (w1 == w0 on AVX2, and on AVX-512 when the pass has one group) against NT tokens; x: [NT, kb].
template <int NT>
void tq_tile(const BlockTQx8* w0, const BlockTQx8* w1, int64_t kb, const BlockQ8A* x, float* y, int64_t n, int valid) {
  vf acc[NT];
  for (int i = 0; i < NT; ++i) acc[i] = zero_f();
  for (int64_t sb = 0; sb < kb / 8; ++sb) {
    const BlockTQx8& b0 = w0[sb];
    const BlockTQx8& b1 = w1[sb];
    vf part[NT];
    float xs[NT];
    for (int i = 0; i < NT; ++i) {
      part[i] = zero_f();
      xs[i] = 0.0f;
    }
    for (int j = 0; j < 8; ++j) {
      if constexpr (NT == 1) {
        if (kb / 8 <= kTqPrefetchMaxBlocks) {
          if (w1 != w0)
            tq_prefetch<2>(w0, sb, j);  // w1 follows w0 (tq_rows)
          else
            tq_prefetch<1>(w0, sb, j);
        }
      }
      vi q[8];
      tq_unpack(b0, b1, j, q);
      for (int i = 0; i < NT; ++i) {
        const BlockQ8A& xb = x[i * kb + 8 * sb + j];
        part[i] = fmadd(cvt(tq_dot32(q, xb.qs)), setf(xb.d), part[i]);
        xs[i] += xb.s;
      }
    }
    const vf d = ld_half(b0.d, b1.d);
    for (int i = 0; i < NT; ++i) acc[i] = fmadd(d, fnmadd(setf(1.0f), setf(xs[i]), part[i]), acc[i]);
  }
  for (int i = 0; i < NT; ++i) store_rows(y + i * n, acc[i], valid);
}

// Tokens per tile: 8 code registers serve NT tokens; AVX2's 16 registers hold them and 4 accumulator pairs, AVX-512's
// 32 hold 8.
constexpr int kTqTile = TESSERA_KQ_WIDTH == 512 ? 8 : 4;

template <int NT>
void tq_remainder(const BlockTQx8* w0, const BlockTQx8* w1, int64_t kb, const BlockQ8A* x, float* y, int64_t n,
                  int valid, int64_t r) {
  if constexpr (NT > 0) {
    if (r == NT) return tq_tile<NT>(w0, w1, kb, x, y, n, valid);
    tq_remainder<NT - 1>(w0, w1, kb, x, y, n, valid, r);
  }
}

#if TESSERA_KQ_WIDTH == 512
// Decode (one token) on AVX-512: two passes' rows (32) at once, so the 8 activation broadcasts of a sub-block serve
// twice the weights and the two passes' dot chains interleave (32 zmm hold 8 broadcasts, 8 codes, 2 x 2 sums).
template <bool Prefetch>
void tq_gemv32(const BlockTQx8* w0, const BlockTQx8* w1, const BlockTQx8* w2, const BlockTQx8* w3, int64_t kb,
               const BlockQ8A* x, float* y) {
  vf acc0 = zero_f(), acc1 = zero_f();
  for (int64_t sb = 0; sb < kb / 8; ++sb) {
    vf part0 = zero_f(), part1 = zero_f();
    float xs = 0.0f;
    for (int j = 0; j < 8; ++j) {
      if constexpr (Prefetch) tq_prefetch<4>(w0, sb, j);  // w1, w2, w3 follow w0 (tq_rows)
      const BlockQ8A& xb = x[8 * sb + j];
      vi xv[8];
      for (int c = 0; c < 8; ++c) xv[c] = bcast4(xb.qs + 4 * c);
      vi q[8];
      tq_unpack(w0[sb], w1[sb], j, q);
      vi s0 = dpbusd(zero_i(), q[0], xv[0]), s1 = dpbusd(zero_i(), q[1], xv[1]);
      for (int c = 2; c < 8; c += 2) {
        s0 = dpbusd(s0, q[c], xv[c]);
        s1 = dpbusd(s1, q[c + 1], xv[c + 1]);
      }
      tq_unpack(w2[sb], w3[sb], j, q);
      vi t0 = dpbusd(zero_i(), q[0], xv[0]), t1 = dpbusd(zero_i(), q[1], xv[1]);
      for (int c = 2; c < 8; c += 2) {
        t0 = dpbusd(t0, q[c], xv[c]);
        t1 = dpbusd(t1, q[c + 1], xv[c + 1]);
      }
      part0 = fmadd(cvt(add32(s0, s1)), setf(xb.d), part0);
      part1 = fmadd(cvt(add32(t0, t1)), setf(xb.d), part1);
      xs += xb.s;
    }
    acc0 = fmadd(ld_half(w0[sb].d, w1[sb].d), fnmadd(setf(1.0f), setf(xs), part0), acc0);
    acc1 = fmadd(ld_half(w2[sb].d, w3[sb].d), fnmadd(setf(1.0f), setf(xs), part1), acc1);
  }
  store_rows(y, acc0, kLanes);
  store_rows(y + kLanes, acc1, kLanes);
}
#endif

void tq_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.w->n, kb = a.w->k / kBlock, sbs = a.w->k / 256;
  const auto* w = static_cast<const BlockTQx8*>(a.w->packed);
#if TESSERA_KQ_WIDTH == 512
  if (a.t == 1) {
    for (; r1 - r0 >= 2 * kLanes; r0 += 2 * kLanes) {
      const BlockTQx8* g = w + (r0 / kGroup) * sbs;
      if (sbs <= kTqPrefetchMaxBlocks)
        tq_gemv32<true>(g, g + sbs, g + 2 * sbs, g + 3 * sbs, kb, a.xq, a.y + r0);
      else
        tq_gemv32<false>(g, g + sbs, g + 2 * sbs, g + 3 * sbs, kb, a.xq, a.y + r0);
    }
  }
#endif
  for (int64_t row = r0; row < r1; row += kLanes) {
    const int valid = static_cast<int>(r1 - row < kLanes ? r1 - row : kLanes);
    const BlockTQx8* w0 = w + (row / kGroup) * sbs;
    const BlockTQx8* w1 = valid > kGroup ? w0 + sbs : w0;
    int64_t i = 0;
    for (; i + kTqTile <= a.t; i += kTqTile) tq_tile<kTqTile>(w0, w1, kb, a.xq + i * kb, a.y + i * n + row, n, valid);
    if (i < a.t) tq_remainder<kTqTile - 1>(w0, w1, kb, a.xq + i * kb, a.y + i * n + row, n, valid, a.t - i);
  }
}

inline RowKernel tq_kernel(WeightLayout layout) { return layout == WeightLayout::ROWS_X8 ? tq_rows : nullptr; }

}  // namespace
}  // namespace tessera::cpu::detail
