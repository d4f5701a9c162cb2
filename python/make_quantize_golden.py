#!/usr/bin/env python3
# Golden data for `tessera quantize` (src/api/quantize.cpp) and GGML's quantizers (src/quant/quantize_ggml.cpp),
# produced by llama.cpp's llama-quantize (built by scripts/build_llamacpp.sh llama-quantize; CI does not build it, so
# its outputs are stored here as hashes and small blobs).
#
# Regenerate (from the repository root):
#   .venv/bin/python python/make_quantize_golden.py
#
# Writes tests/data/quantize/:
#   tiny-f16.gguf, tiny-bf16.gguf, tiny-f32.gguf, tiny-moe-f16.gguf  small random llama-architecture GGUFs (8 layers, tiny tensors whose
#                 rows are 256 or 512 long, plus rows of 288 and 80 that force llama-quantize's fallbacks; a tensor with
#                 edge-case rows: zeros, a constant, a single spike, f16 subnormals; the moe file has 8 experts in 3-D
#                 ffn_*_exps stacks, which switch on llama.cpp's MoE rules). llama-quantize reads only the
#                 hyperparameters, never checks shapes against them, so the tensors can be this small.
#   index.json    per case (input, type, allow_requantize): llama-quantize's output size and FNV-1a 64 of the whole
#                 file, and per tensor "name type bytes fnv1a64" of its data;
#   rows.f32.bin  the float32 rows of blk.0.attn_q.weight (edge cases) and blk.1.ffn_down.weight (random), and
#   rows_<type>.bin  llama-quantize --pure's bytes for those two tensors in each type (row-level golden for
#                 quantize_row_ggml; tests/quant/test_quantize_ggml.cpp).
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "quantize")
TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K_M", "q5_K_M", "q6_K", "iq4_nl"]
# --pure type per quantize_row_ggml format (the _M mixes' base types are q4_K and q5_K).
PURE = {"q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1", "q5_0": "q5_0", "q5_1": "q5_1", "q4_K": "q4_K_M",
        "q5_K": "q5_K_M", "q6_K": "q6_K", "iq4_nl": "iq4_nl", "tq1_0": "tq1_0", "tq2_0": "tq2_0"}
ROW_TENSORS = ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"]
N_LAYER, N_EMBD, N_FF = 8, 256, 512


