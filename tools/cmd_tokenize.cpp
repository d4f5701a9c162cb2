// tessera tokenize: text -> token ids and pieces (the same ids as llama.cpp's llama-tokenize on GGUF models).
#include <fmt/core.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <utility>

#include "command.h"
#include "gen_options.h"
#include "tessera/error.h"
#include "tessera/model_info.h"
#include "tessera/tokenizer.h"

namespace tessera::cli {
namespace {

// Tools use only the public API: input errors are thrown as tessera::Error with one sentence.
template <typename... Args>
void check(bool ok, fmt::format_string<Args...> f, Args&&... args) {
  if (!ok) throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// A piece shown between quotes on one line: complete UTF-8 characters as they are, line breaks, tabs and other
// control bytes as escapes, and bytes of an incomplete character (byte tokens, pieces of emoji) as \xNN.
std::string show_piece(const std::string& s) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = p[i];
    int len = c < 0x80                   ? 1
              : (c >= 0xC2 && c <= 0xDF) ? 2
              : (c >= 0xE0 && c <= 0xEF) ? 3
              : (c >= 0xF0 && c <= 0xF4) ? 4
                                         : 0;
    for (int k = 1; k < len; ++k) {
      if (i + static_cast<size_t>(k) >= s.size() || (p[i + static_cast<size_t>(k)] & 0xC0) != 0x80) len = 0;
    }
    if (len == 1) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\\') {
        out += "\\\\";
      } else if (c < 0x20 || c == 0x7F) {
        out += fmt::format("\\x{:02X}", c);
      } else {
        out.push_back(static_cast<char>(c));
      }
      ++i;
    } else if (len > 1) {
      out.append(s, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += fmt::format("\\x{:02X}", c);
      ++i;
    }
  }
  return out;
}

struct Options {
  std::string model;
  std::string text;
  std::string file;
  bool no_bos = false;
  bool special = false;  // --special: the default now, kept for scripts that pass it
  bool no_parse_special = false;
  bool no_escape = false;
  bool json = false;
};

const int kRegistered = register_command(
    {"tokenize", "Split text into token ids and pieces (the ids llama.cpp's llama-tokenize gives)",
     [](CLI::App& app) -> Runner {
       auto o = std::make_shared<Options>();
       add_model_option(app, o->model);
       CLI::Option* text_opt = app.add_option("text", o->text, "Text to tokenize (or use -f FILE)");
       CLI::Option* file_opt =
           app.add_option("-f,--file", o->file, "Read the text from FILE (- for standard input), bytes as they are");
       text_opt->excludes(file_opt);
       app.add_flag("--no-bos", o->no_bos, "Do not add BOS/EOS even where the model's metadata asks for them");
       app.add_flag("--no-parse-special", o->no_parse_special,
                    "Take control-token text such as \"<|im_start|>\" as plain text (by default it becomes one control "
                    "token, as in llama-tokenize and `tessera run`)");
       app.add_flag("--special", o->special, "Parse special tokens (the default; kept for compatibility)");
       app.add_flag("--no-escape", o->no_escape,
                    "Take backslashes in the text literally (by default \\n, \\t, \\xNN, ... are processed, as "
                    "llama-tokenize does)");
       app.add_flag("--json", o->json, "Print only a JSON array of the ids");
       return [o, text_opt, file_opt] {
         check(text_opt->count() > 0 || file_opt->count() > 0, "tokenize: give the TEXT or -f FILE");
         std::string text = o->text;
         if (file_opt->count() > 0 && o->file == "-") {
           text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
         } else if (file_opt->count() > 0) {
           std::error_code ec;
           check(!std::filesystem::is_directory(o->file, ec), "{}: is a directory, not a text file", o->file);
           std::ifstream f(o->file, std::ios::binary);
           check(f.good(), "{}: cannot open the file", o->file);
           std::ostringstream ss;
           ss << f.rdbuf();
           text = ss.str();
         }
         if (!o->no_escape) text = process_escapes(text);
         const std::string path = resolve_model_path(o->model);
         // A tokenizer.json alone is a tokenizer; anything else must be a model the other commands would load too.
         const std::string fname = std::filesystem::path(path).filename().string();
         if (fname.size() < 14 || fname.compare(fname.size() - 14, 14, "tokenizer.json") != 0) (void)model_format(path);
         const Tokenizer tok = Tokenizer::from_model(path);
         const std::vector<TokenId> ids = tok.encode(text, !o->no_bos, !o->no_parse_special);
         if (o->json) {
           std::string out = "[";
           for (size_t i = 0; i < ids.size(); ++i) {
             if (i > 0) out.append(", ");
             out.append(std::to_string(ids[i]));
           }
           fmt::print("{}]\n", out);
         } else {
           for (const TokenId id : ids) fmt::print("{:>6} '{}'\n", id, show_piece(tok.token_to_piece(id)));
         }
         return 0;
       };
     }});

}  // namespace
}  // namespace tessera::cli
