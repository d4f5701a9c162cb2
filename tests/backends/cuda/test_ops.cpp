// RMSNorm, SwiGLU, residual add, embedding and argmax kernels against plain-loop references.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cuda::test {
namespace {

// A quantized copy written by a kernel must equal the host quantizer applied to the same kernel's f32 output.
void expect_q8_of(const std::vector<float>& y, const DeviceBuffer& q8, const DeviceBuffer& ds, int64_t n) {
  std::vector<int8_t> q_ref(n);
  std::vector<float2> ds_ref(n / 32);
  quantize_q8_ref(y.data(), q_ref.data(), ds_ref.data(), n);
  EXPECT_EQ(to_host<int8_t>(q8, n), q_ref);
  const auto ds_dev = to_host<float2>(ds, n / 32);
  for (int64_t b = 0; b < n / 32; ++b) {
    EXPECT_EQ(ds_dev[b].x, ds_ref[b].x) << "block " << b;
    EXPECT_EQ(ds_dev[b].y, ds_ref[b].y) << "block " << b;
  }
}

TEST(CudaOps, RmsnormMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  // d = 6 takes the scalar kernel (d % 4 != 0); the others the register kernel with 1, 2 and 4 vectors per thread.
  for (const int64_t d : {6, 64, 576, 1000, 4096, 8192, 16384}) {
    for (const int64_t t : {1, 3}) {
      for (const bool quant : {false, true}) {
        if (quant && d % 32 != 0) continue;
        SCOPED_TRACE(::testing::Message() << "d=" << d << " t=" << t << " quant=" << quant);
        const auto x = random_floats(rng, t * d, -3.0f, 3.0f);
        const auto w = random_floats(rng, d, 0.5f, 1.5f);
        DeviceBuffer xd = to_device(x), wd = to_device(w), yd = poisoned(sizeof(float) * t * d);
        DeviceBuffer q8 = poisoned(t * d), ds = poisoned(sizeof(float2) * (t * d / 32 + 1));
        rmsnorm(xd.as<float>(), wd.as<float>(), yd.as<float>(), t, d, 1e-5f, nullptr, quant ? q8.as<int8_t>() : nullptr,
                quant ? ds.as<float2>() : nullptr);
        synchronize();
        const auto y = to_host<float>(yd, t * d);
        std::vector<double> ref(t * d);
        rmsnorm_ref(x.data(), w.data(), ref.data(), t, d, 1e-5f);
        // f32 sum of squares (relative error ~ log2(d) * 2^-24) and three rounded products: 1e-5 relative is
        // ample; the absolute floor covers elements near zero.
        for (int64_t i = 0; i < t * d; ++i)
          ASSERT_NEAR(y[i], ref[i], 1e-5 * std::fabs(ref[i]) + 1e-7) << "element " << i;
        if (quant) expect_q8_of(y, q8, ds, t * d);
      }
    }
  }
}

// The 16-bit copy a kernel writes for matmul_x16 must be its f32 output rounded to nearest even, bit for bit.
void expect_16bit_of(const std::vector<float>& y, const DeviceBuffer& y16, DType type, int64_t n) {
  const auto bits = to_host<uint16_t>(y16, n);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const uint16_t want = float_to_cache(type, y[i]);
    if (bits[i] != want) {
      ADD_FAILURE() << "element " << i << ": 16-bit output " << bits[i] << ", f32 output " << y[i] << " rounds to "
                    << want;
      ++bad;
    }
  }
}

