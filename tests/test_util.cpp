#include "test_util.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

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

int run_cli_stdout(const std::string& args, std::string* out) {
  return run_command("{ " + cli_path() + " " + args + " 2>/dev/null; }", out);
}

Npy read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  Npy n;
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY\x01\x00", 8) != 0) return n;
  const size_t hlen = static_cast<unsigned char>(b[8]) | (static_cast<size_t>(static_cast<unsigned char>(b[9])) << 8);
  if (b.size() < 10 + hlen) return n;
  n.header.assign(b.data() + 10, hlen);
  long rows = 0, cols = 0;
  if (std::sscanf(n.header.c_str(), "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld, %ld), }", &rows, &cols) !=
      2)
    return n;
  n.rows = rows, n.cols = cols;
  const size_t count = static_cast<size_t>(rows * cols);
  if (b.size() != 10 + hlen + count * 4) return n;
  n.data.resize(count);
  std::memcpy(n.data.data(), b.data() + 10 + hlen, count * 4);
  return n;
}

}  // namespace tessera::test
