// LoRA's B side (kernels_lora.h): one thread per output row (lora_b_add) or per SwiGLU output column (lora_b_swiglu),
// over a tile of up to kTile tokens per block (one token: the decode forms below the tiled kernels). A thread reads its
// row of B_m (r_pad f16 values, 16-byte loads) once per tile and keeps kTile sums in registers; the tile's rows of u
// sit in shared memory (every thread of the block reads the same u values: broadcasts). At decode (t = 1) a launch
// reads B once (rank 16 on q|k|v of Llama-3-8B: 6144 rows of 32 bytes) and y once; in a chunk B is read once per 16
// tokens and y once, read and written in f32 (the residual, or the stack's output).
#include <cuda_fp16.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_lora.h"

namespace tessera::cuda {
namespace detail {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 16;

// The member whose rows hold `row`, or -1.
__device__ __forceinline__ int member_of(const LoraBLayout& l, int64_t row) {
  for (int m = 0; m < l.n_members; ++m)
    if (l.rows[m] > 0 && row >= l.row0[m] && row < l.row0[m] + l.rows[m]) return m;
  return -1;
}

// acc[tt] += Σ_c us[tt][u0 + c] · B_m[row - row0, c] for the tile's tokens (us: [kTile, ld_us]).
__device__ __forceinline__ void add_terms(const __half* __restrict__ b, const LoraBLayout& l, int m, int64_t row,
                                          const float* us, int ld_us, int tokens, float (&acc)[kTile]) {
  const __half* br = b + l.b0[m] + (row - l.row0[m]) * l.r_pad[m];
  const int u0 = l.u0[m];
  for (int c = 0; c < l.r_pad[m]; c += 8) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(br + c));
    const __half2* h = reinterpret_cast<const __half2*>(&v);
    float w[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 p = __half22float2(h[e]);
      w[2 * e] = p.x;
      w[2 * e + 1] = p.y;
    }
#pragma unroll
    for (int tt = 0; tt < kTile; ++tt) {
      if (tt >= tokens) break;
      const float* ut = us + tt * ld_us + u0 + c;
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) s += w[e] * ut[e];
      acc[tt] += s;
    }
  }
}

