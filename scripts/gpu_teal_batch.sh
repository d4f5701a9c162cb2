#!/usr/bin/env bash
# TEAL in batched decode on CUDA (issue 23: "union of the rows' masks or dense, whichever measures faster"), end to
# end on the random Llama-3-8B bf16 model: tessera bench --parallel B, top-k at each of --sparsities and calibrated
# thresholds (--teal) at each of --teal, with the two-row union walk (--cuda teal_union=1, the default) and with the
# dense matmul on the zeroed rows (teal_union=0), against the dense model at B rows and, for the calibrated runs, one
# row (dense and --teal), all in one run on one machine. Prints one line per run (also $OUT/teal_batch.md); the full
# output goes to $OUT/teal_batch.log.
#
# On the GPU machine, from the binaries built here (TESSERA_PREBUILT_EXTRA="bin/tessera_bench_sparse"
# scripts/make_gpu_bundle.sh --prebuilt build; carry .gpu-deps):
#   root=$PWD; . scripts/gpu_env.sh; gpu_env; gpu_prebuilt; scripts/gpu_teal_batch.sh [--parallel "2 4"]
#     [--sparsities "0.5 0.4"] [--teal "0.5 0.4"] [--unions "0 1"] [-n 64] [-r 3]
# ~1 minute to write the 16 GB model (skipped where /tmp holds it), ~1.5 minutes per calibration (CPU, 32 tokens of
# README.md), then ~12 s a run.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
parallel="2"
sparsities="0.5 0.4"
unions="0 1"
teal=""
tokens=64
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    --parallel) parallel="$2"; shift 2 ;;
    --sparsities) sparsities="$2"; shift 2 ;;
    --unions) unions="$2"; shift 2 ;;
    --teal) teal="$2"; shift 2 ;;
    -n) tokens="$2"; shift 2 ;;
    -r) repeats="$2"; shift 2 ;;
    *) echo "gpu_teal_batch: unknown option $1" >&2; exit 2 ;;
  esac
done
bin="$root/build-pre/bin"
[ -x "$bin/tessera" ] || bin="$root/build-gpu/bin"
[ -x "$bin/tessera" ] || { echo "gpu_teal_batch: no tessera binary (gpu_prebuilt first)" >&2; exit 1; }
summary="$OUT/teal_batch.md"
log="$OUT/teal_batch.log"
: > "$summary"
: > "$log"
say() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
say "# gpu_teal_batch $(date -u +%Y-%m-%dT%H:%M:%SZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
f=/tmp/gpu_teal_batch_8b_bf16.gguf
if [ ! -s "$f" ] && ! timeout 200 "$bin/tessera" bench --arch llama3-8b --random-weights --dtype bf16 \
    --write-model "$f" >> "$log" 2>&1; then
  say "could not write the random 8B model (see $log)"
  exit 1
fi
say "model written ($(( $(date +%s) - t0 ))s); tessera bench --device cuda -m <random llama3-8b bf16> -p 16 -n $tokens -r $repeats --parallel B"
status=0
run() {  # label, then bench arguments
  local label=$1
  shift
  local line rc
  line=$(timeout 150 "$bin/tessera" bench --device cuda -m "$f" -p 16 -n "$tokens" -r "$repeats" "$@" 2>&1)
  rc=$?
  { echo "## $label: bench $*"; echo "$line"; } >> "$log"
  [ "$rc" -ne 0 ] && status=1
  say "- $label: exit $rc: $(echo "$line" | grep -E '^\| .*tg|achieved' | tr -s ' ' | tr '\n' ' ' | cut -c1-260)"
}
for b in $parallel; do
  run "B=$b dense" --parallel "$b"
  for sp in $sparsities; do
    for u in $unions; do run "B=$b top-k $sp teal_union=$u" --parallel "$b" --sparsity "$sp" --cuda "teal_union=$u"; done
  done
done
for sp in $teal; do
  thr=/tmp/gpu_teal_batch_8b_bf16_$sp.json
  if [ ! -s "$thr" ] && ! timeout 200 "$bin/tessera" calibrate -m "$f" -f "$root/README.md" --sparsity "$sp" -c 32 \
      --tokens 32 -t "$(nproc)" -o "$thr" >> "$log" 2>&1; then
    say "- teal $sp: calibration failed (see $log)"
    status=1
    continue
  fi
  run "B=1 dense" --parallel 1
  run "B=1 teal $sp" --parallel 1 --teal "$thr"
  for b in $parallel; do
    for u in $unions; do run "B=$b teal $sp teal_union=$u" --parallel "$b" --teal "$thr" --cuda "teal_union=$u"; done
  done
done
say "done in $(( $(date +%s) - t0 ))s, status $status"
exit $status
