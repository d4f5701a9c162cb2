#!/usr/bin/env bash
# The K-quant files most people download, made from the default model with llama.cpp's own llama-quantize, run by
# llama-bench and `tessera bench` alternately (llama.cpp, tessera, llama.cpp, ...), and a teacher-forced greedy check:
# llama.cpp's greedy continuations (llama-simple, three prompts) fed to `tessera logits`, whose argmax should agree at
# every generated position; a disagreement is printed with its logit margin (a near-tie of the two engines' roundings,
# as the default Q4_1 file shows at a few positions too, or a bug when the margin is large).
# Prints per file and test the median of the pairwise ratios (tessera / llama.cpp tok/s of the same round), which
# cancels most of a busy machine's drift between rounds.
#
# Usage: bench/kquant_vs_llamacpp.sh [-m MODEL] [--types "Q4_K_M Q5_K_M Q6_K"] [-f FILE]... [-t 2] [-p 512] [-n 128]
#                                    [-r 5] [--rounds 3] [--build DIR] [--out DIR] [--no-check]
#   MODEL  the source GGUF (default: the SmolLM2-135M Q4_1 model of scripts/fetch_model.sh); requantized with
#          llama-quantize --allow-requantize into OUT/<name>.<TYPE>.gguf (kept, made once)
#   FILE   a GGUF to compare as it is, instead of the --types (repeatable), e.g. a random model whose rows are whole
#          super-blocks: tessera bench --arch tinyllama-1.1b --random-weights --dtype q4_k --layers 4 --write-model F
#   DIR    the tessera build holding bin/tessera (default: build)
# SmolLM2-135M's rows of 576 are not whole 256-element super-blocks, so llama-quantize gives only its ffn_down
# (k = 1536) K-quants and falls back to q5_0 / q5_1 / q8_0 elsewhere: a Q4_K_M file of it needs those formats too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=""
types="Q4_K_M Q5_K_M Q6_K"
threads=2
n_prompt=512
n_gen=128
repeats=5
rounds=3
build=$root/build
out=${TMPDIR:-/tmp}/tessera-kquant
check=1
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m) model=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    -f) files+=("$2"); shift 2 ;;
    -t) threads=$2; shift 2 ;;
    -p) n_prompt=$2; shift 2 ;;
    -n) n_gen=$2; shift 2 ;;
    -r) repeats=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-check) check=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "kquant_vs_llamacpp: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
