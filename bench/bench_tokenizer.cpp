// Tokenizer speed: encoding English prose on one core with the default model's tokenizer (SmolLM2, byte-level BPE).
// The text is $TESSERA_BENCH_TEXT when set, else the license texts in /usr/share/common-licenses (real English
// prose, about 240 KB). bench/compare_tokenizer.sh runs this and llama.cpp's tokenizer on the same file side by side.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessera/model_info.h"
#include "tessera/tokenizer.h"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::string& prose() {
  static const std::string text = [] {
    if (const char* p = std::getenv("TESSERA_BENCH_TEXT")) return read_all(p);
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/usr/share/common-licenses", ec)) {
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    std::string all;
    for (const auto& f : files) all += read_all(f.string());
    return all;
  }();
  return text;
}

const tessera::Tokenizer* default_tokenizer() {
  static const tessera::Tokenizer* tok = []() -> const tessera::Tokenizer* {
    try {
      return new tessera::Tokenizer(tessera::Tokenizer::from_model(tessera::resolve_model_path("")));
    } catch (const std::exception&) {
      return nullptr;
    }
  }();
  return tok;
}

void BM_TokenizerEncodeProse(benchmark::State& state) {
  const tessera::Tokenizer* tok = default_tokenizer();
  const std::string& text = prose();
  if (tok == nullptr || text.empty()) {
    state.SkipWithError("needs the default model (scripts/fetch_model.sh) and a prose text");
    return;
  }
  size_t n_tokens = 0;
  for (auto _ : state) {
    const auto ids = tok->encode(text, false, false);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["text_bytes"] = static_cast<double>(text.size());
}
BENCHMARK(BM_TokenizerEncodeProse)->Unit(benchmark::kMillisecond)->MinTime(1.0);

void BM_TokenizerDecodeProse(benchmark::State& state) {
  const tessera::Tokenizer* tok = default_tokenizer();
  const std::string& text = prose();
  if (tok == nullptr || text.empty()) {
    state.SkipWithError("needs the default model (scripts/fetch_model.sh) and a prose text");
    return;
  }
  const auto ids = tok->encode(text, false, false);
  for (auto _ : state) {
    const std::string back = tok->decode(ids);
    benchmark::DoNotOptimize(back.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_TokenizerDecodeProse)->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace
