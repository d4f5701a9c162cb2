#!/usr/bin/env python3
"""Would permuting each matmul's input channels by their calibrated TEAL keep rate cluster the kept channels?

TEAL zeroes each matmul input's smallest magnitudes per token; a sparse GEMV then skips the zeroed channels' weights.
The kept channels are scattered, which costs twice: a channel-major bf16 walk (CUDA) reads many short runs instead of a
stream, and a quantized format (32-element blocks along K) can skip a block only when all its channels are zero. A
fixed permutation of an input's channels (W's K columns and the producer's output order permuted alike: exact) sorted
by how often calibration KEEPS each channel would put the often-kept ones together. This script measures what that
does to the masks, on real sparsified decode activations from `tessera dump` (docs/TEAL.md), numpy only:

  - calibration: dumps of greedy decoding after prompts from one text (default: Genesis passages of the KJV), giving
    each (layer, input)'s per-channel keep frequency and the permutation (descending frequency, ties in index order);
  - evaluation: dumps after prompts from another text (default: gospel passages), whose per-token masks (x != 0) are
    scored in four channel orders: natural, random (the control; mean over --random-perms permutations), calibrated
    ("perm") and the evaluation's own frequency order ("self": the best any fixed permutation could do on these
    tokens, an upper bound);
  - per mask: the share of B-channel blocks that are all zero and the share of the weights a block-skipping walk reads
    (channels in non-empty blocks / K), for each --blocks B; the maximal runs of consecutive kept channels (runs per
    token, mean length, the kept-weighted mean length sum(L^2)/sum(L): the run an average kept channel sits in, and
    the share of kept channels in runs >= 8 and >= 32);
  - per (layer, input): the calibration frequencies' concentration (share of channels kept in > 90% / < 10% of the
    tokens), the Pearson r of calibration and evaluation frequencies, and "hit": the share of evaluation kept channels
    that fall in the calibrated top-(kept) set (1.0 would make a static mask exact).

The four inputs (TEAL's SPARSIFY nodes): qkv (attention norm output; q, k and v share it), o (attention output), gate_up
(ffn norm output; gate and up share it), down (the gated product). Results are means over tokens, then over layers.

With --block-energy it also scores the alternative of block-structured TEAL (keep the 32-blocks of largest norm in the
calibrated order, so a block-skipping walk reads exactly 1 - S): the share of the dense input's energy each drops.

Usage (the dumps are made with -t 1 and reused from --work when present; about a minute of CPU per model):
  # 24 Genesis passages x 8 decode tokens calibrate, 16 gospel passages x 8 tokens evaluate; top-k at 25/40/50/65% and
  # calibrated thresholds (`tessera calibrate` on Genesis) at 40/50%:
  .venv/bin/python python/teal_permutation.py --work /tmp/teal_perm/smollm2_div --calib-refs 'Ge*24' \
      --eval-refs 'Mat*4,Mark*4,Luke*4,John*4' --tokens 8 --sparsity 0.25,0.4,0.5,0.65 --teal-sparsity 0.4,0.5 \
      --json /tmp/teal_perm/smollm2_div.json --per-layer
  # Gemma 3 270M, and block-structured TEAL's energy cost at 40/50%:
  .venv/bin/python python/teal_permutation.py -m ~/.cache/tessera/models/gemma-3-270m-q4_k_m.gguf \
      --work /tmp/teal_perm/gemma_div --calib-refs 'Ge*24' --eval-refs 'Mat*4,Mark*4,Luke*4,John*4' --tokens 8 \
      --sparsity 0.4,0.5 --block-energy
  # score existing dumps (any number of directories each side; their tokens are pooled):
  .venv/bin/python python/teal_permutation.py --calib-dirs d/cal0,d/cal1 --eval-dirs d/eval0,d/eval1
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

INPUTS = ("qkv", "o", "gate_up", "down")
# One matmul per input: dumping only these writes each input's x once (q, k, v share qkv.x; gate, up share gate_up.x).
DUMP_OPS = "q,o,gate,down"
DEFAULT_CALIB_REFS = ("Ge1:1", "Ge12:1", "Ge24:1", "Ge37:1")
DEFAULT_EVAL_REFS = ("Mat5:1", "Mark4:1", "Luke15:1", "John3:1")
REF_RE = re.compile(r"^([0-9]?[A-Za-z]+)(\d+):(\d+) (.*)$")


# ----------------------------------------------------------------------------------------------------------- text

def read_kjv(path: str):
    """[(book, chapter, verse, text)] of a KJV file with one 'BookC:V text' verse a line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = REF_RE.match(line.rstrip("\n"))
            if m:
                out.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)))
    return out


