#!/usr/bin/env python3
"""A tiny random BitNet b1.58 model as bitnet.cpp's converter writes the 2B4T GGUF, with the logits of transformers'
BitNet model holding the same weights, for tests/models/test_bitnetcpp_gguf.cpp.

Regenerate (needs torch + transformers, e.g. /tmp/hfvenv):
  /tmp/hfvenv/bin/python python/make_bitnetcpp_gguf_golden.py [--out tests/data/gguf]
writes tests/data/gguf/bitnetcpp-b158.gguf and tests/data/gguf/bitnetcpp-b158.json (ids, transformers' logits
[T, vocab]).

The file, as microsoft/BitNet's utils/convert-hf-to-gguf-bitnet.py (class BitnetModel) writes BitNet b1.58 2B4T
with --outtype i2_s:
  general.architecture "bitnet-b1.58" (MODEL_ARCH.BITNET_B158 of its llama.cpp fork, which runs it with
  build_bitnet_158: relu(gate)^2 * up, sub-norms, NeoX rope, int8 activations); the keys under that prefix:
  block_count, context_length, embedding_length, feed_forward_length, attention.head_count,
  attention.head_count_kv, rope.freq_base, attention.layer_norm_rms_epsilon, vocab_size, rope.dimension_count;
  general.name, general.file_type 40 (LLAMA_FTYPE_MOSTLY_I2_S);
  tensors token_embd.weight F16 (its I2_S branch keeps 2-D non-linears in F16), output_norm.weight F32, and per
  block blk.N.{attn_norm, attn_sub_norm, ffn_norm, ffn_sub_norm}.weight F32 and blk.N.{attn_q, attn_k, attn_v,
  attn_output, ffn_gate, ffn_up, ffn_down}.weight I2_S (ggml type 36), q and k not permuted; no output.weight (the
  2B4T ties lm_head to the embedding).
I2_S is packed by python/make_i2s_golden.py's quantize_i2_s (bitnet.cpp's x86 layout, one f32 scale per tensor).
No tokenizer metadata: the test feeds ids.

The oracle: the same weights as transformers' BitNetForCausalLM in the 2B4T's own form (quantization_config
autobitlinear, offline: ternary packed four per uint8, W = ternary * weight_scale, int8 per-token activations),
loaded back with from_pretrained from a temporary directory and run in f32. Every scale is a bf16 value (the 2B4T's
weight_scale dtype), so I2_S's f32 scale, TQ2_0's fp16 one and transformers' bf16 one are the same number; the
embedding is rounded to f16 first, so both sides hold it exactly.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # transformers' BitNet unpacking, eager

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_i2s_golden import gguf_string, quantize_i2_s, write_gguf  # noqa: E402

ARCH = "bitnet-b1.58"
GGML_F32, GGML_F16, GGML_I2_S = 0, 1, 36
GGUF_U32, GGUF_F32, GGUF_STRING = 4, 6, 8
LLAMA_FTYPE_MOSTLY_I2_S = 40
# Rows of whole 256-blocks (hidden 256, intermediate 512), as every 2B4T matrix (2560, 6912): Tessera reads I2_S as
# TQ2_0 there and runs its native ternary kernels, the path the real file takes.
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
             num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
             tie_word_embeddings=True, hidden_act="relu2")
ROPE_THETA = 500000.0
IDS = [(i * 37 + 5) % 128 for i in range(10)]
# HF module -> bitnet.cpp tensor (its gguf-py TensorNameMap for BITNET_B158).
LINEARS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}
NORMS = {"input_layernorm": "attn_norm", "self_attn.attn_sub_norm": "attn_sub_norm",
         "post_attention_layernorm": "ffn_norm", "mlp.ffn_sub_norm": "ffn_sub_norm"}


def bf16_round(x: float) -> float:
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", b))[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "tests", "data", "gguf"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers.integrations.bitnet import pack_weights

    torch.manual_seed(a.seed)
    cfg = transformers.BitNetConfig(**SHAPE, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    model = transformers.BitNetForCausalLM(cfg)
    g = torch.Generator().manual_seed(a.seed + 1)
    L, E = SHAPE["num_hidden_layers"], SHAPE["hidden_size"]

    hf_sd: dict[str, torch.Tensor] = {}  # the transformers checkpoint
    tensors: list[tuple[str, list[int], int, bytes]] = []  # the bitnet.cpp GGUF: (name, shape, ggml type, bytes)
    embd = (0.5 * torch.randn((SHAPE["vocab_size"], E), generator=g)).to(torch.float16)
    hf_sd["model.embed_tokens.weight"] = embd.float()
    tensors.append(("token_embd.weight", list(embd.shape), GGML_F16, embd.numpy().tobytes()))
    state = model.state_dict()
    for l in range(L):
        for hf, gg in NORMS.items():
            w = 1.0 + 0.3 * torch.randn(state[f"model.layers.{l}.{hf}.weight"].shape, generator=g)
            hf_sd[f"model.layers.{l}.{hf}.weight"] = w
            tensors.append((f"blk.{l}.{gg}.weight", list(w.shape), GGML_F32, w.numpy().astype(np.float32).tobytes()))
        for hf, gg in LINEARS.items():
            shape = state[f"model.layers.{l}.{hf}.weight"].shape
            tern = torch.randint(-1, 2, shape, generator=g).to(torch.float32)
            scale = bf16_round(float(torch.empty(()).uniform_(0.05, 0.2, generator=g)))
            hf_sd[f"model.layers.{l}.{hf}.weight"] = pack_weights(tern.clone())
            hf_sd[f"model.layers.{l}.{hf}.weight_scale"] = torch.tensor([scale], dtype=torch.bfloat16)
            raw = quantize_i2_s(tern.numpy() * np.float32(scale))
            assert struct.unpack("<f", raw[tern.numel() // 4:tern.numel() // 4 + 4])[0] == scale
            tensors.append((f"blk.{l}.{gg}.weight", list(shape), GGML_I2_S, raw))
    w = 1.0 + 0.3 * torch.randn((E,), generator=g)
    hf_sd["model.norm.weight"] = w
    tensors.append(("output_norm.weight", [E], GGML_F32, w.numpy().astype(np.float32).tobytes()))

    # The oracle: transformers loads its packed checkpoint itself (AutoBitLinear) and runs it in f32.
    with tempfile.TemporaryDirectory() as d:
        cfg_dict = cfg.to_dict()
        cfg_dict["quantization_config"] = {"quant_method": "bitnet", "linear_class": "autobitlinear",
                                           "quantization_mode": "offline"}
        cfg_dict["architectures"] = ["BitNetForCausalLM"]
        cfg_dict["torch_dtype"] = "float32"
        cfg_dict.pop("dtype", None)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg_dict, f)
        save_file({k: v.contiguous() for k, v in hf_sd.items()}, os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
        hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        assert "AutoBitLinear" in {type(m).__name__ for m in hf.modules()}
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([IDS]), use_cache=False).logits[0].float().numpy()

    p = ARCH + "."
    u32 = lambda v: struct.pack("<I", v)  # noqa: E731
    f32 = lambda v: struct.pack("<f", v)  # noqa: E731
    kvs = [("general.architecture", GGUF_STRING, gguf_string(ARCH)),
           ("general.name", GGUF_STRING, gguf_string("bitnetcpp-b158-tiny")),
           (p + "block_count", GGUF_U32, u32(L)),
           (p + "context_length", GGUF_U32, u32(SHAPE["max_position_embeddings"])),
           (p + "embedding_length", GGUF_U32, u32(E)),
           (p + "feed_forward_length", GGUF_U32, u32(SHAPE["intermediate_size"])),
           (p + "attention.head_count", GGUF_U32, u32(SHAPE["num_attention_heads"])),
           (p + "attention.head_count_kv", GGUF_U32, u32(SHAPE["num_key_value_heads"])),
           (p + "rope.freq_base", GGUF_F32, f32(ROPE_THETA)),
           (p + "attention.layer_norm_rms_epsilon", GGUF_F32, f32(SHAPE["rms_norm_eps"])),
           ("general.file_type", GGUF_U32, u32(LLAMA_FTYPE_MOSTLY_I2_S)),
           (p + "vocab_size", GGUF_U32, u32(SHAPE["vocab_size"])),
           (p + "rope.dimension_count", GGUF_U32, u32(E // SHAPE["num_attention_heads"])),
           ("general.alignment", GGUF_U32, u32(32))]
    gguf_path = os.path.join(a.out, "bitnetcpp-b158.gguf")
    write_gguf(gguf_path, kvs, tensors)
    with open(os.path.join(a.out, "bitnetcpp-b158.json"), "w") as f:
        json.dump({"generator": "python/make_bitnetcpp_gguf_golden.py", "seed": a.seed, "ids": IDS,
                   "transformers": transformers.__version__,
                   "logits": [[float(np.format_float_positional(np.float32(x), unique=True, trim="-"))
                               for x in row] for row in logits]}, f)
    top1 = logits.argmax(axis=1)
    print(f"{gguf_path}: {os.path.getsize(gguf_path)} bytes, {len(IDS)} tokens, logit scale "
          f"{np.abs(logits).max():.3f}, distinct top-1 {len(set(top1.tolist()))}/{len(IDS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
