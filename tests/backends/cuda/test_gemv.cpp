// GEMV kernels against the double-precision reference, for every weight format and every launch shape the benchmark
// can pick, on fresh random inputs with NaN-poisoned outputs.
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_options.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/quant.h"

namespace tessera::cuda::test {
namespace {

const DType kFormats[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,   DType::Q4_0,   DType::Q4_1,
                          DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::Q5_0,
                          DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::TQ2_0,  DType::TQ1_0};
const DType kQuantFormats[] = {DType::Q8_0, DType::Q4_0,   DType::Q4_1,   DType::Q4_K, DType::Q5_K,
                               DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::Q5_0, DType::Q5_1,
                               DType::Q2_K, DType::Q3_K,   DType::TQ2_0,  DType::TQ1_0};

bool is_quant(DType t) { return gemv_quantized(t); }

// Rows of a K-quant are whole super-blocks: a test shape's k rounded up to the format's block (256), so the tails of
// the units (64 elements per thread and slot) still leave slots idle.
int64_t k_for(DType t, int64_t k) {
  const int64_t b = static_cast<int64_t>(dtype_info(t).block_size);
  return (k + b - 1) / b * b;
}

// Checks one GEMV launch. Tolerances:
//  - against the reference evaluated on the x the kernel multiplies (x itself for float formats, x's q8 dequantization
//    for quantized formats): only f32 rounding differs. Each thread sums at most k / threads products in sequence,
//    then a tree of <= 8 levels adds the threads; the worst-case bound is (that length) * 2^-24 * mag, with mag the
//    sum of |terms| the kernel rounds (cuda_test_util.h). 1e-5 * mag covers k / threads <= 160 (every shape here).
//  - quantized formats, also against the reference on the original f32 x: plus at most sum |w| * dx / 2, the most
//    x's rounding to q8 can move the result (a rigorous bound, not a fitted one).
void check_gemv(DType dtype, int64_t n, int64_t k, const GemvConfig* config, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << n << " k=" << k << " config="
                                    << (config ? config->threads : 0) << "/" << (config ? config->rows : 0) << "/"
                                    << (config ? config->unroll : 0) << "/" << (config ? config->prefetch : 0));
  const auto w_host = random_weight(rng, dtype, n, k);
  const auto x = random_floats(rng, static_cast<size_t>(k));
  DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
  // TQ1_0 is held in TQ2_0's layout (weights.cpp: exact), so its bytes are TQ2_0's.
  ASSERT_EQ(w.dtype, dtype == DType::TQ1_0 ? DType::TQ2_0 : dtype);
  ASSERT_EQ(w.bytes(), *dtype_row_bytes(w.dtype, static_cast<uint64_t>(k)) * n);
  DeviceBuffer xd = to_device(x);
  DeviceBuffer q8 = poisoned(k), ds = poisoned(sizeof(float2) * (k / 32));
  DeviceBuffer yd = poisoned(sizeof(float) * n);
  GemvInput in;
  in.f32 = xd.as<float>();
  std::vector<float> x_eff = x;  // what the kernel multiplies
  std::vector<float> dx;
  if (is_quant(dtype)) {
    quantize_q8(xd.as<float>(), q8.as<int8_t>(), ds.as<float2>(), k, nullptr);
    in.q8 = q8.as<int8_t>();
    in.q8_ds = ds.as<float2>();
    // The device quantization must equal the host twin bit for bit (the reference below relies on it).
    std::vector<int8_t> q_ref(k);
    std::vector<float2> ds_ref(k / 32);
    quantize_q8_ref(x.data(), q_ref.data(), ds_ref.data(), k);
    const auto q_dev = to_host<int8_t>(q8, k);
    const auto ds_dev = to_host<float2>(ds, k / 32);
    ASSERT_EQ(q_dev, q_ref);
    for (int64_t b = 0; b < k / 32; ++b) {
      ASSERT_EQ(ds_dev[b].x, ds_ref[b].x) << "block " << b;
      ASSERT_EQ(ds_dev[b].y, ds_ref[b].y) << "block " << b;
      dx.push_back(ds_ref[b].x);
      for (int j = 0; j < 32; ++j) x_eff[b * 32 + j] = ds_ref[b].x * q_ref[b * 32 + j];
    }
  }
  gemv(w, in, yd.as<float>(), nullptr, config);
  synchronize();
  const auto y = to_host<float>(yd, n);

  std::vector<double> ref, mag, ref_x, mag_x, absw_dx;
  gemv_ref(dtype, w_host, n, k, x_eff.data(), ref, mag);
  if (is_quant(dtype)) gemv_ref(dtype, w_host, n, k, x.data(), ref_x, mag_x, dx.data(), &absw_dx);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const double err = std::fabs(y[i] - ref[i]);
    if (!(err <= 1e-5 * mag[i] + 1e-30)) {
      ADD_FAILURE() << "row " << i << ": got " << y[i] << ", want " << ref[i] << " (tolerance " << 1e-5 * mag[i] << ")";
      ++bad;
    }
    if (is_quant(dtype)) {
      const double tol = absw_dx[i] * (1 + 1e-6) + 1e-5 * mag[i];
      if (!(std::fabs(y[i] - ref_x[i]) <= tol)) {
        ADD_FAILURE() << "row " << i << ": got " << y[i] << ", f32-x reference " << ref_x[i] << " (tolerance " << tol
                      << ")";
        ++bad;
      }
    }
  }
}

