// Sparse GEMV for TEAL activation sparsity (graph::Op::MATMUL_SPARSE): y = x · Wᵀ where most of x is zero, reading
// only the weights of x's nonzero channels.
//
// Layout (measured choice, docs/TEAL.md): channel-major tiles of 64 output rows. The file's row-major [N, K] layout
// puts one channel's weights N row-strides apart, and its quantized blocks run along K, so a zero channel can only be
// skipped where all 32 channels of a block are zero: at 50% element sparsity that is almost never (0.5^32 for
// independent zeros; docs/TEAL.md measures SmolLM2's activations), so block skipping gains nothing. Here each tile
// holds, for 64 output rows, every channel's 64 weights contiguous, so a zero channel skips its bytes:
//   float formats: tile (r) = [K channels][64 rows] in the weight's own dtype (f32, f16 or bf16);
//   q8_0 / q4_0 / q4_1: tile (r, b) per 64-row chunk r and 32-channel block b: the 64 rows' scales (and q4_1's mins)
//     of block b as fp16 in the kernels' lane order (sparse_lane_row), then per channel its 64 rows' quants as unsigned
//     bytes (the operand vpdpbusd multiplies): q8_0 w + 128, q4 its 0..15. q4 thus takes a byte a weight, 1.8x the
//     file's q4_1 bytes: packing channel pairs (c, c + 16) into nibbles kept the file's size but the shift and mask per
//     channel made the kernel lose to the dense one at 50% (0.89-0.97x, docs/TEAL.md). The values are the file's: the
//     quantization blocks still run along K and the kernel applies each (row, block) scale to the block's integer
//     sum as the dense kernel does, so the result equals the dense kernel's on the same (thresholded, 8-bit
//     quantized) x up to float summation order.
// The kernels take the nonzero channels of a block four at a time, transpose their rows into 4-byte (row, 4 channels)
// lanes and use the dense kernels' dot products (vpdpbusd on AVX-512 VNNI over 64 rows, vpmaddubsw + vpmaddwd on AVX2
// over two 32-row halves) against the 4 matching activation bytes. CPUs without AVX2 run the dense kernels.
#pragma once

#include <cstdint>
#include <memory>

#include "backends/cpu/kernels.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace tessera::cpu {

struct SparseWeight {
  DType dtype = DType::F32;
  int64_t n = 0, k = 0;
  int64_t chunks = 0;  // ceil(n / 32)
  const void* tiles = nullptr;
  std::shared_ptr<const void> storage;
  uint64_t bytes = 0;
};

// Whether the active ISA has sparse kernels for this weight format (f32, f16, bf16, q8_0, q4_0, q4_1 on AVX2+).
bool sparse_matmul_supports(DType dtype);
// Builds the channel-major copy of W [n, k] (file layout). Error for a format sparse_matmul_supports rejects.
SparseWeight prepare_sparse_weight(DType dtype, const void* rows, int64_t n, int64_t k);
// y[t, n] = x[t, k] · Wᵀ, each row as its own sparse GEMV. Quantized formats quantize x to 8 bits per block of 32 as
// matmul() does (a zero stays zero). x and y must not overlap.
void matmul_sparse(ThreadPool& pool, const SparseWeight& w, const float* x /*[t, k]*/, float* y /*[t, n]*/, int64_t t);

// Achieved sparsity: zeros and elements written by every SPARSIFY node of the process since the last reset (its kernel,
// ops/sparsify.cpp, counts them), for bench and profile to report what was measured rather than what was asked.
struct SparsityCounts {
  uint64_t zeros = 0, total = 0;
};
SparsityCounts sparsity_counts();
void reset_sparsity_counts();

namespace detail {

constexpr int kSparseRows = 64;  // output rows per tile

// The order of a quantized tile's 64 scales: the row of scale position p. The transposed dot products of 4 channels
// come out as four vectors i = 0..3 whose 128-bit lane L holds rows 16 L + 4 i + 0..3 (vpunpck* work within lanes);
// scale p = 16 i + q belongs to vector i, dword q. A 256-bit half h of the AVX2 kernel is dwords 8h..8h+7.
constexpr int sparse_lane_row(int p) {
  const int i = p / 16, q = p % 16;
  return 16 * (q / 4) + 4 * i + q % 4;
}
uint64_t sparse_tile_bytes(DType dtype);  // quantized: bytes of one (chunk, block) tile

// One call's nonzero structure, built once per row and shared by the tasks. Float formats: the nonzero channels and
// their values. Quantized: per block with a nonzero quantized activation, groups of 4 channels (offsets in the block,
// padded with x = 0) and their 4 activation bytes.
struct SparseX {
  // float
  const int32_t* idx = nullptr;
  const float* val = nullptr;
  int64_t nnz = 0;
  // quantized
  const int32_t* blocks = nullptr;       // nonzero blocks
  const int32_t* group_begin = nullptr;  // per nonzero block: its first group (and one past the last block)
  const uint8_t* group_ch = nullptr;     // [groups][4] channel offsets in the block
  const int32_t* group_x = nullptr;      // [groups] the 4 int8 activations as one int32
  const float* xd = nullptr;             // per nonzero block: activation scale d
  const float* xs = nullptr;             // per nonzero block: d * sum(q)
  const int32_t* xsum =
      nullptr;  // per nonzero block: sum(q) (q8_0 tiles store w + 128: the kernels take 128 sum(q) off)
  int64_t n_blocks = 0;
};
using SparseKernel = void (*)(const SparseWeight& w, const SparseX& x, float* y, int64_t c0, int64_t c1);
SparseKernel avx2_sparse_kernel(DType dtype);
SparseKernel avx512_sparse_kernel(DType dtype);

}  // namespace detail
}  // namespace tessera::cpu
