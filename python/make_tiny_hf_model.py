#!/usr/bin/env python3
"""Writes tiny random-weight Hugging Face Llama/Mistral models and their golden data into tests/data/hf/.

Regenerate (deterministic, seeded):
    .venv/bin/python python/make_tiny_hf_model.py

Uses numpy and the `safetensors` package only (no torch): tensors are serialized through safetensors' own writer, and
config.json mirrors what transformers' save_pretrained writes (sorted keys, indent 2). Outputs:

  tiny-llama-bf16-tied/   LlamaForCausalLM, bf16, tied output (no lm_head.weight), a byte-level BPE tokenizer.json
  tiny-llama3-f32/        LlamaForCausalLM, f32, separate lm_head, rope_scaling llama3, rope_theta 500000
  tiny-mistral-sharded/   MistralForCausalLM, f16, 2 shards + model.safetensors.index.json, head_dim != hidden/heads
  dtypes.safetensors      one tensor per supported dtype with special values (+-0, inf, nan, subnormals, int limits)
  golden.json             what the C++ tests compare against: the ModelConfig each config.json must give, every
                          tensor's dtype, shape, byte range, GGUF name (from gguf-py's name map), FNV-1a 64 of its raw
                          bytes and of its values converted to f32 by numpy, and sample f32 bit patterns.
"""

import json
import os
import struct
import sys

import gguf
import numpy as np
import safetensors
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf")
TRANSFORMERS_VERSION = "4.46.3"


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# Stored array (raw little-endian bytes) -> its values as f32 (None for integer dtypes), computed by numpy.
def as_f32(dtype: str, raw: np.ndarray):
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype in ("F16", "F32"):
        return raw.astype(np.float32)
    return None  # integers, and F64 (Tessera reads it raw; converting to f32 would round)


ST_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
            "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8"}


def write_safetensors(path: str, tensors: dict, metadata: dict):
    """tensors: name -> (safetensors dtype, numpy array of the stored bits/values)."""
    specs = {}
    keep = []
    for name, (dt, arr) in tensors.items():
        arr = np.array(arr, order="C", copy=True)  # ascontiguousarray would make 0-d arrays 1-d
        keep.append(arr)
        specs[name] = safetensors.TensorSpec(dtype=ST_DTYPE[dt], shape=list(arr.shape), data_ptr=arr.ctypes.data,
                                             data_len=arr.nbytes)
    safetensors.serialize_file(specs, path, metadata)
    os.chmod(path, 0o644)  # the writer creates files 0600


