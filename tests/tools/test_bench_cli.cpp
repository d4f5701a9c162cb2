// `tessera bench`: JSON rows and the text table on the default model (structure and internal consistency, not
// speed), the work each row claims checked against `inspect` and `graph`, ceilings, synthetic models, bad flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

using nlohmann::json;
using tessera::test::cli_path;
using tessera::test::run_command;

int run_stdout(const std::string& args, std::string* out) { return tessera::test::run_cli_stdout(args, out); }

json run_json(const std::string& args) {
  std::string out;
  const int rc = run_stdout(args, &out);
  EXPECT_EQ(rc, 0) << args << "\n" << out;
  return rc == 0 ? json::parse(out) : json();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

TEST(BenchCli, JsonRowsOnDefaultModel) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const json rows = run_json("bench -m " + model + " -p 16 -n 4 -r 3 -t 2 --json --no-ceilings");
  ASSERT_TRUE(rows.is_array());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["test"], "pp16");
  EXPECT_EQ(rows[1]["test"], "tg4");
  for (const json& r : rows) {
    for (const char* k : {"test", "tok_s", "tok_s_stddev", "gbps", "tflops", "samples_tok_s", "n_threads",
                          "peak_host_bytes", "weight_bytes_per_run", "flops_per_run", "model", "device"})
      ASSERT_TRUE(r.contains(k)) << k;
    EXPECT_EQ(r["n_threads"], 2);
    EXPECT_EQ(r["device"], "cpu");
    const std::vector<double> s = r["samples_tok_s"].get<std::vector<double>>();
    ASSERT_EQ(s.size(), 3u);
    for (double x : s) EXPECT_GT(x, 0);
    EXPECT_DOUBLE_EQ(r["tok_s"].get<double>(), median(s));
    EXPECT_GE(r["tok_s_stddev"].get<double>(), 0);
    EXPECT_GT(r["peak_host_bytes"].get<uint64_t>(), 0u);
    // The rates are the work per run times runs per second.
    const double tokens = r["n_prompt"].get<double>() + r["n_gen"].get<double>();
    const double runs_per_s = r["tok_s"].get<double>() / tokens;
    EXPECT_NEAR(r["gbps"].get<double>(), r["weight_bytes_per_run"].get<double>() * runs_per_s / 1e9,
                1e-9 * r["gbps"].get<double>());
    EXPECT_NEAR(r["tflops"].get<double>(), r["flops_per_run"].get<double>() * runs_per_s / 1e12,
                1e-9 * r["tflops"].get<double>());
    EXPECT_TRUE(r["fraction_of_limit"].is_null());  // --no-ceilings
  }

  // Decode reads every tensor of the file once per token (the tied embedding as the output matrix), plus the one
  // embedding row of its token: derived here from `inspect`, independently of the graph's cost model.
  const json info = run_json("inspect -m " + model + " --json");
  double file_bytes = 0, embd_bytes = 0;
  for (const json& t : info["tensors"]) {
    file_bytes += t["bytes"].get<double>();
    if (t["name"] == "token_embd.weight") embd_bytes = t["bytes"].get<double>();
  }
  const double row = embd_bytes / info["n_vocab"].get<double>();
  const double per_token = info["tied_output"].get<bool>() ? file_bytes + row : file_bytes - embd_bytes + row;
  EXPECT_DOUBLE_EQ(rows[1]["weight_bytes_per_run"].get<double>(), 4 * per_token);

  // A one-chunk prefill does exactly the FLOPs of `tessera graph` for that many tokens.
  const json g = run_json("graph -m " + model + " --format json --tokens 16");
  EXPECT_DOUBLE_EQ(rows[0]["flops_per_run"].get<double>(), g["totals"]["flops"].get<double>());
}

// --parallel B (llama.cpp's -np; -b is the logical batch): the tg row decodes B sequences together (one slot each),
// counts B tokens per step, and reads the weights once per step, so its GB/s is the step rate times one step's weight
// bytes.
TEST(BenchCli, BatchedDecodeRow) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const json rows = run_json("bench -m " + model + " -p 8 -n 4 -r 2 -t 2 --parallel 3 --json --no-ceilings");
  ASSERT_TRUE(rows.is_array());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["test"], "pp8");
  EXPECT_EQ(rows[1]["test"], "tg4x3");
  EXPECT_EQ(rows[1]["batch"], 3);
  const json single = run_json("bench -m " + model + " -p 0 -n 4 -r 2 -t 2 --json --no-ceilings");
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0]["batch"], 1);
  // Same weight bytes per run (4 steps), three times the tokens.
  EXPECT_DOUBLE_EQ(rows[1]["weight_bytes_per_run"].get<double>(), single[0]["weight_bytes_per_run"].get<double>());
  const double steps_per_s = rows[1]["tok_s"].get<double>() / 3.0;  // 3 tokens per step
  EXPECT_NEAR(rows[1]["gbps"].get<double>(), rows[1]["weight_bytes_per_run"].get<double>() / 4.0 * steps_per_s / 1e9,
              1e-9 * rows[1]["gbps"].get<double>());
  std::string out;
  EXPECT_EQ(run_command(cli_path() + " bench -m " + model + " --parallel 0 -n 4", &out), 1) << out;
  EXPECT_NE(out.find("tessera: error: "), std::string::npos) << out;
}

