// tessera chat: an interactive multi-turn conversation with the model's chat template. Reads one message per line
// (also from a pipe); /reset starts over, /quit or end of input (Ctrl-D) leaves.
//
// Each turn renders the whole conversation and evaluates only what the session does not already hold (the longest
// common prefix of tokens is kept), so the cache is reused turn after turn whatever the template does at turn ends.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "command.h"
#include "gen_options.h"
#include "tessera/chat.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/session.h"

namespace tessera::cli {
namespace {

struct ChatFlags {
  GenFlags g;
  bool verbose = false;
};

int run(ChatFlags& f) {
  finish_gen_flags(f.g);
  Model model = Model::load(f.g.model);
  const Tokenizer& tok = model.tokenizer();
  const ChatTemplate tmpl = chat_template_for(tok, f.g.chat_template);
  Session session(model, f.g.session);
  const bool interactive = isatty(STDIN_FILENO) != 0;
  std::vector<ChatMessage> messages;
  const auto start_over = [&] {
    messages.clear();
    if (!f.g.system.empty()) messages.push_back({"system", f.g.system});
    session.reset();
  };
  start_over();
  if (interactive)
    fmt::print(stderr, "tessera chat with {} ({} template). /reset starts over, /quit or Ctrl-D leaves.\n",
               model.spec().name.empty() ? model.path() : model.spec().name, tmpl.name);
  std::string line;
  for (;;) {
    if (interactive) {
      fmt::print("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      start_over();
      if (interactive) fmt::print(stderr, "(conversation reset)\n");
      continue;
    }
    messages.push_back({"user", line});
    const std::string text = render_chat(tmpl, messages, true);
    const std::vector<int32_t> ids = tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
    if (ids.empty()) throw Error("the chat template rendered an empty conversation");
    const auto& have = session.tokens();
    size_t keep = 0;
    while (keep < have.size() && keep < ids.size() && have[keep] == ids[keep]) ++keep;
    keep = std::min(keep, ids.size() - 1);  // at least one token is evaluated, to get fresh logits
    if (static_cast<int64_t>(ids.size()) >= session.n_ctx()) {
      messages.pop_back();
      fmt::print(stderr, "tessera: the conversation ({} tokens) no longer fits the context of {}; /reset to start "
                 "over\n", ids.size(), session.n_ctx());
      if (!interactive) return 1;
      continue;
    }
    session.truncate(static_cast<int64_t>(keep));
    const GenerateResult r = session.generate_tokens(std::span<const int32_t>(ids).subspan(keep), f.g.gen,
                                                     [](std::string_view piece) {
                                                       std::fwrite(piece.data(), 1, piece.size(), stdout);
                                                       std::fflush(stdout);
                                                       return true;
                                                     });
    fmt::print("\n");
    std::fflush(stdout);
    messages.push_back({"assistant", r.text});
    if (r.stop_reason == StopReason::CONTEXT_FULL)
      fmt::print(stderr, "tessera: the context is full ({} tokens); /reset to start over\n", session.n_ctx());
    if (f.verbose) fmt::print(stderr, "{}\n", stats_line(r.timings));
  }
  if (interactive) fmt::print("\n");
  return 0;
}

const int registered = register_command({"chat", "Chat with the model (interactive, or messages from a pipe)",
                                         [](CLI::App& app) -> Runner {
                                           auto f = std::make_shared<ChatFlags>();
                                           add_gen_flags(app, f->g);
                                           app.add_flag("-v,--verbose", f->verbose,
                                                        "Print a stats line on stderr after each reply");
                                           return [f] { return run(*f); };
                                         }});

}  // namespace
}  // namespace tessera::cli
