#!/usr/bin/env bash
# LoRA on CUDA (issue 25), one command for the GPU machine: builds what it needs (Release, sm_90a, in build-gpu as
# scripts/gpu_check.sh does, so a warm machine rebuilds little), runs the CUDA LoRA tests (tests/backends/cuda:
# CudaLora*, unmerged and merged adapters against the CPU's logits), writes a random rank-16 PEFT adapter on all seven
# projections of a Llama-3-8B-shaped model (python/make_lora_golden.py --bench-adapter, numpy only) and times decode
# and prefill of the random 8B bf16 model without, with (unmerged) and with merged adapters, alternating in each
# round. Summary in $OUT/lora_summary.md, logs in $OUT/lora_build.log, $OUT/lora_tests.log, $OUT/lora_bench.log.
#
# Prepare here first: scripts/make_gpu_bundle.sh (fills the git-ignored .gpu-deps/). Then, through the device tool,
# with carry [".gpu-deps"]:   scripts/gpu_lora.sh 2>&1 | tee $OUT/log
# Options: --rounds N (default 3), --dtype D (default bf16), --tests-only, --bench-only, --profile (after the rounds:
# `tessera profile --prompt-tokens 512 -n 4` of the model without and with the unmerged adapter, into
# $OUT/lora_profile_base.txt and lora_profile_lora.txt), -h/--help.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
rounds=3
dtype=bf16
tests=1
bench=1
profile=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift ;;
    --dtype) dtype=$2; shift ;;
    --tests-only) bench=0 ;;
    --bench-only) tests=0 ;;
    --profile) profile=1 ;;
    -h | --help) sed -n '2,/^set -uo pipefail/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_lora: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
summary="$OUT/lora_summary.md"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
. "$root/scripts/gpu_env.sh"
say "# gpu_lora $(date -u +%Y-%m-%dT%H:%M:%SZ) $(source_id)"
say "$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"

logb="$OUT/lora_build.log"
: > "$logb"
if gpu_build "$logb" tessera_cli test_backends_cuda; then
  say "- build: ok ($(( $(date +%s) - t0 ))s)"
else
  say "- build: FAILED"
  grep -E "error|FAILED" "$logb" | head -30 | tee -a "$summary"
  exit 1
fi
gpu_env
bin=build-gpu/bin
status=0

if [ "$tests" = 1 ]; then
  logt="$OUT/lora_tests.log"
  timeout 120 build-gpu/tests/test_backends_cuda --gtest_color=no --gtest_filter='CudaLora*' > "$logt" 2>&1
  rc=$?
  say "- CudaLora* tests: exit $rc, $(grep -c '^\[       OK \]' "$logt") passed, $(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$logt") failed"
  grep -E 'worst relative' "$logt" | tee -a "$summary"
  [ "$rc" -ne 0 ] && status=1 && grep -E '^\[  FAILED  \]|Failure|Expected|Which is' "$logt" | head -20 | tee -a "$summary"
fi

if [ "$bench" = 1 ]; then
  logk="$OUT/lora_bench.log"
  : > "$logk"
  adapter=/tmp/gpu_lora_8b_r16
  model=/tmp/gpu_lora_8b_$dtype.gguf
  py=$(command -v python3)
  if ! "$py" python/make_lora_golden.py --bench-adapter "$adapter" --shape 4096,14336,32,8,128,32 --rank 16 >> "$logk" 2>&1; then
    say "- could not write the adapter (see lora_bench.log)"
    exit 1
  fi
  if ! timeout 200 "$bin/tessera" bench --arch llama3-8b --random-weights --dtype "$dtype" --write-model "$model" >> "$logk" 2>&1; then
    say "- could not write the random 8B model"
    exit 1
  fi
  say "- $dtype 8B, rank 16 on all seven projections, \`tessera bench -m M --device cuda -p 512 -n 128 -r 3\` (tok/s):"
  say ""
  say "| round | base pp512 | unmerged pp512 | merged pp512 | base tg128 | unmerged tg128 | merged tg128 |"
  say "|---|---|---|---|---|---|---|"
  field() {  # the tok/s of test $2 in the JSON rows of file $1
    "$py" -c "import json,sys; rows=json.load(open(sys.argv[1])); print(next((round(r['tok_s'],1) for r in rows if r.get('test')==sys.argv[2]),'-'))" "$1" "$2" 2>/dev/null || echo "-"
  }
  for r in $(seq 1 "$rounds"); do
    row="| $r"
    for variant in base unmerged merged; do
      args=()
      [ "$variant" != base ] && args=(--lora "$adapter")
      [ "$variant" = merged ] && args+=(--lora-merge)
      timeout 200 "$bin/tessera" bench -m "$model" --device cuda -p 512 -n 128 -r 3 --no-ceilings --json "${args[@]}" \
        > "$OUT/lora_$variant.json" 2>> "$logk" || status=1
      eval "pp_$variant=\$(field \"\$OUT/lora_$variant.json\" pp512)"
      eval "tg_$variant=\$(field \"\$OUT/lora_$variant.json\" tg128)"
    done
    say "$row | $pp_base | $pp_unmerged | $pp_merged | $tg_base | $tg_unmerged | $tg_merged |"
  done
  if [ "$profile" = 1 ]; then
    for variant in base lora; do
      args=()
      [ "$variant" = lora ] && args=(--lora "$adapter")
      timeout 200 "$bin/tessera" profile -m "$model" --device cuda --prompt-tokens 512 -n 4 --nodes "${args[@]}" \
        > "$OUT/lora_profile_$variant.txt" 2>&1 || status=1
      say "- profile ($variant): $(grep -E '^(prefill|decode):' "$OUT/lora_profile_$variant.txt" | tr '\n' ' ')"
    done
  fi
fi
say "- done in $(( $(date +%s) - t0 ))s, status $status"
exit $status
