#!/usr/bin/env python3
"""Start-up cost of the CLI: median wall time and peak RSS of `tessera inspect` (maps the model, reads no weights) and
`tessera --help` over N runs, optionally beside another build's binary, run alternately (A B A B ...) so that drift
in the machine's speed falls on both.

  bench/startup.py [-n RUNS] [-m MODEL] [--vs OTHER_TESSERA] [TESSERA]

Wall time is a monotonic clock around fork/exec/wait; peak RSS is the kernel's ru_maxrss of the finished child
(os.wait4), so each figure is one whole process, start-up included."""
import argparse
import os
import statistics
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sample(cmd):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"startup: {' '.join(cmd)} exited {p.returncode}")
    return wall * 1e3, ru.ru_maxrss / 1024.0  # ms, MiB (Linux reports KiB)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tessera", nargs="?", default=os.path.join(root, "build/bin/tessera"))
    ap.add_argument("-n", type=int, default=31, help="runs per binary and command (after one warm-up)")
    home = os.environ.get("TESSERA_HOME", os.path.expanduser("~/.cache/tessera/models"))
    ap.add_argument("-m", default=os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"), help="model for inspect")
    ap.add_argument("--vs", help="another tessera binary to run alternately (the baseline)")
    a = ap.parse_args()
    bins = [a.tessera] + ([a.vs] if a.vs else [])
    for b in bins:
        if not os.access(b, os.X_OK):
            sys.exit(f"startup: {b} is not an executable (build first: make)")
    if not os.path.isfile(a.m):
        sys.exit(f"startup: model {a.m} not found (scripts/fetch_model.sh)")
    cmds = {"inspect": ["inspect", "-m", a.m], "help": ["--help"]}
    res = {(b, c): [] for b in bins for c in cmds}
    for i in range(a.n + 1):
        for b in bins:
            for c, args in cmds.items():
                s = sample([b] + args)
                if i > 0:  # the first round warms the page cache
                    res[(b, c)].append(s)
    print(f"{'binary':<44} {'command':<8} {'median_ms':>9} {'min_ms':>7} {'max_ms':>7} {'peak_rss_mib':>12}")
    for (b, c), v in res.items():
        w = [x[0] for x in v]
        print(f"{b[-44:]:<44} {c:<8} {statistics.median(w):9.1f} {min(w):7.1f} {max(w):7.1f} "
              f"{max(x[1] for x in v):12.1f}")
    if a.vs:
        for c in cmds:
            r = [x[0] / y[0] for x, y in zip(res[(bins[0], c)], res[(bins[1], c)])]
            print(f"{c}: wall time A/B, median of pairs {statistics.median(r):.3f}")


if __name__ == "__main__":
    main()
