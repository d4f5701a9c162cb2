// LoRA adapters (models/lora.h) through the public Session API, against transformers + peft's float64 logits of the
// same random adapters (tests/data/lora, python/make_lora_golden.py): PEFT folders unmerged and merged, two adapters at
// once, the GGUF form written by llama.cpp's convert_lora_to_gguf.py, and the errors for malformed or foreign
// adapters.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "api/model_impl.h"
#include "formats/gguf.h"
#include "graph/passes/fuse.h"
#include "models/llama.h"
#include "models/lora.h"
#include "tessera/error.h"
#include "tessera/session.h"
#include "test_util.h"

namespace tessera {
namespace {

struct Golden {
  std::vector<int32_t> ids;
  nlohmann::json j;
  std::vector<std::vector<double>> logits(const char* key) const {
    return j[key].get<std::vector<std::vector<double>>>();
  }
};

const Golden& golden() {
  static const Golden g = [] {
    Golden out;
    std::ifstream(test::data_path("lora/golden.json")) >> out.j;
    out.ids = out.j["ids"].get<std::vector<int32_t>>();
    return out;
  }();
  return g;
}

Model base() { return Model::load(test::data_path("lora/base"), {.load_tokenizer = false}); }

std::vector<float> run(const std::vector<LoraSpec>& lora, bool merge, bool reference, std::string kv = "") {
  SessionOptions so;
  so.n_ctx = 32;
  so.n_batch = 4;  // chunks: prefill graphs of 4 rows and the T = 2 tail
  so.n_threads = 2;
  so.reference = reference;
  so.lora = lora;
  so.lora_merge = merge;
  so.kv_dtype = kv;
  Session s(base(), so);
  return s.eval_all_logits(golden().ids);
}

// |got - want| <= tol * max|want| per row: the reference path differs from float64 by f32 rounding, the fast path by
// its kernels' (the same limits as FamilyHf's). The fast path runs with an f32 KV cache here: these adapters are strong
// (they move logits by up to 2.5), and with an f16 cache "ab" measured 4.0e-3 of the row's scale, past the limit, in
// merged and unmerged runs alike (so the cache, not the adapter nodes). Unmerged fast sessions run A and B in f16
// (LoraSet::dtype) at decode: each of the two products rounds both factors to f16 (2^-11 relative), and "ab" then
// measured 3.06e-3 of the row's scale; the limit for that path is 6e-3 (twice the f32 path's, for the two f16
// products).
void expect_logits(const std::vector<float>& got, const std::vector<std::vector<double>>& want, double tol,
                   const std::string& what) {
  const size_t V = want[0].size();
  ASSERT_EQ(got.size(), want.size() * V) << what;
  for (size_t t = 0; t < want.size(); ++t) {
    double scale = 0;
    for (double x : want[t]) scale = std::max(scale, std::fabs(x));
    for (size_t i = 0; i < V; ++i)
      ASSERT_NEAR(got[t * V + i], want[t][i], tol * scale) << what << " token " << t << " logit " << i;
  }
}

std::string dir(const char* name) { return test::data_path(std::string("lora/") + name); }

TEST(Lora, PeftAdaptersMatchTransformers) {
  const struct {
    const char* key;
    std::vector<LoraSpec> lora;
  } cases[] = {{"base", {}},
               {"a", {{dir("adapter_a")}}},
               {"b", {{dir("adapter_b") + "/adapter_model.safetensors"}}},  // rslora; named by its weights file
               {"ab", {{dir("adapter_a")}, {dir("adapter_b")}}}};
  for (const auto& c : cases)
    for (bool reference : {true, false})
      for (bool merge : {false, true})
        expect_logits(run(c.lora, merge, reference, "f32"), golden().logits(c.key),
                      reference ? 1e-5 : (merge ? 3e-3 : 6e-3),
                      fmt::format("{} reference={} merge={}", c.key, reference, merge));
}

TEST(Lora, AdaptersChangeTheLogits) {  // the golden data can tell an adapter applied from one left out
  const auto base_l = golden().logits("base"), a = golden().logits("a"), ab = golden().logits("ab");
  double da = 0, dab = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].size(); ++i) {
      da = std::max(da, std::fabs(a[t][i] - base_l[t][i]));
      dab = std::max(dab, std::fabs(ab[t][i] - a[t][i]));
    }
  EXPECT_GT(da, 0.1);
  EXPECT_GT(dab, 0.1);
}

TEST(Lora, MergedEqualsUnmerged) {
  const std::vector<LoraSpec> ab = {{dir("adapter_a"), 0.5f}, {dir("adapter_b"), 2.0f}};
  const std::vector<float> u = run(ab, false, true), m = run(ab, true, true);
  ASSERT_EQ(u.size(), m.size());
  for (size_t i = 0; i < u.size(); ++i) ASSERT_NEAR(u[i], m[i], 1e-5) << i;
}