TEST(CudaGemv, EveryFormatAndConfigMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  // k covers: one partial pass of the smallest block (k=64), tails that leave some unrolled loads idle (576, 1056),
  // and several full passes (4096). n covers a partial last block of rows (odd n, n < rows per block).
  const int64_t shapes[][2] = {{1, 64}, {3, 576}, {37, 1056}, {130, 4096}};
  for (DType dtype : kFormats) {
    for (const auto& s : shapes) {
      for (const GemvConfig& c : gemv_configs()) {
        if (!gemv_config_supported(dtype, c)) continue;  // q5_K, q6_K: rows * unroll <= 4
        check_gemv(dtype, s[0], k_for(dtype, s[1]), &c, rng);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The launch shapes a format has no kernel for fail with an error, never a wrong result.
TEST(CudaGemv, UnsupportedShapesAreRefused) {
  int refused = 0;
  for (DType dtype : kFormats)
    for (const GemvConfig& c : gemv_configs()) {
      if (gemv_config_supported(dtype, c)) continue;
      ++refused;
      EXPECT_TRUE(dtype == DType::Q6_K || dtype == DType::Q5_K || dtype == DType::Q3_K)
          << "only q3_K, q5_K and q6_K leave shapes out";
      EXPECT_GT(c.rows * c.unroll, 4);
    }
  EXPECT_GT(refused, 0);
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const auto w_host = random_weight(rng, DType::Q6_K, 8, 256);
  const DeviceWeight w = upload_weight(DType::Q6_K, w_host.data(), 8, 256);
  DeviceBuffer q8 = poisoned(256), ds = poisoned(sizeof(float2) * 8), y = poisoned(sizeof(float) * 8);
  GemvInput in;
  in.q8 = q8.as<int8_t>(), in.q8_ds = ds.as<float2>();
  const GemvConfig c{256, 2, 4, 0};
  ASSERT_FALSE(gemv_config_supported(DType::Q6_K, c));
  EXPECT_THROW(gemv(w, in, y.as<float>(), nullptr, &c), Error);
}

TEST(CudaGemv, DefaultConfigAtModelShapes) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  // SmolLM2-135M (576, 1536) and Llama-3-8B-like widths, where the default heuristic picks different shapes.
  const int64_t shapes[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {1024, 4096}, {4096, 1024}, {512, 14336}};
  // TQ1_0 runs TQ2_0's kernel after an exact conversion at upload: EveryFormatAndConfigMatchesReference covers it.
  for (DType dtype : kFormats)
    for (const auto& s : shapes)
      if (dtype != DType::TQ1_0 && s[1] == k_for(dtype, s[1])) check_gemv(dtype, s[0], s[1], nullptr, rng);
  // Llama-3-8B's q|k|v, o, gate|up and down at the K-quants' defaults (these shapes pick 64 and 128 threads).
  const int64_t llama[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  for (DType dtype : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K, DType::Q5_0, DType::Q5_1})
    for (const auto& s : llama) check_gemv(dtype, s[0], s[1], nullptr, rng);
}

// The x-stationary launch `xs` against the shared kernel's launch `shared` on the same random n x k weight of dtype
// and the same x: y0 + W·x accumulated, with the RMS input (x quantized without its 1/rms, the per-32 sums of
// squares) or without it, to 1e-4 of the accumulated terms' RMS. Leaves the uploaded weight and the inputs in *c for
// the caller's refusal checks.
struct StationaryCase {
  DeviceWeight w;
  DeviceBuffer q8, ds, sumsq;
};
void expect_stationary_matches_shared(DType dtype, int64_t n, int64_t k, const GemvConfig& xs, const GemvConfig& shared,
                                      const std::vector<bool>& rms_inputs, std::mt19937& rng, StationaryCase* c) {
  const auto w_host = random_weight(rng, dtype, n, k);
  c->w = upload_weight(dtype, w_host.data(), n, k);
  const std::vector<float> x = random_floats(rng, static_cast<size_t>(k), -3.0f, 3.0f);
  std::vector<int8_t> q(static_cast<size_t>(k));
  std::vector<float2> ds(static_cast<size_t>(k / 32));
  std::vector<float> sumsq(static_cast<size_t>(k / 32), 0.0f);
  quantize_q8_ref(x.data(), q.data(), ds.data(), k);
  for (int64_t i = 0; i < k; ++i) sumsq[i / 32] += x[i] * x[i];
  const std::vector<float> y0 = random_floats(rng, static_cast<size_t>(n));
  c->q8 = to_device(q), c->ds = to_device(ds), c->sumsq = to_device(sumsq);
  for (const bool rms_in : rms_inputs) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rms_sumsq " << rms_in);
    GemvInput in;
    in.q8 = c->q8.as<int8_t>(), in.q8_ds = c->ds.as<float2>();
    if (rms_in) in.rms_sumsq = c->sumsq.as<float>(), in.rms_eps = 1e-5f;
    DeviceBuffer ya = to_device(y0), yb = to_device(y0);
    gemv(c->w, in, ya.as<float>(), nullptr, &xs, true);
    gemv(c->w, in, yb.as<float>(), nullptr, &shared, true);
    synchronize();
    const auto va = to_host<float>(ya, static_cast<size_t>(n)), vb = to_host<float>(yb, static_cast<size_t>(n));
    double rms = 0;
    for (int64_t i = 0; i < n; ++i) rms += double(vb[i] - y0[i]) * (vb[i] - y0[i]);
    rms = std::sqrt(rms / static_cast<double>(n));
    ASSERT_GT(rms, 0.0);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(va[i], vb[i], 1e-4 * rms) << "row " << i;
  }
}

// tq2_0's x-stationary kernel (GemvConfig::stationary, the default at Llama-3-8B's large ternary shapes) against the
// reference: two and seven warps per row (k = 4096, 14336), five (10240), rows that leave the last block partial, four
// and eight rows per block; then with the RMS input and accumulate against the shared kernel on the same inputs.
TEST(CudaGemv, TernaryStationaryMatchesReference) {
  EXPECT_TRUE(gemv_default_config(DType::TQ2_0, 14336, 4096).stationary);
  EXPECT_TRUE(gemv_default_config(DType::TQ2_0, 4096, 14336).stationary);
  EXPECT_FALSE(gemv_default_config(DType::TQ2_0, 4096, 4096).stationary);
  EXPECT_FALSE(gemv_default_config(DType::TQ2_0, 2560, 6912).stationary);  // 6912 is no multiple of 2048
  EXPECT_FALSE(gemv_norm_out_supported(gemv_default_config(DType::TQ2_0, 14336, 4096)));
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t shapes[][2] = {{8195, 4096}, {258, 14336}, {37, 10240}};
  for (DType dtype : {DType::TQ2_0, DType::TQ1_0})
    for (const auto& s : shapes)
      for (int rows : {4, 8}) {
        GemvConfig c{static_cast<int>(s[1] / 2048) * 32, rows, 1, 0};
        c.stationary = true;
        check_gemv(dtype, s[0], s[1], &c, rng);
        if (HasFatalFailure()) return;
      }
  const int64_t n = 1027, k = 6144;  // three warps per row
  GemvConfig xs{96, 4, 1, 0};
  xs.stationary = true;
  StationaryCase sc;
  expect_stationary_matches_shared(DType::TQ2_0, n, k, xs, GemvConfig{32, 8, 1, 0}, {true}, rng, &sc);
  if (HasFatalFailure()) return;
  // Launch shapes it cannot run are refused with an error, never run.
  GemvInput in;
  in.q8 = sc.q8.as<int8_t>(), in.q8_ds = sc.ds.as<float2>();
  GemvConfig bad = xs;
  bad.threads = 64;
  DeviceBuffer yc = poisoned(sizeof(float) * n);
  EXPECT_THROW(gemv(sc.w, in, yc.as<float>(), nullptr, &bad), Error);
}

// iq4_nl's x-stationary kernel (GemvConfig::stationary, the default at K = 4096 and N >= 14336: Llama-3-8B's gate or
// up, gate|up and output projection) against the reference at 14336x4096, 28672x4096 and rows that leave the last
// block of four partial (and fewer rows than a block); then with accumulate, without and with the RMS input, against
// the shared kernel on the same inputs; launch shapes and inputs it cannot run are refused. (The op table's
// MATMUL_iq4_nl_t1_n14338_k4096 runs it through the decoder's default launch.)
TEST(CudaGemv, Iq4nlStationaryMatchesReference) {
  const GemvConfig xs = gemv_iq4nl_stationary_config();
  EXPECT_TRUE(xs.stationary);
  EXPECT_TRUE(gemv_config_supported(DType::IQ4_NL, xs));
  EXPECT_FALSE(gemv_config_supported(DType::Q4_0, xs));
  EXPECT_FALSE(gemv_norm_out_supported(xs));
  EXPECT_TRUE(gemv_iq4nl_stationary_fits(4096));
  EXPECT_FALSE(gemv_iq4nl_stationary_fits(14336));
  for (const int64_t n : {14336, 28672, 128256}) {
    const GemvConfig c = gemv_default_config(DType::IQ4_NL, n, 4096);
    EXPECT_TRUE(c.stationary && c.threads == xs.threads && c.rows == xs.rows) << n;
  }
  EXPECT_FALSE(gemv_default_config(DType::IQ4_NL, 4096, 4096).stationary);
  EXPECT_FALSE(gemv_default_config(DType::IQ4_NL, 6144, 4096).stationary);
  EXPECT_FALSE(gemv_default_config(DType::IQ4_NL, 4096, 14336).stationary);
  EXPECT_FALSE(gemv_default_config(DType::IQ4_NL, 16384, 2048).stationary);
  EXPECT_FALSE(gemv_default_config(DType::Q4_0, 14336, 4096).stationary);  // q4_0, q4_1, q8_0 lost at every shape
  EXPECT_FALSE(gemv_norm_out_config(DType::IQ4_NL, 4096, 14336).stationary);
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t k = 4096;
  for (const int64_t n : {14336, 28672, 4101, 3}) {
    check_gemv(DType::IQ4_NL, n, k, &xs, rng);
    if (HasFatalFailure()) return;
  }
  const int64_t n = 1027;
  StationaryCase sc;
  expect_stationary_matches_shared(DType::IQ4_NL, n, k, xs, GemvConfig{128, 4, 1, 0}, {false, true}, rng, &sc);
  if (HasFatalFailure()) return;
  const DeviceWeight& w = sc.w;
  // Launch shapes and inputs it cannot run are refused with an error, never run.
  GemvInput in;
  in.q8 = sc.q8.as<int8_t>(), in.q8_ds = sc.ds.as<float2>();
  DeviceBuffer yc = poisoned(sizeof(float) * n);
  GemvConfig bad = xs;
  bad.rows = 8;
  EXPECT_THROW(gemv(w, in, yc.as<float>(), nullptr, &bad), Error);
  bad = xs;
  bad.threads = 64;
  EXPECT_THROW(gemv(w, in, yc.as<float>(), nullptr, &bad), Error);
  const std::vector<float> nw(static_cast<size_t>(n), 1.0f);
  DeviceBuffer nwd = to_device(nw);
  GemvInput with_norm_out = in;
  with_norm_out.norm_out_w = nwd.as<float>();
  EXPECT_THROW(gemv(w, with_norm_out, yc.as<float>(), nullptr, &xs), Error);
  const int64_t k2 = 2048;  // not the compiled row length
  const auto w2_host = random_weight(rng, DType::IQ4_NL, 8, k2);
  const DeviceWeight w2 = upload_weight(DType::IQ4_NL, w2_host.data(), 8, k2);
  EXPECT_THROW(gemv(w2, in, yc.as<float>(), nullptr, &xs), Error);
  const auto w3_host = random_weight(rng, DType::Q4_0, 8, k);  // another format
  const DeviceWeight w3 = upload_weight(DType::Q4_0, w3_host.data(), 8, k);
  EXPECT_THROW(gemv(w3, in, yc.as<float>(), nullptr, &xs), Error);
}

// The GEMV study knobs of CudaOptions (cuda_options.h; they replaced TESSERA_CUDA_EARLY_L2, TESSERA_CUDA_PDL and
// TESSERA_CUDA_GEMV_SHAPES): the early L2 prefetch (per-thread lines or one bulk prefetch, any amount) and PDL change
// no arithmetic, so y is bit for bit the default's; a gemv_shapes entry makes the default launch (config null) take
// that shape for that matrix, checked against the reference.
TEST(CudaGemv, StudyOptionsKeepResults) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t shapes[][2] = {{1536, 576}, {4096, 1024}};
  for (DType dtype : {DType::BF16, DType::Q8_0, DType::Q4_1})
    for (const auto& s : shapes) {
      const int64_t n = s[0], k = s[1];
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << n << "x" << k);
      const auto w_host = random_weight(rng, dtype, n, k);
      const DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
      DeviceBuffer xd = to_device(random_floats(rng, static_cast<size_t>(k)));
      DeviceBuffer q8 = poisoned(k), ds = poisoned(sizeof(float2) * (k / 32));
      GemvInput in;
      in.f32 = xd.as<float>();
      if (is_quant(dtype)) {
        quantize_q8(xd.as<float>(), q8.as<int8_t>(), ds.as<float2>(), k, nullptr);
        in.q8 = q8.as<int8_t>(), in.q8_ds = ds.as<float2>();
      }
      auto run = [&](const CudaOptions& o) {
        const CudaOptionsScope scope(o);
        DeviceBuffer yd = poisoned(sizeof(float) * n);
        gemv(w, in, yd.as<float>(), nullptr);
        synchronize();
        return to_host<float>(yd, n);
      };
      const std::vector<float> base = run(CudaOptions{});
      for (const char* kv : {"early_l2=64/16384/1", "early_l2=1024/65536/0", "early_l2=0/0/0", "pdl=0"}) {
        CudaOptions o;
        parse_cuda_option(o, kv);
        EXPECT_EQ(run(o), base) << kv;
      }
      const GemvConfig def = gemv_default_config(dtype, n, k);
      const GemvConfig other =
          def.threads == 128 && def.rows == 2 ? GemvConfig{256, 4, 1, 0} : GemvConfig{128, 2, 2, 0};
      CudaOptions o;
      o.gemv_shapes = {{n, k, other}};
      const CudaOptionsScope scope(o);
      const GemvConfig got = gemv_default_config(dtype, n, k);
      EXPECT_TRUE(got.threads == other.threads && got.rows == other.rows && got.unroll == other.unroll);
      check_gemv(dtype, n, k, nullptr, rng);
      if (HasFatalFailure()) return;
    }
}

