// Sparse GEMV (matmul_sparse.h): the channel-major copy of a weight, the per-row nonzero structure, dispatch and
// threading. The SIMD kernels are in matmul_sparse_x86.h (compiled for AVX2 and for AVX-512).
#include "backends/cpu/kernels/matmul_sparse.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/matmul_internal.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace tessera::cpu {
namespace {

using detail::kBlock;
using detail::kSparseRows;

bool quantized(DType d) { return d == DType::Q8_0 || d == DType::Q4_0 || d == DType::Q4_1; }
// q4_K: every 32-element sub-block is w = D q + M with a 4-bit q, so its sparse copy is q4_1's (q4_k_rows_as_q4_1:
// D and M rounded to fp16). The ternary formats convert exactly the same way (D = d, M = -d), but their sparse walk
// then reads 20 bytes per 32 weights where their dense kernel reads 8: 0.34-0.40x of it out of cache, measured
// (docs/TEAL.md); they stay dense.
bool as_q4_1_format(DType d) { return d == DType::Q4_K; }
bool floating(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

struct AlignedFree {
  void operator()(void* p) const { ::operator delete (p, std::align_val_t{64}); }
};

// Element c (0..31) of a q4 block's nibbles, in GGML's order (low nibbles are elements 0..15).
template <typename Blk>
uint8_t nibble(const Blk& b, int c) {
  return c < 16 ? static_cast<uint8_t>(b.qs[c] & 0x0F) : static_cast<uint8_t>(b.qs[c - 16] >> 4);
}

template <typename Blk>
void repack_quant(const void* rows, int64_t n, int64_t k, uint8_t* dst) {
  const int64_t kb = k / kBlock, chunks = (n + kSparseRows - 1) / kSparseRows;
  const uint64_t tb = detail::sparse_tile_bytes(std::is_same_v<Blk, BlockQ8_0>   ? DType::Q8_0
                                                : std::is_same_v<Blk, BlockQ4_0> ? DType::Q4_0
                                                                                 : DType::Q4_1);
  const auto* src = static_cast<const Blk*>(rows);
  constexpr bool kHasMin = std::is_same_v<Blk, BlockQ4_1>;
  for (int64_t r = 0; r < chunks; ++r) {
    for (int64_t b = 0; b < kb; ++b) {
      uint8_t* tile = dst + static_cast<uint64_t>(r * kb + b) * tb;
      std::memset(tile, 0, tb);  // rows past n: scale 0 and quants 0
      auto* d = reinterpret_cast<uint16_t*>(tile);
      for (int p = 0; p < kSparseRows; ++p) {
        const int64_t row = r * kSparseRows + detail::sparse_lane_row(p);
        if (row >= n) continue;
        d[p] = src[row * kb + b].d;
        if constexpr (kHasMin) d[kSparseRows + p] = src[row * kb + b].m;
      }
      uint8_t* qs = tile + (kHasMin ? 4 : 2) * kSparseRows;
      for (int c = 0; c < kBlock; ++c) {
        for (int j = 0; j < kSparseRows; ++j) {
          const int64_t row = r * kSparseRows + j;
          if (row >= n) continue;
          const Blk& blk = src[row * kb + b];
          if constexpr (std::is_same_v<Blk, BlockQ8_0>) {
            qs[c * 32 + j] = static_cast<uint8_t>(static_cast<uint8_t>(blk.qs[c]) ^ 0x80);  // w + 128
          } else {
            // byte j % 16 of the channel's 16: row j in the low nibble (j < 16), row j in the high one (j >= 16)
            qs[c * 16 + j % 16] |= static_cast<uint8_t>(nibble(blk, c) << (j < 16 ? 0 : 4));
          }
        }
      }
    }
  }
}

void repack_float(DType dtype, const void* rows, int64_t n, int64_t k, uint8_t* dst) {
  const int64_t chunks = (n + kSparseRows - 1) / kSparseRows;
  const size_t es = dtype == DType::F32 ? 4 : 2;
  const auto* src = static_cast<const uint8_t*>(rows);
  for (int64_t r = 0; r < chunks; ++r)
    for (int64_t c = 0; c < k; ++c)
      for (int j = 0; j < kSparseRows; ++j) {
        const int64_t row = r * kSparseRows + j;
        uint8_t* o = dst + ((static_cast<uint64_t>(r * k + c) * kSparseRows + static_cast<uint64_t>(j)) * es);
        if (row < n)
          std::memcpy(o, src + (static_cast<uint64_t>(row * k + c)) * es, es);
        else
          std::memset(o, 0, es);
      }
}

// Bit c of the result: byte c of the 32 is nonzero. Branch-free (SWAR, 8 bytes a word): the branch on each byte it
// replaces is taken at random half the time at 50% sparsity, and its mispredictions made the per-row setup 6% of a
// decode step (docs/TEAL.md).
uint32_t nonzero_mask32(const int8_t* q) {
  uint32_t mask = 0;
  for (int w = 0; w < 4; ++w) {
    uint64_t v;
    std::memcpy(&v, q + 8 * w, 8);
    // high bit of each byte: (low 7 bits nonzero) | (high bit set); no carry crosses a byte (0x7F + 0x7F < 0x100)
    const uint64_t nz = (((v & 0x7F7F7F7F7F7F7F7FULL) + 0x7F7F7F7F7F7F7F7FULL) | v) & 0x8080808080808080ULL;
    // the 8 flags (bits 7, 15, ..., 63) gathered into one byte: byte i -> bit i
    mask |= static_cast<uint32_t>(((nz >> 7) * 0x0102040810204080ULL) >> 56) << (8 * w);
  }
  return mask;
}

// The per-call scratch of the nonzero structure (decode must not allocate per op once warm), and the input it was
// built from: q, k and v read one SPARSIFY output, as gate and up do, so the second and third matmul of a row find
// their structure built (compared by pointer, length and contents: a buffer is reused by the next token).
struct Scratch {
  std::vector<int32_t> idx, blocks, group_begin, group_x;
  std::vector<float> val, xd, xs;
  std::vector<int32_t> xq_sum;
  std::vector<uint16_t> group_off;
  std::vector<detail::BlockQ8A> xq;
  const float* built_from = nullptr;
  uint64_t built_column = 0;  // bytes of a quantized column (offsets depend on it); 0 for the float formats
  std::vector<float> built_x;
  detail::SparseX built;
};

detail::SparseX build_x(const SparseWeight& w, const float* x, Scratch& s) {
  const int64_t k = w.k;
  const bool quant = quantized(w.dtype);
  const uint64_t column = !quant ? 0 : w.dtype == DType::Q8_0 ? kSparseRows : kSparseRows / 2;
  if (s.built_from == x && s.built_column == column && static_cast<int64_t>(s.built_x.size()) == k &&
      std::memcmp(s.built_x.data(), x, sizeof(float) * static_cast<size_t>(k)) == 0)
    return s.built;
  detail::SparseX sx;
  if (!quant) {
    s.idx.resize(static_cast<size_t>(k));
    s.val.resize(static_cast<size_t>(k));
    int64_t m = 0;
    for (int64_t c = 0; c < k; ++c) {
      // branch-free compaction: always write, advance only past a nonzero
      s.idx[static_cast<size_t>(m)] = static_cast<int32_t>(c);
      s.val[static_cast<size_t>(m)] = x[c];
      m += x[c] != 0.0f;
    }
    sx.idx = s.idx.data();
    sx.val = s.val.data();
    sx.nnz = m;
  } else {
    const int64_t kb = k / kBlock;
    const auto kbs = static_cast<size_t>(kb);
    s.xq.resize(kbs);
    (active_isa() >= Isa::AVX2 ? detail::quantize_act_avx2 : detail::quantize_act_scalar)(x, s.xq.data(), k);
    s.blocks.resize(kbs);
    s.group_begin.resize(kbs + 1);
    s.xd.resize(kbs);
    s.xs.resize(kbs);
    s.xq_sum.resize(kbs);
    s.group_x.resize(kbs * kBlock / 4);
    s.group_off.resize(kbs * kBlock);
    int64_t nb = 0, ng = 0;
    for (int64_t b = 0; b < kb; ++b) {
      const detail::BlockQ8A& q = s.xq[static_cast<size_t>(b)];
      uint32_t mask = nonzero_mask32(q.qs);
      if (mask == 0) continue;  // the whole block of weights is skipped
      const auto bs = static_cast<size_t>(nb++);
      s.blocks[bs] = static_cast<int32_t>(b);
      s.group_begin[bs] = static_cast<int32_t>(ng);
      s.xd[bs] = q.d;
      s.xs[bs] = q.s;
      int32_t sum = 0;
      for (int c = 0; c < kBlock; ++c) sum += q.qs[c];
      s.xq_sum[bs] = sum;
      uint16_t* ch = s.group_off.data() + 4 * ng;
      int32_t* gx = s.group_x.data() + ng;
      int j = 0;
      uint32_t packed = 0;
      for (; mask != 0; mask &= mask - 1, ++j) {
        const int c = std::countr_zero(mask);
        ch[j] = static_cast<uint16_t>(static_cast<uint64_t>(c) * column);
        packed |= static_cast<uint32_t>(static_cast<uint8_t>(q.qs[c])) << (8 * (j & 3));
        if ((j & 3) == 3) {
          gx[j >> 2] = static_cast<int32_t>(packed);
          packed = 0;
        }
      }
      if ((j & 3) != 0) {
        gx[j >> 2] = static_cast<int32_t>(packed);
        // padding reads a real column (the group's first, already in cache) against x = 0
        for (int p = j; (p & 3) != 0; ++p) ch[p] = ch[j & ~3];
      }
      ng += (j + 3) / 4;
    }
    s.group_begin[static_cast<size_t>(nb)] = static_cast<int32_t>(ng);
    sx.blocks = s.blocks.data();
    sx.group_begin = s.group_begin.data();
    sx.group_off = s.group_off.data();
    sx.group_x = s.group_x.data();
    sx.xd = s.xd.data();
    sx.xs = s.xs.data();
    sx.xq_sum = s.xq_sum.data();
    sx.n_blocks = nb;
  }
  s.built_from = x;
  s.built_column = column;
  s.built_x.assign(x, x + k);
  s.built = sx;
  return sx;
}

}  // namespace

namespace detail {
uint64_t sparse_tile_bytes(DType dtype) {
  switch (dtype) {
    case DType::Q8_0:
      return 2 * kSparseRows + 32 * 32;
    case DType::Q4_0:
      return 2 * kSparseRows + 32 * 16;
    case DType::Q4_1:
      return 4 * kSparseRows + 32 * 16;
    default:
      fail("matmul_sparse: {} has no quantized tile", dtype_name(dtype));
  }
}
}  // namespace detail

bool sparse_matmul_supports(DType dtype) {
  return active_isa() >= Isa::AVX2 && (quantized(dtype) || floating(dtype) || as_q4_1_format(dtype));
}

SparseWeight prepare_sparse_weight(DType dtype, const void* rows, int64_t n, int64_t k) {
  TESSERA_CHECK(sparse_matmul_supports(dtype), "matmul_sparse: no sparse kernel for {} weights on this CPU",
                dtype_name(dtype));
  TESSERA_CHECK(rows != nullptr && n > 0 && k > 0 && (!quantized(dtype) || k % kBlock == 0) &&
                    (!as_q4_1_format(dtype) || k % kQKK == 0),
                "matmul_sparse: weight [{}, {}] of {} has no data or is not a whole number of blocks", n, k,
                dtype_name(dtype));
  if (as_q4_1_format(dtype)) {
    std::vector<BlockQ4_1> q41(static_cast<size_t>(n * (k / kBlock)));
    q4_k_rows_as_q4_1(rows, q41.data(), n, k);
    return prepare_sparse_weight(DType::Q4_1, q41.data(), n, k);
  }
  SparseWeight w;
  w.dtype = dtype;
  w.n = n;
  w.k = k;
  w.chunks = (n + kSparseRows - 1) / kSparseRows;
  w.bytes = quantized(dtype) ? static_cast<uint64_t>(w.chunks * (k / kBlock)) * detail::sparse_tile_bytes(dtype)
                             : static_cast<uint64_t>(w.chunks * k * kSparseRows) * (dtype == DType::F32 ? 4 : 2);
  void* mem = ::operator new (w.bytes, std::align_val_t{64});
  std::shared_ptr<void> owner(mem, AlignedFree{});
  auto* dst = static_cast<uint8_t*>(mem);
  switch (dtype) {
    case DType::Q8_0:
      repack_quant<BlockQ8_0>(rows, n, k, dst);
      break;
    case DType::Q4_0:
      repack_quant<BlockQ4_0>(rows, n, k, dst);
      break;
    case DType::Q4_1:
      repack_quant<BlockQ4_1>(rows, n, k, dst);
      break;
    default:
      repack_float(dtype, rows, n, k, dst);
  }
  w.tiles = mem;
  w.storage = std::move(owner);
  return w;
}

void matmul_sparse(ThreadPool& pool, const SparseWeight& w, const float* x, float* y, int64_t t) {
  TESSERA_CHECK(w.tiles != nullptr && t > 0 && x != nullptr && y != nullptr,
                "matmul_sparse: unprepared weight, no tokens or null pointers");
  const detail::SparseKernel kernel =
      active_isa() == Isa::AVX512_VNNI ? detail::avx512_sparse_kernel(w.dtype) : detail::avx2_sparse_kernel(w.dtype);
  TESSERA_CHECK(kernel != nullptr, "matmul_sparse: no sparse kernel for {} weights on this CPU", dtype_name(w.dtype));
  thread_local Scratch scratch;
  // Tasks are ranges of 32-row chunks: ~4 per thread so a core slowed by another process can be balanced.
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(w.chunks, int64_t{4} * pool.n_threads()));
  for (int64_t i = 0; i < t; ++i) {
    const detail::SparseX sx = build_x(w, x + i * w.k, scratch);
    float* yi = y + i * w.n;
    if (tasks == 1) {
      kernel(w, sx, yi, 0, w.chunks);
      continue;
    }
    pool.parallel_for(
        tasks, [&](int64_t task, int) { kernel(w, sx, yi, w.chunks * task / tasks, w.chunks * (task + 1) / tasks); });
  }
}

}  // namespace tessera::cpu
