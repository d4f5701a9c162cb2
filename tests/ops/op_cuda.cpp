// The CUDA runner: each graph op through the kernel entry points the CUDA executors call for it (kernels.h,
// kernels_rows.h, kernels_family.h), with weights uploaded the way the executors' weight store uploads them (a format
// without a kernel converted to bf16 on the host first).
#include <cstring>

#include "core/error.h"
#include "ops/op_case.h"
#include "quant/quant.h"

#ifdef TESSERA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_test_util.h"
#include "backends/cuda/device_info.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/gemv_sparse.h"
#include "backends/cuda/kernels_family.h"
#include "backends/cuda/kernels_rows.h"
#include "backends/cuda/kernels_ternary.h"
#include "backends/cuda/memory.h"
#endif

namespace tessera::ops_test {

#ifndef TESSERA_HAVE_CUDA

std::string cuda_skip_reason() { return "this build has no CUDA backend"; }
std::optional<std::vector<float>> run_cuda(const OpGraph&) { fail("this build has no CUDA backend"); }

#else

using graph::Op;
using namespace tessera::cuda;

// The kernel tests' GPU check (tests/backends/cuda/cuda_test_util.cpp, built into this binary too).
std::string cuda_skip_reason() { return test::gpu_skip_reason(); }

namespace {

DeviceBuffer to_device(const void* host, size_t bytes) {
  DeviceBuffer b(bytes);
  b.upload(host, bytes);
  return b;
}
DeviceBuffer to_device(const std::vector<uint8_t>& host) { return to_device(host.data(), host.size()); }
// NaN bytes, so an element a kernel fails to write fails the comparison.
DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(bytes);
  b.fill_bytes(0xFF);
  return b;
}
std::vector<float> floats_of(const DeviceBuffer& b, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  b.download(v.data(), v.size() * sizeof(float));
  return v;
}

// As CudaShared::Impl::upload_any: native formats as they are, others converted to bf16 on the host.
DeviceWeight upload(const graph::Tensor& t) {
  const int64_t n = t.shape[0], k = t.shape[1];
  if (gemv_supports(t.dtype)) return upload_weight(t.dtype, t.data, n, k);
  const std::vector<uint8_t> c = convert_for_device(t.dtype, t.data, n, k);
  return upload_weight(device_weight_dtype(t.dtype), c.data(), n, k);
}

std::vector<int32_t> positions(int64_t p0, int64_t t) {
  std::vector<int32_t> p(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(p0 + i);
  return p;
}

KvCacheView view(DType dtype, void* k, void* v, const graph::Tensor& cache) {
  KvCacheView c;
  c.dtype = dtype;
  c.k = k;
  c.v = v;
  c.n_kv = cache.shape[0];
  c.n_ctx = cache.shape[1];
  c.hd = cache.shape[2];
  return c;
}

}  // namespace

std::optional<std::vector<float>> run_cuda(const OpGraph& og) {
  const graph::Node& n = og.node();
  const graph::Graph& g = og.g;
  const auto in = [&](size_t i) -> const graph::Tensor& { return g.tensor(n.inputs.at(i)); };
  const auto input = [&](size_t i) { return to_device(og.inputs.at(in(i).name)); };
  const graph::Tensor& out = g.tensor(n.output);
  const int64_t t = g.n_tokens();
  const cudaStream_t s = nullptr;
  std::vector<float> result;
  switch (n.op) {
    case Op::EMBED: {
      const DeviceWeight w = upload(in(0));
      DeviceBuffer ids = input(1), y = poisoned(out.nbytes());
      cuda::embedding(w, ids.as<int32_t>(), y.as<float>(), t, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::RMSNORM: {
      DeviceBuffer x = input(0), w = to_device(in(1).data, in(1).nbytes()), y = poisoned(out.nbytes());
      cuda::rmsnorm(x.as<float>(), w.as<float>(), y.as<float>(), t, in(0).shape[1], n.params.eps, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::MATMUL: {
      const DeviceWeight w = upload(in(1));
      DeviceBuffer x = input(0), y = poisoned(out.nbytes());
      // The executors' workspace: a dequantization scratch for the quantized formats' cuBLASLt path.
      GemmWorkspace ws(t, w.k, gemv_quantized(w.dtype) ? w.n * w.k : 0);
      cuda::matmul(w, x.as<float>(), y.as<float>(), t, ws, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::SPARSIFY: {
      // The executors' launch: the zeroed rows, and the list the decoder's sparse GEMVs read (built, not compared here:
      // tests/backends/cuda/test_gemv_sparse.cpp checks it).
      const int64_t k = in(0).shape[1];
      DeviceBuffer x = input(0), y = poisoned(out.nbytes());
      DeviceBuffer list(static_cast<size_t>(t * k) * sizeof(SparseEntry)), count(static_cast<size_t>(t) * 4);
      cuda::sparsify(x.as<float>(), y.as<float>(), t, k, n.params.sparsity, n.params.sparse_threshold,
                     list.as<SparseEntry>(), count.as<int32_t>(), nullptr, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::MATMUL_SPARSE: {
      // As the executors: one row of bf16, f16, q8_0, q4_0, q4_1 or q4_K weights takes a sparse GEMV over x's nonzero
      // entries (threshold 0 keeps exactly those: x is already zeroed); other formats and several rows the dense
      // matmul on the zeroed x.
      const DeviceWeight w = upload(in(1));
      DeviceBuffer x = input(0), y = poisoned(out.nbytes());
      if (t == 1 && gemv_sparse_supports(w.dtype) && !gemv_quantized(w.dtype)) {
        // bf16/f16: the channel-major GEMV reads x itself (threshold 0: its nonzero entries).
        const SparseWeight sw = make_sparse_columns(w, s);
        SparseGemvWorkspace ws(w.n);
        gemv_sparse_x(sw, x.as<float>(), 0.0f, y.as<float>(), false, ws, s);
      } else if (t == 1 && (gemv_sparse_supports(w.dtype) || w.dtype == DType::Q4_K)) {
        // Quantized: the list of x's nonzero entries with 8-bit values (the CPU's activation quantization). q4_K:
        // q4_1's walk over a q4_1 copy (q4_k_rows_as_q4_1), as the decoder runs it.
        DeviceWeight w41;
        if (w.dtype == DType::Q4_K) {
          std::vector<uint8_t> q41(static_cast<size_t>(w.n) * *dtype_row_bytes(DType::Q4_1, w.k));
          q4_k_rows_as_q4_1(in(1).data, q41.data(), w.n, w.k);
          w41 = upload_weight(DType::Q4_1, q41.data(), w.n, w.k);
        }
        const SparseWeight sw = make_sparse_weight(w.dtype == DType::Q4_K ? w41 : w, s);
        SparseGemvWorkspace ws(w.n);
        DeviceBuffer list(static_cast<size_t>(w.k) * sizeof(SparseEntry)), count(4);
        DeviceBuffer xz(static_cast<size_t>(w.k) * sizeof(float));
        cuda::sparsify(x.as<float>(), xz.as<float>(), 1, w.k, 0.0f, 0.0f, list.as<SparseEntry>(), count.as<int32_t>(),
                       nullptr, s, true);
        gemv_sparse(sw, list.as<SparseEntry>(), count.as<int32_t>(), y.as<float>(), false, ws, s);
      } else {
        GemmWorkspace ws(t, w.k, gemv_quantized(w.dtype) ? w.n * w.k : 0);
        cuda::matmul(w, x.as<float>(), y.as<float>(), t, ws, s);
      }
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::ROPE: {
      // CUDA rotates q in the launch that stores this token's k and v (rope_store_kv_rows); a one-head f32 scratch
      // cache takes the store.
      const graph::OpParams& p = n.params;
      DeviceBuffer x = input(0), f = to_device(in(2).data, in(2).nbytes());
      const std::vector<int32_t> ph = positions(og.n_past, t);
      DeviceBuffer pos = to_device(ph.data(), ph.size() * 4);
      DeviceBuffer kv = DeviceBuffer(static_cast<size_t>(t * p.head_dim) * 4);
      kv.fill_bytes(0);
      KvCacheView c;
      c.dtype = DType::F32;
      c.n_kv = 1;
      c.n_ctx = og.n_past + t;
      c.hd = p.head_dim;
      DeviceBuffer ck(static_cast<size_t>(c.n_ctx * c.hd) * 4), cv(static_cast<size_t>(c.n_ctx * c.hd) * 4);
      c.k = ck.get();
      c.v = cv.get();
      rope_store_kv_rows(x.as<float>(), p.n_head * p.head_dim, kv.as<float>(), kv.as<float>(), p.head_dim, c,
                         pos.as<int32_t>(), nullptr, t, p.n_head, p.rope_dim, f.as<float>(), p.rope_neox, s);
      synchronize();
      return floats_of(x, out.numel());
    }
    case Op::KV_STORE: {
      // The launch that stores this chunk's keys and values (rope_store_kv_rows), with no rotation (rope_dim 0): v is
      // stored as it is, and the cache under test is the v side; q is a scratch of as many heads as the cache has.
      const graph::Tensor& cache = in(1);
      const graph::OpParams& p = n.params;
      const int64_t width = p.n_head_kv * p.head_dim;
      DeviceBuffer x = input(0), q = DeviceBuffer(static_cast<size_t>(t * width) * 4);
      q.fill_bytes(0);
      DeviceBuffer cv = to_device(og.caches.at(cache.name)), ck = DeviceBuffer(cv.bytes());
      const std::vector<int32_t> ph = positions(og.n_past, t);
      DeviceBuffer pos = to_device(ph.data(), ph.size() * 4);
      const KvCacheView c = view(cache.dtype, ck.get(), cv.get(), cache);
      rope_store_kv_rows(q.as<float>(), width, x.as<float>(), x.as<float>(), width, c, pos.as<int32_t>(), nullptr, t,
                         p.n_head_kv, 0, nullptr, false, s);
      synchronize();
      std::vector<uint8_t> bytes(cv.bytes());
      cv.download(bytes.data(), bytes.size());
      result.resize(static_cast<size_t>(cache.numel()));
      dequantize_row(cache.dtype, bytes.data(), result.data(), cache.numel());
      return result;
    }
    case Op::ATTENTION: {
      // One row: split-K decode attention (the decoder's kernel); more rows: the prefill kernel (an f32 cache takes
      // its FFMA path). Chunks of >= 256 rows with a 16-bit cache take attn_prefill_tma or cuDNN in the executor.
      const graph::OpParams& p = n.params;
      // Head sizes the kernels take (64, 128, 256): others have no CUDA kernel.
      if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return std::nullopt;
      DeviceBuffer q = input(0), y = poisoned(out.nbytes());
      DeviceBuffer ck = to_device(og.caches.at(in(1).name)), cv = to_device(og.caches.at(in(2).name));
      KvCacheView c = view(in(1).dtype, ck.get(), cv.get(), in(1));
      c.window = p.window;  // the kernels mask keys outside a sliding window (as the executors' attention_cache_view)
      if (t == 1) {
        const std::vector<int32_t> ph = positions(og.n_past, 1);
        DeviceBuffer pos = to_device(ph.data(), 4);
        AttnWorkspace ws(p.n_head, c);
        attn_decode(q.as<float>(), c, pos.as<int32_t>(), y.as<float>(), p.n_head, p.attn_scale, ws, s);
      } else {
        attn_prefill(q.as<float>(), p.n_head * p.head_dim, c, 0, og.n_past, t, y.as<float>(), p.n_head, p.attn_scale,
                     s);
      }
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::ADD: {
      DeviceBuffer a = input(0), b = input(1);
      cuda::add(a.as<float>(), b.as<float>(), out.numel(), s);
      synchronize();
      return floats_of(a, out.numel());
    }
    case Op::SWIGLU: {
      DeviceBuffer gt = input(0), up = input(1), y = poisoned(out.nbytes());
      cuda::swiglu(gt.as<float>(), up.as<float>(), y.as<float>(), out.numel(), s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::GEGLU: {
      DeviceBuffer gt = input(0), up = input(1), y = poisoned(out.nbytes());
      const int64_t w = out.shape[1];
      cuda::geglu_rows(gt.as<float>(), up.as<float>(), w, y.as<float>(), t, w, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::HEAD_RMSNORM: {
      DeviceBuffer x = input(0), wt = input(1), y = poisoned(out.nbytes());
      const int64_t w = out.shape[1], hd = n.params.head_dim;
      cuda::head_rmsnorm(x.as<float>(), w, wt.as<float>(), y.as<float>(), t, w / hd, hd, n.params.eps, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::BIAS_ADD: {
      DeviceBuffer x = input(0), b = input(1), y = poisoned(out.nbytes());
      const int64_t w = out.shape[1];
      cuda::bias_add_rows(x.as<float>(), w, b.as<float>(), y.as<float>(), t, w, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::SOFTCAP:
    case Op::SCALE: {
      DeviceBuffer x = input(0), y = poisoned(out.nbytes());
      const int64_t w = out.shape[1];
      if (n.op == Op::SOFTCAP)
        cuda::softcap_rows(x.as<float>(), w, y.as<float>(), t, w, n.params.scale, s);
      else
        cuda::scale_rows(x.as<float>(), w, y.as<float>(), t, w, n.params.scale, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::LAST_ROW: {
      // No kernel: the executor copies the chunk's last row (executor_rows.cpp), as here.
      DeviceBuffer x = input(0), y = poisoned(out.nbytes());
      const int64_t w = in(0).shape[1];
      if (cudaMemcpy(y.get(), x.as<float>() + (t - 1) * w, static_cast<size_t>(w) * 4, cudaMemcpyDeviceToDevice) !=
          cudaSuccess)
        fail("LAST_ROW: cudaMemcpy failed");
      return floats_of(y, out.numel());
    }
    case Op::ACT_QUANT_I8: {
      DeviceBuffer x = input(0), y = poisoned(out.nbytes());
      const int64_t w = out.shape[1];
      cuda::act_quant_i8_rows(x.as<float>(), w, y.as<float>(), t, w, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::RELU2_GLU: {
      DeviceBuffer gt = input(0), up = input(1), y = poisoned(out.nbytes());
      const int64_t w = out.shape[1];
      cuda::relu2_glu_rows(gt.as<float>(), up.as<float>(), w, y.as<float>(), t, w, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    case Op::MLGRU: {
      DeviceBuffer f = input(0), c = input(1), lb = to_device(in(2).data, in(2).nbytes());
      DeviceBuffer st = to_device(og.caches.at(in(3).name)), y = poisoned(out.nbytes());
      cuda::mlgru(f.as<float>(), c.as<float>(), lb.as<float>(), st.as<float>(), y.as<float>(), t, out.shape[1],
                  og.n_past, s);
      synchronize();
      return floats_of(y, out.numel());
    }
    default:  // an op with no CUDA kernel (SLICE: made by the passes only, a view; fused-node rows to come)
      return std::nullopt;
  }
}

#endif

}  // namespace tessera::ops_test