def passage(verses, ref: str, n: int) -> str:
    """n consecutive verses from ref ('Ge12:1'), references stripped, joined by spaces."""
    m = re.match(r"^([0-9]?[A-Za-z]+)(\d+):(\d+)$", ref)
    if not m:
        raise ValueError(f"bad reference {ref!r} (want e.g. Ge12:1)")
    key = (m.group(1), int(m.group(2)), int(m.group(3)))
    for i, v in enumerate(verses):
        if v[:3] == key:
            return " ".join(t for _, _, _, t in verses[i:i + n])
    raise ValueError(f"{ref}: not in the KJV file")


def expand_refs(verses, spec: str):
    """Comma-separated verse references; 'BOOK*N' stands for N references evenly spaced over the book."""
    out = []
    for r in spec.split(","):
        if not r:
            continue
        if "*" in r:
            book, n = r.split("*")
            idx = [i for i, v in enumerate(verses) if v[0] == book]
            if not idx:
                raise ValueError(f"{book}: no such book in the KJV file")
            for j in np.linspace(0, len(idx) - 1, int(n), endpoint=False).astype(int):
                b, c, v, _ = verses[idx[j]]
                out.append(f"{b}{c}:{v}")
        else:
            out.append(r)
    return out


def book_text(verses, book: str) -> str:
    return "\n".join(t for b, _, _, t in verses if b == book) + "\n"


# ---------------------------------------------------------------------------------------------------------- dumps

def run(cmd, log):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n" + r.stdout + "\n")
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}")


def make_dump(a, out_dir: str, prompt: str, rule_args) -> str:
    if not a.force and os.path.exists(os.path.join(out_dir, "manifest.json")):
        return out_dir
    cmd = [a.tessera, "dump", "-p", prompt, "--tokens", str(a.tokens), "--ops", DUMP_OPS, "-t", str(a.threads),
           "-o", out_dir] + rule_args
    if a.model:
        cmd[2:2] = ["-m", a.model]
    run(cmd, os.path.join(a.work, "commands.log"))
    return out_dir


def calibrate(a, text_file: str, sparsity: float) -> str:
    out = os.path.join(a.work, f"thresholds_{sparsity:g}.json")
    if not a.force and os.path.exists(out):
        return out
    cmd = [a.tessera, "calibrate", "-f", text_file, "--sparsity", f"{sparsity:g}", "--tokens",
           str(a.calibrate_tokens), "-t", str(a.threads), "-o", out]
    if a.model:
        cmd[2:2] = ["-m", a.model]
    run(cmd, os.path.join(a.work, "commands.log"))
    return out


def load_x(dirs):
    """{(layer, input): float32 [tokens, K]} matmul inputs pooled over the dump directories."""
    xs = {}
    for d in dirs:
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        seen = set()
        for e in m["matmuls"]:
            key = (e["layer"], e["input"])
            if key not in seen:
                seen.add(key)
                xs.setdefault(key, []).append(np.load(os.path.join(d, e["x"])))
    return {k: np.concatenate(v, axis=0) for k, v in xs.items()}


