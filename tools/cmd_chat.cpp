// tessera chat: an interactive multi-turn conversation with the model's chat template. Reads one message per line
// (also from a pipe), with line editing and history on a terminal (libedit); /reset starts over, /quit or end of
// input (Ctrl-D) leaves, Ctrl-C stops a reply and returns to the prompt.
//
// Each turn renders the whole conversation and evaluates only what the session does not already hold (the longest
// common prefix of tokens is kept), so the cache is reused turn after turn whatever the template does at turn ends.
//
// A full context never ends the conversation. By default the oldest turns (a user message and its reply; the system
// prompt stays) are dropped until the conversation and room for a reply fit, as ollama does; a reply that fills the
// context stops there. --context-shift does what llama.cpp does instead: the oldest half of the tokens after the
// system prompt is discarded, at a new message and in the middle of a reply, which then goes on (the kept tokens are
// evaluated again: the cache cannot move rows to new positions).
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#ifdef TESSERA_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

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
  bool context_shift = false;
};

volatile std::sig_atomic_t g_interrupted = 0;
void on_sigint(int) { g_interrupted = 1; }

// Ctrl-C sets a flag instead of ending the process; no SA_RESTART, so a read waiting at the prompt returns.
void catch_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

enum class Read { LINE, INTERRUPTED, END };

