// tessera detokenize: token ids -> text (ids as separate arguments, or one list such as "[1, 2, 3]" or "1,2,3").
#include <fmt/core.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <utility>

#include "command.h"
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

std::vector<TokenId> parse_ids(const std::vector<std::string>& args) {
  std::vector<TokenId> ids;
  for (const std::string& a : args) {
    size_t i = 0;
    while (i < a.size()) {
      const char c = a[i];
      if (c == ',' || c == '[' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i;
        continue;
      }
      size_t j = i;
      if (a[j] == '-') ++j;
      while (j < a.size() && a[j] >= '0' && a[j] <= '9') ++j;
      const std::string num = a.substr(i, j - i);
      check(!num.empty() && num != "-" && num.size() <= 10,
                    "detokenize: '{}' is not a token id (expected integers such as 1 2 3 or [1, 2, 3])", a);
      const long long v = std::stoll(num);
      check(v >= 0 && v <= INT32_MAX, "detokenize: token id {} is out of range", num);
      ids.push_back(static_cast<TokenId>(v));
      i = j;
    }
  }
  return ids;
}

struct Options {
  std::string model;
  std::vector<std::string> ids;
  bool hide_special = false;
};

const int kRegistered = register_command({
    "detokenize", "Turn token ids back into text",
    [](CLI::App& app) -> Runner {
      auto o = std::make_shared<Options>();
      add_model_option(app, o->model);
      app.add_option("ids", o->ids, "Token ids: 1 2 3, or \"[1, 2, 3]\" as `tokenize --json` prints")->required();
      app.add_flag("--hide-special", o->hide_special, "Leave out control tokens such as <|im_end|>");
      return [o] {
        const std::vector<TokenId> ids = parse_ids(o->ids);
        const Tokenizer tok = Tokenizer::from_model(resolve_model_path(o->model));
        const std::string text = tok.decode(ids, !o->hide_special);
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fputc('\n', stdout);
        return 0;
      };
    }});

}  // namespace
}  // namespace tessera::cli
