// Graph IR: the forward pass of a model as named nodes over named tensors, each node carrying its shapes, dtype,
// FLOPs and bytes. Builders (models/) emit it; backends compile it into an execution plan; `tessera graph` and
// `tessera profile` print it.
//
// A graph is built for a fixed number of tokens T at a position P: T fixes every activation shape, P only changes the
// attention cost (the keys a chunk reads), so one graph per T is executed at any P. The KV cache is explicit: each
// layer's cache tensors are graph inputs, and the nodes that store this chunk's keys and values output the updated
// caches (same storage, updated in place), which attention then reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace tessera::graph {

// Compute ops. Matmul follows the project convention y[T, N] = x[T, K] · Wᵀ with W row-major [N, K].
// Each op is one row of the op table (src/graph/ops.cpp, `op_info`): its name, class, traits, input count, shape
// check, output shape and cost. Adding an op is a value here plus that row (docs/ARCHITECTURE.md, "Recipes").
enum class Op : uint8_t {
  EMBED,      // (table[V, E], ids[T]) -> [T, E]: rows of the embedding table as f32
  RMSNORM,    // (x[T, E], w[E]) -> [T, E]
  MATMUL,     // (x[T, K], W[N, K]) -> [T, N]
  ROPE,       // (x[T, H*D], positions[T], inv_freq[R/2]) -> [T, H*D]: rotary embedding of each head
  KV_STORE,   // (x[T, Hkv*D], cache[Hkv, C, D]) -> cache: writes rows P..P+T-1 (in place)
  ATTENTION,  // (q[T, H*D], cache_k, cache_v) -> [T, H*D]: causal GQA attention over positions [0, P+t]
  ADD,        // (a[T, E], b[T, E]) -> [T, E]
  SWIGLU,     // (gate[T, F], up[T, F]) -> [T, F]: silu(gate) * up
  LAST_ROW,   // (x[T, E]) -> [1, E]: only the last token goes on to the output projection
  // Ops of the families beyond Llama (Gemma 3, Qwen2/3, Phi-3). Each is an op of its own rather than a parameter of
  // an op above, so a backend that lacks it refuses the node instead of running the older op without it.
  GEGLU,         // (gate[T, F], up[T, F]) -> [T, F]: gelu_tanh(gate) * up (Gemma)
  HEAD_RMSNORM,  // (x[T, H*D], w[D]) -> [T, H*D]: RMSNorm of each head's D values (Qwen3, Gemma 3 q/k norms)
  BIAS_ADD,      // (x[T, N], b[N]) -> [T, N]: x + b on every row (Qwen2 q/k/v biases)
  SOFTCAP,       // (x[T, N]) -> [T, N]: cap * tanh(x / cap), cap = params.scale (Gemma final logit softcapping)
  // Made by graph passes only (src/graph/passes), never by a model builder:
  SLICE,  // (x[T, N]) -> [T, n]: columns [slice_begin, slice_begin + n) of x, a view (row stride N) of a stack
  // The op docs/ARCHITECTURE.md's recipe for adding an op was proven with (its commit touched this file, ops.cpp, its
  // CPU kernel backends/cpu/ops/scale.cpp and its rows in tests/ops/test_ops.cpp); test-only at first, now Gemma's
  // embedding scale (x * sqrt(E)).
  SCALE,  // (x[T, E]) -> [T, E]: x * params.scale
  // TEAL activation sparsity (graph/passes/sparsify.h), made by that pass only:
  SPARSIFY,       // (x[T, K]) -> [T, K]: x with its smallest-magnitude entries zeroed, per row: |x| <= sparse_threshold
                  // (calibrated), or the floor(sparsity * K) smallest when sparse_threshold < 0 (top-k per token)
  MATMUL_SPARSE,  // (x[T, K], W[N, K]) -> [T, N]: MATMUL whose x is mostly zeros: kernels skip the weights of zero x
  // Ternary models (BitNet b1.58, the MatMul-free LM):
  // (x[T, K]) -> [T, K]: BitLinear's activation fake-quant, per row s = 127 / max(max|x|, 1e-5),
  // y = clamp(round_half_even(x * s), -128, 127) / s (transformers' ActQuant / BitLinear.activation_quant)
  ACT_QUANT_I8,
  RELU2_GLU,  // (gate[T, F], up[T, F]) -> [T, F]: relu(gate)^2 * up (BitNet b1.58's squared-ReLU gating, "relu2")
  // The MatMul-free LM's token mixer recurrence (MLGRU; ridgerchu/matmulfreellm's HGRNBitAttention), element-wise:
  // (f_raw[T, D], c_raw[T, D], lower_bound[D], state[D]) -> h[T, D] with f_t = lb + (1 - lb) * sigmoid(f_raw_t),
  // h_t = f_t * h_{t-1} + (1 - f_t) * silu(c_raw_t). `state` [D + 1] is the layer's recurrent state (a KV_CACHE-kind
  // leaf with IoRole STATE): h_{P-1} and then P, the tokens it has absorbed. It is read on entry (as zeros at P = 0,
  // a new sequence; Error when it holds another position: a recurrence cannot rewind) and holds h_{P+T-1}, P + T on
  // exit, so the node updates it in place, as KV_STORE updates its cache.
  MLGRU,
  COUNT,  // not an op: the number of ops (the op table has this many rows)
};
std::string_view op_name(Op op);
// Op class for totals: "matmul", "attention", "norm", "rope", "elementwise", "embedding", "kv_cache", "copy".
std::string_view op_class(Op op);

