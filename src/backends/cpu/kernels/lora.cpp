#include "backends/cpu/kernels/lora.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/matmul_internal.h"
#include "core/error.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cpu {

namespace detail {

void lora_accumulate_rows(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n,
                          int64_t c0, int64_t c1) {
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < r; ++j) {
      const float c = u[i * r + j];
      float* yi = y + i * n;
      if (bt_f16) {
        const uint16_t* b = static_cast<const uint16_t*>(bt) + j * n;
        for (int64_t col = c0; col < c1; ++col) yi[col] += c * fp16_to_f32(b[col]);
      } else {
        const float* b = static_cast<const float*>(bt) + j * n;
        for (int64_t col = c0; col < c1; ++col) yi[col] += c * b[col];
      }
    }
}

}  // namespace detail

void lora_accumulate(const float* u, const void* bt, bool bt_f16, float* y, int64_t t, int64_t r, int64_t n, int64_t c0,
                     int64_t c1) {
  (active_isa() >= Isa::AVX2 ? detail::lora_accumulate_rows_avx2 : detail::lora_accumulate_rows)(u, bt, bt_f16, y, t, r,
                                                                                                 n, c0, c1);
}

LoraWeights make_lora_weights(const std::vector<LoraFactor>& factors, int64_t n, int64_t k, bool q8_a) {
  TESSERA_CHECK(!factors.empty() && n > 0 && k > 0, "lora: no adapters, or a matmul shape [{}, {}] not positive", n, k);
  LoraWeights l;
  l.n = n;
  l.k = k;
  bool a_f16 = true, b_f16 = true;
  for (const LoraFactor& f : factors) {
    const auto ok = [](DType d) { return d == DType::F32 || d == DType::F16; };
    TESSERA_CHECK(ok(f.a_dtype) && ok(f.b_dtype) && f.a != nullptr && f.b != nullptr && f.r > 0,
                  "lora: an adapter's factors must be bound f32 or f16 matrices of positive rank");
    a_f16 &= f.a_dtype == DType::F16;
    b_f16 &= f.b_dtype == DType::F16;
    l.r += f.r;
  }
  const auto value = [](DType d, const void* p, int64_t i) {
    return d == DType::F16 ? fp16_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
  };
  // A stacked in f32 rows first (exact for f16 and f32), then written in its type.
  std::vector<float> a(static_cast<size_t>(l.r * k));
  size_t at_elem = 0;
  for (const LoraFactor& f : factors)
    for (int64_t i = 0; i < f.r * k; ++i) a[at_elem++] = value(f.a_dtype, f.a, i);
  const DType at = !a_f16 ? DType::F32 : q8_a && k % 32 == 0 ? DType::Q8_0 : DType::F16;
  const uint64_t row_bytes = *dtype_row_bytes(at, static_cast<uint64_t>(k));
  l.a_rows.resize(static_cast<size_t>(row_bytes) * static_cast<size_t>(l.r));
  for (int64_t j = 0; j < l.r; ++j)
    quantize_row(at, a.data() + j * k, l.a_rows.data() + static_cast<size_t>(j) * row_bytes, k);
  l.a = prepare_weight(at, l.a_rows.data(), l.r, k);
  // Bᵀ stacked: row j0 + j of adapter i's block is column j of its B [n, r].
  l.bt_f16 = b_f16;
  l.bt.resize(static_cast<size_t>(l.r * n) * (b_f16 ? sizeof(uint16_t) : sizeof(float)));
  int64_t j0 = 0;
  for (const LoraFactor& f : factors) {
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < f.r; ++j) {
        const int64_t dst = (j0 + j) * n + c, src = c * f.r + j;
        if (b_f16)
          reinterpret_cast<uint16_t*>(l.bt.data())[dst] = static_cast<const uint16_t*>(f.b)[src];
        else
          reinterpret_cast<float*>(l.bt.data())[dst] = value(f.b_dtype, f.b, src);
      }
    j0 += f.r;
  }
  return l;
}

