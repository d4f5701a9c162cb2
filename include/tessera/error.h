// Public API: every failure caused by input (files, flags, prompts) is thrown as tessera::Error with one sentence.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace tessera
