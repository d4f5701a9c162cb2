// Errors: every failure the user can cause is a tessera::Error (include/tessera/error.h) carrying one sentence.
#pragma once

#include <fmt/core.h>

#include <string>
#include <utility>

#include "tessera/error.h"

namespace tessera {

// Throws tessera::Error with a fmt-formatted message. Messages are one sentence, lower-case start, no final period,
// naming the object (file, tensor, key) and the problem, e.g. "model.gguf: tensor 'x' extends past the end of the file".
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tessera

// Checks a condition that bad input can violate (never an assert: it stays in release builds).
#define TESSERA_CHECK(cond, ...)        \
  do {                                  \
    if (!(cond)) ::tessera::fail(__VA_ARGS__); \
  } while (0)
