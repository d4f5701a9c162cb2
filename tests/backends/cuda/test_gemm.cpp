// T-row matmul (kernels_rows.h) against a double-precision CPU reference, for every weight format, every path
// (multi-row GEMV, cuBLASLt, and the default choice), t from batched-decode to prefill sizes, with and without the
// fused accumulate, on fresh random inputs with NaN-poisoned outputs; plus capture into a CUDA graph and replay.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/gemm_paths.h"
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cuda::test {
namespace {

using detail::GemmPath;

const DType kFormats[] = {DType::F32,  DType::F16,    DType::BF16, DType::Q8_0, DType::Q4_0,
                          DType::Q4_1, DType::IQ4_NL, DType::Q5_0, DType::Q5_1};

bool is_quant(DType t) { return gemv_quantized(t); }

// A weight on the host (GGUF layout), on the device, and dequantized to f32 (what every path multiplies, up to the
// bf16 rounding of the quantized cuBLASLt path).
struct Weight {
  DType dtype;
  int64_t n, k;
  std::vector<float> deq;  // [n, k]
  DeviceWeight dev;
};

Weight make_weight(std::mt19937& rng, DType dtype, int64_t n, int64_t k) {
  const auto host = random_weight(rng, dtype, n, k);
  Weight w{dtype, n, k, std::vector<float>(static_cast<size_t>(n * k)), upload_weight(dtype, host.data(), n, k)};
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  for (int64_t i = 0; i < n; ++i) dequantize_row(dtype, host.data() + i * row_bytes, w.deq.data() + i * k, k);
  return w;
}

// The x a path multiplies: f32 as given (f32 weights, multi-row GEMV of float weights), rounded to the weight's 16-bit
// type (cuBLASLt of f16/bf16 weights; bf16 for quantized weights), or each 32-block's q8 dequantization (multi-row
// GEMV of quantized weights).
enum class XForm { F32, BF16, F16, Q8 };

std::vector<float> transform_x(const std::vector<float>& x, int64_t t, int64_t k, XForm f) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (f == XForm::BF16)
      out[i] = bf16_to_f32(f32_to_bf16(x[i]));
    else if (f == XForm::F16)
      out[i] = fp16_to_f32(f32_to_fp16(x[i]));
    else
      out[i] = x[i];
  }
  if (f == XForm::Q8) {
    std::vector<int8_t> q(static_cast<size_t>(k));
    std::vector<float2> ds(static_cast<size_t>(k / 32));
    for (int64_t r = 0; r < t; ++r) {
      quantize_q8_ref(x.data() + r * k, q.data(), ds.data(), k);
      for (int64_t j = 0; j < k; ++j) out[r * k + j] = ds[j / 32].x * q[j];
    }
  }
  return out;
}

struct Expect {
  XForm xform;
  // Tolerance in units of mag = sum_j |w x| of the row: f32 accumulation (tensor-core or FMA chains over <= 1056
  // terms; 1e-4 leaves room for the GEMM's split-K and tensor-core summation orders, still far below the ~mag/sqrt(K)
  // error of any misplaced element), plus 2^-9 for the quantized cuBLASLt path's bf16 rounding of each weight.
  double rel;
};

Expect expect_for(DType dtype, GemmPath path) {
  if (path == GemmPath::ROWS) return {is_quant(dtype) ? XForm::Q8 : XForm::F32, 2e-5};
  switch (dtype) {
    case DType::F32:
      return {XForm::F32, 2e-5};
    case DType::F16:
      return {XForm::F16, 1e-4};
    case DType::BF16:
      return {XForm::BF16, 1e-4};
    default:
      return {XForm::BF16, 1e-4 + std::ldexp(1.0, -9) * 1.01};
  }
}

// The path matmul takes by default (mirrors matmul_path's choice for an aligned x and a large enough scratch).
GemmPath auto_path(DType dtype, int64_t t, int64_t n, int64_t k) {
  if (t == 1) return GemmPath::ROWS;  // kernels.h's GEMV: same x forms and tolerances as the multi-row GEMV
  return detail::gemm_default_path(dtype, t, n, k);
}

