// BitNet b1.58 and Falcon3's 1.58-bit Llama form: config.json parsing (transformers' BitNetConfig and its
// quantization_config), the ternary weight loader (transformers' packing, scales multiplying or dividing, online
// absmean), and the decoder graph's BitNet nodes (sub-norms, relu2 gating, one activation quantizer per linear input).
// The end-to-end logits against transformers are tests/runtime/test_session_hf.cpp's BitNetHf.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "formats/gguf.h"
#include "formats/test_safetensors_util.h"
#include "models/config.h"
#include "models/hgrn_bit.h"
#include "models/model_graph.h"
#include "models/model_weights.h"
#include "models/ternary_weights.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tessera/error.h"
#include "tessera/random_model.h"
#include "test_util.h"

namespace tessera {
namespace {

using graph::Op;
using graph::Role;
using nlohmann::json;

json config_of(const std::string& model) { return test::load_json(test::data_path("hf/" + model + "/config.json")); }
ModelConfig parse(const json& j) { return config_from_hf(j, "config.json"); }

TEST(BitNetConfig, TransformersFiles) {
  const ModelConfig a = parse(config_of("tiny-bitnet-autobitlinear"));
  EXPECT_EQ(a.architecture, "bitnet");
  EXPECT_EQ(a.ffn_act, "relu2");
  EXPECT_TRUE(a.sub_norms);
  EXPECT_TRUE(a.act_quant_i8);
  EXPECT_EQ(a.ternary, "mul");
  EXPECT_EQ(a.rope_base, 500000.0f);
  EXPECT_TRUE(a.rope_neox);
  EXPECT_EQ(a.norm_eps, 1e-5f);
  const ModelConfig b = parse(config_of("tiny-bitnet-bitlinear"));
  EXPECT_EQ(b.ternary, "div");
  EXPECT_EQ(b.rope_base, 10000.0f);
  // Falcon3-1.58bit: a Llama with a BitNet quantization_config; no sub-norms, SwiGLU.
  const ModelConfig f = parse(config_of("tiny-falcon3-bitlinear"));
  EXPECT_EQ(f.architecture, "llama");
  EXPECT_EQ(f.ffn_act, "silu");
  EXPECT_FALSE(f.sub_norms);
  EXPECT_TRUE(f.act_quant_i8);
  EXPECT_EQ(f.ternary, "div");
}

TEST(BitNetConfig, DefaultsAndRefusals) {
  json j = {{"architectures", {"BitNetForCausalLM"}},
            {"hidden_size", 64},
            {"intermediate_size", 96},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 4},
            {"vocab_size", 100}};
  ModelConfig c = parse(j);  // BitNetConfig's defaults: relu2, eps 1e-5, theta 500000, float linears
  EXPECT_EQ(c.ffn_act, "relu2");
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_base, 500000.0f);
  EXPECT_FALSE(c.act_quant_i8);
  EXPECT_EQ(c.ternary, "none");
  j["quantization_config"] = {{"quant_method", "bitnet"}};  // transformers' default class: bitlinear, offline
  EXPECT_EQ(parse(j).ternary, "div");
  j["quantization_config"] = {
      {"quant_method", "bitnet"}, {"linear_class", "autobitlinear"}, {"quantization_mode", "online"}};
  EXPECT_EQ(parse(j).ternary, "online");
  j["quantization_config"]["modules_to_not_convert"] = {"lm_head"};
  EXPECT_EQ(parse(j).ternary, "online");
  j["quantization_config"]["modules_to_not_convert"] = {"lm_head", "model.layers.0.mlp.down_proj"};
  EXPECT_ERROR_HAS(parse(j), "modules_to_not_convert");
  j["quantization_config"] = {{"quant_method", "bitnet"}, {"use_rms_norm", true}};
  EXPECT_ERROR_HAS(parse(j), "use_rms_norm");
  j["quantization_config"] = {{"quant_method", "bitnet"}, {"linear_class", "fancy"}};
  EXPECT_ERROR_HAS(parse(j), "linear_class 'fancy'");
  j["quantization_config"] = {{"quant_method", "gptq"}};
  EXPECT_ERROR_HAS(parse(j), "quant_method 'gptq'");
  j.erase("quantization_config");
  j["hidden_act"] = "gelu";
  EXPECT_ERROR_HAS(parse(j), "hidden_act 'gelu'");
  j["hidden_act"] = "silu";
  EXPECT_EQ(parse(j).ffn_act, "silu");
}

