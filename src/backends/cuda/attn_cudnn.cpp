// cuDNN-frontend SDPA for causal prefill (attn_cudnn.h). Built with TESSERA_HAVE_CUDNN only (CMake TESSERA_CUDNN);
// without it every entry point reports the feature unavailable.
#include "backends/cuda/attn_cudnn.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/executor_common.h"
#include "core/error.h"

#if TESSERA_HAVE_CUDNN
#include <dlfcn.h>

#include <chrono>
#include <map>
#include <tuple>
#include <unordered_map>

#include "backends/cuda/memory.h"
#include "cudnn_frontend.h"

// The frontend's dynamic loading resolves every cuDNN call through this handle (set once, by load_library below).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace tessera::cuda {

#if !TESSERA_HAVE_CUDNN

bool cudnn_attention_available(std::string* why) {
  if (why)
    *why = env_switched_off("TESSERA_CUDA_CUDNN")
               ? "switched off by TESSERA_CUDA_CUDNN=0"
               : "this build has no cuDNN attention (configure with -DTESSERA_CUDNN=ON and the cuDNN frontend)";
  return false;
}

struct CudnnAttnWorkspace::Impl {};

CudnnAttnWorkspace::CudnnAttnWorkspace(int64_t) {
  std::string why;
  cudnn_attention_available(&why);
  fail("cuDNN attention is unavailable: {}", why);
}
CudnnAttnWorkspace::~CudnnAttnWorkspace() = default;
int64_t CudnnAttnWorkspace::max_t() const { return 0; }
void CudnnAttnWorkspace::prepare(const KvCacheView&, int64_t, int64_t, int64_t, int64_t, float) {}
int64_t CudnnAttnWorkspace::graphs_built() const { return 0; }
double CudnnAttnWorkspace::build_ms() const { return 0; }

void attn_prefill_cudnn(const void*, int64_t, const KvCacheView&, int64_t, int64_t, int64_t, void*, int64_t, float,
                        CudnnAttnWorkspace&, cudaStream_t) {
  fail("attn_prefill_cudnn: this build has no cuDNN attention");
}

#else  // TESSERA_HAVE_CUDNN

namespace fe = cudnn_frontend;

namespace {

// The device half of availability, checked on every call (the current device can change).
bool device_is_hopper(std::string* why) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();  // a failed query must not poison the next checked call
    if (why) *why = "no usable CUDA device";
    return false;
  }
  if (major != 9) {
    if (why) *why = "the GPU is sm_" + std::to_string(major * 10 + minor) + ", not Hopper (sm_90)";
    return false;
  }
  return true;
}

// Loads libcudnn once per process. The frontend's own CUDA runtime calls also go through dlopen; it tries
// libcudart.so.12 before .so.13 and takes the first it finds, so name the major we were built with (the one this
// process already has loaded), unless the user chose one.
struct Library {
  bool ok = false;
  std::string why;
  size_t version = 0;
};

const Library& load_library() {
  static const Library lib = [] {
    Library l;
    const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), /*overwrite=*/0);
    const char* env = std::getenv("TESSERA_CUDNN_LIB");
    const std::string name = env != nullptr && *env != '\0' ? env : "libcudnn.so.9";
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      l.why = "cannot load " + name + " (" + (e ? e : "unknown error") +
              "; set TESSERA_CUDNN_LIB or LD_LIBRARY_PATH to cuDNN 9's library)";
      return l;
    }
    using GetVersion = size_t (*)();
    auto get_version = reinterpret_cast<GetVersion>(dlsym(h, "cudnnGetVersion"));
    if (get_version == nullptr) {
      l.why = name + " has no cudnnGetVersion: not a cuDNN library";
      return l;
    }
    l.version = get_version();
    if (l.version / 10000 != CUDNN_MAJOR) {  // 9.x.y is 9xyyy since cuDNN 9
      l.why = name + " is cuDNN " + std::to_string(l.version) + ", built against major " + std::to_string(CUDNN_MAJOR);
      return l;
    }
    fe::cudnn_dlhandle = h;
    l.ok = true;
    return l;
  }();
  return lib;
}

