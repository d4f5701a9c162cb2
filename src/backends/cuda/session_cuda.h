// The CUDA backend behind the backend interface (backends/backend.h): the decoder for slot 0's one-token steps (CUDA
// graph replay, device argmax, chained greedy steps, device sampling), a prefill executor for chunks, batch executors
// for batched decode, all over one CudaShared (stream, caches) per session and one DeviceWeights per model.
#pragma once

#include "backends/backend.h"

namespace tessera::cuda {

const backend::Backend& cuda_backend();

}  // namespace tessera::cuda
