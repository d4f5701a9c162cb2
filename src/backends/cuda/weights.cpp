// Weight upload: GGUF row layout on the host -> the layouts the CUDA kernels read (kernels.h, GemvLayout).
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cuda/kernels.h"
#include "core/error.h"
#include "quant/blocks.h"

namespace tessera::cuda {
namespace {

// Splits GGUF blocks [n, k/32] into quants and scales. Block type B has its fp16 scale (and q4_1's min) first.
template <typename B>
void split_blocks(const void* host, int64_t n, int64_t k, size_t quant_bytes, size_t scale_bytes,
                  std::vector<uint8_t>& quants, std::vector<uint8_t>& scales) {
  const int64_t nb = k / kQK;
  const auto* blocks = static_cast<const B*>(host);
  quants.resize(static_cast<size_t>(n * nb) * quant_bytes);
  scales.resize(static_cast<size_t>(n * nb) * scale_bytes);
  for (int64_t i = 0; i < n * nb; ++i) {
    const B& b = blocks[i];
    std::memcpy(&scales[static_cast<size_t>(i) * scale_bytes], &b, scale_bytes);  // d (and m): the block's head
    std::memcpy(&quants[static_cast<size_t>(i) * quant_bytes], b.qs, quant_bytes);
  }
}

}  // namespace

DeviceWeight upload_weight(DType dtype, const void* host, int64_t n, int64_t k) {
  TESSERA_CHECK(gemv_supports(dtype),
                "cannot upload a {} weight to the GPU: the CUDA kernels support f32, f16, bf16, "
                "q8_0, q4_0 and q4_1",
                dtype_name(dtype));
  TESSERA_CHECK(host != nullptr, "cannot upload a weight from a null host pointer");
  TESSERA_CHECK(n > 0 && k > 0 && n <= std::numeric_limits<int32_t>::max() && k <= std::numeric_limits<int32_t>::max(),
                "cannot upload a weight of shape [{}, {}] to the GPU: both sizes must be in 1..2^31-1", n, k);
  const bool quant = dtype == DType::Q8_0 || dtype == DType::Q4_0 || dtype == DType::Q4_1;
  if (quant) {
    TESSERA_CHECK(k % kQK == 0, "cannot upload a {} weight with k = {} to the GPU: k must be a multiple of 32",
                  dtype_name(dtype), k);
  } else {
    TESSERA_CHECK(k % 8 == 0,
                  "cannot upload a {} weight with k = {} to the GPU: k must be a multiple of 8 "
                  "(rows are read as 16-byte vectors)",
                  dtype_name(dtype), k);
  }
  DeviceWeight w;
  w.dtype = dtype;
  w.n = n;
  w.k = k;
  if (!quant) {
    const uint64_t bytes = static_cast<uint64_t>(n) * static_cast<uint64_t>(k) * (dtype == DType::F32 ? 4 : 2);
    w.layout = GemvLayout::ROWS;
    w.quants = DeviceBuffer(bytes);
    w.quants.upload(host, bytes);
    return w;
  }
  std::vector<uint8_t> quants, scales;
  switch (dtype) {
    case DType::Q8_0:
      split_blocks<BlockQ8_0>(host, n, k, kQK, 2, quants, scales);
      break;
    case DType::Q4_0:
      split_blocks<BlockQ4_0>(host, n, k, kQK / 2, 2, quants, scales);
      break;
    default:
      split_blocks<BlockQ4_1>(host, n, k, kQK / 2, 4, quants, scales);
      break;
  }
  w.layout = GemvLayout::SPLIT_Q;
  w.quants = DeviceBuffer(quants.size());
  w.quants.upload(quants.data(), quants.size());
  w.scales = DeviceBuffer(scales.size());
  w.scales.upload(scales.data(), scales.size());
  return w;
}

}  // namespace tessera::cuda
