#!/usr/bin/env python3
"""A tiny SentencePiece-style (tokenizer.ggml.model = "llama") vocabulary and golden ids for it.

Regenerate:
    .venv/bin/python python/make_spm_golden.py [--llama-tokenize PATH/llama-tokenize]

No SentencePiece GGUF model is available offline, so this builds one: <unk>, <s>, </s>, the 256 byte tokens
<0x00>..<0xFF>, a user-defined token, and about 1500 pieces (with the U+2581 word marker) cut from a small word list,
scored by frequency. Ids are stored as base64 of little-endian uint16 (as in make_tokenizer_golden.py). It writes tests/data/tokenizer/spm_tiny.gguf (vocabulary only) and spm_golden.json with the ids
of an independent, deliberately naive Python implementation of SentencePiece BPE as llama.cpp runs it (spec check):
  - special tokens are cut out first, longest text first (control ones only with special parsing on);
  - every text fragment gets a leading space when it starts the text or follows a special token
    (tokenizer.ggml.add_space_prefix), and spaces become U+2581;
  - symbols start as UTF-8 characters; repeatedly, the adjacent pair whose concatenation is a vocabulary token with
    the highest score is merged (leftmost among equal scores);
  - a final symbol that is not a token becomes its bytes' <0xXX> tokens.
With --llama-tokenize it also runs llama.cpp's llama-tokenize on the same file (a peer check) and records how many
cases agree ("llamacpp_identical") and llama.cpp's ids where they do not ("llamacpp_differing").
"""
import argparse
import base64
import collections
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
SEED = 7
SP = "\u2581"

TRAIN = (
    "the quick brown fox jumps over the lazy dog . hello world ! tokenizers split text into pieces and merge "
    "the most likely pairs first . numbers like 12 345 and 2024 appear too , as do names such as Alice and Bob . "
    "café naïve résumé Straße Привет мир Москва γειά σου κόσμε 你好世界 日本語 한국어 "
    "def main ( ) : return 0 ; int x = 42 ; printf ( \"%d\" , x ) ; "
    "I'm you're don't it's they'll we've "
).split()


def build_vocab():
    counts = collections.Counter()
    for w in TRAIN:
        word = SP + w
        for i in range(len(word)):
            for j in range(i + 1, min(len(word), i + 8) + 1):
                counts[word[i:j]] += 1
    # Every single character of the training text is a piece, so most text merges up from characters.
    pieces = sorted(counts, key=lambda p: (-counts[p] * (1 + len(p)), p))[:1500]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<|user|>"]
    types = [2, 3, 3] + [6] * 256 + [4]
    scores = [0.0] * len(tokens)
    for rank, p in enumerate(pieces):
        if p in tokens:
            continue
        tokens.append(p)
        types.append(1)
        scores.append(-float(rank) / 4.0 - (0.5 if rank % 7 == 0 else 0.0))  # some equal scores on purpose
    # A few equal scores exactly, to exercise leftmost tie-breaking.
    for i in range(300, len(scores), 50):
        scores[i] = scores[i - 1]
    return tokens, types, scores


def write_gguf(path, tokens, types, scores):
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("spm-tiny")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores([float(np.float32(s)) for s in scores])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def utf8_chars(b):
    """Split (valid UTF-8) bytes into characters by the lead byte's length."""
    out, i = [], 0
    while i < len(b):
        n = [1] * 12 + [2, 2, 3, 4]
        n = n[b[i] >> 4]
        out.append(b[i:i + n])
        i += n
    return out


