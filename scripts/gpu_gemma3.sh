#!/usr/bin/env bash
# Gemma 3 on CUDA (issue 21: head size 256), one command for the GPU machine: builds test_ops and the CLI (Release,
# sm_90a, in build-gpu as scripts/gpu_check.sh does), runs the op table's attention rows (the CUDA kernels against the
# CPU reference: decode and prefill at head sizes 64, 128 and 256, f16 and f32 caches, sliding windows), writes the
# random-weight Gemma 3 270M (python/hf_oracle.py, transformers there; prompts of 16, 64 and 2048 tokens, the last
# longer than its 512-token window) and compares Tessera's CUDA logits with transformers' in f32 and bf16, one
# prompt at a time and batched; then times the bf16 model: `tessera bench` against transformers' generate and forward
# (bench/peer/torch_decode.py --hf-dir) in the same run.
# Summary in $OUT/gemma3_summary.md; logs gemma3_build.log, gemma3_ops.log, gemma3_hf.log, gemma3_bench.log.
#
# Prepare here first: scripts/make_gpu_bundle.sh (fills the git-ignored .gpu-deps/). Then, through the device tool,
# with carry [".gpu-deps"]:   scripts/gpu_gemma3.sh 2>&1 | tail -40
# Options: --no-bench, --no-oracle, -h/--help.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
bench=1
oracle_run=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --no-oracle) oracle_run=0 ;;
    -h | --help) sed -n '2,/^set -uo pipefail/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_gemma3: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
summary="$OUT/gemma3_summary.md"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
. "$root/scripts/gpu_env.sh"
say "# gpu_gemma3 $(date -u +%Y-%m-%dT%H:%M:%SZ) $(source_id)"
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
status=0

logb="$OUT/gemma3_build.log"
: > "$logb"
if gpu_build "$logb" test_ops tessera_cli; then
  say "- build: ok ($(( $(date +%s) - t0 ))s)"
else
  say "- build: FAILED"
  grep -E "error|FAILED" "$logb" | head -30 | tee -a "$summary"
  exit 1
fi
gpu_env
cli=build-gpu/bin/tessera

logo="$OUT/gemma3_ops.log"
timeout 300 build-gpu/tests/test_ops --gtest_color=no --gtest_filter='*ATTENTION*' > "$logo" 2>&1
rc=$?
say "- op table, attention rows: exit $rc, $(grep -c '^\[       OK \]' "$logo") passed, $(grep -c '^\[  FAILED  \] .*ms)$' "$logo") failed"
grep -E "hd256" "$logo" | grep -E "nmse|OK|FAILED" | head -20 | sed 's/^/    /' | tee -a "$summary"
[ "$rc" -ne 0 ] && status=1 && grep -E '^\[  FAILED  \]|Failure|Expected|Which is' "$logo" | head -20 | tee -a "$summary"

oracle=/tmp/hf_oracle_gemma3
hlog="$OUT/gemma3_hf.log"
if [ "$oracle_run" = 1 ]; then
  : > "$hlog"
  if [ ! -f "$oracle/manifest.json" ]; then
    PYTHONUNBUFFERED=1 timeout 300 python3 python/hf_oracle.py --out "$oracle" --device cuda --models gemma3-270m \
      --dtypes bf16,f32 --long >> "$hlog" 2>&1
    say "- hf oracle generation (gemma3-270m, bf16 + f32, prompts 16/64/2048 and batch0..7): exit $?"
  fi
  for mode in single batched; do
    dump=/tmp/hf_dump_gemma3_$mode
    hf_oracle_dump "$oracle" "$dump" "$mode" "$cli" "$hlog"
    python3 python/hf_oracle.py --ref "$oracle" --compare "$dump" >> "$hlog" 2>&1
    rc=$?
    say "- hf oracle ($mode, --device cuda): compare exit $rc"
    grep -E "PASS|FAIL" "$hlog" | tail -2 | sed 's/^/    /' | tee -a "$summary"
    [ "$rc" -ne 0 ] && status=1 && grep -iE "error|refus" "$hlog" | head -5 | tee -a "$summary"
  done
fi

if [ "$bench" = 1 ] && [ -f "$oracle/gemma3-270m-bf16/config.json" ]; then
  m="$oracle/gemma3-270m-bf16"
  blog="$OUT/gemma3_bench.log"
  : > "$blog"
  say "- random Gemma 3 270M bf16, \`tessera bench -m M --device cuda -p P -n 128 -r 3\` (tok/s):"
  for p in 512 2048; do
    timeout 200 "$cli" bench -m "$m" --device cuda -p "$p" -n 128 -r 3 --no-ceilings --json > "$OUT/gemma3_p$p.json" \
      2>> "$blog" || status=1
    python3 -c "import json,sys; rows=json.load(open(sys.argv[1])); print('    tessera: ' + ', '.join(f\"{r['test']} {r['tok_s']:.1f}\" for r in rows))" \
      "$OUT/gemma3_p$p.json" 2>&1 | tee -a "$summary"
  done
  say "- transformers on the same folder (bench/peer/torch_decode.py --hf-dir, bf16, eager and static-cache compile):"
  timeout 280 python3 bench/peer/torch_decode.py --hf-dir "$m" --impls hf-eager,hf-static-compile --prompt 512 \
    --gen 128 --repeats 3 --prefill --json "$OUT/gemma3_peer.json" >> "$blog" 2>&1
  say "    exit $?"
  grep -E "^gemma3-270m" "$blog" | sed 's/^/    /' | tee -a "$summary"
fi
say "- total $(( $(date +%s) - t0 ))s, status $status"
exit $status