// Op traits: structural decisions (fusion, planning, totals) ask these, never `op == Op::MATMUL`, so an op added
// later states what it is once, in its row of the op table, instead of quietly falling out of every test that names
// ops.
bool is_matmul_like(Op op);  // (x[T, K], W[N, K], ...) -> [T, N]: reads a weight matrix, fusable epilogues/prologues
// Whether the op's output may take the storage of input `i` when that input dies at this node (the kernels read each
// element before writing it): ROPE and RMSNORM input 0, ADD and SWIGLU either input.
bool may_write_over_input(Op op, size_t i);
// Whether the op's output is a view of another tensor's storage (KV_STORE: its cache; SLICE: its input).
bool is_view(Op op);

class Graph;
struct Node;
struct Tensor;

// What the graph layer knows of an op: one row of the op table (src/graph/ops.cpp).
struct OpTraits {
  bool matmul_like = false;  // is_matmul_like
  uint8_t write_over = 0;    // bit i set: may_write_over_input(op, i)
  int8_t view_of = -1;       // the input whose storage the output is (is_view), -1 for its own storage
  bool pass_only = false;    // made by graph passes only: Graph::add_node rejects it
  bool test_only = false;    // exists for the tests (the op recipe's proof): model builders never emit it
};
struct OpInfo {
  Op op;
  std::string_view name;      // op_name: printers, profiles, errors
  std::string_view op_class;  // op_class: totals
  int n_inputs;               // inputs add_node takes (a pass's fused node may carry more)
  OpTraits traits;
  // Checks the node's inputs (their count and ids already checked) and params, and fills in the output tensor's shape,
  // dtype (f32 unless set) and alias, and the node's FLOPs and bytes. tessera::Error naming the node on a mismatch.
  // nullptr for pass-only ops.
  void (*infer)(const Graph& g, Node& n, Tensor& out);
};
const OpInfo& op_info(Op op);  // Error for a value that is not an op

enum class TensorKind : uint8_t {
  INPUT,       // fed per call: token ids, positions
  WEIGHT,      // constant: model weights (bound to the mapped file) and derived constants (rope inverse frequencies)
  KV_CACHE,    // persistent state owned by the session
  ACTIVATION,  // produced by a node
};
std::string_view tensor_kind_name(TensorKind k);

// What a graph input or output is for the caller: runtimes and executors find these tensors by role, never by name
// (names are for display). CACHE_K / CACHE_V come with their layer.
enum class IoRole : uint8_t {
  NONE,
  TOKENS,     // i32 [T] input: token ids
  POSITIONS,  // i32 [T] input: position of each token
  LOGITS,     // f32 [T or 1, vocab] output
  CACHE_K,    // KV_CACHE [Hkv, C, D] of one layer: keys
  CACHE_V,    // KV_CACHE [Hkv, C, D] of one layer: values
  STATE,      // KV_CACHE [D + 1] of one layer: a recurrent state kept across steps in place of a KV cache (MLGRU)
};
std::string_view io_role_name(IoRole r);

