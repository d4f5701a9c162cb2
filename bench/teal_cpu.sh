#!/usr/bin/env bash
# TEAL on the CPU: decode speed dense vs --sparsity S (top-k per token) or --teal FILE (calibrated thresholds),
# alternating runs so a busy machine slows both alike, and the median of the pairwise ratios (docs/TEAL.md). Usage:
#   bench/teal_cpu.sh [-m MODEL] [-s SPARSITY | -f TEAL_FILE] [-t THREADS] [-n TOKENS] [-k PAIRS] [-b TESSERA_BINARY]
# The load average is printed before and after: on a shared machine quote it with the ratio.
set -euo pipefail
MODEL=""
S=0.5
T=2
N=64
K=7
FILE=""
BIN="$(dirname "$0")/../build/bin/tessera"
while getopts "m:s:f:t:n:k:b:" o; do
  case $o in
    m) MODEL=$OPTARG ;;
    s) S=$OPTARG ;;
    f) FILE=$OPTARG ;;
    t) T=$OPTARG ;;
    n) N=$OPTARG ;;
    k) K=$OPTARG ;;
    b) BIN=$OPTARG ;;
    *) exit 2 ;;
  esac
done
args=(bench -p 0 -n "$N" -r 3 -t "$T" --json)
[ -n "$MODEL" ] && args+=(-m "$MODEL")
tok_s() { "$BIN" "${args[@]}" "$@" 2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print(r["tok_s"], r.get("achieved_sparsity", 0))'; }
if [ -n "$FILE" ]; then
  flag=(--teal "$FILE")
else
  flag=(--sparsity "$S")
fi
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
ratios=()
for i in $(seq 1 "$K"); do
  read -r d _ < <(tok_s)
  read -r s a < <(tok_s "${flag[@]}")
  r=$(python3 -c "print(f'{$s / $d:.3f}')")
  ratios+=("$r")
  echo "pair $i: dense $d tok/s, ${flag[*]} $s tok/s (achieved $a), ratio $r"
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 -c "import statistics,sys; v=[float(x) for x in sys.argv[1:]]; print(f'median ratio {statistics.median(v):.3f} over {len(v)} pairs (min {min(v):.3f}, max {max(v):.3f})')" "${ratios[@]}"
