// The fusion rewrites (fuse.h). Each takes a graph and returns a new one; the preconditions are those the CUDA
// executors checked inline before the rewrites existed (backend_cuda.cpp, executor_rows.cpp at f98a979).
#include "graph/passes/fuse.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "graph/passes/rewriter.h"

namespace tessera::graph {

std::string joined_name(const std::vector<std::string>& names) {
  std::string prefix;
  if (const size_t dot = names[0].rfind('.'); dot != std::string::npos) prefix = names[0].substr(0, dot + 1);
  std::string s = names[0];
  for (size_t i = 1; i < names.size(); ++i)
    s += "+" + (names[i].starts_with(prefix) ? names[i].substr(prefix.size()) : names[i]);
  return s;
}

std::vector<std::vector<int>> consumers_of(const Graph& g) {
  std::vector<std::vector<int>> c(g.tensors().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (int t : g.nodes()[i].inputs) c[static_cast<size_t>(t)].push_back(static_cast<int>(i));
  return c;
}

Graph Rewriter::finish() {
  // Live tensors: leaves, and the outputs of emitted nodes.
  std::vector<int> produced_by(tensors_.size(), -1);
  for (size_t i = 0; i < nodes_.size(); ++i) produced_by[static_cast<size_t>(nodes_[i].output)] = static_cast<int>(i);
  std::vector<int> remap(tensors_.size(), -1);
  std::vector<Tensor> out;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const bool leaf = tensors_[t].producer == -1;
    if (!leaf && produced_by[t] < 0) continue;
    remap[t] = static_cast<int>(out.size());
    out.push_back(tensors_[t]);
    out.back().producer = produced_by[t];
  }
  const auto map = [&](int t) {
    if (t < 0) return t;
    const int m = remap[static_cast<size_t>(t)];
    TESSERA_CHECK(m >= 0, "graph passes: tensor '{}' is read but its producer was removed",
                  tensors_[static_cast<size_t>(t)].name);
    return m;
  };
  for (Tensor& t : out) t.alias = t.alias >= 0 ? map(t.alias) : -1;
  for (Node& n : nodes_) {
    for (int& t : n.inputs) t = map(t);
    n.output = map(n.output);
    if (n.fusion.norm_weight >= 0) n.fusion.norm_weight = map(n.fusion.norm_weight);
    if (n.fusion.residual >= 0) n.fusion.residual = map(n.fusion.residual);
    if (n.fusion.norm_out >= 0) n.fusion.norm_out = map(n.fusion.norm_out);
  }
  Graph r = g_;
  r.replace_contents(std::move(out), std::move(nodes_));
  return r;
}

namespace {

// The names a node stands for: its fused_from, or its own name.
std::vector<std::string> names_of(const Node& n) {
  return n.fusion.fused_from.empty() ? std::vector<std::string>{n.name} : n.fusion.fused_from;
}

void append_names(std::vector<std::string>* to, const Node& n) {
  for (const std::string& s : names_of(n)) to->push_back(s);
}

bool plain(const Node& n) { return n.fusion.empty(); }

// A matmul whose only fusion is its LoRA adapters (rewrite 7 run first): the later rewrites take it as a plain matmul
// and carry its adapters (the node's last 2·lora inputs).
bool lora_only(const Node& n) {
  const Fusion& f = n.fusion;
  return is_matmul_like(n.op) && f.lora > 0 && f.n_weights == 1 && f.norm_weight < 0 && f.residual < 0 && !f.swiglu &&
         !f.gate_up && f.norm_out < 0 && !f.in_producer && !f.rope_store &&
         n.inputs.size() >= 2 + 2 * static_cast<size_t>(f.lora);
}

bool plain_or_lora(const Node& n) { return plain(n) || lora_only(n); }

// The adapters' inputs of a matmul node (A0, B0, A1, B1, ...: its last 2·lora inputs).
std::vector<int> adapter_inputs(const Node& n) {
  return {n.inputs.end() - 2 * static_cast<std::ptrdiff_t>(n.fusion.lora), n.inputs.end()};
}

bool is_2d_weight(const Tensor& w) { return w.kind == TensorKind::WEIGHT && w.shape.size() == 2 && w.data != nullptr; }

// The tensor whose storage t lives in when the executors run t's producer in place (a residual matmul writes over its
// residual; rope over its input; an add over its first operand when it is that operand's last reader; a norm written
// by its producer aliases its input; the last row of one row is the row).
int storage_root(const Graph& g, const std::vector<std::vector<int>>& co, int t) {
  for (;;) {
    const int p = g.tensor(t).producer;
    if (p < 0) return t;
    const Node& n = g.node(p);
    if (is_matmul_like(n.op) && n.fusion.residual >= 0) {
      t = n.fusion.residual;
    } else if (n.op == Op::ROPE || (n.op == Op::RMSNORM && n.fusion.in_producer) ||
               (n.op == Op::LAST_ROW && g.n_tokens() == 1)) {
      t = n.inputs[0];
    } else if (n.op == Op::ADD && !co[static_cast<size_t>(n.inputs[0])].empty() &&
               co[static_cast<size_t>(n.inputs[0])].back() == p && n.inputs[0] != n.inputs[1]) {
      t = n.inputs[0];
    } else {
      return t;
    }
  }
}

// Whether tensor t's row count is the run's token count (derived from the graph inputs' rows) rather than fixed, as
// the rows executor tracks it: every node's output follows its first activation input, except LAST_ROW (one row)
// and KV_STORE (the cache).
std::vector<bool> row_scaled(const Graph& g) {
  std::vector<bool> s(g.tensors().size(), false);
  for (size_t i = 0; i < g.tensors().size(); ++i) s[i] = g.tensors()[i].kind == TensorKind::INPUT;
  for (const Node& n : g.nodes())
    if (n.op != Op::LAST_ROW && n.op != Op::KV_STORE && !n.inputs.empty())
      s[static_cast<size_t>(n.output)] = s[static_cast<size_t>(n.inputs[n.op == Op::EMBED ? 1 : 0])];
  return s;
}

}  // namespace

// 1. Norm prologue.
Graph fold_norm_prologues(const Graph& g, const FusionSupport& fs) {
  if (!fs.norm_prologue) return g;
  const auto co = consumers_of(g);
  const auto foldable = [&](int id) {
    const Node& n = g.node(id);
    const Tensor& o = g.tensor(n.output);
    const auto& readers = co[static_cast<size_t>(n.output)];
    if (n.op != Op::RMSNORM || !plain(n) || o.is_output || readers.empty() || o.numel() % 4 != 0) return false;
    for (size_t i = 0; i < readers.size(); ++i) {
      const Node& m = g.node(readers[i]);
      // The readers are the nodes right after the norm: nothing writes its input before they read it.
      if (readers[i] != id + 1 + static_cast<int>(i) || !is_matmul_like(m.op) || !plain_or_lora(m) ||
          m.inputs.at(0) != n.output)
        return false;
      const Tensor& w = g.tensor(m.inputs.at(1));
      if (w.data == nullptr || w.shape.size() != 2 || !fs.norm_prologue(w)) return false;
    }
    return true;
  };
  Rewriter rw(g);
  for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id) {
    if (rw.skipped(id)) continue;
    if (!foldable(id)) {
      rw.keep(id);
      continue;
    }
    const Node& norm = g.node(id);
    const auto& readers = co[static_cast<size_t>(norm.output)];
    for (size_t i = 0; i < readers.size(); ++i) {
      const Node& m = g.node(readers[i]);
      Node f = m;
      // An adapted matmul's A products read the same normalized x (its executor passes them the norm).
      f.inputs = {norm.inputs[0], m.inputs[1], norm.inputs[1]};
      for (int t : adapter_inputs(m)) f.inputs.push_back(t);
      f.fusion.norm_weight = norm.inputs[1];
      f.fusion.norm_eps = norm.params.eps;
      // The norm is named by its first reader; the others recompute it too (their norm_weight says so).
      f.fusion.fused_from.clear();
      if (i == 0) f.fusion.fused_from = {norm.name};
      append_names(&f.fusion.fused_from, m);
      f.name = joined_name({norm.name, m.name});
      f.flops += i == 0 ? norm.flops : 0;
      Tensor out = g.tensor(m.output);
      out.name = f.name;
      rw.replace(m.output, rw.add(std::move(f), std::move(out)));
      rw.skip(readers[i]);
    }
  }
  return rw.finish();
}

