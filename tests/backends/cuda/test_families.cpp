// The families beyond Llama on the CUDA backend against the CPU backend: small random Hugging Face models of each
// family (Qwen2: q/k/v biases, BIAS_ADD; Qwen3: q/k norms, HEAD_RMSNORM; Mistral: every layer windowed; Phi-3: fused
// qkv_proj and gate_up_proj, split at load, and half-head rotary), written here as a config.json and one f32
// model.safetensors, loaded through tessera::Model and run by a cpu and a cuda Session: the prefill (chunks of 8, the
// rows executor) with every row's logits, then decode steps (the one-token decoder, its CUDA graph replayed).
// tests/data/hf's tiny models have head sizes 8 and 16, which the CUDA attention kernels do not take (64, 128, 256):
// these models have the tiny models' layout at head size 64. Gemma 3 once with both layers global (GEGLU, SCALE,
// SOFTCAP, HEAD_RMSNORM, sandwich norms) and once with a local layer of window 4 (windowed attention kernels); Mistral
// with a window of 4 on both layers (Tessera loads it as "llama" with a sliding window); Phi-3 with
// partial_rotary_factor 0.5 (rope on 32 of the 64 dimensions) and no window.
//
// Tolerance: f32 weights on both; both keep an f16 cache; the GPU's prefill attention rounds q and the probabilities
// to 16 bits for the tensor cores and sums in another order: 2% relative L2 error per row of logits (the synthetic
// Llama models' CudaPrefill bound is 3%).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/session.h"

