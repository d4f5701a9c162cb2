// A C entry point to the engine's causal prefill-attention kernel (src/backends/cuda/kernels/attn_prefill_tma.cu,
// compiled from the same source) for bench/peer/sdpa_vs_tessera.py, which calls it through ctypes on PyTorch's own
// tensors and alternates it launch by launch with torch's scaled_dot_product_attention: both kernels then run in one
// process, on the same inputs, under the same clocks and power state. Not linked into the engine.
//
// Built with the CUDA build (CMake target tessera_attn_capi: <build>/lib/libtessera_attn_capi.so; the kernel runs on
// sm_90 only, like the engine's).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "backends/cuda/kernels_rows.h"

// The engine defines these in cuda_check.cpp and kernels.cu, which pull in the rest of the library; this bridge
// throws plain exceptions (turned into the error string below) and launches without PDL (one kernel, no chain).
namespace tessera::cuda {
void fail_cuda(cudaError_t err, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA call '") + what + "' failed at " + file + ":" + std::to_string(line) +
                           ": " + cudaGetErrorString(err));
}
void fail_message(const std::string& message) { throw std::runtime_error(message); }
bool pdl_enabled() { return false; }
}  // namespace tessera::cuda

extern "C" {

// out [t][n_head * hd] = causal attention of q [t][ld_q] (rows p0 .. p0 + t - 1) over a cache k, v
// [n_kv][n_ctx][hd] (one sequence), dtype 0 = bf16, 1 = f16, hd 64 or 128. Returns 0, or 1 with the reason in err
// (err_len bytes).
int tessera_attn_prefill_tma(int dtype, const void* q, long long ld_q, void* k, void* v, long long n_ctx,
                             long long n_kv, long long hd, long long p0, long long t, void* out, long long n_head,
                             float scale, void* stream, char* err, int err_len) {
  try {
    if (dtype != 0 && dtype != 1) throw std::invalid_argument("dtype must be 0 (bf16) or 1 (f16)");
    tessera::cuda::KvCacheView cache;
    cache.dtype = dtype == 0 ? tessera::DType::BF16 : tessera::DType::F16;
    cache.k = k;
    cache.v = v;
    cache.n_ctx = n_ctx;
    cache.n_kv = n_kv;
    cache.hd = hd;
    tessera::cuda::attn_prefill_tma(q, ld_q, cache, 0, p0, t, out, n_head, scale,
                                    static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    if (err != nullptr && err_len > 0) std::snprintf(err, static_cast<size_t>(err_len), "%s", e.what());
    return 1;
  }
}

}  // extern "C"
