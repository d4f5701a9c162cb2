#!/usr/bin/env python3
# Golden data for the quantization reference (src/quant), produced by gguf-py's numpy implementation (PyPI `gguf`).
#
# Regenerate (from the repository root; the default model comes from scripts/fetch_model.sh):
#   .venv/bin/python python/make_quant_golden.py
#
# Writes tests/data/quant/index.json plus small .bin files (raw little-endian arrays) read by tests/quant/*.cpp:
#   dequant   random blocks of every dtype Tessera can read (f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k
#             q6_k iq4_nl iq4_xs tq1_0 tq2_0) with
#             finite fp16 scale fields and edge cases (zero, negative, subnormal, largest scale; extreme nibbles),
#             and gguf.quants.dequantize's float32 output;
#   quantize  float32 blocks (normal, tiny, huge, zeros, all-equal, one-signed, exact ties) and gguf.quants.quantize's
#             bytes for q8_0, q4_0, q4_1, q5_0, q5_1 (blocks of 32) and tq1_0, tq2_0 (blocks of 256), plus tricky floats (ties, subnormals, overflow, NaN, inf) for
#             f16 and bf16;
#   half      sha256 of all 65536 f16 and bf16 values converted to float32 (NaNs made canonical for f16, see below);
#   model     for a subset of the default model's tensors: file offset, byte count, dtype, shape, the sha256 of
#             gguf-py's dequantized float32 bytes and the first 8 values (as uint32 bit patterns).
# gguf-py 0.19 implements quantize for f16 (numpy astype), bf16, q4_0, q4_1, q5_0, q5_1, q8_0, tq1_0, tq2_0 and mxfp4,
# not for the K-quants and the i-quants, so q2_k..q6_k, iq4_nl and iq4_xs are checked in the dequantize direction
# only (Tessera's own quantizers for them are checked by their error bounds in tests/quant).
import argparse
import hashlib
import importlib.metadata
import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

SEED = 20240611
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant")
MODEL = os.path.expanduser(
    os.path.join(os.environ.get("TESSERA_HOME", "~/.cache/tessera/models"), "SmolLM2-135M-Instruct.Q4_1.gguf"))
COMMAND = ".venv/bin/python python/make_quant_golden.py"

# Halves used as scale fields: zero of both signs, subnormals, the smallest normal, one, the largest finite value.
EDGE_SCALES = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF]


def random_scales(rng, n):
    """n finite fp16 bit patterns of every sign and exponent (no inf/NaN: exponent field 31 is excluded)."""
    exp = rng.integers(0, 31, n, dtype=np.uint16)
    mant = rng.integers(0, 1024, n, dtype=np.uint16)
    sign = rng.integers(0, 2, n, dtype=np.uint16)
    h = (sign << 15) | (exp << 10) | mant
    h[: len(EDGE_SCALES)] = EDGE_SCALES  # the first blocks of each set take the edge cases
    return h


def set_half(blocks, offset, values):
    blocks[:, offset : offset + 2] = values.astype("<u2").view(np.uint8).reshape(-1, 2)