// -d D: tg decodes after D cached tokens (the row is named tg<N>@dD and records the depth); its attention FLOPs grow
// with the position, so a deeper row does more FLOPs for the same weight bytes. -d without a tg test, or negative,
// is an error.
TEST(BenchCli, DepthStartsDecodeAfterCachedTokens) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const json deep = run_json("bench -m " + model + " -p 0 -n 4 -d 24 -r 1 -np 2 -t 2 --json --no-ceilings");
  const json flat = run_json("bench -m " + model + " -p 0 -n 4 -r 1 -np 2 -t 2 --json --no-ceilings");
  ASSERT_EQ(deep.size(), 1u);
  ASSERT_EQ(flat.size(), 1u);
  EXPECT_EQ(deep[0]["test"], "tg4x2@d24");
  EXPECT_EQ(deep[0]["depth"], 24);
  EXPECT_EQ(flat[0]["depth"], 0);
  EXPECT_DOUBLE_EQ(deep[0]["weight_bytes_per_run"].get<double>(), flat[0]["weight_bytes_per_run"].get<double>());
  EXPECT_GT(deep[0]["flops_per_run"].get<double>(), flat[0]["flops_per_run"].get<double>());
  std::string out;
  EXPECT_EQ(run_command(cli_path() + " bench -m " + model + " -p 8 -n 0 -d 4", &out), 1) << out;
  EXPECT_NE(out.find("tessera: error: "), std::string::npos) << out;
  EXPECT_EQ(run_command(cli_path() + " bench -m " + model + " -n 4 -d -1", &out), 1) << out;
}

// A recurrent model (the MatMul-free LM) cannot cut its state back to the depth between repeats: bench evaluates the
// depth again before each run (untimed), for one sequence and for two.
TEST(BenchCli, DepthOnARecurrentModel) {
  const std::string model = tessera::test::data_path("hf/tiny-hgrn-bit-f32");
  for (const char* np : {"1", "2"}) {
    const json rows = run_json("bench -m " + model + " -p 0 -n 3 -d 5 -r 2 -np " + np + " -t 2 --json --no-ceilings");
    ASSERT_EQ(rows.size(), 1u) << "-np " << np;
    EXPECT_EQ(rows[0]["depth"], 5);
    EXPECT_GT(rows[0]["tok_s"].get<double>(), 0.0);
  }
}

