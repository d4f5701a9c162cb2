#!/usr/bin/env bash
# Side by side: llama.cpp's llama-bench and `tessera bench` on the same model, threads, prompt and generation
# lengths, run alternately (llama.cpp, tessera, llama.cpp, ...) so that both see the same machine state; then a ratio
# table with both peers' achieved GB/s (decode) and TFLOP/s (prefill) as a share of the limits measured in the same run.
#
# Usage: bench/compare_llamacpp.sh [-m MODEL | --arch NAME [--dtype D]] [-t THREADS] [-p 512] [-n 128] [-r 5]
#                                  [--rounds 3] [-b BATCH] [--build DIR] [--base DIR] [--json OUT] [--no-ceilings]
#   MODEL   a GGUF file (default: the SmolLM2-135M Q4_1 model of scripts/fetch_model.sh)
#   --arch  a synthetic model preset (tessera bench --list-archs), written once to a temporary GGUF that both
#           engines load, so sizes no offline file offers can be compared (dtype default q4_0)
#   DIR     the tessera build holding bin/tessera (default: build)
#   --base  a second tessera build (e.g. the previous commit's) run in every round beside the first, so that a
#           regression check against the previous commit and llama.cpp share one run; its ratio to DIR is printed
#   OUT     all samples and the table as JSON, for python/plot_bench.py
# llama.cpp comes from scripts/build_llamacpp.sh (built once from the llama-cpp-python sdist, then cached).
# Results belong in docs/PERFORMANCE.md with the device, the date and this command.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=""
arch=""
dtype=q4_0
threads=2
n_prompt=512
n_gen=128
repeats=5
rounds=3
batch=512
build=$root/build
json_out=""
base_build=""
ceilings=1
while [ $# -gt 0 ]; do
  case "$1" in
    -m) model=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    -p) n_prompt=$2; shift 2 ;;
    -n) n_gen=$2; shift 2 ;;
    -r) repeats=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -b) batch=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --base) base_build=$2; shift 2 ;;
    --json) json_out=$2; shift 2 ;;
    --no-ceilings) ceilings=0; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "compare_llamacpp: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
tessera=$build/bin/tessera
[ -x "$tessera" ] || { echo "compare_llamacpp: $tessera not found; build the tessera_cli target in $build" >&2; exit 1; }
if [ -n "$base_build" ]; then
  [ -x "$base_build/bin/tessera" ] || { echo "compare_llamacpp: $base_build/bin/tessera not found" >&2; exit 1; }
fi
bin=$("$root/scripts/build_llamacpp.sh" llama-bench | tail -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -n "$arch" ]; then
  [ -z "$model" ] || { echo "compare_llamacpp: give -m or --arch, not both" >&2; exit 1; }
  model=$tmp/$arch-$dtype.gguf
  echo "compare_llamacpp: writing a random $arch ($dtype) to $model" >&2
  "$tessera" bench --arch "$arch" --random-weights --dtype "$dtype" --write-model "$model" > /dev/null