namespace tessera {
namespace {

using cuda::test::worst_rel;

namespace fs = std::filesystem;

struct Family {
  const char* name;  // model_type
  bool bias = false, qk_norm = false, windowed = false;
  int64_t head_dim = 64;  // Gemma 3 270M's is 256 (CudaFamilyWindow.Gemma3HeadSize256MatchesCpu)
};

// The architecture Tessera loads a family as: Mistral is a Llama with a sliding window (models/config_hf.cpp).
std::string loaded_architecture(const Family& fam) { return std::string(fam.name) == "mistral" ? "llama" : fam.name; }

// Every family: Qwen2, Qwen3, Gemma 3 (all global; a local layer of window 4), Mistral (window 4), Phi-3.
const auto kFamilies =
    ::testing::Values(Family{"qwen2", true, false}, Family{"qwen3", false, true}, Family{"gemma3", false, true},
                      Family{"gemma3", false, true, true}, Family{"mistral", false, false, true}, Family{"phi3"});

std::string family_test_name(const ::testing::TestParamInfo<Family>& info) {
  return std::string(info.param.name) + (info.param.windowed ? "_swa" : "");
}

constexpr int64_t kEmbd = 256, kHeads = 4, kHeadsKv = 2, kHeadDim = 64, kFf = 512, kVocab = 256, kLayers = 2;

using cuda::test::SafetensorsEntry;
using cuda::test::write_safetensors;

// A random model of family `fam` in a fresh directory (removed by the caller).
std::string write_model(const Family& fam, uint32_t seed) {
  const int64_t hd = fam.head_dim;
  const std::string family = fam.name;
  const bool gemma = family == "gemma3", phi3 = family == "phi3";
  const fs::path dir = fs::temp_directory_path() /
                       ("tessera_family_" + family + (fam.windowed ? "_swa_" : "_") + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ostringstream c;
  c << "{\"architectures\":[\""
    << (gemma                 ? std::string("Gemma3")
        : family == "qwen2"   ? std::string("Qwen2")
        : family == "qwen3"   ? std::string("Qwen3")
        : family == "mistral" ? std::string("Mistral")
                              : std::string("Phi3"))
    << "ForCausalLM\"],\"model_type\":\"" << (gemma ? "gemma3_text" : family) << "\",\"hidden_size\":" << kEmbd
    << ",\"intermediate_size\":" << kFf << ",\"num_attention_heads\":" << kHeads
    << ",\"num_key_value_heads\":" << kHeadsKv << ",\"head_dim\":" << hd << ",\"num_hidden_layers\":" << kLayers
    << ",\"vocab_size\":" << kVocab
    << ",\"max_position_embeddings\":2048,\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0";
  if (gemma) {
    // Gemma 3: GEGLU, the embedding scale, q/k norms, sandwich norms, final softcapping; a window of 4 on the first
    // layer when windowed (else both layers global, so every op but the window runs on the GPU).
    c << ",\"hidden_activation\":\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":" << hd
      << ",\"final_logit_softcapping\":5.0,\"rope_local_base_freq\":10000.0,\"sliding_window\":4,"
         "\"tie_word_embeddings\":true,\"layer_types\":[\""
      << (fam.windowed ? "sliding" : "full") << "_attention\",\"full_attention\"]}";
  } else if (family == "mistral") {
    // Mistral: Llama's layout; a window of 4 on every layer when windowed (null: full attention).
    c << ",\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"sliding_window\":" << (fam.windowed ? "4" : "null")
      << "}";
  } else if (phi3) {
    // Phi-3 (the keys of tests/data/hf/tiny-phi3-f32 and Phi-3-mini's): fused projections, rope on half of each head.
    c << ",\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"original_max_position_embeddings\":2048,"
         "\"partial_rotary_factor\":0.5,\"rope_scaling\":null,\"attention_dropout\":0.0,\"embd_pdrop\":0.0,"
         "\"resid_pdrop\":0.0,\"sliding_window\":"
      << (fam.windowed ? "4" : "null") << "}";
  } else {
    c << ",\"hidden_act\":\"silu\",\"tie_word_embeddings\":false,\"use_sliding_window\":false,"
         "\"sliding_window\":null,\"attention_bias\":"
      << (fam.bias ? "true" : "false") << "}";
  }
  std::ofstream(dir / "config.json") << c.str();
  std::mt19937 rng(seed);
  const auto uniform = [&](std::vector<int64_t> shape, float center, float half) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<float> u(center - half, center + half);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
  };
  std::vector<SafetensorsEntry> e;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, float center, float half) {
    e.push_back({name, shape, uniform(shape, center, half)});
  };
  // Weights ~1/sqrt(K) so activations keep their scale; norm weights near 1; biases large enough to matter.
  const float w_in = 1.0f / std::sqrt(float(kEmbd)), w_ff = 1.0f / std::sqrt(float(kFf));
  add("model.embed_tokens.weight", {kVocab, kEmbd}, 0.0f, 1.0f);
  const float norm = gemma ? 0.0f : 1.0f;  // Gemma's RMSNorm multiplies by (1 + w)
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kEmbd}, norm, 0.2f);
    add(p + "post_attention_layernorm.weight", {kEmbd}, norm, 0.2f);
    if (gemma) {
      add(p + "pre_feedforward_layernorm.weight", {kEmbd}, norm, 0.2f);
      add(p + "post_feedforward_layernorm.weight", {kEmbd}, norm, 0.2f);
    }
    if (phi3) {  // q | k | v stacked by rows
      add(p + "self_attn.qkv_proj.weight", {(kHeads + 2 * kHeadsKv) * hd, kEmbd}, 0.0f, 2 * w_in);
    } else {
      add(p + "self_attn.q_proj.weight", {kHeads * hd, kEmbd}, 0.0f, 2 * w_in);
      add(p + "self_attn.k_proj.weight", {kHeadsKv * hd, kEmbd}, 0.0f, 2 * w_in);
      add(p + "self_attn.v_proj.weight", {kHeadsKv * hd, kEmbd}, 0.0f, 2 * w_in);
    }
    add(p + "self_attn.o_proj.weight", {kEmbd, kHeads * hd}, 0.0f, w_in);
    if (fam.bias) {
      add(p + "self_attn.q_proj.bias", {kHeads * hd}, 0.0f, 0.5f);
      add(p + "self_attn.k_proj.bias", {kHeadsKv * hd}, 0.0f, 0.5f);
      add(p + "self_attn.v_proj.bias", {kHeadsKv * hd}, 0.0f, 0.5f);
    }
    if (fam.qk_norm) {
      add(p + "self_attn.q_norm.weight", {hd}, norm, 0.5f);
      add(p + "self_attn.k_norm.weight", {hd}, norm, 0.5f);
    }
    if (phi3) {  // gate | up stacked by rows (gate first)
      add(p + "mlp.gate_up_proj.weight", {2 * kFf, kEmbd}, 0.0f, 2 * w_in);
    } else {
      add(p + "mlp.gate_proj.weight", {kFf, kEmbd}, 0.0f, 2 * w_in);
      add(p + "mlp.up_proj.weight", {kFf, kEmbd}, 0.0f, 2 * w_in);
    }
    add(p + "mlp.down_proj.weight", {kEmbd, kFf}, 0.0f, w_ff);
  }
  add("model.norm.weight", {kEmbd}, norm, 0.2f);
  if (!gemma) add("lm_head.weight", {kVocab, kEmbd}, 0.0f, 2 * w_in);  // Gemma ties it to the embedding
  write_safetensors((dir / "model.safetensors").string(), e);
  return dir.string();
}

// The written models themselves, on the CPU only (runs without a GPU): they load as their family, and the fast path
// agrees with the f32 reference, so a failure of the GPU comparison below is the GPU's.
class CudaFamilyModel : public ::testing::TestWithParam<Family> {};

