#!/usr/bin/env bash
# q5_0, q5_1, iq4_nl and iq4_xs against llama.cpp on the default model made into each format by llama-quantize:
#   1. the files: SmolLM2-135M-Instruct.<TYPE>-from-Q4_1.gguf next to the default model (llama-quantize
#      --allow-requantize; "-pure" files with --pure, every matrix in the one type: llama-quantize's IQ4_NL mix puts
#      q5_K in some ffn_down, and iq4_xs falls back to iq4_nl where a row is not whole 256-element super-blocks);
#   2. greedy text: llama-simple and `tessera run --temp 0` on a few prompts, same text or where it parts; and
#      teacher-forced top-1: llama.cpp's logits (python/llamacpp_logits.cpp) and `tessera logits` at every position of
#      one prose passage, the share of positions whose argmax agree (greedy text parts at the first near-tie, so
#      this is the steadier measure; tessera --reference, f32 activations, is shown beside it);
#   3. speed: llama-bench and `tessera bench` (pp, tg; f16 KV, one batch of the whole prompt) alternating per file and
#      round on the same machine state, and per test the median over rounds of the ratio tessera / llama.cpp of that
#      round's medians (pairwise, so a busy spell of the shared machine moves both sides of a ratio).
# Usage: bench/q5iq4_vs_llamacpp.sh [-t THREADS] [-p 512] [-n 128] [-r 5] [--rounds 3] [--build DIR] [--no-greedy]
#                                   [--no-bench] [TYPE ...]
#   TYPE default: Q4_1 Q5_0 Q5_1 IQ4_NL IQ4_NL-pure IQ4_XS-pure (a file Tessera cannot load is skipped with its error)
# Needs the llama.cpp build of scripts/build_llamacpp.sh (llama-quantize, llama-simple, llama-bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=2
n_prompt=512
n_gen=128
repeats=5
rounds=3
build=$root/build
greedy=1
bench=1
types=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads=$2; shift 2 ;;
    -p) n_prompt=$2; shift 2 ;;
    -n) n_gen=$2; shift 2 ;;
    -r) repeats=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --no-greedy) greedy=0; shift ;;
    --no-bench) bench=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "q5iq4_vs_llamacpp: unknown argument '$1' (see --help)" >&2; exit 1 ;;
    *) types+=("$1"); shift ;;
  esac
