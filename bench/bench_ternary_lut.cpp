// Lookup-table ternary GEMV (the T-MAC / bitnet.cpp TL idea) against Tessera's TQ2_0 kernel (matmul_ternary_x86.h:
// 2-bit codes unpacked and fed to vpmaddubsw / vpdpbusd), decode (T = 1), one thread, on AVX2 and AVX-512.
// Run: build/bin/tessera_bench_kernels --benchmark_filter='ternary_lut'
//
// The LUT kernel, written here since it lost (docs/PERFORMANCE.md "Ternary (CPU)" has the figures):
// - weights: per tile of R rows (32 on AVX2, 64 on AVX-512) and per pair of element pairs, R bytes, row r's byte
//   holding the 4-bit index u0 | u1 << 2 of its two codes (u = w / d + 1) for pair 2p in the low nibble and pair
//   2p + 1 in the high one; the row's fp16 d per 256 elements kept as f32, ordered as the accumulator lanes are;
// - per token and pair of activations (x0, x1), a 16-entry table of (u0 - 1) x0 + (u1 - 1) x1 in int16, split into a
//   table of low bytes and one of high bytes (vpshufb looks up bytes), built with two vpmullw per pair;
// - per pair of pairs: one load, two nibble masks, four vpshufb, four unpacks (lo/hi bytes back to int16) and four
//   int16 adds serve 4 elements of R rows; every 32 elements (an activation block) the int16 sums (at most
//   16 x 508) are widened, converted and scaled by the block's xd; every 256 by the rows' d.
// Activations are the same 8-bit blocks of 32 as Tessera's kernels (quantize_act_q8), so both give the same integer
// sums; the counter max_rel_diff checks it. The LUT timing leaves the activation quantization out (Tessera's
// includes its own), and includes the table build.
// GCC 12's AVX-512 intrinsics trip -Wmaybe-uninitialized inside its own headers (matmul_kquant_avx512.cpp says why).
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

struct LutWeight {
  int rows_per_tile = 0;
  int64_t n = 0, k = 0, tiles = 0;
  std::vector<uint8_t> idx;  // [tiles][k / 4][R]
  std::vector<float> d;      // [tiles][k / 256][R], lane order
};

// Row of accumulator slot s (0..R-1): slot = 8 (W / 256) ... see the file comment; with W / 32 int32 lanes per
// register and registers (acc a even, a odd, b even, b odd), int32 lane i of register g holds int16 element
// e = 2 i + (g & 1) of acc a (g < 2) or b, i.e. byte lane e / 8, row 16 (e / 8) + 8 (g >= 2) + e % 8.
int slot_row(int slot, int lanes32) {
  const int g = slot / lanes32, i = slot % lanes32, e = 2 * i + (g & 1);
  return 16 * (e / 8) + (g >= 2 ? 8 : 0) + e % 8;
}

LutWeight lut_pack(const std::vector<uint8_t>& tq2, int64_t n, int64_t k, int rows_per_tile) {
  LutWeight w;
  w.rows_per_tile = rows_per_tile;
  w.n = n;
  w.k = k;
  w.tiles = (n + rows_per_tile - 1) / rows_per_tile;
  const int64_t kb = k / 256, R = rows_per_tile;
  w.idx.assign(static_cast<size_t>(w.tiles * (k / 4) * R), 0x55);  // rows past n: codes 1 (w = 0)
  w.d.assign(static_cast<size_t>(w.tiles * kb * R), 0.0f);
  const auto* blocks = reinterpret_cast<const BlockTQ2_0*>(tq2.data());
  for (int64_t row = 0; row < n; ++row) {
    const int64_t t = row / R, r = row % R;
    for (int64_t e = 0; e < k; e += 4) {
      int c[4];
      for (int q = 0; q < 4; ++q) {
        const BlockTQ2_0& b = blocks[row * kb + (e + q) / 256];
        c[q] = format_detail::k_quant_2bit(b.qs, static_cast<int>((e + q) % 256));
      }
      w.idx[static_cast<size_t>((t * (k / 4) + e / 4) * R + r)] =
          static_cast<uint8_t>((c[0] | c[1] << 2) | (c[2] | c[3] << 2) << 4);
    }
  }
  const int lanes32 = rows_per_tile / 4;
  for (int64_t t = 0; t < w.tiles; ++t)
    for (int64_t b = 0; b < kb; ++b)
      for (int s = 0; s < R; ++s) {
        const int64_t row = t * R + slot_row(s, lanes32);
        if (row < n) w.d[static_cast<size_t>((t * kb + b) * R + s)] = fp16_to_f32(blocks[row * kb + b].d);
      }
  return w;
}

