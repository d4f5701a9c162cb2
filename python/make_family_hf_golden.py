#!/usr/bin/env python3
"""Tiny random-weight Hugging Face models of the families beyond Llama, with transformers' logits, for
tests/runtime/test_session_hf.cpp (FamilyHf).

Regenerate (needs torch + transformers, e.g. a scratch venv: python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip
install torch transformers numpy safetensors):
  /tmp/hfvenv/bin/python python/make_family_hf_golden.py [--out tests/data/hf]
writes tests/data/hf/tiny-{gemma3,qwen2,qwen3,mistral,phi3,phi3-longrope,qwen3-yarn}-f32/ (config.json and model.safetensors from
save_pretrained, and golden.json: the token ids, and transformers' eager float64 forward of the saved f32 weights as logits [T, vocab]).
The weights are made as python/hf_oracle.py makes its (transformers' init, q/k scaled, norm weights and biases at
random), at a smaller shape; the sliding windows (Gemma 3: 4 on its local layers, Mistral: 5, Phi-3: 6) are shorter
than the 10 test tokens, so the windows drop keys. Phi-3 stores q|k|v and gate|up fused and rotates half of each head.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_oracle  # noqa: E402

COMMON = dict(initializer_range=0.1, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, vocab_size=128, max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
SPECS = {
    "tiny-gemma3-f32": dict(COMMON, family="gemma3", num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=12,
                            sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                            rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
                            final_logit_softcapping=5.0, tie_word_embeddings=True, pad_token_id=0),
    "tiny-qwen2-f32": dict(COMMON, family="qwen2", num_hidden_layers=2, rope_theta=1000000.0, rms_norm_eps=1e-6,
                           tie_word_embeddings=True),
    "tiny-qwen3-f32": dict(COMMON, family="qwen3", num_hidden_layers=2, head_dim=16, rope_theta=1000000.0,
                           rms_norm_eps=1e-6, tie_word_embeddings=False),
    "tiny-mistral-f32": dict(COMMON, family="mistral", num_hidden_layers=2, rope_theta=10000.0, rms_norm_eps=1e-5,
                             sliding_window=5, tie_word_embeddings=False),
    "tiny-phi3-f32": dict(COMMON, family="phi3", num_hidden_layers=2, rope_theta=10000.0, partial_rotary_factor=0.5,
                          rms_norm_eps=1e-5, sliding_window=6, tie_word_embeddings=False, pad_token_id=0),
    # Phi-3's longrope (the 128k variants): the 10 test tokens pass the original context of 8, so transformers rotates
    # with long_factor; golden_short.json holds the first 6 tokens, rotated with short_factor. The attention factor is
    # transformers' default from 64 / 8: sqrt(1 + ln 8 / ln 8).
    "tiny-phi3-longrope-f32": dict(COMMON, family="phi3", num_hidden_layers=2, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False, pad_token_id=0, max_position_embeddings=64,
                                   original_max_position_embeddings=8,
                                   rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                    "short_factor": [1.0, 1.25, 2.5, 4.0],
                                                    "long_factor": [1.5, 3.0, 7.5, 16.0]}),
    # YaRN (Qwen's long-context setting): factor 4 over an original context of 4096; at head size 32 the band blended
    # between kept and interpolated frequencies spans pairs 5-12 of 16. Attention factor 0.1 ln 4 + 1.
    "tiny-qwen3-yarn-f32": dict(COMMON, family="qwen3", num_hidden_layers=2, head_dim=32, rms_norm_eps=1e-6,
                                tie_word_embeddings=False, max_position_embeddings=16384,
                                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 4096}),
}
SHORT = {"tiny-phi3-longrope-f32": 6}  # models with a golden_short.json of their first N ids
IDS = [(i * 37 + 5) % 128 for i in range(10)]  # the ids test_session_hf.cpp feeds (vocab 128)


def write_golden(path: str, seed: int, ids: list, logits) -> None:
    with open(path, "w") as f:
        json.dump({"generator": "python/make_family_hf_golden.py", "seed": seed, "ids": ids,
                   "logits": [[float(np.format_float_positional(np.float32(x), unique=True, trim="-"))
                               for x in row] for row in logits]}, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "tests", "data", "hf"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="write only this model (a name from SPECS)")
    a = ap.parse_args()
    import torch
    for name, spec in SPECS.items():
        if a.only and name != a.only:
            continue
        torch.manual_seed(a.seed)
        cfg = hf_oracle.make_config(spec)
        model = hf_oracle.make_model(spec, cfg).eval()
        hf_oracle.shape_init(torch, model, cfg, spec)
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        model.double()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([IDS]), use_cache=False).logits[0].numpy()
        top1 = logits.argmax(axis=1)
        write_golden(os.path.join(d, "golden.json"), a.seed, IDS, logits)
        if name in SHORT:
            ids = IDS[:SHORT[name]]
            with torch.no_grad():
                short = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()
            write_golden(os.path.join(d, "golden_short.json"), a.seed, ids, short)
        print(f"{name}: {len(IDS)} tokens, logit scale {np.abs(logits).max():.3f}, distinct top-1 "
              f"{len(set(top1.tolist()))}/{len(IDS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
