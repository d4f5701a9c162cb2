// Graph construction, shape checks and the cost model (FLOPs and bytes per node).
#include "graph/graph.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace tessera::graph {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::EMBED: return "embed";
    case Op::RMSNORM: return "rmsnorm";
    case Op::MATMUL: return "matmul";
    case Op::ROPE: return "rope";
    case Op::KV_STORE: return "kv_store";
    case Op::ATTENTION: return "attention";
    case Op::ADD: return "add";
    case Op::SWIGLU: return "swiglu";
    case Op::LAST_ROW: return "last_row";
    case Op::SLICE: return "slice";
  }
  return "?";
}

bool is_matmul_like(Op op) { return op == Op::MATMUL; }

bool may_write_over_input(Op op, size_t i) {
  switch (op) {
    case Op::ROPE:
    case Op::RMSNORM: return i == 0;
    case Op::ADD:
    case Op::SWIGLU: return i < 2;
    default: return false;
  }
}

bool is_view(Op op) { return op == Op::KV_STORE || op == Op::SLICE; }

std::string_view op_class(Op op) {
  switch (op) {
    case Op::EMBED: return "embedding";
    case Op::RMSNORM: return "norm";
    case Op::MATMUL: return "matmul";
    case Op::ROPE: return "rope";
    case Op::KV_STORE: return "kv_cache";
    case Op::ATTENTION: return "attention";
    case Op::ADD:
    case Op::SWIGLU: return "elementwise";
    case Op::LAST_ROW:
    case Op::SLICE: return "copy";
  }
  return "?";
}

std::string_view tensor_kind_name(TensorKind k) {
  switch (k) {
    case TensorKind::INPUT: return "input";
    case TensorKind::WEIGHT: return "weight";
    case TensorKind::KV_CACHE: return "kv_cache";
    case TensorKind::ACTIVATION: return "activation";
  }
  return "?";
}

std::string_view io_role_name(IoRole r) {
  switch (r) {
    case IoRole::NONE: return "";
    case IoRole::TOKENS: return "tokens";
    case IoRole::POSITIONS: return "positions";
    case IoRole::LOGITS: return "logits";
    case IoRole::CACHE_K: return "cache_k";
    case IoRole::CACHE_V: return "cache_v";
  }
  return "?";
}

