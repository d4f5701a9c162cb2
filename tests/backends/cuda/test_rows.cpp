// The T-row decode kernels of kernels_rows.h (rope_store_kv_rows, attn_decode_rows) against double-precision
// references: rows at their own positions in their own cache slots, rows with an invalid position or slot (NaN in
// that row only), strided q rows, workspace reuse across row counts, and CUDA-graph replays with new positions.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cuda/kernels_rows.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "quant/half.h"

namespace tessera::cuda::test {
namespace {

constexpr int64_t kSeqs = 4;

// Host copies of a cache: 16-bit bits (f16/bf16, element type uint16_t) or f32 values (the f32 cache, float).
float cache_value(DType dtype, uint16_t bits) { return cache_to_float(dtype, bits); }
float cache_value(DType, float v) { return v; }
template <typename E>
E to_cache(DType dtype, float v) {
  if constexpr (std::is_same_v<E, float>)
    return v;
  else
    return float_to_cache(dtype, v);
}
// The poison of poisoned(): 0xFF in every byte.
bool is_poison(uint16_t bits) { return bits == 0xFFFF; }
bool is_poison(float v) {
  uint32_t u = 0;
  std::memcpy(&u, &v, sizeof(u));
  return u == 0xFFFFFFFFu;
}
template <typename E>
E poison_value() {
  E e;
  std::memset(&e, 0xFF, sizeof(e));
  return e;
}

// Runs body on the decode attention kernel src/ has (v3, which this also ran through TESSERA_CUDA_ATTN_V1=1, left src/
// for bench/cuda/experiments/attn_decode_versions.cu, which checks it against a reference).
template <typename F>
void for_each_attn_version(F&& body) {
  body();
}

// Positions and slots for t rows over [0, n_ctx) x [0, kSeqs): the first rows take position 0 and n_ctx - 1, rows 1
// and 2 share a slot (different positions), no two rows share a (slot, position) (rope stores would race). With
// `invalid`, four rows (t >= 8) get a bad position (n_ctx, -1) or slot (kSeqs, -1).
struct Rows {
  std::vector<int32_t> pos, seq;
  std::vector<bool> valid;
};
Rows make_rows(std::mt19937& rng, int64_t t, int64_t n_ctx, bool invalid) {
  Rows r;
  std::set<std::pair<int32_t, int32_t>> used;
  std::uniform_int_distribution<int32_t> pd(0, static_cast<int32_t>(n_ctx - 1)), sd(0, kSeqs - 1);
  for (int64_t i = 0; i < t; ++i) {
    int32_t p = 0, s = 0;
    do {
      p = i == 0 ? 0 : i == 1 ? static_cast<int32_t>(n_ctx - 1) : pd(rng);
      s = i == 2 ? r.seq[1] : sd(rng);
    } while (used.count({s, p}) != 0);
    used.insert({s, p});
    r.pos.push_back(p), r.seq.push_back(s), r.valid.push_back(true);
  }
  if (invalid && t >= 8) {
    r.pos[3] = static_cast<int32_t>(n_ctx), r.pos[4] = -1, r.seq[5] = kSeqs, r.seq[6] = -1;
    for (int i = 3; i <= 6; ++i) r.valid[i] = false;
  }
  return r;
}

struct RopeCase {
  DType dtype;
  int64_t n_head, n_kv, hd, rope_dim;
  bool neox;
};

// q, k and v as the columns of one merged [t, width] matmul output (ld_q = ld_kv = width > the heads' width, the pad
// columns NaN), the rows in `rows` (seq == nullptr when `slot0`: prefill's consecutive rows of slot 0). E: the host
// cache element (uint16_t for f16/bf16, float for f32).
template <typename E = uint16_t>
void check_rope_rows(const RopeCase& c, int64_t t, bool slot0, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " heads " << c.n_head << "/" << c.n_kv << " hd " << c.hd
                                    << " rope_dim " << c.rope_dim << " neox " << c.neox << " t " << t
                                    << (slot0 ? " slot 0" : ""));
  const int64_t n_ctx = 64, hd = c.hd;
  const int64_t qw = c.n_head * hd, kvw = c.n_kv * hd, width = qw + 2 * kvw + 8;
  Rows rows;
  if (slot0) {
    const int32_t p0 = static_cast<int32_t>(n_ctx - t);  // the last row lands on n_ctx - 1
    for (int64_t i = 0; i < t; ++i) rows.pos.push_back(p0 + static_cast<int32_t>(i)), rows.valid.push_back(true);
    rows.seq.assign(t, 0);
  } else {
    rows = make_rows(rng, t, n_ctx, true);
  }
  auto qkv = random_floats(rng, static_cast<size_t>(t * width), -2.0f, 2.0f);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t e = qw + 2 * kvw; e < width; ++e) qkv[r * width + e] = std::nanf("");
  const auto inv_freq = llama_inv_freq(c.rope_dim, 10000.0);
  DeviceBuffer qkv_d = to_device(qkv), f_d = to_device(inv_freq);
  DeviceBuffer pos_d = to_device(rows.pos), seq_d = to_device(rows.seq);
  const size_t cache_elems = static_cast<size_t>(kSeqs * c.n_kv * n_ctx * hd);
  DeviceBuffer kc = poisoned(sizeof(E) * cache_elems), vc = poisoned(sizeof(E) * cache_elems);
  const KvCacheView cache{c.dtype, kc.get(), vc.get(), n_ctx, c.n_kv, hd, kSeqs};
  float* q = qkv_d.as<float>();
  rope_store_kv_rows(q, width, q + qw, q + qw + kvw, width, cache, pos_d.as<int32_t>(),
                     slot0 ? nullptr : seq_d.as<int32_t>(), t, c.n_head, c.rope_dim, f_d.as<float>(), c.neox, nullptr);
  synchronize();
  const auto out = to_host<float>(qkv_d, qkv.size());
  const auto kc_h = to_host<E>(kc, cache_elems), vc_h = to_host<E>(vc, cache_elems);
  std::vector<bool> written(static_cast<size_t>(kSeqs * n_ctx), false);
  std::vector<double> ref(hd);
  // Tolerances as in test_attention.cpp's RopeStoreKvMatchesReference (inputs within +-2); an f32 cache holds k as
  // rotated in f32, like q.
  const double rel = c.dtype == DType::F32 ? 0.0 : c.dtype == DType::F16 ? 0x1.0p-11 : 0x1.0p-8;
  for (int64_t r = 0; r < t; ++r) {
    const float* in = &qkv[r * width];
    const float* o = &out[r * width];
    for (int64_t e = qw; e < width; ++e)  // k, v and the pad are inputs: untouched (NaN pad compares by bits)
      ASSERT_EQ(std::isnan(o[e]) ? 1 : o[e], std::isnan(in[e]) ? 1 : in[e]) << "row " << r << " column " << e;
    if (!rows.valid[r]) {
      for (int64_t e = 0; e < qw; ++e) ASSERT_TRUE(std::isnan(o[e])) << "invalid row " << r << " e " << e;
      continue;
    }
    const int32_t p = rows.pos[r], s = rows.seq[r];
    written[s * n_ctx + p] = true;
    for (int64_t h = 0; h < c.n_head; ++h) {
      rope_head_ref(in + h * hd, ref.data(), hd, c.rope_dim, p, inv_freq.data(), c.neox);
      for (int64_t e = 0; e < hd; ++e) ASSERT_NEAR(o[h * hd + e], ref[e], 2e-6) << "row " << r << " q head " << h;
    }
    for (int64_t h = 0; h < c.n_kv; ++h) {
      rope_head_ref(in + qw + h * hd, ref.data(), hd, c.rope_dim, p, inv_freq.data(), c.neox);
      const size_t at = static_cast<size_t>(((s * c.n_kv + h) * n_ctx + p) * hd);
      for (int64_t e = 0; e < hd; ++e) {
        ASSERT_NEAR(cache_value(c.dtype, kc_h[at + e]), ref[e], rel * std::fabs(ref[e]) + 6e-6)
            << "row " << r << " k head " << h << " e " << e;
        ASSERT_EQ(vc_h[at + e], to_cache<E>(c.dtype, in[qw + kvw + h * hd + e]))
            << "row " << r << " v head " << h << " e " << e;
      }
    }
  }
  // Every (slot, position) no valid row owns is still poison: invalid rows stored nothing, and nothing strayed.
  for (int64_t s = 0; s < kSeqs; ++s)
    for (int64_t h = 0; h < c.n_kv; ++h)
      for (int64_t p = 0; p < n_ctx; ++p) {
        if (written[s * n_ctx + p]) continue;
        const size_t at = static_cast<size_t>(((s * c.n_kv + h) * n_ctx + p) * hd);
        for (int64_t e = 0; e < hd; ++e) {
          ASSERT_TRUE(is_poison(kc_h[at + e])) << "slot " << s << " position " << p;
          ASSERT_TRUE(is_poison(vc_h[at + e])) << "slot " << s << " position " << p;
        }
      }
}

