#include "backends/cpu/kernels/lora.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <utility>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/matmul_internal.h"
#include "core/error.h"
#include "core/large_alloc.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::cpu {

namespace detail {

void lora_accumulate_rows(const float* u, const LoraBtView& bt, float* y, int64_t t, int64_t c0, int64_t c1) {
  const int64_t r = bt.r, n = bt.n;
  for (int64_t i = 0; i < t; ++i)
    for (int64_t col = c0; col < c1; ++col) {
      float acc = y[i * n + col];
      for (int64_t j = 0; j < r; ++j) {
        const int64_t e = LoraBtView::at(r, j, col);
        float b = 0;
        switch (bt.type) {
          case LoraBt::F16:
            b = fp16_to_f32(static_cast<const uint16_t*>(bt.data)[e]);
            break;
          case LoraBt::I8:
            b = bt.scale[e / 32] * static_cast<float>(static_cast<const int8_t*>(bt.data)[e]);
            break;
          case LoraBt::F32:
            b = static_cast<const float*>(bt.data)[e];
            break;
        }
        acc += u[i * r + j] * b;
      }
      y[i * n + col] = acc;
    }
}

}  // namespace detail

void lora_accumulate(const float* u, const LoraBtView& bt, float* y, int64_t t, int64_t c0, int64_t c1) {
  const Isa isa = active_isa();
  const auto rows = isa == Isa::AVX512_VNNI ? detail::lora_accumulate_rows_avx512
                    : isa >= Isa::AVX2      ? detail::lora_accumulate_rows_avx2
                                            : detail::lora_accumulate_rows;
  rows(u, bt, y, t, c0, c1);
}

