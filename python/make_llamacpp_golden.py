#!/usr/bin/env python3
"""Golden logits and greedy continuations from llama.cpp (the peer) for Tessera's end-to-end test.

Regenerate (needs the cached llama.cpp build from scripts/build_llamacpp.sh, g++ and the default model):
  .venv/bin/python python/make_llamacpp_golden.py
writes tests/data/golden/llamacpp_smollm2_135m_q4_1.json. --check-reference also prints how the numpy reference
forward (python/reference_forward.py, float64) meets the test's bounds against llama.cpp on the same prompts, and
--check-noise how llama.cpp itself does with flash attention off and an f32 KV cache (several minutes together).

What it does: tokenizes three prompts (prose, code, chat-formatted) with llama-tokenize, so the ids are llama.cpp's;
compiles python/llamacpp_logits.cpp against the cached libllama.a/ggml libraries; runs it with 2 threads to get the
logits of every prompt position (one batch, all outputs requested) and a 64-token greedy continuation (one decode per
token). The JSON keeps, per prompt position, the top-k ids and float32 logits plus the float64 log-sum-exp of the
full row, and per greedy step the chosen id, the top-2 ids/logits and their gap (for the near-tie rule). Golden KL
is then computed from top-k + log-sum-exp with the tail outside top-k lumped into one bucket (docs/CORRECTNESS.md).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import reference_forward as rf  # noqa: E402

OUT_DEFAULT = os.path.join(ROOT, "tests", "data", "golden", "llamacpp_smollm2_135m_q4_1.json")
LLAMACPP_VERSION = "0.3.36"  # llama-cpp-python sdist whose vendored llama.cpp scripts/build_llamacpp.sh builds

# Three kinds of text, chosen (docs/CORRECTNESS.md, "Why the prompts are what they are") so that the top-1 and
# greedy checks measure correctness rather than rounding noise: two correct engines that differ only in rounding
# disagree wherever the top-2 logit gap is below about 0.1, and free prose has such near-ties at 5-10% of positions
# and every few greedy steps. These prompts keep most positions and every greedy step clear of that: repeated,
# memorized prose (the model copies from context, exercising attention over the whole prompt), a well-known program,
# and a chat turn whose answer is a fixed sequence. --check-noise and --check-reference print the evidence.
_DICKENS = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
            "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light,")
_FIZZBUZZ = ("for i in range(1, 101):\n    if i % 15 == 0:\n        print(\"FizzBuzz\")\n    elif i % 3 == 0:\n"
             "        print(\"Fizz\")\n    elif i % 5 == 0:\n        print(\"Buzz\")\n    else:\n        print(i)\n")
_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
PROMPTS = [
    ("prose", _DICKENS + "\n\n" + _DICKENS + "\n\nIt was the best of times, it was the worst"),
    ("code", _FIZZBUZZ + "\n\n" + _FIZZBUZZ[:40]),
    ("chat", _SYSTEM + "<|im_start|>user\nList the letters of the English alphabet in order, separated by commas, and "
             "then list them again.<|im_end|>\n<|im_start|>assistant\nA, B, C, D, E, F, G,"),
]


def llamacpp_dirs() -> tuple[str, str]:
    """(source dir, build dir) of the cached llama.cpp; builds llama-tokenize (and libllama) if missing."""
    bin_dir = subprocess.run([os.path.join(ROOT, "scripts", "build_llamacpp.sh"), "llama-tokenize"], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
    build = os.path.dirname(bin_dir)
    src = os.path.join(os.path.dirname(build), "src")
    for lib in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a"):
        if not os.path.exists(os.path.join(build, lib)):
            sys.exit(f"make_llamacpp_golden: {os.path.join(build, lib)} missing; rebuild llama.cpp")
    return src, build


def compile_helper(src: str, build: str, out_dir: str) -> str:
    exe = os.path.join(out_dir, "llamacpp_logits")
    libs = [os.path.join(build, p) for p in
            ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a")]
    openmp = "GGML_OPENMP:BOOL=ON" in open(os.path.join(build, "CMakeCache.txt")).read()
    cmd = ["g++", "-O2", "-std=c++17", "-I", os.path.join(src, "include"), "-I", os.path.join(src, "ggml", "include"),
           os.path.join(HERE, "llamacpp_logits.cpp"), *libs, *(["-fopenmp"] if openmp else []), "-lpthread", "-ldl",
           "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


def tokenize(bin_dir: str, model: str, text: str) -> list[int]:
    out = subprocess.run([os.path.join(bin_dir, "llama-tokenize"), "-m", model, "-p", text, "--ids", "--log-disable"],
                         check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.strip().strip("[]").split(",")]


def run_helper(exe: str, model: str, ids: list[int], n_gen: int, threads: int, tmp: str, kv_type: str = "f16",
               flash_attn: str = "auto"):
    """(prompt logits [T, n_vocab] f32, greedy ids [n_gen], greedy step logits [n_gen, n_vocab] f32)."""
    ids_file = os.path.join(tmp, "ids.txt")
    out_file = os.path.join(tmp, "logits.bin")
    with open(ids_file, "w") as f:
        f.write(" ".join(map(str, ids)))
    subprocess.run([exe, model, ids_file, str(n_gen), out_file, str(threads), kv_type, flash_attn], check=True)
    raw = np.fromfile(out_file, dtype="<i4")
    n_prompt, n_vocab = int(raw[0]), int(raw[1])
    pos = 2
    prompt = raw[pos:pos + n_prompt * n_vocab].view("<f4").reshape(n_prompt, n_vocab)
    pos += n_prompt * n_vocab
    n = int(raw[pos]); pos += 1
    steps = raw[pos:].reshape(n, n_vocab + 1)
    gen_ids = steps[:, 0].astype(np.int64)
    gen_logits = steps[:, 1:].view("<f4")
    return prompt, gen_ids, gen_logits


def f32(x) -> float:
    # Shortest decimal that round-trips the float32 value: the C++ side reads it back bit-exactly.
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def top_k(row: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    # Sorted by logit descending, ties by lower id (stable), as argmax picks.
    order = np.lexsort((np.arange(row.size), -row.astype(np.float64)))[:k]
    return [int(i) for i in order], [f32(row[i]) for i in order]


def kl_topk(p_ids, p_logits, p_lse, q_row: np.ndarray) -> float:
    """KL(p || q) from p's top-k logits and log-sum-exp, with the tail outside top-k lumped into one bucket (a lower
    bound of the full KL); q is a full logit row. Mirrors the C++ test's computation."""
    q_lse = rf.log_sum_exp(q_row[None])[0]
    lp = np.asarray(p_logits, np.float64) - p_lse
    lq = q_row[np.asarray(p_ids)].astype(np.float64) - q_lse
    kl = float(np.sum(np.exp(lp) * (lp - lq)))
    p_tail = max(0.0, 1.0 - float(np.exp(lp).sum()))
    q_tail = max(1e-30, 1.0 - float(np.exp(lq).sum()))
    if p_tail > 0:
        kl += p_tail * np.log(p_tail / q_tail)
    return kl