TEST(Lora, ScaleZeroIsTheBase) {
  expect_logits(run({{dir("adapter_a"), 0.0f}}, false, true), golden().logits("base"), 1e-5, "scale 0");
}

TEST(Lora, GgufFromLlamaCppConverterMatchesPeft) {
  for (bool merge : {false, true})
    expect_logits(run({{dir("adapter_a.gguf")}}, merge, true), golden().logits("a"), 1e-5, "gguf");
}

TEST(Lora, GraphHasTwoProductsAndAnAddPerTarget) {
  const Model m = base();
  const ModelWeights& w = m.impl()->weights;
  auto a = std::make_shared<const LoraAdapter>(load_lora_adapter(dir("adapter_a"), 1.0f, w));
  EXPECT_EQ(a->targets.size(), 14u);  // 7 projections x 2 layers
  const auto set = make_lora_set({a}, false, w);
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 3, .lora = set.get()});
  const graph::Graph plain = build_llama_graph(w, {.n_tokens = 3});
  EXPECT_EQ(g.nodes().size(), plain.nodes().size() + 14 * 3);
  const int xa = g.find_node("blk.1.ffn_down.lora0_a");
  ASSERT_GE(xa, 0);
  EXPECT_EQ(g.tensor(g.node(xa).output).shape, (std::vector<int64_t>{3, 4}));  // [T, r]
  const int add = g.find_node("blk.1.ffn_down.lora0");
  ASSERT_GE(add, 0);
  EXPECT_EQ(g.node(add).op, graph::Op::ADD);
}

// CUDA sessions pad ranks to a multiple of 8 (LoraSet::rank_multiple): adapter_a's rank 4 becomes 8 with zero rows of
// A and zero columns of B, so B·A (what the logits depend on) is bit for bit the unpadded one; CudaLora checks the
// logits on the GPU.
TEST(Lora, PaddedRanksKeepTheProduct) {
  const Model m = base();
  const ModelWeights& w = m.impl()->weights;
  auto a = std::make_shared<const LoraAdapter>(load_lora_adapter(dir("adapter_a"), 1.0f, w));
  const auto set = make_lora_set({a}, false, w, DType::F16, 8);
  EXPECT_EQ(set->rank_multiple, 8);
  ASSERT_EQ(set->adapters[0]->targets.size(), a->targets.size());
  for (size_t i = 0; i < a->targets.size(); ++i) {
    const LoraTarget &t = a->targets[i], &p = set->adapters[0]->targets[i];
    ASSERT_EQ(t.rank, 4);
    ASSERT_EQ(p.rank, 8);
    ASSERT_EQ(p.a16.size(), p.a.size());
    ASSERT_EQ(p.b16.size(), p.b.size());
    for (int64_t n = 0; n < t.n_out; n += 7)
      for (int64_t k = 0; k < t.n_in; k += 5) {
        float want = 0, got = 0;
        for (int64_t j = 0; j < t.rank; ++j) want += t.b[n * t.rank + j] * t.a[j * t.n_in + k];
        for (int64_t j = 0; j < p.rank; ++j) got += p.b[n * p.rank + j] * p.a[j * p.n_in + k];
        ASSERT_EQ(got, want) << t.weight << " [" << n << ", " << k << "]";
      }
    for (int64_t n = 0; n < t.n_out; ++n)
      for (int64_t j = 0; j < p.rank; ++j)
        ASSERT_EQ(p.b16[n * p.rank + j], j < t.rank ? t.b16[n * t.rank + j] : 0) << t.weight;
  }
  const graph::Graph g = build_llama_graph(w, {.n_tokens = 3, .lora = set.get()});
  EXPECT_EQ(g.tensor(g.node(g.find_node("blk.1.ffn_down.lora0_a")).output).shape, (std::vector<int64_t>{3, 8}));
  // Multiples the ranks already meet leave the adapter shared, not copied.
  EXPECT_EQ(make_lora_set({a}, false, w, DType::F16, 4)->adapters[0].get(), a.get());
}

// The CPU's fast mode runs each target with its adapters as one matmul (graph/passes/fuse.h, rewrite 7): the rewritten
// graph has the base model's node count, and a target both adapters adapt carries both.
TEST(Lora, CpuPassesFuseEachTargetWithItsAdapters) {
  const Model m = base();
  const ModelWeights& w = m.impl()->weights;
  auto a = std::make_shared<const LoraAdapter>(load_lora_adapter(dir("adapter_a"), 1.0f, w));
  auto b = std::make_shared<const LoraAdapter>(load_lora_adapter(dir("adapter_b"), 1.0f, w));
  const auto set = make_lora_set({a, b}, false, w);
  for (const int64_t t : {1, 3}) {
    const graph::Graph g = build_llama_graph(w, {.n_tokens = t, .lora = set.get()});
    const graph::Graph plain = build_llama_graph(w, {.n_tokens = t});
    const graph::Graph rg = graph::run_passes(g, graph::FusionSupport{.lora_epilogue = true});
    EXPECT_EQ(rg.nodes().size(), plain.nodes().size());
    int one = 0, two = 0;
    for (const graph::Node& n : rg.nodes()) {
      one += n.fusion.lora == 1;
      two += n.fusion.lora == 2;
    }
    EXPECT_EQ(one + two, 14);                             // every target of adapter_a (b's are a subset)
    EXPECT_EQ(two, static_cast<int>(b->targets.size()));  // q, v and down of both layers
  }
}

