// matmul entry points: weight preparation, ISA dispatch, threading, and the scalar reference.
//
// Accuracy of the quantized paths (8-bit activations): x is rounded to int8 per block of 32 with scale
// d = amax/127, an error of at most d/2 per element. Measured against matmul_ref (f64, float x, same dequantized
// weights) on uniform random data, 256 outputs x 8 tokens (bench: tessera_bench_kernels --benchmark_filter=accuracy):
//   q4_1 / q8_0 / q4_0, K = 576:  normalized MSE 1.47e-5, max|err|/max|ref| 3.3e-3, mean|err|/mean|ref| 3.9e-3
//   q4_1 / q8_0 / q4_0, K = 4096: normalized MSE 1.39e-5, max|err|/max|ref| 3.7e-3, mean|err|/mean|ref| 3.7e-3
//   q2_K .. q6_K,       K = 4096: normalized MSE 1.38e-5 .. 1.39e-5, max|err|/max|ref| 3.6e-3 .. 4.0e-3
// in line with the model (d^2/12) / E[x^2] = 1.6e-5, and the same for every weight format (the error is the
// activations'); ggml accepts 5e-4 for this scheme. tests/backends/cpu/test_matmul.cpp checks the worst-case bound.
#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels/matmul_internal.h"
#include "backends/cpu/kernels/matmul_kquant.h"
#include "backends/cpu/kernels/matmul_q5iq4.h"
#include "backends/cpu/kernels/matmul_ternary.h"
#include "core/error.h"
#include "core/large_alloc.h"
#include "quant/quant.h"