def fnv1a64(b: bytes) -> str:
    h = 0xCBF29CE484222325
    for x in b:
        h ^= x
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def weights(rng, rows, cols):
    # Normal weights with a heavier tail every few rows, as trained matrices have.
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
    w[rows // 2:, :: 7] *= 6.0
    return w


def edge_rows(rng, cols):
    w = weights(rng, 6, cols)
    w[0, :] = 0.0                         # all zero: every format's zero-scale branch
    w[1, :] = 0.5                         # constant
    w[2, :] = 0.01
    w[2, 37] = 3.0                        # one spike
    w[3, :] = rng.standard_normal(cols) * 2e-7  # f16 subnormals
    w[4, :] = np.abs(w[4, :])             # one-signed
    return w


def build(path, dtype, tied, seed, n_expert=0):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"tessera tiny quantize golden ({dtype})")
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(4)
    w.add_head_count_kv(1)  # n_gqa 4: iq4_nl's attn_v rule fires
    w.add_rope_dimension_count(64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type({"f16": 1, "bf16": 32, "f32": 0}[dtype])
    if n_expert:
        w.add_expert_count(n_expert)  # 8 experts: llama.cpp's MoE rules (attn_v/attn_k q8_0, attn_output q5_K)
        w.add_expert_used_count(2)

    def add(name, arr):
        if arr.ndim == 1 or "ffn_gate_inp" in name:
            w.add_tensor(name, arr.astype(np.float32))
        elif dtype == "f16":
            w.add_tensor(name, arr.astype(np.float16))
        elif dtype == "bf16":
            bits = arr.astype(np.float32).view(np.uint32)
            bf = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            w.add_tensor(name, bf, raw_shape=arr.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(name, arr.astype(np.float32))

    add("token_embd.weight", weights(rng, 16, N_EMBD))
    if not tied:
        add("output.weight", weights(rng, 16, N_EMBD))
    add("output_norm.weight", np.ones(N_EMBD, np.float32))
    for l in range(N_LAYER):
        b = f"blk.{l}."
        add(b + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
        add(b + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(N_EMBD).astype(np.float32))
        add(b + "attn_q.weight", edge_rows(rng, N_EMBD) if l == 0 else weights(rng, 4, 80 if l == 6 else N_EMBD))
        add(b + "attn_k.weight", weights(rng, 2, N_EMBD))
        add(b + "attn_v.weight", weights(rng, 2, 288 if l == 3 else N_EMBD))
        add(b + "attn_output.weight", weights(rng, 4, N_EMBD))
        if n_expert:  # 3-D expert stacks [n_expert, rows, cols] and the f32 router
            add(b + "ffn_gate_inp.weight", weights(rng, n_expert, N_EMBD).astype(np.float32))
            add(b + "ffn_gate_exps.weight", weights(rng, n_expert, N_EMBD).reshape(n_expert, 1, N_EMBD))
            add(b + "ffn_up_exps.weight", weights(rng, n_expert, N_EMBD).reshape(n_expert, 1, N_EMBD))
            add(b + "ffn_down_exps.weight", weights(rng, n_expert, N_FF).reshape(n_expert, 1, N_FF))
            continue
        add(b + "ffn_gate.weight", weights(rng, 4, 288 if l == 5 else N_EMBD))
        add(b + "ffn_up.weight", weights(rng, 4, N_EMBD))
        add(b + "ffn_down.weight", weights(rng, 4, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(llq, args):
    subprocess.run([llq] + args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def describe(path):
    data = open(path, "rb").read()
    r = gguf.GGUFReader(path)
    tensors = []
    for t in r.tensors:
        raw = data[t.data_offset:t.data_offset + t.n_bytes]
        tensors.append(f"{t.name} {t.tensor_type.name.lower()} {int(t.n_bytes)} {fnv1a64(raw)}")
    return {"bytes": len(data), "fnv1a64": fnv1a64(data), "tensors": tensors}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-quantize", help="llama-quantize binary (default: scripts/build_llamacpp.sh builds it)")
    a = ap.parse_args()
    llq = a.llama_quantize
    if not llq:
        bin_dir = subprocess.run([os.path.join(ROOT, "scripts", "build_llamacpp.sh"), "llama-quantize"], check=True,
                                 capture_output=True, text=True).stdout.strip()
        llq = os.path.join(bin_dir, "llama-quantize")
    os.makedirs(OUT, exist_ok=True)
    inputs = {"tiny-f16.gguf": ("f16", True, 1), "tiny-bf16.gguf": ("bf16", False, 2),
              "tiny-f32.gguf": ("f32", True, 3), "tiny-moe-f16.gguf": ("f16", False, 4)}
    for name, (dt, tied, seed) in inputs.items():
        build(os.path.join(OUT, name), dt, tied, seed, n_expert=8 if "moe" in name else 0)
    cases = [("tiny-f16.gguf", t, False) for t in TYPES]
    cases += [("tiny-bf16.gguf", "q4_K_M", False), ("tiny-bf16.gguf", "iq4_nl", False),
              ("tiny-f32.gguf", "q5_K_M", False), ("tiny-f32.gguf", "q4_1", False),
              ("tiny-f16.gguf", "bf16", False), ("tiny-f16.gguf", "f32", False), ("tiny-bf16.gguf", "f16", False),
              ("tiny-moe-f16.gguf", "q4_K_M", False), ("tiny-moe-f16.gguf", "iq4_nl", False),
              ("tiny-moe-f16.gguf", "q5_K_M", False)]
    # The ternary types: tied (output rule on token_embd) and untied (token_embd q4_K) inputs, fallbacks to q4_0/f16.
    cases += [("tiny-f16.gguf", "tq1_0", False), ("tiny-f16.gguf", "tq2_0", False), ("tiny-bf16.gguf", "tq2_0", False)]
    index = {"command": "python/make_quantize_golden.py", "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for inp, t, requant in cases:
            out = os.path.join(tmp, "out.gguf")
            run(llq, ([] if not requant else ["--allow-requantize"]) + [os.path.join(OUT, inp), out, t, "1"])
            index["cases"].append({"input": inp, "type": t, "allow_requantize": requant, **describe(out)})
        # Requantizing: llama-quantize's own q8_0 output, quantized again to q4_K_M.
        q8 = os.path.join(OUT, "tiny-q8_0.gguf")
        run(llq, [os.path.join(OUT, "tiny-f16.gguf"), q8, "q8_0", "1"])
        out = os.path.join(tmp, "out.gguf")
        run(llq, ["--allow-requantize", q8, out, "q4_K_M", "1"])
        index["cases"].append({"input": "tiny-q8_0.gguf", "type": "q4_K_M", "allow_requantize": True,
                               **describe(out)})
        # Row-level golden: every format, --pure so each tensor gets it.
        src = gguf.GGUFReader(os.path.join(OUT, "tiny-f16.gguf"))
        rows = b"".join(np.asarray(t.data).astype(np.float32).tobytes() for n in ROW_TENSORS
                        for t in src.tensors if t.name == n)
        open(os.path.join(OUT, "rows.f32.bin"), "wb").write(rows)
        index["rows"] = {"tensors": ROW_TENSORS, "floats": len(rows) // 4, "formats": {}}
        for fmt, ftype in PURE.items():
            out = os.path.join(tmp, "pure.gguf")
            run(llq, ["--pure", os.path.join(OUT, "tiny-f16.gguf"), out, ftype, "1"])
            r = gguf.GGUFReader(out)
            blob = b""
            for n in ROW_TENSORS:
                t = next(t for t in r.tensors if t.name == n)
                assert t.tensor_type.name.lower() == fmt.lower(), (n, t.tensor_type.name, fmt)
                blob += bytes(np.asarray(t.data).tobytes())
            open(os.path.join(OUT, f"rows_{fmt}.bin"), "wb").write(blob)
            index["rows"]["formats"][fmt] = {"file": f"rows_{fmt}.bin", "bytes": len(blob)}
    with open(os.path.join(OUT, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(index['cases'])} cases, {len(PURE)} row formats", file=sys.stderr)


if __name__ == "__main__":
    main()
