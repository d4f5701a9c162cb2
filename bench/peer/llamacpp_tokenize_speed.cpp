// Peer side of bench/compare_tokenizer.sh: times llama.cpp's llama_tokenize (public llama.h API) on a text file
// with a vocabulary-only model load, one thread, as the tessera benchmark does. Times are thread CPU seconds, as
// Google Benchmark's rates are, so that a busy shared machine does not skew the comparison. Compiled by the script against the
// cached llama.cpp build (scripts/build_llamacpp.sh); never by CMake or CI.
// Usage: llamacpp_tokenize_speed MODEL TEXT_FILE REPEATS    prints: bytes tokens best_seconds median_seconds
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL TEXT_FILE REPEATS\n", argv[0]);
    return 1;
  }
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) {
    std::fprintf(stderr, "cannot load %s\n", argv[1]);
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::ifstream f(argv[2], std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::vector<llama_token> ids(text.size() + 16);
  const int repeats = std::max(1, std::atoi(argv[3]));
  std::vector<double> secs;
  int n = 0;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run warms caches and is not counted
    const double t0 = cpu_seconds();
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(), static_cast<int32_t>(ids.size()),
                       /*add_special=*/false, /*parse_special=*/false);
    const double t1 = cpu_seconds();
    if (r > 0) secs.push_back(t1 - t0);
  }
  std::sort(secs.begin(), secs.end());
  std::printf("%zu %d %.6f %.6f\n", text.size(), n, secs.front(), secs[secs.size() / 2]);
  llama_model_free(model);
  return 0;
}