// 2, 3. Stacks and the SwiGLU epilogue.
Graph stack_matmuls(const Graph& g, const FusionSupport& fs) {
  if (!fs.stack_shared_input && !fs.stack_qkv && !fs.stack_gate_up) return g;
  const auto co = consumers_of(g);
  const int64_t T = g.n_tokens();
  const auto format = [&](const Tensor& w) { return fs.weight_format ? fs.weight_format(w) : w.dtype; };
  Rewriter rw(g);  // a node claimed by an earlier stack is skipped: no later stack may claim it again
  // Same x (and the same folded norm, if any): the members' inputs agree but for the weight.
  const auto same_x = [&](const Node& a, const Node& b) {
    return a.inputs.at(0) == b.inputs.at(0) && a.fusion.norm_weight == b.fusion.norm_weight &&
           a.fusion.norm_eps == b.fusion.norm_eps;
  };
  // Not a matmul by a weight the graph owns (the chain rewrite's folded constants, passes/chain.h): executors keep a
  // stacked matrix by its members' addresses for as long as the model (CUDA's DeviceWeights), and a constant's address
  // is valid only while its graph lives (Graph::owns).
  const auto stackable = [&](const Node& m) {
    return is_matmul_like(m.op) && m.fusion.n_weights == 1 && m.fusion.residual < 0 && !m.fusion.swiglu &&
           !g.owns(g.tensor(m.inputs.at(1)).data);
  };
  const auto feeds_attention_only = [&](int node) {
    const auto& c = co[static_cast<size_t>(g.node(node).output)];
    if (c.empty()) return false;
    for (int r : c)
      if (g.node(r).op != Op::ROPE && g.node(r).op != Op::KV_STORE) return false;
    return true;
  };
  // The up-projection to stack with gate matmul id: both read x, and their outputs are SWIGLU's gate and up and
  // nothing else's, with equal weights (format and shape) and [T, N] f32 outputs.
  const auto gate_up_partner = [&](int id) {
    const Node& n = g.node(id);
    const auto& c = co[static_cast<size_t>(n.output)];
    if (c.size() != 1) return -1;
    const Node& sw = g.node(c[0]);
    if (sw.op != Op::SWIGLU || sw.inputs.size() != 2 || sw.inputs[0] != n.output || sw.inputs[1] == n.output) return -1;
    const int up = sw.inputs[1];
    const auto& cu = co[static_cast<size_t>(up)];
    if (cu.size() != 1 || cu[0] != c[0]) return -1;
    const Tensor& wg = g.tensor(n.inputs.at(1));
    const auto shaped = [&](const Node& m) {
      const Tensor& w = g.tensor(m.inputs.at(1));
      const Tensor& o = g.tensor(m.output);
      return is_2d_weight(w) && format(w) == format(wg) && w.shape == wg.shape && o.dtype == DType::F32 &&
             o.shape.size() == 2 && o.shape[0] == T && o.shape[1] == w.shape[0];
    };
    if (!shaped(n)) return -1;
    for (int c2 : co[static_cast<size_t>(n.inputs.at(0))]) {
      const Node& m = g.node(c2);
      if (c2 > id && !rw.skipped(c2) && stackable(m) && m.output == up && same_x(m, n) && shaped(m)) return c2;
    }
    return -1;
  };
  // Later readers of x that stack with id: same weight format and K, bound 2-D weights, f32 outputs.
  const auto same_input_members = [&](int id, bool attention_only) {
    const Node& n = g.node(id);
    const Tensor& w0 = g.tensor(n.inputs.at(1));
    std::vector<int> group{id};
    if (w0.shape.size() != 2 || w0.data == nullptr) return group;
    if (attention_only && !feeds_attention_only(id)) return group;
    bool left_out = false;  // a reader feeding attention that cannot join (another weight format)
    for (int c : co[static_cast<size_t>(n.inputs.at(0))]) {
      if (c <= id || rw.skipped(c)) continue;
      const Node& m = g.node(c);
      if (!stackable(m) || !same_x(m, n) || (attention_only && !feeds_attention_only(c))) continue;
      const Tensor& wt = g.tensor(m.inputs.at(1));
      if (format(wt) == format(w0) && wt.shape.size() == 2 && wt.shape[1] == w0.shape[1] && wt.data != nullptr &&
          wt.kind == TensorKind::WEIGHT && g.tensor(m.output).dtype == DType::F32)
        group.push_back(c);
      else
        left_out = true;
    }
    // q|k|v all or none: the attention that reads them takes k and v with one row stride, which a q|k stack beside a
    // lone v (a Q4_K_M file's q6_K attn_v) would break.
    if (attention_only && left_out) return std::vector<int>{id};
    // A reader listed twice (x read twice by one node) cannot be: matmuls read x once.
    group.erase(std::unique(group.begin(), group.end()), group.end());
    return group;
  };
  // The SWIGLU a stacked (gate, up) pair feeds when it can be the stack's epilogue: the pair's outputs are its gate and
  // up inputs, in order, and nothing else reads them. -1 if none.
  const auto swiglu_of_pair = [&](const std::vector<int>& group) {
    if (!fs.swiglu_epilogue || group.size() != 2) return -1;
    const int a = g.node(group[0]).output, b = g.node(group[1]).output;
    const auto& ca = co[static_cast<size_t>(a)];
    const auto& cb = co[static_cast<size_t>(b)];
    if (ca.size() != 1 || cb.size() != 1 || ca[0] != cb[0]) return -1;
    const Node& s = g.node(ca[0]);
    if (s.op != Op::SWIGLU || !plain(s) || s.inputs.size() != 2 || s.inputs[0] != a || s.inputs[1] != b) return -1;
    if (g.tensor(a).is_output || g.tensor(b).is_output || g.tensor(a).numel() != g.tensor(b).numel() ||
        g.tensor(s.output).numel() != g.tensor(a).numel())
      return -1;
    return ca[0];
  };

  for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id) {
    if (rw.skipped(id)) continue;
    const Node& n = g.node(id);
    std::vector<int> group{id};
    bool gate_up = false;
    if (stackable(n)) {
      if (fs.stack_shared_input) {
        group = same_input_members(id, false);
      } else {
        if (fs.stack_gate_up)
          if (const int up = gate_up_partner(id); up >= 0) group = {id, up}, gate_up = true;
        if (group.size() == 1 && fs.stack_qkv) group = same_input_members(id, true);
      }
    }
    if (group.size() == 1) {
      rw.keep(id);
      continue;
    }
    std::vector<int> weights;
    Node f = n;
    f.fusion.fused_from.clear();
    f.inputs = {n.inputs[0]};
    int64_t rows = 0;
    f.flops = f.bytes = 0;
    for (int c : group) {
      const Node& m = g.node(c);
      weights.push_back(m.inputs[1]);
      f.inputs.push_back(m.inputs[1]);
      rows += g.tensor(m.inputs[1]).shape[0];
      append_names(&f.fusion.fused_from, m);
      f.flops += m.flops;
      f.bytes += m.bytes;
      rw.skip(c);
    }
    if (n.fusion.norm_weight >= 0) f.inputs.push_back(n.fusion.norm_weight);
    // Every member's adapters, in member order, each marked with its member (lora_terms finds its rows).
    f.fusion.lora = 0;
    f.fusion.lora_member.clear();
    for (size_t i = 0; i < group.size(); ++i) {
      const Node& m = g.node(group[i]);
      for (int t : adapter_inputs(m)) f.inputs.push_back(t);
      for (int a = 0; a < m.fusion.lora; ++a) f.fusion.lora_member.push_back(static_cast<int>(i));
      f.fusion.lora += m.fusion.lora;
    }
    if (f.fusion.lora == 0) f.fusion.lora_member.clear();
    f.fusion.n_weights = static_cast<int>(group.size());
    const int sw = swiglu_of_pair(group);
    f.fusion.gate_up = gate_up || sw >= 0;
    Tensor out = g.tensor(n.output);
    out.shape = {g.tensor(n.output).shape[0], rows};
    out.is_output = false;
    out.io = IoRole::NONE;  // a member's role stays with its slice, which is that member's output
    out.io_layer = -1;
    if (sw >= 0 && fs.swiglu_epilogue(g, weights, sw)) {
      const Node& s = g.node(sw);
      f.fusion.swiglu = true;
      append_names(&f.fusion.fused_from, s);
      f.flops += s.flops;
      f.name = joined_name(f.fusion.fused_from);
      out = g.tensor(s.output);
      out.name = f.name;
      rw.replace(s.output, rw.add(std::move(f), std::move(out)));
      rw.skip(sw);
      continue;
    }
    f.name = joined_name(f.fusion.fused_from);
    out.name = f.name;
    const int stacked = rw.add(std::move(f), std::move(out));
    // Each member's output is a column slice of the stack (a view): its readers read the slice.
    int64_t begin = 0;
    for (int c : group) {
      const Node& m = g.node(c);
      Node s;
      // Named by the member's own matmul (an adapted member's names end with its adapters' three nodes each).
      const std::vector<std::string> mn = names_of(m);
      s.name = mn[mn.size() - 1 - 3 * static_cast<size_t>(m.fusion.lora)] + ".cols";
      s.op = Op::SLICE;
      s.role = m.role;
      s.layer = m.layer;
      s.block = m.block;
      s.inputs = {stacked};
      s.params.slice_begin = begin;
      s.source = -1;
      Tensor so = g.tensor(m.output);
      so.name = s.name;
      rw.replace(m.output, rw.add(std::move(s), std::move(so)));
      begin += g.tensor(m.inputs[1]).shape[0];
    }
  }
  return rw.finish();
}