// rmsnorm's 16-bit output (alone, the way the prefill executor calls it, and beside the f32 output) equals its f32
// output rounded; the shapes cover the scalar kernel (d = 6, and an odd y16 address), and the register kernel.
TEST(CudaOps, Rmsnorm16BitOutputIsTheF32OutputRounded) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const int64_t d : {6, 576, 4096, 16384}) {
    for (const DType type : {DType::BF16, DType::F16}) {
      for (const int64_t off : {0, 1}) {
        SCOPED_TRACE(::testing::Message() << "d=" << d << " type=" << dtype_name(type) << " y16 offset=" << off);
        const int64_t t = 3;
        const auto x = random_floats(rng, t * d, -3.0f, 3.0f);
        const auto w = random_floats(rng, d, 0.5f, 1.5f);
        DeviceBuffer xd = to_device(x), wd = to_device(w), yd = poisoned(sizeof(float) * (t * d + 1));
        DeviceBuffer y16a = poisoned(2 * (t * d + 1)), y16b = poisoned(2 * (t * d + 1));
        // An odd y16 address sends the 16-bit call to the scalar kernel, whose sum of squares runs in another order
        // than the register kernel's; the f32 output it is held to comes from the same kernel (an unaligned y).
        rmsnorm(xd.as<float>(), wd.as<float>(), yd.as<float>() + off, t, d, 1e-5f, nullptr);
        rmsnorm(xd.as<float>(), wd.as<float>(), nullptr, t, d, 1e-5f, nullptr, nullptr, nullptr,
                y16a.as<uint16_t>() + off, type);
        synchronize();
        const auto y_all = to_host<float>(yd, t * d + 1);
        const std::vector<float> y(y_all.begin() + off, y_all.begin() + off + t * d);
        const auto a = to_host<uint16_t>(y16a, t * d + 1);
        DeviceBuffer shifted = to_device(std::vector<uint16_t>(a.begin() + off, a.begin() + off + t * d));
        expect_16bit_of(y, shifted, type, t * d);
        // Both outputs in one pass (the same kernel again): the f32 one unchanged.
        DeviceBuffer yd2 = poisoned(sizeof(float) * (t * d + 1));
        rmsnorm(xd.as<float>(), wd.as<float>(), yd2.as<float>() + off, t, d, 1e-5f, nullptr, nullptr, nullptr,
                y16b.as<uint16_t>() + off, type);
        synchronize();
        const auto y2 = to_host<float>(yd2, t * d + 1);
        EXPECT_EQ(std::vector<float>(y2.begin() + off, y2.begin() + off + t * d), y);
        const auto b = to_host<uint16_t>(y16b, t * d + 1);
        DeviceBuffer shifted_b = to_device(std::vector<uint16_t>(b.begin() + off, b.begin() + off + t * d));
        expect_16bit_of(y, shifted_b, type, t * d);
      }
    }
  }
}

TEST(CudaOps, RmsnormInPlace) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t d = 576;
  const auto x = random_floats(rng, d), w = random_floats(rng, d);
  DeviceBuffer xd = to_device(x), wd = to_device(w);
  rmsnorm(xd.as<float>(), wd.as<float>(), xd.as<float>(), 1, d, 1e-6f, nullptr);
  synchronize();
  const auto y = to_host<float>(xd, d);
  std::vector<double> ref(d);
  rmsnorm_ref(x.data(), w.data(), ref.data(), 1, d, 1e-6f);
  for (int64_t i = 0; i < d; ++i) ASSERT_NEAR(y[i], ref[i], 1e-5 * std::fabs(ref[i]) + 1e-7);
}

TEST(CudaOps, SwigluAndAddMatchReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const int64_t n : {32, 1000, 14336}) {
    for (const bool quant : {false, true}) {
      if (quant && n % 32 != 0) continue;
      SCOPED_TRACE(::testing::Message() << "n=" << n << " quant=" << quant);
      const auto g = random_floats(rng, n, -8.0f, 8.0f), u = random_floats(rng, n, -2.0f, 2.0f);
      DeviceBuffer gd = to_device(g), ud = to_device(u), od = poisoned(sizeof(float) * n);
      DeviceBuffer q8 = poisoned(n), ds = poisoned(sizeof(float2) * (n / 32 + 1));
      swiglu(gd.as<float>(), ud.as<float>(), od.as<float>(), n, nullptr, quant ? q8.as<int8_t>() : nullptr,
             quant ? ds.as<float2>() : nullptr);
      synchronize();
      const auto o = to_host<float>(od, n);
      // expf is within 2 ulp; one division and one product add 1 ulp each.
      for (int64_t i = 0; i < n; ++i) {
        const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
        ASSERT_NEAR(o[i], ref, 1e-6 * std::fabs(ref) + 1e-30) << "element " << i;
      }
      if (quant) expect_q8_of(o, q8, ds, n);
    }
    // add: y += x is one correctly rounded f32 addition, so it must match the host's addition exactly. n = 1000 with
    // an offset pointer exercises the scalar path, the others the float4 path.
    const auto a = random_floats(rng, n), b = random_floats(rng, n);
    DeviceBuffer ad = to_device(a), bd = to_device(b);
    const int64_t off = n == 1000 ? 1 : 0;
    add(ad.as<float>() + off, bd.as<float>() + off, n - off, nullptr);
    synchronize();
    const auto y = to_host<float>(ad, n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], i < off ? a[i] : a[i] + b[i]) << "element " << i;
  }
}