def reference_encode(text, tokens, types, scores, add_bos, parse_special):
    vocab = {}
    for i, t in enumerate(tokens):
        vocab[t.encode("utf-8")] = i  # a repeated text maps to its last id
    specials = [i for i, t in enumerate(types) if t in (2, 3, 4) and (parse_special or t == 4)]
    specials.sort(key=lambda i: -len(tokens[i].encode("utf-8")))  # stable: ties keep id order
    frags = [text.encode("utf-8")]
    for sid in specials:
        st = tokens[sid].encode("utf-8")
        nxt = []
        for f in frags:
            if isinstance(f, int):
                nxt.append(f)
                continue
            parts = f.split(st)
            for k, part in enumerate(parts):
                if k > 0:
                    nxt.append(sid)
                if part:
                    nxt.append(part)
        frags = nxt
    out = [1] if add_bos else []
    prev_special = True
    for f in frags:
        if isinstance(f, int):
            out.append(f)
            prev_special = True
            continue
        if prev_special:
            f = b" " + f
        prev_special = False
        syms = utf8_chars(f.replace(b" ", SP.encode("utf-8")))
        while True:
            best, best_score = None, None
            for i in range(len(syms) - 1):
                t = vocab.get(syms[i] + syms[i + 1])
                if t is not None and (best is None or scores[t] > best_score):
                    best, best_score = i, scores[t]
            if best is None:
                break
            syms[best:best + 2] = [syms[best] + syms[best + 1]]
        for s in syms:
            if s in vocab:
                out.append(vocab[s])
            else:
                out.extend(vocab[f"<0x{b:02X}>".encode()] for b in s)
    return out


def corpus():
    rng = random.Random(SEED)
    with open(os.path.join(DATA, "corpus.json"), encoding="utf-8") as f:
        big = json.load(f)
    picked = [s for s in big if len(s) < 200]
    rng.shuffle(picked)
    fixed = ["", "hello world", " hello", "hello  world ", "<s>hello</s>", "<|user|>hi<|user|>", "a<s>b", "<0x41>",
             "the the the", "Привет мир", "你好世界!", "\n\t", "▁already▁escaped", "I'm here"]
    return fixed + picked[:240]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-tokenize", default=None)
    args = ap.parse_args()
    tokens, types, scores = build_vocab()
    gguf_path = os.path.join(DATA, "spm_tiny.gguf")
    write_gguf(gguf_path, tokens, types, scores)
    # Scores as stored (float32), so ties and order are exactly what the C++ side reads.
    scores32 = [float(np.float32(s)) for s in scores]
    texts = corpus()
    cases = []
    for i, s in enumerate(texts):
        for special in (True, False):
            cases.append({"text": i, "parse_special": special,
                          "ids": reference_encode(s, tokens, types, scores32, True, special)})
    packed = lambda ids: base64.b64encode(struct.pack(f"<{len(ids)}H", *ids)).decode("ascii")
    doc = {"source": "python/make_spm_golden.py reference SentencePiece BPE", "texts": texts, "cases": cases}
    if args.llama_tokenize:
        peer = []
        with tempfile.TemporaryDirectory() as tmp:
            for i, s in enumerate(texts):
                p = os.path.join(tmp, "t.txt")
                with open(p, "wb") as f:
                    f.write(s.encode("utf-8"))
                for special in (True, False):
                    cmd = [args.llama_tokenize, "-m", gguf_path, "-f", p, "--ids", "--log-disable", "--no-escape"]
                    if not special:
                        cmd.append("--no-parse-special")
                    r = subprocess.run(cmd, capture_output=True, text=True)
                    if r.returncode != 0:
                        sys.exit(f"make_spm_golden: llama-tokenize failed: {r.stderr[-500:]}")
                    peer.append(json.loads(r.stdout.strip()))
        diff = [k for k, c in enumerate(cases) if c["ids"] != peer[k]]
        print(f"make_spm_golden: llama.cpp differs from the reference on {len(diff)} of {len(cases)} cases: "
              f"{[(cases[k]['text'], cases[k]['parse_special']) for k in diff[:10]]}", file=sys.stderr)
        # Stored compactly: the number of cases where llama.cpp gave exactly the reference ids, and any others.
        doc["llamacpp_identical"] = len(cases) - len(diff)
        doc["llamacpp_differing"] = {str(k): packed(peer[k]) for k in diff}
    for c in cases:
        c["ids"] = packed(c["ids"])
    with open(os.path.join(DATA, "spm_golden.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"make_spm_golden: {len(tokens)} tokens, {len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