// llama.cpp's "bitnet" GGUF (src/models/bitnet.cpp): sub-norms, SwiGLU, NeoX rotation, output tied to the embedding,
// optional `.scale` tensors multiplying each linear, no activation quantization.
TEST(BitNetConfig, LlamaCppGguf) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::from_string("bitnet"));
  w.set("bitnet.block_count", gguf::Value::from_u32(2));
  w.set("bitnet.embedding_length", gguf::Value::from_u32(64));
  w.set("bitnet.feed_forward_length", gguf::Value::from_u32(128));
  w.set("bitnet.attention.head_count", gguf::Value::from_u32(4));
  const std::vector<float> embd(100 * 64, 0.0f);
  w.add_tensor("token_embd.weight", DType::F32, {100, 64}, embd.data(), embd.size() * sizeof(float));
  const auto bytes = w.to_bytes();
  const ModelConfig c = config_from_gguf(gguf::File::parse(bytes.data(), bytes.size(), "m.gguf"));
  EXPECT_EQ(c.architecture, "bitnet");
  EXPECT_TRUE(c.sub_norms && c.rope_neox && c.tied_output);
  EXPECT_EQ(c.ffn_act, "silu");
  EXPECT_FALSE(c.act_quant_i8);
  EXPECT_EQ(c.ternary, "mul");
}

// transformers' pack_weights on a 8x2 ternary matrix, computed by hand from its definition: rows r, r + 2, r + 4,
// r + 6 of the ternary matrix share packed row r, at bit offsets 0, 2, 4, 6, each stored as value + 1.
TEST(TernaryWeights, UnpacksTransformersPacking) {
  const int8_t t[8][2] = {{-1, 0}, {1, 1}, {0, -1}, {1, 0}, {-1, -1}, {0, 1}, {1, -1}, {0, 0}};
  uint8_t packed[2][2] = {};
  for (int r = 0; r < 8; ++r)
    for (int k = 0; k < 2; ++k) packed[r % 2][k] |= static_cast<uint8_t>((t[r][k] + 1) << (2 * (r / 2)));
  int8_t out[16];
  unpack_ternary_rows(&packed[0][0], 2, 2, out);
  for (int r = 0; r < 8; ++r)
    for (int k = 0; k < 2; ++k) EXPECT_EQ(out[r * 2 + k], t[r][k]) << r << "," << k;
  const uint8_t bad = 0b11;
  EXPECT_ERROR_HAS(unpack_ternary_rows(&bad, 1, 1, out), "code 3");
}

// One linear per storage form, through load_ternary_weights.
TEST(TernaryWeights, ScalesMultiplyDivideOrTernarizeOnline) {
  ModelConfig c;
  const uint8_t packed[2] = {0b10'01'00'10, 0b00'00'01'01};  // column 0: rows 1, -1, 0, 1; column 1: 0, 0, -1, -1
  const float scale = 0.25f;
  const auto views = [&](DType wt, const void* w, std::vector<int64_t> shape) {
    std::vector<TensorView> v(2);
    v[0].name = "blk.0.attn_q.weight";
    v[0].dtype = wt;
    v[0].shape = std::move(shape);
    v[0].data = static_cast<const uint8_t*>(w);
    v[1].name = "blk.0.attn_q.scale";
    v[1].dtype = DType::F32;
    v[1].shape = {1};
    v[1].data = reinterpret_cast<const uint8_t*>(&scale);
    return v;
  };
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned;
  for (const char* mode : {"mul", "div"}) {
    c.ternary = mode;
    std::vector<TensorView> v = views(DType::I8, packed, {1, 2});
    load_ternary_weights(c, "m", v, owned);
    ASSERT_EQ(v.size(), 1u);  // the scale is folded in and dropped
    ASSERT_EQ(v[0].shape, (std::vector<int64_t>{4, 2}));
    ASSERT_EQ(v[0].dtype, DType::F32);
    const float* w = reinterpret_cast<const float*>(v[0].data);
    const float want[8] = {1, 0, -1, 0, 0, -1, 1, -1};
    for (int i = 0; i < 8; ++i) EXPECT_EQ(w[i], c.ternary == "mul" ? want[i] * scale : want[i] / scale) << mode << i;
  }
  // Online (BitNet's WeightQuant): s = 1 / mean|w| = 1 / 0.5; round(w * 2) clamped to [-1, 1], divided by 2.
  c.ternary = "online";
  const float fw[4] = {0.1f, -0.9f, 0.3f, 0.7f};
  std::vector<TensorView> v = views(DType::F32, fw, {2, 2});
  v.pop_back();
  load_ternary_weights(c, "m", v, owned);
  const float* w = reinterpret_cast<const float*>(v[0].data);
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_EQ(w[1], -0.5f);
  EXPECT_EQ(w[2], 0.5f);
  EXPECT_EQ(w[3], 0.5f);
  // A packed weight without its scale, and a scale where the config names no ternary weights.
  c.ternary = "div";
  v = views(DType::I8, packed, {1, 2});
  v.pop_back();
  EXPECT_ERROR_HAS(load_ternary_weights(c, "m", v, owned), "weight_scale");
  c.ternary = "none";
  v = views(DType::I8, packed, {1, 2});
  EXPECT_ERROR_HAS(load_ternary_weights(c, "m", v, owned), "names no ternary weights");
}