// swiglu_rows over gate and up read with a row stride (the halves of one merged [t, 2n] matmul output, and
// separate contiguous tensors): its f32 output equals swiglu's on the same rows bit for bit, its 16-bit output is that
// rounded. n = 1000 with ld_in = 2n + 2 and offset pointers takes the scalar kernel, the others the float4 kernel.
TEST(CudaOps, SwigluRowsMatchesSwigluWithStridedInputs) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t t = 5;
  for (const int64_t n : {32, 1000, 14336}) {
    for (const bool merged : {true, false}) {
      for (const DType type : {DType::BF16, DType::F16}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " merged=" << merged << " type=" << dtype_name(type));
        const int64_t ld_in = merged ? (n == 1000 ? 2 * n + 2 : 2 * n) : n;
        const int64_t off = n == 1000 ? 1 : 0;
        // merged: row r holds gate at [r * ld_in, + n) and up at [r * ld_in + n, + n); else two tensors.
        const auto gbuf = random_floats(rng, t * ld_in + off, -8.0f, 8.0f);
        const auto ubuf = merged ? gbuf : random_floats(rng, t * ld_in + off, -2.0f, 2.0f);
        DeviceBuffer gd = to_device(gbuf), ud = merged ? DeviceBuffer() : to_device(ubuf);
        const float* gp = gd.as<float>() + off;
        const float* up = merged ? gp + n : ud.as<float>() + off;
        DeviceBuffer od = poisoned(sizeof(float) * t * n), o16 = poisoned(2 * t * n);
        swiglu_rows(gp, up, ld_in, od.as<float>(), o16.as<uint16_t>(), type, t, n, nullptr);
        // swiglu on each row's gate and up copied out contiguously: the reference values.
        std::vector<float> g(t * n), u(t * n);
        for (int64_t r = 0; r < t; ++r)
          for (int64_t i = 0; i < n; ++i) {
            g[r * n + i] = gbuf[off + r * ld_in + i];
            u[r * n + i] = ubuf[off + r * ld_in + (merged ? n : 0) + i];
          }
        DeviceBuffer gc = to_device(g), uc = to_device(u), oc = poisoned(sizeof(float) * t * n);
        swiglu(gc.as<float>(), uc.as<float>(), oc.as<float>(), t * n, nullptr);
        // The 16-bit output alone (as the prefill executor calls it).
        DeviceBuffer o16b = poisoned(2 * t * n);
        swiglu_rows(gp, up, ld_in, nullptr, o16b.as<uint16_t>(), type, t, n, nullptr);
        synchronize();
        const auto ref = to_host<float>(oc, t * n);
        EXPECT_EQ(to_host<float>(od, t * n), ref);
        expect_16bit_of(ref, o16, type, t * n);
        expect_16bit_of(ref, o16b, type, t * n);
      }
    }
  }
}

// swiglu_rows16 over a 16-bit merged [gate | up] (what matmul_x16_out16 writes for prefill): its f32 output equals
// swiglu's on the same values widened to f32, bit for bit (both form silu(g) * u in f32 with the same device code);
// its 16-bit output is that rounded. n = 1000 with ld_in = 2n + 2 and an odd offset takes the scalar kernel.
TEST(CudaOps, SwigluRows16MatchesSwigluOnWidenedInputs) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t t = 5;
  for (const int64_t n : {32, 1000, 14336}) {
    for (const DType in_type : {DType::BF16, DType::F16}) {
      for (const DType out_type : {DType::BF16, DType::F16}) {
        SCOPED_TRACE(::testing::Message()
                     << "n=" << n << " in=" << dtype_name(in_type) << " out=" << dtype_name(out_type));
        const int64_t ld_in = n == 1000 ? 2 * n + 2 : 2 * n, off = n == 1000 ? 1 : 0;
        const auto vals = random_floats(rng, t * ld_in + off, -8.0f, 8.0f);
        std::vector<uint16_t> bits(vals.size());
        std::vector<float> g(t * n), u(t * n);
        for (size_t i = 0; i < vals.size(); ++i) bits[i] = float_to_cache(in_type, vals[i]);
        const auto widen = [&](size_t i) {
          return in_type == DType::BF16 ? bf16_to_f32(bits[i]) : fp16_to_f32(bits[i]);
        };
        for (int64_t r = 0; r < t; ++r)
          for (int64_t i = 0; i < n; ++i) {
            g[r * n + i] = widen(static_cast<size_t>(off + r * ld_in + i));
            u[r * n + i] = widen(static_cast<size_t>(off + r * ld_in + n + i));
          }
        DeviceBuffer in = to_device(bits), gc = to_device(g), uc = to_device(u);
        DeviceBuffer oc = poisoned(sizeof(float) * t * n), of = poisoned(sizeof(float) * t * n);
        DeviceBuffer o16 = poisoned(2 * t * n);
        const uint16_t* gp = in.as<uint16_t>() + off;
        swiglu_rows16(gp, gp + n, in_type, ld_in, of.as<float>(), nullptr, DType::BF16, t, n, nullptr);
        swiglu_rows16(gp, gp + n, in_type, ld_in, nullptr, o16.get(), out_type, t, n, nullptr);
        swiglu(gc.as<float>(), uc.as<float>(), oc.as<float>(), t * n, nullptr);
        synchronize();
        const auto ref = to_host<float>(oc, t * n);
        EXPECT_EQ(to_host<float>(of, t * n), ref);
        expect_16bit_of(ref, o16, out_type, t * n);
      }
    }
  }
  DeviceBuffer x(2 * 64), y(sizeof(float) * 64);
  EXPECT_THROW(swiglu_rows16(x.get(), x.get(), DType::F32, 8, y.as<float>(), nullptr, DType::BF16, 4, 4, nullptr),
               Error);
  EXPECT_THROW(swiglu_rows16(x.get(), x.get(), DType::BF16, 8, y.as<float>(), x.get(), DType::BF16, 4, 4, nullptr),
               Error);  // both outputs
  EXPECT_THROW(swiglu_rows16(x.get(), x.get(), DType::BF16, 3, y.as<float>(), nullptr, DType::BF16, 4, 4, nullptr),
               Error);  // ld_in < n
}

