// attention vs the naive softmax(QK^T)V reference: several pos0/t (including t beyond one query and one key block),
// GQA ratios 1 and 3, f16 and f32 caches in both layouts, 1-3 threads, every kernel family.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"
#include "cpu_test_util.h"
#include "quant/half.h"

namespace tessera::cpu {
namespace {

using test::IsaScope;

struct Cache {
  std::vector<uint8_t> k, v;
  KvView kv, vv;
};

Cache make_cache(DType dt, bool head_major, int64_t n_ctx, int64_t n_kv, int64_t hd) {
  Cache c;
  const size_t bytes = static_cast<size_t>(n_ctx * n_kv * hd) * (dt == DType::F16 ? 2 : 4);
  c.k.assign(bytes, 0xff);  // NaN-like garbage past what kv_store writes: reading it would show
  c.v.assign(bytes, 0xff);
  auto view = head_major ? kv_head_major : kv_pos_major;
  c.kv = view(dt, c.k.data(), n_ctx, n_kv, hd);
  c.vv = view(dt, c.v.data(), n_ctx, n_kv, hd);
  return c;
}

TEST(Attention, MatchesNaiveReference) {
  TESSERA_SEEDED_RNG(rng);
  struct Case {
    int64_t pos0, t, n_head, n_kv, hd, window = 0;
  };
  const Case cases[] = {
      {0, 1, 3, 3, 8},
      {0, 7, 9, 3, 64},
      {5, 1, 9, 3, 64},
      {60, 9, 4, 4, 16},
      {0, 70, 3, 1, 64},
      {130, 3, 6, 2, 128},
      {2, 5, 2, 2, 12},  // hd 12: not a multiple of 8 (portable path)
      // hd >= 128: the grouped prefill kernel (Gemma 3: 4 query heads on 1 kv head, hd 256, windows on local layers):
      // partial token blocks and key blocks, a window shorter than a key block and one that starts mid-block.
      {0, 70, 4, 1, 256},
      {33, 75, 8, 2, 128},
      {100, 45, 4, 1, 256, 37},
      {10, 130, 6, 3, 128, 70},
  };
  for (const Case& c : cases) {
    for (DType dt : {DType::F32, DType::F16}) {
      for (bool head_major : {true, false}) {
        const int64_t n_ctx = c.pos0 + c.t + 3;
        Cache cache = make_cache(dt, head_major, n_ctx, c.n_kv, c.hd);
        // Fill the whole history [0, pos0 + t) through kv_store, as the runtime does chunk by chunk.
        const int64_t n_pos = c.pos0 + c.t;
        const auto kall = test::random_floats(rng, static_cast<size_t>(n_pos * c.n_kv * c.hd));
        const auto vall = test::random_floats(rng, static_cast<size_t>(n_pos * c.n_kv * c.hd));
        kv_store(cache.kv, kall.data(), c.pos0, c.n_kv, c.hd, 0);
        kv_store(cache.vv, vall.data(), c.pos0, c.n_kv, c.hd, 0);
        kv_store(cache.kv, kall.data() + c.pos0 * c.n_kv * c.hd, c.t, c.n_kv, c.hd, c.pos0);
        kv_store(cache.vv, vall.data() + c.pos0 * c.n_kv * c.hd, c.t, c.n_kv, c.hd, c.pos0);
        const auto q = test::random_floats(rng, static_cast<size_t>(c.t * c.n_head * c.hd), -2.0f, 2.0f);
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
        std::vector<float> ref(q.size());
        attention_ref(q.data(), cache.kv, cache.vv, ref.data(), c.t, c.n_head, c.n_kv, c.hd, c.pos0, scale, c.window);
        for (Isa isa : test::isas()) {
          IsaScope scope(isa);
          for (ThreadPool* pool : test::pools()) {
            std::vector<float> y(q.size(), std::nanf(""));
            attention(*pool, q.data(), cache.kv, cache.vv, y.data(), c.t, c.n_head, c.n_kv, c.hd, c.pos0, scale,
                      c.window);
            // Outputs are convex combinations of V rows (|v| <= 1). Float scores carry ~hd u |q||k| error and exp
            // a few ulp; each moves a weight by a relative ~1e-6, so 1e-5 absolute is a loose but meaningful bound
            // (a wrong mask or a dropped block moves outputs by ~1e-2 and more).
            for (size_t i = 0; i < y.size(); ++i)
              ASSERT_NEAR(y[i], ref[i], 1e-5f)
                  << "pos0=" << c.pos0 << " t=" << c.t << " heads=" << c.n_head << "/" << c.n_kv << " hd=" << c.hd
                  << " window=" << c.window << " " << dtype_name(dt) << (head_major ? " head-major " : " pos-major ")
                  << isa_name(isa) << " threads=" << pool->n_threads() << " i=" << i;
          }
        }
      }
    }
  }
}

TEST(Attention, SingleKeyReturnsItsValue) {
  // pos0 = 0, t = 1: softmax over one key is 1, so the output is exactly V[0] of the query's kv head.
  const int64_t n_head = 4, n_kv = 2, hd = 16;
  Cache cache = make_cache(DType::F32, true, 4, n_kv, hd);
  std::vector<float> k(n_kv * hd, 0.5f), v(n_kv * hd), q(n_head * hd, 1.0f), out(n_head * hd);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  kv_store(cache.kv, k.data(), 1, n_kv, hd, 0);
  kv_store(cache.vv, v.data(), 1, n_kv, hd, 0);
  ThreadPool pool(2);
  attention(pool, q.data(), cache.kv, cache.vv, out.data(), 1, n_head, n_kv, hd, 0, 0.25f);
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t c = 0; c < hd; ++c) EXPECT_EQ(out[h * hd + c], v[(h / 2) * hd + c]);
}

TEST(Attention, KvStoreRoundsToHalfLikeTheReference) {
  TESSERA_SEEDED_RNG(rng);
  // Specials (max half, overflow to inf, subnormal halves, underflow to zero, a round-to-even tie) and random values
  // across the half range, in rows of 11 so the vector loop and its tail both run.
  std::vector<float> src = {0.1f, -2.5f, 1e-3f, 7.0f, 65504.0f, 65520.0f, -1e6f, 1e-8f, 3e-5f, -6e-8f, 1.00048828125f};
  for (int i = 0; i < 33; ++i)
    src.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng),
                             std::uniform_int_distribution<int>(-26, 16)(rng)));
  const int64_t rows = static_cast<int64_t>(src.size()) / 11;
  for (Isa isa : test::isas()) {
    IsaScope scope(isa);
    Cache cache = make_cache(DType::F16, false, rows + 1, 1, 11);
    kv_store(cache.kv, src.data(), rows, 1, 11, 1);
    const auto* h = reinterpret_cast<const uint16_t*>(cache.k.data()) + 11;
    for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(h[i], f32_to_fp16(src[i])) << isa_name(isa) << " " << src[i];
  }
}

TEST(Attention, RejectsBadArguments) {
  Cache cache = make_cache(DType::F32, true, 4, 2, 8);
  std::vector<float> q(3 * 8), out(3 * 8);
  ThreadPool pool(1);
  EXPECT_THROW(attention(pool, q.data(), cache.kv, cache.vv, out.data(), 1, 3, 2, 8, 0, 1.0f), Error);  // 3 % 2
  EXPECT_THROW(attention(pool, q.data(), cache.kv, cache.vv, out.data(), 1, 2, 2, 8, 4, 1.0f), Error);  // past n_ctx
  KvView bad = cache.kv;
  bad.dtype = DType::Q8_0;
  EXPECT_THROW(attention(pool, q.data(), bad, cache.vv, out.data(), 1, 2, 2, 8, 0, 1.0f), Error);
  EXPECT_THROW(kv_store(cache.kv, q.data(), 2, 2, 8, 3), Error);  // positions 3..4 do not fit 4
}

}  // namespace
}  // namespace tessera::cpu
