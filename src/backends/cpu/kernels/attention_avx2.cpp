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

namespace {

// kt[c * kAttnKeys + j] = K row j, element c, for rows [0, nk) of one head (f16 or f32, row stride ks); columns
// [nk, round_up(nk, 16)) zero, so the score tiles past the last key read zeros, not stale scratch.
void load_k_transposed(const void* base, bool f16, int64_t ks, int64_t nk, int64_t hd, float* kt) {
  const auto row8 = [&](int64_t j, int64_t c) {
    if (f16) {
      return _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + j * ks + c)));
    }
    return _mm256_loadu_ps(static_cast<const float*>(base) + j * ks + c);
  };
  int64_t j = 0;
  for (; j + 8 <= nk; j += 8) {
    for (int64_t c = 0; c < hd; c += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = row8(j + i, c);
      // 8 x 8 transpose: r[i] (row j + i, elements c..c+7) -> column vectors (element c + i of rows j..j+7).
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* d = kt + c * kAttnKeys + j;
      _mm256_storeu_ps(d + 0 * kAttnKeys, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(d + 1 * kAttnKeys, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(d + 2 * kAttnKeys, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(d + 3 * kAttnKeys, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(d + 4 * kAttnKeys, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(d + 5 * kAttnKeys, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(d + 6 * kAttnKeys, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(d + 7 * kAttnKeys, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
  }
  const int64_t nk16 = (nk + 15) / 16 * 16;
  for (; j < nk; ++j) {
    for (int64_t c = 0; c < hd; c += 8) {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, row8(j, c));
      for (int i = 0; i < 8; ++i) kt[(c + i) * kAttnKeys + j] = tmp[i];
    }
  }
  for (int64_t c = 0; c < hd && nk < nk16; ++c)
    for (int64_t z = nk; z < nk16; ++z) kt[c * kAttnKeys + z] = 0.0f;
}

}  // namespace

void attention_task_grouped_avx2(const AttnArgs& a, int64_t kvh, int64_t i0, int64_t i1, float* scratch) {
  const int64_t hd = a.hd, nq = i1 - i0, group = a.group;
  const int64_t rows = nq * group, rows_pad = attention_grouped_rows(group);
  float* kt = scratch;                   // [hd, kAttnKeys]: the block's K, transposed
  float* vb = kt + hd * kAttnKeys;       // [kAttnKeys, hd]: the block's V as f32 (f16 caches)
  float* s = vb + kAttnKeys * hd;        // [rows_pad, kAttnKeys]: scores, then probabilities
  float* qs = s + rows_pad * kAttnKeys;  // [rows_pad, hd]: query rows times scale (rows past `rows` zero)
  float* o = qs + rows_pad * hd;         // [rows_pad, hd]: unnormalized outputs
  float* m = o + rows_pad * hd;          // [rows_pad] running max
  float* l = m + rows_pad;               // [rows_pad] running sum
  float* alpha = l + rows_pad;           // [rows_pad] this block's rescale of o
  // Query row r = token i0 + r / group, head kvh * group + r % group.
  const __m256 vscale = _mm256_set1_ps(a.scale);
  for (int64_t r = 0; r < rows_pad; ++r) {
    const float* src = a.q + ((i0 + r / group) * a.n_head + kvh * group + r % group) * hd;
    for (int64_t c = 0; c < hd; c += 8) {
      const __m256 v = r < rows ? _mm256_mul_ps(_mm256_loadu_ps(src + c), vscale) : _mm256_setzero_ps();
      _mm256_storeu_ps(qs + r * hd + c, v);
      _mm256_storeu_ps(o + r * hd + c, _mm256_setzero_ps());
    }
    m[r] = -__builtin_inff();
    l[r] = 0.0f;
    alpha[r] = 1.0f;
  }
  const int64_t n_keys = a.pos0 + i1;  // what the task's last token sees
  for (int64_t p0 = attn_first_key(a, a.pos0 + i0); p0 < n_keys; p0 += kAttnKeys) {
    const int64_t nk = n_keys - p0 < kAttnKeys ? n_keys - p0 : kAttnKeys;
    const int64_t nk16 = (nk + 15) / 16 * 16;
    const char* kbase =
        static_cast<const char*>(a.k) + (kvh * a.k_head_stride + p0 * a.k_pos_stride) * (a.k_f16 ? 2 : 4);
    load_k_transposed(kbase, a.k_f16, a.k_pos_stride, nk, hd, kt);
    int64_t vs = 0;
    const float* vr = kv_block(a.v, a.v_f16, a.v_pos_stride, kvh * a.v_head_stride, p0, nk, hd, vb, &vs);
    // Scores: tiles of kAttnRowTile rows x 16 keys over the whole head dimension; each 16-key strip of kt (hd x 16
    // floats) serves every row tile from L1.
    for (int64_t j0 = 0; j0 < nk16; j0 += 16) {
      for (int64_t r0 = 0; r0 < rows_pad; r0 += kAttnRowTile) {
        __m256 acc[kAttnRowTile][2];
        for (auto& ar : acc) ar[0] = ar[1] = _mm256_setzero_ps();
        const float* q0 = qs + r0 * hd;
        for (int64_t c = 0; c < hd; ++c) {
          const __m256 k0 = _mm256_loadu_ps(kt + c * kAttnKeys + j0), k1 = _mm256_loadu_ps(kt + c * kAttnKeys + j0 + 8);
          for (int rr = 0; rr < kAttnRowTile; ++rr) {
            const __m256 qb = _mm256_broadcast_ss(q0 + rr * hd + c);
            acc[rr][0] = _mm256_fmadd_ps(qb, k0, acc[rr][0]);
            acc[rr][1] = _mm256_fmadd_ps(qb, k1, acc[rr][1]);
          }
        }
        for (int rr = 0; rr < kAttnRowTile; ++rr) {
          _mm256_storeu_ps(s + (r0 + rr) * kAttnKeys + j0, acc[rr][0]);
          _mm256_storeu_ps(s + (r0 + rr) * kAttnKeys + j0 + 8, acc[rr][1]);
        }
      }
    }
    // Per row: the keys of the block it sees (causal limit and window), their e^(s - m), zeros elsewhere.
    for (int64_t r = 0; r < rows_pad; ++r) {
      float* sr = s + r * kAttnKeys;
      const int64_t pos = a.pos0 + i0 + r / group;
      const int64_t visible = pos + 1 - p0, lim = r < rows ? (visible < nk ? visible : nk) : 0;
      const int64_t skip = attn_first_key(a, pos) - p0, beg = skip > 0 ? skip : 0;
      if (lim <= beg) {
        alpha[r] = 1.0f;
        for (int64_t j = 0; j < nk; ++j) sr[j] = 0.0f;
        continue;
      }
      alpha[r] = softmax_update(sr + beg, lim - beg, &m[r], &l[r]);
      for (int64_t j = 0; j < beg; ++j) sr[j] = 0.0f;
      for (int64_t j = lim; j < nk; ++j) sr[j] = 0.0f;
    }
    // o = o * alpha + P V: tiles of kAttnRowTile rows x 16 columns over the block's keys; each 16-column strip of V
    // (nk x 16 floats) serves every row tile from L1.
    for (int64_t c0 = 0; c0 < hd; c0 += 16) {
      for (int64_t r0 = 0; r0 < rows_pad; r0 += kAttnRowTile) {
        __m256 acc[kAttnRowTile][2];
        for (int rr = 0; rr < kAttnRowTile; ++rr) {
          const __m256 va = _mm256_set1_ps(alpha[r0 + rr]);
          acc[rr][0] = _mm256_mul_ps(_mm256_loadu_ps(o + (r0 + rr) * hd + c0), va);
          acc[rr][1] = _mm256_mul_ps(_mm256_loadu_ps(o + (r0 + rr) * hd + c0 + 8), va);
        }
        const float* p = s + r0 * kAttnKeys;
        for (int64_t j = 0; j < nk; ++j) {
          const __m256 v0 = _mm256_loadu_ps(vr + j * vs + c0), v1 = _mm256_loadu_ps(vr + j * vs + c0 + 8);
          for (int rr = 0; rr < kAttnRowTile; ++rr) {
            const __m256 pb = _mm256_broadcast_ss(p + rr * kAttnKeys + j);
            acc[rr][0] = _mm256_fmadd_ps(pb, v0, acc[rr][0]);
            acc[rr][1] = _mm256_fmadd_ps(pb, v1, acc[rr][1]);
          }
        }
        for (int rr = 0; rr < kAttnRowTile; ++rr) {
          _mm256_storeu_ps(o + (r0 + rr) * hd + c0, acc[rr][0]);
          _mm256_storeu_ps(o + (r0 + rr) * hd + c0 + 8, acc[rr][1]);
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const __m256 inv = _mm256_set1_ps(1.0f / l[r]);
    float* dst = a.out + ((i0 + r / group) * a.n_head + kvh * group + r % group) * hd;
    for (int64_t c = 0; c < hd; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_loadu_ps(o + r * hd + c), inv));
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
