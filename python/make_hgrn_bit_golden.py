#!/usr/bin/env python3
"""A tiny random-weight MatMul-free LM (hgrn_bit) in its Hugging Face layout, with the logits of
python/hgrn_bit_reference.py's numpy forward, for tests/runtime/test_session_hf.cpp (HgrnBitHf).

Regenerate (numpy + safetensors): python3 python/make_hgrn_bit_golden.py [--out tests/data/hf]
writes tests/data/hf/tiny-hgrn-bit-f32/: config.json (HGRNBitConfig's keys as save_pretrained writes them),
model.safetensors (f32, the names HGRNBitForCausalLM's state_dict has) and golden.json (ids and logits [T, vocab]).
Linear weights ~ N(0, 0.1) (lm_head 0.5; ternarized at load by absmean), per-linear and block norms
1 + 0.3 N(0, 1), embeddings 0.5 N(0, 1), lower_bounds N(0, 1) (so the layers' forget-gate floors differ). 12 tokens:
the test runs them in chunks of 5 and of 1, so the recurrent state crosses chunk boundaries.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hgrn_bit_reference  # noqa: E402

CONFIG = {
    "architectures": ["HGRNBitForCausalLM"], "model_type": "hgrn_bit", "vocab_size": 128, "hidden_size": 64,
    "num_hidden_layers": 3, "attn_mode": "fused_recurrent", "num_heads": 4, "expand_ratio": 1,
    "use_short_conv": False, "conv_size": 4, "share_conv_kernel": True, "use_lower_bound": True, "hidden_ratio": 4,
    "intermediate_size": None, "hidden_act": "swish", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    "use_cache": True, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    "initializer_range": 0.02, "fuse_cross_entropy": True, "torch_dtype": "float32",
}
IDS = [(i * 37 + 5) % 128 for i in range(12)]


def make_weights(cfg: dict, rng: np.random.Generator) -> dict:
    e, v, n_layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    f = 256 * ((int(e * cfg["hidden_ratio"] * 2 / 3) + 255) // 256)  # HGRNBitMLP's intermediate_size
    f32 = np.float32
    sd = {"model.embeddings.weight": (0.5 * rng.standard_normal((v, e))).astype(f32),
          "model.lower_bounds": rng.standard_normal((n_layers, e)).astype(f32),
          "model.norm.weight": (1 + 0.3 * rng.standard_normal(e)).astype(f32)}

    def linear(name, n, k, std=0.1):
        sd[name + ".weight"] = (std * rng.standard_normal((n, k))).astype(f32)
        sd[name + ".norm.weight"] = (1 + 0.3 * rng.standard_normal(k)).astype(f32)

    for l in range(n_layers):
        p = f"model.layers.{l}."
        sd[p + "attn_norm.weight"] = (1 + 0.3 * rng.standard_normal(e)).astype(f32)
        sd[p + "mlp_norm.weight"] = (1 + 0.3 * rng.standard_normal(e)).astype(f32)
        sd[p + "attn.g_norm.weight"] = (1 + 0.3 * rng.standard_normal(e)).astype(f32)
        for proj in ("i_proj", "f_proj", "g_proj", "o_proj"):
            linear(p + "attn." + proj, e, e)
        linear(p + "mlp.gate_proj", 2 * f, e)
        linear(p + "mlp.down_proj", e, f)
    linear("lm_head", v, e, std=0.5)  # logits of a few units: top-2 gaps well above int8 noise
    return sd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "tests", "data", "hf"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from safetensors.numpy import save_file
    sd = make_weights(CONFIG, np.random.default_rng(a.seed))
    d = os.path.join(a.out, "tiny-hgrn-bit-f32")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(CONFIG, fh, indent=2, sort_keys=True)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    logits = hgrn_bit_reference.forward(sd, CONFIG, IDS)
    top1 = logits.argmax(axis=1)
    gaps = np.sort(logits, axis=1)[:, -2:]
    with open(os.path.join(d, "golden.json"), "w") as fh:
        json.dump({"generator": "python/make_hgrn_bit_golden.py", "seed": a.seed, "ids": IDS,
                   "logits": [[float(np.format_float_positional(np.float32(x), unique=True, trim="-"))
                               for x in row] for row in logits]}, fh)
    print(f"tiny-hgrn-bit-f32: {len(IDS)} tokens, logit scale {np.abs(logits).max():.3f}, distinct top-1 "
          f"{len(set(top1.tolist()))}/{len(IDS)}, smallest top-2 gap {np.min(gaps[:, 1] - gaps[:, 0]):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
