// --lora on the CLI: `tessera graph --chains` over the tiny LoRA base and its PEFT adapters (tests/data/lora), the
// adapters' nodes in the graph, and the one-line errors of bad --lora / --lora-merge flags; on the default model with a
// GGUF LoRA written here, logits, run, chat and perplexity apply the adapter (unmerged, merged, scaled to 0), bench
// counts its bytes and FLOPs, and every one of them refuses a bad --lora in one line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/gguf.h"
#include "test_util.h"

namespace {

using tessera::test::cli_path;
using tessera::test::data_path;
using tessera::test::run_command;
namespace gguf = tessera::gguf;

int run_cli(const std::string& args, std::string* out) {
  return run_command("{ " + cli_path() + " " + args + " 2>&1; }", out);
}

// stdout alone (stderr dropped): a reply, a text, a JSON document.
int run_stdout(const std::string& args, std::string* out) { return tessera::test::run_cli_stdout(args, out); }

std::string scratch(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tessera_lora_cli_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// A file under the temp directory (this process's), removed when the test ends.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name) : path(scratch(name)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() { std::filesystem::remove(path); }
};

// A strong GGUF LoRA for the default model (SmolLM2-135M, llama, width 576, ffn 1536, 3 kv heads of 64): rank 4 on
// the last block's ffn_down and attn_v, entries uniform in (-0.5, 0.5) from a fixed LCG, alpha 0 (llama.cpp: scale 1).
// One block only, so that the merged adapter (requantized into the Q4_1 base) stays close to the unmerged one: it
// moves the logits by ~20 (their scale ~30) where merging moves them by ~2.
void write_smol_adapter(const std::string& path) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::from_string("llama"));
  w.set("general.type", gguf::Value::from_string("adapter"));
  w.set("adapter.type", gguf::Value::from_string("lora"));
  w.set("adapter.lora.alpha", gguf::Value::from_f32(0.0f));
  uint32_t seed = 12345;
  const auto next = [&] {
    seed = (seed * 1103515245u + 12345u) & 0x7fffffffu;
    return static_cast<float>((seed / double(0x7fffffff) * 2 - 1) * 0.5);
  };
  const int64_t r = 4;
  const auto add = [&](const std::string& name, int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& x : v) x = next();
    w.add_tensor(name, tessera::DType::F32, {rows, cols}, v.data(), v.size() * sizeof(float));
  };
  const struct {
    const char* name;
    int64_t n_out, n_in;
  } targets[] = {{"ffn_down", 576, 1536}, {"attn_v", 192, 576}};
  for (const auto& t : targets) {
    add(std::string("blk.29.") + t.name + ".weight.lora_a", r, t.n_in);
    add(std::string("blk.29.") + t.name + ".weight.lora_b", t.n_out, r);
  }
  w.write(path);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// A few verses, for perplexity.
void write_text_file(const std::string& path) {
  std::ofstream f(path);
  for (int i = 0; i < 60; ++i) f << "And the evening and the morning were the first day, and the light was good. ";
}