TEST(CudaOps, EmbeddingMatchesDequantizedRows) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t n_vocab = 300, d = 576;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    SCOPED_TRACE(dtype_name(dtype));
    const auto table = random_weight(rng, dtype, n_vocab, d);
    DeviceWeight w = upload_weight(dtype, table.data(), n_vocab, d);
    const std::vector<int32_t> ids = {0, 299, 17, 17, -1, 300};  // the last two are out of range
    DeviceBuffer idd = to_device(ids), out = poisoned(sizeof(float) * ids.size() * d);
    embedding(w, idd.as<int32_t>(), out.as<float>(), static_cast<int64_t>(ids.size()), nullptr);
    synchronize();
    const auto o = to_host<float>(out, ids.size() * d);
    const uint64_t row_bytes = *dtype_row_bytes(dtype, d);
    std::vector<float> row(d);
    for (size_t t = 0; t < ids.size(); ++t) {
      const bool valid = ids[t] >= 0 && ids[t] < n_vocab;
      if (valid) dequantize_row(dtype, table.data() + ids[t] * row_bytes, row.data(), d);
      for (int64_t i = 0; i < d; ++i) {
        // Dequantization is exact in f32 except q4_1's d * q + m, which the device may fuse into one rounding.
        if (valid)
          ASSERT_NEAR(o[t * d + i], row[i], dtype == DType::Q4_1 ? 1e-6 * std::fabs(row[i]) + 1e-7 : 0.0)
              << "token " << t << " element " << i;
        else
          ASSERT_TRUE(std::isnan(o[t * d + i])) << "token " << t << " element " << i;
      }
    }
  }
}

int32_t argmax_ref(const std::vector<float>& x) {
  int32_t best = -1;
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isnan(x[i]) && (best < 0 || x[i] > x[best])) best = static_cast<int32_t>(i);
  return best < 0 ? 0 : best;
}

TEST(CudaOps, ArgmaxFirstMaxSkippingNans) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  ArgmaxWorkspace ws(200000);
  DeviceBuffer out = poisoned(sizeof(int32_t));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto run = [&](const std::vector<float>& x) {
    DeviceBuffer xd = to_device(x);
    argmax(xd.as<float>(), static_cast<int64_t>(x.size()), out.as<int32_t>(), ws, nullptr);
    synchronize();
    return to_host<int32_t>(out, 1)[0];
  };
  for (const int64_t n : {1, 100, 49152, 128256, 200000}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    auto x = random_floats(rng, n, -30.0f, 30.0f);
    EXPECT_EQ(run(x), argmax_ref(x));
    // Ties resolve to the first index, also across blocks; NaNs are skipped even where they sit at the maximum.
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    const int64_t a = pick(rng), b = pick(rng);
    x[a] = x[b] = 100.0f;
    EXPECT_EQ(run(x), std::min(a, b));
    x[pick(rng)] = nan;
    x[0] = nan;
    EXPECT_EQ(run(x), argmax_ref(x));
  }
  EXPECT_EQ(run({-0.0f, 0.0f, -1.0f}), 0);  // -0 == +0: the first wins
  EXPECT_EQ(run({-5.0f, -std::numeric_limits<float>::infinity(), -4.0f}), 2);
  EXPECT_EQ(run({nan, nan}), 0);
}

