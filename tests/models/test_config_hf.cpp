// config_from_hf: the tiny models' config.json against the ModelConfig python/make_tiny_hf_model.py expects, then
// mutations of a real config (defaults of transformers' LlamaConfig / MistralConfig, rope variants, errors).
#include <gtest/gtest.h>

#include <string>

#include "formats/safetensors.h"
#include "formats/test_safetensors_util.h"
#include "models/config.h"

namespace tessera {
namespace {

using nlohmann::json;

json config_of(const std::string& model) { return test::load_json(test::data_path("hf/" + model + "/config.json")); }

ModelConfig parse(const json& j) { return config_from_hf(j, "config.json"); }

void expect_config(const ModelConfig& c, const json& g) {
  EXPECT_EQ(c.architecture, g["architecture"].get<std::string>());
  EXPECT_EQ(c.n_layers, g["n_layers"].get<int64_t>());
  EXPECT_EQ(c.n_embd, g["n_embd"].get<int64_t>());
  EXPECT_EQ(c.n_head, g["n_head"].get<int64_t>());
  EXPECT_EQ(c.n_head_kv, g["n_head_kv"].get<int64_t>());
  EXPECT_EQ(c.head_dim, g["head_dim"].get<int64_t>());
  EXPECT_EQ(c.n_ff, g["n_ff"].get<int64_t>());
  EXPECT_EQ(c.n_vocab, g["n_vocab"].get<int64_t>());
  EXPECT_EQ(c.n_ctx_train, g["n_ctx_train"].get<int64_t>());
  EXPECT_EQ(c.rope_base, static_cast<float>(g["rope_base"].get<double>()));
  EXPECT_EQ(c.rope_dim, g["rope_dim"].get<int64_t>());
  EXPECT_EQ(c.rope_neox, g["rope_neox"].get<bool>());
  const json& rs = g["rope_scaling"];
  EXPECT_EQ(c.rope_scaling.type, rs["type"].get<std::string>());
  EXPECT_EQ(c.rope_scaling.factor, static_cast<float>(rs["factor"].get<double>()));
  EXPECT_EQ(c.rope_scaling.low_freq_factor, static_cast<float>(rs["low_freq_factor"].get<double>()));
  EXPECT_EQ(c.rope_scaling.high_freq_factor, static_cast<float>(rs["high_freq_factor"].get<double>()));
  EXPECT_EQ(c.rope_scaling.original_context, rs["original_context"].get<int64_t>());
  EXPECT_EQ(c.norm_eps, static_cast<float>(g["norm_eps"].get<double>()));
  EXPECT_EQ(c.tied_output, g["tied_output"].get<bool>());
  EXPECT_EQ(c.sliding_window, g["sliding_window"].get<int64_t>());
}

TEST(ConfigHf, TinyModelsMatchGolden) {
  const json golden = test::hf_golden()["models"];
  ASSERT_EQ(golden.size(), 3u);
  for (const auto& [model, g] : golden.items()) {
    SCOPED_TRACE(model);
    const ModelConfig c = parse(config_of(model));
    expect_config(c, g["config"]);
    EXPECT_EQ(c.name, "tessera/" + model);
    // Through the loader too: the config it found is the same file.
    safetensors::Model m = safetensors::Model::open(test::data_path("hf/" + model));
    expect_config(config_from_hf(m.config_json(), m.config_path()), g["config"]);
  }
}

// Absent optional keys take transformers' LlamaConfig defaults.
TEST(ConfigHf, LlamaDefaults) {
  json j = config_of("tiny-llama3-f32");
  for (const char* k : {"num_key_value_heads", "head_dim", "rope_theta", "rope_scaling", "tie_word_embeddings",
                        "rms_norm_eps", "max_position_embeddings", "hidden_act", "attention_bias", "mlp_bias"})
    j.erase(k);
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.n_head_kv, c.n_head);
  EXPECT_EQ(c.head_dim, j["hidden_size"].get<int64_t>() / j["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(c.rope_dim, c.head_dim);
  EXPECT_EQ(c.rope_base, 10000.0f);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_FALSE(c.tied_output);
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.n_ctx_train, 2048);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.rope_neox);
  // null is the same as absent (transformers writes null for unset optional values).
  j["num_key_value_heads"] = nullptr;
  j["head_dim"] = nullptr;
  EXPECT_EQ(parse(j).n_head_kv, c.n_head);
}

TEST(ConfigHf, MistralSlidingWindow) {
  json j = config_of("tiny-mistral-sharded");
  EXPECT_EQ(parse(j).sliding_window, 0);  // null: full attention
  j["sliding_window"] = 4096;
  EXPECT_EQ(parse(j).sliding_window, 4096);
  j.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(parse(j).sliding_window, 4096);
  j["sliding_window"] = "wide";
  EXPECT_ERROR_HAS(parse(j), "'sliding_window' must be an integer");
}

TEST(ConfigHf, ModelTypeWhenArchitecturesAbsent) {
  json j = config_of("tiny-mistral-sharded");
  j.erase("architectures");
  EXPECT_EQ(parse(j).architecture, "llama");
  j["model_type"] = "gpt2";
  EXPECT_ERROR_HAS(parse(j), "model_type 'gpt2' is not supported");
  j.erase("model_type");
  EXPECT_ERROR_HAS(parse(j), "neither 'architectures' nor 'model_type'");
}

TEST(ConfigHf, UnsupportedArchitecture) {
  json j = config_of("tiny-llama3-f32");
  j["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_ERROR_HAS(parse(j), "config.json: architecture 'GPT2LMHeadModel' is not supported");
  j["architectures"] = json::array();
  EXPECT_ERROR_HAS(parse(j), "'architectures' must be a non-empty list");
  j["architectures"] = "LlamaForCausalLM";
  EXPECT_ERROR_HAS(parse(j), "'architectures' must be a non-empty list");
}

TEST(ConfigHf, MissingRequiredKeys) {
  for (const char* k : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"}) {
    json j = config_of("tiny-llama-bf16-tied");
    j.erase(k);
    EXPECT_ERROR_HAS(parse(j), std::string("config.json: required key '") + k + "' is missing");
  }
}

TEST(ConfigHf, WrongTypesAndNonPositive) {
  json j = config_of("tiny-llama-bf16-tied");
  j["hidden_size"] = "32";
  EXPECT_ERROR_HAS(parse(j), "'hidden_size' must be an integer, not \"32\"");
  j["hidden_size"] = 32.5;
  EXPECT_ERROR_HAS(parse(j), "'hidden_size' must be an integer");
  j["hidden_size"] = 0;
  EXPECT_ERROR_HAS(parse(j), "'hidden_size' must be positive (got 0)");
  j["hidden_size"] = -32;
  EXPECT_ERROR_HAS(parse(j), "'hidden_size' must be positive (got -32)");
  j["hidden_size"] = 1ull << 40;
  EXPECT_ERROR_HAS(parse(j), "'hidden_size' = 1099511627776 is out of range");
  j = config_of("tiny-llama-bf16-tied");
  j["rms_norm_eps"] = "small";
  EXPECT_ERROR_HAS(parse(j), "'rms_norm_eps' must be a number");
  j["rms_norm_eps"] = -1e-5;
  EXPECT_ERROR_HAS(parse(j), "'rms_norm_eps' must be a positive number");
  j = config_of("tiny-llama-bf16-tied");
  j["tie_word_embeddings"] = 1;
  EXPECT_ERROR_HAS(parse(j), "'tie_word_embeddings' must be true or false");
  j = config_of("tiny-llama-bf16-tied");
  j["rope_theta"] = 0;
  EXPECT_ERROR_HAS(parse(j), "'rope_theta' must be a positive number");
  EXPECT_ERROR_HAS(parse(json::array()), "config.json: is not a JSON object");
  j = config_of("tiny-llama-bf16-tied");
  j["num_hidden_layers"] = 1 << 20;  // passes the type check; ModelConfig::validate refuses it
  EXPECT_THROW(parse(j), Error);
}

TEST(ConfigHf, HeadsNotDividing) {
  json j = config_of("tiny-llama-bf16-tied");
  j["num_key_value_heads"] = 3;
  EXPECT_ERROR_HAS(parse(j), "num_attention_heads 4 is not divisible by num_key_value_heads 3");
  j = config_of("tiny-llama-bf16-tied");
  j.erase("head_dim");
  j["hidden_size"] = 30;
  EXPECT_ERROR_HAS(parse(j), "hidden_size 30 is not divisible by num_attention_heads 4");
  j["head_dim"] = 8;  // an explicit head_dim needs no divisibility
  EXPECT_EQ(parse(j).head_dim, 8);
}

TEST(ConfigHf, UnsupportedFeatures) {
  json j = config_of("tiny-llama-bf16-tied");
  j["hidden_act"] = "gelu";
  EXPECT_ERROR_HAS(parse(j), "hidden_act 'gelu' is not supported");
  j = config_of("tiny-llama-bf16-tied");
  j["attention_bias"] = true;
  EXPECT_ERROR_HAS(parse(j), "attention_bias is true");
  j = config_of("tiny-llama-bf16-tied");
  j["mlp_bias"] = true;
  EXPECT_ERROR_HAS(parse(j), "mlp_bias is true");
  j = config_of("tiny-llama-bf16-tied");
  j["quantization_config"] = {{"quant_method", "gptq"}};
  EXPECT_ERROR_HAS(parse(j), "quantization_config");
}

TEST(ConfigHf, RopeScalingVariants) {
  json j = config_of("tiny-llama-bf16-tied");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};  // legacy key "type", integer factor
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 2.0f);
  j["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_ERROR_HAS(parse(j), "config.json: rope_scaling of type 'linear' has no 'factor'");
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse(j).rope_scaling.type, "none");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}};
  c = parse(j);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_context, 4096);
  j["rope_scaling"] = {{"factor", 4.0}};
  EXPECT_ERROR_HAS(parse(j), "rope_scaling has neither 'rope_type' nor 'type'");
  j["rope_scaling"] = "llama3";
  EXPECT_ERROR_HAS(parse(j), "'rope_scaling' must be an object or null");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2.0}};
  EXPECT_ERROR_HAS(parse(j), "'factor' must be a positive number");
}

