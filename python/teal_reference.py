#!/usr/bin/env python3
"""Independent whole-model TEAL reference: python/reference_forward.py's Llama forward (numpy, gguf-py dequantized
weights, no Tessera code) with TEAL's magnitude thresholding applied exactly where TEAL applies it (FasterDecoding/TEAL,
teal/self_attn.py and teal/mlp.py): the input of q, k and v (the attention norm's output, one input), of o (the
attention output), of gate and up (the ffn norm's output, one input) and of down (the SwiGLU output), per token.

Two rules, as Tessera's SPARSIFY op has them (src/backends/cpu/ops/sparsify.cpp):
  top-k     (--sparsity S): each row keeps its K - floor(S K) largest magnitudes (ties: the first ones in index order
            are dropped first);
  threshold (--teal FILE):   |x| <= threshold[layer][input] is zeroed (a `tessera calibrate` file).

Usage:
  # per-token NLL and logits of a text's first N tokens, dense and sparse, compared with tessera's own logits:
  .venv/bin/python python/teal_reference.py --ids-file ids.txt --sparsity 0.4 --tessera tessera_logits.npy
  # the golden file of tests/models/test_teal_reference.cpp (see make_golden):
  .venv/bin/python python/teal_reference.py --make-golden tests/data/teal_reference.json

Prints, for dense and sparse, the mean NLL over positions 1.. and, with --tessera, the per-token NLL difference and the
largest logit difference against Tessera's `logits` output for the same ids.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as rf  # noqa: E402

INPUTS = ("qkv", "o", "gate_up", "down")


def sparsify(x: np.ndarray, layer: int, which: int, sparsity: float, thresholds) -> np.ndarray:
    """x [T, K] with each row's smallest magnitudes zeroed (top-k), or |x| <= threshold zeroed."""
    if thresholds is not None:
        thr = thresholds[layer][which]
        return np.where(np.abs(x) <= thr, 0.0, x).astype(x.dtype)
    if sparsity <= 0:
        return x
    k = x.shape[1]
    drop = int(math.floor(sparsity * k))
    if drop <= 0:
        return x
    # Stable argsort on |x| drops the smallest, the first index first among equal magnitudes (Tessera's tie rule).
    order = np.argsort(np.abs(x), axis=1, kind="stable")[:, :drop]
    y = x.copy()
    np.put_along_axis(y, order, 0.0, axis=1)
    return y


def forward(model: rf.Model, ids, sparsity: float = 0.0, thresholds=None, dtype=np.float64,
            rows_from: int = 0) -> np.ndarray:
    """Logits [T, n_vocab] of every position; rows >= rows_from are sparsified (all rows by default, as Tessera's
    perplexity and logits do; TEAL's own perplexity sparsifies the second half of each window)."""
    cfg = model.config
    ids = np.asarray(ids, dtype=np.int64)
    t = ids.size
    W = lambda name: model.weight_as(name, dtype)  # noqa: E731

    def sp(x, layer, which):
        y = sparsify(x, layer, which, sparsity, thresholds)
        if rows_from > 0:
            y[:rows_from] = x[:rows_from]
        return y

    x = model.weight("token_embd.weight")[ids].astype(dtype)  # [T, n_embd]
    cos, sin = rf.rope_angles(cfg, np.arange(t))
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        h = sp(rf.rms_norm(x, model.weight(p + "attn_norm.weight"), cfg.norm_eps), il, 0)  # [T, n_embd]
        q = (h @ W(p + "attn_q.weight").T).reshape(t, cfg.n_head, cfg.head_dim)
        k = (h @ W(p + "attn_k.weight").T).reshape(t, cfg.n_head_kv, cfg.head_dim)
        v = (h @ W(p + "attn_v.weight").T).reshape(t, cfg.n_head_kv, cfg.head_dim)
        q = rf.apply_rope(q, cos, sin, cfg.rope_dim, cfg.rope_neox)
        k = rf.apply_rope(k, cos, sin, cfg.rope_dim, cfg.rope_neox)
        a = sp(rf.attention(q, k, v), il, 1)  # [T, n_head * head_dim]
        x = x + a @ W(p + "attn_output.weight").T
        h = sp(rf.rms_norm(x, model.weight(p + "ffn_norm.weight"), cfg.norm_eps), il, 2)
        s = sp(rf.silu(h @ W(p + "ffn_gate.weight").T) * (h @ W(p + "ffn_up.weight").T), il, 3)  # [T, n_ff]
        x = x + s @ W(p + "ffn_down.weight").T
    h = rf.rms_norm(x, model.weight("output_norm.weight"), cfg.norm_eps)
    return h @ W("output").T  # [T, n_vocab]


