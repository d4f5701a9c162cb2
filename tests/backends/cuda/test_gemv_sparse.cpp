// TEAL on CUDA (kernels/gemv_sparse.h): the device SPARSIFY against a host reference of the CPU's rule (the
// floor(sparsity * k) smallest magnitudes zeroed, ties the first in index order; or |x| <= threshold), bit for bit,
// with its surviving-channel list and counters; and the sparse GEMV against the double-precision reference on the
// zeroed x, for bf16, f16, q8_0, q4_0 and q4_1, row counts that are not a multiple of the 64-row tile, every split form
// and accumulate.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "backends/cuda/kernels/gemv_sparse.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace tessera::cuda::test {
namespace {

// The CPU's SPARSIFY rule, written independently: sort the indices by (|x|, index) and zero the first drop.
std::vector<float> sparsify_ref(const std::vector<float>& x, float sparsity, float threshold) {
  std::vector<float> y = x;
  if (threshold >= 0) {
    for (float& v : y)
      if (std::fabs(v) <= threshold) v = 0.0f;
    return y;
  }
  const auto k = static_cast<int64_t>(x.size());
  const auto drop = static_cast<int64_t>(std::floor(static_cast<double>(sparsity) * static_cast<double>(k)));
  std::vector<int64_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return std::fabs(x[a]) < std::fabs(x[b]); });
  for (int64_t i = 0; i < drop; ++i) y[idx[i]] = 0.0f;
  return y;
}

// Rows with many exact ties and zeros: values from a few levels, so the cut falls inside a run of equal magnitudes.
std::vector<float> tied_floats(std::mt19937& rng, size_t n) {
  std::uniform_int_distribution<int> level(-4, 4);
  std::vector<float> v(n);
  for (float& f : v) f = static_cast<float>(level(rng)) * 0.25f;
  return v;
}

void check_sparsify(const std::vector<float>& x, int64_t t, int64_t k, float sparsity, float threshold) {
  SCOPED_TRACE(::testing::Message() << "t=" << t << " k=" << k << " sparsity=" << sparsity
                                    << " threshold=" << threshold);
  DeviceBuffer xd = to_device(x);
  DeviceBuffer yd = poisoned(sizeof(float) * t * k);
  DeviceBuffer list = poisoned(sizeof(SparseEntry) * t * k), count = poisoned(sizeof(int32_t) * t);
  DeviceBuffer zeros(2 * sizeof(unsigned long long));
  zeros.fill_bytes(0);
  sparsify(xd.as<float>(), yd.as<float>(), t, k, sparsity, threshold, list.as<SparseEntry>(), count.as<int32_t>(),
           zeros.as<unsigned long long>(), nullptr);
  synchronize();
  const auto y = to_host<float>(yd, static_cast<size_t>(t * k));
  const auto l = to_host<SparseEntry>(list, static_cast<size_t>(t * k));
  const auto c = to_host<int32_t>(count, static_cast<size_t>(t));
  const auto z = to_host<unsigned long long>(zeros, 2);
  uint64_t want_zeros = 0;
  for (int64_t r = 0; r < t; ++r) {
    const std::vector<float> row(x.begin() + r * k, x.begin() + (r + 1) * k);
    const std::vector<float> ref = sparsify_ref(row, sparsity, threshold);
    std::vector<SparseEntry> want;
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(std::memcmp(&y[r * k + i], &ref[i], 4), 0)
          << "row " << r << " entry " << i << ": " << y[r * k + i] << " vs " << ref[i];
      if (ref[i] == 0.0f) continue;
      SparseEntry e{static_cast<int>(i), 0};
      std::memcpy(&e.y, &ref[i], 4);
      want.push_back(e);
    }
    want_zeros += static_cast<uint64_t>(k) - want.size();
    ASSERT_EQ(c[r], static_cast<int32_t>(want.size())) << "row " << r;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(l[r * k + i].x, want[i].x) << "row " << r << " list entry " << i;
      ASSERT_EQ(l[r * k + i].y, want[i].y) << "row " << r << " list entry " << i;
    }
  }
  EXPECT_EQ(z[0], want_zeros);
  EXPECT_EQ(z[1], static_cast<unsigned long long>(t * k));
}

TEST(GemvSparse, SparsifyMatchesTheCpuRule) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  // 40992: past the rows staged in shared memory (kSpStageMax), read from global memory by the same code.
  for (const int64_t k : {3, 576, 1000, 1536, 4096, 14336, 40992}) {
    for (const float sp : {0.0f, 0.25f, 0.4f, 0.5f, 0.97f, 1.0f}) {
      const int64_t t = 3;
      check_sparsify(random_floats(rng, static_cast<size_t>(t * k)), t, k, sp, -1.0f);
      check_sparsify(tied_floats(rng, static_cast<size_t>(t * k)), t, k, sp, -1.0f);
      if (::testing::Test::HasFatalFailure()) return;
    }
    check_sparsify(random_floats(rng, static_cast<size_t>(2 * k)), 2, k, 0.0f, 0.3f);
    check_sparsify(tied_floats(rng, static_cast<size_t>(2 * k)), 2, k, 0.0f, 0.5f);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(GemvSparse, SparsifyInPlace) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t k = 4096;
  const auto x = random_floats(rng, static_cast<size_t>(k));
  DeviceBuffer xd = to_device(x);
  sparsify(xd.as<float>(), xd.as<float>(), 1, k, 0.5f, -1.0f, nullptr, nullptr, nullptr, nullptr);
  synchronize();
  const auto y = to_host<float>(xd, static_cast<size_t>(k));
  const auto ref = sparsify_ref(x, 0.5f, -1.0f);
  for (int64_t i = 0; i < k; ++i) ASSERT_EQ(y[i], ref[i]) << i;
}

