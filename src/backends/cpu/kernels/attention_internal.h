// Internal to attention: the blocked kernel's arguments (plain pointers, so the AVX2 file needs no other header).
#pragma once

#include <cstdint>

namespace tessera::cpu::detail {

// Query tokens per task and keys per block of the blocked kernel. 8 queries share each K/V block conversion; 64 keys
// keep the block's f32 K and V (2 x 64 x hd floats) in L1 for hd <= 64 and in L2 beyond.
constexpr int kAttnQueries = 8;
constexpr int kAttnKeys = 64;

struct AttnArgs {
  const float* q;  // [t, n_head, hd]
  float* out;      // [t, n_head, hd]
  const void* k;   // element (pos, kv head, i) at k[pos * k_pos_stride + head * k_head_stride + i]
  const void* v;
  bool k_f16, v_f16;  // else f32
  int64_t k_pos_stride, k_head_stride, v_pos_stride, v_head_stride;
  int64_t t, n_head, group, hd, pos0;  // group = n_head / n_head_kv
  float scale;
  int64_t window;  // > 0: query at position p sees keys (p - window, p] only
};

// The first key position the query at position `pos` sees.
inline int64_t attn_first_key(const AttnArgs& a, int64_t pos) {
  return a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
}

// Floats of per-thread scratch attention_task_avx2 needs.
inline int64_t attention_scratch_floats(int64_t hd) {
  return 2 * int64_t{kAttnKeys} * hd + int64_t{kAttnQueries} * kAttnKeys + int64_t{kAttnQueries} * hd;
}

// Query head h, tokens [i0, i1) (i1 - i0 <= kAttnQueries). Needs hd % 8 == 0.
void attention_task_avx2(const AttnArgs& a, int64_t h, int64_t i0, int64_t i1, float* scratch);

// Prefill at large head sizes (hd >= kGroupedMinHd, hd % 16 == 0): one task per (block of kAttnQueries tokens, kv
// head) runs all the group's query heads, so each K/V block is converted once for up to kAttnQueries x group query
// rows, and the products are register tiles (kAttnRowTile rows x 16 keys for the scores, x 16 columns for P V), each
// K / V load serving kAttnRowTile rows, not one dot product per query row and key as attention_task_avx2 does (at hd
// 256 a block's K and V no longer fit L1, and that kernel re-read them from L2 once per query: ~10 GFLOP/s on Gemma 3).
constexpr int64_t kGroupedMinHd = 128;
constexpr int kAttnRowTile = 4;

inline int64_t attention_grouped_rows(int64_t group) {
  return (int64_t{kAttnQueries} * group + kAttnRowTile - 1) / kAttnRowTile * kAttnRowTile;
}
// Floats of per-thread scratch attention_task_grouped_avx2 needs.
inline int64_t attention_grouped_scratch_floats(int64_t hd, int64_t group) {
  const int64_t rows = attention_grouped_rows(group);
  return 2 * int64_t{kAttnKeys} * hd + rows * kAttnKeys + 2 * rows * hd + 3 * rows;
}
// Kv head kvh's query heads, tokens [i0, i1) (i1 - i0 <= kAttnQueries).
void attention_task_grouped_avx2(const AttnArgs& a, int64_t kvh, int64_t i0, int64_t i1, float* scratch);

// Decode (t == 1), split over keys (flash-decoding): the group of query heads that share kv head kvh, against keys
// [p0, p1), reading the cache in place. Writes per query head g of the group part[g * (hd + 2) + ...] = the running
// max m, the sum l and the unnormalized output row o[hd]; the caller merges the key chunks. Needs hd % 8 == 0.
void attention_decode_chunk_avx2(const AttnArgs& a, int64_t kvh, int64_t p0, int64_t p1, float* part);

}  // namespace tessera::cpu::detail
