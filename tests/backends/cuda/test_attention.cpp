// RoPE + KV-cache store and split-K decode attention (separate and fused) against double-precision references, over
// f16/bf16 caches and the opt-in f32 cache.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cuda/cuda_options.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace tessera::cuda::test {
namespace {

// Runs body once per decode attention path src/ has: v6 (the default: v5 with the short-context path) and v5
// (CudaOptions::attn_short = 0); the options are read at launch. (v3, v4 and v5's clusters left src/:
// bench/cuda/experiments/attn_decode_versions.cu checks them against a double reference.)
template <typename F>
void for_each_attn_version(F&& body) {
  for (const bool v5 : {false, true}) {
    SCOPED_TRACE(v5 ? "attention v5 (attn_short = 0)" : "attention v6");
    CudaOptions o = cuda_options();
    o.attn_short = v5 ? 0 : -1;
    const CudaOptionsScope scope(o);
    body();
    if (::testing::Test::HasFatalFailure()) break;
  }
}

struct RopeCase {
  DType dtype;
  int64_t n_head, n_kv, hd, rope_dim;
  bool neox;
  int32_t pos;
};

// rope_store_kv for one token against the double rotation: q in place, k rotated into the cache (E: uint16_t for an
// f16/bf16 cache, float for an f32 one), v copied, the other positions left poisoned (all bits set).
template <typename E>
void check_rope_store_kv(const RopeCase& c, std::mt19937& rng) {
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
  DeviceBuffer kc = poisoned(sizeof(E) * cache_elems), vc = poisoned(sizeof(E) * cache_elems);
  const KvCacheView cache{c.dtype, kc.get(), vc.get(), n_ctx, c.n_kv, c.hd};
  rope_store_kv(qd.as<float>(), kd.as<float>(), vd.as<float>(), cache, posd.as<int32_t>(), c.n_head, c.rope_dim,
                fd.as<float>(), c.neox, nullptr);
  synchronize();
  const auto q_out = to_host<float>(qd, q.size());
  const auto kc_h = to_host<E>(kc, cache_elems), vc_h = to_host<E>(vc, cache_elems);
  const auto poison = [](E x) {
    E all;
    std::memset(&all, 0xFF, sizeof all);
    return std::memcmp(&x, &all, sizeof x) == 0;
  };
  std::vector<double> ref(c.hd);
  // Inputs are within +-2, so rotated values within 2.83: the device's sincosf (2 ulp) and its two rounded
  // products agree with the double rotation to ~4 ulp of 2.83 (1e-6); 2e-6 leaves room. A 16-bit cache adds one
  // rounding to f16 (2^-11 relative) or bf16 (2^-8); an f32 cache holds k exactly as rotated.
  for (int64_t h = 0; h < c.n_head; ++h) {
    rope_head_ref(&q[h * c.hd], ref.data(), c.hd, c.rope_dim, c.pos, inv_freq.data(), c.neox);
    for (int64_t e = 0; e < c.hd; ++e) ASSERT_NEAR(q_out[h * c.hd + e], ref[e], 2e-6) << "q head " << h << " e " << e;
  }
  const double rel = c.dtype == DType::F32 ? 0.0 : c.dtype == DType::F16 ? 0x1.0p-11 : 0x1.0p-8;
  for (int64_t h = 0; h < c.n_kv; ++h) {
    rope_head_ref(&k[h * c.hd], ref.data(), c.hd, c.rope_dim, c.pos, inv_freq.data(), c.neox);
    const size_t row = static_cast<size_t>((h * n_ctx + c.pos) * c.hd);
    for (int64_t e = 0; e < c.hd; ++e) {
      if constexpr (std::is_same_v<E, float>) {
        ASSERT_NEAR(kc_h[row + e], ref[e], 2e-6) << "k head " << h << " e " << e;
        ASSERT_EQ(vc_h[row + e], v[h * c.hd + e]) << "v head " << h << " e " << e;
      } else {
        ASSERT_NEAR(cache_to_float(c.dtype, kc_h[row + e]), ref[e], rel * std::fabs(ref[e]) + 6e-6)
            << "k head " << h << " e " << e;
        // v is only rounded: both sides round to nearest even, so the bits match.
        ASSERT_EQ(vc_h[row + e], float_to_cache(c.dtype, v[h * c.hd + e])) << "v head " << h << " e " << e;
      }
    }
    // Positions other than pos stay untouched (still the poison).
    ASSERT_TRUE(poison(kc_h[static_cast<size_t>((h * n_ctx + c.pos + 1) * c.hd)]));
    ASSERT_TRUE(poison(vc_h[static_cast<size_t>((h * n_ctx + c.pos + 1) * c.hd)]));
  }
}

TEST(CudaAttention, RopeStoreKvMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const RopeCase cases[] = {
      {DType::F16, 9, 3, 64, 64, false, 0},        {DType::F16, 9, 3, 64, 64, true, 37},
      {DType::BF16, 32, 8, 128, 128, false, 4095}, {DType::BF16, 8, 2, 128, 64, true, 1000},  // partial rotation
      {DType::F16, 4, 4, 256, 256, false, 123456},  // large theta: the accurate sincosf path
  };
  for (const RopeCase& c : cases) {
    check_rope_store_kv<uint16_t>(c, rng);
    if (HasFatalFailure()) return;
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
  for_each_attn_version([&] {
    for (const AttnCase& c : cases) check_attention(c, rng);
  });
}

// Positions at the versions' thresholds: a v4 warp step (64 positions for hd 64, 32 for hd 128), a tile (128 / 64
// for groups <= 4; 64 / 32 / 16 for wider groups or hd 256), the single-block limit = smallest chunk (two tiles),
// chunk boundaries (512, 768 for hd 64), v6's short-context limit (8 steps of a block: 512 positions at hd 64 and
// 256 at hd 128 for groups <= 4, 128 for a group of 12 at hd 128 and for hd 256 without GQA, 256 for a group of 8
// at hd 64, 32 for a group of 8 at hd 256), and the last cache position.
// A cache shape and the positions a test decodes at.
struct CacheShape {
  DType dtype;
  int64_t n_head, n_kv, hd, n_ctx;
  std::vector<int32_t> positions;
};

TEST(CudaAttention, DecodeMatchesReferenceAtThresholds) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const CacheShape shapes[] = {
      {DType::F16, 9, 3, 64, 2048, {0, 1, 62, 63, 64, 127, 128, 255, 256, 257, 511, 512, 513, 767, 768, 2047}},
      {DType::BF16, 9, 3, 64, 1024, {1, 63, 64, 129, 511, 512, 1023}},
      {DType::BF16, 32, 8, 128, 4096, {0, 1, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 513, 4095}},
      {DType::F16, 12, 1, 128, 1100, {0, 1, 127, 128, 511, 512, 1099}},
      {DType::BF16, 4, 4, 256, 1200, {0, 1, 15, 16, 63, 64, 127, 128, 511, 512, 1199}},
      {DType::F16, 16, 2, 256, 700, {0, 31, 32, 255, 256, 511, 512, 699}},   // a group of 8 at hd 256: 4 warps in v4
      {DType::F16, 16, 2, 64, 600, {0, 127, 128, 255, 256, 511, 512, 599}},  // a group of 8 at hd 64: 8 warps in v4
  };
  for_each_attn_version([&] {
    for (const CacheShape& s : shapes)
      for (int32_t p : s.positions) {
        check_attention({s.dtype, s.n_head, s.n_kv, s.hd, s.n_ctx, p}, rng);
        if (HasFatalFailure()) return;
      }
  });
}

struct FusedCase {
  DType dtype;
  int64_t n_head, n_kv, hd, n_ctx, rope_dim;
  bool neox;
  int32_t pos;
};

// The fused path's results for one token at pos over a cache whose positions < pos hold `kc_h`/`vc_h` (positions
// > pos poison): checks the cache (pos holds the rotated k and the v, everything else untouched) and the output
// against attention over the stored cache with q rotated in double precision.
void check_fused_result(const FusedCase& c, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, const std::vector<float>& inv_freq,
                        const std::vector<uint16_t>& kc_before, const std::vector<uint16_t>& vc_before,
                        const std::vector<uint16_t>& kc_h, const std::vector<uint16_t>& vc_h,
                        const std::vector<float>& o) {
  std::vector<double> ref(c.hd);
  const double rel = c.dtype == DType::F16 ? 0x1.0p-11 : 0x1.0p-8;  // as RopeStoreKvMatchesReference
  for (int64_t h = 0; h < c.n_kv; ++h)
    for (int64_t p = 0; p < c.n_ctx; ++p) {
      const size_t row = static_cast<size_t>((h * c.n_ctx + p) * c.hd);
      if (p != c.pos) {
        for (int64_t e = 0; e < c.hd; ++e) {
          ASSERT_EQ(kc_h[row + e], kc_before[row + e]) << "k head " << h << " position " << p;
          ASSERT_EQ(vc_h[row + e], vc_before[row + e]) << "v head " << h << " position " << p;
        }
        continue;
      }
      rope_head_ref(&k[h * c.hd], ref.data(), c.hd, c.rope_dim, c.pos, inv_freq.data(), c.neox);
      for (int64_t e = 0; e < c.hd; ++e) {
        ASSERT_NEAR(cache_to_float(c.dtype, kc_h[row + e]), ref[e], rel * std::fabs(ref[e]) + 6e-6)
            << "k head " << h << " e " << e;
        ASSERT_EQ(vc_h[row + e], float_to_cache(c.dtype, v[h * c.hd + e])) << "v head " << h << " e " << e;
      }
    }
  const size_t elems = kc_h.size();
  std::vector<float> kf(elems), vf(elems), q_rot(q.size());
  for (size_t i = 0; i < elems; ++i) kf[i] = cache_to_float(c.dtype, kc_h[i]), vf[i] = cache_to_float(c.dtype, vc_h[i]);
  for (int64_t h = 0; h < c.n_head; ++h) {
    rope_head_ref(&q[h * c.hd], ref.data(), c.hd, c.rope_dim, c.pos, inv_freq.data(), c.neox);
    for (int64_t e = 0; e < c.hd; ++e) q_rot[h * c.hd + e] = static_cast<float>(ref[e]);
  }
  std::vector<double> out_ref;
  attn_decode_ref(q_rot.data(), kf, vf, c.n_ctx, c.n_head, c.n_kv, c.hd, c.pos, 1.0f / std::sqrt(float(c.hd)), out_ref);
  // As DecodeMatchesReference; q's rotation in f32 (~1e-6 relative) moves the scores far less than 2e-5.
  for (size_t i = 0; i < o.size(); ++i)
    ASSERT_NEAR(o[i], out_ref[i], 2e-5) << "head " << i / c.hd << " dim " << i % c.hd;
}

// A cache with random values (cache dtype) at positions < pos and NaN poison from pos on.
void random_prefix(const FusedCase& c, std::mt19937& rng, std::vector<uint16_t>& kc, std::vector<uint16_t>& vc) {
  const size_t elems = static_cast<size_t>(c.n_kv * c.n_ctx * c.hd);
  kc.assign(elems, 0xFFFF), vc.assign(elems, 0xFFFF);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t h = 0; h < c.n_kv; ++h)
    for (int64_t p = 0; p < c.pos; ++p)
      for (int64_t i = 0; i < c.hd; ++i) {
        const size_t at = static_cast<size_t>((h * c.n_ctx + p) * c.hd + i);
        kc[at] = float_to_cache(c.dtype, normal(rng)), vc[at] = float_to_cache(c.dtype, normal(rng));
      }
}

