// RoPE + KV-cache store and split-K decode attention against double-precision references.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"

namespace tessera::cuda::test {
namespace {

struct RopeCase {
  DType dtype;
  int64_t n_head, n_kv, hd, rope_dim;
  bool neox;
  int32_t pos;
};

TEST(CudaAttention, RopeStoreKvMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const RopeCase cases[] = {
      {DType::F16, 9, 3, 64, 64, false, 0},        {DType::F16, 9, 3, 64, 64, true, 37},
      {DType::BF16, 32, 8, 128, 128, false, 4095}, {DType::BF16, 8, 2, 128, 64, true, 1000},  // partial rotation
      {DType::F16, 4, 4, 256, 256, false, 123456},  // large theta: the accurate sincosf path
  };
  for (const RopeCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " heads " << c.n_head << "/" << c.n_kv << " hd " << c.hd
                                      << " rope_dim " << c.rope_dim << " neox " << c.neox << " pos " << c.pos);
    const int64_t n_ctx = c.pos + 2;
    const auto q = random_floats(rng, c.n_head * c.hd, -2.0f, 2.0f);
    const auto k = random_floats(rng, c.n_kv * c.hd, -2.0f, 2.0f);
    const auto v = random_floats(rng, c.n_kv * c.hd, -2.0f, 2.0f);
    const auto inv_freq = llama_inv_freq(c.rope_dim, 500000.0);
    DeviceBuffer qd = to_device(q), kd = to_device(k), vd = to_device(v), fd = to_device(inv_freq);
    DeviceBuffer posd = to_device(std::vector<int32_t>{c.pos});
    const size_t cache_elems = static_cast<size_t>(c.n_kv * n_ctx * c.hd);
    DeviceBuffer kc = poisoned(2 * cache_elems), vc = poisoned(2 * cache_elems);
    const KvCacheView cache{c.dtype, kc.get(), vc.get(), n_ctx, c.n_kv, c.hd};
    rope_store_kv(qd.as<float>(), kd.as<float>(), vd.as<float>(), cache, posd.as<int32_t>(), c.n_head, c.rope_dim,
                  fd.as<float>(), c.neox, nullptr);
    synchronize();
    const auto q_out = to_host<float>(qd, q.size());
    const auto kc_h = to_host<uint16_t>(kc, cache_elems), vc_h = to_host<uint16_t>(vc, cache_elems);
    std::vector<double> ref(c.hd);
    // Inputs are within +-2, so rotated values within 2.83: the device's sincosf (2 ulp) and its two rounded
    // products agree with the double rotation to ~4 ulp of 2.83 (1e-6); 2e-6 leaves room. The cache adds one rounding
    // to f16 (2^-11 relative) or bf16 (2^-8).
    for (int64_t h = 0; h < c.n_head; ++h) {
      rope_head_ref(&q[h * c.hd], ref.data(), c.hd, c.rope_dim, c.pos, inv_freq.data(), c.neox);
      for (int64_t e = 0; e < c.hd; ++e) ASSERT_NEAR(q_out[h * c.hd + e], ref[e], 2e-6) << "q head " << h << " e " << e;
    }
    const double rel = c.dtype == DType::F16 ? 0x1.0p-11 : 0x1.0p-8;
    for (int64_t h = 0; h < c.n_kv; ++h) {
      rope_head_ref(&k[h * c.hd], ref.data(), c.hd, c.rope_dim, c.pos, inv_freq.data(), c.neox);
      const size_t row = static_cast<size_t>((h * n_ctx + c.pos) * c.hd);
      for (int64_t e = 0; e < c.hd; ++e) {
        ASSERT_NEAR(cache_to_float(c.dtype, kc_h[row + e]), ref[e], rel * std::fabs(ref[e]) + 6e-6)
            << "k head " << h << " e " << e;
        // v is only rounded: both sides round to nearest even, so the bits match.
        ASSERT_EQ(vc_h[row + e], float_to_cache(c.dtype, v[h * c.hd + e])) << "v head " << h << " e " << e;
      }
      // Positions other than pos stay untouched (still the 0xFFFF poison).
      ASSERT_EQ(kc_h[static_cast<size_t>((h * n_ctx + c.pos + 1) * c.hd)], 0xFFFF);
    }
  }
}

TEST(CudaAttention, RopeStoreKvRejectsPositionOutsideCache) {
  TESSERA_REQUIRE_GPU();
  const int64_t n_head = 2, n_kv = 1, hd = 64, n_ctx = 8;
  DeviceBuffer q = to_device(std::vector<float>(n_head * hd, 1.0f)), k = to_device(std::vector<float>(hd, 1.0f));
  DeviceBuffer v = to_device(std::vector<float>(hd, 1.0f)), f = to_device(std::vector<float>(hd / 2, 0.5f));
  DeviceBuffer kc = poisoned(2 * n_ctx * hd), vc = poisoned(2 * n_ctx * hd);
  DeviceBuffer pos = to_device(std::vector<int32_t>{static_cast<int32_t>(n_ctx)});
  const KvCacheView cache{DType::F16, kc.get(), vc.get(), n_ctx, n_kv, hd};
  rope_store_kv(q.as<float>(), k.as<float>(), v.as<float>(), cache, pos.as<int32_t>(), n_head, hd, f.as<float>(), false,
                nullptr);
  synchronize();
  for (float x : to_host<float>(q, n_head * hd)) ASSERT_TRUE(std::isnan(x));
  for (uint16_t x : to_host<uint16_t>(kc, n_ctx * hd)) ASSERT_EQ(x, 0xFFFF);  // nothing stored
  EXPECT_THROW(rope_store_kv(q.as<float>(), k.as<float>(), v.as<float>(), cache, pos.as<int32_t>(), n_head, 63,
                             f.as<float>(), false, nullptr),
               Error);  // odd rope_dim
}

struct AttnCase {
  DType dtype;
  int64_t n_head, n_kv, hd, n_ctx;
  int32_t pos;
};

void check_attention(const AttnCase& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " heads " << c.n_head << "/" << c.n_kv << " hd " << c.hd
                                    << " n_ctx " << c.n_ctx << " pos " << c.pos);
  const size_t cache_elems = static_cast<size_t>(c.n_kv * c.n_ctx * c.hd);
  // Random cache contents in the cache dtype; positions past pos hold NaN poison, which must never be read.
  std::vector<uint16_t> kc_h(cache_elems, 0xFFFF), vc_h(cache_elems, 0xFFFF);
  std::vector<float> kf(cache_elems), vf(cache_elems);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t h = 0; h < c.n_kv; ++h)
    for (int64_t p = 0; p <= c.pos; ++p)
      for (int64_t i = 0; i < c.hd; ++i) {
        const size_t at = static_cast<size_t>((h * c.n_ctx + p) * c.hd + i);
        kc_h[at] = float_to_cache(c.dtype, normal(rng));
        vc_h[at] = float_to_cache(c.dtype, normal(rng));
        kf[at] = cache_to_float(c.dtype, kc_h[at]);
        vf[at] = cache_to_float(c.dtype, vc_h[at]);
      }
  std::vector<float> q(c.n_head * c.hd);
  for (auto& x : q) x = normal(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  DeviceBuffer qd = to_device(q), kc = to_device(kc_h), vc = to_device(vc_h);
  DeviceBuffer posd = to_device(std::vector<int32_t>{c.pos}), out = poisoned(sizeof(float) * q.size());
  const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd};
  AttnWorkspace ws(c.n_head, cache);
  attn_decode(qd.as<float>(), cache, posd.as<int32_t>(), out.as<float>(), c.n_head, scale, ws, nullptr);
  synchronize();
  const auto o = to_host<float>(out, q.size());
  std::vector<double> ref;
  attn_decode_ref(q.data(), kf, vf, c.n_ctx, c.n_head, c.n_kv, c.hd, c.pos, scale, ref);
  // Scores are ~N(0, 1): f32 dot products of hd terms and expf are good to ~1e-6 relative, and the output is a convex
  // combination of |v| <~ 5, so 2e-5 absolute is ~10x the rounding while one dropped or doubled position among 4096
  // moves the output by ~1e-4.
  for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], ref[i], 2e-5) << "head " << i / c.hd << " dim " << i % c.hd;
}

