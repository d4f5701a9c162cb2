// RoPE for the decode token(s), fused with storing k and v into the KV cache: one launch instead of three, and k never
// goes back to memory in f32 after its rotation. One kernel serves one token (rope_store_kv), batched decode (rows in
// different cache slots and positions) and prefill (t consecutive positions of one slot).
//
// v1 (one block per head, the head staged in shared memory) launched n_head + 2 n_kv blocks for one token; for a
// 2048-row prefill that is ~100k tiny blocks. v2 (this): one thread per rotation pair (two elements), so a row is
// (n_head + 2 n_kv) * hd / 2 independent items and the grid is (ceil(items / 128), t): no shared memory, no barrier.
// v3 (rows of prefill and batched decode, t >= kRowsV3MinT): every thread of v2 computed sincosf for its own pair,
// though the angle depends on the row and the pair index only: Llama-3-8B's prefill of 2048 rows evaluated 48x the
// sines it needed. A v3 thread takes one pair index of one row for kHeadsPerThread heads (one sincosf), loads all of
// them, then rotates and stores: 8x fewer sines and eight loads in flight per thread.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kMaxHd = 512;
constexpr int kRopeThreads = 128;

// Grid (ceil(items / kRopeThreads), t). Item i of row r is pair j = i % (hd/2) of head slot i / (hd/2): slots
// [0, n_head) are q heads, then n_kv k heads, then n_kv v heads (copied, not rotated). Pair j holds elements (a, b):
// rotated pairs are (2j, 2j+1) (neox: (j, j + rope_dim/2)) for j < rope_dim/2; the rest pass through.
template <typename T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_store_kv_kernel(float* q /*[t, ld_q]*/, const float* __restrict__ k /*[t, ld_kv]*/,
                         const float* __restrict__ v /*[t, ld_kv]*/, size_t ld_q, size_t ld_kv, T* __restrict__ kc,
                         T* __restrict__ vc /*[n_seq, n_kv, n_ctx, hd]*/, const int32_t* __restrict__ pos_ptr /*[t]*/,
                         const int32_t* __restrict__ seq_ptr /*[t] or null*/, int n_head, int n_kv, int hd, int n_ctx,
                         int n_seq, int rope_dim, const float* __restrict__ inv_freq /*[rope_dim/2]*/, bool neox) {
  pdl_wait();
  const int half_hd = hd / 2;
  const int item = blockIdx.x * kRopeThreads + threadIdx.x;
  if (item >= (n_head + 2 * n_kv) * half_hd) return;
  const size_t row = blockIdx.y;
  const int head = item / half_hd, j = item % half_hd;
  const int pos = pos_ptr[row];
  const int slot = seq_ptr ? seq_ptr[row] : 0;
  const bool valid = pos >= 0 && pos < n_ctx && slot >= 0 && slot < n_seq;
  const bool is_q = head < n_head;
  const bool is_v = head >= n_head + n_kv;
  const int kvh = is_q ? 0 : (is_v ? head - n_head - n_kv : head - n_head);
  const int half_rd = rope_dim / 2;
  const bool rotate = !is_v && j < half_rd;
  const int a = rotate ? (neox ? j : 2 * j) : (neox && !is_v ? rope_dim + 2 * (j - half_rd) : 2 * j);
  const int b = rotate && neox ? j + half_rd : a + 1;
  float* qrow = q + row * ld_q + static_cast<size_t>(head) * hd;
  if (!valid) {
    if (is_q) qrow[a] = qrow[b] = __int_as_float(0x7fc00000);
    return;
  }
  const float* src = is_q ? qrow : (is_v ? v : k) + row * ld_kv + static_cast<size_t>(kvh) * hd;
  float xa = src[a], xb = src[b];
  if (rotate) {
    // The pair (a, b) rotates by theta: a' = a cos - b sin, b' = a sin + b cos.
    const float theta = static_cast<float>(pos) * inv_freq[j];
    float s, c;
    sincosf(theta, &s, &c);  // the accurate version: theta reaches thousands of radians at long contexts
    const float ra = xa * c - xb * s, rb = xa * s + xb * c;
    xa = ra, xb = rb;
  }
  if (is_q) {
    qrow[a] = xa, qrow[b] = xb;
    return;
  }
  T* dst = (is_v ? vc : kc) + ((static_cast<size_t>(slot) * n_kv + kvh) * n_ctx + pos) * hd;
  dst[a] = from_float<T>(xa);
  dst[b] = from_float<T>(xb);
}

