#!/usr/bin/env bash
# Ternary GGUFs (every matrix TQ2_0 or TQ1_0, random weights at a real ternary model's shapes, written by `tessera bench
# --arch A --random-weights --dtype D --write-model F`) run by llama-bench and `tessera bench` alternately
# (llama.cpp, tessera, llama.cpp, ...) on the same file and threads. Prints per file and test the median of the
# pairwise ratios (tessera / llama.cpp tok/s of the same round), which cancels most of a busy machine's drift.
#
# Usage: bench/ternary_vs_llamacpp.sh [--archs "mmfreelm-370m-llama bitnet-2b4t-llama"] [--dtypes "tq2_0 tq1_0"]
#                                     [-f FILE]... [-t 2] [-p 512] [-n 128] [-r 3] [--rounds 3] [--build DIR] [--out DIR]
#   --archs   `tessera bench --list-archs` presets; each file is OUT/<arch>-<dtype>.gguf (kept, written once)
#   FILE      a GGUF to compare as it is, instead of the presets (repeatable)
#   DIR       the tessera build holding bin/tessera (default: build)
# The 2B4T shape at pp512 takes minutes a round on two busy cores: pass smaller -p / -n (and say so with the figures).
# Both engines quantize activations to 8 bits (llama.cpp: q8_K per 256 for TQ1_0/TQ2_0; tessera: 8-bit per 32); the
# random weights make the tokens meaningless, so this measures speed only (correctness: tests/quant, tests/ops).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archs="mmfreelm-370m-llama bitnet-2b4t-llama"
dtypes="tq2_0 tq1_0"
threads=2
n_prompt=512
n_gen=128
repeats=3
rounds=3
build=$root/build
out=${TMPDIR:-/tmp}/tessera-ternary
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --archs) archs=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    -f) files+=("$2"); shift 2 ;;
    -t) threads=$2; shift 2 ;;
    -p) n_prompt=$2; shift 2 ;;
    -n) n_gen=$2; shift 2 ;;
    -r) repeats=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "ternary_vs_llamacpp: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
tessera=$build/bin/tessera
[ -x "$tessera" ] || { echo "ternary_vs_llamacpp: $tessera not found; build the tessera_cli target in $build" >&2; exit 1; }
mkdir -p "$out"

if [ ${#files[@]} -gt 0 ]; then
  set -- "${files[@]}"
else
  set --
  for arch in $archs; do
    for dtype in $dtypes; do
      file=$out/$arch-$dtype.gguf
      if [ ! -f "$file" ]; then
        "$tessera" bench --arch "$arch" --random-weights --dtype "$dtype" --write-model "$file.tmp" > "$out/write.log" 2>&1 ||
          { tail -5 "$out/write.log" >&2; exit 1; }
        mv "$file.tmp" "$file"
      fi
      set -- "$@" "$file"
    done
  done
fi
# The rounds and their table are kquant_vs_llamacpp.sh's, on these files (no greedy check: random weights).
args=()
for file in "$@"; do args+=(-f "$file"); done
exec "$root/bench/kquant_vs_llamacpp.sh" "${args[@]}" --no-check -t "$threads" -p "$n_prompt" -n "$n_gen" \
  -r "$repeats" --rounds "$rounds" --build "$build" --out "$out"
