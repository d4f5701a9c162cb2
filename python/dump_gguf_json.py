#!/usr/bin/env python3
# Prints a GGUF file as gguf-py (PyPI `gguf`) reads it, as JSON on stdout: the independent reader that checks files
# written by Tessera's GGUF writer (tests/formats/test_gguf_roundtrip.cpp runs it and compares with what it wrote).
#
# Usage: .venv/bin/python python/dump_gguf_json.py FILE.gguf
#
# Output: {"version", "alignment", "data_offset",
#          "metadata": [{"key", "type", "value"}] in file order, where an array value is
#                      {"elem_type": name, "values": [...]} (nested arrays recursively),
#          "tensors": [{"name", "ggml_type", "shape" (row-major, outermost first), "n_bytes", "data_offset",
#                       "data_hex"}]}
# Type names are gguf-py's GGUFValueType names in lower case (uint8 ... float64, bool, string, array).
import json
import sys

import gguf

VT = gguf.GGUFValueType


def decode(parts, i, vtype):
    """Decodes the value of type vtype starting at parts[i]; returns (json value, next part index).

    gguf-py flattens nested arrays into field.parts (element type, count, then the elements' parts), and its
    ReaderField.contents() does not rebuild them, so the parts are walked here."""
    if vtype == VT.STRING:
        return bytes(parts[i + 1].tobytes()).decode("utf-8"), i + 2
    if vtype == VT.ARRAY:
        elem = VT(int(parts[i][0]))
        n = int(parts[i + 1][0])
        i += 2
        values = []
        for _ in range(n):
            v, i = decode(parts, i, elem)
            values.append(v)
        return {"elem_type": elem.name.lower(), "values": values}, i
    v = parts[i].tolist()[0]
    if vtype == VT.BOOL:
        v = bool(v)
    elif vtype in (VT.FLOAT32, VT.FLOAT64):
        v = float(v)
    else:
        v = int(v)
    return v, i + 1


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: dump_gguf_json.py FILE.gguf")
    r = gguf.GGUFReader(sys.argv[1])
    meta = []
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = VT(int(field.parts[2][0]))  # parts: key length, key bytes, value type, value parts...
        value, end = decode(field.parts, 3, vtype)
        assert end == len(field.parts), key
        meta.append({"key": key, "type": vtype.name.lower(), "value": value})
    tensors = []
    for t in r.tensors:
        start = int(t.data_offset)
        tensors.append({
            "name": t.name,
            "ggml_type": int(t.tensor_type),
            "shape": [int(d) for d in reversed(t.shape.tolist())],
            "n_bytes": int(t.n_bytes),
            "data_offset": start,
            "data_hex": bytes(r.data[start:start + int(t.n_bytes)]).hex(),
        })
    out = {
        "version": int(r.fields["GGUF.version"].parts[0][0]),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": meta,
        "tensors": tensors,
    }
    json.dump(out, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
