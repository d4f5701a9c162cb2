// Causal prefill attention (attn_prefill, kernels_rows.h) against a double-precision CPU reference on the same
// 16-bit-rounded q, K and V, for every launch shape the kernel has; and the f32 cache's FFMA path on f32 inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels/attn_prefill_variants.h"
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/half.h"

namespace tessera::cuda::test {
namespace {

// The 16-bit output (out16, what the prefill executor asks for when the o-projection takes a 16-bit x) must be the f32
// output of the same launch shape rounded to nearest even, bit for bit: the kernel differs only in its store. `run`
// makes the launch with (out, out16, type); o is the f32 output it gave with out16 == nullptr.
template <typename Run>
void expect_out16_is_f32_rounded(const Run& run, const std::vector<float>& o) {
  for (DType type : {DType::BF16, DType::F16}) {
    DeviceBuffer o16 = poisoned(2 * o.size());
    run(nullptr, o16.get(), type);
    synchronize();
    const auto bits = to_host<uint16_t>(o16, o.size());
    int bad = 0;
    for (size_t i = 0; i < o.size() && bad < 5; ++i) {
      const uint16_t want = float_to_cache(type, o[i]);
      if (bits[i] != want) {
        ADD_FAILURE() << dtype_name(type) << " output element " << i << ": " << bits[i] << ", the f32 output " << o[i]
                      << " rounds to " << want;
        ++bad;
      }
    }
  }
}

// `run` into a poisoned f32 output, whose 16-bit outputs are then checked against it; returns the f32 output.
template <typename Run>
std::vector<float> run_f32_and_out16(const Run& run, int64_t n) {
  DeviceBuffer out = poisoned(sizeof(float) * n);
  run(out.as<float>(), nullptr, DType::BF16);
  synchronize();
  std::vector<float> o = to_host<float>(out, n);
  expect_out16_is_f32_rounded(run, o);
  return o;
}

struct PrefillCase {
  DType dtype;
  int64_t hd, n_head, n_kv, t, p0, seq;
};

// A call of attn_prefill (variant < 0) or of one launch shape on case c, as run(out, out16, out16_type).
auto prefill_runner(int variant, const float* q, int64_t ld_q, const KvCacheView& cache, const PrefillCase& c,
                    float scale) {
  return [=](float* out, void* out16, DType type) {
    if (variant < 0)
      attn_prefill(q, ld_q, cache, c.seq, c.p0, c.t, out, c.n_head, scale, nullptr, out16, type);
    else
      detail::attn_prefill_variant(variant, q, ld_q, cache, c.seq, c.p0, c.t, out, c.n_head, scale, nullptr, out16,
                                   type);
  };
}

// Row i of out against attn_decode_ref at position p0 + i, row by row: a masking error at one position of one row
// would vanish in a norm over 513 rows.
void check_prefill(const PrefillCase& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " hd " << c.hd << " heads " << c.n_head << "/" << c.n_kv
                                    << " t " << c.t << " p0 " << c.p0 << " seq " << c.seq);
  const int64_t n_seq = 2, n_ctx = c.p0 + c.t + 5;  // 5 positions past the chunk: poisoned, never to be read
  const int64_t slot = c.n_kv * n_ctx * c.hd;
  std::vector<uint16_t> kc_h(n_seq * slot, 0xFFFF), vc_h(n_seq * slot, 0xFFFF);  // 0xFFFF: NaN in f16 and bf16
  std::vector<float> kf(slot), vf(slot);  // slot c.seq as floats [n_kv, n_ctx, hd]
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t s = 0; s < n_seq; ++s)  // the other slot holds different data of the same kind
    for (int64_t h = 0; h < c.n_kv; ++h)
      for (int64_t p = 0; p < c.p0 + c.t; ++p)
        for (int64_t i = 0; i < c.hd; ++i) {
          const size_t at = static_cast<size_t>(s * slot + (h * n_ctx + p) * c.hd + i);
          kc_h[at] = float_to_cache(c.dtype, normal(rng));
          vc_h[at] = float_to_cache(c.dtype, normal(rng));
          if (s == c.seq)
            kf[at - s * slot] = cache_to_float(c.dtype, kc_h[at]),
                        vf[at - s * slot] = cache_to_float(c.dtype, vc_h[at]);
        }
  // q rows as the merged q|k|v matmul output leaves them: ld_q spans the k and v columns too, which hold NaN here
  // (the kernel must read only the q columns).
  const int64_t width = c.n_head * c.hd, ld_q = width + 2 * c.n_kv * c.hd;
  std::vector<float> q(c.t * ld_q, NAN), q_rounded(c.t * width);
  for (int64_t r = 0; r < c.t; ++r)
    for (int64_t i = 0; i < width; ++i) {
      q[r * ld_q + i] = 2.0f * normal(rng);  // scores ~N(0, 4): softmaxes with a few dominant keys
      q_rounded[r * width + i] = cache_to_float(c.dtype, float_to_cache(c.dtype, q[r * ld_q + i]));
    }
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  std::vector<std::vector<double>> ref(c.t);
  for (int64_t r = 0; r < c.t; ++r)
    attn_decode_ref(&q_rounded[r * width], kf, vf, n_ctx, c.n_head, c.n_kv, c.hd, static_cast<int32_t>(c.p0 + r), scale,
                    ref[r]);

