// config_from_gguf for the families beyond Llama, on GGUF metadata written here (gguf::Writer): what each
// architecture turns into (llama.cpp's conventions: Gemma 3's fixed local rope base and period, its 27B attention
// scale; NeoX rotation for Qwen, Gemma and Phi-3), and a bad value failing with one sentence naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "models/config.h"
#include "tessera/error.h"

namespace tessera {
namespace {

gguf::Writer base(const std::string& arch, uint32_t layers = 4) {
  gguf::Writer w;
  const std::string a = arch + ".";
  w.set("general.architecture", gguf::Value::from_string(arch));
  w.set(a + "block_count", gguf::Value::from_u32(layers));
  w.set(a + "embedding_length", gguf::Value::from_u32(64));
  w.set(a + "feed_forward_length", gguf::Value::from_u32(128));
  w.set(a + "attention.head_count", gguf::Value::from_u32(4));
  w.set(a + "attention.head_count_kv", gguf::Value::from_u32(2));
  w.set(a + "attention.key_length", gguf::Value::from_u32(32));
  w.set(a + "rope.freq_base", gguf::Value::from_f32(1e6f));
  const std::vector<float> embd(100 * 64, 0.0f);
  w.add_tensor("token_embd.weight", DType::F32, {100, 64}, embd.data(), embd.size() * sizeof(float));
  return w;
}

ModelConfig parse(const gguf::Writer& w) {
  const auto bytes = w.to_bytes();
  const gguf::File f = gguf::File::parse(bytes.data(), bytes.size(), "m.gguf");
  return config_from_gguf(f);
}

std::string error_of(const gguf::Writer& w) {
  try {
    parse(w);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigGgufFamilies, Gemma3) {
  gguf::Writer w = base("gemma3", 12);
  w.set("gemma3.attention.sliding_window", gguf::Value::from_u32(512));
  ModelConfig c = parse(w);
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_EQ(c.ffn_act, "gelu_tanh");
  EXPECT_TRUE(c.qk_norm && c.post_norms && c.rope_neox && c.tied_output);
  EXPECT_EQ(c.norm_weight_offset, 0.0f);  // the converter stored 1 + w
  EXPECT_EQ(c.embd_scale, 8.0f);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(32.0f));  // head_dim (not the 27B rule)
  EXPECT_EQ(c.rope_base_local, 10000.0f);
  EXPECT_EQ(c.final_softcap, 0.0f);
  for (int l = 0; l < 12; ++l) EXPECT_EQ(c.is_local_layer(l), (l + 1) % 6 != 0) << l;
  // The file's own period, local base and per-layer pattern win.
  w.set("gemma3.attention.sliding_window_pattern", gguf::Value::from_u32(3));
  w.set("gemma3.rope.freq_base_swa", gguf::Value::from_f32(5000.0f));
  c = parse(w);
  EXPECT_EQ(c.rope_base_local, 5000.0f);
  for (int l = 0; l < 12; ++l) EXPECT_EQ(c.is_local_layer(l), (l + 1) % 3 != 0) << l;
  std::vector<uint8_t> pattern(12, 0);
  pattern[4] = 1;
  w.set("gemma3.attention.sliding_window_pattern", gguf::Value::from_array(gguf::ValueType::BOOL, pattern.data(), 12));
  c = parse(w);
  for (int l = 0; l < 12; ++l) EXPECT_EQ(c.is_local_layer(l), l == 4) << l;
  w.set("gemma3.attention.sliding_window_pattern", gguf::Value::from_array(gguf::ValueType::BOOL, pattern.data(), 5));
  EXPECT_NE(error_of(w).find("'gemma3.attention.sliding_window_pattern' has 5 entries for 12 layers"),
            std::string::npos)
      << error_of(w);
  // No window: no local layers.
  gguf::Writer plain = base("gemma3", 12);
  EXPECT_FALSE(parse(plain).is_local_layer(0));
}

TEST(ConfigGgufFamilies, QwenAndPhi3) {
  ModelConfig c = parse(base("qwen2"));
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_TRUE(c.qkv_bias && c.rope_neox);
  EXPECT_FALSE(c.qk_norm);
  c = parse(base("qwen3"));
  EXPECT_TRUE(c.qk_norm && c.rope_neox);
  EXPECT_FALSE(c.qkv_bias);
  gguf::Writer p = base("phi3");
  p.set("phi3.rope.dimension_count", gguf::Value::from_u32(16));
  p.set("phi3.attention.sliding_window", gguf::Value::from_u32(2047));
  c = parse(p);
  EXPECT_EQ(c.architecture, "phi3");
  EXPECT_TRUE(c.rope_neox);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_TRUE(c.is_local_layer(0));
  const std::vector<float> f(8, 1.0f);
  p.add_tensor("rope_factors_long.weight", DType::F32, {8}, f.data(), f.size() * sizeof(float));
  EXPECT_NE(error_of(p).find("needs both rope_factors_short.weight and rope_factors_long.weight"), std::string::npos)
      << error_of(p);
  // Phi-3's longrope: the two factor sets as tensors, the attention factor and the original context as keys.
  p.add_tensor("rope_factors_short.weight", DType::F32, {8}, f.data(), f.size() * sizeof(float));
  p.set("phi3.rope.scaling.attn_factor", gguf::Value::from_f32(1.19f));
  p.set("phi3.rope.scaling.original_context_length", gguf::Value::from_u32(4096));
  c = parse(p);
  EXPECT_EQ(c.rope_scaling.type, "longrope");
  EXPECT_FLOAT_EQ(c.rope_scaling.attn_factor, 1.19f);
  EXPECT_EQ(c.rope_scaling.original_context, 4096);
  EXPECT_NE(error_of(base("gpt2")).find("architecture 'gpt2' is not supported yet"), std::string::npos);
}

}  // namespace
}  // namespace tessera
