#!/usr/bin/env python3
"""Random-weight ternary models at real shapes for speed measurements (no checkpoint can be fetched here):
  mmfreelm-370m   the MatMul-free LM's 370M shape (hgrn_bit: hidden 1024, 24 layers, MLP 2816, vocab 32000), bf16
                  float weights ternarized by Tessera at load (the released checkpoints' form)
  bitnet-370m     a BitNet b1.58 (Llama-shaped: attention with 16 heads, relu2 MLP, sub-norms) of the same matrices
                  and parameter count, in transformers' packed form (AutoBitLinear offline, bf16 weight_scale)
Both run the same ternary matrices, so the comparison is the token mixer's: the MLGRU's element-wise recurrence
against attention over a KV cache.

  /tmp/hfvenv/bin/python python/make_ternary_bench_models.py --out /tmp/ternary-bench
  build/bin/tessera bench -m /tmp/ternary-bench/mmfreelm-370m -p 128 -n 64 -t 2
  build/bin/tessera bench -m /tmp/ternary-bench/bitnet-370m -p 128 -n 64 -t 2 [-d 1024]
With --bitnet-2b4t it writes only bitnet-2b4t, BitNet b1.58 2B4T's shape (2.4B parameters, 1.2 GB).
Tessera loads the ternary linears of all three as TQ2_0 (rows of whole 256-blocks), the native CPU kernels.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

E, L, F, V, HEADS = 1024, 24, 2816, 32000, 16


def bitnet(d: str, E: int, L: int, F: int, V: int, heads: int, kv_heads: int) -> int:
    """A random BitNet b1.58 in transformers' packed form (AutoBitLinear offline, bf16 weight_scale) in `d`; returns
    its parameter count."""
    import torch
    from safetensors.torch import save_file
    from transformers.integrations.bitnet import pack_weights
    bf = torch.bfloat16

    def norm(n):
        return (1 + 0.1 * torch.randn(n)).to(bf)

    hd = E // heads
    sd = {"model.embed_tokens.weight": (0.5 * torch.randn(V, E)).to(bf), "model.norm.weight": norm(E),
          "lm_head.weight": (0.02 * torch.randn(V, E)).to(bf)}
    n_bitnet = V * E * 2 + E
    for l in range(L):
        p = f"model.layers.{l}."
        sd[p + "input_layernorm.weight"], sd[p + "post_attention_layernorm.weight"] = norm(E), norm(E)
        sd[p + "self_attn.attn_sub_norm.weight"], sd[p + "mlp.ffn_sub_norm.weight"] = norm(E), norm(F)
        for name, n, k in (("self_attn.q_proj", E, E), ("self_attn.k_proj", kv_heads * hd, E),
                           ("self_attn.v_proj", kv_heads * hd, E), ("self_attn.o_proj", E, E),
                           ("mlp.gate_proj", F, E), ("mlp.up_proj", F, E), ("mlp.down_proj", E, F)):
            sd[p + name + ".weight"] = pack_weights(torch.randint(-1, 2, (n, k), dtype=torch.int8).to(torch.float32))
            sd[p + name + ".weight_scale"] = torch.tensor([0.02], dtype=bf)
            n_bitnet += n * k
        n_bitnet += 3 * E + F
    os.makedirs(d, exist_ok=True)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["BitNetForCausalLM"], "model_type": "bitnet", "hidden_size": E,
                   "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": heads,
                   "num_key_value_heads": kv_heads, "vocab_size": V, "rms_norm_eps": 1e-5, "hidden_act": "relu2",
                   "max_position_embeddings": 4096, "tie_word_embeddings": False,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
                   "quantization_config": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                                           "quantization_mode": "offline"}}, f)
    return n_bitnet


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--bitnet-2b4t", action="store_true",
                    help="write only bitnet-2b4t: BitNet b1.58 2B4T's shape (hidden 2560, 30 layers, MLP 6912, 20 heads, "
                         "5 kv heads, vocab 128256; lm_head in bf16, as the checkpoint keeps its tied embeddings)")
    a = ap.parse_args()
    if a.bitnet_2b4t:
        import torch
        torch.manual_seed(0)
        n = bitnet(os.path.join(a.out, "bitnet-2b4t"), 2560, 30, 6912, 128256, 20, 5)
        print(f"bitnet-2b4t: {n / 1e6:.1f}M parameters")
        return 0
    import torch
    from safetensors.torch import save_file
    from transformers.integrations.bitnet import pack_weights
    torch.manual_seed(0)
    bf = torch.bfloat16

    def norm(n):
        return (1 + 0.1 * torch.randn(n)).to(bf)

    # The MatMul-free LM, HGRNBitForCausalLM's names.
    sd = {"model.embeddings.weight": (0.5 * torch.randn(V, E)).to(bf), "model.lower_bounds": torch.randn(L, E).to(bf),
          "model.norm.weight": norm(E)}

    def lin(name, n, k):
        sd[name + ".weight"] = (0.02 * torch.randn(n, k)).to(bf)
        sd[name + ".norm.weight"] = norm(k)

    for l in range(L):
        p = f"model.layers.{l}."
        sd[p + "attn_norm.weight"], sd[p + "mlp_norm.weight"], sd[p + "attn.g_norm.weight"] = norm(E), norm(E), norm(E)
        for proj in ("i_proj", "f_proj", "g_proj", "o_proj"):
            lin(p + "attn." + proj, E, E)
        lin(p + "mlp.gate_proj", 2 * F, E)
        lin(p + "mlp.down_proj", E, F)
    lin("lm_head", V, E)
    d = os.path.join(a.out, "mmfreelm-370m")
    os.makedirs(d, exist_ok=True)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["HGRNBitForCausalLM"], "model_type": "hgrn_bit", "hidden_size": E,
                   "num_hidden_layers": L, "num_heads": 1, "expand_ratio": 1, "use_short_conv": False,
                   "hidden_ratio": 4, "intermediate_size": None, "vocab_size": V, "rms_norm_eps": 1e-6,
                   "use_lower_bound": True, "tie_word_embeddings": False, "max_position_embeddings": 2048}, f)
    n_hgrn = sum(t.numel() for t in sd.values())

    # BitNet b1.58, Llama-shaped, packed.
    n_bitnet = bitnet(os.path.join(a.out, "bitnet-370m"), E, L, F, V, HEADS, HEADS)
    print(f"mmfreelm-370m: {n_hgrn / 1e6:.1f}M parameters; bitnet-370m: {n_bitnet / 1e6:.1f}M parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