// Loads the tile's rows of u into shared memory, zero past r_total (a member's r_pad columns may read up to 7 past its
// u columns, where B is zero: finite values only).
__device__ __forceinline__ void load_u(const float* __restrict__ u, int r_total, int ld_us, int64_t i0, int tokens,
                                       float* us) {
  for (int idx = threadIdx.x; idx < kTile * ld_us; idx += kThreads) {
    const int tt = idx / ld_us, c = idx - tt * ld_us;
    us[idx] = tt < tokens && c < r_total ? u[(i0 + tt) * r_total + c] : 0.0f;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    lora_b_add_kernel(const __half* __restrict__ b, LoraBLayout l, const float* __restrict__ u, float* y, int64_t ld_y,
                      int64_t n, int64_t t, int ld_us, const float* __restrict__ base, int64_t ld_base,
                      bool accumulate) {
  extern __shared__ float us[];
  const int64_t row = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int tokens = static_cast<int>(t - i0 < kTile ? t - i0 : kTile);
  const int m = row < n ? member_of(l, row) : -1;
  if (m >= 0) prefetch_l2(b + l.b0[m] + (row - l.row0[m]) * l.r_pad[m]);  // B is no earlier kernel's output
  pdl_wait();
  load_u(u, l.r_total, ld_us, i0, tokens, us);
  if (row >= n || (m < 0 && base == nullptr)) return;
  float acc[kTile] = {};
  if (m >= 0) add_terms(b, l, m, row, us, ld_us, tokens, acc);
#pragma unroll
  for (int tt = 0; tt < kTile; ++tt) {
    if (tt >= tokens) break;
    float* yr = y + (i0 + tt) * ld_y + row;
    const float v = acc[tt] + (base != nullptr ? base[(i0 + tt) * ld_base + row] : 0.0f);
    *yr = accumulate ? *yr + v : v;
  }
}

// ---- Decode (t = 1) forms: every member's r_pad <= kFastRank. A thread's B row goes into registers before
// pdl_wait() (B is no earlier kernel's output), and after it u, y and the base go out together: one round trip to L2
// where the tiled kernels above take three in series (u into shared memory and a barrier, B, then y). The sums are
// formed in the same order as add_terms, so the results are the same bit for bit.
constexpr int kFastRank = 32;

struct BRow {
  uint4 v[kFastRank / 8];
};

__device__ __forceinline__ void load_brow(const __half* __restrict__ b, const LoraBLayout& l, int m, int64_t row,
                                          BRow& br) {
  const uint4* p = reinterpret_cast<const uint4*>(b + l.b0[m] + (row - l.row0[m]) * l.r_pad[m]);
#pragma unroll
  for (int i = 0; i < kFastRank / 8; ++i) br.v[i] = i * 8 < l.r_pad[m] ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
}

// u's columns of member m (zero past its rank: B is zero there too) into registers.
__device__ __forceinline__ void load_urow(const float* __restrict__ u, const LoraBLayout& l, int m,
                                          float (&uv)[kFastRank]) {
#pragma unroll
  for (int c = 0; c < kFastRank; ++c) uv[c] = c < l.r[m] ? __ldg(u + l.u0[m] + c) : 0.0f;
}

__device__ __forceinline__ float brow_dot(const BRow& br, const float (&uv)[kFastRank], int r_pad) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kFastRank / 8; ++i) {
    if (i * 8 >= r_pad) break;
    const __half2* h = reinterpret_cast<const __half2*>(&br.v[i]);
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 p = __half22float2(h[e]);
      s += p.x * uv[8 * i + 2 * e];
      s += p.y * uv[8 * i + 2 * e + 1];
    }
    acc += s;
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads)
    lora_b_add1_kernel(const __half* __restrict__ b, LoraBLayout l, const float* __restrict__ u, float* y, int64_t n,
                       const float* __restrict__ base, bool accumulate) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  const int m = row < n ? member_of(l, row) : -1;
  BRow br;
  if (m >= 0) load_brow(b, l, m, row, br);
  pdl_wait();
  if (row >= n || (m < 0 && base == nullptr)) return;
  float uv[kFastRank];
  if (m >= 0) load_urow(u, l, m, uv);
  const float yv = accumulate ? y[row] : 0.0f;
  const float bv = base != nullptr ? base[row] : 0.0f;
  const float v = (m >= 0 ? brow_dot(br, uv, l.r_pad[m]) : 0.0f) + bv;
  y[row] = accumulate ? yv + v : v;
}

// The decoder's SwiGLU form: f32 [gate; up] in one row (up at up_off), f32 out.
__global__ void __launch_bounds__(kThreads)
    lora_b_swiglu1_kernel(const __half* __restrict__ b, LoraBLayout l, const float* __restrict__ u,
                          const float* __restrict__ gu, int64_t up_off, float* __restrict__ out, int64_t f) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  const int mg = j < f ? member_of(l, j) : -1, mu = j < f ? member_of(l, up_off + j) : -1;
  BRow bg, bu;
  if (mg >= 0) load_brow(b, l, mg, j, bg);
  if (mu >= 0) load_brow(b, l, mu, up_off + j, bu);
  pdl_wait();
  if (j >= f) return;
  float ug[kFastRank], uu[kFastRank];
  if (mg >= 0) load_urow(u, l, mg, ug);
  if (mu >= 0) load_urow(u, l, mu, uu);
  const float g = gu[j], up = gu[up_off + j];
  const float dg = mg >= 0 ? brow_dot(bg, ug, l.r_pad[mg]) : 0.0f;
  const float du = mu >= 0 ? brow_dot(bu, uu, l.r_pad[mu]) : 0.0f;
  out[j] = silu_mul(g + dg, up + du);
}

bool fast_rank(const LoraBLayout& l) {
  for (int m = 0; m < l.n_members; ++m)
    if (l.rows[m] > 0 && l.r_pad[m] > kFastRank) return false;
  return true;
}