TEST(LoraCli, GraphChainsListsEveryAdapterChainAndItsChoice) {
  const std::string base = data_path("lora/base"), a = data_path("lora/adapter_a"), b = data_path("lora/adapter_b");
  std::string out;
  ASSERT_EQ(run_cli("graph -m " + base + " --lora " + a + " --lora " + b + ":0.5 -T 64 --chains", &out), 0) << out;
  // adapter_a: 7 projections x 2 layers; adapter_b: q, v and down x 2 layers.
  EXPECT_NE(out.find("20 matmul chains at T = 64"), std::string::npos) << out;
  EXPECT_NE(out.find("chain blk.1.ffn_down.lora0_a (dims 64 x 64 x 4 x 32), added to blk.1.ffn_down"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("<- chosen"), std::string::npos) << out;
  EXPECT_NE(out.find("20 of 20 chains run in their optimal order"), std::string::npos) << out;
  ASSERT_EQ(run_cli("graph -m " + base + " --lora " + a + " -T 1", &out), 0) << out;
  EXPECT_NE(out.find("blk.0.attn_q.lora0_b"), std::string::npos) << out;
  ASSERT_EQ(run_cli("graph -m " + base + " --lora " + a + " --lora-merge -T 1", &out), 0) << out;
  EXPECT_EQ(out.find("lora0"), std::string::npos) << out;  // merged: no adapter nodes
}

// --chains --device: the builder's chains (a device's view would have them rewritten already) under that backend's
// ceilings, or one line saying the build has no such backend.
TEST(LoraCli, GraphChainsWeighsByTheDevicesCeilings) {
  const std::string base = data_path("lora/base"), a = data_path("lora/adapter_a");
  std::string out;
  ASSERT_EQ(run_cli("graph -m " + base + " --lora " + a + " -T 256 --chains --device cpu", &out), 0) << out;
  EXPECT_NE(out.find("14 matmul chains at T = 256 (cost: max(FLOPs / 200 GFLOP/s, bytes / 20 GB/s)"), std::string::npos)
      << out;
  const int rc = run_cli("graph -m " + base + " --lora " + a + " -T 256 --chains --device cuda", &out);
  if (rc != 0) {
    EXPECT_EQ(rc, 1);
    EXPECT_NE(out.find("no CUDA backend"), std::string::npos) << out;
    return;
  }
  EXPECT_NE(out.find("as the cuda backend's chain pass weighs them"), std::string::npos) << out;
  EXPECT_NE(out.find("14 matmul chains at T = 256 (cost: max(FLOPs / 50000 GFLOP/s, bytes / 3000 GB/s)"),
            std::string::npos)
      << out;
}

TEST(LoraCli, BadFlagsAreOneLine) {
  const std::string base = data_path("lora/base");
  std::string out;
  EXPECT_EQ(run_cli("graph -m " + base + " --lora-merge", &out), 1) << out;
  EXPECT_NE(out.find("tessera: error: --lora-merge needs at least one --lora adapter"), std::string::npos) << out;
  EXPECT_EQ(run_cli("graph -m " + base + " --lora /nonexistent/adapter", &out), 1) << out;
  EXPECT_NE(out.find("no such LoRA adapter"), std::string::npos) << out;
  EXPECT_EQ(run_cli("graph -m " + base + " --chains --format json", &out), 1) << out;
  EXPECT_NE(out.find("--chains prints text"), std::string::npos) << out;
}

// The commands say which adapters they run (stderr: path, format, matmuls, rank, scale, merged or not); -q keeps
// logits quiet.
TEST(LoraCli, CommandsAnnounceTheirAdapters) {
  const std::string base = data_path("lora/base"), a = data_path("lora/adapter_a"), b = data_path("lora/adapter_b");
  const std::string out = scratch("announce.npy");
  std::string log;
  ASSERT_EQ(run_cli("logits -m " + base + " --ids 1,2,3 --out " + out + " --lora " + a + " --lora " + b + ":0.5", &log),
            0)
      << log;
  EXPECT_NE(log.find("tessera: LoRA " + a + " (peft, "), std::string::npos) << log;
  EXPECT_NE(log.find("rank up to 4, scale 1), unmerged"), std::string::npos) << log;
  EXPECT_NE(log.find("tessera: LoRA " + b + " (peft, "), std::string::npos) << log;
  EXPECT_NE(log.find("scale 0.5), unmerged"), std::string::npos) << log;
  ASSERT_EQ(run_cli("logits -m " + base + " --ids 1,2,3 --out " + out + " --lora " + a + ".gguf --lora-merge", &log), 0)
      << log;
  EXPECT_NE(log.find("(gguf, "), std::string::npos) << log;
  EXPECT_NE(log.find("), merged"), std::string::npos) << log;
  ASSERT_EQ(run_cli("logits -m " + base + " --ids 1,2,3 --out " + out + " -q --lora " + a, &log), 0) << log;
  EXPECT_EQ(log.find("tessera: LoRA"), std::string::npos) << log;
  ASSERT_EQ(run_cli("logits -m " + base + " --ids 1,2,3 --out " + out, &log), 0) << log;
  EXPECT_EQ(log.find("tessera: LoRA"), std::string::npos) << "no adapter, no line: " << log;
  std::filesystem::remove(out);
}

// logits: the adapter moves the logits (by a large share of their scale), the same adapter at scale 0 gives the base's
// logits, and --lora-merge gives the unmerged adapter's up to the requantization of the two merged Q4_1 matrices (far
// closer to it than to the base).
TEST(LoraCli, LogitsApplyTheAdapterMergedOrNot) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const TempFile file("smol_adapter.gguf");
  write_smol_adapter(file.path);
  const std::string& adapter = file.path;
  const auto logits = [&](const std::string& flags, const std::string& name) {
    const std::string out = scratch(name + ".npy");
    std::string log;
    EXPECT_EQ(run_cli("logits -m " + model + " --ids 1,504,3537,314,4649,30 -t 2 -q --out " + out + " " + flags, &log),
              0)
        << log;
    tessera::test::Npy npy = tessera::test::read_npy(out);
    EXPECT_EQ(npy.rows, 6) << name;
    EXPECT_EQ(npy.cols, 49152) << name;
    std::filesystem::remove(out);
    return std::move(npy.data);
  };
  const std::vector<float> base = logits("", "base"), lora = logits("--lora " + adapter, "lora"),
                           zero = logits("--lora " + adapter + ":0", "zero"),
                           merged = logits("--lora " + adapter + " --lora-merge", "merged");
  ASSERT_EQ(base.size(), 6u * 49152u);
  ASSERT_EQ(lora.size(), base.size());
  ASSERT_EQ(zero.size(), base.size());
  ASSERT_EQ(merged.size(), base.size());
  double scale = 0;
  for (float x : base) scale = std::max(scale, std::fabs(double(x)));
  const double moved = max_abs_diff(lora, base);
  EXPECT_GT(moved, 0.1 * scale) << "the adapter did not change the logits";
  EXPECT_LE(max_abs_diff(zero, base), 1e-6 * scale) << "--lora FILE:0 is the base model";
  EXPECT_LT(max_abs_diff(merged, lora), 0.25 * moved)
      << "merged: " << max_abs_diff(merged, lora) << ", moved " << moved;
}

