// Decode attention (one query token) over an f16/bf16/f32 KV cache, split-K ("flash-decoding"). A single kv head's
// keys are far too few bytes to keep 132 SMs busy, so the positions are cut into chunks of >= 64; one block per
// (chunk, kv head) computes all the query heads that share that kv head (GQA: K and V are read once per group, not
// once per query head), and the last block to finish for a kv head rescales and sums the chunks:
// o = sum_j exp(m_j - M) o_j / sum_j exp(m_j - M) l_j.
//
// v1 (docs/CUDA_NOTES.md) staged scores in shared memory between three block-wide phases and combined in a second
// kernel whose threads walked the chunks one dependent load at a time: 23.6 us at 4k context, 4x the bytes' time.
// v2: every thread issues all its K and V loads of a tile at once (one memory round trip per tile), keeps an online
// softmax in registers (no block-wide phases), and the combine is fused behind an atomic ticket. Slower (34.9 us):
// a grid of 64-position chunks over the whole cache (three waves of blocks) and a combine that still walked the
// chunks serially. v3: a one-wave grid (two blocks per SM), 8 positions per thread per tile, and a combine
// with 8 float4 loads in flight per thread.
// v4: at short context a kv head is one block and v3's 4 warps
// each ran ~1000 dependent instructions per 128-position tile with one warp per scheduler to hide them (~1.5 us a
// tile). v4 spreads a tile over 16 warps (2 positions per thread per tile instead of 8), skips the steps that start
// past the chunk's end, runs a group of 3 without an idle fourth head, uses ex2 on log2-scaled scores, sizes its
// grid for one wave of its own blocks, and asks the next 64 KB of K and V into L2 ahead of the tile loop.
// v5: v4's kernel with two run-time paths. (1) Early loads:
// pos, the cache positions below pos and (fused) the rotation angles do not depend on the previous kernel, so they are
// read before pdl_wait() and the first tile's memory round trip overlaps the previous kernel's tail (measured on the
// H100: 0.6-2.2 us less per launch, every shape and context). This requires that the kernel just before in the stream
// writes neither pos/seq nor the cache below pos (the decoders copy pos from the host before the graph; the cache
// below pos was stored by earlier tokens). (2) Clusters, opt-in (and since removed), for up to 4 (kv head,
// head tile) blocks per launch (SmolLM2): a context longer than two tiles and at most 8 smallest chunks is spread over
// the 8 blocks of one thread-block cluster per kv head (v4: chunks combined through global partials and a ticket,
// ~3 us); the blocks combine through distributed shared memory (two cluster barriers, ~1.3-1.5 us measured, no
// global round trip). In the kernel benchmark SmolLM2 heads at 512-2048 positions took 5.1-6.7 us instead of
// 7.6-7.7, but the one end-to-end run with clusters on (SmolLM2 tg256 at 128-384 positions) was 4% slower than v4:
// off until an end-to-end measurement says otherwise.
// Versions 3 and 4, and v5's clusters, measured slower and only switches chose them: they left src/ for
// bench/cuda/experiments/attn_decode_versions.cu (v3's kernel and the cluster combine moved there; v4 and v5 without
// early loads are this kernel with AttnParams::early = false), which validates each against a double reference and
// times it beside this file's launchers.
// v6 (the default; CudaOptions::attn_short = 0 restores v5, = N caps the short path at N positions): one decode row
// over a short context takes attn_short (attn_decode_short.cuh): one block per query head with every position of the
// context in registers, loaded before pdl_wait() (512 positions at hd 64, 256 at hd 128), q and k rotated in
// registers, no tiles, no partials, no ticket. Inside attn_split_kernel (a CUDA graph replays one grid for every
// position, so the choice is made in the kernel: ctx <= a.short_limit), and, for a cache that no context can outgrow
// (256 positions at hd 64, 128 at hd 128), as attn_compact_kernel: the same path in 8-warp blocks that fit beside the
// previous GEMV's blocks (CudaOptions::attn_compact = 0: attn_split_kernel instead). Measured on the H100 (2026-11-22,
// fused, kernel bench): SmolLM2 heads 3.37 / 3.65 / 3.86 us at 128 / 256 / 384 positions (v5: 3.71 / 4.74 / 7.48),
// compact 3.18 / 3.56 at 128 / 256; end to end (tessera bench -p 128 -n 256, a 256-position cache) SmolLM2 bf16
// 2,407-2,433 tok/s with the compact kernel, 2,279-2,292 without, 2,240 with v5.
// v6 windows (CudaOptions::attn_compact = 1 restores one window): the compact kernel walks up to four register windows
// (online softmax across them; the later windows asked into L2 before pdl_wait()), so caches up to 1,024 positions at
// hd 64 (512 at hd 128) take it instead of attn_split_kernel's 16-warp blocks. End to end on the H100 (tessera bench
// -p 0 -d 128 -n 256, a 384-position cache, chained greedy decode): SmolLM2 bf16 2,487.8 tok/s vs 2,395.3 with one
// window; Llama-3.2-1B 1,033.2 vs 1,020.9; Llama-3-8B 194.1 vs 193.1.
// Batched decode (attn_decode_rows) is the same kernel with a row dimension folded into grid z: row r reads its own
// q row, position pos[r] and cache slot seq[r], and owns its own partials and tickets. With t rows the chunks per kv
// head shrink (about max_splits / t, at least 1) so the grid stays about one wave.
#include <algorithm>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_options.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/kernels/attn_decode_kernel.cuh"
#include "backends/cuda/kernels/attn_decode_short.cuh"
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels_rows.h"