def random_blocks(rng, qtype, n):
    """n random blocks of qtype as (n, type_size) uint8, with finite scales and some extreme payloads."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
    if qtype == Q.Q4_0 or qtype == Q.Q8_0:
        set_half(b, 0, random_scales(rng, n))
        payload = slice(2, None)
    elif qtype == Q.Q4_1:
        set_half(b, 0, random_scales(rng, n))
        set_half(b, 2, rng.permutation(random_scales(rng, n)))
        payload = slice(4, None)
    elif qtype in (Q.Q5_0, Q.IQ4_NL, Q.IQ4_XS):
        set_half(b, 0, random_scales(rng, n))
        payload = slice(2, None)  # q5_0: qh then nibbles; iq4_xs: 6-bit scales then nibbles
    elif qtype == Q.Q5_1:
        set_half(b, 0, random_scales(rng, n))
        set_half(b, 2, rng.permutation(random_scales(rng, n)))
        payload = slice(4, None)
    elif qtype == Q.Q4_K:
        set_half(b, 0, random_scales(rng, n))
        set_half(b, 2, rng.permutation(random_scales(rng, n)))
        payload = slice(4, None)  # 6-bit scales and mins, then nibbles
    elif qtype == Q.Q6_K:
        set_half(b, type_size - 2, random_scales(rng, n))
        payload = slice(0, type_size - 2)  # ql, qh, int8 scales
    elif qtype == Q.Q2_K:
        set_half(b, type_size - 4, random_scales(rng, n))
        set_half(b, type_size - 2, rng.permutation(random_scales(rng, n)))
        payload = slice(0, type_size - 4)  # 4-bit scales and mins, 2-bit quants
    elif qtype == Q.Q3_K:
        set_half(b, type_size - 2, random_scales(rng, n))
        payload = slice(0, type_size - 2)  # high bits, 2-bit quants, 6-bit scales
    elif qtype in (Q.TQ1_0, Q.TQ2_0):
        set_half(b, type_size - 2, random_scales(rng, n))
        payload = slice(0, type_size - 2)  # trits (tq1_0: 5 per byte of qs, 4 per byte of qh) or 2-bit codes
    elif qtype == Q.Q5_K:
        set_half(b, 0, random_scales(rng, n))
        set_half(b, 2, rng.permutation(random_scales(rng, n)))
        payload = slice(4, None)  # 6-bit scales and mins, fifth bits, nibbles
    else:
        raise ValueError(qtype)
    # Extreme payloads on blocks that also get ordinary scales: all bits set (largest nibbles, q8 -1, q6 scales -1,
    # 6-bit scales 63), all clear, the int8 minimum, and alternating nibbles.
    k = len(EDGE_SCALES)
    b[k + 0, payload] = 0xFF
    b[k + 1, payload] = 0x00
    b[k + 2, payload] = 0x80
    b[k + 3, payload] = 0x0F
    b[k + 4, payload] = 0xF0
    b[0, payload] = 0xFF  # zero scale with the largest payload
    return b


def float_bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def round_away(t):
    return np.sign(t) * np.floor(np.abs(t) + 0.5)


def sensitive_block(rng, fmt):
    """A block whose elements sit within a few ulps of a rounding boundary of fmt's quantizer, picked so that a
    different order of float operations (a fused multiply-add, x / d instead of x * (1/d), double precision) gives
    different codes than ggml's "x * id, then add, then truncate" in float32: the bit-exact test then notices it."""
    f32, f64 = np.float32, np.float64
    x = np.empty(32, dtype=f32)
    a = f32(10 ** rng.uniform(-2, 2))
    if fmt == "q4_1":
        # With lo = 0, x - lo is x itself and can be steered ulp by ulp (else x's coarser ulps step it).
        lo, hi = f32(-a * rng.uniform(0.1, 1) if rng.integers(0, 2) else 0.0), f32(a * rng.uniform(0.1, 1))
        x[0], x[1] = lo, hi
        d = f32((hi - lo) / f32(15))
        id_ = f32(f32(1) / d)
        ks = rng.integers(0, 15, 30)
        # A fused multiply-add changes q4_1's codes only next to 0.5 (t = 0.5 - tiny, where the spacing of floats
        # doubles between t and t + 0.5), so the slots that expose it (slot % 3 == 0) sit at k = 0.
        ks[::3] = 0
        base = lo + (ks + f32(0.5)) * d
    else:
        top = f32(a if rng.integers(0, 2) else -a)
        x[0], x[1] = top, f32(0.5) * top
        d = f32(top / f32(-8)) if fmt == "q4_0" else f32(np.abs(top) / f32(127))
        id_ = f32(f32(1) / d)
        ks = rng.integers(-8, 8, 30) if fmt == "q4_0" else rng.integers(-127, 127, 30)
        base = (ks + f32(0.5)) * d
    steps = np.arange(-64, 65)
    for slot in range(30):
        cand = base[slot].astype(f32)
        cand = (cand.view(np.int32) + steps).astype(np.int32).view(f32)  # neighbours by ulp (same sign)
        if fmt == "q4_1":
            cand = cand[(cand >= lo) & (cand <= hi)]
            v = (cand - lo).astype(f32)
            ref = np.trunc(f32(v * id_) + f32(0.5))
            alts = [np.trunc((v.astype(f64) * f64(id_) + 0.5).astype(f32)), np.trunc(f32(v / d) + f32(0.5)),
                    np.trunc(v.astype(f64) / f64(d) + 0.5)]
        elif fmt == "q4_0":
            cand = cand[np.abs(cand) < np.abs(top)]
            ref = np.trunc(f32(cand * id_) + f32(8.5))
            alts = [np.trunc((cand.astype(f64) * f64(id_) + 8.5).astype(f32)), np.trunc(f32(cand / d) + f32(8.5)),
                    np.trunc(cand.astype(f64) / f64(d) + 8.5)]
        else:
            cand = cand[np.abs(cand) < np.abs(top)]
            ref = round_away(f32(cand * id_))
            alts = [round_away(f32(cand / d)), round_away(cand.astype(f64) / f64(d)),
                    round_away(cand.astype(f64) * f64(id_))]
        # Take turns on which variant to expose; any other one will do when that one agrees everywhere here.
        pick = np.flatnonzero(alts[slot % len(alts)] != ref)
        if len(pick) == 0:
            pick = np.flatnonzero(np.any([alt != ref for alt in alts], axis=0))
        x[slot + 2] = cand[pick[rng.integers(0, len(pick))]] if len(pick) else base[slot]
    return x


