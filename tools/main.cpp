// tessera: the command-line front end. Every subcommand lives in its own cmd_<name>.cpp (see command.h).
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <exception>

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
                 "(default: SmolLM2-135M-Instruct Q4_1 in $TESSERA_HOME, fetched by scripts/fetch_model.sh)");
}

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
