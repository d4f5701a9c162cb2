// The quantized per-tile GEMM (GemmPath::TILE, kernels/gemm_quant_tile.cu) of every format with a tile kernel. Host (no
// GPU): its dequantization into wgmma's register fragments, run through the same functions the kernel calls
// (gemm_quant_tile.h, gemm_tile_formats.h), gives the expansion's bf16
// weights bit for bit, and gemm_default_path follows CudaOptions::quant_gemm. GPU: against the expansion + cuBLASLt
// path (quant_gemm=expand) on the same bf16 x and the same bf16 weights, so the two differ only in the f32 summation
// order, at prefill row counts (1 to 512: 128- and 256-token tiles, rows past t masked), Llama-3-8B's K (4096, 14336),
// N a multiple of 128 or not (W rows past N masked), with and without split-K, f32 and bf16 outputs, with accumulate;
// every run against a double reference on sampled outputs; two runs give the same bits; the option routes matmul and
// matmul_x16; and what the kernel cannot take (a misaligned x) falls back to the expansion.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels/gemm_tile_formats.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/split_layout.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cuda::test {
namespace {

using detail::GemmPath;
namespace qt = detail::quant_tile;

// Every format with a tile kernel (gemm_tile_formats.h).
constexpr DType kTileFormats[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K,   DType::Q2_K,  DType::Q3_K,
                                  DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS};

// Byte offsets of a GGML block's fp16 fields (d, and dmin or m where the format has one).
std::vector<int> half_fields(DType d) {
  switch (d) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q5_1:
      return {0, 2};
    case DType::Q6_K:
      return {208};
    case DType::Q2_K:
      return {80, 82};
    case DType::Q3_K:
      return {108};
    default:  // q5_0, iq4_nl, iq4_xs
      return {0};
  }
}

// Random rows [n, k] (GGUF layout) of a format with every byte random but its fp16 fields (every code, scale and min
// bit pattern, the high bits of packed scales included) and those in [1e-3, 1e-2) (finite weights of a trained
// model's size). Faster than quantizing floats at Llama-3-8B's widths.
std::vector<uint8_t> random_blocks(std::mt19937& rng, DType dtype, int64_t n, int64_t k) {
  const FormatInfo& fi = *format_info(dtype);
  std::vector<uint8_t> q(static_cast<size_t>(n * k / fi.block_size * fi.block_bytes));
  for (uint8_t& b : q) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(1e-3f, 1e-2f);
  const std::vector<int> halves = half_fields(dtype);
  for (size_t b = 0; b < q.size() / static_cast<size_t>(fi.block_bytes); ++b)
    for (const int off : halves) {
      const uint16_t h = f32_to_fp16(scale(rng));
      std::memcpy(q.data() + b * static_cast<size_t>(fi.block_bytes) + off, &h, 2);
    }
  return q;
}

// The weights as the expansion writes them: Format<D>::dequantize (gguf-py's arithmetic), rounded to bf16.
std::vector<float> bf16_row(DType dtype, const std::vector<uint8_t>& q, int64_t k, int64_t r) {
  std::vector<float> row(static_cast<size_t>(k));
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  dequantize_row(dtype, q.data() + r * static_cast<int64_t>(row_bytes), row.data(), k);
  for (float& v : row) v = bf16_to_f32(f32_to_bf16(v));
  return row;
}