def quantize_inputs(rng):
    """Float32 blocks of 32 shared by the q8_0, q4_0 and q4_1 quantize goldens."""
    blocks = []

    def add(x):
        blocks.append(np.asarray(x, dtype=np.float32).reshape(32))

    for _ in range(72):  # normal, scale over 6 decades
        add(rng.normal(0, 10 ** rng.uniform(-3, 3), 32))
    for _ in range(12):  # offset: min and max far from zero, fp16 rounding of m matters for q4_1
        add(rng.normal(rng.uniform(-1000, 1000), 10 ** rng.uniform(-2, 1), 32))
    for _ in range(12):  # tiny: d underflows to an fp16 subnormal or zero (floats stay normal, see below)
        add(rng.normal(0, 10 ** rng.uniform(-30, -5), 32))
    for _ in range(12):  # huge: d overflows fp16 to inf; max - min stays finite
        add(rng.normal(0, 10 ** rng.uniform(5, 36), 32))
    for v in [0.0, 1.0, -1.0, 3.5, -1e-20, 7e30, -65504.0, 0.1]:  # all equal (d = 0 for q4_1)
        add(np.full(32, v))
    for _ in range(8):  # one-signed
        add(-np.abs(rng.normal(0, 10 ** rng.uniform(-2, 2), 32)))
        add(np.abs(rng.normal(0, 10 ** rng.uniform(-2, 2), 32)))
    for s in [1.0, 0.25, 2.0**-10, 3.0]:  # exact ties of every rounding step: integers and half-integers times s
        add(rng.integers(-16, 16, 32) * (s / 2))
        add(np.arange(32) * (s / 2) - 8 * s)
    for a in [1.0, 5.0, 0.3]:  # |max| tie: the first of +a/-a sets the sign of the q4_0 scale
        x = rng.uniform(-a / 2, a / 2, 32)
        x[3], x[17] = a, -a
        add(x)
        x = x.copy()
        x[3], x[17] = -a, a
        add(x)
    for _ in range(4):  # one outlier
        x = rng.normal(0, 0.01, 32)
        x[rng.integers(0, 32)] = rng.choice([-1, 1]) * 10 ** rng.uniform(0, 3)
        add(x)
    for _ in range(16):
        add(rng.uniform(-1, 1, 32))
    for fmt in ("q8_0", "q4_0", "q4_1"):  # near rounding boundaries, against reordered float arithmetic
        for _ in range(6):
            add(sensitive_block(rng, fmt))
    for s in [1.0, 2.0**-6, 64.0]:  # exact .5 ties of each format's own rounding step (d = s exactly)
        k = rng.integers(-127, 127, 32)
        add(np.where(np.arange(32) == 0, 127 * s, (k + 0.5) * s))  # q8_0: round half away from zero
        k = rng.integers(0, 15, 32)
        add(np.where(np.arange(32) == 0, 0.0, np.where(np.arange(32) == 1, 15 * s, (k + 0.5) * s)))  # q4_1
    # Left out on purpose, because gguf-py and ggml's C reference disagree there and Tessera follows ggml:
    # - blocks mixing +0.0 and -0.0 as minimum: numpy's SIMD min may return either zero (q4_1 m field sign), while
    #   ggml keeps the first; the dequantized values are the same;
    # - an all-zero block starting with -0.0: gguf-py's argmax picks that -0.0 as max (q4_0 d = +0), ggml's loop
    #   keeps its initial +0.0 (d = -0);
    # - blocks of float subnormals: 1/d overflows, and numpy's float->uint8 cast of the resulting inf/NaN is
    #   platform-defined (x86 gives 0); tests/quant/test_quant_roundtrip.cpp checks those blocks dequantize to 0.
    x = np.stack(blocks)
    assert np.all(np.isfinite(x)) and not np.any((x == 0) & np.signbit(x))
    assert np.all((x == 0) | (np.abs(x) >= np.finfo(np.float32).tiny))
    return x


