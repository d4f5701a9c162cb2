// tessera dump (docs/TEAL.md): the workload of a few decode steps as .npy + manifest.json, read back by
// python/load_dump.py, which reproduces every output from its input and the weight (read from the GGUF by gguf-py, or
// the dequantized copy with --weights); bad input is one sentence and a non-zero exit, and nothing is written past
// --max-bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace {

using tessera::test::cli_path;
using tessera::test::run_command;

// The python with numpy and gguf-py (the project's .venv, else python3); "" when neither has them.
std::string python_with_gguf() {
  const std::string venv = std::string(TESSERA_SOURCE_DIR) + "/.venv/bin/python";
  std::string ignored;
  for (const std::string& py : {venv, std::string("python3")})
    if (run_command(py + " -c 'import numpy, gguf'", &ignored) == 0) return py;
  return "";
}

TEST(DumpCli, WritesTheWorkloadAndPythonReproducesIt) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const auto dir = std::filesystem::temp_directory_path() / "tessera_dump_cli";
  std::filesystem::remove_all(dir);
  std::string out;
  // The fast path, weights by reference.
  ASSERT_EQ(run_command(cli_path() + " dump -m " + model + " -p 'The capital of France is' --sparsity 0.5 " +
                            "--layers 1-2 --ops q,v,o,up,down --tokens 3 -t 2 -o " + (dir / "fast").string(),
                        &out),
            0)
      << out;
  EXPECT_NE(out.find("achieved activation sparsity 50.0%"), std::string::npos) << out;
  std::ifstream mf(dir / "fast" / "manifest.json");
  const nlohmann::json m = nlohmann::json::parse(mf);
  ASSERT_EQ(m.at("matmuls").size(), 10u);  // 2 layers x 5 ops
  const nlohmann::json& e = m.at("matmuls")[0];
  EXPECT_EQ(e.at("layer"), 1);
  EXPECT_EQ(e.at("block"), "attention");
  EXPECT_EQ(e.at("type"), "q");
  EXPECT_EQ(e.at("x_shape"), nlohmann::json({3, 576}));
  EXPECT_EQ(e.at("weight").at("name"), "blk.1.attn_q.weight");
  EXPECT_EQ(e.at("achieved_sparsity"), nlohmann::json({0.5, 0.5, 0.5}));
  EXPECT_EQ(m.at("positions").size(), 3u);
  // The reference path with the dequantized weights written too.
  ASSERT_EQ(run_command(cli_path() + " dump -m " + model + " -p 'Hello' --sparsity 0.4 --layers 0 --ops k,gate " +
                            "--tokens 2 -t 2 --reference --weights -o " + (dir / "ref").string(),
                        &out),
            0)
      << out;
  EXPECT_TRUE(std::filesystem::exists(dir / "ref" / "blk.0.gate.w.npy"));

  // Bad input: one sentence, non-zero exit, nothing written.
  EXPECT_NE(run_command(cli_path() + " dump -m " + model + " -p hi --ops q,zz -o " + (dir / "bad").string(), &out), 0);
  EXPECT_NE(out.find("unknown op 'zz'"), std::string::npos) << out;
  EXPECT_NE(run_command(cli_path() + " dump -m " + model + " -p hi --layers 5-99 -o " + (dir / "bad").string(), &out),
            0);
  EXPECT_NE(out.find("outside the model's layers 0-29"), std::string::npos) << out;
  EXPECT_NE(
      run_command(cli_path() + " dump -m " + model + " -p hi --weights --max-bytes 1M -o " + (dir / "bad").string(),
                  &out),
      0);
  EXPECT_NE(out.find("more than --max-bytes"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir / "bad"));

  const std::string py = python_with_gguf();
  if (py.empty()) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "python with numpy and gguf is needed to read the dump back";
  }
  const std::string script = std::string(TESSERA_SOURCE_DIR) + "/python/load_dump.py";
  EXPECT_EQ(run_command(py + " " + script + " " + (dir / "fast").string(), &out), 0) << out;
  EXPECT_NE(out.find("0 over"), std::string::npos) << out;
  // f32 kernels on dequantized weights: the outputs are x W^T to float32 rounding.
  EXPECT_EQ(run_command(py + " " + script + " " + (dir / "ref").string() + " --tol 1e-5", &out), 0) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
