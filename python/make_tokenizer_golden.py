#!/usr/bin/env python3
"""Golden token ids for the tokenizer corpus, from two independent peers.

Regenerate (needs the default model and llama.cpp's llama-tokenize from scripts/build_llamacpp.sh):
    .venv/bin/python python/make_tokenizer_golden.py \
        --llama-tokenize "$(scripts/build_llamacpp.sh llama-tokenize)/llama-tokenize" \
        --model ~/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf

Token id lists are stored packed: base64 of little-endian uint16 ids (every vocabulary here is below 65536), which
keeps the files a third of their JSON-array size; pack()/unpack() below and the C++ tests decode them.

Writes into tests/data/tokenizer/:
  golden_llamacpp.json   llama.cpp `llama-tokenize` ids for every corpus string on the default model, with special
                         tokens parsed ("special") and, for the strings that contain a special token's text, with
                         special parsing off ("plain": {index: ids}).
  smollm_4k.tokenizer.json + golden_hf.json
                         a tokenizer.json exported from the default model's vocabulary cut to its first 4000 merges
                         (python/export_tokenizer_json.py; small enough to commit) and the ids the PyPI `tokenizers`
                         package gives for every corpus string on it.
  golden_pre.json        llama.cpp ids for every PRE_STRIDE-th corpus string on vocabulary-only copies of the default
                         model with tokenizer.ggml.pre set to llama-bpe, qwen2, gpt-2 and default, stored as the
                         strings whose ids differ from golden_llamacpp.json's (smollm).
  golden_gemma3.json     (--only gemma3) llama.cpp ids for every corpus string and GEMMA3_EXTRA (chat turns, Gemma's
                         control and user-defined tokens) on Gemma 3 270M (scripts/fetch_model.sh gemma3-270m), with
                         special parsing on ("special") and off ("plain", where it differs), as llama-tokenize gives them; tokenized in
                         one process by python/llamacpp_tokenize.cpp (compiled here against the cached llama.cpp
                         build), since loading the 262k-token vocabulary per string took 2 s. Ids are packed as
                         uint32 (pack32): the vocabulary is above 65536.
It also exports the full vocabulary to a temporary tokenizer.json and reports how many corpus strings `tokenizers`
tokenizes differently from llama.cpp (a cross-check of the two peers; expected 0).
"""
import argparse
import base64
import concurrent.futures
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
sys.path.insert(0, HERE)

import export_tokenizer_json  # noqa: E402

SPECIAL_MARKERS = ("<|", "<repo", "<file", "<gh_", "<issue", "<jupyter", "<empty")


def pack(ids):
    assert all(0 <= i < 65536 for i in ids)
    return base64.b64encode(struct.pack(f"<{len(ids)}H", *ids)).decode("ascii")


def pack32(ids):
    return base64.b64encode(struct.pack(f"<{len(ids)}I", *ids)).decode("ascii")


def unpack(text):
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 2}H", raw))


def llama_tokenize(exe, model, text, parse_special, tmpdir, index):
    path = os.path.join(tmpdir, f"s{index}_{int(parse_special)}.txt")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    cmd = [exe, "-m", model, "-f", path, "--ids", "--log-disable", "--no-escape"]
    if not parse_special:
        cmd.append("--no-parse-special")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    os.unlink(path)
    return json.loads(out)


PRE_VARIANTS = {"llama-bpe": True, "qwen2": False, "gpt-2": False, "default": False}  # name: ignore_merges
PRE_STRIDE = 3