TEST(CudaAttention, DecodeMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const AttnCase cases[] = {
      {DType::F16, 9, 3, 64, 128, 0},          // one position (SmolLM2-135M heads)
      {DType::F16, 9, 3, 64, 2048, 64},        // chunk boundary
      {DType::BF16, 32, 8, 128, 4096, 4095},   // Llama-3-8B heads at a full 4k cache
      {DType::BF16, 32, 8, 128, 8192, 1000},   // grid sized for 8k, 1k in use
      {DType::F16, 12, 1, 128, 600, 599},      // a group of 12: two head tiles (8 + 4)
      {DType::F16, 4, 4, 256, 3000, 2500},     // no GQA, hd 256
      {DType::BF16, 16, 2, 64, 70000, 33000},  // more than 1024-position chunks would need: max_splits grows
  };
  for (const AttnCase& c : cases) check_attention(c, rng);
}

TEST(CudaAttention, DecodeRejectsBadArguments) {
  TESSERA_REQUIRE_GPU();
  DeviceBuffer kc(2 * 64 * 96), vc(2 * 64 * 96);
  const KvCacheView bad_hd{DType::F16, kc.get(), vc.get(), 64, 1, 96};
  EXPECT_THROW(AttnWorkspace(4, bad_hd), Error);
  const KvCacheView bad_dtype{DType::F32, kc.get(), vc.get(), 64, 1, 64};
  EXPECT_THROW(AttnWorkspace(4, bad_dtype), Error);
  const KvCacheView ok{DType::F16, kc.get(), vc.get(), 64, 2, 64};
  EXPECT_THROW(AttnWorkspace(3, ok), Error);  // 3 query heads over 2 kv heads
}

}  // namespace
}  // namespace tessera::cuda::test