// Fresh random inputs of one fused launch at c.pos: the cache prefix (random_prefix), q, this token's k and v, the
// RoPE frequencies for `rope_base`, and device copies of q, k, v, the frequencies and pos (the caches are copied per
// run: the launch stores into them).
struct FusedInputs {
  std::vector<uint16_t> kc_h, vc_h;
  std::vector<float> q, k, v, inv_freq;
  DeviceBuffer qd, kd, vd, fd, posd;
};
FusedInputs fused_inputs(const FusedCase& c, std::mt19937& rng, double rope_base) {
  FusedInputs in;
  random_prefix(c, rng, in.kc_h, in.vc_h);
  in.q = random_floats(rng, c.n_head * c.hd, -2.0f, 2.0f);
  in.k = random_floats(rng, c.n_kv * c.hd, -2.0f, 2.0f);
  in.v = random_floats(rng, c.n_kv * c.hd, -2.0f, 2.0f);
  in.inv_freq = llama_inv_freq(c.rope_dim, rope_base);
  in.qd = to_device(in.q), in.kd = to_device(in.k), in.vd = to_device(in.v), in.fd = to_device(in.inv_freq);
  in.posd = to_device(std::vector<int32_t>{c.pos});
  return in;
}

// One fused launch at c.pos over a random prefix, checked as check_fused_result.
void check_fused(const FusedCase& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " heads " << c.n_head << "/" << c.n_kv << " hd " << c.hd
                                    << " rope_dim " << c.rope_dim << " neox " << c.neox << " n_ctx " << c.n_ctx
                                    << " pos " << c.pos);
  FusedInputs in = fused_inputs(c, rng, 500000.0);
  const auto &q = in.q, &k = in.k, &v = in.v, &inv_freq = in.inv_freq;
  const auto &kc_h = in.kc_h, &vc_h = in.vc_h;
  DeviceBuffer &qd = in.qd, &kd = in.kd, &vd = in.vd, &fd = in.fd, &posd = in.posd;
  DeviceBuffer kc = to_device(kc_h), vc = to_device(vc_h);
  DeviceBuffer out = poisoned(sizeof(float) * q.size());
  const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd};
  AttnWorkspace ws(c.n_head, cache);
  attn_decode_rope(qd.as<float>(), kd.as<float>(), vd.as<float>(), cache, posd.as<int32_t>(), c.rope_dim,
                   fd.as<float>(), c.neox, out.as<float>(), c.n_head, 1.0f / std::sqrt(float(c.hd)), ws, nullptr);
  synchronize();
  ASSERT_EQ(to_host<float>(qd, q.size()), q);  // q is only read
  check_fused_result(c, q, k, v, inv_freq, kc_h, vc_h, to_host<uint16_t>(kc, kc_h.size()),
                     to_host<uint16_t>(vc, vc_h.size()), to_host<float>(out, q.size()));
}

