// Sparse GEMV (matmul_sparse.h): the channel-major copy of a weight, the per-row nonzero structure, dispatch and
// threading. The SIMD kernels are in matmul_sparse_x86.h (compiled for AVX2 and for AVX-512).
#include "backends/cpu/kernels/matmul_sparse.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/matmul_internal.h"
#include "core/error.h"
#include "quant/blocks.h"

namespace tessera::cpu {
namespace {

using detail::kBlock;
using detail::kSparseRows;

bool quantized(DType d) { return d == DType::Q8_0 || d == DType::Q4_0 || d == DType::Q4_1; }
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
            qs[c * 32 + j] = static_cast<uint8_t>(blk.qs[c]);
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

// The per-call scratch of the nonzero structure (decode must not allocate per op once warm).
struct Scratch {
  std::vector<int32_t> idx, blocks, group_begin, group_x;
  std::vector<float> val, xd, xs;
  std::vector<uint8_t> group_ch;
  std::vector<detail::BlockQ8A> xq;
};

detail::SparseX build_x(const SparseWeight& w, const float* x, Scratch& s) {
  detail::SparseX sx;
  const int64_t k = w.k;
  if (floating(w.dtype)) {
    s.idx.resize(static_cast<size_t>(k));
    s.val.resize(static_cast<size_t>(k));
    int64_t m = 0;
    for (int64_t c = 0; c < k; ++c)
      if (x[c] != 0.0f) {
        s.idx[static_cast<size_t>(m)] = static_cast<int32_t>(c);
        s.val[static_cast<size_t>(m++)] = x[c];
      }
    sx.idx = s.idx.data();
    sx.val = s.val.data();
    sx.nnz = m;
    return sx;
  }
  const int64_t kb = k / kBlock;
  s.xq.resize(static_cast<size_t>(kb));
  (active_isa() >= Isa::AVX2 ? detail::quantize_act_avx2 : detail::quantize_act_scalar)(x, s.xq.data(), k);
  s.blocks.clear();
  s.group_begin.clear();
  s.group_x.clear();
  s.group_ch.clear();
  s.xd.clear();
  s.xs.clear();
  for (int64_t b = 0; b < kb; ++b) {
    const detail::BlockQ8A& q = s.xq[static_cast<size_t>(b)];
    uint8_t ch[kBlock];
    int cnt = 0;
    for (int c = 0; c < kBlock; ++c)
      if (q.qs[c] != 0) ch[cnt++] = static_cast<uint8_t>(c);
    if (cnt == 0) continue;  // the whole block of weights is skipped
    s.blocks.push_back(static_cast<int32_t>(b));
    s.group_begin.push_back(static_cast<int32_t>(s.group_x.size()));
    s.xd.push_back(q.d);
    s.xs.push_back(q.s);
    for (int g = 0; g < cnt; g += 4) {
      uint32_t packed = 0;
      for (int j = 0; j < 4; ++j) {
        const bool real = g + j < cnt;
        const uint8_t c = real ? ch[g + j] : ch[g];  // padding reads a real column against x = 0
        s.group_ch.push_back(c);
        if (real) packed |= static_cast<uint32_t>(static_cast<uint8_t>(q.qs[c])) << (8 * j);
      }
      s.group_x.push_back(static_cast<int32_t>(packed));
    }
  }
  s.group_begin.push_back(static_cast<int32_t>(s.group_x.size()));
  sx.blocks = s.blocks.data();
  sx.group_begin = s.group_begin.data();
  sx.group_ch = s.group_ch.data();
  sx.group_x = s.group_x.data();
  sx.xd = s.xd.data();
  sx.xs = s.xs.data();
  sx.n_blocks = static_cast<int64_t>(s.blocks.size());
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

bool sparse_matmul_supports(DType dtype) { return active_isa() >= Isa::AVX2 && (quantized(dtype) || floating(dtype)); }

SparseWeight prepare_sparse_weight(DType dtype, const void* rows, int64_t n, int64_t k) {
  TESSERA_CHECK(sparse_matmul_supports(dtype), "matmul_sparse: no sparse kernel for {} weights on this CPU",
                dtype_name(dtype));
  TESSERA_CHECK(rows != nullptr && n > 0 && k > 0 && (!quantized(dtype) || k % kBlock == 0),
                "matmul_sparse: weight [{}, {}] of {} has no data or is not a whole number of blocks", n, k,
                dtype_name(dtype));
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