tessera=$build/bin/tessera
[ -x "$tessera" ] || { echo "kquant_vs_llamacpp: $tessera not found; build the tessera_cli target in $build" >&2; exit 1; }
bin=$("$root/scripts/build_llamacpp.sh" llama-bench llama-quantize llama-simple llama-tokenize | tail -1)
[ -n "$model" ] || model=${TESSERA_MODEL:-${TESSERA_HOME:-$HOME/.cache/tessera/models}/SmolLM2-135M-Instruct.Q4_1.gguf}
# The source model is read only to make the --types files: given files (-f) need none.
[ ${#files[@]} -gt 0 ] || [ -f "$model" ] ||
  { echo "kquant_vs_llamacpp: model $model not found (scripts/fetch_model.sh fetches it)" >&2; exit 1; }
py=$root/.venv/bin/python  # numpy, for the greedy check
[ -x "$py" ] || py=python3
mkdir -p "$out"
base=$(basename "$model" .gguf)
base=${base%.*}  # SmolLM2-135M-Instruct.Q4_1 -> SmolLM2-135M-Instruct

echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M') UTC"
if [ ${#files[@]} -gt 0 ]; then
  set -- "${files[@]}"
else
  set --
  for type in $types; do set -- "$@" "$out/$base.$type.gguf"; done
fi
for file in "$@"; do
  type=$(basename "$file" .gguf)
  type=${type##*.}  # SmolLM2-135M-Instruct.Q4_K_M -> Q4_K_M; tinyllama-4l-q4_k -> tinyllama-4l-q4_k
  if [ ! -f "$file" ]; then
    "$bin/llama-quantize" --allow-requantize "$model" "$file" "$type" > "$out/$base.$type.quantize.log" 2>&1 ||
      { tail -5 "$out/$base.$type.quantize.log" >&2; exit 1; }
  fi
  if [ "$check" = 1 ]; then
    "$py" - "$file" "$tessera" "$bin" <<'PY'
import json, os, subprocess, sys
import numpy as np
model, tessera, bin_dir = sys.argv[1:4]
def tokens(s):
    r = subprocess.run([f"{bin_dir}/llama-tokenize", "-m", model, "-p", s, "--ids", "--log-disable"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])
for prompt in ("The capital of France is", "Once upon a time", "def fibonacci(n):"):
    text = subprocess.run([f"{bin_dir}/llama-simple", "-m", model, "-n", "64", prompt], capture_output=True,
                          text=True, check=True).stdout
    text = text[:-1] if text.endswith("\n") else text  # llama-simple ends its output with a newline of its own
    p_ids, ids = tokens(prompt), tokens(text)
    assert ids[:len(p_ids)] == p_ids, "the continuation does not retokenize after the prompt"
    npy = model + ".logits.npy"
    subprocess.run([tessera, "logits", "-m", model, "--ids", ",".join(map(str, ids)), "-o", npy, "-t", "2", "-q"],
                   check=True)
    logits = np.load(npy)
    diff = [(i, ids[i + 1], int(logits[i].argmax()), float(logits[i].max() - logits[i][ids[i + 1]]))
            for i in range(len(p_ids) - 1, len(ids) - 1) if int(logits[i].argmax()) != ids[i + 1]]
    gen = len(ids) - len(p_ids)
    print(f"greedy {os.path.basename(model)} '{prompt}': {gen - len(diff)} of {gen} llama.cpp tokens are tessera's "
          "argmax" + "".join(f"; position {i}: llama.cpp {w}, tessera {g} (margin {m:.3f})" for i, w, g, m in diff))
PY
  fi
  for i in $(seq 1 "$rounds"); do
    echo "round $i $type: load $(cut -d' ' -f1 /proc/loadavg)" >&2
    "$bin/llama-bench" -m "$file" -p "$n_prompt" -n "$n_gen" -t "$threads" -r "$repeats" -o json \
      > "$out/llama_${type}_$i.json" 2> "$out/llama_${type}_$i.log" || { cat "$out/llama_${type}_$i.log" >&2; exit 1; }
    "$tessera" bench -m "$file" -p "$n_prompt" -n "$n_gen" -t "$threads" -r "$repeats" --json \
      > "$out/tessera_${type}_$i.json" 2> "$out/tessera_${type}_$i.log" || { cat "$out/tessera_${type}_$i.log" >&2; exit 1; }
  done
  python3 - "$out" "$type" "$rounds" <<'PY'
import json, statistics, sys
out, type_, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
per = {}
for i in range(1, rounds + 1):
    llama = {(f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"): r["avg_ts"]
             for r in json.load(open(f"{out}/llama_{type_}_{i}.json"))}
    ours = {r["test"]: r["tok_s"] for r in json.load(open(f"{out}/tessera_{type_}_{i}.json"))}
    for test in sorted(set(llama) & set(ours)):
        per.setdefault(test, []).append((llama[test], ours[test]))
for test, pairs in sorted(per.items(), key=lambda kv: (kv[0][:2] != "pp", kv[0])):
    ratios = [t / l for l, t in pairs]
    print(f"{type_:<7} {test:<6} llama.cpp {' '.join(f'{l:8.1f}' for l, _ in pairs)} tok/s | tessera "
          f"{' '.join(f'{t:8.1f}' for _, t in pairs)} tok/s | ratio per round {' '.join(f'{r:.2f}' for r in ratios)}"
          f" | median {statistics.median(ratios):.2f}x")
PY
done