// The quantized dense GEMV's input with calibrated thresholds (the decoder's fold when a format has no walk):
// quantize_q8 with a threshold gives the bits of SPARSIFY's zeroed row quantized, and counts what SPARSIFY counts.
TEST(GemvSparse, QuantizeWithThresholdIsSparsifyThenQuantize) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const int64_t k : {int64_t{576}, int64_t{4096}, int64_t{14336}}) {
    for (const float th : {0.0f, 0.3f, 0.7f}) {
      SCOPED_TRACE(::testing::Message() << "k=" << k << " threshold=" << th);
      auto x = random_floats(rng, static_cast<size_t>(k));
      for (int64_t i = 0; i < k; i += 97) x[static_cast<size_t>(i)] = 0.0f;  // zeros already there count too
      DeviceBuffer xd = to_device(x), zd = poisoned(sizeof(float) * k);
      DeviceBuffer q_ref = poisoned(k), ds_ref = poisoned(sizeof(float) * 2 * (k / 32));
      DeviceBuffer q = poisoned(k), ds = poisoned(sizeof(float) * 2 * (k / 32));
      DeviceBuffer z1(2 * sizeof(unsigned long long)), z2(2 * sizeof(unsigned long long));
      z1.fill_bytes(0);
      z2.fill_bytes(0);
      sparsify(xd.as<float>(), zd.as<float>(), 1, k, 0.0f, th, nullptr, nullptr, z1.as<unsigned long long>(), nullptr);
      quantize_q8(zd.as<float>(), q_ref.as<int8_t>(), ds_ref.as<float2>(), k, nullptr);
      quantize_q8(xd.as<float>(), q.as<int8_t>(), ds.as<float2>(), k, nullptr, th, z2.as<unsigned long long>());
      synchronize();
      EXPECT_EQ(to_host<int8_t>(q, static_cast<size_t>(k)), to_host<int8_t>(q_ref, static_cast<size_t>(k)));
      const auto a = to_host<uint32_t>(ds, static_cast<size_t>(2 * (k / 32)));
      const auto b = to_host<uint32_t>(ds_ref, static_cast<size_t>(2 * (k / 32)));
      EXPECT_EQ(a, b);  // (d, d * sum q) bit for bit
      const auto c1 = to_host<unsigned long long>(z1, 2), c2 = to_host<unsigned long long>(z2, 2);
      EXPECT_EQ(c2[0], c1[0]);
      EXPECT_EQ(c2[1], c1[1]);
      EXPECT_GT(c2[0], 0u);
    }
  }
}

// q8_list: the list's values are the zeroed row's 8-bit activations, as the CPU's quantize_act computes them
// (id = 127 / amax per block of 32, round half to even, d = amax / 127), bit for bit.
TEST(GemvSparse, SparsifyQ8ListMatchesTheCpuQuantization) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const int64_t k : {int64_t{576}, int64_t{1536}, int64_t{14336}, int64_t{40992}}) {
    for (const float sp : {0.0f, 0.5f, 0.9f}) {
      SCOPED_TRACE(::testing::Message() << "k=" << k << " sparsity=" << sp);
      const auto x = random_floats(rng, static_cast<size_t>(k));
      DeviceBuffer xd = to_device(x), yd = poisoned(sizeof(float) * k);
      DeviceBuffer list = poisoned(sizeof(SparseEntry) * k), count = poisoned(sizeof(int32_t));
      sparsify(xd.as<float>(), yd.as<float>(), 1, k, sp, -1.0f, list.as<SparseEntry>(), count.as<int32_t>(), nullptr,
               nullptr, true);
      synchronize();
      const auto l = to_host<SparseEntry>(list, static_cast<size_t>(k));
      const auto c = to_host<int32_t>(count, 1);
      const std::vector<float> z = sparsify_ref(x, sp, -1.0f);
      std::vector<SparseEntry> want;
      for (int64_t b = 0; b < k / 32; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(z[b * 32 + i]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < 32; ++i) {
          const float v = z[b * 32 + i];
          if (v == 0.0f) continue;
          const float q = amax / 127.0f * std::nearbyint(v * id);
          SparseEntry e{static_cast<int>(b * 32 + i), 0};
          std::memcpy(&e.y, &q, 4);
          want.push_back(e);
        }
      }
      ASSERT_EQ(c[0], static_cast<int32_t>(want.size()));
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(l[i].x, want[i].x) << i;
        ASSERT_EQ(l[i].y, want[i].y) << i;
      }
    }
  }
}

