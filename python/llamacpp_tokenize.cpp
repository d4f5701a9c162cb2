// Peer-side helper for python/make_tokenizer_golden.py: tokenizes many strings with llama.cpp in one process (what
// `llama-tokenize -m MODEL -f FILE --ids --no-escape` does for one string: llama_tokenize with add_special on, as the
// model asks, and parse_special on unless --no-parse-special), so a 262k-token vocabulary is loaded once instead of
// once per string. Compiled by make_tokenizer_golden.py against the cached llama.cpp build; never by CI.
//
// Usage: llamacpp_tokenize MODEL IN_FILE OUT_FILE
//   IN_FILE (little-endian): per string, uint32 byte length, uint8 parse_special, then the UTF-8 bytes.
//   OUT_FILE: one line per string, its ids separated by spaces.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llamacpp_tokenize: %s\n", msg.c_str());
  std::exit(1);
}

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) die("usage: llamacpp_tokenize MODEL IN_FILE OUT_FILE");
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) die(std::string("cannot load ") + argv[1]);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::ifstream in(argv[2], std::ios::binary);
  std::ofstream out(argv[3]);
  if (!in || !out) die("cannot open the input or output file");
  std::vector<llama_token> ids;
  for (;;) {
    uint32_t len = 0;
    uint8_t special = 0;
    if (!in.read(reinterpret_cast<char*>(&len), 4)) break;
    in.read(reinterpret_cast<char*>(&special), 1);
    std::string text(len, '\0');
    in.read(text.data(), len);
    ids.resize(text.size() + 8);
    int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                           static_cast<int32_t>(ids.size()), true, special != 0);
    if (n < 0) {
      ids.resize(static_cast<size_t>(-n));
      n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                         static_cast<int32_t>(ids.size()), true, special != 0);
    }
    if (n < 0) die("llama_tokenize failed");
    for (int i = 0; i < n; ++i) out << (i ? " " : "") << ids[static_cast<size_t>(i)];
    out << '\n';
  }
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