// Grids larger than one wave of the plain quantized kernel make launch_shape pick its register-capped instantiation
// (4-bit formats at rows * unroll == 4; gemv_quant.cu): 8192 rows give 2048-8192 blocks, more than 132 SMs hold.
TEST(CudaGemv, QuantLargeGridsMatchReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (DType dtype : kQuantFormats)
    for (const GemvConfig& c : gemv_configs())
      if (dtype != DType::TQ1_0 && c.rows * c.unroll == 4 && c.prefetch == 0) {  // TQ1_0: TQ2_0's kernel
        check_gemv(dtype, 8192, 1024, &c, rng);
        if (HasFatalFailure()) return;
      }
}

// A random x [k] in [-3, 3] quantized on the device (quantize_q8): the activation the quantized epilogue tests feed.
struct QuantX {
  DeviceBuffer q8, ds;
};
QuantX random_quant_x(std::mt19937& rng, int64_t k) {
  DeviceBuffer xd = to_device(random_floats(rng, k, -3.0f, 3.0f));
  QuantX x{poisoned(static_cast<size_t>(k)), poisoned(sizeof(float2) * (k / 32))};
  quantize_q8(xd.as<float>(), x.q8.as<int8_t>(), x.ds.as<float2>(), k, nullptr);
  synchronize();
  return x;
}