// Runs one matmul (y at element offset y_off of its buffer, to exercise cuBLASLt's alignment handling) and compares.
void check_case(const Weight& w, int64_t t, GemmPath path, bool accumulate, int64_t y_off, GemmWorkspace& ws,
                std::mt19937& rng) {
  const GemmPath effective = path == GemmPath::AUTO ? auto_path(w.dtype, t, w.n, w.k) : path;
  SCOPED_TRACE(::testing::Message() << dtype_name(w.dtype) << " n=" << w.n << " k=" << w.k << " t=" << t << " path="
                                    << detail::gemm_path_name(path) << " (" << detail::gemm_path_name(effective)
                                    << ") accumulate=" << accumulate << " y_off=" << y_off);
  const int64_t n = w.n, k = w.k;
  const auto x = random_floats(rng, static_cast<size_t>(t * k), -2.0f, 2.0f);
  const auto y0 = random_floats(rng, static_cast<size_t>(t * n + y_off));
  DeviceBuffer xd = to_device(x);
  DeviceBuffer yd = accumulate ? to_device(y0) : poisoned(sizeof(float) * (t * n + y_off));
  float* y_ptr = yd.as<float>() + y_off;
  detail::matmul_path(w.dev, xd.as<float>(), y_ptr, t, ws, nullptr, accumulate, path);
  synchronize();
  const auto y = to_host<float>(yd, static_cast<size_t>(t * n + y_off));

  const Expect e = expect_for(w.dtype, effective);
  const auto xe = transform_x(x, t, k, e.xform);
  int bad = 0;
  for (int64_t r = 0; r < t && bad < 5; ++r) {
    for (int64_t i = 0; i < n && bad < 5; ++i) {
      double acc = 0, mag = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double p = static_cast<double>(w.deq[i * k + j]) * xe[r * k + j];
        acc += p;
        mag += std::fabs(p);
      }
      const double base = accumulate ? y0[y_off + r * n + i] : 0.0;
      const double want = base + acc;
      const double tol = e.rel * mag + 1e-6 * std::fabs(base) + 1e-30;
      const double got = y[y_off + r * n + i];
      if (!(std::fabs(got - want) <= tol)) {
        ADD_FAILURE() << "row " << r << " col " << i << ": got " << got << ", want " << want << " (tolerance " << tol
                      << ")";
        ++bad;
      }
    }
  }
}

