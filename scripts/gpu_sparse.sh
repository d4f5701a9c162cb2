#!/usr/bin/env bash
# TEAL on CUDA (issue 23), one command for the GPU machine: builds only what it needs (Release, sm_90a, in build-gpu
# as scripts/gpu_check.sh does, so a warm machine rebuilds little), runs the sparse kernels' GPU tests and the op
# table's SPARSIFY / MATMUL_SPARSE rows, the sparse GEMV benchmark (tessera_bench_sparse: Llama-3-8B's shapes at
# 0-80%, L2 flushed before each call) and, where the CUDA executors run sparse decode, end-to-end decode of the 8B
# random models dense vs --sparsity 0.4 / 0.5. Prints a compact summary (also $OUT/sparse_summary.md); the full logs
# go to $OUT/sparse_build.log, $OUT/sparse_tests.log, $OUT/sparse_bench.log. Under 5 minutes on 16 cores + H100.
#
# Prepare here first: scripts/make_gpu_bundle.sh (fills the git-ignored .gpu-deps/). Then, through the device tool,
# with carry [".gpu-deps"]:   scripts/gpu_sparse.sh 2>&1 | tee $OUT/log
# --prebuilt: no build there; the binaries built here instead (TESSERA_PREBUILT_EXTRA="bin/tessera_bench_sparse"
# scripts/make_gpu_bundle.sh --prebuilt build, unpacked by gpu_env.sh's gpu_prebuilt into build-pre/bin).
# Options: --no-e2e (skip the end-to-end decode), --only-e2e (only the end-to-end decode: a second call on the warm
# machine), --e2e-quant (end to end also for q8_0 and q4_1 at 0 and 50%), --splits-sweep (the benchmark also times
# every split count), --fast (the benchmark without taller tiles and most sweeps), --no-teal (no calibrated-threshold
# runs), --teal-sparsities="0.5", --quant-sparsities="0.5", --e2e-formats="bf16 q8_0", --quick-tests (the kernel tests only), --bench-bf16 (the benchmark for bf16 only), --e2e-sparsities="0 0.5" (top-k runs), --e2e-quant-only (end to end q8_0 and q4_1 only), --tests-only (no benchmark). The end-to-end phase starts only while under 4 minutes have passed (else it says how to run it).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
e2e=1
only_e2e=0
bench=1
quick_tests=0
prebuilt=0
e2e_formats="bf16"
e2e_sparsities="0 0.4 0.5"
teal_sparsities="0.4 0.5"
quant_sparsities="0 0.5"
sweep=()
for a in "$@"; do
  case "$a" in
    --no-e2e) e2e=0 ;;
    --only-e2e) only_e2e=1 ;;
    --e2e-quant) e2e_formats="bf16 q8_0 q4_1" ;;
    --e2e-quant-only) e2e_formats="q8_0 q4_1" ;;
    --no-teal) teal_sparsities="" ;;
    --tests-only) bench=0 ;;
    --splits-sweep) sweep=(--splits-sweep) ;;
    --fast) sweep+=(--fast) ;;
    --bench-bf16) sweep+=(--bf16-only) ;;
    --e2e-sparsities=*) e2e_sparsities=${a#*=} ;;
    --teal-sparsities=*) teal_sparsities=${a#*=} ;;
    --quant-sparsities=*) quant_sparsities=${a#*=} ;;
    --e2e-formats=*) e2e_formats=${a#*=} ;;
    --quick-tests) quick_tests=1 ;;
    --prebuilt) prebuilt=1 ;;
    *) echo "gpu_sparse: unknown option $a" >&2; exit 2 ;;
  esac
done
summary="$OUT/sparse_summary.md"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
. "$root/scripts/gpu_env.sh"
say "# gpu_sparse $(date -u +%Y-%m-%dT%H:%M:%SZ) $(source_id)"
say "$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"

logb="$OUT/sparse_build.log"
: > "$logb"
targets="test_backends_cuda test_ops tessera_bench_sparse"
[ "$quick_tests" = 1 ] && targets="test_backends_cuda tessera_bench_sparse"
[ "$e2e" = 1 ] && targets="$targets tessera_cli"
[ "$only_e2e" = 1 ] && targets="tessera_cli"
if [ "$prebuilt" = 1 ]; then
  gpu_env
  gpu_prebuilt || exit 1
  say "- prebuilt: $(head -1 "$root/.gpu-deps/prebuilt/INFO")"
  bin=build-pre/bin
  tests=build-pre/bin
elif gpu_build "$logb" $targets; then
  say "- build: ok ($(( $(date +%s) - t0 ))s)"
  gpu_env
  bin=build-gpu/bin
  tests=build-gpu/tests
else
  say "- build: FAILED"
  grep -E "error|FAILED" "$logb" | head -30 | tee -a "$summary"
  exit 1
fi
status=0