constexpr int kHeadsPerThread = 8;
constexpr int64_t kRowsV3MinT = 8;

// v3: item = (row * n_chunks + chunk) * hd/2 + j; the chunk's heads are [chunk * 8, chunk * 8 + 8) of the same head
// slots as v2 (q heads, then k heads, then v heads). Lanes of a warp take consecutive j of one (row, chunk) when
// hd/2 is a multiple of 32, so each head's loads and stores are contiguous runs.
template <typename T>
__global__ void __launch_bounds__(kRopeThreads)
    rope_store_rows_kernel(float* q /*[t, ld_q]*/, const float* __restrict__ k /*[t, ld_kv]*/,
                           const float* __restrict__ v /*[t, ld_kv]*/, size_t ld_q, size_t ld_kv, T* __restrict__ kc,
                           T* __restrict__ vc /*[n_seq, n_kv, n_ctx, hd]*/, const int32_t* __restrict__ pos_ptr,
                           const int32_t* __restrict__ seq_ptr, int n_head, int n_kv, int hd, int n_ctx, int n_seq,
                           int rope_dim, const float* __restrict__ inv_freq, bool neox, int n_chunks, int64_t items,
                           T* __restrict__ q16 /*[t, n_head * hd] or null*/) {
  pdl_wait();
  const int64_t item = blockIdx.x * static_cast<int64_t>(kRopeThreads) + threadIdx.x;
  if (item >= items) return;
  const int half_hd = hd / 2;
  const int j = static_cast<int>(item % half_hd);
  const int64_t rc = item / half_hd;
  const int chunk = static_cast<int>(rc % n_chunks);
  const size_t row = static_cast<size_t>(rc / n_chunks);
  const int pos = pos_ptr[row];
  const int slot = seq_ptr ? seq_ptr[row] : 0;
  const bool valid = pos >= 0 && pos < n_ctx && slot >= 0 && slot < n_seq;
  const int half_rd = rope_dim / 2;
  const bool in_rot = j < half_rd;
  // Elements of pair j in a rotated (q or k) head, and in a copied (v) head.
  const int a_r = in_rot ? (neox ? j : 2 * j) : (neox ? rope_dim + 2 * (j - half_rd) : 2 * j);
  const int b_r = in_rot && neox ? j + half_rd : a_r + 1;
  const int a_v = 2 * j, b_v = 2 * j + 1;
  const int h0 = chunk * kHeadsPerThread, heads = n_head + 2 * n_kv;
  float* qrow = q + row * ld_q;
  if (!valid) {
#pragma unroll
    for (int u = 0; u < kHeadsPerThread; ++u) {
      const int head = h0 + u;
      if (head < n_head && q16 != nullptr) {
        T* qh = q16 + (row * n_head + head) * static_cast<size_t>(hd);
        qh[a_r] = qh[b_r] = from_float<T>(__int_as_float(0x7fc00000));
      } else if (head < n_head) {
        qrow[static_cast<size_t>(head) * hd + a_r] = qrow[static_cast<size_t>(head) * hd + b_r] =
            __int_as_float(0x7fc00000);
      }
    }
    return;
  }
  float s = 0.0f, c = 1.0f;
  if (in_rot) sincosf(static_cast<float>(pos) * inv_freq[j], &s, &c);  // as v2: the same theta, the accurate sincos
  float xa[kHeadsPerThread], xb[kHeadsPerThread];
#pragma unroll
  for (int u = 0; u < kHeadsPerThread; ++u) {
    const int head = h0 + u;
    if (head >= heads) continue;
    const bool is_q = head < n_head, is_v = head >= n_head + n_kv;
    const float* src = is_q ? qrow + static_cast<size_t>(head) * hd
                            : (is_v ? v + row * ld_kv + static_cast<size_t>(head - n_head - n_kv) * hd
                                    : k + row * ld_kv + static_cast<size_t>(head - n_head) * hd);
    xa[u] = src[is_v ? a_v : a_r];
    xb[u] = src[is_v ? b_v : b_r];
  }
#pragma unroll
  for (int u = 0; u < kHeadsPerThread; ++u) {
    const int head = h0 + u;
    if (head >= heads) continue;
    const bool is_q = head < n_head, is_v = head >= n_head + n_kv;
    float ya = xa[u], yb = xb[u];
    if (!is_v && in_rot) ya = xa[u] * c - xb[u] * s, yb = xa[u] * s + xb[u] * c;
    if (is_q && q16 != nullptr) {
      T* qh = q16 + (row * n_head + head) * static_cast<size_t>(hd);
      qh[a_r] = from_float<T>(ya);
      qh[b_r] = from_float<T>(yb);
      continue;
    }
    if (is_q) {
      qrow[static_cast<size_t>(head) * hd + a_r] = ya;
      qrow[static_cast<size_t>(head) * hd + b_r] = yb;
      continue;
    }
    const int kvh = is_v ? head - n_head - n_kv : head - n_head;
    T* dst = (is_v ? vc : kc) + ((static_cast<size_t>(slot) * n_kv + kvh) * n_ctx + pos) * hd;
    dst[is_v ? a_v : a_r] = from_float<T>(ya);
    dst[is_v ? b_v : b_r] = from_float<T>(yb);
  }
}

