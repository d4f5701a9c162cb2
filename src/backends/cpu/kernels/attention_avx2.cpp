// Blocked causal attention for one query head and up to kAttnQueries tokens (flash-attention style, on the CPU):
// keys and values are visited in blocks of kAttnKeys positions, converted to f32 once per block and reused by every
// query of the task; each query keeps a running max, sum and output row (online softmax), so no t x t score matrix is
// ever formed. Compiled with -mavx2 -mfma -mf16c; includes no header shared with portable code (matmul_float_avx2.cpp
// says why).
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/attention_internal.h"
#include "backends/cpu/kernels/avx2_math.h"

namespace tessera::cpu::detail {
namespace {

inline float exp1(float v) {
  alignas(32) float buf[8] = {v};
  _mm256_store_ps(buf, exp8(_mm256_load_ps(buf)));
  return buf[0];
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}


// r[j] = sum of the 8 lanes of a[j]: three rounds of pairwise adds instead of eight separate reductions.
inline __m256 hsum8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Rows [p0, p0 + nk) of one head as f32: converted into dst (row stride hd) when f16, else pointed to in place.
const float* kv_block(const void* base, bool f16, int64_t pos_stride, int64_t head_off, int64_t p0, int64_t nk,
                      int64_t hd, float* dst, int64_t* stride) {
  if (!f16) {
    *stride = pos_stride;
    return static_cast<const float*>(base) + head_off + p0 * pos_stride;
  }
  const auto* src = static_cast<const uint16_t*>(base) + head_off + p0 * pos_stride;
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t c = 0; c < hd; c += 8)
      _mm256_storeu_ps(dst + j * hd + c,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j * pos_stride + c))));
  *stride = hd;
  return dst;
}

// s[j] = scale * q · k_j for j < nk (keys with row stride ks).
void scores(const float* q, const float* k, int64_t ks, int64_t nk, int64_t hd, float scale, float* s) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= nk; j += 8) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (j + r) * ks + c), acc[r]);
    }
    _mm256_storeu_ps(s + j, _mm256_mul_ps(hsum8x8(acc), vscale));
  }
  for (; j < nk; ++j) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd; c += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + j * ks + c), acc);
    s[j] = hsum8(acc) * scale;
  }
}

// o = o * alpha + sum_j p[j] * v_j, 64 output columns (8 registers) at a time.
void accumulate(float* o, float alpha, const float* p, const float* v, int64_t vs, int64_t nk, int64_t hd) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t c = 0;
  for (; c + 64 <= hd; c += 64) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_mul_ps(_mm256_loadu_ps(o + c + 8 * r), va);
    for (int64_t j = 0; j < nk; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * vs + c + 8 * r), acc[r]);
    }
    for (int r = 0; r < 8; ++r) _mm256_storeu_ps(o + c + 8 * r, acc[r]);
  }
  for (; c < hd; c += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(o + c), va);
    for (int64_t j = 0; j < nk; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * vs + c), acc);
    _mm256_storeu_ps(o + c, acc);
  }
}

// As scores() and accumulate(), reading f16 rows in place (decode: each K/V row is used by one query per head, so
// converting the block into scratch first would only add a store and a load per element).
void scores_f16(const float* q, const uint16_t* k, int64_t ks, int64_t nk, int64_t hd, float scale, float* s) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= nk; j += 8) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd; c += 8) {
      const __m256 qv = _mm256_loadu_ps(q + c);
      for (int r = 0; r < 8; ++r) {
        const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + (j + r) * ks + c)));
        acc[r] = _mm256_fmadd_ps(qv, kv, acc[r]);
      }
    }
    _mm256_storeu_ps(s + j, _mm256_mul_ps(hsum8x8(acc), vscale));
  }
  for (; j < nk; ++j) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < hd; c += 8) {
      const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + j * ks + c)));
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), kv, acc);
    }
    s[j] = hsum8(acc) * scale;
  }
}

void accumulate_f16(float* o, float alpha, const float* p, const uint16_t* v, int64_t vs, int64_t nk, int64_t hd) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t c = 0;
  for (; c + 64 <= hd; c += 64) {
    __m256 acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm256_mul_ps(_mm256_loadu_ps(o + c + 8 * r), va);
    for (int64_t j = 0; j < nk; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      for (int r = 0; r < 8; ++r) {
        const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + j * vs + c + 8 * r)));
        acc[r] = _mm256_fmadd_ps(pj, vv, acc[r]);
      }
    }
    for (int r = 0; r < 8; ++r) _mm256_storeu_ps(o + c + 8 * r, acc[r]);
  }
  for (; c < hd; c += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(o + c), va);
    for (int64_t j = 0; j < nk; ++j) {
      const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + j * vs + c)));
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), vv, acc);
    }
    _mm256_storeu_ps(o + c, acc);
  }
}

// Turns scores s[0..n) into e^(s - m_new) in place, updating the running max *m and sum *l; returns the factor the
// previous output row must be scaled by.
float softmax_update(float* s, int64_t n, float* m, float* l) {
  __m256 vmax = _mm256_set1_ps(*m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  float mnew = hmax8(vmax);
  for (; j < n; ++j) mnew = s[j] > mnew ? s[j] : mnew;
  const __m256 vm = _mm256_set1_ps(mnew);
  __m256 vsum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = hsum8(vsum);
  for (; j < n; ++j) sum += (s[j] = exp1(s[j] - mnew));
  const float alpha = exp1(*m - mnew);  // *m = -inf on the first block: alpha ~ 0 multiplies a zero row
  *l = *l * alpha + sum;
  *m = mnew;
  return alpha;
}

}  // namespace

