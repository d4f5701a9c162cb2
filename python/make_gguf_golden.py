#!/usr/bin/env python3
# Golden data for the GGUF reader (src/formats/gguf_reader.cpp), produced by gguf-py's GGUFReader (PyPI `gguf`).
#
# Regenerate (from the repository root; the default model comes from scripts/fetch_model.sh):
#   .venv/bin/python python/make_gguf_golden.py
#
# Writes tests/data/gguf/smollm2_q4_1_golden.json, read by tests/formats/test_gguf_golden.cpp:
#   version, alignment, data_offset, file_size;
#   metadata  every key in file order with its type and value; arrays give their length and element type, the
#             first and last few elements, every element when short, and an FNV-1a 64 hash over all elements in a
#             canonical encoding (below), so the test checks every element without a megabyte of JSON;
#   tensors   the full tensor table: name, ggml type id and name, shape (row-major, outermost first), n_bytes,
#             absolute data offset, and FNV-1a 64 of the first and last 64 bytes of the data.
# Canonical element encoding for the hash: a string is its u64 little-endian byte length followed by its bytes; an
# integer or bool is its value as 64-bit two's complement little-endian; a float is its float64 value's 8 bytes.
import argparse
import importlib.metadata
import json
import os
import struct
import sys

import gguf
import numpy as np

GENERATED_BY = ".venv/bin/python python/make_gguf_golden.py"
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1
SHORT_ARRAY = 16  # arrays up to this length are stored whole
HEAD = 4


def fnv1a64(data: bytes, h: int = FNV_OFFSET) -> int:
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def type_name(t: gguf.GGUFValueType) -> str:
    return t.name.lower()


def decode_value(field: gguf.ReaderField, idx: int, vtype: gguf.GGUFValueType):
    """Element idx (an index into field.parts) as a JSON value and its canonical bytes."""
    part = field.parts[idx]
    if vtype == gguf.GGUFValueType.STRING:
        raw = bytes(part.tobytes())
        return raw.decode("utf-8"), struct.pack("<Q", len(raw)) + raw
    v = part.tolist()[0]
    if vtype == gguf.GGUFValueType.BOOL:
        return bool(v), struct.pack("<Q", int(bool(v)))
    if vtype in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
        return float(v), struct.pack("<d", float(v))
    v = int(v)
    return v, struct.pack("<Q", v & MASK)


def metadata_entry(key: str, field: gguf.ReaderField) -> dict:
    main = field.types[0]
    if main != gguf.GGUFValueType.ARRAY:
        value, _ = decode_value(field, field.data[0], main)
        return {"key": key, "type": type_name(main), "value": value}
    if len(field.types) > 2:
        sys.exit(f"{key}: nested arrays are not expected in the default model")
    elem = field.types[-1] if len(field.types) > 1 else gguf.GGUFValueType(int(field.parts[3][0]))
    n = len(field.data)
    h = FNV_OFFSET
    values = []
    for k, idx in enumerate(field.data):
        v, enc = decode_value(field, idx, elem)
        h = fnv1a64(enc, h)
        if n <= SHORT_ARRAY or k < HEAD or k >= n - HEAD:
            values.append(v)
    entry = {"key": key, "type": "array", "elem_type": type_name(elem), "len": n, "fnv1a64": f"{h:016x}"}
    if n <= SHORT_ARRAY:
        entry["values"] = values
    else:
        entry["head"] = values[:HEAD]
        entry["tail"] = values[HEAD:]
    return entry


def tensor_entry(r: gguf.GGUFReader, t) -> dict:
    start = int(t.data_offset)
    nbytes = int(t.n_bytes)
    head = bytes(r.data[start:start + min(64, nbytes)])
    tail = bytes(r.data[start + nbytes - min(64, nbytes):start + nbytes])
    return {
        "name": t.name,
        "ggml_type": int(t.tensor_type),
        "type_name": t.tensor_type.name.lower(),
        "shape": [int(d) for d in reversed(t.shape.tolist())],  # gguf-py gives ne (innermost first)
        "n_bytes": nbytes,
        "data_offset": start,
        "head_fnv1a64": f"{fnv1a64(head):016x}",
        "tail_fnv1a64": f"{fnv1a64(tail):016x}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    home = os.environ.get("TESSERA_HOME", os.path.expanduser("~/.cache/tessera/models"))
    ap.add_argument("--model", default=os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default="tests/data/gguf/smollm2_q4_1_golden.json")
    args = ap.parse_args()

    r = gguf.GGUFReader(args.model)
    version = int(r.fields["GGUF.version"].parts[0][0])
    meta = [metadata_entry(k, f) for k, f in r.fields.items() if not k.startswith("GGUF.")]
    golden = {
        "generated_by": GENERATED_BY,
        "gguf_py_version": importlib.metadata.version("gguf"),
        "model": os.path.basename(args.model),
        "file_size": os.path.getsize(args.model),
        "version": version,
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": meta,
        "tensors": [tensor_entry(r, t) for t in r.tensors],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    # Indented, but one line per metadata entry and per tensor: small, and diffs stay readable.
    tensors = golden.pop("tensors")
    metadata = golden.pop("metadata")
    lines = [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in golden.items()]
    lines.append(' "metadata": [\n' + ",\n".join("  " + json.dumps(m, ensure_ascii=False) for m in metadata) + "\n ],")
    lines.append(' "tensors": [\n' + ",\n".join("  " + json.dumps(t, ensure_ascii=False) for t in tensors) + "\n ]")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("{\n" + "\n".join(lines) + "\n}\n")
    print(f"wrote {args.out}: {len(meta)} keys, {len(tensors)} tensors", file=sys.stderr)


if __name__ == "__main__":
    np.seterr(all="raise")
    main()
