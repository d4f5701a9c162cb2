// The MatMul-free LM (Zhu et al. 2024; ridgerchu/matmulfreellm's HGRNBitForCausalLM, model type "hgrn_bit"): a
// decoder whose token mixer is the MLGRU, a gated element-wise linear recurrence, in place of attention, and whose
// every linear (lm_head included) is a BitLinear: its own RMSNorm of its input, int8 per-token activations, ternary
// weights. Per layer:
//   h = RMSNorm(x);  i, f, g = BitLinear_{i,f,g}(h)            (each with its own norm and quantizer)
//   r = MLGRU(f, i) with the layer's lower bound and state      (op MLGRU: h_t = f h_{t-1} + (1 - f) silu(i))
//   x = x + BitLinear_o(RMSNorm(g) * silu(r))                   (the code's g_norm: FusedRMSNormSwishGate(g, r))
//   x = x + BitLinear_down(silu(gate) * up), gate|up = BitLinear_gate_up(RMSNorm(x))
// then RMSNorm and BitLinear_lm_head. The recurrent state is one [E] vector per layer (IoRole::STATE): memory per
// token of context is zero, by construction.
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"
#include "models/llama.h"
#include "models/model_weights.h"

namespace tessera {

// Graph inputs: TOKENS "tokens" i32 [T] and STATE "blk.N.state" f32 [E + 1] per layer (updated in place); output:
// LOGITS "output" f32 [T or 1, vocab]. options.n_ctx and kv_dtype are unused (no cache grows with the context).
graph::Graph build_hgrn_bit_graph(const ModelWeights& weights, const LlamaGraphOptions& options);

// Each layer's forget-gate lower bound lb[l][E] from lower_bounds [L, E] as HGRNBitModel computes it: softmax over the
// layers per channel, cumulative sum, minus the first layer's share (so layer 0's bound is 0).
std::vector<std::vector<float>> hgrn_lower_bounds(const float* lower_bounds /*[L, E]*/, int64_t n_layers, int64_t e);

// The released MatMul-free LM shapes (ridger/MMfreeLM-370M, -1.3B, -2.7B: num_heads 1, hidden_ratio 4, vocab 32000,
// no short convolution, lower bounds on) by name: "mmfreelm-370m" (hidden 1024, 24 layers), "mmfreelm-1.3b" (2048,
// 24), "mmfreelm-2.7b" (2560, 32); the MLP width follows HGRNBitMLP's rule. Error naming the known ones otherwise.
ModelConfig hgrn_bit_preset(const std::string& name);
std::vector<std::string> hgrn_bit_preset_names();
// Parameters of a hgrn_bit model: embeddings, per layer 4 E^2 (i, f, g, o) + 3 E F (gate|up, down) + norms, the
// lower bounds, lm_head and its norm.
int64_t hgrn_bit_parameters(const ModelConfig& c);

}  // namespace tessera
