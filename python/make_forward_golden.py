#!/usr/bin/env python3
"""Golden logits from the independent numpy forward (python/reference_forward.py) for Tessera's f32 path test.

Regenerate (needs the default model; about a minute):
  .venv/bin/python python/make_forward_golden.py
writes tests/data/golden/forward_smollm2_135m_q4_1.json (per position: top-k ids and logits, log-sum-exp) and
tests/data/golden/forward_smollm2_135m_q4_1.rows.f32 (full-vocab logit rows of a few positions, float32
little-endian, [n_rows, n_vocab] in the order the JSON lists them).

The input is token ids, so no tokenizer is involved: SEQUENCE below is the ids llama.cpp's llama-tokenize gives for
TEXT (kept for the reader; the ids are what matters), and RANDOM_LEN ids drawn from a seeded generator over the whole
vocabulary follow it in a second sequence, so rows of the embedding that text rarely reaches are exercised too.
The forward runs in float64 (weights dequantized bit-exactly by gguf-py), so the golden values carry no float32
rounding of their own; they are stored as float32, whose 6e-8 relative rounding is far below the 1e-4 tolerance.
Because attention is causal, the logits of a prefix are those of the full sequence's first positions: the C++ test
runs a prefix (32 tokens, to stay within a few seconds on the scalar reference kernels) and compares the positions
it covers, so full rows are stored at positions inside that prefix.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import reference_forward as rf  # noqa: E402
from make_llamacpp_golden import f32, sha256, top_k  # noqa: E402

OUT_DIR = os.path.join(ROOT, "tests", "data", "golden")
BASENAME = "forward_smollm2_135m_q4_1"

TEXT = ("The lighthouse keeper had lived alone on the island for eleven years. Every evening he climbed the ninety-one "
        "steps of the tower, cleaned the great lens with a soft cloth, and lit the lamp that warned ships away from "
        "the rocks. The supply boat came once a month, bringing flour, oil, letters and newspapers that")
# llama-tokenize -m SmolLM2-135M-Instruct.Q4_1.gguf -p "$TEXT" --ids  (64 ids; --check-tokens re-checks them)
SEQUENCE = [
    504, 33059, 40061, 761, 4161, 4016, 335, 260, 5432, 327, 20654, 929, 30, 5081, 9053, 384, 30324, 260, 34069, 29,
    537, 3301, 282, 260, 11637, 28, 16681, 260, 1109, 7247, 351, 253, 2375, 11244, 28, 284, 1150, 260, 17559, 338,
    15504, 7761, 2025, 429, 260, 7739, 30, 378, 3577, 9741, 2422, 2268, 253, 3531, 28, 7611, 7367, 28, 2664, 28, 5073,
    284, 12968, 338,
]
RANDOM_LEN = 8
RANDOM_SEED = 20240601


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=rf.DEFAULT_MODEL)
    ap.add_argument("--out-dir", default=OUT_DIR)
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--full-rows", default="15,31",
                    help="positions of the text sequence whose full-vocab rows are stored (plus the random one's last)")
    ap.add_argument("--check-tokens", action="store_true",
                    help="verify SEQUENCE against llama-tokenize (needs scripts/build_llamacpp.sh)")
    a = ap.parse_args()

    if a.check_tokens:
        from make_llamacpp_golden import llamacpp_dirs, tokenize
        ids = tokenize(os.path.join(llamacpp_dirs()[1], "bin"), a.model, TEXT)
        if ids != SEQUENCE:
            sys.exit(f"make_forward_golden: llama-tokenize gives {ids}, not SEQUENCE")
        print("SEQUENCE matches llama-tokenize")
    model = rf.Model(a.model)
    n_vocab = model.weight("token_embd.weight").shape[0]
    rng = np.random.default_rng(RANDOM_SEED)
    sequences = [("text", SEQUENCE), ("random", [int(i) for i in rng.integers(0, n_vocab, RANDOM_LEN)])]
    full_rows_text = [int(p) for p in a.full_rows.split(",") if p]

    rows = []
    seq_docs = []
    for name, ids in sequences:
        logits = rf.forward(model, ids)  # [T, n_vocab] float64
        # The same forward in float32 measures each position's conditioning: how far plain float32 rounding alone
        # moves its logits (max |diff| / max |logit|). Well-conditioned positions land near 2e-6; the C++ test
        # widens its 1e-4 bound only where this is large (docs/CORRECTNESS.md).
        logits32 = rf.forward(model, ids, dtype=np.float32).astype(np.float64)
        f32_err = np.abs(logits32 - logits).max(axis=1) / np.abs(logits).max(axis=1)
        lse = rf.log_sum_exp(logits)
        positions = []
        for t in range(len(ids)):
            tid, tl = top_k(logits[t], a.top_k)
            positions.append({"top_ids": tid, "top_logits": tl, "lse": float(lse[t]),
                              "f32_rel_err": float(f"{f32_err[t]:.3g}")})
        full = full_rows_text if name == "text" else [len(ids) - 1]
        row_index = []
        for p in full:
            if not 0 <= p < len(ids):
                sys.exit(f"make_forward_golden: full-row position {p} outside sequence '{name}'")
            row_index.append(len(rows))
            rows.append(logits[p].astype("<f4"))
        seq_docs.append({"name": name, "ids": ids, "positions": positions,
                         "full_rows": [{"position": p, "row": r} for p, r in zip(full, row_index)]})
        print(f"{name}: {len(ids)} tokens, top-1 at last position {positions[-1]['top_ids'][0]} "
              f"({f32(logits[-1].max())}), full rows at {full}, numpy float32-vs-float64 relative error: median "
              f"{np.median(f32_err):.2g}, max {f32_err.max():.2g} at position {int(f32_err.argmax())}")

    os.makedirs(a.out_dir, exist_ok=True)
    rows_name = BASENAME + ".rows.f32"
    np.stack(rows).astype("<f4").tofile(os.path.join(a.out_dir, rows_name))
    doc = {
        "generator": "python/make_forward_golden.py",
        "command": ".venv/bin/python python/make_forward_golden.py",
        "reference": "python/reference_forward.py, float64 arithmetic on gguf-py-dequantized weights",
        "model_file": os.path.basename(a.model),
        "model_sha256": sha256(a.model),
        "n_vocab": int(n_vocab),
        "top_k": a.top_k,
        "rows_file": rows_name,
        "n_rows": len(rows),
        "sequences": seq_docs,
    }
    out = os.path.join(a.out_dir, BASENAME + ".json")
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out} ({os.path.getsize(out)} bytes) and {rows_name} "
          f"({os.path.getsize(os.path.join(a.out_dir, rows_name))} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