fi
[ -n "$model" ] || model=${TESSERA_MODEL:-${TESSERA_HOME:-$HOME/.cache/tessera/models}/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || { echo "compare_llamacpp: model $model not found (scripts/fetch_model.sh fetches the default)" >&2; exit 1; }

# The same work: same tests, threads, prefill chunk (llama.cpp's n_batch and n_ubatch = tessera's --ubatch), f16 KV.
for i in $(seq 1 "$rounds"); do
  echo "compare_llamacpp: round $i/$rounds: llama-bench" >&2
  "$bin/llama-bench" -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$repeats" -b "$batch" -ub "$batch" \
    -ctk f16 -ctv f16 -o json > "$tmp/llama_$i.json" 2> "$tmp/llama_$i.log" ||
    { cat "$tmp/llama_$i.log" >&2; exit 1; }
  echo "compare_llamacpp: round $i/$rounds: tessera bench" >&2
  "$tessera" bench -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$repeats" --ubatch "$batch" --kv-type f16 \
    --no-ceilings --json > "$tmp/tessera_$i.json" 2> "$tmp/tessera_$i.log" ||
    { cat "$tmp/tessera_$i.log" >&2; exit 1; }
  if [ -n "$base_build" ]; then
    echo "compare_llamacpp: round $i/$rounds: tessera bench ($base_build)" >&2
    "$base_build/bin/tessera" bench -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$repeats" --ubatch "$batch" \
      --kv-type f16 --no-ceilings --json > "$tmp/base_$i.json" 2> "$tmp/base_$i.log" ||
      { cat "$tmp/base_$i.log" >&2; exit 1; }
  fi
done
echo '[]' > "$tmp/ceilings.json"
if [ "$ceilings" = 1 ]; then
  echo "compare_llamacpp: measuring the limits" >&2
  "$tessera" bench --ceilings --json -t "$threads" -r "$repeats" > "$tmp/ceilings.json" 2> /dev/null
fi

python3 - "$tmp" "$rounds" "$model" "$threads" "$json_out" "$base_build" <<'PY'
import datetime, json, os, statistics, sys
tmp, rounds, model, threads, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
base_build = sys.argv[6]
llama, ours, base = {}, {}, {}
info = {}
for i in range(1, rounds + 1):
    for r in json.load(open(f"{tmp}/llama_{i}.json")):
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        llama.setdefault(test, []).extend(r["samples_ts"])
    for r in json.load(open(f"{tmp}/tessera_{i}.json")):
        ours.setdefault(r["test"], []).extend(r["samples_tok_s"])
        info[r["test"]] = r
    if base_build:
        for r in json.load(open(f"{tmp}/base_{i}.json")):
            base.setdefault(r["test"], []).extend(r["samples_tok_s"])
ceil = json.load(open(f"{tmp}/ceilings.json"))
read_gbps = next((c["gbps"] for c in ceil if c["kind"] == "bandwidth" and c["name"] == "read"), None)
def gemm_tflops(dtype):
    return next((c["tflops"] for c in ceil if c["kind"] == "gemm" and c["kernel"] == "tessera" and c["dtype"] == dtype), None)

def spread(v):
    return statistics.stdev(v) if len(v) > 1 else 0.0

rows = []
for test in sorted(set(llama) & set(ours), key=lambda t: (t[:2] != "pp", t)):
    r = info[test]
    tokens = r["n_prompt"] + r["n_gen"]
    lt, tt = statistics.median(llama[test]), statistics.median(ours[test])
    row = {"test": test, "llamacpp_tok_s": lt, "llamacpp_tok_s_stddev": spread(llama[test]),
           "llamacpp_samples": llama[test], "tessera_tok_s": tt, "tessera_tok_s_stddev": spread(ours[test]),
           "tessera_samples": ours[test], "ratio": tt / lt if lt > 0 else None}
    # Same work for both engines: the bytes and FLOPs of one run come from tessera's graph.
    if test.startswith("tg"):
        limit, unit = read_gbps, "GB/s"
        per = r["weight_bytes_per_run"] / tokens / 1e9
    else:
        limit, unit = gemm_tflops(r["weight_dtype"] if r["weight_dtype"] in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1") else "f16"), "TFLOP/s"
        per = r["flops_per_run"] / tokens / 1e12
    row.update({"unit": unit, "llamacpp_rate": lt * per, "tessera_rate": tt * per, "limit": limit})
    if test in base:
        bt = statistics.median(base[test])
        row.update({"base_tok_s": bt, "base_tok_s_stddev": spread(base[test]), "base_samples": base[test],
                    "base_ratio": bt / lt if lt > 0 else None, "tessera_over_base": tt / bt if bt > 0 else None})
    rows.append(row)

first = next(iter(info.values()))
now = datetime.datetime.now(datetime.timezone.utc)
print(f"model {model} ({first['weight_dtype']} matmuls), {threads} threads, batch {first['n_batch']}, "
      f"{rounds} alternating rounds x {first['repeats']} repeats, {now:%Y-%m-%d %H:%M} UTC")
print(f"| {'test':<7} | {'llama.cpp tok/s':>18} | {'tessera tok/s':>18} | {'tessera/llama.cpp':>17} | {'unit':<7} | "
      f"{'llama.cpp rate':>15} | {'tessera rate':>15} | {'limit':>8} |")
print(f"|{'-'*9}|{'-'*20}|{'-'*20}|{'-'*19}|{'-'*9}|{'-'*17}|{'-'*17}|{'-'*10}|")
for w in rows:
    lim = w["limit"]
    rate = lambda v: f"{v:.3f}" + (f" ({100 * v / lim:.0f}%)" if lim else "")
    print(f"| {w['test']:<7} | {w['llamacpp_tok_s']:>9.2f} ± {w['llamacpp_tok_s_stddev']:<6.2f} | "
          f"{w['tessera_tok_s']:>9.2f} ± {w['tessera_tok_s_stddev']:<6.2f} | {w['ratio']:>16.2f}x | {w['unit']:<7} | "
          f"{rate(w['llamacpp_rate']):>15} | {rate(w['tessera_rate']):>15} | {(f'{lim:.3f}' if lim else '-'):>8} |")
if base:
    print(f"base build {base_build}, run in the same rounds:")
    print(f"| {'test':<7} | {'base tok/s':>18} | {'base/llama.cpp':>15} | {'tessera/base':>13} |")
    print(f"|{'-'*9}|{'-'*20}|{'-'*17}|{'-'*15}|")
    for w in rows:
        if "base_tok_s" in w:
            print(f"| {w['test']:<7} | {w['base_tok_s']:>9.2f} ± {w['base_tok_s_stddev']:<6.2f} | "
                  f"{w['base_ratio']:>14.2f}x | {w['tessera_over_base']:>12.3f}x |")
print("rates: GB/s of weight bytes for tg, TFLOP/s for pp; limit: measured read bandwidth (tg), tessera's GEMM (pp)")
if out_path:
    json.dump({"model": model, "threads": threads, "rounds": rounds, "rows": rows, "ceilings": ceil, "base": base_build,
               "date": now.isoformat()}, open(out_path, "w"), indent=2)
PY