TEST(CudaAttention, DecodeRopeMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  // v3: one block per kv head up to 256 positions (hd 64, groups <= 4) or 128 (hd 128), chunks with a combine beyond;
  // v4 and v5 the same (v5's opt-in clusters: DecodeV5ClusterSizesAndEarlyLoads).
  const FusedCase cases[] = {
      {DType::F16, 9, 3, 64, 512, 64, false, 0},       {DType::BF16, 9, 3, 64, 512, 64, true, 37},
      {DType::F16, 9, 3, 64, 512, 64, false, 255},     {DType::BF16, 9, 3, 64, 512, 64, false, 256},
      {DType::F16, 9, 3, 64, 512, 64, true, 511},      {DType::BF16, 32, 8, 128, 4096, 128, false, 127},
      {DType::BF16, 32, 8, 128, 4096, 128, true, 128}, {DType::F16, 32, 8, 128, 4096, 128, false, 4095},
      {DType::BF16, 8, 2, 128, 300, 64, true, 200},     // partial rotation
      {DType::F16, 12, 1, 128, 600, 128, false, 599},   // two head tiles: only tile 0 stores
      {DType::F16, 4, 4, 256, 3000, 256, false, 2500},  // hd 256, no GQA
      {DType::BF16, 9, 3, 64, 1024, 64, false, 511},    // two chunks
      {DType::F16, 9, 3, 64, 1024, 64, true, 512},      // three chunks
      {DType::F16, 9, 3, 64, 1024, 64, false, 1},      {DType::BF16, 32, 8, 128, 4096, 128, false, 513},
  };
  for_each_attn_version([&] {
    for (const FusedCase& c : cases) {
      check_fused(c, rng);
      if (HasFatalFailure()) return;
    }
  });
}

