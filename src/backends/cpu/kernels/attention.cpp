// Attention over the KV cache: validation, cache writes, the naive reference, and dispatch to the blocked
// (flash-attention style) kernel in attention_avx2.cpp or, without AVX2, a portable online-softmax loop.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/attention_internal.h"
#include "backends/cpu/kernels/elementwise_internal.h"
#include "core/error.h"
#include "quant/half.h"

namespace tessera::cpu {
namespace {

// op: "attention" or "kv_store"; what: "K", "V" or "destination".
void check_kv(const KvView& kv, const char* op, const char* what, int64_t n_pos) {
  TESSERA_CHECK(kv.dtype == DType::F32 || kv.dtype == DType::F16, "{}: {} cache dtype {} is not f32 or f16", op, what,
                dtype_name(kv.dtype));
  TESSERA_CHECK(kv.data != nullptr, "{}: {} cache has no data", op, what);
  TESSERA_CHECK(kv.pos_stride >= 0 && kv.head_stride >= 0, "{}: {} cache has negative strides", op, what);
  TESSERA_CHECK(n_pos <= kv.n_ctx, "{}: positions up to {} do not fit the {} cache of {} positions", op, n_pos, what,
                kv.n_ctx);
}

// The first key position the query at `pos` sees under a sliding window (0 without one).
int64_t first_key(int64_t pos, int64_t window) { return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0; }

void check_attention(const float* q, const KvView& k, const KvView& v, const float* out, int64_t t, int64_t n_head,
                     int64_t n_head_kv, int64_t hd, int64_t pos0, int64_t window) {
  TESSERA_CHECK(window >= 0, "attention: sliding window {} is negative", window);
  TESSERA_CHECK(q != nullptr && out != nullptr, "attention: null query or output");
  TESSERA_CHECK(t > 0 && n_head > 0 && n_head_kv > 0 && hd > 0 && pos0 >= 0,
                "attention: bad shape (t {}, heads {}/{}, head dim {}, pos0 {})", t, n_head, n_head_kv, hd, pos0);
  TESSERA_CHECK(n_head % n_head_kv == 0, "attention: {} query heads are not a multiple of {} kv heads", n_head,
                n_head_kv);
  check_kv(k, "attention", "K", pos0 + t);
  check_kv(v, "attention", "V", pos0 + t);
}

float kv_at(const KvView& kv, int64_t pos, int64_t head, int64_t i) {
  const int64_t off = pos * kv.pos_stride + head * kv.head_stride + i;
  if (kv.dtype == DType::F16) return fp16_to_f32(static_cast<const uint16_t*>(kv.data)[off]);
  return static_cast<const float*>(kv.data)[off];
}

// Portable path: one (token, head) at a time, keys streamed with an online softmax (running max and sum).
void attention_portable(ThreadPool& pool, const float* q, const KvView& k, const KvView& v, float* out, int64_t t,
                        int64_t n_head, int64_t n_head_kv, int64_t hd, int64_t pos0, float scale, int64_t window) {
  const int64_t group = n_head / n_head_kv;
  pool.parallel_for(t * n_head, [&](int64_t task, int) {
    const int64_t i = task / n_head, h = task % n_head, kvh = h / group;
    thread_local std::vector<float> acc;
    acc.assign(static_cast<size_t>(hd), 0.0f);
    const float* qv = q + (i * n_head + h) * hd;
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    for (int64_t p = first_key(pos0 + i, window); p <= pos0 + i; ++p) {
      float s = 0.0f;
      for (int64_t c = 0; c < hd; ++c) s += qv[c] * kv_at(k, p, kvh, c);
      s *= scale;
      const float mnew = std::max(m, s);
      const float alpha = std::exp(m - mnew), w = std::exp(s - mnew);
      l = l * alpha + w;
      for (int64_t c = 0; c < hd; ++c)
        acc[static_cast<size_t>(c)] = acc[static_cast<size_t>(c)] * alpha + w * kv_at(v, p, kvh, c);
      m = mnew;
    }
    float* o = out + (i * n_head + h) * hd;
    for (int64_t c = 0; c < hd; ++c) o[c] = acc[static_cast<size_t>(c)] / l;
  });
}

// Decode: one query per head, so (token, head) tasks would give the pool only n_head tasks and make each q head of a
// GQA group read the same K/V. Instead tasks are (kv head, chunk of keys), each running the group's heads over its
// chunk, and the chunks' partial softmax states are merged here: M = max m_c, L = sum l_c e^(m_c - M),
// out = sum o_c e^(m_c - M) / L.
void attention_decode(ThreadPool& pool, const detail::AttnArgs& a, int64_t n_head_kv, float* out) {
  const int64_t first = detail::attn_first_key(a, a.pos0);
  const int64_t n_keys = a.pos0 + 1 - first, hd = a.hd, group = a.group;
  // ~4 tasks per thread for balance, but chunks of at least 64 keys (one block) so each task amortizes its setup.
  const int64_t want = (4 * pool.n_threads() + n_head_kv - 1) / n_head_kv;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(want, n_keys / detail::kAttnKeys));
  const int64_t chunk = (n_keys + chunks - 1) / chunks;
  thread_local std::vector<float> parts;
  const auto part_floats = static_cast<size_t>(group * (hd + 2));
  parts.resize(static_cast<size_t>(n_head_kv * chunks) * part_floats);
  float* base = parts.data();
  pool.parallel_for(n_head_kv * chunks, [&](int64_t task, int) {
    const int64_t kvh = task / chunks, c = task % chunks;
    const int64_t p0 = c * chunk, p1 = std::min(n_keys, p0 + chunk);
    if (p0 < p1)
      detail::attention_decode_chunk_avx2(a, kvh, first + p0, first + p1,
                                          base + static_cast<size_t>(task) * part_floats);
  });
  for (int64_t kvh = 0; kvh < n_head_kv; ++kvh) {
    for (int64_t g = 0; g < group; ++g) {
      float mmax = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c * chunk < n_keys; ++c)
        mmax = std::max(mmax, base[static_cast<size_t>(kvh * chunks + c) * part_floats + g * (hd + 2)]);
      float* o = out + (kvh * group + g) * hd;
      std::fill(o, o + hd, 0.0f);
      float l = 0.0f;
      for (int64_t c = 0; c * chunk < n_keys; ++c) {
        const float* pm = base + static_cast<size_t>(kvh * chunks + c) * part_floats + g * (hd + 2);
        const float w = std::exp(pm[0] - mmax);
        l += pm[1] * w;
        for (int64_t i = 0; i < hd; ++i) o[i] += pm[2 + i] * w;
      }
      for (int64_t i = 0; i < hd; ++i) o[i] /= l;
    }
  }
}

}  // namespace