// Rows of whole 256-blocks become TQ2_0 (the CPU's ternary kernels) holding the same ternary values times the scale
// rounded to fp16: packed with a dividing f32 scale, and float ternarized online. A float weight that is not ternary
// per block stays float, as rows of 255 do.
TEST(TernaryWeights, WholeBlocksOf256BecomeTq2_0) {
  ModelConfig c;
  const int64_t k = 512, rows = 2;  // packed [2, 512] -> [8, 512]
  std::vector<uint8_t> packed(rows * k);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>((i * 37 + i / 7) % 243);  // codes 0..2
  for (uint8_t& b : packed)  // no code 3 in any 2-bit field
    for (int f = 0; f < 4; ++f)
      if (((b >> (2 * f)) & 3) == 3) b = static_cast<uint8_t>(b & ~(1 << (2 * f)));
  std::vector<int8_t> tern(4 * rows * k);
  unpack_ternary_rows(packed.data(), rows, k, tern.data());
  const float scale = 3.0f;  // BitLinear divides: weights are ±1/3, which fp16 rounds
  std::vector<std::shared_ptr<std::vector<uint8_t>>> owned;
  c.ternary = "div";
  std::vector<TensorView> v(2);
  v[0].name = "blk.0.ffn_down.weight";
  v[0].dtype = DType::I8;
  v[0].shape = {rows, k};
  v[0].data = packed.data();
  v[1].name = "blk.0.ffn_down.scale";
  v[1].dtype = DType::F32;
  v[1].shape = {1};
  v[1].data = reinterpret_cast<const uint8_t*>(&scale);
  load_ternary_weights(c, "m", v, owned);
  ASSERT_EQ(v.size(), 1u);
  ASSERT_EQ(v[0].dtype, DType::TQ2_0);
  ASSERT_EQ(v[0].shape, (std::vector<int64_t>{4 * rows, k}));
  std::vector<float> got(tern.size());
  dequantize_row(DType::TQ2_0, v[0].data, got.data(), static_cast<int64_t>(got.size()));
  const float d = fp16_to_f32(f32_to_fp16(1.0f / scale));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], float(tern[i]) * d) << i;

  // Online: a float weight ternarized at load; then one that is not ternary ("mul" without a scale) stays f32.
  c.ternary = "online";
  std::vector<float> fw(4 * 256);
  for (size_t i = 0; i < fw.size(); ++i) fw[i] = float(int(i % 7) - 3) * 0.1f;
  v.resize(1);
  v[0].dtype = DType::F32;
  v[0].shape = {4, 256};
  v[0].data = reinterpret_cast<const uint8_t*>(fw.data());
  load_ternary_weights(c, "m", v, owned);
  EXPECT_EQ(v[0].dtype, DType::TQ2_0);
  c.ternary = "mul";
  v[0].dtype = DType::F32;
  v[0].data = reinterpret_cast<const uint8_t*>(fw.data());
  load_ternary_weights(c, "m", v, owned);
  EXPECT_EQ(v[0].dtype, DType::F32);
  c.ternary = "online";
  v[0].shape = {4, 255};
  v[0].data = reinterpret_cast<const uint8_t*>(fw.data());
  load_ternary_weights(c, "m", v, owned);
  EXPECT_EQ(v[0].dtype, DType::F32);
  // A whole checkpoint of width 256 (tests/runtime BitNetHf runs it against transformers).
  const ModelWeights m = ModelWeights::open(test::data_path("hf/tiny-bitnet-256"));
  for (const char* name : {"blk.0.attn_q.weight", "blk.1.ffn_down.weight"})
    EXPECT_EQ(m.find(name)->dtype, DType::TQ2_0) << name;
  EXPECT_EQ(m.find("output.weight")->dtype, DType::F32);  // lm_head stays float, as transformers keeps it
}