// The default path at v5's old cluster thresholds, plain and fused: two tiles (the single-block limit: 256 positions
// for SmolLM2 heads, 128 for 2 kv heads of 128, 64 for a group of 8 at hd 256), 8 smallest chunks (2048 / 1024 / 512)
// and past them (the global combine); Llama-3-8B heads. (The clusters themselves, and v5 without its early loads,
// left src/ for bench/cuda/experiments/attn_decode_versions.cu.)
TEST(CudaAttention, DecodeAtChunkThresholds) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (int32_t p : {63, 64, 255, 256, 511, 1023, 2047, 2048, 2100})
    check_attention({DType::BF16, 9, 3, 64, 2200, p}, rng);
  for (int32_t p : {127, 128, 129, 700, 1023, 1024}) check_attention({DType::F16, 8, 2, 128, 1100, p}, rng);
  for (int32_t p : {31, 128, 1023}) check_attention({DType::F16, 32, 8, 128, 1100, p}, rng);
  for (int32_t p : {63, 64, 200, 511, 512}) check_attention({DType::F16, 16, 2, 256, 700, p}, rng);
  for (int32_t p : {64, 255, 256, 300, 2047, 2048}) check_fused({DType::BF16, 9, 3, 64, 2200, 64, false, p}, rng);
  check_fused({DType::F16, 8, 2, 128, 1100, 128, true, 700}, rng);
  check_fused({DType::F16, 32, 8, 128, 1100, 128, true, 700}, rng);
  check_fused({DType::BF16, 8, 2, 128, 300, 64, true, 200}, rng);  // partial rotation
  check_fused({DType::F16, 16, 2, 256, 700, 256, false, 400}, rng);
}

// v6's short-context paths against v5 (CudaOptions::attn_short = 0) on the same fresh random inputs, fused: over
// caches of one compact register window (256 positions at hd 64, 128 at hd 128), of 520 positions and of the compact
// kernel's four windows (attn_compact_kernel by default where the cache is at most four windows, walking 1-4 windows;
// attn_split_kernel's short path or v5 with attn_compact = 0), at positions where the paths differ most (one position,
// a partial warp step, one step, a block step, window edges, the limits), under caps (attn_short = N: contexts up to N
// take the short path, longer ones v5; a cap below the cache size also rules the compact kernel out). Every result
// must match the double reference (check_fused_result) and v5's; the caches must be identical except k at pos, which
// each path rotates in f32 on its own (checked against the reference's tolerance for the stored k).
TEST(CudaAttention, DecodeShortPathMatchesSplitPath) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  struct Shape {
    DType dtype;
    int64_t n_head, n_kv, hd, rope_dim;
    bool neox;
    int64_t window;  // the compact kernel's register window
    std::vector<int32_t> positions;
  };
  const Shape shapes[] = {
      {DType::BF16, 9, 3, 64, 64, false, 256, {0, 1, 5, 63, 64, 200, 255, 256, 383, 511, 512, 700, 1023}},  // SmolLM2
      {DType::BF16, 32, 8, 64, 64, true, 256, {0, 100, 255, 384, 511, 767, 768, 1000}},  // Llama-3.2-1B heads
      {DType::BF16, 32, 8, 128, 128, false, 128, {0, 31, 127, 128, 200, 255, 300, 511}},  // Llama-3-8B heads
      {DType::F16, 8, 2, 128, 64, true, 128, {7, 127, 130, 400}},                        // partial neox rotation
  };
  struct Path {
    int attn_short;  // CudaOptions::attn_short (-1: the default limit)
    int attn_compact;
  };
  for (const int cap : {-1, 64, 300})  // -1: the default limit
    for (const Shape& sh : shapes)
      for (int64_t n_ctx : {int64_t{520}, sh.window, 4 * sh.window})
        for (int32_t pos : sh.positions) {
          if (pos >= n_ctx) continue;
          const FusedCase c{sh.dtype, sh.n_head, sh.n_kv, sh.hd, n_ctx, sh.rope_dim, sh.neox, pos};
          SCOPED_TRACE(::testing::Message() << "cap " << cap << " heads " << c.n_head << "/" << c.n_kv << " hd " << c.hd
                                            << " n_ctx " << n_ctx << " pos " << pos);
          FusedInputs in = fused_inputs(c, rng, 10000.0);
          const auto &q = in.q, &k = in.k, &v = in.v, &inv_freq = in.inv_freq;
          const auto &kc_h = in.kc_h, &vc_h = in.vc_h;
          DeviceBuffer &qd = in.qd, &kd = in.kd, &vd = in.vd, &fd = in.fd, &posd = in.posd;
          // v5 last: the others are compared with it.
          const Path paths[] = {{cap, -1}, {cap, 0}, {0, -1}};
          std::vector<float> o[3];
          std::vector<uint16_t> vc_out[3];
          for (int i = 0; i < 3; ++i) {
            SCOPED_TRACE(::testing::Message()
                         << "attn_short " << paths[i].attn_short << " attn_compact " << paths[i].attn_compact);
            CudaOptions opt = cuda_options();
            opt.attn_short = paths[i].attn_short, opt.attn_compact = paths[i].attn_compact;
            const CudaOptionsScope scope(opt);
            DeviceBuffer kc = to_device(kc_h), vc = to_device(vc_h), out = poisoned(sizeof(float) * q.size());
            const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd};
            AttnWorkspace ws(c.n_head, cache);
            attn_decode_rope(qd.as<float>(), kd.as<float>(), vd.as<float>(), cache, posd.as<int32_t>(), c.rope_dim,
                             fd.as<float>(), c.neox, out.as<float>(), c.n_head, 1.0f / std::sqrt(float(c.hd)), ws,
                             nullptr);
            synchronize();
            o[i] = to_host<float>(out, q.size());
            vc_out[i] = to_host<uint16_t>(vc, vc_h.size());
            check_fused_result(c, q, k, v, inv_freq, kc_h, vc_h, to_host<uint16_t>(kc, kc_h.size()), vc_out[i], o[i]);
            if (HasFatalFailure()) break;
          }
          if (HasFatalFailure()) return;
          for (int i = 0; i < 2; ++i) {
            ASSERT_EQ(vc_out[i], vc_out[2]);
            for (size_t j = 0; j < o[i].size(); ++j)
              ASSERT_NEAR(o[i][j], o[2][j], 2e-5) << "path " << i << " head " << j / c.hd << " dim " << j % c.hd;
          }
        }
}