// 4. Residual epilogue.
Graph fold_residual_adds(const Graph& g, const FusionSupport& fs) {
  if (!fs.residual_epilogue) return g;
  const auto co = consumers_of(g);
  const auto scaled = row_scaled(g);
  // The ADD node matmul id may accumulate into: its output's only reader is ADD(a, output), the last reader of a (a an
  // activation of the same size and row count, not a strided slice), every other reader of a runs before the matmul,
  // and the matmul's x does not live in a's storage. -1 if none.
  const auto target = [&](int id) {
    const Node& n = g.node(id);
    if (!is_matmul_like(n.op) || n.fusion.n_weights != 1 || n.fusion.swiglu || n.fusion.residual >= 0) return -1;
    const int out = n.output;
    const auto& c = co[static_cast<size_t>(out)];
    if (c.size() != 1) return -1;
    const Node& r = g.node(c[0]);
    if (r.op != Op::ADD || !plain(r) || r.inputs.size() != 2 || r.inputs[1] != out || r.inputs[0] == out) return -1;
    const int a = r.inputs[0];
    const Tensor& at = g.tensor(a);
    if (at.kind != TensorKind::ACTIVATION || at.is_output) return -1;
    if (at.producer >= 0 && g.node(at.producer).op == Op::SLICE) return -1;
    if (at.numel() != g.tensor(out).numel() || scaled[static_cast<size_t>(a)] != scaled[static_cast<size_t>(out)])
      return -1;
    const auto& ca = co[static_cast<size_t>(a)];
    if (ca.empty() || ca.back() != c[0]) return -1;
    for (int x : ca)
      if (x != c[0] && x > id) return -1;
    if (storage_root(g, co, n.inputs[0]) == storage_root(g, co, a)) return -1;
    return c[0];
  };
  Rewriter rw(g);
  for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id) {
    if (rw.skipped(id)) continue;
    const int r = target(id);
    if (r < 0) {
      rw.keep(id);
      continue;
    }
    const Node& n = g.node(id);
    const Node& add = g.node(r);
    Node f = n;
    f.fusion.fused_from.clear();
    append_names(&f.fusion.fused_from, n);
    append_names(&f.fusion.fused_from, add);
    f.fusion.residual = add.inputs[0];
    // Before the adapters, which stay the node's last inputs.
    f.inputs.insert(f.inputs.end() - 2 * static_cast<std::ptrdiff_t>(n.fusion.lora), add.inputs[0]);
    f.flops += add.flops;
    f.name = joined_name(f.fusion.fused_from);
    Tensor out = g.tensor(add.output);
    out.name = f.name;
    rw.replace(add.output, rw.add(std::move(f), std::move(out)));
    rw.skip(r);
  }
  return rw.finish();
}

