#!/usr/bin/env python3
"""A tiny GGUF holding ternary matrices in bitnet.cpp's I2_S (ggml type 36 of microsoft/BitNet's ggml fork), each
beside its ternary source, for tests/formats/test_gguf_i2s.cpp (the reader converts I2_S at load: src/quant/i2s.h).

Regenerate (numpy only):
  .venv/bin/python python/make_i2s_golden.py
writes tests/data/gguf/i2s-ternary.gguf. For each matrix X [n, k]:
  X.weight   I2_S, packed as bitnet.cpp's quantize_i2_s does on x86 (src/ggml-bitnet-mad.cpp, QK_I2_S = 128): from
             the float weights w = t * s it takes scale = max |w| (in double), code 1 where |w| < 1e-6, else 2 where
             w * scale > 0 and 0 otherwise; the flat tensor in blocks of 128, byte 32 b + p holding elements p,
             p + 32, p + 64, p + 96 of block b in bits 7:6, 5:4, 3:2, 1:0; then the scale as one f32 and 28 bytes of
             padding (numel / 4 + 32 bytes in all, as bitnet.cpp's ggml_nbytes counts them);
  X.ternary  I8 [n, k], the source trits t in {-1, 0, 1};
  X.scale    F32 [1], float32(scale).
Matrices: a [16, 512] with scale 0.8125 (a bf16 value, as BitNet checkpoints' weight_scale; row 3 and one 256-block of
row 5 all zero): TQ2_0 holds it exactly; b [8, 384] (rows not whole 256-blocks) and c [4, 256] with scale 0.1 (not an
fp16 value): read as F32.
"""
from __future__ import annotations

import argparse
import os
import struct

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGML_I2_S, GGML_I8, GGML_F32 = 36, 24, 0
ALIGN = 32


def quantize_i2_s(w: np.ndarray) -> bytes:
    """bitnet.cpp's quantize_i2_s (x86 layout) of a float32 matrix, written out here."""
    flat = w.astype(np.float32).reshape(-1)
    n = flat.size
    assert n % 128 == 0
    scale = float(np.max(np.abs(flat.astype(np.float64))))
    q8 = np.where(np.abs(flat.astype(np.float64)) < 1e-6, 1,
                  np.where(flat.astype(np.float64) * scale > 0, 2, 0)).astype(np.uint8)
    out = np.zeros(n // 4, dtype=np.uint8)
    for i in range(n // 128):
        for j in range(128):
            out[i * 32 + j % 32] |= np.uint8(q8[i * 128 + j] << (6 - 2 * (j // 32)))
    return out.tobytes() + struct.pack("<f", scale) + bytes(28)


def gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path: str, kvs: list[tuple[str, int, bytes]], tensors: list[tuple[str, list[int], int, bytes]]):
    """GGUF v3: kvs as (key, value type, packed value); tensors as (name, row-major shape, ggml type, bytes)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, vtype, value in kvs:
        head += gguf_string(key) + struct.pack("<I", vtype) + value
    data, offsets = b"", []
    for _, _, _, raw in tensors:
        data += bytes(-len(data) % ALIGN)
        offsets.append(len(data))
        data += raw
    for (name, shape, gtype, _), off in zip(tensors, offsets):
        head += gguf_string(name) + struct.pack("<I", len(shape))
        head += b"".join(struct.pack("<Q", d) for d in reversed(shape)) + struct.pack("<IQ", gtype, off)
    head += bytes(-len(head) % ALIGN)
    with open(path, "wb") as f:
        f.write(head + data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/gguf/i2s-ternary.gguf"))
    args = ap.parse_args()
    rng = np.random.default_rng(24)
    mats = []
    for name, n, k, scale in (("a", 16, 512, 0.8125), ("b", 8, 384, 0.5), ("c", 4, 256, 0.1)):
        t = rng.integers(-1, 2, size=(n, k)).astype(np.int8)
        if name == "a":
            t[3] = 0
            t[5, 256:] = 0
        mats.append((name, t, np.float32(scale)))
    kvs = [("general.architecture", 8, gguf_string("i2s-test")), ("general.alignment", 4, struct.pack("<I", ALIGN))]
    tensors = []
    for name, t, scale in mats:
        w = t.astype(np.float32) * scale
        raw = quantize_i2_s(w)
        stored = struct.unpack("<f", raw[t.size // 4:t.size // 4 + 4])[0]
        assert stored == scale, (name, stored, scale)
        tensors.append((f"{name}.weight", list(t.shape), GGML_I2_S, raw))
        tensors.append((f"{name}.ternary", list(t.shape), GGML_I8, t.tobytes()))
        tensors.append((f"{name}.scale", [1], GGML_F32, struct.pack("<f", stored)))
    write_gguf(args.out, kvs, tensors)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
