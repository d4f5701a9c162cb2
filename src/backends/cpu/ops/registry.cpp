// The registry of per-op CPU kernels (op_kernel.h). It lives in tessera_cpu_ops with the kernels, a library linked
// whole into every binary (src/CMakeLists.txt): a kernel file is referenced by nothing but its own static initializer,
// which a plain static library would drop.
#include <array>
#include <cstdio>
#include <cstdlib>

#include "backends/cpu/op_kernel.h"

namespace tessera::cpu {

namespace {

// Built on first use: kernels register from static initializers, in an order no one controls.
std::array<OpKernel, static_cast<size_t>(graph::Op::COUNT)>& registry() {
  static std::array<OpKernel, static_cast<size_t>(graph::Op::COUNT)> r{};
  return r;
}

}  // namespace

bool register_op_kernel(graph::Op op, OpKernel kernel) {
  const auto i = static_cast<size_t>(op);
  // Static initialization: an exception here would end the process without a word, so say why first.
  if (i >= registry().size() || kernel.run == nullptr || registry()[i].run != nullptr) {
    std::fprintf(stderr,
                 "tessera: bug: a CPU kernel for op %zu is registered twice, has no run function or names no op\n", i);
    std::abort();
  }
  registry()[i] = kernel;
  return true;
}

const OpKernel* find_op_kernel(graph::Op op) {
  const auto i = static_cast<size_t>(op);
  if (i >= registry().size() || registry()[i].run == nullptr) return nullptr;
  return &registry()[i];
}

}  // namespace tessera::cpu
