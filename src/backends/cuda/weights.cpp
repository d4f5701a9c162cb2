// Weight upload: GGUF row layout on the host -> the layouts the CUDA kernels read (kernels.h, GemvLayout), and the
// CUDA weight-format table: formats without a kernel are converted on the host to bf16 first.
#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

#include "backends/cuda/kernels.h"
#include "backends/cuda/split_layout.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/format_support.h"
#include "quant/format_traits.h"
#include "quant/quant.h"

namespace tessera::cuda {
namespace {

// Splits GGUF blocks [n, k / block size] into quants, scales and tail as SplitLayout<D> says (split_layout.h).
template <DType D>
void split_blocks(const void* host, int64_t n, int64_t k, std::vector<uint8_t>& quants, std::vector<uint8_t>& scales) {
  using L = SplitLayout<D>;
  const size_t nb = static_cast<size_t>(n) * static_cast<size_t>(k / Format<D>::kBlockSize);
  const auto* blocks = static_cast<const typename Format<D>::Block*>(host);
  quants.resize(nb * L::kQuantBytes);
  scales.resize(nb * (L::kScaleBytes + L::kTailBytes));
  uint8_t* tail = scales.data() + nb * L::kScaleBytes;
  for (size_t i = 0; i < nb; ++i) {
    typename Format<D>::Block b;
    std::memcpy(&b, blocks + i, sizeof(b));  // the file's blocks may sit at any address (GGUF aligns tensors only)
    split_block<D>(b, &quants[i * L::kQuantBytes], &scales[i * L::kScaleBytes], tail + i * L::kTailBytes);
  }
}

}  // namespace

const FormatSupport& weight_formats() {
  // One GEMV, multi-row GEMV, dequantize-to-bf16 (cuBLASLt path) and embedding instantiation per format below (tq1_0
  // runs as tq2_0: upload_weight rewrites it, exactly, tq1_0_as_tq2_0)
  // (kernels/gemv*.cu, gemm_rows.cu, gemm_convert.cu, embedding_argmax.cu). bf16 is the fallback: K-quant values
  // (a 6-bit code times an 8-bit scale times an fp16 super-scale) keep 8 significant bits in bf16 at most a rounding
  // away, with f32's range (f16 could overflow on a large super-scale), and bf16 takes cuBLASLt's fastest path.
  static const FormatSupport table("cuda",
                                   {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                    DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::Q5_0,
                                    DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::TQ2_0, DType::TQ1_0},
                                   DType::BF16);
  return table;
}

bool gemv_supports(DType dtype) { return weight_formats().is_native(dtype); }

std::vector<uint8_t> tq1_0_as_tq2_0(const void* host, int64_t n, int64_t k) {
  TESSERA_CHECK(host != nullptr && n > 0 && k > 0 && k % kQKK == 0,
                "cannot rewrite a tq1_0 weight of shape [{}, {}] as tq2_0: rows must be whole blocks of {}", n, k,
                kQKK);
  const size_t nb = static_cast<size_t>(n) * static_cast<size_t>(k / kQKK);
  const auto* blocks = static_cast<const BlockTQ1_0*>(host);
  std::vector<uint8_t> out(nb * sizeof(BlockTQ2_0));
  for (size_t i = 0; i < nb; ++i) {
    BlockTQ1_0 b;
    std::memcpy(&b, blocks + i, sizeof(b));  // the file's blocks may sit at any address
    BlockTQ2_0 o;
    std::memset(&o, 0, sizeof(o));
    for (int e = 0; e < kQKK; ++e)  // tq2_0's code of element e: byte 32 (e / 128) + e % 32, bits 2 ((e % 128) / 32)
      o.qs[32 * (e / 128) + e % 32] |=
          static_cast<uint8_t>(format_detail::tq1_trit(b.qs, b.qh, e) << (2 * ((e % 128) / 32)));
    o.d = b.d;
    std::memcpy(out.data() + i * sizeof(o), &o, sizeof(o));
  }
  return out;
}
bool gemv_quantized(DType dtype) { return weight_formats().is_native_quantized(dtype); }

DType device_weight_dtype(DType dtype) {
  const std::optional<DType> as = weight_formats().runs_as(dtype);
  TESSERA_CHECK(as.has_value(), "a {} weight cannot be read on the GPU: {}", dtype_name(dtype),
                weight_formats().summary());
  return *as;
}

std::vector<uint8_t> convert_for_device(DType dtype, const void* host, int64_t n, int64_t k) {
  const DType to = device_weight_dtype(dtype);
  TESSERA_CHECK(to != dtype, "a {} weight needs no conversion for the GPU", dtype_name(dtype));
  TESSERA_CHECK(host != nullptr && n > 0 && k > 0, "cannot convert a weight of shape [{}, {}] from a null pointer", n,
                k);
  const std::optional<uint64_t> in_row = dtype_row_bytes(dtype, static_cast<uint64_t>(k));
  const std::optional<uint64_t> out_row = dtype_row_bytes(to, static_cast<uint64_t>(k));
  TESSERA_CHECK(in_row && out_row, "a {} weight with rows of {} elements is not a whole number of blocks",
                dtype_name(dtype), k);
  std::vector<uint8_t> out(*out_row * static_cast<uint64_t>(n));
  // Row ranges on up to 16 threads: a Llama-3-8B q6_K file is ~7e9 values, ~10 s on one core.
  const int64_t threads = std::clamp<int64_t>(std::min<int64_t>(n / 64, std::thread::hardware_concurrency()), 1, 16);
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const int64_t r0 = n * t / threads, r1 = n * (t + 1) / threads;
      try {
        convert_rows(dtype, static_cast<const uint8_t*>(host) + static_cast<uint64_t>(r0) * *in_row, to,
                     out.data() + static_cast<uint64_t>(r0) * *out_row, r1 - r0, k);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  }
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

DeviceWeight upload_weight(DType dtype, const void* host, int64_t n, int64_t k) {
  TESSERA_CHECK(gemv_supports(dtype), "cannot upload a {} weight to the GPU as it is: {}", dtype_name(dtype),
                weight_formats().summary());
  TESSERA_CHECK(host != nullptr, "cannot upload a weight from a null host pointer");
  TESSERA_CHECK(n > 0 && k > 0 && n <= std::numeric_limits<int32_t>::max() && k <= std::numeric_limits<int32_t>::max(),
                "cannot upload a weight of shape [{}, {}] to the GPU: both sizes must be in 1..2^31-1", n, k);
  const bool quant = gemv_quantized(dtype);
  if (quant) {
    const int64_t block = static_cast<int64_t>(dtype_info(dtype).block_size);
    TESSERA_CHECK(k % block == 0, "cannot upload a {} weight with k = {} to the GPU: k must be a multiple of {}",
                  dtype_name(dtype), k, block);
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
  if (dtype == DType::TQ1_0) {  // the kernels read tq2_0's layout (exact: tq1_as_tq2)
    split_blocks<DType::TQ2_0>(tq1_0_as_tq2_0(host, n, k).data(), n, k, quants, scales);
    w.dtype = DType::TQ2_0;
  } else if (!with_split_layout(dtype,
                                [&](auto tag) { split_blocks<decltype(tag)::value>(host, n, k, quants, scales); })) {
    fail("cannot upload a {} weight: it has no split layout for the GPU", dtype_name(dtype));
  }
  w.layout = GemvLayout::SPLIT_Q;
  w.quants = DeviceBuffer(quants.size());
  w.quants.upload(quants.data(), quants.size());
  w.scales = DeviceBuffer(scales.size());
  w.scales.upload(scales.data(), scales.size());
  return w;
}

}  // namespace tessera::cuda