// The fused RMSNorm at one launch shape against rmsnorm-then-GEMV in double: rmsnorm in double rounded to f32 (what
// the unfused rmsnorm kernel would hand the GEMV), then check_gemv's bound plus the scale: the kernel sums x^2 in
// another order than the reference and multiplies the row sum by 1/rms once instead of each x (a few ulp of the
// result, 2e-6 relative).
void check_gemv_norm(DType dtype, int64_t n, int64_t k, const GemvConfig& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << n << " k=" << k << " config=" << c.threads << "/"
                                    << c.rows << "/" << c.unroll << "/" << c.prefetch);
  const auto w_host = random_weight(rng, dtype, n, k);
  const auto x = random_floats(rng, k, -3.0f, 3.0f), g = random_floats(rng, k, 0.5f, 1.5f);
  DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
  DeviceBuffer xd = to_device(x), gd = to_device(g);
  std::vector<double> xn_d(k);
  rmsnorm_ref(x.data(), g.data(), xn_d.data(), 1, k, 1e-5f);
  std::vector<float> xn(xn_d.begin(), xn_d.end());
  std::vector<double> ref, mag;
  gemv_ref(dtype, w_host, n, k, xn.data(), ref, mag);
  DeviceBuffer yd = poisoned(sizeof(float) * n);
  GemvInput in;
  in.f32 = xd.as<float>();
  in.norm_w = gd.as<float>();
  in.norm_eps = 1e-5f;
  gemv(w, in, yd.as<float>(), nullptr, &c);
  synchronize();
  const auto y = to_host<float>(yd, n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(y[i], ref[i], 1e-5 * mag[i] + 2e-6 * std::fabs(ref[i]) + 1e-30) << "row " << i;
}