KvView kv_head_major(DType dtype, void* data, int64_t n_ctx, int64_t n_head_kv, int64_t hd) {
  (void)n_head_kv;
  return KvView{dtype, data, hd, n_ctx * hd, n_ctx};
}

KvView kv_pos_major(DType dtype, void* data, int64_t n_ctx, int64_t n_head_kv, int64_t hd) {
  return KvView{dtype, data, n_head_kv * hd, hd, n_ctx};
}

void kv_store_ref(const KvView& dst, const float* src, int64_t t, int64_t n_head_kv, int64_t hd, int64_t pos0) {
  TESSERA_CHECK(src != nullptr && t >= 0 && pos0 >= 0 && n_head_kv > 0 && hd > 0,
                "kv_store: bad source, shape or positions (t {}, kv heads {}, head dim {}, pos0 {})", t, n_head_kv, hd,
                pos0);
  check_kv(dst, "kv_store", "destination", pos0 + t);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t h = 0; h < n_head_kv; ++h) {
      const float* s = src + (i * n_head_kv + h) * hd;
      const int64_t off = (pos0 + i) * dst.pos_stride + h * dst.head_stride;
      if (dst.dtype == DType::F16) {
        auto* d = static_cast<uint16_t*>(dst.data) + off;
        for (int64_t c = 0; c < hd; ++c) d[c] = f32_to_fp16(s[c]);
      } else {
        std::copy(s, s + hd, static_cast<float*>(dst.data) + off);
      }
    }
  }
}

void kv_store(const KvView& dst, const float* src, int64_t t, int64_t n_head_kv, int64_t hd, int64_t pos0) {
  // The f16 conversion is what costs: vcvtps2ph instead of the bit-exact software rounding (same results).
  if (dst.dtype != DType::F16 || active_isa() < Isa::AVX2) return kv_store_ref(dst, src, t, n_head_kv, hd, pos0);
  TESSERA_CHECK(src != nullptr && t >= 0 && pos0 >= 0 && n_head_kv > 0 && hd > 0,
                "kv_store: bad source, shape or positions (t {}, kv heads {}, head dim {}, pos0 {})", t, n_head_kv, hd,
                pos0);
  check_kv(dst, "kv_store", "destination", pos0 + t);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t h = 0; h < n_head_kv; ++h)
      detail::f32_to_f16_avx2(src + (i * n_head_kv + h) * hd,
                              static_cast<uint16_t*>(dst.data) + (pos0 + i) * dst.pos_stride + h * dst.head_stride, hd);
}