def quantize_inputs_256(rng):
    """Float32 blocks of 256 for the ternary quantizers (tq1_0, tq2_0: d = max|x| per block, codes round(x / d))."""
    blocks = []

    def add(x):
        blocks.append(np.asarray(x, dtype=np.float32).reshape(256))

    for _ in range(24):  # normal, scale over 6 decades
        add(rng.normal(0, 10 ** rng.uniform(-3, 3), 256))
    for _ in range(4):  # tiny: d underflows to an fp16 subnormal or zero (floats stay normal)
        add(rng.normal(0, 10 ** rng.uniform(-30, -5), 256))
    for _ in range(4):  # huge: d overflows fp16 to inf
        add(rng.normal(0, 10 ** rng.uniform(5, 36), 256))
    for v in [0.0, 1.0, -1.0, 0.1]:  # all equal
        add(np.full(256, v))
    for _ in range(4):  # one-signed
        add(-np.abs(rng.normal(0, 1, 256)))
        add(np.abs(rng.normal(0, 1, 256)))
    for a in [1.0, 3.0, 0.3]:  # exact ties x / d = +-0.5 (rounded away from zero) and their float neighbours
        x = rng.choice(np.array([-a, -a / 2, 0.0, a / 2, a], dtype=np.float32), 256)
        x[0] = a
        add(x)
        h = np.float32(a / 2)
        x = rng.choice(np.array([np.nextafter(h, np.float32(0)), np.nextafter(h, np.float32(9)), -h], np.float32), 256)
        x[0] = -a
        add(x)
    for _ in range(4):  # one outlier: nearly everything rounds to 0
        x = rng.normal(0, 0.01, 256)
        x[rng.integers(0, 256)] = rng.choice([-1, 1]) * 10 ** rng.uniform(0, 3)
        add(x)
    for _ in range(8):
        add(rng.uniform(-1, 1, 256))
    x = np.stack(blocks)
    assert np.all(np.isfinite(x)) and not np.any((x == 0) & np.signbit(x))
    assert np.all((x == 0) | (np.abs(x) >= np.finfo(np.float32).tiny))
    return x


def halves_midpoints(h):
    """Float32 values exactly halfway between fp16 h and its successor (h non-negative, finite, below 0x7BFF)."""
    lo = h.view(np.float16).astype(np.float64)
    hi = (h + 1).view(np.float16).astype(np.float64)
    return ((lo + hi) / 2).astype(np.float32)  # exact: the midpoint needs 12 significant bits


def tricky_floats(rng):
    """Float32 inputs for f16 and bf16 rounding: ties, neighbours of ties, subnormals, overflow, NaN, inf."""
    parts = []
    h = rng.choice(np.arange(0, 0x7BFF, dtype=np.uint16), 600, replace=False).astype(np.uint16)
    h = np.concatenate([h, np.array([0, 1, 2, 3, 0x3FF, 0x400, 0x401, 0x3C00, 0x7BFE], np.uint16)])
    mid = halves_midpoints(h)
    parts += [mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0))]
    parts.append(h.view(np.float16).astype(np.float32))  # exactly representable
    # bf16 ties: low 16 bits exactly 0x8000 with even and odd bf16 mantissa, and one ulp either side
    u = rng.integers(0, 0x7F7F, 400, dtype=np.uint32) << 16 | 0x8000
    parts += [u.view(np.float32), (u + 1).view(np.float32), (u - 1).view(np.float32)]
    specials = [
        0.0, 65504.0, 65519.0, 65519.996, 65520.0, 65520.004, 65536.0, 1e5, 3.4028235e38,
        2.0**-24, 2.0**-25, np.nextafter(np.float32(2.0**-25), np.float32(1)), 2.0**-26, 3 * 2.0**-26,
        2.0**-14, 2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-26, 1e-40, 1.4e-45, 1.1754942e-38, 1.1754944e-38,
    ]
    parts.append(np.array(specials, dtype=np.float32))
    bits = [
        0x7F800000, 0xFF800000,  # inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F802000,
        0x7FA00000, 0x7F80FFFF, 0x7F810000, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000,
        0x80007FFF, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x477FF000, 0x477FEFFF, 0x477FF001,
    ]
    parts.append(np.array(bits, dtype=np.uint32).view(np.float32))
    parts.append(rng.integers(0, 2**32, 512, dtype=np.uint64).astype(np.uint32).view(np.float32))  # any bits
    x = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])
    return np.concatenate([x, -x])  # both signs of every tie and special