// --sample: tg as a sampled generation loop (one token evaluated, then n - 1 sampled and evaluated: the same n steps
// and weight bytes as the plain tg row), named like it and marked in tg_logits; it needs batch 1, excludes
// --host-logits and needs -n 2 or more.
TEST(BenchCli, SampledGenerationRow) {
  const std::string model = "--arch smollm2-135m --random-weights --dtype q8_0 --layers 2";
  const json sampled = run_json("bench " + model + " -p 0 -n 6 -r 2 -t 2 --sample --json --no-ceilings");
  const json plain = run_json("bench " + model + " -p 0 -n 6 -r 2 -t 2 --json --no-ceilings");
  ASSERT_EQ(sampled.size(), 1u);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(sampled[0]["test"], "tg6");
  EXPECT_EQ(sampled[0]["tg_logits"], "sampled on the host");  // the CPU draws on the host
  EXPECT_EQ(plain[0]["tg_logits"], "host logits");
  EXPECT_GT(sampled[0]["tok_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(sampled[0]["weight_bytes_per_run"].get<double>(), plain[0]["weight_bytes_per_run"].get<double>());
  for (const std::string& bad : {std::string(" --sample --parallel 2 -n 4"),
                                 std::string(" --sample --host-logits -n 4"), std::string(" --sample -n 1")}) {
    std::string out;
    EXPECT_EQ(run_command(cli_path() + " bench " + model + bad, &out), 1) << bad << "\n" << out;
    EXPECT_NE(out.find("tessera: error: "), std::string::npos) << bad << "\n" << out;
  }
}

TEST(BenchCli, TextTableWithCeilings) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  ASSERT_EQ(run_stdout("bench -m " + model + " -p 8 -n 2 -r 1 -t 2 --ceiling-mib 64", &out), 0) << out;
  for (const char* s : {"| test", "tok/s", "GB/s", "TFLOP/s", "% of limit", "| pp8 ", "| tg2 ", "peak host memory",
                        "read bandwidth", "GEMM"})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  const json rows = run_json("bench -m " + model + " -p 8 -n 2 -r 1 -t 2 --ceiling-mib 64 --json");
  ASSERT_EQ(rows.size(), 2u);
  for (const json& r : rows) {
    ASSERT_FALSE(r["limit"].is_null());
    EXPECT_GT(r["limit"].get<double>(), 0);
    EXPECT_NEAR(r["fraction_of_limit"].get<double>(),
                (r["limit_unit"] == "gbps" ? r["gbps"] : r["tflops"]).get<double>() / r["limit"].get<double>(), 1e-9);
  }
}

TEST(BenchCli, Ceilings) {
  const json rows = run_json("bench --ceilings --json --ceiling-mib 64 -r 2 -t 2");
  ASSERT_TRUE(rows.is_array());
  std::vector<std::string> bw, tessera_dtypes;
  bool fma = false;
  for (const json& r : rows) {
    if (r["kind"] == "bandwidth") {
      bw.push_back(r["name"]);
      EXPECT_GT(r["gbps"].get<double>(), 0);
      EXPECT_EQ(r["repeats"], 2);
    } else {
      ASSERT_EQ(r["kind"], "gemm");
      EXPECT_GT(r["tflops"].get<double>(), 0);
      if (r["kernel"] == "tessera") tessera_dtypes.push_back(r["dtype"]);
      if (r["kernel"].get<std::string>().rfind("fma-peak", 0) == 0) fma = true;
    }
  }
  EXPECT_EQ(bw, (std::vector<std::string>{"read", "copy"}));
  EXPECT_EQ(tessera_dtypes, (std::vector<std::string>{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"}));
  EXPECT_TRUE(fma);
}

TEST(BenchCli, RandomWeights) {
  const json rows = run_json(
      "bench --arch smollm2-135m --random-weights --layers 2 --dtype q8_0 -p 8 -n 2 -r 1 -t 2 "
      "--json --no-ceilings");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["arch"], "smollm2-135m");
  EXPECT_EQ(rows[0]["weight_dtype"], "q8_0");
  EXPECT_TRUE(rows[0]["random_weights"].get<bool>());
  EXPECT_GT(rows[1]["tok_s"].get<double>(), 0);
  // The temporary file is gone once the model is mapped.
  EXPECT_FALSE(std::filesystem::exists(rows[0]["model_path"].get<std::string>()));
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The preset's hyperparameters are the real model's: compare with the SmolLM2 file itself.
TEST(BenchCli, WriteModelMatchesRealHyperparameters) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const std::string dir = testing::TempDir() + "/tessera_bench_write";
  std::filesystem::create_directories(dir);
  const std::string a = dir + "/a.gguf", b = dir + "/b.gguf", c = dir + "/c.gguf";
  std::string out;
  const std::string base = "bench --arch smollm2-135m --random-weights --layers 2 --dtype q4_0 --write-model ";
  ASSERT_EQ(run_stdout(base + a, &out), 0) << out;
  ASSERT_EQ(run_stdout(base + b, &out), 0) << out;
  ASSERT_EQ(run_stdout(base + c + " --seed 7", &out), 0) << out;
  EXPECT_EQ(read_all(a), read_all(b));  // seeded: the same bytes every time
  EXPECT_NE(read_all(a), read_all(c));

  const json real = run_json("inspect -m " + model + " --json");
  const json synth = run_json("inspect -m " + a + " --json");
  for (const char* k : {"architecture", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab", "n_ctx_train",
                        "rope_base", "norm_eps", "tied_output"})
    EXPECT_EQ(synth[k], real[k]) << k;
  EXPECT_EQ(synth["n_layers"], 2);
  for (const json& t : synth["tensors"])
    if (t["shape"].size() == 2) {
      EXPECT_EQ(t["dtype"], "q4_0") << t["name"];
    }
  std::filesystem::remove_all(dir);
}

TEST(BenchCli, BadFlags) {
  for (const std::string& args :
       {std::string("bench --ceilings --device cuda"), std::string("bench --device tpu"), std::string("bench -r 0"),
        std::string("bench -p 0 -n 0"), std::string("bench --arch smollm2-135m"), std::string("bench --random-weights"),
        std::string("bench --arch nope --random-weights"),
        std::string("bench --arch smollm2-135m --random-weights --dtype q4_k"),
        std::string("bench --arch smollm2-135m --random-weights --layers 99"),
        std::string("bench --write-model /tmp/x.gguf")}) {
    std::string out;
    EXPECT_EQ(run_command(cli_path() + " " + args, &out), 1) << args << "\n" << out;
    EXPECT_NE(out.find("tessera: error: "), std::string::npos) << args << "\n" << out;
  }
  std::string out;
  // Without a GPU (CI), the CUDA ceilings are refused with one sentence naming the device and a non-zero exit.
  if (run_command(cli_path() + " bench --ceilings --device cuda", &out) != 0) {
    EXPECT_NE(out.find("tessera: error: "), std::string::npos) << out;
    EXPECT_NE(out.find("cuda"), std::string::npos) << out;
  }
}

}  // namespace
