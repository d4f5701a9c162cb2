#!/usr/bin/env python3
"""A tiny random-weight Llama base and random PEFT LoRA adapters, with transformers + peft logits, for
tests/models/test_lora.cpp.

Regenerate (needs torch, transformers, peft and safetensors, e.g. the scratch venv of make_family_hf_golden.py plus
`/tmp/hfvenv/bin/pip install peft`; the GGUF form needs llama.cpp's source tree for convert_lora_to_gguf.py and gguf-py):
  /tmp/hfvenv/bin/python python/make_lora_golden.py [--out tests/data/lora] [--llama-cpp DIR]
writes into --out:
  base/          config.json + model.safetensors (LlamaForCausalLM, f32, 2 layers, hidden 32, vocab 128)
  adapter_a/     PEFT LoRA r=4, lora_alpha=8 on all seven projections (q, k, v, o, gate, up, down), A and B random
  adapter_b/     PEFT LoRA r=2, lora_alpha=3, use_rslora (scale alpha/sqrt(r)) on q, v and down only
  adapter_a.gguf adapter_a converted by llama.cpp's convert_lora_to_gguf.py (--outtype f32), when --llama-cpp is given
  golden.json    ids and float64 logits [T, vocab] of the base, base+a, base+b and base+a+b (both adapters active
                 at once in one PeftModel), each from transformers' eager forward of the saved f32 weights.
B is drawn at random too (peft's init_lora_weights=False), so each adapter changes the logits.
Then python/make_lora_llamacpp_golden.py adds the base as a GGUF and llama.cpp's own logits without and with
adapter_a.gguf (tests/models/test_lora_llamacpp.cpp); rerun it after this script.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
IDS = [(i * 37 + 5) % 128 for i in range(10)]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def rounded(logits):
    return [[float(np.format_float_positional(np.float32(x), unique=True, trim="-")) for x in row] for row in logits]


def bench_adapter(a) -> int:
    from safetensors.numpy import save_file
    e, f, h, hkv, d, layers = (int(x) for x in a.shape.split(","))
    shapes = {"self_attn.q_proj": (h * d, e), "self_attn.k_proj": (hkv * d, e), "self_attn.v_proj": (hkv * d, e),
              "self_attn.o_proj": (e, h * d), "mlp.gate_proj": (f, e), "mlp.up_proj": (f, e),
              "mlp.down_proj": (e, f)}
    rng = np.random.default_rng(a.seed)
    tensors = {}
    for layer in range(layers):
        for mod, (n, k) in shapes.items():
            pre = f"base_model.model.model.layers.{layer}.{mod}"
            tensors[pre + ".lora_A.weight"] = (rng.standard_normal((a.rank, k)) / np.sqrt(k)).astype(np.float32)
            tensors[pre + ".lora_B.weight"] = (rng.standard_normal((n, a.rank)) * 0.01).astype(np.float32)
    os.makedirs(a.bench_adapter, exist_ok=True)
    save_file(tensors, os.path.join(a.bench_adapter, "adapter_model.safetensors"))
    with open(os.path.join(a.bench_adapter, "adapter_config.json"), "w") as fh:
        json.dump({"peft_type": "LORA", "r": a.rank, "lora_alpha": 2 * a.rank, "target_modules": ALL,
                   "bias": "none", "use_rslora": False}, fh, indent=2)
    print(f"{a.bench_adapter}: rank {a.rank}, {len(tensors)} tensors")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "tests", "data", "lora"))
    ap.add_argument("--llama-cpp", default="", help="llama.cpp source tree (for convert_lora_to_gguf.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bench-adapter", default="",
                    help="instead: write a random PEFT adapter of --rank on all seven projections of a model of "
                         "--shape into this folder (numpy only; for `tessera bench --lora`)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--shape", default="576,1536,9,3,64,30",
                    help="hidden,ffn,heads,kv_heads,head_dim,layers (default: SmolLM2-135M)")
    a = ap.parse_args()
    if a.bench_adapter:
        return bench_adapter(a)
    import torch
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(a.seed)
    cfg = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                   vocab_size=128, num_hidden_layers=2, max_position_embeddings=256,
                                   rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                                   initializer_range=0.1, bos_token_id=1, eos_token_id=2,
                                   attn_implementation="eager")
    base = transformers.LlamaForCausalLM(cfg).eval()
    base_dir = os.path.join(a.out, "base")
    os.makedirs(base_dir, exist_ok=True)
    base.save_pretrained(base_dir)
    gen = os.path.join(base_dir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)

    specs = {"adapter_a": dict(r=4, lora_alpha=8, target_modules=ALL),
             "adapter_b": dict(r=2, lora_alpha=3, use_rslora=True, target_modules=["q_proj", "v_proj", "down_proj"])}
    for name, spec in specs.items():
        fresh = transformers.LlamaForCausalLM.from_pretrained(base_dir, attn_implementation="eager")
        pm = get_peft_model(fresh, LoraConfig(init_lora_weights=False, lora_dropout=0.0, **spec))
        with torch.no_grad():  # peft's random init leaves small products; scale A and B so each adapter shows
            for n, p in pm.named_parameters():
                if "lora_" in n:
                    p.normal_(0.0, 0.3)
        d = os.path.join(a.out, name)
        pm.save_pretrained(d)
        os.remove(os.path.join(d, "README.md"))  # peft's model card template: nothing the tests read
        with open(os.path.join(d, "adapter_config.json")) as f:
            ac = json.load(f)
        ac["base_model_name_or_path"] = "../base"  # not this machine's absolute path
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(ac, f, indent=2, sort_keys=True)

    def logits(adapters):
        m = transformers.LlamaForCausalLM.from_pretrained(base_dir, attn_implementation="eager",
                                                          dtype=torch.float32)
        if adapters:
            m = PeftModel.from_pretrained(m, os.path.join(a.out, adapters[0]), adapter_name=adapters[0])
            for extra in adapters[1:]:
                m.load_adapter(os.path.join(a.out, extra), adapter_name=extra)
            m.base_model.set_adapter(list(adapters))
        m = m.double().eval()
        with torch.no_grad():
            return m(input_ids=torch.tensor([IDS]), use_cache=False).logits[0].numpy()

    out = {"generator": "python/make_lora_golden.py", "seed": a.seed, "ids": IDS}
    for key, ads in {"base": [], "a": ["adapter_a"], "b": ["adapter_b"], "ab": ["adapter_a", "adapter_b"]}.items():
        lg = logits(ads)
        out[key] = rounded(lg)
        print(f"{key}: logit scale {np.abs(lg).max():.3f}")
    d_ab = np.abs(np.array(out["ab"]) - np.array(out["a"])).max()
    print(f"largest change of adding b to a: {d_ab:.3f}")
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(out, f)

    if a.llama_cpp:
        env = dict(os.environ, PYTHONPATH=os.path.join(a.llama_cpp, "gguf-py"))
        subprocess.run([sys.executable, os.path.join(a.llama_cpp, "convert_lora_to_gguf.py"), "--base", base_dir,
                        "--outtype", "f32", "--outfile", os.path.join(a.out, "adapter_a.gguf"),
                        os.path.join(a.out, "adapter_a")], check=True, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