TEST(CudaRows, RopeStoreKvRowsMatchesReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const RopeCase cases[] = {
      {DType::F16, 9, 3, 64, 64, false},     // SmolLM2-135M heads
      {DType::BF16, 32, 8, 128, 128, true},  // Llama-3-8B heads, neox pairs
      {DType::F16, 8, 2, 128, 64, true},     // partial rotation
      {DType::BF16, 4, 2, 64, 32, false},    // partial rotation, interleaved pairs
  };
  for (const RopeCase& c : cases)
    for (int64_t t : {1, 3, 8, 32}) {
      check_rope_rows(c, t, false, rng);
      check_rope_rows(c, t, true, rng);
    }
}

// rope_store_kv_rows with q16 (the cuDNN attention's input): the rotated q lands in the 16-bit copy, equal to the
// in-place f32 rotation rounded to the cache type, bit for bit (the same kernel math), q itself is left as it was, and
// the cache receives the same k and v.
TEST(CudaRows, RopeStoreKvRowsQ16IsTheF32RotationRounded) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  for (const RopeCase& c : {RopeCase{DType::F16, 9, 3, 64, 64, false}, RopeCase{DType::BF16, 32, 8, 128, 128, true}}) {
    for (int64_t t : {3, 40}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " heads " << c.n_head << " t " << t);
      const int64_t n_ctx = 64, hd = c.hd, qw = c.n_head * hd, kvw = c.n_kv * hd, width = qw + 2 * kvw;
      const Rows rows = make_rows(rng, t, n_ctx, true);
      const auto qkv = random_floats(rng, static_cast<size_t>(t * width), -2.0f, 2.0f);
      const auto inv_freq = llama_inv_freq(c.rope_dim, 10000.0);
      DeviceBuffer a = to_device(qkv), b = to_device(qkv), f_d = to_device(inv_freq);
      DeviceBuffer pos_d = to_device(rows.pos), seq_d = to_device(rows.seq);
      const size_t cache_elems = static_cast<size_t>(kSeqs * c.n_kv * n_ctx * hd);
      DeviceBuffer kc_a = poisoned(2 * cache_elems), vc_a = poisoned(2 * cache_elems);
      DeviceBuffer kc_b = poisoned(2 * cache_elems), vc_b = poisoned(2 * cache_elems);
      DeviceBuffer q16 = poisoned(2 * t * qw);
      const KvCacheView ca{c.dtype, kc_a.get(), vc_a.get(), n_ctx, c.n_kv, hd, kSeqs};
      const KvCacheView cb{c.dtype, kc_b.get(), vc_b.get(), n_ctx, c.n_kv, hd, kSeqs};
      float* qa = a.as<float>();
      float* qb = b.as<float>();
      rope_store_kv_rows(qa, width, qa + qw, qa + qw + kvw, width, ca, pos_d.as<int32_t>(), seq_d.as<int32_t>(), t,
                         c.n_head, c.rope_dim, f_d.as<float>(), c.neox, nullptr);
      rope_store_kv_rows(qb, width, qb + qw, qb + qw + kvw, width, cb, pos_d.as<int32_t>(), seq_d.as<int32_t>(), t,
                         c.n_head, c.rope_dim, f_d.as<float>(), c.neox, nullptr, q16.get());
      synchronize();
      const auto rotated = to_host<float>(a, qkv.size());
      EXPECT_EQ(to_host<float>(b, qkv.size()), qkv) << "q must be left as it was";
      const auto bits = to_host<uint16_t>(q16, static_cast<size_t>(t * qw));
      int bad = 0;
      for (int64_t r = 0; r < t && bad < 5; ++r)
        for (int64_t e = 0; e < qw && bad < 5; ++e) {
          const float v = rotated[r * width + e];
          const uint16_t want = c.dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_fp16(v);
          const bool both_nan = std::isnan(v) && std::isnan(cache_value(c.dtype, bits[r * qw + e]));
          if (!both_nan && bits[r * qw + e] != want) {
            ADD_FAILURE() << "row " << r << " element " << e << ": q16 " << bits[r * qw + e] << ", f32 " << v;
            ++bad;
          }
        }
      EXPECT_EQ(to_host<uint16_t>(kc_a, cache_elems), to_host<uint16_t>(kc_b, cache_elems));
      EXPECT_EQ(to_host<uint16_t>(vc_a, cache_elems), to_host<uint16_t>(vc_b, cache_elems));
    }
  }
}

