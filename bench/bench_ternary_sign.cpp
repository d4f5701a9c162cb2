// Sign-mask ternary GEMV (issue 24: no multiplication by the weights in the inner loop) against Tessera's TQ2_0
// kernel (matmul_ternary_x86.h: 2-bit codes fed to vpdpbusd), decode (T = 1), one thread, AVX-512.
// Run: build/bin/tessera_bench_kernels --benchmark_filter='ternary_sign/'
//
// The sign-mask kernel, written here to be measured beside the shipped one (figures: docs/PERFORMANCE.md
// "Lookup-table kernels (T-MAC / bitnet.cpp TL): measured, lost"):
// - weights: repacked once from TQ2_0 (outside the timing) into tiles of 32 rows; per tile and element e two 32-bit
//   masks, P (rows whose w / d is +1, code 2) and N (rows whose w / d is -1, code 0), stored side by side as one
//   uint64 (2 bits per weight, as TQ2_0); the rows' fp16 d per 256 elements kept as f32;
// - activations: the same 8-bit blocks of 32 as Tessera's (quantize_act_q8), widened once per call to int16;
// - inner loop, per element and pass of G tiles (G x 32 rows): one vpbroadcastw of x_e, then per tile two kmovd and
//   one masked vpaddw (P) and one masked vpsubw (N) into the tile's int16 accumulator (32 rows, one per lane); no
//   multiply touches the weights. A block of 32 sums to at most 32 x 127 = 4064, so int16 holds it; per block the
//   sums are widened to int32, converted and scaled by the block's xd; per 256 by the rows' d (as the TQ2_0 kernel
//   applies d once per block of 256).
// Before timing, the integer block sums (the same code path with a store of the int16 sums) are checked bit-exactly
// against a scalar reference sum_e (code_e - 1) * q_e, and the float outputs against Tessera's kernel (max_rel_diff).
// The timing includes the activation quantization and widening, as Tessera's kernel includes its own.
// TQ2_0's unused code 3 is rejected at the repack (quantize_row never writes it).
// Two further forms (comments at vtest_pack and Sign8Weight): "signmask_vtest" makes the masks with vptestmw from
// per-row bit words, "signmask8" keeps 64 rows a zmm in bytes. All three lost at every shape (1.65-5.3x slower than
// the shipped kernel, 2026-11-27), so none is in src/.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "bench_util.h"
#include "core/error.h"
#include "quant/format_traits.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::bench {
namespace {

constexpr int kRows = 32;  // rows per tile: one int16 lane each in a zmm

struct SignWeight {
  int64_t n = 0, k = 0, tiles = 0;
  std::vector<uint64_t> pn;  // [tiles][k]: P in bits 0..31, N in bits 32..63 (bit r: row r of the tile)
  std::vector<float> d;      // [tiles][k / 256][32]
};

SignWeight sign_pack(const std::vector<uint8_t>& tq2, int64_t n, int64_t k) {
  SignWeight w;
  w.n = n;
  w.k = k;
  w.tiles = (n + kRows - 1) / kRows;
  const int64_t kb = k / 256;
  w.pn.assign(static_cast<size_t>(w.tiles * k), 0);  // rows past n: no bit set (w = 0)
  w.d.assign(static_cast<size_t>(w.tiles * kb * kRows), 0.0f);
  const auto* blocks = reinterpret_cast<const BlockTQ2_0*>(tq2.data());
  for (int64_t row = 0; row < n; ++row) {
    const int64_t t = row / kRows, r = row % kRows;
    for (int64_t e = 0; e < k; ++e) {
      const BlockTQ2_0& b = blocks[row * kb + e / 256];
      const int c = format_detail::k_quant_2bit(b.qs, static_cast<int>(e % 256));
      TESSERA_CHECK(c <= 2, "tq2_0 code 3 has no sign mask");
      uint64_t& m = w.pn[static_cast<size_t>(t * k + e)];
      if (c == 2) m |= uint64_t{1} << r;
      if (c == 0) m |= uint64_t{1} << (32 + r);
    }
    for (int64_t b = 0; b < kb; ++b)
      w.d[static_cast<size_t>((t * kb + b) * kRows + r)] = fp16_to_f32(blocks[row * kb + b].d);
  }
  return w;
}

// Second layout (variant "vtest"): per tile and 16 elements, one zmm of P words and one of N words, lane r holding
// row r's 16 bits (bit i: element 16 q + i); the masks come from vptestmw against 1 << i instead of kmovd loads.
std::vector<uint16_t> vtest_pack(const SignWeight& w) {
  std::vector<uint16_t> v(static_cast<size_t>(w.tiles * (w.k / 16) * 2 * kRows), 0);
  for (int64_t t = 0; t < w.tiles; ++t)
    for (int64_t e = 0; e < w.k; ++e) {
      const uint64_t m = w.pn[static_cast<size_t>(t * w.k + e)];
      uint16_t* q = v.data() + ((t * (w.k / 16) + e / 16) * 2) * kRows;
      for (int r = 0; r < kRows; ++r) {
        if (m >> r & 1) q[r] |= static_cast<uint16_t>(1u << (e % 16));
        if (m >> (32 + r) & 1) q[kRows + r] |= static_cast<uint16_t>(1u << (e % 16));
      }
    }
  return v;
}

// Activations widened to int16 for vpbroadcastw from memory.
void widen_act(const BlockQ8Act* x, int64_t k, int16_t* x16) {
  for (int64_t e = 0; e < k; ++e) x16[e] = x[e / 32].qs[e % 32];
}

// One pass of G tiles starting at tile t0. kInts: also store the int16 block sums to ints[row][k / 32]. kVtest: the
// "signmask_vtest" form, its masks made by vptestmw from the per-row bit words vt (vtest_pack), else kmovd loads of
// the packed masks; the rest (block sums to f32, the per-256 d, the stores) is the same for both.
template <int G, bool kInts, bool kVtest>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline void sign_pass(const SignWeight& w,
                                                                                    const uint16_t* vt,
                                                                                    const BlockQ8Act* x,
                                                                                    const int16_t* x16, int64_t t0,
                                                                                    float* y, int32_t* ints) {
  const int64_t k = w.k, kb = k / 256;
  const uint32_t* m[G];
  for (int g = 0; g < G; ++g) m[g] = reinterpret_cast<const uint32_t*>(w.pn.data() + (t0 + g) * k);
  __m512i bit[16];
  if constexpr (kVtest)
    for (int i = 0; i < 16; ++i) bit[i] = _mm512_set1_epi16(static_cast<int16_t>(1u << i));
  __m512 acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    __m512 part[G][2];
    for (int g = 0; g < G; ++g) part[g][0] = part[g][1] = _mm512_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const int64_t blk = 8 * b + j;
      __m512i s[G];
      for (int g = 0; g < G; ++g) s[g] = _mm512_setzero_si512();
      if constexpr (kVtest) {
        for (int h = 0; h < 2; ++h) {
          const int16_t* xb = x16 + 32 * blk + 16 * h;
          __m512i pv[G], nv[G];
          for (int g = 0; g < G; ++g) {
            const uint16_t* q = vt + (((t0 + g) * (k / 16) + 2 * blk + h) * 2) * kRows;
            pv[g] = _mm512_loadu_si512(q);
            nv[g] = _mm512_loadu_si512(q + kRows);
          }
#pragma GCC unroll 16
          for (int i = 0; i < 16; ++i) {
            const __m512i xe = _mm512_set1_epi16(xb[i]);
            for (int g = 0; g < G; ++g) {
              __mmask32 kp, kn;
              __asm__(
                  "vptestmw %[bit], %[pv], %[kp]\n\t"
                  "vptestmw %[bit], %[nv], %[kn]\n\t"
                  "vpaddw %[xe], %[s], %[s]%{%[kp]%}\n\t"
                  "vpsubw %[xe], %[s], %[s]%{%[kn]%}"
                  : [s] "+v"(s[g]), [kp] "=&Yk"(kp), [kn] "=&Yk"(kn)
                  : [xe] "v"(xe), [pv] "v"(pv[g]), [nv] "v"(nv[g]), [bit] "v"(bit[i]));
            }
          }
        }
      } else {
        __m512i sn[G];
        for (int g = 0; g < G; ++g) sn[g] = _mm512_setzero_si512();
        const int16_t* xb = x16 + 32 * blk;
        const uint32_t* mb[G];
        for (int g = 0; g < G; ++g) mb[g] = m[g] + 64 * blk;
#pragma GCC unroll 32
        for (int e = 0; e < 32; ++e) {
          const __m512i xe = _mm512_set1_epi16(xb[e]);
          // kmovd k, m32; vpaddw s{k}, s, xe; kmovd k, m32; vpsubw s{k}, s, xe (inline asm: GCC 12 otherwise adds a
          // register copy per masked op).
          for (int g = 0; g < G; ++g) {
            __mmask32 kp, kn;
            __asm__(
                "kmovd %[mp], %[kp]\n\t"
                "kmovd %[mn], %[kn]\n\t"
                "vpaddw %[xe], %[s], %[s]%{%[kp]%}\n\t"
                "vpaddw %[xe], %[sn], %[sn]%{%[kn]%}"
                : [s] "+v"(s[g]), [sn] "+v"(sn[g]), [kp] "=&Yk"(kp), [kn] "=&Yk"(kn)
                : [xe] "v"(xe), [mp] "m"(mb[g][2 * e]), [mn] "m"(mb[g][2 * e + 1]));
          }
        }
        for (int g = 0; g < G; ++g) s[g] = _mm512_sub_epi16(s[g], sn[g]);
      }
      const __m512 xd = _mm512_set1_ps(x[blk].d);
      for (int g = 0; g < G; ++g) {
        if constexpr (kInts) {
          alignas(64) int16_t tmp[kRows];
          _mm512_store_si512(tmp, s[g]);
          for (int r = 0; r < kRows; ++r) {
            const int64_t row = (t0 + g) * kRows + r;
            if (row < w.n) ints[row * (k / 32) + blk] = tmp[r];
          }
        }
        const __m512i lo = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(s[g]));
        const __m512i hi = _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(s[g], 1));
        part[g][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), xd, part[g][0]);
        part[g][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), xd, part[g][1]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const float* d = w.d.data() + ((t0 + g) * kb + b) * kRows;
      acc[g][0] = _mm512_fmadd_ps(_mm512_loadu_ps(d), part[g][0], acc[g][0]);
      acc[g][1] = _mm512_fmadd_ps(_mm512_loadu_ps(d + 16), part[g][1], acc[g][1]);
    }
  }
  for (int g = 0; g < G; ++g) {
    const int64_t row0 = (t0 + g) * kRows;
    if (row0 + kRows <= w.n) {
      _mm512_storeu_ps(y + row0, acc[g][0]);
      _mm512_storeu_ps(y + row0 + 16, acc[g][1]);
    } else {
      alignas(64) float out[kRows];
      _mm512_store_ps(out, acc[g][0]);
      _mm512_store_ps(out + 16, acc[g][1]);
      for (int r = 0; row0 + r < w.n; ++r) y[row0 + r] = out[r];
    }
  }
}