// Tables [k / 2][32]: low bytes of the 16 int16 entries, then their high bytes.
__attribute__((target("avx2,fma"))) void lut_tables(const BlockQ8Act* x, int64_t k, uint8_t* tab) {
  const __m256i c0 = _mm256_setr_epi16(-1, 0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2);
  const __m256i c1 = _mm256_setr_epi16(-1, -1, -1, -1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2);
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                         14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t p = 0; p < k / 2; ++p) {
    const int8_t* q = x[p / 16].qs + 2 * (p % 16);
    const __m256i v = _mm256_add_epi16(_mm256_mullo_epi16(c0, _mm256_set1_epi16(q[0])),
                                       _mm256_mullo_epi16(c1, _mm256_set1_epi16(q[1])));
    // Per lane [lo(8), hi(8)] -> [lo(e0..7), lo(e8..15), hi(e0..7), hi(e8..15)].
    const __m256i s = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, split), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tab + 32 * p), s);
  }
}

__attribute__((target("avx2,fma"))) void lut_gemv_avx2(const LutWeight& w, const BlockQ8Act* x, const uint8_t* tab,
                                                       float* y) {
  constexpr int R = 32;
  const int64_t pps = w.k / 4, kb = w.k / 256;
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int64_t t = 0; t < w.tiles; ++t) {
    const uint8_t* idx = w.idx.data() + t * pps * R;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < kb; ++b) {
      __m256 part[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int j = 0; j < 8; ++j) {
        const int64_t blk = 8 * b + j;
        __m256i sa = _mm256_setzero_si256(), sb = _mm256_setzero_si256();
        for (int pp = 0; pp < 8; ++pp) {
          const int64_t q = 8 * blk + pp;  // pair of pairs
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + q * R));
          const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
          const uint8_t* t0 = tab + 32 * (2 * q);
          const __m256i l0 = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)t0)), lo);
          const __m256i h0 =
              _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(t0 + 16))), lo);
          const __m256i l1 =
              _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(t0 + 32))), hi);
          const __m256i h1 =
              _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(t0 + 48))), hi);
          sa = _mm256_add_epi16(sa, _mm256_add_epi16(_mm256_unpacklo_epi8(l0, h0), _mm256_unpacklo_epi8(l1, h1)));
          sb = _mm256_add_epi16(sb, _mm256_add_epi16(_mm256_unpackhi_epi8(l0, h0), _mm256_unpackhi_epi8(l1, h1)));
        }
        const __m256 xd = _mm256_set1_ps(x[blk].d);
        const __m256i ints[4] = {_mm256_srai_epi32(_mm256_slli_epi32(sa, 16), 16), _mm256_srai_epi32(sa, 16),
                                 _mm256_srai_epi32(_mm256_slli_epi32(sb, 16), 16), _mm256_srai_epi32(sb, 16)};
        for (int g = 0; g < 4; ++g) part[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ints[g]), xd, part[g]);
      }
      const float* d = w.d.data() + (t * kb + b) * R;
      for (int g = 0; g < 4; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(d + 8 * g), part[g], acc[g]);
    }
    alignas(32) float out[R];
    for (int g = 0; g < 4; ++g) _mm256_store_ps(out + 8 * g, acc[g]);
    for (int s = 0; s < R; ++s) {
      const int64_t row = t * R + slot_row(s, 8);
      if (row < w.n) y[row] = out[s];
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void lut_gemv_avx512(const LutWeight& w,
                                                                                   const BlockQ8Act* x,
                                                                                   const uint8_t* tab, float* y) {
  constexpr int R = 64;
  const int64_t pps = w.k / 4, kb = w.k / 256;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int64_t t = 0; t < w.tiles; ++t) {
    const uint8_t* idx = w.idx.data() + t * pps * R;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b = 0; b < kb; ++b) {
      __m512 part[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int j = 0; j < 8; ++j) {
        const int64_t blk = 8 * b + j;
        __m512i sa = _mm512_setzero_si512(), sb = _mm512_setzero_si512();
        for (int pp = 0; pp < 8; ++pp) {
          const int64_t q = 8 * blk + pp;
          const __m512i v = _mm512_loadu_si512(idx + q * R);
          const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
          const uint8_t* t0 = tab + 32 * (2 * q);
          const __m512i l0 = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)t0)), lo);
          const __m512i h0 =
              _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(t0 + 16))), lo);
          const __m512i l1 =
              _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(t0 + 32))), hi);
          const __m512i h1 =
              _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(t0 + 48))), hi);
          sa = _mm512_add_epi16(sa, _mm512_add_epi16(_mm512_unpacklo_epi8(l0, h0), _mm512_unpacklo_epi8(l1, h1)));
          sb = _mm512_add_epi16(sb, _mm512_add_epi16(_mm512_unpackhi_epi8(l0, h0), _mm512_unpackhi_epi8(l1, h1)));
        }
        const __m512 xd = _mm512_set1_ps(x[blk].d);
        const __m512i ints[4] = {_mm512_srai_epi32(_mm512_slli_epi32(sa, 16), 16), _mm512_srai_epi32(sa, 16),
                                 _mm512_srai_epi32(_mm512_slli_epi32(sb, 16), 16), _mm512_srai_epi32(sb, 16)};
        for (int g = 0; g < 4; ++g) part[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ints[g]), xd, part[g]);
      }
      const float* d = w.d.data() + (t * kb + b) * R;
      for (int g = 0; g < 4; ++g) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(d + 16 * g), part[g], acc[g]);
    }
    alignas(64) float out[R];
    for (int g = 0; g < 4; ++g) _mm512_store_ps(out + 16 * g, acc[g]);
    for (int s = 0; s < R; ++s) {
      const int64_t row = t * R + slot_row(s, 16);
      if (row < w.n) y[row] = out[s];
    }
  }
}

// impl: 0 Tessera's kernel, 1 the LUT kernel. isa: Isa::AVX2 or Isa::AVX512_VNNI.
void bm_lut(benchmark::State& state, int64_t n, int64_t k, cpu::Isa isa, int impl) {
  if (!cpu::isa_supported(isa)) return state.SkipWithError("ISA not supported here");
  const Tq2Case c = make_tq2_case(n, k);
  const cpu::Isa before = cpu::active_isa();
  cpu::set_active_isa(isa);
  const cpu::PackedWeight pw = cpu::prepare_weight(DType::TQ2_0, c.tq2.data(), n, k);
  std::vector<float> ref(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  cpu::matmul(pool(1), pw, c.x.data(), ref.data(), 1);
  std::vector<BlockQ8Act> xq(static_cast<size_t>(k / 32));
  quantize_act_q8(c.x.data(), xq.data(), k);
  const bool avx512 = isa == cpu::Isa::AVX512_VNNI;
  const LutWeight lw = lut_pack(c.tq2, n, k, avx512 ? 64 : 32);
  std::vector<uint8_t> tab(static_cast<size_t>(k / 2 * 32));
  for (auto _ : state) {
    if (impl == 0) {
      cpu::matmul(pool(1), pw, c.x.data(), y.data(), 1);
    } else {
      lut_tables(xq.data(), k, tab.data());
      if (avx512) {
        lut_gemv_avx512(lw, xq.data(), tab.data(), y.data());
      } else {
        lut_gemv_avx2(lw, xq.data(), tab.data(), y.data());
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
  if (dmax > 1e-4 * rmax) state.SkipWithError("LUT result differs from Tessera's kernel");
  cpu::set_active_isa(before);
}

int register_lut() {
  const int64_t shapes[][2] = {{576, 1536},  {576, 768},   {192, 768},   {1536, 768},   {2048, 2048},
                               {8192, 2048}, {2048, 8192}, {4096, 4096}, {14336, 4096}, {4096, 14336}};
  for (const auto& s : shapes) {
    for (cpu::Isa isa : {cpu::Isa::AVX2, cpu::Isa::AVX512_VNNI}) {
      for (int impl : {0, 1}) {
        const std::string name =
            fmt::format("ternary_lut/{}/{}/{}x{}", impl == 0 ? "tessera" : "lut", cpu::isa_name(isa), s[0], s[1]);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
          bm_lut(st, s[0], s[1], isa, impl);
        })->Unit(benchmark::kMicrosecond);
      }
    }
  }
  return 0;
}

const int registered = register_lut();

}  // namespace
}  // namespace tessera::bench
