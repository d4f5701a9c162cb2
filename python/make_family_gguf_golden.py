#!/usr/bin/env python3
"""The tiny family models of tests/data/hf converted to GGUF by llama.cpp's own converter, for
tests/models/test_family_gguf.cpp (FamilyGguf): Tessera must read a user's GGUF (llama.cpp's layout and metadata), not
only the GGUF files it writes itself.

Regenerate (needs torch + transformers + sentencepiece, e.g. /tmp/hfvenv of python/make_family_hf_golden.py, and the
llama.cpp source of scripts/build_llamacpp.sh --source; llama.cpp's logits only where its CPU build exists):
  /tmp/hfvenv/bin/python python/make_family_gguf_golden.py [--out tests/data/family_gguf]
writes tiny-{gemma3,qwen2,qwen3,mistral,phi3}.gguf (convert_hf_to_gguf.py --outtype f32 of tests/data/hf/tiny-*-f32)
and golden.json: per file its sha256, the transformers reference it must match, and llama.cpp's logits of the same
token ids on the converted file (f32 KV cache, flash attention off), when llama.cpp is built.

The tiny folders hold no tokenizer, which the converter needs: each is copied to a temporary folder together with a
tiny sentencepiece model (64 pieces, trained here; Phi-3 also <|endoftext|>, which llama.cpp's loader requires
of it); the converter pads the token list with [PADn] to the config's
vocab_size, so the vocabulary keeps the embedding's 128 rows.

The transformers reference is the folder's own golden.json (float64 logits) unless the conversion drops something
the file cannot say, in which case it is recomputed here with transformers from the same weights, as llama.cpp reads
the converted file:
  Gemma 3: the converter keeps neither layer_types nor query_pre_attn_scalar; llama.cpp then makes five of every six
    layers local (all 3 here) and scales by 1/sqrt(head_dim) (16, not 12).
  Mistral: it is converted as architecture llama, which has no sliding window (full attention).
Phi-3 keeps its sliding window in the file (6) but llama.cpp switches Phi's window off; Tessera applies it as
transformers does, so llama.cpp's rows are comparable only while the window drops no key (the first 6 tokens):
golden.json says how many rows of llama.cpp's logits the test compares.
"""
from __future__ import annotations

import argparse
import hashlib
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
HF_DIR = os.path.join(ROOT, "tests", "data", "hf")

# family -> (HF folder under tests/data/hf, config overrides for transformers' reference of the converted file or
# None to reuse the folder's golden.json, why, rows of llama.cpp's logits comparable to the reference)
FAMILIES = {
    "gemma3": ("tiny-gemma3-f32",
               {"layer_types": ["sliding_attention"] * 3, "query_pre_attn_scalar": 16},
               "the converter keeps neither layer_types nor query_pre_attn_scalar: llama.cpp (and Tessera) make five "
               "of every six layers local and scale by 1/sqrt(head_dim)", 10),
    "qwen2": ("tiny-qwen2-f32", None, "", 10),
    "qwen3": ("tiny-qwen3-f32", None, "", 10),
    "mistral": ("tiny-mistral-f32", {"sliding_window": None},
                "converted as architecture llama, which has no sliding window", 10),
    "phi3": ("tiny-phi3-f32", None,
             "llama.cpp switches Phi-3's sliding window (6) off: its rows match only while the window drops no key", 6),
}


def f32(x) -> float:
    # Shortest decimal that round-trips the float32 value (as make_family_hf_golden.py writes its logits).
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tokenizer_model() -> bytes:
    """A tiny sentencepiece model (ids 0-2 unk/bos/eos as the tiny configs say): only for the converter's vocabulary."""
    import sentencepiece as spm
    text = [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(200)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=out, vocab_size=64, model_type="bpe",
                                   character_coverage=1.0, num_threads=1, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   minloglevel=2)
    return out.getvalue()


def convert(src: str, hf_name: str, tok: bytes, tmp: str, out: str) -> None:
    d = os.path.join(tmp, hf_name)
    os.makedirs(d)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(HF_DIR, hf_name, f), d)
    with open(os.path.join(d, "tokenizer.model"), "wb") as f:
        f.write(tok)
    if hf_name.startswith("tiny-phi3"):
        # llama.cpp's vocabulary loader looks up <|endoftext|> in a model named Phi-3 (and fails without it): the first
        # id past the 64 pieces, as Phi-3's own added_tokens.json places it past its sentencepiece vocabulary.
        with open(os.path.join(d, "added_tokens.json"), "w") as f:
            json.dump({"<|endoftext|>": 64}, f)
    env = dict(os.environ, PYTHONPATH=os.path.join(src, "gguf-py") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(src, "convert_hf_to_gguf.py"), d, "--outtype", "f32",
                        "--outfile", out], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"make_family_gguf_golden: convert_hf_to_gguf.py failed on {hf_name}:\n{r.stderr[-4000:]}")


