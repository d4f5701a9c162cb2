// cuDNN-frontend SDPA for causal prefill (attn_cudnn.h). Built with TESSERA_HAVE_CUDNN only (CMake TESSERA_CUDNN);
// without it every entry point reports the feature unavailable.
#include "backends/cuda/attn_cudnn.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_options.h"
#include "core/error.h"

#if TESSERA_HAVE_CUDNN
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

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
    *why = !cuda_options().cudnn
               ? "switched off (CudaOptions::cudnn)"
               : "this build has no cuDNN attention (configure with -DTESSERA_CUDNN=ON and the cuDNN frontend)";
  return false;
}

struct CudnnAttnWorkspace::Impl {};

CudnnAttnWorkspace::CudnnAttnWorkspace(int64_t, const CudnnAttnOptions&) {
  std::string why;
  cudnn_attention_available(&why);
  fail("cuDNN attention is unavailable: {}", why);
}
CudnnAttnWorkspace::~CudnnAttnWorkspace() = default;
int64_t CudnnAttnWorkspace::max_t() const { return 0; }
const CudnnAttnOptions& CudnnAttnWorkspace::options() const {
  static const CudnnAttnOptions none;
  return none;
}
void CudnnAttnWorkspace::prepare(const KvCacheView&, int64_t, int64_t, int64_t, int64_t, float) {}
int64_t CudnnAttnWorkspace::graphs_built() const { return 0; }
double CudnnAttnWorkspace::build_ms() const { return 0; }
std::vector<CudnnGraphInfo> CudnnAttnWorkspace::graph_info() const { return {}; }
void CudnnAttnWorkspace::force_plan(int64_t) {}

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
  int64_t workspace_bytes = 0;  // the largest of the plans'
  std::vector<int64_t> plan_index;  // the graph's index of each of info.plans
  CudnnGraphInfo info;
};

// Plan timing: two warm-up rounds, then rounds of one timed launch per plan (interleaved, so that clock and thermal
// drift lands on every plan alike) until about this many milliseconds of GPU time, within [kTuneMinRounds,
// kTuneMaxRounds] rounds; each plan's median decides. Another plan replaces the heuristics' first only when it is at
// least kTuneMargin faster (closer is noise, and the first is what every other cuDNN user runs).
constexpr double kTuneBudgetMs = 100;
constexpr int kTuneMinRounds = 5, kTuneMaxRounds = 25;
constexpr double kTuneMargin = 0.01;
// TESSERA_CUDNN_AUTOTUNE=2: at most this many knob variants per graph, and only knobs with at most kKnobValues values.
constexpr int64_t kMaxKnobVariants = 32, kKnobValues = 16;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Two CUDA events, destroyed on every way out.
struct EventPair {
  cudaEvent_t a = nullptr, b = nullptr;
  EventPair() {
    TESSERA_CUDA_CHECK(cudaEventCreate(&a));
    TESSERA_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~EventPair() {
    if (a != nullptr) cudaEventDestroy(a);
    if (b != nullptr) cudaEventDestroy(b);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
};

void check_fe(const fe::error_t& e, const char* step, const ShapeKey& k) {
  if (e.is_good()) return;
  fail("cuDNN attention ({} q heads, {} kv heads, hd {}, {} rows over {} keys): {} failed: {}", k.n_head, k.n_kv, k.hd,
       k.t, k.s_kv, step, e.err_msg);
}

// max_t > 0: the variable-length key, except for p0 = 0 and t = max_t when exact_full (the exact key).
ShapeKey make_key(const KvCacheView& cache, int64_t ld_q, int64_t p0, int64_t t, int64_t n_head, float scale,
                  int64_t max_t, bool exact_full) {
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
    if (!(exact_full && p0 == 0 && t == max_t))
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
  CudnnAttnOptions options;
  int64_t forced = -1;  // force_plan

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
    Built b;
    b.graph = g;
    build_plans(b, k);
    check_fe(g->prepare_variant_pack_template(), "prepare_variant_pack_template", k);
    if (static_cast<size_t>(b.workspace_bytes) > workspace.bytes()) {
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());  // the old buffer may still be in use by queued launches
      workspace = DeviceBuffer(static_cast<size_t>(b.workspace_bytes));
    }
    b.info.t = k.t;
    b.info.s_kv = k.s_kv;
    b.info.varlen = k.varlen;
    b.info.tuned = options.autotune == 0 || b.plan_index.size() == 1;
    b.info.build_ms = ms_since(t0);
    build_ms += b.info.build_ms;
    return graphs.emplace(k, std::move(b)).first->second;
  }

