// CudaOptions (cuda_options.h): the defaults are the ones docs/ENVIRONMENT.md documents (its "CUDA options" table, read
// from the source tree), every key parses back what format_cuda_options prints, bad values are one-sentence errors,
// and the GEMV and attention launchers' study knobs reach the launch-shape choice. Runs everywhere (no GPU needed).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels.h"
#include "tessera/error.h"

namespace tessera::cuda::test {
namespace {

namespace fs = std::filesystem;

// key -> default of docs/ENVIRONMENT.md's "CUDA options" table (rows "| `key` | `default` | kind | effect |").
std::map<std::string, std::string> documented_defaults() {
  std::ifstream f(fs::path(TESSERA_SOURCE_DIR) / "docs" / "ENVIRONMENT.md");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  std::map<std::string, std::string> out;
  const std::regex row("\\| `([a-z0-9_]+)` \\| `([^`]*)` \\| (kernel|study|engine) \\|");
  for (std::sregex_iterator it(doc.begin(), doc.end(), row), end; it != end; ++it) out[(*it)[1]] = (*it)[2];
  return out;
}

TEST(CudaOptions, DefaultsAreTheDocumentedOnes) {
  const std::map<std::string, std::string> doc = documented_defaults();
  ASSERT_FALSE(doc.empty()) << "docs/ENVIRONMENT.md has no CUDA options table (is TESSERA_SOURCE_DIR right?)";
  const std::set<std::string> keys(cuda_option_keys().begin(), cuda_option_keys().end());
  for (const auto& [key, value] : doc) EXPECT_TRUE(keys.count(key)) << key << " is documented but not an option";
  const std::string defaults = format_cuda_options(CudaOptions{});
  for (const std::string& key : keys) {
    ASSERT_TRUE(doc.count(key)) << key << " is an option the documentation does not list";
    // Setting the documented default on a default struct must change nothing: the document and the struct agree.
    CudaOptions o;
    parse_cuda_option(o, key + "=" + doc.at(key));
    EXPECT_EQ(format_cuda_options(o), defaults)
        << key << "'s documented default '" << doc.at(key) << "' is not its default";
  }
  // What the launchers read before any set_cuda_options: the struct's defaults.
  EXPECT_EQ(format_cuda_options(cuda_options()), defaults);
  EXPECT_TRUE(pdl_enabled());
}

TEST(CudaOptions, EveryKeyRoundTrips) {
  CudaOptions o;
  for (const char* kv : {"pdl=0",
                         "cudnn=off",
                         "attn_short=300",
                         "attn_compact=1",
                         "attn_chunk=128",
                         "gemv_shapes=576x1536=256/4/1/0,4096x14336=128/4/1/0",
                         "early_l2=64/16384/1",
                         "graph=false",
                         "fuse=0",
                         "fuse_attn=0",
                         "fold_norm=0",
                         "fold_swiglu=0",
                         "attn_q8=0",
                         "quant_norm=all",
                         "chain=0",
                         "chain_steps=3",
                         "chain_embed=0",
                         "sample=0",
                         "drop_ops=rmsnorm,swiglu",
                         "attn_tma=0",
                         "x16=0",
                         "out16=0",
                         "merge_gate_up=0",
                         "lora_side=0",
                         "teal_walk=all",
                         "teal_union=0",
                         "quant_gemm=expand"})
    parse_cuda_option(o, kv);
  const std::string text = format_cuda_options(o);
  EXPECT_NE(text, format_cuda_options(CudaOptions{}));
  CudaOptions back;
  std::istringstream words(text);
  for (std::string kv; words >> kv;) parse_cuda_option(back, kv);
  EXPECT_EQ(format_cuda_options(back), text);
  EXPECT_FALSE(back.pdl);
  EXPECT_EQ(back.attn_short, 300);
  ASSERT_EQ(back.gemv_shapes.size(), 2u);
  EXPECT_EQ(back.gemv_shapes[1].n, 4096);
  EXPECT_EQ(back.gemv_shapes[1].config.threads, 128);
  EXPECT_EQ(back.early_l2.bytes, 16384u);
  EXPECT_TRUE(back.early_l2.bulk);
  EXPECT_EQ(back.quant_norm, QuantNorm::ALL);
  EXPECT_EQ(back.quant_gemm, QuantGemm::EXPAND);
  EXPECT_FALSE(back.teal_union);
  EXPECT_EQ(back.drop_ops, (std::vector<std::string>{"rmsnorm", "swiglu"}));
}

TEST(CudaOptions, QuantGemmValuesRoundTrip) {
  EXPECT_EQ(CudaOptions{}.quant_gemm, QuantGemm::AUTO);
  for (const auto& [text, value] : {std::pair{"auto", QuantGemm::AUTO}, std::pair{"tile", QuantGemm::TILE},
                                    std::pair{"expand", QuantGemm::EXPAND}}) {
    CudaOptions o;
    o.quant_gemm = QuantGemm::EXPAND == value ? QuantGemm::TILE : QuantGemm::EXPAND;
    parse_cuda_option(o, std::string("quant_gemm=") + text);
    EXPECT_EQ(o.quant_gemm, value) << text;
    EXPECT_NE(format_cuda_options(o).find(std::string("quant_gemm=") + text), std::string::npos) << text;
  }
  CudaOptions o;
  EXPECT_THROW(parse_cuda_option(o, "quant_gemm=on"), Error);
}

TEST(CudaOptions, QuantNormValuesRoundTrip) {
  EXPECT_EQ(CudaOptions{}.quant_norm, QuantNorm::AUTO);
  for (const auto& [text, value] : {std::pair{"auto", QuantNorm::AUTO}, std::pair{"q4_1", QuantNorm::Q4_1_ONLY},
                                    std::pair{"all", QuantNorm::ALL}, std::pair{"none", QuantNorm::NONE}}) {
    CudaOptions o;
    o.quant_norm = QuantNorm::NONE == value ? QuantNorm::ALL : QuantNorm::NONE;
    parse_cuda_option(o, std::string("quant_norm=") + text);
    EXPECT_EQ(o.quant_norm, value) << text;
    EXPECT_NE(format_cuda_options(o).find(std::string("quant_norm=") + text), std::string::npos) << text;
  }
}

TEST(CudaOptions, TealWalkValuesRoundTrip) {
  EXPECT_EQ(CudaOptions{}.teal_walk, TealWalk::AUTO);
  for (const auto& [text, value] :
       {std::pair{"q8_0", TealWalk::Q8_0}, std::pair{"all", TealWalk::ALL}, std::pair{"none", TealWalk::NONE},
        std::pair{"auto", TealWalk::AUTO}}) {
    CudaOptions o;
    o.teal_walk = TealWalk::NONE == value ? TealWalk::ALL : TealWalk::NONE;
    parse_cuda_option(o, std::string("teal_walk=") + text);
    EXPECT_EQ(o.teal_walk, value) << text;
    EXPECT_NE(format_cuda_options(o).find(std::string("teal_walk=") + text), std::string::npos) << text;
  }
  CudaOptions o;
  EXPECT_THROW(parse_cuda_option(o, "teal_walk=q4_1"), Error);
}

// Each set_cuda_options is a new generation (CUDA sessions re-apply their own options when it moved), a refused one
// is not.
TEST(CudaOptions, EverySetIsANewGeneration) {
  const CudaOptions saved = cuda_options();
  const uint64_t g0 = cuda_options_generation();
  set_cuda_options(saved);
  EXPECT_EQ(cuda_options_generation(), g0 + 1);
  CudaOptions bad;
  bad.attn_chunk = 65;
  EXPECT_THROW(set_cuda_options(bad), Error);
  EXPECT_EQ(cuda_options_generation(), g0 + 1);
}

TEST(CudaOptions, BadValuesAreErrors) {
  CudaOptions o;
  EXPECT_THROW(parse_cuda_option(o, "pdl"), Error);             // not key=value
  EXPECT_THROW(parse_cuda_option(o, "attn_v1=1"), Error);       // removed: v3 is an experiment now
  EXPECT_THROW(parse_cuda_option(o, "attn_cluster=8"), Error);  // removed
  EXPECT_THROW(parse_cuda_option(o, "pdl=yes"), Error);
  EXPECT_THROW(parse_cuda_option(o, "attn_short=a"), Error);
  EXPECT_THROW(parse_cuda_option(o, "gemv_shapes=576x1536=256/4/1"), Error);
  EXPECT_THROW(parse_cuda_option(o, "early_l2=64"), Error);
  EXPECT_THROW(parse_cuda_option(o, "early_l2=64/0/2"), Error);
  EXPECT_THROW(parse_cuda_option(o, "quant_norm=q8_0"), Error);
  const std::string before = format_cuda_options(cuda_options());
  CudaOptions bad;
  bad.gemv_shapes = {{576, 1536, GemvConfig{96, 4, 1, 0}}};  // not a compiled launch shape
  EXPECT_THROW(set_cuda_options(bad), Error);
  bad = CudaOptions{};
  bad.attn_chunk = 100;
  EXPECT_THROW(set_cuda_options(bad), Error);
  bad = CudaOptions{};
  bad.chain_steps = 17;
  EXPECT_THROW(set_cuda_options(bad), Error);
  EXPECT_EQ(format_cuda_options(cuda_options()), before) << "a refused set changed the options";
}

// gemv_shapes reaches gemv_default_config (host code: no GPU), for that matrix shape only, and a scope restores.
TEST(CudaOptions, GemvShapesOverrideTheDefaultLaunchShape) {
  const GemvConfig plain = gemv_default_config(DType::BF16, 576, 1536);
  const GemvConfig other = plain.threads == 64 ? GemvConfig{128, 2, 2, 0} : GemvConfig{64, 2, 2, 0};
  {
    CudaOptions o;
    parse_cuda_option(o, "gemv_shapes=576x1536=" + std::to_string(other.threads) + "/2/2/0");
    const CudaOptionsScope scope(o);
    const GemvConfig got = gemv_default_config(DType::BF16, 576, 1536);
    EXPECT_EQ(got.threads, other.threads);
    EXPECT_EQ(got.rows, 2);
    EXPECT_EQ(got.unroll, 2);
    const GemvConfig q = gemv_default_config(DType::Q8_0, 576, 1536);  // any weight format
    EXPECT_EQ(q.threads, other.threads);
    const GemvConfig untouched = gemv_default_config(DType::BF16, 576, 576);
    EXPECT_EQ(untouched.threads, gemv_default_config(DType::F16, 576, 576).threads);
  }
  const GemvConfig after = gemv_default_config(DType::BF16, 576, 1536);
  EXPECT_EQ(after.threads, plain.threads);
  EXPECT_EQ(after.rows, plain.rows);
  EXPECT_EQ(after.unroll, plain.unroll);
}

// The quantized GEMV's launch shapes are tessera_bench_kquant --all-configs' best per format and shape class (H100,
// 2026-11-26): one-warp blocks at the 8B and 1B shapes for q4_K, iq4_xs and iq4_nl's short rows, and every default a
// shape the format's kernels are compiled for.
TEST(CudaOptions, QuantGemvLaunchShapesAreTheSweptOnes) {
  const auto is = [](const GemvConfig& c, int threads, int rows, int unroll) {
    return c.threads == threads && c.rows == rows && c.unroll == unroll && c.prefetch == 0;
  };
  EXPECT_TRUE(is(gemv_default_config(DType::Q4_K, 28672, 4096), 32, 2, 2));
  EXPECT_TRUE(is(gemv_default_config(DType::Q4_K, 6144, 4096), 32, 4, 1));
  EXPECT_TRUE(is(gemv_default_config(DType::Q4_K, 4096, 14336), 32, 4, 2));
  EXPECT_TRUE(is(gemv_default_config(DType::Q6_K, 4096, 4096), 64, 2, 1));
  EXPECT_TRUE(is(gemv_default_config(DType::IQ4_XS, 16384, 2048), 32, 8, 1));
  EXPECT_TRUE(is(gemv_default_config(DType::IQ4_NL, 4096, 14336), 64, 8, 1));
  EXPECT_TRUE(is(gemv_default_config(DType::IQ4_NL, 6144, 4096), 32, 4, 1));
  EXPECT_TRUE(is(gemv_default_config(DType::IQ4_NL, 576, 576), 128, 4, 1)) << "SmolLM2's rows keep q4_0's pick";
  EXPECT_TRUE(is(gemv_default_config(DType::Q8_0, 2048, 2048), 64, 4, 1));
  EXPECT_TRUE(is(gemv_default_config(DType::Q8_0, 576, 576), 64, 2, 1));
  const std::pair<int64_t, int64_t> shapes[] = {{576, 576},    {1536, 576},   {576, 1536},   {49152, 576}, {2048, 2048},
                                                {3072, 2048},  {16384, 2048}, {2048, 8192},  {4096, 4096}, {6144, 4096},
                                                {28672, 4096}, {4096, 14336}, {128256, 4096}};
  for (const DType d : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::IQ4_NL, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                        DType::IQ4_XS, DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K})
    for (const auto& [n, k] : shapes)
      EXPECT_TRUE(gemv_config_supported(d, gemv_default_config(d, n, k))) << dtype_name(d) << " " << n << "x" << k;
}

// The float GEMV's launch shapes are the swept ones (the pre-sweep shapes, TESSERA_CUDA_GEMV_PREV_SHAPES, left src/ for
// gemv_float_sweep.cu): four rows, one vector per row per step; 256 threads for rows of >= 512 vectors or >= 192
// vectors on at most 1,024 rows.
TEST(CudaOptions, FloatGemvLaunchShapesAreTheSweptOnes) {
  const GemvConfig big = gemv_default_config(DType::BF16, 4096, 4096);
  EXPECT_EQ(big.threads, 256);
  EXPECT_EQ(big.rows, 4);
  EXPECT_EQ(big.unroll, 1);
  const GemvConfig small = gemv_default_config(DType::BF16, 960, 576);
  EXPECT_EQ(small.threads, 128);
  EXPECT_EQ(small.rows, 4);
  const GemvConfig down = gemv_default_config(DType::F16, 576, 1536);
  EXPECT_EQ(down.threads, 256);
  const GemvConfig f32 = gemv_default_config(DType::F32, 4096, 4096);  // f32 keeps its own rule
  EXPECT_EQ(f32.rows, 2);
}

}  // namespace
}  // namespace tessera::cuda::test