// The SwiGLU epilogue at launch shape c over w = [gate; up] (2f rows), with the fused RMSNorm when norm_w is given:
// bit for bit the plain GEMV of the same launch shape followed by the swiglu kernel.
void expect_swiglu_is_gemv_then_swiglu(const DeviceWeight& w, const float* x, const float* norm_w, int64_t f,
                                       const GemvConfig& c) {
  GemvInput in;
  in.f32 = x;
  if (norm_w != nullptr) {
    in.norm_w = norm_w;
    in.norm_eps = 1e-5f;
  }
  DeviceBuffer both = poisoned(sizeof(float) * 2 * f), want = poisoned(sizeof(float) * f);
  gemv(w, in, both.as<float>(), nullptr, &c);
  swiglu(both.as<float>(), both.as<float>() + f, want.as<float>(), f, nullptr);
  in.swiglu = true;
  DeviceBuffer got = poisoned(sizeof(float) * f);
  gemv(w, in, got.as<float>(), nullptr, &c);
  synchronize();
  const auto a = to_host<float>(got, f), b = to_host<float>(want, f);
  for (int64_t i = 0; i < f; ++i) {
    ASSERT_FALSE(std::isnan(b[i])) << "row " << i;
    ASSERT_EQ(a[i], b[i]) << "row " << i;
  }
}

// The SwiGLU epilogue with the fused RMSNorm over a fresh [gate; up] weight of 2f rows.
void check_swiglu_bitwise(DType dtype, int64_t f, int64_t k, const GemvConfig& c, std::mt19937& rng) {
  const auto w_host = random_weight(rng, dtype, 2 * f, k);
  const auto x = random_floats(rng, k, -3.0f, 3.0f), g = random_floats(rng, k, 0.5f, 1.5f);
  DeviceWeight w = upload_weight(dtype, w_host.data(), 2 * f, k);
  DeviceBuffer xd = to_device(x), gd = to_device(g);
  expect_swiglu_is_gemv_then_swiglu(w, xd.as<float>(), gd.as<float>(), f, c);
}

TEST(CudaGemv, FusedRmsnormMatchesNormThenGemv) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t shapes[][2] = {{37, 576}, {64, 4096}};
  for (DType dtype : {DType::F32, DType::F16, DType::BF16})
    for (const auto& sh : shapes)
      for (const GemvConfig& c : gemv_configs()) {
        check_gemv_norm(dtype, sh[0], sh[1], c, rng);
        if (HasFatalFailure()) return;
      }
}