struct Tensor {
  std::string name;
  TensorKind kind = TensorKind::ACTIVATION;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // row-major, outermost first
  int producer = -1;           // node index, -1 for a leaf (INPUT, WEIGHT, KV_CACHE)
  int alias = -1;              // tensor whose storage this one is (a KV_STORE output is its cache), -1 if its own
  bool is_output = false;      // read by the caller after execution (logits, updated caches)
  IoRole io = IoRole::NONE;    // what the caller binds it to (Graph::set_io_role)
  int io_layer = -1;           // CACHE_K / CACHE_V: the layer
  const void* data = nullptr;  // WEIGHT: the bytes (mapped file or graph-owned); nullptr in display-only graphs

  int64_t numel() const;
  uint64_t nbytes() const;  // exact bytes in `dtype`
};

// Parameters of the ops that need more than their input shapes.
struct OpParams {
  float eps = 0;           // RMSNORM, HEAD_RMSNORM
  int64_t n_head = 0;      // ROPE (heads of its input), ATTENTION (query heads)
  int64_t n_head_kv = 0;   // ATTENTION, KV_STORE
  int64_t head_dim = 0;    // ROPE, ATTENTION, KV_STORE, HEAD_RMSNORM
  int64_t rope_dim = 0;    // ROPE: rotated dims per head
  bool rope_neox = false;  // ROPE: pairs (i, i + R/2) instead of (2i, 2i+1)
  float attn_scale = 0;    // ATTENTION: usually 1/sqrt(head_dim)
  // ATTENTION: sliding window; > 0: the token at position p attends to positions (p - window, p] only (Mistral, Gemma
  // local layers; HF's `sliding_window`, llama.cpp's n_swa). 0: every earlier position.
  int64_t window = 0;
  int64_t slice_begin = 0;      // SLICE: first column
  float scale = 0;              // SCALE: the factor; SOFTCAP: the cap
  float sparsity = 0;           // SPARSIFY: share of each row zeroed (top-k by magnitude) when sparse_threshold < 0
  float sparse_threshold = -1;  // SPARSIFY: zero the entries with |x| <= this (a calibrated threshold); < 0: top-k
};

// What a node made by a graph pass computes beyond its op (src/graph/passes/fuse.h). Builders leave it empty. Every
// tensor named here is also one of the node's inputs, so edges, liveness and printers see it.
struct Fusion {
  std::vector<std::string> fused_from;  // names of the source graph's nodes this node computes (empty: not fused)
  // Matmul-like nodes. inputs = {x, W0, ..., W(n_weights-1), then the tensors below that are set}.
  int n_weights = 1;     // weights stacked row-wise: one matmul over [sum N, K], output [T, sum N]
  int norm_weight = -1;  // prologue: x is RMSNorm'd with this weight (f32 [K]) by the matmul itself
  float norm_eps = 0;    //   and this epsilon
  int residual = -1;     // epilogue: output = residual + x·Wᵀ, written over the residual's storage
  bool swiglu = false;   // epilogue: silu(gate) * up of the [gate; up] stack, output [T, N/2]
  bool gate_up = false;  // a stack of (gate, up) whose outputs are one SWIGLU's gate and up (or its epilogue)
  int norm_out = -1;     // epilogue: the output of the RMSNORM (in_producer) whose quantized input it also writes
  // epilogue: y += (x·A_iᵀ)·B_iᵀ for i < lora (unmerged LoRA adapters, B scaled); A_i [r_i, K] and B_i [N_m, r_i]
  // are the node's last 2·lora inputs, A0, B0, A1, B1, ... In a stack, adapter i adapts member lora_member[i] (its
  // rows of the stacked output: graph::lora_terms in passes/fuse.h), added before a SwiGLU epilogue and into a
  // residual; empty lora_member: every adapter adapts member 0.
  int lora = 0;
  std::vector<int> lora_member;
  // RMSNORM: its output is written by its input's producer (that node's norm_out); it launches nothing itself.
  bool in_producer = false;
  // ATTENTION: rope + cache store + attention in one node. inputs = {q, cache_k, cache_v, k, v, positions, inv_freq}:
  // q and k unrotated (rotated with params.rope_dim / rope_neox), k and v stored at positions before attending.
  bool rope_store = false;
  bool empty() const { return fused_from.empty() && !in_producer; }
  // Whether the node's op alone computes the source nodes it names, with nothing else set (the matmul-chain rewrite's
  // matmul by a folded weight, passes/chain.h): executors run it as they run its op unfused.
  bool names_only() const {
    return !fused_from.empty() && n_weights == 1 && norm_weight < 0 && residual < 0 && !swiglu && !gate_up &&
           norm_out < 0 && lora == 0 && lora_member.empty() && !in_producer && !rope_store;
  }
};