// Host: each lane's fragments of each W row of each step, from the shared-memory row image the kernel's cp.async
// builds (TileFormat<D>::piece's bytes of the SPLIT_Q arrays, laid out as upload_weight lays them out), are the
// expansion's bf16 weights at the k the m16n8k16 A layout gives that register, the four lanes of a row cover the step's
// 64 values once each, and the pieces are aligned to their size and fill the image without overlap.
template <DType D>
void check_fragments(std::mt19937& rng, int64_t kN, int64_t kK) {
  SCOPED_TRACE(::testing::Message() << "n=" << kN << " k=" << kK);
  using F = qt::TileFormat<D>;
  using L = SplitLayout<D>;
  const std::vector<uint8_t> q = random_blocks(rng, D, kN, kK);
  const int64_t nb = kN * kK / Format<D>::kBlockSize;
  std::vector<uint8_t> quants(static_cast<size_t>(nb * L::kQuantBytes)),
      scales(static_cast<size_t>(nb * (L::kScaleBytes + L::kTailBytes)));
  for (int64_t b = 0; b < nb; ++b) {
    typename Format<D>::Block blk;
    std::memcpy(&blk, q.data() + b * static_cast<int64_t>(sizeof(blk)), sizeof(blk));
    split_block<D>(blk, &quants[static_cast<size_t>(b * L::kQuantBytes)],
                   &scales[static_cast<size_t>(b * L::kScaleBytes)],
                   scales.data() + nb * L::kScaleBytes + b * L::kTailBytes);
  }
  // As DeviceBuffer allocates: rounded up to 16 bytes (a 2-byte tail entry's 4-byte window may cover 2 bytes past).
  quants.resize((quants.size() + 15) / 16 * 16);
  scales.resize((scales.size() + 15) / 16 * 16);
  static_assert(F::kRawRow % 16 == 0, "row images are 16-byte multiples");
  int bad = 0;
  for (int64_t r = 0; r < kN; ++r) {
    const std::vector<float> want = bf16_row(D, q, kK, r);
    for (int s = 0; s < kK / qt::kStepK; ++s) {
      alignas(16) uint32_t image[F::kRawRow / 4] = {};
      std::vector<int> owner(F::kRawRow, -1);
      for (int p = 0; p < F::kPieces; ++p) {
        const qt::Piece pc = F::piece(r, kN, kK, s, p);
        ASSERT_TRUE(pc.bytes == 4 || pc.bytes == 8 || pc.bytes == 16) << "piece " << p;
        ASSERT_EQ(pc.src % pc.bytes, 0) << "piece " << p << " source misaligned";
        ASSERT_EQ(pc.dst % pc.bytes, 0) << "piece " << p << " destination misaligned";
        const std::vector<uint8_t>& buf = pc.scales ? scales : quants;
        ASSERT_TRUE(pc.src >= 0 && pc.src + pc.bytes <= static_cast<int64_t>(buf.size())) << "piece " << p;
        ASSERT_TRUE(pc.dst >= 0 && pc.dst + pc.bytes <= F::kRawRow) << "piece " << p;
        for (int i = pc.dst; i < pc.dst + pc.bytes; ++i) {
          ASSERT_EQ(owner[static_cast<size_t>(i)], -1) << "pieces overlap at byte " << i;
          owner[static_cast<size_t>(i)] = p;
        }
        std::memcpy(reinterpret_cast<uint8_t*>(image) + pc.dst, buf.data() + pc.src, static_cast<size_t>(pc.bytes));
      }
      int hits[qt::kStepK] = {};
      for (int c = 0; c < 4; ++c) {
        uint32_t out[4][2];
        qt::frags<D>(image, c, s, r, kK, out);
        for (int j = 0; j < 4; ++j)
          for (int half = 0; half < 2; ++half) {
            const int kk = 16 * j + 2 * c + 8 * half;  // within the step
            ++hits[kk];
            ++hits[kk + 1];
            const size_t at = static_cast<size_t>(s * qt::kStepK + kk);
            const uint32_t w = f32_to_bf16(want[at]) | static_cast<uint32_t>(f32_to_bf16(want[at + 1])) << 16;
            if (out[j][half] != w && bad++ < 5)
              ADD_FAILURE() << dtype_name(D) << " row " << r << " k " << at << " lane c " << c << ": " << std::hex
                            << out[j][half] << ", want " << w;
          }
      }
      for (int kk = 0; kk < qt::kStepK; ++kk) ASSERT_EQ(hits[kk], 1) << "step " << s << " k " << kk;
    }
  }
  EXPECT_EQ(bad, 0) << dtype_name(D);
}

template <DType D>
void check_fragments_if_tiled(std::mt19937& rng) {
  if constexpr (qt::HasTileFormat<D>::value) {
    SCOPED_TRACE(dtype_name(D));
    // Four super-blocks a row (every step's place in one; 32 blocks of 32), and three (K / 256 odd, n odd: an odd
    // number of super-blocks, so blocks of both parities in one row and a last block at an even index).
    check_fragments<D>(rng, 6, 1024);
    check_fragments<D>(rng, 5, 768);
  } else {
    ADD_FAILURE() << dtype_name(D) << " has no TileFormat";
  }
}

