// Builders of the one-node graphs and the CPU runner (CpuBackend: the same planner, weight cache and executor a
// model uses; reference mode runs each step's scalar `_ref` twin).
#include "ops/op_case.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/cpu/backend.h"
#include "core/error.h"
#include "quant/half.h"
#include "quant/quant.h"

namespace tessera::ops_test {

using graph::Op;
using graph::Role;

const char* backend_name(Backend b) { return b == Backend::CPU ? "cpu" : "cuda"; }

uint32_t seed() {
  if (const char* s = std::getenv("TESSERA_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

double nmse(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(out[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return num / std::max(den, 1e-300);
}

namespace {

std::vector<float> uniform(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

// W [n, k] (or a 1-D [k]) in `dtype`: random values in [lo, hi] quantized to it.
int add_weight(OpGraph& og, std::mt19937& rng, const std::string& name, DType dtype, std::vector<int64_t> shape,
               float lo, float hi) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  const std::vector<float> x = uniform(rng, numel, lo, hi);
  auto bytes = std::make_shared<std::vector<uint8_t>>(*dtype_row_bytes(dtype, static_cast<uint64_t>(numel)));
  quantize_row(dtype, x.data(), bytes->data(), numel);
  og.weights.push_back(bytes);
  return og.g.add_weight(name, dtype, std::move(shape), bytes->data());
}

int add_f32_input(OpGraph& og, std::mt19937& rng, const std::string& name, std::vector<int64_t> shape, float lo,
                  float hi) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  og.inputs[name] = bytes_of(uniform(rng, numel, lo, hi));
  return og.g.add_input(name, DType::F32, std::move(shape));
}

namespace {

// A cache [n_kv, n_ctx, hd] whose positions [0, filled) hold random values (the rest zero, as a fresh cache).
int add_cache(OpGraph& og, std::mt19937& rng, const std::string& name, DType dtype, int64_t n_kv, int64_t n_ctx,
              int64_t hd, int64_t filled) {
  const int64_t n = n_kv * n_ctx * hd;
  std::vector<float> v(static_cast<size_t>(n), 0.0f);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t h = 0; h < n_kv; ++h)
    for (int64_t p = 0; p < filled; ++p)
      for (int64_t i = 0; i < hd; ++i) v[static_cast<size_t>((h * n_ctx + p) * hd + i)] = u(rng);
  std::vector<uint8_t> b(*dtype_row_bytes(dtype, static_cast<uint64_t>(n)));
  quantize_row(dtype, v.data(), b.data(), n);
  og.caches[name] = std::move(b);
  const int id = og.g.add_kv_cache(name, dtype, {n_kv, n_ctx, hd});
  // Backends bind caches by role and layer (one layer here): "cache_k" / "cache_v".
  og.g.set_io_role(id, name == "cache_k" ? graph::IoRole::CACHE_K : graph::IoRole::CACHE_V, 0);
  return id;
}

std::vector<float> inv_freq(int64_t rope_dim, double base) {
  std::vector<float> f(static_cast<size_t>(rope_dim / 2));
  for (int64_t i = 0; i < rope_dim / 2; ++i)
    f[static_cast<size_t>(i)] = static_cast<float>(std::pow(base, -2.0 * double(i) / double(rope_dim)));
  return f;
}

}  // namespace

OpGraph embed(std::mt19937& rng, DType table, int64_t n_vocab, int64_t d, int64_t t) {
  OpGraph og{graph::Graph(t, 0)};
  const int w = add_weight(og, rng, "table", table, {n_vocab, d}, -1.0f, 1.0f);
  std::vector<int32_t> ids(static_cast<size_t>(t));
  std::uniform_int_distribution<int32_t> u(0, static_cast<int32_t>(n_vocab - 1));
  for (int32_t& id : ids) id = u(rng);
  ids.back() = static_cast<int32_t>(n_vocab - 1);  // the last row: an off-by-one in the row stride reads past it
  og.inputs["tokens"] = bytes_of(ids);
  const int tok = og.g.add_input("tokens", DType::I32, {t});
  og.g.mark_output(og.g.add_node("embed", Op::EMBED, Role::TOKEN_EMBD, -1, "embd", {w, tok}));
  return og;
}

OpGraph rmsnorm(std::mt19937& rng, int64_t t, int64_t d) {
  OpGraph og{graph::Graph(t, 0)};
  const int x = add_f32_input(og, rng, "x", {t, d}, -3.0f, 3.0f);
  const int w = add_weight(og, rng, "w", DType::F32, {d}, 0.5f, 1.5f);
  graph::OpParams p;
  p.eps = 1e-5f;
  og.g.mark_output(og.g.add_node("norm", Op::RMSNORM, Role::ATTN_NORM, 0, "attn", {x, w}, p));
  return og;
}

OpGraph matmul(std::mt19937& rng, DType wt, int64_t t, int64_t n, int64_t k) {
  OpGraph og{graph::Graph(t, 0)};
  const int x = add_f32_input(og, rng, "x", {t, k}, -1.0f, 1.0f);
  const int w = add_weight(og, rng, "blk.0.w", wt, {n, k}, -1.0f, 1.0f);
  og.g.mark_output(og.g.add_node("matmul", Op::MATMUL, Role::ATTN_Q, 0, "attn", {x, w}));
  return og;
}

OpGraph matmul_sparse(std::mt19937& rng, DType wt, int64_t t, int64_t n, int64_t k, float sparsity) {
  OpGraph og{graph::Graph(t, 0)};
  const int x = add_f32_input(og, rng, "x", {t, k}, -1.0f, 1.0f);
  auto* xv = reinterpret_cast<float*>(og.inputs["x"].data());
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t i = 0; i < t * k; ++i)
    if (u(rng) < sparsity) xv[i] = 0.0f;
  const int w = add_weight(og, rng, "blk.0.w", wt, {n, k}, -1.0f, 1.0f);
  og.g.mark_output(og.g.add_node("matmul_sparse", Op::MATMUL_SPARSE, Role::ATTN_Q, 0, "attn", {x, w}));
  return og;
}

OpGraph rope(std::mt19937& rng, int64_t t, int64_t n_head, int64_t head_dim, int64_t rope_dim, bool neox,
             int64_t n_past) {
  OpGraph og{graph::Graph(t, n_past)};
  const int x = add_f32_input(og, rng, "x", {t, n_head * head_dim}, -2.0f, 2.0f);
  const int pos = og.g.add_input("positions", DType::I32, {t});  // CpuBackend::execute writes n_past + i
  std::vector<int32_t> p(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(n_past + i);
  og.inputs["positions"] = bytes_of(p);
  const int f = og.g.add_constant("inv_freq", inv_freq(rope_dim, 10000.0));
  og.n_past = n_past;
  graph::OpParams prm;
  prm.n_head = n_head;
  prm.head_dim = head_dim;
  prm.rope_dim = rope_dim;
  prm.rope_neox = neox;
  og.g.mark_output(og.g.add_node("rope", Op::ROPE, Role::ROPE_Q, 0, "attn", {x, pos, f}, prm));
  return og;
}

OpGraph kv_store(std::mt19937& rng, DType cache, int64_t t, int64_t n_kv, int64_t head_dim, int64_t n_ctx,
                 int64_t n_past) {
  OpGraph og{graph::Graph(t, n_past)};
  const int x = add_f32_input(og, rng, "x", {t, n_kv * head_dim}, -2.0f, 2.0f);
  const int c = add_cache(og, rng, "cache_v", cache, n_kv, n_ctx, head_dim, n_past);
  og.n_past = n_past;
  graph::OpParams p;
  p.n_head_kv = n_kv;
  p.head_dim = head_dim;
  og.g.mark_output(og.g.add_node("store", Op::KV_STORE, Role::CACHE_V, 0, "attn", {x, c}, p));
  return og;
}

OpGraph attention(std::mt19937& rng, DType cache, int64_t t, int64_t n_head, int64_t n_kv, int64_t head_dim,
                  int64_t n_ctx, int64_t n_past, int64_t window) {
  OpGraph og{graph::Graph(t, n_past)};
  const int q = add_f32_input(og, rng, "q", {t, n_head * head_dim}, -1.0f, 1.0f);
  // The chunk's own keys and values are in the cache already (KV_STORE ran before attention).
  const int k = add_cache(og, rng, "cache_k", cache, n_kv, n_ctx, head_dim, n_past + t);
  const int v = add_cache(og, rng, "cache_v", cache, n_kv, n_ctx, head_dim, n_past + t);
  og.n_past = n_past;
  graph::OpParams p;
  p.n_head = n_head;
  p.n_head_kv = n_kv;
  p.head_dim = head_dim;
  p.attn_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  p.window = window;
  og.g.mark_output(og.g.add_node("attn", Op::ATTENTION, Role::ATTN, 0, "attn", {q, k, v}, p));
  return og;
}

OpGraph add(std::mt19937& rng, int64_t t, int64_t d) {
  OpGraph og{graph::Graph(t, 0)};
  const int a = add_f32_input(og, rng, "a", {t, d}, -1.0f, 1.0f);
  const int b = add_f32_input(og, rng, "b", {t, d}, -1.0f, 1.0f);
  og.g.mark_output(og.g.add_node("add", Op::ADD, Role::ATTN_RESIDUAL, 0, "attn", {a, b}));
  return og;
}

OpGraph swiglu(std::mt19937& rng, int64_t t, int64_t f) {
  OpGraph og{graph::Graph(t, 0)};
  const int g = add_f32_input(og, rng, "gate", {t, f}, -6.0f, 6.0f);  // both tails of silu
  const int u = add_f32_input(og, rng, "up", {t, f}, -2.0f, 2.0f);
  og.g.mark_output(og.g.add_node("act", Op::SWIGLU, Role::FFN_ACT, 0, "ffn", {g, u}));
  return og;
}

OpGraph last_row(std::mt19937& rng, int64_t t, int64_t d) {
  OpGraph og{graph::Graph(t, 0)};
  const int x = add_f32_input(og, rng, "x", {t, d}, -1.0f, 1.0f);
  og.g.mark_output(og.g.add_node("last", Op::LAST_ROW, Role::LAST_TOKEN, -1, "output", {x}));
  return og;
}

OpGraph simple(std::mt19937& rng, graph::Op op, const std::vector<std::vector<int64_t>>& shapes,
               const graph::OpParams& params) {
  OpGraph og{graph::Graph(shapes.at(0).at(0), 0)};
  std::vector<int> ins;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string name = "x";  // (not "x" + to_string: GCC 12's -Wrestrict false positive)
    name += std::to_string(i);
    ins.push_back(add_f32_input(og, rng, name, shapes[i], -2.0f, 2.0f));
  }
  og.g.mark_output(og.g.add_node(std::string(graph::op_name(op)), op, Role::NONE, 0, "test", ins, params));
  return og;
}

Row simple_row(graph::Op op, std::vector<std::vector<int64_t>> shapes, graph::OpParams params, double max_nmse_cpu,
               double max_nmse_cuda) {
  std::string name(graph::op_name(op));
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& shape : shapes)
    for (size_t i = 0; i < shape.size(); ++i) {
      name += i ? 'x' : '_';
      name += std::to_string(shape[i]);
    }
  return {name, [=](std::mt19937& rng) { return simple(rng, op, shapes, params); }, max_nmse_cpu, max_nmse_cuda};
}

OpGraph mlgru(std::mt19937& rng, int64_t t, int64_t d, int64_t n_past) {
  OpGraph og{graph::Graph(t, n_past)};
  og.n_past = n_past;
  const int f = add_f32_input(og, rng, "f_raw", {t, d}, -3.0f, 3.0f);
  const int c = add_f32_input(og, rng, "c_raw", {t, d}, -3.0f, 3.0f);
  const int lb = add_weight(og, rng, "lower_bound", DType::F32, {d}, 0.0f, 0.9f);
  std::vector<float> state = uniform(rng, d, -1.0f, 1.0f);  // h_{P-1}, read since P > 0
  state.push_back(static_cast<float>(n_past));              // the tokens it has absorbed
  og.caches["state"] = bytes_of(state);
  const int st = og.g.add_kv_cache("state", DType::F32, {d + 1});
  og.g.set_io_role(st, graph::IoRole::STATE, 0);
  og.g.mark_output(og.g.add_node("mlgru", Op::MLGRU, Role::MLGRU, 0, "attn", {f, c, lb, st}));
  return og;
}

std::vector<float> run_cpu(const OpGraph& og, bool reference) {
  cpu::CpuBackend be({.n_threads = 2, .reference = reference, .teal_walk = true}, nullptr);  // TEAL's sparse kernels
  std::map<std::string, std::vector<uint8_t>> caches = og.caches;  // fresh storage per run
  std::vector<cpu::StateBinding> state;
  for (auto& [name, bytes] : caches) {  // bound by the role and layer the case gave each cache
    const graph::Tensor& t = og.g.tensor(og.g.find_tensor(name));
    state.push_back({t.io, t.io_layer, bytes.data()});
  }
  std::unique_ptr<cpu::Plan> plan = be.compile(og.g, state);
  for (const auto& [name, bytes] : og.inputs) std::memcpy(plan->input(name), bytes.data(), bytes.size());
  be.execute(*plan, og.n_past);
  const graph::Node& n = og.node();
  const graph::Tensor& out = og.g.tensor(n.output);
  if (n.op == Op::KV_STORE) {
    const std::vector<uint8_t>& c = caches.at(og.g.tensor(n.inputs[1]).name);
    std::vector<float> v(static_cast<size_t>(out.numel()));
    dequantize_row(out.dtype, c.data(), v.data(), out.numel());
    return v;
  }
  const float* y = plan->output(out.name);
  return std::vector<float>(y, y + out.numel());
}

}  // namespace tessera::ops_test
