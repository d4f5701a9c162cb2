// Device-side helpers of the CUDA benchmark: random fills (timing on zeros can run faster than real data) and a
// read-only bandwidth probe (the GEMVs only read, so pure reads are their natural ceiling next to the copy).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace tessera::cuda::bench {

enum class FillKind { F32, F16, BF16, BYTES };

// Fills `count` elements (bytes for BYTES) with hash-random values in [lo, hi) (ignored for BYTES).
void fill_random(FillKind kind, void* p, size_t count, float lo, float hi, uint64_t seed, cudaStream_t stream);

// Reads `bytes` (a multiple of 16) with 16-byte loads and writes one word per block to `sink` ([blocks] words) so the
// reads cannot be optimized away. Returns the number of blocks launched (sink must hold that many).
int read_all(const void* p, size_t bytes, uint32_t* sink, int blocks, cudaStream_t stream);

// Captures launch(0) .. launch(batch - 1) into one CUDA graph on `stream`, replays it `warmups` times, then times
// `reps` replays with the events e0/e1. Per-launch µs of the replays: median, min, max.
struct GraphTiming {
  double us = 0, min_us = 0, max_us = 0;
};
GraphTiming time_graph_replays(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, int batch, int reps, int warmups,
                               const std::function<void(int)>& launch);

}  // namespace tessera::cuda::bench