  // The plans of b.graph: the heuristics' configurations in their order, each distinct one (by engine tag) that
  // builds; with autotune off only the first that builds (what build_plans() would pick). With autotune 2, then
  // variants of each engine among them with one knob moved off the heuristics' value.
  void build_plans(Built& b, const ShapeKey& k) {
    fe::graph::Graph& g = *b.graph;
    std::set<std::string> seen;
    std::string failures;
    auto try_build = [&](int64_t i) {
      std::string name;
      if (g.get_plan_name_at_index(i, name).is_bad() || !seen.insert(name).second) return false;
      const fe::error_t st = g.build_plan_at_index(i);
      if (st.is_bad()) {
        if (failures.size() < 2000) failures += "\n  plan " + std::to_string(i) + " (" + name + "): " + st.err_msg;
        return false;
      }
      int64_t ws = 0;
      check_fe(g.get_workspace_size_plan_at_index(i, ws), "get_workspace_size", k);
      b.plan_index.push_back(i);
      b.info.plans.push_back(CudnnPlanInfo{name, ws, -1});
      b.workspace_bytes = std::max(b.workspace_bytes, ws);
      return true;
    };
    const int64_t offered = g.get_execution_plan_count();
    for (int64_t i = 0; i < offered; ++i)
      if (try_build(i) && options.autotune == 0) break;
    if (b.plan_index.empty())
      fail("cuDNN attention ({} q heads, {} kv heads, hd {}, {} rows over {} keys): no plan of {} built:{}", k.n_head,
           k.n_kv, k.hd, k.t, k.s_kv, offered, failures);
    if (options.autotune >= 2) {
      std::set<int64_t> engines;
      int64_t variants = 0;
      const size_t base = b.plan_index.size();
      for (size_t c = 0; c < base && variants < kMaxKnobVariants; ++c) {
        int64_t engine = -1;
        std::unordered_map<fe::KnobType_t, int64_t> chosen;
        if (g.get_engine_and_knobs_at_index(b.plan_index[c], engine, chosen).is_bad() || !engines.insert(engine).second)
          continue;
        std::vector<fe::Knob> knobs;
        if (g.get_knobs_for_engine(engine, knobs).is_bad()) continue;
        for (const fe::Knob& kn : knobs) {
          if (fe::is_frontend_knob_type(kn.type)) continue;
          const int64_t step = std::max<int64_t>(1, kn.stride);
          if (kn.maxValue < kn.minValue || (kn.maxValue - kn.minValue) / step + 1 > kKnobValues) continue;
          for (int64_t v = kn.minValue; v <= kn.maxValue && variants < kMaxKnobVariants; v += step) {
            auto it = chosen.find(kn.type);
            if (it != chosen.end() && it->second == v) continue;
            auto knob_values = chosen;
            knob_values[kn.type] = v;
            const int64_t at = g.get_execution_plan_count();
            if (g.create_execution_plan(engine, knob_values).is_bad()) continue;  // cuDNN refuses the combination
            ++variants;
            try_build(at);
          }
        }
      }
    }
    b.info.configs = g.get_execution_plan_count();
  }

  // Times every plan of b on this call's buffers (pack; lengths already queued) and chooses (kTune* above). Leaves
  // b untouched during stream capture. `stream` is the handle's stream already.
  void tune(Built& b, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (stream != nullptr) TESSERA_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
    if (cap != cudaStreamCaptureStatusNone) return;
    const auto t0 = std::chrono::steady_clock::now();
    const size_t n = b.plan_index.size();
    EventPair ev;
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<bool> ok(n, true);
    std::vector<std::vector<float>> times(n);
    std::string failures;
    auto timed = [&](size_t c) -> float {  // < 0: the plan failed to run
      TESSERA_CUDA_CHECK(cudaEventRecord(ev.a, stream));
      const fe::error_t st = b.graph->execute_plan_at_index(handle, pack, workspace.get(), b.plan_index[c]);
      TESSERA_CUDA_CHECK(cudaEventRecord(ev.b, stream));
      TESSERA_CUDA_CHECK(cudaEventSynchronize(ev.b));
      if (st.is_bad()) {
        (void)cudaGetLastError();  // a refused launch must not poison the next checked call
        if (failures.size() < 2000) failures += "\n  " + b.info.plans[c].name + ": " + st.err_msg;
        return -1;
      }
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a, ev.b));
      return ms;
    };
    double round_ms = 0;
    for (int w = 0; w < 2; ++w) {
      round_ms = 0;
      for (size_t c = 0; c < n; ++c) {
        if (!ok[c]) continue;
        const float ms = timed(c);
        ok[c] = ms >= 0;
        round_ms += std::max(0.0f, ms);
      }
    }
    const int rounds = std::clamp(static_cast<int>(kTuneBudgetMs / std::max(round_ms, 1e-3)), kTuneMinRounds,
                                  kTuneMaxRounds);
    for (int r = 0; r < rounds; ++r)
      for (size_t j = 0; j < n; ++j) {
        const size_t c = (j + static_cast<size_t>(r)) % n;  // rotate the order: no plan always runs first
        if (!ok[c]) continue;
        const float ms = timed(c);
        ok[c] = ms >= 0;
        if (ok[c]) times[c].push_back(ms);
      }
    int64_t best = -1;
    for (size_t c = 0; c < n; ++c) {
      if (!ok[c] || times[c].empty()) continue;
      std::sort(times[c].begin(), times[c].end());
      b.info.plans[c].tune_ms = times[c][times[c].size() / 2];
      if (best < 0 || b.info.plans[c].tune_ms < b.info.plans[static_cast<size_t>(best)].tune_ms)
        best = static_cast<int64_t>(c);
    }
    b.info.tune_ms = ms_since(t0);
    if (best < 0) {
      fail("cuDNN attention ({} rows over {} keys): no plan ran while tuning:{}", b.info.t, b.info.s_kv, failures);
    }
    const double best_ms = b.info.plans[static_cast<size_t>(best)].tune_ms;
    if (best != 0 && ok[0] && best_ms > (1 - kTuneMargin) * b.info.plans[0].tune_ms) best = 0;
    b.info.chosen = best;
    b.info.tuned = true;
  }
};