# ---- tests: the kernels (tests/backends/cuda/test_gemv_sparse.cpp, and any CUDA test named *Sparse*/*Teal*), then
# the op table's rows (tests/ops: SPARSIFY, MATMUL_SPARSE on CUDA) ----
logt="$OUT/sparse_tests.log"
logk="$OUT/sparse_bench.log"
if [ "$only_e2e" = 0 ]; then
: > "$logt"
run_tests() {
  local what=$1 bin_=$2 filter=$3
  local log
  log=$(mktemp)
  timeout 150 "$bin_" --gtest_color=no --gtest_filter="$filter" > "$log" 2>&1
  local rc=$?
  { echo "== $what ($filter)"; cat "$log"; } >> "$logt"
  say "- $what: exit $rc, $(grep -c '^\[       OK \]' "$log") passed, $(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$log") failed, $(grep -c '^\[  SKIPPED \] .*([0-9]* ms)$' "$log") skipped"
  if [ "$rc" -ne 0 ]; then
    status=1
    # The first failure's lines (assertion text), so the summary says what broke.
    grep -E '^\[  FAILED  \]|Failure|error|Expected|Which is|row |vs ' "$log" | head -25 | tee -a "$summary"
  fi
  rm -f "$log"
}
run_tests "cuda sparse tests" $tests/test_backends_cuda '*Sparse*:*Teal*:*SPARS*'
[ "$quick_tests" = 0 ] && run_tests "op table sparse rows" $tests/test_ops '*SPARS*:*Sparse*'
# compute-sanitizer memcheck of the kernel tests (out-of-bounds list or weight reads would show here first).
if [ "$quick_tests" = 0 ] && command -v compute-sanitizer > /dev/null; then
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $tests/test_backends_cuda --gtest_color=no \
    --gtest_filter='GemvSparse.*:-GemvSparse.QuantizedDecoderShapes:GemvSparse.StripeFormDecoderShapes' > "$OUT/sparse_memcheck.tmp" 2>&1
  rc=$?
  say "- memcheck (GemvSparse.*): exit $rc, $(grep -c '^\[       OK \]' "$OUT/sparse_memcheck.tmp") passed"
  [ "$rc" -ne 0 ] && status=1 && grep -E 'ERROR SUMMARY|Invalid|at 0x' "$OUT/sparse_memcheck.tmp" | head -12 | tee -a "$summary"
  { echo "== memcheck"; cat "$OUT/sparse_memcheck.tmp"; } >> "$logt"
  rm -f "$OUT/sparse_memcheck.tmp"
fi

# ---- the kernel benchmark ----
if [ "$bench" = 1 ]; then
say "- kernel bench ($(( $(date +%s) - t0 ))s):"
timeout 150 "$bin/tessera_bench_sparse" "${sweep[@]}" > "$logk" 2>&1
rc=$?
[ "$rc" -ne 0 ] && status=1
say '```'
cat "$logk" | tee -a "$summary"
say '```'
say "  (exit $rc)"
fi
fi  # only_e2e

# ---- end to end: tessera bench --device cuda dense vs --sparsity. The random 8B model is written once per format
# (--write-model; ~16 GB for bf16, read back from the page cache by each run) instead of generated per run. ----
if [ "$e2e" = 1 ] && [ "$only_e2e" = 0 ] && [ $(( $(date +%s) - t0 )) -gt 250 ]; then
  say "- end to end: skipped ($(( $(date +%s) - t0 ))s passed); run scripts/gpu_sparse.sh --only-e2e next (warm machine)"
  e2e=0
fi
if [ "$e2e" = 1 ]; then
  say "- end to end ($(( $(date +%s) - t0 ))s): tessera bench --device cuda -m <random llama3-8b> -p 0 -n 64 -r 2"
  for dt in $e2e_formats; do
    f=/tmp/gpu_sparse_8b_$dt.gguf
    if ! timeout 150 "$bin/tessera" bench --arch llama3-8b --random-weights --dtype "$dt" --write-model "$f" >> "$logk" 2>&1; then
      say "  - $dt: could not write the random model"
      continue
    fi
    sps=$e2e_sparsities
    teal_sparsities_dt=$teal_sparsities
    if [ "$dt" != bf16 ]; then
      sps=$quant_sparsities
      teal_sparsities_dt=$(echo "$teal_sparsities" | grep -o '0.5')
    fi
    for sp in $sps; do
      args=(--device cuda -m "$f" -p 0 -n 64 -r 2)
      [ "$sp" != 0 ] && args+=(--sparsity "$sp")
      line=$(timeout 120 "$bin/tessera" bench "${args[@]}" 2>&1)
      rc=$?
      { echo "## bench ${args[*]}"; echo "$line"; } >> "$logk"
      tg=$(echo "$line" | grep -E 'tg|tok/s' | tail -3 | tr '\n' ' ' | cut -c1-300)
      say "  - $dt sparsity $sp: exit $rc: $tg"
      # The first failure's reason (e.g. a node the CUDA decoder refuses) is enough.
      [ "$rc" -ne 0 ] && echo "$line" | grep -iE 'error|refus|support|unsupported' | head -2 | tee -a "$summary"
    done
    # Calibrated thresholds (--teal; TEAL's decode form: the bf16/f16 sparse GEMVs threshold x themselves and the
    # SPARSIFY launches are skipped): calibrated on the CPU over a short text, then decoded on the GPU.
    for sp in $teal_sparsities_dt; do
      thr=/tmp/gpu_sparse_8b_${dt}_$sp.json
      if ! timeout 100 "$bin/tessera" calibrate -m "$f" -f README.md --sparsity "$sp" -c 32 --tokens 32 \
          -t "$(nproc)" -o "$thr" >> "$logk" 2>&1; then
        say "  - $dt teal $sp: calibration failed (see sparse_bench.log)"
        continue
      fi
      args=(--device cuda -m "$f" -p 0 -n 64 -r 2 --teal "$thr")
      line=$(timeout 120 "$bin/tessera" bench "${args[@]}" 2>&1)
      rc=$?
      { echo "## bench ${args[*]}"; echo "$line"; } >> "$logk"
      tg=$(echo "$line" | grep -E 'tg|tok/s' | tail -3 | tr '\n' ' ' | cut -c1-300)
      say "  - $dt teal (calibrated at $sp): exit $rc: $tg"
      [ "$rc" -ne 0 ] && echo "$line" | grep -iE 'error|refus|support|unsupported' | head -2 | tee -a "$summary"
    done
    rm -f "$f"
  done
fi
say "- done in $(( $(date +%s) - t0 ))s, status $status"
exit $status