// The optional quantized output (attn_decode_rope's out_q8/out_ds, for a quantized o-projection) is exactly what
// quantize_q8 makes of the f32 output, which it leaves unchanged: over caches the compact kernel serves (written in
// attn_short) and larger ones (the split kernel, then a quantize_q8 launch), short and chunked contexts.
TEST(CudaAttention, DecodeQ8OutputIsQuantizeQ8OfTheOutput) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const CacheShape shapes[] = {
      {DType::BF16, 32, 8, 128, 384, {0, 200, 383}},        // Llama-3-8B heads, compact (three windows)
      {DType::BF16, 32, 8, 128, 2048, {100, 1500}},         // the split kernel: short path, then chunks
      {DType::F16, 9, 3, 64, 1024, {5, 700}},               // SmolLM2 heads, compact
      {DType::BF16, 9, 3, 64, 4096, {3000}},                // the split kernel's chunks at hd 64
  };
  for (const CacheShape& sh : shapes)
    for (int32_t pos : sh.positions) {
      const FusedCase c{sh.dtype, sh.n_head, sh.n_kv, sh.hd, sh.n_ctx, sh.hd, false, pos};
      SCOPED_TRACE(::testing::Message() << "heads " << c.n_head << "/" << c.n_kv << " hd " << c.hd << " n_ctx "
                                        << c.n_ctx << " pos " << pos);
      const int64_t width = c.n_head * c.hd;
      FusedInputs in = fused_inputs(c, rng, 10000.0);  // c.rope_dim = c.hd
      const auto &kc_h = in.kc_h, &vc_h = in.vc_h;
      DeviceBuffer &qd = in.qd, &kd = in.kd, &vd = in.vd, &fd = in.fd, &posd = in.posd;
      std::vector<float> out[2];
      DeviceBuffer q8 = poisoned(static_cast<size_t>(width)), ds = poisoned(sizeof(float2) * (width / 32));
      for (int with_q8 = 0; with_q8 < 2; ++with_q8) {
        DeviceBuffer kc = to_device(kc_h), vc = to_device(vc_h), o = poisoned(sizeof(float) * width);
        const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd};
        AttnWorkspace ws(c.n_head, cache);
        attn_decode_rope(qd.as<float>(), kd.as<float>(), vd.as<float>(), cache, posd.as<int32_t>(), c.rope_dim,
                         fd.as<float>(), c.neox, o.as<float>(), c.n_head, 1.0f / std::sqrt(float(c.hd)), ws, nullptr,
                         with_q8 ? q8.as<int8_t>() : nullptr, with_q8 ? ds.as<float2>() : nullptr);
        synchronize();
        out[with_q8] = to_host<float>(o, static_cast<size_t>(width));
      }
      ASSERT_EQ(out[0], out[1]);  // the f32 output does not depend on the quantized one being written
      DeviceBuffer od = to_device(out[1]), q8_ref = poisoned(static_cast<size_t>(width)),
                   ds_ref = poisoned(sizeof(float2) * (width / 32));
      quantize_q8(od.as<float>(), q8_ref.as<int8_t>(), ds_ref.as<float2>(), width, nullptr);
      synchronize();
      EXPECT_EQ(to_host<int8_t>(q8, static_cast<size_t>(width)), to_host<int8_t>(q8_ref, static_cast<size_t>(width)));
      const auto d_got = to_host<float>(ds, static_cast<size_t>(width / 16));
      const auto d_ref = to_host<float>(ds_ref, static_cast<size_t>(width / 16));
      EXPECT_EQ(d_got, d_ref);
      if (HasFailure()) return;
    }
  // Only one of the pair is an error.
  {
    const FusedCase c{DType::BF16, 9, 3, 64, 64, 64, false, 3};
    DeviceBuffer q = to_device(std::vector<float>(c.n_head * c.hd, 1.0f));
    DeviceBuffer k = to_device(std::vector<float>(c.n_kv * c.hd, 1.0f)), f = to_device(llama_inv_freq(c.hd, 1e4));
    DeviceBuffer kc = poisoned(2 * c.n_kv * c.n_ctx * c.hd), vc = poisoned(2 * c.n_kv * c.n_ctx * c.hd);
    DeviceBuffer posd = to_device(std::vector<int32_t>{c.pos}), o = poisoned(sizeof(float) * c.n_head * c.hd);
    DeviceBuffer q8 = poisoned(static_cast<size_t>(c.n_head * c.hd));
    const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd};
    AttnWorkspace ws(c.n_head, cache);
    EXPECT_THROW(attn_decode_rope(q.as<float>(), k.as<float>(), k.as<float>(), cache, posd.as<int32_t>(), c.hd,
                                  f.as<float>(), false, o.as<float>(), c.n_head, 0.125f, ws, nullptr,
                                  q8.as<int8_t>(), nullptr),
                 Error);
  }
}