TEST_P(CudaFamilyModel, LoadsAndRunsOnCpu) {
  const Family fam = GetParam();
  const std::string dir = write_model(fam, 3);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  fs::remove_all(dir);
  EXPECT_EQ(m.spec().architecture, loaded_architecture(fam));
  EXPECT_EQ(m.spec().head_dim, kHeadDim);
  // Gemma 3 writes its window of 4 either way (layer_types choose the local layers); the others only when windowed.
  EXPECT_EQ(m.spec().sliding_window, fam.windowed || std::string(fam.name) == "gemma3" ? 4 : 0);
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(int32_t((i * 37 + 5) % kVocab));
  Session ref(m, {.n_ctx = 64, .n_batch = 8, .n_threads = 2, .reference = true});
  Session fast(m, {.n_ctx = 64, .n_batch = 8, .n_threads = 2});
  const std::vector<float> a = ref.eval_all_logits(ids);
  double rms = 0;
  for (float x : a) rms += double(x) * x;
  EXPECT_GT(std::sqrt(rms / double(a.size())), 1e-3) << "the logits vanish";
  EXPECT_LE(worst_rel(a, fast.eval_all_logits(ids), kVocab), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaFamilyModel, kFamilies, family_test_name);

// A cpu and a cuda session of `m` (the CPU's `co`, the same on the GPU): the worst relative L2 error per row of
// every prompt row's logits (prefill in chunks of co.n_batch), then of 8 decode steps after it.
struct CpuGpuErrors {
  double prefill = 0, decode = 0;
};
CpuGpuErrors compare_with_cpu(const Model& m, const std::vector<int32_t>& ids, const SessionOptions& co) {
  SessionOptions go = co;
  go.device = "cuda";
  Session cpu(m, co), gpu(m, go);
  CpuGpuErrors e;
  e.prefill = worst_rel(cpu.eval_all_logits(ids), gpu.eval_all_logits(ids), kVocab);
  std::vector<float> da, db;
  for (int i = 0; i < 8; ++i) {
    const int32_t id = int32_t((i * 53 + 11) % kVocab);
    const std::span<const float> x = cpu.decode(id);
    da.insert(da.end(), x.begin(), x.end());
    const std::span<const float> y = gpu.decode(id);
    db.insert(db.end(), y.begin(), y.end());
  }
  e.decode = worst_rel(da, db, kVocab);
  return e;
}

class CudaFamily : public ::testing::TestWithParam<Family> {};

TEST_P(CudaFamily, MatchesCpu) {
  TESSERA_REQUIRE_GPU();
  const Family fam = GetParam();
  const std::string dir = write_model(fam, 3);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  fs::remove_all(dir);  // the weights are mapped
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(int32_t((i * 37 + 5) % kVocab));
  SessionOptions co{.n_ctx = 64, .n_batch = 8, .n_threads = 2};
  constexpr double kTol = 2e-2;
  const auto [prefill, decode] = compare_with_cpu(m, ids, co);
  EXPECT_LE(prefill, kTol) << fam.name << " prefill (chunks of 8)";
  EXPECT_LE(decode, kTol) << fam.name << " decode after prefill";
  std::printf("%s: worst relative L2 error prefill %.3g, decode %.3g\n", fam.name, prefill, decode);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaFamily, kFamilies, family_test_name);

// Gemma 3 with a local layer of window 4 at long contexts: a prefill of 700 ids in chunks of 256 (the rows
// executor's attn_prefill for the local layer, the TMA kernel or cuDNN for the global one) and decode steps past the
// short-context kernel's reach (n_ctx 1024: the split-K kernel, whose chunks below the window hold no key).
TEST(CudaFamilyWindow, Gemma3LongContextMatchesCpu) {
  TESSERA_REQUIRE_GPU();
  const std::string dir = write_model(Family{"gemma3", false, true, true}, 5);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  fs::remove_all(dir);
  std::vector<int32_t> ids;
  for (int i = 0; i < 700; ++i) ids.push_back(int32_t((i * 37 + 5) % kVocab));
  SessionOptions co{.n_ctx = 1024, .n_batch = 256, .n_threads = 2};
  constexpr double kTol = 2e-2;
  const auto [prefill, decode] = compare_with_cpu(m, ids, co);
  EXPECT_LE(prefill, kTol) << "prefill (chunks of 256)";
  EXPECT_LE(decode, kTol) << "decode at positions 700-707";
  std::printf("gemma3 window 4, 700 positions: worst relative L2 error prefill %.3g, decode %.3g\n", prefill, decode);
}

// Gemma 3 at its real head size, 256 (the 270M's: 4 heads over 1 kv head there; 4 over 2 here), a local layer of
// window 4 and a global one: prefill chunks of 128 (attn_prefill's one-row-tile shape at head size 256, windowed and
// not) and decode steps (the decode kernels at head size 256).
TEST(CudaFamilyWindow, Gemma3HeadSize256MatchesCpu) {
  TESSERA_REQUIRE_GPU();
  const std::string dir = write_model(Family{"gemma3", false, true, true, 256}, 9);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  fs::remove_all(dir);
  ASSERT_EQ(m.spec().head_dim, 256);
  std::vector<int32_t> ids;
  for (int i = 0; i < 300; ++i) ids.push_back(int32_t((i * 41 + 3) % kVocab));
  SessionOptions co{.n_ctx = 512, .n_batch = 128, .n_threads = 2};
  constexpr double kTol = 2e-2;
  const auto [prefill, decode] = compare_with_cpu(m, ids, co);
  EXPECT_LE(prefill, kTol) << "prefill (chunks of 128)";
  EXPECT_LE(decode, kTol) << "decode at positions 300-307";
  std::printf("gemma3 head size 256, window 4: worst relative L2 error prefill %.3g, decode %.3g\n", prefill, decode);
}

// ---- LoRA on the CUDA backend (docs/LORA.md): the CPU runs adapters in its fused step, CUDA as the graph's unfused
// products (x·Aᵀ, then ·Bᵀ, added to the base matmul's output), or merged into the weights at load.

// A random rank-4 PEFT adapter on all seven projections of write_model's layout (B large enough to move the logits).
std::string write_adapter(uint32_t seed) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_lora_cuda_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  cuda::test::write_peft_adapter(dir.string(), kLayers, kEmbd, kHeads * kHeadDim, kHeadsKv * kHeadDim, kFf, 4, 0.3f,
                                 seed);
  return dir.string();
}