// The SwiGLU epilogue (GemvInput::swiglu) over a merged [gate; up] weight: bit for bit what the plain GEMV of the same
// launch shape followed by the swiglu kernel computes (each row's sum runs in the same order; silu is the same
// code), with and without the fused RMSNorm, for every launch shape it accepts; shapes with an odd number of gate rows
// leave a block's last pair half outside. Shapes it does not accept fail with an error, as does a quantized weight
// without the quantized epilogue's outputs (QuantSwigluEpilogueEqualsGemvThenSwiglu).
TEST(CudaGemv, SwigluEpilogueEqualsGemvThenSwiglu) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t shapes[][2] = {{1, 64}, {37, 576}, {1536, 576}, {130, 4096}};  // {F, k}: the weight is [2F, k]
  int accepted = 0;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (const auto& sh : shapes) {
      const int64_t f = sh[0], k = sh[1];
      const auto w_host = random_weight(rng, dtype, 2 * f, k);
      const auto x = random_floats(rng, k, -3.0f, 3.0f), g = random_floats(rng, k, 0.5f, 1.5f);
      DeviceWeight w = upload_weight(dtype, w_host.data(), 2 * f, k);
      DeviceBuffer xd = to_device(x), gd = to_device(g);
      for (const bool norm : {false, true}) {
        for (const GemvConfig& c : gemv_configs()) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << " F=" << f << " k=" << k << " norm=" << norm << " config=" << c.threads
                       << "/" << c.rows << "/" << c.unroll << "/" << c.prefetch);
          if (c.rows % 2 != 0 || c.prefetch != 0 || c.threads < 128) {
            GemvInput in;
            in.f32 = xd.as<float>();
            in.swiglu = true;
            DeviceBuffer got = poisoned(sizeof(float) * f);
            EXPECT_THROW(gemv(w, in, got.as<float>(), nullptr, &c), Error);
            continue;
          }
          expect_swiglu_is_gemv_then_swiglu(w, xd.as<float>(), norm ? gd.as<float>() : nullptr, f, c);
          if (HasFatalFailure()) return;
          ++accepted;
        }
      }
      // The default launch shape accepts it.
      GemvInput in;
      in.f32 = xd.as<float>();
      in.swiglu = true;
      DeviceBuffer got = poisoned(sizeof(float) * f);
      gemv(w, in, got.as<float>(), nullptr);
      synchronize();
      EXPECT_FALSE(std::isnan(to_host<float>(got, f)[0]));
      EXPECT_THROW(gemv(w, in, got.as<float>(), nullptr, nullptr, /*accumulate=*/true), Error);
    }
  }
  EXPECT_GT(accepted, 0);
  const auto q_host = random_weight(rng, DType::Q8_0, 8, 64);
  DeviceWeight q = upload_weight(DType::Q8_0, q_host.data(), 8, 64);
  DeviceBuffer xq = poisoned(64), dq = poisoned(2 * sizeof(float2)), y = poisoned(4 * sizeof(float));
  GemvInput in;
  in.q8 = xq.as<int8_t>();
  in.q8_ds = dq.as<float2>();
  in.swiglu = true;
  EXPECT_THROW(gemv(q, in, y.as<float>(), nullptr), Error);
}

// The norm_out epilogue (GemvInput::norm_out_*; the decoder's norm fold), as warp groups: y to rounding (their warps
// sum in a 32-thread order) what the plain accumulating quantized GEMV of the same launch shape stores; q8 / ds bit for
// bit the host quantization of y ⊙ w per block of 32 (quantize_q8's arithmetic, without the 1/rms factor); sumsq each
// block's sum of y^2 (a warp tree's order: relative 1e-5). Launch shapes without the epilogue, and a call missing an
// output, fail with an error.
TEST(CudaGemv, QuantNormOutEpilogueWritesTheNextInput) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t shapes[][2] = {{64, 256}, {576, 1536}, {4096, 4096}, {4096, 14336}};  // {n, k}
  int accepted = 0;
  for (DType dtype : kQuantFormats)
    for (const auto& sh : shapes) {
      const int64_t n = sh[0], k = k_for(dtype, sh[1]);
      const auto w_host = random_weight(rng, dtype, n, k);
      DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
      const QuantX xin = random_quant_x(rng, k);
      const std::vector<float> y0 = random_floats(rng, static_cast<size_t>(n), -2.0f, 2.0f);
      const std::vector<float> norm_w = random_floats(rng, static_cast<size_t>(n), 0.5f, 1.5f);
      DeviceBuffer nw = to_device(norm_w);
      for (const GemvConfig& c : gemv_configs()) {
        if (!gemv_config_supported(dtype, c)) continue;
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << n << " k=" << k << " config=" << c.threads
                                          << "/" << c.rows << "/" << c.unroll << "/" << c.prefetch);
        GemvInput in;
        in.q8 = xin.q8.as<int8_t>();
        in.q8_ds = xin.ds.as<float2>();
        DeviceBuffer q8 = poisoned(static_cast<size_t>(n)), ds = poisoned(sizeof(float2) * (n / 32)),
                     ss = poisoned(sizeof(float) * (n / 32));
        GemvInput fused = in;
        fused.norm_out_w = nw.as<float>();
        fused.norm_out_q8 = q8.as<int8_t>();
        fused.norm_out_ds = ds.as<float2>();
        fused.norm_out_sumsq = ss.as<float>();
        DeviceBuffer want = to_device(y0), got = to_device(y0);
        if (!gemv_norm_out_supported(c, dtype)) {
          EXPECT_THROW(gemv(w, fused, got.as<float>(), nullptr, &c, true), Error);
          continue;
        }
        gemv(w, in, want.as<float>(), nullptr, &c, true);
        gemv(w, fused, got.as<float>(), nullptr, &c, true);
        synchronize();
        const auto y = to_host<float>(got, static_cast<size_t>(n));
        {  // each warp sums its rows as a 32-thread block would: another order than the shape's own
          const auto w0 = to_host<float>(want, static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i)
            ASSERT_NEAR(y[i], w0[i], 1e-4f * (std::fabs(w0[i]) + std::fabs(y0[i]) + 1.0f)) << "row " << i;
        }
        std::vector<float> yw(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) yw[i] = y[i] * norm_w[i];
        std::vector<int8_t> ref_q8(static_cast<size_t>(n));
        std::vector<float2> ref_ds(static_cast<size_t>(n / 32));
        quantize_q8_ref(yw.data(), ref_q8.data(), ref_ds.data(), n);
        EXPECT_EQ(to_host<int8_t>(q8, static_cast<size_t>(n)), ref_q8);
        const auto got_ds = to_host<float>(ds, static_cast<size_t>(n / 16));
        const auto got_ss = to_host<float>(ss, static_cast<size_t>(n / 32));
        for (int64_t b = 0; b < n / 32; ++b) {
          EXPECT_EQ(got_ds[2 * b], ref_ds[b].x) << "block " << b;
          EXPECT_EQ(got_ds[2 * b + 1], ref_ds[b].y) << "block " << b;
          double s = 0;
          for (int64_t j = 0; j < 32; ++j) s += double(y[b * 32 + j]) * y[b * 32 + j];
          EXPECT_NEAR(got_ss[b], s, 1e-5 * s) << "block " << b;
        }
        if (HasFailure()) return;
        ++accepted;
        GemvInput missing = fused;
        missing.norm_out_sumsq = nullptr;
        EXPECT_THROW(gemv(w, missing, got.as<float>(), nullptr, &c, true), Error);
      }
    }
  EXPECT_GT(accepted, 0);
}