TEST(ConfigHf, RopeScalingLlama3NeedsAllParameters) {
  const json base = config_of("tiny-llama3-f32");
  for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    json j = base;
    j["rope_scaling"].erase(k);
    EXPECT_ERROR_HAS(parse(j), "rope_scaling of type 'llama3'");
  }
  json j = base;
  j["rope_scaling"]["low_freq_factor"] = 4.0;
  EXPECT_ERROR_HAS(parse(j), "low_freq_factor 4 must be below high_freq_factor 4");
}

// transformers 5 folds rope_theta and the scaling into rope_parameters.
TEST(ConfigHf, RopeParametersOfTransformers5) {
  json j = config_of("tiny-llama3-f32");
  const json rs = j["rope_scaling"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_base, 250000.0f);
  EXPECT_EQ(c.rope_scaling.type, "none");
  json p = rs;
  p["rope_theta"] = 500000.0;
  j["rope_parameters"] = p;
  c = parse(j);
  EXPECT_EQ(c.rope_base, 500000.0f);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, static_cast<float>(rs["factor"].get<double>()));
  EXPECT_EQ(c.rope_scaling.original_context, rs["original_max_position_embeddings"].get<int64_t>());
}

// The families beyond Llama: what each config.json turns into.
TEST(ConfigHf, Gemma3) {
  json j = config_of("tiny-llama3-f32");
  j.erase("rope_scaling");
  j.erase("rope_parameters");
  j.erase("hidden_act");
  j["architectures"] = {"Gemma3ForCausalLM"};
  j["hidden_size"] = 64;
  j["num_hidden_layers"] = 3;
  j["query_pre_attn_scalar"] = 16;
  j["sliding_window"] = 12;
  j["final_logit_softcapping"] = 30.0;
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  j.erase("tie_word_embeddings");
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_EQ(c.ffn_act, "gelu_tanh");
  EXPECT_TRUE(c.qk_norm && c.post_norms && c.tied_output && c.rope_neox);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.norm_weight_offset, 1.0f);
  EXPECT_EQ(c.embd_scale, 8.0f);  // sqrt(64)
  EXPECT_FLOAT_EQ(c.attn_scale, 0.25f);
  EXPECT_EQ(c.final_softcap, 30.0f);
  EXPECT_EQ(c.rope_base, 1e6f);
  EXPECT_EQ(c.rope_base_local, 1e4f);
  EXPECT_EQ(c.sliding_window, 12);
  EXPECT_TRUE(c.is_local_layer(0));
  EXPECT_FALSE(c.is_local_layer(1));
  EXPECT_TRUE(c.is_local_layer(2));
  j.erase("layer_types");  // transformers' pattern: every sixth layer is global
  j["num_hidden_layers"] = 12;
  const ModelConfig p = parse(j);
  for (int l = 0; l < 12; ++l) EXPECT_EQ(p.is_local_layer(l), (l + 1) % 6 != 0) << l;
  j["layer_types"] = {"sliding_attention"};
  EXPECT_ERROR_HAS(parse(j), "'layer_types' must list one type per layer");
  j["layer_types"] = std::vector<std::string>(12, "chunked_attention");
  EXPECT_ERROR_HAS(parse(j), "is not 'sliding_attention' or 'full_attention'");
  j.erase("layer_types");
  j["attn_logit_softcapping"] = 50.0;
  EXPECT_ERROR_HAS(parse(j), "attn_logit_softcapping is set");
  j.erase("attn_logit_softcapping");
  j["hidden_activation"] = "gelu";
  EXPECT_ERROR_HAS(parse(j), "hidden_activation 'gelu' is not supported");
}