// Tolerance as test_gemv.cpp's: only f32 rounding differs from the double reference on the same (zeroed) x. A thread
// sums at most k / slots products in sequence (slots: channels a 256-thread block walks at once, 256 / (tile / 8) for
// float formats, 64 for quantized ones), then a tree of at most 8 levels and up to 64 splits' partials, so
// (k / slots + 72) * 2^-24 * mag bounds it (mag = sum |w x|); at least 2e-5 * mag.
void check_gemv_sparse(DType dtype, int64_t n, int64_t k, float sparsity, int splits, bool accumulate,
                       std::mt19937& rng, int tile = kSparseTile) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << n << " k=" << k << " sparsity=" << sparsity
                                    << " splits=" << splits << " accumulate=" << accumulate << " tile=" << tile);
  const auto w_host = random_weight(rng, dtype, n, k);
  const auto x = random_floats(rng, static_cast<size_t>(k));
  const DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
  const SparseWeight sw = make_sparse_weight(w, nullptr, tile);
  SparseGemvWorkspace ws(n);
  DeviceBuffer xd = to_device(x), xz = poisoned(sizeof(float) * k);
  DeviceBuffer list = poisoned(sizeof(SparseEntry) * k), count = poisoned(sizeof(int32_t));
  sparsify(xd.as<float>(), xz.as<float>(), 1, k, sparsity, -1.0f, list.as<SparseEntry>(), count.as<int32_t>(), nullptr,
           nullptr);
  const auto y0 = random_floats(rng, static_cast<size_t>(n));
  DeviceBuffer yd = accumulate ? to_device(y0) : poisoned(sizeof(float) * n);
  gemv_sparse(sw, list.as<SparseEntry>(), count.as<int32_t>(), yd.as<float>(), accumulate, ws, nullptr, splits);
  synchronize();
  const auto y = to_host<float>(yd, static_cast<size_t>(n));
  const auto xzh = to_host<float>(xz, static_cast<size_t>(k));
  std::vector<double> ref, mag;
  gemv_ref(dtype, w_host, n, k, xzh.data(), ref, mag);
  const int slots = gemv_quantized(dtype) ? 64 : 256 / (tile / 8);
  const double rel = std::max(2e-5, (static_cast<double>(k) / slots + 72) * std::ldexp(1.0, -24));
  for (int64_t i = 0; i < n; ++i) {
    const double want = ref[i] + (accumulate ? y0[i] : 0.0);
    const double tol = rel * mag[i] + (accumulate ? 1e-6 * std::fabs(y0[i]) : 0.0) + 1e-30;
    ASSERT_TRUE(std::fabs(y[i] - want) <= tol)
        << "row " << i << ": " << y[i] << " vs " << want << " (tol " << tol << ")";
  }
  // The same list gives the same bits (no value atomics; splits are summed in slice order).
  if (!accumulate) {
    DeviceBuffer y2 = poisoned(sizeof(float) * n);
    gemv_sparse(sw, list.as<SparseEntry>(), count.as<int32_t>(), y2.as<float>(), false, ws, nullptr, splits);
    synchronize();
    const auto again = to_host<float>(y2, static_cast<size_t>(n));
    ASSERT_EQ(std::memcmp(again.data(), y.data(), sizeof(float) * n), 0);
  }
}

