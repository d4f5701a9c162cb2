// The GEMV units (kernels/quant_units.h: what gemv_quant_kernel.cuh and gemm_rows.cu run per thread and unit)
// executed on the host, over weights split as upload_weight splits them (split_layout.h) and activations quantized as
// quantize_q8 quantizes them, against the format's own Format<D>::dot_q8 (quant/format_traits.h). No GPU needed: the
// index arithmetic of every unit (which bytes, which scales, which activation blocks) is checked here, and the GPU
// tests (test_gemv.cpp, test_gemm.cpp) then check the kernels around them.
//
// Tolerance: both sides sum the same integer dot products and differ only in the order of the float products and sums
// (per 32-block there vs per unit here): a few f32 roundings of terms bounded by sum |w x| (with a minimum, q4_K and
// q5_K round d sc q and dmin m apart: sum (|d sc q| + |dmin m|) |x| <= sum (|w| + 2 |dmin m|) |x|); 1e-5 of that.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/kernels/quant_units.h"
#include "backends/cuda/split_layout.h"
#include "cuda_test_util.h"
#include "quant/format_traits.h"
#include "quant/quant.h"

namespace tessera::cuda::test {
namespace {

template <DType D>
void check_units(int64_t n, int64_t k, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(D) << " n=" << n << " k=" << k);
  using F = Format<D>;
  using L = SplitLayout<D>;
  using Q = detail::QuantFmt<D>;
  const std::vector<uint8_t> w = random_weight(rng, D, n, k);
  const uint64_t row_bytes = *dtype_row_bytes(D, static_cast<uint64_t>(k));
  // The upload's split (weights.cpp): quants, scales, then the tail after every block's scales.
  const size_t nb = static_cast<size_t>(n * k / F::kBlockSize);
  std::vector<uint8_t> quants(nb * L::kQuantBytes), scales(nb * (L::kScaleBytes + L::kTailBytes));
  for (size_t i = 0; i < nb; ++i) {
    typename F::Block b;
    std::memcpy(&b, w.data() + i * sizeof(b), sizeof(b));
    split_block<D>(b, &quants[i * L::kQuantBytes], &scales[i * L::kScaleBytes],
                   &scales[nb * L::kScaleBytes + i * L::kTailBytes]);
  }
  const std::vector<float> x = random_floats(rng, static_cast<size_t>(k), -3.0f, 3.0f);
  std::vector<int8_t> xq(static_cast<size_t>(k));
  std::vector<float2> xds(static_cast<size_t>(k / 32));
  quantize_q8_ref(x.data(), xq.data(), xds.data(), k);
  std::vector<BlockQ8Act> acts(static_cast<size_t>(k / 32));
  for (int64_t b = 0; b < k / 32; ++b) {
    acts[b].d = xds[b].x;
    acts[b].s = xds[b].y;
    std::memcpy(acts[b].qs, xq.data() + 32 * b, 32);
  }
  const int units = static_cast<int>(k / Q::kUnit);
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* qr = quants.data() + static_cast<size_t>(r) * units * Q::kQuantBytes;
    const uint8_t* sr = scales.data() + static_cast<size_t>(r) * units * Q::kScaleBytes;
    const uint8_t* tr = detail::tail_row<D>(scales.data(), static_cast<int>(n), units, static_cast<size_t>(r));
    double got = 0;
    for (int b = 0; b < units; ++b) {
      uint4 wv[Q::kVecs];
      typename Q::Scale sc;
      Q::load(qr, sr, tr, b, wv, sc);
      got += Q::dot(wv, sc, Q::Act::load(xq.data(), xds.data(), b));
    }
    double want = 0, mag = 0;
    std::vector<float> wr(static_cast<size_t>(k));
    dequantize_row(D, w.data() + r * row_bytes, wr.data(), k);
    for (int64_t b = 0; b < k / F::kBlockSize; ++b) {
      typename F::Block blk;
      std::memcpy(&blk, w.data() + r * row_bytes + b * sizeof(blk), sizeof(blk));
      want += F::dot_q8(blk, &acts[static_cast<size_t>(b * F::kBlockSize / 32)]);
      for (int e = 0; e < F::kBlockSize; ++e) {
        const int64_t j = b * F::kBlockSize + e;
        double term = std::fabs(wr[static_cast<size_t>(j)]);
        if constexpr (D == DType::Q4_K ||
                      D == DType::Q5_K) {  // d sc q and dmin m are rounded apart: |d sc q| + |dmin m|
          int sc = 0, m = 0;
          format_detail::q4_k_scale_min(e / 32, blk.scales, &sc, &m);
          term += 2.0 * std::fabs(format_detail::half_value(blk.dmin)) * m;
        } else if constexpr (D == DType::Q2_K) {  // the same with q2_K's 4-bit minimum of the 16-element sub-block
          term += 2.0 * std::fabs(format_detail::half_value(blk.dmin)) * (blk.scales[e / 16] >> 4);
        } else if constexpr (D == DType::Q5_1) {  // d q and m are rounded apart
          term += 2.0 * std::fabs(format_detail::half_value(blk.m));
        } else if constexpr (D == DType::Q5_0) {  // d q and 16 d are rounded apart
          term += 32.0 * std::fabs(format_detail::half_value(blk.d));
        }
        if constexpr (D == DType::TQ2_0)  // the unit sums d_x q q_x (q = 0..3) and subtracts d_x sum q_x apart
          term += std::fabs(format_detail::half_value(blk.d));
        mag += term * std::fabs(xds[static_cast<size_t>(j / 32)].x * xq[static_cast<size_t>(j)]);
      }
    }
    ASSERT_NEAR(got, want, 1e-5 * mag + 1e-30) << "row " << r;
  }
}

TEST(CudaQuantUnits, KQuantUnitsEqualTheTraitsDot) {
  std::mt19937 rng(test_seed());
  for (const int64_t k : {256, 512, 1280, 4096, 14336}) {
    check_units<DType::Q4_K>(5, k, rng);
    check_units<DType::Q5_K>(5, k, rng);
    check_units<DType::Q6_K>(5, k, rng);
    check_units<DType::IQ4_XS>(5, k, rng);
    check_units<DType::Q2_K>(5, k, rng);
    check_units<DType::Q3_K>(5, k, rng);
    check_units<DType::TQ2_0>(5, k, rng);
    if (HasFatalFailure()) return;
  }
}

// q5_0 and q5_1: a unit is one 32-block with its fifth bits from the tail (qh after every block's scales). Odd block
// counts per row and in the table (k = 32, 96, 544; n = 3, 5) put q5_0's tail on a 2-byte boundary.
TEST(CudaQuantUnits, Q5UnitsEqualTheTraitsDot) {
  std::mt19937 rng(test_seed());
  for (const int64_t k : {32, 96, 544, 576, 4096, 14336}) {
    check_units<DType::Q5_0>(5, k, rng);
    check_units<DType::Q5_1>(5, k, rng);
    check_units<DType::Q5_0>(3, k, rng);
    check_units<DType::Q5_1>(3, k, rng);
    if (HasFatalFailure()) return;
  }
}

// q5_high4 spreads four bits of qh into bit 4 of four bytes: every 4-bit value at every shift, with the other bits of
// qh set (they must not leak in).
TEST(CudaQuantUnits, Q5HighBitsSpreadToBit4OfEachByte) {
  for (uint32_t v = 0; v < 16; ++v)
    for (int s = 0; s <= 28; s += 4) {
      const uint32_t qh = (v << s) | ~(0xFu << s);
      const uint32_t got = detail::q5_high4(qh, s);
      for (int b = 0; b < 4; ++b)
        ASSERT_EQ((got >> (8 * b)) & 0xFFu, ((v >> b) & 1u) << 4) << "v " << v << " shift " << s << " byte " << b;
    }
}