void attention_ref(const float* q, const KvView& k, const KvView& v, float* out, int64_t t, int64_t n_head,
                   int64_t n_head_kv, int64_t hd, int64_t pos0, float scale, int64_t window) {
  check_attention(q, k, v, out, t, n_head, n_head_kv, hd, pos0, window);
  const int64_t group = n_head / n_head_kv;
  std::vector<double> s, acc(static_cast<size_t>(hd));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t kvh = h / group, first = first_key(pos0 + i, window), n_keys = pos0 + i + 1 - first;
      const float* qv = q + (i * n_head + h) * hd;
      s.assign(static_cast<size_t>(n_keys), 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t p = 0; p < n_keys; ++p) {
        double d = 0.0;
        for (int64_t c = 0; c < hd; ++c) d += static_cast<double>(qv[c]) * kv_at(k, first + p, kvh, c);
        s[static_cast<size_t>(p)] = d * scale;
        mx = std::max(mx, s[static_cast<size_t>(p)]);
      }
      double sum = 0.0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t p = 0; p < n_keys; ++p)
        for (int64_t c = 0; c < hd; ++c)
          acc[static_cast<size_t>(c)] += s[static_cast<size_t>(p)] * kv_at(v, first + p, kvh, c);
      float* o = out + (i * n_head + h) * hd;
      for (int64_t c = 0; c < hd; ++c) o[c] = static_cast<float>(acc[static_cast<size_t>(c)] / sum);
    }
  }
}

void attention(ThreadPool& pool, const float* q, const KvView& k, const KvView& v, float* out, int64_t t,
               int64_t n_head, int64_t n_head_kv, int64_t hd, int64_t pos0, float scale, int64_t window) {
  check_attention(q, k, v, out, t, n_head, n_head_kv, hd, pos0, window);
  if (active_isa() < Isa::AVX2 || hd % 8 != 0) {
    return attention_portable(pool, q, k, v, out, t, n_head, n_head_kv, hd, pos0, scale, window);
  }
  const detail::AttnArgs a{q,
                           out,
                           k.data,
                           v.data,
                           k.dtype == DType::F16,
                           v.dtype == DType::F16,
                           k.pos_stride,
                           k.head_stride,
                           v.pos_stride,
                           v.head_stride,
                           t,
                           n_head,
                           n_head / n_head_kv,
                           hd,
                           pos0,
                           scale,
                           window};
  if (t == 1) return attention_decode(pool, a, n_head_kv, out);
  const int64_t qblocks = (t + detail::kAttnQueries - 1) / detail::kAttnQueries;
  if (hd >= detail::kGroupedMinHd && hd % 16 == 0) {
    const auto floats = static_cast<size_t>(detail::attention_grouped_scratch_floats(hd, n_head / n_head_kv));
    pool.parallel_for(qblocks * n_head_kv, [&](int64_t task, int) {
      const int64_t qb = qblocks - 1 - task / n_head_kv, kvh = task % n_head_kv;  // longest tasks first, as below
      thread_local std::vector<float> scratch;
      if (scratch.size() < floats) scratch.resize(floats);
      const int64_t i0 = qb * detail::kAttnQueries;
      detail::attention_task_grouped_avx2(a, kvh, i0, std::min(t, i0 + detail::kAttnQueries), scratch.data());
    });
    return;
  }
  const auto scratch_floats = static_cast<size_t>(detail::attention_scratch_floats(hd));
  // Later token blocks see more keys: hand them out first so the dynamic schedule ends with the small tasks.
  pool.parallel_for(qblocks * n_head, [&](int64_t task, int) {
    const int64_t qb = qblocks - 1 - task / n_head, h = task % n_head;
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    const int64_t i0 = qb * detail::kAttnQueries;
    detail::attention_task_avx2(a, h, i0, std::min(t, i0 + detail::kAttnQueries), scratch.data());
  });
}

}  // namespace tessera::cpu
