#!/usr/bin/env bash
# The CUDA weight formats on the GPU machine (issue 21: K-quant speed, native formats): builds only what it needs in
# build-gpu (gpu_check.sh's configuration, so a warm machine reuses either's build), then
#   1. the CUDA format tests: test_backends_cuda's weight-format, GEMV, GEMM and quantized-decoder tests, and the op
#      table's MATMUL rows (tests/ops: every format at t = 1, 7, 64 on CPU and CUDA against the CPU reference);
#   2. tessera_bench_kquant --all-configs: per format and Llama-3-8B / 3.2-1B shape, the default launch shape's and the
#      best shape's % of the byte floor (the copy bandwidth measured in the same run), and the prefill path's bf16
#      expansion in GB/s (bytes read plus written);
#   3. tessera bench --device cuda --arch llama3-8b --random-weights -p 512 -n 128 for each --dtype of DTYPES
#      (default: q4_k iq4_nl; formats CUDA has no kernel for run as their bf16 conversion).
# and prints a compact summary (also $OUT/kquant_summary.md; the full outputs: $OUT/kquant_tests.log, kquant_bench.txt,
# kquant_e2e.log). About 4-5 minutes on 16 cores + H100 from a fresh machine (build ~2.5 minutes of it).
#
# Prepare here first: scripts/make_gpu_bundle.sh   (fills the git-ignored .gpu-deps/)
# Then, through the device tool, with carry [".gpu-deps"]:
#   set -o pipefail; scripts/gpu_kquant.sh 2>&1 | tee $OUT/kquant.log
# Options: --skip-tests, --quick (the format tests without the two slowest GEMV tests, ~3 minutes of CPU reference:
# large grids and the norm_out epilogue), --skip-bench, --skip-e2e, --dtypes "q4_k iq4_nl q4_1" (the end-to-end
# dtypes), --reps N and --formats q4_k,iq4_nl (the kernel bench; default: every format it times).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/build-gpu/out}
mkdir -p "$OUT"
run_tests=1
run_e2e=1
run_bench=1
quick=0
formats=""
dtypes="q4_k iq4_nl"
reps=10
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-tests) run_tests=0 ;;
    --skip-e2e) run_e2e=0 ;;
    --skip-bench) run_bench=0 ;;
    --quick) quick=1 ;;
    --formats) formats="$2"; shift ;;
    --dtypes) dtypes="$2"; shift ;;
    --reps) reps="$2"; shift ;;
    -h | --help) sed -n '2,/^set -uo pipefail/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_kquant: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

summary="$OUT/kquant_summary.md"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
status=0
. "$root/scripts/gpu_env.sh"
say "# gpu_kquant $(date -u +%Y-%m-%dT%H:%M:%SZ) $(source_id)"
say "- $(nvidia-smi --query-gpu=name,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -1)"

logt="$OUT/kquant_tests.log"
: > "$logt"
stamp "building (Release, sm_90a) in build-gpu"
targets="test_backends_cuda test_ops tessera_cli tessera_bench_kquant"
if gpu_build "$logt" $targets; then
  say "- build: ok ($(( $(date +%s) - t0 ))s)"
else
  say "- build: FAILED (kquant_tests.log)"
  grep -E "error|FAILED" "$logt" | head -30
  exit 1
fi
gpu_env

# gtest pass / fail / skip counts of a log, and its failures into the summary.
counts() {
  echo "$(grep -c '^\[       OK \]' "$1") passed, $(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$1") failed," \
    "$(grep -c '^\[  SKIPPED \] .*([0-9]* ms)$' "$1") skipped"
}