def write_bin(name, array):
    data = np.ascontiguousarray(array).tobytes()
    with open(os.path.join(OUT_DIR, name), "wb") as f:
        f.write(data)
    return {"file": name, "bytes": len(data)}


def sha256_f32(x):
    return hashlib.sha256(np.ascontiguousarray(x, dtype="<f4").tobytes()).hexdigest()


def gen_dequant(rng):
    cases = []
    for qtype, n_blocks in [(Q.Q4_0, 256), (Q.Q4_1, 256), (Q.Q8_0, 256), (Q.Q4_K, 48), (Q.Q6_K, 48)]:
        b = random_blocks(rng, qtype, n_blocks)
        out = dequantize(b, qtype).reshape(-1)
        assert out.dtype == np.float32 and np.all(np.isfinite(out)), qtype.name
        name = qtype.name.lower()
        cases.append({"dtype": name, "n": int(out.size), "src": write_bin(f"dequant_{name}.src.bin", b),
                      "expected": write_bin(f"dequant_{name}.f32.bin", out)})
    # q2_K, q3_K and q5_K came later: their own generator, so the data above stays as it was.
    krng = np.random.default_rng(SEED + 1)
    for qtype in (Q.Q2_K, Q.Q3_K, Q.Q5_K):
        b = random_blocks(krng, qtype, 48)
        out = dequantize(b, qtype).reshape(-1)
        assert out.dtype == np.float32 and np.all(np.isfinite(out)), qtype.name
        name = qtype.name.lower()
        cases.append({"dtype": name, "n": int(out.size), "src": write_bin(f"dequant_{name}.src.bin", b),
                      "expected": write_bin(f"dequant_{name}.f32.bin", out)})
    # Formats added later draw from their own stream, so the files above stay as they were.
    rng_added = np.random.default_rng(SEED + 1)
    for qtype, n_blocks in [(Q.Q5_0, 256), (Q.Q5_1, 256), (Q.IQ4_NL, 256), (Q.IQ4_XS, 48)]:
        b = random_blocks(rng_added, qtype, n_blocks)
        out = dequantize(b, qtype).reshape(-1)
        assert out.dtype == np.float32 and np.all(np.isfinite(out)), qtype.name
        name = qtype.name.lower()
        cases.append({"dtype": name, "n": int(out.size), "src": write_bin(f"dequant_{name}.src.bin", b),
                      "expected": write_bin(f"dequant_{name}.f32.bin", out)})
    # The ternary formats: their own stream again.
    rng_tq = np.random.default_rng(SEED + 2)
    for qtype in (Q.TQ1_0, Q.TQ2_0):
        b = random_blocks(rng_tq, qtype, 48)
        out = dequantize(b, qtype).reshape(-1)
        assert out.dtype == np.float32 and np.all(np.isfinite(out)), qtype.name
        name = qtype.name.lower()
        cases.append({"dtype": name, "n": int(out.size), "src": write_bin(f"dequant_{name}.src.bin", b),
                      "expected": write_bin(f"dequant_{name}.f32.bin", out)})
    # f32 is a copy of any bits; f16 and bf16 get every value in the "half" section, plus these random ones.
    bits = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32)
    out = dequantize(bits.view(np.float32).reshape(1, -1), Q.F32).reshape(-1)
    cases.append({"dtype": "f32", "n": 256, "src": write_bin("dequant_f32.src.bin", bits),
                  "expected": write_bin("dequant_f32.f32.bin", out)})
    for qtype, exp_mask in ((Q.F16, 0x7C00), (Q.BF16, 0x7F80)):
        name = qtype.name.lower()
        h = rng.integers(0, 2**16, 512, dtype=np.uint32).astype(np.uint16)
        h = h[(h & exp_mask) != exp_mask][:256]  # finite: the exhaustive "half" hashes cover inf and NaN
        out = dequantize(h.view(np.uint8).reshape(1, -1), qtype).reshape(-1)
        assert out.dtype == np.float32
        cases.append({"dtype": name, "n": int(h.size), "src": write_bin(f"dequant_{name}.src.bin", h),
                      "expected": write_bin(f"dequant_{name}.f32.bin", out)})
    return cases