enum Uid : int64_t { UID_Q = 1, UID_K = 2, UID_V = 3, UID_O = 4, UID_SEQ_Q = 5, UID_SEQ_KV = 6 };

// Everything that changes the built graph. Pointers are not part of it: they are bound at execute time.
struct ShapeKey {
  DType dtype;
  int64_t n_head, n_kv, hd, t, s_kv, ld_q, n_ctx;  // variable-length: t = max_t, s_kv = n_ctx
  uint32_t scale_bits;
  bool varlen;
  auto tie() const { return std::tie(dtype, n_head, n_kv, hd, t, s_kv, ld_q, n_ctx, scale_bits, varlen); }
  bool operator<(const ShapeKey& o) const { return tie() < o.tie(); }
};

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

void check_fe(const fe::error_t& e, const char* step, const ShapeKey& k) {
  if (e.is_good()) return;
  fail("cuDNN attention ({} q heads, {} kv heads, hd {}, {} rows over {} keys): {} failed: {}", k.n_head, k.n_kv, k.hd,
       k.t, k.s_kv, step, e.err_msg);
}

ShapeKey make_key(const KvCacheView& cache, int64_t ld_q, int64_t p0, int64_t t, int64_t n_head, float scale,
                  int64_t max_t) {
  TESSERA_CHECK(cache.dtype == DType::BF16 || cache.dtype == DType::F16,
                "attn_prefill_cudnn: the KV cache is {}, but cuDNN attention takes a bf16 or f16 cache",
                dtype_name(cache.dtype));
  TESSERA_CHECK(cache.hd == 64 || cache.hd == 128, "attn_prefill_cudnn: head size {} is not 64 or 128", cache.hd);
  TESSERA_CHECK(cache.n_kv > 0 && n_head > 0 && n_head % cache.n_kv == 0,
                "attn_prefill_cudnn: {} query heads are not a multiple of {} kv heads", n_head, cache.n_kv);
  TESSERA_CHECK(t > 0 && p0 >= 0 && p0 + t <= cache.n_ctx,
                "attn_prefill_cudnn: rows {}..{} are outside the cache's {} positions", p0, p0 + t - 1, cache.n_ctx);
  TESSERA_CHECK(ld_q >= n_head * cache.hd && ld_q % 8 == 0,
                "attn_prefill_cudnn: q row stride {} is below {} heads x {} or not a multiple of 8 elements", ld_q,
                n_head, cache.hd);
  uint32_t bits = 0;
  std::memcpy(&bits, &scale, sizeof bits);
  if (max_t > 0) {
    TESSERA_CHECK(t <= max_t, "attn_prefill_cudnn: {} rows exceed the workspace's max_t {}", t, max_t);
    return ShapeKey{cache.dtype, n_head, cache.n_kv, cache.hd, max_t, cache.n_ctx, ld_q, cache.n_ctx, bits, true};
  }
  return ShapeKey{cache.dtype, n_head, cache.n_kv, cache.hd, t, p0 + t, ld_q, cache.n_ctx, bits, false};
}

}  // namespace

struct CudnnAttnWorkspace::Impl {
  std::mutex mu;
  int64_t max_t = 0;
  DeviceBuffer lengths;  // variable-length mode: int32 t at byte 0, p0 + t at byte 16 (16-byte aligned operands)
  cudnnHandle_t handle = nullptr;
  std::map<ShapeKey, Built> graphs;
  DeviceBuffer workspace;
  double build_ms = 0;

