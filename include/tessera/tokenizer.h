// Public API: text <-> token ids, agreeing with llama.cpp token for token on GGUF models and with Hugging Face
// `tokenizers` on byte-level BPE tokenizer.json files.
//
// Kinds: GGUF `tokenizer.ggml.model` = "gpt2" (byte-level BPE with merges, pre-tokenized per `tokenizer.ggml.pre`),
// "llama" (SentencePiece BPE with scores and <0xXX> byte fallback) and "gemma4" (BPE with merges over raw UTF-8
// characters, spaces as U+2581, <0xXX> byte fallback); tokenizer.json with a byte-level BPE model.
//
// Invalid UTF-8 input: for byte-level BPE every byte that is not part of a well-formed UTF-8 sequence is replaced
// by U+FFFD before tokenization (llama.cpp does the same for stray and truncated sequences), so such input never
// fails and never crashes; for SentencePiece the bytes are kept and become <0xXX> byte tokens. decode() returns the
// exact bytes of the tokens, so decode(encode(s)) == s for every valid UTF-8 string s.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

using TokenId = int32_t;

class Tokenizer {
 public:
  struct Impl;  // defined in src/runtime (the library's internals)

  // A .gguf file; a tokenizer.json; or a safetensors model (a .safetensors file, an index.json, or a directory)
  // with tokenizer.json (and optionally tokenizer_config.json) beside it. Throws tessera::Error naming the file.
  static Tokenizer from_model(const std::string& model_path);

  explicit Tokenizer(std::shared_ptr<const Impl> impl);

  // add_special: add BOS/EOS where the model's metadata asks for them (tokenizer.ggml.add_bos_token, ...).
  // parse_special: text of control tokens (e.g. "<|im_start|>") becomes that single token; when off it is plain
  // text. User-defined added tokens are always matched, as in llama.cpp and Hugging Face tokenizers.
  std::vector<TokenId> encode(std::string_view text, bool add_special = true, bool parse_special = false) const;

  // The bytes of the tokens, concatenated. render_special: control tokens render as their text (else nothing).
  // For SentencePiece models with a space prefix, the space added by encode() before the first word is removed.
  // Throws tessera::Error for an id outside [0, n_vocab).
  std::string decode(const std::vector<TokenId>& ids, bool render_special = true) const;
  // The bytes one token stands for (may be an incomplete UTF-8 sequence, e.g. a byte token).
  std::string token_to_piece(TokenId id, bool render_special = true) const;
  // The token's string as stored in the vocabulary (byte-level or ▁-escaped form).
  const std::string& token_text(TokenId id) const;

  int32_t n_vocab() const;
  TokenId bos_id() const;  // -1 when the model has none
  TokenId eos_id() const;
  TokenId eot_id() const;  // end of turn (e.g. <|im_end|>, <|eot_id|>), -1 when none
  bool add_bos() const;
  bool add_eos() const;
  bool is_eog(TokenId id) const;      // ends generation: eos, eot, eom and the known end-of-turn tokens
  bool is_control(TokenId id) const;  // control or unknown token (rendered only with render_special)
  std::string kind() const;           // "gpt2", "llama", "gemma4" or "hf-bpe"
  std::string pre_type() const;       // pre-tokenizer name ("smollm", "llama3", ...; "tokenizer.json" for HF)
  const std::string& chat_template() const;  // Jinja source from the model, "" when absent

  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// Turns a stream of token ids into text pieces that are always complete UTF-8: bytes of a multi-byte character
// split across tokens (byte tokens, byte-level pieces of emoji) are held back until the character is complete.
// Bytes that can never form a valid character are emitted as U+FFFD, so every piece is valid UTF-8.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool render_special = true);
  // Text that became complete with this token ("" while a character is incomplete).
  std::string push(TokenId id);
  // Whatever is held back, with an incomplete trailing sequence as U+FFFD; resets the decoder.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool render_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace tessera