// in16: 0 f32 gate|up, 1 bf16, 2 f16; out16: 0 f32 out, 1 bf16, 2 f16.
__global__ void __launch_bounds__(kThreads)
    lora_b_swiglu_kernel(const __half* __restrict__ b, LoraBLayout l, const float* __restrict__ u,
                         const void* __restrict__ gate, int in16, int64_t ld_in, int64_t up_off, void* __restrict__ out,
                         int out16, int64_t f, int64_t t, int ld_us) {
  extern __shared__ float us[];
  const int64_t j = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int tokens = static_cast<int>(t - i0 < kTile ? t - i0 : kTile);
  pdl_wait();
  load_u(u, l.r_total, ld_us, i0, tokens, us);
  if (j >= f) return;
  float dg[kTile] = {}, du[kTile] = {};
  if (const int m = member_of(l, j); m >= 0) add_terms(b, l, m, j, us, ld_us, tokens, dg);
  if (const int m = member_of(l, up_off + j); m >= 0) add_terms(b, l, m, up_off + j, us, ld_us, tokens, du);
  const auto read = [&](int64_t idx) {
    return in16 == 0 ? static_cast<const float*>(gate)[idx]
                     : from16(static_cast<const uint16_t*>(gate)[idx], in16 == 1);
  };
#pragma unroll
  for (int tt = 0; tt < kTile; ++tt) {
    if (tt >= tokens) break;
    const int64_t r = i0 + tt;
    const float v = silu_mul(read(r * ld_in + j) + dg[tt], read(r * ld_in + up_off + j) + du[tt]);
    if (out16 == 0)
      static_cast<float*>(out)[r * f + j] = v;
    else
      static_cast<uint16_t*>(out)[r * f + j] = to16(v, out16 == 1);
  }
}

// u16[i] = Σ_s parts[s][i], four values per thread (count a multiple of 4).
__global__ void __launch_bounds__(256) lora_sum_parts_kernel(const float4* __restrict__ parts, int splits,
                                                             int64_t count4, uint2* __restrict__ u16, bool bf16) {
  const int64_t i = blockIdx.x * 256ll + threadIdx.x;
  pdl_wait();
  if (i >= count4) return;
  float4 a = parts[i];
  for (int s = 1; s < splits; ++s) {
    const float4 b = parts[s * count4 + i];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
  }
  u16[i] = make_uint2(pack16x2(a.x, a.y, bf16), pack16x2(a.z, a.w, bf16));
}

void check_layout(const char* op, const void* b, const LoraBLayout& l, const float* u, int64_t t) {
  TESSERA_CUDA_REQUIRE(b != nullptr && u != nullptr && t >= 1, std::string(op) + ": a null pointer or no rows");
  TESSERA_CUDA_REQUIRE(
      l.n_members >= 1 && l.n_members <= kLoraMaxMembers && l.r_total >= 1 && l.r_total <= kLoraMaxRank,
      std::string(op) + ": the adapters' layout has no member or too large a rank");
  TESSERA_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(b) % 16 == 0, std::string(op) + ": B must be 16-byte aligned");
  for (int m = 0; m < l.n_members; ++m)
    TESSERA_CUDA_REQUIRE(l.rows[m] == 0 || (l.r_pad[m] % 8 == 0 && l.b0[m] % 8 == 0 && l.u0[m] + l.r[m] <= l.r_total),
                         std::string(op) + ": a member's B is not in rows of whole 16-byte vectors");
}

// u's row stride in shared memory: r_total plus 8 (a member's last step of 8 columns may reach 7 past it), rounded up
// to a multiple of 4. Every thread of a block reads the same word at a time (broadcasts), so no padding against bank
// conflicts is needed.
int ld_us(const LoraBLayout& l) { return (l.r_total + 8 + 3) / 4 * 4; }

}  // namespace
}  // namespace detail

void lora_sum_parts(const float* parts, int splits, int64_t count, void* u16, DType type, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(parts != nullptr && u16 != nullptr && splits >= 1 && count >= 1 && count % 4 == 0,
                       "lora_sum_parts: null buffers, no parts, or a count that is not a multiple of 4");
  TESSERA_CUDA_REQUIRE(type == DType::BF16 || type == DType::F16, "lora_sum_parts: u must be bf16 or f16");
  TESSERA_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(parts) % 16 == 0 && reinterpret_cast<uintptr_t>(u16) % 8 == 0,
                       "lora_sum_parts: parts must be 16-byte and u 8-byte aligned");
  const int64_t count4 = count / 4;
  detail::launch("lora_sum_parts_kernel", detail::lora_sum_parts_kernel, dim3(detail::ceil_div(count4, 256)), dim3(256),
                 0, stream, reinterpret_cast<const float4*>(parts), splits, count4, static_cast<uint2*>(u16),
                 type == DType::BF16);
}