namespace tessera::cpu {
namespace {

using detail::BlockQ8A;
using detail::kBlock;
using detail::kGroup;

// The quantized formats read with 8-bit activations (blocks of 32; repacked 8 rows at a time on AVX2).
bool is_quantized_matmul_dtype(DType t) { return matmul_formats().is_native_quantized(t); }

void check_shape(DType dtype, int64_t n, int64_t k) {
  TESSERA_CHECK(matmul_supports(dtype), "matmul: weight dtype {} is not supported on the CPU ({} are)",
                dtype_name(dtype), matmul_formats().native_names());
  TESSERA_CHECK(n > 0 && k > 0, "matmul: weight shape [{}, {}] must be positive", n, k);
  TESSERA_CHECK(!is_quantized_matmul_dtype(dtype) || k % dtype_info(dtype).block_size == 0,
                "matmul: {} weight rows of {} elements are not a whole number of {}-element blocks", dtype_name(dtype),
                k, dtype_info(dtype).block_size);
  TESSERA_CHECK(n < (int64_t{1} << 40) && k < (int64_t{1} << 32), "matmul: weight shape [{}, {}] is too large", n, k);
}

// Per-thread activation buffer: matmul is called from one thread per pool, and decode must not allocate per op.
BlockQ8A* act_scratch(size_t blocks) {
  thread_local std::vector<BlockQ8A> buf;
  if (buf.size() < blocks) buf.resize(blocks);
  return buf.data();
}

}  // namespace

const FormatSupport& matmul_formats() {
  // One kernel family per format below (kernels/matmul_*.cpp; the quantized ones also in repack.cpp's layouts).
  static const FormatSupport table("cpu",
                                   {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                    DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS,           // matmul_q5iq4.h
                                    DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,  // matmul_kquant.h
                                    DType::TQ1_0, DType::TQ2_0},  // matmul_ternary.h
                                   DType::F16);
  return table;
}

bool matmul_supports(DType dtype) { return matmul_formats().is_native(dtype); }

PackedWeight prepare_weight(DType dtype, const void* data, int64_t n, int64_t k) {
  check_shape(dtype, n, k);
  TESSERA_CHECK(data != nullptr, "matmul: weight [{}, {}] has no data", n, k);
  PackedWeight w;
  w.dtype = dtype;
  w.n = n;
  w.k = k;
  w.rows = data;
  // The interleaved layout beats reading the file's rows in place on every shape measured (bench/bench_layout.cpp,
  // q4_1, one thread, CPU time): 3.3x at T = 1 (1536x576: 9.3 vs 30 us; 2048x2048: 45 vs 146 us, weights in L3) and
  // 4.5x at T = 8..64 (8 outputs per pass without horizontal sums; weights unpacked once for several tokens). The copy
  // costs the weights' size in RAM once; the file's pages stay clean and can be dropped by the kernel.
  if (is_quantized_matmul_dtype(dtype) && active_isa() >= Isa::AVX2) {
    const uint64_t bytes = detail::repack_x8_bytes(dtype, n, k);
    std::shared_ptr<void> owner = allocate_large(bytes);  // huge pages: decode streams it every token
    void* mem = owner.get();
    detail::repack_x8(dtype, data, n, k, mem);
    w.layout = WeightLayout::ROWS_X8;
    w.packed = mem;
    w.packed_bytes = bytes;
    w.storage = std::move(owner);
  }
  return w;
}

detail::RowKernel detail::row_kernel(const PackedWeight& w) {
  RowKernel kernel = nullptr;
  const Isa isa = active_isa();
  if (isa >= Isa::AVX2) {
    if (!is_quantized_matmul_dtype(w.dtype)) {
      kernel = avx2_float_kernel(w.dtype, w.layout);
    } else if (isa == Isa::AVX512_VNNI) {
      kernel = avx512_quant_kernel(w.dtype, w.layout);
    } else if (isa == Isa::AVX2_VNNI) {
      kernel = avxvnni_quant_kernel(w.dtype, w.layout);
    } else {
      kernel = avx2_quant_kernel(w.dtype, w.layout);
    }
  }
  if (kernel == nullptr && is_ternary(w.dtype)) kernel = ternary_kernel(isa, w.dtype, w.layout);
  if (kernel == nullptr && is_kquant(w.dtype)) kernel = kquant_kernel(isa, w.dtype, w.layout);
  if (kernel == nullptr && is_q5iq4(w.dtype))  // q5_0, q5_1, iq4_nl, iq4_xs (matmul_q5iq4.h)
    kernel = q5iq4_kernel(w.layout == WeightLayout::ROWS_X8 ? isa : Isa::SCALAR, w.dtype);
  if (kernel == nullptr) kernel = scalar_kernel(w.dtype);  // also the path for a repacked weight on scalar
  TESSERA_CHECK(kernel != nullptr, "matmul: no CPU kernel for weight dtype {}", dtype_name(w.dtype));
  return kernel;
}

void matmul(ThreadPool& pool, const PackedWeight& w, const float* x, float* y, int64_t t) {
  matmul(pool, w, x, y, t, MatmulHooks{});
}

void matmul(ThreadPool& pool, const PackedWeight& w, const float* x, float* y, int64_t t, const MatmulHooks& hooks) {
  TESSERA_CHECK(w.rows != nullptr, "matmul: the weight was not prepared (call prepare_weight first)");
  TESSERA_CHECK(t > 0, "matmul: {} tokens; expected at least one", t);
  TESSERA_CHECK(x != nullptr && y != nullptr, "matmul: null input or output");
  const int64_t n = w.n, k = w.k;

  const detail::RowKernel kernel = detail::row_kernel(w);
  const Isa isa = active_isa();

  detail::MatmulArgs a{&w, x, nullptr, y, t};
  // Where the matmul is not a job of row tasks (OpenBLAS, inline), the hooks' tasks run around it on this thread.
  int64_t n_before = hooks.n_before;
  const auto run_befores = [&] {
    for (int64_t i = 0; i < n_before; ++i) hooks.before(hooks.ctx, i, a.xq);
    n_before = 0;
  };
  if (w.dtype == DType::F32 && isa >= Isa::AVX2 && t >= detail::kBlasMinTokens) {
    run_befores();
    if (detail::matmul_f32_blas(pool, static_cast<const float*>(w.rows), x, y, t, n, k)) {
      if (hooks.after != nullptr) hooks.after(hooks.ctx, 0, n);
      return;
    }
  }

  if (is_quantized_matmul_dtype(w.dtype)) {
    const int64_t kb = k / kBlock;
    BlockQ8A* xq = act_scratch(static_cast<size_t>(t * kb));
    auto quantize = isa >= Isa::AVX2 ? detail::quantize_act_avx2 : detail::quantize_act_scalar;
    if (t == 1) {
      quantize(x, xq, k);  // microseconds: not worth a dispatch
    } else {
      pool.parallel_for(t, [&](int64_t i, int) { quantize(x + i * k, xq + i * kb, k); });
    }
    a.xq = xq;
    if (detail::kquant_needs_half_sums(w.dtype)) {
      thread_local std::vector<float> half_sums;
      half_sums.resize(static_cast<size_t>(2 * t * kb));
      detail::kquant_half_sums(xq, half_sums.data(), t * kb);
      a.xsum16 = half_sums.data();
    }
  }

  // Tasks are ranges of 8-row groups (the interleave unit; 16 rows for AVX-512). Aim for ~4 tasks per thread so the
  // dynamic schedule can balance a core that another process slows down, but keep each task >= ~16 KiB of weights (T =
  // 1) so the shared counter and the per-task setup stay in the noise. The AVX-512 quantized kernels take two groups
  // per pass: split in pairs so no task ends on a half-empty pass.
  const int64_t unit = isa == Isa::AVX512_VNNI && w.layout == WeightLayout::ROWS_X8 ? 2 * kGroup : kGroup;
  const int64_t groups = (n + unit - 1) / unit;
  const uint64_t group_bytes = *dtype_row_bytes(w.dtype, static_cast<uint64_t>(k)) * static_cast<uint64_t>(unit);
  const int64_t min_groups_per_task =
      t >= 4 ? 1 : std::max<int64_t>(1, static_cast<int64_t>((16 * 1024) / std::max<uint64_t>(group_bytes, 1)));
  int64_t tasks = std::min<int64_t>(groups / min_groups_per_task, int64_t{4} * pool.n_threads());
  tasks = std::max<int64_t>(tasks, 1);
  // A decode row through a small weight (<= 64 KiB, e.g. an unfused LoRA adapter's A [16, 576] or B [1536, 16] in f16)
  // is a few microseconds on one core, less than waking and joining the other threads costs on a busy machine: run it
  // inline. (The CPU's fused LoRA step runs its adapters inside the base matmul's job instead: kernels/lora.h.)
  if (t == 1 && group_bytes * static_cast<uint64_t>(groups) <= 64 * 1024) {
    run_befores();
    kernel(a, 0, n);
    if (hooks.after != nullptr) hooks.after(hooks.ctx, 0, n);
    return;
  }
  pool.parallel_for(n_before + tasks, [&](int64_t task, int) {
    if (task < n_before) return hooks.before(hooks.ctx, task, a.xq);
    task -= n_before;
    const int64_t g0 = groups * task / tasks, g1 = groups * (task + 1) / tasks;
    const int64_t r0 = g0 * unit, r1 = std::min(g1 * unit, n);
    kernel(a, r0, r1);
    if (hooks.after != nullptr) hooks.after(hooks.ctx, r0, r1);
  });
}

void matmul_ref(DType dtype, const void* w, const float* x, float* y, int64_t t, int64_t n, int64_t k) {
  // Any format Tessera reads: the reference dequantizes, so it also serves formats the kernels lack (q6_K, ...).
  TESSERA_CHECK(can_dequantize(dtype), "matmul: weight dtype {} cannot be read ({})", dtype_name(dtype),
                matmul_formats().summary());
  TESSERA_CHECK(n > 0 && k > 0 && k % dtype_info(dtype).block_size == 0,
                "matmul: {} weight shape [{}, {}] is not positive or not a whole number of blocks per row",
                dtype_name(dtype), n, k);
  TESSERA_CHECK(t > 0, "matmul: {} tokens; expected at least one", t);
  const uint64_t row_bytes = *dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  std::vector<float> wr(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    dequantize_row(dtype, static_cast<const uint8_t*>(w) + static_cast<uint64_t>(j) * row_bytes, wr.data(), k);
    for (int64_t i = 0; i < t; ++i) {
      const float* xi = x + i * k;
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) acc += static_cast<double>(wr[static_cast<size_t>(c)]) * xi[c];
      y[i * n + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace tessera::cpu
