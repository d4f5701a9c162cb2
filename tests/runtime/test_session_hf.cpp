// The tiny Hugging Face models of tests/data/hf (bf16 tied Llama, f32 Llama 3 with llama3 rope scaling, f16 Mistral
// in two shards; the other families against transformers' logits, FamilyHf below) run by the engine, against the naive
// forward pass of naive_llama.h fed straight from the safetensors files under their Hugging Face names, with the
// configuration read from config.json here: checks the whole safetensors path (renaming, NeoX rotation, head_dim !=
// hidden/heads, rope scaling, bf16/f16 weights).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "models/model_weights.h"
#include "naive_llama.h"
#include "quant/quant.h"
#include "runtime/session.h"
#include "test_util.h"

namespace tessera::runtime {
namespace {

// Hugging Face's name for a GGUF-style one (written out here, independently of hf_to_gguf_name).
std::string hf_name(const std::string& g) {
  static const std::map<std::string, std::string> kBlock = {
      {"attn_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},   {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},   {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},    {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  const size_t dot = g.find('.', 4);  // "blk.N."
  return "model.layers." + g.substr(4, dot - 4) + "." + kBlock.at(g.substr(dot + 1));
}

class HfModel : public ::testing::TestWithParam<const char*> {};

TEST_P(HfModel, MatchesNaiveForward) {
  const std::string dir = test::data_path(std::string("hf/") + GetParam());
  nlohmann::json cfg;
  std::ifstream(dir + "/config.json") >> cfg;
  test::NaiveSpec s;
  s.n_layers = cfg["num_hidden_layers"];
  s.n_embd = cfg["hidden_size"];
  s.n_head = cfg["num_attention_heads"];
  s.n_head_kv = cfg["num_key_value_heads"];
  s.head_dim = cfg.value("head_dim", s.n_embd / s.n_head);
  s.n_ff = cfg["intermediate_size"];
  s.n_vocab = cfg["vocab_size"];
  s.eps = cfg["rms_norm_eps"];
  s.neox = true;
  s.tied = cfg.value("tie_word_embeddings", false);
  const double base = cfg["rope_theta"];
  for (int64_t i = 0; i < s.head_dim / 2; ++i)
    s.inv_freq.push_back(std::pow(base, -2.0 * double(i) / double(s.head_dim)));
  if (cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object()) {
    // transformers' _compute_llama3_parameters
    const auto& r = cfg["rope_scaling"];
    ASSERT_EQ(r["rope_type"], "llama3");
    const double factor = r["factor"], lo = r["low_freq_factor"], hi = r["high_freq_factor"];
    const double old = r["original_max_position_embeddings"];
    for (double& f : s.inv_freq) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > old / lo) {
        f /= factor;
      } else if (wavelen >= old / hi) {
        const double smooth = (old / wavelen - lo) / (hi - lo);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
  }
  const safetensors::Model st = safetensors::Model::open(dir);
  std::map<std::string, std::vector<float>> cache;
  const test::WeightFn weights = [&](const std::string& g) -> const std::vector<float>& {
    auto it = cache.find(g);
    if (it != cache.end()) return it->second;
    const TensorView* t = st.find_tensor(hf_name(g));
    if (t == nullptr) throw std::runtime_error("missing " + hf_name(g));
    std::vector<float> v(static_cast<size_t>(t->numel()));
    dequantize_row(t->dtype, t->data, v.data(), t->numel());
    return cache.emplace(g, std::move(v)).first->second;
  };
  std::vector<int32_t> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(int32_t((i * 37 + 5) % s.n_vocab));
  const auto want = test::naive_forward(s, weights, ids);

  const ModelWeights w = ModelWeights::open(dir);
  for (bool reference : {true, false}) {
    SessionOptions so;
    so.n_ctx = 32;
    so.n_batch = 4;
    so.n_threads = 2;
    so.reference = reference;
    Engine e(w, nullptr, resolve_options(so, w.config()));
    const size_t V = size_t(s.n_vocab);
    std::vector<float> rows(ids.size() * V);
    e.eval(ids, rows.data());
    // bf16 / f16 weights are exact in f32; the fast path adds an f16 cache and its own accumulation order.
    const double tol = reference ? 1e-5 : 3e-3;
    for (size_t t = 0; t < ids.size(); ++t) {
      double scale = 0;
      for (double x : want[t]) scale = std::max(scale, std::fabs(x));
      for (size_t i = 0; i < V; ++i)
        ASSERT_NEAR(rows[t * V + i], want[t][i], tol * scale)
            << (reference ? "reference" : "fast") << " token " << t << " logit " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TinyHf, HfModel,
                         ::testing::Values("tiny-llama-bf16-tied", "tiny-llama3-f32", "tiny-mistral-sharded"));

// The families beyond Llama (Gemma 3 with local and global layers, Qwen2's biases, Qwen3's q/k norms, Mistral's
// sliding window, Phi-3's fused q|k|v and gate|up with half-head rotary) from their Hugging Face files, against
// transformers' own float64 forward of the same weights (tests/data/hf/tiny-*-f32/golden.json,
// python/make_family_hf_golden.py). Chunks of 4 tokens and windows of 4-5 keys: the windows drop keys of earlier
// chunks.
class FamilyHf : public ::testing::TestWithParam<const char*> {};

// A model folder's logits against a golden file of python/make_family_hf_golden.py (ids and transformers' float64
// logits), on the reference and the fast path, at context n_ctx.
void expect_golden_logits(const std::string& dir, const std::string& golden_file, int64_t n_ctx) {
  nlohmann::json golden;
  std::ifstream(dir + "/" + golden_file) >> golden;
  const std::vector<int32_t> ids = golden["ids"].get<std::vector<int32_t>>();
  const auto want = golden["logits"].get<std::vector<std::vector<double>>>();
  const ModelWeights w = ModelWeights::open(dir);
  for (bool reference : {true, false}) {
    SessionOptions so;
    so.n_ctx = n_ctx;
    so.n_batch = 4;
    so.n_threads = 2;
    so.reference = reference;
    Engine e(w, nullptr, resolve_options(so, w.config()));
    const size_t V = want[0].size();
    ASSERT_EQ(V, size_t(w.config().n_vocab));
    std::vector<float> rows(ids.size() * V);
    e.eval(ids, rows.data());
    // f32 weights: the reference path differs from float64 by f32 rounding only; the fast path adds an f16 cache.
    const double tol = reference ? 1e-5 : 3e-3;
    for (size_t t = 0; t < ids.size(); ++t) {
      double scale = 0;
      for (double x : want[t]) scale = std::max(scale, std::fabs(x));
      for (size_t i = 0; i < V; ++i)
        ASSERT_NEAR(rows[t * V + i], want[t][i], tol * scale)
            << golden_file << " " << (reference ? "reference" : "fast") << " token " << t << " logit " << i;
    }
  }
}

TEST_P(FamilyHf, MatchesTransformers) {
  expect_golden_logits(test::data_path(std::string("hf/") + GetParam()), "golden.json", 32);
}

// Phi-3's longrope: a session whose context stays within the original one (8) rotates with short_factor, a longer one
// with long_factor (FamilyHf runs the long case at n_ctx 32: transformers switches to it past 8 tokens). The two
// sets give different logits from the second token on, so reading the wrong one, or no attention factor, fails.
TEST(FamilyHfLongrope, ShortContextRotatesWithTheShortFactors) {
  const std::string dir = test::data_path("hf/tiny-phi3-longrope-f32");
  const ModelConfig c = ModelWeights::open(dir).config();
  EXPECT_EQ(c.rope_scaling.type, "longrope");
  EXPECT_NEAR(c.rope_scaling.attn_factor, std::sqrt(2.0), 1e-6);  // transformers' default from 64 / 8
  expect_golden_logits(dir, "golden_short.json", 8);
}

// YaRN as transformers reads it (FamilyHf compares the logits): the factor, the original context, the default band
// and the attention factor 0.1 ln(factor) + 1.
TEST(FamilyHfYarn, ConfigAsTransformersReadsIt) {
  const ModelConfig c = ModelWeights::open(test::data_path("hf/tiny-qwen3-yarn-f32")).config();
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_context, 4096);
  EXPECT_FLOAT_EQ(c.rope_scaling.beta_fast, 32.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.beta_slow, 1.0f);
  EXPECT_NEAR(c.rope_scaling.attn_factor, 0.1 * std::log(4.0) + 1.0, 1e-6);
}

// The default context stays within the window only where every layer slides (Mistral: the window then drops nothing
// and the CUDA executors, which read no window, run the model); Gemma 3's global layers keep the trained context.
TEST(FamilyHfContext, DefaultCappedOnlyWhenEveryLayerSlides) {
  const ModelConfig gemma = ModelWeights::open(test::data_path("hf/tiny-gemma3-f32")).config();
  const ModelConfig mistral = ModelWeights::open(test::data_path("hf/tiny-mistral-f32")).config();
  EXPECT_EQ(resolve_options(SessionOptions{}, gemma).n_ctx, gemma.n_ctx_train);
  EXPECT_EQ(resolve_options(SessionOptions{}, mistral).n_ctx, mistral.sliding_window);
  SessionOptions longer;
  longer.n_ctx = 64;  // asked for: past the window, which the CPU applies
  EXPECT_EQ(resolve_options(longer, mistral).n_ctx, 64);
}

// BitNet b1.58 (and Falcon3's 1.58-bit Llama form) from transformers' packed checkpoints (ternary weights four per
// uint8 with a weight_scale, python/make_bitnet_hf_golden.py), against transformers' own f32 forward of those files.
// Every ternary linear quantizes its input to int8 per token: a value that lands near a rounding boundary takes the
// other int8 level under any perturbation (one level is 1/127 of the row's largest magnitude), so the logits agree
// to int8 precision, not f32's. The f32 paths (reference, and the fast kernels with an f32 KV cache) perturb only
// by summation order: 1e-2 of the logit scale and every top-1. The default f16 KV cache rounds keys and values to
// 11 bits (relative 5e-4), which moves x * 127 / max|x| by up to 0.06 of a level after attention: a few percent of
// the o projection's inputs change level, as a second int8 rounding would: 5e-2 of the scale, top-1 at 90%.
// Measured (AVX2, this data): f32 paths 2.8e-7..4.6e-7 (no level changed), f16 cache 1.1e-2..4.3e-2, top-1 10/10.
// tiny-bitnet-256's linears load as TQ2_0 (rows of whole 256-blocks): its one fp16 scale per block rounds BitLinear's
// f32 1/weight_scale (relative 2^-11, which moves levels as the f16 cache does, even in the reference path), and the
// native kernel rounds the already-int8 activations again to its own 8-bit blocks of 32 (a block's step is at most the
// row's, so up to half a BitLinear level more per input, in every linear): the f16 cache's bound, doubled, 1e-1 of the
// scale and top-1 at 90%. Measured (AVX-512, this data): reference 2.6e-2, fast 5.2e-2..5.5e-2, top-1 10/10.
struct BitNetAgreement {
  double max_rel = 0;  // max over positions of max_i |got - want| / max_i |want|
  size_t top1 = 0;     // positions whose argmax matches
};

BitNetAgreement bitnet_agreement(const ModelWeights& w, const nlohmann::json& golden, bool reference, const char* kv) {
  const std::vector<int32_t> ids = golden["ids"].get<std::vector<int32_t>>();
  const auto want = golden["logits"].get<std::vector<std::vector<double>>>();
  SessionOptions so;
  so.n_ctx = 32;
  so.n_batch = 4;
  so.n_threads = 2;
  so.reference = reference;
  so.kv_dtype = kv;
  Engine e(w, nullptr, resolve_options(so, w.config()));
  const size_t V = want[0].size();
  std::vector<float> rows(ids.size() * V);
  e.eval(ids, rows.data());
  BitNetAgreement a;
  for (size_t t = 0; t < ids.size(); ++t) {
    double scale = 0, err = 0;
    size_t best_want = 0, best_got = 0;
    for (size_t i = 0; i < V; ++i) {
      scale = std::max(scale, std::fabs(want[t][i]));
      err = std::max(err, std::fabs(rows[t * V + i] - want[t][i]));
      if (want[t][i] > want[t][best_want]) best_want = i;
      if (rows[t * V + i] > rows[t * V + best_got]) best_got = i;
    }
    a.max_rel = std::max(a.max_rel, err / scale);
    a.top1 += best_want == best_got;
  }
  return a;
}

class BitNetHf : public ::testing::TestWithParam<const char*> {};

TEST_P(BitNetHf, MatchesTransformers) {
  const std::string dir = test::data_path(std::string("hf/") + GetParam());
  nlohmann::json golden;
  std::ifstream(dir + "/golden.json") >> golden;
  const size_t n = golden["ids"].size();
  const ModelWeights w = ModelWeights::open(dir);
  EXPECT_TRUE(w.config().act_quant_i8);
  ASSERT_EQ(golden["logits"][0].size(), size_t(w.config().n_vocab));
  struct Case {
    const char* name;
    bool reference;
    const char* kv;
    double max_rel;
    size_t min_top1;
  };
  const bool tq2_0 = w.find("blk.0.attn_q.weight")->dtype == DType::TQ2_0;
  for (Case c : {Case{"reference", true, "f32", 1e-2, n}, Case{"fast, f32 cache", false, "f32", 1e-2, n},
                 Case{"fast, f16 cache", false, "f16", 5e-2, n * 9 / 10}}) {
    if (tq2_0) {
      c.max_rel = 1e-1;
      c.min_top1 = n * 9 / 10;
    }
    const BitNetAgreement a = bitnet_agreement(w, golden, c.reference, c.kv);
    std::printf("[ bitnet   ] %s %s: max |err| / scale %.2e, top-1 %zu/%zu\n", GetParam(), c.name, a.max_rel, a.top1,
                n);
    EXPECT_LE(a.max_rel, c.max_rel) << c.name;
    EXPECT_GE(a.top1, c.min_top1) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyHf, BitNetHf,
                         ::testing::Values("tiny-bitnet-autobitlinear", "tiny-bitnet-bitlinear",
                                           "tiny-falcon3-bitlinear", "tiny-bitnet-256"));

// The MatMul-free LM (hgrn_bit) from its Hugging Face layout (random f32 weights, ternarized at load), against the
// numpy forward of python/hgrn_bit_reference.py (tests/data/hf/tiny-hgrn-bit-f32, python/make_hgrn_bit_golden.py).
// Chunks of 5 and of 1 token: the recurrent state carries across chunk boundaries and through one-token steps. The
// int8 activations bound the agreement as for BitNet. Each layer's ffn_down (rows of 256) loads as TQ2_0, whose
// kernel rounds its int8 inputs again to its own 8-bit blocks of 32, up to half a BitLinear level more (see
// BitNetAgreement): the TQ2_0 bound there, 1e-1 of the logit scale and top-1 at 90% (measured on AVX-512: 4.8e-2,
// one of the 10 tokens' top-1 flipped; with float weights it was under 1e-2 and every top-1).
constexpr double kHgrnTol = 1e-1;

TEST(HgrnBitHf, MatchesNumpyReference) {
  const std::string dir = test::data_path("hf/tiny-hgrn-bit-f32");
  nlohmann::json golden;
  std::ifstream(dir + "/golden.json") >> golden;
  const std::vector<int32_t> ids = golden["ids"].get<std::vector<int32_t>>();
  const auto want = golden["logits"].get<std::vector<std::vector<double>>>();
  const ModelWeights w = ModelWeights::open(dir);
  EXPECT_EQ(w.config().architecture, "hgrn_bit");
  double worst = 0;  // max |got - want| / logit scale
  for (const int64_t n_batch : {5, 1})
    for (bool reference : {true, false}) {
      SessionOptions so;
      so.n_ctx = 32;
      so.n_batch = n_batch;
      so.n_threads = 2;
      so.reference = reference;
      Engine e(w, nullptr, resolve_options(so, w.config()));
      const size_t V = want[0].size();
      ASSERT_EQ(V, size_t(w.config().n_vocab));
      // Twice: a second prompt from position 0 must start from a zero state, not the first prompt's.
      for (int pass = 0; pass < 2; ++pass) {
        e.truncate(0);
        std::vector<float> rows(ids.size() * V);
        e.eval(ids, rows.data());
        size_t top1 = 0;
        for (size_t t = 0; t < ids.size(); ++t) {
          double scale = 0;
          size_t best_want = 0, best_got = 0;
          for (size_t i = 0; i < V; ++i) {
            scale = std::max(scale, std::fabs(want[t][i]));
            if (want[t][i] > want[t][best_want]) best_want = i;
            if (rows[t * V + i] > rows[t * V + best_got]) best_got = i;
          }
          top1 += best_got == best_want;
          for (size_t i = 0; i < V; ++i) worst = std::max(worst, std::fabs(rows[t * V + i] - want[t][i]) / scale);
          for (size_t i = 0; i < V; ++i)
            ASSERT_NEAR(rows[t * V + i], want[t][i], kHgrnTol * scale)
                << (reference ? "reference" : "fast") << " n_batch " << n_batch << " pass " << pass << " token " << t
                << " logit " << i;
        }
        EXPECT_GE(top1, ids.size() * 9 / 10) << (reference ? "reference" : "fast") << " n_batch " << n_batch;
      }
      // Going back to an earlier position is refused: the state holds the later tokens.
      e.truncate(4);
      EXPECT_THROW(e.eval(std::span<const int32_t>(ids).subspan(4, 2)), Error);
    }
  std::printf("[ hgrn_bit ] chunks of 5 and 1: max |err| / scale %.2e\n", worst);
}

// Two sequence slots decoded together keep two recurrent states: slot 1 runs the prompt shifted by three tokens, so a
// state shared between slots (or bound to the wrong one) changes both rows' logits.
TEST(HgrnBitHf, EachSlotKeepsItsOwnState) {
  const std::string dir = test::data_path("hf/tiny-hgrn-bit-f32");
  nlohmann::json golden;
  std::ifstream(dir + "/golden.json") >> golden;
  const std::vector<int32_t> ids = golden["ids"].get<std::vector<int32_t>>();
  const auto want = golden["logits"].get<std::vector<std::vector<double>>>();
  const ModelWeights w = ModelWeights::open(dir);
  SessionOptions so;
  so.n_ctx = 32;
  so.n_seq = 2;
  so.n_threads = 2;
  Engine e(w, nullptr, resolve_options(so, w.config()));
  e.eval_seq(1, std::span<const int32_t>(ids).subspan(0, 3));
  const size_t V = want[0].size();
  double worst = 0;
  for (size_t t = 0; t + 3 < ids.size(); ++t) {
    const std::vector<int32_t> toks = {ids[t], ids[t + 3]}, seqs = {0, 1};
    const std::span<const float> rows = e.decode_batch(toks, seqs);
    double scale0 = 0, scale1 = 0;
    for (size_t i = 0; i < V; ++i) {
      scale0 = std::max(scale0, std::fabs(want[t][i]));
      scale1 = std::max(scale1, std::fabs(want[t + 3][i]));
    }
    for (size_t i = 0; i < V; ++i) {
      worst =
          std::max({worst, std::fabs(rows[i] - want[t][i]) / scale0, std::fabs(rows[V + i] - want[t + 3][i]) / scale1});
    }
    for (size_t i = 0; i < V; ++i) {
      ASSERT_NEAR(rows[i], want[t][i], kHgrnTol * scale0) << "slot 0 token " << t << " logit " << i;
      ASSERT_NEAR(rows[V + i], want[t + 3][i], kHgrnTol * scale1) << "slot 1 token " << t + 3 << " logit " << i;
    }
  }
  std::printf("[ hgrn_bit ] two slots: max |err| / scale %.2e\n", worst);
}

INSTANTIATE_TEST_SUITE_P(TinyHf, FamilyHf,
                         ::testing::Values("tiny-gemma3-f32", "tiny-qwen2-f32", "tiny-qwen3-f32", "tiny-mistral-f32",
                                           "tiny-phi3-f32", "tiny-phi3-longrope-f32", "tiny-qwen3-yarn-f32"));

}  // namespace
}  // namespace tessera::runtime