void attention_task_avx2(const AttnArgs& a, int64_t h, int64_t i0, int64_t i1, float* scratch) {
  const int64_t hd = a.hd, nq = i1 - i0, kvh = h / a.group;
  float* kf = scratch;                      // [kAttnKeys, hd]
  float* vf = kf + kAttnKeys * hd;          // [kAttnKeys, hd]
  float* s = vf + kAttnKeys * hd;           // [kAttnQueries, kAttnKeys]
  float* o = s + kAttnQueries * kAttnKeys;  // [kAttnQueries, hd]
  float m[kAttnQueries], l[kAttnQueries];
  for (int64_t i = 0; i < nq; ++i) {
    m[i] = -__builtin_inff();
    l[i] = 0.0f;
    for (int64_t c = 0; c < hd; ++c) o[i * hd + c] = 0.0f;
  }
  const int64_t n_keys = a.pos0 + i1;  // what the last query of the task sees
  // The first query of the task sees the earliest key (a sliding window moves forward with the query); blocks start
  // there, so a window skips the blocks no query of the task sees.
  for (int64_t p0 = attn_first_key(a, a.pos0 + i0); p0 < n_keys; p0 += kAttnKeys) {
    const int64_t nk = n_keys - p0 < kAttnKeys ? n_keys - p0 : kAttnKeys;
    int64_t ks = 0, vs = 0;
    const float* kr = kv_block(a.k, a.k_f16, a.k_pos_stride, kvh * a.k_head_stride, p0, nk, hd, kf, &ks);
    const float* vr = kv_block(a.v, a.v_f16, a.v_pos_stride, kvh * a.v_head_stride, p0, nk, hd, vf, &vs);
    for (int64_t i = 0; i < nq; ++i) {
      // Causal limit: query i0 + i sees positions [first, pos0 + i0 + i] (first = 0 without a window). The block
      // holding a query's first key comes before the others it sees, so m never stays -inf once it had keys.
      const int64_t visible = a.pos0 + i0 + i + 1 - p0;
      const int64_t lim = visible < nk ? visible : nk;
      const int64_t skip = attn_first_key(a, a.pos0 + i0 + i) - p0;  // keys of the block before the window
      const int64_t beg = skip > 0 ? skip : 0;
      if (lim <= beg) continue;
      const float* qv = a.q + ((i0 + i) * a.n_head + h) * hd;
      float* si = s + i * kAttnKeys;
      scores(qv, kr + beg * ks, ks, lim - beg, hd, a.scale, si);
      const float alpha = softmax_update(si, lim - beg, &m[i], &l[i]);
      accumulate(o + i * hd, alpha, si, vr + beg * vs, vs, lim - beg, hd);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    const __m256 inv = _mm256_set1_ps(1.0f / l[i]);
    float* dst = a.out + ((i0 + i) * a.n_head + h) * hd;
    for (int64_t c = 0; c < hd; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(o + i * hd + c), inv));
  }
}

void attention_decode_chunk_avx2(const AttnArgs& a, int64_t kvh, int64_t p0, int64_t p1, float* part) {
  const int64_t hd = a.hd;
  for (int64_t g = 0; g < a.group; ++g) {
    const int64_t h = kvh * a.group + g;
    const float* qv = a.q + h * hd;
    float* pm = part + g * (hd + 2);
    float m = -__builtin_inff(), l = 0.0f;
    float* o = pm + 2;
    for (int64_t c = 0; c < hd; ++c) o[c] = 0.0f;
    // The group's query heads run one after another over the same keys, so K and V come from L1/L2 after the first.
    for (int64_t b0 = p0; b0 < p1; b0 += kAttnKeys) {
      const int64_t nk = p1 - b0 < kAttnKeys ? p1 - b0 : kAttnKeys;
      float s[kAttnKeys];
      if (a.k_f16) {
        scores_f16(qv, static_cast<const uint16_t*>(a.k) + kvh * a.k_head_stride + b0 * a.k_pos_stride, a.k_pos_stride,
                   nk, hd, a.scale, s);
      } else {
        scores(qv, static_cast<const float*>(a.k) + kvh * a.k_head_stride + b0 * a.k_pos_stride, a.k_pos_stride, nk, hd,
               a.scale, s);
      }
      const float alpha = softmax_update(s, nk, &m, &l);
      if (a.v_f16) {
        accumulate_f16(o, alpha, s, static_cast<const uint16_t*>(a.v) + kvh * a.v_head_stride + b0 * a.v_pos_stride,
                       a.v_pos_stride, nk, hd);
      } else {
        accumulate(o, alpha, s, static_cast<const float*>(a.v) + kvh * a.v_head_stride + b0 * a.v_pos_stride,
                   a.v_pos_stride, nk, hd);
      }
    }
    pm[0] = m;
    pm[1] = l;
  }
}

}  // namespace tessera::cpu::detail
