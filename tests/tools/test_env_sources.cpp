// Options, not environment: the only environment variables src/ may read are the ones a user sets (docs/ENVIRONMENT.md,
// "What a user sets") and, until the executors are wired to CudaOptions, the engine switches listed below. Reads the
// source tree (TESSERA_SOURCE_DIR), so a switch added back, or a removed one read again, fails CI.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// What a user sets: file locations.
const std::set<std::string> kUserVariables = {"TESSERA_HOME", "TESSERA_CUDNN_LIB"};

// Engine switches the CUDA executors (backend_cuda.cpp, executor_rows.cpp, executor_shared.cpp) and the runtime still
// read; each has its CudaOptions field (cuda_options.h). Remove a name here when its reader is wired to the options:
// this list must end empty.

// Switches that became options or whose paths left src/ for bench/cuda/experiments: never read again.
const std::set<std::string> kRemoved = {
    "TESSERA_CUDA_ATTN_V1",      "TESSERA_CUDA_ATTN_V4",
    "TESSERA_CUDA_ATTN_EARLY",   "TESSERA_CUDA_ATTN_CLUSTER",
    "TESSERA_CUDA_ATTN_CHUNK",   "TESSERA_CUDA_ATTN_SHORT",
    "TESSERA_CUDA_ATTN_COMPACT", "TESSERA_CUDA_GEMV_PREV_SHAPES",
    "TESSERA_CUDA_GEMV_SHAPES",  "TESSERA_CUDA_EARLY_L2",
    "TESSERA_CUDA_PDL",          "TESSERA_CUDNN_AUTOTUNE",
    "TESSERA_CUDNN_EXACT_FIRST", "TESSERA_CUDA_CUDNN",
    "TESSERA_CPU_ISA",
    "TESSERA_CUDA_GRAPH",
    "TESSERA_CUDA_FUSE",
    "TESSERA_CUDA_FUSE_ATTN",
    "TESSERA_CUDA_FOLD_NORM",
    "TESSERA_CUDA_FOLD_SWIGLU",
    "TESSERA_CUDA_ATTN_Q8",
    "TESSERA_CUDA_QUANT_SWIGLU",
    "TESSERA_CUDA_QUANT_SWIGLU_TICKETS",
    "TESSERA_CUDA_QUANT_NORM",
    "TESSERA_CUDA_QUANT_NORM_CLUSTERS",
    "TESSERA_CUDA_CHAIN",
    "TESSERA_CUDA_CHAIN_STEPS",
    "TESSERA_CUDA_CHAIN_EMBED",
    "TESSERA_CUDA_SAMPLE",
    "TESSERA_CUDA_DROP_OPS",
    "TESSERA_CUDA_ATTN_TMA",
    "TESSERA_CUDA_X16",
    "TESSERA_CUDA_OUT16",
    "TESSERA_CUDA_MERGE_GATE_UP",
};

bool is_source(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".cpp" || ext == ".h" || ext == ".cu" || ext == ".cuh";
}

TEST(EnvSources, SrcReadsOnlyUserVariables) {
  const fs::path root = fs::path(TESSERA_SOURCE_DIR) / "src";
  ASSERT_TRUE(fs::is_directory(root)) << root << " is missing (is TESSERA_SOURCE_DIR right?)";
  const std::regex literal("\"(TESSERA_[A-Z0-9_]+)\"");
  std::set<std::string> user_seen;
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file() || !is_source(e.path())) continue;
    ++files;
    const std::string text = read_all(e.path());
    const std::string rel = fs::relative(e.path(), root).string();
    for (std::sregex_iterator it(text.begin(), text.end(), literal), end; it != end; ++it) {
      const std::string name = (*it)[1];
      EXPECT_FALSE(kRemoved.count(name)) << rel << " reads " << name << ", which left the environment";
      EXPECT_TRUE(kUserVariables.count(name))
          << rel << " reads " << name << ": an engine choice is an option (cuda_options.h, cpu::BackendOptions), "
          << "not an environment variable";
      if (kUserVariables.count(name)) user_seen.insert(name);
    }
  }
  EXPECT_GT(files, 50) << "the scan found too few files";
  EXPECT_EQ(user_seen, kUserVariables) << "a user variable is no longer read: drop it here and from the docs";
}

// The kernels, their launchers and the CPU backend read no environment at all (cuDNN's library location is the one
// exception: attn_cudnn.cpp).
TEST(EnvSources, KernelsReadNoEnvironment) {
  const fs::path root = fs::path(TESSERA_SOURCE_DIR) / "src" / "backends";
  const std::regex getenv_call("getenv\\s*\\(\\s*\"?([A-Za-z0-9_]*)");
  for (const char* dir : {"cuda/kernels", "cpu"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      if (!e.is_regular_file() || !is_source(e.path())) continue;
      const std::string text = read_all(e.path());
      EXPECT_FALSE(std::regex_search(text, getenv_call)) << e.path() << " calls getenv";
    }
  }
  for (const char* file : {"cuda/attn_cudnn.cpp", "cuda/cuda_options.cpp", "cuda/kernels.h", "cuda/kernels_rows.h"}) {
    const std::string text = read_all(root / file);
    for (std::sregex_iterator it(text.begin(), text.end(), getenv_call), end; it != end; ++it)
      EXPECT_EQ((*it)[1].str(), "TESSERA_CUDNN_LIB") << file << " calls getenv";
  }
}

}  // namespace