// The rms_sumsq input (the consumer side of the same fold): fed x ⊙ w quantized without 1/rms plus the per-32 sums of
// x^2, every launch shape equals the GEMV fed rmsnorm(x)'s own q8 output, to rounding: a block's codes agree except
// where x w / d falls within a rounding error of a half step (the two sides quantize differently rounded products),
// so the rows agree to 1e-3 of the output's RMS rather than bit for bit. Without the 1/rms scale they would differ
// by 1 - 1/rms (~40% here).
TEST(CudaGemv, QuantRmsInputEqualsRmsnormThenGemv) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t shapes[][2] = {{256, 576}, {2048, 4096}};  // {n, k}
  const float eps = 1e-5f;
  for (DType dtype : kQuantFormats)
    for (const auto& sh : shapes) {
      const int64_t n = sh[0], k = k_for(dtype, sh[1]);
      const auto w_host = random_weight(rng, dtype, n, k);
      DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
      const std::vector<float> x = random_floats(rng, static_cast<size_t>(k), -3.0f, 3.0f);
      const std::vector<float> nw = random_floats(rng, static_cast<size_t>(k), 0.5f, 1.5f);
      DeviceBuffer xd = to_device(x), nwd = to_device(nw), xn = poisoned(sizeof(float) * k);
      DeviceBuffer qa = poisoned(static_cast<size_t>(k)), dsa = poisoned(sizeof(float2) * (k / 32));
      rmsnorm(xd.as<float>(), nwd.as<float>(), xn.as<float>(), 1, k, eps, nullptr, qa.as<int8_t>(), dsa.as<float2>());
      std::vector<float> xw(static_cast<size_t>(k)), sumsq(static_cast<size_t>(k / 32), 0.0f);
      for (int64_t i = 0; i < k; ++i) {
        xw[i] = x[i] * nw[i];
        sumsq[i / 32] += x[i] * x[i];
      }
      std::vector<int8_t> qb_host(static_cast<size_t>(k));
      std::vector<float2> dsb_host(static_cast<size_t>(k / 32));
      quantize_q8_ref(xw.data(), qb_host.data(), dsb_host.data(), k);
      DeviceBuffer qb = to_device(qb_host), dsb = to_device(dsb_host), ssb = to_device(sumsq);
      for (const GemvConfig& c : gemv_configs()) {
        if (!gemv_config_supported(dtype, c)) continue;
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << n << " k=" << k << " config=" << c.threads
                                          << "/" << c.rows << "/" << c.unroll << "/" << c.prefetch);
        GemvInput a;
        a.q8 = qa.as<int8_t>();
        a.q8_ds = dsa.as<float2>();
        GemvInput b;
        b.q8 = qb.as<int8_t>();
        b.q8_ds = dsb.as<float2>();
        b.rms_sumsq = ssb.as<float>();
        b.rms_eps = eps;
        DeviceBuffer ya = poisoned(sizeof(float) * n), yb = poisoned(sizeof(float) * n);
        gemv(w, a, ya.as<float>(), nullptr, &c);
        gemv(w, b, yb.as<float>(), nullptr, &c);
        synchronize();
        const auto va = to_host<float>(ya, static_cast<size_t>(n)), vb = to_host<float>(yb, static_cast<size_t>(n));
        double rms = 0;
        for (float v : va) rms += double(v) * v;
        rms = std::sqrt(rms / static_cast<double>(n));
        ASSERT_GT(rms, 0.0);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_FALSE(std::isnan(vb[i])) << "row " << i;
          // The two inputs' int8 codes agree but where x * 127 / amax lands within a rounding of a half in one form and
          // not the other: each such code moves y by one activation step times a weight. With the K-quants' wider
          // weight codes that reached 1.29e-3 of the rows' rms once on the H100 (q5_k, k = 768); 3e-3 leaves 2x.
          ASSERT_NEAR(vb[i], va[i], 3e-3 * rms) << "row " << i;
        }
      }
    }
}