// Prefill (chunks of 8) and decode logits of one session.
std::vector<float> prefill_and_decode(Session& s, const std::vector<int32_t>& ids) {
  std::vector<float> out = s.eval_all_logits(ids);
  for (int i = 0; i < 6; ++i) {
    const std::span<const float> x = s.decode(int32_t((i * 53 + 11) % kVocab));
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

// The adapter on the CPU alone (runs without a GPU): it moves the logits well past the GPU comparison's tolerance, so
// a CUDA session that dropped the adapter fails below.
TEST(CudaLoraModel, TheAdapterMovesTheCpuLogits) {
  const std::string dir = write_model(Family{"qwen3", false, true}, 7), adapter = write_adapter(11);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(int32_t((i * 37 + 5) % kVocab));
  SessionOptions base{.n_ctx = 64, .n_batch = 8, .n_threads = 2};
  SessionOptions adapted = base;
  adapted.lora = {LoraSpec{adapter, 1.0f}};
  Session a(m, base), b(m, adapted);
  const double moved = worst_rel(prefill_and_decode(a, ids), prefill_and_decode(b, ids), kVocab);
  fs::remove_all(dir);
  fs::remove_all(adapter);
  EXPECT_GT(moved, 0.2) << "the adapter hardly changes the logits: the CUDA comparison could not tell it was applied";
}

TEST(CudaLora, UnmergedAndMergedMatchCpu) {
  TESSERA_REQUIRE_GPU();
  const std::string dir = write_model(Family{"qwen3", false, true}, 7), adapter = write_adapter(11);
  const Model m = Model::load(dir, {.load_tokenizer = false});
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(int32_t((i * 37 + 5) % kVocab));
  SessionOptions co{.n_ctx = 64, .n_batch = 8, .n_threads = 2};
  co.lora = {LoraSpec{adapter, 1.0f}};
  SessionOptions go = co;
  go.device = "cuda";
  SessionOptions gm = go;
  gm.lora_merge = true;
  Session cpu(m, co), gpu(m, go), merged(m, gm);
  const std::vector<float> want = prefill_and_decode(cpu, ids);
  const double unmerged_err = worst_rel(want, prefill_and_decode(gpu, ids), kVocab);
  const double merged_err = worst_rel(want, prefill_and_decode(merged, ids), kVocab);
  fs::remove_all(dir);
  fs::remove_all(adapter);
  EXPECT_LE(unmerged_err, 2e-2) << "unmerged adapters on CUDA";
  EXPECT_LE(merged_err, 2e-2) << "merged adapters on CUDA";
  std::printf("lora on cuda: worst relative L2 error unmerged %.3g, merged %.3g\n", unmerged_err, merged_err);
}

}  // namespace
}  // namespace tessera
