#!/usr/bin/env python3
"""Exports a Hugging Face tokenizer.json (byte-level BPE) from a GGUF file's `gpt2` tokenizer metadata.

Usage:
    .venv/bin/python python/export_tokenizer_json.py MODEL.gguf OUT.json [--max-merges N]

With --max-merges N the vocabulary is cut to a smaller but still complete BPE: the 256 byte-level symbols, the results
of the first N merges and the added (control / user-defined) tokens, renumbered densely in the original id order.
The pre-tokenizer follows `tokenizer.ggml.pre` (smollm, gpt2, llama3 / llama-bpe, qwen2, default-like gpt2), the
decoder is ByteLevel, and control tokens become special added tokens, as in the original models' tokenizer.json.
Used by python/make_tokenizer_golden.py to produce tests/data/tokenizer/smollm_4k.tokenizer.json.
"""
import argparse
import json

import gguf

# Byte-level alphabet: printable bytes map to themselves, the rest to U+0100 onwards (GPT-2's bytes_to_unicode).
def byte_alphabet():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping = {}
    n = 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


LLAMA3_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def pre_tokenizer_for(pre):
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "Isolated", "invert": False}, byte_level]}
    if pre in ("llama3", "llama-bpe", "llama-v3", "qwen2"):
        regex = QWEN2_REGEX if pre == "qwen2" else LLAMA3_REGEX
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            dict(byte_level, use_regex=False)]}
    if pre in ("gpt-2", "gpt2", "mpt", "olmo"):
        return byte_level
    raise SystemExit(f"export_tokenizer_json: pre-tokenizer '{pre}' is not supported by this exporter")


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def field_scalar(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]]
    return bytes(v).decode("utf-8") if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()


def export(model_path, out_path, max_merges=None):
    r = gguf.GGUFReader(model_path)
    if field_scalar(r, "tokenizer.ggml.model") != "gpt2":
        raise SystemExit("export_tokenizer_json: only tokenizer.ggml.model = gpt2 (byte-level BPE) is supported")
    tokens = field_strings(r, "tokenizer.ggml.tokens")
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    merges = [m.split(" ", 1) for m in field_strings(r, "tokenizer.ggml.merges")]
    pre = field_scalar(r, "tokenizer.ggml.pre", "gpt2")

    added_types = (3, 4)  # CONTROL, USER_DEFINED
    if max_merges is not None:
        merges = merges[:max_merges]
        keep = set(byte_alphabet().values())
        for a, b in merges:
            keep.update((a, b, a + b))
        kept_ids = [i for i, t in enumerate(tokens) if t in keep or types[i] in added_types]
    else:
        kept_ids = list(range(len(tokens)))
    new_id = {old: new for new, old in enumerate(kept_ids)}
    vocab = {}
    for old in kept_ids:
        vocab.setdefault(tokens[old], new_id[old])
    missing = [a + " " + b for a, b in merges if a not in vocab or b not in vocab or a + b not in vocab]
    if missing:
        raise SystemExit(f"export_tokenizer_json: merges refer to tokens outside the vocabulary: {missing[:5]}")

    added = [{"id": new_id[old], "content": tokens[old], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[old] == 3}
             for old in kept_ids if types[old] in added_types]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer_for(pre),
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--max-merges", type=int, default=None)
    a = ap.parse_args()
    export(a.model, a.out, a.max_merges)


if __name__ == "__main__":
    main()
