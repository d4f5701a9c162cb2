#!/usr/bin/env python3
"""llama.cpp's own logits for the tiny LoRA test model, without and with the GGUF adapter that llama.cpp's
convert_lora_to_gguf.py made, for tests/models/test_lora_llamacpp.cpp.

Regenerate (after python/make_lora_golden.py; needs the cached llama.cpp build of scripts/build_llamacpp.sh, g++, and a
python with numpy and sentencepiece, e.g. the scratch venv of make_lora_golden.py):
  /tmp/hfvenv/bin/python python/make_lora_llamacpp_golden.py [--data tests/data/lora] [--threads 2]
reads --data's base/, adapter_a.gguf and golden.json, and writes into --data:
  base.gguf              base/ converted by llama.cpp's convert_hf_to_gguf.py --outtype f32 (Q and K rows permuted
                         for llama.cpp's rotation, as for any llama GGUF). base/ has no tokenizer, but the converter
                         needs one and llama.cpp sizes its logits by the vocabulary, so the conversion runs on a copy of
                         base/ with a throwaway character-level SentencePiece model (30 pieces, padded by the converter
                         to the config's 128 tokens). Nothing reads the pieces: the tests give token ids.
  golden_llamacpp.json   golden.json's ids and llama.cpp's float32 logits [T, vocab] of base.gguf without the adapter
                         ("base") and with adapter_a.gguf at scale 1 ("a"), from python/llamacpp_logits.cpp (helpers of
                         make_llamacpp_golden.py): every position in one batch, f32 KV cache, flash attention off, so
                         both engines are f32 throughout.
Also prints how llama.cpp's logits meet transformers + peft's float64 ones in golden.json (the same model and adapter).
Deterministic: a second run rewrites both files byte for byte (the SentencePiece training runs on one thread).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import make_llamacpp_golden as golden  # noqa: E402

# The throwaway tokenizer's training text: only its characters matter (a "char" model keeps each one as a piece).
_SPM_TEXT = ["the quick brown fox jumps over the lazy dog", "pack my box with five dozen liquor jugs"]


def convert_base(src: str, base_dir: str, out: str) -> None:
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "base")  # the folder's name becomes general.name: keep it fixed
        os.makedirs(copy)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(base_dir, f), copy)
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(_SPM_TEXT), model_writer=buf, model_type="char",
                                       vocab_size=128, hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2,
                                       num_threads=1, minloglevel=2)
        with open(os.path.join(copy, "tokenizer.model"), "wb") as f:
            f.write(buf.getvalue())
        env = dict(os.environ, PYTHONPATH=os.path.join(src, "gguf-py"))
        subprocess.run([sys.executable, os.path.join(src, "convert_hf_to_gguf.py"), copy, "--outtype", "f32",
                        "--outfile", out], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def llamacpp_logits(exe: str, model: str, ids: list[int], threads: int, tmp: str, lora: str = "") -> np.ndarray:
    """llama.cpp's logits [T, n_vocab] (f32) of every position of ids, f32 KV cache, flash attention off."""
    ids_file = os.path.join(tmp, "ids.txt")
    out_file = os.path.join(tmp, "logits.bin")
    with open(ids_file, "w") as f:
        f.write(" ".join(map(str, ids)))
    subprocess.run([exe, model, ids_file, "1", out_file, str(threads), "f32", "off", *([lora] if lora else [])],
                   check=True)
    raw = np.fromfile(out_file, dtype="<i4")
    n_prompt, n_vocab = int(raw[0]), int(raw[1])
    assert n_prompt == len(ids), (n_prompt, len(ids))
    return raw[2:2 + n_prompt * n_vocab].view("<f4").reshape(n_prompt, n_vocab).copy()


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.sum((got - want) ** 2) / np.sum(want ** 2))


def max_rel(got: np.ndarray, want: np.ndarray) -> float:
    """Largest |got - want| over the row's max |want| (test_lora.cpp's measure)."""
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "tests", "data", "lora"))
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    src, build = golden.llamacpp_dirs()
    with open(os.path.join(a.data, "golden.json")) as f:
        hf = json.load(f)
    ids = hf["ids"]
    base_gguf = os.path.join(a.data, "base.gguf")
    adapter = os.path.join(a.data, "adapter_a.gguf")
    convert_base(src, os.path.join(a.data, "base"), base_gguf)
    with tempfile.TemporaryDirectory() as tmp:
        exe = golden.compile_helper(src, build, tmp)
        runs = {"base": llamacpp_logits(exe, base_gguf, ids, a.threads, tmp),
                "a": llamacpp_logits(exe, base_gguf, ids, a.threads, tmp, adapter)}

    for key, lg in runs.items():
        want = np.asarray(hf[key], np.float64)
        top1 = int((lg.argmax(axis=1) == want.argmax(axis=1)).sum())
        print(f"{key}: llama.cpp against transformers + peft (float64): nMSE {nmse(lg, want):.3g}, max error "
              f"{max_rel(lg, want):.3g} of the row's scale, top-1 {top1}/{len(ids)}")
    eff = runs["a"].astype(np.float64) - runs["base"]
    eff_hf = np.asarray(hf["a"], np.float64) - np.asarray(hf["base"], np.float64)
    print(f"adapter effect (a - base): largest {np.abs(eff).max():.3f}; against peft's nMSE {nmse(eff, eff_hf):.3g}; "
          f"twice peft's would be nMSE {nmse(2 * eff_hf, eff_hf):.3g}")

    out = {"generator": "python/make_lora_llamacpp_golden.py",
           "peer": f"llama.cpp vendored in llama-cpp-python=={golden.LLAMACPP_VERSION}, CPU, {a.threads} threads, "
                   "f32 KV cache, flash attention off, python/llamacpp_logits.cpp",
           "model_file": "base.gguf", "model_sha256": golden.sha256(base_gguf),
           "adapter_file": "adapter_a.gguf", "adapter_sha256": golden.sha256(adapter), "adapter_scale": 1.0,
           "ids": ids}
    for key, lg in runs.items():
        out[key] = [[golden.f32(x) for x in row] for row in lg]
    path = os.path.join(a.data, "golden_llamacpp.json")
    with open(path, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {base_gguf} ({os.path.getsize(base_gguf)} bytes) and {path} ({os.path.getsize(path)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
