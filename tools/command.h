// Subcommand registry: each tools/cmd_<name>.cpp registers itself with a static initializer, so adding a command
// is adding a file. A command's setup adds its options to its CLI11 sub-app and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tessera::cli {

using Runner = std::function<int()>;
struct Command {
  std::string name;
  std::string help;
  std::function<Runner(CLI::App&)> setup;
};

// Returns a dummy value so it can initialize a namespace-scope constant.
int register_command(Command c);
std::vector<Command>& commands();

// Adds -m/--model with the shared help text; an empty value means the default model.
void add_model_option(CLI::App& app, std::string& model);

}  // namespace tessera::cli