TEST(ConfigHf, Qwen2AndQwen3) {
  json j = config_of("tiny-llama3-f32");
  j["architectures"] = {"Qwen2ForCausalLM"};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);
  j["use_sliding_window"] = true;
  EXPECT_ERROR_HAS(parse(j), "use_sliding_window is true");
  j.erase("use_sliding_window");
  j["architectures"] = {"Qwen3ForCausalLM"};
  c = parse(j);
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  j["attention_bias"] = true;
  EXPECT_ERROR_HAS(parse(j), "attention_bias is true");
  j.erase("architectures");
  j["model_type"] = "qwen3";
  j.erase("attention_bias");
  EXPECT_EQ(parse(j).architecture, "qwen3");
}

TEST(ConfigHf, Phi3) {
  json j = config_of("tiny-llama3-f32");
  j["architectures"] = {"Phi3ForCausalLM"};
  j["partial_rotary_factor"] = 0.5;
  j["sliding_window"] = 2047;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.architecture, "phi3");
  EXPECT_EQ(c.rope_dim, c.head_dim / 2);
  EXPECT_EQ(c.sliding_window, 2047);
  EXPECT_TRUE(c.is_local_layer(0));
  j["partial_rotary_factor"] = 1.5;
  EXPECT_ERROR_HAS(parse(j), "partial_rotary_factor 1.5 is above 1");
}

}  // namespace
}  // namespace tessera
