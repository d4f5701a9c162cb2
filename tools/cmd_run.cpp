// tessera run: generate text from a prompt, streamed to stdout; a stats line on stderr; --json for one object.
#include <fmt/core.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "command.h"
#include "gen_options.h"
#include "tessera/chat.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/session.h"

namespace tessera::cli {
namespace {

struct RunFlags {
  GenFlags g;
  std::string prompt;
  std::string prompt_file;
  bool chat = false;
  bool json = false;
  bool no_stats = false;
  CLI::Option* prompt_opt = nullptr;
};

int run(RunFlags& f) {
  finish_gen_flags(f.g);
  if (!f.prompt_file.empty()) {
    if (f.prompt_opt->count() > 0) throw Error("give the prompt with -p or -f, not both");
    f.prompt = read_prompt_file(f.prompt_file);
    if (f.prompt.empty()) throw Error(fmt::format("{}: the prompt file is empty", f.prompt_file));
  }
  if (f.prompt.empty()) throw Error("a prompt is required: -p TEXT, -f FILE or -f - (standard input)");
  if (!f.g.no_escape) f.prompt = process_escapes(f.prompt);
  Model model = Model::load(f.g.model);
  Session session(model, f.g.session);
  announce_adapters(session);
  std::string text = f.prompt;
  if (f.chat) {
    std::vector<ChatMessage> msgs;
    if (!f.g.system.empty()) msgs.push_back({"system", f.g.system});
    msgs.push_back({"user", f.prompt});
    text = render_chat(chat_template_for(model.tokenizer(), f.g.chat_template), msgs, true);
  }
  TextCallback stream;
  // Whether the streamed text ended a line: the stats go to stderr, so stdout must end its line first.
  bool at_line_start = true;
  if (!f.json)
    stream = [&at_line_start](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      if (!piece.empty()) at_line_start = piece.back() == '\n';
      return true;
    };
  const GenerateResult r = session.generate(text, f.g.gen, stream);
  const Timings& t = r.timings;
  if (f.json) {
    nlohmann::json j;
    j["model"] = model.path();
    j["text"] = r.text;
    j["tokens"] = r.tokens;
    j["prompt_tokens"] = t.prompt_tokens;
    j["stop_reason"] = stop_reason_name(r.stop_reason);
    j["seed"] = r.seed;
    j["n_ctx"] = session.n_ctx();
    j["n_threads"] = session.n_threads();
    j["timings"] = {{"prompt_tokens", t.prompt_tokens},
                    {"prompt_ms", t.prompt_ms},
                    {"prompt_tokens_per_s", t.prompt_tokens_per_s()},
                    {"generated_tokens", t.generated_tokens},
                    {"generate_ms", t.generate_ms},
                    {"generated_tokens_per_s", t.generated_tokens_per_s()},
                    {"peak_rss_bytes", t.peak_rss_bytes}};
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else if (!at_line_start) {
    std::fputc('\n', stdout);
  }
  std::fflush(stdout);
  if (r.stop_reason == StopReason::CONTEXT_FULL)
    fmt::print(stderr, "tessera: the context is full ({} tokens); generation stopped (raise it with -c)\n",
               session.n_ctx());
  if (!f.no_stats) fmt::print(stderr, "{}\n", stats_line(t));
  return 0;
}

const int registered = register_command(
    {"run", "Generate text from a prompt", [](CLI::App& app) -> Runner {
       auto f = std::make_shared<RunFlags>();
       add_gen_flags(app, f->g);
       f->prompt_opt =
           app.add_option("-p,--prompt", f->prompt, "Prompt text (escapes such as \\n are processed; --no-escape)");
       app.add_option("-f,--file", f->prompt_file,
                      "Read the prompt from a file (- for standard input); one "
                      "final newline is dropped, as llama.cpp does");
       app.add_flag("--no-stats", f->no_stats, "Do not print the stats line on stderr");
       app.add_flag("--chat", f->chat, "Wrap the prompt in the model's chat template");
       app.add_flag("--json", f->json, "Print one JSON object (text, tokens, timings) instead of streaming");
       return [f] { return run(*f); };
     }});

}  // namespace
}  // namespace tessera::cli
