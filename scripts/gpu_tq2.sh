#!/usr/bin/env bash
# The tq2_0 (ternary) GEMV on the GPU machine (issue 24): builds only what it needs in build-gpu (gpu_check.sh's
# configuration), then
#   1. bench/cuda/experiments/gemv_tq2_sweep.cu: the bf16 GEMV, src's tq2_0 GEMV at every launch shape and the
#      x-stationary kernel at every shape, per Llama-3-8B / BitNet-2B4T matrix ($OUT/tq2_sweep.log, tq2_sweep.tsv);
#   2. unless --skip-tests: the CUDA ternary tests, the GEMV tests that cover tq2_0 (not the two slowest), the op
#      table's tq2_0 rows, and tessera_bench_cuda --only ternary (src's default GEMVs against bf16, $OUT/tq2_bench.txt);
#   3. unless --skip-e2e: tessera bench --device cuda --arch A --random-weights --dtype D -p 512 -n 128 -r 3 for
#      A in llama3-8b bitnet-2b4t-llama and D in bf16 tq2_0 ($OUT/tq2_e2e.log), and with --profile a decode profile
#      of the 8B tq2_0 model ($OUT/tq2_profile.txt).
# Prepare here first: scripts/make_gpu_bundle.sh. Then, through the device tool, with carry [".gpu-deps"]:
#   set -o pipefail; scripts/gpu_tq2.sh [--skip-sweep] [--skip-tests] [--skip-e2e] [--profile] 2>&1 | tee $OUT/tq2.log
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
sweep=1 tests=1 e2e=1 profile=0
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-sweep) sweep=0 ;;
    --skip-tests) tests=0 ;;
    --skip-e2e) e2e=0 ;;
    --profile) profile=1 ;;
    -h | --help) sed -n '2,/^set -uo pipefail/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_tq2: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
. "$root/scripts/gpu_env.sh"
echo "# gpu_tq2 $(date -u +%Y-%m-%dT%H:%M:%SZ) $(source_id)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -1
targets="tessera_cli"
[ $sweep = 1 ] && targets="$targets exp_gemv_tq2_sweep"
[ $tests = 1 ] && targets="$targets test_backends_cuda test_ops tessera_bench_cuda"
stamp "building $targets"
gpu_build "$OUT/tq2_build.log" $targets || { tail -40 "$OUT/tq2_build.log"; exit 1; }
gpu_env
bin="$root/build-gpu/bin"
status=0
if [ $sweep = 1 ]; then
  stamp "tq2_0 GEMV sweep"
  "$bin/experiments/exp_gemv_tq2_sweep" 15 > "$OUT/tq2_sweep.log" 2>&1 || status=1
  sed -n '/== summary/,$p' "$OUT/tq2_sweep.log"
  grep FAIL "$OUT/tq2_sweep.log" | head
fi
if [ $tests = 1 ]; then
  stamp "CUDA ternary tests and op table tq2_0 rows"
  test_bin=$(find "$root/build-gpu" -name test_backends_cuda -type f -perm -u+x | head -1)
  ops_bin=$(find "$root/build-gpu" -name test_ops -type f -perm -u+x | head -1)
  "$test_bin" --gtest_filter='*Ternary*:*BitNet*:*Hgrn*:CudaGemv.*:-CudaGemv.QuantLargeGrids*:CudaGemv.QuantNormOut*' \
    > "$OUT/tq2_tests.log" 2>&1 || status=1
  tail -5 "$OUT/tq2_tests.log"; grep -E "^\[  FAILED" "$OUT/tq2_tests.log" | head
  "$ops_bin" --gtest_filter='*tq2*:*TQ2*:*tq1*:*TQ1*' > "$OUT/tq2_ops.log" 2>&1 || status=1
  tail -3 "$OUT/tq2_ops.log"; grep -E "^\[  FAILED" "$OUT/tq2_ops.log" | head
  "$bin/tessera_bench_cuda" --only ternary > "$OUT/tq2_bench.txt" 2>&1 || status=1
  grep -A14 "^ternary" "$OUT/tq2_bench.txt"
fi
if [ $e2e = 1 ]; then
  for a in llama3-8b bitnet-2b4t-llama; do
    for d in bf16 tq2_0; do
      stamp "bench $a $d"
      "$bin/tessera" bench --device cuda --arch "$a" --random-weights --dtype "$d" -p 512 -n 128 -r 3 2>&1 |
        tee -a "$OUT/tq2_e2e.log" | grep -E "pp512|tg128" || status=1
    done
  done
fi
if [ $profile = 1 ]; then
  stamp "profile 8B tq2_0 decode"
  "$bin/tessera" profile --device cuda --arch llama3-8b --random-weights --dtype tq2_0 --prompt-tokens 64 -n 16 \
    > "$OUT/tq2_profile.txt" 2>&1 || status=1
  sed -n '/decode/,$p' "$OUT/tq2_profile.txt" | head -60
fi
stamp "done (status $status)"
exit $status