void lora_b_add(const void* b, const LoraBLayout& l, const float* u, float* y, int64_t ld_y, int64_t n, int64_t t,
                cudaStream_t stream, const float* base, int64_t ld_base, bool accumulate) {
  detail::check_layout("lora_b_add", b, l, u, t);
  TESSERA_CUDA_REQUIRE(y != nullptr && n >= 1 && ld_y >= n, "lora_b_add: bad output");
  TESSERA_CUDA_REQUIRE(base == nullptr ? accumulate : (ld_base >= n && base != y),
                       "lora_b_add: without a base the adapters' terms can only be added; a base is not the output");
  if (t == 1 && ld_y == n && detail::fast_rank(l)) {
    detail::launch("lora_b_add1_kernel", detail::lora_b_add1_kernel, dim3(detail::ceil_div(n, detail::kThreads)),
                   dim3(detail::kThreads), 0, stream, static_cast<const __half*>(b), l, u, y, n, base, accumulate);
    return;
  }
  const int ld = detail::ld_us(l);
  const dim3 grid(detail::ceil_div(n, detail::kThreads), detail::ceil_div(t, detail::kTile));
  detail::launch("lora_b_add_kernel", detail::lora_b_add_kernel, grid, dim3(detail::kThreads),
                 static_cast<size_t>(detail::kTile * ld) * sizeof(float), stream, static_cast<const __half*>(b), l, u,
                 y, ld_y, n, t, ld, base, ld_base, accumulate);
}

void lora_b_swiglu_rows(const void* b, const LoraBLayout& l, const float* u, const void* gate, DType in_type,
                        int64_t ld_in, int64_t up_off, float* out, void* out16, DType out16_type, int64_t f, int64_t t,
                        cudaStream_t stream) {
  detail::check_layout("lora_b_swiglu", b, l, u, t);
  TESSERA_CUDA_REQUIRE(gate != nullptr && f >= 1 && up_off >= f && ld_in >= up_off + f,
                       "lora_b_swiglu: the gate|up input is null or its columns overlap");
  TESSERA_CUDA_REQUIRE((out == nullptr) != (out16 == nullptr) && gate != out && gate != out16,
                       "lora_b_swiglu: exactly one output, not the input");
  TESSERA_CUDA_REQUIRE(in_type == DType::F32 || in_type == DType::BF16 || in_type == DType::F16,
                       "lora_b_swiglu: gate|up must be f32, bf16 or f16");
  TESSERA_CUDA_REQUIRE(out16 == nullptr || out16_type == DType::BF16 || out16_type == DType::F16,
                       "lora_b_swiglu: a 16-bit output must be bf16 or f16");
  const int in16 = in_type == DType::F32 ? 0 : in_type == DType::BF16 ? 1 : 2;
  const int o16 = out16 == nullptr ? 0 : out16_type == DType::BF16 ? 1 : 2;
  void* o = out16 != nullptr ? out16 : static_cast<void*>(out);
  if (t == 1 && in16 == 0 && o16 == 0 && detail::fast_rank(l)) {
    detail::launch("lora_b_swiglu1_kernel", detail::lora_b_swiglu1_kernel, dim3(detail::ceil_div(f, detail::kThreads)),
                   dim3(detail::kThreads), 0, stream, static_cast<const __half*>(b), l, u,
                   static_cast<const float*>(gate), up_off, out, f);
    return;
  }
  const int ld = detail::ld_us(l);
  const dim3 grid(detail::ceil_div(f, detail::kThreads), detail::ceil_div(t, detail::kTile));
  detail::launch("lora_b_swiglu_kernel", detail::lora_b_swiglu_kernel, grid, dim3(detail::kThreads),
                 static_cast<size_t>(detail::kTile * ld) * sizeof(float), stream, static_cast<const __half*>(b), l, u,
                 gate, in16, ld_in, up_off, o, o16, f, t, ld);
}

void lora_b_swiglu(const void* b, const LoraBLayout& l, const float* u, const float* gu, float* out, int64_t f,
                   int64_t t, cudaStream_t stream) {
  lora_b_swiglu_rows(b, l, u, gu, DType::F32, 2 * f, f, out, nullptr, DType::BF16, f, t, stream);
}

}  // namespace tessera::cuda