std::string_view role_name(Role r) {
  switch (r) {
    case Role::NONE: return "";
    case Role::TOKEN_EMBD: return "token_embd";
    case Role::ATTN_NORM: return "attn_norm";
    case Role::ATTN_Q: return "attn_q";
    case Role::ATTN_K: return "attn_k";
    case Role::ATTN_V: return "attn_v";
    case Role::ROPE_Q: return "rope_q";
    case Role::ROPE_K: return "rope_k";
    case Role::CACHE_K: return "cache_k";
    case Role::CACHE_V: return "cache_v";
    case Role::ATTN: return "attn";
    case Role::ATTN_O: return "attn_o";
    case Role::ATTN_RESIDUAL: return "attn_residual";
    case Role::FFN_NORM: return "ffn_norm";
    case Role::FFN_GATE: return "ffn_gate";
    case Role::FFN_UP: return "ffn_up";
    case Role::FFN_ACT: return "ffn_act";
    case Role::FFN_DOWN: return "ffn_down";
    case Role::FFN_RESIDUAL: return "ffn_residual";
    case Role::LAST_TOKEN: return "last_token";
    case Role::OUTPUT_NORM: return "output_norm";
    case Role::OUTPUT: return "output";
  }
  return "?";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t Tensor::nbytes() const {
  if (shape.empty()) return dtype_info(dtype).type_size;
  const int64_t inner = shape.back();
  const auto row = dtype_row_bytes(dtype, static_cast<uint64_t>(inner));
  if (!row) return 0;
  return *row * static_cast<uint64_t>(numel() / std::max<int64_t>(inner, 1));
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += i ? ", " : "";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int Graph::add_tensor(Tensor t) {
  TESSERA_CHECK(!tensor_index_.contains(t.name), "graph: tensor '{}' is defined twice", t.name);
  for (int64_t d : t.shape) TESSERA_CHECK(d >= 0, "graph: tensor '{}' has a negative dimension", t.name);
  const int id = static_cast<int>(tensors_.size());
  tensor_index_.emplace(t.name, id);
  tensors_.push_back(std::move(t));
  return id;
}

int Graph::add_input(std::string name, DType dtype, std::vector<int64_t> shape) {
  return add_tensor(Tensor{std::move(name), TensorKind::INPUT, dtype, std::move(shape)});
}

int Graph::add_weight(std::string name, DType dtype, std::vector<int64_t> shape, const void* data) {
  Tensor t{std::move(name), TensorKind::WEIGHT, dtype, std::move(shape)};
  t.data = data;
  return add_tensor(std::move(t));
}

int Graph::add_constant(std::string name, std::vector<float> values) {
  auto store = std::make_shared<std::vector<float>>(std::move(values));
  constants_.push_back(store);
  const int64_t n = static_cast<int64_t>(store->size());
  return add_weight(std::move(name), DType::F32, {n}, store->data());
}

int Graph::add_kv_cache(std::string name, DType dtype, std::vector<int64_t> shape) {
  TESSERA_CHECK(dtype == DType::F32 || dtype == DType::F16, "graph: kv cache '{}' must be f32 or f16", name);
  return add_tensor(Tensor{std::move(name), TensorKind::KV_CACHE, dtype, std::move(shape)});
}

int Graph::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? -1 : it->second;
}

int Graph::find_node(std::string_view name) const {
  auto it = node_index_.find(std::string(name));
  return it == node_index_.end() ? -1 : it->second;
}

void Graph::set_io_role(int tensor, IoRole role, int layer) {
  TESSERA_CHECK(tensor >= 0 && static_cast<size_t>(tensor) < tensors_.size(), "graph: no tensor {} to give a role",
                tensor);
  const int held = role == IoRole::NONE ? -1 : find_role(role, layer);
  TESSERA_CHECK(held < 0 || held == tensor, "graph: role {} (layer {}) is already held by '{}'", io_role_name(role),
                layer, tensors_[static_cast<size_t>(held)].name);
  Tensor& t = tensors_[static_cast<size_t>(tensor)];
  t.io = role;
  t.io_layer = layer;
}

int Graph::find_role(IoRole role, int layer) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].io == role && tensors_[i].io_layer == layer) return static_cast<int>(i);
  return -1;
}

int Graph::require_role(IoRole role, int layer) const {
  const int id = find_role(role, layer);
  if (layer >= 0)
    TESSERA_CHECK(id >= 0, "graph: no tensor has role {} for layer {}", io_role_name(role), layer);
  else
    TESSERA_CHECK(id >= 0, "graph: no tensor has role {}", io_role_name(role));
  return id;
}

void Graph::replace_contents(std::vector<Tensor> tensors, std::vector<Node> nodes) {
  std::unordered_map<std::string, int> ti, ni;
  for (size_t i = 0; i < tensors.size(); ++i)
    TESSERA_CHECK(ti.emplace(tensors[i].name, static_cast<int>(i)).second, "graph: tensor '{}' is defined twice",
                  tensors[i].name);
  const auto valid = [&](int id) { return id >= 0 && static_cast<size_t>(id) < tensors.size(); };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    TESSERA_CHECK(ni.emplace(n.name, static_cast<int>(i)).second, "graph: node '{}' is defined twice", n.name);
    for (int id : n.inputs) TESSERA_CHECK(valid(id), "graph: node '{}' has a bad input id", n.name);
    TESSERA_CHECK(valid(n.output) && tensors[static_cast<size_t>(n.output)].producer == static_cast<int>(i),
                  "graph: node '{}' does not produce its output tensor", n.name);
  }
  tensors_ = std::move(tensors);
  nodes_ = std::move(nodes);
  tensor_index_ = std::move(ti);
  node_index_ = std::move(ni);
}

