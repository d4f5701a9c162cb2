#include "test_util.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace tessera::test {

std::string default_model_or_skip_reason(std::string* reason) {
  const char* home = std::getenv("TESSERA_HOME");
  std::string dir = home ? home : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/tessera/models";
  std::string p = dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (std::filesystem::exists(p)) return p;
  *reason = "default model missing at " + p + " (run scripts/fetch_model.sh)";
  return "";
}

std::string data_path(const std::string& rel) { return std::string(TESSERA_TEST_DATA) + "/" + rel; }

std::string cli_path() { return TESSERA_CLI; }

int run_command(const std::string& cmd, std::string* out) {
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf{};
  out->clear();
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out->append(buf.data(), n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace tessera::test
