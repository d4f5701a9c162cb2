// tessera: the command-line front end. Every subcommand lives in its own cmd_<name>.cpp (see command.h).
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string_view>

#include "command.h"
#include "tessera/error.h"

namespace tessera::cli {

std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

int register_command(Command c) {
  commands().push_back(std::move(c));
  return 0;
}

void add_model_option(CLI::App& app, std::string& model) {
  app.add_option("-m,--model", model,
                 "Model: a .gguf file, a .safetensors file or index.json, or a Hugging Face model directory "
                 "(default: SmolLM2-135M-Instruct Q4_1 in $TESSERA_HOME, else $XDG_CACHE_HOME/tessera/models, else "
                 "~/.cache/tessera/models; fetched by scripts/fetch_model.sh)");
}

namespace {

// llama.cpp's multi-letter single-dash flags. CLI11 reads "-ngl 99" as "-n gl" (a short flag with its value glued
// on), so these are rewritten to their long spellings before parsing.
std::vector<std::string> rewrite_llama_flags(int argc, char** argv) {
  static const std::pair<std::string_view, std::string_view> kLong[] = {
      {"-ngl", "--n-gpu-layers"}, {"-np", "--parallel"}, {"-ub", "--ubatch-size"}};
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;
    for (const auto& [from, to] : kLong) {
      if (args[i] == from) {
        args[i] = to;
      } else if (args[i].size() > from.size() && args[i].compare(0, from.size(), from) == 0 &&
                 args[i][from.size()] == '=') {
        args[i] = std::string(to) + args[i].substr(from.size());
      }
    }
  }
  return args;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

int usage_error(const std::string& message, const std::string& usage) {
  std::fflush(stdout);
  fmt::print(stderr, "tessera: error: {}\n{}", message, usage);
  return 1;
}

// "usage: tessera run [OPTIONS]" and where the full list is.
std::string short_usage(const CLI::App* sub) {
  if (sub == nullptr) return "usage: tessera COMMAND [OPTIONS]   (tessera --help lists the commands)\n";
  return fmt::format("usage: tessera {} [OPTIONS]   (tessera {} --help lists the options)\n", sub->get_name(),
                     sub->get_name());
}

}  // namespace
}  // namespace tessera::cli

int main(int argc, char** argv) {
  using namespace tessera::cli;
  CLI::App app{"tessera: fast LLM inference on CPUs and NVIDIA GPUs, built around matrix multiplication"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tessera 0.1.0");
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  Runner chosen;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    Runner r = c.setup(*sub);
    sub->callback([&chosen, r] { chosen = r; });
  }
  if (argc < 2) {  // plain `tessera`: the commands, as git and llama.cpp's tools print them
    fmt::print("{}", app.help());
    return 1;
  }
  const std::string first = argv[1];
  const bool known = std::any_of(cmds.begin(), cmds.end(), [&](const Command& c) { return c.name == first; });
  if (first[0] != '-' && !known) {
    std::string best;
    size_t best_d = 3;  // suggest only a near miss
    for (const Command& c : cmds) {
      const size_t d = edit_distance(first, c.name);
      if (d < best_d) best_d = d, best = c.name;
    }
    std::string names;
    for (const Command& c : cmds) names += (names.empty() ? "" : ", ") + c.name;
    return usage_error(best.empty() ? fmt::format("unknown command '{}' (commands: {})", first, names)
                                    : fmt::format("unknown command '{}'; did you mean '{}'?", first, best),
                       short_usage(nullptr));
  }
  std::vector<std::string> args = rewrite_llama_flags(argc, argv);
  std::vector<char*> ptrs;
  for (std::string& a : args) ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const CLI::App* sub = app.get_subcommands().empty() ? nullptr : app.get_subcommands().front();
    return usage_error(e.what(), short_usage(sub));
  }
  try {
    return chosen ? chosen() : 1;
  } catch (const tessera::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "tessera: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "tessera: internal error: {}\n", e.what());
    return 2;
  }
}