// 5. Norm epilogue.
Graph fold_residual_norms(const Graph& g, const FusionSupport& fs) {
  if (!fs.residual_norm_out) return g;
  const auto co = consumers_of(g);
  Graph r = g;
  std::vector<Node> nodes = g.nodes();
  bool changed = false;
  for (size_t id = 0; id < nodes.size(); ++id) {
    const Node& n = g.node(static_cast<int>(id));
    // An adapted residual matmul's sum is whole only after its adapters: it writes no norm input.
    if (!is_matmul_like(n.op) || n.fusion.residual < 0 || n.fusion.n_weights != 1 || n.fusion.lora > 0) continue;
    const Tensor& w = g.tensor(n.inputs.at(1));
    const auto& cs = co[static_cast<size_t>(n.output)];
    if (cs.empty()) continue;
    const Node& nn = g.node(cs[0]);
    if (nn.op != Op::RMSNORM || !plain(nn) || nn.inputs.at(0) != n.output) continue;
    const Tensor& o = g.tensor(nn.output);
    const auto& readers = co[static_cast<size_t>(nn.output)];
    if (o.is_output || readers.empty() || o.numel() != w.shape[0] || w.shape[0] % 32 != 0) continue;
    std::vector<const Tensor*> rw;
    bool ok = true;
    for (int c : readers) {
      const Node& m = g.node(c);
      // An adapted reader's A products read the norm's f32 output, which the norm epilogue does not write.
      if (!is_matmul_like(m.op) || m.inputs.at(0) != nn.output || m.fusion.norm_weight >= 0 || m.fusion.lora > 0)
        ok = false;
      if (!ok) break;
      for (int k = 0; k < m.fusion.n_weights; ++k) {
        const Tensor& wt = g.tensor(m.inputs.at(static_cast<size_t>(1 + k)));
        if (wt.data == nullptr || wt.shape.size() != 2) ok = false;
        rw.push_back(&wt);
      }
    }
    if (!ok || !fs.residual_norm_out(w, rw)) continue;
    nodes[id].fusion.norm_out = nn.output;
    if (nodes[id].fusion.fused_from.empty()) nodes[id].fusion.fused_from = {n.name};
    nodes[static_cast<size_t>(cs[0])].fusion.in_producer = true;
    changed = true;
  }
  if (!changed) return g;
  r.replace_contents(g.tensors(), std::move(nodes));
  return r;
}

