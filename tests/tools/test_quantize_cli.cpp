// tessera quantize against llama-quantize: every golden case of tests/data/quantize (python/make_quantize_golden.py
// ran llama-quantize on small random GGUFs, one case per type plus bf16, f32 and requantized inputs) must give the
// same file, byte for byte; a mismatch names the first tensor whose type or bytes differ. Then the command's behaviour:
// --help, bad input (one error line, exit 1), --allow-requantize, thread count, Hugging Face input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "quant/quant.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/quantize.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string qdata(const std::string& f) { return test::data_path("quantize/" + f); }

const json& golden() {
  static const json j = [] {
    std::ifstream f(qdata("index.json"));
    return json::parse(f);
  }();
  return j;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// A path under this process's temporary folder, removed when the process ends.
std::string temp_path(const std::string& name) {
  struct Dir {
    fs::path path = fs::temp_directory_path() / ("tessera_quantize_test_" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return (dir.path / name).string();
}

// "name type bytes fnv" per tensor of a file, as the golden lists them.
std::vector<std::string> tensor_lines(const std::string& path) {
  const gguf::File f = gguf::File::open(path);
  std::vector<std::string> out;
  for (const TensorView& t : f.tensors()) {
    std::string type(dtype_name(t.dtype));
    out.push_back(t.name + " " + type + " " + std::to_string(t.nbytes) + " " + fnv1a64(t.data, t.nbytes));
  }
  return out;
}

class QuantizeGolden : public ::testing::TestWithParam<size_t> {};

TEST_P(QuantizeGolden, SameBytesAsLlamaQuantize) {
  const json& c = golden()["cases"][GetParam()];
  const std::string out = temp_path("golden_" + std::to_string(GetParam()) + ".gguf");
  QuantizeOptions o;
  o.type = c["type"];
  o.allow_requantize = c["allow_requantize"];
  o.n_threads = 2;
  quantize_model(qdata(c["input"]), out, o);
  const std::vector<uint8_t> got = read_bytes(out);
  EXPECT_EQ(got.size(), c["bytes"].get<size_t>());
  if (fnv1a64(got.data(), got.size()) == c["fnv1a64"]) return;
  ADD_FAILURE() << c["input"] << " -> " << c["type"] << ": the file differs from llama-quantize's";
  const std::vector<std::string> lines = tensor_lines(out);
  ASSERT_EQ(lines.size(), c["tensors"].size());
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i] != c["tensors"][i].get<std::string>()) {
      ADD_FAILURE() << "first differing tensor: got '" << lines[i] << "', llama-quantize '"
                    << c["tensors"][i].get<std::string>() << "'";
      return;
    }
  }
  ADD_FAILURE() << "every tensor matches: the metadata or the layout differs";
}