def agreement(what: str, positions, other_logits: np.ndarray, greedy_ref, other_greedy) -> None:
    """Prints how `other` (full logit rows per prompt position, and a greedy continuation) meets the test's bounds
    against the golden data: the same statistics test_e2e_llamacpp.cpp computes for Tessera."""
    top1 = [int(np.argmax(other_logits[t])) == p["top_ids"][0] for t, p in enumerate(positions)]
    kls = [kl_topk(p["top_ids"], p["top_logits"], p["lse"], other_logits[t].astype(np.float64))
           for t, p in enumerate(positions)]
    div = next((s for s, (a, b) in enumerate(zip(greedy_ref, other_greedy)) if a["id"] != b), None)
    gtxt = "greedy identical" if div is None else (f"greedy diverges at step {div} (llama.cpp top-2 gap "
                                                   f"{greedy_ref[div]['gap']:.3g})")
    print(f"  {what:<34} top-1 {sum(top1)}/{len(top1)}, mean KL {np.mean(kls):.3g}, {gtxt}")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=rf.DEFAULT_MODEL)
    ap.add_argument("--out", default=OUT_DEFAULT)
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check-reference", action="store_true",
                    help="also compare the numpy reference forward (float64) with llama.cpp and print the figures")
    ap.add_argument("--check-noise", action="store_true",
                    help="also run llama.cpp with flash attention off and an f32 KV cache and print how that "
                         "differs from its default: the noise floor between two correct engines")
    ap.add_argument("--prompts-json", help="candidate prompts as a JSON list of [name, text] (to evaluate others)")
    a = ap.parse_args()
    prompt_list = PROMPTS if not a.prompts_json else [tuple(x) for x in json.load(open(a.prompts_json))]

    src, build = llamacpp_dirs()
    bin_dir = os.path.join(build, "bin")
    ref_model = rf.Model(a.model, cache_casts=True) if a.check_reference else None
    prompts = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = compile_helper(src, build, tmp)
        for name, text in prompt_list:
            ids = tokenize(bin_dir, a.model, text)
            if not 64 <= len(ids) <= 128:
                sys.exit(f"make_llamacpp_golden: prompt '{name}' has {len(ids)} tokens; keep it within 64..128")
            logits, gen_ids, gen_logits = run_helper(exe, a.model, ids, a.n_gen, a.threads, tmp)
            lse = rf.log_sum_exp(logits)
            positions = []
            for t in range(len(ids)):
                tid, tl = top_k(logits[t], a.top_k)
                positions.append({"top_ids": tid, "top_logits": tl, "lse": float(lse[t])})
            greedy = []
            for s in range(len(gen_ids)):
                tid, tl = top_k(gen_logits[s], 2)
                assert tid[0] == gen_ids[s]
                greedy.append({"id": tid[0], "second_id": tid[1], "top2_logits": tl,
                               "gap": f32(np.float32(tl[0]) - np.float32(tl[1]))})
            prompts.append({"name": name, "text": text, "ids": ids, "positions": positions, "greedy": greedy})
            gaps = [g["gap"] for g in greedy]
            print(f"{name}: {len(ids)} prompt tokens, greedy {a.n_gen} tokens, min top-2 gap {min(gaps):.4g}, "
                  f"EOS (id 2) in continuation: {2 in gen_ids.tolist()}")
            if a.check_noise:
                alt, alt_ids, _ = run_helper(exe, a.model, ids, a.n_gen, a.threads, tmp, "f32", "off")
                agreement("llama.cpp (flash-attn off, f32 KV)", positions, alt, greedy, alt_ids.tolist())
            if ref_model is not None:
                ref = rf.forward(ref_model, ids)
                ref_greedy, _ = rf.greedy(ref_model, ids, a.n_gen)
                agreement("numpy reference (float64)", positions, ref, greedy, ref_greedy)

    doc = {
        "generator": "python/make_llamacpp_golden.py",
        "command": ".venv/bin/python python/make_llamacpp_golden.py",
        "peer": f"llama.cpp vendored in llama-cpp-python=={LLAMACPP_VERSION}, CPU, {a.threads} threads, default "
                "context settings (f16 KV cache, flash attention auto), python/llamacpp_logits.cpp",
        "model_file": os.path.basename(a.model),
        "model_sha256": sha256(a.model),
        "top_k": a.top_k,
        "n_gen": a.n_gen,
        "prompts": prompts,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {a.out} ({os.path.getsize(a.out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