  // The graph for `k`: Q [1, n_head, t, hd] with rows ld_q apart, K and V [1, n_kv, s_kv, hd] inside the cache slot
  // (rows hd apart, heads n_ctx * hd apart), O [1, n_head, t, hd] row-major [t, n_head * hd].
  Built& get(const ShapeKey& k, cudaStream_t stream) {
    if (auto it = graphs.find(k); it != graphs.end()) return it->second;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (stream != nullptr) TESSERA_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
    TESSERA_CHECK(cap == cudaStreamCaptureStatusNone,
                  "attn_prefill_cudnn: shape ({} rows over {} keys) first seen during CUDA graph capture; call "
                  "CudnnAttnWorkspace::prepare before capturing",
                  k.t, k.s_kv);
    const auto t0 = std::chrono::steady_clock::now();
    const auto io = k.dtype == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = g->tensor(fe::graph::Tensor_attributes()
                           .set_name("Q")
                           .set_uid(UID_Q)
                           .set_dim({1, k.n_head, k.t, k.hd})
                           .set_stride({k.t * k.ld_q, k.hd, k.ld_q, 1}));
    const std::vector<int64_t> kv_dim = {1, k.n_kv, k.s_kv, k.hd};
    const std::vector<int64_t> kv_stride = {k.n_kv * k.n_ctx * k.hd, k.n_ctx * k.hd, k.hd, 1};
    auto kt =
        g->tensor(fe::graph::Tensor_attributes().set_name("K").set_uid(UID_K).set_dim(kv_dim).set_stride(kv_stride));
    auto vt =
        g->tensor(fe::graph::Tensor_attributes().set_name("V").set_uid(UID_V).set_dim(kv_dim).set_stride(kv_stride));
    float scale = 0;
    std::memcpy(&scale, &k.scale_bits, sizeof scale);
    auto attrs = fe::graph::SDPA_attributes().set_name("prefill").set_generate_stats(false).set_attn_scale(scale);
    // Row i may see keys [0, p0 + i]: the diagonal through the bottom-right corner of the t x s_kv score matrix
    // (with the padding mask: of the actual lengths, per sequence). With p0 = 0 that is the ordinary (top-left)
    // causal mask, which every cuDNN 9 engine takes.
    if (k.varlen) {
      auto len = [&](const char* name, int64_t uid) {
        return g->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({1, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_data_type(fe::DataType_t::INT32));
      };
      attrs.set_padding_mask(true)
          .set_seq_len_q(len("seq_len_q", UID_SEQ_Q))
          .set_seq_len_kv(len("seq_len_kv", UID_SEQ_KV));
      attrs.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT).set_diagonal_band_right_bound(0);
    } else if (k.s_kv == k.t)
      attrs.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    else
      attrs.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT).set_diagonal_band_right_bound(0);
    auto [o, stats] = g->sdpa(q, kt, vt, attrs);
    (void)stats;
    o->set_output(true)
        .set_uid(UID_O)
        .set_dim({1, k.n_head, k.t, k.hd})
        .set_stride({k.t * k.n_head * k.hd, k.hd, k.n_head * k.hd, 1});
    check_fe(g->validate(), "validate", k);
    check_fe(g->build_operation_graph(handle), "build_operation_graph", k);
    check_fe(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans", k);
    check_fe(g->check_support(), "check_support", k);
    check_fe(g->build_plans(), "build_plans", k);
    Built b;
    b.graph = g;
    check_fe(g->get_workspace_size(b.workspace_bytes), "get_workspace_size", k);
    if (static_cast<size_t>(b.workspace_bytes) > workspace.bytes()) {
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());  // the old buffer may still be in use by queued launches
      workspace = DeviceBuffer(static_cast<size_t>(b.workspace_bytes));
    }
    build_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return graphs.emplace(k, std::move(b)).first->second;
  }
};

bool cudnn_attention_available(std::string* why) {
  if (env_switched_off("TESSERA_CUDA_CUDNN")) {
    if (why) *why = "switched off by TESSERA_CUDA_CUDNN=0";
    return false;
  }
  const Library& lib = load_library();
  if (!lib.ok) {
    if (why) *why = lib.why;
    return false;
  }
  return device_is_hopper(why);
}