TEST(Lora, SpecParsesAnOptionalScale) {
  EXPECT_EQ(parse_lora_spec("a/b.gguf"), std::make_pair(std::string("a/b.gguf"), 1.0f));
  EXPECT_EQ(parse_lora_spec("a/b.gguf:0.5"), std::make_pair(std::string("a/b.gguf"), 0.5f));
  EXPECT_EQ(parse_lora_spec("dir:name"), std::make_pair(std::string("dir:name"), 1.0f));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Lora, AdapterForAnotherBaseIsRefused) {
  // tiny-qwen3-f32 has 4 heads of 16: its q projection is 64x32, adapter_a's 32x32.
  const Model qwen = Model::load(test::data_path("hf/tiny-qwen3-f32"), {.load_tokenizer = false});
  const std::string e = error_of([&] { Session s(qwen, {.n_ctx = 16, .lora = {{dir("adapter_a")}}}); });
  EXPECT_NE(e.find("an adapter made for another base model?"), std::string::npos) << e;
  EXPECT_NE(e.find("but the base's is"), std::string::npos) << e;
}

// A GGUF LoRA written here: `tensors` (name -> shape, f32 zeros) and general.type.
std::string write_gguf(const std::string& name, const std::string& type,
                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  gguf::Writer w;
  w.set("general.type", gguf::Value::from_string(type));
  w.set("adapter.type", gguf::Value::from_string("lora"));
  w.set("adapter.lora.alpha", gguf::Value::from_f32(8.0f));
  for (const auto& [n, shape] : tensors) {
    std::vector<float> zeros(static_cast<size_t>(shape[0] * shape[1]));
    w.add_tensor(n, DType::F32, shape, zeros.data(), zeros.size() * sizeof(float));
  }
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  w.write(path);
  return path;
}

TEST(Lora, MalformedOrForeignGgufIsRefused) {
  const Model m = base();
  const auto open = [&](const std::string& path) {
    return error_of([&] { Session s(m, {.n_ctx = 16, .lora = {{path}}}); });
  };
  EXPECT_NE(open(write_gguf("tessera_lora_model.gguf", "model", {})).find("general.type is 'model', not 'adapter'"),
            std::string::npos);
  EXPECT_NE(open(write_gguf("tessera_lora_layer.gguf", "adapter",
                            {{"blk.7.attn_q.weight.lora_a", {4, 32}}, {"blk.7.attn_q.weight.lora_b", {32, 4}}}))
                .find("'blk.7.attn_q.weight', which"),
            std::string::npos);
  EXPECT_NE(open(write_gguf("tessera_lora_half.gguf", "adapter", {{"blk.0.attn_q.weight.lora_a", {4, 32}}}))
                .find("has lora_a but not lora_b"),
            std::string::npos);
  EXPECT_NE(open(write_gguf("tessera_lora_rank.gguf", "adapter",
                            {{"blk.0.attn_q.weight.lora_a", {4, 32}}, {"blk.0.attn_q.weight.lora_b", {32, 3}}}))
                .find("are not [r, K] and [N, r]"),
            std::string::npos);
  EXPECT_NE(open(write_gguf("tessera_lora_embd.gguf", "adapter",
                            {{"token_embd.weight.lora_a", {4, 128}}, {"token_embd.weight.lora_b", {32, 4}}}))
                .find("does not run as a matmul"),
            std::string::npos);
  EXPECT_NE(open("/nonexistent/adapter").find("no such LoRA adapter"), std::string::npos);
}

TEST(Lora, MalformedPeftConfigIsRefused) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / "tessera_lora_peft_bad";
  std::filesystem::create_directories(d);
  std::filesystem::copy_file(dir("adapter_a") + "/adapter_model.safetensors", d / "adapter_model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  const Model m = base();
  const auto with_config = [&](const std::string& cfg) {
    std::ofstream(d / "adapter_config.json") << cfg;
    return error_of([&] { Session s(m, {.n_ctx = 16, .lora = {{d.string()}}}); });
  };
  EXPECT_NE(with_config(R"({"lora_alpha": 8})").find("'r' is not a positive integer"), std::string::npos);
  EXPECT_NE(with_config(R"({"r": 4, "lora_alpha": 8, "use_dora": true})").find("DoRA"), std::string::npos);
  EXPECT_NE(with_config(R"({"r": 4, "lora_alpha": 8)").find("not valid JSON"), std::string::npos);
  EXPECT_EQ(with_config(R"({"r": 4, "lora_alpha": 8})"), "(no error)");
}

}  // namespace
}  // namespace tessera
