#!/usr/bin/env python3
"""Turns benchmark JSON into a PNG chart: tok/s per test against the peers (median with the spread as error bars)
and the share of the machine's limit each one reaches.

Inputs, any mix of:
  - `tessera bench --json` output (an array of rows): one series, "tessera" (or the --label given for it);
  - `bench/compare_llamacpp.sh --json OUT` output: two series, "llama.cpp" and "tessera", measured in the same run.

Usage:
  .venv/bin/python python/plot_bench.py RESULT.json [MORE.json ...] -o chart.png [--label NAME ...] [--title TEXT]
Example (the README chart):
  bench/compare_llamacpp.sh --json /tmp/cmp.json && .venv/bin/python python/plot_bench.py /tmp/cmp.json \
      -o docs/img/bench_cpu.png
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402


def test_order(test):
    return (0 if test.startswith("pp") else 1, int("".join(c for c in test if c.isdigit()) or 0))


def load_series(path, label):
    """Returns [(series name, {test: {"tok_s", "sd", "fraction"}}, caption)] for one input file."""
    with open(path) as f:
        data = json.load(f)
    name = label or os.path.splitext(os.path.basename(path))[0]
    if isinstance(data, dict) and "rows" in data:  # compare_llamacpp.sh
        peer, ours = {}, {}
        for r in data["rows"]:
            lim = r.get("limit")
            peer[r["test"]] = {"tok_s": r["llamacpp_tok_s"], "sd": r["llamacpp_tok_s_stddev"],
                               "fraction": r["llamacpp_rate"] / lim if lim else None}
            ours[r["test"]] = {"tok_s": r["tessera_tok_s"], "sd": r["tessera_tok_s_stddev"],
                               "fraction": r["tessera_rate"] / lim if lim else None}
        caption = f"{os.path.basename(data['model'])}, {data['threads']} threads, {data.get('date', '')[:10]}"
        suffix = f" ({label})" if label else ""
        return [("llama.cpp" + suffix, peer, caption), ("tessera" + suffix, ours, caption)]
    if isinstance(data, list) and data and "test" in data[0]:  # tessera bench --json
        rows = {}
        for r in data:
            rows[r["test"]] = {"tok_s": r["tok_s"], "sd": r["tok_s_stddev"], "fraction": r.get("fraction_of_limit")}
        r0 = data[0]
        caption = f"{r0['model']}, {r0['device']}, {r0['n_threads']} threads, {r0.get('date', '')[:10]}"
        return [(label or "tessera", rows, caption)]
    sys.exit(f"plot_bench: {path}: neither `tessera bench --json` rows nor compare_llamacpp.sh output")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="JSON files")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--label", action="append", default=[], help="series name per input, in order")
    ap.add_argument("--title", default="", help="chart title")
    args = ap.parse_args()

    series, captions = [], []
    for i, path in enumerate(args.inputs):
        label = args.label[i] if i < len(args.label) else ""
        for s in load_series(path, label):
            series.append(s[:2])
            if s[2] not in captions:
                captions.append(s[2])
    tests = sorted({t for _, rows in series for t in rows}, key=test_order)
    if not tests:
        sys.exit("plot_bench: no rows to plot")

    fig, axes = plt.subplots(1, len(tests) + 1, figsize=(3.2 * (len(tests) + 1) + 1, 3.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(len(series), 1)
    for ax, test in zip(axes, tests):
        for i, (name, rows) in enumerate(series):
            if test in rows:
                r = rows[test]
                ax.bar(i * width, r["tok_s"], width, yerr=r["sd"], capsize=3, color=colors[i % len(colors)], label=name)
                ax.annotate(f"{r['tok_s']:.1f}", (i * width, r["tok_s"]), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 2), textcoords="offset points")
        ax.set_title(test)
        ax.set_ylabel("tokens / s (median ± sd)")
        ax.set_xticks([])
    ax = axes[-1]
    for i, (name, rows) in enumerate(series):
        xs = [j + i * width for j, t in enumerate(tests) if rows.get(t, {}).get("fraction") is not None]
        ys = [100 * rows[t]["fraction"] for t in tests if rows.get(t, {}).get("fraction") is not None]
        if xs:
            ax.bar(xs, ys, width, color=colors[i % len(colors)], label=name)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(tests))])
    ax.set_xticklabels(tests)
    ax.set_ylabel("% of the measured limit")
    ax.set_title("tg: read bandwidth; pp: GEMM")
    ax.axhline(100, color="grey", lw=0.8, ls="--")
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle((args.title + "\n" if args.title else "") + "; ".join(captions), fontsize=9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(args.output)


if __name__ == "__main__":
    main()
