// config_from_gguf for the families beyond Llama, on GGUF metadata written here (gguf::Writer): what each
// architecture turns into (llama.cpp's conventions: Gemma 3's fixed local rope base and period, its 27B attention
// scale; NeoX rotation for Qwen, Gemma and Phi-3), and a bad value failing with one sentence naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
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

// Gemma 3's family keys that config_from_gguf reads and ModelConfig::validate checks, each bad value refused in one
// sentence naming the file and the key or field: a negative sliding window or pattern (GGUF's unsigned read refuses a
// negative signed value), a window past int64, and a local rope base or final logit softcap that is NaN, infinite or
// negative (an f64 past float's range turns infinite). Zero is a value, not an error, for the three: no window, the
// global rope base for the local layers, no softcap.
TEST(ConfigGgufFamilies, Gemma3BadWindowLocalBaseAndSoftcapAreRefused) {
  const auto one_sentence = [](const std::string& e, const std::string& want) {
    EXPECT_EQ(e.rfind("m.gguf: ", 0), 0u) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << e;
  };
  const auto with = [](const std::string& key, const gguf::Value& v) {
    gguf::Writer w = base("gemma3", 12);
    w.set("gemma3.attention.sliding_window", gguf::Value::from_u32(512));
    w.set(key, v);
    return w;
  };
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();

  // The window and its period.
  one_sentence(error_of(with("gemma3.attention.sliding_window", gguf::Value::from_i32(-1))),
               "metadata key 'gemma3.attention.sliding_window' is negative (-1)");
  one_sentence(error_of(with("gemma3.attention.sliding_window", gguf::Value::from_i64(-4096))),
               "metadata key 'gemma3.attention.sliding_window' is negative (-4096)");
  one_sentence(error_of(with("gemma3.attention.sliding_window", gguf::Value::from_u64(uint64_t{1} << 63))),
               "metadata 'gemma3.attention.sliding_window' = 9223372036854775808 is out of range");
  one_sentence(error_of(with("gemma3.attention.sliding_window_pattern", gguf::Value::from_i32(-6))),
               "metadata key 'gemma3.attention.sliding_window_pattern' is negative (-6)");
  ModelConfig c = parse(with("gemma3.attention.sliding_window", gguf::Value::from_i32(0)));
  EXPECT_EQ(c.sliding_window, 0);
  for (int l = 0; l < 12; ++l) EXPECT_FALSE(c.is_local_layer(l)) << l;
  c = parse(with("gemma3.attention.sliding_window", gguf::Value::from_i32(1024)));  // a signed >= 0 value reads
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_TRUE(c.is_local_layer(0));

  // The local layers' rope base (rope.freq_base_swa).
  for (const auto& [v, text] :
       std::vector<std::pair<gguf::Value, std::string>>{{gguf::Value::from_f32(nan), "nan"},
                                                        {gguf::Value::from_f32(-1.0f), "-1"},
                                                        {gguf::Value::from_f32(inf), "inf"},
                                                        {gguf::Value::from_f64(1e300), "inf"},
                                                        {gguf::Value::from_i32(-10000), "-10000"}})
    one_sentence(error_of(with("gemma3.rope.freq_base_swa", v)), "local rope base " + text + " is not a number >= 0");
  EXPECT_EQ(parse(with("gemma3.rope.freq_base_swa", gguf::Value::from_f32(0.0f))).rope_base_local, 0.0f);
  EXPECT_EQ(parse(with("gemma3.rope.freq_base_swa", gguf::Value::from_u32(20000))).rope_base_local, 20000.0f);
  // The global base must be positive: zero is refused there.
  one_sentence(error_of(with("gemma3.rope.freq_base", gguf::Value::from_f32(0.0f))),
               "rope base 0 is not a positive number");
  one_sentence(error_of(with("gemma3.rope.freq_base", gguf::Value::from_f32(nan))),
               "rope base nan is not a positive number");

  // The final logit softcap.
  for (const auto& [v, text] :
       std::vector<std::pair<gguf::Value, std::string>>{{gguf::Value::from_f32(nan), "nan"},
                                                        {gguf::Value::from_f32(-30.0f), "-30"},
                                                        {gguf::Value::from_f32(-inf), "-inf"},
                                                        {gguf::Value::from_f64(-1e300), "-inf"}})
    one_sentence(error_of(with("gemma3.final_logit_softcapping", v)),
                 "final logit softcap " + text + " is not a number >= 0");
  EXPECT_EQ(parse(with("gemma3.final_logit_softcapping", gguf::Value::from_f32(0.0f))).final_softcap, 0.0f);
  EXPECT_EQ(parse(with("gemma3.final_logit_softcapping", gguf::Value::from_f32(30.0f))).final_softcap, 30.0f);
}

}  // namespace
}  // namespace tessera