namespace {

uint64_t u(int64_t v) { return static_cast<uint64_t>(v); }

// Number of (query, key) pairs causal attention scores for T tokens after P cached ones: sum over t of (P + t + 1).
uint64_t causal_pairs(int64_t t, int64_t p) { return u(t) * u(p) + u(t) * u(t + 1) / 2; }

}  // namespace

void Graph::compute_shape_and_cost(Node& n, std::vector<int64_t>* out_shape, DType* out_dtype) const {
  const auto in = [&](size_t i) -> const Tensor& { return tensors_.at(static_cast<size_t>(n.inputs.at(i))); };
  const auto want_inputs = [&](size_t k) {
    TESSERA_CHECK(n.inputs.size() == k, "graph: node '{}' ({}) takes {} inputs, got {}", n.name, op_name(n.op), k,
                  n.inputs.size());
    for (int id : n.inputs)
      TESSERA_CHECK(id >= 0 && static_cast<size_t>(id) < tensors_.size(), "graph: node '{}' has a bad input id",
                    n.name);
  };
  const auto want_2d = [&](const Tensor& t) {
    TESSERA_CHECK(t.shape.size() == 2, "graph: node '{}': input '{}' must be 2-D, is {}", n.name, t.name,
                  shape_string(t.shape));
  };
  const auto want_f32 = [&](const Tensor& t) {
    TESSERA_CHECK(t.dtype == DType::F32, "graph: node '{}': input '{}' must be f32, is {}", n.name, t.name,
                  dtype_name(t.dtype));
  };
  const uint64_t f32 = 4;
  *out_dtype = DType::F32;
  const OpParams& p = n.params;
  switch (n.op) {
    case Op::EMBED: {
      want_inputs(2);
      const Tensor& table = in(0);
      const Tensor& ids = in(1);
      want_2d(table);
      TESSERA_CHECK(ids.shape.size() == 1 && ids.dtype == DType::I32, "graph: node '{}': ids must be i32 [T]", n.name);
      const int64_t t = ids.shape[0], e = table.shape[1];
      *out_shape = {t, e};
      n.flops = 0;  // a row lookup (dequantization is conversion, not arithmetic on activations)
      n.bytes = u(t) * (table.nbytes() / u(std::max<int64_t>(table.shape[0], 1))) + u(t) * 4 + u(t * e) * f32;
      return;
    }
    case Op::RMSNORM: {
      want_inputs(2);
      const Tensor& x = in(0);
      const Tensor& w = in(1);
      want_2d(x);
      want_f32(x);
      want_f32(w);
      TESSERA_CHECK(w.shape.size() == 1 && w.shape[0] == x.shape[1], "graph: node '{}': norm weight {} does not match {}",
                    n.name, shape_string(w.shape), shape_string(x.shape));
      *out_shape = x.shape;
      // Per element: square, accumulate, scale, multiply by the weight.
      n.flops = 4 * u(x.numel());
      n.bytes = 2 * x.nbytes() + w.nbytes();
      return;
    }
    case Op::MATMUL: {
      want_inputs(2);
      const Tensor& x = in(0);
      const Tensor& w = in(1);
      want_2d(x);
      want_2d(w);
      want_f32(x);
      TESSERA_CHECK(w.shape[1] == x.shape[1], "graph: node '{}': x {} and W {} disagree on K", n.name,
                    shape_string(x.shape), shape_string(w.shape));
      const int64_t t = x.shape[0], k = x.shape[1], nn = w.shape[0];
      *out_shape = {t, nn};
      n.flops = 2 * u(t) * u(nn) * u(k);
      n.bytes = w.nbytes() + x.nbytes() + u(t * nn) * f32;
      return;
    }
    case Op::ROPE: {
      want_inputs(3);
      const Tensor& x = in(0);
      want_2d(x);
      want_f32(x);
      TESSERA_CHECK(p.n_head > 0 && p.head_dim > 0 && x.shape[1] == p.n_head * p.head_dim,
                    "graph: node '{}': {} heads of {} do not fill {}", n.name, p.n_head, p.head_dim,
                    shape_string(x.shape));
      TESSERA_CHECK(p.rope_dim > 0 && p.rope_dim % 2 == 0 && p.rope_dim <= p.head_dim,
                    "graph: node '{}': rope dims {} must be even and at most the head size {}", n.name, p.rope_dim,
                    p.head_dim);
      TESSERA_CHECK(in(1).shape == std::vector<int64_t>{x.shape[0]}, "graph: node '{}': positions must be [T]", n.name);
      TESSERA_CHECK(in(2).numel() == p.rope_dim / 2, "graph: node '{}': inv_freq must hold {} values", n.name,
                    p.rope_dim / 2);
      *out_shape = x.shape;
      // Per rotated pair: 4 multiplies and 2 adds (sin/cos per pair and token are shared across heads).
      n.flops = 3 * u(x.shape[0]) * u(p.n_head) * u(p.rope_dim);
      n.bytes = 2 * x.nbytes() + in(1).nbytes() + in(2).nbytes();
      return;
    }
    case Op::KV_STORE: {
      want_inputs(2);
      const Tensor& x = in(0);
      const Tensor& cache = in(1);
      want_2d(x);
      TESSERA_CHECK(cache.kind == TensorKind::KV_CACHE || cache.alias >= 0, "graph: node '{}': '{}' is not a kv cache",
                    n.name, cache.name);
      TESSERA_CHECK(cache.shape.size() == 3 && x.shape[1] == cache.shape[0] * cache.shape[2],
                    "graph: node '{}': x {} does not match cache {}", n.name, shape_string(x.shape),
                    shape_string(cache.shape));
      TESSERA_CHECK(n_past_ + x.shape[0] <= cache.shape[1], "graph: node '{}': positions {}..{} exceed the cache of {}",
                    n.name, n_past_, n_past_ + x.shape[0], cache.shape[1]);
      *out_shape = cache.shape;
      *out_dtype = cache.dtype;
      n.flops = 0;
      const uint64_t elem = dtype_info(cache.dtype).type_size;
      n.bytes = x.nbytes() + u(x.numel()) * elem;
      return;
    }
    case Op::ATTENTION: {
      want_inputs(3);
      const Tensor& q = in(0);
      const Tensor& k = in(1);
      const Tensor& v = in(2);
      want_2d(q);
      want_f32(q);
      TESSERA_CHECK(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0,
                    "graph: node '{}': {} query heads are not a multiple of {} kv heads", n.name, p.n_head,
                    p.n_head_kv);
      TESSERA_CHECK(q.shape[1] == p.n_head * p.head_dim, "graph: node '{}': q {} is not {} heads of {}", n.name,
                    shape_string(q.shape), p.n_head, p.head_dim);
      for (const Tensor* c : {&k, &v})
        TESSERA_CHECK(c->shape == std::vector<int64_t>({p.n_head_kv, c->shape.size() == 3 ? c->shape[1] : 0,
                                                        p.head_dim}),
                      "graph: node '{}': cache '{}' {} is not [{}, C, {}]", n.name, c->name, shape_string(c->shape),
                      p.n_head_kv, p.head_dim);
      const int64_t t = q.shape[0];
      *out_shape = q.shape;
      const uint64_t pairs = causal_pairs(t, n_past_);
      // Per (query, key) pair and head: q·k (2D), p·v (2D), and about 5 for scale, max, exp and sum.
      n.flops = u(p.n_head) * pairs * (4 * u(p.head_dim) + 5);
      // Each kv head's keys and values for positions [0, P+T) are read once (its query heads share them).
      const uint64_t elem = dtype_info(k.dtype).type_size;
      n.bytes = 2 * q.nbytes() + 2 * u(p.n_head_kv) * u(n_past_ + t) * u(p.head_dim) * elem;
      return;
    }
    case Op::ADD: {
      want_inputs(2);
      const Tensor& a = in(0);
      const Tensor& b = in(1);
      want_f32(a);
      want_f32(b);
      TESSERA_CHECK(a.shape == b.shape, "graph: node '{}': {} + {} shapes differ", n.name, shape_string(a.shape),
                    shape_string(b.shape));
      *out_shape = a.shape;
      n.flops = u(a.numel());
      n.bytes = 3 * a.nbytes();
      return;
    }
    case Op::SWIGLU: {
      want_inputs(2);
      const Tensor& g = in(0);
      const Tensor& up = in(1);
      want_f32(g);
      want_f32(up);
      TESSERA_CHECK(g.shape == up.shape, "graph: node '{}': gate {} and up {} shapes differ", n.name,
                    shape_string(g.shape), shape_string(up.shape));
      *out_shape = g.shape;
      // silu(g) = g / (1 + exp(-g)): negate, exp, add, divide; then the multiply by up.
      n.flops = 5 * u(g.numel());
      n.bytes = 3 * g.nbytes();
      return;
    }
    case Op::LAST_ROW: {
      want_inputs(1);
      const Tensor& x = in(0);
      want_2d(x);
      TESSERA_CHECK(x.shape[0] > 0, "graph: node '{}': no rows to take", n.name);
      *out_shape = {1, x.shape[1]};
      *out_dtype = x.dtype;
      n.flops = 0;
      n.bytes = 2 * u(x.shape[1]) * dtype_info(x.dtype).type_size;
      return;
    }
    case Op::SLICE:
      fail("graph: node '{}': slices are made by graph passes, not by add_node", n.name);
  }
  fail("graph: node '{}' has an unknown op", n.name);
}