// argmax_rows: per row the answer argmax gives, in one launch (random rows, ties, NaN rows, -0/+0).
TEST(CudaOps, ArgmaxRowsEqualsArgmaxPerRow) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t n : {1, 3, 49152, 128256}) {
    for (const int64_t t : {1, 5, 32}) {
      SCOPED_TRACE(::testing::Message() << "t=" << t << " n=" << n);
      auto x = random_floats(rng, t * n, -30.0f, 30.0f);
      std::uniform_int_distribution<int64_t> pick(0, n - 1);
      std::vector<int32_t> want(static_cast<size_t>(t));
      for (int64_t r = 0; r < t; ++r) {
        float* row = x.data() + r * n;
        if (r % 3 == 1) {  // a tie at the maximum: the first index wins
          const int64_t a = pick(rng), b = pick(rng);
          row[a] = row[b] = 100.0f;
        }
        if (r % 4 == 2) row[pick(rng)] = nan;  // skipped, even next to the maximum
        if (r == t - 1 && t > 1)
          for (int64_t i = 0; i < n; ++i) row[i] = nan;  // all NaN: 0
        want[static_cast<size_t>(r)] = argmax_ref(std::vector<float>(row, row + n));
      }
      DeviceBuffer xd = to_device(x), out = poisoned(sizeof(int32_t) * t);
      argmax_rows(xd.as<float>(), t, n, out.as<int32_t>(), nullptr);
      synchronize();
      EXPECT_EQ(to_host<int32_t>(out, t), want);
    }
  }
  DeviceBuffer z = to_device(std::vector<float>{-0.0f, 0.0f, 1.0f, 1.0f}), out = poisoned(2 * sizeof(int32_t));
  argmax_rows(z.as<float>(), 2, 2, out.as<int32_t>(), nullptr);
  synchronize();
  EXPECT_EQ(to_host<int32_t>(out, 2), (std::vector<int32_t>{0, 0}));
  EXPECT_THROW(argmax_rows(z.as<float>(), 0, 2, out.as<int32_t>(), nullptr), Error);
}

// row_scores: per row the log-sum-exp and the target's logit, against backend::DeviceSession::score_row (double).
TEST(CudaOps, RowScoresEqualTheHostLogSoftmax) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const int64_t n : {1, 7, 49152, 128256}) {
    for (const int64_t t : {1, 5, 256}) {
      SCOPED_TRACE(::testing::Message() << "t=" << t << " n=" << n);
      auto x = random_floats(rng, t * n, -30.0f, 30.0f);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(n - 1));
      std::vector<int32_t> targets(static_cast<size_t>(t));
      for (int32_t& id : targets) id = pick(rng);
      if (t > 1) x[static_cast<size_t>(n + pick(rng))] = 80.0f;  // one dominant logit: exp(110) would overflow f32
      if (t > 2) targets[2] = -1;                                // a row not scored: (0, 0)
      DeviceBuffer xd = to_device(x), td = to_device(targets), out = poisoned(sizeof(double) * 2 * t);
      row_scores(xd.as<float>(), td.as<int32_t>(), t, n, out.as<double2>(), nullptr);
      synchronize();
      const std::vector<double> got = to_host<double>(out, 2 * t);
      for (int64_t r = 0; r < t; ++r) {
        const int32_t tgt = targets[static_cast<size_t>(r)];
        const backend::RowScore want = tgt < 0
                                           ? backend::RowScore{}
                                           : backend::DeviceSession::score_row(
                                                 std::span<const float>(x.data() + r * n, static_cast<size_t>(n)), tgt);
        // Per-thread sums in float over ~250 terms: relative 1e-6 of the sum, 1e-6 absolute in its log.
        EXPECT_NEAR(got[static_cast<size_t>(2 * r)], want.lse, 2e-5) << "row " << r;
        EXPECT_EQ(got[static_cast<size_t>(2 * r + 1)], want.target_logit) << "row " << r;
      }
    }
  }
  DeviceBuffer z = to_device(std::vector<float>{1.0f}), id = to_device(std::vector<int32_t>{0}),
               out = poisoned(2 * sizeof(double));
  EXPECT_THROW(row_scores(z.as<float>(), id.as<int32_t>(), 0, 1, out.as<double2>(), nullptr), Error);
}

}  // namespace
}  // namespace tessera::cuda::test
