// CUDA is loaded only when used: the `tessera` binary (built with the CUDA backend where nvcc is present) names no
// CUDA library among its dependencies, so it starts, and runs CPU work, where none is installed; cuBLASLt is opened
// when a CUDA matmul first needs it, libcuda by the statically linked runtime on the first CUDA call.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace tessera {
namespace {

TEST(Startup, BinaryNeedsNoCudaLibrary) {
  std::string out;
  if (test::run_command("command -v ldd", &out) != 0) GTEST_SKIP() << "no ldd here";
  ASSERT_EQ(test::run_command("ldd " + test::cli_path(), &out), 0) << out;
  for (const char* lib : {"libcudart", "libcublas", "libcudnn", "libcuda.so"})
    EXPECT_EQ(out.find(lib), std::string::npos) << lib << " is linked:\n" << out;
}

// With no CUDA library on the loader's path at all, CPU commands still run (the loader path is emptied and the
// binary's own RUNPATH names no CUDA folder).
TEST(Startup, CpuCommandsRunWithoutTheCudaLibraries) {
  std::string out;
  ASSERT_EQ(test::run_command("env LD_LIBRARY_PATH= " + test::cli_path() + " --help", &out), 0) << out;
  EXPECT_NE(out.find("inspect"), std::string::npos) << out;
}

// Where the driver is absent, --device cuda says so in one line (the runtime's own text, "CUDA driver version is
// insufficient for CUDA runtime version", reads as an upgrade request), exits 1 and runs nothing.
TEST(Startup, CudaWithoutDriverSaysSoInOneLine) {
  std::string out;
  if (test::run_command("ls /dev/nvidia0 > /dev/null 2>&1", &out) == 0) GTEST_SKIP() << "this machine has a GPU";
  const int rc = test::run_command(test::cli_path() + " run --device cuda -p hi -n 1", &out);
  EXPECT_EQ(rc, 1) << out;
  const bool no_backend = out.find("has no CUDA backend") != std::string::npos;  // a build without nvcc
  EXPECT_TRUE(no_backend || out.find("no NVIDIA GPU or driver found") != std::string::npos) << out;
  EXPECT_EQ(out.find("tessera: error:"), 0u) << out;
}

}  // namespace
}  // namespace tessera
