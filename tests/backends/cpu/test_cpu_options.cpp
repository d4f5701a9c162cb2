// The CPU backend's instruction-set option (BackendOptions::isa, the `--cpu-isa` flag; it replaced TESSERA_CPU_ISA):
// unset, the kernels run the best ISA this CPU has; set, the backend's constructor makes it the active one; names parse
// as isa_name prints them, anything else is an error, and so is an ISA the CPU lacks.
#include <gtest/gtest.h>

#include <memory>

#include "backends/cpu/backend.h"
#include "backends/cpu/cpu_features.h"
#include "cpu_test_util.h"
#include "tessera/error.h"

namespace tessera::cpu::test {
namespace {

TEST(CpuOptions, IsaDefaultsToTheBestThisCpuRuns) {
  EXPECT_FALSE(BackendOptions{}.isa.has_value());
  const IsaScope keep(active_isa());  // restores whatever the other tests left
  set_active_isa(best_isa());
  BackendOptions o;
  o.n_threads = 1;
  const CpuBackend b(o, nullptr);
  EXPECT_EQ(active_isa(), best_isa());
}

TEST(CpuOptions, BackendSetsTheIsaItIsGiven) {
  const IsaScope keep(active_isa());
  for (Isa isa : isas()) {
    SCOPED_TRACE(std::string(isa_name(isa)));
    BackendOptions o;
    o.n_threads = 1;
    o.isa = isa;
    const CpuBackend b(o, nullptr);
    EXPECT_EQ(active_isa(), isa);
  }
}

TEST(CpuOptions, IsaNamesParse) {
  for (Isa isa : {Isa::SCALAR, Isa::AVX2, Isa::AVX2_VNNI, Isa::AVX512_VNNI}) EXPECT_EQ(parse_isa(isa_name(isa)), isa);
  EXPECT_THROW(parse_isa("avx512"), Error);
  EXPECT_THROW(parse_isa(""), Error);
  EXPECT_THROW(parse_isa("AVX2"), Error);
}

TEST(CpuOptions, AnIsaTheCpuLacksIsAnError) {
  const IsaScope keep(active_isa());
  for (Isa isa : {Isa::AVX2, Isa::AVX2_VNNI, Isa::AVX512_VNNI}) {
    if (isa_supported(isa)) continue;
    BackendOptions o;
    o.n_threads = 1;
    o.isa = isa;
    EXPECT_THROW(CpuBackend(o, nullptr), Error) << isa_name(isa);
  }
}

}  // namespace
}  // namespace tessera::cpu::test
