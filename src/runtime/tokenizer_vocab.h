// Tokenizer data as a plain struct, loaded from GGUF metadata or from a Hugging Face tokenizer.json, and the
// construction of a Tokenizer from it. Everything model-specific is decided here (defaults, special ids, pre type),
// so the engines in tokenizer_bpe / tokenizer_spm only see tables.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessera/tokenizer.h"

namespace tessera::gguf {
class File;
}

namespace tessera::tok {

// Values of GGUF tokenizer.ggml.token_type (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  UNDEFINED = 0,
  NORMAL = 1,
  UNKNOWN = 2,
  CONTROL = 3,
  USER_DEFINED = 4,
  UNUSED = 5,
  BYTE = 6,
};

enum class VocabKind { BYTE_BPE, SPM };

struct VocabData {
  VocabKind kind = VocabKind::BYTE_BPE;
  std::string kind_name;  // "gpt2", "llama", "hf-bpe"
  std::string pre;        // tokenizer.ggml.pre, or "tokenizer.json"
  std::string source;     // file name, for error messages
  std::vector<std::string> tokens;
  std::vector<float> scores;     // SPM merge priorities; empty for BPE
  std::vector<TokenType> types;  // one per token
  std::vector<uint8_t> lstrip, rstrip;  // per token (empty = none): whitespace eaten around special tokens
  std::vector<std::pair<std::string, std::string>> merges;  // BPE, in rank order
  // Pre-tokenizer regexes applied in sequence (each splits every piece into matches and the gaps between them).
  // Patterns use PCRE2 syntax. Unless pre_explicit, they are derived from `pre` (GGUF) by make_tokenizer.
  std::vector<std::string> pre_patterns;
  bool pre_explicit = false;
  bool ignore_merges = false;  // a word that is a whole token is emitted as is (llama3)
  // BPE over raw UTF-8 characters instead of GPT-2's byte alphabet, with spaces written as U+2581 first and
  // <0xXX> byte tokens for characters outside the merges (GGUF tokenizer.ggml.model "gemma4": SentencePiece-style
  // BPE). A word of newlines that is a whole token is emitted as is.
  bool raw_bpe = false;
  TokenId bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  std::vector<TokenId> extra_eog;  // more end-of-generation ids (generation_config.json eos lists)
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  std::string chat_template;
};

// Reads tokenizer.* keys (and general.name for model-specific token attributes). Throws tessera::Error naming the
// file and key when something is missing or malformed.
VocabData vocab_from_gguf(const gguf::File& file);
// Reads a tokenizer.json (BPE model, byte-level pre-tokenizer) plus tokenizer_config.json and
// generation_config.json from the same directory when present.
VocabData vocab_from_tokenizer_json(const std::string& path);
// Parses tokenizer.json text already in memory; `dir` ("" for none) is where the config files are looked up.
VocabData vocab_from_tokenizer_json_text(const std::string& text, const std::string& name, const std::string& dir);

// The PCRE2 patterns llama.cpp uses for a GGUF tokenizer.ggml.pre name (whitespace class adapted, see
// tokenizer_pretokenize.cpp); Error listing the supported names for an unknown one.
std::vector<std::string> pre_patterns_for(const std::string& pre, const std::string& source);

// Validates `data` and builds the tables; Error on inconsistent data (ids out of range, missing byte tokens...).
Tokenizer make_tokenizer(VocabData data);

}  // namespace tessera::tok