// What part of the model a node computes; names follow shared/DESIGN.md.
enum class Role : uint8_t {
  NONE,
  TOKEN_EMBD,
  ATTN_NORM,
  ATTN_Q,
  ATTN_K,
  ATTN_V,
  ROPE_Q,
  ROPE_K,
  CACHE_K,
  CACHE_V,
  ATTN,
  ATTN_O,
  ATTN_RESIDUAL,
  FFN_NORM,
  FFN_GATE,
  FFN_UP,
  FFN_ACT,
  FFN_DOWN,
  FFN_RESIDUAL,
  LAST_TOKEN,
  OUTPUT_NORM,
  OUTPUT,
  // Families beyond Llama.
  EMBD_SCALE,   // Gemma: embeddings times sqrt(E)
  ATTN_Q_NORM,  // per-head q/k norms (Qwen3, Gemma 3)
  ATTN_K_NORM,
  ATTN_Q_BIAS,  // q/k/v biases (Qwen2)
  ATTN_K_BIAS,
  ATTN_V_BIAS,
  ATTN_POST_NORM,  // Gemma: norm of the attention block's output before the residual add
  FFN_POST_NORM,   // Gemma: norm of the FFN block's output before the residual add
  OUTPUT_SOFTCAP,  // Gemma: final logit softcapping
  // Ternary models (BitNet b1.58):
  ACT_QUANT,      // BitLinear's int8 activation fake-quant in front of ternary matmuls
  ATTN_SUB_NORM,  // BitNet: norm of the attention output before the o projection
  FFN_SUB_NORM,   // BitNet: norm of the gated activation before the down projection
  // The MatMul-free LM (hgrn_bit):
  LINEAR_NORM,     // a ternary linear's own RMSNorm of its input (its BitLinear's norm)
  MLGRU_I,         // the candidate projection (i_proj)
  MLGRU_F,         // the forget gate projection (f_proj)
  MLGRU_G,         // the output gate projection (g_proj)
  MLGRU,           // the recurrence
  MLGRU_OUT_NORM,  // RMSNorm of the gate projection (g_norm)
  MLGRU_OUT_GATE,  // ... times silu of the recurrence output
};
std::string_view role_name(Role r);

struct Node {
  std::string name;  // unique, e.g. "blk.3.attn_q"; also the name of its output tensor
  Op op = Op::ADD;
  Role role = Role::NONE;
  int layer = -1;           // transformer block index, -1 outside the blocks
  std::string block;        // "embd", "attn", "ffn", "output"
  std::vector<int> inputs;  // tensor ids, in the op's argument order
  int output = -1;          // tensor id
  OpParams params;
  uint64_t flops = 0;  // floating-point operations (a multiply-add counts 2)
  uint64_t bytes = 0;  // bytes read and written, each tensor once (weights included)
  Fusion fusion;       // set by graph passes only
  // The node of the graph the passes started from that this node's time is reported under (profiles index the
  // source graph): itself for a builder's node, the anchor of what a pass fused (a stack's first matmul, the matmul
  // that absorbed an add, the attention that absorbed rope and stores). -1 for a node with no source node (SLICE).
  int source = -1;
};

