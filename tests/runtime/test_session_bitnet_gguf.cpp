// llama.cpp's "bitnet" GGUF (tests/data/gguf/tiny-bitnet.gguf, python/make_bitnet_gguf_golden.py) run by the engine
// against llama.cpp's own logits of the file (f32 KV cache, flash attention off): the architecture's config
// (sub-norms, SwiGLU, NeoX rotation, output tied to the embedding) and its `.scale` tensors, which Tessera folds into
// the f32 weights at load while llama.cpp multiplies each matmul's output (a rounding apart). No activation
// quantization on either side, so the paths agree to f32 precision: 1e-4 of the logit scale (ggml's and Tessera's
// summation orders differ over dot products of 64-128 values through two layers), and every top-1.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/model_weights.h"
#include "runtime/session.h"
#include "test_util.h"

namespace tessera::runtime {
namespace {

TEST(BitNetGguf, MatchesLlamaCpp) {
  nlohmann::json golden;
  std::ifstream(test::data_path("gguf/tiny-bitnet.json")) >> golden;
  const std::vector<int32_t> ids = golden["ids"].get<std::vector<int32_t>>();
  const auto want = golden["logits"].get<std::vector<std::vector<double>>>();
  const ModelWeights w = ModelWeights::open(test::data_path("gguf/tiny-bitnet.gguf"));
  ASSERT_EQ(w.config().architecture, "bitnet");
  EXPECT_EQ(w.find("blk.0.attn_q.scale"), nullptr);  // folded into the weight
  for (bool reference : {true, false}) {
    SessionOptions so;
    so.n_ctx = 32;
    so.n_batch = 4;
    so.n_threads = 2;
    so.reference = reference;
    so.kv_dtype = "f32";
    Engine e(w, nullptr, resolve_options(so, w.config()));
    const size_t V = want[0].size();
    ASSERT_EQ(V, size_t(w.config().n_vocab));
    std::vector<float> rows(ids.size() * V);
    e.eval(ids, rows.data());
    for (size_t t = 0; t < ids.size(); ++t) {
      double scale = 0;
      size_t best_want = 0, best_got = 0;
      for (size_t i = 0; i < V; ++i) {
        scale = std::max(scale, std::fabs(want[t][i]));
        if (want[t][i] > want[t][best_want]) best_want = i;
        if (rows[t * V + i] > rows[t * V + best_got]) best_got = i;
      }
      EXPECT_EQ(best_got, best_want) << "token " << t;
      for (size_t i = 0; i < V; ++i)
        ASSERT_NEAR(rows[t * V + i], want[t][i], 1e-4 * scale)
            << (reference ? "reference" : "fast") << " token " << t << " logit " << i;
    }
  }
}

}  // namespace
}  // namespace tessera::runtime