TEST(CudaRows, RopeStoreKvRowsRejectsBadArguments) {
  TESSERA_REQUIRE_GPU();
  const int64_t n_head = 2, hd = 64, n_ctx = 8;
  DeviceBuffer q(4 * n_head * hd * 4), kc(2 * n_ctx * hd), vc(2 * n_ctx * hd), f(4 * hd / 2), pos(16);
  float* qp = q.as<float>();
  const KvCacheView cache{DType::F16, kc.get(), vc.get(), n_ctx, 1, hd};
  const int32_t* pp = pos.as<int32_t>();
  // ld_q narrower than the q heads
  EXPECT_THROW(rope_store_kv_rows(qp, hd, qp, qp, hd, cache, pp, nullptr, 1, n_head, hd, f.as<float>(), false, nullptr),
               Error);
  // no rows
  EXPECT_THROW(
      rope_store_kv_rows(qp, n_head * hd, qp, qp, hd, cache, pp, nullptr, 0, n_head, hd, f.as<float>(), false, nullptr),
      Error);
  KvCacheView no_seqs = cache;
  no_seqs.n_seq = 0;
  EXPECT_THROW(rope_store_kv_rows(qp, n_head * hd, qp, qp, hd, no_seqs, pp, nullptr, 1, n_head, hd, f.as<float>(),
                                  false, nullptr),
               Error);
}

