// The backends compiled into this binary. The one place that knows which exist: the runtime asks here by name.
#include <string>

#include "backends/backend.h"
#include "backends/cpu/session_cpu.h"
#include "core/error.h"
#ifdef TESSERA_HAVE_CUDA
#include "backends/cuda/session_cuda.h"
#endif

namespace tessera::backend {

namespace {

std::vector<const Backend*> all() {
  std::vector<const Backend*> v{&cpu::cpu_backend()};
#ifdef TESSERA_HAVE_CUDA
  v.push_back(&cuda::cuda_backend());
#endif
  return v;
}

}  // namespace

std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const Backend* b : all()) out.emplace_back(b->name());
  return out;
}

const Backend* find_compiled(std::string_view name) {
  for (const Backend* b : all())
    if (b->name() == name) return b;
  return nullptr;
}

const Backend& get(std::string_view name) {
  for (const Backend* b : all())
    if (b->name() == name) {
      std::string why;
      TESSERA_CHECK(b->available(&why), "device '{}' is not available: {}", name, why);
      return *b;
    }
  if (name == "cuda")
    fail("device 'cuda' is not available: this build of Tessera has no CUDA backend (nvcc was not found at configure "
         "time)");
  std::string list;
  for (const std::string& n : names()) list += (list.empty() ? "" : " or ") + n;
  fail("device '{}' is not supported ({})", name, list);
}

}  // namespace tessera::backend
