#!/usr/bin/env python3
"""PyTorch peer of bench/cuda/bench_attention (Tessera's attn_prefill): causal scaled_dot_product_attention in bf16.

Run on the GPU machine, in the same session as tessera_bench_attention (python3 there has torch 2.11):
    python3 bench/peer/torch_sdpa.py [--reps 20] [--json FILE] [--quick]

Shapes (the same as the Tessera benchmark): Llama-3-8B (32 query heads, 8 kv heads, head 128) at t = 2048, 8192,
16384, and head 64 with 32/8 and 9/3 heads at 2048. q [1, n_head, t, hd], k/v [1, n_kv, t, hd], is_causal=True.
GQA through enable_gqa=True where the backend takes it, else with k/v repeated to n_head heads (the row says which;
repeating is not timed).
Backends, one row each: "default" (what PyTorch picks; the name it picked is found by trying each backend alone and
taking the first of the priority list that runs, reported in the row), then each of flash, cudnn and efficient
forced via torch.nn.attention.sdpa_kernel. A backend that refuses the inputs gets a row with its error.
Timing: CUDA events around each call, 3 warm-up calls, median of --reps (min and max beside it). TFLOP/s counts the
causal FLOPs 4 * t^2 * hd * n_head / 2, as the Tessera benchmark does.
"""
from __future__ import annotations

import argparse
import json
import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [("llama3-8b", 32, 8, 128, 2048), ("llama3-8b", 32, 8, 128, 8192), ("llama3-8b", 32, 8, 128, 16384),
          ("hd64 32/8", 32, 8, 64, 2048), ("smollm2 9/3", 9, 3, 64, 2048)]
FORCED = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
          ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def time_ms(fn, reps: int) -> tuple[float, float, float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
    ms.sort()
    return ms[len(ms) // 2], ms[0], ms[-1]


def make_call(q, k, v, n_head: int, n_kv: int):
    """The SDPA call and how GQA is done: enable_gqa if this torch has it and the backend accepts it."""
    def gqa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = n_head // n_kv
    ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def expanded():
        return F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
    return [("gqa", gqa), ("expanded", expanded)]


def run_backend(backend, q, k, v, n_head, n_kv, reps):
    errors = []
    for mode, fn in make_call(q, k, v, n_head, n_kv):
        try:
            with sdpa_kernel(backend) if backend is not None else _null():
                fn()  # raises when the backend refuses
                torch.cuda.synchronize()
                return mode, time_ms(fn, reps), None
        except Exception as e:  # noqa: BLE001: report any refusal as a row
            errors.append(f"{mode}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    return None, None, "; ".join(errors)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def picked_backend(q, k, v, n_head, n_kv) -> str:
    """Which backend the default path would use: the first one in PyTorch's priority order that accepts the inputs."""
    choose = getattr(torch, "_fused_sdp_choice", None)  # private: may be absent or change its signature
    names = {int(getattr(SDPBackend, n).value if hasattr(getattr(SDPBackend, n), "value") else getattr(SDPBackend, n)): n
             for n in dir(SDPBackend) if n.isupper()}
    why = "no torch._fused_sdp_choice"
    for call in (lambda: choose(q, k, v, None, 0.0, True, None, True), lambda: choose(q, k, v, None, 0.0, True, None),
                 lambda: choose(q, k, v, is_causal=True, enable_gqa=True)):
        if choose is None:
            break
        try:
            idx = int(call())
            return names.get(idx, str(idx)).lower()
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''}"
    return f"unknown: {why}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # forced backends that refuse explain at length; the row keeps the error
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"device: {props.name}, torch {torch.__version__}, cuda {torch.version.cuda}, "
          f"cudnn {torch.backends.cudnn.version()}")
    rows = []
    print(f"{'shape':<12} {'t':>6} {'hd':>4} {'backend':<22} {'gqa':<9} {'ms':>9} {'min':>9} {'max':>9} {'TFLOP/s':>8}")
    for name, n_head, n_kv, hd, t in SHAPES[:1] if args.quick else SHAPES:
        g = torch.Generator(device=dev).manual_seed(t + hd)
        q = torch.randn(1, n_head, t, hd, device=dev, dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, n_kv, t, hd, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, n_kv, t, hd, device=dev, dtype=torch.bfloat16, generator=g)
        flops = 4.0 * t * t * hd * n_head / 2
        picked = picked_backend(q, k, v, n_head, n_kv)
        for bname, backend in [(f"default ({picked})", None)] + FORCED:
            mode, tm, err = run_backend(backend, q, k, v, n_head, n_kv, args.reps)
            row = {"shape": name, "n_head": n_head, "n_kv": n_kv, "hd": hd, "t": t, "backend": bname}
            if err is not None:
                row["error"] = err
                print(f"{name:<12} {t:>6} {hd:>4} {bname:<22} refused: {err[:90]}")
            else:
                med, lo, hi = tm
                row.update(gqa=mode, ms=med, min_ms=lo, max_ms=hi, tflops=flops / (med * 1e-3) / 1e12)
                print(f"{name:<12} {t:>6} {hd:>4} {bname:<22} {mode:<9} {med:>9.3f} {lo:>9.3f} {hi:>9.3f} "
                      f"{row['tflops']:>8.1f}")
            rows.append(row)
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__, "rows": rows}, f, indent=2)
    assert math.isfinite(sum(r.get("ms", 0.0) for r in rows))


if __name__ == "__main__":
    main()