struct AttnCase {
  DType dtype;
  int64_t n_head, n_kv, hd, n_ctx;
};

// One cache of kSeqs slots, filled with random values up to the largest position any valid row of `rows` uses in
// each slot; the rest is NaN poison that no row may read.
template <typename E>
struct CacheOf {
  std::vector<E> k, v;
  std::vector<float> kf, vf;
};
using Cache = CacheOf<uint16_t>;
template <typename E = uint16_t>
CacheOf<E> random_cache(const AttnCase& c, const Rows& rows, std::mt19937& rng) {
  const size_t elems = static_cast<size_t>(kSeqs * c.n_kv * c.n_ctx * c.hd);
  CacheOf<E> ch{std::vector<E>(elems, poison_value<E>()), std::vector<E>(elems, poison_value<E>()),
                std::vector<float>(elems), std::vector<float>(elems)};
  std::vector<int32_t> last(kSeqs, -1);
  for (size_t r = 0; r < rows.pos.size(); ++r)
    if (rows.valid[r]) last[rows.seq[r]] = std::max(last[rows.seq[r]], rows.pos[r]);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t s = 0; s < kSeqs; ++s)
    for (int64_t h = 0; h < c.n_kv; ++h)
      for (int64_t p = 0; p <= last[s]; ++p)
        for (int64_t i = 0; i < c.hd; ++i) {
          const size_t at = static_cast<size_t>(((s * c.n_kv + h) * c.n_ctx + p) * c.hd + i);
          ch.k[at] = to_cache<E>(c.dtype, normal(rng));
          ch.v[at] = to_cache<E>(c.dtype, normal(rng));
        }
  for (size_t i = 0; i < elems; ++i) ch.kf[i] = cache_value(c.dtype, ch.k[i]), ch.vf[i] = cache_value(c.dtype, ch.v[i]);
  return ch;
}

// Checks out [t, n_head * hd] against attn_decode_ref per row (slot s's part of the cache); invalid rows all NaN.
void check_attn_out(const AttnCase& c, const Rows& rows, const std::vector<float>& q, int64_t ld_q,
                    const std::vector<float>& kf, const std::vector<float>& vf, float scale,
                    const std::vector<float>& out) {
  const int64_t width = c.n_head * c.hd;
  const size_t slot_elems = static_cast<size_t>(c.n_kv * c.n_ctx * c.hd);
  std::vector<double> ref;
  for (size_t r = 0; r < rows.pos.size(); ++r) {
    const float* o = &out[r * width];
    if (!rows.valid[r]) {
      for (int64_t i = 0; i < width; ++i) ASSERT_TRUE(std::isnan(o[i])) << "invalid row " << r << " element " << i;
      continue;
    }
    const size_t off = static_cast<size_t>(rows.seq[r]) * slot_elems;
    const std::vector<float> ks(kf.begin() + off, kf.begin() + off + slot_elems);
    const std::vector<float> vs(vf.begin() + off, vf.begin() + off + slot_elems);
    attn_decode_ref(&q[r * ld_q], ks, vs, c.n_ctx, c.n_head, c.n_kv, c.hd, rows.pos[r], scale, ref);
    // Tolerance as in test_attention.cpp's DecodeMatchesReference.
    for (int64_t i = 0; i < width; ++i)
      ASSERT_NEAR(o[i], ref[i], 2e-5) << "row " << r << " (pos " << rows.pos[r] << ", slot " << rows.seq[r] << ") head "
                                      << i / c.hd << " dim " << i % c.hd;
  }
}