// 6. Rope + cache store + attention.
Graph fuse_rope_store_attention(const Graph& g, const FusionSupport& fs) {
  if (!fs.rope_store_attention) return g;
  const auto co = consumers_of(g);
  const int positions = g.find_role(IoRole::POSITIONS);
  const auto producer = [&](int t, Op op) -> const Node* {
    const int p = g.tensor(t).producer;
    return p >= 0 && g.node(p).op == op && plain(g.node(p)) ? &g.node(p) : nullptr;
  };
  const auto only_reader = [&](int t, int node) {
    const auto& c = co[static_cast<size_t>(t)];
    return c.size() == 1 && c[0] == node;
  };
  // A rope the attention can apply itself: it rotates by the graph's positions, nothing else reads its input (the
  // fused launch rotates in place) and only `reader` reads its output.
  const auto fusable_rope = [&](const Node* r, int reader) {
    return r != nullptr && r->inputs.at(1) == positions && only_reader(r->inputs[0], g.tensor(r->output).producer) &&
           only_reader(r->output, reader);
  };
  // The attentions that fuse: ATTENTION(rope(q), store(rope(k)), store(v)) with q and k rotated alike, v not, and
  // every intermediate read by the next node of the pattern only.
  std::set<int> fused;
  for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id) {
    const Node& n = g.node(id);
    if (n.op != Op::ATTENTION || !plain(n) || n.inputs.size() != 3 || positions < 0) continue;
    // A sliding window is the attention's own parameter (the fused node keeps it): only a backend whose fused kernels
    // read it fuses such an attention; elsewhere it stays unfused, so a backend that runs attention only fused refuses
    // it instead of attending to all.
    if (n.params.window > 0 && !fs.windowed_attention) continue;
    const Node* rq = producer(n.inputs[0], Op::ROPE);
    const Node* sk = producer(n.inputs[1], Op::KV_STORE);
    const Node* sv = producer(n.inputs[2], Op::KV_STORE);
    const Node* rk = sk != nullptr ? producer(sk->inputs[0], Op::ROPE) : nullptr;
    if (rq != nullptr && sk != nullptr && sv != nullptr && rk != nullptr && sk != sv &&
        producer(sv->inputs[0], Op::ROPE) == nullptr && fusable_rope(rq, id) &&
        fusable_rope(rk, g.tensor(sk->output).producer) && rk->inputs[2] == rq->inputs[2] &&
        rk->params.rope_dim == rq->params.rope_dim && rk->params.rope_neox == rq->params.rope_neox &&
        only_reader(sk->output, id) && only_reader(sv->output, id))
      fused.insert(id);
  }
  Rewriter out(g);
  for (int id : fused) {
    const Node& n = g.node(id);
    for (int t : {n.inputs[0], n.inputs[1], n.inputs[2]}) out.skip(g.tensor(t).producer);
    out.skip(g.tensor(g.node(g.tensor(n.inputs[1]).producer).inputs[0]).producer);  // the key rope
  }
  for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id) {
    if (!fused.contains(id)) {
      if (!out.skipped(id)) out.keep(id);
      continue;
    }
    const Node& n = g.node(id);
    const Node& rq = g.node(g.tensor(n.inputs[0]).producer);
    const Node& sk = g.node(g.tensor(n.inputs[1]).producer);
    const Node& sv = g.node(g.tensor(n.inputs[2]).producer);
    const Node& rk = g.node(g.tensor(sk.inputs[0]).producer);
    const int cache_k = g.tensor(sk.output).alias, cache_v = g.tensor(sv.output).alias;
    Node f = n;
    f.inputs = {rq.inputs[0], cache_k, cache_v, rk.inputs[0], sv.inputs[0], positions, rq.inputs[2]};
    f.params.rope_dim = rq.params.rope_dim;
    f.params.rope_neox = rq.params.rope_neox;
    f.fusion.rope_store = true;
    f.fusion.fused_from.clear();
    // Graph order of the source nodes, so a printed fusion reads like the source.
    std::vector<const Node*> parts{&rq, &rk, &sk, &sv, &n};
    std::sort(parts.begin(), parts.end(), [&](const Node* a, const Node* b) { return a->source < b->source; });
    for (const Node* p : parts) {
      append_names(&f.fusion.fused_from, *p);
      if (p != &n) {
        f.flops += p->flops;
        f.bytes += p->bytes;
      }
    }
    Tensor o = g.tensor(n.output);
    out.replace(n.output, out.add(std::move(f), std::move(o)));
  }
  return out.finish();
}