// The compact kernel unfused (attn_decode after rope_store_kv) over small caches of every head size and over caches of
// several register windows (the f32 cache:
// F32CacheDecodeAndDecodeRopeMatchReference), and a position outside the cache (NaN).
TEST(CudaAttention, DecodeCompactSmallCaches) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (int32_t p : {0, 1, 100, 255}) check_attention({DType::BF16, 9, 3, 64, 256, p}, rng);
  for (int32_t p : {0, 63, 64, 127}) check_attention({DType::F16, 32, 8, 128, 128, p}, rng);
  for (int32_t p : {0, 33, 63}) check_attention({DType::BF16, 4, 4, 256, 64, p}, rng);
  // Caches of several register windows (1,024 positions at hd 64, 512 at hd 128): 1-4 windows walked.
  for (int32_t p : {256, 511, 600, 1023}) check_attention({DType::BF16, 9, 3, 64, 1024, p}, rng);
  for (int32_t p : {128, 300, 511}) check_attention({DType::F16, 32, 8, 128, 512, p}, rng);
  // pos == n_ctx: NaN rows, nothing stored (compact kernel, fused).
  const int64_t n_head = 9, n_kv = 3, hd = 64, n_ctx = 32;
  DeviceBuffer q = to_device(std::vector<float>(n_head * hd, 1.0f)), k = to_device(std::vector<float>(n_kv * hd, 1.0f));
  DeviceBuffer f = to_device(std::vector<float>(hd / 2, 0.5f)), out = poisoned(sizeof(float) * n_head * hd);
  DeviceBuffer kc = poisoned(2 * n_kv * n_ctx * hd), vc = poisoned(2 * n_kv * n_ctx * hd);
  DeviceBuffer pos = to_device(std::vector<int32_t>{static_cast<int32_t>(n_ctx)});
  const KvCacheView cache{DType::BF16, kc.get(), vc.get(), n_ctx, n_kv, hd};
  AttnWorkspace ws(n_head, cache);
  out.fill_bytes(0);
  attn_decode_rope(q.as<float>(), k.as<float>(), k.as<float>(), cache, pos.as<int32_t>(), hd, f.as<float>(), false,
                   out.as<float>(), n_head, 0.125f, ws, nullptr);
  synchronize();
  for (float x : to_host<float>(out, n_head * hd)) ASSERT_TRUE(std::isnan(x));
  for (uint16_t x : to_host<uint16_t>(kc, n_kv * n_ctx * hd)) ASSERT_EQ(x, 0xFFFF);
}