int Graph::add_node(std::string name, Op op, Role role, int layer, std::string block, std::vector<int> inputs,
                    OpParams params) {
  TESSERA_CHECK(!node_index_.contains(name), "graph: node '{}' is defined twice", name);
  Node n;
  n.name = std::move(name);
  n.op = op;
  n.role = role;
  n.layer = layer;
  n.block = std::move(block);
  n.inputs = std::move(inputs);
  n.params = params;
  Tensor out;
  out.name = n.name;
  out.kind = TensorKind::ACTIVATION;
  compute_shape_and_cost(n, &out.shape, &out.dtype);
  out.producer = static_cast<int>(nodes_.size());
  n.source = static_cast<int>(nodes_.size());
  if (op == Op::KV_STORE) {
    const Tensor& cache = tensors_[static_cast<size_t>(n.inputs[1])];
    out.alias = cache.alias >= 0 ? cache.alias : n.inputs[1];
  }
  n.output = add_tensor(std::move(out));
  node_index_.emplace(n.name, static_cast<int>(nodes_.size()));
  nodes_.push_back(std::move(n));
  return nodes_.back().output;
}

std::vector<Edge> Graph::edges() const {
  std::vector<Edge> out;
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (int t : nodes_[i].inputs) out.push_back(Edge{t, tensors_[static_cast<size_t>(t)].producer, static_cast<int>(i)});
  return out;
}

Totals Graph::totals() const {
  Totals t;
  std::map<std::string, OpClassTotal> by;
  std::set<int> weights;
  for (const Node& n : nodes_) {
    ++t.nodes;
    t.flops += n.flops;
    t.bytes += n.bytes;
    if (is_matmul_like(n.op)) {
      t.matmul_flops += n.flops;
      t.matmul_bytes += n.bytes;
    }
    auto& c = by[std::string(op_class(n.op))];
    c.op_class = op_class(n.op);
    ++c.nodes;
    c.flops += n.flops;
    c.bytes += n.bytes;
    for (int id : n.inputs)
      if (tensors_[static_cast<size_t>(id)].kind == TensorKind::WEIGHT) weights.insert(id);
  }
  for (int id : weights) t.weight_bytes += tensors_[static_cast<size_t>(id)].nbytes();
  for (auto& [k, v] : by) t.by_class.push_back(v);
  std::stable_sort(t.by_class.begin(), t.by_class.end(), [](const OpClassTotal& a, const OpClassTotal& b) {
    return a.flops != b.flops ? a.flops > b.flops : a.bytes > b.bytes;
  });
  return t;
}

}  // namespace tessera::graph
