// Graph construction; the shape checks and the cost model of each op are its row of the op table (ops.cpp).
#include "graph/graph.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace tessera::graph {

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
    case IoRole::STATE: return "state";
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
    case Role::EMBD_SCALE: return "embd_scale";
    case Role::ATTN_Q_NORM: return "attn_q_norm";
    case Role::ATTN_K_NORM: return "attn_k_norm";
    case Role::ATTN_Q_BIAS: return "attn_q_bias";
    case Role::ATTN_K_BIAS: return "attn_k_bias";
    case Role::ATTN_V_BIAS: return "attn_v_bias";
    case Role::ATTN_POST_NORM: return "attn_post_norm";
    case Role::FFN_POST_NORM: return "ffn_post_norm";
    case Role::OUTPUT_SOFTCAP: return "output_softcap";
    case Role::ACT_QUANT: return "act_quant";
    case Role::ATTN_SUB_NORM: return "attn_sub_norm";
    case Role::FFN_SUB_NORM: return "ffn_sub_norm";
    case Role::LINEAR_NORM: return "linear_norm";
    case Role::MLGRU_I: return "mlgru_i";
    case Role::MLGRU_F: return "mlgru_f";
    case Role::MLGRU_G: return "mlgru_g";
    case Role::MLGRU: return "mlgru";
    case Role::MLGRU_OUT_NORM: return "mlgru_out_norm";
    case Role::MLGRU_OUT_GATE: return "mlgru_out_gate";
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
  const int64_t n = static_cast<int64_t>(values.size());
  return add_constant(std::move(name), std::move(values), {n});
}

int Graph::add_constant(std::string name, std::vector<float> values, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  TESSERA_CHECK(n == static_cast<int64_t>(values.size()), "graph: constant '{}' of shape {} is given {} values", name,
                shape_string(shape), values.size());
  auto store = std::make_shared<std::vector<float>>(std::move(values));
  const int id = add_weight(std::move(name), DType::F32, std::move(shape), store->data());
  constants_.push_back(std::move(store));
  return id;
}

bool Graph::owns(const void* data) const {
  if (data == nullptr) return false;
  for (const auto& c : constants_)
    if (c->data() == data) return true;
  return false;
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

int Graph::add_node(std::string name, Op op, Role role, int layer, std::string block, std::vector<int> inputs,
                    OpParams params) {
  TESSERA_CHECK(!node_index_.contains(name), "graph: node '{}' is defined twice", name);
  const OpInfo& info = op_info(op);
  TESSERA_CHECK(!info.traits.pass_only, "graph: node '{}': {} nodes are made by graph passes, not by add_node", name,
                info.name);
  Node n;
  n.name = std::move(name);
  n.op = op;
  n.role = role;
  n.layer = layer;
  n.block = std::move(block);
  n.inputs = std::move(inputs);
  n.params = params;
  TESSERA_CHECK(n.inputs.size() == static_cast<size_t>(info.n_inputs), "graph: node '{}' ({}) takes {} inputs, got {}",
                n.name, info.name, info.n_inputs, n.inputs.size());
  for (int id : n.inputs)
    TESSERA_CHECK(id >= 0 && static_cast<size_t>(id) < tensors_.size(), "graph: node '{}' has a bad input id", n.name);
  Tensor out;
  out.name = n.name;
  out.kind = TensorKind::ACTIVATION;
  out.dtype = DType::F32;
  info.infer(*this, n, out);
  out.producer = static_cast<int>(nodes_.size());
  n.source = static_cast<int>(nodes_.size());
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
