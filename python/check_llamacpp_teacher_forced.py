#!/usr/bin/env python3
"""Teacher-forced logits of a model against llama.cpp (the peer), for families beyond the golden SmolLM2 test.

  .venv/bin/python python/check_llamacpp_teacher_forced.py --model ~/.cache/tessera/models/gemma-3-270m-q4_k_m.gguf \
      [--tessera build/bin/tessera] [--n-gen 160] [--threads 2]

llama.cpp tokenizes the prompt (llama-tokenize) and continues it greedily (python/llamacpp_logits.cpp: the prompt in
one batch with every position's logits, then one decode per generated token). The sequence prompt + continuation
(but its last token) then goes through `tessera logits --ids`, which gives every position's logits; llama.cpp's rows
for the same positions are its prompt rows and its decode steps' rows. Printed, per the families brief's targets:
top-1 agreement at the positions where llama.cpp's top-2 gap exceeds 0.4 nats (target >= 99%), and the mean KL
divergence from llama.cpp over its top-5 with the rest of the row lumped into one bucket (target < 0.01). The default
prompt is long enough (with the continuation, past 512 tokens) that Gemma 3's sliding-window layers drop keys.
Exit status 1 when a target is missed.

On the GPU machine (no llama.cpp there): save llama.cpp's side here with --save-ref ref.npz (a few hundred KB), carry
it, and run there with --ref ref.npz --device cuda (numpy only).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import make_llamacpp_golden as golden  # noqa: E402

_PROSE = (
    "The history of the bicycle begins in the early nineteenth century, when inventors in Europe experimented with "
    "two-wheeled machines pushed along by the rider's feet. The draisine, built by Karl Drais in 1817, had no pedals "
    "at all; its rider sat between two wooden wheels and walked or ran while seated. Pedals attached to the front "
    "wheel appeared in France in the 1860s, and the resulting velocipedes, nicknamed boneshakers for their iron tyres "
    "and rough ride, became a fashion in Paris and then in London and New York. To go faster, makers enlarged the "
    "front wheel, since one turn of the pedals moved the machine forward by one turn of that wheel, and by the 1870s "
    "the high-wheeler, or penny-farthing, stood taller than its rider. It was fast but dangerous: a stone in the road "
    "could throw the rider over the handlebars. The safety bicycle of the 1880s solved this with two wheels of equal "
    "size and a chain driving the rear wheel through gears, so that speed no longer depended on the size of the "
    "wheel. John Kemp Starley's Rover of 1885 is usually named as the first successful design of this kind. Pneumatic "
    "tyres, patented by John Boyd Dunlop in 1888, made the ride comfortable, and within a decade the bicycle had "
    "become a means of transport for ordinary people rather than a toy for the wealthy. Bicycles changed the lives "
    "of women in particular, giving them a freedom of movement they had rarely had before, and changed the dress "
    "they wore to ride. Bicycle makers also developed techniques, such as ball bearings, steel tubing and precise "
    "mass production, that the early automobile and aircraft industries would later adopt; the Wright brothers ran "
    "a bicycle shop before they built their aeroplane. In the twentieth century the bicycle remained the most common "
    "vehicle in much of Asia and Europe, while in North America it was largely displaced by the car until interest "
    "returned with the environmental movement of the 1970s. Today cities around the world build cycle lanes and "
    "bicycle-sharing schemes, and electric bicycles extend the distances riders can comfortably cover. Write a short "
    "summary of this history in five sentences, then list the inventors it names.\n\nSummary:")


def reference(a) -> dict:
    """llama.cpp's side: the token sequence and, per position, what the metrics need of its logits (top-5 ids and
    logits, log-sum-exp, top-2 gap, argmax): small enough to carry to the GPU machine (--save-ref / --ref)."""
    src, build = golden.llamacpp_dirs()
    with tempfile.TemporaryDirectory() as tmp:
        exe = golden.compile_helper(src, build, tmp)
        ids = golden.tokenize(os.path.join(build, "bin"), a.model, a.prompt)
        prompt_logits, gen_ids, gen_logits = golden.run_helper(exe, a.model, ids, a.n_gen, a.threads, tmp)
    # Row s of gen_logits predicts the token after prompt + gen[:s]: rows 1.. follow the prompt rows.
    ref = np.concatenate([prompt_logits, gen_logits[1:]])
    seq = ids + [int(t) for t in gen_ids[:-1]]
    top2 = np.sort(ref, axis=1)[:, -2:]
    tids, tls, lses = [], [], []
    for t in range(len(seq)):
        tid, tl = golden.top_k(ref[t], 5)
        tids.append(tid)
        tls.append(tl)
        lses.append(float(golden.rf.log_sum_exp(ref[t].astype(np.float64)[None])[0]))
    return {"seq": np.asarray(seq, dtype=np.int64), "n_prompt": np.int64(len(ids)), "n_gen": np.int64(a.n_gen),
            "gap": (top2[:, 1] - top2[:, 0]).astype(np.float64), "top1": ref.argmax(axis=1).astype(np.int64),
            "top5_ids": np.asarray(tids, dtype=np.int64), "top5_logits": np.asarray(tls, dtype=np.float64),
            "lse": np.asarray(lses, dtype=np.float64)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build", "bin", "tessera"))
    ap.add_argument("--n-gen", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default=_PROSE)
    ap.add_argument("--gap", type=float, default=0.4, help="top-2 gap (nats) above which top-1 must agree")
    ap.add_argument("--device", default="cpu", help="tessera's device (cpu or cuda)")
    ap.add_argument("--save-ref", metavar="NPZ", help="only run llama.cpp and save what the check needs of it here")
    ap.add_argument("--ref", metavar="NPZ", help="llama.cpp's side from --save-ref (no llama.cpp needed: the GPU "
                    "machine runs tessera against it)")
    a = ap.parse_args()

    if a.ref:
        r = dict(np.load(a.ref))
    else:
        r = reference(a)
    if a.save_ref:
        np.savez_compressed(a.save_ref, **r)
        print(f"saved llama.cpp's reference for {len(r['seq'])} positions to {a.save_ref}")
        return 0
    seq = [int(x) for x in r["seq"]]
    n = len(seq)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "tessera.npy")
        subprocess.run([a.tessera, "logits", "-m", a.model, "--ids", ",".join(map(str, seq)), "-o", out, "-t",
                        str(a.threads), "-q", "--device", a.device], check=True)
        got = np.load(out)
    assert got.shape[0] == n, (got.shape, n)
    got_top1 = got.argmax(axis=1)
    clear = r["gap"] > a.gap
    agree = r["top1"] == got_top1
    kls = np.asarray([golden.kl_topk(r["top5_ids"][t], r["top5_logits"][t], float(r["lse"][t]),
                                     got[t].astype(np.float64)) for t in range(n)])
    top1_clear = float(agree[clear].mean()) if clear.any() else 1.0
    print(f"{os.path.basename(a.model)} on {a.device}: {int(r['n_prompt'])} prompt + {int(r['n_gen']) - 1} greedy "
          f"tokens = {n} positions")
    print(f"  top-1 agreement: {agree.sum()}/{n} overall; {agree[clear].sum()}/{clear.sum()} = {100 * top1_clear:.2f}% "
          f"where llama.cpp's top-2 gap > {a.gap}")
    print(f"  KL(llama.cpp || tessera) over llama.cpp's top-5: mean {kls.mean():.5f}, max {kls.max():.4f} "
          f"(position {int(kls.argmax())}); before position 512: {kls[:512].mean():.5f}, from 512: "
          f"{kls[512:].mean() if n > 512 else float('nan'):.5f}")
    ok = top1_clear >= 0.99 and kls.mean() < 0.01
    print("  targets (top-1 >= 99% where clear, mean KL < 0.01):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
