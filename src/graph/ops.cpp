// The op table: one row per graph op (name, class, traits, input count) and its shape check and cost model (output
// shape and dtype, FLOPs, bytes). Everything that asks what an op is reads this table, so adding an op is a value in
// graph.h's `Op` plus a row here (docs/ARCHITECTURE.md, "Recipes").
#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/error.h"
#include "graph/graph.h"

namespace tessera::graph {

namespace {

uint64_t u(int64_t v) { return static_cast<uint64_t>(v); }

// Number of (query, key) pairs causal attention scores for T tokens after P cached ones: sum over t of (P + t + 1).
uint64_t causal_pairs(int64_t t, int64_t p) { return u(t) * u(p) + u(t) * u(t + 1) / 2; }

constexpr uint64_t kF32 = 4;

// Checks the shape functions share, each failing with one sentence that names the node.
struct Check {
  const Graph& g;
  const Node& n;
  const Tensor& in(size_t i) const { return g.tensor(n.inputs.at(i)); }
  void is_2d(const Tensor& t) const {
    TESSERA_CHECK(t.shape.size() == 2, "graph: node '{}': input '{}' must be 2-D, is {}", n.name, t.name,
                  shape_string(t.shape));
  }
  void is_f32(const Tensor& t) const {
    TESSERA_CHECK(t.dtype == DType::F32, "graph: node '{}': input '{}' must be f32, is {}", n.name, t.name,
                  dtype_name(t.dtype));
  }
};

void infer_embed(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& table = c.in(0);
  const Tensor& ids = c.in(1);
  c.is_2d(table);
  TESSERA_CHECK(ids.shape.size() == 1 && ids.dtype == DType::I32, "graph: node '{}': ids must be i32 [T]", n.name);
  const int64_t t = ids.shape[0], e = table.shape[1];
  out.shape = {t, e};
  n.flops = 0;  // a row lookup (dequantization is conversion, not arithmetic on activations)
  n.bytes = u(t) * (table.nbytes() / u(std::max<int64_t>(table.shape[0], 1))) + u(t) * 4 + u(t * e) * kF32;
}

void infer_rmsnorm(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  const Tensor& w = c.in(1);
  c.is_2d(x);
  c.is_f32(x);
  c.is_f32(w);
  TESSERA_CHECK(w.shape.size() == 1 && w.shape[0] == x.shape[1], "graph: node '{}': norm weight {} does not match {}",
                n.name, shape_string(w.shape), shape_string(x.shape));
  out.shape = x.shape;
  // Per element: square, accumulate, scale, multiply by the weight.
  n.flops = 4 * u(x.numel());
  n.bytes = 2 * x.nbytes() + w.nbytes();
}

void infer_matmul(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  const Tensor& w = c.in(1);
  c.is_2d(x);
  c.is_2d(w);
  c.is_f32(x);
  TESSERA_CHECK(w.shape[1] == x.shape[1], "graph: node '{}': x {} and W {} disagree on K", n.name,
                shape_string(x.shape), shape_string(w.shape));
  const int64_t t = x.shape[0], k = x.shape[1], nn = w.shape[0];
  out.shape = {t, nn};
  n.flops = 2 * u(t) * u(nn) * u(k);
  n.bytes = w.nbytes() + x.nbytes() + u(t * nn) * kF32;
}

void infer_rope(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const OpParams& p = n.params;
  const Tensor& x = c.in(0);
  c.is_2d(x);
  c.is_f32(x);
  TESSERA_CHECK(p.n_head > 0 && p.head_dim > 0 && x.shape[1] == p.n_head * p.head_dim,
                "graph: node '{}': {} heads of {} do not fill {}", n.name, p.n_head, p.head_dim, shape_string(x.shape));
  TESSERA_CHECK(p.rope_dim > 0 && p.rope_dim % 2 == 0 && p.rope_dim <= p.head_dim,
                "graph: node '{}': rope dims {} must be even and at most the head size {}", n.name, p.rope_dim,
                p.head_dim);
  TESSERA_CHECK(c.in(1).shape == std::vector<int64_t>{x.shape[0]}, "graph: node '{}': positions must be [T]", n.name);
  TESSERA_CHECK(c.in(2).numel() == p.rope_dim / 2, "graph: node '{}': inv_freq must hold {} values", n.name,
                p.rope_dim / 2);
  out.shape = x.shape;
  // Per rotated pair: 4 multiplies and 2 adds (sin/cos per pair and token are shared across heads).
  n.flops = 3 * u(x.shape[0]) * u(p.n_head) * u(p.rope_dim);
  n.bytes = 2 * x.nbytes() + c.in(1).nbytes() + c.in(2).nbytes();
}

void infer_kv_store(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  const Tensor& cache = c.in(1);
  c.is_2d(x);
  TESSERA_CHECK(cache.kind == TensorKind::KV_CACHE || cache.alias >= 0, "graph: node '{}': '{}' is not a kv cache",
                n.name, cache.name);
  TESSERA_CHECK(cache.shape.size() == 3 && x.shape[1] == cache.shape[0] * cache.shape[2],
                "graph: node '{}': x {} does not match cache {}", n.name, shape_string(x.shape),
                shape_string(cache.shape));
  TESSERA_CHECK(g.n_past() + x.shape[0] <= cache.shape[1], "graph: node '{}': positions {}..{} exceed the cache of {}",
                n.name, g.n_past(), g.n_past() + x.shape[0], cache.shape[1]);
  out.shape = cache.shape;
  out.dtype = cache.dtype;
  out.alias = cache.alias >= 0 ? cache.alias : n.inputs[1];  // the updated cache is the cache's storage
  n.flops = 0;
  const uint64_t elem = dtype_info(cache.dtype).type_size;
  n.bytes = x.nbytes() + u(x.numel()) * elem;
}

void infer_attention(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const OpParams& p = n.params;
  const Tensor& q = c.in(0);
  const Tensor& k = c.in(1);
  const Tensor& v = c.in(2);
  c.is_2d(q);
  c.is_f32(q);
  TESSERA_CHECK(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0,
                "graph: node '{}': {} query heads are not a multiple of {} kv heads", n.name, p.n_head, p.n_head_kv);
  TESSERA_CHECK(q.shape[1] == p.n_head * p.head_dim, "graph: node '{}': q {} is not {} heads of {}", n.name,
                shape_string(q.shape), p.n_head, p.head_dim);
  for (const Tensor* cache : {&k, &v})
    TESSERA_CHECK(
        cache->shape == std::vector<int64_t>({p.n_head_kv, cache->shape.size() == 3 ? cache->shape[1] : 0, p.head_dim}),
        "graph: node '{}': cache '{}' {} is not [{}, C, {}]", n.name, cache->name, shape_string(cache->shape),
        p.n_head_kv, p.head_dim);
  TESSERA_CHECK(p.window >= 0, "graph: node '{}': sliding window {} is negative", n.name, p.window);
  const int64_t t = q.shape[0];
  out.shape = q.shape;
  uint64_t pairs = causal_pairs(t, g.n_past());
  int64_t keys_read = g.n_past() + t;
  if (p.window > 0) {  // token i sees min(P + i + 1, window) keys; the chunk reads keys from P - window + 1 on
    pairs = 0;
    for (int64_t i = 0; i < t; ++i) pairs += u(std::min(g.n_past() + i + 1, p.window));
    keys_read = std::min(keys_read, t - 1 + p.window);
  }
  // Per (query, key) pair and head: q·k (2D), p·v (2D), and about 5 for scale, max, exp and sum.
  n.flops = u(p.n_head) * pairs * (4 * u(p.head_dim) + 5);
  // Each kv head's keys and values for positions [0, P+T) are read once (its query heads share them).
  const uint64_t elem = dtype_info(k.dtype).type_size;
  n.bytes = 2 * q.nbytes() + 2 * u(p.n_head_kv) * u(keys_read) * u(p.head_dim) * elem;
}

void infer_add(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& a = c.in(0);
  const Tensor& b = c.in(1);
  c.is_f32(a);
  c.is_f32(b);
  TESSERA_CHECK(a.shape == b.shape, "graph: node '{}': {} + {} shapes differ", n.name, shape_string(a.shape),
                shape_string(b.shape));
  out.shape = a.shape;
  n.flops = u(a.numel());
  n.bytes = 3 * a.nbytes();
}

void infer_gated(const Graph& g, Node& n, Tensor& out, uint64_t flops_per_element);

// silu(g) = g / (1 + exp(-g)): negate, exp, add, divide; then the multiply by up.
void infer_swiglu(const Graph& g, Node& n, Tensor& out) { infer_gated(g, n, out, 5); }

void infer_last_row(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  c.is_2d(x);
  TESSERA_CHECK(x.shape[0] > 0, "graph: node '{}': no rows to take", n.name);
  out.shape = {1, x.shape[1]};
  out.dtype = x.dtype;
  n.flops = 0;
  n.bytes = 2 * u(x.shape[1]) * dtype_info(x.dtype).type_size;
}

// The gated activations (SWIGLU, GEGLU) share their shape check.
void infer_gated(const Graph& g, Node& n, Tensor& out, uint64_t flops_per_element) {
  const Check c{g, n};
  const Tensor& gate = c.in(0);
  const Tensor& up = c.in(1);
  c.is_f32(gate);
  c.is_f32(up);
  TESSERA_CHECK(gate.shape == up.shape, "graph: node '{}': gate {} and up {} shapes differ", n.name,
                shape_string(gate.shape), shape_string(up.shape));
  out.shape = gate.shape;
  n.flops = flops_per_element * u(gate.numel());
  n.bytes = 3 * gate.nbytes();
}

// gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))): about 9 operations with the tanh, then the multiply.
void infer_geglu(const Graph& g, Node& n, Tensor& out) { infer_gated(g, n, out, 10); }

void infer_head_rmsnorm(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  const Tensor& w = c.in(1);
  c.is_2d(x);
  c.is_f32(x);
  c.is_f32(w);
  const int64_t d = n.params.head_dim;
  TESSERA_CHECK(d > 0 && x.shape[1] % d == 0, "graph: node '{}': heads of {} do not fill {}", n.name, d,
                shape_string(x.shape));
  TESSERA_CHECK(w.shape == std::vector<int64_t>{d}, "graph: node '{}': norm weight {} is not [{}]", n.name,
                shape_string(w.shape), d);
  TESSERA_CHECK(n.params.eps > 0, "graph: node '{}': epsilon {} must be positive", n.name, n.params.eps);
  out.shape = x.shape;
  n.flops = 4 * u(x.numel());  // as RMSNORM: square, accumulate, scale, weight
  n.bytes = 2 * x.nbytes() + w.nbytes();
}

void infer_bias_add(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  const Tensor& b = c.in(1);
  c.is_2d(x);
  c.is_f32(x);
  c.is_f32(b);
  TESSERA_CHECK(b.shape == std::vector<int64_t>{x.shape[1]}, "graph: node '{}': bias {} does not match {}", n.name,
                shape_string(b.shape), shape_string(x.shape));
  out.shape = x.shape;
  n.flops = u(x.numel());
  n.bytes = 2 * x.nbytes() + b.nbytes();
}

void infer_softcap(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  c.is_f32(x);
  TESSERA_CHECK(std::isfinite(n.params.scale) && n.params.scale > 0, "graph: node '{}': cap {} must be positive",
                n.name, n.params.scale);
  out.shape = x.shape;
  n.flops = 3 * u(x.numel());  // divide, tanh (counted as one), multiply
  n.bytes = 2 * x.nbytes();
}

void infer_scale(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  c.is_f32(x);
  out.shape = x.shape;
  n.flops = u(x.numel());  // one multiply per element
  n.bytes = 2 * x.nbytes();
}

void infer_sparsify(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  c.is_2d(x);
  c.is_f32(x);
  const OpParams& p = n.params;
  TESSERA_CHECK(p.sparse_threshold >= 0 || (p.sparsity >= 0 && p.sparsity < 1),
                "graph: node '{}': sparsity {} must be in [0, 1) when no threshold is given", n.name, p.sparsity);
  out.shape = x.shape;
  n.flops = 2 * u(x.numel());  // a magnitude and a compare per element (top-k selection is linear on average)
  n.bytes = 2 * x.nbytes();
}

void infer_act_quant_i8(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& x = c.in(0);
  c.is_2d(x);
  c.is_f32(x);
  out.shape = x.shape;
  n.flops = 4 * u(x.numel());  // |x| and max, then multiply, round and divide (the clamp is not arithmetic)
  n.bytes = 2 * x.nbytes();
}

// max(g, 0)^2 * up: a compare, two multiplies.
void infer_relu2_glu(const Graph& g, Node& n, Tensor& out) { infer_gated(g, n, out, 3); }

void infer_mlgru(const Graph& g, Node& n, Tensor& out) {
  const Check c{g, n};
  const Tensor& f = c.in(0);
  const Tensor& cand = c.in(1);
  const Tensor& lb = c.in(2);
  const Tensor& state = c.in(3);
  c.is_2d(f);
  c.is_f32(f);
  c.is_f32(cand);
  c.is_f32(lb);
  TESSERA_CHECK(f.shape == cand.shape, "graph: node '{}': forget gate {} and candidate {} shapes differ", n.name,
                shape_string(f.shape), shape_string(cand.shape));
  const int64_t d = f.shape[1];
  TESSERA_CHECK(lb.shape == std::vector<int64_t>{d}, "graph: node '{}': lower bound {} is not [{}]", n.name,
                shape_string(lb.shape), d);
  TESSERA_CHECK(state.kind == TensorKind::KV_CACHE && state.io == IoRole::STATE && state.dtype == DType::F32 &&
                    state.shape == std::vector<int64_t>{d + 1},
                "graph: node '{}': '{}' is not an f32 recurrent state [{}]", n.name, state.name, d + 1);
  out.shape = f.shape;
  // Per element: sigmoid (4) and the lower bound (3), silu (4), the recurrence (4).
  n.flops = 15 * u(f.numel());
  n.bytes = 3 * f.nbytes() + lb.nbytes() + 2 * state.nbytes();
}

// One row per op, in the enum's order (checked below, so a missing or misplaced row fails the build).
constexpr OpInfo kOps[] = {
    // op, name, class, inputs, traits, shape check and cost
    {Op::EMBED, "embed", "embedding", 2, {}, infer_embed},
    {Op::RMSNORM, "rmsnorm", "norm", 2, {.write_over = 0b01}, infer_rmsnorm},
    {Op::MATMUL, "matmul", "matmul", 2, {.matmul_like = true}, infer_matmul},
    {Op::ROPE, "rope", "rope", 3, {.write_over = 0b01}, infer_rope},
    {Op::KV_STORE, "kv_store", "kv_cache", 2, {.view_of = 1}, infer_kv_store},
    {Op::ATTENTION, "attention", "attention", 3, {}, infer_attention},
    {Op::ADD, "add", "elementwise", 2, {.write_over = 0b11}, infer_add},
    {Op::SWIGLU, "swiglu", "elementwise", 2, {.write_over = 0b11}, infer_swiglu},
    {Op::LAST_ROW, "last_row", "copy", 1, {}, infer_last_row},
    {Op::GEGLU, "geglu", "elementwise", 2, {.write_over = 0b11}, infer_geglu},
    {Op::HEAD_RMSNORM, "head_rmsnorm", "norm", 2, {.write_over = 0b01}, infer_head_rmsnorm},
    {Op::BIAS_ADD, "bias_add", "elementwise", 2, {.write_over = 0b01}, infer_bias_add},
    {Op::SOFTCAP, "softcap", "elementwise", 1, {.write_over = 0b01}, infer_softcap},
    {Op::SLICE, "slice", "copy", 1, {.view_of = 0, .pass_only = true}, nullptr},
    {Op::SCALE, "scale", "elementwise", 1, {.write_over = 0b01}, infer_scale},
    {Op::SPARSIFY, "sparsify", "elementwise", 1, {.write_over = 0b01}, infer_sparsify},
    {Op::MATMUL_SPARSE, "matmul_sparse", "matmul", 2, {.matmul_like = true}, infer_matmul},
    {Op::ACT_QUANT_I8, "act_quant_i8", "elementwise", 1, {.write_over = 0b01}, infer_act_quant_i8},
    {Op::RELU2_GLU, "relu2_glu", "elementwise", 2, {.write_over = 0b11}, infer_relu2_glu},
    {Op::MLGRU, "mlgru", "recurrence", 4, {}, infer_mlgru},
};

constexpr bool rows_follow_the_enum() {
  for (size_t i = 0; i < std::size(kOps); ++i)
    if (kOps[i].op != static_cast<Op>(i)) return false;
  return true;
}
static_assert(std::size(kOps) == static_cast<size_t>(Op::COUNT), "every op in graph.h needs its row in kOps");
static_assert(rows_follow_the_enum(), "kOps rows must follow the order of graph.h's Op");

}  // namespace

const OpInfo& op_info(Op op) {
  const auto i = static_cast<size_t>(op);
  TESSERA_CHECK(i < std::size(kOps), "graph: {} is not an op", i);
  return kOps[i];
}

std::string_view op_name(Op op) { return static_cast<size_t>(op) < std::size(kOps) ? op_info(op).name : "?"; }
std::string_view op_class(Op op) { return static_cast<size_t>(op) < std::size(kOps) ? op_info(op).op_class : "?"; }
bool is_matmul_like(Op op) { return op_info(op).traits.matmul_like; }
bool may_write_over_input(Op op, size_t i) { return i < 8 && ((op_info(op).traits.write_over >> i) & 1u) != 0; }
bool is_view(Op op) { return op_info(op).traits.view_of >= 0; }

}  // namespace tessera::graph
