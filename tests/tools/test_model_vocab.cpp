// A GGUF whose vocabulary (tokenizer.ggml.tokens) disagrees with its embedding rows, its output rows or its
// <arch>.vocab_size is refused when the model is opened, in one sentence (before, such a file ran and the ids past
// the vocabulary decoded to nothing). The files are crafted here with the GGUF writer: no weights beyond the two
// matrices are needed, since Model::load checks them before anything builds a graph.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/gguf.h"
#include "tessera/error.h"
#include "tessera/model.h"

namespace tessera {
namespace {

constexpr int64_t kEmbd = 8;

struct Shape {
  int64_t n_tokens, embd_rows;
  std::optional<int64_t> output_rows;  // none: tied to the embedding
  std::optional<int64_t> vocab_size;   // llama.vocab_size key
};

std::string write_model(const Shape& s, const std::string& name) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::from_string("llama"));
  w.set("llama.context_length", gguf::Value::from_u32(64));
  w.set("llama.embedding_length", gguf::Value::from_u32(kEmbd));
  w.set("llama.block_count", gguf::Value::from_u32(1));
  w.set("llama.feed_forward_length", gguf::Value::from_u32(16));
  w.set("llama.attention.head_count", gguf::Value::from_u32(2));
  w.set("llama.attention.head_count_kv", gguf::Value::from_u32(2));
  w.set("llama.attention.layer_norm_rms_epsilon", gguf::Value::from_f32(1e-5f));
  if (s.vocab_size) w.set("llama.vocab_size", gguf::Value::from_u32(static_cast<uint32_t>(*s.vocab_size)));
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  while (static_cast<int64_t>(tokens.size()) < s.n_tokens) {
    std::string t = "t";
    t.append(std::to_string(tokens.size()));
    tokens.push_back(std::move(t));
    types.push_back(1);
  }
  w.set("tokenizer.ggml.model", gguf::Value::from_string("llama"));
  w.set("tokenizer.ggml.tokens", gguf::Value::from_strings(tokens));
  w.set("tokenizer.ggml.scores", gguf::Value::from_f32s(std::vector<float>(tokens.size(), 0.0f)));
  w.set("tokenizer.ggml.token_type", gguf::Value::from_i32s(types));
  const std::vector<float> embd(static_cast<size_t>(s.embd_rows * kEmbd), 0.5f);
  w.add_tensor("token_embd.weight", DType::F32, {s.embd_rows, kEmbd}, embd.data(), embd.size() * sizeof(float));
  if (s.output_rows) {
    const std::vector<float> out(static_cast<size_t>(*s.output_rows * kEmbd), 0.25f);
    w.add_tensor("output.weight", DType::F32, {*s.output_rows, kEmbd}, out.data(), out.size() * sizeof(float));
  }
  const std::string path = (std::filesystem::temp_directory_path() / ("tessera_vocab_" + name + ".gguf")).string();
  w.write(path);
  return path;
}

// The error text, or "" when the model loads.
std::string load_error(const Shape& s, const std::string& name) {
  const std::string path = write_model(s, name);
  std::string what;
  try {
    (void)Model::load(path);
  } catch (const Error& e) {
    what = e.what();
  }
  std::filesystem::remove(path);
  return what;
}

TEST(ModelVocabulary, MatchingSizesLoad) {
  EXPECT_EQ(load_error({10, 10, std::nullopt, std::nullopt}, "tied"), "");
  EXPECT_EQ(load_error({10, 10, 10, 10}, "untied"), "");
}

TEST(ModelVocabulary, DisagreeingSizesAreRefusedInOneSentence) {
  const struct {
    Shape shape;
    const char* name;
  } cases[] = {
      {{10, 12, std::nullopt, std::nullopt}, "embedding_rows"},  // tokens past the vocabulary would decode to nothing
      {{10, 12, std::nullopt, 12}, "vocab_size_key"},            // the key agrees with the rows, the tokens do not
      {{10, 10, 12, std::nullopt}, "output_rows"},
      {{12, 10, std::nullopt, std::nullopt}, "fewer_rows"},
  };
  for (const auto& c : cases) {
    const std::string what = load_error(c.shape, c.name);
    SCOPED_TRACE(c.name);
    std::string want = "the vocabulary (tokenizer.ggml.tokens) has ";
    want.append(std::to_string(c.shape.n_tokens));
    want.append(" tokens but ");
    EXPECT_NE(what.find(want), std::string::npos) << what;
    EXPECT_NE(what.find("they must be equal"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace tessera
