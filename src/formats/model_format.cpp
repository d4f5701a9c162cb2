#include "formats/model_format.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace tessera {

ModelFormat detect_model_format(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  TESSERA_CHECK(fs::exists(st), "{}: no such file or directory", path);
  if (fs::is_directory(st)) return ModelFormat::SAFETENSORS;
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "{}: cannot open the file", path);
  unsigned char head[9] = {};
  f.read(reinterpret_cast<char*>(head), sizeof head);
  const auto got = static_cast<size_t>(f.gcount());
  const uint64_t size = fs::is_regular_file(st) ? fs::file_size(path, ec) : 0;
  if (got >= 4 && std::memcmp(head, "GGUF", 4) == 0) return ModelFormat::GGUF;
  if (got == 9 && head[8] == '{') {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | head[i];
    if (n >= 2 && n <= size - 8) return ModelFormat::SAFETENSORS;
  }
  const std::string name = fs::path(path).filename().string();
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) return ModelFormat::SAFETENSORS;
  fail("{}: not a GGUF or safetensors model ({})", path,
       got == 0 ? "the file is empty" : "it starts with neither the GGUF magic nor a safetensors header");
}

}  // namespace tessera