// The decode pattern: one attn_decode_rope captured in a CUDA graph, replayed for tokens at positions 0..259, then
// every 13th, then 505..520, with new q, k, v each step.
void graph_replay_at_successive_positions(int64_t n_ctx) {
  std::mt19937 rng(test_seed());
  FusedCase c{DType::BF16, 9, 3, 64, n_ctx, 64, false, 0};
  const size_t elems = static_cast<size_t>(c.n_kv * c.n_ctx * c.hd);
  const auto inv_freq = llama_inv_freq(c.rope_dim, 10000.0);
  DeviceBuffer qd(sizeof(float) * c.n_head * c.hd), kd(sizeof(float) * c.n_kv * c.hd), vd(kd.bytes());
  DeviceBuffer fd = to_device(inv_freq), posd(sizeof(int32_t)), out = poisoned(sizeof(float) * c.n_head * c.hd);
  DeviceBuffer kc = poisoned(2 * elems), vc = poisoned(2 * elems);
  const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd};
  AttnWorkspace ws(c.n_head, cache);
  for (bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "PDL on" : "PDL off");
    set_pdl(pdl);
    kc.fill_bytes(0xFF), vc.fill_bytes(0xFF);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    attn_decode_rope(qd.as<float>(), kd.as<float>(), vd.as<float>(), cache, posd.as<int32_t>(), c.rope_dim,
                     fd.as<float>(), c.neox, out.as<float>(), c.n_head, 1.0f / std::sqrt(float(c.hd)), ws, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    std::vector<uint16_t> kc_before(elems, 0xFFFF), vc_before(elems, 0xFFFF);
    for (int32_t p = 0; p < std::min<int64_t>(530, n_ctx); p += (p < 260 || (p >= 505 && p < 520) ? 1 : 13)) {
      SCOPED_TRACE(::testing::Message() << "position " << p);
      c.pos = p;
      if (p > 0 && kc_before[static_cast<size_t>(p - 1) * c.hd] == 0xFFFF) {  // a jump: fill the skipped positions
        for (int64_t h = 0; h < c.n_kv; ++h)
          for (size_t i = static_cast<size_t>((h * c.n_ctx) * c.hd); i < static_cast<size_t>((h * c.n_ctx + p) * c.hd);
               ++i)
            if (kc_before[i] == 0xFFFF) kc_before[i] = vc_before[i] = float_to_cache(c.dtype, 0.5f);
        kc.upload(kc_before.data(), 2 * elems), vc.upload(vc_before.data(), 2 * elems);
      }
      const auto q = random_floats(rng, c.n_head * c.hd, -2.0f, 2.0f);
      const auto k = random_floats(rng, c.n_kv * c.hd, -2.0f, 2.0f);
      const auto v = random_floats(rng, c.n_kv * c.hd, -2.0f, 2.0f);
      qd.upload(q.data(), sizeof(float) * q.size()), kd.upload(k.data(), sizeof(float) * k.size());
      vd.upload(v.data(), sizeof(float) * v.size()), posd.upload(&p, sizeof(int32_t));
      out.fill_bytes(0xFF);
      synchronize();  // the plain copies above are on the legacy stream, the graph on `stream`
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto kc_h = to_host<uint16_t>(kc, elems), vc_h = to_host<uint16_t>(vc, elems);
      check_fused_result(c, q, k, v, inv_freq, kc_before, vc_before, kc_h, vc_h, to_host<float>(out, c.n_head * c.hd));
      if (::testing::Test::HasFatalFailure()) break;
      kc_before = kc_h, vc_before = vc_h;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  set_pdl(true);
}

// The graph replay across the single-block/split boundary (256) and a chunk boundary and v6's short-context limit
// (512); every step checked, PDL on and off, every kernel version; then v6 over a cache that only the compact kernel
// serves.
TEST(CudaAttention, DecodeRopeGraphReplayAtSuccessivePositions) {
  TESSERA_REQUIRE_GPU();
  for_each_attn_version([] { graph_replay_at_successive_positions(540); });
  // A 256-position cache: the compact kernel (v6's default there) at every position.
  graph_replay_at_successive_positions(256);
}

TEST(CudaAttention, DecodeRopeRejectsBadArguments) {
  TESSERA_REQUIRE_GPU();
  const int64_t n_head = 2, n_kv = 1, hd = 64, n_ctx = 8;
  DeviceBuffer q = to_device(std::vector<float>(n_head * hd, 1.0f)), k = to_device(std::vector<float>(hd, 1.0f));
  DeviceBuffer f = to_device(std::vector<float>(hd / 2, 0.5f)), out = poisoned(sizeof(float) * n_head * hd);
  DeviceBuffer kc = poisoned(2 * n_ctx * hd), vc = poisoned(2 * n_ctx * hd);
  DeviceBuffer pos = to_device(std::vector<int32_t>{static_cast<int32_t>(n_ctx)});
  const KvCacheView cache{DType::F16, kc.get(), vc.get(), n_ctx, n_kv, hd};
  AttnWorkspace ws(n_head, cache);
  // A position outside the cache: NaN output, nothing stored.
  attn_decode_rope(q.as<float>(), k.as<float>(), k.as<float>(), cache, pos.as<int32_t>(), hd, f.as<float>(), false,
                   out.as<float>(), n_head, 0.125f, ws, nullptr);
  synchronize();
  for (float x : to_host<float>(out, n_head * hd)) ASSERT_TRUE(std::isnan(x));
  for (uint16_t x : to_host<uint16_t>(kc, n_ctx * hd)) ASSERT_EQ(x, 0xFFFF);
  for (uint16_t x : to_host<uint16_t>(vc, n_ctx * hd)) ASSERT_EQ(x, 0xFFFF);
  EXPECT_THROW(attn_decode_rope(q.as<float>(), k.as<float>(), k.as<float>(), cache, pos.as<int32_t>(), 63,
                                f.as<float>(), false, out.as<float>(), n_head, 0.125f, ws, nullptr),
               Error);  // odd rope_dim
  EXPECT_THROW(attn_decode_rope(q.as<float>(), nullptr, k.as<float>(), cache, pos.as<int32_t>(), hd, f.as<float>(),
                                false, out.as<float>(), n_head, 0.125f, ws, nullptr),
               Error);
  EXPECT_THROW(attn_decode_rope(q.as<float>(), k.as<float>(), k.as<float>(), cache, pos.as<int32_t>(), hd, nullptr,
                                false, out.as<float>(), n_head, 0.125f, ws, nullptr),
               Error);
}

TEST(CudaAttention, DecodeRejectsBadArguments) {
  TESSERA_REQUIRE_GPU();
  DeviceBuffer kc(2 * 64 * 96), vc(2 * 64 * 96);
  const KvCacheView bad_hd{DType::F16, kc.get(), vc.get(), 64, 1, 96};
  EXPECT_THROW(AttnWorkspace(4, bad_hd), Error);
  const KvCacheView bad_dtype{DType::Q8_0, kc.get(), vc.get(), 64, 1, 64};
  EXPECT_THROW(AttnWorkspace(4, bad_dtype), Error);
  const KvCacheView ok{DType::F16, kc.get(), vc.get(), 64, 2, 64};
  EXPECT_THROW(AttnWorkspace(3, ok), Error);  // 3 query heads over 2 kv heads
}

// ---------------------------------------------------------------------------------------------------------------------
// The f32 cache (opt-in, so that f32 models keep f32 precision): the same kernels store and read f32. Host caches are
// float vectors; NaN with all bits set is the poison (0xFF bytes).

float poison_f32() {
  float v = 0;
  std::memset(&v, 0xFF, sizeof(v));
  return v;
}

TEST(CudaAttention, F32CacheRopeStoreKvMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const RopeCase cases[] = {
      {DType::F32, 9, 3, 64, 64, false, 0},
      {DType::F32, 8, 2, 128, 64, true, 1000},      // partial rotation
      {DType::F32, 4, 4, 256, 256, false, 123456},  // large theta
  };
  for (const RopeCase& c : cases) {
    check_rope_store_kv<float>(c, rng);
    if (HasFatalFailure()) return;
  }
}

// An f32 cache with N(0, 1) values at positions [0, filled) and poison from there on.
void random_f32_cache(std::mt19937& rng, int64_t n_kv, int64_t n_ctx, int64_t hd, int64_t filled,
                      std::vector<float>& kc, std::vector<float>& vc) {
  const size_t elems = static_cast<size_t>(n_kv * n_ctx * hd);
  kc.assign(elems, poison_f32()), vc.assign(elems, poison_f32());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t h = 0; h < n_kv; ++h)
    for (int64_t p = 0; p < filled; ++p)
      for (int64_t i = 0; i < hd; ++i) {
        const size_t at = static_cast<size_t>((h * n_ctx + p) * hd + i);
        kc[at] = normal(rng), vc[at] = normal(rng);
      }
}

// Plain (fused == false) or fused-rope decode attention over an f32 cache at one position; checks the output (and for
// the fused path the cache) against the double reference with DecodeMatchesReference's tolerance.
void check_attention_f32(const FusedCase& c, bool fused, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << (fused ? "fused" : "plain") << " f32 heads " << c.n_head << "/" << c.n_kv
                                    << " hd " << c.hd << " n_ctx " << c.n_ctx << " pos " << c.pos);
  std::vector<float> kc_h, vc_h;
  random_f32_cache(rng, c.n_kv, c.n_ctx, c.hd, fused ? c.pos : c.pos + 1, kc_h, vc_h);
  const auto q = random_floats(rng, c.n_head * c.hd, -2.0f, 2.0f);
  const auto k = random_floats(rng, c.n_kv * c.hd, -2.0f, 2.0f);
  const auto v = random_floats(rng, c.n_kv * c.hd, -2.0f, 2.0f);
  const auto inv_freq = llama_inv_freq(c.rope_dim, 500000.0);
  DeviceBuffer qd = to_device(q), kd = to_device(k), vd = to_device(v), fd = to_device(inv_freq);
  DeviceBuffer kc = to_device(kc_h), vc = to_device(vc_h), posd = to_device(std::vector<int32_t>{c.pos});
  DeviceBuffer out = poisoned(sizeof(float) * q.size());
  const KvCacheView cache{DType::F32, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd};
  AttnWorkspace ws(c.n_head, cache);
  const float scale = 1.0f / std::sqrt(float(c.hd));
  if (fused)
    attn_decode_rope(qd.as<float>(), kd.as<float>(), vd.as<float>(), cache, posd.as<int32_t>(), c.rope_dim,
                     fd.as<float>(), c.neox, out.as<float>(), c.n_head, scale, ws, nullptr);
  else
    attn_decode(qd.as<float>(), cache, posd.as<int32_t>(), out.as<float>(), c.n_head, scale, ws, nullptr);
  synchronize();
  const auto o = to_host<float>(out, q.size());
  const auto kc_after = to_host<float>(kc, kc_h.size()), vc_after = to_host<float>(vc, vc_h.size());
  std::vector<float> q_ref = q;
  std::vector<double> ref(c.hd);
  if (fused) {
    // The cache: pos holds k rotated in f32 (q's tolerance) and v as given; every other position is untouched.
    for (int64_t h = 0; h < c.n_kv; ++h)
      for (int64_t p = 0; p < c.n_ctx; ++p) {
        const size_t row = static_cast<size_t>((h * c.n_ctx + p) * c.hd);
        if (p != c.pos) {
          ASSERT_EQ(std::memcmp(&kc_after[row], &kc_h[row], sizeof(float) * c.hd), 0) << "k head " << h << " pos " << p;
          ASSERT_EQ(std::memcmp(&vc_after[row], &vc_h[row], sizeof(float) * c.hd), 0) << "v head " << h << " pos " << p;
          continue;
        }
        rope_head_ref(&k[h * c.hd], ref.data(), c.hd, c.rope_dim, c.pos, inv_freq.data(), c.neox);
        for (int64_t e = 0; e < c.hd; ++e) {
          ASSERT_NEAR(kc_after[row + e], ref[e], 2e-6) << "k head " << h << " e " << e;
          ASSERT_EQ(vc_after[row + e], v[h * c.hd + e]) << "v head " << h << " e " << e;
        }
      }
    ASSERT_EQ(to_host<float>(qd, q.size()), q);  // q is only read
    for (int64_t h = 0; h < c.n_head; ++h) {
      rope_head_ref(&q[h * c.hd], ref.data(), c.hd, c.rope_dim, c.pos, inv_freq.data(), c.neox);
      for (int64_t e = 0; e < c.hd; ++e) q_ref[h * c.hd + e] = static_cast<float>(ref[e]);
    }
  }
  std::vector<double> out_ref;
  attn_decode_ref(q_ref.data(), kc_after, vc_after, c.n_ctx, c.n_head, c.n_kv, c.hd, c.pos, scale, out_ref);
  for (size_t i = 0; i < o.size(); ++i)
    ASSERT_NEAR(o[i], out_ref[i], 2e-5) << "head " << i / c.hd << " dim " << i % c.hd;
}

// f32 runs with tiles half as long as the 16-bit ones' (steps of 2x
// the registers): 64 positions at hd 64, 32 at hd 128 (groups <= 4), so the single-block limit is 128 / 64. The
// positions straddle those, chunk boundaries and the last position; groups 1, 3, 4, 8 and 12 (two head tiles).
TEST(CudaAttention, F32CacheDecodeAndDecodeRopeMatchReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  struct Shape {
    int64_t n_head, n_kv, hd, n_ctx, rope_dim;
    bool neox;
    std::vector<int32_t> positions;
  };
  const Shape shapes[] = {
      {9, 3, 64, 2048, 64, false, {0, 1, 63, 64, 127, 128, 129, 255, 256, 511, 512, 513, 2047}},
      {32, 8, 128, 4096, 128, true, {0, 31, 32, 63, 64, 65, 127, 128, 511, 512, 1000, 4095}},
      {8, 2, 128, 300, 64, true, {1, 200, 299}},  // a group of 4, partial rotation
      {12, 1, 128, 600, 128, false, {0, 127, 128, 599}},
      {4, 4, 256, 1200, 256, false, {0, 15, 16, 63, 64, 511, 512, 1199}},
      {16, 2, 256, 700, 256, false, {0, 255, 256, 699}},  // a group of 8 at hd 256
      {16, 2, 64, 600, 64, true, {0, 127, 128, 599}},     // a group of 8 at hd 64
      {9, 3, 64, 128, 64, false, {0, 100, 127}},          // v6's compact kernel (128 f32 positions at hd 64)
      {9, 3, 64, 512, 64, false, {127, 128, 300, 511}},   // the compact kernel's four windows
      {8, 2, 128, 256, 64, true, {63, 64, 200, 255}},     // the same at hd 128 (64 f32 positions a window)
  };
  for (const Shape& s : shapes)
    for (int32_t p : s.positions)
      for (bool fused : {false, true}) {
        check_attention_f32({DType::F32, s.n_head, s.n_kv, s.hd, s.n_ctx, s.rope_dim, s.neox, p}, fused, rng);
        if (HasFatalFailure()) return;
      }
}

}  // namespace
}  // namespace tessera::cuda::test