  DeviceBuffer qd = to_device(q), kc = to_device(kc_h), vc = to_device(vc_h);
  KvCacheView cache{c.dtype, kc.get(), vc.get(), n_ctx, c.n_kv, c.hd};
  cache.n_seq = n_seq;
  // The error sources are P rounded to 16 bits for the P·V product (relative 2^-9 for bf16, 2^-12 for f16, random in
  // sign so they largely cancel over a row), ex2.approx (2 ulp) and f32 sums; q, K and V are rounded identically on
  // both sides. Measured headroom is several times; an off-by-one in masking moves a row by ~1/n_keys ~> 1e-3
  // relative, far more for short rows.
  const double limit = c.dtype == DType::BF16 ? 1e-2 : 3e-3;
  double worst_all = 0;
  for (int variant = -1; variant < detail::attn_prefill_variant_count(); ++variant) {
    SCOPED_TRACE(variant < 0 ? std::string("attn_prefill") : detail::attn_prefill_variant_name(variant, c.hd));
    const auto run = prefill_runner(variant, qd.as<float>(), ld_q, cache, c, scale);
    const auto o = run_f32_and_out16(run, c.t * width);
    const double worst =
        check_rows_rel(o, c.t, width, c.p0, [&](int64_t r) -> const std::vector<double>& { return ref[r]; }, limit);
    if (!(worst <= limit)) return;  // the first bad row ends the case (it failed the test), as before
    worst_all = std::max(worst_all, worst);
  }
  // The headroom, for the log: the worst row over all launch shapes against the limit.
  std::printf("  %s hd %lld heads %lld/%lld t %lld p0 %lld seq %lld: worst row error %.2e (limit %.0e)\n",
              std::string(dtype_name(c.dtype)).c_str(), static_cast<long long>(c.hd), static_cast<long long>(c.n_head),
              static_cast<long long>(c.n_kv), static_cast<long long>(c.t), static_cast<long long>(c.p0),
              static_cast<long long>(c.seq), worst_all, limit);
}

TEST(CudaAttnPrefill, MatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const int64_t hds[] = {64, 128};
  const int64_t heads[][2] = {{9, 3}, {32, 8}, {4, 4}};
  const int64_t ts[] = {1, 7, 64, 200, 513};
  const int64_t p0s[] = {0, 37, 300};
  // Every (t, p0) pair once per dtype; head size, head layout and slot cycle through them so that each value meets
  // several of the others (the full cross product would take the double reference minutes).
  for (DType dtype : {DType::BF16, DType::F16})
    for (int i = 0; i < 15; ++i) {
      const int k = i + (dtype == DType::F16 ? 1 : 0);
      const PrefillCase c{dtype,     hds[k % 2], heads[k % 3][0],   heads[k % 3][1],
                          ts[i % 5], p0s[i / 5], k % 4 == 3 ? 0 : 1};
      check_prefill(c, rng);
    }
}

// The f32 cache (FFMA path): the same checks on f32 q, K and V, nothing rounded on either side.
void check_prefill_f32(const PrefillCase& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << "f32 hd " << c.hd << " heads " << c.n_head << "/" << c.n_kv << " t " << c.t
                                    << " p0 " << c.p0 << " seq " << c.seq);
  const int64_t n_seq = 2, n_ctx = c.p0 + c.t + 5;  // 5 positions past the chunk: poisoned, never to be read
  const int64_t slot = c.n_kv * n_ctx * c.hd;
  std::vector<float> kc_h(n_seq * slot, NAN), vc_h(n_seq * slot, NAN);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t s = 0; s < n_seq; ++s)
    for (int64_t h = 0; h < c.n_kv; ++h)
      for (int64_t p = 0; p < c.p0 + c.t; ++p)
        for (int64_t i = 0; i < c.hd; ++i) {
          const size_t at = static_cast<size_t>(s * slot + (h * n_ctx + p) * c.hd + i);
          kc_h[at] = normal(rng), vc_h[at] = normal(rng);
        }
  const std::vector<float> kf(kc_h.begin() + c.seq * slot, kc_h.begin() + (c.seq + 1) * slot);
  const std::vector<float> vf(vc_h.begin() + c.seq * slot, vc_h.begin() + (c.seq + 1) * slot);
  const int64_t width = c.n_head * c.hd, ld_q = width + 2 * c.n_kv * c.hd;
  std::vector<float> q(c.t * ld_q, NAN);
  for (int64_t r = 0; r < c.t; ++r)
    for (int64_t i = 0; i < width; ++i) q[r * ld_q + i] = 2.0f * normal(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  DeviceBuffer qd = to_device(q), kc = to_device(kc_h), vc = to_device(vc_h);
  KvCacheView cache{DType::F32, kc.get(), vc.get(), n_ctx, c.n_kv, c.hd};
  cache.n_seq = n_seq;
  // Every launch-shape variant must give the same f32 results (the f32 path has one shape and ignores the variant).
  for (int variant = -1; variant < detail::attn_prefill_variant_count(); ++variant) {
    const auto run = prefill_runner(variant, qd.as<float>(), ld_q, cache, c, scale);
    const auto o = run_f32_and_out16(run, c.t * width);
    // f32 throughout: dot products and sums over <= 820 terms (~1e-6 relative), exp2f (2 ulp) of scores whose
    // f32 rounding moves a weight by ~1e-6; 1e-5 leaves several times that while a masking off-by-one moves a row
    // by ~1e-3.
    for (int64_t r = 0; r < c.t; ++r) {
      std::vector<double> ref;
      attn_decode_ref(&q[r * ld_q], kf, vf, n_ctx, c.n_head, c.n_kv, c.hd, static_cast<int32_t>(c.p0 + r), scale, ref);
      const double rel = rel_l2(o.data() + r * width, ref.data(), static_cast<size_t>(width));
      ASSERT_TRUE(rel <= 1e-5) << "variant " << variant << " row " << r << " (position " << c.p0 + r
                               << "): relative error " << rel;
    }
  }
}