CudnnAttnWorkspace::CudnnAttnWorkspace(int64_t max_t) : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!cudnn_attention_available(&why)) fail("cuDNN attention is unavailable: {}", why);
  TESSERA_CHECK(max_t >= 0, "cuDNN attention: max_t {} is negative", max_t);
  impl_->max_t = max_t;
  if (max_t > 0) impl_->lengths = DeviceBuffer(32);
  try {
    const cudnnStatus_t st = fe::detail::create_handle(&impl_->handle);
    if (st != CUDNN_STATUS_SUCCESS) fail("cuDNN attention: cudnnCreate failed with status {}", static_cast<int>(st));
  } catch (const std::runtime_error& e) {  // the frontend throws when a symbol or libcudart cannot be loaded
    fail("cuDNN attention: cudnnCreate failed: {}", e.what());
  }
}

CudnnAttnWorkspace::~CudnnAttnWorkspace() {
  if (impl_ && impl_->handle != nullptr) {
    impl_->graphs.clear();
    (void)fe::detail::destroy_handle(impl_->handle);
  }
}

void CudnnAttnWorkspace::prepare(const KvCacheView& cache, int64_t ld_q, int64_t p0, int64_t t, int64_t n_head,
                                 float scale) {
  const ShapeKey k = make_key(cache, ld_q, p0, t, n_head, scale, impl_->max_t);
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    impl_->get(k, nullptr);
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e) != nullptr) throw;
    fail("cuDNN attention: building the graph failed: {}", e.what());
  }
}

int64_t CudnnAttnWorkspace::max_t() const { return impl_->max_t; }

int64_t CudnnAttnWorkspace::graphs_built() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int64_t>(impl_->graphs.size());
}

double CudnnAttnWorkspace::build_ms() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->build_ms;
}

void attn_prefill_cudnn(const void* q, int64_t ld_q, const KvCacheView& cache, int64_t seq, int64_t p0, int64_t t,
                        void* out, int64_t n_head, float scale, CudnnAttnWorkspace& ws, cudaStream_t stream) {
  CudnnAttnWorkspace::Impl& im = ws.impl();
  const ShapeKey k = make_key(cache, ld_q, p0, t, n_head, scale, im.max_t);
  TESSERA_CHECK(seq >= 0 && seq < cache.n_seq, "attn_prefill_cudnn: slot {} is outside the cache's {} slots", seq,
                cache.n_seq);
  TESSERA_CHECK(reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
                "attn_prefill_cudnn: q and out must be 16-byte aligned");
  const size_t slot_bytes = static_cast<size_t>(seq * cache.seq_stride()) * 2;  // 16-bit cache
  void* kp = static_cast<char*>(cache.k) + slot_bytes;
  void* vp = static_cast<char*>(cache.v) + slot_bytes;
  std::lock_guard<std::mutex> lock(im.mu);
  try {
    Built& b = im.get(k, stream);
    std::unordered_map<int64_t, void*> pack = {{UID_Q, const_cast<void*>(q)}, {UID_K, kp}, {UID_V, vp}, {UID_O, out}};
    if (k.varlen) {
      // A pageable copy this small is written into the stream's command buffer at the call, so `lens` may go out of
      // scope at once; stream order puts it before cuDNN's kernel and after the previous call's.
      const int32_t lens[5] = {static_cast<int32_t>(t), 0, 0, 0, static_cast<int32_t>(p0 + t)};
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(im.lengths.get(), lens, sizeof lens, cudaMemcpyHostToDevice, stream));
      pack[UID_SEQ_Q] = im.lengths.get();
      pack[UID_SEQ_KV] = im.lengths.as<char>() + 16;
    }
    const cudnnStatus_t st = fe::detail::set_stream(im.handle, stream);
    TESSERA_CHECK(st == CUDNN_STATUS_SUCCESS, "attn_prefill_cudnn: cudnnSetStream failed with status {}",
                  static_cast<int>(st));
    check_fe(b.graph->execute(im.handle, pack, im.workspace.get()), "execute", k);
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e) != nullptr) throw;
    fail("attn_prefill_cudnn: cuDNN failed: {}", e.what());
  }
}

#endif  // TESSERA_HAVE_CUDNN

}  // namespace tessera::cuda
