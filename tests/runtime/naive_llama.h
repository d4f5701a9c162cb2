// A naive double-precision Llama forward pass written from the model's definition (no Tessera code), for the
// engine tests: logits of every token of a sequence, computed from scratch at positions 0..T-1.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace tessera::test {

struct NaiveSpec {
  int64_t n_layers = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
  double eps = 1e-5;
  bool neox = false;  // rotate (i, i + R/2) as Hugging Face does; else adjacent pairs (2i, 2i+1) as GGUF does
  bool tied = false;
  std::vector<double> inv_freq;  // [rope_dim / 2], scaling already applied
};

// Weights by GGUF-style name ("blk.0.attn_q.weight"), as f32 row-major [out, in].
using WeightFn = std::function<const std::vector<float>&(const std::string&)>;

using Vec = std::vector<double>;

// y[n] = W[n, k] · x[k]
inline Vec linear(const std::vector<float>& w, const Vec& x, size_t n) {
  Vec y(n, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < x.size(); ++j) y[i] += double(w[i * x.size() + j]) * x[j];
  return y;
}

inline Vec rmsnorm(const Vec& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
  return y;
}

inline void rope(Vec& x, size_t n_heads, const NaiveSpec& c, int64_t pos) {
  const size_t d = size_t(c.head_dim), half = c.inv_freq.size();
  for (size_t h = 0; h < n_heads; ++h)
    for (size_t i = 0; i < half; ++i) {
      const double theta = double(pos) * c.inv_freq[i];
      const size_t a = h * d + (c.neox ? i : 2 * i), b = h * d + (c.neox ? i + half : 2 * i + 1);
      const double x0 = x[a], x1 = x[b];
      x[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      x[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
}

// Logits [T][V] of every token of `ids`, from scratch.
inline std::vector<Vec> naive_forward(const NaiveSpec& c, const WeightFn& w, const std::vector<int32_t>& ids) {
  const size_t E = size_t(c.n_embd), H = size_t(c.n_head), Hkv = size_t(c.n_head_kv), D = size_t(c.head_dim);
  const size_t T = ids.size();
  std::vector<Vec> x(T, Vec(E));
  const auto& emb = w("token_embd.weight");
  for (size_t t = 0; t < T; ++t)
    for (size_t i = 0; i < E; ++i) x[t][i] = emb[size_t(ids[t]) * E + i];
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<Vec> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      const Vec h = rmsnorm(x[t], w(p + "attn_norm.weight"), c.eps);
      q[t] = linear(w(p + "attn_q.weight"), h, H * D);
      k[t] = linear(w(p + "attn_k.weight"), h, Hkv * D);
      v[t] = linear(w(p + "attn_v.weight"), h, Hkv * D);
      rope(q[t], H, c, int64_t(t));
      rope(k[t], Hkv, c, int64_t(t));
    }
    for (size_t t = 0; t < T; ++t) {
      Vec att(H * D, 0.0);
      for (size_t h = 0; h < H; ++h) {
        const size_t g = h / (H / Hkv);
        Vec s(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (size_t i = 0; i < D; ++i) dot += q[t][h * D + i] * k[j][g * D + i];
          s[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += e = std::exp(e - mx);
        for (size_t j = 0; j <= t; ++j)
          for (size_t i = 0; i < D; ++i) att[h * D + i] += s[j] / sum * v[j][g * D + i];
      }
      const Vec o = linear(w(p + "attn_output.weight"), att, E);
      for (size_t i = 0; i < E; ++i) x[t][i] += o[i];
      const Vec h = rmsnorm(x[t], w(p + "ffn_norm.weight"), c.eps);
      const Vec gate = linear(w(p + "ffn_gate.weight"), h, size_t(c.n_ff));
      const Vec up = linear(w(p + "ffn_up.weight"), h, size_t(c.n_ff));
      Vec act(gate.size());
      for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      const Vec d = linear(w(p + "ffn_down.weight"), act, E);
      for (size_t i = 0; i < E; ++i) x[t][i] += d[i];
    }
  }
  std::vector<Vec> logits(T);
  const auto& out = c.tied ? emb : w("output.weight");
  for (size_t t = 0; t < T; ++t)
    logits[t] = linear(out, rmsnorm(x[t], w("output_norm.weight"), c.eps), size_t(c.n_vocab));
  return logits;
}


}  // namespace tessera::test