// The verifier and the pipeline.
std::vector<std::string> verify_rewrite(const Graph& source, const Graph& rewritten) {
  std::vector<std::string> problems;
  std::map<std::string, int> named;  // source node name -> fused_from mentions
  std::set<std::string> kept;
  std::map<std::string, Op> ops;  // the source's unfused nodes
  // The nodes the source computes, in order: its unfused nodes, and the nodes its fused ones name (a source that is
  // itself a rewrite); a SLICE stands for none.
  std::vector<std::string> wanted;
  for (const Node& n : source.nodes()) {
    if (n.fusion.fused_from.empty()) ops[n.name] = n.op;
    if (n.fusion.fused_from.empty() && n.op == Op::SLICE) continue;
    append_names(&wanted, n);
  }
  const std::set<std::string> computed(wanted.begin(), wanted.end());
  for (const Node& n : rewritten.nodes()) {
    if (n.fusion.fused_from.empty()) {
      if (n.op == Op::SLICE) continue;  // a view of a stack, standing for no source node
      const auto it = ops.find(n.name);
      if (it == ops.end())
        problems.push_back(fmt::format("node '{}' is neither a source node nor a fusion of some", n.name));
      else if (it->second != n.op)
        problems.push_back(
            fmt::format("node '{}' changed its op from {} to {}", n.name, op_name(it->second), op_name(n.op)));
      else
        kept.insert(n.name);
      continue;
    }
    for (const std::string& f : n.fusion.fused_from) {
      if (!computed.contains(f))
        problems.push_back(fmt::format("node '{}' fuses '{}', which is no source node", n.name, f));
      ++named[f];
    }
  }
  for (const std::string& name : wanted) {
    const int c = named.contains(name) ? named[name] : 0;
    const bool k = kept.contains(name);
    if (!k && c == 0) problems.push_back(fmt::format("source node '{}' was lost", name));
    if (k && c > 0) problems.push_back(fmt::format("source node '{}' is both kept and fused", name));
    if (c > 1) problems.push_back(fmt::format("source node '{}' is fused {} times", name, c));
  }
  for (const Tensor& t : source.tensors())
    if (t.io != IoRole::NONE && rewritten.find_role(t.io, t.io_layer) < 0)
      problems.push_back(
          fmt::format("role {} (layer {}) of '{}' has no tensor", io_role_name(t.io), t.io_layer, t.name));
  return problems;
}

