// A tensor as a model file holds it: name, dtype, shape and where its bytes are (inside the mapped file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera {

// Shapes are row-major, outermost dimension first (torch order): a linear weight W is {N, K} (y = x · Wᵀ).
// GGUF stores ne[] innermost first, so its readers reverse ne into this order.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;            // byte offset of the data inside its file
  uint64_t nbytes = 0;            // exact byte size of the data
  const uint8_t* data = nullptr;  // points into the mapped file; valid while the file object lives

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

}  // namespace tessera
