// The fused-node rows' CUDA runner: a rewritten one-token graph, node by node, through the entry points the CUDA
// decoder (backend_cuda.cpp, CudaDecoder::Impl::compile) calls for each node and fusion: gemv with its GemvInput
// (the norm prologue, the SwiGLU epilogue, stacked weights, the residual accumulate and the next norm's q8 output),
// quantize_q8 for a quantized GEMV's input, rmsnorm, add, swiglu, and a SLICE as a copy of its columns.
#include <cstring>
#include <map>

#include "core/error.h"
#include "ops/op_fused.h"

#ifdef TESSERA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_test_util.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#endif

namespace tessera::ops_test {

#ifndef TESSERA_HAVE_CUDA

std::optional<std::vector<float>> run_cuda_fused(const OpGraph&, const graph::Graph&, std::string*) {
  fail("this build has no CUDA backend");
}

#else

using graph::Op;
using namespace tessera::cuda;

namespace {

// A quantized activation written by a residual GEMV's norm_out epilogue for the norm's readers.
struct Q8Act {
  DeviceBuffer q8, ds, sumsq;
  float eps = 0;
};

DeviceBuffer upload_bytes(const void* host, size_t bytes) {
  DeviceBuffer b(bytes);
  b.upload(host, bytes);
  return b;
}

DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(bytes);
  b.fill_bytes(0xFF);
  return b;
}

DeviceBuffer copy_of(const DeviceBuffer& src) {
  DeviceBuffer b(src.bytes());
  if (cudaMemcpy(b.get(), src.get(), src.bytes(), cudaMemcpyDeviceToDevice) != cudaSuccess)
    fail("fused runner: cudaMemcpy failed");
  return b;
}

}  // namespace