// Third variant ("signmask8"): tiles of 64 rows, one byte lane each; per element two 64-bit masks P and N (kmovq).
// Per element and tile: t = blend(P, 128, x + 128), t = blend(N, t, 128 - x) (two masked byte moves: every byte is
// the biased product w x + 128, 1..255), then the int16 view of t is accumulated raw and its high bytes (vpsrlw 8)
// separately; over a block of 32 both stay below 2^16, so the low bytes' sum is raw - 256 hi (mod 2^16), exactly.
struct Sign8Weight {
  int64_t n = 0, k = 0, tiles = 0;
  std::vector<uint64_t> pn;  // [tiles][k][2]: P, N (bit r: row r of the tile)
  std::vector<float> d;      // [tiles][k / 256][64], slot order (slot_row8)
};

// Slot s of the 4 float accumulators (16 lanes each): 0: even rows 0..30, 1: even rows 32..62, 2: odd 1..31, 3:
// odd 33..63.
int slot_row8(int s) { return 2 * (s % 32) + (s >= 32 ? 1 : 0); }

Sign8Weight sign8_pack(const SignWeight& w32) {
  Sign8Weight w;
  w.n = w32.n;
  w.k = w32.k;
  w.tiles = (w.n + 63) / 64;
  const int64_t k = w.k, kb = k / 256;
  w.pn.assign(static_cast<size_t>(w.tiles * k * 2), 0);
  w.d.assign(static_cast<size_t>(w.tiles * kb * 64), 0.0f);
  for (int64_t row = 0; row < w.n; ++row) {
    const int64_t t = row / 64, r = row % 64, t32 = row / kRows, r32 = row % kRows;
    for (int64_t e = 0; e < k; ++e) {
      const uint64_t m = w32.pn[static_cast<size_t>(t32 * k + e)];
      if (m >> r32 & 1) w.pn[static_cast<size_t>((t * k + e) * 2)] |= uint64_t{1} << r;
      if (m >> (32 + r32) & 1) w.pn[static_cast<size_t>((t * k + e) * 2 + 1)] |= uint64_t{1} << r;
    }
  }
  for (int64_t t = 0; t < w.tiles; ++t)
    for (int64_t b = 0; b < kb; ++b)
      for (int sl = 0; sl < 64; ++sl) {
        const int64_t row = t * 64 + slot_row8(sl);
        if (row < w.n)
          w.d[static_cast<size_t>((t * kb + b) * 64 + sl)] =
              w32.d[static_cast<size_t>(((row / kRows) * kb + b) * kRows + row % kRows)];
      }
  return w;
}