bool cudnn_attention_available(std::string* why) {
  if (!cuda_options().cudnn) {
    if (why) *why = "switched off (CudaOptions::cudnn)";
    return false;
  }
  const Library& lib = load_library();
  if (!lib.ok) {
    if (why) *why = lib.why;
    return false;
  }
  return device_is_hopper(why);
}

CudnnAttnWorkspace::CudnnAttnWorkspace(int64_t max_t, const CudnnAttnOptions& options)
    : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!cudnn_attention_available(&why)) fail("cuDNN attention is unavailable: {}", why);
  TESSERA_CHECK(max_t >= 0, "cuDNN attention: max_t {} is negative", max_t);
  TESSERA_CHECK(options.autotune >= 0 && options.autotune <= 2, "cuDNN attention: autotune level {} is not 0, 1 or 2",
                options.autotune);
  impl_->max_t = max_t;
  impl_->options = options;
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
  const ShapeKey k = make_key(cache, ld_q, p0, t, n_head, scale, impl_->max_t, impl_->options.exact_full_chunk);
  std::lock_guard<std::mutex> lock(impl_->mu);
  try {
    impl_->get(k, nullptr);
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e) != nullptr) throw;
    fail("cuDNN attention: building the graph failed: {}", e.what());
  }
}

int64_t CudnnAttnWorkspace::max_t() const { return impl_->max_t; }

const CudnnAttnOptions& CudnnAttnWorkspace::options() const { return impl_->options; }

int64_t CudnnAttnWorkspace::graphs_built() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int64_t>(impl_->graphs.size());
}

double CudnnAttnWorkspace::build_ms() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->build_ms;
}

std::vector<CudnnGraphInfo> CudnnAttnWorkspace::graph_info() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<CudnnGraphInfo> out;
  for (const auto& [key, built] : impl_->graphs) out.push_back(built.info);
  return out;
}

void CudnnAttnWorkspace::force_plan(int64_t plan) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->forced = plan < 0 ? -1 : plan;
}

void attn_prefill_cudnn(const void* q, int64_t ld_q, const KvCacheView& cache, int64_t seq, int64_t p0, int64_t t,
                        void* out, int64_t n_head, float scale, CudnnAttnWorkspace& ws, cudaStream_t stream) {
  TESSERA_CHECK(cache.window == 0, "attn_prefill_cudnn: sliding-window attention is attn_prefill's, not cuDNN's");
  CudnnAttnWorkspace::Impl& im = ws.impl();
  const ShapeKey k = make_key(cache, ld_q, p0, t, n_head, scale, im.max_t, im.options.exact_full_chunk);
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
    TESSERA_CHECK(im.forced < static_cast<int64_t>(b.plan_index.size()),
                  "attn_prefill_cudnn: plan {} forced, but this shape's graph has {} plans", im.forced,
                  b.plan_index.size());
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
    // The chosen plan; at the graph's first call outside capture, timed among its candidates first.
    if (im.forced < 0 && !b.info.tuned) im.tune(b, pack, stream);
    const int64_t plan = im.forced >= 0 ? im.forced : b.info.chosen;
    const int64_t index = b.plan_index[static_cast<size_t>(plan)];
    check_fe(b.graph->execute_plan_at_index(im.handle, pack, im.workspace.get(), index), "execute", k);
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e) != nullptr) throw;
    fail("attn_prefill_cudnn: cuDNN failed: {}", e.what());
  }
}

#endif  // TESSERA_HAVE_CUDNN

}  // namespace tessera::cuda