template <typename E = uint16_t>
void check_attn_rows(const AttnCase& c, std::mt19937& rng) {
  constexpr int64_t kMaxT = 32;
  const KvCacheView shape{c.dtype, nullptr, nullptr, c.n_ctx, c.n_kv, c.hd, kSeqs};
  DeviceBuffer kc(sizeof(E) * static_cast<size_t>(kSeqs * c.n_kv * c.n_ctx * c.hd)), vc(kc.bytes());
  KvCacheView cache = shape;
  cache.k = kc.get(), cache.v = vc.get();
  AttnRowsWorkspace ws(kMaxT, c.n_head, cache);  // one workspace serves every row count up to kMaxT
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  const int64_t ld_q = c.n_head * c.hd + 12;  // a multiple of 4 wider than the heads; the pad holds NaN
  for (int64_t t : {1, 3, 8, 32}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " heads " << c.n_head << "/" << c.n_kv << " hd " << c.hd
                                      << " n_ctx " << c.n_ctx << " t " << t);
    const Rows rows = make_rows(rng, t, c.n_ctx, true);
    const CacheOf<E> ch = random_cache<E>(c, rows, rng);
    kc.upload(ch.k.data(), sizeof(E) * ch.k.size()), vc.upload(ch.v.data(), sizeof(E) * ch.v.size());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(t * ld_q), std::nanf(""));
    for (int64_t r = 0; r < t; ++r)
      for (int64_t i = 0; i < c.n_head * c.hd; ++i) q[r * ld_q + i] = normal(rng);
    DeviceBuffer q_d = to_device(q), pos_d = to_device(rows.pos), seq_d = to_device(rows.seq);
    DeviceBuffer out = poisoned(sizeof(float) * t * c.n_head * c.hd);
    attn_decode_rows(q_d.as<float>(), ld_q, cache, pos_d.as<int32_t>(), seq_d.as<int32_t>(), t, out.as<float>(),
                     c.n_head, scale, ws, nullptr);
    synchronize();
    check_attn_out(c, rows, q, ld_q, ch.kf, ch.vf, scale, to_host<float>(out, t * c.n_head * c.hd));
  }
}

void attn_decode_rows_matches_reference() {
  std::mt19937 rng(test_seed());
  const AttnCase cases[] = {
      {DType::F16, 9, 3, 64, 300},     // SmolLM2-135M heads (GQA 9/3: a head tile of 4 with one idle head)
      {DType::BF16, 32, 8, 128, 700},  // Llama-3-8B heads
      {DType::BF16, 9, 3, 64, 1100},   // several chunks per row at small t
      {DType::F16, 32, 8, 128, 130},   // chunk boundary (2 x 64 + 2)
      {DType::F16, 12, 1, 128, 200},   // a group of 12: two head tiles per row
      {DType::BF16, 9, 3, 64, 2048},   // long single chunks at t = 32 (past the prefetch window)
      {DType::F16, 32, 8, 128, 600},   // past v4's prefetch window (256 positions at hd 128)
      {DType::BF16, 16, 2, 256, 520},  // a group of 8 at hd 256
  };
  for (const AttnCase& c : cases) check_attn_rows(c, rng);
}

TEST(CudaRows, AttnDecodeRowsMatchesReference) {
  TESSERA_REQUIRE_GPU();
  for_each_attn_version([] { attn_decode_rows_matches_reference(); });
}