TEST(CudaGemm, EveryFormatPathAndTMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  // n: a partial last warp of rows (67) and several blocks (130); k: one lane pass (96: 3 quant blocks, 12 bf16
  // vectors) and several with tails (544, 1056), none multiples of the GEMM's tiles.
  const int64_t shapes[][2] = {{67, 96}, {130, 544}, {33, 1056}};
  const int64_t ts[] = {2, 5, 8, 32, 100, 300};
  GemmWorkspace ws(300, 1056, 130 * 1056);
  for (DType dtype : kFormats) {
    for (const auto& s : shapes) {
      const Weight w = make_weight(rng, dtype, s[0], s[1]);
      for (int64_t t : ts) {
        for (GemmPath path : {GemmPath::ROWS, GemmPath::CUBLAS, GemmPath::AUTO}) {
          for (bool accumulate : {false, true}) {
            check_case(w, t, path, accumulate, 0, ws, rng);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// The K-quants (rows of whole 256-element super-blocks): the multi-row GEMV over their 64-element units and the
// cuBLASLt path behind the traits' dequantization, at every t the executors use, with partial warps of rows and rows
// of 1, 3 and 5 super-blocks (4 to 20 units per lane pass of 32).
TEST(CudaGemm, KQuantsEveryPathAndTMatchReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t shapes[][2] = {{67, 256}, {130, 768}, {33, 1280}};
  const int64_t ts[] = {1, 2, 5, 8, 32, 100};
  GemmWorkspace ws(100, 1280, 130 * 1280);
  for (DType dtype :
       {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::TQ2_0, DType::TQ1_0}) {
    for (const auto& s : shapes) {
      const Weight w = make_weight(rng, dtype, s[0], s[1]);
      for (int64_t t : ts) {
        for (GemmPath path : {GemmPath::ROWS, GemmPath::CUBLAS, GemmPath::AUTO}) {
          for (bool accumulate : {false, true}) {
            check_case(w, t, path, accumulate, 0, ws, rng);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(CudaGemm, SingleRowAndUnalignedOutput) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  GemmWorkspace ws(64, 544, 67 * 544);
  for (DType dtype : kFormats) {
    const Weight w = make_weight(rng, dtype, 67, 544);
    for (bool accumulate : {false, true}) {
      check_case(w, 1, GemmPath::AUTO, accumulate, 0, ws, rng);  // t == 1: the GEMV of kernels.h
      // y one float past a 256-byte boundary, rows of odd length: cuBLASLt must be told the 4-byte alignment.
      check_case(w, 3, GemmPath::CUBLAS, accumulate, 1, ws, rng);
      check_case(w, 64, GemmPath::CUBLAS, accumulate, 1, ws, rng);
      check_case(w, 3, GemmPath::ROWS, accumulate, 1, ws, rng);
    }
  }
}

TEST(CudaGemm, CapturedGraphReplaysWithNewInputs) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t n = 130, k = 544;
  for (DType dtype : kFormats) {
    for (int64_t t : {4, 64}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " t=" << t);
      const Weight w1 = make_weight(rng, dtype, n, k), w2 = make_weight(rng, dtype, n, k);
      // A fresh workspace: the first call of a shape (cuBLASLt plan and heuristic) happens inside the capture.
      GemmWorkspace ws(t, k, n * k);
      DeviceBuffer xd(sizeof(float) * t * k), yd(sizeof(float) * t * n);
      cudaStream_t stream = nullptr;
      TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      // y = x W1ᵀ, then y += x W2ᵀ: the accumulate path inside a graph too.
      matmul(w1.dev, xd.as<float>(), yd.as<float>(), t, ws, stream, false);
      matmul(w2.dev, xd.as<float>(), yd.as<float>(), t, ws, stream, true);
      TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const GemmPath path = auto_path(dtype, t, n, k);
      const Expect e = expect_for(dtype, path);
      for (int replay = 0; replay < 2; ++replay) {
        const auto x = random_floats(rng, static_cast<size_t>(t * k), -2.0f, 2.0f);
        xd.upload(x.data(), x.size() * sizeof(float));
        yd.fill_bytes(0xFF);
        TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto y = to_host<float>(yd, static_cast<size_t>(t * n));
        const auto xe = transform_x(x, t, k, e.xform);
        int bad = 0;
        for (int64_t r = 0; r < t && bad < 5; ++r) {
          for (int64_t i = 0; i < n && bad < 5; ++i) {
            double acc = 0, mag = 0;
            for (int64_t j = 0; j < k; ++j) {
              const double p1 = static_cast<double>(w1.deq[i * k + j]) * xe[r * k + j];
              const double p2 = static_cast<double>(w2.deq[i * k + j]) * xe[r * k + j];
              acc += p1 + p2;
              mag += std::fabs(p1) + std::fabs(p2);
            }
            if (!(std::fabs(y[r * n + i] - acc) <= e.rel * mag + 1e-30)) {
              ADD_FAILURE() << "replay " << replay << " row " << r << " col " << i << ": got " << y[r * n + i]
                            << ", want " << acc;
              ++bad;
            }
          }
        }
      }
      TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
      TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
      TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
    }
  }
}

TEST(CudaGemm, RejectsShapesBeyondTheWorkspace) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const Weight w = make_weight(rng, DType::Q4_0, 64, 256);
  GemmWorkspace ws(64, 256, 64 * 128);  // scratch for half the matrix
  DeviceBuffer x(sizeof(float) * 65 * 256), y(sizeof(float) * 65 * 64);
  EXPECT_THROW(matmul(w.dev, x.as<float>(), y.as<float>(), 65, ws, nullptr), Error);  // t > max_t
  EXPECT_THROW(matmul(w.dev, x.as<float>(), y.as<float>(), 0, ws, nullptr), Error);   // t < 1
  EXPECT_THROW(detail::matmul_path(w.dev, x.as<float>(), y.as<float>(), 64, ws, nullptr, false, GemmPath::CUBLAS),
               Error);  // the dequantization scratch is too small
  GemmWorkspace narrow(8, 128, 0);
  EXPECT_THROW(matmul(w.dev, x.as<float>(), y.as<float>(), 4, narrow, nullptr), Error);  // K > max_k
  EXPECT_THROW(GemmWorkspace(0, 128, 0), Error);
  // The default path never needs the scratch it lacks: at t = 64 (cuBLASLt by default) it falls back to the
  // multi-row GEMV.
  ASSERT_EQ(detail::gemm_default_path(DType::Q4_0, 64, 64, 256), GemmPath::CUBLAS);
  EXPECT_NO_THROW(matmul(w.dev, x.as<float>(), y.as<float>(), 64, ws, nullptr));
  synchronize();
}

// matmul_x16 fed x already rounded to its 16-bit type (as rmsnorm and swiglu_rows write it) against matmul's cuBLASLt
// path fed the f32 x (which rounds x the same way before the same GEMM): equal up to the GEMM's summation order, and
// both within the reference's tolerance. t = 1 and 3 are below matmul_x16_min_t: matmul_x16 must still be right there.
TEST(CudaGemm, X16InputMatchesTheF32InputPath) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  GemmWorkspace ws(100, 544, 130 * 544);
  for (DType dtype : kFormats) {
    if (dtype == DType::F32) continue;
    const DType type = matmul_x16_type(dtype);
    for (const auto& s : {std::pair<int64_t, int64_t>{67, 96}, {130, 544}}) {
      const Weight w = make_weight(rng, dtype, s.first, s.second);
      const int64_t n = w.n, k = w.k;
      for (int64_t t : {1, 3, 41, 100}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << " n=" << n << " k=" << k << " t=" << t << " accumulate=" << accumulate);
          const auto x = random_floats(rng, static_cast<size_t>(t * k), -2.0f, 2.0f);
          std::vector<uint16_t> x16(x.size());
          for (size_t i = 0; i < x.size(); ++i) x16[i] = float_to_cache(type, x[i]);
          const auto y0 = random_floats(rng, static_cast<size_t>(t * n));
          DeviceBuffer xd = to_device(x), x16d = to_device(x16);
          DeviceBuffer ya = accumulate ? to_device(y0) : poisoned(sizeof(float) * t * n);
          DeviceBuffer yb = accumulate ? to_device(y0) : poisoned(sizeof(float) * t * n);
          matmul_x16(w.dev, x16d.get(), ya.as<float>(), t, ws, nullptr, accumulate);
          detail::matmul_path(w.dev, xd.as<float>(), yb.as<float>(), t, ws, nullptr, accumulate, GemmPath::CUBLAS);
          synchronize();
          const auto a = to_host<float>(ya, static_cast<size_t>(t * n));
          const auto b = to_host<float>(yb, static_cast<size_t>(t * n));
          const Expect e = expect_for(dtype, GemmPath::CUBLAS);
          const auto xe = transform_x(x, t, k, e.xform);
          int bad = 0;
          for (int64_t r = 0; r < t && bad < 5; ++r) {
            for (int64_t i = 0; i < n && bad < 5; ++i) {
              double acc = accumulate ? y0[r * n + i] : 0.0, mag = 0;
              for (int64_t j = 0; j < k; ++j) {
                const double p = static_cast<double>(w.deq[i * k + j]) * xe[r * k + j];
                acc += p;
                mag += std::fabs(p);
              }
              const double got = a[r * n + i], other = b[r * n + i];
              const double tol = e.rel * mag + 1e-6 * std::fabs(accumulate ? y0[r * n + i] : 0.0) + 1e-30;
              if (!(std::fabs(got - acc) <= tol) || !(std::fabs(got - other) <= 1e-6 * mag + 1e-30)) {
                ADD_FAILURE() << "row " << r << " col " << i << ": matmul_x16 " << got << ", f32-input path " << other
                              << ", reference " << acc << " (tolerance " << tol << ")";
                ++bad;
              }
            }
          }
        }
      }
    }
  }
}

// matmul_x16_out16 (prefill's gate|up: the output in x's 16-bit type) against matmul_x16's f32 output on the same
// x: the 16-bit value is the f32 one rounded once (half an ulp: at most 2^-8 relative in bf16, 2^-11 in f16, at the
// bottom of a binade; measured on the H100: f16 errors up to 4.4e-4 relative with a 2^-12 limit), give or take
// the summation order of whichever cuBLASLt kernel serves a 16-bit D (~1e-6 of the row's scale).
TEST(CudaGemm, X16Out16IsTheF32OutputRounded) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  GemmWorkspace ws(100, 544, 130 * 544);
  for (DType dtype : kFormats) {
    if (dtype == DType::F32) continue;
    const DType type = matmul_x16_type(dtype);
    const Weight w = make_weight(rng, dtype, 130, 544);
    for (int64_t t : {1, 41, 100}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " t=" << t);
      const auto x = random_floats(rng, static_cast<size_t>(t * w.k), -2.0f, 2.0f);
      std::vector<uint16_t> x16(x.size());
      for (size_t i = 0; i < x.size(); ++i) x16[i] = float_to_cache(type, x[i]);
      DeviceBuffer x16d = to_device(x16), yf = poisoned(sizeof(float) * t * w.n), y16 = poisoned(2 * t * w.n);
      matmul_x16(w.dev, x16d.get(), yf.as<float>(), t, ws, nullptr);
      matmul_x16_out16(w.dev, x16d.get(), y16.get(), t, ws, nullptr);
      synchronize();
      const auto f = to_host<float>(yf, static_cast<size_t>(t * w.n));
      const auto h = to_host<uint16_t>(y16, static_cast<size_t>(t * w.n));
      double ss = 0;
      for (float v : f) ss += double(v) * v;
      const double rms = std::sqrt(ss / static_cast<double>(f.size()));
      const double rel = type == DType::BF16 ? 1.0 / 256 : 1.0 / 2048;
      int bad = 0;
      for (size_t i = 0; i < f.size() && bad < 5; ++i) {
        const double got = type == DType::BF16 ? bf16_to_f32(h[i]) : fp16_to_f32(h[i]);
        if (!(std::fabs(got - f[i]) <= rel * std::fabs(f[i]) + 1e-5 * rms)) {
          ADD_FAILURE() << "element " << i << ": 16-bit output " << got << ", f32 output " << f[i];
          ++bad;
        }
      }
    }
  }
  DeviceBuffer x(2 * 64 * 544), y(2 * 64 * 130);
  const Weight f32w = make_weight(rng, DType::F32, 130, 544);
  EXPECT_THROW(matmul_x16_out16(f32w.dev, x.get(), y.get(), 64, ws, nullptr), Error);  // f32 weights take f32 x
  EXPECT_THROW(matmul_x16_out16(f32w.dev, x.get(), nullptr, 64, ws, nullptr), Error);
  synchronize();
}

TEST(CudaGemm, X16RejectsF32WeightsAndShortScratch) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const Weight f = make_weight(rng, DType::F32, 64, 256), q = make_weight(rng, DType::Q4_1, 64, 256);
  GemmWorkspace ws(64, 256, 64 * 128);  // scratch for half the quantized matrix
  DeviceBuffer x(2 * 64 * 256), y(sizeof(float) * 64 * 64);
  EXPECT_THROW(matmul_x16(f.dev, x.get(), y.as<float>(), 64, ws, nullptr), Error);
  EXPECT_THROW(matmul_x16(q.dev, x.get(), y.as<float>(), 64, ws, nullptr), Error);
  EXPECT_THROW(matmul_x16(q.dev, x.get(), y.as<float>(), 65, ws, nullptr), Error);  // t > max_t
  synchronize();
}

// The executor switches a tensor to its 16-bit copy from matmul_x16_min_t rows on; from there matmul itself must leave
// the multi-row GEMV for every shape (cuBLASLt, or the tile GEMM for the formats that have one; else the switch would
// trade the multi-row GEMV's faster small-t path away), and one row fewer must not (the threshold is tight).
// Host-only: runs without a GPU.
TEST(CudaGemm, X16TypeAndThresholdAgreeWithTheDefaultPath) {
  EXPECT_EQ(matmul_x16_type(DType::F32), DType::F32);
  EXPECT_EQ(matmul_x16_type(DType::F16), DType::F16);
  for (DType d : {DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                  DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K})
    EXPECT_EQ(matmul_x16_type(d), DType::BF16);
  const int64_t shapes[][2] = {{64, 256}, {576, 576}, {4096, 4096}, {6144, 4096}, {28672, 4096}, {4096, 14336}};
  for (DType d : kFormats) {
    if (d == DType::F32) continue;
    const int64_t min_t = matmul_x16_min_t(d);
    bool rows_below = false;
    for (const auto& s : shapes) {
      for (int64_t t = min_t; t <= min_t + 300; ++t)
        ASSERT_NE(detail::gemm_default_path(d, t, s[0], s[1]), GemmPath::ROWS)
            << dtype_name(d) << " t=" << t << " n=" << s[0] << " k=" << s[1];
      rows_below |= detail::gemm_default_path(d, min_t - 1, s[0], s[1]) == GemmPath::ROWS;
    }
    EXPECT_TRUE(rows_below) << dtype_name(d) << ": matmul_x16_min_t is not the smallest such t";
  }
}

}  // namespace
}  // namespace tessera::cuda::test
