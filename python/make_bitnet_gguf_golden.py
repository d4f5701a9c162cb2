#!/usr/bin/env python3
"""A tiny random-weight GGUF of llama.cpp's "bitnet" architecture (src/models/bitnet.cpp: sub-layer norms, SwiGLU,
NeoX rotation, the output tied to the embedding, per-matrix `.scale` tensors multiplying each linear's output, no
activation quantization), written with gguf-py, and llama.cpp's own logits of it, for tests/models/test_bitnet.cpp
(BitNetGguf).

Regenerate (needs the cached llama.cpp build of scripts/build_llamacpp.sh, g++ and numpy):
  .venv/bin/python python/make_bitnet_gguf_golden.py
writes tests/data/gguf/tiny-bitnet.gguf and tests/data/gguf/tiny-bitnet.json (ids, llama.cpp's logits [T, vocab] with
an f32 KV cache). Weights: ternary f32 matrices (as llama.cpp's converter stores BitNet's: weight_quant's
ternary / scale) times a `.scale` tensor, norms 1 + 0.3 N(0, 1), embeddings 0.5 N(0, 1); a placeholder vocabulary
(llama.cpp needs one to load a file).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import make_llamacpp_golden as mlg  # noqa: E402

E, F, H, HKV, L, V = 64, 128, 4, 2, 2, 300
IDS = [(i * 37 + 5) % V for i in range(10)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "gguf"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    src, build = mlg.llamacpp_dirs()
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    import gguf

    rng = np.random.default_rng(a.seed)
    f32 = np.float32
    path = os.path.join(a.out, "tiny-bitnet.gguf")
    w = gguf.GGUFWriter(path, "bitnet")
    w.add_name("tiny-bitnet")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    tokens += [f"<t{i}>".encode() for i in range(len(tokens), V)]
    types = [2, 3, 3] + [6] * 256 + [1] * (V - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(V)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    def norm(n):
        return (1 + 0.3 * rng.standard_normal(n)).astype(f32)

    # gguf-py takes numpy arrays in row-major (outermost first) order, as Tessera's shapes.
    w.add_tensor("token_embd.weight", (0.5 * rng.standard_normal((V, E))).astype(f32))
    w.add_tensor("output_norm.weight", norm(E))
    hd = E // H
    for l in range(L):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", norm(E))
        w.add_tensor(p + "attn_sub_norm.weight", norm(E))
        w.add_tensor(p + "ffn_norm.weight", norm(E))
        w.add_tensor(p + "ffn_sub_norm.weight", norm(F))
        for name, n, k in (("attn_q", E, E), ("attn_k", HKV * hd, E), ("attn_v", HKV * hd, E), ("attn_output", E, E),
                           ("ffn_gate", F, E), ("ffn_up", F, E), ("ffn_down", E, F)):
            inv = rng.uniform(0.05, 0.2)
            w.add_tensor(p + name + ".weight", (rng.integers(-1, 2, (n, k)) * inv).astype(f32))
            w.add_tensor(p + name + ".scale", np.array([rng.uniform(0.5, 2.0)], dtype=f32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    with tempfile.TemporaryDirectory() as tmp:
        exe = mlg.compile_helper(src, build, tmp)
        logits, _, _ = mlg.run_helper(exe, path, IDS, 0, 2, tmp, kv_type="f32", flash_attn="off")
    top1 = logits.argmax(axis=1)
    with open(os.path.join(a.out, "tiny-bitnet.json"), "w") as fh:
        json.dump({"generator": "python/make_bitnet_gguf_golden.py", "seed": a.seed, "ids": IDS,
                   "logits": [[float(np.format_float_positional(np.float32(x), unique=True, trim="-"))
                               for x in row] for row in logits]}, fh)
    print(f"tiny-bitnet.gguf: {len(IDS)} tokens, logit scale {np.abs(logits).max():.3f}, distinct top-1 "
          f"{len(set(top1.tolist()))}/{len(IDS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
