// Tokenizer data from a Hugging Face tokenizer.json (byte-level BPE), plus tokenizer_config.json and
// generation_config.json from the same directory for special tokens and the chat template.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "runtime/tokenizer_pretokenize.h"
#include "runtime/tokenizer_vocab.h"

namespace tessera::tok {

namespace {

using nlohmann::json;

// The regex of Hugging Face's ByteLevel pre-tokenizer (use_regex = true).
constexpr const char* kByteLevelRegex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "{}: cannot open the file", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& text, const std::string& name) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    tessera::fail("{}: not valid JSON ({})", name, e.what());
  }
}

std::string literal_pattern(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

struct PreState {
  std::vector<std::string> patterns;
  bool byte_level = false;
};

void collect_pre(const json& node, PreState& st, const std::string& name) {
  if (node.is_null()) return;
  TESSERA_CHECK(node.is_object() && node.contains("type"), "{}: malformed pre_tokenizer entry", name);
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& p : node.value("pretokenizers", json::array())) collect_pre(p, st, name);
  } else if (type == "ByteLevel") {
    TESSERA_CHECK(!node.value("add_prefix_space", false),
                  "{}: ByteLevel pre-tokenizer with add_prefix_space = true is not supported", name);
    if (node.value("use_regex", true)) st.patterns.push_back(adapt_whitespace(kByteLevelRegex));
    st.byte_level = true;
  } else if (type == "Split") {
    TESSERA_CHECK(node.value("behavior", "") == "Isolated" && !node.value("invert", false),
                  "{}: Split pre-tokenizer with behavior '{}' is not supported (only Isolated, not inverted)", name,
                  node.value("behavior", ""));
    const json& pat = node.at("pattern");
    if (pat.contains("Regex")) {
      st.patterns.push_back(adapt_whitespace(pat.at("Regex").get<std::string>()));
    } else if (pat.contains("String")) {
      st.patterns.push_back(literal_pattern(pat.at("String").get<std::string>()));
    } else {
      tessera::fail("{}: Split pre-tokenizer without a Regex or String pattern", name);
    }
  } else if (type == "Digits") {
    st.patterns.push_back(node.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
  } else {
    tessera::fail("{}: pre-tokenizer '{}' is not supported (byte-level BPE tokenizers only)", name, type);
  }
}

TokenId id_of(const VocabData& v, const json& tok) {
  std::string text;
  if (tok.is_string()) {
    text = tok.get<std::string>();
  } else if (tok.is_object() && tok.contains("content")) {
    text = tok.at("content").get<std::string>();
  } else {
    return -1;
  }
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.tokens[i] == text) return static_cast<TokenId>(i);
  }
  return -1;
}

// BOS/EOS added by a TemplateProcessing post-processor: special tokens before / after the sequence.
void read_post_processor(const json& pp, VocabData& v) {
  if (!pp.is_object()) return;
  if (pp.value("type", "") == "Sequence") {
    for (const json& p : pp.value("processors", json::array())) read_post_processor(p, v);
    return;
  }
  if (pp.value("type", "") != "TemplateProcessing") return;
  bool seen_seq = false;
  for (const json& item : pp.value("single", json::array())) {
    if (item.contains("Sequence")) {
      seen_seq = true;
    } else if (item.contains("SpecialToken")) {
      const TokenId id = id_of(v, item["SpecialToken"].value("id", json()));
      if (id < 0) continue;
      if (seen_seq) {
        v.add_eos = true;
        v.eos = id;
      } else {
        v.add_bos = true;
        v.bos = id;
      }
    }
  }
}

void read_configs(const std::string& dir, VocabData& v) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  if (!dir.empty() && fs::exists(cfg_path, ec)) {
    const json cfg = parse_json(read_file(cfg_path.string()), cfg_path.string());
    if (cfg.contains("bos_token")) v.bos = id_of(v, cfg["bos_token"]);
    if (cfg.contains("eos_token")) v.eos = id_of(v, cfg["eos_token"]);
    if (cfg.contains("unk_token")) v.unk = id_of(v, cfg["unk_token"]);
    if (cfg.contains("pad_token")) v.pad = id_of(v, cfg["pad_token"]);
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) v.add_bos = cfg["add_bos_token"].get<bool>();
    if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) v.add_eos = cfg["add_eos_token"].get<bool>();
    if (cfg.contains("chat_template")) {
      const json& ct = cfg["chat_template"];
      if (ct.is_string()) {
        v.chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {  // named templates: take "default", else the first
        for (const json& t : ct) {
          if (v.chat_template.empty() || t.value("name", "") == "default") v.chat_template = t.value("template", "");
        }
      }
    }
  }
  const fs::path gen_path = fs::path(dir) / "generation_config.json";
  if (!dir.empty() && fs::exists(gen_path, ec)) {
    const json gen = parse_json(read_file(gen_path.string()), gen_path.string());
    const json eos = gen.value("eos_token_id", json());
    if (eos.is_number_integer()) v.extra_eog.push_back(eos.get<TokenId>());
    if (eos.is_array()) {
      for (const json& e : eos) {
        if (e.is_number_integer()) v.extra_eog.push_back(e.get<TokenId>());
      }
    }
  }
}

}  // namespace