// The embedding's element lookup (split_value) gives the traits' dequantized values: bit for bit on the host (the
// same operations in the same order; for q4_K, q5_K, q6_K and iq4_xs nvcc may contract a * b - c into an FMA on the
// device, a last-bit difference; q5_0, q5_1, q2_K and q3_K round each operation on its own there too).
template <DType D>
void check_values(int64_t n, int64_t k, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(D) << " n=" << n << " k=" << k);
  using F = Format<D>;
  using L = SplitLayout<D>;
  const std::vector<uint8_t> w = random_weight(rng, D, n, k);
  const size_t nb = static_cast<size_t>(n * k / F::kBlockSize);
  std::vector<uint8_t> quants(nb * L::kQuantBytes), scales(nb * (L::kScaleBytes + L::kTailBytes));
  for (size_t i = 0; i < nb; ++i) {
    typename F::Block b;
    std::memcpy(&b, w.data() + i * sizeof(b), sizeof(b));
    split_block<D>(b, &quants[i * L::kQuantBytes], &scales[i * L::kScaleBytes],
                   &scales[nb * L::kScaleBytes + i * L::kTailBytes]);
  }
  std::vector<float> ref(static_cast<size_t>(n * k));
  dequantize_row(D, w.data(), ref.data(), n * k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i)
      ASSERT_EQ(detail::split_value<D>(quants.data(), scales.data(), static_cast<int>(n), static_cast<size_t>(r),
                                       static_cast<int>(k), static_cast<int>(i)),
                ref[static_cast<size_t>(r * k + i)])
          << "row " << r << " element " << i;
}

TEST(CudaQuantUnits, EmbeddingValuesEqualTheTraitsDequantize) {
  std::mt19937 rng(test_seed());
  check_values<DType::Q4_K>(3, 768, rng);
  check_values<DType::Q5_K>(3, 768, rng);
  check_values<DType::Q6_K>(3, 768, rng);
  check_values<DType::IQ4_XS>(3, 768, rng);
  check_values<DType::Q2_K>(3, 768, rng);
  check_values<DType::Q3_K>(3, 768, rng);
  check_values<DType::Q5_0>(3, 544, rng);  // 51 blocks: q5_0's tail of qh on a 2-byte boundary
  check_values<DType::Q5_1>(3, 544, rng);
  check_values<DType::TQ2_0>(3, 768, rng);
}

// iq4_nl's table lookup in byte permutes (what the GEMVs run per quant word) against format_detail::iq4nl_value: every
// code in every nibble position, and random words (a code's neighbours must not leak into its byte).
TEST(CudaQuantUnits, Iq4nlWordsEqualTheTable) {
  std::mt19937 rng(test_seed());
  auto check = [](uint32_t w) {
    int lo = 0, hi = 0;
    detail::iq4nl_words(w, lo, hi);
    for (int b = 0; b < 4; ++b) {
      const int byte = static_cast<int>((w >> (8 * b)) & 0xFFu);
      ASSERT_EQ(static_cast<int8_t>(static_cast<uint32_t>(lo) >> (8 * b)), format_detail::iq4nl_value(byte & 0xF))
          << std::hex << w << " byte " << b;
      ASSERT_EQ(static_cast<int8_t>(static_cast<uint32_t>(hi) >> (8 * b)), format_detail::iq4nl_value(byte >> 4))
          << std::hex << w << " byte " << b;
    }
  };
  for (uint32_t code = 0; code < 16; ++code)
    for (int nib = 0; nib < 8; ++nib) check((code << (4 * nib)) | (nib % 2 ? 0x5u : 0xA0u));
  for (int i = 0; i < 4096; ++i) check(static_cast<uint32_t>(rng()));
}

// The units' own twins of the device intrinsics: dp4a multiplies signed bytes.
TEST(CudaQuantUnits, HostDp4aIsSigned) {
  EXPECT_EQ(detail::unit::dp4a(0x7F80FF01, 0x01FF0280, 10), 10 + 127 * 1 + (-128) * (-1) + (-1) * 2 + 1 * (-128));
}

}  // namespace
}  // namespace tessera::cuda::test
