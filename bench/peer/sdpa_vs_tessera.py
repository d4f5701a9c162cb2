#!/usr/bin/env python3
"""Tessera's prefill-attention kernel and PyTorch's scaled_dot_product_attention side by side, in one process.

Both run on the same torch tensors, launch by launch in alternation (ABBA order, so neither always follows the other),
each launch timed alone with CUDA events and synchronized: the two kernels see the same clocks, temperature and
power state, which separate processes run minutes apart do not (at 16k the H100's clock under sustained attention
moves the medians of either kernel by +-5% between runs). Tessera's kernel is reached through ctypes in
libtessera_attn_capi.so (CMake target tessera_attn_capi of the CUDA build, compiled from the engine's own kernel
source, bench/peer/tessera_attn_capi.cu).

Run on the GPU machine (python3 there has torch 2.11):
    python3 bench/peer/sdpa_vs_tessera.py --lib build-gpu/lib/libtessera_attn_capi.so [--t 2048,8192,16384]
        [--heads llama3-8b,llama3.2-1b,smollm2] [--reps 30] [--backend default|cudnn|flash] [--json FILE]

Shapes: --heads picks the attention heads (default llama3-8b: 32 query heads, 8 kv heads, head 128; llama3.2-1b:
32/8, head 64; smollm2: 9/3, head 64), bf16, causal, t query rows over t keys. SDPA gets q [1, n_head, t, hd] and
k, v [1, n_kv, t, hd] with enable_gqa=True; Tessera the same q transposed to [t, n_head * hd] (not timed) and k, v as
they are (the cache layout [n_kv][n_ctx][hd]). Each output is checked against SDPA's before timing
(relative L2 and max |diff|; both are bf16 results of fp32 accumulations, so they differ by bf16 rounding).
Per row: each side's median, min and max over --reps launches, TFLOP/s (causal count 4 * t^2 * hd * n_head / 2),
and tessera/sdpa as the ratio of medians and as the median of the per-pair ratios.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
HEADS = {"llama3-8b": (32, 8, 128), "llama3.2-1b": (32, 8, 64), "smollm2": (9, 3, 64)}  # n_head, n_kv, hd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="path of libtessera_attn_capi.so")
    ap.add_argument("--t", default="2048,8192,16384", help="comma-separated sequence lengths (default 2048,8192,16384)")
    ap.add_argument("--heads", default="llama3-8b",
                    help=f"comma-separated head shapes from {', '.join(HEADS)} (default llama3-8b)")
    ap.add_argument("--reps", type=int, default=30, help="timed launches per side (default 30)")
    ap.add_argument("--backend", default="default", choices=["default", *BACKENDS],
                    help="SDPA backend: what PyTorch picks (default), or one forced")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    if args.reps < 3:
        sys.exit("error: --reps must be at least 3")
    try:
        ts = [int(x) for x in args.t.split(",") if x]
    except ValueError:
        sys.exit(f"error: --t wants comma-separated integers, got {args.t!r}")
    if not ts or min(ts) < 1:
        sys.exit("error: --t wants positive lengths")
    heads = [h for h in args.heads.split(",") if h]
    for h in heads:
        if h not in HEADS:
            sys.exit(f"error: unknown --heads {h!r} (known: {', '.join(HEADS)})")
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device")
    try:
        lib = ctypes.CDLL(args.lib)
    except OSError as e:
        sys.exit(f"error: cannot load {args.lib}: {e}")
    fn = lib.tessera_attn_prefill_tma
    ll = ctypes.c_longlong
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ll, ctypes.c_void_p, ctypes.c_void_p, ll, ll, ll, ll, ll,
                   ctypes.c_void_p, ll, ctypes.c_float, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    err = ctypes.create_string_buffer(512)

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, SDPA backend: {args.backend}")
    print(f"{'heads':<12} {'t':>6} {'side':<8} {'ms':>8} {'min':>8} {'max':>8} {'TFLOP/s':>8}   check / ratio")
    rows = []
    # A forced backend is entered once for the whole run, not inside the timed calls.
    backend = contextlib.ExitStack()
    if args.backend != "default":
        backend.enter_context(sdpa_kernel(BACKENDS[args.backend]))
    for name, t in [(h, t) for h in heads for t in ts]:
        n_head, n_kv, hd = HEADS[name]
        scale = 1.0 / math.sqrt(hd)
        gen = torch.Generator(device="cuda").manual_seed(t)
        q = torch.randn(1, n_head, t, hd, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, n_kv, t, hd, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, n_kv, t, hd, device="cuda", dtype=torch.bfloat16, generator=gen)
        q_rows = q[0].transpose(0, 1).contiguous().view(t, n_head * hd)  # [t][n_head * hd]
        k_cache, v_cache = k[0].contiguous(), v[0].contiguous()           # [n_kv][t][hd]
        out = torch.empty(t, n_head * hd, device="cuda", dtype=torch.bfloat16)
        stream = torch.cuda.current_stream().cuda_stream

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def ours():
            rc = fn(0, q_rows.data_ptr(), n_head * hd, k_cache.data_ptr(), v_cache.data_ptr(), t, n_kv, hd, 0, t,
                    out.data_ptr(), n_head, scale, stream, err, len(err))
            if rc != 0:
                raise RuntimeError(err.value.decode())

        ref = sdpa()
        ours()
        torch.cuda.synchronize()
        ref_rows = ref[0].transpose(0, 1).reshape(t, n_head * hd).float()
        diff = out.float() - ref_rows
        rel = (diff.norm() / ref_rows.norm()).item()
        max_abs = diff.abs().max().item()
        ok = rel < 1e-2 and math.isfinite(rel)
        for _ in range(3):
            sdpa()
            ours()
        torch.cuda.synchronize()
        ms = {"sdpa": [], "tessera": []}
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for r in range(args.reps):
            order = ("sdpa", "tessera") if r % 2 == 0 else ("tessera", "sdpa")
            for side in order:
                e0.record()
                sdpa() if side == "sdpa" else ours()
                e1.record()
                e1.synchronize()
                ms[side].append(e0.elapsed_time(e1))
        flops = 4.0 * t * t * hd * n_head / 2
        med = {s: statistics.median(v) for s, v in ms.items()}
        pair = statistics.median(a / b for a, b in zip(ms["tessera"], ms["sdpa"]))
        for side in ("sdpa", "tessera"):
            m = med[side]
            extra = (f"relative L2 {rel:.2e}, max|diff| {max_abs:.2e} vs SDPA {'ok' if ok else 'WRONG'}"
                     if side == "tessera" else "")
            lo, hi = min(ms[side]), max(ms[side])
            print(f"{name:<12} {t:>6} {side:<8} {m:8.3f} {lo:8.3f} {hi:8.3f} {flops / m / 1e9:8.1f}   {extra}")
        print(f"{name:<12} {t:>6} tessera/sdpa: medians {med['tessera'] / med['sdpa']:.3f}, "
              f"per-pair median {pair:.3f}")
        rows.append({"heads": name, "n_head": n_head, "n_kv": n_kv, "hd": hd, "t": t, "backend": args.backend,
                     "reps": args.reps, "check_rel_l2": rel, "check_max_abs": max_abs,
                     "check_ok": ok, "ratio_medians": med["tessera"] / med["sdpa"], "ratio_pairs": pair,
                     **{f"{s}_ms": {"median": med[s], "min": min(v), "max": max(v)} for s, v in ms.items()}})
        if not ok:
            print(f"error: Tessera's output differs from SDPA's at {name} t = {t}", file=sys.stderr)
    backend.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0 if all(r["check_ok"] for r in rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:  # the bridge's reason (bad shape, CUDA failure) or torch's, as one line
        sys.exit(f"error: {e}")
