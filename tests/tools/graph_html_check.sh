#!/usr/bin/env bash
# Renders `tessera graph --format html` pages in a real headless browser (Debian's chromium) and checks them: the page
# loaded without a JavaScript error, drew every layer and node of the graph (the page writes what it drew into
# data-* attributes of <html>, read back with --dump-dom), and the 32-layer page of the llama3-8b preset was drawn
# within 2 s of the navigation's start (performance.now() when the SVG is drawn: parsing the page and its data, layout
# and drawing; the browser's own start-up is not the page's and is reported apart). Saves a PNG screenshot
# of each page. Skips (exit 0, one line) when chromium is not installed: it is ~350 MB, so scripts/setup.sh leaves it
# out; `apt-get install chromium` to run the check.
#
# Usage: tests/tools/graph_html_check.sh [TESSERA_BINARY] [OUT_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cli=${1:-$root/build/bin/tessera}
out=${2:-$root/build/graph_html_check}
budget_ms=2000

browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [ -z "$browser" ]; then
  echo "graph_html_check: skipped: chromium is not installed (apt-get install chromium)"
  exit 0
fi
[ -x "$cli" ] || { echo "graph_html_check: $cli is not an executable (build tessera_cli first)"; exit 1; }
mkdir -p "$out"
# A fresh profile per run: no state from an earlier run, no first-run dialogs.
profile_dir=$(mktemp -d)
trap 'rm -rf "$profile_dir"' EXIT
flags=(--headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$profile_dir" --enable-logging=stderr --v=0)

fail=0
check() {  # name, then the tessera graph arguments
  local name=$1; shift
  local html="$out/$name.html" json="$out/$name.json"
  "$cli" graph "$@" --format html -o "$html"
  "$cli" graph "$@" --format json -o "$json"
  local t0 t1
  t0=$(date +%s%N)
  "$browser" "${flags[@]}" --dump-dom "file://$html" >"$out/$name.dom" 2>"$out/$name.log" || true
  t1=$(date +%s%N)
  "$browser" "${flags[@]}" --window-size=1600,1000 --screenshot="$out/$name.png" "file://$html" \
    >/dev/null 2>>"$out/$name.log" || true
  python3 - "$name" "$json" "$out/$name.dom" "$out/$name.log" "$out/$name.png" "$(( (t1 - t0) / 1000000 ))" \
    "$budget_ms" <<'EOF' || fail=1
import json, re, sys
name, graph_json, dom_path, log_path, png, browser_ms, budget = sys.argv[1:8]
g = json.load(open(graph_json))
dom = open(dom_path, encoding="utf-8", errors="replace").read()
log = open(log_path, encoding="utf-8", errors="replace").read()
m = re.search(r"<html[^>]*>", dom)
attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(0))) if m else {}
layers = 1 + max(n["layer"] for n in g["nodes"])
problems = []
if attrs.get("ready") != "1":
    problems.append("the page's script did not finish (no data-ready)")
if "errors" in attrs or "Uncaught" in log:
    problems.append("JavaScript error: " + "; ".join(l for l in log.splitlines() if "Uncaught" in l)[:300])
if attrs.get("layers") != str(layers):
    problems.append(f"{attrs.get('layers')} layers drawn, {layers} expected")
if attrs.get("nodes") != str(len(g["nodes"])) or attrs.get("drawn-nodes") != str(len(g["nodes"])):
    problems.append(f"{attrs.get('drawn-nodes')} of {attrs.get('nodes')} nodes drawn, {len(g['nodes'])} expected")
render_ms = float(attrs.get("render-ms", "inf"))
loaded_ms = float(attrs.get("loaded-ms", "inf"))
if layers >= 32 and loaded_ms >= float(budget):
    problems.append(f"drawn {loaded_ms:.0f} ms after navigation start, over the {budget} ms budget")
try:
    with open(png, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            problems.append("the screenshot is no PNG")
except OSError:
    problems.append("no screenshot")
status = "ok" if not problems else "FAILED: " + "; ".join(problems)
print(f"graph_html_check: {name}: {layers} layers, {len(g['nodes'])} nodes, {attrs.get('drawn-edges')} edges; "
      f"drawn {loaded_ms:.0f} ms after navigation start (layout and drawing {render_ms:.0f} ms), browser run {browser_ms} ms (start-up included); {png}: {status}")
sys.exit(0 if not problems else 1)
EOF
}

check default
check llama3-8b --random-weights --arch llama3-8b
exit $fail
