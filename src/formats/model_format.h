// Which reader a model path needs, decided once for every command from the file's first bytes (not its name), so
// that `run`, `inspect` and `tokenize` give the same answer for the same file.
#pragma once

#include <string>

namespace tessera {

enum class ModelFormat { GGUF, SAFETENSORS };

// GGUF: a file starting with the magic "GGUF". SAFETENSORS: a directory (a Hugging Face model), a file whose first 8
// bytes are a little-endian header length followed by '{' (a .safetensors file), or a .json file (a sharded model's
// index). Anything else fails with "<path>: not a GGUF or safetensors model (...)"; a missing path with "no such file
// or directory".
ModelFormat detect_model_format(const std::string& path);

}  // namespace tessera