TEST(CudaGemmQuantTile, FragmentsAreTheExpansionsWeightsOnTheHost) {
  std::mt19937 rng(test_seed());
  check_fragments_if_tiled<DType::Q4_K>(rng);
  check_fragments_if_tiled<DType::Q5_K>(rng);
  check_fragments_if_tiled<DType::Q6_K>(rng);
  check_fragments_if_tiled<DType::Q2_K>(rng);
  check_fragments_if_tiled<DType::Q3_K>(rng);
  check_fragments_if_tiled<DType::Q5_0>(rng);
  check_fragments_if_tiled<DType::Q5_1>(rng);
  check_fragments_if_tiled<DType::IQ4_NL>(rng);
  check_fragments_if_tiled<DType::IQ4_XS>(rng);
  for (const DType d : kTileFormats) EXPECT_TRUE(detail::gemm_quant_tile_format(d)) << dtype_name(d);
  for (const DType d : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::TQ2_0, DType::BF16})
    EXPECT_FALSE(detail::gemm_quant_tile_format(d)) << dtype_name(d);
}

// Host: the default path of a matmul past the multi-row GEMV's rows under each quant_gemm, for a tiled format and for
// one without a tile kernel (q4_0: the expansion).
TEST(CudaGemmQuantTile, DefaultPathFollowsTheOption) {
  const auto path = [](QuantGemm mode, DType d, int64_t t) {
    CudaOptions o;
    o.quant_gemm = mode;
    const CudaOptionsScope scope(o);
    return detail::gemm_default_path(d, t, 4096, 4096);
  };
  for (const DType d : kTileFormats) {
    SCOPED_TRACE(dtype_name(d));
    EXPECT_EQ(path(QuantGemm::AUTO, d, 16), GemmPath::ROWS);
    EXPECT_EQ(path(QuantGemm::TILE, d, 16), GemmPath::ROWS);
    EXPECT_EQ(path(QuantGemm::AUTO, d, 17), GemmPath::TILE);
    const int64_t max_t = detail::quant_tile_auto_max_t(d);
    EXPECT_GE(max_t, 256);
    EXPECT_EQ(path(QuantGemm::AUTO, d, max_t), GemmPath::TILE);
    EXPECT_EQ(path(QuantGemm::AUTO, d, max_t + 1), GemmPath::CUBLAS);
    EXPECT_EQ(path(QuantGemm::TILE, d, 2048), GemmPath::TILE);
    EXPECT_EQ(path(QuantGemm::EXPAND, d, 200), GemmPath::CUBLAS);
  }
  EXPECT_EQ(detail::quant_tile_auto_max_t(DType::Q4_0), 0);
  EXPECT_EQ(path(QuantGemm::TILE, DType::Q4_0, 200), GemmPath::CUBLAS);
  EXPECT_EQ(path(QuantGemm::TILE, DType::Q8_0, 200), GemmPath::CUBLAS);
  EXPECT_STREQ(detail::gemm_path_name(GemmPath::TILE), "quant_tile");
}

// ---- GPU ----

// A quantized weight on the host and the device, with each row's L2 norm of its bf16 weights.
struct QW {
  DType dtype;
  int64_t n, k;
  std::vector<uint8_t> host;
  DeviceWeight dev;
  std::vector<double> norm;  // [n]
};

QW make_weight(std::mt19937& rng, DType dtype, int64_t n, int64_t k) {
  QW w{dtype, n, k, random_blocks(rng, dtype, n, k), {}, std::vector<double>(static_cast<size_t>(n))};
  w.dev = upload_weight(dtype, w.host.data(), n, k);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (float v : bf16_row(dtype, w.host, k, i)) ss += double(v) * v;
    w.norm[static_cast<size_t>(i)] = std::sqrt(ss);
  }
  return w;
}

// x [t, k] in bf16 (as rmsnorm and swiglu_rows write it), with each row's L2 norm.
struct X16 {
  std::vector<uint16_t> bits;
  std::vector<double> norm;  // [t]
  DeviceBuffer dev;
};

