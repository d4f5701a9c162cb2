#!/usr/bin/env python3
"""Load a `tessera dump` directory with numpy and reproduce every matmul output from its input and weight.

  tessera dump -p "The capital of France is" --sparsity 0.5 --layers 0-3 --ops q,down --tokens 8 -o dump/
  .venv/bin/python python/load_dump.py dump/ [--tol 0.05]

A dump (docs/TEAL.md) holds manifest.json and, per matmul, x [tokens, K] (its input after TEAL's sparsification; q, k
and v share one file, as do gate and up), y [tokens, N] (its output) and either the dequantized weight W [N, K]
(`--weights`) or a reference to the tensor in the model file (name, dtype, shape, offset), which this script reads with
gguf-py (GGUFReader + gguf.quants.dequantize, bit-exact with ggml's dequantization; no Tessera code). It checks
y = x @ W.T for every entry: the relative error ||y - x W^T|| / ||x W^T||, in float64. The default tolerance, 5e-2,
allows the fast CPU path's 8-bit activation quantization inside quantized matmuls (2e-3 to 2e-2 measured on SmolLM2
q4_1, the most where the output's entries cancel, e.g. v at 18% sparsity: 1.8e-2); a dump made with --reference
(f32 kernels on dequantized weights) reproduces to ~1e-6, and --tol 1e-4 checks that. Exit status 1 when an entry is
off, 0 otherwise. As a library: `load(dir)` returns the manifest with each entry's arrays under "x", "y", "W".
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def _gguf_weight(path: str, name: str, offset: int | None) -> np.ndarray:
    from gguf import GGUFReader
    from gguf import quants as gguf_quants

    reader = _gguf_weight.readers.get(path)
    if reader is None:
        reader = _gguf_weight.readers[path] = GGUFReader(path)
    for t in reader.tensors:
        if t.name == name:
            if offset is not None and int(t.data_offset) != int(offset):
                raise ValueError(f"{path}: {name} is at offset {t.data_offset}, the manifest says {offset}")
            w = gguf_quants.dequantize(t.data, t.tensor_type)
            return np.asarray(w, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
    raise KeyError(f"{path}: no tensor {name}")


_gguf_weight.readers = {}


def load(dump_dir: str, weights: bool = True) -> dict:
    """The manifest with each entry's arrays: "x" [tokens, K], "y" [tokens, N] and (weights=True) "W" [N, K]."""
    with open(os.path.join(dump_dir, "manifest.json")) as f:
        m = json.load(f)
    if m.get("format") != "tessera-dump-1":
        raise ValueError(f"{dump_dir}: not a tessera dump (format {m.get('format')!r})")
    for e in m["matmuls"]:
        e["x_array"] = np.load(os.path.join(dump_dir, e["x"]))
        e["y_array"] = np.load(os.path.join(dump_dir, e["y"]))
        if not weights:
            continue
        w = e["weight"]
        if "weight_file" in w:
            e["W"] = np.load(os.path.join(dump_dir, w["weight_file"]))
        elif m.get("model_format") == "gguf":
            e["W"] = _gguf_weight(w["file"], w["name"], w.get("offset"))
        else:
            raise ValueError(f"{w['name']}: only GGUF weights can be read by reference; dump with --weights")
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump_dir")
    ap.add_argument("--tol", type=float, default=5e-2, help="largest relative error ||y - x W^T|| / ||x W^T|| allowed")
    a = ap.parse_args(argv)
    m = load(a.dump_dir)
    worst = 0.0
    bad = 0
    print(f"{a.dump_dir}: {len(m['matmuls'])} matmuls, {len(m['positions'])} tokens at positions {m['positions']}, "
          f"rule {m['rule']}, achieved sparsity {m['achieved_sparsity'] * 100:.1f}%")
    for e in m["matmuls"]:
        x, y, w = e["x_array"].astype(np.float64), e["y_array"].astype(np.float64), e["W"].astype(np.float64)
        if list(x.shape) != e["x_shape"] or list(y.shape) != e["y_shape"] or list(w.shape) != e["weight"]["shape"]:
            print(f"blk.{e['layer']}.{e['type']}: shapes x {x.shape} y {y.shape} W {w.shape} disagree with the "
                  "manifest")
            bad += 1
            continue
        ref = x @ w.T  # [tokens, N]
        err = float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))
        zeros = float(np.mean(x == 0))
        worst = max(worst, err)
        ok = err <= a.tol
        bad += not ok
        print(f"  blk.{e['layer']}.{e['type']:<4} ({e['block']}) x {tuple(x.shape)} W {tuple(w.shape)} "
              f"{e['weight'].get('dtype', 'f32')}: zeros {zeros * 100:5.1f}%, rel err {err:.2e}"
              f"{'' if ok else '  <-- over --tol'}")
    print(f"worst relative error {worst:.2e} (tol {a.tol:g}); {bad} over")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