if [ "$run_tests" = 1 ]; then
  stamp "CUDA format tests"
  filter='CudaWeightFormats*:KQuantFiles/*:CudaGemv.*:CudaGemm.*:CudaQuantUnits.*:CudaOptions.*:CudaBackend.Quant*'
  filter="$filter:CudaRows.*:CudaBackendDtype*:*/CudaBackendDtype.*:*/CudaPrefill.*"
  [ "$quick" = 1 ] &&
    filter="$filter-CudaGemv.QuantLargeGridsMatchReference:CudaGemv.QuantNormOutEpilogueWritesTheNextInput"
  log1=$(mktemp)
  timeout 240 build-gpu/tests/test_backends_cuda --gtest_color=no --gtest_filter="$filter" > "$log1" 2>&1
  rc=$?
  { echo "== test_backends_cuda --gtest_filter=$filter"; cat "$log1"; } >> "$logt"
  say "- format tests: exit $rc, $(counts "$log1")"
  [ "$rc" -ne 0 ] && status=1 && grep -E '^\[  FAILED  \]' "$log1" | head -20 | tee -a "$summary"
  stamp "op table MATMUL rows"
  log2=$(mktemp)
  timeout 120 build-gpu/tests/test_ops --gtest_color=no --gtest_filter='*MATMUL_*' > "$log2" 2>&1
  rc=$?
  { echo "== test_ops --gtest_filter=*MATMUL_*"; cat "$log2"; } >> "$logt"
  say "- op table MATMUL rows: exit $rc, $(counts "$log2")"
  [ "$rc" -ne 0 ] && status=1 && grep -E '^\[  FAILED  \]' "$log2" | head -20 | tee -a "$summary"
  rm -f "$log1" "$log2"
fi

if [ "$run_bench" = 1 ]; then
  stamp "tessera_bench_kquant --all-configs"
  bench="$OUT/kquant_bench.txt"
  timeout 200 build-gpu/bin/tessera_bench_kquant --all-configs --reps "$reps" ${formats:+--formats "$formats"} \
    > "$bench" 2>&1
  rc=$?
  say "- tessera_bench_kquant: exit $rc ($(grep -m1 '^ceilings' "$bench"))"
  [ "$rc" -ne 0 ] && status=1 && tail -5 "$bench" | tee -a "$summary"
  say ""
  say "| format | shape | default | %floor | best | %floor | bf16 expansion GB/s |"
  say "|---|---|---|---|---|---|---|"
  # pick FMT NxK default T/R/U P% best T/R/U P% expand G GB/s
  grep '^pick ' "$bench" | awk '{printf "| %s | %s | %s | %s | %s | %s | %s |\n", $2, $3, $5, $6, $8, $9, $11}' |
    tee -a "$summary"
fi

if [ "$run_e2e" = 1 ]; then
  e2e="$OUT/kquant_e2e.log"
  : > "$e2e"
  say ""
  for dt in $dtypes; do
    stamp "tessera bench llama3-8b $dt"
    json=$(mktemp)
    timeout 200 build-gpu/bin/tessera bench --device cuda --arch llama3-8b --random-weights --dtype "$dt" -p 512 \
      -n 128 -r 3 --json > "$json" 2>> "$e2e"
    rc=$?
    cat "$json" >> "$e2e"
    line=$(python3 - "$json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no JSON ({e})"); sys.exit()
out = []
for r in rows if isinstance(rows, list) else [rows]:
    out.append(f"{r.get('test', '?')} {r.get('tok_s', 0):.1f} tok/s ({r.get('gbps', 0):.0f} GB/s, "
               f"{r.get('tflops', 0):.1f} TFLOP/s)")
print("; ".join(out))
PY
)
    say "- llama3-8b $dt: exit $rc: $line"
    [ "$rc" -ne 0 ] && status=1 && grep -iE "error|convert" "$e2e" | tail -3 | tee -a "$summary"
    rm -f "$json"
  done
  say "- goals (issue 21): q4_k pp512 2x llama.cpp (measured 1.07x before), decode 85% of the byte floor; iq4_nl" \
    "decode >= 1.5x llama.cpp's 306.6 tok/s (460)"
fi
stamp "done (exit $status)"
exit $status
