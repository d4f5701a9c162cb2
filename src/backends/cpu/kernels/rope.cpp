// Rotary position embedding. cos/sin are computed once per token and shared by all heads; the angle is formed in
// double because pos * inv_freq reaches thousands of radians, where a float angle is off by ~1e-3.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"

namespace tessera::cpu {
namespace {

void check_rope(const float* x, int64_t t, int64_t n_heads, int64_t head_dim, int64_t rope_dim, const int32_t* pos,
                const float* inv_freq) {
  TESSERA_CHECK(x != nullptr && pos != nullptr && inv_freq != nullptr, "rope: null argument");
  TESSERA_CHECK(t >= 0 && n_heads > 0 && head_dim > 0, "rope: bad shape [{}, {}, {}]", t, n_heads, head_dim);
  TESSERA_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim,
                "rope: rotated dimension {} must be even and within the head dimension {}", rope_dim, head_dim);
}

template <bool kNeox, typename Real>
void rotate_head(float* h, int64_t half, const Real* c, const Real* s) {
  for (int64_t i = 0; i < half; ++i) {
    const int64_t i0 = kNeox ? i : 2 * i;
    const int64_t i1 = kNeox ? i + half : 2 * i + 1;
    const Real x0 = h[i0], x1 = h[i1];
    h[i0] = static_cast<float>(x0 * c[i] - x1 * s[i]);
    h[i1] = static_cast<float>(x0 * s[i] + x1 * c[i]);
  }
}

// The cos/sin rows of the last calls, per frequency set: every layer rotates q and k at the same positions with one
// or two frequency sets (Gemma 3: local and global bases), so after the first layer a prefill chunk's table is reused,
// not recomputed (512 tokens x 128 double sin/cos per call took ~6% of Gemma 3 270M's prefill, on one thread).
// A hit needs the same positions and frequencies by value, so a reused pointer cannot serve stale angles.
struct RopeTable {
  std::vector<float> inv_freq;  // [half]
  std::vector<int32_t> pos;     // [t]
  std::vector<float> cs;        // [t, 2 * half]: cos, then sin
};

const float* rope_table(int64_t t, int64_t half, const int32_t* pos, const float* inv_freq) {
  constexpr int kSlots = 2;
  thread_local RopeTable slots[kSlots];
  thread_local int victim = 0;
  for (RopeTable& r : slots) {
    if (static_cast<int64_t>(r.pos.size()) == t && static_cast<int64_t>(r.inv_freq.size()) == half &&
        std::equal(r.pos.begin(), r.pos.end(), pos) && std::equal(r.inv_freq.begin(), r.inv_freq.end(), inv_freq))
      return r.cs.data();
  }
  RopeTable& r = slots[victim];
  victim = (victim + 1) % kSlots;
  r.inv_freq.assign(inv_freq, inv_freq + half);
  r.pos.assign(pos, pos + t);
  r.cs.resize(static_cast<size_t>(t * 2 * half));
  for (int64_t tok = 0; tok < t; ++tok) {
    float* c = r.cs.data() + tok * 2 * half;
    for (int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<double>(pos[tok]) * static_cast<double>(inv_freq[i]);
      c[i] = static_cast<float>(std::cos(theta));
      c[half + i] = static_cast<float>(std::sin(theta));
    }
  }
  return r.cs.data();
}

}  // namespace

void rope_ref(float* x, int64_t t, int64_t n_heads, int64_t head_dim, int64_t rope_dim, const int32_t* pos,
              const float* inv_freq, bool neox) {
  check_rope(x, t, n_heads, head_dim, rope_dim, pos, inv_freq);
  const int64_t half = rope_dim / 2;
  std::vector<double> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t tok = 0; tok < t; ++tok) {
    for (int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<double>(pos[tok]) * static_cast<double>(inv_freq[i]);
      c[static_cast<size_t>(i)] = std::cos(theta);
      s[static_cast<size_t>(i)] = std::sin(theta);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (tok * n_heads + h) * head_dim;
      if (neox) {
        rotate_head<true>(v, half, c.data(), s.data());
      } else {
        rotate_head<false>(v, half, c.data(), s.data());
      }
    }
  }
}

void rope(float* x, int64_t t, int64_t n_heads, int64_t head_dim, int64_t rope_dim, const int32_t* pos,
          const float* inv_freq, bool neox) {
  check_rope(x, t, n_heads, head_dim, rope_dim, pos, inv_freq);
  const int64_t half = rope_dim / 2;
  const float* table = rope_table(t, half, pos, inv_freq);
  for (int64_t tok = 0; tok < t; ++tok) {
    const float* c = table + tok * 2 * half;
    const float* s = c + half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (tok * n_heads + h) * head_dim;
      if (neox) {
        rotate_head<true>(v, half, c, s);
      } else {
        rotate_head<false>(v, half, c, s);
      }
    }
  }
}

}  // namespace tessera::cpu