// run, chat and perplexity: greedy text and the perplexity change with the adapter and come back at scale 0 (none of
// the three names the adapter in its output: the change is what shows it ran).
TEST(LoraCli, RunChatAndPerplexityApplyTheAdapter) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const TempFile file("smol_adapter.gguf");
  write_smol_adapter(file.path);
  const std::string& adapter = file.path;
  // Greedy text on stdout: `run` of a prompt, and `chat`'s reply to one line on stdin.
  const auto text = [&](const std::string& command, const std::string& lora) {
    const std::string flags = " -m " + model + " -n 12 --temp 0 -t 2" + (lora.empty() ? "" : " --lora " + lora);
    std::string o;
    const std::string cmd = command == "run" ? cli_path() + " run -p 'The capital of France is'" + flags
                                             : "printf 'Hello, who are you?\\n' | " + cli_path() + " chat" + flags;
    EXPECT_EQ(run_command("{ " + cmd + " 2>/dev/null; }", &o), 0) << command << " " << lora << ": " << o;
    return o;
  };
  for (const std::string command : {"run", "chat"}) {
    const std::string base = text(command, "");
    ASSERT_GT(base.size(), 2u) << command;
    const std::string adapted = text(command, adapter);
    EXPECT_GT(adapted.size(), 2u) << command;
    EXPECT_NE(adapted, base) << command << ": the adapter did not change the greedy text";
    EXPECT_EQ(text(command, adapter + ":0"), base) << command;
  }
  const TempFile text_file("text.txt");
  write_text_file(text_file.path);
  const auto ppl = [&](const std::string& flags) {
    std::string o;
    EXPECT_EQ(
        run_stdout("perplexity -m " + model + " -f " + text_file.path + " -c 64 --chunks 2 -t 2 --json " + flags, &o),
        0)
        << o;
    const nlohmann::json j = nlohmann::json::parse(o, nullptr, false);
    return j.is_object() && j.contains("ppl") ? j["ppl"].get<double>() : -1.0;
  };
  const double p0 = ppl(""), pa = ppl("--lora " + adapter), pz = ppl("--lora " + adapter + ":0"),
               pm = ppl("--lora " + adapter + " --lora-merge");
  ASSERT_GT(p0, 1.0);
  EXPECT_GT(pa, 2 * p0) << "the adapter (its random update ruins the easy text) did not change the perplexity";
  EXPECT_DOUBLE_EQ(pz, p0);
  EXPECT_GT(pm, 2 * p0) << "merged";
}