def load_masks(dirs):
    """{(layer, input): bool [tokens, K] kept-channel masks} pooled over the dump directories, and their info."""
    masks, info = {}, {"generated": [], "achieved": []}
    for d in dirs:
        with open(os.path.join(d, "manifest.json")) as f:
            m = json.load(f)
        if m.get("format") != "tessera-dump-1":
            sys.exit(f"{d}: not a tessera dump")
        info["model"] = m.get("model")
        info["rule"] = m.get("rule")
        info["generated"].append(m.get("generated_tokens", []))
        info["achieved"].append(m.get("achieved_sparsity"))
        seen = set()
        for e in m["matmuls"]:
            key = (e["layer"], e["input"])
            if key in seen:
                continue
            seen.add(key)
            x = np.load(os.path.join(d, e["x"]))
            masks.setdefault(key, []).append(x != 0)
    return {k: np.concatenate(v, axis=0) for k, v in masks.items()}, info


# -------------------------------------------------------------------------------------------------------- metrics

def block_stats(mask: np.ndarray, b: int):
    """(share of all-zero blocks, share of channels in non-empty blocks) of b-channel blocks, mean over tokens."""
    t, k = mask.shape
    nb = -(-k // b)
    pad = np.zeros((t, nb * b), dtype=bool)
    pad[:, :k] = mask
    nonempty = pad.reshape(t, nb, b).any(axis=2)
    sizes = np.full(nb, b)
    sizes[-1] = k - (nb - 1) * b
    return float(1.0 - nonempty.mean()), float((nonempty * sizes).sum(axis=1).mean() / k)


def run_stats(mask: np.ndarray):
    """Runs of consecutive kept channels: runs per token, mean run length, kept-weighted mean length sum(L^2)/sum(L),
    share of kept channels in runs >= 8 and >= 32 (means over tokens)."""
    t, k = mask.shape
    m = np.zeros((t, k + 2), dtype=np.int8)
    m[:, 1:-1] = mask
    d = np.diff(m, axis=1)
    rows_s, starts = np.nonzero(d == 1)
    _, ends = np.nonzero(d == -1)  # row-major order: starts and ends pair up row by row
    lengths = ends - starts
    runs = np.bincount(rows_s, minlength=t).astype(float)
    kept = np.bincount(rows_s, weights=lengths, minlength=t)
    sq = np.bincount(rows_s, weights=lengths.astype(float) ** 2, minlength=t)
    ge8 = np.bincount(rows_s, weights=lengths * (lengths >= 8), minlength=t)
    ge32 = np.bincount(rows_s, weights=lengths * (lengths >= 32), minlength=t)
    ok = kept > 0
    return {"runs": float(runs.mean()),
            "mean_run": float((kept[ok] / runs[ok]).mean()) if ok.any() else 0.0,
            "kw_run": float((sq[ok] / kept[ok]).mean()) if ok.any() else 0.0,
            "ge8": float((ge8[ok] / kept[ok]).mean()) if ok.any() else 0.0,
            "ge32": float((ge32[ok] / kept[ok]).mean()) if ok.any() else 0.0}


def order_stats(mask: np.ndarray, blocks):
    s = {"blocks": {}}
    for b in blocks:
        empty, read = block_stats(mask, b)
        s["blocks"][b] = {"empty": empty, "read": read}
    s.update(run_stats(mask))
    return s


def mean_stats(stats):
    out = {"blocks": {b: {q: float(np.mean([s["blocks"][b][q] for s in stats])) for q in ("empty", "read")}
                      for b in stats[0]["blocks"]}}
    for q in ("runs", "mean_run", "kw_run", "ge8", "ge32"):
        out[q] = float(np.mean([s[q] for s in stats]))
    return out


def analyse(cal, ev, blocks, n_random, seed):
    """Per (layer, input) statistics of the evaluation masks under each channel order."""
    rng = np.random.default_rng(seed)
    res = {}
    for key in sorted(ev):
        if key not in cal:
            continue
        mc, me = cal[key], ev[key]
        k = me.shape[1]
        fc, fe = mc.mean(axis=0), me.mean(axis=0)
        perm = np.argsort(-fc, kind="stable")
        self_perm = np.argsort(-fe, kind="stable")
        kept = me.sum(axis=1)
        rank = np.empty(k, dtype=np.int64)
        rank[perm] = np.arange(k)
        # hit: per token the share of its kept channels among the calibrated top-(its kept count) channels
        in_top = rank[None, :] < kept[:, None]
        hit = float(np.mean((me & in_top).sum(axis=1) / np.maximum(kept, 1)))
        r = float(np.corrcoef(fc, fe)[0, 1]) if fc.std() > 0 and fe.std() > 0 else float("nan")
        rnd = mean_stats([order_stats(me[:, rng.permutation(k)], blocks) for _ in range(n_random)])
        res[key] = {
            "K": k, "sparsity": float(1.0 - me.mean()),
            "cal_gt90": float((fc > 0.9).mean()), "cal_lt10": float((fc < 0.1).mean()),
            "eval_gt90": float((fe > 0.9).mean()), "eval_lt10": float((fe < 0.1).mean()),
            "r": r, "hit": hit, "cal_p10": float(np.quantile(fc, 0.1)), "cal_p90": float(np.quantile(fc, 0.9)),
            "orders": {"natural": order_stats(me, blocks), "random": rnd,
                       "perm": order_stats(me[:, perm], blocks), "self": order_stats(me[:, self_perm], blocks)},
        }
    return res


def block_energy(cal, dense, sparsity, b, n_random, seed):
    """Block-structured TEAL as the alternative: per token keep the round((1 - S) K / b) b-blocks of largest L2 norm
    (a block-skipping walk then reads exactly 1 - S of the weights). Returns per (layer, input) the share of the dense
    input's energy sum(x^2) dropped by channel top-k (TEAL) and by block top-k in natural, random and calibrated order
    (the input's relative L2 error is its square root)."""
    rng = np.random.default_rng(seed)
    res = {}
    for key in sorted(dense):
        if key not in cal:
            continue
        x2 = dense[key].astype(np.float64) ** 2
        t, k = x2.shape
        if k % b:
            continue
        tot = np.maximum(x2.sum(axis=1), 1e-30)
        keep = k - int(np.floor(sparsity * k))
        ch = np.sort(x2, axis=1)[:, ::-1][:, :keep].sum(axis=1)
        nb_keep = int(round(keep / b))

        def blk(order):
            e = x2[:, order].reshape(t, k // b, b).sum(axis=2)
            return float(np.mean(1 - np.sort(e, axis=1)[:, ::-1][:, :nb_keep].sum(axis=1) / tot))
        perm = np.argsort(-cal[key].mean(axis=0), kind="stable")
        res[key] = {"channel": float(np.mean(1 - ch / tot)), "natural": blk(np.arange(k)),
                    "random": float(np.mean([blk(rng.permutation(k)) for _ in range(n_random)])), "perm": blk(perm)}
    return res


def print_energy(title, res, b):
    print(f"\n-- {title}: share of the dense input's energy dropped, channel top-k (TEAL) vs top-k of {b}-blocks "
          f"(same kept share) in nat / rnd / perm order; means over tokens, then layers")
    print(f"{'input':8} {'channel':>8} {'blk nat':>8} {'blk rnd':>8} {'blk perm':>8}")
    for inp in INPUTS:
        v = [s for (l, i), s in res.items() if i == inp]
        if v:
            print(f"{inp:8} " + " ".join(f"{np.mean([x[q] for x in v]):8.4f}" for q in
                                         ("channel", "natural", "random", "perm")))


# --------------------------------------------------------------------------------------------------------- output

ORDERS = ("natural", "random", "perm", "self")
SHORT = {"natural": "nat", "random": "rnd", "perm": "perm", "self": "self"}


def get(s, path):
    for p in path:
        s = s[p]
    return s


def layer_mean(res, inp, path):
    v = [get(s, path) for (l, i), s in res.items() if i == inp]
    return float(np.mean(v)) if v else float("nan")


def print_tables(title, res, blocks, per_layer):
    print(f"\n=== {title}")
    layers = sorted({l for l, _ in res})
    print(f"{len(layers)} layers; means over evaluation tokens, then layers; orders: nat(ural), rnd (random control), "
          f"perm (calibrated keep-rate order), self (evaluation's own order: upper bound)")
    print("\n-- keep-rate concentration (calibration), transfer to evaluation")
    print(f"{'input':8} {'K':>5} {'sparsity':>8} {'cal>90%':>8} {'cal<10%':>8} {'ev>90%':>7} {'ev<10%':>7} "
          f"{'cal p10':>7} {'cal p90':>7} {'r':>6} {'hit':>6}")
    for inp in INPUTS:
        ks = [s["K"] for (l, i), s in res.items() if i == inp]
        if not ks:
            continue
        print(f"{inp:8} {ks[0]:5d} {layer_mean(res, inp, ['sparsity']):8.3f} "
              f"{layer_mean(res, inp, ['cal_gt90']):8.3f} {layer_mean(res, inp, ['cal_lt10']):8.3f} "
              f"{layer_mean(res, inp, ['eval_gt90']):7.3f} {layer_mean(res, inp, ['eval_lt10']):7.3f} "
              f"{layer_mean(res, inp, ['cal_p10']):7.3f} {layer_mean(res, inp, ['cal_p90']):7.3f} "
              f"{layer_mean(res, inp, ['r']):6.3f} {layer_mean(res, inp, ['hit']):6.3f}")
    print("\n-- block skipping: share of the weights read (channels in non-empty B-blocks / K); 1 - sparsity is ideal")
    hdr = f"{'input':8} " + " ".join(f"{'B=' + str(b) + ' ' + '/'.join(SHORT[o] for o in ORDERS):>26}" for b in blocks)
    print(hdr)
    for inp in INPUTS:
        if not any(i == inp for _, i in res):
            continue
        cells = []
        for b in blocks:
            cells.append("/".join(f"{layer_mean(res, inp, ['orders', o, 'blocks', b, 'read']):.3f}" for o in ORDERS))
        print(f"{inp:8} " + " ".join(f"{c:>26}" for c in cells))
    print("\n-- runs of kept channels (nat / rnd / perm / self)")
    print(f"{'input':8} {'runs/token':>24} {'mean run':>22} {'kept-wtd run':>24} {'kept in runs>=8':>24} "
          f"{'kept in runs>=32':>24}")
    for inp in INPUTS:
        if not any(i == inp for _, i in res):
            continue
        row = f"{inp:8}"
        for q, w, fmt in (("runs", 24, "{:.0f}"), ("mean_run", 22, "{:.2f}"), ("kw_run", 24, "{:.1f}"),
                          ("ge8", 24, "{:.3f}"), ("ge32", 24, "{:.3f}")):
            row += " " + f"{'/'.join(fmt.format(layer_mean(res, inp, ['orders', o, q])) for o in ORDERS):>{w}}"
        print(row)
    b32 = 32 if 32 in blocks else blocks[0]
    print(f"\n-- per input, the layers where the calibrated order helps least / most (B={b32} read share, perm; "
          f"kept-weighted run, perm)")
    for inp in INPUTS:
        items = [(l, s) for (l, i), s in res.items() if i == inp]
        if not items:
            continue
        items.sort(key=lambda ls: ls[1]["orders"]["perm"]["blocks"][b32]["read"])
        best, worst = items[0], items[-1]

        def cell(ls):
            l, s = ls
            return (f"L{l}: read {s['orders']['natural']['blocks'][b32]['read']:.3f}->"
                    f"{s['orders']['perm']['blocks'][b32]['read']:.3f}, kw-run {s['orders']['natural']['kw_run']:.1f}->"
                    f"{s['orders']['perm']['kw_run']:.1f}, hit {s['hit']:.2f}")
        print(f"{inp:8} worst {cell(worst)} | best {cell(best)}")
    if per_layer:
        print(f"\n-- per layer: B={b32} read nat/perm/self, kept-weighted run nat/perm/self, hit, cal>90%, cal<10%")
        for inp in INPUTS:
            for l in layers:
                s = res.get((l, inp))
                if s is None:
                    continue
                o = s["orders"]
                print(f"{inp:8} L{l:<3d} read " + "/".join(f"{o[x]['blocks'][b32]['read']:.3f}" for x in
                                                        ("natural", "perm", "self")) +
                      "  kw-run " + "/".join(f"{o[x]['kw_run']:.1f}" for x in ("natural", "perm", "self")) +
                      f"  hit {s['hit']:.3f}  cal>90% {s['cal_gt90']:.3f}  cal<10% {s['cal_lt10']:.3f}")


def summary(res, blocks):
    out = {}
    for inp in INPUTS:
        if not any(i == inp for _, i in res):
            continue
        d = {q: layer_mean(res, inp, [q]) for q in ("K", "sparsity", "cal_gt90", "cal_lt10", "eval_gt90", "eval_lt10",
                                                    "cal_p10", "cal_p90", "r", "hit")}
        for o in ORDERS:
            d[o] = {"blocks": {str(b): {q: layer_mean(res, inp, ["orders", o, "blocks", b, q]) for q in
                                        ("empty", "read")} for b in blocks}}
            for q in ("runs", "mean_run", "kw_run", "ge8", "ge32"):
                d[o][q] = layer_mean(res, inp, ["orders", o, q])
        out[inp] = d
    return out


# ----------------------------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tessera", default="./build/bin/tessera", help="the tessera binary (default ./build/bin/tessera)")
    ap.add_argument("-m", "--model", default="", help="model file passed to tessera (default: tessera's default, "
                                                      "SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--kjv", default=os.path.expanduser("~/.cache/tessera/eval/kjv.txt"),
                    help="KJV text, one 'BookC:V text' verse a line: the prompts' and calibration text's source")
    ap.add_argument("--work", default="/tmp/teal_perm/work",
                    help="directory for the dumps, thresholds files and commands.log (reused when present)")
    ap.add_argument("--sparsity", default="0.25,0.4,0.5,0.65",
                    help="top-k sparsities to dump and score, comma-separated ('' for none)")
    ap.add_argument("--teal-sparsity", default="",
                    help="also calibrated thresholds (`tessera calibrate` on --calib-book) at these sparsities")
    ap.add_argument("--calib-refs", default=",".join(DEFAULT_CALIB_REFS),
                    help="calibration prompts: the passages starting at these verses, comma-separated; 'BOOK*N' is N "
                         "passages evenly spaced over a book (e.g. 'Ge*16')")
    ap.add_argument("--eval-refs", default=",".join(DEFAULT_EVAL_REFS),
                    help="evaluation prompts, as --calib-refs (e.g. 'Mat*4,Mark*4,Luke*4,John*4')")
    ap.add_argument("--verses", type=int, default=8, help="verses per prompt passage (default 8)")
    ap.add_argument("--tokens", type=int, default=32,
                    help="decode tokens dumped per prompt (default 32: 4 prompts give 128 tokens a side)")
    ap.add_argument("--calib-book", default="Ge", help="book whose text `tessera calibrate` reads (--teal-sparsity)")
    ap.add_argument("--calibrate-tokens", type=int, default=4096, help="tokens `tessera calibrate` reads")
    ap.add_argument("-t", "--threads", type=int, default=1, help="tessera threads (default 1)")
    ap.add_argument("--force", action="store_true", help="redo dumps and thresholds files that already exist")
    ap.add_argument("--calib-dirs", default="",
                    help="score existing dumps instead: calibration dump directories, comma-separated")
    ap.add_argument("--eval-dirs", default="", help="with --calib-dirs: the evaluation dump directories")
    ap.add_argument("--blocks", default="16,32,64,128,256", help="block sizes (channels) for block skipping")
    ap.add_argument("--random-perms", type=int, default=4, help="random permutations averaged for the control")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random permutations")
    ap.add_argument("--per-layer", action="store_true", help="also print one line per (input, layer)")
    ap.add_argument("--block-energy", action="store_true",
                    help="also dump the evaluation prompts dense and score block-structured top-k (32-blocks) in the "
                         "calibrated order against TEAL's channel top-k by the input energy each drops (top-k cases)")
    ap.add_argument("--json", default="", help="write the per-input summaries (means over layers) here")
    a = ap.parse_args(argv)
    blocks = [int(b) for b in a.blocks.split(",") if b]
    results = {}

    if a.calib_dirs:
        if not a.eval_dirs:
            ap.error("--calib-dirs needs --eval-dirs")
        cal, ci = load_masks(a.calib_dirs.split(","))
        ev, ei = load_masks(a.eval_dirs.split(","))
        res = analyse(cal, ev, blocks, a.random_perms, a.seed)
        title = f"{ei.get('model')} rule {ei.get('rule')}: calibration {a.calib_dirs}, evaluation {a.eval_dirs}"
        print_tables(title, res, blocks, a.per_layer)
        results[title] = summary(res, blocks)
    else:
        os.makedirs(a.work, exist_ok=True)
        verses = read_kjv(a.kjv)
        cal_prompts = [passage(verses, r, a.verses) for r in expand_refs(verses, a.calib_refs)]
        ev_prompts = [passage(verses, r, a.verses) for r in expand_refs(verses, a.eval_refs)]
        cases = [("topk", float(s), ["--sparsity", s]) for s in a.sparsity.split(",") if s]
        if a.teal_sparsity:
            text_file = os.path.join(a.work, f"calib_{a.calib_book}.txt")
            with open(text_file, "w", encoding="utf-8") as f:
                f.write(book_text(verses, a.calib_book))
            for s in a.teal_sparsity.split(","):
                if s:
                    thr = calibrate(a, text_file, float(s))
                    cases.append(("teal", float(s), ["--teal", thr]))
        for rule, s, rule_args in cases:
            tag = f"{rule}{s:g}"
            cdirs = [make_dump(a, os.path.join(a.work, tag, f"cal{i}"), p, rule_args)
                     for i, p in enumerate(cal_prompts)]
            edirs = [make_dump(a, os.path.join(a.work, tag, f"eval{i}"), p, rule_args)
                     for i, p in enumerate(ev_prompts)]
            cal, ci = load_masks(cdirs)
            ev, ei = load_masks(edirs)
            res = analyse(cal, ev, blocks, a.random_perms, a.seed)
            ntok_c = next(iter(cal.values())).shape[0]
            ntok_e = next(iter(ev.values())).shape[0]
            uc = len({t for g in ci["generated"] for t in g})
            ue = len({t for g in ei["generated"] for t in g})
            title = (f"{os.path.basename(ei.get('model') or '')} {rule} {s:g}: calibration {ntok_c} tokens "
                     f"({a.calib_refs}; {uc} distinct generated ids), evaluation {ntok_e} tokens ({a.eval_refs}; "
                     f"{ue} distinct)")
            print_tables(title, res, blocks, a.per_layer)
            results[tag] = {"title": title, "inputs": summary(res, blocks)}
            if a.block_energy and rule == "topk":
                ddirs = [make_dump(a, os.path.join(a.work, "dense", f"eval{i}"), p, ["--sparsity", "0"])
                         for i, p in enumerate(ev_prompts)]
                eres = block_energy(cal, load_x(ddirs), s, 32, a.random_perms, a.seed)
                print_energy(f"block-structured TEAL at {s:g} (dense evaluation activations)", eres, 32)
                results[tag]["block_energy"] = {
                    inp: {q: float(np.mean([x[q] for (l, i), x in eres.items() if i == inp]))
                          for q in ("channel", "natural", "random", "perm")}
                    for inp in INPUTS if any(i == inp for _, i in eres)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