// One line of input: through libedit on a terminal (arrow keys, history), std::getline otherwise.
Read read_line(bool interactive, std::string& line) {
  g_interrupted = 0;
#ifdef TESSERA_HAVE_LIBEDIT
  if (interactive) {
    char* s = readline("> ");
    if (s == nullptr) return g_interrupted ? Read::INTERRUPTED : Read::END;
    line = s;
    std::free(s);
    if (!line.empty()) add_history(line.c_str());
    return Read::LINE;
  }
#endif
  if (interactive) {
    fmt::print("> ");
    std::fflush(stdout);
  }
  if (std::getline(std::cin, line)) return Read::LINE;
  if (g_interrupted && interactive) {
    std::cin.clear();
    return Read::INTERRUPTED;
  }
  return Read::END;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

int run(ChatFlags& f) {
  finish_gen_flags(f.g);
  Model model = Model::load(f.g.model);
  const Tokenizer& tok = model.tokenizer();
  const ChatTemplate tmpl = chat_template_for(tok, f.g.chat_template);
  Session session(model, f.g.session);
  announce_adapters(session);
  const int64_t n_ctx = session.n_ctx();
  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive) catch_sigint();
#ifdef TESSERA_HAVE_LIBEDIT
  if (interactive) using_history();
#endif
  std::vector<ChatMessage> messages;
  const auto start_over = [&] {
    messages.clear();
    if (!f.g.system.empty()) messages.push_back({"system", f.g.system});
    session.reset();
  };
  start_over();
  const auto encode = [&](const std::vector<ChatMessage>& m, bool generation_prompt) {
    return tok.encode(render_chat(tmpl, m, generation_prompt), /*add_special=*/true, /*parse_special=*/true);
  };
  // Tokens a context shift never discards: the system prompt (and BOS).
  const auto keep_count = [&](const std::vector<int32_t>& ids) {
    if (messages.empty() || messages[0].role != "system") return std::min<size_t>(1, ids.size());
    return common_prefix(encode({messages[0]}, false), ids);
  };
  // Room left for a reply when the conversation is trimmed to fit.
  const int64_t reserve = f.g.gen.max_tokens < 0 ? n_ctx / 4 : std::min<int64_t>(f.g.gen.max_tokens, n_ctx / 2);
  // llama.cpp's shift: drop half of what follows the kept prefix.
  const auto shift = [&](std::vector<int32_t>& ids) {
    const size_t keep = keep_count(ids);
    const size_t discard = (ids.size() - keep) / 2;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(keep),
              ids.begin() + static_cast<std::ptrdiff_t>(keep + std::max<size_t>(discard, 1)));
  };

  if (interactive)
    fmt::print(stderr,
               "tessera chat with {} ({} template, context {}). /reset starts over, /quit or Ctrl-D leaves, Ctrl-C "
               "stops a reply.\n",
               model.spec().name.empty() ? model.path() : model.spec().name, tmpl.name, count_noun(n_ctx, "token"));
  bool refused = false;
  std::string line;
  for (;;) {
    const Read rd = read_line(interactive, line);
    if (rd == Read::END) break;
    if (rd == Read::INTERRUPTED) {
      fmt::print("\n");
      std::fflush(stdout);
      continue;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      start_over();
      if (interactive) fmt::print(stderr, "(conversation reset)\n");
      continue;
    }
    messages.push_back({"user", line});
    std::vector<int32_t> ids = encode(messages, true);
    if (ids.empty()) throw Error("the chat template rendered an empty conversation");
    const auto fits = [&](const std::vector<int32_t>& v) { return static_cast<int64_t>(v.size()) + reserve <= n_ctx; };
    if (!fits(ids)) {
      int dropped = 0;
      if (f.context_shift) {
        while (!fits(ids) && ids.size() > keep_count(ids) + 1) shift(ids);
      } else {
        const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
        while (!fits(ids) && messages.size() > first + 1) {
          // The oldest turn: a user message and the assistant reply after it.
          const size_t n = messages.size() > first + 2 && messages[first + 1].role == "assistant" ? 2 : 1;
          messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(first),
                         messages.begin() + static_cast<std::ptrdiff_t>(first + n));
          ++dropped;
          ids = encode(messages, true);
        }
      }
      if (static_cast<int64_t>(ids.size()) >= n_ctx) {
        messages.pop_back();
        fmt::print(stderr, "tessera: this message ({}) does not fit the context of {} (raise it with -c)\n",
                   count_noun(static_cast<int64_t>(ids.size()), "token"), n_ctx);
        refused = true;
        continue;
      }
      if (dropped > 0)
        fmt::print(stderr, "(the context is full: dropped the {})\n",
                   dropped == 1 ? std::string("oldest turn") : fmt::format("{} oldest turns", dropped));
    }
    size_t keep = std::min(common_prefix(session.tokens(), ids), ids.size() - 1);  // >= 1 token for fresh logits
    session.truncate(static_cast<int64_t>(keep));
    g_interrupted = 0;
    const TextCallback stream = [](std::string_view piece) {
      if (g_interrupted != 0) return false;  // Ctrl-C: not even the piece that was on its way
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    };
    GenerateOptions gen = f.g.gen;
    GenerateResult r = session.generate_tokens(std::span<const int32_t>(ids).subspan(keep), gen, stream);
    std::string reply = r.text;
    Timings timings = r.timings;
    // --context-shift: a reply that fills the context goes on after the shift.
    while (f.context_shift && r.stop_reason == StopReason::CONTEXT_FULL) {
      if (gen.max_tokens >= 0) gen.max_tokens -= static_cast<int64_t>(r.tokens.size());
      if (gen.max_tokens == 0) break;
      std::vector<int32_t> ctx = session.tokens();
      // The token that found the context full was streamed but not evaluated: it belongs to the reply.
      if (!r.tokens.empty()) ctx.push_back(r.tokens.back());
      if (ctx.size() <= keep_count(ctx) + 1) break;
      shift(ctx);
      session.reset();
      r = session.generate_tokens(ctx, gen, stream);
      reply += r.text;
      timings.generated_tokens += r.timings.generated_tokens;
    }
    fmt::print("\n");
    std::fflush(stdout);
    messages.push_back({"assistant", reply});
    if (r.stop_reason == StopReason::CALLBACK && g_interrupted && interactive) fmt::print(stderr, "(stopped)\n");
    if (r.stop_reason == StopReason::CONTEXT_FULL && !f.context_shift)
      fmt::print(stderr, "(the reply filled the context of {}; the oldest turns are dropped at the next message)\n",
                 count_noun(n_ctx, "token"));
    if (f.verbose) fmt::print(stderr, "{}\n", stats_line(timings));
  }
  if (interactive) fmt::print("\n");
  return refused && !interactive ? 1 : 0;
}

const int registered = register_command(
    {"chat", "Chat with the model (interactive, or messages from a pipe)", [](CLI::App& app) -> Runner {
       auto f = std::make_shared<ChatFlags>();
       add_gen_flags(app, f->g);
       app.add_flag("-v,--verbose", f->verbose, "Print a stats line on stderr after each reply");
       app.add_flag("--context-shift", f->context_shift,
                    "When the context is full, discard the oldest half of the tokens after the system prompt (also "
                    "in the middle of a reply, which goes on), as llama.cpp does; the default drops the oldest turns");
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