LoraWeights make_lora_weights(const std::vector<LoraFactor>& factors, int64_t n, int64_t k, bool q8) {
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
  const DType at = !a_f16 ? DType::F32 : q8 && k % 32 == 0 ? DType::Q8_0 : DType::F16;
  const uint64_t row_bytes = *dtype_row_bytes(at, static_cast<uint64_t>(k));
  l.a_rows.resize(static_cast<size_t>(row_bytes) * static_cast<size_t>(l.r));
  for (int64_t j = 0; j < l.r; ++j)
    quantize_row(at, a.data() + j * k, l.a_rows.data() + static_cast<size_t>(j) * row_bytes, k);
  l.a = prepare_weight(at, l.a_rows.data(), l.r, k);
  // Bᵀ stacked: row j0 + j of adapter i's block is column j of its B [n, r]; f32 first, then written in its type.
  std::vector<float> bt(static_cast<size_t>(l.r * n));
  int64_t j0 = 0;
  for (const LoraFactor& f : factors) {
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < f.r; ++j) bt[static_cast<size_t>((j0 + j) * n + c)] = value(f.b_dtype, f.b, c * f.r + j);
    j0 += f.r;
  }
  l.bt_type = !b_f16 ? LoraBt::F32 : q8 ? LoraBt::I8 : LoraBt::F16;
  // Tiled (LoraBtView::at): every tile kLoraTile wide, the last one's padding zero.
  const int64_t tiles = (n + kLoraTile - 1) / kLoraTile;
  std::vector<float> tiled(static_cast<size_t>(tiles * kLoraTile * l.r), 0.0f);
  for (int64_t j = 0; j < l.r; ++j)
    for (int64_t c = 0; c < n; ++c)
      tiled[static_cast<size_t>(LoraBtView::at(l.r, j, c))] = bt[static_cast<size_t>(j * n + c)];
  const uint64_t elems = tiled.size();
  const uint64_t data_bytes = elems * (l.bt_type == LoraBt::F32   ? sizeof(float)
                                       : l.bt_type == LoraBt::F16 ? sizeof(uint16_t)
                                                                  : 1);
  l.bt_scale_offset = (data_bytes + 63) / 64 * 64;
  l.bt_bytes = l.bt_scale_offset + (l.bt_type == LoraBt::I8 ? elems / 32 * sizeof(float) : 0);
  l.bt = allocate_large(l.bt_bytes);
  auto* data = static_cast<uint8_t*>(l.bt.get());
  if (l.bt_type == LoraBt::F32) {
    std::copy(tiled.begin(), tiled.end(), reinterpret_cast<float*>(data));
  } else if (l.bt_type == LoraBt::F16) {
    for (size_t i = 0; i < tiled.size(); ++i) reinterpret_cast<uint16_t*>(data)[i] = f32_to_fp16(tiled[i]);
  } else {
    // q8_0's rounding per 32 consecutive elements (32 columns of one row): scale amax / 127, round to nearest.
    auto* scale = reinterpret_cast<float*>(data + l.bt_scale_offset);
    for (size_t b = 0; b < elems / 32; ++b) {
      float amax = 0;
      for (size_t e = 32 * b; e < 32 * b + 32; ++e) amax = std::max(amax, std::fabs(tiled[e]));
      const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
      scale[b] = d;
      for (size_t e = 32 * b; e < 32 * b + 32; ++e)
        reinterpret_cast<int8_t*>(data)[e] = static_cast<int8_t>(std::lrint(tiled[e] * id));
    }
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
  bool by_tokens = false;  // the `before` tasks split u by tokens (a chunk), else by rows of A (decode)
  int64_t a_rows_per_task = 0;
  std::atomic<int64_t> before_left{0};
  std::atomic<bool> ready{false};
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>>* pending = nullptr;  // the caller thread's: no allocation per step

  void accumulate(int64_t c0, int64_t c1) const { lora_accumulate(u, l->bt_view(), y, t, c0, c1); }

  void before(int64_t i, const void* xq_base) {
    const LoraWeights& w = *l;
    const int64_t k = w.k, kb = k / detail::kBlock;
    int64_t t0 = 0, t1 = t, r0 = 0, r1 = w.r;
    if (by_tokens) {
      t0 = t * i / n_before;
      t1 = t * (i + 1) / n_before;
    } else {
      r0 = i * a_rows_per_task;
      r1 = std::min(r0 + a_rows_per_task, w.r);
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
    {
      std::lock_guard<std::mutex> lock(mu);
      ready.store(true, std::memory_order_release);
    }
    for (const auto& [c0, c1] : *pending) accumulate(c0, c1);  // no task appends once `ready` is set
  }

  void after(int64_t c0, int64_t c1) {
    if (!ready.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mu);
      if (!ready.load(std::memory_order_relaxed)) {
        pending->emplace_back(c0, c1);
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
  thread_local std::vector<std::pair<int64_t, int64_t>> pending;
  pending.clear();
  Job job;
  job.pending = &pending;
  job.l = &l;
  job.a_kernel = detail::row_kernel(l.a);
  job.a_quantized = l.a.dtype == DType::Q8_0;
  job.x = x;
  job.y = y;
  job.u = u;
  job.t = t;
  // A chunk splits u by tokens (every thread one part); a decode step by A's row passes (the AVX-512 quantized
  // kernels take 16 rows per pass, the others 8: R = 16 is one task there, two here), so no task computes a pass for
  // half its rows.
  job.by_tokens = t >= 2 * pool.n_threads();
  job.a_rows_per_task =
      active_isa() == Isa::AVX512_VNNI && l.a.layout == WeightLayout::ROWS_X8 ? 2 * detail::kGroup : detail::kGroup;
  job.n_before = job.by_tokens ? pool.n_threads() : (l.r + job.a_rows_per_task - 1) / job.a_rows_per_task;
  job.before_left.store(job.n_before);
  MatmulHooks hooks;
  hooks.n_before = job.n_before;
  hooks.before = [](void* ctx, int64_t i, const void* xq) { static_cast<Job*>(ctx)->before(i, xq); };
  hooks.after = [](void* ctx, int64_t r0, int64_t r1) { static_cast<Job*>(ctx)->after(r0, r1); };
  hooks.ctx = &job;
  matmul(pool, w, x, y, t, hooks);
}

}  // namespace tessera::cpu