INSTANTIATE_TEST_SUITE_P(Cases, QuantizeGolden, ::testing::Range<size_t>(0, golden()["cases"].size()),
                         [](const auto& info) {
                           const json& c = golden()["cases"][info.param];
                           std::string n = c["input"].get<std::string>() + "_" + c["type"].get<std::string>();
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The thread count only splits rows: every count writes the same file.
TEST(QuantizeApi, ThreadCountDoesNotChangeTheFile) {
  const std::string a = temp_path("t1.gguf"), b = temp_path("t3.gguf");
  quantize_model(qdata("tiny-f16.gguf"), a, {.type = "q4_K_M", .n_threads = 1});
  quantize_model(qdata("tiny-f16.gguf"), b, {.type = "Q4_K", .n_threads = 3});  // alias, any case
  EXPECT_EQ(read_bytes(a), read_bytes(b));
  quantize_model(qdata("tiny-f16.gguf"), b, {.type = "15"});  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  EXPECT_EQ(read_bytes(a), read_bytes(b));
}

TEST(QuantizeApi, ProgressAndWarnings) {
  std::vector<QuantizeTensorInfo> seen;
  std::vector<std::string> warnings;
  QuantizeOptions o{.type = "q4_K_M"};
  o.on_tensor = [&](const QuantizeTensorInfo& t) { seen.push_back(t); };
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  const QuantizeResult r = quantize_model(qdata("tiny-f16.gguf"), temp_path("p.gguf"), o);
  ASSERT_EQ(static_cast<int64_t>(seen.size()), r.n_tensors);
  EXPECT_EQ(seen.front().index, 1);
  EXPECT_EQ(seen.back().index, r.n_tensors);
  EXPECT_EQ(r.file_type, 15u);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  EXPECT_EQ(r.n_fallback, 3);   // rows of 288 (twice) and 80 in tiny-f16.gguf
  EXPECT_EQ(static_cast<int64_t>(warnings.size()), r.n_fallback);
  for (const QuantizeTensorInfo& t : seen) {
    if (t.name == "blk.6.attn_q.weight") {
      EXPECT_TRUE(t.fallback && t.to == "f16") << t.to;
    }
  }
}

// The ternary types warn that a full-precision model loses its quality. --ternary absmean (BitNet's) gives every
// ternary tensor one scale, mean |W|, so each tensor's blocks dequantize to {-s, 0, s} with one s; the other tensors
// (q6_K output, q4_0 fallbacks) are llama-quantize's. absmean on a non-ternary type is refused.
TEST(QuantizeApi, TernaryWarnsAndAbsmeanKeepsOneScalePerTensor) {
  std::vector<std::string> warnings;
  QuantizeOptions o{.type = "tq2_0", .ternary_absmean = true};
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  const std::string out = temp_path("absmean.gguf");
  const QuantizeResult r = quantize_model(qdata("tiny-f16.gguf"), out, o);
  EXPECT_EQ(r.file_type, 37u);  // LLAMA_FTYPE_MOSTLY_TQ2_0
  bool warned = false;
  for (const std::string& w : warnings) warned |= w.find("loses nearly all its quality") != std::string::npos;
  EXPECT_TRUE(warned);
  const gguf::File f = gguf::File::open(out);
  int ternary = 0;
  for (const TensorView& t : f.tensors()) {
    if (t.dtype != DType::TQ2_0) continue;
    ++ternary;
    const int64_t n = t.numel();
    std::vector<float> x(static_cast<size_t>(n));
    dequantize_row(t.dtype, t.data, x.data(), n);
    float s = 0.0f;
    for (float v : x) {
      if (v == 0.0f) continue;
      if (s == 0.0f) s = std::fabs(v);
      ASSERT_EQ(std::fabs(v), s) << t.name;
    }
    EXPECT_GT(s, 0.0f) << t.name;
  }
  EXPECT_GT(ternary, 10);
  EXPECT_THROW(quantize_model(qdata("tiny-f16.gguf"), temp_path("x.gguf"), {.type = "q4_0", .ternary_absmean = true}),
               Error);
}

TEST(QuantizeApi, RequantizingNeedsTheFlag) {
  try {
    quantize_model(qdata("tiny-q8_0.gguf"), temp_path("r.gguf"), {.type = "q4_0"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--allow-requantize"), std::string::npos) << e.what();
  }
  // A type equal to the input's copies the tensors: nothing is requantized, no flag needed.
  const QuantizeResult r = quantize_model(qdata("tiny-q8_0.gguf"), temp_path("r8.gguf"), {.type = "q8_0"});
  EXPECT_EQ(r.n_requantized, 0);
}

// Hugging Face input: the same file as quantizing the lossless GGUF written from it, and a model whose logits match
// the safetensors model's (so the q/k rows are permuted as GGUF's rope expects).
// The two models' logits over `ids` in sessions of `so` agree within 1e-4 of their scale (the same f32 weights read
// from two files: only float rounding of derived tables, such as rope's, may differ).
void expect_same_logits(const Model& a, const Model& b, const std::vector<int32_t>& ids, const SessionOptions& so,
                        const std::string& what) {
  Session sa(a, so), sb(b, so);
  const std::vector<float> la = sa.eval_all_logits(ids), lb = sb.eval_all_logits(ids);
  ASSERT_EQ(la.size(), lb.size()) << what;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(la[i]) - lb[i]));
    max_ref = std::max(max_ref, std::fabs(double(la[i])));
  }
  EXPECT_LT(max_diff, 1e-4 * std::max(1.0, max_ref)) << what << ": max |logit difference| " << max_diff;
}

TEST(QuantizeApi, HuggingFaceInputEqualsItsGgufAndKeepsTheLogits) {
  const std::string hf = test::data_path("hf/tiny-llama3-f32");
  const std::string f32 = temp_path("hf-f32.gguf"), direct = temp_path("hf-q8.gguf"), via = temp_path("hf-q8b.gguf");
  quantize_model(hf, f32, {.type = "f32"});
  quantize_model(hf, direct, {.type = "q8_0"});
  quantize_model(f32, via, {.type = "q8_0"});
  EXPECT_EQ(read_bytes(direct), read_bytes(via));

  const ModelOptions mo{.load_tokenizer = false};
  Model a = Model::load(hf, mo), b = Model::load(f32, mo);
  // Same f32 weights, same math: only the rope table's float rounding (rope_freqs vs computed) may differ.
  expect_same_logits(a, b, {1, 5, 9, 2, 7, 3, 11, 4}, {}, "tiny-llama3-f32");
}

// The families beyond Llama from Hugging Face files to GGUF and back (q/k rows reordered for llama only, as
// convert_hf_to_gguf.py does), and rope scaling written as llama.cpp's converter writes it: Phi-3's longrope
// (rope_factors_{short,long}.weight, the attention factor and the original context as keys; the GGUF gives the
// Hugging Face files' logits with either factor set, a context of 8 (short) and of 32 (long) alike) and YaRN
// (rope.scaling.type, factor and original context; the attention factor derived from the factor).
class QuantizeFromHf : public ::testing::TestWithParam<const char*> {};

TEST_P(QuantizeFromHf, SurvivesTheConversion) {
  const std::string hf = test::data_path(std::string("hf/") + GetParam());
  const std::string f32 = temp_path(std::string(GetParam()) + ".gguf");
  quantize_model(hf, f32, {.type = "f32"});
  const ModelOptions mo{.load_tokenizer = false};
  Model a = Model::load(hf, mo), b = Model::load(f32, mo);
  for (int64_t n_ctx : {8, 32}) {
    SessionOptions so;
    so.n_ctx = n_ctx;
    expect_same_logits(a, b, {1, 5, 9, 2, 7, 3}, so, "n_ctx " + std::to_string(n_ctx));
  }
}

INSTANTIATE_TEST_SUITE_P(HfToGguf, QuantizeFromHf,
                         ::testing::Values("tiny-phi3-longrope-f32", "tiny-qwen3-yarn-f32", "tiny-qwen3-f32",
                                           "tiny-qwen2-f32", "tiny-phi3-f32", "tiny-mistral-f32"),
                         [](const auto& info) {
                           std::string n = std::string(info.param).substr(5);  // less "tiny-"
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Gemma 3 in its GGUF form (norm weights stored as 1 + w, its norm names, which layers slide, the local rope base and
// the softcap as keys) gives the safetensors folder's logits. llama.cpp reads no query_pre_attn_scalar (it takes
// head_dim), so the tiny model's 12 (head size 16) is refused in one sentence, and a copy set to 16 converts.
TEST(QuantizeApi, Gemma3FromHuggingFace) {
  const fs::path src = test::data_path("hf/tiny-gemma3-f32");
  try {
    quantize_model(src.string(), temp_path("gemma3-refused.gguf"), {.type = "f32"});
    FAIL() << "a Gemma 3 GGUF with another attention scale was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("query_pre_attn_scalar gives an attention scale"), std::string::npos)
        << e.what();
  }
  const fs::path dir = temp_path("gemma3-hd");
  fs::create_directories(dir);
  fs::copy_file(src / "model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
  nlohmann::json cfg;
  std::ifstream(src / "config.json") >> cfg;
  cfg["query_pre_attn_scalar"] = 16;
  std::ofstream(dir / "config.json") << cfg.dump();
  const std::string gguf = temp_path("gemma3-hd.gguf");
  quantize_model(dir.string(), gguf, {.type = "f32"});
  const ModelOptions mo{.load_tokenizer = false};
  Model a = Model::load(dir.string(), mo), b = Model::load(gguf, mo);
  SessionOptions so;
  so.n_ctx = 32;
  expect_same_logits(a, b, {1, 5, 9, 2, 7, 3, 11, 4, 6, 8}, so, "gemma3 past its window of 4");
}

// ---- the command

std::string cli(const std::string& args, int* rc) {
  std::string out;
  *rc = test::run_command(test::cli_path() + " quantize " + args + " 2>&1", &out);
  return out;
}

TEST(QuantizeCli, HelpExplainsEveryFlagAndType) {
  int rc = 0;
  const std::string out = cli("--help", &rc);
  EXPECT_EQ(rc, 0) << out;
  for (const char* s : {"input", "output", "type", "--threads", "--allow-requantize", "--quiet", "q4_K_M", "q5_K_M",
                        "iq4_nl", "q6_K", "q8_0", "q5_1", "llama-quantize", "tq1_0", "tq2_0", "--ternary", "absmean"})
    EXPECT_NE(out.find(s), std::string::npos) << s << " missing from\n" << out;
}

TEST(QuantizeCli, WritesTheGoldenFileWithProgress) {
  int rc = 0;
  const std::string out_path = temp_path("cli.gguf");
  // llama-quantize's argument order, thread count last.
  const std::string out = cli(qdata("tiny-f16.gguf") + " " + out_path + " Q6_K 2", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[  74/  74]"), std::string::npos) << out;
  EXPECT_NE(out.find("warning: blk.3.attn_v.weight"), std::string::npos) << out;
  for (const json& c : golden()["cases"]) {
    if (c["input"] == "tiny-f16.gguf" && c["type"] == "q6_K") {
      const std::vector<uint8_t> got = read_bytes(out_path);
      EXPECT_EQ(fnv1a64(got.data(), got.size()), c["fnv1a64"]);
    }
  }
}

// Bad input: one "tessera: error:" line and exit status 1, never a crash.
TEST(QuantizeCli, BadInputIsOneErrorLine) {
  const std::string out_path = temp_path("bad.gguf");
  const std::string in = qdata("tiny-f16.gguf");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {in + " " + out_path + " q3_K_XL", "unknown quantization type"},
      {"/nonexistent.gguf " + out_path + " q8_0", "nonexistent"},
      {qdata("index.json") + " " + out_path + " q8_0", "config.json"},
      {in + " " + test::data_path("quantize") + " q8_0", "is a folder"},
      {qdata("tiny-q8_0.gguf") + " " + out_path + " q4_0", "--allow-requantize"},
      {in + " /nonexistent-dir/out.gguf q8_0", "nonexistent-dir"},
  };
  for (const auto& [args, needle] : cases) {
    int rc = 0;
    const std::string out = cli("-q " + args, &rc);
    EXPECT_EQ(rc, 1) << args << "\n" << out;
    EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << args << "\n" << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << args << "\n" << out;
    EXPECT_NE(out.find(needle), std::string::npos) << args << "\n" << out;
  }
  int rc = 0;
  const std::string out = cli(in, &rc);  // missing OUTPUT and TYPE: a usage error
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("tessera: error:"), std::string::npos) << out;
}

// In the default model (Q4_1, width 576) blk.0.attn_k falls back from q4_K before the first requantized tensor is met:
// its warning must not precede the error.
TEST(QuantizeCli, RefusedRequantizeOfTheDefaultModelIsOneLine) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  int rc = 0;
  const std::string out = cli(model + " " + temp_path("d.gguf") + " q4_K_M", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

TEST(QuantizeCli, RequantizeWarns) {
  int rc = 0;
  const std::string out =
      cli("-q --allow-requantize " + qdata("tiny-q8_0.gguf") + " " + temp_path("rq.gguf") + " q4_K_M", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("warning: requantizing"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