namespace tessera::cuda {
namespace detail {
namespace {

// The fused path's extra inputs: this token's k and v rows and the rotation (k == nullptr: unfused).
struct RopeIn {
  const float* k = nullptr;
  const float* v = nullptr;
  size_t ld_kv = 0;
  const float* inv_freq = nullptr;
  int rope_dim = 0;
  bool neox = false;
};

// One launch's arguments, shared by attn_decode (t = 1) and attn_decode_rows, fused or not.
struct AttnArgs {
  const float* q;
  size_t ld_q;
  const int32_t* pos;
  const int32_t* seq;
  int t;
  float* out;
  int64_t n_head;
  float scale;
  int splits;
  float* part_out;
  float2* part_ml;
  unsigned int* counters;
  cudaStream_t stream;
  RopeIn rope;
  int8_t* out_q8 = nullptr;  // t = 1: the output also quantized (quantize_q8's q8 and ds); null: not written
  float2* out_ds = nullptr;
};

// The study knobs of CudaOptions (cuda_options.h), read at launch, so at capture for graphs. attn_chunk: the split
// kernel's smallest chunk (0: per shape), for measuring the single-block/split trade-off.
int min_chunk_override() { return cuda_options().attn_chunk; }

// attn_short: contexts of at most this many positions take the short-context path (-1: up to its register capacity,
// the default; 0: never, v5 at every context).
int short_cap(int capacity) {
  const int v = cuda_options().attn_short;
  return v < 0 ? capacity : std::min(v, capacity);
}

// attn_compact: register windows the compact kernel may walk (-1: all, the default; 0: never).
int compact_windows_cap() {
  const int v = cuda_options().attn_compact;
  return v < 0 ? kCompactWindows : std::min(v, kCompactWindows);
}

// Blocks of a kernel resident per SM (its registers and shared memory decide), asked once per kernel.
template <typename K>
int resident_blocks(K* kernel, int threads) {
  int n = 0;
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
  return std::max(1, n);
}

template <typename T, int HD, int G>
void launch_split(const KvCacheView& c, const AttnArgs& a, int group) {
  constexpr int threads = attn_warps<HD, G>() * kWarp;
  auto* kernel = a.rope.k != nullptr ? attn_split_kernel<T, HD, G, true> : attn_split_kernel<T, HD, G, false>;
  const int tiles = (group + G - 1) / G;
  // One wave of blocks (one 16-warp block per SM for hd 64/128): longer chunks, fewer combines. a.splits is sized for
  // v3's one wave of two 4-warp blocks per SM, and stays the partials' stride.
  static const int per_sm = std::max(resident_blocks(attn_split_kernel<T, HD, G, false>, threads),
                                     resident_blocks(attn_split_kernel<T, HD, G, true>, threads));
  const int64_t blocks = c.n_kv * tiles * a.t;
  const int splits = std::max(1, std::min(a.splits, ceil_div(int64_t{per_sm} * sm_count(), blocks)));
  // v6: one decode row also takes the short-context path, which needs a block per query head of a head tile along x
  // (the chunks' extra blocks exit at once) and neox pairs that lie in whole 16-byte slices.
  const bool rope_ok = a.rope.k == nullptr || !a.rope.neox || (a.rope.rope_dim / 2) % 8 == 0;
  constexpr int short_capacity = short_positions<T, HD, attn_warps<HD, G>()>();
  const int short_limit = a.t == 1 && rope_ok ? short_cap(short_capacity) : 0;
  const int grid_x = short_limit > 0 ? std::max(splits, G) : splits;
  const dim3 grid(grid_x, static_cast<unsigned>(c.n_kv), static_cast<unsigned>(tiles * a.t));
  const int forced = min_chunk_override();
  const int min_chunk = forced ? forced : default_min_chunk<T, HD, G>();
  AttnParams<T> p{};
  p.q = a.q, p.ld_q = a.ld_q, p.kc = static_cast<T*>(c.k), p.vc = static_cast<T*>(c.v), p.pos = a.pos, p.seq = a.seq;
  p.n_ctx = static_cast<int>(c.n_ctx), p.n_seq = static_cast<int>(c.n_seq), p.group = group, p.tiles = tiles;
  p.max_splits = a.splits, p.min_chunk = min_chunk, p.scale = a.scale;
  p.window = static_cast<int>(std::min<int64_t>(c.window, INT32_MAX));
  p.part_out = a.part_out, p.part_ml = a.part_ml, p.counters = a.counters, p.out = a.out;
  p.k_new = a.rope.k, p.v_new = a.rope.v, p.ld_kv = a.rope.ld_kv, p.inv_freq = a.rope.inv_freq;
  p.rope_dim = a.rope.rope_dim, p.neox = a.rope.neox;
  p.early = true;
  p.splits = splits, p.short_limit = short_limit;
  // v6 compact: a cache of at most kCompactWindows register windows takes the 8-warp kernel (attn_decode_short.cuh
  // says why); CudaOptions::attn_compact = 0 keeps it on attn_split_kernel (=N: caches of at most N windows). A cap on
  // the short path (CudaOptions::attn_short = N) below the cache size rules it out too.
  // A sliding window takes attn_split_kernel (its attn_short reads the window; the compact kernel's does not).
  if (c.window == 0 && short_limit > 0 && short_limit >= std::min<int64_t>(c.n_ctx, short_capacity) &&
      c.n_ctx <= compact_windows_cap() * compact_window<T, HD>()) {
    const bool rope = a.rope.k != nullptr;
    auto* ck = rope ? attn_compact_kernel<T, HD, true> : attn_compact_kernel<T, HD, false>;
    p.out_q8 = a.out_q8, p.out_ds = a.out_ds;  // every context takes attn_short here: it quantizes too
    return launch(rope ? "attn_compact_kernel<rope>" : "attn_compact_kernel", ck,
                  dim3(static_cast<unsigned>(c.n_kv * group)), dim3(kCompactThreads), 0, a.stream, p);
  }
  launch(a.rope.k != nullptr ? "attn_split_kernel<rope>" : "attn_split_kernel", kernel, grid, dim3(threads), 0,
         a.stream, p);
  // The split kernel's chunked paths do not quantize (their output is written by several blocks or a combine): one
  // quantize_q8 launch after it, as the decoder would have launched.
  if (a.out_q8 != nullptr) quantize_q8(a.out, a.out_q8, a.out_ds, a.n_head * c.hd, a.stream);
}

template <typename T, int HD>
void launch_hd(const KvCacheView& c, const AttnArgs& a) {
  const int group = static_cast<int>(a.n_head / c.n_kv);
  // The smallest head tile that holds the group (groups over 8 take several tiles): fewer idle registers.
  if (group == 3) return launch_split<T, HD, 3>(c, a, group);
  if (head_tile(group) == 1)
    launch_split<T, HD, 1>(c, a, group);
  else if (head_tile(group) == 2)
    launch_split<T, HD, 2>(c, a, group);
  else if (head_tile(group) == 4)
    launch_split<T, HD, 4>(c, a, group);
  else
    launch_split<T, HD, 8>(c, a, group);
}

template <typename T>
void launch_typed(const KvCacheView& c, const AttnArgs& a) {
  if (c.hd == 64) launch_hd<T, 64>(c, a);
  if (c.hd == 128) launch_hd<T, 128>(c, a);
  if (c.hd == 256) launch_hd<T, 256>(c, a);
}

void launch_attn(const KvCacheView& c, const AttnArgs& a) {
  if (c.dtype == DType::F16)
    launch_typed<__half>(c, a);
  else if (c.dtype == DType::F32)
    launch_typed<float>(c, a);
  else
    launch_typed<__nv_bfloat16>(c, a);
}

// The fused path's checks on this token's k/v rows and the rotation (as rope_store_kv's).
void require_rope(const char* op, const KvCacheView& c, const RopeIn& r) {
  const std::string o(op);
  TESSERA_CUDA_REQUIRE(r.k && r.v, o + ": the k or v pointer is null");
  TESSERA_CUDA_REQUIRE(r.rope_dim >= 0 && r.rope_dim % 2 == 0 && r.rope_dim <= c.hd,
                       o + ": rope_dim " + num(r.rope_dim) + " must be even and at most the head size");
  TESSERA_CUDA_REQUIRE(r.rope_dim == 0 || r.inv_freq != nullptr, o + ": inv_freq is null");
  TESSERA_CUDA_REQUIRE(
      r.ld_kv >= static_cast<size_t>(c.n_kv * c.hd),
      o + ": the k/v row stride " + num(static_cast<int64_t>(r.ld_kv)) + " is smaller than the kv heads' width");
}

int head_tiles(int64_t n_head, const KvCacheView& c) {
  const int group = static_cast<int>(n_head / c.n_kv);
  return (group + head_tile(group) - 1) / head_tile(group);
}

// Chunks per kv head for t rows: one wave of two blocks per SM over all rows (v2 sized the grid by chunks of 64 at
// the full cache: 1024 blocks for an 8k cache, three waves of mostly idle blocks), never more chunks of 64 than the
// cache holds, at most 256.
int attn_splits(int64_t n_head, const KvCacheView& c, int64_t t) {
  const int64_t blocks = c.n_kv * head_tiles(n_head, c) * t;
  const int fill = ceil_div(2 * sm_count(), blocks);
  return std::max(1, std::min({kMaxSplits, fill, ceil_div(c.n_ctx, kMinChunk)}));
}
int attn_max_splits(int64_t n_head, const KvCacheView& c) { return attn_splits(n_head, c, 1); }

void require_cache(const char* op, const KvCacheView& c, int64_t n_head) {
  const std::string o(op);
  TESSERA_CUDA_REQUIRE(c.k && c.v, o + ": the KV cache pointers are null");
  TESSERA_CUDA_REQUIRE(c.dtype == DType::F16 || c.dtype == DType::BF16 || c.dtype == DType::F32,
                       o + ": the KV cache must be f16, bf16 or f32");
  TESSERA_CUDA_REQUIRE(c.hd == 64 || c.hd == 128 || c.hd == 256,
                       o + ": head size " + num(c.hd) + " is not supported (64, 128 or 256)");
  TESSERA_CUDA_REQUIRE(c.n_ctx > 0 && c.n_ctx <= kMaxCtx, o + ": context size " + num(c.n_ctx) + " is outside 1..2^24");
  TESSERA_CUDA_REQUIRE(n_head > 0 && c.n_kv > 0 && n_head % c.n_kv == 0 && c.n_kv < 65536,
                       o + ": " + num(n_head) + " query heads do not group over " + num(c.n_kv) + " kv heads");
}

}  // namespace
}  // namespace detail

AttnWorkspace::AttnWorkspace(int64_t n_head, const KvCacheView& cache) : n_head_(n_head), hd_(cache.hd) {
  detail::require_cache("attention workspace", cache, n_head);
  max_splits_ = detail::attn_max_splits(n_head, cache);
  out_ = DeviceBuffer(sizeof(float) * static_cast<size_t>(n_head) * max_splits_ * hd_);
  ml_ = DeviceBuffer(sizeof(float2) * static_cast<size_t>(n_head) * max_splits_);
  counters_ = DeviceBuffer(sizeof(unsigned int) * static_cast<size_t>(n_head));  // >= n_kv * head tiles
  counters_.fill_bytes(0);
}

namespace {

void decode_one(const char* op, const float* q, const KvCacheView& cache, const int32_t* pos, float* out,
                int64_t n_head, float scale, AttnWorkspace& ws, cudaStream_t stream, const detail::RopeIn& rope,
                int8_t* out_q8, float2* out_ds) {
  const std::string o(op);
  detail::require_cache(op, cache, n_head);
  TESSERA_CUDA_REQUIRE(q && pos && out, o + ": a pointer argument is null");
  TESSERA_CUDA_REQUIRE(detail::aligned16(q) && detail::aligned16(out), o + ": q and out must be 16-byte aligned");
  TESSERA_CUDA_REQUIRE(
      ws.n_head() == n_head && ws.hd() == cache.hd && ws.max_splits() == detail::attn_max_splits(n_head, cache),
      o + ": the workspace was made for another head count, head size or context size");
  if (rope.k != nullptr || rope.v != nullptr) detail::require_rope(op, cache, rope);
  TESSERA_CUDA_REQUIRE((out_q8 == nullptr) == (out_ds == nullptr),
                       o + ": the quantized output needs both q8 and ds (or neither)");
  detail::AttnArgs a{q,
                     static_cast<size_t>(n_head * cache.hd),
                     pos,
                     nullptr,
                     1,
                     out,
                     n_head,
                     scale,
                     ws.max_splits(),
                     ws.partial_out(),
                     ws.partial_ml(),
                     ws.counters(),
                     stream};
  a.rope = rope;
  a.out_q8 = out_q8, a.out_ds = out_ds;
  detail::launch_attn(cache, a);
}

}  // namespace

void attn_decode(const float* q, const KvCacheView& cache, const int32_t* pos, float* out, int64_t n_head, float scale,
                 AttnWorkspace& ws, cudaStream_t stream, int8_t* out_q8, float2* out_ds) {
  decode_one("attn_decode", q, cache, pos, out, n_head, scale, ws, stream, detail::RopeIn{}, out_q8, out_ds);
}

void attn_decode_rope(const float* q, const float* k, const float* v, const KvCacheView& cache, const int32_t* pos,
                      int64_t rope_dim, const float* inv_freq, bool neox, float* out, int64_t n_head, float scale,
                      AttnWorkspace& ws, cudaStream_t stream, int8_t* out_q8, float2* out_ds) {
  TESSERA_CUDA_REQUIRE(k && v, "attn_decode_rope: the k or v pointer is null");
  const detail::RopeIn rope{k,   v, static_cast<size_t>(cache.n_kv * cache.hd), inv_freq, static_cast<int>(rope_dim),
                            neox};
  TESSERA_CUDA_REQUIRE(rope_dim >= 0 && rope_dim <= cache.hd,
                       "attn_decode_rope: rope_dim " + detail::num(rope_dim) + " is outside 0..head size");
  decode_one("attn_decode_rope", q, cache, pos, out, n_head, scale, ws, stream, rope, out_q8, out_ds);
}

// ---------------------------------------------------------------------------------------------------------------------
// Batched decode

struct AttnRowsWorkspace::Impl {
  int64_t max_t = 0, n_head = 0, n_kv = 0, hd = 0, n_ctx = 0;
  int64_t capacity = 0;   // max over t <= max_t of t * attn_splits(t): chunk partials per head
  DeviceBuffer out;       // [capacity, n_head, hd] unnormalized partial outputs
  DeviceBuffer ml;        // [capacity, n_head] (max score, sum of exp)
  DeviceBuffer counters;  // [max_t, n_kv, head tiles] chunks finished; zero between launches
};

AttnRowsWorkspace::AttnRowsWorkspace(int64_t max_t, int64_t n_head, const KvCacheView& cache)
    : impl_(std::make_unique<Impl>()) {
  detail::require_cache("attention rows workspace", cache, n_head);
  TESSERA_CUDA_REQUIRE(max_t > 0 && max_t * detail::head_tiles(n_head, cache) <= 65535,
                       "attention rows workspace: row count " + detail::num(max_t) + " is outside 1..65535 / tiles");
  Impl& w = *impl_;
  w.max_t = max_t, w.n_head = n_head, w.n_kv = cache.n_kv, w.hd = cache.hd, w.n_ctx = cache.n_ctx;
  for (int64_t t = 1; t <= max_t; ++t) w.capacity = std::max(w.capacity, t * detail::attn_splits(n_head, cache, t));
  w.out = DeviceBuffer(sizeof(float) * static_cast<size_t>(w.capacity * n_head * cache.hd));
  w.ml = DeviceBuffer(sizeof(float2) * static_cast<size_t>(w.capacity * n_head));
  w.counters = DeviceBuffer(sizeof(unsigned int) * static_cast<size_t>(max_t * n_head));  // >= n_kv * head tiles
  w.counters.fill_bytes(0);
}
AttnRowsWorkspace::~AttnRowsWorkspace() = default;
int64_t AttnRowsWorkspace::max_t() const { return impl_->max_t; }

namespace {

void decode_rows(const char* op, const float* q, int64_t ld_q, const KvCacheView& cache, const int32_t* pos,
                 const int32_t* seq, int64_t t, float* out, int64_t n_head, float scale, AttnRowsWorkspace& ws,
                 cudaStream_t stream, const detail::RopeIn& rope) {
  using detail::num;
  const std::string o(op);
  detail::require_cache(op, cache, n_head);
  const AttnRowsWorkspace::Impl& w = ws.impl();
  TESSERA_CUDA_REQUIRE(q && pos && out, o + ": a pointer argument is null");
  TESSERA_CUDA_REQUIRE(t > 0 && t <= w.max_t,
                       o + ": row count " + num(t) + " is outside 1.." + num(w.max_t) + " (the workspace's size)");
  TESSERA_CUDA_REQUIRE(w.n_head == n_head && w.n_kv == cache.n_kv && w.hd == cache.hd && w.n_ctx == cache.n_ctx,
                       o + ": the workspace was made for another head count, head size or context size");
  TESSERA_CUDA_REQUIRE(cache.n_seq > 0 && cache.n_seq < (int64_t{1} << 31), o + ": n_seq is invalid");
  TESSERA_CUDA_REQUIRE(ld_q >= n_head * cache.hd && ld_q % 4 == 0 && detail::aligned16(q) && detail::aligned16(out),
                       o + ": q and out must be 16-byte aligned and ld_q " + num(ld_q) +
                           " a multiple of 4 of at least the heads' width");
  if (rope.k != nullptr || rope.v != nullptr) detail::require_rope(op, cache, rope);
  const int splits = detail::attn_splits(n_head, cache, t);
  detail::AttnArgs a{q,
                     static_cast<size_t>(ld_q),
                     pos,
                     seq,
                     static_cast<int>(t),
                     out,
                     n_head,
                     scale,
                     splits,
                     w.out.as<float>(),
                     w.ml.as<float2>(),
                     w.counters.as<unsigned int>(),
                     stream};
  a.rope = rope;
  detail::launch_attn(cache, a);
}

}  // namespace

void attn_decode_rows(const float* q, int64_t ld_q, const KvCacheView& cache, const int32_t* pos, const int32_t* seq,
                      int64_t t, float* out, int64_t n_head, float scale, AttnRowsWorkspace& ws, cudaStream_t stream) {
  decode_rows("attn_decode_rows", q, ld_q, cache, pos, seq, t, out, n_head, scale, ws, stream, detail::RopeIn{});
}

void attn_decode_rope_rows(const float* q, int64_t ld_q, const float* k, const float* v, int64_t ld_kv,
                           const KvCacheView& cache, const int32_t* pos, const int32_t* seq, int64_t t,
                           int64_t rope_dim, const float* inv_freq, bool neox, float* out, int64_t n_head, float scale,
                           AttnRowsWorkspace& ws, cudaStream_t stream) {
  TESSERA_CUDA_REQUIRE(k && v, "attn_decode_rope_rows: the k or v pointer is null");
  TESSERA_CUDA_REQUIRE(ld_kv >= 0 && rope_dim >= 0 && rope_dim <= cache.hd,
                       "attn_decode_rope_rows: ld_kv " + detail::num(ld_kv) + " or rope_dim " + detail::num(rope_dim) +
                           " is out of range");
  const detail::RopeIn rope{k, v, static_cast<size_t>(ld_kv), inv_freq, static_cast<int>(rope_dim), neox};
  decode_rows("attn_decode_rope_rows", q, ld_q, cache, pos, seq, t, out, n_head, scale, ws, stream, rope);
}

}  // namespace tessera::cuda
