// Sliding-window attention (KvCacheView::window) in the decode and prefill kernels against the double reference of
// the window's positions alone: a window of w at position p is plain attention over the cache positions (p - w, p],
// so the reference runs attn_decode_ref on a copy of just those positions. Decode through both paths (the
// short-context kernel and the split-K kernel: CudaOptions::attn_short = 0), with windows that start inside a chunk,
// cover one position, or reach past position 0; prefill through the tensor-core kernel (16-bit cache) and the FFMA
// kernel (f32 cache), rows whose windows start in different key tiles.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels_rows.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace tessera::cuda::test {
namespace {

struct Cache {
  DType dtype;
  int64_t n_kv, n_ctx, hd;
  std::vector<float> kf, vf;  // the cache's values as floats [n_kv, n_ctx, hd]
  DeviceBuffer k, v;
};

// Random cache contents for positions [0, filled) in `dtype` (16-bit or f32).
Cache make_cache(DType dtype, int64_t n_kv, int64_t n_ctx, int64_t hd, int64_t filled, std::mt19937& rng) {
  Cache c{dtype, n_kv, n_ctx, hd, {}, {}, {}, {}};
  const size_t elems = static_cast<size_t>(n_kv * n_ctx * hd);
  c.kf.assign(elems, 0.0f);
  c.vf.assign(elems, 0.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> k16(elems, 0), v16(elems, 0);
  for (int64_t h = 0; h < n_kv; ++h)
    for (int64_t p = 0; p < filled; ++p)
      for (int64_t i = 0; i < hd; ++i) {
        const size_t at = static_cast<size_t>((h * n_ctx + p) * hd + i);
        if (dtype == DType::F32) {
          c.kf[at] = normal(rng);
          c.vf[at] = normal(rng);
        } else {
          k16[at] = float_to_cache(dtype, normal(rng));
          v16[at] = float_to_cache(dtype, normal(rng));
          c.kf[at] = cache_to_float(dtype, k16[at]);
          c.vf[at] = cache_to_float(dtype, v16[at]);
        }
      }
  c.k = dtype == DType::F32 ? to_device(c.kf) : to_device(k16);
  c.v = dtype == DType::F32 ? to_device(c.vf) : to_device(v16);
  return c;
}

// The reference output [n_head, hd] of the query at position pos with window w: attention over (pos - w, pos] only.
std::vector<double> window_ref(const Cache& c, const float* q, int64_t n_head, int32_t pos, int64_t w, float scale) {
  const int64_t lo = w > 0 ? std::max<int64_t>(0, pos - w + 1) : 0;
  const int64_t n = pos - lo + 1;
  std::vector<float> k(static_cast<size_t>(c.n_kv * n * c.hd)), v(k.size());
  for (int64_t h = 0; h < c.n_kv; ++h)
    for (int64_t p = 0; p < n; ++p)
      for (int64_t i = 0; i < c.hd; ++i) {
        const size_t from = static_cast<size_t>((h * c.n_ctx + lo + p) * c.hd + i);
        const size_t to = static_cast<size_t>((h * n + p) * c.hd + i);
        k[to] = c.kf[from];
        v[to] = c.vf[from];
      }
  std::vector<double> out;
  attn_decode_ref(q, k, v, n, n_head, c.n_kv, c.hd, static_cast<int32_t>(n - 1), scale, out);
  return out;
}

struct DecodeCase {
  int64_t n_head, n_kv, hd, n_ctx;
  int32_t pos;
  int64_t window;
};

TEST(CudaAttnWindow, DecodeMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const DecodeCase cases[] = {
      {8, 2, 64, 4096, 3000, 100},   // the split kernel: most chunks wholly below the window
      {8, 2, 64, 4096, 3000, 1},     // only the token itself
      {8, 2, 64, 512, 300, 37},      // the short-context path (v6), a window starting mid-step
      {4, 4, 128, 1024, 900, 513},   // hd 128, no GQA
      {8, 2, 64, 512, 20, 100},      // a window reaching past position 0: every position
      {8, 8, 256, 2048, 1500, 700},  // hd 256
  };
  for (const bool split : {false, true}) {
    CudaOptions o = cuda_options();
    o.attn_short = split ? 0 : -1;
    const CudaOptionsScope scope(o);
    for (const DecodeCase& d : cases) {
      SCOPED_TRACE(::testing::Message() << (split ? "split-K" : "default") << " heads " << d.n_head << "/" << d.n_kv
                                        << " hd " << d.hd << " pos " << d.pos << " window " << d.window);
      const Cache c = make_cache(DType::F16, d.n_kv, d.n_ctx, d.hd, d.pos + 1, rng);
      const std::vector<float> q = random_floats(rng, static_cast<size_t>(d.n_head * d.hd), -1.0f, 1.0f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(d.hd));
      KvCacheView view{DType::F16, c.k.get(), c.v.get(), d.n_ctx, d.n_kv, d.hd};
      view.window = d.window;
      DeviceBuffer qd = to_device(q), posd = to_device(std::vector<int32_t>{d.pos});
      DeviceBuffer out = poisoned(sizeof(float) * q.size());
      AttnWorkspace ws(d.n_head, view);
      attn_decode(qd.as<float>(), view, posd.as<int32_t>(), out.as<float>(), d.n_head, scale, ws, nullptr);
      synchronize();
      const auto o_h = to_host<float>(out, q.size());
      const std::vector<double> ref = window_ref(c, q.data(), d.n_head, d.pos, d.window, scale);
      for (size_t i = 0; i < o_h.size(); ++i)
        ASSERT_NEAR(o_h[i], ref[i], 2e-5) << "head " << i / d.hd << " dim " << i % d.hd;
    }
  }
}

struct PrefillCase {
  DType dtype;
  int64_t n_head, n_kv, hd, p0, t, window;
};

TEST(CudaAttnWindow, PrefillMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const PrefillCase cases[] = {
      {DType::F16, 8, 2, 64, 0, 200, 37},      // windows starting in different key tiles
      {DType::BF16, 8, 2, 128, 100, 130, 70},  // a later chunk: windows reach into earlier chunks' keys
      {DType::F16, 4, 4, 64, 50, 40, 1},       // only the token itself
      {DType::F16, 8, 2, 64, 0, 64, 500},      // a window longer than the context: causal attention
      {DType::F32, 8, 2, 64, 30, 70, 20},      // the FFMA path
  };
  for (const PrefillCase& pc : cases) {
    SCOPED_TRACE(::testing::Message() << dtype_name(pc.dtype) << " heads " << pc.n_head << "/" << pc.n_kv << " hd "
                                      << pc.hd << " p0 " << pc.p0 << " t " << pc.t << " window " << pc.window);
    const int64_t n_ctx = pc.p0 + pc.t + 16;
    const Cache c = make_cache(pc.dtype, pc.n_kv, n_ctx, pc.hd, pc.p0 + pc.t, rng);
    const int64_t width = pc.n_head * pc.hd;
    const std::vector<float> q = random_floats(rng, static_cast<size_t>(pc.t * width), -1.0f, 1.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(pc.hd));
    KvCacheView view{pc.dtype, c.k.get(), c.v.get(), n_ctx, pc.n_kv, pc.hd};
    view.window = pc.window;
    DeviceBuffer qd = to_device(q), out = poisoned(sizeof(float) * q.size());
    attn_prefill(qd.as<float>(), width, view, 0, pc.p0, pc.t, out.as<float>(), pc.n_head, scale, nullptr);
    synchronize();
    const auto o = to_host<float>(out, q.size());
    // 16-bit caches: q and the probabilities are rounded to 16 bits for the tensor cores (test_attn_prefill.cpp's
    // per-row bound 3e-3); f32: f32 arithmetic throughout.
    const double limit = pc.dtype == DType::F32 ? 1e-5 : 3e-3;
    for (int64_t r = 0; r < pc.t; ++r) {
      const std::vector<double> ref =
          window_ref(c, q.data() + r * width, pc.n_head, static_cast<int32_t>(pc.p0 + r), pc.window, scale);
      ASSERT_LE(rel_l2(o.data() + r * width, ref.data(), static_cast<size_t>(width)), limit) << "row " << r;
    }
  }
}

// The TMA prefill kernel and cuDNN read no window: they say so instead of attending to every key.
TEST(CudaAttnWindow, FusedPrefillPathsRefuseWindows) {
  KvCacheView view{DType::BF16, nullptr, nullptr, 1024, 2, 128};
  view.window = 64;
  std::string why;
  EXPECT_FALSE(attn_prefill_tma_supported(view, 8, &why));
  EXPECT_NE(why.find("sliding window"), std::string::npos) << why;
}

}  // namespace
}  // namespace tessera::cuda::test