// The f32 cache (opt-in, f32 models): rope/store rows and batched decode attention, same checks as above. f32 runs
// attention with tiles half as long as the 16-bit ones (32
// positions at hd 128, 64 at hd 64): the context sizes put rows on both sides of a tile, the single-block limit and
// the chunk boundaries.
TEST(CudaRows, F32CacheRopeRowsAndAttnDecodeRowsMatchReference) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const RopeCase rope_cases[] = {{DType::F32, 9, 3, 64, 64, false}, {DType::F32, 8, 2, 128, 64, true}};
  for (const RopeCase& c : rope_cases)
    for (int64_t t : {1, 3, 8, 32}) {
      check_rope_rows<float>(c, t, false, rng);
      check_rope_rows<float>(c, t, true, rng);
      if (HasFatalFailure()) return;
    }
  const AttnCase attn_cases[] = {
      {DType::F32, 9, 3, 64, 300},   {DType::F32, 32, 8, 128, 700}, {DType::F32, 9, 3, 64, 1100},
      {DType::F32, 32, 8, 128, 66},  {DType::F32, 12, 1, 128, 200}, {DType::F32, 16, 2, 256, 520},
      {DType::F32, 4, 4, 128, 2048},
  };
  for (const AttnCase& c : attn_cases) {
    check_attn_rows<float>(c, rng);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaRows, AttnDecodeRowsWithoutSeqUsesSlotZero) {
  TESSERA_REQUIRE_GPU();
  std::mt19937 rng(test_seed());
  const AttnCase c{DType::BF16, 9, 3, 64, 200};
  Rows rows;
  rows.pos = {0, 57, 199}, rows.seq = {0, 0, 0}, rows.valid = {true, true, true};
  const Cache ch = random_cache(c, rows, rng);
  DeviceBuffer kc = to_device(ch.k), vc = to_device(ch.v);
  const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd, kSeqs};
  AttnRowsWorkspace ws(3, c.n_head, cache);
  const int64_t ld_q = c.n_head * c.hd;
  const auto q = random_floats(rng, static_cast<size_t>(3 * ld_q), -2.0f, 2.0f);
  DeviceBuffer q_d = to_device(q), pos_d = to_device(rows.pos), out = poisoned(sizeof(float) * q.size());
  const float scale = 0.125f;
  attn_decode_rows(q_d.as<float>(), ld_q, cache, pos_d.as<int32_t>(), nullptr, 3, out.as<float>(), c.n_head, scale, ws,
                   nullptr);
  synchronize();
  check_attn_out(c, rows, q, ld_q, ch.kf, ch.vf, scale, to_host<float>(out, q.size()));
  // More rows than the workspace holds, or a workspace for another cache: one clear error.
  EXPECT_THROW(attn_decode_rows(q_d.as<float>(), ld_q, cache, pos_d.as<int32_t>(), nullptr, 4, out.as<float>(),
                                c.n_head, scale, ws, nullptr),
               Error);
  KvCacheView longer = cache;
  longer.n_ctx = 2 * c.n_ctx;
  EXPECT_THROW(attn_decode_rows(q_d.as<float>(), ld_q, longer, pos_d.as<int32_t>(), nullptr, 3, out.as<float>(),
                                c.n_head, scale, ws, nullptr),
               Error);
}

