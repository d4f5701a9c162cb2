// kernels/lora.h: the fused LoRA step (base matmul, u = x·Aᵀ as the job's first tasks, u·Bᵀ added per base task) on
// every kernel family and pool size, against the base matmul alone plus the adapters' products in double; the matmul
// hooks it rides on (every `before` task once, `after` over every output row once).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/lora.h"
#include "cpu_test_util.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cpu {
namespace {

using test::IsaScope;

std::vector<uint16_t> to_f16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_fp16(v[i]);
  return h;
}

// Normalized MSE of got against want.
double nmse(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0, s = 0;
  for (size_t i = 0; i < want.size(); ++i) e += (got[i] - want[i]) * (got[i] - want[i]), s += want[i] * want[i];
  return e / s;
}

// The adapters' contribution (the step's output minus the base matmul's, same kernel) against Σ (x·Aᵀ)·Bᵀ in double
// from the same f16 factors. A quantized base runs them in 8 bits (q8_0 A on the base's 8-bit x, int8 Bᵀ): q8_0's
// error, nMSE ~1e-5 per product (matmul.cpp); a float base in f16 as given, so only f32 rounding.
TEST(LoraKernels, MatchTheUnfusedProductsOnEveryIsaAndPool) {
  TESSERA_SEEDED_RNG(rng);
  const int64_t k = 64;
  for (Isa isa : test::isas()) {
    IsaScope scope(isa);
    for (DType base : {DType::Q4_1, DType::F16})
      for (int64_t n : {200, 576})
        for (int64_t t : {1, 3, 17}) {
          SCOPED_TRACE(testing::Message() << isa_name(isa) << " " << dtype_name(base) << " n=" << n << " t=" << t);
          const std::vector<float> wf = test::random_floats(rng, static_cast<size_t>(n * k));
          std::vector<uint8_t> wq(*dtype_row_bytes(base, static_cast<uint64_t>(n * k)));
          for (int64_t i = 0; i < n; ++i)
            quantize_row(base, wf.data() + i * k, wq.data() + *dtype_row_bytes(base, static_cast<uint64_t>(i * k)), k);
          const PackedWeight w = prepare_weight(base, wq.data(), n, k);
          const std::vector<int64_t> ranks = {16, 5};
          std::vector<std::vector<uint16_t>> a, b;
          std::vector<LoraFactor> factors;
          for (int64_t r : ranks) {
            a.push_back(to_f16(test::random_floats(rng, static_cast<size_t>(r * k))));
            b.push_back(to_f16(test::random_floats(rng, static_cast<size_t>(n * r))));
            factors.push_back({DType::F16, DType::F16, a.back().data(), b.back().data(), r});
          }
          const bool q8 = base == DType::Q4_1;
          const LoraWeights l = make_lora_weights(factors, n, k, q8);
          EXPECT_EQ(l.r, 21);
          EXPECT_EQ(l.bt_type, q8 ? LoraBt::I8 : LoraBt::F16);
          const std::vector<float> x = test::random_floats(rng, static_cast<size_t>(t * k));
          std::vector<double> want(static_cast<size_t>(t * n), 0.0);
          for (size_t f = 0; f < ranks.size(); ++f) {
            const int64_t r = ranks[f];
            for (int64_t i = 0; i < t; ++i)
              for (int64_t j = 0; j < r; ++j) {
                double u = 0;
                for (int64_t c = 0; c < k; ++c)
                  u += double(fp16_to_f32(a[f][size_t(j * k + c)])) * x[size_t(i * k + c)];
                for (int64_t c = 0; c < n; ++c) want[size_t(i * n + c)] += u * fp16_to_f32(b[f][size_t(c * r + j)]);
              }
          }
          for (ThreadPool* pool : test::pools()) {
            std::vector<float> y0(static_cast<size_t>(t * n)), y(y0.size()), u(static_cast<size_t>(t * l.r));
            matmul(*pool, w, x.data(), y0.data(), t);
            lora_matmul(*pool, w, l, x.data(), y.data(), u.data(), t);
            std::vector<double> got(y.size());
            for (size_t i = 0; i < y.size(); ++i) got[i] = double(y[i]) - double(y0[i]);
            EXPECT_LT(nmse(got, want), q8 ? 2e-4 : 1e-9) << pool->n_threads() << " threads";
          }
        }
  }
}

// The hooks: each `before` task runs once and before the matmul's own tasks are handed out; the `after` ranges tile
// [0, n) exactly, on the pooled path (a large weight), the inline one (a small weight at t = 1) and OpenBLAS's (f32).
TEST(LoraKernels, MatmulHooksRunEachTaskOnceAndCoverEveryRow) {
  TESSERA_SEEDED_RNG(rng);
  struct Count {
    std::atomic<int> before[3] = {0, 0, 0};
    std::mutex mu;
    std::vector<int> rows;
  };
  for (DType dt : {DType::Q4_1, DType::F32})
    for (int64_t n : {24, 1024})
      for (int64_t t : {1, 20})
        for (ThreadPool* pool : test::pools()) {
          SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n << " t=" << t << " " << pool->n_threads());
          const int64_t k = 256;
          const std::vector<float> wf = test::random_floats(rng, static_cast<size_t>(n * k));
          std::vector<uint8_t> wq(*dtype_row_bytes(dt, static_cast<uint64_t>(n * k)));
          quantize_row(dt, wf.data(), wq.data(), n * k);
          const PackedWeight w = prepare_weight(dt, wq.data(), n, k);
          const std::vector<float> x = test::random_floats(rng, static_cast<size_t>(t * k));
          std::vector<float> y(static_cast<size_t>(t * n));
          Count c;
          c.rows.assign(static_cast<size_t>(n), 0);
          MatmulHooks h;
          h.n_before = 3;
          h.before = [](void* ctx, int64_t i, const void*) { static_cast<Count*>(ctx)->before[i]++; };
          h.after = [](void* ctx, int64_t r0, int64_t r1) {
            auto* cc = static_cast<Count*>(ctx);
            std::lock_guard<std::mutex> lock(cc->mu);
            for (int64_t r = r0; r < r1; ++r) cc->rows[static_cast<size_t>(r)]++;
          };
          h.ctx = &c;
          matmul(*pool, w, x.data(), y.data(), t, h);
          for (int i = 0; i < 3; ++i) EXPECT_EQ(c.before[i].load(), 1) << i;
          for (int64_t r = 0; r < n; ++r) ASSERT_EQ(c.rows[static_cast<size_t>(r)], 1) << "row " << r;
        }
}

}  // namespace
}  // namespace tessera::cpu
