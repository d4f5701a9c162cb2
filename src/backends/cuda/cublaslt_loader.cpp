// cuBLASLt opened at run time. Linking libcublasLt (540 MB) made every command, `tessera --help` and `inspect`
// included, map and relocate it at start (~100 ms, ~150 MB RSS on the 2-core dev machine) and kept a binary built
// with CUDA from starting where the CUDA libraries are absent. The engine calls 15 cuBLASLt entry points; this file
// defines each of them (the declarations come from cublasLt.h, so the signatures are checked by the compiler) as a
// forward to the function found in the library, which is dlopen'ed on the first call. Nothing links libcublasLt.
#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/error.h"

namespace {

void* library() {
  static void* handle = [] {
    // The major version we were built against first, so a newer toolkit's library does not shadow it.
    // Then the toolkit's folder this binary was built with, which need not be on the loader's path (linking the
    // library used to put it in the binary's RUNPATH).
    const std::string major = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    for (const std::string& name : {major, std::string("libcublasLt.so"), std::string(TESSERA_CUDA_LIBDIR "/") + major})
      if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    return static_cast<void*>(nullptr);
  }();
  if (handle == nullptr)
    tessera::fail("cuBLASLt is not available: cannot load libcublasLt.so.{} (install the CUDA toolkit's cuBLAS or "
                  "add its lib folder to LD_LIBRARY_PATH)",
                  CUBLAS_VER_MAJOR);
  return handle;
}

template <typename Fn>
Fn resolve(const char* name) {
  void* f = dlsym(library(), name);
  if (f == nullptr) tessera::fail("cuBLASLt is not usable: libcublasLt has no symbol '{}'", name);
  return reinterpret_cast<Fn>(f);
}

}  // namespace

// One forward per entry point: the function pointer is looked up once (thread-safe static initialization).
#define TESSERA_LT_FORWARD(ret, name, params, args)                  \
  extern "C" ret CUBLASWINAPI name params {                          \
    static const auto fn = resolve<ret(CUBLASWINAPI*) params>(#name); \
    return fn args;                                                  \
  }

TESSERA_LT_FORWARD(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * h), (h))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t h), (h))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatmulDescCreate,
                   (cublasLtMatmulDesc_t * d, cublasComputeType_t c, cudaDataType_t s), (d, c, s))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatmulDescSetAttribute,
                   (cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf, size_t n),
                   (d, a, buf, n))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutCreate,
                   (cublasLtMatrixLayout_t * l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld),
                   (l, t, rows, cols, ld))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
                   (cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void* buf, size_t n),
                   (l, a, buf, n))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * p), (p))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
                   (cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void* buf, size_t n),
                   (p, a, buf, n))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
                   (cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                    cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int req,
                    cublasLtMatmulHeuristicResult_t results[], int* found),
                   (h, op, a, b, c, d, pref, req, results, found))
TESSERA_LT_FORWARD(cublasStatus_t, cublasLtMatmul,
                   (cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha, const void* A,
                    cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                    const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                    const cublasLtMatmulAlgo_t* algo, void* ws, size_t ws_bytes, cudaStream_t s),
                   (h, op, alpha, A, a, B, b, beta, C, c, D, d, algo, ws, ws_bytes, s))
TESSERA_LT_FORWARD(const char*, cublasLtGetStatusName, (cublasStatus_t s), (s))
TESSERA_LT_FORWARD(const char*, cublasLtGetStatusString, (cublasStatus_t s), (s))