VocabData vocab_from_tokenizer_json_text(const std::string& text, const std::string& name, const std::string& dir) {
  const json doc = parse_json(text, name);
  TESSERA_CHECK(doc.is_object() && doc.contains("model"), "{}: no 'model' object (not a tokenizer.json)", name);
  const json& model = doc["model"];
  const std::string mtype = model.value("type", "BPE");
  TESSERA_CHECK(mtype == "BPE", "{}: tokenizer model '{}' is not supported (only BPE)", name, mtype);
  TESSERA_CHECK(!model.value("byte_fallback", false),
                "{}: BPE with byte_fallback (SentencePiece-style) is not supported from tokenizer.json", name);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json x = model.value(key, json());
    TESSERA_CHECK(x.is_null() || (x.is_string() && x.get<std::string>().empty()),
                  "{}: BPE option '{}' is not supported", name, key);
  }
  const json norm = doc.value("normalizer", json());
  TESSERA_CHECK(norm.is_null() || (norm.value("type", "") == "Sequence" && norm.value("normalizers", json::array()).empty()),
                "{}: normalizer '{}' is not supported", name, norm.is_object() ? norm.value("type", "?") : "?");

  VocabData v;
  v.kind = VocabKind::BYTE_BPE;
  v.kind_name = "hf-bpe";
  v.pre = "tokenizer.json";
  v.source = name;
  const json& vocab = model.at("vocab");
  TESSERA_CHECK(vocab.is_object() && !vocab.empty(), "{}: 'model.vocab' is missing or empty", name);
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    TESSERA_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                      it.value().get<int64_t>() < (int64_t{1} << 24),
                  "{}: vocabulary entry has an invalid id", name);
    max_id = std::max(max_id, it.value().get<int64_t>());
  }
  const json added = doc.value("added_tokens", json::array());
  for (const json& a : added) {
    TESSERA_CHECK(a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
                      a["id"].get<int64_t>() < (int64_t{1} << 24) && a.contains("content") && a["content"].is_string(),
                  "{}: malformed added_tokens entry", name);
    max_id = std::max(max_id, a["id"].get<int64_t>());
  }
  const size_t n = static_cast<size_t>(max_id + 1);
  v.tokens.assign(n, std::string());
  v.types.assign(n, TokenType::UNUSED);
  v.lstrip.assign(n, 0);
  v.rstrip.assign(n, 0);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const auto id = static_cast<size_t>(it.value().get<int64_t>());
    v.tokens[id] = it.key();
    v.types[id] = TokenType::NORMAL;
  }
  for (const json& a : added) {
    const auto id = static_cast<size_t>(a["id"].get<int64_t>());
    v.tokens[id] = a["content"].get<std::string>();
    v.types[id] = a.value("special", false) ? TokenType::CONTROL : TokenType::USER_DEFINED;
    v.lstrip[id] = a.value("lstrip", false) ? 1 : 0;
    v.rstrip[id] = a.value("rstrip", false) ? 1 : 0;
  }
  for (size_t i = 0; i < n; ++i) {
    if (v.tokens[i].empty()) v.tokens[i] = "[UNUSED_" + std::to_string(i) + "]";  // a hole in the id range
  }
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      TESSERA_CHECK(sp != std::string::npos, "{}: merge '{}' has no space separator", name, s);
      v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      TESSERA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                    "{}: malformed merge entry", name);
      v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  v.ignore_merges = model.value("ignore_merges", false);

  PreState st;
  collect_pre(doc.value("pre_tokenizer", json()), st, name);
  TESSERA_CHECK(st.byte_level, "{}: only byte-level BPE tokenizers (a ByteLevel pre-tokenizer) are supported", name);
  v.pre_patterns = std::move(st.patterns);
  v.pre_explicit = true;

  read_post_processor(doc.value("post_processor", json()), v);
  read_configs(dir, v);
  return v;
}

VocabData vocab_from_tokenizer_json(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return vocab_from_tokenizer_json_text(read_file(path), path, dir.empty() ? "." : dir);
}

}  // namespace tessera::tok