def transformers_logits(hf_name: str, ids: list, overrides: dict | None) -> np.ndarray:
    """transformers' eager float64 logits [T, vocab] of the saved weights, with config overrides."""
    import torch
    import transformers
    d = os.path.join(HF_DIR, hf_name)
    cfg = transformers.AutoConfig.from_pretrained(d, attn_implementation="eager")
    for k, v in (overrides or {}).items():
        setattr(cfg, k, v)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32).eval().double()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()


def llamacpp_build(src: str) -> str | None:
    """The cached llama.cpp build directory when its libraries exist (never starts a build)."""
    build = os.path.join(os.path.dirname(src), "build")
    libs = ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a",
            "CMakeCache.txt")
    return build if all(os.path.exists(os.path.join(build, p)) for p in libs) else None


def agreement(got: np.ndarray, want: np.ndarray) -> str:
    scale = np.abs(want).max(axis=1, keepdims=True)
    rel = np.abs(got - want) / scale
    top1 = int((got.argmax(axis=1) == want.argmax(axis=1)).sum())
    return f"max rel {rel.max():.2e}, mean rel {rel.mean():.2e}, top-1 {top1}/{len(want)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "family_gguf"))
    ap.add_argument("--no-llamacpp", action="store_true", help="leave llama.cpp's logits out even if it is built")
    a = ap.parse_args()
    src = subprocess.run([os.path.join(ROOT, "scripts", "build_llamacpp.sh"), "--source"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    sys.path.insert(0, HERE)
    import make_llamacpp_golden as lg  # compile_helper / run_helper
    build = None if a.no_llamacpp else llamacpp_build(src)
    if build is None and not a.no_llamacpp:
        print("make_family_gguf_golden: no llama.cpp build (scripts/build_llamacpp.sh): llama.cpp's logits left out")
    os.makedirs(a.out, exist_ok=True)
    tok = tokenizer_model()
    golden = {"generator": "python/make_family_gguf_golden.py", "converter": f"llama.cpp {lg.LLAMACPP_VERSION} "
              "convert_hf_to_gguf.py --outtype f32", "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        exe = lg.compile_helper(src, build, tmp) if build else None
        for fam, (hf_name, overrides, why, llama_rows) in FAMILIES.items():
            out = os.path.join(a.out, f"tiny-{fam}.gguf")
            convert(src, hf_name, tok, tmp, out)
            with open(os.path.join(HF_DIR, hf_name, "golden.json")) as f:
                hf_golden = json.load(f)
            ids = hf_golden["ids"]
            entry = {"sha256": sha256(out), "hf_folder": f"hf/{hf_name}"}
            if overrides is None:
                entry["transformers"] = {"golden": f"hf/{hf_name}/golden.json"}
                want = np.array(hf_golden["logits"])
            else:
                # The loader must reproduce the folder's own golden first, or the changed reference means nothing.
                same = transformers_logits(hf_name, ids, None)
                err = np.abs(same - np.array(hf_golden["logits"])).max()
                if err > 1e-5:
                    sys.exit(f"make_family_gguf_golden: reloading {hf_name} moved its logits by {err}")
                want = transformers_logits(hf_name, ids, overrides)
                entry["transformers"] = {"config_overrides": overrides, "why": why, "ids": ids,
                                         "logits": [[f32(x) for x in row] for row in want]}
            line = f"tiny-{fam}.gguf: {os.path.getsize(out)} bytes"
            if exe:
                logits, _, _ = lg.run_helper(exe, out, ids, 1, 2, tmp, kv_type="f32", flash_attn="off")
                entry["llamacpp"] = {"rows": llama_rows, "kv_type": "f32", "flash_attn": "off", "ids": ids,
                                     "logits": [[f32(x) for x in row] for row in logits]}
                if why and llama_rows < len(ids):
                    entry["llamacpp"]["why"] = why
                line += f"; llama.cpp vs transformers (first {llama_rows} rows): " + \
                    agreement(logits[:llama_rows].astype(np.float64), want[:llama_rows])
            golden["files"][f"tiny-{fam}.gguf"] = entry
            print(line)
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(golden, f)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