TEST(GemvSparse, MatchesTheReferenceOnTheZeroedInput) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const DType dtype : {DType::BF16, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{64, 256}, {100, 576}, {1536, 576}, {1024, 4096}}) {
      for (const float sp : {0.0f, 0.5f, 0.97f, 1.0f}) {
        for (const int splits : {0, 1, 3, 64}) {
          check_gemv_sparse(dtype, n, k, sp, splits, false, rng);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
      check_gemv_sparse(dtype, n, k, 0.5f, 0, true, rng);
      check_gemv_sparse(dtype, n, k, 0.5f, 1, true, rng);
      if (!gemv_quantized(dtype))
        for (const int tile : {128, 256})  // the benchmark's taller tiles
          for (const int splits : {0, 1, 5}) check_gemv_sparse(dtype, n, k, 0.5f, splits, splits == 5, rng, tile);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The channel-major form (gemv_sparse_x): x raw with a threshold (the calibrated rule folded into the GEMV), against
// the reference on the thresholded x; its counters as sparsify's. Threshold 0 on an x with zeros is the top-k path (the
// GEMV reads SPARSIFY's zeroed row). A thread sums at most a slice's k / splits products in sequence, then the splits'
// partials: (k + 64) * 2^-24 * mag bounds it.
// stripe {rows, slices}: the stripe form at that shape (gemv_sparse_x_stripes) instead of gemv_sparse_x(splits).
void check_gemv_sparse_x(DType dtype, int64_t n, int64_t k, float threshold, int splits, bool accumulate,
                         std::mt19937& rng, bool zeroed = false, std::pair<int, int> stripe = {0, 0}) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n=" << n << " k=" << k << " threshold=" << threshold
                                    << " splits=" << splits << " accumulate=" << accumulate << " zeroed=" << zeroed
                                    << " stripe rows=" << stripe.first << " slices=" << stripe.second);
  const auto run = [&](const SparseWeight& sw, const float* x, float* y, bool acc, SparseGemvWorkspace& ws,
                       unsigned long long* z) {
    if (stripe.first > 0)
      gemv_sparse_x_stripes(sw, x, threshold, y, acc, nullptr, z, stripe.first, stripe.second);
    else
      gemv_sparse_x(sw, x, threshold, y, acc, ws, nullptr, z, splits);
  };
  const auto w_host = random_weight(rng, dtype, n, k);
  auto x = random_floats(rng, static_cast<size_t>(k));
  if (zeroed) x = sparsify_ref(x, 0.5f, -1.0f);
  const DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
  const SparseWeight sw = make_sparse_columns(w, nullptr);
  SparseGemvWorkspace ws(n);
  DeviceBuffer xd = to_device(x);
  DeviceBuffer zeros(2 * sizeof(unsigned long long));
  zeros.fill_bytes(0);
  const auto y0 = random_floats(rng, static_cast<size_t>(n));
  DeviceBuffer yd = accumulate ? to_device(y0) : poisoned(sizeof(float) * n);
  run(sw, xd.as<float>(), yd.as<float>(), accumulate, ws, zeros.as<unsigned long long>());
  synchronize();
  const auto y = to_host<float>(yd, static_cast<size_t>(n));
  const auto z = to_host<unsigned long long>(zeros, 2);
  std::vector<float> xz = x;
  uint64_t want_zeros = 0;
  for (float& v : xz) {
    if (std::fabs(v) <= threshold) v = 0.0f;
    want_zeros += v == 0.0f;
  }
  EXPECT_EQ(z[0], want_zeros);
  EXPECT_EQ(z[1], static_cast<unsigned long long>(k));
  std::vector<double> ref, mag;
  gemv_ref(dtype, w_host, n, k, xz.data(), ref, mag);
  const double rel = std::max(2e-5, (static_cast<double>(k) + 64) * std::ldexp(1.0, -24));
  for (int64_t i = 0; i < n; ++i) {
    const double want = ref[i] + (accumulate ? y0[i] : 0.0);
    const double tol = rel * mag[i] + (accumulate ? 1e-6 * std::fabs(y0[i]) : 0.0) + 1e-30;
    ASSERT_TRUE(std::fabs(y[i] - want) <= tol)
        << "row " << i << ": " << y[i] << " vs " << want << " (tol " << tol << ")";
  }
  if (!accumulate) {  // the same x gives the same bits
    DeviceBuffer y2 = poisoned(sizeof(float) * n);
    run(sw, xd.as<float>(), y2.as<float>(), false, ws, nullptr);
    synchronize();
    const auto again = to_host<float>(y2, static_cast<size_t>(n));
    ASSERT_EQ(std::memcmp(again.data(), y.data(), sizeof(float) * n), 0);
  }
}

TEST(GemvSparse, ColumnsMatchTheReferenceOnTheThresholdedInput) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const DType dtype : {DType::BF16, DType::F16}) {
    // Rows past a 1024-row stripe and not a multiple of 64; k past one 2048-channel slice; the decoder's shapes.
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{64, 256},
                               {100, 576},
                               {960, 576},
                               {1536, 576},
                               {576, 1536},
                               {3000, 4096},
                               {1024, 4104}}) {
      for (const float th : {0.0f, 0.3f, 0.7f, 2.0f}) {
        for (const int splits : {0, 3, 64}) {
          if (splits != 0 && splits < (k + 2047) / 2048) continue;
          check_gemv_sparse_x(dtype, n, k, th, splits, false, rng);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
      check_gemv_sparse_x(dtype, n, k, 0.5f, 0, true, rng);
      check_gemv_sparse_x(dtype, n, k, 0.0f, 0, false, rng, true);
      check_gemv_sparse_x(dtype, n, k, 0.5f, 3, true, rng);
      if ((k + 2047) / 2048 <= 1) check_gemv_sparse_x(dtype, n, k, 0.5f, 1, true, rng);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// The stripe form at every rows a block and 1-8 slices (clusters), on shapes with rows past the last full stripe, k
// split unevenly and the 8B decoder's; its default shape where gemv_sparse_x takes it; the split form where it cannot.
TEST(GemvSparse, StripeFormMatchesTheReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const DType dtype : {DType::BF16, DType::F16}) {
    for (const auto& [n, k] :
         {std::pair<int64_t, int64_t>{64, 256}, {100, 576}, {520, 2048}, {576, 1536}, {3000, 4096}}) {
      const int64_t n_pad = (n + 63) / 64 * 64;
      for (const int rows : {32, 64, 128, 256}) {
        if (n_pad % rows != 0) continue;
        for (const int slices : {1, 2, 3, 8}) {
          check_gemv_sparse_x(dtype, n, k, 0.5f, 0, false, rng, false, {rows, slices});
          check_gemv_sparse_x(dtype, n, k, 0.5f, 0, true, rng, false, {rows, slices});
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
      check_gemv_sparse_x(dtype, n, k, 0.0f, 0, false, rng, true, {32, 2});   // SPARSIFY's zeroed row (top-k)
      check_gemv_sparse_x(dtype, n, k, 2.0f, 0, false, rng, false, {64, 1});  // nothing kept
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // Where the stripe form cannot run, gemv_sparse_x takes the split form: an x that is not 16-byte aligned (the same
  // bits as the split form on an aligned copy), k over 65536 (16-bit list entries).
  const auto w2 = random_weight(rng, DType::BF16, 576, 1024);
  const SparseWeight sw2 = make_sparse_columns(upload_weight(DType::BF16, w2.data(), 576, 1024), nullptr);
  const auto xh = random_floats(rng, 1025);
  const DeviceBuffer xd = to_device(xh);
  const DeviceBuffer xa = to_device(std::vector<float>(xh.begin() + 1, xh.end()));
  const float* x_odd = xd.as<float>() + 1;
  EXPECT_EQ(gemv_sparse_x_stripe_shape(sw2, x_odd), std::make_pair(0, 0));
  EXPECT_GT(gemv_sparse_x_stripe_shape(sw2, xa.as<float>()).first, 0);
  SparseGemvWorkspace ws(576);
  DeviceBuffer y = poisoned(sizeof(float) * 576), y_split = poisoned(sizeof(float) * 576);
  gemv_sparse_x(sw2, x_odd, 0.5f, y.as<float>(), false, ws, nullptr);
  gemv_sparse_x(sw2, xa.as<float>(), 0.5f, y_split.as<float>(), false, ws, nullptr, nullptr,
                gemv_sparse_x_default_splits(sw2));
  synchronize();
  const auto a = to_host<float>(y, 576), b = to_host<float>(y_split, 576);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * 576), 0);
  SparseWeight wide;  // only the shape is read
  wide.columns = true, wide.n = 64, wide.k = 70000, wide.tile = 64;
  EXPECT_EQ(gemv_sparse_x_stripe_shape(wide, nullptr), std::make_pair(0, 0));
  // gemv_sparse_x_stripes refuses what it cannot run: rows not 32-256 or not dividing the padded rows, 9 slices, a
  // negative threshold.
  EXPECT_THROW(gemv_sparse_x_stripes(sw2, nullptr, 0.0f, y.as<float>(), false, nullptr, nullptr, 48, 1), Error);
  EXPECT_THROW(gemv_sparse_x_stripes(sw2, nullptr, 0.0f, y.as<float>(), false, nullptr, nullptr, 256, 1), Error);
  EXPECT_THROW(gemv_sparse_x_stripes(sw2, nullptr, 0.0f, y.as<float>(), false, nullptr, nullptr, 64, 9), Error);
  EXPECT_THROW(gemv_sparse_x_stripes(sw2, nullptr, -1.0f, y.as<float>(), false, nullptr, nullptr, 64, 1), Error);
}

// The stripe form with the SwiGLU folded in (SparseXFusion: w is [gate; up], y = silu(gate . x') * (up . x')) against a
// double reference. The threshold sits in the widest gap between the magnitudes near the middle, so every kept entry
// is far from it.
void check_swiglu(DType dtype, int64_t f, int64_t k, int rows, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " f=" << f << " k=" << k << " rows=" << rows);
  const int64_t n = 2 * f;
  const auto w_host = random_weight(rng, dtype, n, k);
  const auto x = random_floats(rng, static_cast<size_t>(k), -2.0f, 2.0f);
  std::vector<float> mags(x.size());
  for (size_t i = 0; i < x.size(); ++i) mags[i] = std::fabs(x[i]);
  std::sort(mags.begin(), mags.end());
  size_t best = static_cast<size_t>(k) * 2 / 5;
  for (size_t i = best; i < static_cast<size_t>(k) * 3 / 5; ++i)
    if (mags[i + 1] - mags[i] > mags[best + 1] - mags[best]) best = i;
  const float threshold = (mags[best] + mags[best + 1]) / 2;
  std::vector<float> xz(x);
  uint64_t want_zeros = 0;
  for (float& v : xz) {
    if (std::fabs(v) <= threshold) v = 0.0f;
    want_zeros += v == 0.0f;
  }
  const DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
  const SparseWeight sw = make_sparse_columns(w, nullptr);
  DeviceBuffer xd = to_device(x), zeros(2 * sizeof(unsigned long long));
  zeros.fill_bytes(0);
  DeviceBuffer yd = poisoned(sizeof(float) * f);
  SparseXFusion fu;
  fu.swiglu = true;
  if (rows > 0) {
    gemv_sparse_x_stripes(sw, xd.as<float>(), threshold, yd.as<float>(), false, nullptr, zeros.as<unsigned long long>(),
                          rows, 1, fu);
  } else {  // gemv_sparse_x's default shape
    SparseGemvWorkspace ws(n);
    gemv_sparse_x(sw, xd.as<float>(), threshold, yd.as<float>(), false, ws, nullptr, zeros.as<unsigned long long>(), 0,
                  fu);
  }
  synchronize();
  const auto y = to_host<float>(yd, static_cast<size_t>(f));
  const auto z = to_host<unsigned long long>(zeros, 2);
  EXPECT_EQ(z[0], want_zeros);
  EXPECT_EQ(z[1], static_cast<unsigned long long>(k));
  std::vector<double> ref, mag;
  gemv_ref(dtype, w_host, n, k, xz.data(), ref, mag);
  const double rel = std::max(2e-5, (static_cast<double>(k) + 64) * std::ldexp(1.0, -24));
  for (int64_t i = 0; i < f; ++i) {
    const double gs = ref[static_cast<size_t>(i)], us = ref[static_cast<size_t>(f + i)];
    const double dg = rel * mag[static_cast<size_t>(i)], du = rel * mag[static_cast<size_t>(f + i)];
    const double silu = gs / (1.0 + std::exp(-gs)), want = silu * us;
    // silu' <= 1.1; expf and the divide add ~1e-6 of y.
    const double tol = 1.2 * std::fabs(us) * dg + std::fabs(silu) * du + 1e-5 * std::fabs(want) + 1e-30;
    ASSERT_TRUE(std::fabs(y[static_cast<size_t>(i)] - want) <= tol)
        << "row " << i << ": " << y[static_cast<size_t>(i)] << " vs " << want << " (tol " << tol << ")";
  }
}

TEST(GemvSparse, StripeFormFoldsSwiGlu) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const DType dtype : {DType::BF16, DType::F16}) {
    for (const auto& [f, k] : {std::pair<int64_t, int64_t>{256, 576}, {448, 2048}, {1536, 576}})
      for (const int rows : {32, 64, 128, 256}) {
        if (f % rows != 0) continue;
        check_swiglu(dtype, f, k, rows, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
    check_swiglu(dtype, 1536, 576, 0, rng);  // the default shape (SmolLM2's gate|up)
    if (::testing::Test::HasFatalFailure()) return;
  }
  // What the SwiGLU form refuses: a cluster, rows that do not divide the gate rows, accumulating, and a weight the
  // stripe form cannot run.
  const auto w_host = random_weight(rng, DType::BF16, 2 * 96, 512);
  const SparseWeight sw = make_sparse_columns(upload_weight(DType::BF16, w_host.data(), 2 * 96, 512), nullptr);
  DeviceBuffer y(sizeof(float) * 2 * 96);
  SparseXFusion sg;
  sg.swiglu = true;
  EXPECT_THROW(gemv_sparse_x_stripes(sw, nullptr, 0.0f, y.as<float>(), false, nullptr, nullptr, 32, 2, sg), Error);
  EXPECT_THROW(gemv_sparse_x_stripes(sw, nullptr, 0.0f, y.as<float>(), false, nullptr, nullptr, 64, 1, sg), Error);
  EXPECT_THROW(gemv_sparse_x_stripes(sw, nullptr, 0.0f, y.as<float>(), true, nullptr, nullptr, 32, 1, sg), Error);
  EXPECT_EQ(gemv_sparse_x_stripe_shape(sw, nullptr, true), std::make_pair(32, 1));
  SparseWeight wide;  // only the shape is read: k over 65536 has no stripe form, so no fusion either
  wide.columns = true, wide.n = 64, wide.k = 70000, wide.tile = 64;
  SparseGemvWorkspace ws(64);
  EXPECT_THROW(gemv_sparse_x(wide, nullptr, 0.0f, y.as<float>(), false, ws, nullptr, nullptr, 0, sg), Error);
}

// The 8B decoder's stacks (q|k|v, o, gate|up, down) through gemv_sparse_x's default: the stripe form.
TEST(GemvSparse, StripeFormDecoderShapes) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}}) {
    const auto w_host = random_weight(rng, DType::BF16, 64, k);  // the shape choice reads n, k and the padded n only
    const DeviceWeight w = upload_weight(DType::BF16, w_host.data(), 64, k);
    SparseWeight sw = make_sparse_columns(w, nullptr);
    sw.n = n, sw.tile = static_cast<int>((n + 63) / 64 * 64);
    const auto [rows, slices] = gemv_sparse_x_stripe_shape(sw, nullptr);
    EXPECT_GT(rows, 0) << n << "x" << k;
    EXPECT_EQ(sw.tile % std::max(rows, 1), 0);
    EXPECT_GE(slices, 1);
    check_gemv_sparse_x(DType::BF16, n, k, 0.6f, 0, true, rng);
    check_gemv_sparse_x(DType::BF16, n, k, 0.6f, 0, false, rng);  // and the same bits twice
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// TEAL's two-row decode (gemv_sparse_x_rows): x [2, k] with the rows' masks apart (each row thresholded on its own;
// zeroed: each row's own top-k 50%, threshold 0, as the batched decoder reads SPARSIFY's rows), one walk over the
// union, against the reference per row on that row's thresholded x; y [2, n] accumulated onto or written; the same
// bits twice. stripe {rows, slices}: that shape (gemv_sparse_x_stripes with two rows) instead of the default.
void check_gemv_sparse_x_rows(DType dtype, int64_t n, int64_t k, float threshold, bool accumulate, std::mt19937& rng,
                              bool zeroed = false, std::pair<int, int> stripe = {0, 0}) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " two rows n=" << n << " k=" << k << " threshold="
                                    << threshold << " accumulate=" << accumulate << " zeroed=" << zeroed
                                    << " stripe rows=" << stripe.first << " slices=" << stripe.second);
  const auto w_host = random_weight(rng, dtype, n, k);
  std::vector<float> x = random_floats(rng, static_cast<size_t>(2 * k));
  if (zeroed)
    for (int r = 0; r < 2; ++r) {
      const std::vector<float> row(x.begin() + r * k, x.begin() + (r + 1) * k);
      const std::vector<float> z = sparsify_ref(row, 0.5f, -1.0f);
      std::copy(z.begin(), z.end(), x.begin() + r * k);
    }
  const DeviceWeight w = upload_weight(dtype, w_host.data(), n, k);
  const SparseWeight sw = make_sparse_columns(w, nullptr);
  DeviceBuffer xd = to_device(x);
  const auto y0 = random_floats(rng, static_cast<size_t>(2 * n));
  const auto run = [&](float* y, bool acc) {
    if (stripe.first > 0)
      gemv_sparse_x_stripes(sw, xd.as<float>(), threshold, y, acc, nullptr, nullptr, stripe.first, stripe.second, {},
                            2);
    else
      gemv_sparse_x_rows(sw, xd.as<float>(), 2, threshold, y, acc, nullptr);
  };
  DeviceBuffer yd = accumulate ? to_device(y0) : poisoned(sizeof(float) * 2 * n);
  run(yd.as<float>(), accumulate);
  synchronize();
  const auto y = to_host<float>(yd, static_cast<size_t>(2 * n));
  const double rel = std::max(2e-5, (static_cast<double>(k) + 64) * std::ldexp(1.0, -24));
  size_t union_kept = 0;
  for (int64_t c = 0; c < k; ++c)
    union_kept += (std::fabs(x[c]) > threshold && x[c] != 0) || (std::fabs(x[k + c]) > threshold && x[k + c] != 0);
  if (threshold > 0 && threshold < 1) {  // the masks differ: the union is more than either row's
    EXPECT_GT(union_kept, static_cast<size_t>((1.0 - threshold) * k * 1.1));
  }
  for (int r = 0; r < 2; ++r) {
    std::vector<float> xz(x.begin() + r * k, x.begin() + (r + 1) * k);
    for (float& v : xz)
      if (std::fabs(v) <= threshold) v = 0.0f;
    std::vector<double> ref, mag;
    gemv_ref(dtype, w_host, n, k, xz.data(), ref, mag);
    for (int64_t i = 0; i < n; ++i) {
      const double base = accumulate ? y0[static_cast<size_t>(r * n + i)] : 0.0;
      const double want = ref[i] + base;
      const double tol = rel * mag[i] + (accumulate ? 1e-6 * std::fabs(base) : 0.0) + 1e-30;
      ASSERT_TRUE(std::fabs(y[static_cast<size_t>(r * n + i)] - want) <= tol)
          << "row " << r << ", output " << i << ": " << y[static_cast<size_t>(r * n + i)] << " vs " << want
          << " (tol " << tol << ")";
    }
  }
  if (!accumulate) {
    DeviceBuffer y2 = poisoned(sizeof(float) * 2 * n);
    run(y2.as<float>(), false);
    synchronize();
    const auto again = to_host<float>(y2, static_cast<size_t>(2 * n));
    ASSERT_EQ(std::memcmp(again.data(), y.data(), sizeof(float) * 2 * n), 0);
  }
}

