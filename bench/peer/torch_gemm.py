#!/usr/bin/env python3
"""PyTorch peer of tessera_bench_gemm: torch.nn.functional.linear in bf16 (cuBLAS underneath; bf16 out, as PyTorch
gives) at Llama-3-8B's projection shapes for t = 8, 32 (batched decode) and 2048 (prefill), plus the 8192^3 bf16
matmul as the peak. Timed as the tessera benchmark: a CUDA graph of back-to-back launches over rotating weight copies
covering 4x the L2, event-timed replays, median.

Run on the GPU machine: python3 bench/peer/torch_gemm.py [--json FILE]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cuda"))
from torch_peer import time_graph as _time_graph  # noqa: E402

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
TS = [8, 32, 2048]


def time_graph(fn, batch, reps=15):
    """Median µs per launch of `batch` launches replayed as one CUDA graph (bench/cuda/torch_peer.py's timing)."""
    return _time_graph(fn, batch, reps)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    print(f"torch {torch.__version__}, {props.name}")
    rows = []
    s = 8192
    a = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    us = time_graph(lambda i: torch.matmul(a, b), 3)
    peak = 2 * s**3 / (us * 1e-6) / 1e12
    print(f"peak: torch.matmul bf16 8192^3 {peak:.0f} TFLOP/s ({us:.0f} us)")
    del a, b
    print(f"{'shape':<8} {'t':>5} {'us':>9} {'TFLOP/s':>8} {'%peak':>6} {'wt GB/s':>8}")
    for name, n, k in SHAPES:
        wbytes = n * k * 2
        copies = max(1, min(64, -(-4 * l2 // wbytes)))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
        for t in TS:
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            batch = max(copies, 3 if t >= 1024 else 8)
            us = time_graph(lambda i: torch.nn.functional.linear(x, ws[i % copies]), batch)
            tf = 2 * t * n * k / (us * 1e-6) / 1e12
            gbps = wbytes / (us * 1e-6) / 1e9
            print(f"{name:<8} {t:>5} {us:>9.1f} {tf:>8.1f} {100 * tf / peak:>5.1f}% {gbps:>8.0f}")
            rows.append({"shape": name, "n": n, "k": k, "t": t, "us": us, "tflops": tf, "weight_gbps": gbps})
        del ws
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__, "peak_tflops": peak, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
