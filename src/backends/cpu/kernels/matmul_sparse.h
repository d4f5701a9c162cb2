// Sparse GEMV for TEAL activation sparsity (graph::Op::MATMUL_SPARSE): y = x · Wᵀ where most of x is zero, reading
// only the weights of x's nonzero channels.
//
// Layout (measured choice, docs/TEAL.md): channel-major tiles of 32 output rows. The file's row-major [N, K] layout
// puts one channel's weights N row-strides apart, and its quantized blocks run along K, so a zero channel can only be
// skipped where all 32 channels of a block are zero: at 50% element sparsity that is 0.5^32 for independent zeros and
// 0.004% of the blocks of SmolLM2's sparsified activations (14 of 391,680 over 128 decode steps; 0.26% at 65%), so
// block skipping gains nothing. Here each tile holds, for 32 output rows, every channel's 32 weights contiguous, so a
// zero channel skips its 32 (or 16, 4-bit) bytes and a chunk of rows reads one stream:
//   float formats: tile (r) = [K channels][32 rows] in the weight's own dtype (f32, f16 or bf16);
//   q8_0 / q4_0 / q4_1: tile (r, b) per 32-row chunk r and 32-channel block b: the 32 rows' scales (and q4_1's mins)
//     of block b as fp16, then per channel of the block its 32 rows' quants: q8_0 32 bytes w + 128 (w ^ 0x80: unsigned
//     for vpdpbusd), q4 16 bytes (byte j: row j in the low nibble, row j + 16 in the high one). The values are the
//     file's (q8_0's up to that offset): the quantization blocks still run along K, and the kernel applies each (row,
//     block) scale to the block's integer sum as the dense kernel does, so the result equals the dense kernel's on the
//     same (thresholded, 8-bit quantized) x up to float summation order.
// The AVX2 / AVX-512 kernels take the nonzero channels of a block four at a time, transpose their 32 rows into
// 4-byte (row, 4 channels) lanes and use the dense kernels' vpmaddubsw / vpdpbusd dot products against the 4 matching
// activation bytes. CPUs without AVX2 run the dense kernels (the pass's MATMUL_SPARSE then gains nothing there).
// Tried and measured worse end to end (docs/TEAL.md): 64-row tiles with 512-bit vpdpbusd and q4 quants a byte each
// (faster with the weights in cache, but the doubled bytes lost in a real decode step); nibble pairs (c, c + 16) in
// 64-row tiles (a shift and mask per channel: slower than the dense kernel even in cache); one channel a 64-byte line
// (q4 128-row, q8_0 64-row tiles, so a zero channel skips a whole line: 60% of q4_1's bytes read at 50%), 0.81x of
// this layout end to end, because reading a random half of the lines is slower than streaming all of them on the
// machine measured (the stream prefetchers set the pace; software prefetch did not help).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

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

// Whether the active ISA has sparse kernels for this weight format (f32, f16, bf16, q8_0, q4_0, q4_1 on AVX2+; and
// q4_K, whose copy is q4_1's: every 32-element sub-block of it is w = D q + M with a 4-bit q).
bool sparse_matmul_supports(DType dtype);
// Builds the channel-major copy of W [n, k] (file layout). Error for a format sparse_matmul_supports rejects. A q4_K
// weight comes back as a q4_1 one (its dtype says Q4_1).
SparseWeight prepare_sparse_weight(DType dtype, const void* rows, int64_t n, int64_t k);
// y[t, n] = x[t, k] · Wᵀ, each row as its own sparse GEMV. Quantized formats quantize x to 8 bits per block of 32 as
// matmul() does (a zero stays zero). x and y must not overlap.
void matmul_sparse(ThreadPool& pool, const SparseWeight& w, const float* x /*[t, k]*/, float* y /*[t, n]*/, int64_t t);

// Achieved sparsity: zeros and elements written by every SPARSIFY node of the process since the last reset (its kernel,
// ops/sparsify.cpp, counts them), for bench and profile to report what was measured rather than what was asked.
struct SparsityCounts {
  uint64_t zeros = 0, total = 0;
  uint64_t zero_blocks = 0, blocks = 0;  // 32-element blocks (of rows whose length is a multiple of 32) all zero
};
SparsityCounts sparsity_counts();
void reset_sparsity_counts();
// Calibration (tessera calibrate): while on, every SPARSIFY node adds its input's magnitudes to a histogram per
// (layer, input) (graph::SparseInput), bucket = the top 16 bits of |x|'s float bits. take_ returns them (key
// layer * 4 + input) and clears them.
void record_activation_histograms(bool on);
std::map<int, std::vector<uint64_t>> take_activation_histograms();

namespace detail {

constexpr int kSparseRows = 32;  // output rows per tile

// The order of a quantized tile's 32 scales: the row of scale position p (the transposed dot products' lane order).
constexpr int sparse_lane_row(int p) {
  const int i = p / 8, l = p % 8;
  return l < 4 ? 4 * i + l : 16 + 4 * i + l - 4;
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
  const uint16_t* group_off = nullptr;   // [groups][4] byte offsets of the channels' columns in the tile's quants
  const int32_t* group_x = nullptr;      // [groups] the 4 int8 activations as one int32
  const float* xd = nullptr;             // per nonzero block: activation scale d
  const float* xs = nullptr;             // per nonzero block: d * sum(q)
  const int32_t* xq_sum = nullptr;       // per nonzero block: sum(q) (q8_0's w + 128 correction)
  int64_t n_blocks = 0;
};
using SparseKernel = void (*)(const SparseWeight& w, const SparseX& x, float* y, int64_t c0, int64_t c1);
SparseKernel avx2_sparse_kernel(DType dtype);
SparseKernel avx512_sparse_kernel(DType dtype);

}  // namespace detail
}  // namespace tessera::cpu
