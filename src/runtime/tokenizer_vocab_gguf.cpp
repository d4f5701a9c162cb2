// Tokenizer data from GGUF metadata (tokenizer.ggml.*), with llama.cpp's defaults per tokenizer model and
// pre-tokenizer name.
#include <algorithm>
#include <array>
#include <cctype>

#include "core/error.h"
#include "formats/gguf.h"
#include "runtime/tokenizer_pretokenize.h"
#include "runtime/tokenizer_vocab.h"

namespace tessera::tok {

namespace {

// llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), written for PCRE2. llama.cpp runs some through hand-written
// matchers and the rest through std::regex over a category-collapsed copy of the text; PCRE2 with UCP evaluates
// the same expressions on the Unicode properties directly. \s is adapted by adapt_whitespace().
constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen3.5: Qwen2's with combining marks (\p{M}) kept inside words.
constexpr const char* kQwen35 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
    "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

bool one_of(const std::string& s, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return s == n; });
}

std::vector<std::string> adapted(std::initializer_list<const char*> patterns) {
  std::vector<std::string> out;
  for (const char* p : patterns) out.push_back(adapt_whitespace(p));
  return out;
}

}  // namespace

std::vector<std::string> pre_patterns_for(const std::string& pre, const std::string& source) {
  if (pre.empty() || pre == "default") {
    return adapted({"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"});
  }
  if (one_of(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                   "jina-v5-nano", "dbrx", "smaug-bpe"})) {
    return adapted({kLlama3});
  }
  if (one_of(pre, {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"})) {
    return adapted({"\\p{N}", kGpt2});
  }
  if (one_of(pre, {"gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                   "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
                   "jina-v1-en", "jina-v2-code", "roberta-bpe"})) {
    return adapted({kGpt2});
  }
  if (one_of(pre, {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "bailingmoe",
                   "solar-open", "megrez"})) {
    return adapted({kQwen2});
  }
  if (pre == "qwen35") return adapted({kQwen35});
  if (pre == "gemma4") return {"[^\\n]+|[\\n]+"};  // whole lines and runs of newlines; BPE does the rest
  if (pre == "falcon") {
    return adapted({"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"});
  }
  tessera::fail(
      "{}: pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported; supported: default, smollm (and "
      "starcoder, refact, command-r, ...), llama3 / llama-bpe (and dbrx, smaug-bpe, ...), gpt2 / gpt-2 (and "
      "mpt, olmo, ...), qwen2 (and stablelm2, ...), qwen35, falcon, gemma4",
      source, pre);
}

VocabData vocab_from_gguf(const gguf::File& file) {
  VocabData v;
  v.source = file.path();
  const auto model = file.get_string("tokenizer.ggml.model");
  TESSERA_CHECK(model.has_value(), "{}: no tokenizer in the file (metadata key 'tokenizer.ggml.model' is missing)",
                v.source);
  v.kind_name = std::string(*model);
  if (v.kind_name == "gpt2") {
    v.kind = VocabKind::BYTE_BPE;
  } else if (v.kind_name == "gemma4") {
    v.kind = VocabKind::BYTE_BPE;
    v.raw_bpe = true;
  } else if (v.kind_name == "llama") {
    v.kind = VocabKind::SPM;
  } else {
    tessera::fail("{}: tokenizer model '{}' (tokenizer.ggml.model) is not supported; supported: gpt2, gemma4, llama",
                  v.source, v.kind_name);
  }
  const auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  TESSERA_CHECK(tokens.has_value() && !tokens->empty(), "{}: metadata key 'tokenizer.ggml.tokens' is missing or empty",
                v.source);
  const size_t n = tokens->size();
  v.tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // llama.cpp renames empty tokens so that every token has a distinct, non-empty text.
    v.tokens.emplace_back((*tokens)[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : std::string((*tokens)[i]));
  }
  v.types.assign(n, TokenType::NORMAL);
  if (const auto types = file.get_number_array("tokenizer.ggml.token_type")) {
    TESSERA_CHECK(types->size() >= n, "{}: 'tokenizer.ggml.token_type' has {} entries for {} tokens", v.source,
                  types->size(), n);
    for (size_t i = 0; i < n; ++i) {
      const double t = (*types)[i];
      v.types[i] = (t >= 1 && t <= 6) ? static_cast<TokenType>(static_cast<int32_t>(t)) : TokenType::UNDEFINED;
    }
  }
  if (const auto scores = file.get_number_array("tokenizer.ggml.scores")) {
    TESSERA_CHECK(scores->size() >= n, "{}: 'tokenizer.ggml.scores' has {} entries for {} tokens", v.source,
                  scores->size(), n);
    v.scores.assign(scores->begin(), scores->begin() + static_cast<std::ptrdiff_t>(n));
  }
  if (v.kind == VocabKind::BYTE_BPE) {
    const auto merges = file.get_string_array("tokenizer.ggml.merges");
    TESSERA_CHECK(merges.has_value(), "{}: metadata key 'tokenizer.ggml.merges' is missing (a gpt2 tokenizer needs it)",
                  v.source);
    v.merges.reserve(merges->size());
    for (const std::string_view m : *merges) {
      // The separator is the first space after the first character: a merge's left side may itself be a space.
      const size_t sp = m.find(' ', 1);
      if (sp == std::string_view::npos) continue;  // malformed entry: llama.cpp records a pair that never matches
      v.merges.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
    }
    v.pre = v.raw_bpe ? "gemma4" : std::string(file.get_string("tokenizer.ggml.pre").value_or("default"));
    v.add_bos = false;
    v.bos = v.raw_bpe ? -1 : 11;  // llama.cpp's defaults for gpt2 vocabularies without explicit ids
    v.eos = v.raw_bpe ? -1 : 11;
    if (one_of(v.pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                       "jina-v5-nano"})) {
      v.ignore_merges = true;
      v.add_bos = true;
    }
  } else {
    v.pre = "spm";
    v.add_bos = true;
    v.add_space_prefix = true;
    v.bos = 1;
    v.eos = 2;
    v.unk = 0;
  }
  v.pre_patterns.clear();

  auto id_key = [&](const char* key, TokenId& id) {
    if (const auto x = file.get_uint(key)) id = *x < n ? static_cast<TokenId>(*x) : -1;
  };
  id_key("tokenizer.ggml.bos_token_id", v.bos);
  id_key("tokenizer.ggml.eos_token_id", v.eos);
  id_key("tokenizer.ggml.eot_token_id", v.eot);
  id_key("tokenizer.ggml.eom_token_id", v.eom);
  id_key("tokenizer.ggml.unknown_token_id", v.unk);
  id_key("tokenizer.ggml.padding_token_id", v.pad);
  if (const auto b = file.get_bool("tokenizer.ggml.add_bos_token")) v.add_bos = *b;
  if (const auto b = file.get_bool("tokenizer.ggml.add_eos_token")) v.add_eos = *b;
  if (const auto b = file.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *b;
  if (v.kind == VocabKind::BYTE_BPE) v.add_space_prefix = false;  // byte-level BPE never prefixes (llama.cpp)
  if (const auto t = file.get_string("tokenizer.chat_template")) v.chat_template = std::string(*t);

  // Phi-3 models: special tokens eat the whitespace after them (llama.cpp sets this by model name).
  std::string name(file.get_string("general.name").value_or(""));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    v.rstrip.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      const TokenType t = v.types[i];
      const bool special = t == TokenType::CONTROL || t == TokenType::USER_DEFINED || t == TokenType::UNKNOWN;
      if (special || v.tokens[i] == "</s>") v.rstrip[i] = 1;
      if (one_of(v.tokens[i], {"<unk>", "<s>", "<|endoftext|>"})) v.rstrip[i] = 0;
    }
  }
  return v;
}

}  // namespace tessera::tok