struct Edge {
  int from_tensor;  // the tensor carried
  int from_node;    // producer, -1 for a leaf tensor
  int to_node;
};

struct OpClassTotal {
  std::string op_class;
  uint64_t nodes = 0, flops = 0, bytes = 0;
};

struct Totals {
  uint64_t nodes = 0, flops = 0, bytes = 0;
  uint64_t matmul_flops = 0, matmul_bytes = 0;
  uint64_t weight_bytes = 0;           // distinct weight tensors read once
  std::vector<OpClassTotal> by_class;  // sorted by FLOPs, descending
  double matmul_flop_share() const { return flops ? double(matmul_flops) / double(flops) : 0.0; }
  double matmul_byte_share() const { return bytes ? double(matmul_bytes) / double(bytes) : 0.0; }
};

class Graph {
 public:
  Graph() = default;
  Graph(int64_t n_tokens, int64_t n_past) : n_tokens_(n_tokens), n_past_(n_past) {}

  int64_t n_tokens() const { return n_tokens_; }
  int64_t n_past() const { return n_past_; }
  std::string model_name;  // shown in headers of printed graphs

  // Leaves. Names must be unique (Error otherwise).
  int add_input(std::string name, DType dtype, std::vector<int64_t> shape);
  int add_weight(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  // A weight whose values the graph computes and owns (e.g. rope inverse frequencies), f32 [n].
  int add_constant(std::string name, std::vector<float> values);
  // The same with a shape (values row-major; Error unless their count is the shape's): the matmul-chain rewrite's
  // folded weight-only products (passes/chain.h), f32 [N, K].
  int add_constant(std::string name, std::vector<float> values, std::vector<int64_t> shape);
  // Whether `data` is the storage of one of this graph's constants. It lives as long as the graph and its copies
  // (they share it), not as long as the model: a cache keyed by weight addresses that outlives the graph must not hold
  // it, since another graph's constant may later be allocated at the same address.
  bool owns(const void* data) const;
  int add_kv_cache(std::string name, DType dtype, std::vector<int64_t> shape);

  // Appends a node whose output tensor is named after it; checks the inputs' shapes against the op (Error on a
  // mismatch, naming the node) and fills in the output shape, FLOPs and bytes. Returns the output tensor id.
  int add_node(std::string name, Op op, Role role, int layer, std::string block, std::vector<int> inputs,
               OpParams params = {});
  // Marks a tensor as a graph output.
  void mark_output(int tensor) { tensors_.at(static_cast<size_t>(tensor)).is_output = true; }
  // Gives a tensor its role for the caller; a role (with its layer) belongs to one tensor (Error otherwise).
  void set_io_role(int tensor, IoRole role, int layer = -1);
  // The tensor with this role (and layer, for caches); -1 when absent.
  int find_role(IoRole role, int layer = -1) const;
  // Like find_role, but Error naming `what` when absent.
  int require_role(IoRole role, int layer = -1) const;

  // For graph passes: replaces every tensor and node (leaf tensors are usually carried over; node outputs must name
  // their producers). Checks names are unique and ids in range; constants stay owned.
  void replace_contents(std::vector<Tensor> tensors, std::vector<Node> nodes);

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Tensor& tensor(int id) const { return tensors_.at(static_cast<size_t>(id)); }
  const Node& node(int id) const { return nodes_.at(static_cast<size_t>(id)); }
  int find_tensor(std::string_view name) const;  // -1 when absent
  int find_node(std::string_view name) const;    // -1 when absent

  // Every (tensor, producer, consumer) pair, leaves included, in node order.
  std::vector<Edge> edges() const;
  Totals totals() const;

 private:
  int add_tensor(Tensor t);

  int64_t n_tokens_ = 0;
  int64_t n_past_ = 0;
  std::vector<Tensor> tensors_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, int> tensor_index_;
  std::unordered_map<std::string, int> node_index_;
  std::vector<std::shared_ptr<std::vector<float>>> constants_;  // storage of add_constant tensors
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[1, 576]"

}  // namespace tessera::graph