X16 make_x16(std::mt19937& rng, int64_t t, int64_t k) {
  X16 x{std::vector<uint16_t>(static_cast<size_t>(t * k)), std::vector<double>(static_cast<size_t>(t)), {}};
  const std::vector<float> f = random_floats(rng, x.bits.size(), -2.0f, 2.0f);
  for (size_t i = 0; i < f.size(); ++i) x.bits[i] = f32_to_bf16(f[i]);
  for (int64_t r = 0; r < t; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double v = bf16_to_f32(x.bits[static_cast<size_t>(r * k + j)]);
      ss += v * v;
    }
    x.norm[static_cast<size_t>(r)] = std::sqrt(ss);
  }
  x.dev = to_device(x.bits);
  return x;
}

// The tolerance unit of output (r, i): ||x_r|| ||w_i||, which bounds sum_j |x_rj w_ij| (Cauchy-Schwarz) and is of its
// size for these random rows (cheap: no O(t N K) pass on the host). Two f32 summation orders of the same bf16 products
// differ by ~1e-7 of it (the experiment measured 1e-5 of the products' root sum of squares, itself ~1/sqrt(K) of the
// sum); 1e-5 still sees one wrong weight or x element (~1/K of it: 2.4e-4 at K = 4096, 7e-5 at 14336), and a lost or
// doubled K slice by far.
constexpr double kOrder = 1e-5;

double unit(const QW& w, const X16& x, int64_t r, int64_t i) {
  return w.norm[static_cast<size_t>(i)] * x.norm[static_cast<size_t>(r)] + 1e-30;
}

// matmul_x16 (y f32, or bf16 with y16) under one quant_gemm.
void run_x16(QuantGemm mode, const QW& w, const void* x16, void* y, bool y16, int64_t t, GemmWorkspace& ws,
             bool accumulate) {
  CudaOptions o = cuda_options();
  o.quant_gemm = mode;
  const CudaOptionsScope scope(o);
  if (y16)
    matmul_x16_out16(w.dev, x16, y, t, ws, nullptr, accumulate);
  else
    matmul_x16(w.dev, x16, static_cast<float*>(y), t, ws, nullptr, accumulate);
}

// y (f32 [t, n], or bf16 bits with y16) read back as floats.
std::vector<float> download(const DeviceBuffer& y, int64_t count, bool y16) {
  if (!y16) return to_host<float>(y, static_cast<size_t>(count));
  const std::vector<uint16_t> h = to_host<uint16_t>(y, static_cast<size_t>(count));
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_to_f32(h[i]);
  return f;
}

// Tile against expansion over every output; tile against a double reference (x · the bf16 weights, plus y0) on 64
// sampled outputs. y16: each side rounded once to bf16 (half a unit each), so the two may be one unit apart (2^-7
// relative).
void expect_tile_matches(const QW& w, const X16& x, const std::vector<float>& tile, const std::vector<float>& expand,
                         int64_t t, bool y16, const std::vector<float>* y0, std::mt19937& rng) {
  const int64_t n = w.n, k = w.k;
  const double round16 = y16 ? 1.0 / 128 : 0.0;
  int bad = 0;
  for (int64_t r = 0; r < t && bad < 5; ++r)
    for (int64_t i = 0; i < n && bad < 5; ++i) {
      const size_t at = static_cast<size_t>(r * n + i);
      const double a = tile[at], b = expand[at];
      const double base = y0 != nullptr ? std::fabs((*y0)[at]) : 0.0;
      const double tol = kOrder * unit(w, x, r, i) + 1e-6 * base + round16 * std::max(std::fabs(a), std::fabs(b));
      if (!(std::fabs(a - b) <= tol)) {
        ADD_FAILURE() << "row " << r << " col " << i << ": tile " << a << ", expansion " << b << " (tolerance " << tol
                      << ")";
        ++bad;
      }
    }
  for (int sample = 0; sample < 64 && bad < 5; ++sample) {
    const int64_t r = static_cast<int64_t>(rng() % static_cast<uint32_t>(t));
    const int64_t i = static_cast<int64_t>(rng() % static_cast<uint32_t>(n));
    const std::vector<float> wr = bf16_row(w.dtype, w.host, k, i);
    const size_t at = static_cast<size_t>(r * n + i);
    double want = y0 != nullptr ? (*y0)[at] : 0.0;
    for (int64_t j = 0; j < k; ++j) want += double(wr[static_cast<size_t>(j)]) * bf16_to_f32(x.bits[r * k + j]);
    const double got = tile[at];
    const double tol = kOrder * unit(w, x, r, i) + 1e-6 * std::fabs(want) + round16 * std::fabs(want);
    if (!(std::fabs(got - want) <= tol)) {
      ADD_FAILURE() << "row " << r << " col " << i << ": tile " << got << ", reference " << want << " (tolerance "
                    << tol << ")";
      ++bad;
    }
  }
}