// The Llama-shaped bench presets of the ternary families' matrices: mmfreelm-370m-llama has the MatMul-free LM 370M's
// parameter count (the same-size comparison), bitnet-2b4t-llama BitNet b1.58 2B4T's 2.41B (tied embeddings).
TEST(TernaryBenchPresets, LlamaShapesOfTheTernaryFamilies) {
  const auto params = [](const ModelSpec& s) {
    const int64_t kv = s.n_head_kv * s.head_dim, q = s.n_head * s.head_dim;
    const int64_t layer = s.n_embd * (2 * q + 2 * kv) + 3 * s.n_embd * s.n_ff + 2 * s.n_embd;
    return double(s.n_vocab * s.n_embd * (s.tied_output ? 1 : 2) + s.n_layers * layer + s.n_embd);
  };
  const ModelSpec* mmf = nullptr;
  const ModelSpec* b2 = nullptr;
  for (const RandomModelPreset& p : random_model_presets()) {
    if (p.name == "mmfreelm-370m-llama") mmf = &p.spec;
    if (p.name == "bitnet-2b4t-llama") b2 = &p.spec;
  }
  ASSERT_NE(mmf, nullptr);
  ASSERT_NE(b2, nullptr);
  EXPECT_NEAR(params(*mmf), double(hgrn_bit_parameters(hgrn_bit_preset("mmfreelm-370m"))), 0.005e9);
  EXPECT_NEAR(params(*b2), 2.41e9, 0.01e9);
}

// The decoder's BitNet nodes, from the packed file.
TEST(BitNetGraph, SubNormsRelu2AndOneQuantizerPerLinearInput) {
  const ModelWeights w = ModelWeights::open(test::data_path("hf/tiny-bitnet-autobitlinear"));
  EXPECT_EQ(w.find("blk.0.attn_q.weight")->dtype, DType::BF16);  // ±bf16 scale: exact in bf16
  EXPECT_EQ(w.find("blk.0.attn_q.scale"), nullptr);
  const graph::Graph g = build_model_graph(w, {.n_tokens = 3, .n_ctx = 8});
  const auto at = [&](const std::string& name) -> const graph::Node& {
    const int id = g.find_node(name);
    EXPECT_GE(id, 0) << name;
    return g.node(id < 0 ? 0 : id);
  };
  const auto producer = [&](const graph::Node& n, size_t i) { return g.node(g.tensor(n.inputs[i]).producer); };
  for (const char* m : {"blk.1.attn_q", "blk.1.attn_k", "blk.1.attn_v"})
    EXPECT_EQ(producer(at(m), 0).name, "blk.1.attn_act_quant");
  EXPECT_EQ(producer(at("blk.1.attn_act_quant"), 0).op, Op::RMSNORM);
  EXPECT_EQ(producer(at("blk.1.attn_output"), 0).name, "blk.1.attn_output_act_quant");
  EXPECT_EQ(producer(at("blk.1.attn_output_act_quant"), 0).role, Role::ATTN_SUB_NORM);
  EXPECT_EQ(producer(at("blk.1.attn_sub_norm"), 0).op, Op::ATTENTION);
  EXPECT_EQ(producer(at("blk.1.ffn_gate"), 0).name, "blk.1.ffn_act_quant");
  EXPECT_EQ(producer(at("blk.1.ffn_up"), 0).name, "blk.1.ffn_act_quant");
  EXPECT_EQ(at("blk.1.ffn_act").op, Op::RELU2_GLU);
  EXPECT_EQ(producer(at("blk.1.ffn_down"), 0).name, "blk.1.ffn_down_act_quant");
  EXPECT_EQ(producer(at("blk.1.ffn_down_act_quant"), 0).role, Role::FFN_SUB_NORM);
  EXPECT_EQ(g.tensor(at("blk.1.ffn_sub_norm").inputs[1]).shape, (std::vector<int64_t>{128}));
  // lm_head stays float (transformers never converts it): no quantizer before the output matmul.
  EXPECT_EQ(producer(at("output"), 0).op, Op::RMSNORM);
  int quantizers = 0;
  for (const graph::Node& n : g.nodes()) quantizers += n.op == Op::ACT_QUANT_I8;
  EXPECT_EQ(quantizers, 4 * 2);  // q|k|v, o, gate|up, down per layer
}