// Rope/store then attention for t rows, captured once into a CUDA graph and replayed with new q/k/v, positions and
// slots written to the same device buffers between replays (as the executor does), with PDL on and off.
void graph_replay_reads_positions() {
  std::mt19937 rng(test_seed());
  const AttnCase c{DType::F16, 32, 8, 128, 256};
  const RopeCase rc{c.dtype, c.n_head, c.n_kv, c.hd, c.hd, false};
  const int64_t t = 8, qw = c.n_head * c.hd, kvw = c.n_kv * c.hd, width = qw + 2 * kvw;
  const size_t cache_elems = static_cast<size_t>(kSeqs * c.n_kv * c.n_ctx * c.hd);
  const auto inv_freq = llama_inv_freq(c.hd, 500000.0);
  DeviceBuffer qkv_d(sizeof(float) * t * width), pos_d(sizeof(int32_t) * t), seq_d(sizeof(int32_t) * t);
  DeviceBuffer f_d = to_device(inv_freq), out = poisoned(sizeof(float) * t * qw);
  DeviceBuffer kc(2 * cache_elems), vc(2 * cache_elems);
  const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd, kSeqs};
  AttnRowsWorkspace ws(t, c.n_head, cache);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  for (bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "PDL on" : "PDL off");
    set_pdl(pdl);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    float* q = qkv_d.as<float>();
    rope_store_kv_rows(q, width, q + qw, q + qw + kvw, width, cache, pos_d.as<int32_t>(), seq_d.as<int32_t>(), t,
                       c.n_head, c.hd, f_d.as<float>(), rc.neox, stream);
    attn_decode_rows(q, width, cache, pos_d.as<int32_t>(), seq_d.as<int32_t>(), t, out.as<float>(), c.n_head, scale, ws,
                     stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE(::testing::Message() << "replay " << replay);
      const Rows rows = make_rows(rng, t, c.n_ctx, replay == 1);
      // Earlier positions of each row's slot hold random values; the row's own position is written by the graph.
      Cache ch = random_cache(c, rows, rng);
      kc.upload(ch.k.data(), 2 * cache_elems), vc.upload(ch.v.data(), 2 * cache_elems);
      const auto qkv = random_floats(rng, static_cast<size_t>(t * width), -2.0f, 2.0f);
      qkv_d.upload(qkv.data(), sizeof(float) * qkv.size());
      pos_d.upload(rows.pos.data(), sizeof(int32_t) * t), seq_d.upload(rows.seq.data(), sizeof(int32_t) * t);
      out.fill_bytes(0xFF);
      synchronize();  // the plain copies and memsets above are on the legacy stream, the graph on `stream`
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      // The graph's rope must match the reference (q rotated in place, k/v stored at each row's position) ...
      const auto q_dev = to_host<float>(qkv_d, qkv.size());
      const auto kc_h = to_host<uint16_t>(kc, cache_elems), vc_h = to_host<uint16_t>(vc, cache_elems);
      std::vector<double> ref(c.hd);
      for (int64_t r = 0; r < t; ++r) {
        if (!rows.valid[r]) continue;
        for (int64_t h = 0; h < c.n_head; h += 7) {
          rope_head_ref(&qkv[r * width + h * c.hd], ref.data(), c.hd, c.hd, rows.pos[r], inv_freq.data(), false);
          for (int64_t e = 0; e < c.hd; ++e) ASSERT_NEAR(q_dev[r * width + h * c.hd + e], ref[e], 2e-6);
        }
        const size_t at = static_cast<size_t>(((rows.seq[r] * c.n_kv) * c.n_ctx + rows.pos[r]) * c.hd);
        for (int64_t e = 0; e < c.hd; ++e)
          ASSERT_EQ(vc_h[at + e], float_to_cache(c.dtype, qkv[r * width + qw + kvw + e]));
      }
      // ... and attention reads that cache (the stored rows included) with the rotated q at the new positions.
      for (size_t i = 0; i < cache_elems; ++i)
        ch.kf[i] = cache_to_float(c.dtype, kc_h[i]), ch.vf[i] = cache_to_float(c.dtype, vc_h[i]);
      check_attn_out(c, rows, q_dev, width, ch.kf, ch.vf, scale, to_host<float>(out, t * qw));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
  set_pdl(true);
}

TEST(CudaRows, GraphReplayReadsPositionsOnTheDevice) {
  TESSERA_REQUIRE_GPU();
  for_each_attn_version([] { graph_replay_reads_positions(); });
}