// Activations as the two biased bytes x + 128 and 128 - x.
void bias_act(const BlockQ8Act* x, int64_t k, uint8_t* xp, uint8_t* xn) {
  for (int64_t e = 0; e < k; ++e) {
    const int q = x[e / 32].qs[e % 32];
    xp[e] = static_cast<uint8_t>(q + 128);
    xn[e] = static_cast<uint8_t>(128 - q);
  }
}

template <int G, bool kInts>
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) inline void sign8_pass(const Sign8Weight& w,
                                                                                     const BlockQ8Act* x,
                                                                                     const uint8_t* xp,
                                                                                     const uint8_t* xn, int64_t t0,
                                                                                     float* y, int32_t* ints) {
  const int64_t k = w.k, kb = k / 256;
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i bias = _mm512_set1_epi16(32 * 128);
  const uint64_t* m[G];
  for (int g = 0; g < G; ++g) m[g] = w.pn.data() + (t0 + g) * k * 2;
  __m512 acc[G][4];
  for (int g = 0; g < G; ++g)
    for (int q = 0; q < 4; ++q) acc[g][q] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    __m512 part[G][4];
    for (int g = 0; g < G; ++g)
      for (int q = 0; q < 4; ++q) part[g][q] = _mm512_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const int64_t blk = 8 * b + j;
      __m512i raw[G], hi[G];
      for (int g = 0; g < G; ++g) raw[g] = hi[g] = _mm512_setzero_si512();
      const uint8_t* xpb = xp + 32 * blk;
      const uint8_t* xnb = xn + 32 * blk;
#pragma GCC unroll 32
      for (int e = 0; e < 32; ++e) {
        const __m512i vp = _mm512_set1_epi8(static_cast<char>(xpb[e]));
        const __m512i vn = _mm512_set1_epi8(static_cast<char>(xnb[e]));
        for (int g = 0; g < G; ++g) {
          __mmask64 kp, kn;
          __m512i t, h;
          __asm__(
              "kmovq %[mp], %[kp]\n\t"
              "kmovq %[mn], %[kn]\n\t"
              "vpblendmb %[vp], %[c], %[t]%{%[kp]%}\n\t"
              "vmovdqu8 %[vn], %[t]%{%[kn]%}\n\t"
              "vpsrlw $8, %[t], %[h]\n\t"
              "vpaddw %[t], %[raw], %[raw]\n\t"
              "vpaddw %[h], %[hi], %[hi]"
              : [raw] "+v"(raw[g]), [hi] "+v"(hi[g]), [t] "=&v"(t), [h] "=&v"(h), [kp] "=&Yk"(kp), [kn] "=&Yk"(kn)
              : [vp] "v"(vp), [vn] "v"(vn), [c] "v"(c128), [mp] "m"(m[g][2 * (32 * blk + e)]),
                [mn] "m"(m[g][2 * (32 * blk + e) + 1]));
        }
      }
      const __m512 xd = _mm512_set1_ps(x[blk].d);
      for (int g = 0; g < G; ++g) {
        const __m512i so = _mm512_sub_epi16(hi[g], bias);                                                  // odd rows
        const __m512i se = _mm512_sub_epi16(_mm512_sub_epi16(raw[g], _mm512_slli_epi16(hi[g], 8)), bias);  // even
        if constexpr (kInts) {
          alignas(64) int16_t te[32], to[32];
          _mm512_store_si512(te, se);
          _mm512_store_si512(to, so);
          for (int i = 0; i < 32; ++i) {
            const int64_t r0 = (t0 + g) * 64 + 2 * i;
            if (r0 < w.n) ints[r0 * (k / 32) + blk] = te[i];
            if (r0 + 1 < w.n) ints[(r0 + 1) * (k / 32) + blk] = to[i];
          }
        }
        const __m512i v[4] = {
            _mm512_cvtepi16_epi32(_mm512_castsi512_si256(se)), _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(se, 1)),
            _mm512_cvtepi16_epi32(_mm512_castsi512_si256(so)), _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(so, 1))};
        for (int q = 0; q < 4; ++q) part[g][q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v[q]), xd, part[g][q]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const float* d = w.d.data() + ((t0 + g) * kb + b) * 64;
      for (int q = 0; q < 4; ++q) acc[g][q] = _mm512_fmadd_ps(_mm512_loadu_ps(d + 16 * q), part[g][q], acc[g][q]);
    }
  }
  for (int g = 0; g < G; ++g) {
    alignas(64) float out[64];
    for (int q = 0; q < 4; ++q) _mm512_store_ps(out + 16 * q, acc[g][q]);
    for (int sl = 0; sl < 64; ++sl) {
      const int64_t row = (t0 + g) * 64 + slot_row8(sl);
      if (row < w.n) y[row] = out[sl];
    }
  }
}

