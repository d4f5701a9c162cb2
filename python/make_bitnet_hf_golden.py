#!/usr/bin/env python3
"""Tiny random-weight BitNet b1.58 checkpoints in transformers' packed form, with transformers' own logits, for
tests/runtime/test_session_hf.cpp (BitNetHf).

Regenerate (needs torch + transformers, e.g. /tmp/hfvenv):
  /tmp/hfvenv/bin/python python/make_bitnet_hf_golden.py [--out tests/data/hf]
writes tests/data/hf/tiny-*/ (config.json, model.safetensors, golden.json):
  tiny-bitnet-autobitlinear  BitNetForCausalLM as BitNet b1.58 2B4T ships: quantization_config linear_class
                             "autobitlinear", offline; q/k/v/o/gate/up/down packed four per uint8 (transformers'
                             pack_weights) with a bf16 weight_scale (W = ternary * scale); relu2, sub-norms
  tiny-bitnet-bitlinear      the same model type with the default class "bitlinear" (W = ternary / weight_scale)
                             and f32 scales
  tiny-falcon3-bitlinear     Falcon3-1.58bit's form: LlamaForCausalLM (SwiGLU, no sub-norms) with a BitNet
                             quantization_config (bitlinear)
  tiny-bitnet-256            tiny-bitnet-bitlinear at width 256 (intermediate 512): rows of whole 256-blocks, which
                             Tessera loads as TQ2_0 and runs on its native ternary kernels (--only NAME makes one)
The weights: every ternary matrix uniform in {-1, 0, 1} with a random scale, norms and embeddings random, lm_head in
float (transformers never converts it). golden.json holds the ids and the logits [T, vocab] of transformers' forward
of the saved files, loaded back with from_pretrained (so transformers' own deserializer unpacks them) in f32: the
activation fake-quant rounds at x * 127 / max|x|, so the reference runs in the dtype Tessera computes in.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# transformers' BitNet integration wraps unpacking and the activation quantizer in torch.compile; eager gives the
# same values without a compiler toolchain.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=128,
              num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
              tie_word_embeddings=False)
SPECS = {
    "tiny-bitnet-autobitlinear": dict(arch="bitnet", linear_class="autobitlinear", scale_dtype="bf16",
                                      rope_theta=500000.0),
    "tiny-bitnet-bitlinear": dict(arch="bitnet", linear_class="bitlinear", scale_dtype="f32", rope_theta=10000.0),
    "tiny-falcon3-bitlinear": dict(arch="llama", linear_class="bitlinear", scale_dtype="f32", rope_theta=1000.0),
    "tiny-bitnet-256": dict(arch="bitnet", linear_class="bitlinear", scale_dtype="f32", rope_theta=10000.0,
                            shape=dict(hidden_size=256, intermediate_size=512)),
}
IDS = [(i * 37 + 5) % 128 for i in range(10)]  # the ids test_session_hf.cpp feeds (vocab 128)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def make(name: str, spec: dict, out: str, seed: int) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers.integrations.bitnet import pack_weights

    torch.manual_seed(seed)
    qc = {"quant_method": "bitnet", "linear_class": spec["linear_class"], "quantization_mode": "offline"}
    common = dict(COMMON, **spec.get("shape", {}))
    kw = dict(common, rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"]})
    if spec["arch"] == "bitnet":
        cfg = transformers.BitNetConfig(**kw)
        model = transformers.BitNetForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**kw)
        model = transformers.LlamaForCausalLM(cfg)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items() if "rotary_emb" not in k}
    g = torch.Generator().manual_seed(seed + 1)
    scale_dtype = torch.bfloat16 if spec["scale_dtype"] == "bf16" else torch.float32
    for k in list(sd):
        t = sd[k]
        if k.endswith("norm.weight"):
            sd[k] = 1.0 + 0.3 * torch.randn(t.shape, generator=g)
        elif k in ("model.embed_tokens.weight", "lm_head.weight"):
            sd[k] = 0.5 * torch.randn(t.shape, generator=g)
        elif any(k == f"{p}.weight" for p in (f"model.layers.{i}.{lin}" for i in range(common["num_hidden_layers"])
                                             for lin in LINEARS)):
            tern = torch.randint(-1, 2, t.shape, generator=g).to(torch.float32)
            # Effective weight ~ 0.05..0.2 times ternary: the scale multiplies (autobitlinear) or divides (bitlinear).
            eff = float(torch.empty(()).uniform_(0.05, 0.2, generator=g))
            scale = eff if spec["linear_class"] == "autobitlinear" else 1.0 / eff
            sd[k] = pack_weights(tern.clone())
            sd[k[: -len("weight")] + "weight_scale"] = torch.tensor([scale], dtype=torch.float32).to(scale_dtype)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    cfg_dict = cfg.to_dict()
    cfg_dict["quantization_config"] = qc
    cfg_dict["architectures"] = ["BitNetForCausalLM" if spec["arch"] == "bitnet" else "LlamaForCausalLM"]
    cfg_dict["torch_dtype"] = "float32"
    cfg_dict.pop("dtype", None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})

    # The oracle: transformers loads the packed files itself and runs them.
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    kinds = {type(m).__name__ for m in hf.modules()}
    assert ("AutoBitLinear" if spec["linear_class"] == "autobitlinear" else "BitLinear") in kinds, kinds
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([IDS]), use_cache=False).logits[0].float().numpy()
    top1 = logits.argmax(axis=1)
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump({"generator": "python/make_bitnet_hf_golden.py", "seed": seed, "ids": IDS,
                   "transformers": transformers.__version__,
                   "logits": [[float(np.format_float_positional(np.float32(x), unique=True, trim="-"))
                               for x in row] for row in logits]}, f)
    print(f"{name}: {len(IDS)} tokens, logit scale {np.abs(logits).max():.3f}, distinct top-1 "
          f"{len(set(top1.tolist()))}/{len(IDS)}, modules {sorted(k for k in kinds if 'Bit' in k)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "tests", "data", "hf"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=sorted(SPECS), help="make only this model")
    a = ap.parse_args()
    for name, spec in SPECS.items():
        if a.only in (None, name):
            make(name, spec, a.out, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