// attn_decode_rope_rows (rotation, store and attention in one launch) captured in a graph and replayed with new
// rows: distinct slots (its contract), positions 0 and n_ctx - 1 among them, and two invalid rows (NaN, no store).
void decode_rope_rows_graph_replay() {
  std::mt19937 rng(test_seed());
  const AttnCase c{DType::BF16, 9, 3, 64, 512};
  const int64_t t = 6, qw = c.n_head * c.hd, kvw = c.n_kv * c.hd, width = qw + 2 * kvw + 4;
  const size_t cache_elems = static_cast<size_t>(kSeqs * c.n_kv * c.n_ctx * c.hd);
  const auto inv_freq = llama_inv_freq(c.hd, 10000.0);
  DeviceBuffer qkv_d(sizeof(float) * t * width), pos_d(sizeof(int32_t) * t), seq_d(sizeof(int32_t) * t);
  DeviceBuffer f_d = to_device(inv_freq), out = poisoned(sizeof(float) * t * qw);
  DeviceBuffer kc(2 * cache_elems), vc(2 * cache_elems);
  const KvCacheView cache{c.dtype, kc.get(), vc.get(), c.n_ctx, c.n_kv, c.hd, kSeqs};
  AttnRowsWorkspace ws(t, c.n_head, cache);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const float* q = qkv_d.as<float>();
  attn_decode_rope_rows(q, width, q + qw, q + qw + kvw, width, cache, pos_d.as<int32_t>(), seq_d.as<int32_t>(), t, c.hd,
                        f_d.as<float>(), false, out.as<float>(), c.n_head, scale, ws, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::uniform_int_distribution<int32_t> pd(1, static_cast<int32_t>(c.n_ctx - 2));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    Rows rows;
    std::vector<int32_t> slots = {0, 1, 2, 3};
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int64_t r = 0; r < t; ++r) {
      const int32_t p = r == 0 ? 0 : r == 1 ? static_cast<int32_t>(c.n_ctx - 1) : pd(rng);
      rows.pos.push_back(p), rows.seq.push_back(r < 4 ? slots[r] : 0), rows.valid.push_back(r < 4);
    }
    rows.pos[4] = static_cast<int32_t>(c.n_ctx), rows.seq[5] = -1;
    // Random values before each row's position, poison from it on (the row's own position is written by the launch).
    Rows before = rows;
    for (int64_t r = 0; r < 4; ++r) before.pos[r] = std::max(0, rows.pos[r] - 1);
    for (int64_t r = 0; r < 4; ++r) before.valid[r] = rows.pos[r] > 0;
    Cache ch = random_cache(c, before, rng);
    kc.upload(ch.k.data(), 2 * cache_elems), vc.upload(ch.v.data(), 2 * cache_elems);
    const auto qkv = random_floats(rng, static_cast<size_t>(t * width), -2.0f, 2.0f);
    qkv_d.upload(qkv.data(), sizeof(float) * qkv.size());
    pos_d.upload(rows.pos.data(), sizeof(int32_t) * t), seq_d.upload(rows.seq.data(), sizeof(int32_t) * t);
    out.fill_bytes(0xFF);
    synchronize();  // the plain copies and memsets above are on the legacy stream, the graph on `stream`
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(to_host<float>(qkv_d, qkv.size()) == qkv, true);  // q, k and v are only read
    const auto kc_h = to_host<uint16_t>(kc, cache_elems), vc_h = to_host<uint16_t>(vc, cache_elems);
    std::vector<double> ref(c.hd);
    std::vector<float> q_rot(qkv);
    std::vector<bool> stored(static_cast<size_t>(kSeqs * c.n_ctx), false);
    for (int64_t r = 0; r < 4; ++r) {
      const int32_t p = rows.pos[r], s = rows.seq[r];
      stored[s * c.n_ctx + p] = true;
      for (int64_t h = 0; h < c.n_head; ++h) {
        rope_head_ref(&qkv[r * width + h * c.hd], ref.data(), c.hd, c.hd, p, inv_freq.data(), false);
        for (int64_t e = 0; e < c.hd; ++e) q_rot[r * width + h * c.hd + e] = static_cast<float>(ref[e]);
      }
      for (int64_t h = 0; h < c.n_kv; ++h) {
        rope_head_ref(&qkv[r * width + qw + h * c.hd], ref.data(), c.hd, c.hd, p, inv_freq.data(), false);
        const size_t at = static_cast<size_t>(((s * c.n_kv + h) * c.n_ctx + p) * c.hd);
        for (int64_t e = 0; e < c.hd; ++e) {
          ASSERT_NEAR(cache_to_float(c.dtype, kc_h[at + e]), ref[e], 0x1.0p-8 * std::fabs(ref[e]) + 6e-6);
          ASSERT_EQ(vc_h[at + e], float_to_cache(c.dtype, qkv[r * width + qw + kvw + h * c.hd + e]));
        }
      }
    }
    for (int64_t s = 0; s < kSeqs; ++s)  // every other position is as uploaded (invalid rows stored nothing)
      for (int64_t h = 0; h < c.n_kv; ++h)
        for (int64_t p = 0; p < c.n_ctx; ++p) {
          if (stored[s * c.n_ctx + p]) continue;
          const size_t at = static_cast<size_t>(((s * c.n_kv + h) * c.n_ctx + p) * c.hd);
          for (int64_t e = 0; e < c.hd; ++e)
            ASSERT_TRUE(kc_h[at + e] == ch.k[at + e] && vc_h[at + e] == ch.v[at + e]) << "slot " << s << " pos " << p;
        }
    for (size_t i = 0; i < cache_elems; ++i)
      ch.kf[i] = cache_to_float(c.dtype, kc_h[i]), ch.vf[i] = cache_to_float(c.dtype, vc_h[i]);
    check_attn_out(c, rows, q_rot, width, ch.kf, ch.vf, scale, to_host<float>(out, t * qw));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CudaRows, DecodeRopeRowsGraphReplayMatchesReference) {
  TESSERA_REQUIRE_GPU();
  for_each_attn_version([] { decode_rope_rows_graph_replay(); });
}

}  // namespace
}  // namespace tessera::cuda::test