def write_pre_variant(model, pre, path):
    """A vocabulary-only GGUF: every metadata key of `model` (no tensors), tokenizer.ggml.pre replaced."""
    import gguf
    r = gguf.GGUFReader(model)
    arch_field = r.fields["general.architecture"]
    w = gguf.GGUFWriter(path, bytes(arch_field.parts[arch_field.data[0]]).decode("utf-8"))  # writes the arch key
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in ("tokenizer.ggml.pre", "general.architecture"):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                val = [field.parts[i][0].item() for i in field.data]
            w.add_key_value(key, val, vtype, sub_type=sub)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_key_value(key, bytes(field.parts[field.data[0]]).decode("utf-8"), vtype)
        else:
            w.add_key_value(key, field.parts[field.data[0]][0].item(), vtype)
    w.add_key_value("tokenizer.ggml.pre", pre, gguf.GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def pre_golden(args, corpus, base):
    out = {"source": "llama.cpp llama-tokenize on vocabulary-only copies of the default model",
           "regenerate": "python/make_tokenizer_golden.py", "stride": PRE_STRIDE, "pre": {}}
    idx = list(range(0, len(corpus), PRE_STRIDE))
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for pre, ignore_merges in PRE_VARIANTS.items():
            path = os.path.join(tmp, f"vocab-{pre}.gguf")
            write_pre_variant(args.model, pre, path)
            ids = list(pool.map(lambda i: llama_tokenize(args.llama_tokenize, path, corpus[i], True, tmp, i), idx))
            differs = {str(i): pack(x) for i, x in zip(idx, ids) if x != base[i]}
            out["pre"][pre] = {"ignore_merges": ignore_merges, "checked": len(idx), "differs": differs}
            print(f"make_tokenizer_golden: pre {pre}: {len(differs)} of {len(idx)} strings differ from smollm",
                  file=sys.stderr)
    dump_compact(out, os.path.join(DATA, "golden_pre.json"))


def dump_compact(obj, path):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
        f.write("\n")
    print(f"make_tokenizer_golden: wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-tokenize", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--hf-merges", type=int, default=4000)
    ap.add_argument("--only", choices=["all", "llamacpp", "pre", "hf", "gemma3"], default="all")
    ap.add_argument("--gemma3-model", default=os.path.expanduser("~/.cache/tessera/models/gemma-3-270m-q4_k_m.gguf"))
    args = ap.parse_args()

    with open(os.path.join(DATA, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    model_name = os.path.basename(args.model)

    if args.only in ("all", "llamacpp"):
        llamacpp_golden(args, corpus, model_name)
    if args.only in ("all", "pre"):
        with open(os.path.join(DATA, "golden_llamacpp.json"), encoding="utf-8") as f:
            base = [unpack(x) for x in json.load(f)["special"]]
        pre_golden(args, corpus, base)
    if args.only in ("all", "hf"):
        hf_golden(args, corpus, model_name)
    if args.only in ("all", "gemma3"):
        gemma3_golden(args, corpus)


# Strings for Gemma's own special tokens and chat format (the corpus holds SmolLM's), appended to the corpus.
GEMMA3_EXTRA = [
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
    "text<end_of_turn>more text <start_of_turn> spaced  ",
    "<start_of_image><end_of_image> <image_soft_token>",
    "<unused0><unused1> <unused99>",
    "<eos><pad><unk><mask>[multimodal]",
    "<table><tr><td>cell</td></tr></table>",
    "<h1>Title</h1>\n<p>para</p>\n<br>",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t",
    " " * 40 + "x" + " " * 33,
    "<0x41><0xFF> literal byte-token text",
    "\u2581already\u2581escaped \u2581 spaces",
    "<start_of_turn",
    "<<start_of_turn>>",
]


def gemma3_golden(args, corpus):
    model = args.gemma3_model
    if not os.path.exists(model):
        sys.exit(f"make_tokenizer_golden: {model} is missing: run scripts/fetch_model.sh gemma3-270m")
    bin_dir = os.path.dirname(os.path.abspath(args.llama_tokenize))
    build = os.path.dirname(bin_dir)
    src = os.path.join(os.path.dirname(build), "src")
    texts = corpus + GEMMA3_EXTRA
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "llamacpp_tokenize")
        libs = [os.path.join(build, p) for p in
                ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a")]
        openmp = "GGML_OPENMP:BOOL=ON" in open(os.path.join(build, "CMakeCache.txt")).read()
        subprocess.run(["g++", "-O2", "-std=c++17", "-I", os.path.join(src, "include"), "-I",
                        os.path.join(src, "ggml", "include"), os.path.join(HERE, "llamacpp_tokenize.cpp"), *libs,
                        *(["-fopenmp"] if openmp else []), "-lpthread", "-ldl", "-o", exe], check=True)
        inp, out = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.txt")
        with open(inp, "wb") as f:
            for special in (1, 0):
                for t in texts:
                    b = t.encode("utf-8")
                    f.write(struct.pack("<IB", len(b), special) + b)
        subprocess.run([exe, model, inp, out], check=True)
        with open(out, encoding="ascii") as f:
            lines = [[int(x) for x in line.split()] for line in f.read().split("\n")[:-1]]
    assert len(lines) == 2 * len(texts), (len(lines), len(texts))
    # Cross-check the helper against llama-tokenize itself on a few strings (the same call path, one per process).
    with tempfile.TemporaryDirectory() as tmp:
        for i in list(range(0, len(corpus), 97)) + [len(corpus) + k for k in range(len(GEMMA3_EXTRA))]:
            for special, ids in ((True, lines[i]), (False, lines[len(texts) + i])):
                want = llama_tokenize(args.llama_tokenize, model, texts[i], special, tmp, i)
                assert ids == want, (i, special, ids, want)
    import hashlib
    with open(model, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    dump_compact({
        "source": "llama.cpp llama_tokenize (llama-cpp-python 0.3.36 sdist) through python/llamacpp_tokenize.cpp, "
                  "add_special on; cross-checked against llama-tokenize --ids --no-escape",
        "model": os.path.basename(model), "model_sha256": digest,
        "regenerate": "python/make_tokenizer_golden.py --only gemma3",
        "extra": GEMMA3_EXTRA,
        "special": [pack32(x) for x in lines[:len(texts)]],
        # special parsing off: only the strings whose ids differ from "special" ({index: ids})
        "plain": {str(i): pack32(x) for i, x in enumerate(lines[len(texts):]) if x != lines[i]},
    }, os.path.join(DATA, "golden_gemma3.json"))


def llamacpp_golden(args, corpus, model_name):
    # llama.cpp: one process per string and mode (vocab-only load, about 0.1 s each).
    plain_idx = [i for i, s in enumerate(corpus) if any(m in s for m in SPECIAL_MARKERS)]
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        special = list(pool.map(lambda i: llama_tokenize(args.llama_tokenize, args.model, corpus[i], True, tmp, i),
                                range(len(corpus))))
        plain = list(pool.map(lambda i: llama_tokenize(args.llama_tokenize, args.model, corpus[i], False, tmp, i),
                              plain_idx))
    dump_compact({
        "source": "llama.cpp llama-tokenize (llama-cpp-python 0.3.36 sdist) --ids --no-escape",
        "model": model_name,
        "regenerate": "python/make_tokenizer_golden.py",
        "special": [pack(x) for x in special],
        "plain": {str(i): pack(ids) for i, ids in zip(plain_idx, plain)},
    }, os.path.join(DATA, "golden_llamacpp.json"))


def hf_golden(args, corpus, model_name):
    with open(os.path.join(DATA, "golden_llamacpp.json"), encoding="utf-8") as f:
        special = [unpack(x) for x in json.load(f)["special"]]
    # Hugging Face tokenizers on the exported (cut) tokenizer.json.
    from tokenizers import Tokenizer
    small_path = os.path.join(DATA, "smollm_4k.tokenizer.json")
    export_tokenizer_json.export(args.model, small_path, max_merges=args.hf_merges)
    tok = Tokenizer.from_file(small_path)
    hf = [tok.encode(s, add_special_tokens=False).ids for s in corpus]
    dump_compact({
        "source": f"tokenizers {__import__('tokenizers').__version__} on smollm_4k.tokenizer.json",
        "model": model_name,
        "regenerate": "python/make_tokenizer_golden.py",
        "ids": [pack(x) for x in hf],
    }, os.path.join(DATA, "golden_hf.json"))

    # Cross-check of the peers on the full vocabulary (not stored: the full tokenizer.json is megabytes).
    with tempfile.TemporaryDirectory() as tmp:
        full_path = os.path.join(tmp, "tokenizer.json")
        export_tokenizer_json.export(args.model, full_path)
        full = Tokenizer.from_file(full_path)
        diff = [i for i, s in enumerate(corpus) if full.encode(s, add_special_tokens=False).ids != special[i]]
    print(f"make_tokenizer_golden: {len(corpus)} strings; tokenizers (full vocab) and llama.cpp differ on "
          f"{len(diff)}: {diff[:20]}", file=sys.stderr)


if __name__ == "__main__":
    main()