def gen_quantize(rng):
    x = quantize_inputs(rng)
    cases = {"block_inputs": write_bin("quantize_blocks.f32.bin", x), "block_n": int(x.size), "block": [],
             "float": []}
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
        with np.errstate(over="ignore"):  # huge blocks overflow the fp16 scale to inf on purpose
            out = quantize(x, qtype)
        name = qtype.name.lower()
        cases["block"].append({"dtype": name, "expected": write_bin(f"quantize_{name}.bin", out)})
    t = tricky_floats(rng)
    cases["float_inputs"] = write_bin("quantize_floats.f32.bin", t)
    cases["float_n"] = int(t.size)
    with np.errstate(all="ignore"):
        f16 = quantize(t, Q.F16).view(np.uint16)
        bf16 = quantize(t.reshape(1, -1), Q.BF16).view(np.uint16).reshape(-1)
    cases["float"].append({"dtype": "f16", "expected": write_bin("quantize_f16.bin", f16)})
    cases["float"].append({"dtype": "bf16", "expected": write_bin("quantize_bf16.bin", bf16)})
    # The ternary formats quantize blocks of 256: inputs of their own, from their own stream.
    x256 = quantize_inputs_256(np.random.default_rng(SEED + 3))
    cases["block256_inputs"] = write_bin("quantize_blocks256.f32.bin", x256)
    cases["block256_n"] = int(x256.size)
    cases["block256"] = []
    for qtype in (Q.TQ1_0, Q.TQ2_0):
        with np.errstate(over="ignore"):
            out = quantize(x256, qtype)
        name = qtype.name.lower()
        cases["block256"].append({"dtype": name, "expected": write_bin(f"quantize_{name}.bin", out)})
    return cases


def gen_half():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f16 = dequantize(h.copy(), Q.F16).view(np.uint32)
    # numpy keeps a NaN's payload bits as they are; ggml's and Tessera's converters quiet it (bit 22). Only "NaN of
    # this sign" is specified, so NaNs are hashed as 0x7FC00000 with their sign bit.
    nan = (h & 0x7C00) == 0x7C00
    nan &= (h & 0x3FF) != 0
    f16 = np.where(nan, np.uint32(0x7FC00000) | (f16 & np.uint32(0x80000000)), f16).astype("<u4")
    bf16 = dequantize(h.view(np.uint8).reshape(1, -1), Q.BF16).reshape(-1)
    return {"f16_sha256": hashlib.sha256(f16.tobytes()).hexdigest(),
            "bf16_sha256": hashlib.sha256(bf16.astype("<f4").tobytes()).hexdigest(),
            "f16_nan_rule": "NaN results hashed as 0x7FC00000 | sign"}


def gen_model(path):
    reader = gguf.GGUFReader(path)
    n_layer = 1 + max(int(t.name.split(".")[1]) for t in reader.tensors if t.name.startswith("blk."))
    # token_embd (q8_0), every tensor of the first, a middle and the last layer (all q4_1 roles, f32 norms), and
    # output_norm: about a third of the file, enough to cover each dtype and role while the test stays fast.
    keep_layers = {0, n_layer // 2, n_layer - 1}
    tensors = []
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) not in keep_layers:
            continue
        ne = [int(v) for v in t.shape]  # GGUF order: ne[0] is the row length
        out = dequantize(t.data, t.tensor_type).reshape(-1)
        assert out.dtype == np.float32 and out.size == int(np.prod(ne))
        tensors.append({"name": t.name, "dtype": t.tensor_type.name.lower(), "ne": ne, "offset": int(t.data_offset),
                        "n_bytes": int(t.n_bytes), "sha256": sha256_f32(out),
                        "first8_bits": [int(v) for v in float_bits(out[:8])]})
    return {"file": os.path.basename(path), "size": os.path.getsize(path), "n_tensors_in_file": len(reader.tensors),
            "tensors": tensors}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=MODEL)
    args = ap.parse_args()
    if not os.path.exists(args.model):
        sys.exit(f"{args.model}: default model missing (run scripts/fetch_model.sh)")
    os.makedirs(OUT_DIR, exist_ok=True)
    rng = np.random.default_rng(SEED)
    index = {
        "regenerate": COMMAND,
        "generator": {"gguf": importlib.metadata.version("gguf"),
                      "numpy": np.__version__, "seed": SEED},
        "dequant": gen_dequant(rng),
        "quantize": gen_quantize(rng),
        "half": gen_half(),
        "model": gen_model(args.model),
    }
    with open(os.path.join(OUT_DIR, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT_DIR, p)) for p in os.listdir(OUT_DIR))
    print(f"wrote {OUT_DIR} ({total} bytes)")


if __name__ == "__main__":
    main()
