#!/usr/bin/env python3
"""torchview and `tessera graph` side by side on one model (docs/GRAPH.md, "Compared with torchview").

    python python/torchview_compare.py --out DIR [--tessera PATH] [--tokens 8] [--timeout 300]
                                       [--stages tv135,ts135,tv8b,ts8b]

Needs torch, transformers, torchview and the graphviz Python package (pip install torchview graphviz), Graphviz's
`dot` on PATH, and a built tessera (default: build/bin/tessera next to this script's parent).

What it does:
  1. Builds a random-weight SmolLM2-135M-shaped LlamaForCausalLM (hf_oracle.py's "smollm2-135m" config: hidden 576,
     30 layers, 9 heads, 3 KV heads, ffn 1536, vocab 49152, rope_theta 1e5, tied embeddings; eager attention),
     in bf16, and saves it with save_pretrained (plus hf_oracle's small tokenizer.json) to DIR/smollm2-135m.
  2. torchview: draw_graph(model, input_data=<1 x TOKENS ids>, depth=D, device="cpu") for D = 1, 2, 3 (its default)
     and inf (every module and torch function), then `dot -Tsvg` on the graph's source with a timeout. Each depth is
     first tried as a plain call; when that raises, again with use_cache=False (transformers 5's DynamicCache output
     makes torchview 0.2.7 raise KeyError in render_edges at depth 2 and 3). depth=3 with roll=True is tried too.
  3. tessera graph -m DIR/smollm2-135m -T TOKENS: --format svg (layer 0 in full, the rest collapsed), html, json
     (node and edge counts), and svg with --layers 0-29 (every layer in full, laid out by libgvc in-process); three
     runs each, the median kept (one run where it took over 30 s), each run with the same timeout.
  4. Llama-3-8B's shape (32 layers, hidden 4096, vocab 128256): torchview on a model built on device "meta" (no
     weights allocated), depth 3 and inf, against `tessera graph --arch llama3-8b --random-weights -T TOKENS`
     (svg, html, json).
Every timeout (torchview's `dot`, tessera's whole run) is --timeout; each row records it, so stages may be run
separately with different timeouts into one DIR.
Writes DIR/results.json, the SVGs / HTML / Graphviz sources, and prints a Markdown table.
Node counts: an SVG's `<g id="node` elements (both tools' Graphviz output); the HTML page's embedded graph-data
JSON "nodes"; a Graphviz source that did not lay out in time: its node statements.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

LLAMA3_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, max_position_embeddings=8192, bos_token_id=128000, eos_token_id=128001)


def svg_nodes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().count('<g id="node')


def gv_nodes(source):  # node statements of a Graphviz source: `\tNAME [label=...]`
    return len(re.findall(r'^\s*"?[\w.]+"? \[label=', source, flags=re.M))


def html_nodes(path):
    s = open(path, encoding="utf-8").read()
    m = re.search(r'<script id="graph-data" type="application/json">(.*?)</script>', s, flags=re.S)
    if not m:
        return None
    return len(json.loads(m.group(1))["nodes"])


def run_dot(gv_path, svg_path, timeout):
    t = time.perf_counter()
    try:
        subprocess.run(["dot", "-Tsvg", gv_path, "-o", svg_path], check=True, timeout=timeout,
                       capture_output=True)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    except subprocess.CalledProcessError as e:
        return None, "dot failed: " + e.stderr.decode(errors="replace").strip()[:200]
    return time.perf_counter() - t, ""


def torchview_case(model, ids, out, name, depth, timeout, roll=False, device="cpu"):
    from torchview import draw_graph
    row = {"tool": "torchview", "name": name, "depth": "inf" if depth == float("inf") else depth, "roll": roll,
           "timeout_s": timeout}
    attempts = [{}, {"use_cache": False}]
    notes = []
    g = None
    for kw in attempts:
        t = time.perf_counter()
        try:
            g = draw_graph(model, input_data=ids, depth=depth, device=device, roll=roll, graph_name=name, **kw)
        except Exception as e:  # torchview's own failure, recorded as such
            notes.append(f"{'plain call' if not kw else kw}: {type(e).__name__} {str(e)[:80]}")
            continue
        row["trace_s"] = time.perf_counter() - t
        row["kwargs"] = kw
        break
    row["errors"] = notes
    if g is None:
        row["status"] = "trace failed"
        return row
    src = g.visual_graph.source
    gv = os.path.join(out, name + ".gv")
    with open(gv, "w") as f:
        f.write(src)
    row["gv_bytes"] = len(src.encode())
    row["gv_nodes"] = gv_nodes(src)
    svg = os.path.join(out, name + ".svg")
    dt, err = run_dot(gv, svg, timeout)
    if dt is None:
        row["status"] = err
        row["render_s"] = None if err != "timeout" else f">{timeout}"
        return row
    row.update(status="ok", render_s=dt, wall_s=row["trace_s"] + dt, out_bytes=os.path.getsize(svg),
               nodes=svg_nodes(svg))
    return row


def tessera_case(tessera, args_, out, name, fmt, timeout, runs=3):
    path = os.path.join(out, name + "." + fmt)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        try:
            r = subprocess.run([tessera, "graph", *args_, "--format", fmt, "-o", path], capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"tool": "tessera", "name": name, "format": fmt, "args": args_, "status": "timeout",
                    "wall_s": f">{timeout}", "timeout_s": timeout}
        times.append(time.perf_counter() - t)
        if times[-1] > 30:  # a slow layout: one run is enough
            break
        if r.returncode != 0:
            return {"tool": "tessera", "name": name, "format": fmt, "status": "failed: " + r.stderr.strip()[:200]}
    row = {"tool": "tessera", "name": name, "format": fmt, "args": args_, "status": "ok", "timeout_s": timeout,
           "wall_s": statistics.median(times), "wall_all_s": times, "out_bytes": os.path.getsize(path)}
    if fmt == "svg":
        row["nodes"] = svg_nodes(path)
    elif fmt == "html":
        row["nodes"] = html_nodes(path)
    elif fmt == "json":
        d = json.load(open(path))
        row["nodes"], row["edges"] = len(d["nodes"]), len(d["edges"])
    return row


def fmt_s(v):
    return "-" if v is None else (v if isinstance(v, str) else f"{v:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tessera", default=os.path.join(os.path.dirname(HERE), "build", "bin", "tessera"))
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=300, help="seconds allowed to each `dot -Tsvg`")
    ap.add_argument("--stages", default="tv135,ts135,tv8b,ts8b",
                    help="tv135/ts135: torchview/tessera on the 135M model; tv8b/ts8b: on Llama-3-8B's shape. "
                         "Rows of stages not run are kept from an earlier DIR/results.json")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)

    import torch
    import transformers
    import torchview
    from hf_oracle import MODELS, make_config, make_model, write_tokenizer

    dot_v = subprocess.run(["dot", "-V"], capture_output=True, text=True).stderr.strip()
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "torchview": getattr(torchview, "__version__", "?"), "dot": dot_v, "tokens": a.tokens,
            "timeout_s": a.timeout, "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count()}
    stages = a.stages.split(",")
    rows = []
    res_path = os.path.join(a.out, "results.json")
    if os.path.exists(res_path):  # keep the other stages' rows
        rows = [r for r in json.load(open(res_path))["rows"] if r.get("stage") not in stages]

    def add(stage, r):
        r["stage"] = stage
        rows.append(r)
        print(json.dumps(r), flush=True)

    # 1. The model, saved for Tessera.
    torch.manual_seed(0)
    spec = MODELS["smollm2-135m"]
    model = make_model(spec, make_config(spec)).to(torch.bfloat16).eval()
    mdir = os.path.join(a.out, "smollm2-135m")
    if "ts135" in stages or not os.path.isdir(mdir):
        t = time.perf_counter()
        model.save_pretrained(mdir)
        write_tokenizer(mdir)
        meta["save_s"] = time.perf_counter() - t
    ids = torch.randint(0, spec["vocab_size"], (1, a.tokens))

    # 2. torchview on it.
    if "tv135" in stages:
        for d in [1, 2, 3, float("inf")]:
            name = f"torchview_smollm2_depth{'inf' if d == float('inf') else d}"
            add("tv135", torchview_case(model, ids, a.out, name, d, a.timeout))
        add("tv135", torchview_case(model, ids, a.out, "torchview_smollm2_depth3_roll", 3, a.timeout, roll=True))

    # 3. tessera graph on the saved directory.
    base = ["-m", mdir, "-T", str(a.tokens)]
    for name, extra, fmt in [("tessera_smollm2", [], "svg"), ("tessera_smollm2", [], "html"),
                             ("tessera_smollm2", [], "json"),
                             ("tessera_smollm2_all_layers", ["--layers", "0-29"], "svg")]:
        if "ts135" in stages:
            add("ts135", tessera_case(a.tessera, base + extra, a.out, name, fmt, a.timeout))

    # 4. Llama-3-8B's shape.
    if "tv8b" in stages:
        del model
        cfg = transformers.LlamaConfig(**LLAMA3_8B, attn_implementation="eager")
        t = time.perf_counter()
        with torch.device("meta"):
            big = transformers.LlamaForCausalLM(cfg).eval()
        meta["meta_build_s"] = time.perf_counter() - t
        ids_m = torch.randint(0, LLAMA3_8B["vocab_size"], (1, a.tokens))
        for d in [3, float("inf")]:
            name = f"torchview_llama3_8b_meta_depth{'inf' if d == float('inf') else d}"
            add("tv8b", torchview_case(big, ids_m, a.out, name, d, a.timeout, device="meta"))
    if "ts8b" in stages:
        base8 = ["--arch", "llama3-8b", "--random-weights", "-T", str(a.tokens)]
        for name, extra, fmt in [("tessera_llama3_8b", [], "svg"), ("tessera_llama3_8b", [], "html"),
                                 ("tessera_llama3_8b", [], "json")]:
            add("ts8b", tessera_case(a.tessera, base8 + extra, a.out, name, fmt, a.timeout))

    with open(res_path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)

    print("\n" + json.dumps(meta))
    print("| run | setting | wall s (trace + dot) | output bytes | nodes | status (timeout s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["tool"] == "torchview":
            setting = f"depth={r['depth']}" + (" roll" if r["roll"] else "") + \
                (" use_cache=False" if r.get("kwargs") else "")
            wall = f"{fmt_s(r.get('wall_s'))} ({fmt_s(r.get('trace_s'))} + {fmt_s(r.get('render_s'))})"
            nodes = r.get("nodes", f"({r.get('gv_nodes', '-')} in .gv)")
        else:
            setting = f"--format {r['format']} " + " ".join(x for x in r.get("args", []) if not x.startswith("/"))
            wall, nodes = fmt_s(r.get("wall_s")), r.get("nodes", "-")
        print(f"| {r['name']} | {setting} | {wall} | {r.get('out_bytes', '-')} | {nodes} | {r['status']} ({r.get('timeout_s', '-')}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