def read_offsets(path: str) -> dict:
    """name -> absolute [begin, end) in the file, from the header as written."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    base = 8 + n
    return {k: [base + v["data_offsets"][0], base + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def tensor_golden(name: str, dt: str, arr: np.ndarray, shard: str, offsets: dict, name_map) -> dict:
    raw = np.array(arr, order="C", copy=True)  # ascontiguousarray would make 0-d arrays 1-d
    g = {
        "name": name,
        "dtype": dt.lower(),
        "shape": list(raw.shape),
        "shard": shard,
        "offset": offsets[name][0],
        "nbytes": offsets[name][1] - offsets[name][0],
        "fnv1a64_raw": f"{fnv1a64(raw.tobytes()):016x}",
    }
    assert g["nbytes"] == raw.nbytes
    if name_map is not None:
        g["gguf_name"] = name_map.get_name(name, try_suffixes=(".weight", ".bias")) or ""
    f = as_f32(dt, raw)
    flat = raw.reshape(-1)
    if f is not None:
        f = f.reshape(-1)
        g["fnv1a64_f32"] = f"{fnv1a64(f.astype('<f4').tobytes()):016x}"
        idx = sorted({0, len(f) // 3, len(f) // 2, len(f) - 1}) if len(f) else []
        g["samples_f32_bits"] = [[i, int(f[i:i + 1].view(np.uint32)[0])] for i in idx]
    else:
        # Integers as they are; F64 as its IEEE bit patterns (exact in JSON).
        g["values_raw_int"] = [int(v) for v in (flat.view(np.uint64) if dt == "F64" else flat)]
    return g


def llama_tensors(rng, cfg: dict, dt: str, tied: bool) -> dict:
    """State-dict order of transformers' LlamaForCausalLM / MistralForCausalLM."""
    h, ff, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh

    def mat(rows, cols, std=0.1):
        x = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        return store(x)

    def norm(n):
        return store((1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    def store(x):
        if dt == "BF16":
            return (dt, to_bf16_bits(x))
        if dt == "F16":
            return (dt, x.astype(np.float16))
        return (dt, x)

    t = {"model.embed_tokens.weight": mat(v, h)}                              # (vocab, hidden)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = mat(nh * hd, h)                   # (n_head * head_dim, hidden)
        t[p + "self_attn.k_proj.weight"] = mat(nkv * hd, h)                  # (n_head_kv * head_dim, hidden)
        t[p + "self_attn.v_proj.weight"] = mat(nkv * hd, h)                  # (n_head_kv * head_dim, hidden)
        t[p + "self_attn.o_proj.weight"] = mat(h, nh * hd)                   # (hidden, n_head * head_dim)
        t[p + "mlp.gate_proj.weight"] = mat(ff, h)                           # (ffn, hidden)
        t[p + "mlp.up_proj.weight"] = mat(ff, h)                             # (ffn, hidden)
        t[p + "mlp.down_proj.weight"] = mat(h, ff)                           # (hidden, ffn)
        t[p + "input_layernorm.weight"] = norm(h)                            # (hidden)
        t[p + "post_attention_layernorm.weight"] = norm(h)                   # (hidden)
    t["model.norm.weight"] = norm(h)                                         # (hidden)
    if not tied:
        t["lm_head.weight"] = mat(v, h)                                      # (vocab, hidden)
    return t


def llama_config(arch: str, torch_dtype: str, **kw) -> dict:
    """config.json as transformers 4.46 save_pretrained writes it for LlamaConfig / MistralConfig."""
    c = {
        "architectures": [arch],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "torch_dtype": torch_dtype,
        "transformers_version": TRANSFORMERS_VERSION,
        "use_cache": True,
    }
    if arch == "LlamaForCausalLM":
        c.update({"model_type": "llama", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
                  "rope_scaling": None})
    else:
        c.update({"model_type": "mistral", "sliding_window": None})
    c.update(kw)
    return c


def expected_config(c: dict) -> dict:
    """The ModelConfig Tessera must derive from config.json `c` (HF semantics: rotate_half rope, defaults)."""
    rs = c.get("rope_scaling") or {}
    rope_type = rs.get("rope_type", rs.get("type", "none"))
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return {
        "architecture": "llama",
        "n_layers": c["num_hidden_layers"],
        "n_embd": c["hidden_size"],
        "n_head": c["num_attention_heads"],
        "n_head_kv": c.get("num_key_value_heads") or c["num_attention_heads"],
        "head_dim": head_dim,
        "n_ff": c["intermediate_size"],
        "n_vocab": c["vocab_size"],
        "n_ctx_train": c["max_position_embeddings"],
        "rope_base": c["rope_theta"],
        "rope_dim": head_dim,
        "rope_neox": True,
        "rope_scaling": {
            "type": "none" if rope_type == "default" else rope_type,
            "factor": rs.get("factor", 1.0),
            "low_freq_factor": rs.get("low_freq_factor", 1.0),
            "high_freq_factor": rs.get("high_freq_factor", 4.0),
            "original_context": rs.get("original_max_position_embeddings", 0),
        },
        "norm_eps": c["rms_norm_eps"],
        "tied_output": c.get("tie_word_embeddings", False),
        "sliding_window": c.get("sliding_window") or 0,
    }


def write_config(d: str, c: dict):
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def write_tokenizer(d: str, vocab_size: int):
    """A real byte-level BPE tokenizer.json (GPT-2 style), trained on this script's docstring."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([__doc__] * 4, trainer=trainer)
    tok.save(os.path.join(d, "tokenizer.json"))
    return tok.get_vocab_size()


def main():
    rng = np.random.default_rng(20240611)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 64)
    golden = {"regenerate": "python/make_tiny_hf_model.py", "models": {}}
    meta = {"format": "pt"}

    # 1. bf16, tied output, tokenizer.json (vocab padded above the tokenizer's size, as real models do).
    d = os.path.join(ROOT, "tiny-llama-bf16-tied")
    os.makedirs(d, exist_ok=True)
    cfg = llama_config("LlamaForCausalLM", "bfloat16", _name_or_path="tessera/tiny-llama-bf16-tied", hidden_size=32,
                       intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=320, max_position_embeddings=256, tie_word_embeddings=True)
    n_tok = write_tokenizer(d, 300)
    assert n_tok <= cfg["vocab_size"]
    models_out = [(d, cfg, llama_tensors(rng, cfg, "BF16", tied=True), None)]
    tokenizer_sizes = {os.path.basename(d): n_tok}

    # 2. f32, separate output, Llama 3 rope scaling.
    d = os.path.join(ROOT, "tiny-llama3-f32")
    os.makedirs(d, exist_ok=True)
    cfg = llama_config("LlamaForCausalLM", "float32", _name_or_path="tessera/tiny-llama3-f32", hidden_size=32,
                       intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                       head_dim=16, vocab_size=128, max_position_embeddings=512, tie_word_embeddings=False,
                       rope_theta=500000.0, bos_token_id=0, eos_token_id=1,
                       rope_scaling={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                     "original_max_position_embeddings": 64, "rope_type": "llama3"})
    models_out.append((d, cfg, llama_tensors(rng, cfg, "F32", tied=False), None))

    # 3. Mistral, f16, two shards, head_dim (16) != hidden_size / num_attention_heads (8).
    d = os.path.join(ROOT, "tiny-mistral-sharded")
    os.makedirs(d, exist_ok=True)
    cfg = llama_config("MistralForCausalLM", "float16", _name_or_path="tessera/tiny-mistral-sharded", hidden_size=32,
                       intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, vocab_size=96, max_position_embeddings=1024, tie_word_embeddings=False,
                       rms_norm_eps=1e-06, rope_theta=1000000.0)
    t = llama_tensors(rng, cfg, "F16", tied=False)
    first = [k for k in t if k == "model.embed_tokens.weight" or k.startswith("model.layers.0.")]
    shards = {"model-00001-of-00002.safetensors": {k: t[k] for k in first},
              "model-00002-of-00002.safetensors": {k: v for k, v in t.items() if k not in first}}
    models_out.append((d, cfg, t, shards))

    for d, cfg, tensors, shard_split in models_out:
        write_config(d, cfg)
        if shard_split is None:
            shard_split = {"model.safetensors": tensors}
        else:
            weight_map = {k: s for s, ts in shard_split.items() for k in ts}
            total = sum(a.nbytes for _, a in tensors.values())
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f,
                          indent=2)
                f.write("\n")
        gt = []
        for shard, ts in shard_split.items():
            p = os.path.join(d, shard)
            write_safetensors(p, ts, meta)
            offs = read_offsets(p)
            gt += [tensor_golden(k, dt, a, shard, offs, name_map) for k, (dt, a) in ts.items()]
        golden["models"][os.path.basename(d)] = {
            "config": expected_config(cfg),
            "shards": list(shard_split.keys()),
            "sharded": len(shard_split) > 1,
            "has_tokenizer": os.path.exists(os.path.join(d, "tokenizer.json")),
            "tokenizer_vocab": tokenizer_sizes.get(os.path.basename(d), 0),
            "metadata": meta,
            "tensors": gt,
        }

    # 4. Every supported dtype, with the values conversions get wrong first.
    f32_specials = np.array([0.0, -0.0, 1.0, -2.5, 3.4028235e38, 1.1754944e-38, 1e-45, np.inf, -np.inf, np.nan, 0.1],
                            dtype=np.float32)
    dt_tensors = {
        "f32": ("F32", f32_specials),
        "f16": ("F16", np.array([0x0000, 0x8000, 0x3C00, 0xC100, 0x7BFF, 0x0400, 0x0001, 0x03FF, 0x7C00, 0xFC00,
                                 0x7E00, 0x2E66], dtype=np.uint16).view(np.float16)),
        "bf16": ("BF16", np.array([0x0000, 0x8000, 0x3F80, 0xC020, 0x7F7F, 0x0080, 0x0001, 0x007F, 0x7F80, 0xFF80,
                                   0x7FC0, 0x3DCD], dtype=np.uint16)),
        "f64": ("F64", np.array([[0.0, -1.5], [1e300, 5e-324], [np.inf, 0.1]], dtype=np.float64)),
        "i64": ("I64", np.array([np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max], dtype=np.int64)),
        "i32": ("I32", np.array([[np.iinfo(np.int32).min, -7], [7, np.iinfo(np.int32).max]], dtype=np.int32)),
        "i16": ("I16", np.array([-32768, -1, 0, 32767], dtype=np.int16)),
        "i8": ("I8", np.array([[[-128, -1], [0, 127]]], dtype=np.int8)),
        "empty": ("F32", np.zeros((0, 4), dtype=np.float32)),
        "scalar": ("F32", np.array(42.0, dtype=np.float32)),
    }
    p = os.path.join(ROOT, "dtypes.safetensors")
    dmeta = {"format": "pt", "purpose": "tessera dtype test"}
    write_safetensors(p, dt_tensors, dmeta)
    offs = read_offsets(p)
    golden["dtypes"] = {
        "metadata": dmeta,
        "tensors": [tensor_golden(k, dt, a, "dtypes.safetensors", offs, None) for k, (dt, a) in dt_tensors.items()],
    }

    # Names the mapping must also get right beyond the tiny models: biases and two-digit layers.
    extra = ["model.layers.31.self_attn.q_proj.bias", "model.layers.31.self_attn.k_proj.bias",
             "model.layers.31.self_attn.v_proj.bias", "model.layers.31.self_attn.o_proj.bias",
             "model.layers.17.mlp.down_proj.weight", "model.layers.10.post_attention_layernorm.weight"]
    golden["extra_names"] = [[n, name_map.get_name(n, try_suffixes=(".weight", ".bias"))] for n in extra]

    with open(os.path.join(ROOT, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {ROOT}", file=sys.stderr)


if __name__ == "__main__":
    main()