// Llama-3-8B's K and N a multiple of 128 (4096) or not (1000: the last W tile 104 rows; 8200: 8 rows), at t from one
// row to 512: with 132 SMs, 4096 x 4096 splits K in 4 up to 256 rows and in 2 at 512, 1000 x 14336 in 4 everywhere,
// 8200 x 4096 in 2 at t <= 256 and not at 512 (130 CTAs). q4_K at every shape and t; the other formats (the same
// kernel, their own loads and dequantization) at 4096 x 4096 and 1000 x 14336 over fewer t.
TEST(CudaGemmQuantTile, MatchesTheExpansion) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  GemmWorkspace ws(512, 14336, 8200 * 4096);
  std::set<int> splits_seen;
  for (const DType dtype : kTileFormats) {
    const bool full = dtype == DType::Q4_K;
    std::vector<std::array<int64_t, 2>> shapes = {{4096, 4096}, {1000, 14336}};
    if (full) shapes.push_back({8200, 4096});
    for (const auto& s : shapes) {
      const QW w = make_weight(rng, dtype, s[0], s[1]);
      std::string why;
      ASSERT_TRUE(detail::gemm_quant_tile_supported(w.dev, nullptr, &why)) << dtype_name(dtype) << ": " << why;
      for (const int64_t t : full ? std::vector<int64_t>{1, 17, 128, 200, 512} : std::vector<int64_t>{17, 200, 512}) {
        const int splits = detail::gemm_quant_tile_splits(t, w.n, w.k, 8200 * 4096 / 2);
        splits_seen.insert(splits);
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " n=" << w.n << " k=" << w.k << " t=" << t << " splits=" << splits);
        const X16 x = make_x16(rng, t, w.k);
        DeviceBuffer ya = poisoned(sizeof(float) * t * w.n), yb = poisoned(sizeof(float) * t * w.n);
        run_x16(QuantGemm::TILE, w, x.dev.get(), ya.get(), false, t, ws, false);
        run_x16(QuantGemm::EXPAND, w, x.dev.get(), yb.get(), false, t, ws, false);
        synchronize();
        expect_tile_matches(w, x, download(ya, t * w.n, false), download(yb, t * w.n, false), t, false, nullptr, rng);
        if (HasFailure()) return;
      }
    }
  }
  EXPECT_TRUE(splits_seen.count(1) && (splits_seen.count(2) || splits_seen.count(4)))
      << "the shapes no longer cover both the split and the unsplit kernel on this device";
}

// accumulate (y += x Wᵀ) with f32 and bf16 outputs, and bf16 outputs written: split (1000 x 14336 at 200 rows) and
// unsplit (8200 x 4096 at 512) for q4_K, split for q6_K (another row image, the same epilogue).
TEST(CudaGemmQuantTile, AccumulateAndBf16Outputs) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  GemmWorkspace ws(512, 14336, 8200 * 4096);
  const std::tuple<DType, int64_t, int64_t, int64_t> cases[] = {
      {DType::Q4_K, 1000, 14336, 200}, {DType::Q4_K, 8200, 4096, 512}, {DType::Q6_K, 1000, 14336, 200}};
  for (const auto& [dtype, cn, ck, ct] : cases) {
    const int64_t c[3] = {cn, ck, ct};
    const QW w = make_weight(rng, dtype, c[0], c[1]);
    const int64_t t = c[2], count = t * w.n;
    const X16 x = make_x16(rng, t, w.k);
    for (const bool y16 : {false, true})
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "n=" << w.n << " k=" << w.k << " t=" << t << " y16=" << y16 << " accumulate=" << accumulate);
        std::vector<float> y0 = random_floats(rng, static_cast<size_t>(count), -4.0f, 4.0f);
        std::vector<uint16_t> y0_16(y0.size());
        for (size_t i = 0; i < y0.size(); ++i) {
          y0_16[i] = f32_to_bf16(y0[i]);
          if (y16) y0[i] = bf16_to_f32(y0_16[i]);  // what a bf16 y holds
        }
        const auto start = [&] {
          if (!accumulate) return poisoned((y16 ? 2 : 4) * static_cast<size_t>(count));
          return y16 ? to_device(y0_16) : to_device(y0);
        };
        DeviceBuffer ya = start(), yb = start();
        run_x16(QuantGemm::TILE, w, x.dev.get(), ya.get(), y16, t, ws, accumulate);
        run_x16(QuantGemm::EXPAND, w, x.dev.get(), yb.get(), y16, t, ws, accumulate);
        synchronize();
        expect_tile_matches(w, x, download(ya, count, y16), download(yb, count, y16), t, y16,
                            accumulate ? &y0 : nullptr, rng);
        if (HasFailure()) return;
      }
  }
}