template <int G, bool kInts = false>
void sign8_gemv(const Sign8Weight& w, const BlockQ8Act* x, const uint8_t* xp, const uint8_t* xn, float* y,
                int32_t* ints = nullptr) {
  int64_t t = 0;
  for (; t + G <= w.tiles; t += G) sign8_pass<G, kInts>(w, x, xp, xn, t, y, ints);
  for (; t < w.tiles; ++t) sign8_pass<1, kInts>(w, x, xp, xn, t, y, ints);
}

// G: tiles per pass (they share each activation broadcast); the tail runs one tile per pass. kVtest: the vptestmw
// form on vtest_pack's words vt (null for the kmovd form).
template <int G, bool kVtest, bool kInts = false>
void sign_gemv(const SignWeight& w, const uint16_t* vt, const BlockQ8Act* x, const int16_t* x16, float* y,
               int32_t* ints = nullptr) {
  int64_t t = 0;
  for (; t + G <= w.tiles; t += G) sign_pass<G, kInts, kVtest>(w, vt, x, x16, t, y, ints);
  for (; t < w.tiles; ++t) sign_pass<1, kInts, kVtest>(w, vt, x, x16, t, y, ints);
}

constexpr int kG = 4;   // tiles per pass, kmovd variant
constexpr int kGv = 2;  // tiles per pass, vptestmw variant (16 bit constants hold registers)
constexpr int kG8 = 2;  // tiles (of 64 rows) per pass, byte variant