// The MatMul-free LM's config.json (HGRNBitConfig's keys) and the released shapes.
TEST(HgrnBitConfig, FileAndPresets) {
  json j = config_of("tiny-hgrn-bit-f32");
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.architecture, "hgrn_bit");
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_ff, 256);  // 256 * ceil(int(64 * 4 * 2 / 3) / 256)
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_TRUE(c.act_quant_i8 && c.ternary_output && c.hgrn_lower_bound);
  EXPECT_EQ(c.ternary, "online");
  j["use_short_conv"] = true;
  EXPECT_ERROR_HAS(parse(j), "use_short_conv");
  j["use_short_conv"] = false;
  j["expand_ratio"] = 2;
  EXPECT_ERROR_HAS(parse(j), "expand_ratio");
  j["expand_ratio"] = 1;
  j["tie_word_embeddings"] = true;
  EXPECT_ERROR_HAS(parse(j), "tie_word_embeddings");
  // 370M, 1.3B and 2.7B parameters, as the checkpoints are named.
  EXPECT_NEAR(double(hgrn_bit_parameters(hgrn_bit_preset("mmfreelm-370m"))), 0.37e9, 0.01e9);
  EXPECT_NEAR(double(hgrn_bit_parameters(hgrn_bit_preset("mmfreelm-1.3b"))), 1.36e9, 0.01e9);
  EXPECT_NEAR(double(hgrn_bit_parameters(hgrn_bit_preset("mmfreelm-2.7b"))), 2.70e9, 0.01e9);
  EXPECT_EQ(hgrn_bit_preset("mmfreelm-370m").n_ff, 2816);
  EXPECT_ERROR_HAS(hgrn_bit_preset("mmfreelm-7b"), "mmfreelm-370m");
}

// The MLGRU graph from the Hugging Face files: every linear's own norm and quantizer, the recurrence reading its
// layer's state, the gated output norm, and the lower bounds (0 at layer 0).
TEST(HgrnBitGraph, NodesStatesAndLowerBounds) {
  const ModelWeights w = ModelWeights::open(test::data_path("hf/tiny-hgrn-bit-f32"));
  EXPECT_EQ(w.find("blk.0.ffn_gate.weight")->shape, (std::vector<int64_t>{256, 64}));  // gate|up split
  EXPECT_EQ(w.find("blk.0.ffn_up.weight")->shape, (std::vector<int64_t>{256, 64}));
  const graph::Graph g = build_model_graph(w, {.n_tokens = 3});
  const auto at = [&](const std::string& name) -> const graph::Node& {
    const int id = g.find_node(name);
    EXPECT_GE(id, 0) << name;
    return g.node(id < 0 ? 0 : id);
  };
  const auto producer = [&](const graph::Node& n, size_t i) { return g.node(g.tensor(n.inputs[i]).producer); };
  const graph::Node& r = at("blk.2.mlgru");
  EXPECT_EQ(r.op, Op::MLGRU);
  EXPECT_EQ(producer(r, 0).name, "blk.2.attn_f");
  EXPECT_EQ(producer(r, 1).name, "blk.2.attn_i");
  EXPECT_EQ(g.tensor(r.inputs[3]).io, graph::IoRole::STATE);
  EXPECT_EQ(g.tensor(r.inputs[3]).io_layer, 2);
  EXPECT_EQ(g.tensor(r.inputs[3]).shape, (std::vector<int64_t>{65}));
  EXPECT_EQ(producer(at("blk.2.attn_f"), 0).name, "blk.2.attn_f_act_quant");
  EXPECT_EQ(producer(at("blk.2.attn_f_act_quant"), 0).role, Role::LINEAR_NORM);
  EXPECT_EQ(producer(at("blk.2.ffn_up"), 0).name, "blk.2.ffn_gate_act_quant");  // gate|up: one BitLinear
  EXPECT_EQ(at("blk.2.attn_out_gate").op, Op::SWIGLU);
  EXPECT_EQ(producer(at("blk.2.attn_out_gate"), 0).name, "blk.2.mlgru");
  EXPECT_EQ(producer(at("output"), 0).name, "output_act_quant");
  EXPECT_EQ(g.find_role(graph::IoRole::CACHE_K, 0), -1);  // no KV cache
  const graph::Tensor& first = g.tensor(at("blk.0.mlgru").inputs[2]);
  for (int64_t j = 0; j < 64; ++j) EXPECT_EQ(static_cast<const float*>(first.data)[j], 0.0f);
  // softmax-cumsum: the bounds grow with depth and stay below 1.
  const float* b1 = static_cast<const float*>(g.tensor(at("blk.1.mlgru").inputs[2]).data);
  const float* b2 = static_cast<const float*>(g.tensor(r.inputs[2]).data);
  for (int64_t j = 0; j < 64; ++j) {
    EXPECT_GT(b1[j], 0.0f);
    EXPECT_GT(b2[j], b1[j]);
    EXPECT_LT(b2[j], 1.0f);
  }
}

}  // namespace
}  // namespace tessera