TEST(GemvSparse, TwoRowsWalkTheUnionOfTheirMasks) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const DType dtype : {DType::BF16, DType::F16}) {
    // Rows past the last full stripe, k split over a cluster (k > 2n), the smollm2 stacks.
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{100, 576},
                               {960, 576},
                               {3072, 576},
                               {576, 1536},
                               {520, 2048},
                               {3000, 4096}}) {
      for (const float th : {0.0f, 0.5f, 0.9f}) {
        check_gemv_sparse_x_rows(dtype, n, k, th, false, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
      check_gemv_sparse_x_rows(dtype, n, k, 0.5f, true, rng);
      check_gemv_sparse_x_rows(dtype, n, k, 0.0f, true, rng, true);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // Every rows a block and clusters of 2-8 at explicit shapes.
  for (const int rows : {32, 64, 128, 256})
    for (const int slices : {1, 2, 3, 8}) {
      check_gemv_sparse_x_rows(DType::BF16, 1024, 2048, 0.5f, slices == 3, rng, false, {rows, slices});
      if (::testing::Test::HasFatalFailure()) return;
    }
  // The 8B decoder's gate|up and down, as the batched decoder runs them (zeroed rows, down accumulating).
  check_gemv_sparse_x_rows(DType::BF16, 28672, 4096, 0.0f, false, rng, true);
  check_gemv_sparse_x_rows(DType::BF16, 4096, 14336, 0.0f, true, rng, true);
}

TEST(GemvSparse, TwoRowsRefuseWhatTheyCannotRun) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const auto w_host = random_weight(rng, DType::BF16, 128, 256);
  const DeviceWeight w = upload_weight(DType::BF16, w_host.data(), 128, 256);
  const SparseWeight sw = make_sparse_columns(w, nullptr);
  DeviceBuffer x = to_device(random_floats(rng, 3 * 256));
  DeviceBuffer y = poisoned(sizeof(float) * 3 * 128);
  DeviceBuffer zeros(2 * sizeof(unsigned long long));
  EXPECT_TRUE(gemv_sparse_x_rows_runs(sw, x.as<float>(), 2));
  EXPECT_FALSE(gemv_sparse_x_rows_runs(sw, x.as<float>(), 3));
  EXPECT_FALSE(gemv_sparse_x_rows_runs(sw, x.as<float>() + 1, 2));  // not 16-byte aligned
  EXPECT_THROW(gemv_sparse_x_rows(sw, x.as<float>(), 3, 0.0f, y.as<float>(), false, nullptr), Error);
  EXPECT_THROW(gemv_sparse_x_rows(sw, x.as<float>(), 2, -1.0f, y.as<float>(), false, nullptr), Error);
  // no achieved-sparsity counters for two rows (their SPARSIFY counts); no SwiGLU form for two rows
  EXPECT_THROW(gemv_sparse_x_stripes(sw, x.as<float>(), 0.0f, y.as<float>(), false, nullptr,
                                     zeros.as<unsigned long long>(), 64, 1, {}, 2),
               Error);
  EXPECT_THROW(gemv_sparse_x_stripes(sw, x.as<float>(), 0.0f, y.as<float>(), false, nullptr, nullptr, 64, 1,
                                     SparseXFusion{.swiglu = true}, 2),
               Error);
}

// The decoder's quantized shapes (smollm2: q|k|v 960 x 576, gate|up 3072 x 576, down 576 x 1536) through the list
// walk, accumulating as the residual GEMVs do.
TEST(GemvSparse, QuantizedDecoderShapes) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const DType dtype : {DType::Q8_0, DType::Q4_1})
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{960, 576}, {3072, 576}, {576, 1536}, {576, 576}})
      for (const bool acc : {false, true}) {
        check_gemv_sparse(dtype, n, k, 0.5f, 0, acc, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

TEST(GemvSparse, RefusesWhatItCannotRun) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const auto w_host = random_weight(rng, DType::Q6_K, 64, 256);
  const DeviceWeight w = upload_weight(DType::Q6_K, w_host.data(), 64, 256);
  EXPECT_THROW(make_sparse_weight(w, nullptr), Error);
  const auto wq_host = random_weight(rng, DType::Q8_0, 64, 256);
  const DeviceWeight wq = upload_weight(DType::Q8_0, wq_host.data(), 64, 256);
  EXPECT_THROW(make_sparse_weight(wq, nullptr, 128), Error);  // quantized weights: 64-row tiles only
  const auto wb = random_weight(rng, DType::BF16, 300, 256);
  const DeviceWeight wd = upload_weight(DType::BF16, wb.data(), 300, 256);
  EXPECT_THROW(make_sparse_weight(wd, nullptr, 96), Error);
  const SparseWeight sw = make_sparse_weight(wd, nullptr);
  SparseGemvWorkspace small(64);  // 256 rows; the weight has 300
  DeviceBuffer list(sizeof(SparseEntry) * 256), count(sizeof(int32_t)), y(sizeof(float) * 300);
  EXPECT_THROW(gemv_sparse(sw, list.as<SparseEntry>(), count.as<int32_t>(), y.as<float>(), false, small, nullptr),
               Error);
  EXPECT_THROW(sparsify(nullptr, nullptr, 1, 256, 1.5f, -1.0f, nullptr, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(make_sparse_columns(wq, nullptr), Error);  // channel-major: bf16/f16 only
  EXPECT_THROW(gemv_sparse_x(sw, nullptr, 0.0f, y.as<float>(), false, small, nullptr), Error);  // not channel-major
  const SparseWeight cw = make_sparse_columns(wd, nullptr);
  SparseGemvWorkspace ws(300);
  EXPECT_THROW(gemv_sparse_x(cw, nullptr, -1.0f, y.as<float>(), false, ws, nullptr), Error);    // negative threshold
  EXPECT_THROW(gemv_sparse_x(cw, nullptr, 0.0f, y.as<float>(), false, small, nullptr), Error);  // workspace too small
}

}  // namespace
}  // namespace tessera::cuda::test