// Bit-exact check of the integer block sums against a scalar reference; returns the number of mismatches.
// run(ints) runs the kernel under test with its int16 block sums stored to ints[row][k / 32].
template <class Run>
int64_t check_ints(const Tq2Case& c, int64_t n, int64_t k, const std::vector<BlockQ8Act>& xq, Run run) {
  const int64_t kb = k / 256;
  std::vector<int32_t> ints(static_cast<size_t>(n * (k / 32)), INT32_MIN);
  run(ints.data());
  const auto* blocks = reinterpret_cast<const BlockTQ2_0*>(c.tq2.data());
  int64_t bad = 0;
  for (int64_t row = 0; row < n; ++row)
    for (int64_t blk = 0; blk < k / 32; ++blk) {
      int32_t ref = 0;
      for (int64_t e = 32 * blk; e < 32 * blk + 32; ++e) {
        const int code = format_detail::k_quant_2bit(blocks[row * kb + e / 256].qs, static_cast<int>(e % 256));
        ref += (code - 1) * xq[static_cast<size_t>(e / 32)].qs[e % 32];
      }
      bad += ints[static_cast<size_t>(row * (k / 32) + blk)] != ref;
    }
  return bad;
}

// impl: 0 Tessera's kernel (AVX-512 VNNI), 1 the sign-mask kernel (kmovd masks), 2 the same with vptestmw masks.
void bm_sign(benchmark::State& state, int64_t n, int64_t k, int impl) {
  const cpu::Isa isa = cpu::Isa::AVX512_VNNI;
  if (!cpu::isa_supported(isa)) return state.SkipWithError("ISA not supported here");
  const Tq2Case c = make_tq2_case(n, k);
  const cpu::Isa before = cpu::active_isa();
  cpu::set_active_isa(isa);
  const cpu::PackedWeight pw = cpu::prepare_weight(DType::TQ2_0, c.tq2.data(), n, k);
  std::vector<float> ref(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  cpu::matmul(pool(1), pw, c.x.data(), ref.data(), 1);
  std::vector<BlockQ8Act> xq(static_cast<size_t>(k / 32));
  std::vector<int16_t> x16(static_cast<size_t>(k));
  const SignWeight sw = sign_pack(c.tq2, n, k);
  const std::vector<uint16_t> vt = impl == 2 ? vtest_pack(sw) : std::vector<uint16_t>{};
  const Sign8Weight s8 = impl == 3 ? sign8_pack(sw) : Sign8Weight{};
  std::vector<uint8_t> xp(static_cast<size_t>(k)), xn(static_cast<size_t>(k));
  if (impl != 0) {
    quantize_act_q8(c.x.data(), xq.data(), k);
    widen_act(xq.data(), k, x16.data());
    bias_act(xq.data(), k, xp.data(), xn.data());
    const int64_t bad = check_ints(c, n, k, xq, [&](int32_t* ints) {
      if (impl == 1) sign_gemv<kG, false, true>(sw, nullptr, xq.data(), x16.data(), y.data(), ints);
      if (impl == 2) sign_gemv<kGv, true, true>(sw, vt.data(), xq.data(), x16.data(), y.data(), ints);
      if (impl == 3) sign8_gemv<kG8, true>(s8, xq.data(), xp.data(), xn.data(), y.data(), ints);
    });
    state.counters["int_mismatch"] = static_cast<double>(bad);
    if (bad != 0) {
      cpu::set_active_isa(before);
      return state.SkipWithError("sign-mask integer sums differ from the scalar reference");
    }
  }
  for (auto _ : state) {
    if (impl == 0) {
      cpu::matmul(pool(1), pw, c.x.data(), y.data(), 1);
    } else {
      quantize_act_q8(c.x.data(), xq.data(), k);
      if (impl == 1) {
        widen_act(xq.data(), k, x16.data());
        sign_gemv<kG, false>(sw, nullptr, xq.data(), x16.data(), y.data());
      } else if (impl == 2) {
        widen_act(xq.data(), k, x16.data());
        sign_gemv<kGv, true>(sw, vt.data(), xq.data(), x16.data(), y.data());
      } else {
        bias_act(xq.data(), k, xp.data(), xn.data());
        sign8_gemv<kG8>(s8, xq.data(), xp.data(), xn.data(), y.data());
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  double dmax = 0, rmax = 0;
  for (int64_t i = 0; i < n; ++i) {
    dmax = std::max(dmax, std::fabs(static_cast<double>(y[i]) - ref[i]));
    rmax = std::max(rmax, std::fabs(static_cast<double>(ref[i])));
  }
  state.counters["max_rel_diff"] = dmax / rmax;
  cpu::set_active_isa(before);
  if (dmax > 1e-4 * rmax) state.SkipWithError("sign-mask result differs from Tessera's kernel");
}

int register_sign() {
  const int64_t shapes[][2] = {{576, 1536},  {576, 768},   {192, 768},   {1536, 768},   {2048, 2048},
                               {8192, 2048}, {2048, 8192}, {4096, 4096}, {14336, 4096}, {4096, 14336}};
  for (const auto& s : shapes)
    for (int impl : {0, 1, 2, 3}) {
      const char* names[] = {"tessera", "signmask", "signmask_vtest", "signmask8"};
      const std::string name = fmt::format("ternary_sign/{}/avx512/{}x{}", names[impl], s[0], s[1]);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
        bm_sign(st, s[0], s[1], impl);
      })->Unit(benchmark::kMicrosecond);
    }
  return 0;
}

const int registered = register_sign();

}  // namespace
}  // namespace tessera::bench