std::optional<std::vector<float>> run_cuda_fused(const OpGraph& og, const graph::Graph& rg, std::string* skipped) {
  TESSERA_CHECK(rg.n_tokens() == 1, "the fused runner runs one-token (decoder) graphs, not {} tokens", rg.n_tokens());
  const cudaStream_t s = nullptr;
  std::map<int, DeviceBuffer> act;  // f32 activations by tensor id
  std::map<int, Q8Act> q8_of;       // quantized inputs written by a producer's epilogue, by the norm's output id
  const auto value = [&](int id) -> DeviceBuffer& {
    auto it = act.find(id);
    if (it != act.end()) return it->second;
    const graph::Tensor& t = rg.tensor(id);
    TESSERA_CHECK(t.kind == graph::TensorKind::INPUT, "fused runner: tensor '{}' has no value", t.name);
    const std::vector<uint8_t>& bytes = og.inputs.at(t.name);
    return act.emplace(id, upload_bytes(bytes.data(), bytes.size())).first->second;
  };
  const auto f32_weight = [&](int id) { return upload_bytes(rg.tensor(id).data, rg.tensor(id).nbytes()); };

  for (const graph::Node& n : rg.nodes()) {
    const graph::Fusion& f = n.fusion;
    const graph::Tensor& out = rg.tensor(n.output);
    switch (n.op) {
      case Op::RMSNORM: {
        if (f.in_producer) break;  // its quantized output was written by its input's producer (norm_out)
        DeviceBuffer w = f32_weight(n.inputs[1]), y = poisoned(out.nbytes());
        cuda::rmsnorm(value(n.inputs[0]).as<float>(), w.as<float>(), y.as<float>(), 1, out.shape[1], n.params.eps, s);
        act.emplace(n.output, std::move(y));
        break;
      }
      case Op::MATMUL: {
        // The stack's members' rows appended (the executors' CudaShared::stack does the same for any row format).
        std::vector<uint8_t> rows;
        int64_t n_rows = 0;
        const graph::Tensor& w0 = rg.tensor(n.inputs[1]);
        for (int i = 0; i < f.n_weights; ++i) {
          const graph::Tensor& wi = rg.tensor(n.inputs[static_cast<size_t>(1 + i)]);
          const auto* p = static_cast<const uint8_t*>(wi.data);
          rows.insert(rows.end(), p, p + wi.nbytes());
          n_rows += wi.shape[0];
        }
        if (!gemv_supports(w0.dtype)) {
          *skipped = "weights in " + std::string(dtype_name(w0.dtype)) + " are converted at load; rows use native ones";
          return std::nullopt;
        }
        const DeviceWeight w = upload_weight(w0.dtype, rows.data(), n_rows, w0.shape[1]);
        GemvInput x;
        DeviceBuffer q8, ds, norm_w;
        if (gemv_quantized(w.dtype)) {
          auto it = q8_of.find(n.inputs[0]);
          if (it != q8_of.end()) {  // the norm before it was folded into the producer: rms-free codes and sums
            x.q8 = it->second.q8.as<int8_t>();
            x.q8_ds = it->second.ds.as<float2>();
            x.rms_sumsq = it->second.sumsq.as<float>();
            x.rms_eps = it->second.eps;
          } else {
            q8 = DeviceBuffer(static_cast<size_t>(w.k));
            ds = DeviceBuffer(static_cast<size_t>(w.k / 32) * sizeof(float2));
            quantize_q8(value(n.inputs[0]).as<float>(), q8.as<int8_t>(), ds.as<float2>(), w.k, s);
            x.q8 = q8.as<int8_t>();
            x.q8_ds = ds.as<float2>();
          }
        } else {
          x.f32 = value(n.inputs[0]).as<float>();
          if (f.norm_weight >= 0) {  // the norm prologue
            norm_w = f32_weight(f.norm_weight);
            x.norm_w = norm_w.as<float>();
            x.norm_eps = f.norm_eps;
          }
        }
        GemvConfig c = gemv_default_config(w.dtype, w.n, w.k);
        bool accumulate = false;
        DeviceBuffer y;
        Q8Act next;
        int next_id = -1;
        if (f.swiglu) {
          if (gemv_quantized(w.dtype)) {
            *skipped = "the quantized SwiGLU epilogue is an option the decoder leaves off";
            return std::nullopt;
          }
          x.swiglu = true;
          y = poisoned(out.nbytes());
        } else if (f.residual >= 0) {
          y = copy_of(value(f.residual));  // y = residual + W·x, as the decoder writes it over the residual
          accumulate = true;
          if (f.norm_out >= 0) {
            const graph::Node& norm = rg.node(rg.tensor(f.norm_out).producer);
            norm_w = f32_weight(norm.inputs.at(1));
            next.q8 = DeviceBuffer(static_cast<size_t>(w.n));
            next.ds = DeviceBuffer(static_cast<size_t>(w.n / 32) * sizeof(float2));
            next.sumsq = DeviceBuffer(static_cast<size_t>(w.n / 32) * sizeof(float));
            next.eps = norm.params.eps;
            x.norm_out_w = norm_w.as<float>();
            x.norm_out_q8 = next.q8.as<int8_t>();
            x.norm_out_ds = next.ds.as<float2>();
            x.norm_out_sumsq = next.sumsq.as<float>();
            next_id = f.norm_out;
            c = gemv_norm_out_config(w.dtype, w.n, w.k);
          }
        } else {
          y = poisoned(out.nbytes());
        }
        gemv(w, x, y.as<float>(), s, &c, accumulate);
        synchronize();
        act.insert_or_assign(n.output, std::move(y));
        if (next_id >= 0) q8_of.emplace(next_id, std::move(next));
        break;
      }
      case Op::SLICE: {
        const graph::Tensor& in = rg.tensor(n.inputs[0]);
        DeviceBuffer y = poisoned(out.nbytes());
        if (cudaMemcpy(y.get(), value(n.inputs[0]).as<float>() + n.params.slice_begin, out.nbytes(),
                       cudaMemcpyDeviceToDevice) != cudaSuccess ||
            in.shape[0] != 1)
          fail("fused runner: SLICE copy failed");
        act.emplace(n.output, std::move(y));
        break;
      }
      case Op::ADD: {
        DeviceBuffer y = copy_of(value(n.inputs[0]));
        cuda::add(y.as<float>(), value(n.inputs[1]).as<float>(), out.numel(), s);
        act.emplace(n.output, std::move(y));
        break;
      }
      case Op::SWIGLU: {
        DeviceBuffer y = poisoned(out.nbytes());
        cuda::swiglu(value(n.inputs[0]).as<float>(), value(n.inputs[1]).as<float>(), y.as<float>(), out.numel(), s);
        act.emplace(n.output, std::move(y));
        break;
      }
      default:
        *skipped = "no fused runner for op " + std::string(graph::op_name(n.op));
        return std::nullopt;
    }
  }
  synchronize();
  // The graph's one marked output (a fused node's output tensor takes the fused nodes' joined name).
  int id = -1;
  for (size_t i = 0; i < rg.tensors().size(); ++i)
    if (rg.tensors()[i].is_output) id = static_cast<int>(i);
  TESSERA_CHECK(id >= 0 && act.count(id), "fused runner: the output of '{}' was not computed", og.node().name);
  std::vector<float> y(static_cast<size_t>(rg.tensor(id).numel()));
  act.at(id).download(y.data(), y.size() * sizeof(float));
  return y;
}

#endif

}  // namespace tessera::ops_test
