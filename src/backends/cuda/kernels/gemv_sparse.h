// TEAL's sparse decode on CUDA (issue 23, docs/TEAL.md): SPARSIFY's thresholding builds, on the device, the list of
// an activation row's surviving channels, and the sparse GEMV reads only the weights those channels multiply.
//
// Skipping inside the GEMV's row-major layout would leave each skipped channel's 2 bytes inside the 32-byte sectors
// DRAM delivers, so nothing would be saved: the sparse GEMV reads a second, channel-blocked copy of the weight
// (SparseWeight), in which one channel's weights for a tile of 64 output rows are 128 contiguous bytes (one cache
// line). A block owns one tile and a slice of the surviving-channel list; no atomics on values (split slices are
// summed by the tile's last block in a fixed order, so results do not depend on scheduling).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "backends/cuda/kernels.h"
#include "backends/cuda/memory.h"
#include "core/dtype.h"

namespace tessera::cuda {

// Output rows whose weights for one input channel are contiguous in a SparseWeight: 64 16-bit values (128 bytes, one
// cache line) by default; 128 and 256 (longer contiguous runs, fewer tiles) for the benchmark's comparison.
constexpr int kSparseTile = 64;
bool sparse_tile_supported(int tile);  // 64, 128, 256

// W [n, k] channel-blocked. Float formats (bf16, f16): data[t][c][r] = W[t * tile + r, c] (rows past n are zero).
// Quantized formats (q8_0, q4_0, q4_1; tile 64): per (tile t, block b of 32 channels) a chunk of
// sparse_quant_header(dtype) bytes of the 64 rows' scales (fp16 d per row; q4_1 (d, m) pairs), then the block's 32
// channels, each sparse_quant_run(dtype) bytes: the 64 rows' quants (q8_0 int8; q4 a byte per two rows, the even row
// in the low nibble), the file's values unchanged. A surviving channel costs its run in every tile, and a block with
// any survivor its header once per tile (read through L1 by the block's channels).
struct SparseWeight {
  DType dtype = DType::BF16;
  int64_t n = 0;
  int64_t k = 0;
  int tile = kSparseTile;
  bool columns = false;  // make_sparse_columns' channel-major copy: one tile of all n rows padded to 64 (gemv_sparse_x)
  DeviceBuffer data;     // float: [ceil(n / tile), k, tile]; quantized: [ceil(n / 64), k / 32, chunk]
  int64_t tiles() const { return (n + tile - 1) / tile; }
  // Bytes one surviving channel costs the sparse GEMV (all tiles' runs of that channel; quantized: without headers).
  uint64_t bytes_per_channel() const;
};
int sparse_quant_run(DType dtype);     // q8_0 64, q4_0 / q4_1 32
int sparse_quant_header(DType dtype);  // q8_0 / q4_0 128, q4_1 256

// Weight formats with a sparse GEMV: bf16, f16, q8_0, q4_0, q4_1 (the K-quants: not yet).
bool gemv_sparse_supports(DType dtype);

// The channel-blocked copy of w (bf16/f16 GemvLayout::ROWS, or q8_0/q4_0/q4_1 SPLIT_Q), made on the device on
// `stream` (no host round trip). Quantized formats take tile 64 only. Error for another format.
SparseWeight make_sparse_weight(const DeviceWeight& w, cudaStream_t stream, int tile = kSparseTile);

// One surviving channel of a sparsified row: its index and its value's float bits (one 8-byte load per channel).
using SparseEntry = int2;

// SPARSIFY (graph.h) on the device, one block per row: y[i, :] = x[i, :] with |x| <= threshold zeroed when
// threshold >= 0 (calibrated thresholds), else with the floor(sparsity * k) smallest magnitudes zeroed, ties the
// first ones in index order: the CPU kernel's rule (backends/cpu/ops/sparsify.cpp), found by a four-pass radix
// select on |x|'s bits. y may equal x, or be null. With `list` and `count`, row i's surviving nonzero entries go to
// list[i * k ...] in ascending channel order and their number to count[i]. With `zeros` (two counters, never reset
// here): zeros[0] += entries zeroed or zero, zeros[1] += t * k (achieved sparsity, as the CPU counts it).
// q8_list (needs y, the list and k a multiple of 32): the list's values are the zeroed row's 8-bit activations d * q
// (per block of 32, as the CPU's quantized kernels quantize x), for the quantized sparse GEMV.
void sparsify(const float* x /*[t, k]*/, float* y /*[t, k] or null*/, int64_t t, int64_t k, float sparsity,
              float threshold, SparseEntry* list /*[t, k] or null*/, int32_t* count /*[t] or null*/,
              unsigned long long* zeros /*[2] or null*/, cudaStream_t stream, bool q8_list = false);

// The process's achieved-sparsity counters on the device ([2]: zeros, elements), the `zeros` argument the executors
// pass to sparsify (process-wide, as the CPU's: backends/cpu/ops/sparsify.cpp). Allocated on first use.
unsigned long long* sparsity_counters();
// Their values (waits for the device) and a reset to zero (waits too).
std::pair<uint64_t, uint64_t> read_sparsity_counters();
void reset_sparsity_counters();

// Partial sums and tickets of the split form (the default where one block per tile would leave SMs idle), sized for
// weights of at most max_n rows.
class SparseGemvWorkspace {
 public:
  explicit SparseGemvWorkspace(int64_t max_n);
  // Rows its partials cover (max_n rounded up to the largest tile) and 64-row tiles its tickets cover.
  int64_t max_rows() const { return max_tiles_ * kSparseTile; }
  int64_t max_tiles() const { return max_tiles_; }
  float* partials() const { return partials_.as<float>(); }
  unsigned int* tickets() const { return tickets_.as<unsigned int>(); }
  static constexpr int kMaxSplits = 64;