TEST(CudaAttnPrefill, F32CacheMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  // Row counts around the 32-row blocks and 32-key tiles, chunked prefill (p0 > 0), both slots.
  const PrefillCase cases[] = {
      {DType::F32, 64, 9, 3, 1, 0, 0},     {DType::F32, 64, 9, 3, 31, 0, 1},    {DType::F32, 128, 32, 8, 33, 0, 0},
      {DType::F32, 128, 4, 4, 200, 37, 1}, {DType::F32, 64, 9, 3, 513, 300, 1}, {DType::F32, 128, 32, 8, 64, 300, 0},
      {DType::F32, 128, 8, 2, 7, 32, 1},
  };
  for (const PrefillCase& c : cases) {
    check_prefill_f32(c, rng);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaAttnPrefill, RejectsBadArguments) {
  TESSERA_REQUIRE_GPU();
  const int64_t n_ctx = 64, hd = 64, n_kv = 2, n_head = 4;
  DeviceBuffer kc(2 * 2 * n_kv * n_ctx * hd), vc(2 * 2 * n_kv * n_ctx * hd);
  DeviceBuffer q(sizeof(float) * n_ctx * n_head * hd), out(sizeof(float) * n_ctx * n_head * hd);
  KvCacheView cache{DType::BF16, kc.get(), vc.get(), n_ctx, n_kv, hd};
  cache.n_seq = 2;
  const int64_t ld = n_head * hd;
  auto call = [&](const KvCacheView& c, int64_t seq, int64_t p0, int64_t t, int64_t heads) {
    attn_prefill(q.as<float>(), ld, c, seq, p0, t, out.as<float>(), heads, 0.125f, nullptr);
  };
  EXPECT_NO_THROW(call(cache, 1, 10, 54, n_head));  // exactly fills the cache
  synchronize();
  EXPECT_THROW(call(cache, 1, 10, 55, n_head), Error);  // p0 + t > n_ctx
  EXPECT_THROW(call(cache, 0, 64, 1, n_head), Error);
  EXPECT_THROW(call(cache, 2, 0, 8, n_head), Error);  // slot outside [0, n_seq)
  EXPECT_THROW(call(cache, -1, 0, 8, n_head), Error);
  EXPECT_THROW(call(cache, 0, 0, 8, 3), Error);  // 3 query heads over 2 kv heads
  KvCacheView bad = cache;
  bad.hd = 96;
  EXPECT_THROW(call(bad, 0, 0, 8, n_head), Error);
  bad = cache;
  bad.dtype = DType::Q8_0;
  EXPECT_THROW(call(bad, 0, 0, 8, n_head), Error);
  EXPECT_THROW(attn_prefill(q.as<float>(), ld - 4, cache, 0, 0, 8, out.as<float>(), n_head, 0.125f, nullptr), Error);
  // Exactly one of out and out16, and out16 only in bf16 or f16.
  EXPECT_THROW(attn_prefill(q.as<float>(), ld, cache, 0, 0, 8, out.as<float>(), n_head, 0.125f, nullptr, out.get()),
               Error);
  EXPECT_THROW(attn_prefill(q.as<float>(), ld, cache, 0, 0, 8, nullptr, n_head, 0.125f, nullptr), Error);
  EXPECT_THROW(attn_prefill(q.as<float>(), ld, cache, 0, 0, 8, nullptr, n_head, 0.125f, nullptr, out.get(), DType::F32),
               Error);
}

}  // namespace
}  // namespace tessera::cuda::test