template <typename T>
void launch_rope_rows(float* q, const float* k, const float* v, size_t ld_q, size_t ld_kv, T* kc, T* vc,
                      const int32_t* pos, const int32_t* seq, int nh, int nkv, int hd, int nctx, int nseq, int rd,
                      const float* inv_freq, bool neox, int64_t t, cudaStream_t stream, T* q16) {
  if (t >= kRowsV3MinT || q16 != nullptr) {
    const int n_chunks = (nh + 2 * nkv + kHeadsPerThread - 1) / kHeadsPerThread;
    const int64_t items = t * n_chunks * (hd / 2);
    launch("rope_store_rows_kernel", rope_store_rows_kernel<T>, dim3(ceil_div(items, kRopeThreads)),
           dim3(kRopeThreads), 0, stream, q, k, v, ld_q, ld_kv, kc, vc, pos, seq, nh, nkv, hd, nctx, nseq, rd, inv_freq,
           neox, n_chunks, items, q16);
    return;
  }
  const int64_t items = (nh + 2 * nkv) * (hd / 2);
  const dim3 grid(ceil_div(items, kRopeThreads), static_cast<unsigned>(t));
  launch("rope_store_kv_kernel", rope_store_kv_kernel<T>, grid, dim3(kRopeThreads), 0, stream, q, k, v, ld_q, ld_kv, kc,
         vc, pos, seq, nh, nkv, hd, nctx, nseq, rd, inv_freq, neox);
}