// Grids of exactly one wave of the capped float kernel (1024 / threads blocks per SM, at most 64 registers): for the
// launch shapes that have a capped copy (16-bit weights, rows * unroll <= 4; gemv_float_kernel.cuh), gemv_float.cu
// launches it wherever the plain kernel holds fewer blocks per SM (the fused RMSNorm at most of these shapes: 67-95
// registers), so these grids run it. k = 1056 leaves a partial last step. The plain GEMV of the SwiGLU check has
// twice the grid and stays uncapped: capping changes register allocation, not the arithmetic.
TEST(CudaGemv, FloatCappedGridsMatchReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const auto devices = list_devices();
  ASSERT_FALSE(devices.empty());
  const int64_t sms = devices[0].sm_count, k = 1056;
  int checked = 0;
  for (DType dtype : {DType::F16, DType::BF16}) {
    for (const GemvConfig& c : gemv_configs()) {
      if (c.rows * c.unroll > 4 || c.prefetch != 0) continue;
      const int64_t blocks = 1024 / c.threads * sms;
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " blocks=" << blocks << " config=" << c.threads << "/"
                                        << c.rows << "/" << c.unroll);
      check_gemv(dtype, blocks * c.rows, k, &c, rng);
      check_gemv_norm(dtype, blocks * c.rows, k, c, rng);
      if (c.rows % 2 == 0 && c.threads >= 128) check_swiglu_bitwise(dtype, blocks * c.rows / 2, k, c, rng);
      if (HasFatalFailure()) return;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CudaGemv, AccumulateAddsToOutput) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (DType dtype :
       {DType::BF16, DType::Q4_1, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0, DType::Q2_K, DType::Q3_K}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t n = 300, k = 1024;
    const auto w_host = random_weight(rng, dtype, n, k);
    const auto x = random_floats(rng, k), y0 = random_floats(rng, n);
    DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
    DeviceBuffer xd = to_device(x), q8 = poisoned(k), ds = poisoned(sizeof(float2) * (k / 32));
    DeviceBuffer y_plain = poisoned(sizeof(float) * n), y_acc = to_device(y0);
    GemvInput in;
    in.f32 = xd.as<float>();
    quantize_q8(xd.as<float>(), q8.as<int8_t>(), ds.as<float2>(), k, nullptr);
    in.q8 = q8.as<int8_t>();
    in.q8_ds = ds.as<float2>();
    gemv(w, in, y_plain.as<float>(), nullptr);
    gemv(w, in, y_acc.as<float>(), nullptr, nullptr, /*accumulate=*/true);
    synchronize();
    const auto a = to_host<float>(y_plain, n), b = to_host<float>(y_acc, n);
    // The same block sums, then one f32 addition: exactly y0 + W·x as the plain launch computes it.
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i], y0[i] + a[i]) << "row " << i;
  }
}

TEST(CudaGemv, QuantizeQ8HandlesZeroBlocks) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  auto x = random_floats(rng, 256);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;  // an all-zero block must give d = 0 and q = 0, not NaN
  DeviceBuffer xd = to_device(x), q8 = poisoned(256), ds = poisoned(sizeof(float2) * 8);
  quantize_q8(xd.as<float>(), q8.as<int8_t>(), ds.as<float2>(), 256, nullptr);
  synchronize();
  std::vector<int8_t> q_ref(256);
  std::vector<float2> ds_ref(8);
  quantize_q8_ref(x.data(), q_ref.data(), ds_ref.data(), 256);
  EXPECT_EQ(to_host<int8_t>(q8, 256), q_ref);
  const auto ds_dev = to_host<float2>(ds, 8);
  for (int b = 0; b < 8; ++b) {
    EXPECT_EQ(ds_dev[b].x, ds_ref[b].x);
    EXPECT_EQ(ds_dev[b].y, ds_ref[b].y);
  }
  EXPECT_EQ(ds_dev[1].x, 0.0f);
}

// Argument checks run before any CUDA call, so these run on machines without a GPU too.
TEST(CudaGemv, UploadRejectsBadShapesAndTypes) {
  std::vector<uint8_t> host(4096);
  for (const FormatInfo& fi : formats()) {  // readable, but converted at load (tq1_0 and tq2_0 at this commit)
    if (!gemv_supports(fi.type)) {
      EXPECT_THROW(upload_weight(fi.type, host.data(), 1, 256), Error) << fi.name;
    }
  }
  EXPECT_THROW(upload_weight(DType::IQ2_XXS, host.data(), 1, 256), Error);  // not readable at all
  EXPECT_THROW(upload_weight(DType::Q4_K, host.data(), 2, 128), Error);     // k not a multiple of 256
  EXPECT_THROW(upload_weight(DType::Q4_0, host.data(), 2, 48), Error);      // k not a multiple of 32
  EXPECT_THROW(upload_weight(DType::BF16, host.data(), 2, 12), Error);      // rows not 16-byte aligned
  EXPECT_THROW(upload_weight(DType::F32, host.data(), 0, 8), Error);
  EXPECT_THROW(upload_weight(DType::F32, nullptr, 1, 8), Error);
  EXPECT_TRUE(gemv_supports(DType::Q6_K));
  EXPECT_TRUE(gemv_supports(DType::Q2_K));
  EXPECT_TRUE(gemv_supports(DType::Q5_0));
  EXPECT_TRUE(gemv_supports(DType::Q4_1));
}

TEST(CudaGemv, RejectsMissingActivation) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const auto w_host = random_weight(rng, DType::Q4_0, 8, 64);
  DeviceWeight w = upload_weight(DType::Q4_0, w_host.data(), 8, 64);
  DeviceBuffer x = poisoned(64 * sizeof(float)), y = poisoned(8 * sizeof(float));
  GemvInput in;
  in.f32 = x.as<float>();  // a quantized weight needs the q8 activation
  EXPECT_THROW(gemv(w, in, y.as<float>(), nullptr), Error);
  GemvConfig bogus{96, 3, 1, 0};
  in.q8 = reinterpret_cast<const int8_t*>(x.get());
  in.q8_ds = reinterpret_cast<const float2*>(y.get());
  EXPECT_THROW(gemv(w, in, y.as<float>(), nullptr, &bogus), Error);
  in.norm_w = x.as<float>();  // the fused RMSNorm is for float weights only
  EXPECT_THROW(gemv(w, in, y.as<float>(), nullptr), Error);
}

}  // namespace
}  // namespace tessera::cuda::test