// bench: the unmerged adapter's bytes and FLOPs are counted (two adapters more than one), merged runs the base's.
TEST(LoraCli, BenchCountsTheAdapter) {
  const std::string base = data_path("lora/base"), a = data_path("lora/adapter_a"), b = data_path("lora/adapter_b");
  const auto tg = [&](const std::string& flags) {
    std::string o;
    EXPECT_EQ(run_stdout("bench -m " + base + " -p 0 -n 4 -r 1 -t 2 --json " + flags, &o), 0) << o;
    const nlohmann::json j = nlohmann::json::parse(o, nullptr, false);
    EXPECT_TRUE(j.is_array() && j.size() == 1 && j[0]["test"] == "tg4") << o;
    return j.is_array() && !j.empty() ? j[0] : nlohmann::json::object();
  };
  const nlohmann::json plain = tg(""), one = tg("--lora " + a), two = tg("--lora " + a + " --lora " + b + ":0.5"),
                       merged = tg("--lora " + a + " --lora-merge");
  for (const char* key : {"model_bytes", "flops_per_run", "weight_bytes_per_run"}) {
    ASSERT_TRUE(plain.contains(key) && one.contains(key) && two.contains(key) && merged.contains(key)) << key;
    EXPECT_GT(one[key].get<double>(), plain[key].get<double>()) << key;
    EXPECT_GT(two[key].get<double>(), one[key].get<double>()) << key;
    EXPECT_EQ(merged[key].get<double>(), plain[key].get<double>()) << key;
  }
  // adapter_a: rank 4 on 7 projections of 2 layers, 4096 parameters, 2 FLOPs each per token, plus the add of each
  // adapted matmul's output (256 per layer): 4 tokens.
  EXPECT_EQ(one["flops_per_run"].get<double>() - plain["flops_per_run"].get<double>(), 4 * (2 * 4096 + 2 * 256));
}

// Every command that takes --lora refuses a missing adapter, --lora-merge alone and an adapter for another model in
// one "tessera: error:" line with exit status 1.
TEST(LoraCli, BadAdapterIsOneLineOnEveryCommand) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const TempFile npy_file("bad.npy"), text_file("bad.txt");
  write_text_file(text_file.path);
  const std::string& npy = npy_file.path;
  const struct {
    std::string bad, error;
  } cases[] = {
      {"--lora /nonexistent/adapter", "tessera: error: /nonexistent/adapter: no such LoRA adapter file or folder"},
      {"--lora-merge", "tessera: error: --lora-merge needs at least one --lora adapter"},
      {"--lora " + data_path("lora/adapter_a"), "(an adapter made for another base model?)"},
  };
  for (const std::string& cmd : std::vector<std::string>{"run -p hi -n 2", "chat -n 2", "bench -p 0 -n 2 -r 1",
                                                         "perplexity -f " + text_file.path + " -c 64 --chunks 1",
                                                         "logits --ids 1,2 --out " + npy})
    for (const auto& c : cases) {
      std::string out;
      EXPECT_EQ(run_cli(cmd + " -m " + model + " -t 2 " + c.bad + " < /dev/null", &out), 1) << cmd << " " << c.bad;
      EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << cmd << " " << c.bad << ": " << out;
      EXPECT_NE(out.find(c.error), std::string::npos) << cmd << " " << c.bad << ": " << out;
      EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << cmd << " " << c.bad << ": " << out;
    }
}

}  // namespace