void rope_rows(const char* op, float* q, int64_t ld_q, const float* k, const float* v, int64_t ld_kv,
               const KvCacheView& cache, const int32_t* pos, const int32_t* seq, int64_t t, int64_t n_head,
               int64_t rope_dim, const float* inv_freq, bool neox, cudaStream_t stream, void* q16 = nullptr) {
  const std::string o(op);
  TESSERA_CUDA_REQUIRE(q16 == nullptr || cache.dtype != DType::F32,
                       o + ": a 16-bit copy of q needs a 16-bit (f16 or bf16) cache");
  TESSERA_CUDA_REQUIRE(q && k && v && pos && cache.k && cache.v, o + ": a pointer argument is null");
  TESSERA_CUDA_REQUIRE(cache.dtype == DType::F16 || cache.dtype == DType::BF16 || cache.dtype == DType::F32,
                       o + ": the KV cache must be f16, bf16 or f32");
  TESSERA_CUDA_REQUIRE(cache.hd > 0 && cache.hd <= kMaxHd && cache.hd % 2 == 0,
                       o + ": head size " + num(cache.hd) + " is not an even number in 2..512");
  TESSERA_CUDA_REQUIRE(rope_dim >= 0 && rope_dim % 2 == 0 && rope_dim <= cache.hd,
                       o + ": rope_dim " + num(rope_dim) + " must be even and at most the head size");
  TESSERA_CUDA_REQUIRE(rope_dim == 0 || inv_freq != nullptr, o + ": inv_freq is null");
  TESSERA_CUDA_REQUIRE(n_head > 0 && cache.n_kv > 0 && n_head % cache.n_kv == 0 && n_head + 2 * cache.n_kv < 65536,
                       o + ": " + num(n_head) + " query heads do not group over " + num(cache.n_kv) + " kv heads");
  TESSERA_CUDA_REQUIRE(cache.n_seq > 0 && cache.n_seq < (int64_t{1} << 31) && cache.n_ctx > 0 &&
                           cache.n_ctx < (int64_t{1} << 31) &&
                           cache.n_seq * cache.n_ctx * cache.n_kv * cache.hd < (int64_t{1} << 40),
                       o + ": the cache size is invalid");
  TESSERA_CUDA_REQUIRE(t > 0 && t <= 65535, o + ": row count " + num(t) + " is outside 1..65535");
  TESSERA_CUDA_REQUIRE(
      ld_q >= n_head * cache.hd && ld_kv >= cache.n_kv * cache.hd,
      o + ": the row strides ld_q " + num(ld_q) + " and ld_kv " + num(ld_kv) + " are smaller than the heads' widths");
  const int nh = static_cast<int>(n_head), nkv = static_cast<int>(cache.n_kv), hd = static_cast<int>(cache.hd);
  const int nctx = static_cast<int>(cache.n_ctx), nseq = static_cast<int>(cache.n_seq), rd = static_cast<int>(rope_dim);
  const auto lq = static_cast<size_t>(ld_q), lkv = static_cast<size_t>(ld_kv);
  if (cache.dtype == DType::F16)
    launch_rope_rows(q, k, v, lq, lkv, static_cast<__half*>(cache.k), static_cast<__half*>(cache.v), pos, seq, nh, nkv,
                     hd, nctx, nseq, rd, inv_freq, neox, t, stream, static_cast<__half*>(q16));
  else if (cache.dtype == DType::F32)
    launch_rope_rows(q, k, v, lq, lkv, static_cast<float*>(cache.k), static_cast<float*>(cache.v), pos, seq, nh, nkv,
                     hd, nctx, nseq, rd, inv_freq, neox, t, stream, static_cast<float*>(nullptr));
  else
    launch_rope_rows(q, k, v, lq, lkv, static_cast<__nv_bfloat16*>(cache.k), static_cast<__nv_bfloat16*>(cache.v), pos,
                     seq, nh, nkv, hd, nctx, nseq, rd, inv_freq, neox, t, stream, static_cast<__nv_bfloat16*>(q16));
}

}  // namespace
}  // namespace detail

void rope_store_kv(float* q, const float* k, const float* v, const KvCacheView& cache, const int32_t* pos,
                   int64_t n_head, int64_t rope_dim, const float* inv_freq, bool neox, cudaStream_t stream) {
  detail::rope_rows("rope_store_kv", q, n_head * cache.hd, k, v, cache.n_kv * cache.hd, cache, pos, nullptr, 1, n_head,
                    rope_dim, inv_freq, neox, stream);
}

void rope_store_kv_rows(float* q, int64_t ld_q, const float* k, const float* v, int64_t ld_kv, const KvCacheView& cache,
                        const int32_t* pos, const int32_t* seq, int64_t t, int64_t n_head, int64_t rope_dim,
                        const float* inv_freq, bool neox, cudaStream_t stream, void* q16) {
  detail::rope_rows("rope_store_kv_rows", q, ld_q, k, v, ld_kv, cache, pos, seq, t, n_head, rope_dim, inv_freq, neox,
                    stream, q16);
}

}  // namespace tessera::cuda
