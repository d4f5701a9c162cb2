// The CPU backend behind the backend interface (backends/backend.h): plans compiled per chunk size, one KV cache per
// sequence slot, batched decode as one row after another (correct, not fast).
#pragma once

#include "backends/backend.h"

namespace tessera::cpu {

const backend::Backend& cpu_backend();

}  // namespace tessera::cpu