def token_nll(logits: np.ndarray, ids) -> np.ndarray:
    """-log p(ids[t+1] | ids[..t]) for t = 0 .. T-2, float64 [T-1]."""
    ids = np.asarray(ids)
    lse = rf.log_sum_exp(logits[:-1])
    return lse - logits[np.arange(len(ids) - 1), ids[1:]].astype(np.float64)


def make_golden(path: str, model_path: str) -> None:
    """A small golden file: 48 tokens of fixed ids, dense and at 40% top-k, the per-token NLL (float64) and the top-1
    ids. The test holds tessera's f32 reference path to it."""
    model = rf.Model(model_path, cache_casts=True)
    rng = np.random.default_rng(23)
    # Ids of ordinary text tokens (not control tokens): a deterministic draw from the first 20000 ids past 256.
    ids = [1] + [int(v) for v in rng.integers(256, 20000, size=47)]
    out = {"model": os.path.basename(model_path), "ids": ids, "command": "python/teal_reference.py --make-golden",
           "cases": []}
    for s in (0.0, 0.25, 0.4):
        lg = forward(model, ids, sparsity=s)
        out["cases"].append({"sparsity": s, "nll": [float(v) for v in token_nll(lg, ids)],
                             "top1": [int(v) for v in np.argmax(lg, axis=1)]})
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=rf.DEFAULT_MODEL)
    ap.add_argument("--ids-file", help="whitespace- or comma-separated token ids")
    ap.add_argument("--sparsity", type=float, default=0.0)
    ap.add_argument("--teal", help="a tessera calibrate thresholds file (instead of --sparsity)")
    ap.add_argument("--tessera", help="tessera logits .npy [T, n_vocab] of the same ids and sparsity")
    ap.add_argument("--rows-from", type=int, default=0, help="sparsify only rows from this one (TEAL's eval: T/2)")
    ap.add_argument("--make-golden", help="write the test's golden JSON here and exit")
    a = ap.parse_args(argv)
    if a.make_golden:
        make_golden(a.make_golden, a.model)
        return 0
    with open(a.ids_file) as f:
        ids = [int(v) for v in f.read().replace(",", " ").split()]
    thresholds = None
    if a.teal:
        with open(a.teal) as f:
            thresholds = json.load(f)["thresholds"]
    model = rf.Model(a.model, cache_casts=True)
    dense = forward(model, ids)
    sparse = forward(model, ids, sparsity=a.sparsity, thresholds=thresholds, rows_from=a.rows_from)
    nd, ns = token_nll(dense, ids), token_nll(sparse, ids)
    r = a.rows_from
    print(f"tokens {len(ids)}: dense mean NLL {nd[r:].mean():.5f} (PPL {math.exp(nd[r:].mean()):.4f}), "
          f"sparse mean NLL {ns[r:].mean():.5f} (PPL {math.exp(ns[r:].mean()):.4f}), "
          f"PPL ratio {math.exp(ns[r:].mean() - nd[r:].mean()):.4f} (rows from {r})")
    if a.tessera:
        te = np.load(a.tessera).astype(np.float64)
        nt = token_nll(te, ids)
        d = nt - ns
        print(f"tessera sparse mean NLL {nt[r:].mean():.5f} (PPL {math.exp(nt[r:].mean()):.4f}); per-token NLL diff: "
              f"mean {d[r:].mean():+.5f}, mean |diff| {np.abs(d[r:]).mean():.5f}, max |diff| {np.abs(d[r:]).max():.4f}; "
              f"max |logit diff| {np.abs(te - sparse).max():.4f}; same top-1 "
              f"{np.mean(np.argmax(te, 1) == np.argmax(sparse, 1)) * 100:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