 private:
  int64_t max_tiles_ = 0;
  DeviceBuffer partials_;  // [kMaxSplits, max_tiles * 64], max_tiles rounded up to a multiple of 4 (256-row tiles)
  DeviceBuffer tickets_;   // [max_tiles] blocks finished per tile; zero between launches (the last block resets it)
};

// The number of list slices (blocks per tile) gemv_sparse uses for w by default: enough blocks for every SM.
int gemv_sparse_default_splits(const SparseWeight& w);

// y[N] = W · x over the surviving channels list[0 .. *count) of x (sparsify's output for one row): y[r] = sum over
// entries e of W[r, e.x] * float(e.y), in a fixed order (the same list gives the same y). accumulate: y += instead.
// splits 0: gemv_sparse_default_splits; else 1..kMaxSplits.
void gemv_sparse(const SparseWeight& w, const SparseEntry* list /*[k]*/, const int32_t* count /*[1]*/, float* y /*[N]*/,
                 bool accumulate, SparseGemvWorkspace& ws, cudaStream_t stream, int splits = 0);

// ---- The channel-major form (gemv_sparse_cols.cu): no list and no SPARSIFY launch ----
// Phase-1 measurements (H100, L2 flushed, 8B shapes at 50%): the list walk over 64-row tiles streamed 1.6 TB/s (the
// dependent list load in front of every weight load, 128-byte runs), and the SPARSIFY launch in front of each GEMV
// (7-15 us, 128 per token) made sparse decode slower than dense. This form reads x itself: each block thresholds its
// slice of x (the calibrated-threshold rule, or threshold 0 on an x SPARSIFY's top-k already zeroed) and walks the
// kept channels, each a 2 KB run of a column stored contiguously.
// Measured (H100, L2 flushed, 2026-11-26, tessera_bench_sparse): the split form at 50%, 4096->14336 33.1 us (tiled
// list walk 36.1, dense 46.7), 14336->4096 36.8 us (36.4, 48.2), 4096x4096 19.9 us (17.4, 17.9). The limit is the
// flushed method itself: a contiguous read of the 58.7 MB a 50% walk reads takes 27.5 us flushed (21.3 in a graph of
// back-to-back calls), and a random half of 256 B-56 KB runs 27.5-29.8 (21.4-22.3): bench/cuda/experiments/
// gather_ceiling.cu, twenty-fourth session. The stripe form (below, the default since then) takes 29.0 / 32.1 / 14.7
// us flushed at those shapes. End to end (8B bf16, tg128, calibrated thresholds at 50%, 55.2% achieved): 267.7
// tok/s with the stripe form alone (1.35x dense; the split form 1.15x), 310.5 (1.57x) with the SwiGLU fold and the
// SPARSIFY launch really skipped (backend_cuda.cpp).

// W [n, k] as data[c][r] = W[r, c], rows padded to a multiple of 64 (tile = the padded n, columns = true). bf16/f16.
SparseWeight make_sparse_columns(const DeviceWeight& w, cudaStream_t stream);

// Slices of k (blocks per stripe of rows) gemv_sparse_x uses by default (128 threads, 8 rows each, a block).
int gemv_sparse_x_default_splits(const SparseWeight& w);

// A consumer folded into the stripe form (the decoder's TEAL path: no swiglu launch). An RMSNorm folded in front as
// well (each block summing the squares of all of x) measured even on the H100 (8B --teal 50%: 310.6 tok/s with it,
// 310.4 without) and left src in the twenty-fourth session.
struct SparseXFusion {
  bool swiglu = false;  // SwiGLU behind: w is [gate; up] (2f rows) and y[f] = silu(gate . x') * (up . x')
};

// y[N] (+)= W · x' where x'[c] = x[c] if !(|x[c]| <= threshold) and x[c] != 0, else 0: SPARSIFY's calibrated-threshold
// rule folded in (threshold >= 0; 0 keeps x's nonzero entries). Fixed summation order (the same x gives the same bits).
// zeros: as sparsify's (the achieved-sparsity counters), or null. splits 0: the default, the stripe form below where it
// runs (gemv_sparse_x_stripe_shape), else the split form; splits > 0: the split form with that many slices (at least
// k / 2048). The split form: 1,024-row stripes, k in slices, the stripe's last block adding the slices' partials.
// A fusion runs the stripe form only (an error where it cannot run; SwiGLU: not with accumulate).
void gemv_sparse_x(const SparseWeight& w, const float* x /*[k]*/, float threshold, float* y /*[N]*/, bool accumulate,
                   SparseGemvWorkspace& ws, cudaStream_t stream, unsigned long long* zeros = nullptr, int splits = 0,
                   const SparseXFusion& fusion = {});

// The stripe form (gemv_sparse_cols.cu): a block of 512 threads owns `rows` output rows (32, 64, 128 or 256, dividing
// the padded n; SwiGLU: as many gate and up rows, dividing f) and walks every kept channel of its slice of k; `slices`
// > 1 (up to 8, sm_90; not with SwiGLU) splits k over one thread-block cluster whose sums meet in rank 0's shared
// memory. No workspace, no atomics, the same bits for the same x. Needs k % 4 == 0, k <= 65536, x 16-byte aligned and
// the slice's list (6 bytes an entry) in shared memory.
// In a CUDA graph of back-to-back calls on the H100 at 50%: 0.74x / 0.69x / 0.97x / 0.88x / 0.85x the split form's
// time at 4096->6144, 4096x4096, 4096->28672, 4096->14336 and 14336->4096 (docs/TEAL.md, twenty-fourth session).
// The default shape for w and x ({rows, slices}), or {0, 0} where gemv_sparse_x takes the split form (swiglu: where
// the SwiGLU form cannot run). n_rows: for gemv_sparse_x_rows' rows.
std::pair<int, int> gemv_sparse_x_stripe_shape(const SparseWeight& w, const float* x, bool swiglu = false,
                                               int n_rows = 1);
// The stripe form at an explicit shape (tests, benchmarks); an error names what does not fit. n_rows: as
// gemv_sparse_x_rows (x [n_rows, k], y [n_rows, N]; no counters for 2).
void gemv_sparse_x_stripes(const SparseWeight& w, const float* x /*[k]*/, float threshold, float* y /*[N]*/,
                           bool accumulate, cudaStream_t stream, unsigned long long* zeros, int rows, int slices,
                           const SparseXFusion& fusion = {}, int n_rows = 1);

// TEAL's batched decode over the union of the rows' masks: y[r] (+)= W · x_r' for the n_rows (1 or 2) rows of
// x [n_rows, k] and y [n_rows, N] (row strides k and N), x_r' as gemv_sparse_x's rule per row. One stripe-form walk
// over the channels any row keeps, each 16-byte load of W feeding every row's sums (each row's own values, 0 where it
// dropped a channel another kept). Independent rows at 50% keep 75% of the channels together; on the H100 at the 8B
// shapes at 50% (exp_gemv_sparse_union, in a graph, twenty-fifth session) two rows took 0.80x / 0.86x / 0.93x / 0.95x
// the dense two-row matmul's time at gate|up 4096->28672, down 14336->4096, q|k|v 4096->6144 and o 4096x4096; four
// rows (94% kept) lost everywhere (docs/TEAL.md).
// No sparsity counters: that path's SPARSIFY counts. gemv_sparse_x_rows_runs: whether the stripe form runs it.
bool gemv_sparse_x_rows_runs(const SparseWeight& w, const float* x, int n_rows);
void gemv_sparse_x_rows(const SparseWeight& w, const float* x /*[n_rows, k]*/, int n_rows, float threshold,
                        float* y /*[n_rows, N]*/, bool accumulate, cudaStream_t stream);

}  // namespace tessera::cuda
