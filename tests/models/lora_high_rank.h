// A LoRA adapter of high rank on tests/data/lora's base, written as GGUF: the case the matmul-chain rewrite folds
// (graph/passes/chain.h). Shared by tests/models/test_lora_chain.cpp (the CPU) and tests/backends/cuda/test_lora.cpp
// (CUDA against the CPU); header-only, since tests/test_util.cpp is linked into binaries without the model layer.
#pragma once

#include <fmt/core.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "formats/gguf.h"
#include "models/model_weights.h"

namespace tessera::test {

// A GGUF LoRA of rank r on every projection of `w`'s two layers: A [r, K] and B [N, r] random in [-0.2, 0.2] drawn
// from `seed`, alpha 16 (scale 1/3 at r = 48), so the adapter moves the logits by about as much as tests/data/lora's
// do. Written to the temporary directory as `file`; returns its path.
inline std::string write_high_rank_adapter(const ModelWeights& w, int64_t r,
                                           const std::string& file = "tessera_lora_rank48.gguf", uint32_t seed = 48) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.2f, 0.2f);
  gguf::Writer f;
  f.set("general.type", gguf::Value::from_string("adapter"));
  f.set("adapter.type", gguf::Value::from_string("lora"));
  f.set("adapter.lora.alpha", gguf::Value::from_f32(16.0f));
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      const std::string name = fmt::format("blk.{}.{}.weight", l, p);
      const std::vector<int64_t> shape = w.find(name)->shape;  // [N, K]
      for (const auto& [suffix, rows, cols] :
           {std::tuple{".lora_a", r, shape[1]}, std::tuple{".lora_b", shape[0], r}}) {
        std::vector<float> v(static_cast<size_t>(rows * cols));
        for (float& x : v) x = u(rng);
        f.add_tensor(name + suffix, DType::F32, {rows, cols}, v.data(), v.size() * sizeof(float));
      }
    }
  const std::string path = (std::filesystem::temp_directory_path() / file).string();
  f.write(path);
  return path;
}

}  // namespace tessera::test