done
[ ${#types[@]} -gt 0 ] || types=(Q4_1 Q5_0 Q5_1 IQ4_NL IQ4_NL-pure IQ4_XS-pure)
tessera=$build/bin/tessera
[ -x "$tessera" ] || { echo "q5iq4_vs_llamacpp: $tessera not found; build the tessera_cli target" >&2; exit 1; }
bin=$("$root/scripts/build_llamacpp.sh" llama-bench | tail -1)
models=${TESSERA_HOME:-$HOME/.cache/tessera/models}
base=$models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$base" ] || { echo "q5iq4_vs_llamacpp: $base not found (scripts/fetch_model.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

file_of() {  # TYPE -> the model file, made on first use
  local t=$1 f
  if [ "$t" = Q4_1 ]; then echo "$base"; return; fi
  f=$models/SmolLM2-135M-Instruct.$t-from-Q4_1.gguf
  if [ ! -f "$f" ]; then
    local pure=()
    [[ "$t" == *-pure ]] && pure=(--pure)
    echo "q5iq4_vs_llamacpp: llama-quantize ${pure[*]} $base -> ${t%-pure}" >&2
    "$bin/llama-quantize" --allow-requantize "${pure[@]}" "$base" "$f" "${t%-pure}" > "$tmp/quantize.log" 2>&1 ||
      { tail -5 "$tmp/quantize.log" >&2; exit 1; }
  fi
  echo "$f"
}

readable=()
for t in "${types[@]}"; do
  f=$(file_of "$t")
  if "$tessera" run -m "$f" -p "Hi" -n 1 --temp 0 --no-stats -t "$threads" > /dev/null 2> "$tmp/load.log"; then
    readable+=("$t")
  else
    echo "q5iq4_vs_llamacpp: $t skipped: $(grep -m1 error "$tmp/load.log")" >&2
  fi
done

if [ "$greedy" = 1 ]; then
  echo "## greedy text (32 tokens): llama-simple vs tessera run --temp 0"
  prompts=("The capital of France is" "Once upon a time, there was a little" "def fibonacci(n):")
  for t in "${readable[@]}"; do
    f=$(file_of "$t")
    for p in "${prompts[@]}"; do
      # llama-simple prints the prompt and then the continuation; tessera run prints the continuation.
      "$bin/llama-simple" -m "$f" -n 32 "$p" 2> /dev/null > "$tmp/l.txt" || true
      "$tessera" run -m "$f" -p "$p" -n 32 --temp 0 --no-stats -t "$threads" 2> /dev/null > "$tmp/t.txt"
      python3 - "$t" "$p" "$tmp/l.txt" "$tmp/t.txt" <<'PY'
import sys
t, p, lf, tf = sys.argv[1:]
l = open(lf, encoding="utf-8", errors="replace").read()
l = l[len(p):] if l.startswith(p) else l
o = open(tf, encoding="utf-8", errors="replace").read()
l, o = l.rstrip("\n"), o.rstrip("\n")
n = min(len(l), len(o))
i = next((k for k in range(n) if l[k] != o[k]), n)
verdict = "same" if l == o else f"parts at char {i}: llama.cpp {l[i:i+24]!r} / tessera {o[i:i+24]!r}"
print(f"| {t:<12} | {p[:24]:<24} | {verdict} |")
PY
    done
  done
fi

if [ "$greedy" = 1 ]; then
  src=$(dirname "$(dirname "$bin")")/src
  lb=$(dirname "$bin")
  g++ -O2 -std=c++17 -I "$src/include" -I "$src/ggml/include" "$root/python/llamacpp_logits.cpp" "$lb/src/libllama.a" \
    "$lb/ggml/src/libggml.a" "$lb/ggml/src/libggml-cpu.a" "$lb/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl \
    -o "$tmp/llamacpp_logits"
  text="The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable \
metal type, oil-based inks and a wooden press adapted from those used for wine. Books that had taken a scribe months \
to copy could now be produced in days, and within fifty years presses were working in more than two hundred European \
towns. The spread of cheap pamphlets changed how ideas travelled: scholars corresponded across borders, merchants \
printed price lists, and religious reformers reached readers who had never owned a book."
  "$bin/llama-tokenize" -m "$base" -p "$text" --ids --log-disable 2> /dev/null | tr -d '[] ' > "$tmp/ids.csv"
  tr ',' ' ' < "$tmp/ids.csv" > "$tmp/ids.txt"
  echo
  echo "## teacher-forced top-1 agreement with llama.cpp over $(tr ',' '\n' < "$tmp/ids.csv" | wc -l) positions"
  echo "| file         | tessera | tessera --reference |"
  echo "|--------------|---------|---------------------|"
  for t in "${readable[@]}"; do
    f=$(file_of "$t")
    "$tmp/llamacpp_logits" "$f" "$tmp/ids.txt" 0 "$tmp/llama.bin" "$threads" > /dev/null 2>&1
    "$tessera" logits -m "$f" --ids "$(cat "$tmp/ids.csv")" -o "$tmp/t.npy" -t "$threads" > /dev/null 2>&1
    "$tessera" logits -m "$f" --ids "$(cat "$tmp/ids.csv")" -o "$tmp/r.npy" -t "$threads" --reference > /dev/null 2>&1
    "$root/.venv/bin/python" - "$t" "$tmp" <<'PY'
import sys
import numpy as np
t, tmp = sys.argv[1:]
raw = open(f"{tmp}/llama.bin", "rb").read()
n_prompt, n_vocab = np.frombuffer(raw[:8], dtype="<i4")
ref = np.frombuffer(raw[8:8 + 4 * n_prompt * n_vocab], dtype="<f4").reshape(n_prompt, n_vocab)
ours, f32 = np.load(f"{tmp}/t.npy"), np.load(f"{tmp}/r.npy")
agree = lambda a: f"{100 * np.mean(a.argmax(-1) == ref.argmax(-1)):.1f}%"
print(f"| {t:<12} | {agree(ours):>7} | {agree(f32):>19} |")
PY
  done
fi

[ "$bench" = 1 ] || exit 0
for i in $(seq 1 "$rounds"); do
  for t in "${readable[@]}"; do
    f=$(file_of "$t")
    echo "q5iq4_vs_llamacpp: round $i/$rounds $t: llama-bench, tessera bench" >&2
    "$bin/llama-bench" -m "$f" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$repeats" -b "$n_prompt" -ub "$n_prompt" \
      -ctk f16 -ctv f16 -o json > "$tmp/llama_${t}_$i.json" 2> "$tmp/llama.log" || { cat "$tmp/llama.log" >&2; exit 1; }
    "$tessera" bench -m "$f" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$repeats" --ubatch "$n_prompt" --kv-type f16 \
      --no-ceilings --json > "$tmp/tessera_${t}_$i.json" 2> "$tmp/tessera.log" ||
      { cat "$tmp/tessera.log" >&2; exit 1; }
  done
done

python3 - "$tmp" "$rounds" "$threads" "$(nproc)" "${readable[@]}" <<'PY'
import datetime, json, statistics, sys
tmp, rounds, threads, cores, types = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
med = statistics.median
print(f"\n## speed: {threads} threads on {cores} cores, {rounds} alternating rounds, "
      f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
print("| file         | test  | llama.cpp tok/s | tessera tok/s | tessera/llama.cpp (median of round ratios) | "
      "round ratios |")
print("|--------------|-------|-----------------|---------------|-----|-----|")
for t in types:
    per = {}
    for i in range(1, rounds + 1):
        l = {}
        for r in json.load(open(f"{tmp}/llama_{t}_{i}.json")):
            l["pp" if r["n_gen"] == 0 else "tg"] = r["samples_ts"]
        for r in json.load(open(f"{tmp}/tessera_{t}_{i}.json")):
            test = r["test"][:2]
            if test in l:
                per.setdefault(test, []).append((med(l[test]), med(r["samples_tok_s"])))
    for test in ("pp", "tg"):
        pairs = per.get(test, [])
        if not pairs:
            continue
        ratios = [b / a for a, b in pairs]
        print(f"| {t:<12} | {test:<5} | {med(a for a, _ in pairs):15.1f} | {med(b for _, b in pairs):13.1f} | "
              f"{med(ratios):.2f}x | {' '.join(f'{x:.2f}' for x in ratios)} |")
PY
