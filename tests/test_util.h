// Helpers shared by the test binaries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::test {

// Path of the default model when present, else "" (tests that need it call GTEST_SKIP only outside CI: under
// CI=true a missing model is a failure, since `make test` fetches it first).
std::string default_model_or_skip_reason(std::string* reason);
// tests/data/<rel>
std::string data_path(const std::string& rel);
// Runs a shell command, returns its exit status; stdout+stderr captured into *out.
int run_command(const std::string& cmd, std::string* out);
// The built `tessera` executable.
std::string cli_path();
// Runs `tessera ARGS`; returns its exit status with its stdout only in *out (stderr dropped).
int run_cli_stdout(const std::string& args, std::string* out);

// A float32 [rows, cols] .npy as `tessera logits` writes it. read_npy parses what numpy needs (magic, version 1.0,
// header length, the dict, the data's size); data stays empty when the file is not one.
struct Npy {
  std::string header;
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
};
Npy read_npy(const std::string& path);

}  // namespace tessera::test

// Skips (locally) or fails (CI) when the default model is missing; binds `var` to its path.
#define TESSERA_REQUIRE_DEFAULT_MODEL(var)                                   \
  std::string var;                                                           \
  do {                                                                       \
    std::string why_;                                                        \
    var = ::tessera::test::default_model_or_skip_reason(&why_);              \
    if (var.empty()) {                                                       \
      if (std::getenv("CI") != nullptr) FAIL() << why_;                      \
      GTEST_SKIP() << why_;                                                  \
    }                                                                        \
  } while (0)