// 7. LoRA epilogue.
Graph fold_lora_epilogues(const Graph& g, const FusionSupport& fs) {
  if (!fs.lora_epilogue) return g;
  const auto co = consumers_of(g);
  const auto only_reader = [&](int t) {
    const auto& c = co[static_cast<size_t>(t)];
    return c.size() == 1 ? c[0] : -1;
  };
  const auto plain_matmul = [&](int id) {
    const Node& n = g.node(id);
    return n.op == Op::MATMUL && plain(n) && n.inputs.size() == 2 && is_2d_weight(g.tensor(n.inputs[1]));
  };
  // For the sum y read by `add_id`: the adapter (A, B, its A node, its B node) when add_id is ADD(y, (x·Aᵀ)·Bᵀ) with
  // the products read by nothing else; nullopt otherwise.
  struct Term {
    int a, b, node_a, node_b;
  };
  const auto term = [&](int add_id, int y, int x, int base) -> std::optional<Term> {
    if (add_id < 0) return std::nullopt;
    const Node& add = g.node(add_id);
    if (add.op != Op::ADD || !plain(add) || add.inputs.size() != 2 || add.inputs[0] != y || add.inputs[1] == y)
      return std::nullopt;
    const int xab = add.inputs[1];
    const int nb = g.tensor(xab).producer;
    if (nb < 0 || !plain_matmul(nb) || only_reader(xab) != add_id) return std::nullopt;
    const int xa = g.node(nb).inputs[0];
    const int na = g.tensor(xa).producer;
    // The fused node runs where the base matmul is: A's product must come after it (the builder's order).
    if (na <= base || !plain_matmul(na) || only_reader(xa) != nb || g.node(na).inputs[0] != x) return std::nullopt;
    const Tensor& a = g.tensor(g.node(na).inputs[1]);
    const Tensor& b = g.tensor(g.node(nb).inputs[1]);
    if (a.shape[0] != b.shape[1] || g.tensor(xab).numel() != g.tensor(y).numel()) return std::nullopt;
    return Term{g.node(na).inputs[1], g.node(nb).inputs[1], na, nb};
  };
  Rewriter rw(g);
  for (int id = 0; id < static_cast<int>(g.nodes().size()); ++id) {
    if (rw.skipped(id)) continue;
    if (!plain_matmul(id)) {
      rw.keep(id);
      continue;
    }
    const Node& n = g.node(id);
    const int x = n.inputs[0];
    Node f = n;
    int y = n.output;
    std::vector<int> skipped;
    while (true) {
      const int add_id = only_reader(y);
      const auto t = term(add_id, y, x, id);
      if (!t) break;
      append_names(&f.fusion.fused_from, g.node(t->node_a));
      append_names(&f.fusion.fused_from, g.node(t->node_b));
      append_names(&f.fusion.fused_from, g.node(add_id));
      f.inputs.push_back(t->a);
      f.inputs.push_back(t->b);
      f.flops += g.node(t->node_a).flops + g.node(t->node_b).flops + g.node(add_id).flops;
      ++f.fusion.lora;
      skipped.insert(skipped.end(), {t->node_a, t->node_b, add_id});
      y = g.node(add_id).output;
    }
    if (f.fusion.lora == 0) {
      rw.keep(id);
      continue;
    }
    f.fusion.fused_from.insert(f.fusion.fused_from.begin(), n.name);
    f.name = joined_name(f.fusion.fused_from);
    Tensor out = g.tensor(y);
    if (!out.is_output) out.name = f.name;  // a graph output keeps its name: runtimes and tests read it by name
    rw.replace(y, rw.add(std::move(f), std::move(out)));
    for (int s : skipped) rw.skip(s);
  }
  return rw.finish();
}