namespace {

// The LoRA step's state inside the base matmul's job. The `before` tasks compute u; each base task's `after` adds u·Bᵀ
// to its columns of y once u is complete: tasks that finish their rows before the last `before` task has finished
// leave their column range in `pending`, and that last task adds them (no task waits for another).
struct Job {
  const LoraWeights* l = nullptr;
  detail::RowKernel a_kernel = nullptr;
  bool a_quantized = false;
  const float* x = nullptr;
  float* y = nullptr;
  float* u = nullptr;  // [t, R]
  int64_t t = 0;
  int64_t n_before = 0;
  bool by_tokens = false;  // the `before` tasks split u by tokens (a chunk), else by 8-row groups of A (decode)
  std::atomic<int64_t> before_left{0};
  std::atomic<bool> ready{false};
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> pending;

  void accumulate(int64_t c0, int64_t c1) const {
    lora_accumulate(u, l->bt.data(), l->bt_f16, y, t, l->r, l->n, c0, c1);
  }

  void before(int64_t i, const void* xq_base) {
    const LoraWeights& w = *l;
    const int64_t k = w.k, kb = k / detail::kBlock;
    int64_t t0 = 0, t1 = t, r0 = 0, r1 = w.r;
    if (by_tokens) {
      t0 = t * i / n_before;
      t1 = t * (i + 1) / n_before;
    } else {
      r0 = i * detail::kGroup;
      r1 = std::min(r0 + detail::kGroup, w.r);
    }
    if (t1 > t0) {
      const detail::BlockQ8A* xq = nullptr;
      if (a_quantized) {
        // x as the base's kernel quantized it (the same x); a float base made none, so this task makes its rows'.
        if (xq_base != nullptr) {
          xq = static_cast<const detail::BlockQ8A*>(xq_base) + t0 * kb;
        } else {
          thread_local std::vector<detail::BlockQ8A> own;
          own.resize(static_cast<size_t>((t1 - t0) * kb));
          const auto quantize = active_isa() >= Isa::AVX2 ? detail::quantize_act_avx2 : detail::quantize_act_scalar;
          for (int64_t s = t0; s < t1; ++s) quantize(x + s * k, own.data() + (s - t0) * kb, k);
          xq = own.data();
        }
      }
      const detail::MatmulArgs args{&w.a, x + t0 * k, xq, u + t0 * w.r, t1 - t0};
      a_kernel(args, r0, r1);
    }
    if (before_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    std::vector<std::pair<int64_t, int64_t>> todo;
    {
      std::lock_guard<std::mutex> lock(mu);
      ready.store(true, std::memory_order_release);
      todo.swap(pending);
    }
    for (const auto& [c0, c1] : todo) accumulate(c0, c1);
  }

  void after(int64_t c0, int64_t c1) {
    if (!ready.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mu);
      if (!ready.load(std::memory_order_relaxed)) {
        pending.emplace_back(c0, c1);
        return;
      }
    }
    accumulate(c0, c1);
  }
};

}  // namespace

void lora_matmul(ThreadPool& pool, const PackedWeight& w, const LoraWeights& l, const float* x, float* y, float* u,
                 int64_t t) {
  TESSERA_CHECK(w.n == l.n && w.k == l.k, "lora: adapters for a [{}, {}] matmul on a [{}, {}] one", l.n, l.k, w.n, w.k);
  Job job;
  job.l = &l;
  job.a_kernel = detail::row_kernel(l.a);
  job.a_quantized = l.a.dtype == DType::Q8_0;
  job.x = x;
  job.y = y;
  job.u = u;
  job.t = t;
  // A chunk splits u by tokens (every thread one part); a decode step by A's 8-row groups (R = 16: two tasks).
  job.by_tokens = t >= 2 * pool.n_threads();
  job.n_before = job.by_tokens ? pool.n_threads() : (l.r + detail::kGroup - 1) / detail::kGroup;
  job.before_left.store(job.n_before);
  MatmulHooks hooks;
  hooks.n_before = job.n_before;
  hooks.before = [](void* ctx, int64_t i, const void* xq) { static_cast<Job*>(ctx)->before(i, xq); };
  hooks.after = [](void* ctx, int64_t r0, int64_t r1) { static_cast<Job*>(ctx)->after(r0, r1); };
  hooks.ctx = &job;
  matmul(pool, w, x, y, t, hooks);
}

}  // namespace tessera::cpu
