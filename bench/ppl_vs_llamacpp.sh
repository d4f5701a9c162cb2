#!/usr/bin/env bash
# Side by side: llama.cpp's llama-perplexity and `tessera perplexity` on the same model, text, context, chunks and
# threads, run alternately (llama.cpp, tessera, llama.cpp, ...) so that both see the same machine state. Prints each
# run's PPL and times, then one line with the PPL difference (the correctness bound of issue 22 is 0.3%) and the
# speed ratio (median wall time of the whole command, loading and tokenizing included, and the evaluation alone).
#
# Usage: bench/ppl_vs_llamacpp.sh [-m MODEL] [-f TEXT] [-c 512] [--chunks 20] [-t 2] [--rounds 1] [--build DIR]
#                                 [-- EXTRA llama-perplexity ARGS]
#   MODEL  a GGUF file (default: the SmolLM2-135M Q4_1 model of scripts/fetch_model.sh)
#   TEXT   a UTF-8 file (default: the KJV of scripts/fetch_eval_text.sh)
#   DIR    the tessera build holding bin/tessera (default: build)
# llama-perplexity runs with its defaults (batch 2048: four 512-token chunks per pass; flash attention auto), as a
# llama.cpp user runs it; tessera with its own (one chunk at a time, batch = the context).
# Results belong in docs/PERFORMANCE.md and docs/QUALITY.md with the machine, the date and this command.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=""
text=""
ctx=512
chunks=20
threads=2
rounds=1
build=$root/build
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m) model=$2; shift 2 ;;
    -f) text=$2; shift 2 ;;
    -c) ctx=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "ppl_vs_llamacpp: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || model=$("$root/scripts/fetch_model.sh" | tail -1)
[ -n "$text" ] || text=$("$root/scripts/fetch_eval_text.sh" | tail -1)
bin=$("$root/scripts/build_llamacpp.sh" llama-perplexity | tail -1)
tessera=$build/bin/tessera
[ -x "$tessera" ] || { echo "ppl_vs_llamacpp: $tessera not built (cmake --build build --target tessera_cli)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

now() { date +%s.%N; }
# "PPL ERR" from a run's output ("Final estimate: PPL = 7.1901 +/- 0.16848").
final() { sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 \2/p' "$1" | tail -1; }

echo "model $model"
echo "text  $text ($(stat -c %s "$text") bytes), -c $ctx, --chunks $chunks, -t $threads, $rounds round(s)"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
lw=(); tw=(); le=(); te=()
for r in $(seq 1 "$rounds"); do
  t0=$(now)
  "$bin/llama-perplexity" -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" "${extra[@]}" \
    > "$tmp/l.txt" 2>&1 || { cat "$tmp/l.txt" >&2; exit 1; }
  t1=$(now)
  "$tessera" perplexity -m "$model" -f "$text" -c "$ctx" --chunks "$chunks" -t "$threads" > "$tmp/t.txt" 2> "$tmp/te.txt" ||
    { cat "$tmp/t.txt" "$tmp/te.txt" >&2; exit 1; }
  t2=$(now)
  lw+=("$(echo "$t1 - $t0" | bc -l)"); tw+=("$(echo "$t2 - $t1" | bc -l)")
  # llama.cpp's evaluation: from its log's time stamps (M.SS.mmm.uuu), "calculating perplexity" to "Final estimate";
  # tessera's: its "N tokens (K chunks) in S s" line.
  le+=("$(awk '/calculating perplexity|Final estimate/ { split($1, t, "."); s[++n] = t[1] * 60 + t[2] + t[3] / 1e3 }
              END { print s[2] - s[1] }' "$tmp/l.txt")")
  te+=("$(sed -n 's/^perplexity: [0-9]* tokens ([0-9]* chunks\?) in \([0-9.]*\) s.*/\1/p' "$tmp/te.txt" | tail -1)")
  read -r lp le_err <<<"$(final "$tmp/l.txt")"
  read -r tp te_err <<<"$(final "$tmp/t.txt")"
  printf 'round %d: llama.cpp PPL %s +/- %s, %.2f s (eval %.2f s); tessera PPL %s +/- %s, %.2f s (eval %.2f s)\n' "$r" \
    "$lp" "$le_err" "${lw[-1]}" "${le[-1]:-0}" "$tp" "$te_err" "${tw[-1]}" "${te[-1]:-0}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mlw=$(median "${lw[@]}"); mtw=$(median "${tw[@]}"); mle=$(median "${le[@]}"); mte=$(median "${te[@]}")
tokens=$((ctx * chunks))
awk -v lp="$lp" -v tp="$tp" -v lw="$mlw" -v tw="$mtw" -v le="$mle" -v te="$mte" -v n="$tokens" 'BEGIN {
  printf "PPL: llama.cpp %.4f, tessera %.4f: tessera %+.3f%%\n", lp, tp, 100 * (tp - lp) / lp
  printf "wall (median): llama.cpp %.2f s, tessera %.2f s: tessera %.2fx as fast\n", lw, tw, lw / tw
  printf "evaluation (median): llama.cpp %.2f s (%.0f tok/s), tessera %.2f s (%.0f tok/s): tessera %.2fx as fast\n",
         le, n / le, te, n / te, le / te
}'