std::vector<LoraTerm> lora_terms(const Graph& g, const Node& n) {
  std::vector<LoraTerm> terms;
  if (n.fusion.lora <= 0) return terms;
  const size_t first = n.inputs.size() - 2 * static_cast<size_t>(n.fusion.lora);
  std::vector<int64_t> row0{0};
  for (int i = 0; i < n.fusion.n_weights; ++i)
    row0.push_back(row0.back() + g.tensor(n.inputs.at(static_cast<size_t>(1 + i))).shape.at(0));
  for (int i = 0; i < n.fusion.lora; ++i) {
    LoraTerm t;
    t.a = n.inputs.at(first + 2 * static_cast<size_t>(i));
    t.b = n.inputs.at(first + 2 * static_cast<size_t>(i) + 1);
    t.member = n.fusion.lora_member.empty() ? 0 : n.fusion.lora_member.at(static_cast<size_t>(i));
    TESSERA_CHECK(t.member >= 0 && t.member < n.fusion.n_weights, "graph passes: node '{}' has an adapter of member {}",
                  n.name, t.member);
    t.row0 = row0[static_cast<size_t>(t.member)];
    t.rows = row0[static_cast<size_t>(t.member) + 1] - t.row0;
    terms.push_back(t);
  }
  return terms;
}

Graph run_passes(const Graph& g, const FusionSupport& fs) {
  TESSERA_CHECK(!fs.chain_orders || fs.weight_values,
                "graph passes: the chain rewrite needs FusionSupport::weight_values");
  Graph r = fs.chain_orders ? apply_chain_orders(g, *fs.chain_orders, fs.weight_values) : g;
  if (fs.lora_first) r = fold_lora_epilogues(r, fs);
  r = fold_norm_prologues(r, fs);
  r = stack_matmuls(r, fs);
  r = fold_residual_adds(r, fs);
  r = fold_residual_norms(r, fs);
  r = fuse_rope_store_attention(r, fs);
  if (!fs.lora_first) r = fold_lora_epilogues(r, fs);
  const std::vector<std::string> problems = verify_rewrite(g, r);
  TESSERA_CHECK(problems.empty(), "graph passes: {} (and {} more)", problems.empty() ? "" : problems[0],
                problems.empty() ? 0 : problems.size() - 1);
  return r;
}

}  // namespace tessera::graph