// Two runs on NaN-poisoned outputs give the same bits: split-K's partial sums are added in a fixed order.
TEST(CudaGemmQuantTile, RunsAreBitForBitRepeatable) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  GemmWorkspace ws(512, 14336, 8200 * 4096);
  const int64_t cases[][3] = {{4096, 4096, 200}, {1000, 14336, 17}, {8200, 4096, 512}};
  for (const auto& c : cases) {
    const QW w = make_weight(rng, DType::Q4_K, c[0], c[1]);
    const int64_t t = c[2], count = t * w.n;
    const X16 x = make_x16(rng, t, w.k);
    for (const bool y16 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << w.n << " k=" << w.k << " t=" << t << " y16=" << y16);
      std::vector<std::vector<uint8_t>> runs;
      for (int run = 0; run < 2; ++run) {
        DeviceBuffer y = poisoned((y16 ? 2 : 4) * static_cast<size_t>(count));
        run_x16(QuantGemm::TILE, w, x.dev.get(), y.get(), y16, t, ws, false);
        synchronize();
        runs.push_back(to_host<uint8_t>(y, y.bytes()));
      }
      EXPECT_TRUE(runs[0] == runs[1]) << "two runs of the tile path differ";
    }
  }
}

// The tile path inside a captured CUDA graph (the tensor map, with x's address, is a kernel parameter; split-K's two
// kernels both captured), replayed with new x values: the bits of a plain launch on the same x.
TEST(CudaGemmQuantTile, CapturedGraphReplaysWithNewInputs) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const QW w = make_weight(rng, DType::Q4_K, 1000, 4096);
  const int64_t t = 200;
  GemmWorkspace ws(t, w.k, w.n * w.k);
  ASSERT_GT(detail::gemm_quant_tile_splits(t, w.n, w.k, w.n * w.k / 2), 1) << "meant to capture the split form";
  DeviceBuffer x16(2 * static_cast<size_t>(t * w.k)), yg(sizeof(float) * t * w.n), yd(sizeof(float) * t * w.n);
  cudaStream_t stream = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CudaOptions o = cuda_options();
  o.quant_gemm = QuantGemm::TILE;
  const CudaOptionsScope scope(o);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  matmul_x16(w.dev, x16.get(), yg.as<float>(), t, ws, stream);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    const X16 x = make_x16(rng, t, w.k);
    x16.upload(x.bits.data(), x.bits.size() * 2);
    yg.fill_bytes(0xFF);
    yd.fill_bytes(0xFF);
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    matmul_x16(w.dev, x16.get(), yd.as<float>(), t, ws, stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(to_host<uint8_t>(yg, yg.bytes()) == to_host<uint8_t>(yd, yd.bytes())) << "replay " << replay;
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// quant_gemm=auto takes the tile path up to 512 rows and the expansion above, in matmul_x16 and in matmul (f32 x,
// rounded to bf16 first): the tile kernel is deterministic, so its bits identify it. A misaligned x16 (TMA wants 16
// bytes) falls back to the expansion even under quant_gemm=tile; other formats are refused by the tile path itself.
TEST(CudaGemmQuantTile, OptionRoutesAndFallsBack) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const QW w = make_weight(rng, DType::Q4_K, 640, 2048);
  GemmWorkspace ws(600, 2048, 640 * 2048);
  const auto x16_bits = [&](QuantGemm mode, const void* x16, int64_t t) {
    DeviceBuffer y = poisoned(sizeof(float) * t * w.n);
    run_x16(mode, w, x16, y.get(), false, t, ws, false);
    synchronize();
    return to_host<uint8_t>(y, y.bytes());
  };
  for (const int64_t t : {200, 600}) {
    SCOPED_TRACE(::testing::Message() << "t=" << t);
    const X16 x = make_x16(rng, t, w.k);
    const std::vector<uint8_t> tile = x16_bits(QuantGemm::TILE, x.dev.get(), t);
    const std::vector<uint8_t> automatic = x16_bits(QuantGemm::AUTO, x.dev.get(), t);
    std::vector<float> xf(x.bits.size());
    for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x.bits[i]);
    DeviceBuffer xd = to_device(xf), ym = poisoned(sizeof(float) * t * w.n);
    matmul(w.dev, xd.as<float>(), ym.as<float>(), t, ws, nullptr);
    synchronize();
    const std::vector<uint8_t> f32_input = to_host<uint8_t>(ym, ym.bytes());
    // The paths, asked directly: the expansion's cuBLASLt GEMM and the tile kernel can give the same bits (both run
    // wgmma over K in order, unsplit at this K), so equal outputs past the limit would not show the route.
    const bool takes_tile = t <= detail::quant_tile_auto_max_t(DType::Q4_K);
    EXPECT_EQ(detail::matmul_x16_path(w.dev, x.dev.get(), t) == detail::GemmPath::TILE, takes_tile)
        << "matmul_x16 under auto";
    EXPECT_EQ(detail::gemm_default_path(DType::Q4_K, t, w.n, w.k) == detail::GemmPath::TILE, takes_tile)
        << "matmul under auto";
    if (takes_tile) {
      EXPECT_TRUE(automatic == tile) << "matmul_x16 under auto did not give the tile path's bits";
      EXPECT_TRUE(f32_input == tile) << "matmul under auto did not give the tile path's bits";
    }
  }
  // x 8 bytes past a 16-byte boundary (cuBLASLt takes it, TMA does not): the expansion's result under quant_gemm=tile.
  const int64_t t = 64;
  const X16 x = make_x16(rng, t, w.k);
  std::vector<uint16_t> padded(x.bits.size() + 4, 0);
  std::memcpy(padded.data() + 4, x.bits.data(), x.bits.size() * 2);
  DeviceBuffer xs = to_device(padded), ya = poisoned(sizeof(float) * t * w.n), yb = poisoned(sizeof(float) * t * w.n);
  const void* shifted = static_cast<const uint16_t*>(xs.get()) + 4;
  EXPECT_FALSE(detail::gemm_quant_tile_supported(w.dev, shifted));
  EXPECT_THROW(detail::launch_gemm_quant_tile(w.dev, shifted, ya.get(), false, t, false, nullptr, 0, nullptr), Error);
  EXPECT_NO_THROW(run_x16(QuantGemm::TILE, w, shifted, ya.get(), false, t, ws, false));
  run_x16(QuantGemm::EXPAND, w, x.dev.get(), yb.get(), false, t, ws, false);
  synchronize();
  expect_tile_matches(w, x, download(ya, t * w.n, false), download(yb, t * w.n, false), t, false, nullptr, rng);
  // Another format: no tile path, and forcing it is an error.
  const std::vector<uint8_t> q40 = random_weight(rng, DType::Q4_0, 64, 256);
  const DeviceWeight w40 = upload_weight(DType::Q4_0, q40.data(), 64, 256);
  EXPECT_FALSE(detail::gemm_quant_tile_supported(w40, nullptr));
  DeviceBuffer xf(sizeof(float) * 64 * 256), y = poisoned(sizeof(float) * 64 * 64);
  EXPECT_THROW(detail::matmul_path(w40, xf.as<float>(), y.as<float>(), 64, ws, nullptr, false, GemmPath::TILE), Error);
  synchronize();
}

}  // namespace
}  // namespace tessera::cuda::test
