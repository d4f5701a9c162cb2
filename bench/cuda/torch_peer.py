#!/usr/bin/env python3
"""PyTorch peer of tessera_bench_cuda's GEMV rows: torch.nn.functional.linear with one token (cuBLAS underneath) at
the same shapes, timed the same way (a CUDA graph of back-to-back launches over rotating weight copies covering 4x
the L2, event-timed replays, median), next to a device-to-device copy measured in the same process.

Run on the GPU machine (scripts/gpu_check.sh does): python3 bench/cuda/torch_peer.py [--json FILE] [--quick]
"""
import argparse
import json
import statistics

import torch

SHAPES = [(4096, 14336, True), (14336, 4096, True), (4096, 4096, True), (1024, 4096, False), (2048, 2048, False),
          (8192, 2048, False), (576, 576, True), (1536, 576, False), (576, 1536, False), (128256, 4096, False)]


def time_graph(fn, batch, reps):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(batch, 3)):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(batch):
            fn(i)
    graph.replay()
    graph.replay()
    per = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1e3 / batch)
    return statistics.median(per), min(per), max(per)


def copy_gbps():
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    ms = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return 2 * n / (statistics.median(ms) * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    copy = copy_gbps()
    out = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda, "copy_gbps": copy,
           "records": []}
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {props.name}: copy {copy:.0f} GB/s")
    print(f"{'torch F.linear':<16} {'N x K':>13} {'us':>10} {'GB/s':>8} {'%copy':>7}")
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):
        for n, k, quick in SHAPES:
            if args.quick and not quick:
                continue
            nbytes = n * k * 2
            copies = max(1, min(512, -(-4 * l2 // nbytes)))
            ws = [(torch.rand(n, k, device="cuda", dtype=torch.float32) - 0.5).to(dtype) * 0.1 for _ in range(copies)]
            x = (torch.rand(1, k, device="cuda", dtype=torch.float32) - 0.5).to(dtype)
            ys = [None]

            def run(i):
                ys[0] = torch.nn.functional.linear(x, ws[i % copies])

            big = n * k > (256 << 20)
            us, lo, hi = time_graph(run, max(copies, 4 if big else 10), args.reps)
            gbps = nbytes / (us * 1e-6) / 1e9
            print(f"{name:<16} {f'{n}x{k}':>13} {us:>10.2f} {gbps:>8.0f} {100 * gbps / copy:>6.1f}%")
            out["records"].append({"dtype": name, "n": n, "k": k, "us": us, "min_us": lo, "max_us": hi,
                                   "gbps": gbps, "pct_copy": 100 * gbps / copy, "copies": copies})
            del ws
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
